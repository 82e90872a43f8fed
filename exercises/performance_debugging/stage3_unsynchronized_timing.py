"""Stage 3 - timing a GPU with the host's clock: impossible numbers.

The planted mistake is not in the model but in the stopwatch. A GPU runs
asynchronously: `loss = model(x)` returns as soon as the kernels are *queued*. A
host clock (time.time, perf_counter) read right after it measures how long Python
took to launch the work, not how long the GPU took to do it. The waiting happens
later - wherever something needs a result (`loss.item()` for a progress line, a
synchronize) - and lands in whichever region happens to be timed around it.

This stage swaps the harness's stopwatch (device events, read after one
synchronize per step) for host timestamps taken without waiting - the pattern of
AMD's TinyTransformer workshop, which timed "forward" and "backward" this way.

The checks that expose it compare with the synchronised run (--fixed): the phases
no longer add up to the step (forward + backward + optimizer cover much less of it,
because the wait falls between steps), and the forward may appear to run faster.
How much faster depends on how far the host gets ahead. With many small kernels
(V1, medium preset) launching them takes the host most of the time the GPU needs to
run them, and it can never get further ahead than the launch queue allows, so the
numbers stay plausible (below the peak) - they only fail to add up. With few, large
kernels the host runs far ahead and the forward can even beat the GPU's peak. On a CPU every
operation finishes before the next starts, so host clocks are exact there: the
symptom needs a GPU.

    python exercises/performance_debugging/stage3_unsynchronized_timing.py --log-every 1
    python exercises/performance_debugging/stage3_unsynchronized_timing.py --log-every 1 --fixed
"""
import sys
from unittest import mock

import common
from harness import device as dev
from training import trainer


class HostClock(dev.StepClock):
    """MISTAKE: host timestamps around work the GPU has only been asked to do."""

    def __init__(self, device):
        super().__init__(device)
        self.use_events = False  # never record device events, never wait for the GPU


class LossReadAtOnce(trainer.LossReader):
    """With it, the pattern's other half: each loss read as `loss.item()` reads it, waiting for
    the GPU (the harness's own reader copies it behind the queued work and reads it when it
    has arrived, never waiting). The wait falls after the step's "end", outside every phase."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "behind": False})


def build_model(config, fixed=False):
    return common.v1.TinyLlama(config)  # the model is fine; the stopwatch is not


def patches(args):
    if not args.fixed:
        yield mock.patch("harness.device.StepClock", HostClock)
        yield mock.patch("training.trainer.LossReader", LossReadAtOnce)


def main(argv=None) -> int:
    return common.run("stage3", build_model, argv, patches=patches,
                      description="Stage 3: step phases timed with host clocks, no synchronize.")


if __name__ == "__main__":
    sys.exit(main())
