"""What every performance-debugging stage shares: the V1 model, the harness, and a --fixed flag.

A stage is V1 with ONE planted mistake. Each stage file only says what the mistake is
(`build_model(config, fixed=False)` and, where the mistake lives outside the model,
`patches` that plant it for the run); everything else - flags, training loop,
timing, gradient guard, results JSON - is the shared harness, exactly as for the
real versions. Run a stage with and without `--fixed` and compare.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import training  # noqa: E402
from version1_baseline import tiny_llama_v1 as v1  # noqa: E402


def add_fixed_flag(group) -> None:
    group.add_argument("--fixed", action="store_true",
                       help="run the stage with its mistake repaired, for comparison")


def expected_first_loss(vocab_size: int) -> float:
    """A freshly initialised model guesses uniformly: cross-entropy ln(vocab_size)."""
    return math.log(vocab_size)


def import_triton():
    """(triton, triton.language), or (None, None) when triton is not installed.

    Without a GPU the kernels run in Triton's CPU interpreter, which must be chosen
    before triton is first imported."""
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None, None
    return triton, tl


def run(stage: str, build_model, argv=None, *, description: str, init_from_v1: bool = True,
        add_arguments=None, patches=None, needs_triton: bool = False) -> int:
    """Run one stage through training.main.

    add_arguments(group) adds the stage's own flags (--fixed is always there);
    patches(args) returns context managers that plant a mistake outside the model
    (in the timing, say) - they are active for the whole run. A stage that needs_triton
    says so in one line and returns 0 where triton is missing.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if needs_triton and import_triton()[0] is None:
        print(f"{stage}: skipped - triton is not installed (pip install triton runs it on a CPU "
              f"in the interpreter)")
        return 0

    def stage_arguments(group):
        add_fixed_flag(group)
        if add_arguments is not None:
            add_arguments(group)

    # Peek at the stage's own flags; the harness parses (and validates) everything.
    peek = argparse.ArgumentParser(add_help=False)
    stage_arguments(peek)
    args = peek.parse_known_args(argv)[0]
    with contextlib.ExitStack() as stack:
        for patch in (patches(args) if patches else []):
            stack.enter_context(patch)
        return training.main(stage, build_model, argv=argv, description=description,
                             add_arguments=stage_arguments,
                             model_options=lambda a: {"fixed": a.fixed},
                             init_from_v1=init_from_v1)
