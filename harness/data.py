"""Training data: random tokens, or real text as bytes.

`synthetic` draws uniform random tokens. It is what AMD's TinyTransformer workshop timed;
the loss cannot fall below ln(vocab_size), so it tests speed, not learning.
`text` reads real text as bytes (vocabulary 256): by default the Python
standard library's own source files, which exist on every machine, so a loss
curve visibly falls without downloading anything.

Targets are the inputs shifted by one token: we draw windows of seq_len+1
tokens once and slice them, so the shift happens in exactly one place.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from .errors import UsageError

BYTE_VOCAB = 256


def default_text_files(limit_bytes: int = 8 << 20) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(stdlib.glob("*.py")):  # sorted: same corpus on every run
        files.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    return files


def load_text_tokens(data_path: str | None) -> torch.Tensor:
    if data_path:
        path = Path(data_path)
        if not path.exists():
            raise UsageError(f"--data-path {data_path} does not exist")
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    else:
        files = default_text_files()
    raw = b"".join(f.read_bytes() for f in files)
    if len(raw) < 1024:
        raise UsageError(f"not enough text to train on ({len(raw)} bytes from {len(files)} files)")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


class Batches:
    """An endless, seeded stream of (inputs, targets) batches.

    The stream is generated on the CPU with its own generator, so every version,
    device and precision sees exactly the same tokens for the same seed.

    Data parallelism: every rank draws the *global* batch (global_batch_size =
    batch_size x world_size sequences) from the same seeded generator and keeps
    only its own slice of it. Ranks see different data, and N ranks of batch
    size B see exactly the tokens of one process of batch size N*B - which is
    what lets a test check that DDP computes the same losses as a single process.
    """

    def __init__(self, kind: str, vocab_size: int, batch_size: int, seq_len: int,
                 seed: int, data_path: str | None = None, rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is outside world size {world_size}")
        self.kind, self.vocab_size = kind, vocab_size
        self.batch_size, self.seq_len = batch_size, seq_len
        self.own_slice = slice(rank * batch_size, (rank + 1) * batch_size)
        self.global_batch_size = batch_size * world_size
        self.generator = torch.Generator().manual_seed(seed * 1000003)
        if kind == "text":
            if vocab_size < BYTE_VOCAB:
                raise UsageError(f"--data text needs --vocab-size >= {BYTE_VOCAB} (got {vocab_size})")
            self.tokens = load_text_tokens(data_path)
            if len(self.tokens) <= seq_len + 1:
                raise UsageError("--seq-len is longer than the text")
        elif kind != "synthetic":
            raise UsageError(f"--data must be synthetic or text (got {kind!r})")

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.seq_len + 1
        if self.kind == "synthetic":
            chunk = torch.randint(0, self.vocab_size, (self.global_batch_size, window),
                                  generator=self.generator)[self.own_slice]
        else:
            starts = torch.randint(0, len(self.tokens) - window, (self.global_batch_size,),
                                   generator=self.generator)[self.own_slice]
            chunk = torch.stack([self.tokens[s:s + window] for s in starts.tolist()])
        return chunk[:, :-1], chunk[:, 1:]
