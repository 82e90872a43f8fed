"""A sum over every program's row, inside the kernel that wrote the rows: no second launch.

A reduction over all of a kernel's rows - RMSNorm's weight gradient sums dy * x_hat over
every row of the batch - is split among the programs: each accumulates the rows it owns
into one fp32 row of partial sums. Those rows still have to be added up. A second kernel
(or `partial.sum(0)`) costs the host a launch, ~10 us, more than the GPU spends on the
sum; adding atomically into one shared row would make the result depend on which program
came first. Here the programs that finish last do the sum, in a fixed order:

- A ticket decides who is last: each program, its row written, adds 1 to a counter; the
  program that draws the final number knows every other row is in memory. Drawing is
  acq_rel: it publishes the drawer's row and lets the last drawer see everyone's.
- Two levels, so nobody waits long for one summer reading hundreds of rows: programs
  come in groups of ~sqrt(programs); the last of each group sums its group's rows into a
  group row, and the last of the group summers sums the group rows. Both sum in row order,
  so the result is the same every run, whoever wins the race.
- Each counter's last drawer sets it back to 0: one set of counters (and of partial rows)
  serves every launch on a stream, since launches on one stream run one after another.
  Another stream, which may run alongside, gets its own.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from . import common, operators


@triton.jit
def _last_to_arrive(ticket, arrivals):
    """True in the program that draws the last of `arrivals` tickets; it resets the counter."""
    tl.debug_barrier()  # every thread's stores are issued before the ticket is drawn
    last = tl.atomic_add(ticket, 1, sem="acq_rel") == arrivals - 1
    if last:
        tl.store(ticket, 0)
    return last


@triton.jit
def _sum_rows(ROWS, n, stride, cols, n_cols, SUM_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """The sum of n fp32 rows ROWS + i * stride, in row order. The loads skip the compute
    unit's own cache (.cg): other programs wrote these rows, on other compute units."""
    acc = tl.zeros((SUM_ROWS, BLOCK_COLS), dtype=tl.float32)
    for first in range(0, n, SUM_ROWS):
        rows = first + tl.arange(0, SUM_ROWS)[:, None]
        acc += tl.load(ROWS + rows * stride + cols, mask=(rows < n) & (cols < n_cols),
                       other=0.0, cache_modifier=".cg")
    return tl.sum(acc, axis=0)[None, :]


@triton.jit
def sum_program_rows(row, PARTIAL, OUT, TICKETS, group_size, n_cols, cols,
                     SUM_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Write this program's `row` (1, BLOCK_COLS) of partial sums; the last program to do
    so stores the sum of every program's row at OUT, in OUT's dtype. PARTIAL holds a row
    per program, then one per group; TICKETS a counter per group, then one (see above)."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    groups = tl.cdiv(programs, group_size)
    group = pid // group_size
    members = tl.minimum(group_size, programs - group * group_size)
    tl.store(PARTIAL + pid * n_cols + cols, row, mask=cols < n_cols)
    if _last_to_arrive(TICKETS + group, members):
        total = _sum_rows(PARTIAL + group * group_size * n_cols, members, n_cols, cols, n_cols,
                          SUM_ROWS, BLOCK_COLS)
        GROUP_ROWS = PARTIAL + programs * n_cols
        tl.store(GROUP_ROWS + group * n_cols + cols, total, mask=cols < n_cols)
        if _last_to_arrive(TICKETS + groups, groups):
            total = _sum_rows(GROUP_ROWS, groups, n_cols, cols, n_cols, SUM_ROWS, BLOCK_COLS)
            tl.store(OUT + cols, total.to(OUT.dtype.element_ty), mask=cols < n_cols)


def summing_rows(n_cols: int) -> int:
    """Rows a summer adds per step (SUM_ROWS): a tile of 4096 fp32 - no more than the
    kernels' own tiles hold, so no more registers."""
    return max(1, 4096 // common.next_power_of_2(n_cols))


@functools.lru_cache(maxsize=None)
def group_size(programs: int) -> int:
    return math.isqrt(programs - 1) + 1  # ~sqrt: both levels sum about as many rows


_SCRATCH: dict[tuple, tuple] = {}  # (device, stream, programs, n_cols) -> (partial, tickets)


def scratch(like: torch.Tensor, programs: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(PARTIAL, TICKETS) for `programs` programs summing rows of n_cols, on like's device:
    kept per stream (the kernel leaves the counters at 0). Inside an operator - traced by
    torch.compile, which owns every buffer it launches with - and on the CPU, new ones."""
    if operators.IN_OPERATOR or not like.is_cuda:
        return _allocate(like, programs, n_cols)
    device = like.get_device()
    key = (device, torch._C._cuda_getCurrentRawStream(device), programs, n_cols)
    if (buffers := _SCRATCH.get(key)) is None:
        if len(_SCRATCH) >= 16:  # sizes that keep changing: start over
            _SCRATCH.clear()
        buffers = _SCRATCH[key] = _allocate(like, programs, n_cols)
    return buffers


def _allocate(like: torch.Tensor, programs: int, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A row per program and one per group (NaN under the tests' POISON_OUTPUTS: a row read
    before it is written shows); a counter per group and one for the groups, at 0."""
    groups = -(-programs // group_size(programs))
    partial = torch.empty((programs + groups, n_cols), dtype=torch.float32, device=like.device)
    if common.POISON_OUTPUTS:  # (as common.empty does, without its frame on the eager path)
        partial.fill_(float("nan"))
    return partial, torch.zeros(groups + 1, dtype=torch.int32, device=like.device)
