"""The precision of a run, in one place: which --precision a device gets by default or
refuses, whether fp32 matmuls may use the matrix units (tf32), and the autocast
context a forward runs under. The trainer, the analysis tools, the benchmarks and
the versions all take these from here."""
from __future__ import annotations

import contextlib

import torch

from . import device as dev
from .config import PRECISIONS
from .errors import UsageError


def choose_precision(requested: str | None, device: torch.device) -> str:
    if requested is None:
        if device.type == "cpu":
            return "fp32"
        return "bf16" if dev.supports_bf16(device) else "fp16"
    if requested == "bf16" and not dev.supports_bf16(device):
        raise UsageError(f"--precision bf16 is not supported on {dev.device_name(device)} "
                         f"(try fp16 or fp32)")
    if requested == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a GPU (use fp32 or bf16 on the CPU)")
    return requested


def configure_matmul_precision(precision: str) -> None:
    # tf32 = fp32 storage, matrix units with a 10-bit mantissa. Everything else
    # keeps true fp32 for the fp32 parts, so fp32 means fp32.
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def autocast_for(precision: str, device: torch.device):
    dtype = PRECISIONS[precision].autocast_dtype
    if dtype is not None:
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()
