"""Version 3's hand-written Triton kernels, forward AND backward, one file per family:

    rmsnorm.py          RMSNorm: a memory-bound row reduction, optionally with the
                        residual add in front of it (add_rms_norm)
    row_sums.py         a sum over every program's row inside the kernel that wrote
                        them (RMSNorm's weight gradient): tickets, no second launch
    rope.py             rotary embedding of q and k, one kernel each way
    flash_attention.py  causal flash attention: online softmax; its backward kernels
                        (recomputing, no T x T matrix) are flash_attention_backward.py,
                        the tiles and launch configs both share attention_tiles.py
    attention_hopper.py the same attention for Hopper GPUs at head sizes 64 and 128, in Gluon
                        (TMA, asynchronous warp-group MMAs): chosen where it pays
    attention_rope.py   RoPE on load (--rope-in-attention): the attention kernels handed
                        loads that rotate q and k, and stores that unrotate their gradients
    qkv_attention.py    RoPE + attention on the QKV GEMM's output, whose gradient the
                        kernels write in one piece (no new kernel)
    swiglu.py           silu(gate) * up on the gate/up GEMM's output, its gradient
                        written in one piece
    recompute.py        a kernel and the GEMM after it in one autograd step that rebuilds
                        the GEMM's input in the backward instead of keeping it (the norms,
                        SwiGLU): memory for one more launch
    linear_cross_entropy.py  the output layer and the loss a chunk of rows at a time:
                        the (rows, vocab) logits never exist whole
    attention_tables.py flash attention's candidate launch configurations per GPU
                        family and head size, the shared memory each needs
    configs.py          how a launch configuration is chosen: the memory-bound rules,
                        the autotuner's prune, the forced-config hook
    common.py           what they share: the launch and the operator registration
    target.py           the GPU a kernel is built for (re-exported by common.py)

Each kernel file reads like a Triton tutorial: the PyTorch reference, the forward
kernel, the backward kernel(s), the launch configuration, the torch.library binding.
On a machine without a GPU set TRITON_INTERPRET=1 *before* importing triton: the
kernels then run, slowly, in Triton's CPU interpreter (the tests do this).
"""
from .common import (INTERPRET, chosen_configs, current_target,  # noqa: F401
                     eager_operators, triton_backend)
from . import attention_hopper  # noqa: F401
from .attention_tables import attention_warning  # noqa: F401
from .configs import (FORCED_CONFIGS, KERNEL_NAMES, check_config, forced_config,  # noqa: F401
                      read_environment)
from .flash_attention import attention_backward, attention_forward, flash_attention  # noqa: F401
from .attention_rope import flash_attention_rope  # noqa: F401
from .linear_cross_entropy import linear_cross_entropy  # noqa: F401
from .qkv_attention import qkv_attention  # noqa: F401
from .rmsnorm import (add_rms_norm, add_rmsnorm_backward, add_rmsnorm_forward,  # noqa: F401
                      rms_norm, rmsnorm_backward, rmsnorm_forward)
from .rope import rope, rope_forward  # noqa: F401
from .swiglu import swiglu, swiglu_backward, swiglu_forward  # noqa: F401
from .recompute import add_rms_norm_linear, swiglu_linear  # noqa: F401
