"""Try a change to the model before it goes into V2/V4: V4 with variants patched in.

    python benchmarks/v4_variants.py VARIANT [V4 flags...]
    python benchmarks/v4_variants.py rope+swiglu --preset medium --precision bf16 \
        --compile --compile-mode reduce-overhead --num-steps 40 --warmup-steps 15

VARIANT is "base" or a "+"-joined list of:
    rope      RoPE applied on the (B, T, heads, D) layout, before the head transpose
    ropehalf  RoPE as two half-width products and one cat (no rotate_half, no negation)
    swiglu    SiLU*mul as an autograd.Function whose backward writes d(gate|up) as two
              slices of one buffer (instead of the cat that split's backward builds)
    cdt       Inductor's coordinate-descent tuning of its generated kernels
    cat1      Inductor never lowers a cat as one "pointwise cat" kernel (each output
              element evaluates every input, masked: the backward of a split reads
              its inputs twice); it writes each input into its slice instead
Each variant keeps V1's maths (same final loss on the tiny preset); only speed
differs. Results of the H200 runs are in docs/PERFORMANCE.md (issue 3).
This is a lab bench, not a version: the winners move into the model files.
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
import torch.nn.functional as F
from version2_fused import tiny_llama_v2 as v2

variant, argv = sys.argv[1], sys.argv[2:]
parts = set(variant.split("+"))

if "rope" in parts:  # RoPE on (B, T, H, D) before the head transpose
    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x)
        c, s = cos[:, None, :], sin[:, None, :]
        q = v2.apply_rope(q.view(B, T, self.num_heads, self.head_dim), c, s).transpose(1, 2)
        k = v2.apply_rope(k.view(B, T, self.num_kv_heads, self.head_dim), c, s).transpose(1, 2)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        out = self.attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
    v2.Attention.forward = forward

if "ropehalf" in parts:  # no rotate_half cat: two half-width products
    def apply_rope(x, cos, sin):
        x32 = x.float()
        h = x.shape[-1] // 2
        x1, x2 = x32[..., :h], x32[..., h:]
        c, s = cos[..., :h], sin[..., :h]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)
    v2.apply_rope = apply_rope

if "swiglu" in parts:  # backward writes d(gate|up) as two slices of one buffer
    class SiluMulPacked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gu):
            ctx.save_for_backward(gu)
            g, u = gu.chunk(2, dim=-1)
            return F.silu(g) * u

        @staticmethod
        def backward(ctx, dh):
            (gu,) = ctx.saved_tensors
            g, u = gu.float().chunk(2, dim=-1)
            dh = dh.float()
            s = torch.sigmoid(g)
            d = torch.empty_like(gu)
            n = g.shape[-1]
            d[..., :n] = (dh * u * s * (1 + g * (1 - s))).to(gu.dtype)
            d[..., n:] = (dh * g * s).to(gu.dtype)
            return d

    def mlp_forward(self, x):
        gu = F.linear(x, self.gate_up_proj.weight)
        return self.down_proj(SiluMulPacked.apply(gu))
    v2.SwiGLU.forward = mlp_forward

if "cdt" in parts:
    import torch._inductor.config as ic
    ic.coordinate_descent_tuning = True

if "cat1" in parts:
    import torch._inductor.config as ic
    for knob in ("max_pointwise_cat_inputs", "max_complex_pointwise_cat_inputs"):
        if hasattr(ic, knob):  # the second one is newer than torch 2.11
            setattr(ic, knob, 1)

from version4_sdpa import tiny_llama_v4 as v4  # noqa: E402
sys.exit(v4.main(argv))
