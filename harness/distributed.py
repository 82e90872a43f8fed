"""Data-parallel context. Single process for now: world size 1, nothing wrapped.

(The torchrun/DDP/FSDP2 implementation replaces this; the trainer only talks
to the methods below.)
"""
from __future__ import annotations

import contextlib


class SingleProcess:
    rank, world_size, is_main, kind, device, extra = 0, 1, True, "single", None, None

    def wrap(self, model, settings):
        return model

    def no_sync(self, model, micro_step):
        return contextlib.nullcontext()

    def aggregate_timing(self, timing):
        return timing

    def close(self):
        pass


def setup(settings) -> SingleProcess:
    return SingleProcess()
