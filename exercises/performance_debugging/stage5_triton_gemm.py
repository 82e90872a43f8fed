"""Stage 5 - a hand-written matrix multiply in Triton: correct, and slower than the vendor library.

The planted mistake: every nn.Linear runs on a GEMM we wrote ourselves - the first
version of the Triton tutorial's tiled matmul, with one fixed tile size, no
autotuning and no grouped tile order. It is correct (it has a backward, and the
losses match V1), so no guard fires. It is just slow: rocBLAS/hipBLASLt and
cuBLAS/cuBLASLt pick among hundreds of tuned kernels per shape and GPU.

The lesson of the workshop's V3: write kernels where the library has nothing
fused to offer (norms, attention, activations - memory-bound chains), and leave
dense GEMMs to BLAS.

The checks that expose it: tokens/s against --fixed (same model on torch.matmul),
and the profiler's kernel table, where `matmul_kernel` tops the list with a
lower achieved TFLOP/s than the library's GEMMs it replaced.

    python exercises/performance_debugging/stage5_triton_gemm.py --num-steps 20
    python exercises/performance_debugging/stage5_triton_gemm.py --num-steps 20 --fixed

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1): correct but
thousands of times slower, so only the losses mean something there.
"""
import sys

import torch
import torch.nn as nn

import common

triton, tl = common.import_triton()  # on a CPU: the interpreter

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32  # one tile size for every shape: the first mistake

if triton is not None:
    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """C[M, N] = A[M, K] @ B[K, N]; one program computes one BLOCK_M x BLOCK_N tile of C."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # accumulate in fp32 whatever the inputs
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                        mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
            b = tl.load(b_ptr + (k0 + ks)[:, None] * stride_bk + cols[None, :] * stride_bn,
                        mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc += tl.dot(a, b, input_precision="ieee")  # fp32 means fp32 (no TF32), as in the harness
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a, b):
    """a (M, K) @ b (K, N) with any strides (transposed views need no copy)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return c


class TritonLinearFunction(torch.autograd.Function):
    """y = x @ W^T, with the backward a linear layer needs: dx = dy @ W, dW = dy^T @ x."""

    @staticmethod
    def forward(ctx, x, weight):
        device_type = x.device.type
        # Autocast does not reach inside a custom Function: apply its dtype ourselves.
        dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
                 else x.dtype)
        x2, w = x.reshape(-1, x.shape[-1]).to(dtype), weight.to(dtype)
        ctx.save_for_backward(x2, w)
        ctx.weight_dtype, ctx.x_shape = weight.dtype, x.shape
        return matmul(x2, w.t()).view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        x2, w = ctx.saved_tensors
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(x2.dtype)
        grad_x = matmul(g, w).view(ctx.x_shape)
        grad_w = matmul(g.t(), x2).to(ctx.weight_dtype)
        return grad_x, grad_w


class TritonLinear(nn.Linear):
    def forward(self, x):
        return TritonLinearFunction.apply(x, self.weight)  # MISTAKE: a GEMM BLAS does better


def build_model(config, fixed=False):
    model = common.v1.TinyLlama(config)
    if not fixed:
        for module in model.modules():
            if type(module) is nn.Linear:
                module.__class__ = TritonLinear  # same parameters, new forward
    return model


def main(argv=None) -> int:
    return common.run("stage5", build_model, argv,
                      description="Stage 5: every linear layer on a hand-written Triton GEMM.",
                      needs_triton=True)


if __name__ == "__main__":
    sys.exit(main())
