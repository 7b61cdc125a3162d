# SPDX-License-Identifier: BSD-3-Clause
"""The MoE layer's weighted combine in one pass: y [P, H] (rows by expert) -> out [T, H].

For token t with slots s = 0 .. k-1, pair p = t * k + s at row r = row_of[p], in float32:

    out[t] = sum_s  topk_weights[t, s] * (y[r] + bias[expert_of[r]])     (bias optional)

summed in slot order, then rounded to y's dtype: ``fp4_ops.moe``'s scatter back to (token,
slot) order, bias, weighting and sum in one kernel instead of half a dozen. Each thread makes
VEC consecutive columns of one token from 16-byte loads (H is a multiple of 32).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fp4_ops.moe_kernels.dtypes import DTYPES

THREADS = 256
VEC = 8  # columns per thread and step
CTAS_PER_SM = 4


class MoeCombine:
    """(y, topk_weights, row_of, bias, expert_of) -> out [T, H]; see the module docstring."""

    def __init__(self, dtype: str, weights_dtype: str, bias_dtype: str | None):
        self.dtype = DTYPES[dtype]
        self.weights_dtype = DTYPES[weights_dtype]
        self.bias_dtype = None if bias_dtype is None else DTYPES[bias_dtype]
        self._setup_attributes()

    def _setup_attributes(self):
        self.has_bias = self.bias_dtype is not None

    @cute.jit
    def __call__(
        self,
        y_ptr: cute.Pointer,
        weights_ptr: cute.Pointer,
        row_of_ptr: cute.Pointer,
        bias_ptr: cute.Pointer,
        expert_of_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32, Int32],
        sm_count: Int32,
        stream,
    ):
        tokens, top_k, hidden, experts = problem
        hidden = cute.assume(hidden, divby=VEC)
        cols = hidden // VEC
        pairs = tokens * top_k
        rows_layout = cute.make_layout((pairs, cols, VEC), stride=(hidden, VEC, 1))
        mY = cute.make_tensor(y_ptr, rows_layout)
        mBias = cute.make_tensor(
            bias_ptr, cute.make_layout((experts, cols, VEC), stride=(hidden, VEC, 1))
        )
        mOut = cute.make_tensor(
            out_ptr, cute.make_layout((tokens, cols, VEC), stride=(hidden, VEC, 1))
        )
        mWeights = cute.make_tensor(weights_ptr, cute.make_layout(pairs))
        mRowOf = cute.make_tensor(row_of_ptr, cute.make_layout(pairs))
        mExpertOf = cute.make_tensor(expert_of_ptr, cute.make_layout(pairs))
        total = tokens * cols
        ctas = min((total + THREADS - 1) // THREADS, sm_count * CTAS_PER_SM)
        self.kernel(mY, mWeights, mRowOf, mBias, mExpertOf, mOut, top_k, cols, total).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mY: cute.Tensor,
        mWeights: cute.Tensor,
        mRowOf: cute.Tensor,
        mBias: cute.Tensor,
        mExpertOf: cute.Tensor,
        mOut: cute.Tensor,
        top_k: Int32,
        cols: Int32,
        total: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rY = cute.make_rmem_tensor(VEC, self.dtype)
        rOut = cute.make_rmem_tensor(VEC, self.dtype)
        for v in range(bidx * THREADS + tidx, total, gdim * THREADS):
            t = v // cols
            c = v - t * cols
            acc = cute.zeros_like(rY, Float32)
            for s in range(top_k):
                p = t * top_k + s
                r = mRowOf[p]
                cute.autovec_copy(mY[r, c, None], rY)
                y = rY.load().to(Float32)
                if const_expr(self.has_bias):
                    rBias = cute.make_rmem_tensor(VEC, self.bias_dtype)
                    cute.autovec_copy(mBias[mExpertOf[r], c, None], rBias)
                    y = y + rBias.load().to(Float32)
                acc = acc + Float32(mWeights[p]) * y
            rOut.store(acc.to(self.dtype))
            cute.autovec_copy(rOut, mOut[t, c, None])


def compile_combine(dtype: str, weights_dtype: str, bias_dtype: str | None, options: str = ""):
    """Compile for any T, k, H (a multiple of VEC) and E; returns the executor.
    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    op = MoeCombine(dtype, weights_dtype, bias_dtype)
    gmem = cute.AddressSpace.gmem
    ptrs = (
        make_ptr(DTYPES[dtype], 0, gmem, assumed_align=16),
        make_ptr(DTYPES[weights_dtype], 0, gmem, assumed_align=DTYPES[weights_dtype].width // 8),
        make_ptr(Int32, 0, gmem, assumed_align=4),
        make_ptr(DTYPES[bias_dtype or dtype], 0, gmem, assumed_align=16),
        make_ptr(Int32, 0, gmem, assumed_align=4),
        make_ptr(DTYPES[dtype], 0, gmem, assumed_align=16),
    )
    problem = (Int32(1), Int32(1), Int32(VEC), Int32(1))
    return cute.compile(op, *ptrs, problem, Int32(1), cuda_driver.CUstream(0), options=options)
