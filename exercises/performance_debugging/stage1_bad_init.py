"""Stage 1 - a bad weight initialisation: the first loss is far above ln(vocab_size).

The planted mistake: every linear and embedding weight is drawn from N(0, 1), the
"textbook" normal, instead of LLaMA's N(0, 0.02). Each matmul then multiplies the
activations' scale by about sqrt(fan_in), so the logits come out huge, softmax is
almost one-hot on a random token, and cross-entropy starts at tens (tiny preset) or
hundreds (medium) instead of ln(vocab_size) - the loss of a model that knows nothing
and says so with uniform probabilities.

The check that exposes it: compare the loss of step 1 with ln(vocab_size)
(5.55 for vocab 256, 6.91 for vocab 1000). No profiler needed - read the first
progress line.

    python exercises/performance_debugging/stage1_bad_init.py --num-steps 10
    python exercises/performance_debugging/stage1_bad_init.py --num-steps 10 --fixed
"""
import sys

import torch.nn as nn

import common


class BadInitLlama(common.v1.TinyLlama):
    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=1.0)  # MISTAKE: should be std=0.02


def build_model(config, fixed=False):
    return common.v1.TinyLlama(config) if fixed else BadInitLlama(config)


def main(argv=None) -> int:
    # init_from_v1=False: loading V1's (good) weights would hide the mistake.
    return common.run("stage1", build_model, argv, init_from_v1=False,
                      description="Stage 1: weights initialised with std 1.0 instead of 0.02.")


if __name__ == "__main__":
    sys.exit(main())
