# SPDX-License-Identifier: BSD-3-Clause
"""NVFP4 / MXFP4 quantizer for the GPU, bit-exact with the formats' definition (``fp4_ops.cpu``,
``reference.py``): codes, scale bytes, the 128x4 layout's zero padding.

What it computes
----------------
x [L, R, K] (BFloat16, Float16 or Float32, K a multiple of 32) -> packed E2M1 codes [L, R, K/2]
(element 2i in the low nibble), block scales in the 128x4 blocked layout of ``fp4_ops.layout``
([L, R_pad * C_pad] with R_pad = R rounded up to 128, C_pad = K / V rounded up to 4, padding zero)
and the fp32 global scale.
* NVFP4 (V = 16, E4M3 scales): global scale ``gs`` given (a device scalar, e.g. a static input
  scale) or dynamic, ``amax(|x|) / 2688`` (1.0 where that is 0); block scale
  ``e4m3(min(amax_block / 6 / gs, 448))``; codes ``e2m1(x / (scale * gs))``.
* MXFP4 (V = 32, E8M0 scales): block scale ``2^ceil(log2(amax_block / 6))`` clamped to
  [2^-127, 2^127]; codes ``e2m1(x * 2^-e)``; global scale 1.0.
The arithmetic gives the reference's results bit for bit: the block scale's correctly rounded
divisions fl(fl(amax / 6) / gs), fp32 -> E4M3 rounding to nearest even (``cvt.rn.satfinite``
after the clamp at 448; sm_89 and later), the E8M0 exponent read off amax's bits (exact), and
E2M1 rounding to nearest even of the quotient fl(|x| / divisor) with the sign of zero kept. A
quotient a / b costs a multiply and two fmas, not a division: q0 = a * fl(1 / b),
q = fma(fma(-q0, b, a), fl(1 / b), q0) is the correctly rounded quotient (Markstein's theorem)
where no step under- or overflows. Elements: while divisors lie in [2^-100, 2^100] (other blocks
divide), where only quotients past 6, which saturate, can overflow (NaN, which the clamp at 6
drops). Block scales: while gs lies in [2^-60, 2^60] (a grid-uniform choice, which also keeps
divisors in range; else IEEE divisions), where every scale that can round to a nonzero E4M3 value
comes from an amax over 2^-72; an overflowing quotient (NaN) counts as past 448. The E2M1
code is read off the bits of min(q, 6) + 2^(22 + seg) + 2 seg ulps (seg = 0, 1, 2 on [0, 2),
[2, 4), [4, 6]), whose ulp is the E2M1 step of the segment: one add rounds, ties to even.

Non-finite input: a check would need a host sync, so none is made. A block holding NaN or Inf
gets the NaN scale byte (E4M3 0x7F, E8M0 0xFF) and zero codes, and a dynamic global scale over
such a tensor is NaN or Inf, which makes every scale byte NaN, as does a static global scale that
is not finite and positive: each GEMM output that reads such a block is NaN, never a finite wrong
number. (The CPU path, ``fp4_ops.cpu``, raises ValueError.)

Kernels (no arch-specific "a" features: sm_90 and the sm_100 family; E4M3 cvts need sm_89+)
-------------------------------------------------------------------------------------------
    amax_kernel  (dynamic NVFP4 only)  a persistent grid-stride walk over x: |x| bits max per
                 thread (the bit patterns of non-negative floats order like integers, NaN above
                 Inf above every number), one maximum per CTA into a small buffer. PDL-launched
                 (programmatic dependent launch), it lets the next grid launch at once, then
                 waits for the kernel ahead before it touches memory.
    kernel       a persistent grid-stride walk, one thread per (batch, padded row, pair of
                 padded scale columns): two consecutive blocks' 16-byte vector loads, all issued
                 before either block is encoded, coalesced across the warp; their codes as one
                 16-byte store (NVFP4) or one per block (MXFP4, whose K / 32 may be odd); lanes
                 2j, 2j + 1 gather their 4 scale bytes into the 32-bit word that the 128x4
                 layout keeps contiguous (padding gets zero bytes). NVFP4: each CTA first finds
                 the global scale (dynamic: it waits for the amax grid, ``griddepcontrol.wait``,
                 then reduces its maxima), then tabulates (divisor, fl(1 / divisor)) for every
                 scale byte in shared memory; its threads' first blocks are loaded before, where
                 x is final by then. Block 0's thread 0 writes the global scale.
                 A dynamic x of at most LOCAL_AMAX_BYTES (decode) has no amax grid: each of
                 at most LOCAL_AMAX_CTAS CTAs reduces all of x itself, one launch in all.
                 ``tokens`` (L = 1): instead of codes and scales, the Hopper W4A4 decode GEMM's
                 token copy (exact F16 / BF16 in its K order, ``fp4_ops.sm90.dequant``), as its
                 prologue grid would make it. NVFP4: one thread per half block (8 values,
                 one code word), the block's amax from the lane pair; each lane gathers the
                 words of one 16-byte chunk from its k-block's 8 lanes. MXFP4: a lane holds
                 a k-block, all its chunks. PDL-launched, it waits for the kernel ahead before
                 it touches memory, then lets the GEMM behind it launch (PDL).
                 ``exact_rows`` (L = 1): instead of codes and scales, e2m1 x block scale in
                 BF16 (MXFP4 x MXFP4_BF16_SHIFT), exact, in plain K order: the rows of the
                 Hopper grouped W4A16 kernel in a W4A4 MoE layer (``quantize_exact_rows``);
                 it too waits, then releases that GEMM (PDL).
Both run on the caller's stream, with no memset and no host synchronization.

Run
---
    python -m fp4_ops.quantizer --shape 8192,8192 --format nvfp4    # GPU: checked, bit for bit
    python -m fp4_ops.quantizer --compile_only --gpu_arch sm_100a   # any machine
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import arith, llvm
from cutlass.cutlass_dsl import dsl_user_op

from fp4_ops import cpu
from fp4_ops.devtools import time_eager_us, time_graph_us
from fp4_ops.layout import (
    DSL_DTYPE_NAMES,
    MXFP4_BF16_SHIFT,
    SCALE_DTYPES,
    blocked_numel,
    blocked_scale_shape,
)
from fp4_ops.memory import aligned_rows, device_scalar, kept, stream_handle
from fp4_ops.sm90 import dequant as dq
from fp4_ops.sm90.k_order import K_BLOCK

IN_DTYPES = {"BFloat16": cutlass.BFloat16, "Float16": cutlass.Float16, "Float32": cutlass.Float32}
SF_VEC_SIZES = (16, 32)
# compile targets (portable code: no architecture-specific instructions)
GPU_ARCHS = ("sm_90a", "sm_100a", "sm_100f", "sm_103a")
THREADS = 128
WARP = 32
SF_PER_WORD = 4  # scale bytes per 32-bit word: one row of a 128x4 atom
BLOCKS_PER_THREAD = 2  # consecutive blocks of a row per thread and step: half a scale word
HALF_BLOCK = 8  # NVFP4 tokens: values per thread and step, one code word
# Persistent grids: quantize CTAs per SM by (block size, input dtype), as many as stay resident at
# the kernel's registers per thread (tests check the cubins); amax CTAs per SM.
QUANT_CTAS_PER_SM = {
    (16, "BFloat16"): 7,
    (16, "Float16"): 6,
    (16, "Float32"): 5,
    (32, "BFloat16"): 8,
    (32, "Float16"): 5,
    (32, "Float32"): 5,
}
# the modes that write values (tokens, exact rows) where their registers allow fewer (MXFP4
# keeps a whole k-block's codes live)
VALUES_CTAS_PER_SM = {(32, "BFloat16"): 6, (32, "Float32"): 4}
AMAX_CTAS_PER_SM = 4
AMAX_ELEMS_PER_THREAD = 32  # elements per grid-stride step of the amax pass
# the quantize kernel reduces the amax pass's per-CTA maxima, up to this many per thread
PARTIALS_PER_THREAD = 5
MAX_PARTIALS = THREADS * PARTIALS_PER_THREAD
# dynamic NVFP4 x of at most this many bytes (a decode step's activations): every quantize CTA
# reduces x itself (at most 4 steps per thread, from L2), so no amax grid, one launch; at most
# LOCAL_AMAX_CTAS CTAs, so the repeated reads stay within 2 MB
LOCAL_AMAX_BYTES = 32 * 1024
LOCAL_AMAX_CTAS = 64


def ctas_per_sm(sf_vec_size: int, in_dtype: str, values_out: bool = False) -> int:
    """Quantize CTAs per SM of a configuration: as many as stay resident."""
    per_sm = QUANT_CTAS_PER_SM[sf_vec_size, in_dtype]
    return VALUES_CTAS_PER_SM.get((sf_vec_size, in_dtype), per_sm) if values_out else per_sm


def sf_cols_padded(sf_cols):
    """Scale columns of a row padded to whole 4-byte words (int, or the kernel's Int32)."""
    return (sf_cols + SF_PER_WORD - 1) // SF_PER_WORD * SF_PER_WORD


def walk_shape(rows, k, batches, sf_vec_size: int, values_out: bool, half_blocks: bool) -> tuple:
    """The quantize grid's walk over x [L, rows, K] (ints, or the kernel's Int32): (threads a
    row, rows, threads). A thread takes a pair of blocks of the scales' padded row (scale
    columns padded to whole words; rows to 128 for scales, unpadded for values out; lane pairs
    hold a scale word), or (NVFP4 tokens) a half block of the row padded to whole k-blocks (8
    lanes a k-block)."""
    if half_blocks:
        units = (k + K_BLOCK - 1) // K_BLOCK * (K_BLOCK // HALF_BLOCK)
    else:
        units = sf_cols_padded(k // sf_vec_size) // BLOCKS_PER_THREAD
    rows_pad = rows if values_out else (rows + 127) // 128 * 128
    return units, rows_pad, batches * rows_pad * units


# NOTE: the non-negative fp32 bit patterns order like uint32, so amax is an integer max.
ABS_MASK = 0x7FFFFFFF
SIGN_BIT = 0x80000000
INF_BITS = 0x7F800000
E4M3_MAX = 448.0
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF
E2M1_MAX = 6.0
GLOBAL_DIVISOR = 448.0 * 6.0
# E2M1 rounding adds 2^(22 + seg) + 2 seg ulps (seg = 0, 1, 2 on [0, 2), [2, 4), [4, 6]): its ulp
# is the segment's grid step, and the sum's low bits are the E2M1 index k + 2 seg
MAGIC_OFFSET = (22 << 23) - 254  # magic's bits: e (2^23 + 2) + this, e = max(mag's exponent, 127)
BF16_PAIR_ABS = 0x7FFF7FFF
# Markstein's theorem makes |x| * rcp plus one fma correction the correctly rounded |x| / divisor
# where no step can under- or overflow: divisors in [2^-100, 2^100] (smaller |x| encode as 0)
MARKSTEIN_MIN = 2.0**-100
MARKSTEIN_MAX = 2.0**100
RCP_E2M1_MAX = float.fromhex("0x1.555556p-3")  # fl(1 / 6)
# global scales for which the block scale's two divisions are Markstein quotients
SCALE_FAST_MIN = 2.0**-60
SCALE_FAST_MAX = 2.0**60
# exact rows: MXFP4's values carry 2^SHIFT_EXP (6 x 2^127 would overflow BF16); f32 bits of 0.5
SHIFT_EXP = round(math.log2(MXFP4_BF16_SHIFT))
F32_HALF_BITS = 0x3F000000
E8M0_NAN = 0xFF


@dsl_user_op
def _f32_bits(x: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(arith.bitcast(ir.IntegerType.get_signless(32), x.ir_value(loc=loc, ip=ip)))


@dsl_user_op
def _bits_f32(b: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(arith.bitcast(ir.F32Type.get(), b.ir_value(loc=loc, ip=ip)))


@dsl_user_op
def _byte_perm(lo: Uint32, hi: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """Bytes of (hi, lo) picked by the selector's nibbles (0..3 from lo, 4..7 from hi)."""
    operands = [lo.ir_value(loc=loc, ip=ip), hi.ir_value(loc=loc, ip=ip)]
    i32 = ir.IntegerType.get_signless(32)
    asm = f"prmt.b32 $0, $1, $2, {selector:#x};"
    return Uint32(llvm.inline_asm(i32, operands, asm, "=r,r,r"))


@dsl_user_op
def _shift_in_nibble(word: Uint32, code: Uint32, *, loc=None, ip=None) -> Uint32:
    """(word >> 4) | (code << 28): a funnel shift, which keeps only code's low nibble."""
    operands = [word.ir_value(loc=loc, ip=ip), code.ir_value(loc=loc, ip=ip)]
    i32 = ir.IntegerType.get_signless(32)
    return Uint32(llvm.inline_asm(i32, operands, "shf.r.wrap.b32 $0, $1, $2, 4;", "=r,r,r"))


@dsl_user_op
def _e4m3_bits(v: Float32, *, loc=None, ip=None) -> Uint32:
    """E4M3 bits of v (|v| <= 448) in byte 0, rounded to nearest even (satfinite cvt of the pair
    (0, v))."""
    i16 = ir.IntegerType.get_signless(16)
    operands = [Float32(0.0).ir_value(loc=loc, ip=ip), v.ir_value(loc=loc, ip=ip)]
    pair = llvm.inline_asm(i16, operands, "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f")
    return Uint32(arith.extui(ir.IntegerType.get_signless(32), pair))


@dsl_user_op
def _e4m3_f32(byte: Uint32, *, loc=None, ip=None) -> Float32:
    """The value of E4M3 bits (exact through f16)."""
    bits = arith.trunci(ir.IntegerType.get_signless(16), byte.ir_value(loc=loc, ip=ip))
    asm = (
        "{ .reg .b32 t; .reg .b16 lo, hi; cvt.rn.f16x2.e4m3x2 t, $1; mov.b32 {lo, hi}, t;"
        " cvt.f32.f16 $0, lo; }"
    )
    return Float32(llvm.inline_asm(ir.F32Type.get(), [bits], asm, "=f,h"))


@cute.jit
def e2m1_f32(nibble: Uint32) -> Float32:
    """The value of an E2M1 code: magnitudes 0 and 0.5 as 0 / 0.5, 1 .. 6 as exponent and
    mantissa bits ((m + 252) << 22 spans 1, 1.5, 2, 3, 4, 6), the sign in bit 3."""
    mag = nibble & Uint32(7)
    bits = mag * Uint32(F32_HALF_BITS)
    if mag >= Uint32(2):
        bits = (mag + Uint32(252)) << Uint32(22)
    return _bits_f32(bits | ((nibble & Uint32(8)) << Uint32(28)))


@cute.jit
def block_scale_f32(byte: Uint32, nvfp4: cutlass.Constexpr) -> Float32:
    """A scale byte's value, exact in f32: E4M3 (NaN 0x7F / 0xFF), or E8M0 times
    MXFP4_BF16_SHIFT, 2^(b - 127 + s) (an f32 subnormal for b < 1 - s; NaN 0xFF)."""
    if const_expr(nvfp4):
        return _e4m3_f32(byte)
    bits = Uint32(1) << (cutlass.min(byte, Uint32(-SHIFT_EXP)) + Uint32(22 + SHIFT_EXP))
    if byte >= Uint32(1 - SHIFT_EXP):
        bits = (byte - Uint32(-SHIFT_EXP)) << Uint32(23)
    value = _bits_f32(bits)
    if byte == Uint32(E8M0_NAN):
        value = Float32(float("nan"))
    return value


class QuantizeFp4:
    """x -> (codes, blocked scales, global scale); see the module docstring."""

    def __init__(
        self,
        in_dtype: str,
        sf_vec_size: int,
        dynamic: bool,
        local_amax: bool = False,
        tokens: bool = False,
        exact_rows: bool = False,
    ):
        self.in_dtype_name = in_dtype
        self.in_dtype = IN_DTYPES[in_dtype]
        self.sf_vec_size = sf_vec_size
        self.dynamic = dynamic
        # (dynamic only: each quantize CTA finds amax itself, for x of LOCAL_AMAX_BYTES at most)
        self.local_amax = local_amax
        # (L = 1: the Hopper W4A4 decode GEMM's token copy instead of codes and scales)
        self.tokens = tokens
        # (L = 1: the exact BF16 values of the codes in plain K order instead of codes and
        # scales, the rows that the Hopper grouped W4A16 kernel takes)
        self.exact_rows = exact_rows
        self._setup_attributes()

    def _setup_attributes(self):
        self.nvfp4 = self.sf_vec_size == 16
        self.amax_grid = self.dynamic and not self.local_amax
        self.words_per_block = self.sf_vec_size // 8  # 8 codes per 32-bit word
        # elements per code store: a thread's two NVFP4 blocks, or one MXFP4 block
        self.code_vec = self.sf_vec_size * (BLOCKS_PER_THREAD if self.nvfp4 else 1)
        # the token copy's type: the GEMM's decode path's MMA type
        self.tokens_f16 = dq.decode_tokens_f16(self.sf_vec_size)
        # codes kept in registers for a store of values (tokens, exact rows), not stored
        self.values_out = self.tokens or self.exact_rows
        # NVFP4 tokens: one thread per half block (8 values, one code word, one 16-byte chunk of
        # the copy), so that each thread's chain of loads, arithmetic and stores is short
        self.half_blocks = self.tokens and self.nvfp4
        # NVFP4: a thread's first blocks are loaded before the global scale and its table where x
        # is final by then (not behind the amax grid's release, which comes before its wait)
        self.preload = self.nvfp4 and (self.values_out or not self.amax_grid)
        # a block of x as loaded: BF16 pairs as 32-bit words, else the elements
        self.raw_type = Uint32 if self.in_dtype is cutlass.BFloat16 else self.in_dtype
        # values a thread loads per block of its walk: a half block, or a whole one
        self.raw_values = HALF_BLOCK if self.half_blocks else self.sf_vec_size
        self.raw_len = (
            self.raw_values // 2 if self.in_dtype is cutlass.BFloat16 else self.raw_values
        )

    @cute.jit
    def __call__(
        self,
        x_ptr: cute.Pointer,
        q_ptr: cute.Pointer,
        sf_ptr: cute.Pointer,
        gs_in_ptr: cute.Pointer,
        gs_out_ptr: cute.Pointer,
        partials_ptr: cute.Pointer,
        problem: tuple[Int32, Int32, Int32],
        sm_count: Int32,
        stream,
    ):
        rows, k, l = problem  # noqa: E741
        vec = self.sf_vec_size
        n_elems = l * rows * k
        # x and codes as flat tensors of blocks; block strides are static so that loads and
        # stores vectorize
        if const_expr(self.in_dtype is cutlass.BFloat16):
            # BF16 pairs as 32-bit words: |x| and the sign need no conversion instructions
            mX = cute.make_tensor(
                cute.recast_ptr(x_ptr, dtype=Uint32),
                cute.make_layout((n_elems // vec, vec // 2), stride=(vec // 2, 1)),
            )
        else:
            mX = cute.make_tensor(x_ptr, cute.make_layout((n_elems // vec, vec), stride=(vec, 1)))
        if const_expr(self.half_blocks):
            # (the same x by half blocks: one 16-byte load for 16-bit values)
            mX = cute.make_tensor(
                mX.iterator,
                cute.make_layout((n_elems // HALF_BLOCK, self.raw_len), stride=(self.raw_len, 1)),
            )
        sf_cols = k // vec
        units, rows_pad, total = walk_shape(rows, k, l, vec, self.values_out, self.half_blocks)
        if const_expr(self.tokens):
            # the token copy [rows, K_pad] as words (16-bit values: K_pad / 2 words a row);
            # no scales, so the walk covers the rows themselves
            row_words = (k + K_BLOCK - 1) // K_BLOCK * K_BLOCK // 2
            mQ = cute.make_tensor(
                cute.recast_ptr(q_ptr, dtype=Uint32),
                cute.make_layout((rows, row_words), stride=(row_words, 1)),
            )
        elif const_expr(self.exact_rows):
            # the rows [rows, K] in BF16 by (row, block, value); no scales
            k = cute.assume(k, divby=32)
            mQ = cute.make_tensor(
                cute.recast_ptr(q_ptr, dtype=cutlass.BFloat16),
                cute.make_layout((rows, k // vec, vec), stride=(k, vec, 1)),
            )
        else:
            # NVFP4: a thread's two blocks' codes as one 16-byte store (K / 16 is even)
            mQ = cute.make_tensor(
                cute.recast_ptr(q_ptr, dtype=Uint32),
                cute.make_layout(
                    (n_elems // self.code_vec, self.code_vec // 8), stride=(self.code_vec // 8, 1)
                ),
            )
        mSF = cute.make_tensor(
            cute.recast_ptr(sf_ptr, dtype=Uint32),
            cute.make_layout(l * rows_pad * sf_cols_padded(sf_cols) // SF_PER_WORD),
        )
        mGsIn = cute.make_tensor(gs_in_ptr, cute.make_layout(1))
        mGsOut = cute.make_tensor(gs_out_ptr, cute.make_layout(1))
        amax_steps = n_elems // AMAX_ELEMS_PER_THREAD
        amax_ctas = min((amax_steps + THREADS - 1) // THREADS, sm_count * AMAX_CTAS_PER_SM)
        amax_ctas = min(amax_ctas, MAX_PARTIALS)
        # what the quantize kernel reduces to amax: the amax grid's maxima, or (local) x itself
        mAmax = cute.make_tensor(partials_ptr, cute.make_layout(MAX_PARTIALS))
        amax_count = amax_ctas
        mXa = cute.make_tensor(
            x_ptr,
            cute.make_layout(
                (amax_steps, AMAX_ELEMS_PER_THREAD), stride=(AMAX_ELEMS_PER_THREAD, 1)
            ),
        )
        if const_expr(self.amax_grid):
            # (PDL: its launch overlaps the tail of the kernel ahead, which may still write x)
            self.amax_kernel(mXa, mAmax, amax_steps).launch(
                grid=(amax_ctas, 1, 1), block=(THREADS, 1, 1), stream=stream, use_pdl=True
            )
        if const_expr(self.local_amax):
            mAmax, amax_count = mXa, amax_steps
        total_warps = (total + WARP - 1) // WARP * WARP
        ctas = min(
            (total_warps + THREADS - 1) // THREADS,
            sm_count * ctas_per_sm(vec, self.in_dtype_name, self.values_out),
        )
        if const_expr(self.local_amax):
            ctas = min(ctas, LOCAL_AMAX_CTAS)
        self.kernel(
            mX,
            mQ,
            mSF,
            mGsIn,
            mGsOut,
            mAmax,
            amax_count,
            (rows, sf_cols, total, total_warps),
            cute.fast_divmod_create_divisor_v2(units),
            cute.fast_divmod_create_divisor_v2(rows_pad),
        ).launch(
            grid=(ctas, 1, 1),
            block=(THREADS, 1, 1),
            stream=stream,
            # (tokens: its launch overlaps the tail of the kernel ahead, and its CTAs take the
            # GEMM's SMEM carveout, so that the GEMM's CTAs need no reconfigured SM)
            use_pdl=self.amax_grid or self.tokens,
            preferred_smem_carveout=100 if self.tokens else None,
        )

    # ------------------------------------------------------------------------------ amax pass

    @cute.kernel
    def amax_kernel(self, mXa: cute.Tensor, mPartials: cute.Tensor, steps: Int32):
        """Per-CTA max of |x|'s bits into mPartials[block]; lets the quantize grid launch at once
        (it waits for this grid's completion before it reads the maxima)."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        cute.arch.griddepcontrol_launch_dependents()
        # NOTE: PDL launch: the kernel ahead may still write x, or read the partials of the
        # stream's last quantization; nothing is read or written before this wait
        cute.arch.griddepcontrol_wait()
        amax = self._thread_amax(mXa, bidx * THREADS + tidx, gdim * THREADS, steps)
        amax = self._cta_max(amax)
        if tidx == 0:
            mPartials[bidx] = amax

    @cute.jit
    def _thread_amax(self, mXa: cute.Tensor, start, step, steps) -> Uint32:
        """The max of |x|'s bits over rows start, start + step, ... of mXa (32 elements each)."""
        amax = Uint32(0)
        i = start
        while i < steps:
            vals = mXa[i, None].load().to(Float32)
            for j in cutlass.range_constexpr(AMAX_ELEMS_PER_THREAD):
                amax = max(amax, _f32_bits(vals[j]) & Uint32(ABS_MASK))
            i += step
        return amax

    @cute.jit
    def _cta_max(self, value: Uint32) -> Uint32:
        """The max of ``value`` over the CTA's threads, in every thread."""
        smem = cutlass.memory.SmemAllocator()
        sMax = smem.allocate_tensor(Uint32, cute.make_layout(THREADS // WARP), byte_alignment=16)
        for offset in cutlass.range_constexpr(5):
            value = max(value, cute.arch.shuffle_sync_bfly(value, offset=1 << offset))
        tidx, _, _ = cute.arch.thread_idx()
        if tidx % WARP == 0:
            sMax[tidx // WARP] = value
        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(THREADS // WARP):
            value = max(value, sMax[w])
        return value

    # ------------------------------------------------------------------------------ quantize pass

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mQ: cute.Tensor,
        mSF: cute.Tensor,
        mGsIn: cute.Tensor,
        mGsOut: cute.Tensor,
        mAmax: cute.Tensor,
        amax_count: Int32,
        extents: tuple[Int32, Int32, Int32, Int32],
        units_pad: cute.FastDivmodDivisorV2,
        rows_pad: cute.FastDivmodDivisorV2,
    ):
        """The global scale, the block scaling it implies (NVFP4: the divisor table), then the
        walk over the blocks: Markstein block scales where gs allows, IEEE divisions else."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if const_expr(self.values_out):
            # NOTE: PDL launch (tokens): the kernel ahead may still run (a GEMM reading this
            # copy, or what writes x); nothing is read or written before this wait
            cute.arch.griddepcontrol_wait()
        rRaw = None
        if const_expr(self.preload):
            # (the first step's x in flight with the global scale's load: the round trips overlap)
            rRaw = self._raw_registers()
            self._load_step(mX, rRaw, bidx * THREADS + tidx, extents, units_pad, rows_pad)
        if const_expr(self.values_out):
            # only now may the GEMM behind request weights (before its own wait for this grid,
            # which it needs before it reads the copy or the global scale)
            cute.arch.griddepcontrol_launch_dependents()
        gs = self._global_scale(mGsIn, mAmax, amax_count)
        if (bidx == 0) & (tidx == 0):
            mGsOut[0] = gs
        scaling = self._block_scaling(gs)
        walk = (mX, mQ, mSF, rRaw, extents, units_pad, rows_pad, scaling)
        if const_expr(self.nvfp4):
            # (a grid-uniform choice: no IEEE division in the usual loop)
            if (gs >= Float32(SCALE_FAST_MIN)) & (gs <= Float32(SCALE_FAST_MAX)):
                self._walk(*walk, True)
            else:
                self._walk(*walk, False)
        else:
            self._walk(*walk, False)

    @cute.jit
    def _walk(
        self,
        mX: cute.Tensor,
        mQ: cute.Tensor,
        mSF: cute.Tensor,
        rRaw: list | None,
        extents: tuple[Int32, Int32, Int32, Int32],
        units_pad: cute.FastDivmodDivisorV2,
        rows_pad: cute.FastDivmodDivisorV2,
        scaling,
        fast: cutlass.Constexpr,
    ):
        """A grid-stride walk over the thread space, the first step apart where its blocks were
        loaded ahead (rRaw, None where not ``preload``), so that no loaded block is live across
        the loop. ``fast``: the global scale lies in [2^-60, 2^60] (see _quantize_block)."""
        _, _, _, total_warps = extents
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        t = bidx * THREADS + tidx
        stride = gdim * THREADS
        step, args = self._step, (mX, mQ, mSF, extents, units_pad, rows_pad, scaling, fast)
        if const_expr(self.half_blocks):
            step, args = self._step_half, (mX, mQ, extents, units_pad, scaling, fast)
        if const_expr(rRaw is not None):
            if t < total_warps:
                step(t, rRaw, *args)
            t += stride
        while t < total_warps:
            step(t, None, *args)
            t += stride

    @cute.jit
    def _step(
        self,
        t,
        rRaw,
        mX: cute.Tensor,
        mQ: cute.Tensor,
        mSF: cute.Tensor,
        extents: tuple[Int32, Int32, Int32, Int32],
        pairs_pad: cute.FastDivmodDivisorV2,
        rows_pad: cute.FastDivmodDivisorV2,
        scaling,
        fast: cutlass.Constexpr,
    ):
        """Thread index t's two blocks (loaded in rRaw, or None: loaded here): codes and scales,
        the token copy or the exact rows. Lanes 2j, 2j + 1 hold one scale word."""
        rows, sf_cols = extents[:2]
        batch, r, pair, col, live = self._step_coords(t, extents, pairs_pad, rows_pad)
        sf_bytes = Uint32(0)
        # (tokens: registers that outlive the branch, for the lane pair's exchange)
        codes = self._code_registers() if const_expr(self.values_out) else None
        load = rRaw is None
        if const_expr(load):
            rRaw = self._raw_registers()
        if live & (r < rows) & (col < sf_cols):
            row = batch * rows + r
            if const_expr(load):
                self._load_pair(mX, rRaw, row, col, sf_cols)
            sf_bytes = self._quantize_pair(rRaw, mQ, codes, row, col, sf_cols, scaling, fast)
            if const_expr(self.exact_rows):
                self._store_exact_rows(mQ, codes, sf_bytes, row, col, sf_cols)
        # NOTE: the walk's bound and step are whole warps: all 32 lanes reach the shuffles.
        if const_expr(self.tokens):
            self._store_tokens(mQ, codes, sf_bytes, r, pair, sf_cols, live & (r < rows))
        elif const_expr(not self.exact_rows):
            word = sf_bytes | (cute.arch.shuffle_sync_down(sf_bytes, offset=1) << 16)
            if live & (pair % 2 == 0):
                index = self._sf_word_index(batch, r, col, rows_pad.divisor, pairs_pad.divisor)
                mSF[index] = word

    def _raw_registers(self) -> list:
        """Registers for a thread's two blocks (or one half block) of x as loaded."""
        count = 1 if self.half_blocks else BLOCKS_PER_THREAD
        return [cute.make_rmem_tensor(self.raw_len, self.raw_type) for _ in range(count)]

    @cute.jit
    def _step_coords(self, t, extents, pairs_pad, rows_pad):
        """Thread index t's (batch, padded row, pair, first scale column, t < total)."""
        rest, pair = divmod(t, pairs_pad)
        batch, r = divmod(rest, rows_pad)
        return batch, r, pair, pair * BLOCKS_PER_THREAD, t < extents[2]

    @cute.jit
    def _half_coords(self, t, extents, units_pad):
        """NVFP4 tokens: thread index t's (row, half block of the padded row, t < total)."""
        r, unit = divmod(t, units_pad)
        return r, unit, t < extents[2]

    @cute.jit
    def _step_half(self, t, rRaw, mX, mQ, extents, units_pad, scaling, fast: cutlass.Constexpr):
        """NVFP4 tokens: thread index t's half block (loaded in rRaw, or None: loaded here) and
        its chunk of the token copy. Lanes 2q, 2q + 1 of a k-block's 8 hold 16-group q: the
        block's amax is the pair's. Half blocks past K have zero codes. Every lane reaches the
        shuffles."""
        sf_cols = extents[1]
        r, unit, live = self._half_coords(t, extents, units_pad)
        active = live & (unit < sf_cols * 2)
        if const_expr(rRaw is None):
            rRaw = self._raw_registers()
            if active:
                self._load_half(mX, rRaw, r, unit, sf_cols)
        # (the values as loaded, for both regions below: read, not used, where not active)
        magnitude, *sign = self._magnitudes_and_signs(rRaw[0].load(), HALF_BLOCK)
        amax_bits = Uint32(0)
        if active:
            amax_bits = self._block_amax(magnitude, HALF_BLOCK)
        amax_bits = max(amax_bits, cute.arch.shuffle_sync_bfly(amax_bits, offset=1))
        codes = cute.make_rmem_tensor(1, Uint32)
        codes.fill(0)
        sf_byte = Uint32(0)
        if active:
            sf_byte = self._scale_and_encode(magnitude, sign, amax_bits, codes, 0, 1, scaling, fast)
        self._store_chunk(mQ, codes[0], sf_byte, r, unit, sf_cols, live)

    @cute.jit
    def _store_chunk(self, mC: cute.Tensor, word: Uint32, sf_byte: Uint32, r, unit, sf_cols, live):
        """NVFP4 tokens: lane 2q + h of a k-block writes chunk 4h + q of its token copy, as the
        decode GEMM's prologue grid (``convert_operands``) would: pair shift q of word h of each
        16-group (``dequant.token_chunk_layout``), gathered from the k-block's lanes 2g + h, under
        the 4 groups' scale bytes."""
        h = Uint32(unit) & Uint32(1)
        q = (Uint32(unit) >> 1) & Uint32(3)
        lane = cute.arch.lane_idx()
        first = lane - lane % 8
        groups = [cute.arch.shuffle_sync(word, offset=first + 2 * g + Int32(h)) for g in range(4)]
        sf4 = sf_byte << (q * Uint32(8))
        sf4 = sf4 | cute.arch.shuffle_sync_bfly(sf4, offset=2)
        sf4 = sf4 | cute.arch.shuffle_sync_bfly(sf4, offset=4)
        kb = Uint32(unit) >> 3
        # all ones for a full 64-block, zero for the 32-wide tail of K = 32 x odd
        keep = Uint32(0) - Uint32(kb * K_BLOCK + K_BLOCK <= Uint32(sf_cols * self.sf_vec_size))
        col0 = kb * (K_BLOCK // self.sf_vec_size)
        out = dq.convert_chunk_words(
            groups, sf4, keep, col0, q * Uint32(4), self.sf_vec_size, self.tokens_f16
        )
        row_words = Int64(cute.size(mC.shape[1]))
        word_index = Int64(r) * row_words + Int64(kb * (K_BLOCK // 2) + (h * Uint32(4) + q) * 4)
        if live:
            dq.st_global_v4_b32(mC.iterator.toint() + word_index * 4, out)

    @cute.jit
    def _load_step(self, mX, rRaw: list, t, extents, units_pad, rows_pad):
        """The blocks of thread index t's first walk step into rRaw, where it has any."""
        rows, sf_cols = extents[:2]
        if const_expr(self.half_blocks):
            r, unit, live = self._half_coords(t, extents, units_pad)
            if live & (unit < sf_cols * 2):
                self._load_half(mX, rRaw, r, unit, sf_cols)
        else:
            batch, r, _, col, live = self._step_coords(t, extents, units_pad, rows_pad)
            if live & (r < rows) & (col < sf_cols):
                self._load_pair(mX, rRaw, batch * rows + r, col, sf_cols)

    @cute.jit
    def _load_half(self, mX, rRaw: list, r, unit, sf_cols):
        """NVFP4 tokens: half block ``unit`` of row r (one that lies within K) into rRaw, in one
        16-byte vector load for 16-bit values."""
        rRaw[0].store(mX[r * sf_cols * 2 + unit, None].load())

    @cute.jit
    def _load_pair(self, mX, rRaw: list, row, col, sf_cols):
        """Blocks ``col`` and ``col + 1`` of ``row`` into rRaw, in 16-byte vector loads (MXFP4:
        a second block past K re-reads the first; NVFP4's K / 16 is even)."""
        block = row * sf_cols + col
        second = block + 1
        if const_expr(not self.nvfp4):
            second = block + Int32(col + 1 < sf_cols)
        rRaw[0].store(mX[block, None].load())
        rRaw[1].store(mX[second, None].load())

    @cute.jit
    def _global_scale(self, mGsIn: cute.Tensor, mAmax: cute.Tensor, amax_count) -> Float32:
        """1.0 (MXFP4), mGsIn[0] (static) or amax / 2688 (dynamic), amax from the amax grid's
        ``amax_count`` maxima in mAmax, or (local) from x itself, mAmax's ``amax_count`` rows."""
        gs = Float32(1.0)
        if const_expr(self.nvfp4):
            if const_expr(self.dynamic):
                amax_bits = Uint32(0)
                tidx, _, _ = cute.arch.thread_idx()
                if const_expr(self.local_amax):
                    amax_bits = self._thread_amax(mAmax, tidx, THREADS, amax_count)
                else:
                    # the amax grid's maxima are complete once it has (PDL)
                    cute.arch.griddepcontrol_wait()
                    for j in cutlass.range_constexpr(PARTIALS_PER_THREAD):
                        if tidx + j * THREADS < amax_count:
                            amax_bits = max(amax_bits, mAmax[tidx + j * THREADS])
                amax_bits = self._cta_max(amax_bits)
                amax = _bits_f32(amax_bits)
                # (an amax below 2688 * 2^-150 gives 0: 1.0 then, as for an all-zero x)
                gs_dynamic = amax / Float32(GLOBAL_DIVISOR)
                if gs_dynamic > Float32(0.0):
                    gs = gs_dynamic
                # (NaN amax: the comparison is false; keep the NaN so that every scale is NaN)
                if amax_bits > Uint32(INF_BITS):
                    gs = amax
            else:
                gs = mGsIn[0]
        return gs

    @cute.jit
    def _sf_word_index(self, batch, r, col, rows_pad, pairs_pad) -> Int32:
        """Word index of (row r, scale columns col..col+3) in the 128x4 layout: atom
        (r // 128, col // 4) of 512 bytes = 128 words, word (r % 32) * 4 + (r // 32) % 4 in it."""
        # (shifts and masks: the operands are non-negative)
        atom = (batch * (rows_pad >> 7) + (r >> 7)) * (pairs_pad >> 1) + (col >> 2)
        return (atom << 7) + ((r & 31) << 2) + ((r >> 5) & 3)

    @cute.jit
    def _block_scaling(self, gs: Float32):
        """Per-thread constants of the NVFP4 block scales: (gs, fl(1 / gs), whether gs is finite
        and positive, the CTA's table of (divisor, fl(1 / divisor)) by E4M3 scale byte)."""
        if const_expr(not self.nvfp4):
            return (gs,)
        valid = (gs > Float32(0.0)) & (_f32_bits(gs) < Uint32(INF_BITS))
        # divisor fl(scale * gs) and its reciprocal (0 for a zero divisor: zero codes, signs
        # kept) for scale bytes 0..127, one per thread, instead of a reciprocal per block
        smem = cutlass.memory.SmemAllocator()
        sDiv = smem.allocate_tensor(
            Float32, cute.make_layout((2, THREADS), stride=(1, 2)), byte_alignment=16
        )
        tidx, _, _ = cute.arch.thread_idx()
        divisor = _e4m3_f32(Uint32(tidx)) * gs
        rcp = Float32(0.0)
        if divisor > Float32(0.0):
            rcp = Float32(1.0) / divisor
        sDiv[0, tidx] = divisor
        sDiv[1, tidx] = rcp
        cute.arch.sync_threads()
        return gs, Float32(1.0) / gs, valid, sDiv

    def _code_registers(self) -> list:
        """A thread's codes: one tensor of two NVFP4 blocks' words, or one per MXFP4 block
        (zero: the token copy reads a dead lane's words, masked, and must not read garbage)."""
        shapes = [2 * self.words_per_block] if self.nvfp4 else [self.words_per_block] * 2
        codes = [cute.make_rmem_tensor(n, Uint32) for n in shapes]
        if const_expr(self.tokens):
            for words in codes:
                words.fill(0)
        return codes

    @cute.jit
    def _quantize_pair(
        self, rRaw, mQ, codes, row, col, sf_cols, scaling, fast: cutlass.Constexpr
    ) -> Uint32:
        """Codes of blocks ``col`` and ``col + 1`` (if live) of ``row``, loaded in rRaw, into mQ,
        or (tokens) into ``codes`` (``_code_registers``); returns their scale bytes as the low
        half of a scale word."""
        store = codes is None
        if const_expr(store):
            codes = self._code_registers()
        wpb = self.words_per_block
        raw0, raw1 = rRaw[0].load(), rRaw[1].load()
        if const_expr(self.nvfp4):  # (K / 16 is even: the second block is live)
            pair = row * (sf_cols >> 1) + (col >> 1)
            sf0 = self._quantize_block(raw0, codes[0], 0, scaling, fast)
            sf1 = self._quantize_block(raw1, codes[0], wpb, scaling, fast)
            if const_expr(store):
                mQ[pair, None].store(codes[0].load())  # one 16-byte store
            return sf0 | (sf1 << 8)
        # MXFP4: K / 32 may be odd; a dead second block stores nothing
        block = row * sf_cols + col
        live1 = col + 1 < sf_cols
        sf0 = self._quantize_block(raw0, codes[0], 0, scaling, fast)
        sf1 = self._quantize_block(raw1, codes[1], 0, scaling, fast)
        if const_expr(store):
            mQ[block, None].store(codes[0].load())
        sf = sf0
        if live1:
            if const_expr(store):
                mQ[block + 1, None].store(codes[1].load())
            sf = sf | (sf1 << 8)
        return sf

    @cute.jit
    def _store_tokens(self, mC: cute.Tensor, codes: list, sf_bytes: Uint32, r, pair, sf_cols, live):
        """MXFP4: the Hopper decode GEMM's token copy of one 64-wide k-block of row r (the lane's
        two blocks), as its prologue grid (``convert_operands``) writes it from codes and scales:
        16-byte chunk c holds pair P_c of each 16-group (``dequant.token_chunk_layout``), exact
        BF16. (NVFP4: ``_store_chunk``.) Every lane reaches the shuffle."""
        odd = Uint32(pair) & Uint32(1)
        # the k-block's scale word (scale columns 4j..4j+3) in both lanes of the pair
        other = cute.arch.shuffle_sync_bfly(sf_bytes, offset=1)
        sf4 = (sf_bytes << (odd << 4)) | (other << ((Uint32(1) - odd) << 4))
        kb = Uint32(pair)
        w0, w1 = codes
        groups_by_word = [[w0[w], w0[2 + w], w1[w], w1[2 + w]] for w in range(2)]
        # (the walk's scale columns run to a multiple of 4: a pair past K has no k-block)
        live = live & (kb * Uint32(2) < Uint32(sf_cols))
        k = Uint32(sf_cols * self.sf_vec_size)
        # all ones for a full 64-block, zero for the 32-wide tail of K = 32 x odd
        keep = Uint32(0) - Uint32(kb * K_BLOCK + K_BLOCK <= k)
        col0 = kb * (K_BLOCK // self.sf_vec_size)
        row_words = Int64(cute.size(mC.shape[1]))
        base = mC.iterator.toint() + (Int64(r) * row_words + Int64(kb * (K_BLOCK // 2))) * 4
        for w, groups in enumerate(groups_by_word):
            for i in cutlass.range_constexpr(4):
                chunk = Uint32(4 * w + i)
                out = dq.convert_chunk_words(
                    groups, sf4, keep, col0, 4 * i, self.sf_vec_size, self.tokens_f16
                )
                if live:
                    dq.st_global_v4_b32(base + Int64(chunk * Uint32(16)), out)

    @cute.jit
    def _store_exact_rows(self, mQ: cute.Tensor, codes: list, sf_bytes: Uint32, row, col, sf_cols):
        """Blocks ``col`` and ``col + 1`` (if live) of ``row`` as the exact BF16 values
        e2m1 x block scale (MXFP4 x MXFP4_BF16_SHIFT), element j of a block at value j."""
        for b in cutlass.range_constexpr(BLOCKS_PER_THREAD):
            words = codes[0] if const_expr(self.nvfp4) else codes[b]
            first = b * self.words_per_block if const_expr(self.nvfp4) else 0
            scale = block_scale_f32((sf_bytes >> Uint32(8 * b)) & Uint32(0xFF), self.nvfp4)
            rOut = cute.make_rmem_tensor(self.sf_vec_size, cutlass.BFloat16)
            for j in cutlass.range_constexpr(self.sf_vec_size):
                nibble = (words[first + j // 8] >> Uint32(4 * (j % 8))) & Uint32(0xF)
                rOut[j] = (e2m1_f32(nibble) * scale).to(cutlass.BFloat16)
            # (NVFP4's K / 16 is even; MXFP4's second block may lie past K)
            if (b == 0) | (col + b < sf_cols):
                cute.autovec_copy(rOut, mQ[row, col + b, None])

    @cute.jit
    def _quantize_block(
        self, raw, words: cute.Tensor, base, scaling, fast: cutlass.Constexpr
    ) -> Uint32:
        """Codes of one block (its loaded values ``raw``) into words[base:]; returns its scale
        byte."""
        magnitude, *sign = self._magnitudes_and_signs(raw, self.sf_vec_size)
        amax_bits = self._block_amax(magnitude, self.sf_vec_size)
        return self._scale_and_encode(
            magnitude, sign, amax_bits, words, base, self.words_per_block, scaling, fast
        )

    @cute.jit
    def _block_amax(self, magnitude, n: cutlass.Constexpr) -> Uint32:
        """The max of |x|'s bits over values 0..n-1 (``magnitude``: _magnitudes_and_signs')."""
        amax_bits = Uint32(0)
        for i in cutlass.range_constexpr(n):
            amax_bits = max(amax_bits, _f32_bits(magnitude(i)))
        return amax_bits

    @cute.jit
    def _scale_and_encode(
        self,
        magnitude,
        sign,
        amax_bits: Uint32,
        words: cute.Tensor,
        base,
        n_words: cutlass.Constexpr,
        scaling,
        fast: cutlass.Constexpr,
    ) -> Uint32:
        """The scale byte of a block whose |x| bits peak at ``amax_bits``, and the codes of its
        values 0..8 n_words - 1 (``magnitude``, ``sign``: _magnitudes_and_signs') into
        words[base:]."""
        finite = amax_bits < Uint32(INF_BITS)
        if const_expr(self.nvfp4):
            gs, rcp_gs, gs_valid, sDiv = scaling
            # (a global scale that is not finite and positive makes every scale NaN)
            finite = finite & gs_valid
            amax = _bits_f32(amax_bits)
            if const_expr(fast):
                # fl(fl(amax / 6) / gs) exactly where it can reach the E4M3 range (amax over
                # 2^-72); an overflow gives NaN, which the fmin below turns into 448
                s = self._markstein(
                    self._markstein(amax, Float32(E2M1_MAX), RCP_E2M1_MAX), gs, rcp_gs
                )
            else:
                s = (amax / Float32(E2M1_MAX)) / gs
            sf_byte = _e4m3_bits(cute.arch.fmin(s, Float32(E4M3_MAX)))
            # (a negative gs gives sign bits; its blocks become NaN below)
            divisor_rcp = sDiv[None, Int32(sf_byte & Uint32(0x7F))].load()
            divisor, rcp = divisor_rcp[0], divisor_rcp[1]
            # quotients past 6 saturate, overflowing ones too (NaN, which fmin drops); a fast
            # global scale keeps divisors in [2^-69, 2^69] (or 0)
            if const_expr(fast):
                self._encode_words(magnitude, sign, words, base, n_words, rcp, divisor, "markstein")
            elif (divisor == Float32(0.0)) | (
                (divisor >= Float32(MARKSTEIN_MIN)) & (divisor <= Float32(MARKSTEIN_MAX))
            ):
                self._encode_words(magnitude, sign, words, base, n_words, rcp, divisor, "markstein")
            else:
                self._encode_words(magnitude, sign, words, base, n_words, rcp, divisor, "divide")
            if not finite:
                sf_byte = Uint32(E4M3_NAN)
        else:
            sf_byte = self._e8m0_scale(amax_bits)
            # 2^(127 - byte): exact and normal, so |x| * rcp is the quotient itself
            rcp = _bits_f32((Uint32(254) - sf_byte) << 23)
            self._encode_words(magnitude, sign, words, base, n_words, rcp, Float32(1.0), "exact")
            if not finite:
                sf_byte = Uint32(E8M0_NAN)
        if not finite:
            for w in cutlass.range_constexpr(n_words):
                words[base + w] = Uint32(0)
        return sf_byte

    @cute.jit
    def _markstein(self, a: Float32, b: Float32, rcp_b: Float32) -> Float32:
        """fl(a / b) from rcp_b = fl(1 / b) (Markstein's theorem) where no step under- or
        overflows; 0 for a = 0."""
        q0 = a * rcp_b
        return cute.math.fma(cute.math.fma(-q0, b, a), rcp_b, q0)

    def _magnitudes_and_signs(self, raw, n: int):
        """Functions of an element's index in the ``n`` values loaded in ``raw``: its |x| as
        fp32; and either a word whose bit 31 is x's sign, or (BF16, read off the loaded words'
        bits) the sign bits of a word of 8 codes, by word."""
        if const_expr(self.in_dtype is cutlass.BFloat16):
            pairs = [raw[w] & Uint32(BF16_PAIR_ABS) for w in range(n // 2)]

            def magnitude(i):
                low = pairs[i // 2] << 16
                return _bits_f32(pairs[i // 2] & Uint32(0xFFFF0000) if i % 2 else low)

            def signs(w):
                # bytes 1 and 3 of 4 words (elements 8w..8w+7) end in the signs of 2j and 2j + 1:
                # gathered as bytes, they sit 4 bits above, and at, their code's sign bits
                lo = _byte_perm(raw[4 * w], raw[4 * w + 1], 0x7351)
                hi = _byte_perm(raw[4 * w + 2], raw[4 * w + 3], 0x7351)
                odd = _byte_perm(lo, hi, 0x7632)
                even = _byte_perm(lo, hi, 0x5410)
                return (odd & Uint32(0x80808080)) | ((even >> 4) & Uint32(0x08080808))

            return magnitude, None, signs

        else:
            # (read here, in the caller's region: the closures may run in sibling regions)
            vals = raw.to(Float32)
            bits = [_f32_bits(vals[i]) for i in range(n)]

            def magnitude(i):
                return _bits_f32(bits[i] & Uint32(ABS_MASK))

            def sign(i):
                return bits[i]

            return magnitude, sign, None

    @cute.jit
    def _encode_words(
        self,
        magnitude,
        sign,
        words: cute.Tensor,
        base,
        n_words: cutlass.Constexpr,
        rcp: Float32,
        divisor: Float32,
        how: cutlass.Constexpr,
    ):
        """Pack the E2M1 codes of the quotients fl(|x| / divisor) with x's sign into ``words``, 8
        per 32-bit word. ``how``: "exact" (rcp a power of two: |x| * rcp is the quotient),
        "markstein" (|x| * rcp, then one fma correction; rcp = fl(1 / divisor), 0 for a zero
        divisor) or "divide" (IEEE divisions). ``sign``: the two sign functions of
        _magnitudes_and_signs, one of them None."""
        sign_bit, sign_bits = sign
        for w in cutlass.range_constexpr(n_words):
            word = Uint32(0)
            for e in cutlass.range_constexpr(8):
                ax = magnitude(w * 8 + e)
                if const_expr(how == "exact"):
                    mag = ax * rcp
                else:
                    if const_expr(how == "markstein"):
                        q = self._markstein(ax, divisor, rcp)
                    else:
                        q = ax / divisor
                    # (quotients past 6 all encode as 6)
                    mag = cute.arch.fmin(q, Float32(E2M1_MAX))
                # each code enters at the top nibble and moves down 4 bits per later code (its
                # sign bit, if by element, enters at bit 31)
                word = _shift_in_nibble(word, self._e2m1_code(mag))
                if const_expr(sign_bit is not None):
                    word = word | (sign_bit(w * 8 + e) & Uint32(SIGN_BIT))
            if const_expr(sign_bits is not None):
                word = word | sign_bits(w)
            words[base + w] = word

    @cute.jit
    def _e2m1_code(self, mag: Float32) -> Uint32:
        """The E2M1 code of 0 <= mag <= 6, rounded to nearest even, in the low nibble (sign bit
        3 clear; the bits above the nibble are not cleared). magic = 2^(22 + seg) + 2 seg ulps has
        the ulp 2^(seg - 1) of mag's segment, so mag + magic rounds mag to the segment's grid (k
        steps; an even sum is an even k) and the sum's bits are magic's + k: their mantissa is
        the index k + 2 seg <= 7, with bit 3 clear."""
        biased_exp = max(_f32_bits(mag) >> 23, Uint32(127))  # (mag >= 0: no sign bit)
        magic_bits = biased_exp * Uint32((1 << 23) + 2) + Uint32(MAGIC_OFFSET)
        return _f32_bits(mag + _bits_f32(magic_bits))

    @cute.jit
    def _e8m0_scale(self, amax_bits: Uint32) -> Uint32:
        """E8M0 bits of 2^ceil(log2(amax / 6)), clamped to [2^-127, 2^127]: amax = f 2^E with
        f in [1, 2) needs 6 * 2^e >= amax, i.e. e = E - 2 for f <= 1.5 and E - 1 above."""
        exp_bits = Int32(amax_bits >> 23)
        up = Int32((amax_bits & Uint32(0x7FFFFF)) > Uint32(0x400000))
        return Uint32(max(exp_bits + up - 2, Int32(0)))


def compile_quantizer(
    in_dtype: str,
    sf_vec_size: int,
    dynamic: bool,
    options: str = "",
    local_amax: bool = False,
    tokens: bool = False,
    exact_rows: bool = False,
):
    """Compile for any shape (runtime extents; ``local_amax``: dynamic x of at most
    ``LOCAL_AMAX_BYTES``; ``tokens``: the Hopper decode GEMM's token copy; ``exact_rows``: the
    exact BF16 rows of the codes); returns the executor.

    ``options="--gpu-arch sm_90a --keep-ptx --dump-dir=DIR"`` cross-compiles without a GPU."""
    import cuda.bindings.driver as cuda_driver

    op = QuantizeFp4(in_dtype, sf_vec_size, dynamic, local_amax, tokens, exact_rows)
    args = compile_arguments(op)
    return cute.compile(op, *args, cuda_driver.CUstream(0), options=options)


def compile_arguments(op: QuantizeFp4) -> tuple:
    """Placeholders of the launch's arguments but the stream, for ``cute.compile``: the pointers
    (x, codes, scales, input and output global scales, amax partials; compilation only needs
    their element types and alignments), (rows, K, L) and the SM count."""
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    ptrs = (
        make_ptr(op.in_dtype, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Uint8, 0, gmem, assumed_align=16),
        make_ptr(cutlass.Uint8, 0, gmem, assumed_align=16),
        make_ptr(Float32, 0, gmem, assumed_align=4),
        make_ptr(Float32, 0, gmem, assumed_align=4),
        make_ptr(Uint32, 0, gmem, assumed_align=4),
    )
    return (*ptrs, (Int32(1), Int32(32), Int32(1)), Int32(1))


def shape_reason(shape: tuple, sf_vec_size: int) -> str:
    """Why x of this shape cannot be quantized ("" if it can): [rows, K] or [L, rows, K], K a
    multiple of 32; the kernel's 32-bit offsets need fewer than 2^31 elements and 2^31 padded
    scale bytes (rows padded to 128)."""
    if len(shape) not in (2, 3) or shape[-1] % 32:
        return f"x must be [rows, K] or [L, rows, K] with K % 32 == 0, got {shape}"
    if min(shape) < 1:
        return f"x's extents must be >= 1, got {shape}"
    l, rows, k = (1, *shape) if len(shape) == 2 else shape  # noqa: E741
    if l * rows * k >= 2**31:
        return f"x {shape} has {l * rows * k} elements; the kernel's offsets are 32-bit (< 2^31)"
    scale_bytes = l * blocked_numel(rows, k // sf_vec_size)
    if scale_bytes >= 2**31:
        return f"x {shape} needs {scale_bytes} padded scale bytes; the kernel's offsets are 32-bit"
    return ""


@dataclass(frozen=True)
class QuantizerConfig:
    """What one compiled quantizer is: with the device index, the key of its cache."""

    in_dtype: str  # a key of IN_DTYPES
    sf_vec_size: int
    dynamic: bool  # NVFP4 with the global scale found on the device (the amax grid first)
    local_amax: bool = False  # dynamic, x of LOCAL_AMAX_BYTES at most: no amax grid
    tokens: bool = False  # the Hopper W4A4 decode GEMM's token copy instead of codes and scales
    exact_rows: bool = False  # the codes' exact BF16 values in plain K order instead

    def kernel(self) -> QuantizeFp4:
        """A new kernel object of this configuration (what ``compile_quantizer`` compiles)."""
        return QuantizeFp4(
            self.in_dtype,
            self.sf_vec_size,
            self.dynamic,
            self.local_amax,
            self.tokens,
            self.exact_rows,
        )


# (QuantizerConfig, device index) -> (compiled kernel, its TVM-FFI function, the SM count)
_KERNELS: dict[tuple[QuantizerConfig, int], tuple] = {}
# (x's torch dtype, sf_vec_size, dynamic, local amax, device index) -> _KERNELS' (function,
# SM count): the launch's lookup, without building a QuantizerConfig per call
_LAUNCHERS: dict[tuple, tuple] = {}
# (x's shape, sf_vec_size, device index, stream handle) -> scratch_buffers' tensors
_SCRATCH: dict[tuple, tuple] = {}
# (device index, stream handle) -> _partials' buffer
_PARTIALS: dict[tuple, object] = {}
# (device index, stream handle) -> tokens_scale's global scale
_TOKEN_SCALES: dict[tuple, object] = {}


def quantize_cuda(x, sf_vec_size: int, global_scale=None):
    """Quantize a CUDA tensor x [rows, K] or [L, rows, K] (copied first unless contiguous and
    16-byte aligned; limits: ``shape_reason``) on the current stream.

    Returns ``(codes uint8 [.., rows, K/2], blocked scales [n] or [L, n], global scale 0-d
    float32)``, all on x's device; ``global_scale`` (NVFP4 only): a 0-d float32 tensor on x's
    device, or None for the dynamic one. Nothing synchronizes with the host.
    """
    if not x.is_cuda or x.dtype not in DSL_DTYPE_NAMES:
        raise ValueError(f"x must be a bfloat16, float16 or float32 CUDA tensor, got {x.dtype}")
    if sf_vec_size not in SF_VEC_SIZES:
        raise ValueError(f"sf_vec_size must be 16 (NVFP4) or 32 (MXFP4), got {sf_vec_size}")
    reason = shape_reason(tuple(x.shape), sf_vec_size)
    if reason:
        raise ValueError(reason)
    if global_scale is not None:
        if sf_vec_size != 16:
            raise ValueError("global_scale is NVFP4's; MXFP4 has none")
        if not isinstance(global_scale, torch.Tensor) or global_scale.numel() != 1:
            raise ValueError(f"global_scale must be a one-element tensor, got {global_scale!r}")
        if global_scale.dtype != torch.float32 or global_scale.device != x.device:
            raise ValueError("global_scale must be a float32 tensor on x's device")
    q, sf, gs = launch_quantize(x, sf_vec_size, global_scale)
    return q, sf.view(*q.shape[:-2], -1), gs


def launch_quantize(x, sf_vec_size: int, global_scale=None, scratch=None):
    """``quantize_cuda`` for arguments its checks (or ``fp4_ops.quantize``'s) have passed:
    (codes, blocked scales shaped by atoms in the format's dtype, global scale). ``scratch``:
    ``scratch_buffers``' (codes, scales, global scale) to write instead of new tensors, for a
    consumer that reads them on this stream before the next call does (returned as given)."""
    x = aligned_rows(x)
    plan = plan_quantize(x, sf_vec_size, global_scale)
    stream = stream_handle(x.get_device())
    if x.device.index == torch.cuda.current_device():
        return _run(plan, x, global_scale, scratch, stream)
    with torch.cuda.device(x.device):
        return _run(plan, x, global_scale, scratch, stream)


def _run(plan: QuantizePlan, x, global_scale, scratch, stream: int):
    """``launch_quantize``'s launch on x's device (the current one)."""
    if scratch is None:
        return plan(x, global_scale, stream)
    plan.bind(scratch, global_scale)(x.data_ptr(), stream)
    return scratch


# (an expanded template is not dense: empty_like would otherwise pick a layout for it)
DENSE = torch.contiguous_format


@dataclass(frozen=True)
class QuantizePlan:
    """The quantization of one x shape and dtype, format and kind of global scale (static or
    dynamic) on one stream, checked once: ``plan(x, global_scale, stream)`` makes the outputs
    and launches, with no checks. The caller checks at each call that x is contiguous, 16-byte
    aligned and on the current device, and (dynamic) that no CUDA graph is being captured: the
    amax pass's partials buffer is this stream's."""

    fn: object
    templates: tuple  # ``output_templates``: codes, blocked scales (shaped by atoms), global scale
    tail: tuple  # (rows, K, L), SM count
    partials: torch.Tensor | None  # dynamic NVFP4: the amax pass's per-CTA maxima
    config: QuantizerConfig

    def __call__(self, x, global_scale, stream_handle: int):
        q_like, sf_like, gs_like = self.templates
        q = torch.empty_like(q_like, memory_format=DENSE)
        sf = torch.empty_like(sf_like, memory_format=DENSE)
        gs = torch.empty_like(gs_like)
        gs_in = gs if global_scale is None else global_scale
        partials = gs if self.partials is None else self.partials
        ptrs = (q.data_ptr(), sf.data_ptr(), gs_in.data_ptr(), gs.data_ptr(), partials.data_ptr())
        self.fn(x.data_ptr(), *ptrs, *self.tail, stream_handle)
        return q, sf, gs

    def bind(self, outputs: tuple, global_scale=None) -> BoundQuantize:
        """This quantization into fixed ``outputs`` (``scratch_buffers``), with ``global_scale``
        (None: dynamic or MXFP4) bound."""
        q, sf, gs = outputs
        held = (q, sf, gs if global_scale is None else global_scale, gs)
        held += (gs if self.partials is None else self.partials,)
        ptrs = tuple(t.data_ptr() for t in held)
        return BoundQuantize(self.fn, (*ptrs, *self.tail), held, self.config)


@dataclass(frozen=True)
class BoundQuantize:
    """A ``QuantizePlan`` into fixed outputs (a layer's scratch): ``bound(x, stream)`` takes
    x's address, no checks."""

    fn: object
    tail: tuple  # the outputs' (and the input scale's) addresses, (rows, K, L), SM count
    held: tuple
    config: QuantizerConfig

    def __call__(self, x: int, stream_handle: int) -> None:
        self.fn(x, *self.tail, stream_handle)


@dataclass(frozen=True)
class TokensQuantize:
    """The quantizer's tokens mode bound to one layer's token copy (``bind_tokens``): what
    ``fp4_ops.sm90.tokens_step`` launches ahead of the GEMM, which compiles the kernel itself
    (``config``) and passes x's address, then ``tail``."""

    tail: tuple  # the copy's (twice), the scales' and the partials' addresses, (rows, K, 1), SMs
    held: tuple
    config: QuantizerConfig


def plan_quantize(x, sf_vec_size: int, global_scale=None) -> QuantizePlan:
    """The ``QuantizePlan`` of contiguous x [rows, K] or [L, rows, K] (checked) on x's device's
    current stream; compiles the kernel at the first use of its configuration."""
    rows, k = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    l = x.shape[0] if lead else 1  # noqa: E741
    index = x.get_device()
    dynamic = sf_vec_size == 16 and global_scale is None
    local = dynamic and x.numel() * x.element_size() <= LOCAL_AMAX_BYTES
    kernel, sm_count = _kernel(x.dtype, sf_vec_size, dynamic, index, local)
    partials = _partials(x.device, stream_handle(index)) if dynamic and not local else None
    sf_shape = (*lead, *blocked_scale_shape(rows, k, sf_vec_size))
    q_shape = (*lead, rows, k // 2)
    templates = output_templates(q_shape, sf_shape, SCALE_DTYPES[sf_vec_size], x.device)
    config = QuantizerConfig(DSL_DTYPE_NAMES[x.dtype], sf_vec_size, dynamic, local)
    return QuantizePlan(kernel, templates, ((rows, k, l), sm_count), partials, config)


def output_templates(q_shape, sf_shape, sf_dtype: torch.dtype, device) -> tuple:
    """Templates of a quantization's outputs (codes, blocked scales, global scale): their
    shapes and dtypes over one element each, for ``torch.empty_like``, which parses no sizes
    (the cheapest new tensor); ``memory_format=DENSE`` makes them contiguous."""
    one = (torch.empty((), dtype=d, device=device) for d in (torch.uint8, sf_dtype, torch.float32))
    return tuple(t.expand(shape) for t, shape in zip(one, (q_shape, sf_shape, ()), strict=True))


def tokens_scale(x):
    """The global scale that ``bind_tokens`` writes for a dynamic x on x's device's current
    stream: a 0-d float32 kept per stream outside every graph pool (a new one under CUDA-graph
    capture). Whatever reads it must do so on that stream before the next quantization there:
    the GEMM launched right after."""
    stream = stream_handle(x.get_device())
    return _stream_buffer(_TOKEN_SCALES, x.device, stream, (), torch.float32)


def bind_tokens(
    x, sf_vec_size: int, copy: torch.Tensor, global_scale, gs_out: torch.Tensor, sm_count: int
) -> TokensQuantize:
    """The quantization of x [rows, K] (checked, contiguous; L = 1) on x's device's current
    stream into the Hopper W4A4 decode GEMM's token copy instead of codes and scales (``copy``:
    the launcher's converted kernel B, [1, rows', K_pad] with rows' >= rows, whose padding rows
    it does not write), with ``global_scale`` (None: dynamic, or MXFP4) and the global scale
    written to ``gs_out`` (``tokens_scale``), on ``sm_count`` SMs: a ``TokensQuantize``."""
    rows, k = x.shape
    index = x.get_device()
    need = rows * -(-k // K_BLOCK) * K_BLOCK
    if copy.element_size() != 2 or copy.numel() < need or copy.get_device() != index:
        raise ValueError(
            f"copy must hold 16-bit values for {rows} x {k} rounded up to 64 on {x.device}, "
            f"got {copy.dtype} {tuple(copy.shape)} on {copy.device}"
        )
    # (the kernel writes it by row pitch in 16-byte stores)
    if not copy.is_contiguous() or copy.data_ptr() % 16:
        raise ValueError("copy must be contiguous and 16-byte aligned")
    dynamic = sf_vec_size == 16 and global_scale is None
    local = dynamic and x.numel() * x.element_size() <= LOCAL_AMAX_BYTES
    partials = _partials(x.device, stream_handle(index)) if dynamic and not local else gs_out
    # (the copy stands in for the scales, which this kernel neither reads nor writes)
    held = (copy, copy, gs_out if global_scale is None else global_scale, gs_out, partials)
    ptrs = tuple(t.data_ptr() for t in held)
    config = QuantizerConfig(DSL_DTYPE_NAMES[x.dtype], sf_vec_size, dynamic, local, True)
    return TokensQuantize((*ptrs, (rows, k, 1), sm_count), held, config)


def _outputs(rows: int, k: int, sf_vec_size: int, device):
    """New (codes, blocked scales as bytes, global scale) for x [rows, K]."""
    q = torch.empty((rows, k // 2), dtype=torch.uint8, device=device)
    sf = torch.empty(blocked_numel(rows, k // sf_vec_size), dtype=torch.uint8, device=device)
    return q, sf, torch.empty((), dtype=torch.float32, device=device)


def scratch_buffers(x, sf_vec_size: int):
    """(codes, blocked scales as bytes, global scale) for x [rows, K] on x's device and current
    stream, made once per shape and stream outside every graph pool, or None under CUDA-graph
    capture (a graph keeps its own). Whatever reads them must do so on that stream before the
    next quantization there writes them again: fp4_ops' own GEMM, launched right after."""
    index = x.get_device()
    key = (x.shape, sf_vec_size, index, stream_handle(index))
    rows, k = x.shape
    return kept(_SCRATCH, key, lambda: _outputs(rows, k, sf_vec_size, x.device), x.device)


def _partials(device, stream: int):
    """The amax pass's per-CTA maxima: one buffer per stream, made outside every graph pool
    (the quantize pass of the same call reads it before the next call's amax pass can start,
    which waits for the stream); a new one under CUDA-graph capture."""
    return _stream_buffer(_PARTIALS, device, stream, MAX_PARTIALS, torch.int32)


def _stream_buffer(cache: dict, device, stream: int, shape, dtype):
    """A tensor of ``shape`` and ``dtype`` kept per (device, stream) in ``cache`` outside every
    graph pool (``memory.kept``), or a new one under CUDA-graph capture."""

    def make():
        return torch.empty(shape, dtype=dtype, device=device)

    found = kept(cache, (device.index, stream), make, device)
    return make() if found is None else found


def _kernel(in_dtype, sf_vec_size: int, dynamic, index: int, local_amax=False, exact=False):
    """(the compiled quantizer's TVM-FFI function, the device's SM count) for x of torch dtype
    ``in_dtype`` on CUDA device ``index`` (``exact``: the exact-rows mode), compiled once per
    process (``QuantizerConfig``)."""
    found = _LAUNCHERS.get((in_dtype, sf_vec_size, dynamic, local_amax, exact, index))
    if found is None:
        name = DSL_DTYPE_NAMES[in_dtype]
        config = QuantizerConfig(name, sf_vec_size, dynamic, local_amax, exact_rows=exact)
        if (config, index) not in _KERNELS:
            with torch.cuda.device(index):
                # (TVM-FFI: the launch takes plain ints for pointers, extents and the stream)
                compiled = compile_quantizer(
                    config.in_dtype,
                    config.sf_vec_size,
                    config.dynamic,
                    "--enable-tvm-ffi",
                    config.local_amax,
                    exact_rows=exact,
                )
            sm_count = torch.cuda.get_device_properties(index).multi_processor_count
            _KERNELS[config, index] = (compiled, compiled.__tvm_ffi_object__(), sm_count)
        found = _KERNELS[config, index][1:]
        _LAUNCHERS[in_dtype, sf_vec_size, dynamic, local_amax, exact, index] = found
    return found


def quantize_exact_rows(x, sf_vec_size: int):
    """x [rows >= 1, K] (a CUDA tensor on the current device, bfloat16 / float16 / float32, K a
    multiple of 32) quantized as ``fp4_ops.quantize(x)`` quantizes it (NVFP4: the dynamic global
    scale), in one pass that writes each code's exact value in place of codes and scales:
    (BF16 [rows, K], e2m1 x block scale (MXFP4's also x MXFP4_BF16_SHIFT: 6 x 2^127 overflows
    BF16), the float32 scalar on x's device that turns them into the quantized values: the
    global scale, or 1 / the shift). The rows the Hopper grouped W4A16 kernel takes for W4A4."""
    rows, k = x.shape
    x = aligned_rows(x)
    device, index = x.device, x.get_device()
    values = torch.empty((rows, k), dtype=torch.bfloat16, device=device)
    gs = torch.empty((), dtype=torch.float32, device=device)
    dynamic = sf_vec_size == 16
    local = dynamic and x.numel() * x.element_size() <= LOCAL_AMAX_BYTES
    fn, sm_count = _kernel(x.dtype, sf_vec_size, dynamic, index, local, exact=True)
    stream = stream_handle(index)
    partials = _partials(device, stream) if dynamic and not local else gs
    # (no scales are written: the values stand in for their pointer; gs is read when static)
    ptrs = (values, values, gs, gs, partials)
    fn(x.data_ptr(), *(t.data_ptr() for t in ptrs), (rows, k, 1), sm_count, stream)
    return values, gs if dynamic else device_scalar(1 / MXFP4_BF16_SHIFT, device)


def _torchao_quantizer(x, gs):
    """torchao's NVFP4 quantizer (torch-ops path, swizzled scales) on x, or None without it."""
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except Exception:  # (absent, or built for another torch)
        return None

    def run():
        scale = per_tensor_amax_to_scale(x.abs().amax()) if gs is None else gs
        return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale, is_swizzled_scales=True)

    return run


def benchmark(x, vec: int, gs) -> None:
    """Print the time of this quantizer, of a device copy of x and of torchao's quantizer on the
    same x (NVFP4), with effective bandwidths."""
    n = x.numel()
    moved = n * x.element_size() * (2 if vec == 16 and gs is None else 1) + n // 2
    moved += n // vec  # scale bytes (before padding)
    ours = time_graph_us(lambda: quantize_cuda(x, vec, gs))
    dst = torch.empty_like(x)
    copy = time_graph_us(lambda: dst.copy_(x))
    copy_bw = 2 * n * x.element_size() / copy / 1e3
    eager = time_eager_us(lambda: quantize_cuda(x, vec, gs), iterations=20)
    print(f"Mean time: {ours:.2f} us (fp4_ops.quantizer, CUDA graph; {eager:.2f} us eager)")
    print(
        f"Throughput: {moved / ours / 1e3:.1f} GB/s moved ({moved} bytes), "
        f"{moved / ours / 1e3 / copy_bw:.2f} x the copy's {copy_bw:.1f} GB/s "
        f"(copy of x: {copy:.2f} us)"
    )
    run = _torchao_quantizer(x, gs) if vec == 16 else None
    if run is None:
        print("torchao: not measured (not importable here, or MXFP4)")
        return
    # (eagerly: a failed capture of code that was not written for graphs would end the run)
    theirs = time_eager_us(run)
    print(
        f"torchao NVFP4Tensor.to_nvfp4 (eager): {theirs:.2f} us, {theirs / eager:.1f} x ours eager"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fp4_ops.quantizer",
        description="NVFP4 / MXFP4 quantizer for the GPU, bit-exact with the formats' definition.",
    )
    p.add_argument("--shape", default="8192,8192", help="rows,K or L,rows,K")
    p.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--in_dtype", choices=sorted(IN_DTYPES), default="BFloat16")
    p.add_argument("--global_scale", type=float, default=None, help="static NVFP4 scale")
    p.add_argument("--compile_only", action="store_true")
    p.add_argument("--benchmark", action="store_true", help="time it against a copy and peers")
    p.add_argument("--gpu_arch", choices=GPU_ARCHS, default=None, help="with --compile_only")
    args = p.parse_args(argv)
    if args.benchmark and args.compile_only:
        print("error: --benchmark runs the kernel: not with --compile_only", file=sys.stderr)
        return 2
    if args.gpu_arch is not None and not args.compile_only:
        print("error: --gpu_arch is --compile_only's target: give both or neither", file=sys.stderr)
        return 2
    args.gpu_arch = args.gpu_arch or "sm_90a"
    try:
        shape = tuple(int(v) for v in args.shape.split(","))
    except ValueError:
        print(f"error: --shape {args.shape}: integers, e.g. 16,8192", file=sys.stderr)
        return 2
    vec = 16 if args.format == "nvfp4" else 32
    reason = shape_reason(shape, vec)
    if reason:
        print(f"error: --shape {args.shape}: {reason}", file=sys.stderr)
        return 2
    # (the kernel reads it as float32: what rounds to 0 or overflows there is no scale)
    as_f32 = None if args.global_scale is None else float(torch.tensor(args.global_scale))
    if as_f32 is not None and (vec != 16 or not 0 < as_f32 < math.inf):
        print(
            f"error: --global_scale {args.global_scale}: a finite value > 0 in float32, NVFP4 only",
            file=sys.stderr,
        )
        return 2
    dynamic = vec == 16 and args.global_scale is None
    print(
        f"fp4_ops.quantizer: shape={shape} format={args.format} in_dtype={args.in_dtype} "
        f"global_scale={'dynamic' if dynamic else args.global_scale}"
    )
    if args.compile_only:
        compile_quantizer(args.in_dtype, vec, dynamic, f"--gpu-arch {args.gpu_arch}")
        print(f"compiled for {args.gpu_arch}")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --compile_only)", file=sys.stderr)
        return 2
    x = torch.randn(shape, device="cuda").to(
        {v: k for k, v in DSL_DTYPE_NAMES.items()}[args.in_dtype]
    )
    gs = None if args.global_scale is None else torch.tensor(args.global_scale, device="cuda")
    q, sf, g = quantize_cuda(x, vec, gs)
    # the check: the torch implementation of the same definition, on the CPU
    if vec == 16:
        rq, rsf, rg = cpu.quantize_nvfp4(x.cpu(), None if gs is None else gs.cpu())
    else:
        rq, rsf, rg = cpu.quantize_mxfp4(x.cpu())
    ok = (
        torch.equal(q.cpu(), rq)
        and torch.equal(sf.view(torch.uint8).cpu(), rsf.view(torch.uint8))
        and torch.equal(g.cpu(), rg)
    )
    print("PASS" if ok else "FAIL: differs from fp4_ops.cpu")
    if ok and args.benchmark:
        benchmark(x, vec, gs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
