"""Version 3 declared once: V2's fusions and V3's Triton kernels, each a switch, with the
rules between them (`needs`; harness/spec.py says who reads this)."""
from harness.spec import Switch, VersionSpec
from version2_fused.spec import FUSIONS

FALLS_BACK = "falls back to V2's version"
# From this many words on, the logits (rows x vocabulary, and their fp32 gradient) are the
# step's largest tensors and the fused loss pays in time and memory: the large preset's 32k
# does, the medium preset's 1,000 has nothing to save (V3's README, both tables).
LARGE_VOCABULARY = 8192


def large_vocabulary(model) -> bool:
    return model.vocab_size >= LARGE_VOCABULARY


KERNELS = (
    # the Triton norm saves only its input on every device (V2's F.rms_norm, GPUs only, its
    # input and 1/rms): its backward recomputes 1/rms from the input it loads anyway
    Switch("triton_rmsnorm", "RMSNorm forward/backward as Triton kernels", off=FALLS_BACK,
           memory={True: {"fused_norm": True, "norm_stats": False}}),
    # without its attention kernels V3 runs V2's: the T x T scores, k and v repeated per head
    Switch("triton_attention", "flash attention forward/backward as Triton kernels", off=FALLS_BACK,
           memory={False: {"attention": "explicit", "gqa_native": False}}),
    # it rotates q and k in the output of the one QKV GEMM; q and k keep their size
    Switch("triton_rope", "RoPE of q and k as one Triton kernel each way", off=FALLS_BACK,
           needs=("fused_qkv",), memory={}),
    # the kernels rotate each q and k tile as they load it: no rotated copy exists
    Switch("rope_in_attention", "RoPE applied by the attention kernels as they load q and k, "
           "instead of the RoPE kernel's own pass; eager only, see the README", default=False,
           needs=("triton_attention", "triton_rope"), memory={True: {"rotated_qk": "on load"}}),
    # h is stored either way; the add moves into the next norm's kernels
    Switch("fused_residual_norm", "each residual add done by the next RMSNorm's kernels",
           off=FALLS_BACK, needs=("triton_rmsnorm",), memory={}),
    # the QKV gradient written in one piece is a transient of backward
    Switch("fused_qkv_grad", "RoPE and attention as one step on the QKV GEMM's output, whose "
           "gradient the kernels write whole", off=FALLS_BACK,
           needs=("triton_attention", "triton_rope"), memory={}),
    # the rotated q, k not kept for attention's backward: rotated again from the QKV output
    Switch("recompute_rope", "q and k rotated again in backward from the QKV output (kept anyway) "
           "instead of kept rotated: a copy of q and k less per block, one RoPE kernel more per "
           "backward", default=False, needs=("fused_qkv_grad",), memory={True: {"rotated_qk": "recomputed"}}),
    Switch("triton_swiglu", "silu(gate) * up as one Triton kernel each way on the gate/up GEMM's "
           "output, its gradient written whole", off=FALLS_BACK, needs=("fused_gate_up",),
           memory={True: {"fused_swiglu": True}}),
    # silu(gate) * up not kept for the down projection's weight gradient: rebuilt in backward
    Switch("recompute_swiglu", "silu(gate) * up recomputed in backward from the gate/up output "
           "(kept anyway) instead of kept for the down projection: one (rows, ffn) tensor less "
           "per block, one SwiGLU kernel more per backward", default=False,
           needs=("triton_swiglu",), memory={True: {"swiglu_recompute": True}}),
    # the norms' outputs not kept for the QKV and gate/up GEMMs' weight gradients
    Switch("recompute_norm", "each norm's output recomputed in backward from the residual "
           "stream (kept anyway) instead of kept for the GEMM after it: two (rows, hidden) "
           "tensors less per block, two norm kernels more per backward", default=False,
           needs=("fused_residual_norm", "triton_rope", "triton_swiglu"),
           memory={True: {"norm_recompute": True}}),
    # the loss in forward, a chunk of rows at a time: no whole logits, no fp32 copy of them
    Switch("fused_linear_ce", "the output layer and the loss computed together a chunk of rows "
           "at a time (kernels/linear_cross_entropy.py): the whole logits never exist; on by "
           f"default where the vocabulary has {LARGE_VOCABULARY:,} words or more",
           default=large_vocabulary, needs=("fused_residual_norm",), memory={True: {"loss": "chunked"}},
           off="computes the whole logits, then the loss"),
    # launch configurations forced through the environment: recorded, they change nothing
    Switch("kernel_configs", "forced launch configurations", default=None, flag=False, memory={}),
)

SPEC = VersionSpec(
    name="v3", adds="Triton RMSNorm, RoPE and flash attention",
    modes=("eager", "compile", "reduce-overhead", "reduce-overhead-master"),
    memory={"attention": "flash", "gqa_native": True}, switches=FUSIONS + KERNELS)
