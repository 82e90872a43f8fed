"""Version 1: a tiny LLaMA in plain PyTorch, written to be read.

Every operation is spelled out the way a textbook writes it: separate q/k/v/o
projections, rotary position embeddings, attention as an explicit causal mask
plus softmax, RMSNorm from pow/mean/rsqrt, and a SwiGLU MLP with separate
gate/up/down projections. Nothing is fused, so every step is its own kernel
launch and every intermediate is written to memory - that is the baseline the
later versions improve on.

The parameter names here are the reference layout: versions 2-4 load this
model's state_dict().

Run:  python version1_baseline/tiny_llama_v1.py --preset tiny
"""
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a fresh clone
import training  # noqa: E402
from harness import ModelConfig  # noqa: E402
from version1_baseline.spec import SPEC  # noqa: E402


class RMSNorm(nn.Module):
    """Scale each token's vector to unit root-mean-square, then by a learned gain.

    Cheaper than LayerNorm (no mean subtraction, no bias) and what LLaMA uses.
    Computed in fp32: squaring bf16 values loses too much precision.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * inv_rms).type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None):
    """cos/sin tables for rotary embeddings: one frequency per pair of channels."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)  # (T, hd/2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate channel pairs (i, i + head_dim/2) of q or k by a position-dependent angle.

    x: (B, heads, T, head_dim). Relative position then shows up in q.k as a
    phase difference, which is how LLaMA encodes order. Pairing the two halves
    (rather than neighbouring channels) keeps every slice contiguous.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_dim, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        # Grouped-query attention: several query heads share one k/v head.
        # The baseline simply copies each k/v head; V4's SDPA avoids the copy.
        repeats = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(repeats, dim=1)
        v = v.repeat_interleave(repeats, dim=1)

        # The full (T x T) score matrix per head is materialised in memory: this
        # is what makes V1's attention memory-bound, and what flash attention removes.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = probs @ v  # (B, heads, T, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    """LLaMA's MLP: down( silu(gate(x)) * up(x) )."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.hidden_dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        # GPT-2/LLaMA style: small normal init keeps early logits near uniform,
        # so the first loss is close to ln(vocab_size).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, ids):
        B, T = ids.shape
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        cos, sin = rope_tables(self.config.head_dim, T, self.config.rope_theta, ids.device)
        x = self.embed(ids)
        for block in self.layers:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def build_model(config: ModelConfig) -> nn.Module:
    return TinyLlama(config)


def main(argv=None) -> int:
    return training.main(SPEC, build_model, argv=argv,
                         description="Version 1: the plain PyTorch baseline.")


if __name__ == "__main__":
    sys.exit(main())
