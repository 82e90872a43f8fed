"""Stage 4 - a kernel without a backward: the autograd graph is cut, backward looks free.

The planted mistake: RMSNorm is replaced by a "kernel" that fills a fresh tensor the way
a hand-written GPU kernel does (`out = torch.empty_like(x)`, then launch). Nothing tells
autograd how `out` depends on `x` or on the norm's weight, so gradients stop there.
The final norm sits between every block and the loss: only the output head still
learns. Backward now skips almost all the work and the step gets "faster" - the fake
3x speed-up AMD's TinyTransformer workshop reported (README) (its "0.6 ms backward").

The checks that expose it:
  * the harness's gradient-flow guard after step 1: every parameter must receive a
    finite, non-zero gradient. Here it does not, and the run stops with exit code 5;
  * with the guard switched off (--skip-guard, to see what that workshop saw), the
    results' warnings say "backward is faster than forward" - on a GPU a healthy
    backward costs about twice the forward.

    python exercises/performance_debugging/stage4_cut_graph.py --num-steps 10     # exit 5
    python exercises/performance_debugging/stage4_cut_graph.py --num-steps 10 --skip-guard
    python exercises/performance_debugging/stage4_cut_graph.py --num-steps 10 --fixed
"""
import sys
from unittest import mock

import torch

import common


def rmsnorm_kernel_without_backward(x, weight, eps):
    """Stands in for launching a raw kernel: the result is written into a new tensor."""
    out = torch.empty_like(x)
    with torch.no_grad():  # what a kernel launch looks like to autograd: nothing happened
        x32 = x.float()
        out.copy_((x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight)
    return out  # MISTAKE: no autograd.Function, so no backward


class KernelRMSNorm(common.v1.RMSNorm):
    def forward(self, x):
        return rmsnorm_kernel_without_backward(x, self.weight, self.eps)


def build_model(config, fixed=False):
    model = common.v1.TinyLlama(config)
    if not fixed:
        for parent in [model, *model.layers]:
            for name, child in parent.named_children():
                if type(child) is common.v1.RMSNorm:
                    kernel_norm = KernelRMSNorm(config.hidden_dim, config.norm_eps)
                    kernel_norm.load_state_dict(child.state_dict())
                    setattr(parent, name, kernel_norm)
    return model


def add_arguments(group):
    group.add_argument("--skip-guard", action="store_true",
                       help="switch the gradient-flow guard off to see the fake speed-up")


def patches(args):
    if args.skip_guard:
        # Report 0 checked parameters: the results then show the guard did not look.
        yield mock.patch("harness.measure.check_gradient_flow", lambda model: 0)


def main(argv=None) -> int:
    return common.run("stage4", build_model, argv, add_arguments=add_arguments, patches=patches,
                      description="Stage 4: RMSNorm as a kernel without backward (graph cut).")


if __name__ == "__main__":
    sys.exit(main())
