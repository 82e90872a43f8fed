"""FLOP model, peak table and MFU.

Convention (PaLM appendix B, nanoGPT's estimate_mfu): a training step costs per
token
    6 * N_matmul            (forward 2*N, backward 4*N, for every weight in a matmul)
  + 12 * L * d * T          (attention scores Q@K^T and P@V: forward 4*L*d*T, x3)
where N_matmul counts the weights that take part in matrix products - every
linear layer and the output head, but not the embedding lookup or the norms -
L is layers, d = num_heads*head_dim (= hidden), T the sequence length. There is
no causal discount: the model FLOPs are the same whichever attention kernel
runs, so MFU compares implementations fairly.

Attention *kernels* are usually reported with another convention (FlashAttention
papers): 4*B*H*T^2*D forward, halved when causal, backward = 2.5x forward. We
report it separately as `attention_kernel_flops`.
"""
from __future__ import annotations

from .config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
    d, hd = cfg.hidden_dim, cfg.head_dim
    attn = d * (cfg.num_heads * hd) + 2 * d * (cfg.num_kv_heads * hd) + (cfg.num_heads * hd) * d
    mlp = 3 * d * cfg.ffn_dim
    head = d * cfg.vocab_size
    return cfg.num_layers * (attn + mlp) + head


def total_params(cfg: ModelConfig) -> int:
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_dim
    embedding = cfg.vocab_size * cfg.hidden_dim
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_dim
    return matmul_params(cfg) - cfg.vocab_size * cfg.hidden_dim + head + embedding + norms


def model_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs (forward + backward) per token, in the convention above."""
    return 6 * matmul_params(cfg) + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len


def forward_flops(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    return model_flops_per_token(cfg, seq_len) * batch_size * seq_len // 3


def step_flops(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    return model_flops_per_token(cfg, seq_len) * batch_size * seq_len


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> dict:
    """One attention call's FLOPs: QK^T and PV, 2 * seq * seq * head_dim multiply-adds per
    head, half of them under a causal mask; the backward 2.5x (dV, dP, dS -> dQ and dK: five
    products to the forward's two)."""
    fwd = 4 * batch * heads * seq * seq * head_dim
    if causal:
        fwd //= 2
    return {"forward": fwd, "backward": int(2.5 * fwd), "causal": causal}


def attention_kernel_flops(cfg: ModelConfig, batch_size: int, seq_len: int,
                           causal: bool = True) -> dict:
    """attention_flops over a step's layers."""
    one = attention_flops(batch_size, cfg.num_heads, seq_len, cfg.head_dim, causal)
    return {"forward": one["forward"] * cfg.num_layers,
            "backward": one["backward"] * cfg.num_layers, "causal": causal}


def attention_shape(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int) -> str:
    """An attention shape's name in the kernel table (benchmarks/bench_kernels.py) and the docs
    that quote its rows: 'b8 h16 kv8 s2048 d128' ('kv' only where it differs from 'h')."""
    return f"b{batch} h{heads}" + (f" kv{kv_heads}" if kv_heads != heads else "") + f" s{seq} d{head_dim}"


# Dense (no sparsity) datasheet peaks in TFLOP/s, per device as PyTorch sees it
# (an MI250X is two devices - one per GCD - so its figures are per GCD).
# Keys: fp32 = vector FP32, tf32 = FP32 through matrix units (xf32 / TF32),
# bf16 / fp16 = matrix units. None = not supported in hardware.
# Sources: AMD Instinct and NVIDIA datasheets (see shared/PROFILERS.md section 7.2).
PEAK_TFLOPS: dict[str, dict] = {
    "MI50":   {"fp32": 13.3, "tf32": None, "fp16": 26.5, "bf16": None, "hbm_tbs": 1.02},
    "MI100":  {"fp32": 23.1, "tf32": 46.1, "fp16": 184.6, "bf16": 92.3, "hbm_tbs": 1.23},
    "MI210":  {"fp32": 22.6, "tf32": 45.3, "fp16": 181.0, "bf16": 181.0, "hbm_tbs": 1.6},
    "MI250X": {"fp32": 23.9, "tf32": 47.9, "fp16": 191.5, "bf16": 191.5, "hbm_tbs": 1.6},
    "MI300A": {"fp32": 122.6, "tf32": 490.3, "fp16": 980.6, "bf16": 980.6, "hbm_tbs": 5.3},
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "hbm_tbs": 5.3},
    "MI325X": {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "hbm_tbs": 6.0},
    "A100":   {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "hbm_tbs": 2.0},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "hbm_tbs": 2.0},
    "H100":   {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "hbm_tbs": 3.35},
    "H200":   {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "hbm_tbs": 4.8},
}

# ROCm reports marketing names inconsistently ("AMD Instinct MI300X", or just
# "AMD Radeon Graphics" with gfx942); the gfx architecture is a fallback.
_ARCH_FALLBACK = {"gfx906": "MI50", "gfx908": "MI100", "gfx90a": "MI250X", "gfx942": "MI300X"}


def lookup_peak(device_name: str, arch: str | None = None) -> tuple[str, dict] | None:
    name = device_name.upper()
    # Longest key first, so "H100 PCIE" wins over "H100" and "MI300X" over "MI300".
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.upper() in name:
            return key, PEAK_TFLOPS[key]
    if arch:
        key = _ARCH_FALLBACK.get(arch.split(":")[0])
        if key:
            return key, PEAK_TFLOPS[key]
    return None


def peak_for(device_name: str, arch: str | None, precision: str,
             measured_tflops: float | None = None) -> dict:
    """Which peak MFU is computed against; `source` says where it came from."""
    if measured_tflops:
        return {"tflops": measured_tflops, "source": "measured", "device_key": None}
    found = lookup_peak(device_name, arch)
    if found is None:
        return {"tflops": None, "source": "unknown device: no MFU", "device_key": None}
    key, row = found
    value = row.get(precision)
    if value is None:
        return {"tflops": None, "source": f"{key} has no {precision} peak", "device_key": key}
    return {"tflops": value, "source": f"datasheet {key} {precision}", "device_key": key}
