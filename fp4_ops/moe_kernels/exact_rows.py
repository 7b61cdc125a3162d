# SPDX-License-Identifier: BSD-3-Clause
"""FP4 rows -> their exact BF16 values, for the Hopper W4A4 MoE layer's grouped GEMM:

    out[r, j] = e2m1(codes[r, j]) * scale[r, j // vec] * shift   (shift: 1 NVFP4, MXFP4_BF16_SHIFT)

from packed codes [P, K/2] (element 2i in the low nibble) and their blocked scales
(``fp4_ops.layout.to_blocked``). Hopper has no FP4 tensor cores: its W4A4 kernels turn FP4 into
16 bits, and here the grouped W4A16 kernel then runs on these rows, its alpha taking 1 / shift
back. Every product has at most 6 significant bits (e2m1 2, E4M3 4, E8M0 1), so its one rounding
to BF16 is exact: MXFP4 carries 2^-2 so that 6 x 2^127 stays finite and 0.5 x 2^-127 becomes the
BF16 subnormal 2^-130. The values are formed in float32 from their bits (no lookup, subnormals
kept), NaN scale bytes (E4M3 0x7f / 0xff, E8M0 0xff) give NaN, as ``reference.dequantize_fp4``.

Each thread converts 16 values (8 bytes of codes: one NVFP4 block, half an MXFP4 one) per step
of a grid-stride loop: one 8-byte load, one scale byte, two 16-byte stores.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Uint8, Uint32, const_expr

from fp4_ops.layout import MXFP4_BF16_SHIFT
from fp4_ops.sm90.gemm import SF_ATOM_COLS, blocked_sf_byte

THREADS = 256
VALUES = 16  # per thread and step
CTAS_PER_SM = 4
E4M3_NAN = 0x7F  # (magnitude bits)
E8M0_NAN = 0xFF
SHIFT_EXP = round(math.log2(MXFP4_BF16_SHIFT))
# float32 bits: 0.5, and the 2^-6 of E4M3's subnormal step
F32_HALF = 0x3F000000
F32_2POW_M6 = 0x3C800000


class MoeExactRows:
    """codes [P, K/2] + blocked scales -> BF16 [P, K]; see the module docstring."""

    def __init__(self, sf_vec_size: int):
        self.sf_vec_size = sf_vec_size
        self._setup_attributes()

    def _setup_attributes(self):
        self.nvfp4 = self.sf_vec_size == 16
        # steps (16 values) per scale column
        self.steps_per_scale = self.sf_vec_size // VALUES

    @cute.jit
    def __call__(
        self,
        codes_ptr: cute.Pointer,
        scale_ptr: cute.Pointer,
        out_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32],
        sm_count: Int32,
        stream,
    ):
        rows, k, scale_bytes = problem
        k = cute.assume(k, divby=32)
        steps = k // VALUES
        # (row, step, word): the two 32-bit words of a step's 8 code bytes
        mCodes = cute.make_tensor(
            codes_ptr, cute.make_layout((rows, steps, 2), stride=(k // 8, 2, 1))
        )
        mScale = cute.make_tensor(scale_ptr, cute.make_layout(scale_bytes))
        mOut = cute.make_tensor(
            out_ptr, cute.make_layout((rows, steps, VALUES), stride=(k, VALUES, 1))
        )
        atoms_k = (k // self.sf_vec_size + SF_ATOM_COLS - 1) // SF_ATOM_COLS
        total = rows * steps
        ctas = min((total + THREADS - 1) // THREADS, sm_count * CTAS_PER_SM)
        self.kernel(mCodes, mScale, mOut, steps, atoms_k, total).launch(
            grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mCodes: cute.Tensor,
        mScale: cute.Tensor,
        mOut: cute.Tensor,
        steps: Int32,
        atoms_k: Int32,
        total: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rCodes = cute.make_rmem_tensor(2, Uint32)
        rOut = cute.make_rmem_tensor(VALUES, BFloat16)
        for v in range(bidx * THREADS + tidx, total, gdim * THREADS):
            r = v // steps
            c = v - r * steps
            cute.autovec_copy(mCodes[r, c, None], rCodes)
            # (unsigned: the atom's % and // by powers of two are single AND / shift)
            col = Uint32(c) // Uint32(self.steps_per_scale)
            byte = Uint32(mScale[blocked_sf_byte(Uint32(r), col, Uint32(atoms_k))])
            scale = self._scale(byte)
            for i in cutlass.range_constexpr(VALUES):
                nibble = (rCodes[i // 8] >> Uint32(4 * (i % 8))) & Uint32(0xF)
                rOut[i] = (self._e2m1(nibble) * scale).to(BFloat16)
            cute.autovec_copy(rOut, mOut[r, c, None])

    @cute.jit
    def _e2m1(self, nibble: Uint32) -> Float32:
        """The e2m1 value of a code: magnitudes 0, 0.5 as 0 / 0.5, 1 .. 6 as exponent and
        mantissa bits ((m + 252) << 22 spans 1, 1.5, 2, 3, 4, 6), the sign in bit 3."""
        mag = nibble & Uint32(7)
        bits = mag * Uint32(F32_HALF)
        if mag >= Uint32(2):
            bits = (mag + Uint32(252)) << Uint32(22)
        return (bits | ((nibble & Uint32(8)) << Uint32(28))).bitcast(Float32)

    @cute.jit
    def _scale(self, byte: Uint32) -> Float32:
        """The block scale times the shift, exact in float32."""
        if const_expr(self.nvfp4):
            # E4M3: exponent field e (bias 7) and mantissa m; e = 0 is m x 2^-9, formed as
            # (1 + m / 8) x 2^-6 - 2^-6 (exact)
            e = (byte >> Uint32(3)) & Uint32(0xF)
            bits = ((cutlass.max(e, Uint32(1)) + Uint32(120)) << Uint32(23)) | (
                (byte & Uint32(7)) << Uint32(20)
            )
            value = bits.bitcast(Float32)
            if e == Uint32(0):
                value = value - Uint32(F32_2POW_M6).bitcast(Float32)
            if byte & Uint32(E4M3_NAN) == Uint32(E4M3_NAN):
                value = Float32(float("nan"))
            if byte & Uint32(0x80) != Uint32(0):
                value = -value
            return value
        # E8M0 byte b times the shift 2^s: 2^(b - 127 + s), a float32 subnormal for b < 1 - s
        bits = Uint32(1) << (cutlass.min(byte, Uint32(-SHIFT_EXP)) + Uint32(22 + SHIFT_EXP))
        if byte >= Uint32(1 - SHIFT_EXP):
            bits = (byte - Uint32(-SHIFT_EXP)) << Uint32(23)
        value = bits.bitcast(Float32)
        if byte == Uint32(E8M0_NAN):
            value = Float32(float("nan"))
        return value


def compile_exact_rows(sf_vec_size: int, options: str = ""):
    """Compile for any P and K (a multiple of 32); returns the executor.
    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    op = MoeExactRows(sf_vec_size)
    gmem = cute.AddressSpace.gmem
    ptrs = (
        make_ptr(Uint32, 0, gmem, assumed_align=16),
        make_ptr(Uint8, 0, gmem, assumed_align=4),
        make_ptr(BFloat16, 0, gmem, assumed_align=16),
    )
    problem = (Int32(1), Int32(32), Int32(512))
    return cute.compile(op, *ptrs, problem, Int32(1), cuda_driver.CUstream(0), options=options)
