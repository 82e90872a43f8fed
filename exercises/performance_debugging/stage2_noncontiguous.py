"""Stage 2 - a transposed (non-contiguous) tensor handed to a kernel: correct, and slow.

The kernel: SiLU(gate) * up as one Triton kernel with a backward. Like most
hand-written elementwise kernels it walks the elements in row-major order - the
k-th program handles elements k*BLOCK .. k*BLOCK+BLOCK-1 of the logical matrix -
and honours the strides it is given, so any layout gives the right answer.

The planted mistake: the MLP computes its projections in "maths order",
`gate = (W @ x.T).T`. PyTorch does not care - the result is a free transposed
view - but the kernel does. Neighbouring elements of a row are now `rows`
elements apart in memory, so the threads of one warp/wavefront, which should
read one contiguous run of bytes, each touch a different cache line: most of
every memory transaction is wasted, and this memory-bound kernel slows down
several times. (AMD's TinyTransformer workshop found its flash-attention kernel 20x
slower for the same reason and fixed it with `.contiguous()`.)

The checks that expose it: tokens/s against --fixed, and the profiler's kernel
table, where `silu_mul_fwd_kernel`/`silu_mul_bwd_kernel` take far more time than
their bytes justify (ncu: low "Memory Throughput", many sectors per request).
On a CPU the kernel runs in Triton's interpreter, where every load costs the same:
only `input_strides()` (what the kernel was handed) shows the mistake there.

    python exercises/performance_debugging/stage2_noncontiguous.py --num-steps 20
    python exercises/performance_debugging/stage2_noncontiguous.py --num-steps 20 --fixed
"""
import sys

import torch

import common

triton, tl = common.import_triton()  # on a CPU: the interpreter

BLOCK = 1024
_seen_strides: dict = {}  # what the kernel was last handed, for input_strides()

if triton is not None:
    @triton.jit
    def silu_mul_fwd_kernel(G, U, Y, n_elements, n_cols, sg_row, sg_col, su_row, su_col,
                            BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # logical index, row-major
        mask = offs < n_elements
        row, col = offs // n_cols, offs % n_cols
        # With col-stride 1 neighbouring offsets are neighbouring addresses (coalesced);
        # with a transposed view they are `rows` elements apart (one cache line each).
        g = tl.load(G + row * sg_row + col * sg_col, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row * su_row + col * su_col, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def silu_mul_bwd_kernel(DY, G, U, DG, DU, n_elements, n_cols, sg_row, sg_col, su_row, su_col,
                            BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        row, col = offs // n_cols, offs % n_cols
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + row * sg_row + col * sg_col, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + row * su_row + col * su_col, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g)
        tl.store(DU + offs, (dy * g * sig).to(DU.dtype.element_ty), mask=mask)
        # d silu(g)/dg = sig * (1 + g * (1 - sig))
        tl.store(DG + offs, (dy * u * sig * (1 + g * (1 - sig))).to(DG.dtype.element_ty), mask=mask)


def _launch(kernel, *tensors, gate, up):
    rows, cols = gate.shape
    grid = (triton.cdiv(rows * cols, BLOCK),)
    kernel[grid](*tensors, rows * cols, cols, *gate.stride(), *up.stride(), BLOCK=BLOCK)


class SiluMul(torch.autograd.Function):
    """silu(gate) * up for 2-D gate and up of any layout; outputs are row-major."""

    @staticmethod
    def forward(ctx, gate, up):
        _seen_strides.update(gate=gate.stride(), up=up.stride(), shape=tuple(gate.shape))
        y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        _launch(silu_mul_fwd_kernel, gate, up, y, gate=gate, up=up)
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dg, du = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device), torch.empty_like(dy)
        _launch(silu_mul_bwd_kernel, dy.contiguous(), gate, up, dg, du, gate=gate, up=up)
        return dg, du


def input_strides() -> dict:
    """Strides of the last gate/up the kernel read: (cols, 1) is row-major, (1, rows) transposed."""
    return dict(_seen_strides)


class KernelSwiGLU(common.v1.SwiGLU):
    def __init__(self, cfg, fixed: bool):
        super().__init__(cfg)
        self.fixed = fixed

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        if self.fixed:
            gate, up = self.gate_proj(x2), self.up_proj(x2)  # x @ W^T: row-major, contiguous
        else:
            # MISTAKE: y = W x in maths notation, transposed back - a free, strided view.
            gate = (self.gate_proj.weight @ x2.t()).t()
            up = (self.up_proj.weight @ x2.t()).t()
        return self.down_proj(SiluMul.apply(gate, up)).view(*x.shape[:-1], -1)


def build_model(config, fixed=False):
    model = common.v1.TinyLlama(config)
    for block in model.layers:
        state = block.mlp.state_dict()
        block.mlp = KernelSwiGLU(config, fixed)
        block.mlp.load_state_dict(state)
    return model


def main(argv=None) -> int:
    return common.run("stage2", build_model, argv,
                      description="Stage 2: a Triton SwiGLU kernel handed transposed views.",
                      needs_triton=True)


if __name__ == "__main__":
    sys.exit(main())
