# SPDX-License-Identifier: BSD-3-Clause
"""The MoE layer's gated activation in one pass: h [P, 2I] -> a [P, I], one dtype in and out.

Per row r with expert e = expert_of[r] and output column j, in float32:

    g, u = h[r, gate j] + bias[e, gate j], h[r, up j] + bias[e, up j]   (bias optional)
    silu:       a = silu(g) * u                          gate columns 0 .. I-1, up I .. 2I-1
    swigluoai:  a = (clamp(u, -L, L) + 1) * g' * sigmoid(alpha * g'),  g' = min(g, L)
                                                         gate columns even, up odd (gpt-oss)

then rounded to h's dtype: ``fp4_ops.moe.apply_activation`` on ``h.float() + bias`` in one
kernel instead of half a dozen. Each thread makes VEC consecutive outputs from 16-byte loads
(I is a multiple of 32, so every row and every vector is 16-byte aligned); exp is the accurate
one (no fast math).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from fp4_ops.moe_kernels.dtypes import DTYPES
from fp4_ops.moe_kernels.gating import ACTIVATIONS, SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT

THREADS = 256
VEC = 8  # outputs per thread and step
CTAS_PER_SM = 4


class MoeActivation:
    """h [P, 2I] (+ bias [E, 2I] by expert_of [P]) -> a [P, I]; see the module docstring."""

    def __init__(self, dtype: str, activation: str, bias_dtype: str | None):
        self.dtype = DTYPES[dtype]
        self.activation = activation
        self.bias_dtype = None if bias_dtype is None else DTYPES[bias_dtype]
        self._setup_attributes()

    def _setup_attributes(self):
        self.interleaved = ACTIVATIONS[self.activation]
        self.has_bias = self.bias_dtype is not None
        # registers in the order of memory, so that the copies vectorize
        self.gated_regs = ((2, VEC), (1, 2) if self.interleaved else (VEC, 1))

    def _gated(self, ptr: cute.Pointer, rows: Int32, inter: Int32) -> cute.Tensor:
        """[rows, 2I] as (row, vector, gate / up, element): [r, c, 0, i] the gate of output
        column c * VEC + i, [r, c, 1, i] its up."""
        if const_expr(self.interleaved):
            stride = (2 * inter, 2 * VEC, 1, 2)
        else:
            stride = (2 * inter, VEC, inter, 1)
        return cute.make_tensor(ptr, cute.make_layout((rows, inter // VEC, 2, VEC), stride=stride))

    @cute.jit
    def __call__(
        self,
        h_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        bias_ptr: cute.Pointer,
        expert_of_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32],
        sm_count: Int32,
        stream,
    ):
        rows, inter, experts = problem
        inter = cute.assume(inter, divby=VEC)
        cols = inter // VEC
        mH = self._gated(h_ptr, rows, inter)
        mBias = self._gated(bias_ptr, experts, inter)
        mOut = cute.make_tensor(
            out_ptr, cute.make_layout((rows, cols, VEC), stride=(inter, VEC, 1))
        )
        mExpertOf = cute.make_tensor(expert_of_ptr, cute.make_layout(rows))
        total = rows * cols
        ctas = min((total + THREADS - 1) // THREADS, sm_count * CTAS_PER_SM)
        self.kernel(mH, mBias, mOut, mExpertOf, cols, total).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mH: cute.Tensor,
        mBias: cute.Tensor,
        mOut: cute.Tensor,
        mExpertOf: cute.Tensor,
        cols: Int32,
        total: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        gated = cute.make_layout(self.gated_regs[0], stride=self.gated_regs[1])
        rH = cute.make_rmem_tensor(gated, self.dtype)
        rOut = cute.make_rmem_tensor(VEC, self.dtype)
        for v in range(bidx * THREADS + tidx, total, gdim * THREADS):
            r = v // cols
            c = v - r * cols
            cute.autovec_copy(mH[r, c, None, None], rH)
            gu = rH.load().to(Float32)
            if const_expr(self.has_bias):
                rBias = cute.make_rmem_tensor(gated, self.bias_dtype)
                cute.autovec_copy(mBias[mExpertOf[r], c, None, None], rBias)
                gu = gu + rBias.load().to(Float32)
            rGU = cute.make_rmem_tensor(gated, Float32)
            rGU.store(gu)
            for i in cutlass.range_constexpr(VEC):
                rOut[i] = self._gate(rGU[0, i], rGU[1, i]).to(self.dtype)
            cute.autovec_copy(rOut, mOut[r, c, None])

    @cute.jit
    def _gate(self, g: Float32, u: Float32) -> Float32:
        if const_expr(self.interleaved):
            g = min(g, Float32(SWIGLUOAI_LIMIT))
            u = max(min(u, Float32(SWIGLUOAI_LIMIT)), Float32(-SWIGLUOAI_LIMIT))
            sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-g * Float32(SWIGLUOAI_ALPHA)))
            return (u + Float32(1.0)) * (g * sig)
        return g / (Float32(1.0) + cute.math.exp(-g)) * u


def compile_activation(dtype: str, activation: str, bias_dtype: str | None, options: str = ""):
    """Compile for any P, I (a multiple of VEC) and E; returns the executor.
    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    op = MoeActivation(dtype, activation, bias_dtype)
    gmem = cute.AddressSpace.gmem
    ptrs = (
        make_ptr(DTYPES[dtype], 0, gmem, assumed_align=16),
        make_ptr(DTYPES[dtype], 0, gmem, assumed_align=16),
        make_ptr(DTYPES[bias_dtype or dtype], 0, gmem, assumed_align=16),
        make_ptr(Int32, 0, gmem, assumed_align=4),
    )
    problem = (Int32(1), Int32(VEC), Int32(1))
    return cute.compile(op, *ptrs, problem, Int32(1), cuda_driver.CUstream(0), options=options)
