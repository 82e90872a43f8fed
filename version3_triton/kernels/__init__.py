"""Version 3's hand-written Triton kernels, forward AND backward, one file per family:

    rmsnorm.py          RMSNorm: a memory-bound row reduction
    rope.py             rotary embedding of q and k, one kernel each way
    flash_attention.py  causal flash attention: online softmax, recomputing backward
    common.py           what they share: the target GPU, the launch configurations
                        per target, the forced-config hook, the operator registration

Each kernel file reads like a Triton tutorial: the PyTorch reference, the forward
kernel, the backward kernel(s), the launch configuration, the torch.library binding.
On a machine without a GPU set TRITON_INTERPRET=1 *before* importing triton: the
kernels then run, slowly, in Triton's CPU interpreter (the tests do this).
"""
from .common import (FORCED_CONFIGS, INTERPRET, KERNEL_NAMES, attention_warning,  # noqa: F401
                     backend, check_config, chosen_configs, current_target, eager_operators,
                     forced_config)
from .flash_attention import attention_backward, attention_forward, flash_attention  # noqa: F401
from .rmsnorm import rms_norm, rmsnorm_backward, rmsnorm_forward  # noqa: F401
from .rope import rope, rope_forward  # noqa: F401
