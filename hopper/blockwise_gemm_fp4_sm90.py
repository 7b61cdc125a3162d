# SPDX-License-Identifier: BSD-3-Clause
"""Persistent, warp-specialized NVFP4 / MXFP4 (W4A4) GEMM for Hopper (sm_90a; run on an H200).

What it computes
----------------
    D[m, n, l] = alpha * sum_k (A[m, k, l] * SFA[m, k // V, l]) * (B[n, k, l] * SFB[n, k // V, l])

with the operands of the Blackwell kernel (``blockwise_gemm_fp4.py``): A [M, K/2, L] and
B [N, K/2, L] packed FP4 bytes, K-major, element 2i in the low nibble; SFA / SFB in the 128x4
blocked layout of ``reference.to_blocked``; NVFP4 = Float8E4M3FN scales per 16 elements, MXFP4 =
Float8E8M0FNU scales per 32; alpha a runtime fp32; D BFloat16 / Float16 / Float32, row-major
[M, N] per batch with row pitch N (no padding: M and N are arbitrary).

Hopper has no FP4 tensor cores, so FP4 is dequantized exactly to F16 (NVFP4 on the decode
path) or BF16 (MXFP4; NVFP4 on prefill) with integer, byte-permute and packed-half
multiplies, and the tensor cores run F16 / BF16
``wgmma`` with FP32 accumulation.  Every e2m1 * scale product is exact in that type (see
``Exactness``), so D equals ``reference.reference_gemm`` up to the order of the fp32 summation.

Operand roles ("kernel A" / "kernel B") and the two paths
----------------------------------------------------------
The kernel computes a tile of rows x cols of the *row* operand ("kernel A", the wgmma A
operand) against the *column* operand ("kernel B", the wgmma B operand, always in SMEM).
    decode  (M <= 2048): kernel A = B (weights), kernel B = A (tokens); D^T = B A^T, so the
            token count is the wgmma N (tiles of 8..128 tokens) and the large weight matrix is
            dequantized straight into the wgmma A register fragment (RS wgmma), never through
            SMEM (once per token tile: up to 2048 tokens cheaper than converting it).  A prologue
            kernel (``convert_operands``, same launch sequence) converts the tokens once into
            an F16 / BF16 copy in the permuted K order below, which TMA brings straight into the
            wgmma B layout; the GEMM's producer requests its first stage of weights before it
            waits for the prologue (programmatic dependent launch).  Two CTAs per SM for
            <= 64 tokens; kernel tiles of 128 or 64 weight rows and split-K chosen by the
            busiest CTA's work (deterministic fix-up by the last split, in split order, over
            value-major fp32 partials).  Where split-K units would be short and one CTA per 64
            weight rows fills the GPU in one wave, ``k_groups`` = 4 groups of consumer
            warpgroups split each unit's k-tiles inside one CTA per SM and sum their
            accumulators through SMEM, in group order, instead.
    prefill (M > 2048, or where decode's padded token copy would pass 2^31 elements): both
            operands are converted once per launch by ``convert_operands`` (not once per
            output tile, which costs (M / 128 + N / 256) x the conversions) and the mainloop is
            a plain SS-wgmma GEMM over 128 x 256 tiles in 2x1 clusters that multicast their
            common B tile.
The path and tile are chosen by ``default_config`` (documented there); ``--path`` overrides.
After ``convert_operands`` the GEMM grid is launched with programmatic dependent launch, so its
prologue overlaps the conversion; its producer waits (``griddepcontrol.wait``) before it loads a
converted operand (on decode it requests the first stage's weights before the wait).  The GEMM
releases its dependents once every CTA has issued its last load; on decode tiles of up to 16
or 32 tokens (``prologue_pdl``) ``convert_operands`` is launched with PDL as well, waits for the
kernel ahead of it before it touches memory, and so starts within the previous launch's tail;
its CTAs are small enough (128 threads, <= 32 registers) to share an SM with two GEMM CTAs of
128 weight rows, or with one CTA of 4 K groups.

Warp roles (128 * (1 + G * k_groups) threads, G = 1 or 2 row warpgroups, 1 or 2 CTAs per SM)
------------------------------------------------------------------------------------------
    ==========  ============  =================================================================
    warps       role          work
    ==========  ============  =================================================================
    0           TMA producer  per stage: packed kernel A + its scales (decode) or the
                              converted A tile (prefill); converted kernel B (multicast to the
                              2x1 cluster on prefill)
    1 .. 3      (idle)        give their registers back to the consumers
    4 .. 4Gk+3  consumers     per 64-wide k-block: decode dequantizes its 64 kernel-A
                              rows into registers; then 4 wgmma (m64 x tile_cols x k16);
                              epilogue (after the split-K fix-up): * alpha, convert,
                              (rows x 32)-column subtiles through SMEM, TMA stores issued by
                              warp 4 (direct stores where D's row pitch is not a multiple of 16
                              bytes, and for split-K decode tiles of 128 rows x 64 tokens).
                              k_groups > 1: group g (warpgroups g x G ...) takes the unit's
                              k-tiles in stages s with s % k_groups == g; groups 1.. park their
                              accumulators in SMEM, group 0 adds them and runs the epilogue
    ==========  ============  =================================================================

Pipelines and barriers (producer -> consumer)
---------------------------------------------
    ab_pipeline (PipelineTmaAsync, ``num_stages`` deep; two 64-wide k-blocks per stage over
                 packed FP4, one over converted tiles): TMA producer -> consumer warpgroups (of
                 both CTAs of a 2x1 cluster: a stage is refilled only when both released it).
                 A stage is released one step later, once the wgmma that read it completed
                 (k_groups > 1: each group waits for that wgmma and frees the stage at once, so
                 that a group holds one stage, and one group's consumer warps release it).
    d_pipeline  (PipelineTmaStore, 2 deep; 1 when a tile is one subtile): consumer warpgroups
                 -> TMA store unit; a subtile buffer is rewritten once its store has read it.
    NamedBarrierId.EPILOGUE: consumer threads (of group 0), twice per D subtile (written to
                 SMEM / its buffer free again)
    NamedBarrierId.SPLITK_FIXUP: consumer threads (of group 0) around the split-K tile counter
    NamedBarrierId.K_GROUP_REDUCE (k_groups > 1): all consumer threads, twice per work unit
                 (accumulators parked / read back)
Every role walks the same static persistent tile schedule (StaticPersistentTileScheduler over
row tiles x col tiles x (L * split_k), in clusters of 2 x 1 on prefill), so they agree on the
order without talking.

Dequantization (``_fp4x8_to_f16x2``, ``_fp4x8_to_bf16x2``)
----------------------------------------------------------
One 32-bit word holds 8 e2m1 nibbles; both formats pair nibbles (p, p + 4) into one 32-bit
register.  NVFP4: the F16 bits of e2m1 * 2^-14 are one byte, ``sign << 7 | (exp, mant) << 1``,
above a zero byte (0.5 becomes the F16 subnormal 2^-15); two masked shifts build that byte for
the four even nibbles, two more for the odd ones, one ``prmt`` per pair puts two bytes in
place, and one ``mul.rn.f16x2`` by the scale * 2^7 (``cvt.rn.f16x2.e4m3x2``, then * 128) gives
e2m1 * scale * 2^-7: about 15 instructions per 8 values.  The kernel multiplies alpha by 2^14
(2^-7 from each operand; ``alpha_reason`` keeps that finite), so acc * alpha still rounds once.
BF16 (MXFP4, and NVFP4 on prefill, converted once per launch): ``sign << 15 | (exp, mant) << 6``
as BF16 is e2m1 * 2^-126 (one AND, one IMAD, one AND), then ``mul.rn.bf16x2`` by 2^126 and by
the scale (E4M3 bits << 4 read as BF16 are scale * 2^-120, subnormals included, times 2^120).
The pairing (p, p + 4) instead of (2i, 2i + 1) is a permutation of K inside each 64-wide
k-block (a thread's 16 consecutive K values, one NVFP4 scale block read with one 8-byte load,
land in wgmma K slots 16 (i // 2) + 8 (i % 2) + 2q, +1); both operands use the same permutation
(``convert_operands`` writes it), so the dot products are unchanged.

Exactness
---------
e2m1 significands have 2 bits, E4M3 ones 4 bits, so e2m1 * scale = i * 2^-10 with an integer i
of at most 6 significant bits and |value| <= 2688 (E4M3 subnormal scales included).  Times
2^-7 that is i * 2^-17: F16 holds it exactly (11 significant bits, subnormal step 2^-24), as it
holds e2m1 * 2^-14 and scale * 2^7 (<= 57344); ``test_nvfp4_f16_conversion_is_exact`` checks
every nibble against every finite E4M3 scale.  BF16 (8 significant bits, exponents down to
2^-133) holds i * 2^-10 too.  An E8M0 scale is a power of two, so the MXFP4
product is the e2m1 value with a shifted exponent, exact in BF16 unless it leaves BF16's range
(which FP32 shares); E8M0 bits << 7 are the BF16 power of two (bits 0 -> 2^-127, a BF16
subnormal).

Constraints (``can_implement`` explains each refusal)
----------------------------------------------------
* K % 32 == 0 (16-byte TMA rows of packed FP4); M, N >= 1 arbitrary; L >= 1.
* kernel tile rows 64 or 128 (one or two consumer warpgroups); kernel tile cols 8, 16, 32, 64,
  128 or 256 (a divisor or multiple of the 128-row scale atom).
* cluster shape (1, 1), or (2, 1) on the prefill path (the default there).
* NVFP4 on the decode path (F16 operands): |alpha| < 2^114 (alpha * 2^14 must be
  finite); prefill (BF16) takes any finite fp32 alpha.
* 32-bit offsets: D (M*N*L), packed A and B (M*K/2*L, N*K/2*L bytes), the converted copies
  (rows x K rounded up to 64 x L; decode pads the token rows) and, on decode and prefill, the
  blocked scales (bytes) each stay below 2^31.
* split_k 1..16, and split-K only with kernel tiles at most 128 wide.
* decode and prefill keep F16 / BF16 copies of the converted operands in the runner's workspace
  ((L x rows x K rounded up to 64) x 2 bytes each; on decode the token rows are rounded up to
  whole token tiles: ``converted_shapes``).
* every operand (packed A and B, blocked scales, D) starts on a 16-byte boundary and is
  contiguous (TMA); ``Fp4GemmSm90Runner`` checks it (``operand_reasons``).
* the blocked scales' padding (rows past M or N, scale columns past K / sf_vec_size) holds zero
  bytes, as ``reference.to_blocked`` writes it: where K is not a multiple of 128, the mainloop's
  last k-tile multiplies TMA's zero fill (K past the end) by the scales of those K, which are
  padding bytes where their atom holds them (0 x NaN would be NaN).
* NaN scales: an E4M3 NaN makes D NaN where the reference does; an E8M0 NaN (byte 255) is read
  as +inf, so D is inf or NaN there.
* D leaves through TMA stores when N * sizeof(D) is a multiple of 16 bytes (a TMA stride rule);
  otherwise the runner takes the variant compiled with direct, predicated stores
  (``tma_store_fits``).

Run
---
    python hopper/blockwise_gemm_fp4_sm90.py --mnkl 8192,8192,8192,1     # H200 (H100: untested)
    python hopper/blockwise_gemm_fp4_sm90.py --mnkl 16,8192,8192,1 --sf_vec_size 32 \\
        --sf_dtype Float8E8M0FNU --c_dtype Float32
    python hopper/blockwise_gemm_fp4_sm90.py --mnkl 4096,4096,4096,1 --compile_only   # any host
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import struct
import sys

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.nvgpu.warpgroup import OperandSource
from cutlass.cutlass_dsl import Int32, Int64, Uint32, Uint64, dsl_user_op
from cutlass.tensor_utils import LayoutEnum

# NOTE: sm_90 allows 227 KiB (232448 bytes) of dynamic SMEM per CTA.
SM90_SMEM_CAPACITY = 232448
SM90_SMEM_PER_SM = 233472
SM90_REGS_PER_SM = 65536
# scale-factor dtype -> the block size it goes with
SF_VEC_OF_DTYPE = {"Float8E4M3FN": 16, "Float8E8M0FNU": 32}
C_DTYPES = {"BFloat16": cutlass.BFloat16, "Float16": cutlass.Float16, "Float32": cutlass.Float32}
VALID_TILE_COLS = (8, 16, 32, 64, 128, 256)
VALID_TILE_ROWS = (64, 128)
PATHS = ("prefill", "decode")
# K elements per pipeline stage (64 packed bytes per row) and per wgmma k-block (4 x k16).
K_TILE = 128
K_BLOCK = 64
# One 128x4 scale atom: 128 rows x 4 scale columns = 512 bytes.
SF_ATOM_ROWS = 128
SF_ATOM_COLS = 4
SF_ATOM_BYTES = 512
# convert_operands: threads per CTA and 16-byte chunks per thread.  Prefill converts whole
# operands (many bytes in flight per thread); decode converts the tokens with small CTAs that
# fit next to two GEMM CTAs on an SM (``DECODE_CONVERT_MAX_REGS``).
CONVERT_THREADS = 256
CONVERT_UNROLL = 4
DECODE_CONVERT_THREADS = 128
DECODE_CONVERT_UNROLL = 2
# NOTE: two decode GEMM CTAs of 128 weight rows hold 2 x 384 threads x 80 registers = 61440 of
# the SM's 65536, so a prologue CTA of 128 threads fits beside them (and can overlap their
# tail, see ``prologue_pdl``) only at <= 32 registers per thread; the launch caps it through
# min_blocks_per_mp.
DECODE_CONVERT_MAX_REGS = 32
# 16-byte chunks in one converted 64-wide k-block row (64 x 2 bytes)
CHUNKS_PER_KBLOCK = 8
MAX_STAGES = 12
# Decode: at most 6 stages in flight per CTA.  With 264 CTAs each requesting its whole ring at
# once, deeper rings measured slower on the H200 (16 x 18432 x 7168: 32.3 us against 33.9 with
# 8 stages; 1 x 8192 x 8192: 16.0-16.1 against 16.3-16.6 with 8), 3 stages slower still
# (hopper/NOTES.md, fifth session).
DECODE_MAX_STAGES = 6
# Decode with k_groups > 1: at most this many stages per CTA, rounded down to a multiple of
# k_groups (H200, 4 groups: 8 or 12 measured best, 6 starved the groups; hopper/NOTES.md,
# twelfth session).
DECODE_K_GROUP_MAX_STAGES = 8
# default_config: K groups of the one-wave decode configuration (see there)
DECODE_K_GROUPS = 4
# default_config: the fixed cost of one decode work unit (its split-K fix-up and store, about
# 1 us on the H200, the time a CTA streams about three k-tiles of 128 weight rows), in weight
# rows x k-tiles of 128
UNIT_COST = 384
# default_config: the decode path (weights dequantized in registers for every 128-token tile)
# up to this M; the prefill path (both operands converted once) beyond it
DECODE_MAX_M = 2048
# TMA-store epilogue: D subtiles of (tile rows) x 32 columns, double-buffered in SMEM.
EPI_COLS = 32
EPI_STAGES = 2
# Split-K fix-up: partial values loaded at once (registers) before they are summed, at most
# FIXUP_LOADS, and fewer where the consumers' registers would not hold them next to the
# accumulators (FIXUP_RESERVED for addresses and the rest of the epilogue).
FIXUP_LOADS = 128
FIXUP_RESERVED = 24
# BF16 bit patterns of 2^126 and 2^120 and F16 bit pattern of 2^7, in both halves.
BF16X2_2POW126 = 0x7E807E80
BF16X2_2POW120 = 0x7B807B80
F16X2_2POW7 = 0x58005800
# NVFP4: each converted operand carries 2^-7 (see ``Exactness``); D = acc * 2^14 * alpha.
NVFP4_ACC_SCALE = 2.0**14
FP32_MAX = (2.0 - 2.0**-23) * 2.0**127


class NamedBarrierId(enum.IntEnum):
    """Hardware named barriers (id 0 is __syncthreads)."""

    EPILOGUE = 1  # consumers: a D subtile is in SMEM (TMA store) / its buffer is free again
    SPLITK_FIXUP = 2  # consumers: split-K partial tile written / counter read
    K_GROUP_REDUCE = 3  # consumers (k_groups > 1): partials parked in SMEM / read back


# ---------------------------------------------------------------------------------------------
# PTX helpers (sm_90 has no FP4 conversion instruction: integer, prmt and f16x2 / bf16x2 ops)
# ---------------------------------------------------------------------------------------------
def _ptx(result, operands, asm: str, constraints: str, *, side_effects=True, loc=None, ip=None):
    """One PTX instruction as LLVM inline asm.  ``operands`` are (DSL type, value) pairs;
    ``result`` is the DSL type of the single output, or None for an instruction without one."""
    out = llvm.inline_asm(
        None if result is None else result.mlir_type,
        [dtype(value).ir_value(loc=loc, ip=ip) for dtype, value in operands],
        asm,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return None if result is None else result(out)


# NOTE: loads carry side effects so that they stay after the mbarrier wait guarding their stage.
@dsl_user_op
def _ld_shared_b64(addr: Int32, *, loc=None, ip=None) -> Uint64:
    return _ptx(Uint64, [(Int32, addr)], "ld.shared.b64 $0, [$1];", "=l,r", loc=loc, ip=ip)


@dsl_user_op
def _ld_shared_u8(addr: Int32, *, loc=None, ip=None) -> Uint32:
    return _ptx(Uint32, [(Int32, addr)], "ld.shared.u8 $0, [$1];", "=r,r", loc=loc, ip=ip)


@dsl_user_op
def _ld_shared_u32(addr: Int32, *, loc=None, ip=None) -> Uint32:
    return _ptx(Uint32, [(Int32, addr)], "ld.shared.u32 $0, [$1];", "=r,r", loc=loc, ip=ip)


@dsl_user_op
def _st_shared_b32(addr: Int32, value: Uint32, *, loc=None, ip=None) -> None:
    operands = [(Int32, addr), (Uint32, value)]
    _ptx(None, operands, "st.shared.b32 [$0], $1;", "r,r", loc=loc, ip=ip)


@dsl_user_op
def _st_shared_f32(addr: Int32, value: cutlass.Float32, *, loc=None, ip=None) -> None:
    operands = [(Int32, addr), (cutlass.Float32, value)]
    _ptx(None, operands, "st.shared.f32 [$0], $1;", "r,f", loc=loc, ip=ip)


@dsl_user_op
def _ld_shared_f32(addr: Int32, *, loc=None, ip=None) -> cutlass.Float32:
    return _ptx(cutlass.Float32, [(Int32, addr)], "ld.shared.f32 $0, [$1];", "=f,r", loc=loc, ip=ip)


@dsl_user_op
def _mul_bf16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    operands = [(Uint32, a), (Uint32, b)]
    asm = "mul.rn.bf16x2 $0, $1, $2;"
    return _ptx(Uint32, operands, asm, "=r,r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def _st_global_f32(addr: Int64, value: cutlass.Float32, *, loc=None, ip=None) -> None:
    operands = [(Int64, addr), (cutlass.Float32, value)]
    _ptx(None, operands, "st.global.f32 [$0], $1;", "l,f", loc=loc, ip=ip)


@dsl_user_op
def _ld_global_cg_f32(addr: Int64, *, loc=None, ip=None) -> cutlass.Float32:
    # NOTE: .cg (L2 only): the partials come from other SMs, whose writes L1 does not see.
    asm = "ld.global.cg.f32 $0, [$1];"
    return _ptx(cutlass.Float32, [(Int64, addr)], asm, "=f,l", loc=loc, ip=ip)


@dsl_user_op
def _atomic_add_global_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> Uint32:
    operands = [(Int64, addr), (Uint32, value)]
    asm = "atom.global.acq_rel.gpu.add.u32 $0, [$1], $2;"
    return _ptx(Uint32, operands, asm, "=r,l,r", loc=loc, ip=ip)


@dsl_user_op
def _ld_global_nc_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    return _ptx(Uint32, [(Int64, addr)], "ld.global.nc.u32 $0, [$1];", "=r,l", loc=loc, ip=ip)


@dsl_user_op
def _st_global_v4_b32(addr: Int64, values: list, *, loc=None, ip=None) -> None:
    operands = [(Int64, addr)] + [(Uint32, v) for v in values]
    asm = "st.global.v4.b32 [$0], {$1, $2, $3, $4};"
    _ptx(None, operands, asm, "l,r,r,r,r", loc=loc, ip=ip)


@dsl_user_op
def _st_global_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> None:
    operands = [(Int64, addr), (Uint32, value)]
    _ptx(None, operands, "st.relaxed.gpu.global.u32 [$0], $1;", "l,r", loc=loc, ip=ip)


@dsl_user_op
def _mul_f16x2(a: Uint32, b: Uint32, *, loc=None, ip=None) -> Uint32:
    operands = [(Uint32, a), (Uint32, b)]
    asm = "mul.rn.f16x2 $0, $1, $2;"
    return _ptx(Uint32, operands, asm, "=r,r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def _prmt_zero(a: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """Bytes of ``a`` (selector digits 0..3) or zero bytes (digit 4) -> one word."""
    asm = f"prmt.b32 $0, $1, 0, {selector:#06x};"
    return _ptx(Uint32, [(Uint32, a)], asm, "=r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def _e4m3_to_f16x2(sf_byte: Uint32, *, loc=None, ip=None) -> Uint32:
    """One E4M3 byte -> the same F16 value in both halves (hardware cvt, sm_89+)."""
    asm = "{ .reg .b16 t; cvt.u16.u32 t, $1; cvt.rn.f16x2.e4m3x2 $0, t; }"
    doubled = sf_byte * Uint32(0x0101)
    return _ptx(Uint32, [(Uint32, doubled)], asm, "=r,r", side_effects=False, loc=loc, ip=ip)


def _fp4x8_to_f16x2(word: Uint32, factor: Uint32) -> list:
    """NVFP4: 8 e2m1 values (one 32-bit word) -> 4 F16x2 words (nibbles (p, p + 4), p = 0..3),
    each times ``factor``.

    The F16 bits of e2m1 * 2^-14 are one byte, ``sign << 7 | (exp, mant) << 1``, above a zero
    byte (0.5 becomes the F16 subnormal 2^-15).  Two masked shifts build that byte for the four
    even nibbles and two for the odd ones; one byte permute per pair places two of them."""
    even = ((word << 4) & Uint32(0x80808080)) | ((word << 1) & Uint32(0x0E0E0E0E))
    odd = (word & Uint32(0x80808080)) | ((word >> 3) & Uint32(0x0E0E0E0E))
    # (nibble p, nibble p + 4) = bytes p // 2 and p // 2 + 2 of ``even`` / ``odd``.
    bytes_ = [
        _prmt_zero(even, 0x2404),
        _prmt_zero(odd, 0x2404),
        _prmt_zero(even, 0x3414),
        _prmt_zero(odd, 0x3414),
    ]
    return [_mul_f16x2(b, factor) for b in bytes_]


def _fp4_pair_to_bf16x2(word: Uint32, p: int, factor: Uint32) -> Uint32:
    """MXFP4: nibbles p (low half) and p + 4 (high half) of ``word`` -> BF16x2 of e2m1 * scale.

    ``word`` is already shifted right by 8 for p = 2, 3 (one shift serves two pairs)."""
    if p % 2 == 0:
        # x * 0x1040 = x << 6 | x << 12 (disjoint bits): magnitude bits to 6..8, sign to 15.
        raw = ((word & Uint32(0x000F000F)) * Uint32(0x1040)) & Uint32(0x81C081C0)
    else:
        # the nibble sits 4 bits higher: x << 2 | x << 8 lands on the same bits.
        raw = ((word & Uint32(0x00F000F0)) * Uint32(0x0104)) & Uint32(0x81C081C0)
    return _mul_bf16x2(_mul_bf16x2(raw, Uint32(BF16X2_2POW126)), factor)


def _fp4x8_to_bf16x2(word: Uint32, factor: Uint32) -> list:
    """MXFP4: 8 e2m1 values -> 4 BF16x2 words (nibbles (p, p + 4)), each times ``factor``."""
    shifted = word >> 8
    return [_fp4_pair_to_bf16x2(word if p < 2 else shifted, p, factor) for p in range(4)]


def _fp4_pair_lo_to_mma(x: Uint32, factor: Uint32, f16: bool) -> Uint32:
    """The nibbles at bits 0..3 (low half) and 16..19 (high half) of ``x`` -> F16x2 / BF16x2 of
    e2m1 * ``factor``: the same bit patterns as ``_fp4x8_to_f16x2`` / ``_fp4x8_to_bf16x2`` build
    (F16: sign to 15, magnitude to 9..11; BF16: to 15 and 6..8), for a pair chosen at run time."""
    if f16:
        bits = ((x & Uint32(0x00080008)) << 12) | ((x & Uint32(0x00070007)) << 9)
        return _mul_f16x2(bits, factor)
    return _fp4_pair_to_bf16x2(x, 0, factor)


def _scale_factor(sf_byte: Uint32, f16: bool) -> Uint32:
    """One scale byte -> the multiplier of ``_fp4x16_to_mma`` in both halves, exact: NVFP4
    (F16 MMAs) the F16 value scale * 2^7 (NaN stays NaN), MXFP4 (BF16 MMAs) the BF16 value
    scale.  (NVFP4 with BF16 MMAs converts its scales in ``convert_operands``:
    ``_e4m3_byte_to_bf16x2``.)"""
    if f16:
        return _mul_f16x2(_e4m3_to_f16x2(sf_byte), Uint32(F16X2_2POW7))
    # E8M0: bits << 7 is the BF16 power of two; byte 0 (2^-127) is the BF16 subnormal 0x0040.
    # NOTE: the NaN byte 255 becomes +inf (0x7F80), so D is inf or NaN wherever the reference
    # has NaN; mapping it to NaN took three more instructions per scale here and measured 3%
    # slower at 16 x 18432 x 7168 on the H200 (hopper/NOTES.md, eleventh session).
    bits = (sf_byte << 7) | (((sf_byte - Uint32(1)) >> 31) << 6)
    return bits | (bits << 16)


def _e4m3_byte_to_bf16x2(mags: Uint32, signs: Uint32, q: int, keep=None) -> Uint32:
    """Scale byte q of a word of four E4M3 scales, given as its magnitude bytes (& 0x7f..)
    and sign bytes (& 0x80..), -> the BF16 scale in both halves: magnitude << 4, sign << 8 (the
    BF16 value scale * 2^-120, E4M3 subnormals included) with two byte permutes and one IMAD,
    then times 2^120; the NaN magnitude 0x7f becomes a BF16 NaN.  ``keep`` (all ones or zero)
    zeroes it."""
    bits = _prmt_zero(mags, 0x4040 | q << 8 | q) * Uint32(16) + _prmt_zero(
        signs, 0x0404 | q << 12 | q << 4
    )
    # (magnitude 0x7f: bits 0x07f0 | 0x7fc0 has the BF16 exponent all ones, a mantissa != 0)
    is_nan = ((mags >> Uint32(8 * q)) & Uint32(0xFF)) == Uint32(0x7F)
    bits = bits | ((Uint32(0) - Uint32(is_nan)) & Uint32(0x7FC07FC0))
    if keep is not None:
        bits = bits & keep
    return _mul_bf16x2(bits, Uint32(BF16X2_2POW120))


def _fp4x16_to_mma(packed: Uint64, factor: Uint32, f16: bool) -> list:
    """16 e2m1 values (8 bytes) -> 8 words P_0..P_7 of the MMA type (P_i = nibbles
    (i % 4, i % 4 + 4) of 32-bit word i // 4), each times ``factor``: F16 values
    e2m1 * scale * 2^-7 or BF16 values e2m1 * scale."""
    convert = _fp4x8_to_f16x2 if f16 else _fp4x8_to_bf16x2
    return convert(Uint32(packed & Uint64(0xFFFFFFFF)), factor) + convert(
        Uint32(packed >> 32), factor
    )


def _round_up(x, multiple):
    return (x + multiple - 1) // multiple * multiple


def decode_token_rows(m, tile_cols):
    """Rows of decode's converted token copy: the M tokens rounded up to whole token tiles.

    NOTE: TMA boxes of 64 or 128 token rows that ran past the copy's last row measured slow
    on the H200 (72 x 8192 x 8192: 37.3-38.0 against 30.4-30.8 us padded).  The padding rows
    are never written and reach only columns of D^T past M, which are not stored."""
    return _round_up(m, tile_cols)


def decode_token_copy_elems(m, k, l, tile_cols):  # noqa: E741
    """Elements of decode's converted token copy (whole token tiles x K rounded up to 64 x L):
    ``default_config`` and ``check_config`` keep it below the kernel's 32-bit offsets."""
    return decode_token_rows(m, max(8, tile_cols)) * _round_up(k, K_BLOCK) * l


def _swizzle64(offset):
    # NOTE: TMA / wgmma 64B swizzle on byte offsets from a 512B-aligned base.
    return offset ^ ((offset >> 3) & 0x30)


# ---------------------------------------------------------------------------------------------
# Configuration helpers
# ---------------------------------------------------------------------------------------------
def default_sf_dtype(sf_vec_size: int) -> str:
    """The scale dtype of a format: E4M3 for NVFP4 (16), E8M0 otherwise (MXFP4, 32)."""
    return "Float8E4M3FN" if sf_vec_size == 16 else "Float8E8M0FNU"


def default_config(
    m: int,
    n: int,
    k: int,
    l: int,  # noqa: E741
    num_sms: int = 132,
    path: str | None = None,
    allow_k_groups: bool = True,
):
    """(path, mma_tiler_mn, split_k, k_groups) for a problem; ``path`` given: that path's
    tile, split and K groups; ``allow_k_groups`` False: the pick without K groups (the CLI's
    base when the tile or the split is given).

    Heuristic: with M <= 128 tokens, reading the FP4 weights is the cost, so the weights become
    the register operand (decode path, kernel tile of 128 or 64 weight rows x the next power of
    two >= M tokens, at least 8).  Work units (tiles x K splits) are dealt statically to the
    persistent CTAs, so the kernel lasts about as long as its busiest CTA.  The tile rows and
    split (1, 2, 3, 4, 6 or 8, each split keeping at least 8 k-tiles of 128, since shorter ones
    cost more in pipeline fill and fix-up than they gain) minimize the busiest CTA's work in
    weight rows x k-tiles, ceil(units / CTA slots) x (rows x ceil(k-tiles / split) + UNIT_COST):
    a unit's epilogue (split-K fix-up and store) costs about as much as streaming three k-tiles
    of 128 rows.  Ties go to the fewest units (fewer split-K partials), then to 128 rows for
    tiles of up to 32 tokens (two consumer warpgroups per CTA) and to 64 rows for wider ones,
    where 64-row tiles unsplit beat 128-row tiles split in two (no 128 x 128 fp32 partials);
    tiles of 64 tokens split only with 64 rows (split-K tiles of 64 x 128 lose the TMA-store
    epilogue).  On the H200 this picks the fastest measured configuration, or one
    within 0.4 us of it, at 21 of 25 decode shapes from 1 x 8192 x 8192 to 128 x 18432 x 7168;
    the largest misses are 64 x 7168 x 2048 (11.3 us against 10.3 unsplit, one timing) and
    128 x 7168 x 16384 (53.7 against 50.5 for 128 rows split 2; hopper/NOTES.md).

    One wave of K groups: where that pick's units are short (at most 8 k-tiles) and one CTA
    per 64 weight rows (x a K split that keeps >= 8 k-tiles per unit, two per group) fills
    between 3/4 of the SMs and all of them, one token tile of <= 32 tokens runs as 64-row tiles
    with
    DECODE_K_GROUPS groups of consumer warpgroups splitting K inside the CTA, summed through
    SMEM instead of a split-K fix-up.  H200 (hopper/NOTES.md, twelfth session): 1, 8, 16 and
    32 x 7168 x 2048 5.9-6.4 / 6.4-6.6 / 6.6 / 6.9 us against 6.8-7.3 / 7.5-7.6 / 7.6-7.7 /
    9.0.  Not taken for longer units: of 16 such shapes it measured slower at 8 (1 x 7168 x
    16384 27.0 against 24.2 us), the same at 4 and faster at 4 (32 x 8192 x 8192 17.9 against
    18.8).

    From 129 to DECODE_MAX_M tokens the decode path still wins: tiles of 128 tokens x 128
    weight rows dequantize every weight once per token tile, which costs less than the prefill
    path's conversion of the whole weight matrix up to about 2048 tokens (H200: 47 against
    128 us at 192 x 8192 x 8192, 360-408 against 377-445 at 2048 x 8192 x 8192, a tie at 3072).
    These tiles are compute-bound: 64-row tiles (one consumer warpgroup) measured slower, and
    the K loop is split only while the tiles alone leave CTA slots idle.  Larger M (or a
    padded token copy past the 32-bit offsets) uses the prefill path: both operands converted
    once, then 128 x 256 tiles in 2x1 clusters.
    """
    cols = min(128, max(8, 1 << (m - 1).bit_length()))
    if path is None:
        # (the decode path's token copy, padded to whole token tiles, must stay within the
        # kernel's 32-bit offsets; the prefill path's copy is not padded)
        token_copy = decode_token_copy_elems(m, k, l, cols)
        path = "decode" if m <= DECODE_MAX_M and token_copy < 2**31 else "prefill"
    if path == "decode":
        slots = num_sms * occupancy("decode", (cols, 128))
        k_tiles = math.ceil(k / K_TILE)
        best = None
        for rows in VALID_TILE_ROWS[::-1]:
            if m > cols and rows != 128:
                # several token tiles: compute-bound, both consumer warpgroups needed
                continue
            tiles = math.ceil(m / cols) * math.ceil(n / rows) * l
            for split in (1, 2, 3, 4, 6, 8):
                if split > 1 and (k_tiles // split < 8 or (m > cols and tiles >= slots)):
                    continue
                if not epilogue_staging_fits("decode", (cols, rows), split):
                    # (and those tiles measured slower than 64 rows)
                    continue
                units = tiles * split
                busiest = math.ceil(units / slots) * (rows * math.ceil(k_tiles / split) + UNIT_COST)
                key = (busiest, units, rows != (64 if cols >= 64 else 128))
                if best is None or key < best[0]:
                    best = (key, (cols, rows), split)
        _, tiler, split = best
        kg_split = None
        if allow_k_groups and cols <= 32 and math.ceil(k_tiles / split) <= 8:
            kg_split = _one_wave_k_group_split(n, l, k_tiles, num_sms)
        if kg_split is not None:
            return "decode", (cols, 64), kg_split, DECODE_K_GROUPS
        return "decode", tiler, split, 1
    return path, (128, 256), 1, 1


def _one_wave_k_group_split(n, l, k_tiles, num_sms):  # noqa: E741
    """``default_config``'s K groups: the first K split (1, 2, 3, 4, 6, 8) at which one CTA per
    64 weight rows and split fills between 3/4 of the SMs and all of them, with at least two
    k-tiles per group; None if there is none."""
    tiles = math.ceil(n / 64) * l
    for kg_split in (1, 2, 3, 4, 6, 8):
        if k_tiles // kg_split < 2 * DECODE_K_GROUPS:
            return None
        ctas = tiles * kg_split
        if 0.75 * num_sms <= ctas <= num_sms:
            return kg_split
    return None


def default_cluster(path: str) -> tuple[int, int]:
    """Prefill pairs two M tiles in a cluster that multicasts their common B tile (half the
    L2 -> SMEM traffic of B); the other paths run without clusters."""
    return (2, 1) if path == "prefill" else (1, 1)


def occupancy(path: str, mma_tiler_mn: tuple[int, int], k_groups: int = 1) -> int:
    """CTAs per SM: 2 for decode tiles of <= 64 tokens with up to two consumer warpgroups,
    whose consumers (weights only) fit in 104 registers, so that two CTAs hide each other's
    per-k-block latency (SMEM load -> convert -> wgmma); 1 otherwise (and for ``k_groups``
    CTAs of more consumer warpgroups).  (3 CTAs of <= 16 tokens, 72 registers each, measured
    slower on the H200: hopper/README.md.)"""
    rows, cols = kernel_tile(path, mma_tiler_mn)
    return 2 if path == "decode" and cols <= 64 and rows // 64 * k_groups <= 2 else 1


def kernel_tile(path: str, mma_tiler_mn: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of the kernel tile: rows = register operand, cols = SMEM operand."""
    tm, tn = mma_tiler_mn
    return (tn, tm) if path == "decode" else (tm, tn)


def epilogue_staging_fits(path: str, mma_tiler_mn: tuple[int, int], split_k: int) -> bool:
    """Whether the consumers have the registers to stage D subtiles in SMEM for TMA stores.

    NOTE: not for split-K decode tiles of 128 weight rows x 64 tokens, whose consumers (104
    registers at two CTAs per SM) would spill the subtile staging next to the fix-up."""
    return not (path == "decode" and kernel_tile(path, mma_tiler_mn) == (128, 64) and split_k > 1)


def blocked_sf_bytes(rows: int, k: int, l: int, sf_vec_size: int) -> int:  # noqa: E741
    """Bytes of one operand's scales in the 128x4 blocked layout: rows padded to 128, scale
    columns (K / sf_vec_size) to 4, per batch."""
    sf_cols = -(-(k // sf_vec_size) // SF_ATOM_COLS) * SF_ATOM_COLS
    return l * -(-rows // SF_ATOM_ROWS) * SF_ATOM_ROWS * sf_cols


def check_config(
    mnkl: tuple[int, int, int, int],
    sf_vec_size: int,
    sf_dtype: str,
    c_dtype: str,
    path: str,
    mma_tiler_mn: tuple[int, int],
    cluster_shape_mn: tuple[int, int],
    split_k: int,
    k_groups: int = 1,
) -> list[str]:
    """Reasons why this configuration cannot run this problem (empty when it can)."""
    return problem_reasons(mnkl, sf_vec_size, path, mma_tiler_mn) + config_reasons(
        sf_vec_size, sf_dtype, c_dtype, path, mma_tiler_mn, cluster_shape_mn, split_k, k_groups
    )


def problem_reasons(
    mnkl: tuple[int, int, int, int], sf_vec_size: int, path: str, mma_tiler_mn: tuple[int, int]
) -> list[str]:
    """Reasons why a problem (M, N, K, L) cannot run on a configuration: extents, K, and the
    kernel's 32-bit offsets (empty when it can)."""
    reasons = []
    m, n, k, l = mnkl  # noqa: E741
    for name, v in (("M", m), ("N", n), ("K", k), ("L", l)):
        if v < 1:
            reasons.append(f"{name} = {v}: every extent must be >= 1")
    if k % 32:
        reasons.append(f"K = {k} is not a multiple of 32 (TMA needs 16-byte rows of packed FP4)")
    if min(m, n, k, l) >= 1:
        # NOTE: tensor offsets are computed in 32 bits: D, packed A and packed B must each hold
        # fewer than 2^31 elements (bytes for A and B), and so must the F16 / BF16 copies the
        # decode (tokens) and prefill (A and B) paths convert, whose K is rounded up to 64, and
        # the blocked scales (bytes: TMA strides and the prologue's reads).
        k_pad = _round_up(k, K_BLOCK)
        extents = [("M*N*L", m * n * l), ("M*K/2*L", m * k // 2 * l), ("N*K/2*L", n * k // 2 * l)]
        if sf_vec_size in (16, 32):
            for name, rows in (("SFA", m), ("SFB", n)):
                extents.append((f"{name} blocked bytes", blocked_sf_bytes(rows, k, l, sf_vec_size)))
        if path == "prefill":
            extents.append(("M*K_pad*L (converted A)", m * k_pad * l))
            extents.append(("N*K_pad*L (converted B)", n * k_pad * l))
        elif path == "decode":
            # the tokens' copy has whole token tiles (``converted_shapes``)
            tile_cols = kernel_tile(path, mma_tiler_mn)[1]
            m_pad = decode_token_rows(m, max(8, tile_cols))
            extents.append(
                (
                    f"M_pad*K_pad*L (converted A, M_pad = {m_pad})",
                    decode_token_copy_elems(m, k, l, tile_cols),
                )
            )
        for name, extent in extents:
            if extent >= 2**31:
                reasons.append(
                    f"{name} = {extent} does not fit the kernel's 32-bit offsets (< 2^31); "
                    "split the problem along M, N or L"
                )
    return reasons


def config_reasons(
    sf_vec_size: int,
    sf_dtype: str,
    c_dtype: str,
    path: str,
    mma_tiler_mn: tuple[int, int],
    cluster_shape_mn: tuple[int, int],
    split_k: int,
    k_groups: int = 1,
) -> list[str]:
    """Reasons why a configuration cannot be built, whatever the problem (empty when it can)."""
    reasons = []
    if sf_vec_size not in (16, 32):
        reasons.append(f"sf_vec_size = {sf_vec_size}: only 16 (NVFP4) and 32 (MXFP4) exist")
    if sf_dtype not in SF_VEC_OF_DTYPE:
        reasons.append(f"sf_dtype = {sf_dtype}: expected one of {sorted(SF_VEC_OF_DTYPE)}")
    elif sf_vec_size in (16, 32) and SF_VEC_OF_DTYPE[sf_dtype] != sf_vec_size:
        reasons.append(
            f"sf_dtype {sf_dtype} goes with sf_vec_size {SF_VEC_OF_DTYPE[sf_dtype]}, "
            f"not {sf_vec_size} (NVFP4 = E4M3 / 16, MXFP4 = E8M0 / 32)"
        )
    if c_dtype not in C_DTYPES:
        reasons.append(f"c_dtype = {c_dtype}: expected one of {sorted(C_DTYPES)}")
    if path not in PATHS:
        reasons.append(f"path = {path}: expected one of {', '.join(PATHS)}")
    else:
        rows, cols = kernel_tile(path, mma_tiler_mn)
        if rows not in VALID_TILE_ROWS:
            what = "N (weight rows)" if path == "decode" else "M"
            reasons.append(
                f"tile {what} = {rows}: the register operand takes 64 or 128 rows "
                "(one or two consumer warpgroups of wgmma m64)"
            )
        if cols not in VALID_TILE_COLS:
            what = "M (tokens)" if path == "decode" else "N"
            reasons.append(
                f"tile {what} = {cols}: the SMEM operand takes {VALID_TILE_COLS} rows "
                "(wgmma N, and a divisor or multiple of the 128-row scale atom)"
            )
    if tuple(cluster_shape_mn) not in ((1, 1), (2, 1)) or (
        tuple(cluster_shape_mn) == (2, 1) and path != "prefill"
    ):
        reasons.append(
            f"cluster_shape_mn = {tuple(cluster_shape_mn)}: this Hopper kernel takes (1, 1), "
            "or (2, 1) on the prefill path (two M tiles share one multicast B tile)"
        )
    if split_k < 1 or split_k > 16:
        reasons.append(f"split_k = {split_k}: expected 1..16")
    elif split_k > 1 and path in PATHS and kernel_tile(path, mma_tiler_mn)[1] > 128:
        # NOTE: 128 fp32 accumulators per thread plus the fix-up's loads spill to local memory.
        reasons.append(
            f"split_k = {split_k} with a {kernel_tile(path, mma_tiler_mn)[1]}-wide SMEM-operand "
            "tile: split-K needs tiles of at most 128 x 128"
        )
    reason = k_groups_reason(path, mma_tiler_mn, k_groups) if path in PATHS else None
    if reason:
        reasons.append(reason)
    return reasons


def k_groups_reason(path: str, mma_tiler_mn: tuple[int, int], k_groups: int) -> str | None:
    """Why ``k_groups`` cannot run with this path and tile, or None."""
    if k_groups == 1:
        return None
    rows, cols = kernel_tile(path, mma_tiler_mn)
    # NOTE: 640 threads per CTA at most (setmaxnreg budgets), and the ring must hold at least
    # two stages per group next to the groups' parked accumulators.
    if path != "decode" or k_groups not in (2, 3, 4) or rows // 64 * k_groups > 4 or cols > 32:
        return (
            f"k_groups = {k_groups} on the {path} path with a {rows} x {cols} kernel tile: "
            "K groups (2..4) run on the decode path, with tiles of at most 32 tokens and "
            "at most 4 consumer warpgroups (tile rows / 64 x k_groups)"
        )
    return None


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class BlockwiseGemmFp4Sm90:
    """NVFP4 / MXFP4 GEMM on sm_90a: TMA ring of packed FP4 + scales or of converted tiles,
    exact dequantization, F16 / BF16 wgmma -> FP32.  See the module docstring for the paths,
    roles, pipelines and the math."""

    def __init__(
        self,
        sf_vec_size: int,
        path: str,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int] = (1, 1),
        split_k: int = 1,
        tma_store: bool = True,
        k_groups: int = 1,
    ):
        self.sf_vec_size = sf_vec_size
        self.path = path
        self.swap_ab = path == "decode"
        self.mma_tiler_mn = tuple(mma_tiler_mn)
        self.cluster_shape_mn = tuple(cluster_shape_mn)
        self.cluster_m = self.cluster_shape_mn[0]
        self.split_k = split_k
        self.tile_rows, self.tile_cols = kernel_tile(path, mma_tiler_mn)
        # D leaves through SMEM and TMA stores unless the caller compiles direct stores (D's row
        # pitch N * sizeof(D) not a multiple of 16 bytes, a TMA stride rule) or the consumers
        # have no registers for the staging (``epilogue_staging_fits``).
        self.tma_store = tma_store and epilogue_staging_fits(path, mma_tiler_mn, split_k)
        # Decode: ``k_groups`` groups of consumer warpgroups share each work unit's k-tiles
        # (group g takes those in the ring stages s with s % k_groups == g) and sum their
        # accumulators through SMEM before the epilogue: one CTA per SM covers a tile over all
        # of K without a split-K fix-up through global memory.
        reason = k_groups_reason(path, mma_tiler_mn, k_groups)
        if reason:
            raise ValueError(reason)
        self.k_groups = k_groups
        self.threads_per_wg = 128
        # consumer warpgroups along the tile rows (one K group), and in all
        self.row_wgs = self.tile_rows // 64
        self.num_mma_wg = self.row_wgs * k_groups
        self.group_threads = self.row_wgs * self.threads_per_wg
        self.num_mma_threads = self.num_mma_wg * self.threads_per_wg
        self.threads_per_cta = (1 + self.num_mma_wg) * self.threads_per_wg
        self.occupancy = occupancy(path, mma_tiler_mn, k_groups)
        # Decode: the tokens are converted once per launch by ``convert_operands`` into an F16 /
        # BF16 copy in the wgmma's permuted K order, which TMA then brings straight into the
        # wgmma B layout, so the consumers convert only the weights.  (Two other schemes measured
        # slower on the H200: the consumers, or idle producer warps, converting each stage's
        # packed tokens next to the weights; hopper/README.md.)
        # Prefill: both operands are converted by ``convert_operands`` (once per launch, not once
        # per output tile) and the mainloop is a plain SS wgmma GEMM over F16 / BF16 tiles.
        self.a_converted = path == "prefill"
        # 64-wide k-blocks per pipeline stage: two over packed FP4 (16-byte TMA rows), one over
        # converted F16 / BF16 tiles (128-byte rows, and room for four stages of 128 x 256).
        self.kblocks_per_stage = 1 if self.a_converted else K_TILE // K_BLOCK
        # Programmatic dependent launch of convert_operands, so that its launch overlaps the
        # tail of the kernel before it (the previous GEMM releases it once all its loads are
        # issued).  Decode only, two GEMM CTAs per SM, and (H200, hopper/NOTES.md, tenth session):
        # - tiles of 128 weight rows x up to 32 tokens, where the prologue's small CTAs fit
        #   beside two GEMM CTAs: 16 x 8192 x 8192 16.3 against 16.9 us, 32 x 28672 x 4096 26.3
        #   against 27.4;
        # - tiles of 64 rows x up to 16 tokens: two such CTAs fill the SM's registers, yet the
        #   chain measured faster (16 x 7168 x 2048 7.6 against 8.5 us); with 32 tokens it was
        #   mixed (32 x 4096 x 7168 12.5 against 11.9), with 64 slower (64 x 18432 x 7168 47.4
        #   against 45.5), and so on 128-token tiles, one GEMM CTA per SM (up to 2 us, ninth
        #   session).
        # K groups: on for up to 32 tokens where a prologue CTA fits beside the GEMM CTAs (4
        # groups: one CTA of 640 threads x 96 registers; not 3 groups of 64 rows, 512 x 128),
        # as measured (hopper/NOTES.md, twelfth session).
        # (registers per thread at launch: what ptxas picks under the minctasm cap, a multiple
        # of 8, at most 248)
        launch_regs = min(248, 65536 // (self.occupancy * self.threads_per_cta) // 8 * 8)
        prologue_fits = (
            self.occupancy * self.threads_per_cta * launch_regs
            + DECODE_CONVERT_THREADS * DECODE_CONVERT_MAX_REGS
            <= SM90_REGS_PER_SM
        )
        self.prologue_pdl = path == "decode" and (
            (self.occupancy == 2 and self.tile_cols <= (32 if self.tile_rows == 128 else 16))
            or (k_groups > 1 and self.tile_cols <= 32 and prologue_fits)
        )
        if path == "decode":
            self.convert_threads, self.convert_unroll = (
                DECODE_CONVERT_THREADS,
                DECODE_CONVERT_UNROLL,
            )
        else:
            self.convert_threads, self.convert_unroll = CONVERT_THREADS, CONVERT_UNROLL
        self.stage_k = K_BLOCK * self.kblocks_per_stage
        self.producer_warp = 0
        # setmaxnreg budgets.  NOTE: setmaxnreg.inc only takes registers that other warps of the
        # CTA gave back, so the total must stay within what the CTA got at launch: the
        # per-thread count ptxas picks under the minctasm cap (a multiple of 8, at most 248).
        # (with two CTAs per SM the producer warpgroup keeps 24: consumers of 128 weight rows
        # get 104, of 64 rows 232)
        self.producer_regs = 40 if self.occupancy == 1 else 24
        self.mma_regs = min(
            240,
            (self.threads_per_cta * launch_regs - self.threads_per_wg * self.producer_regs)
            // self.num_mma_threads
            // 8
            * 8,
        )
        self.acc_dtype = cutlass.Float32
        # NVFP4 runs F16 wgmma (cheaper exact conversion in the mainloop), MXFP4 BF16 (E8M0
        # range).  Prefill converts once per launch, so it takes BF16 for NVFP4 too: the same
        # SS GEMM measured faster on BF16 operands on the H200 (hopper/NOTES.md).
        self.f16 = sf_vec_size == 16 and path != "prefill"
        self.mma_dtype = cutlass.Float16 if self.f16 else cutlass.BFloat16

    def _setup_attributes(self):
        """Tiled MMA, SMEM layouts, stage count: everything fixed by the configuration."""
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            self.acc_dtype,
            (self.row_wgs, 1, 1),
            tiler_mn=(64, self.tile_cols),
            a_source=OperandSource.SMEM if self.a_converted else OperandSource.RMEM,
        )
        # Scale atoms per stage along K, and 128-row atom blocks per tile (rows <= 128 -> 1).
        self.sf_cols_per_stage = K_TILE // self.sf_vec_size
        self.sf_atoms_k = self.sf_cols_per_stage // SF_ATOM_COLS
        self.sfa_row_blocks = max(1, self.tile_rows // SF_ATOM_ROWS)

        packed_atom = warpgroup.make_smem_layout_atom(
            warpgroup.SmemLayoutAtomKind.K_SW64, cutlass.Uint8
        )
        if self.a_converted:
            self.a_stage_bytes = self.tile_rows * self.stage_k * 2
            self.sfa_stage_bytes = 0
        else:
            self.a_stage_bytes = self.tile_rows * K_TILE // 2
            self.sfa_stage_bytes = SF_ATOM_BYTES * self.sf_atoms_k * self.sfa_row_blocks
        self.b_stage_bytes = self.tile_cols * self.stage_k * 2
        self.tx_bytes = self.a_stage_bytes + self.b_stage_bytes + self.sfa_stage_bytes
        # TMA-store epilogue: D in kernel coordinates, (rows, EPI_COLS) subtiles; the decode
        # path's tile is a tile of D^T, whose rows (D's columns) are the contiguous dimension.
        self.epi_tile = (self.tile_rows, min(self.tile_cols, EPI_COLS))
        self.epi_subtiles = self.tile_cols // self.epi_tile[1]
        # a static buffer per subtile (subtile % stages) when the count divides the subtiles
        self.epi_stages = min(EPI_STAGES, self.epi_subtiles)
        self.d_layout = LayoutEnum.COL_MAJOR if self.swap_ab else LayoutEnum.ROW_MAJOR
        self.epi_bytes = 0
        if self.tma_store:
            self.epi_bytes = (
                self.epi_stages * self.epi_tile[0] * self.epi_tile[1] * self.c_dtype.width // 8
            )
        # k_groups > 1: the fp32 accumulators of groups 1 .. k_groups - 1, parked for group 0
        self.reduce_bytes = (self.k_groups - 1) * self.tile_rows * self.tile_cols * 4
        max_stages = MAX_STAGES
        if self.path == "decode":
            max_stages = DECODE_K_GROUP_MAX_STAGES if self.k_groups > 1 else DECODE_MAX_STAGES
        self.num_stages = self._compute_stages(
            self.tx_bytes,
            self.epi_bytes + self.reduce_bytes,
            self.occupancy,
            max_stages,
        )
        if self.k_groups > 1:
            # NOTE: mbarrier waits test a phase's parity, so a consumer must have seen fill
            # n - 1 of a stage before it waits for fill n.  A group that skips the other
            # groups' k-tiles sees that only if every fill of the stage is its own: a ring of
            # a multiple of k_groups stages, stage s owned by group s % k_groups (``_consumer``
            # keeps that across work units).
            self.num_stages = self.num_stages // self.k_groups * self.k_groups
            if self.num_stages < 2 * self.k_groups:
                raise ValueError(
                    f"k_groups = {self.k_groups}: {self.num_stages} stages of "
                    f"{self.tx_bytes} bytes fit, fewer than two per group"
                )
        converted_atom = warpgroup.make_smem_layout_atom(
            warpgroup.SmemLayoutAtomKind.K_SW128, self.mma_dtype
        )
        kblocks = self.kblocks_per_stage * self.num_stages
        if self.a_converted:
            # (rows, 64, k-blocks x stage): converted kernel A as wgmma reads it (K-major SW128)
            self.a_smem_layout_staged = cute.tile_to_shape(
                converted_atom, (self.tile_rows, K_BLOCK, kblocks), order=(0, 1, 2)
            )
        else:
            # (rows, 64 bytes, stage): SW64 so the 8-byte reads of a warp hit distinct banks.
            self.a_smem_layout_staged = cute.tile_to_shape(
                packed_atom, (self.tile_rows, K_TILE // 2, self.num_stages), order=(0, 1, 2)
            )
        # (cols, 64, k-blocks x stage): converted kernel B as wgmma reads it (K-major SW128)
        self.b_smem_layout_staged = cute.tile_to_shape(
            converted_atom, (self.tile_cols, K_BLOCK, kblocks), order=(0, 1, 2)
        )
        # Scale stage: (256 bytes, 2 * atoms_k, row blocks, stage) = whole 512-byte atoms.
        self.sfa_smem_layout_staged = cute.make_ordered_layout(
            (256, 2 * self.sf_atoms_k, self.sfa_row_blocks, self.num_stages), order=(0, 1, 2, 3)
        )
        # (rows, epi cols, epi stage): D subtiles on their way to the TMA store
        self.d_smem_layout_staged = sm90_utils.make_smem_layout_epi(
            self.c_dtype, self.d_layout, self.epi_tile, self.epi_stages
        )
        # The wgmma's accumulator partition restricted to one subtile: the values of subtile s
        # are the accumulator's values s * V .. s * V + V - 1 (V = the subtile's size per thread;
        # the wgmma C fragment walks 8-column blocks slowest).
        self.epi_mma = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            self.acc_dtype,
            (self.row_wgs, 1, 1),
            tiler_mn=(64, self.epi_tile[1]),
            a_source=OperandSource.SMEM if self.a_converted else OperandSource.RMEM,
        )

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        conv_b_ptr: cute.Pointer,
        conv_a_ptr: cute.Pointer,
        problem_mnkl: tuple[Int32, Int32, Int32, Int32],
        alpha: cutlass.Float32,
        num_sms: cutlass.Constexpr,
        stream,
    ):
        """Host side: global layouts, TMA descriptors, grid, shared storage, launch."""
        self.c_dtype = c_ptr.value_type
        self._setup_attributes()
        m, n, k, l = problem_mnkl  # noqa: E741
        # The kernel's row / col operands (decode path: weights are the rows).
        rows_a, rows_b = (n, m) if cutlass.const_expr(self.swap_ab) else (m, n)
        ptr_ka, ptr_kb = (b_ptr, a_ptr) if cutlass.const_expr(self.swap_ab) else (a_ptr, b_ptr)
        ptr_sfka, ptr_sfkb = (
            (sfb_ptr, sfa_ptr) if cutlass.const_expr(self.swap_ab) else (sfa_ptr, sfb_ptr)
        )
        kb = cute.assume(k // 2, 16)
        k_pad = cute.assume((k + K_BLOCK - 1) // K_BLOCK * K_BLOCK, K_BLOCK)
        # Packed FP4 bytes, K-major: (rows, K/2, L).
        mKApacked = cute.make_tensor(
            ptr_ka, cute.make_layout((rows_a, kb, l), stride=(kb, 1, rows_a * kb))
        )
        mKBpacked = cute.make_tensor(
            ptr_kb, cute.make_layout((rows_b, kb, l), stride=(kb, 1, rows_b * kb))
        )
        # Converted operands (rows, K rounded up to 64, L) in F16 / BF16, written by
        # convert_operands in the mainloop's permuted K order.
        mKA, mKB = mKApacked, mKBpacked
        if cutlass.const_expr(self.a_converted):
            mKA = cute.make_tensor(
                conv_a_ptr,
                cute.make_layout((rows_a, k_pad, l), stride=(k_pad, 1, rows_a * k_pad)),
            )
        conv_rows_b = self.converted_rows_b(rows_b)
        mKB = cute.make_tensor(
            conv_b_ptr,
            cute.make_layout((conv_rows_b, k_pad, l), stride=(k_pad, 1, conv_rows_b * k_pad)),
        )
        # Scales, blocked: (256, 2 * atoms along K, 128-row blocks, L); an atom is 2 x 256 bytes.
        sf_atoms_k = (k // self.sf_vec_size + SF_ATOM_COLS - 1) // SF_ATOM_COLS
        mSFKA = self._blocked_sf_tensor(ptr_sfka, rows_a, sf_atoms_k, l)
        mSFKB = self._blocked_sf_tensor(ptr_sfkb, rows_b, sf_atoms_k, l)
        # D in kernel coordinates (rows, cols, L): the decode path writes D^T, i.e. D's columns.
        pitch = n
        if cutlass.const_expr(self.tma_store):
            # NOTE: TMA strides are multiples of 16 bytes; the runner takes this variant only
            # when N * sizeof(D) is one.
            pitch = cute.assume(n, 128 // self.c_dtype.width)
        if cutlass.const_expr(self.swap_ab):
            mD = cute.make_tensor(c_ptr, cute.make_layout((n, m, l), stride=(1, pitch, m * pitch)))
        else:
            mD = cute.make_tensor(c_ptr, cute.make_layout((m, n, l), stride=(pitch, 1, m * pitch)))
        # Split-K partials (fp32) and per-tile arrival counters (int32) share one workspace.
        mWork = cute.make_tensor(workspace_ptr, cute.make_layout(1))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        a_tile = (self.tile_rows, K_BLOCK if self.a_converted else K_TILE // 2)
        tma_atom_a, tma_tensor_a = cpasync.make_tiled_tma_atom(
            g2s, mKA, cute.slice_(self.a_smem_layout_staged, (None, None, 0)), a_tile
        )
        b_tile = (self.tile_cols, K_BLOCK)
        # NOTE: with a 2x1 cluster each CTA loads half of the shared B tile and multicasts it.
        tma_atom_b, tma_tensor_b = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster_m > 1 else g2s,
            mKB,
            cute.slice_(self.b_smem_layout_staged, (None, None, 0)),
            b_tile,
            num_multicast=self.cluster_m,
        )
        sf_tile_a = (256, 2 * self.sf_atoms_k, self.sfa_row_blocks)
        if cutlass.const_expr(self.a_converted):
            # no scales in the mainloop: the A pair stands in for the unused arguments
            tma_atom_sfa, tma_tensor_sfa = tma_atom_a, tma_tensor_a
        else:
            tma_atom_sfa, tma_tensor_sfa = cpasync.make_tiled_tma_atom(
                g2s,
                mSFKA,
                cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0)),
                sf_tile_a,
            )

        if cutlass.const_expr(self.tma_store):
            tma_atom_d, tma_tensor_d = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(),
                mD,
                cute.slice_(self.d_smem_layout_staged, (None, None, 0)),
                self.epi_tile,
            )
        else:
            # direct stores: the A pair stands in for the unused arguments
            tma_atom_d, tma_tensor_d = tma_atom_a, tma_tensor_a

        tile_sched_params, grid = self._compute_grid(
            rows_a,
            rows_b,
            l,
            self.tile_rows,
            self.tile_cols,
            self.split_k,
            num_sms * self.occupancy // self.cluster_m,
            self.cluster_m,
        )

        a_smem_dtype = self.mma_dtype if self.a_converted else cutlass.Uint8
        # (16-element placeholders for the buffers this configuration does not use: sSFA on
        # prefill, sD with direct stores)
        sfa_bytes = cute.cosize(self.sfa_smem_layout_staged) if self.sfa_stage_bytes else 16
        d_elems = cute.cosize(self.d_smem_layout_staged) if self.tma_store else 16

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]
            splitk_flag: cute.struct.MemRange[cutlass.Int32, 4]
            sA: cute.struct.Align[
                cute.struct.MemRange[a_smem_dtype, cute.cosize(self.a_smem_layout_staged)],
                1024,
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.mma_dtype, cute.cosize(self.b_smem_layout_staged)],
                1024,
            ]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, sfa_bytes], 128]
            sD: cute.struct.Align[cute.struct.MemRange[self.c_dtype, d_elems], 1024]
            if cutlass.const_expr(self.reduce_bytes > 0):
                # k_groups > 1: the groups' parked accumulators (no placeholder otherwise: its
                # alignment would cost up to 128 bytes that two CTAs of 32 x 128 do not have)
                sRed: cute.struct.Align[
                    cute.struct.MemRange[cutlass.Float32, self.reduce_bytes // 4], 128
                ]

        self.shared_storage = SharedStorage

        # one CTA covers convert_threads * convert_unroll chunks of one operand
        per_cta = self.convert_threads * self.convert_unroll
        chunks_b = l * rows_b * (k_pad // K_BLOCK) * CHUNKS_PER_KBLOCK
        ctas = (chunks_b + per_cta - 1) // per_cta
        if cutlass.const_expr(self.a_converted):
            chunks_a = l * rows_a * (k_pad // K_BLOCK) * CHUNKS_PER_KBLOCK
            ctas += (chunks_a + per_cta - 1) // per_cta
        # (runtime divisors of the chunk index: precomputed multiply-shift, no IDIV sequence)
        blocks_per_row = cute.fast_divmod_create_divisor_v2(k_pad // K_BLOCK)
        rows_div_b = cute.fast_divmod_create_divisor_v2(rows_b)
        rows_div_a = cute.fast_divmod_create_divisor_v2(rows_a)
        decode = self.path == "decode"
        self.convert_operands(
            mKBpacked,
            mSFKB,
            mKB,
            mKApacked,
            mSFKA,
            mKA,
            k,
            k_pad,
            blocks_per_row,
            rows_div_b,
            rows_div_a,
        ).launch(
            grid=[ctas, 1, 1],
            block=[self.convert_threads, 1, 1],
            stream=stream,
            use_pdl=self.prologue_pdl,
            # decode: the register cap of DECODE_CONVERT_MAX_REGS, and the GEMM's SMEM
            # carveout, so that these CTAs can share an SM with two GEMM CTAs
            min_blocks_per_mp=(
                SM90_REGS_PER_SM // (self.convert_threads * DECODE_CONVERT_MAX_REGS)
                if decode
                else 0
            ),
            preferred_smem_carveout=100 if decode else None,
        )
        self.kernel(
            tma_atom_a,
            tma_tensor_a,
            tma_atom_b,
            tma_tensor_b,
            tma_atom_sfa,
            tma_tensor_sfa,
            mD,
            tma_atom_d,
            tma_tensor_d,
            mWork,
            alpha,
            k,
            self.tiled_mma,
            self.epi_mma,
            tile_sched_params,
            self.a_smem_layout_staged,
            self.b_smem_layout_staged,
            self.sfa_smem_layout_staged,
            self.d_smem_layout_staged,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(self.cluster_m, 1, 1),
            # programmatic dependent launch: overlaps this grid's start with convert_operands
            use_pdl=True,
            min_blocks_per_mp=self.occupancy,
            # all of the SM's 228 KiB as SMEM (percent), so that `occupancy` CTAs fit
            preferred_smem_carveout=100,
            stream=stream,
        )

    # -----------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        mD_mnl: cute.Tensor,
        tma_atom_d: cute.CopyAtom,
        mD_tma: cute.Tensor,
        mWork: cute.Tensor,
        alpha: cutlass.Float32,
        k: Int32,
        tiled_mma: cute.TiledMma,
        epi_mma: cute.TiledMma,
        tile_sched_params: utils.PersistentTileSchedulerParams,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        d_smem_layout_staged: cute.ComposedLayout,
    ):
        """Dispatcher: shared storage and the pipeline, then one branch per warp role."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == self.producer_warp:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            # (the scale atoms are stand-ins for A's when the operand is converted)
            if cutlass.const_expr(not self.a_converted):
                cpasync.prefetch_descriptor(tma_atom_sfa)
            if cutlass.const_expr(self.tma_store):
                cpasync.prefetch_descriptor(tma_atom_d)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.num_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # one arrive per consumer warp of the K group that reads the stage, in every CTA
            # whose producer writes into this one (lanes 0 .. cluster size - 1 signal in
            # PipelineTmaAsync)
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.group_threads // 32 * self.cluster_m
            ),
            tx_count=self.tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, self.cluster_m, 1, 1)),
        )
        k_tiles = (k + self.stage_k - 1) // self.stage_k
        if cutlass.const_expr(self.f16):
            # exact (``alpha_reason`` keeps it finite): undoes the 2^-7 of each F16 operand, so
            # acc * alpha rounds once, as in the reference
            alpha = alpha * cutlass.Float32(NVFP4_ACC_SCALE)

        if warp_idx < 4:
            cute.arch.warpgroup_reg_dealloc(self.producer_regs)
            if warp_idx == self.producer_warp:
                self._producer(
                    storage,
                    ab_pipeline,
                    k_tiles,
                    a_smem_layout_staged,
                    b_smem_layout_staged,
                    sfa_smem_layout_staged,
                    tma_atom_a,
                    mA_mkl,
                    tma_atom_b,
                    mB_nkl,
                    tma_atom_sfa,
                    mSFA_mkl,
                    tile_sched_params,
                )
        else:
            cute.arch.warpgroup_reg_alloc(self.mma_regs)
            self._consumer(
                storage,
                ab_pipeline,
                k_tiles,
                a_smem_layout_staged,
                b_smem_layout_staged,
                d_smem_layout_staged,
                mD_mnl,
                tma_atom_d,
                mD_tma,
                mWork,
                alpha,
                tiled_mma,
                epi_mma,
                tile_sched_params,
            )
        if cutlass.const_expr(self.cluster_m > 1):
            # NOTE: no CTA may exit while its peer can still multicast into its SMEM or
            # signal its barriers.
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()

    # ======================================= TMA producer ======================================
    @cute.jit
    def _producer(
        self,
        storage,
        ab_pipeline,
        k_tiles,
        a_smem_layout_staged,
        b_smem_layout_staged,
        sfa_smem_layout_staged,
        tma_atom_a,
        mA_mkl,
        tma_atom_b,
        mB_nkl,
        tma_atom_sfa,
        mSFA_mkl,
        tile_sched_params,
    ):
        # packed: (rows, 64 bytes, stage); converted: (rows, 64, k-blocks x stage)
        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        # packed: (cols, 64 bytes, stage); converted: (cols, 64, k-blocks x stage)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        # packed: (rows, 64 bytes, RestRows, RestK, L); converted: (rows, 64, RestRows, RestK64, L)
        a_tile_k = K_BLOCK if self.a_converted else K_TILE // 2
        gA = cute.local_tile(mA_mkl, (self.tile_rows, a_tile_k), (None, None, None))
        # packed: (cols, 64 bytes, RestCols, RestK, L); converted: (cols, 64, RestCols, RestK64, L)
        gB = cute.local_tile(mB_nkl, (self.tile_cols, K_BLOCK), (None, None, None))
        # (TMA, stage) / (TMA, RestRows, RestK, L)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a,
            0,
            cute.make_layout(1),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        # 2x1 cluster: this CTA loads its half of the B tile, multicast to both CTAs
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cta_layout_vmnk = cute.make_layout((1, self.cluster_m, 1, 1))
        b_mcast_mask = None
        if cutlass.const_expr(self.cluster_m > 1):
            b_mcast_mask = cpasync.create_tma_multicast_mask(
                cta_layout_vmnk, cta_layout_vmnk.get_flat_coord(cta_rank), mcast_mode=1
            )
        # (TMA, stage) / (TMA, RestCols, RestK, L)
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b,
            cta_rank % self.cluster_m,
            cute.make_layout(self.cluster_m),
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )
        tAsSFA, tAgSFA = None, None
        if cutlass.const_expr(not self.a_converted):
            # (256, 2 * atoms_k, row_blocks, stage)
            sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
            # (256, 2 * atoms_k, row_blocks, RestK, RestRowBlocks, L)
            gSFA = cute.local_tile(
                mSFA_mkl, (256, 2 * self.sf_atoms_k, self.sfa_row_blocks), (0, None, None, None)
            )
            # (TMA, stage) / (TMA, RestK, RestRowBlocks, L)
            tAsSFA, tAgSFA = cpasync.tma_partition(
                tma_atom_sfa,
                0,
                cute.make_layout(1),
                cute.group_modes(sSFA, 0, 3),
                cute.group_modes(gSFA, 0, 3),
            )

        # the TMA atoms and partitions of each operand, for ``_copy_a`` / ``_copy_b``
        a_copies = (tma_atom_a, tAgA, tAsA, tma_atom_sfa, tAgSFA, tAsSFA)
        b_copies = (tma_atom_b, tBgB, tBsB, b_mcast_mask)
        tile_sched = utils.StaticPersistentTileScheduler.create(
            tile_sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work_tile = tile_sched.initial_work_tile_info()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        # k-tiles of the first work tile already requested (decode: its first stages)
        issued = Int32(0)
        if cutlass.const_expr(not self.a_converted):
            issued, state = self._first_stages_across_pdl_wait(
                ab_pipeline, state, a_copies, b_copies, work_tile, k_tiles
            )
        else:
            # NOTE: PDL launch: the converted operands are complete only after this wait.
            cute.arch.griddepcontrol_wait()
        while work_tile.is_valid_tile:
            row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb = self._producer_unit(
                work_tile, k_tiles
            )
            kt_first = kt_begin + issued
            issued = Int32(0)
            for kt in cutlass.range(kt_first, kt_end, unroll=1):
                ab_pipeline.producer_acquire(state)
                bar = ab_pipeline.producer_get_barrier(state)
                self._copy_a(a_copies, kt, state.index, bar, row_tile, sfa_rb, batch)
                self._copy_b(b_copies, kt, state.index, bar, col_tile, batch)
                ab_pipeline.producer_commit(state)
                state.advance()
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()
        # Every load of this CTA is issued: a PDL-launched successor (the next launch's
        # prologue grid) may be scheduled once all CTAs are here; it must wait for this grid to
        # complete before it touches memory (``convert_operands`` does), and its launch
        # overlaps this grid's last stages.
        cute.arch.griddepcontrol_launch_dependents()
        ab_pipeline.producer_tail(state)

    @cute.jit
    def _first_stages_across_pdl_wait(
        self, ab_pipeline, state, a_copies, b_copies, work_tile, k_tiles
    ):
        """Decode with a token prologue: request the weights of the first stage, wait for the
        prologue grid (``griddepcontrol.wait``), then its tokens.  Returns the k-tiles issued
        (0 for a CTA without work or a first unit without k-tiles) and the advanced pipeline
        state (returned because the loops below rebind the name ``state`` to their results,
        so the caller's object does not see the advance).

        NOTE: PDL launch: the converted tokens are complete only after the wait; the weights and
        their scales do not depend on it.  Requesting the first stage's weights early overlaps
        their DRAM latency with the prologue (hopper/DESIGN.md).
        """
        row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb = self._producer_unit(
            work_tile, k_tiles
        )
        issued = cutlass.min(Int32(1), kt_end - kt_begin)
        if not work_tile.is_valid_tile:
            issued = Int32(0)
        token_state = state.clone()
        for i in cutlass.range(issued, unroll=1):
            ab_pipeline.producer_acquire(state)
            bar = ab_pipeline.producer_get_barrier(state)
            self._copy_a(a_copies, kt_begin + i, state.index, bar, row_tile, sfa_rb, batch)
            state.advance()
        cute.arch.griddepcontrol_wait()
        for i in cutlass.range(issued, unroll=1):
            bar = ab_pipeline.producer_get_barrier(token_state)
            self._copy_b(b_copies, kt_begin + i, token_state.index, bar, col_tile, batch)
            ab_pipeline.producer_commit(token_state)
            token_state.advance()
        return issued, state

    @cute.jit
    def _producer_unit(self, work_tile, k_tiles):
        """A work unit's coordinates for the TMA copies: row tile, col tile, batch, its k-tiles
        [begin, end) and kernel A's scale row block."""
        row_tile, col_tile, lk = work_tile.tile_idx
        batch = lk // self.split_k
        kt_begin, kt_end = self._split_range(lk % self.split_k, k_tiles)
        # Scale row block of this tile (tiles narrower than an atom share one).
        sfa_rb = row_tile * self.tile_rows // (SF_ATOM_ROWS * self.sfa_row_blocks)
        return row_tile, col_tile, batch, kt_begin, kt_end, sfa_rb

    @cute.jit
    def _copy_a(self, a_copies, kt, stage, bar, row_tile, sfa_rb, batch):
        """Kernel A (and, packed, its scales) of k-tile ``kt`` into ``stage``."""
        tma_atom_a, tAgA, tAsA, tma_atom_sfa, tAgSFA, tAsSFA = a_copies
        cute.copy(
            tma_atom_a, tAgA[(None, row_tile, kt, batch)], tAsA[(None, stage)], tma_bar_ptr=bar
        )
        if cutlass.const_expr(not self.a_converted):
            cute.copy(
                tma_atom_sfa,
                tAgSFA[(None, kt, sfa_rb, batch)],
                tAsSFA[(None, stage)],
                tma_bar_ptr=bar,
            )

    @cute.jit
    def _copy_b(self, b_copies, kt, stage, bar, col_tile, batch):
        """Converted kernel B of k-tile ``kt`` into ``stage``, one TMA copy per k-block
        (multicast on a 2x1 cluster)."""
        tma_atom_b, tBgB, tBsB, b_mcast_mask = b_copies
        kbs = self.kblocks_per_stage
        for j in cutlass.range_constexpr(kbs):
            cute.copy(
                tma_atom_b,
                tBgB[(None, col_tile, kbs * kt + j, batch)],
                tBsB[(None, kbs * stage + j)],
                tma_bar_ptr=bar,
                mcast_mask=b_mcast_mask,
            )

    @cute.jit
    def _split_range(self, split, k_tiles):
        """K-tiles [begin, end) of one split: the first k_tiles % split_k splits get one more."""
        if cutlass.const_expr(self.split_k == 1):
            return Int32(0), k_tiles
        base = k_tiles // self.split_k
        extra = k_tiles % self.split_k
        begin = split * base + cutlass.min(split, extra)
        end = begin + base + (split < extra)
        return begin, end

    # ======================================= consumers =========================================
    @cute.jit
    def _consumer(
        self,
        storage,
        ab_pipeline,
        k_tiles,
        a_smem_layout_staged,
        b_smem_layout_staged,
        d_smem_layout_staged,
        mD_mnl,
        tma_atom_d,
        mD_tma,
        mWork,
        alpha,
        tiled_mma,
        epi_mma,
        tile_sched_params,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        tidx = tidx - self.threads_per_wg  # 0 .. num_mma_threads - 1
        # K group of this thread (``k_groups``), then tidx = its index inside the group
        # (0 .. group_threads - 1), the only index the rest of this function uses
        kgroup = 0
        if cutlass.const_expr(self.k_groups > 1):
            kgroup = cute.arch.make_warp_uniform(tidx // self.group_threads)
            tidx = tidx % self.group_threads
        wg = tidx // self.threads_per_wg
        warp_in_wg = (tidx // 32) % 4
        lane = tidx % 32
        q = lane % 4  # 16-element group of the 64-wide k-block this thread dequantizes

        thr_mma = tiled_mma.get_slice(tidx)
        # (cols, 64, k-blocks x stage)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        # (MMA, MMA_N, MMA_K, k-blocks x stage): descriptors of the converted kernel B
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        if cutlass.const_expr(self.a_converted):
            # (rows, 64, k-blocks x stage)
            sA = storage.sA.get_tensor(
                a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner
            )
            # (MMA, MMA_M, MMA_K, k-blocks x stage): descriptors of the converted kernel A
            tCsA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        else:
            # (MMA, MMA_M, MMA_K): the RS A fragments, double-buffered across k-blocks
            a_frag_shape = thr_mma.partition_shape_A((self.tile_rows, K_BLOCK))
            tCrA0 = tiled_mma.make_fragment_A(a_frag_shape)
            tCrA1 = tiled_mma.make_fragment_A(a_frag_shape)
        # (MMA, MMA_M, MMA_N)
        tCrAcc = cute.make_rmem_tensor(
            thr_mma.partition_shape_C((self.tile_rows, self.tile_cols)), self.acc_dtype
        )
        base_a = storage.sA.data_ptr().toint()
        base_sfa = storage.sSFA.data_ptr().toint()
        sD, d_pipeline = None, None
        if cutlass.const_expr(self.tma_store):
            # (rows, epi cols, epi stage)
            sD = storage.sD.get_tensor(
                d_smem_layout_staged.outer, swizzle=d_smem_layout_staged.inner
            )
            d_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=self.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.group_threads),
            )
        # This thread's two kernel-A rows in the tile: wgmma A fragment rows g and g + 8.
        a_row0 = wg * 64 + warp_in_wg * 16 + lane // 4

        tile_sched = utils.StaticPersistentTileScheduler.create(
            tile_sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work_tile = tile_sched.initial_work_tile_info()
        # the stage of this thread's next k-tile
        read_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.num_stages
        )
        # k_groups == 1: stages are released one step late, once the wgmma reading them
        # completed
        free_state = pipeline.make_pipeline_state(
            pipeline.PipelineUserType.Consumer, self.num_stages
        )
        # k_groups > 1: the CTA's first k-tile of the current unit (every group's count)
        unit_state = None
        if cutlass.const_expr(self.k_groups > 1):
            unit_state = pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Consumer, self.num_stages
            )
        while work_tile.is_valid_tile:
            row_tile, col_tile, lk = work_tile.tile_idx
            kt_begin, kt_end = self._split_range(lk % self.split_k, k_tiles)
            # This thread's k-tiles: kt_first, kt_first + k_groups, ... < kt_end.
            kt_first = kt_begin
            if cutlass.const_expr(self.k_groups > 1):
                # the unit's k-tiles whose stages this group owns (stage % k_groups == group)
                owned = unit_state.count % self.k_groups
                offset = (kgroup - owned + self.k_groups) % self.k_groups
                kt_first = kt_begin + offset
                read_state = unit_state.clone()
                read_state.advance(offset)
            # Row offset of this tile inside its 128-row scale atom.
            sfa_row_off = row_tile * self.tile_rows % SF_ATOM_ROWS
            tCrAcc.fill(0.0)
            # NOTE: wgmma's scale-d operand: without ACCUMULATE every k16 step overwrites D.
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kt in cutlass.range(kt_first, kt_end, self.k_groups, unroll=1):
                ab_pipeline.consumer_wait(read_state)
                kbs = self.kblocks_per_stage
                # decode: both k-blocks' kernel-A bytes at once, one SMEM latency per stage
                a_bytes = [
                    self._load_a(base_a, base_sfa, read_state.index, j, a_row0, sfa_row_off, q)
                    for j in range(kbs if self.path == "decode" else 0)
                ]
                for j in cutlass.range_constexpr(kbs):
                    if cutlass.const_expr(self.a_converted):
                        tCrA = tCsA[(None, None, None, kbs * read_state.index + j)]
                    else:
                        tCrA = tCrA0 if j == 0 else tCrA1
                        # ---- kernel A: 2 rows x 16 K values -> 16 F16x2 / BF16x2 registers
                        self._dequant_a(tCrA, a_bytes[j])
                    b_block = kbs * read_state.index + j
                    warpgroup.fence()
                    for s in cutlass.range_constexpr(K_BLOCK // 16):
                        cute.gemm(
                            tiled_mma,
                            tCrAcc,
                            tCrA[(None, None, s)],
                            tCrB[(None, None, s, b_block)],
                            tCrAcc,
                        )
                    warpgroup.commit_group()
                    if cutlass.const_expr(self.k_groups > 1 and j == kbs - 1):
                        # K groups free a stage once its last wgmma has completed, not one
                        # k-tile later (each group would hold two stages of the ring)
                        warpgroup.wait_group(0)
                        ab_pipeline.consumer_release(read_state)
                    else:
                        # NOTE: k-block t - 1 done => its A registers are free again.
                        warpgroup.wait_group(1)
                    if cutlass.const_expr(j == 0 and self.k_groups == 1):
                        # the last wgmma of the previous stage has completed: free it
                        if kt > kt_first:
                            ab_pipeline.consumer_release(free_state)
                            free_state.advance()
                read_state.advance(self.k_groups)
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.k_groups == 1):
                if kt_end > kt_first:
                    ab_pipeline.consumer_release(free_state)
                    free_state.advance()
            if cutlass.const_expr(self.k_groups > 1):
                unit_state.advance(kt_end - kt_begin)
                self._reduce_k_groups(tCrAcc, kgroup, tidx, storage.sRed.data_ptr().toint())
            # (k_groups > 1: group 0 holds the sum)
            if kgroup == 0:
                self._epilogue(
                    tCrAcc,
                    mD_mnl,
                    mWork,
                    alpha,
                    row_tile,
                    col_tile,
                    lk,
                    thr_mma,
                    tidx,
                    storage.splitk_flag.data_ptr().toint(),
                    tma_atom_d,
                    mD_tma,
                    sD,
                    epi_mma,
                    d_pipeline,
                )
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()
        if cutlass.const_expr(self.tma_store):
            # warp 0 of group 0, which issued them (both terms >= 0; kgroup is 0 without groups)
            if tidx // 32 + kgroup == 0:
                # NOTE: the CTA must not exit before its TMA stores have read their SMEM.
                d_pipeline.producer_tail()

    @cute.jit
    def _load_a(self, base_a, base_sfa, stage, j, a_row0, sfa_row_off, q):
        """Packed FP4 (8 bytes) and scale byte of rows a_row0 and a_row0 + 8, K values
        16q..16q+15 of k-block j: [(packed, scale byte)] x 2."""
        out = []
        for r in cutlass.range_constexpr(2):
            row = a_row0 + 8 * r
            packed = self._load_packed(base_a, stage, self.a_stage_bytes, row, j, q)
            sf = self._load_scale_byte(
                base_sfa, stage, self.sfa_stage_bytes, row + sfa_row_off, j, q
            )
            out.append((packed, sf))
        return out

    @cute.jit
    def _dequant_a(self, tCrA, a_bytes):
        """``_load_a``'s bytes -> the A fragment of one k-block."""
        # Uint32 view of the F16 / BF16 fragment: word r + 2c + 4s = row r, K half c, k16 step s.
        rA = cute.recast_tensor(tCrA, Uint32)
        for r in cutlass.range_constexpr(2):
            packed, sf = a_bytes[r]
            pairs = _fp4x16_to_mma(packed, _scale_factor(sf, self.f16), self.f16)
            for i in cutlass.range_constexpr(8):
                rA[r + 2 * (i % 2) + 4 * (i // 2)] = pairs[i]

    @cute.jit
    def _load_packed(self, base, stage, stage_bytes, row, j, q):
        """The 8 packed bytes of tile row ``row``, K values 16q..16q+15 of k-block j (SW64)."""
        byte = row * (K_TILE // 2) + j * (K_BLOCK // 2) + q * 8
        return _ld_shared_b64(base + stage * stage_bytes + _swizzle64(byte))

    @cute.jit
    def _load_scale_byte(self, base_sf, stage, stage_bytes, row, j, q):
        """Scale byte of (tile row ``row`` counted from its atom's first row, group q of
        k-block j).  Atom byte of (r, c): (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4."""
        if cutlass.const_expr(self.sf_vec_size == 16):
            col = j * 4 + q
        else:
            col = j * 2 + q // 2
        atom = (row // SF_ATOM_ROWS) * self.sf_atoms_k + col // SF_ATOM_COLS
        r = row % SF_ATOM_ROWS
        byte = atom * SF_ATOM_BYTES + (r % 32) * 16 + (r // 32) * 4 + col % SF_ATOM_COLS
        return _ld_shared_u8(base_sf + stage * stage_bytes + byte)

    @cute.jit
    def _reduce_k_groups(self, tCrAcc, kgroup, tidx, base_red):
        """k_groups > 1: sum every K group's accumulators into group 0's, in group order.
        Groups 1 .. k_groups - 1 park theirs in SMEM, value-major (value i of thread t of group
        g at word ((g - 1) * values + i) * group_threads + t: a warp writes one 128-byte line),
        and group 0 adds them."""
        nacc = cute.size(tCrAcc)
        words = self.group_threads * 4
        if kgroup > 0:
            mine = base_red + ((kgroup - 1) * nacc * self.group_threads + tidx) * 4
            for i in cutlass.range_constexpr(nacc):
                _st_shared_f32(mine + i * words, tCrAcc[i])
        self._k_group_barrier()
        if kgroup == 0:
            for g in cutlass.range_constexpr(1, self.k_groups):
                theirs = base_red + ((g - 1) * nacc * self.group_threads + tidx) * 4
                for i in cutlass.range_constexpr(nacc):
                    tCrAcc[i] = tCrAcc[i] + _ld_shared_f32(theirs + i * words)
        # NOTE: group 0 has read every parked value before any group parks its next unit's.
        self._k_group_barrier()

    def _k_group_barrier(self):
        cute.arch.barrier(
            barrier_id=int(NamedBarrierId.K_GROUP_REDUCE), number_of_threads=self.num_mma_threads
        )

    # ======================================= epilogue ==========================================
    @cute.jit
    def _epilogue(
        self,
        tCrAcc,
        mD_mnl,
        mWork,
        alpha,
        row_tile,
        col_tile,
        lk,
        thr_mma,
        tidx,
        flag_addr,
        tma_atom_d,
        mD_tma,
        sD,
        epi_mma,
        d_pipeline,
    ):
        """acc * alpha -> D, through SMEM and TMA stores of (rows, 32)-column subtiles, or
        (``tma_store`` False) with predicated direct stores; TMA clips ragged rows / cols.

        With split-K, every split first parks its fp32 fragment in the workspace; the split
        that arrives last at the tile's counter sums all of them in split order (so the result
        does not depend on the arrival order), resets the counter and stores D."""
        batch = lk // self.split_k
        rows, cols = mD_mnl.shape[0], mD_mnl.shape[1]
        is_last = True
        if cutlass.const_expr(self.split_k > 1):
            nacc = cute.size(tCrAcc)
            row_tiles, col_tiles, num_tiles = output_tiles(
                rows, cols, mD_mnl.shape[2], self.tile_rows, self.tile_cols, self.cluster_m
            )
            tile_id = (batch * col_tiles + col_tile) * row_tiles + row_tile
            split = lk % self.split_k
            work = mWork.iterator.toint()
            frag_stride = Int64(self.group_threads * nacc * 4)
            # A partial is stored value-major (value i of thread t at 4 * (i * threads + t)), so
            # that every warp access is one contiguous 128-byte line.
            value_stride = self.group_threads * 4
            my_frag = work + (Int64(tile_id * self.split_k + split) * frag_stride + Int64(tidx * 4))
            counter = (
                work + Int64(num_tiles) * Int64(self.split_k) * frag_stride + Int64(tile_id * 4)
            )
            for i in cutlass.range_constexpr(nacc):
                _st_global_f32(my_frag + i * value_stride, tCrAcc[i])
            self._splitk_barrier()
            if tidx == 0:
                # NOTE: the barrier orders the epilogue group's partial stores before this thread's
                # acq_rel atomic, whose gpu-scope release is cumulative: it publishes all of
                # them, and the atomic of the last split acquires all earlier splits' partials
                # for its CTA through the barrier below.
                old = _atomic_add_global_u32(counter, Uint32(1))
                last = old == Uint32(self.split_k - 1)
                if last:
                    _st_global_u32(counter, Uint32(0))
                _st_shared_b32(flag_addr, Uint32(last))
            self._splitk_barrier()
            is_last = _ld_shared_u32(flag_addr) != Uint32(0)
            if is_last:
                # Every split's partial (this split's too: the same bits, read back) is loaded
                # before any is added, so the fix-up waits for one memory round trip per chunk
                # of values (the chunk as large as the registers next to the accumulators
                # allow) instead of one per split; the sum runs in split order from 0.
                tile_frags = work + (Int64(tile_id * self.split_k) * frag_stride + Int64(tidx * 4))
                loads = min(FIXUP_LOADS, self.mma_regs - nacc - FIXUP_RESERVED)
                chunk = max(1, min(nacc, loads // self.split_k))
                for c0 in cutlass.range_constexpr(0, nacc, chunk):
                    width = min(chunk, nacc - c0)
                    parts = [
                        [
                            _ld_global_cg_f32(
                                tile_frags + sp * frag_stride + (c0 + v) * value_stride
                            )
                            for v in range(width)
                        ]
                        for sp in range(self.split_k)
                    ]
                    for v in cutlass.range_constexpr(width):
                        total = cutlass.Float32(0.0)
                        for sp in cutlass.range_constexpr(self.split_k):
                            total = total + parts[sp][v]
                        tCrAcc[c0 + v] = total
        if is_last:
            if cutlass.const_expr(self.tma_store):
                self._store_tile_tma(
                    tCrAcc,
                    alpha,
                    mD_tma,
                    tma_atom_d,
                    sD,
                    epi_mma,
                    d_pipeline,
                    row_tile,
                    col_tile,
                    batch,
                    tidx,
                )
            else:
                tile = (self.tile_rows, self.tile_cols)
                # (rows, cols)
                gD = cute.local_tile(mD_mnl, tile, (row_tile, col_tile, batch))
                cD = cute.local_tile(
                    cute.make_identity_tensor(mD_mnl.shape), tile, (row_tile, col_tile, batch)
                )
                # (MMA, MMA_M, MMA_N)
                tCgD = thr_mma.partition_C(gD)
                tCcD = thr_mma.partition_C(cD)
                tCrD = cute.make_rmem_tensor_like(tCrAcc, mD_mnl.element_type)
                tCrD.store((tCrAcc.load() * alpha).to(mD_mnl.element_type))
                for i in cutlass.range_constexpr(cute.size(tCrAcc)):
                    crd = tCcD[i]
                    if crd[0] < rows and crd[1] < cols:
                        tCgD[i] = tCrD[i]

    @cute.jit
    def _store_tile_tma(
        self,
        tCrAcc,
        alpha,
        mD_tma,
        tma_atom_d,
        sD,
        epi_mma,
        d_pipeline,
        row_tile,
        col_tile,
        batch,
        tidx,
    ):
        """One subtile at a time: this thread's values * alpha -> SMEM buffer, then the first
        consumer warp issues its TMA store; the stores drain while the next tile's mainloop
        runs."""
        # (rows, epi cols, 1, subtiles)
        gD_epi = cute.flat_divide(
            cute.local_tile(mD_tma, (self.tile_rows, self.tile_cols), (row_tile, col_tile, batch)),
            self.epi_tile,
        )
        # (TMA, epi stage) / (TMA, 1, subtiles)
        bSG_sD, bSG_gD = cpasync.tma_partition(
            tma_atom_d,
            0,
            cute.make_layout(1),
            cute.group_modes(sD, 0, 2),
            cute.group_modes(gD_epi, 0, 2),
        )
        # (MMA, MMA_M, MMA_N, epi stage): this thread's accumulator positions in a subtile
        tCsD = epi_mma.get_slice(tidx).partition_C(sD)
        # (MMA, MMA_M, MMA_N) of one subtile
        tRS_rAcc = cute.make_rmem_tensor(tCsD[(None, None, None, 0)].shape, self.acc_dtype)
        tRS_rD = cute.make_rmem_tensor(tRS_rAcc.shape, self.c_dtype)
        per_subtile = cute.size(tRS_rAcc)
        for sub in cutlass.range_constexpr(self.epi_subtiles):
            buf = sub % self.epi_stages
            for i in cutlass.range_constexpr(per_subtile):
                tRS_rAcc[i] = tCrAcc[sub * per_subtile + i]
            tRS_rD.store((tRS_rAcc.load() * alpha).to(self.c_dtype))
            cute.autovec_copy(tRS_rD, tCsD[(None, None, None, buf)])
            # NOTE: generic-proxy SMEM writes must be fenced before the async-proxy TMA store
            # reads them, and every consumer thread must have written its part.
            cute.arch.fence_proxy("async.shared", space="cta")
            self._epilogue_barrier()
            if tidx // 32 == 0:
                cute.copy(tma_atom_d, bSG_sD[(None, buf)], bSG_gD[(None, 0, sub)])
                d_pipeline.producer_commit()
                # the store of the subtile that used the next buffer has read it
                d_pipeline.producer_acquire()
            self._epilogue_barrier()

    def _epilogue_barrier(self):
        cute.arch.barrier(
            barrier_id=int(NamedBarrierId.EPILOGUE), number_of_threads=self.group_threads
        )

    def _splitk_barrier(self):
        cute.arch.barrier(
            barrier_id=int(NamedBarrierId.SPLITK_FIXUP), number_of_threads=self.group_threads
        )

    # ======================================= prologue grid =====================================
    @cute.kernel
    def convert_operands(
        self,
        mB: cute.Tensor,
        mSFB: cute.Tensor,
        mConvB: cute.Tensor,
        mA: cute.Tensor,
        mSFA: cute.Tensor,
        mConvA: cute.Tensor,
        k: Int32,
        k_pad: Int32,
        blocks_per_row: cute.FastDivmodDivisorV2,
        rows_div_b: cute.FastDivmodDivisorV2,
        rows_div_a: cute.FastDivmodDivisorV2,
    ):
        """Prologue, one grid: packed FP4 (rows, K/2, L) + blocked scales -> F16 / BF16
        (rows, K_pad, L) in the mainloop's permuted K order, for kernel B (decode, prefill) and
        kernel A (prefill).  Pair P_i of 16-group q of a 64-block goes to elements
        16 (i // 2) + 8 (i % 2) + 2q, +1 (where the A fragment expects it), so the block's
        16-byte chunk i is (P_i of q = 0, 1, 2, 3).  One thread per chunk (eight per 64-block),
        ``convert_unroll`` chunks per thread with all their loads issued first (the bytes in
        flight hide DRAM latency); each CTA step stores convert_threads x 16 bytes contiguous
        (4 KiB on prefill, 2 KiB on decode).  Kernel B's CTAs come
        first; a K = 32 x odd tail block gets zeros for its missing logical K 32..63."""
        # NOTE: with ``prologue_pdl`` this grid may start before the kernel ahead of it ends
        # (the previous GEMM releases it early): nothing here may read the operands or write the
        # converted copies (which that GEMM may still read) before the wait.  The release
        # must stay after the wait: the GEMM relies on it for everything it does before or
        # without its own wait (the first stage's weight loads, and the epilogue of split-K
        # units without k-tiles, which writes the workspace and D).
        cute.arch.griddepcontrol_wait()
        # the GEMM (launched with PDL) may start its prologue now; its producer waits for this
        # grid's writes before the first TMA load of them
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        per_cta = self.convert_threads * self.convert_unroll
        chunks_per_row = k_pad // K_BLOCK * CHUNKS_PER_KBLOCK
        chunks_b = cute.size(mB.shape[0]) * cute.size(mB.shape[2]) * chunks_per_row
        ctas_b = (chunks_b + per_cta - 1) // per_cta
        if bidx < ctas_b:
            first = bidx * per_cta + tidx
            self._convert_chunks(
                mB, mSFB, mConvB, first, chunks_b, k, k_pad, blocks_per_row, rows_div_b
            )
        elif cutlass.const_expr(self.a_converted):
            chunks_a = cute.size(mA.shape[0]) * cute.size(mA.shape[2]) * chunks_per_row
            first = (bidx - ctas_b) * per_cta + tidx
            self._convert_chunks(
                mA, mSFA, mConvA, first, chunks_a, k, k_pad, blocks_per_row, rows_div_a
            )

    @cute.jit
    def _convert_chunks(
        self, mPacked, mSF, mConv, first, chunks, k, k_pad, blocks_per_row, rows_div
    ):
        """16-byte output chunks first + j * convert_threads, j < convert_unroll, of one packed
        operand and its blocked scales (chunks row-major over (L, rows, K_pad / 64, 8)); chunk
        c is pair p = c % 4 of 32-bit word c % 8 // 4 of its block's four 16-groups."""
        # NOTE: unsigned index arithmetic: % and // by powers of two are single AND / shift
        # instructions (signed ones need sign fix-ups), and every index here is >= 0.
        rows = Uint32(mPacked.shape[0])
        atoms_k = Uint32((k // self.sf_vec_size + SF_ATOM_COLS - 1) // SF_ATOM_COLS)
        row_blocks = (rows + SF_ATOM_ROWS - 1) // SF_ATOM_ROWS
        loaded = []
        for j in cutlass.range_constexpr(self.convert_unroll):
            # loads at a clamped (valid) chunk; only valid chunks are stored below
            c = Uint32(cutlass.min(first + j * self.convert_threads, chunks - 1))
            chunk = c % CHUNKS_PER_KBLOCK
            row_id, kb = divmod(Int32(c // CHUNKS_PER_KBLOCK), blocks_per_row)
            batch, row = divmod(row_id, rows_div)
            kb, batch, row = Uint32(kb), Uint32(batch), Uint32(row)
            row_id = Int64(row_id)
            # all ones for a full 64-block, zero for the 32-wide tail of K = 32 x odd
            keep = Uint32(0) - Uint32(kb * K_BLOCK + K_BLOCK <= Uint32(k))
            src = mPacked.iterator.toint() + row_id * Int64(k // 2) + Int64(kb * (K_BLOCK // 2))
            src = src + Int64(4 * (chunk // 4))
            # The block's scale columns lie in one atom's 4 bytes (NVFP4: columns 4kb .. 4kb+3,
            # MXFP4: 2kb, 2kb+1): one aligned 32-bit load.
            col0 = kb * (K_BLOCK // self.sf_vec_size)
            r = row % SF_ATOM_ROWS
            sf_word = (
                ((batch * row_blocks + row // SF_ATOM_ROWS) * atoms_k + col0 // SF_ATOM_COLS)
                * SF_ATOM_BYTES
                + (r % 32) * 16
                + (r // 32) * 4
            )
            sf4 = _ld_global_nc_u32(mSF.iterator.toint() + Int64(sf_word))
            words = []
            for q in cutlass.range_constexpr(4):
                if cutlass.const_expr(q < 2):
                    words.append(_ld_global_nc_u32(src + Int64(8 * q)))
                else:
                    # the tail's missing groups 2, 3 re-read groups 0, 1; zeroed below
                    off = Int64(8 * (q - 2)) + Int64(16) * Int64(keep & Uint32(1))
                    words.append(_ld_global_nc_u32(src + off))
            if cutlass.const_expr(self.swap_ab):
                # decode: the tokens' copy has whole tiles of rows (mConv.shape[0] >= rows)
                row_id = Int64(batch) * Int64(mConv.shape[0]) + Int64(row)
            dst = mConv.iterator.toint() + (row_id * Int64(k_pad) + Int64(kb * K_BLOCK)) * 2
            loaded.append((words, sf4, keep, col0, chunk, dst + Int64(16 * chunk)))
        # NVFP4 to BF16: the four E4M3 scales of a block, magnitude and sign bytes apart
        e4m3_bf16 = self.sf_vec_size == 16 and not self.f16
        for j in cutlass.range_constexpr(self.convert_unroll):
            words, sf4, keep, col0, chunk, dst = loaded[j]
            shift = Uint32(4 * (chunk % 4))
            if cutlass.const_expr(e4m3_bf16):
                mags, signs = sf4 & Uint32(0x7F7F7F7F), sf4 & Uint32(0x80808080)
            out = []
            for q in cutlass.range_constexpr(4):
                word = words[q]
                if cutlass.const_expr(e4m3_bf16):
                    factor = _e4m3_byte_to_bf16x2(mags, signs, q, keep if q >= 2 else None)
                else:
                    if cutlass.const_expr(self.sf_vec_size == 16):
                        sf = (sf4 >> Uint32(8 * q)) & Uint32(0xFF)
                    else:
                        sf = (sf4 >> Uint32(8 * (col0 % 4 + q // 2))) & Uint32(0xFF)
                    if cutlass.const_expr(q >= 2):
                        sf = sf & keep
                    factor = _scale_factor(sf, self.f16)
                if cutlass.const_expr(q >= 2):
                    word = word & keep
                out.append(_fp4_pair_lo_to_mma(word >> shift, factor, self.f16))
            if first + j * self.convert_threads < chunks:
                _st_global_v4_b32(dst, out)

    # ======================================= static helpers ====================================
    @staticmethod
    def _compute_stages(stage_bytes, fixed_bytes, occupancy, max_stages) -> int:
        """Ring stages of ``stage_bytes`` that fit next to ``fixed_bytes`` (converted kernel-B
        buffers, D subtiles, K groups' parked accumulators) at ``occupancy`` CTAs per SM, at
        most ``max_stages``."""
        reserved = 2048  # mbarriers + alignment padding
        # NOTE: 228 KiB per SM in all, of which 1 KiB per CTA is reserved by the hardware.
        per_cta = min(SM90_SMEM_CAPACITY, SM90_SMEM_PER_SM // occupancy - 1024)
        stages = (per_cta - fixed_bytes - reserved) // stage_bytes
        return min(stages, max_stages)

    @staticmethod
    def _compute_grid(
        rows,
        cols,
        l,  # noqa: E741
        tile_rows,
        tile_cols,
        split_k,
        max_active_clusters,
        cluster_m,
    ):
        num_tiles = (
            (rows + tile_rows - 1) // tile_rows,
            (cols + tile_cols - 1) // tile_cols,
            l * split_k,
        )
        params = utils.PersistentTileSchedulerParams(num_tiles, (cluster_m, 1, 1))
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(params, max_active_clusters)
        return params, grid

    @staticmethod
    def _blocked_sf_tensor(ptr, rows, sf_atoms_k, l):  # noqa: E741
        # NOTE: the 128x4 atoms are stored row-block-major, so the atoms of one row block are
        # contiguous along K; two 256-byte halves keep every TMA box extent <= 256.
        row_blocks = (rows + SF_ATOM_ROWS - 1) // SF_ATOM_ROWS
        atom_stride = cute.assume(SF_ATOM_BYTES * sf_atoms_k, SF_ATOM_BYTES)
        return cute.make_tensor(
            ptr,
            cute.make_layout(
                (256, 2 * sf_atoms_k, row_blocks, l),
                stride=(1, 256, atom_stride, atom_stride * row_blocks),
            ),
        )

    def converted_rows_b(self, rows_b):
        """Rows of the converted kernel-B copy (Python or DSL integers): on decode
        ``decode_token_rows``, else ``rows_b``."""
        return decode_token_rows(rows_b, self.tile_cols) if self.swap_ab else rows_b

    @staticmethod
    def can_implement(
        mnkl: tuple[int, int, int, int],
        sf_vec_size: int,
        sf_dtype: str,
        c_dtype: str,
        path: str,
        mma_tiler_mn: tuple[int, int],
        cluster_shape_mn: tuple[int, int] = (1, 1),
        split_k: int = 1,
        k_groups: int = 1,
    ) -> tuple[bool, list[str]]:
        """(ok, reasons): ``check_config`` in the CUTLASS-example shape."""
        reasons = check_config(
            mnkl,
            sf_vec_size,
            sf_dtype,
            c_dtype,
            path,
            mma_tiler_mn,
            cluster_shape_mn,
            split_k,
            k_groups,
        )
        return not reasons, reasons


# ---------------------------------------------------------------------------------------------
# Compilation and the command line
# ---------------------------------------------------------------------------------------------
def alpha_reason(alpha: float, sf_vec_size: int, path: str = "decode") -> str | None:
    """Why ``alpha`` cannot be used, or None: it must be a finite fp32 number, and where the
    kernel runs F16 operands (NVFP4 off the prefill path) its fp32 value * 2^14 (the exact
    rescaling of those operands) must be finite too."""
    if not math.isfinite(alpha) or abs(alpha) > FP32_MAX:
        return f"alpha must be a finite fp32 number, got {alpha}"
    alpha32 = struct.unpack("f", struct.pack("f", alpha))[0]
    if sf_vec_size == 16 and path != "prefill" and abs(alpha32) * NVFP4_ACC_SCALE > FP32_MAX:
        return f"NVFP4 here needs |alpha| < 2^114 (alpha * 2^14 must stay finite), got {alpha}"
    return None


# ---------------------------------------------------------------------------------------------
def output_tiles(rows, cols, l, tile_rows, tile_cols, cluster_m):  # noqa: E741
    """(row tiles, col tiles, tiles) of the kernel's output, on the host (``workspace_elems``)
    and in the kernel (the split-K fix-up's addresses): Python or DSL integers.  A 2x1 cluster
    runs an even number of row tiles."""
    row_tiles = (rows + tile_rows * cluster_m - 1) // (tile_rows * cluster_m) * cluster_m
    col_tiles = (cols + tile_cols - 1) // tile_cols
    return row_tiles, col_tiles, row_tiles * col_tiles * l


def workspace_elems(m, n, l, path, mma_tiler_mn, split_k, cluster_m=1):  # noqa: E741
    """fp32 elements of the split-K workspace (partials + one counter per output tile)."""
    rows, cols = (n, m) if path == "decode" else (m, n)
    tr, tc = kernel_tile(path, mma_tiler_mn)
    tiles = output_tiles(rows, cols, l, tr, tc, cluster_m)[2]
    return tiles * split_k * tr * tc + tiles if split_k > 1 else 1


def converted_shapes(gemm: BlockwiseGemmFp4Sm90, m, n, k, l):  # noqa: E741
    """Shapes of the F16 / BF16 copies of kernel A and kernel B that ``convert_operands`` writes
    for a problem: (L, rows, K rounded up to 64), rows rounded up to whole tiles for the tokens
    of the decode path; (8,) for kernel A on decode, which is not converted."""
    rows_a, rows_b = (n, m) if gemm.swap_ab else (m, n)
    k_pad = _round_up(k, K_BLOCK)
    shape_a = (l, rows_a, k_pad) if gemm.a_converted else (8,)
    return shape_a, (l, gemm.converted_rows_b(rows_b), k_pad)


def smem_bytes(gemm: BlockwiseGemmFp4Sm90) -> int:
    """Dynamic SMEM of one CTA (after compilation): the shared storage struct, alignment padding
    included."""
    return gemm.shared_storage.size_in_bytes()


def tma_store_fits(n: int, c_dtype: str) -> bool:
    """Whether D (row pitch N elements) can leave through TMA stores: TMA strides are
    multiples of 16 bytes.  Otherwise the kernel variant with direct stores runs."""
    return n * C_DTYPES[c_dtype].width // 8 % 16 == 0


def compile_gemm(
    sf_vec_size: int,
    c_dtype: str,
    path: str,
    mma_tiler_mn: tuple[int, int],
    split_k: int = 1,
    num_sms: int = 132,
    options: str = "",
    cluster_shape_mn: tuple[int, int] | None = None,
    tma_store: bool = True,
    k_groups: int = 1,
):
    """Compile for any M, N, K, L (runtime values); returns (kernel object, executor).

    ``options="--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir=DIR"`` cross-compiles on a
    machine without a GPU; the executor's ``__ptx__`` / ``__cubin__`` then hold PTX and cubin.
    ``num_sms``: the GPU's SMs (the persistent grid holds occupancy x num_sms CTAs);
    ``cluster_shape_mn`` None takes ``default_cluster(path)``; ``tma_store`` False compiles the
    direct-store epilogue (for N * sizeof(D) not a multiple of 16 bytes, see ``tma_store_fits``);
    """
    import cuda.bindings.driver as cuda_driver
    from cutlass.cute.runtime import make_ptr

    cluster = default_cluster(path) if cluster_shape_mn is None else tuple(cluster_shape_mn)
    gemm = BlockwiseGemmFp4Sm90(
        sf_vec_size, path, mma_tiler_mn, cluster, split_k, tma_store, k_groups
    )
    gmem = cute.AddressSpace.gmem
    # Placeholder addresses: only types and alignments matter for compilation.
    ptrs = [make_ptr(cutlass.Uint8, 0, gmem, assumed_align=16) for _ in range(4)]
    ptrs.append(make_ptr(C_DTYPES[c_dtype], 0, gmem, assumed_align=16))
    ptrs.append(make_ptr(cutlass.Float32, 0, gmem, assumed_align=16))
    ptrs += [make_ptr(gemm.mma_dtype, 0, gmem, assumed_align=16) for _ in range(2)]
    problem = tuple(Int32(1) for _ in range(4))
    compiled = cute.compile(
        gemm,
        *ptrs,
        problem,
        cutlass.Float32(1.0),
        num_sms,
        cuda_driver.CUstream(0),
        options=options,
    )
    return gemm, compiled


class Fp4GemmSm90Runner:
    """Compiled kernel + workspace for one configuration; ``__call__`` launches on torch data.
    A configuration ``check_config`` refuses raises ValueError at construction, and a problem or
    operands it refuses (and ``operand_reasons``, ``alpha_reason``) at the call, with the reasons.

    NOTE: one runner serves one stream at a time.  All its launches of a shape share one
    split-K workspace (partials + self-resetting tile counters) and the converted operands, which
    are zeroed once on the stream current at the first call; launches of the same shape on two
    streams at once would race on them (use one runner per stream).  A launch that aborts part
    way leaves counters behind: make a new runner after a CUDA error.  The GEMM grid releases a
    PDL-launched successor once all its loads are issued (``griddepcontrol.launch_dependents``):
    a kernel that follows it with programmatic dependent launch must ``griddepcontrol.wait``
    before it reads D.
    """

    def __init__(
        self,
        sf_vec_size,
        c_dtype,
        path,
        mma_tiler_mn,
        split_k=1,
        options="",
        cluster_shape_mn=None,
        k_groups=1,
    ):
        # a configuration the kernel cannot be built for is refused here, before compiling, and
        # a problem it cannot run at each call (``__call__``): ValueError naming each reason
        cluster = default_cluster(path) if cluster_shape_mn is None else tuple(cluster_shape_mn)
        reasons = config_reasons(
            sf_vec_size,
            default_sf_dtype(sf_vec_size),
            c_dtype,
            path,
            mma_tiler_mn,
            cluster,
            split_k,
            k_groups,
        )
        if reasons:
            raise ValueError("; ".join(reasons))
        self.sf_vec_size, self.c_dtype = sf_vec_size, c_dtype
        self.path, self.mma_tiler_mn, self.split_k = path, tuple(mma_tiler_mn), split_k
        self._args = (
            sf_vec_size,
            c_dtype,
            path,
            mma_tiler_mn,
            split_k,
            gpu_sm_count(),
            options,
            cluster_shape_mn,
        )
        # the TMA-store variant now; the direct-store one when an N first needs it
        self.gemm, compiled = compile_gemm(*self._args, tma_store=True, k_groups=k_groups)
        self._compiled = {True: compiled}
        self._workspace = {}

    def executor(self, n: int):
        """The compiled kernel for output width N (see ``tma_store_fits``)."""
        tma_store = tma_store_fits(n, self.c_dtype) and self.gemm.tma_store
        if tma_store not in self._compiled:
            self._compiled[tma_store] = compile_gemm(
                *self._args,
                tma_store=tma_store,
                k_groups=self.gemm.k_groups,
            )[1]
        return self._compiled[tma_store]

    def workspace(self, m, n, k, l):  # noqa: E741
        """(split-K workspace, converted kernel B, converted kernel A) for a problem shape,
        allocated once (F16 / BF16 ``converted_shapes``; 8 elements when unused)."""
        import torch

        key = (m, n, k, l)
        if key not in self._workspace:
            # zeros once: the split-K counters reset themselves after every tile (every launch
            # rewrites the converted operands' rows, K padding included; the decode tokens'
            # padding rows are never written)
            elems = workspace_elems(
                m, n, l, self.path, self.mma_tiler_mn, self.split_k, self.gemm.cluster_m
            )
            shape_a, shape_b = converted_shapes(self.gemm, m, n, k, l)
            self._workspace[key] = (
                torch.zeros(elems, dtype=torch.float32, device="cuda"),
                torch.zeros(shape_b, dtype=torch.float16, device="cuda"),
                torch.zeros(shape_a, dtype=torch.float16, device="cuda"),
            )
            # NOTE: the zeros are written on the current stream; a launch on another stream
            # (``__call__``'s ``stream``) must not read the counters before they land.
            torch.cuda.current_stream().synchronize()
        return self._workspace[key]

    def __call__(self, a, b, sfa_blocked, sfb_blocked, d, m, n, k, l, alpha, stream=None):  # noqa: E741
        import cuda.bindings.driver as cuda_driver
        import torch
        from cutlass.cute.runtime import make_ptr

        reasons = operand_reasons(
            a, b, sfa_blocked, sfb_blocked, d, m, n, k, l, self.sf_vec_size, self.c_dtype
        )
        reasons += problem_reasons((m, n, k, l), self.sf_vec_size, self.path, self.mma_tiler_mn)
        reason = alpha_reason(float(alpha), self.sf_vec_size, self.path)
        if reason:
            reasons.append(reason)
        if reasons:
            raise ValueError("; ".join(reasons))
        gmem = cute.AddressSpace.gmem
        work, conv_b, conv_a = self.workspace(m, n, k, l)
        ptrs = [
            make_ptr(cutlass.Uint8, t.data_ptr(), gmem, assumed_align=16)
            for t in (a, b, sfa_blocked, sfb_blocked)
        ]
        ptrs.append(make_ptr(C_DTYPES[self.c_dtype], d.data_ptr(), gmem, assumed_align=16))
        ptrs.append(make_ptr(cutlass.Float32, work.data_ptr(), gmem, assumed_align=16))
        ptrs += [
            make_ptr(self.gemm.mma_dtype, t.data_ptr(), gmem, assumed_align=16)
            for t in (conv_b, conv_a)
        ]
        if stream is None:
            stream = cuda_driver.CUstream(torch.cuda.current_stream().cuda_stream)
        self.executor(n)(
            *ptrs, (Int32(m), Int32(n), Int32(k), Int32(l)), cutlass.Float32(alpha), stream
        )


def operand_reasons(
    a,
    b,
    sfa_blocked,
    sfb_blocked,
    d,
    m,
    n,
    k,
    l,  # noqa: E741
    sf_vec_size,
    c_dtype,
) -> list[str]:
    """Why these torch tensors cannot be the kernel's operands (empty when they can): sizes,
    D's dtype (``c_dtype``), 16-byte aligned bases (TMA loads and stores), contiguity, one CUDA
    device."""
    want = {
        "a": l * m * (k // 2),
        "b": l * n * (k // 2),
        "sfa_blocked": blocked_sf_bytes(m, k, l, sf_vec_size),
        "sfb_blocked": blocked_sf_bytes(n, k, l, sf_vec_size),
        "d": l * m * n,
    }
    tensors = {"a": a, "b": b, "sfa_blocked": sfa_blocked, "sfb_blocked": sfb_blocked, "d": d}
    reasons = []
    if d.dtype != _torch_dtype(c_dtype):
        reasons.append(f"d is {d.dtype}; this kernel writes {c_dtype} (c_dtype)")
    for name, t in tensors.items():
        unit = "elements" if name == "d" else "bytes"
        have = t.numel() * (1 if name == "d" else t.element_size())
        if have != want[name]:
            reasons.append(f"{name} has {have} {unit}; (M, N, K, L) needs {want[name]}")
        # NOTE: TMA needs 16-byte aligned global base addresses.
        if t.data_ptr() % 16:
            reasons.append(f"{name} must start on a 16-byte boundary (TMA); copy it first")
        if not t.is_cuda or not t.is_contiguous():
            reasons.append(f"{name} must be a contiguous CUDA tensor")
        elif t.device != a.device:
            reasons.append(f"{name} is on {t.device}, a is on {a.device}")
    return reasons


def _torch_dtype(c_dtype: str):
    import torch

    return {"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32}[c_dtype]


def blocked_scales(scales):
    """[L, R, K/V] unswizzled scales -> contiguous uint8 [L, bytes] in the 128x4 layout."""
    import torch

    import reference

    return reference.to_blocked(scales).view(torch.uint8).contiguous()


def _resource_usage(dump_dir: str) -> list[dict]:
    """Registers / stack / local / static shared of every kernel in the newest dumped cubin
    (``cuobjdump -res-usage``); empty if cuobjdump or the cubin is missing."""
    import glob
    import re
    import shutil
    import subprocess

    tool = shutil.which("cuobjdump")
    if tool is None:
        try:
            import nvidia.cu13 as cu13

            tool = os.path.join(list(cu13.__path__)[0], "bin", "cuobjdump")
        except ImportError:
            return []
    cubins = sorted(glob.glob(os.path.join(dump_dir, "*.cubin")), key=os.path.getmtime)
    if not cubins or not os.path.exists(tool):
        return []
    out = subprocess.run([tool, "-res-usage", cubins[-1]], capture_output=True, text=True).stdout
    pattern = r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)"
    return [
        dict(kernel=f, reg=int(r), stack=int(st), static_shared=int(sh), local=int(lo))
        for f, r, st, sh, lo in re.findall(pattern, out)
    ]


def _parse_pair(text: str) -> tuple[int, int]:
    vals = tuple(int(x) for x in text.split(","))
    if len(vals) != 2:
        raise argparse.ArgumentTypeError(f"expected two comma-separated ints, got {text!r}")
    return vals


def _parse_mnkl(text: str) -> tuple[int, int, int, int]:
    vals = tuple(int(x) for x in text.split(","))
    if len(vals) != 4:
        raise argparse.ArgumentTypeError(f"expected M,N,K,L, got {text!r}")
    return vals


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="NVFP4 / MXFP4 W4A4 GEMM on Hopper (F16 / BF16 wgmma on exact dequant)."
    )
    ap.add_argument("--mnkl", type=_parse_mnkl, default=(8192, 8192, 8192, 1))
    ap.add_argument(
        "--mma_tiler_mn",
        "--tile_shape_mn",
        dest="mma_tiler_mn",
        type=_parse_pair,
        default=None,
        help="output tile (M, N); default: see default_config",
    )
    ap.add_argument(
        "--cluster_shape_mn", type=_parse_pair, default=None, help="default: 2,1 on prefill"
    )
    ap.add_argument("--path", choices=("auto",) + PATHS, default="auto")
    ap.add_argument("--split_k", type=int, default=None, help="default: see default_config")
    ap.add_argument(
        "--k_groups",
        type=int,
        default=None,
        help="decode: consumer warpgroup groups splitting K in a CTA; default: see default_config",
    )
    ap.add_argument("--sf_vec_size", type=int, default=16)
    ap.add_argument("--sf_dtype", default=None, help="Float8E4M3FN (16) / Float8E8M0FNU (32)")
    ap.add_argument("--c_dtype", default="BFloat16")
    ap.add_argument("--alpha", type=float, default=None, help="default: the NVFP4 global scales")
    ap.add_argument(
        "--tolerance",
        type=float,
        default=1.0,
        help="multiplier of reference.gemm_tolerance's derived bound",
    )
    ap.add_argument("--warmup_iterations", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--skip_ref_check", action="store_true")
    ap.add_argument("--use_cold_l2", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile_only", action="store_true")
    ap.add_argument("--dump_dir", default=None)
    return ap.parse_args(argv)


def gpu_sm_count() -> int:
    """SMs of the current GPU (``default_config``'s CTA slots), or an H200's 132 without one
    (e.g. for ``--compile_only``)."""
    try:
        import torch
    except ImportError:
        return 132
    if not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def resolve_config(args):
    """(path, mma_tiler_mn, split_k, k_groups, sf_dtype) after applying the defaults; also
    fills in ``args.cluster_shape_mn``."""
    m, n, k, l = args.mnkl  # noqa: E741
    # (the default K groups go with the default tile and split only: a tile or a split given
    # completes the pick without them)
    path, tiler, split, k_groups = default_config(
        m,
        n,
        k,
        l,
        gpu_sm_count(),
        path=None if args.path == "auto" else args.path,
        allow_k_groups=args.mma_tiler_mn is None and args.split_k is None,
    )
    if args.mma_tiler_mn is not None:
        tiler = args.mma_tiler_mn
    if args.split_k is not None:
        split = args.split_k
    if args.k_groups is not None:
        k_groups = args.k_groups
    if args.cluster_shape_mn is None:
        args.cluster_shape_mn = default_cluster(path)
    sf_dtype = args.sf_dtype or default_sf_dtype(args.sf_vec_size)
    return path, tuple(tiler), split, k_groups, sf_dtype


def main(argv=None) -> int:
    args = parse_args(argv)
    path, tiler, split, k_groups, sf_dtype = resolve_config(args)
    _, reasons = BlockwiseGemmFp4Sm90.can_implement(
        args.mnkl,
        args.sf_vec_size,
        sf_dtype,
        args.c_dtype,
        path,
        tiler,
        args.cluster_shape_mn,
        split,
        k_groups,
    )
    print(
        f"Hopper FP4 GEMM: mnkl={args.mnkl} sf_vec_size={args.sf_vec_size} sf_dtype={sf_dtype} "
        f"c_dtype={args.c_dtype} path={path} mma_tiler_mn={tiler} "
        f"cluster_shape_mn={tuple(args.cluster_shape_mn)} split_k={split} k_groups={k_groups}"
    )
    reasons = list(reasons)
    if args.iterations < 1 or args.warmup_iterations < 0:
        reasons.append("--iterations must be >= 1 and --warmup_iterations >= 0")
    reason = None if args.alpha is None else alpha_reason(args.alpha, args.sf_vec_size, path)
    if reason:
        reasons.append(f"--alpha: {reason}")
    if args.tolerance <= 0:
        reasons.append("--tolerance must be > 0")
    if reasons:
        for r in reasons:
            print(f"error: {r}", file=sys.stderr)
        return 2

    if args.compile_only:
        import tempfile

        dump = args.dump_dir or tempfile.mkdtemp(prefix="fp4_sm90_")
        try:
            os.makedirs(dump, exist_ok=True)
        except OSError as err:
            print(f"error: --dump_dir {dump}: cannot create the folder ({err})", file=sys.stderr)
            return 2
        opts = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir={dump}"
        tma_store = tma_store_fits(args.mnkl[1], args.c_dtype)
        gemm, _ = compile_gemm(
            args.sf_vec_size,
            args.c_dtype,
            path,
            tiler,
            split,
            132,
            opts,
            args.cluster_shape_mn,
            tma_store,
            k_groups,
        )
        kernels = _resource_usage(dump)
        if not kernels:
            print("(cuobjdump not found: no register / local-memory report)")
        for info in kernels:
            print(f"kernel: {info['kernel']}")
            print(
                f"  registers: {info['reg']}, local memory: {info['local']} bytes, "
                f"stack: {info['stack']} bytes, static shared: {info['static_shared']} bytes"
            )
        print(
            f"main kernel: setmaxnreg producer {gemm.producer_regs} / consumers "
            f"{gemm.mma_regs}, {gemm.threads_per_cta} threads, {gemm.occupancy} CTA(s)/SM, "
            f"{gemm.k_groups} K group(s)"
        )
        print("epilogue: " + ("TMA store" if gemm.tma_store else "direct stores"))
        print(f"shared memory: {smem_bytes(gemm)} bytes dynamic")
        print(f"stages: {gemm.num_stages} (k-tile {gemm.stage_k})")
        print(f"dump: {dump}")
        return 0

    import torch

    if not torch.cuda.is_available():
        print(
            "error: no CUDA GPU found; this kernel needs an sm_90 GPU (H100 / H200). "
            "Use --compile_only to cross-compile on this machine.",
            file=sys.stderr,
        )
        return 2
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        print(
            f"error: found {torch.cuda.get_device_name()} (sm_{major}{minor}); this kernel "
            "needs sm_90 (H100 / H200). Use --compile_only to cross-compile.",
            file=sys.stderr,
        )
        return 2

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import reference

    m, n, k, l = args.mnkl  # noqa: E741
    ops = reference.make_fp4_operands(m, n, k, l, args.sf_vec_size, "cuda", args.seed)
    alpha = float(ops.alpha) if args.alpha is None else args.alpha
    sfa, sfb = blocked_scales(ops.sfa), blocked_scales(ops.sfb)
    d = torch.full((l, m, n), float("nan"), dtype=_torch_dtype(args.c_dtype), device="cuda")
    runner = Fp4GemmSm90Runner(
        args.sf_vec_size,
        args.c_dtype,
        path,
        tiler,
        split,
        cluster_shape_mn=args.cluster_shape_mn,
        k_groups=k_groups,
    )
    runner(ops.a, ops.b, sfa, sfb, d, m, n, k, l, alpha)
    torch.cuda.synchronize()

    sets = [(ops.a, ops.b, sfa, sfb, d)]
    if args.use_cold_l2:
        one = sum(t.numel() * t.element_size() for t in sets[0])
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        for _ in range(max(1, math.ceil(2 * l2 / one))):
            sets.append(tuple(t.clone() for t in sets[0]))
    for i in range(args.warmup_iterations):
        a_, b_, sa_, sb_, d_ = sets[i % len(sets)]
        runner(a_, b_, sa_, sb_, d_, m, n, k, l, alpha)
    # NOTE: the timed launches are replays of a CUDA graph: a launch from Python (operand checks,
    # pointer wrapping) takes longer than a small decode GEMM, and timing it would time the host.
    # At least one launch per operand set, so that with --use_cold_l2 every copy is read.
    iterations = max(args.iterations, len(sets))  # (--iterations >= 1: checked with the others)
    stream = torch.cuda.Stream()
    # (the operands and their copies were written on the current stream)
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(iterations):
            a_, b_, sa_, sb_, d_ = sets[i % len(sets)]
            runner(a_, b_, sa_, sb_, d_, m, n, k, l, alpha)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / iterations
    print(f"Mean time: {us:.2f} us")
    print(f"Throughput: {2.0 * m * n * k * l / us / 1e6:.2f} TFLOP/s")
    if args.skip_ref_check:
        return 0
    ok, info = reference.check_gemm(
        d,
        ops.a,
        ops.b,
        ops.sfa,
        ops.sfb,
        args.sf_vec_size,
        alpha,
        unit_roundoff=reference.FP32_UNIT_ROUNDOFF * args.tolerance,
    )
    print(info)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
