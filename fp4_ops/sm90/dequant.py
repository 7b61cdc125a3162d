# SPDX-License-Identifier: BSD-3-Clause
"""Exact FP4 dequantization on sm_90 and the PTX the Hopper kernel needs beyond the DSL.

Hopper has no FP4 conversion instruction: e2m1 values become F16 / BF16 bit patterns through
integer masks, shifts and byte permutes (``prmt``), then one packed multiply by the scale puts
the block scale in (two for MXFP4 scales above 1).  Every product e2m1 x E4M3 (at most 6
significant bits) or e2m1 x E8M0 (a power of two) is exact in the MMA type, so nothing rounds
before the tensor cores.

Pairs: 16 e2m1 values (8 bytes, one 16-group of a 64-wide k-block) become 8 words P_0..P_7;
P_i holds nibbles (i % 4, i % 4 + 4) of 32-bit word i // 4.  ``a_fragment_word`` places them in
the wgmma A fragment, which fixes the K permutation that ``token_chunk_layout`` gives the other
operand.  W4A16's prepacked words hold the same pairs with their bits spread
(``k_order.PAIR_BITS``): ``prepacked_pair_bits`` takes a pair's BF16 bits out with one to three
instructions instead of three or four.  All functions here are DSL ops or take Python / DSL
integers.
"""

from __future__ import annotations

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import Int32, Int64, Uint32, Uint64, dsl_user_op

from fp4_ops.sm90.k_order import pair_k

# BF16 bit patterns of 2^126 and 2^120 and F16 bit pattern of 2^7, in both halves.
BF16X2_2POW126 = 0x7E807E80
BF16X2_2POW120 = 0x7B807B80
F16X2_2POW7 = 0x58005800
# fp32 bits of 2^118: ``e4m3_low_factor``'s prescale
E4M3_BF16_PRESCALE_BITS = 0x7A800000
# where a pair's e2m1 bits sit in BF16x2 (sign 15, magnitude 6..8: e2m1 x 2^-126) and in F16x2
# (sign 15, magnitude 9..11: e2m1 x 2^-14), both halves
BF16_PAIR_BITS = 0x81C081C0
F16_PAIR_BITS = 0x8E008E00
# prepacked pair 3's bits (k_order.PAIR_BITS), and x << 3 | x << 8 | x << 14 (disjoint terms),
# which moves them onto BF16_PAIR_BITS
PAIR3_BITS = 0x001B001B
PAIR3_SPREAD = 0x4108


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


def _load(opcode: str, result, address, constraints: str):
    """``result = opcode [address]`` as a DSL op.  NOTE: loads carry side effects so that they
    stay after the mbarrier wait guarding their stage."""

    @dsl_user_op
    def load(addr, *, loc=None, ip=None):
        return _ptx(result, [(address, addr)], f"{opcode} $0, [$1];", constraints, loc=loc, ip=ip)

    return load


def _store(opcode: str, address, value_type, constraints: str):
    """``opcode [address], value`` as a DSL op."""

    @dsl_user_op
    def store(addr, value, *, loc=None, ip=None):
        operands = [(address, addr), (value_type, value)]
        _ptx(None, operands, f"{opcode} [$0], $1;", constraints, loc=loc, ip=ip)

    return store


def _packed_mul(opcode: str):
    """Lane-wise ``opcode`` (mul.rn.f16x2 / mul.rn.bf16x2) of two 32-bit words as a DSL op."""

    @dsl_user_op
    def mul(a, b, *, loc=None, ip=None):
        operands = [(Uint32, a), (Uint32, b)]
        asm = f"{opcode} $0, $1, $2;"
        return _ptx(Uint32, operands, asm, "=r,r,r", side_effects=False, loc=loc, ip=ip)

    return mul


ld_shared_b64 = _load("ld.shared.b64", Uint64, Int32, "=l,r")
ld_shared_u8 = _load("ld.shared.u8", Uint32, Int32, "=r,r")
ld_shared_u32 = _load("ld.shared.u32", Uint32, Int32, "=r,r")
ld_shared_f32 = _load("ld.shared.f32", cutlass.Float32, Int32, "=f,r")
ld_global_nc_u32 = _load("ld.global.nc.u32", Uint32, Int64, "=r,l")
# NOTE: .cg (L2 only): split-K partials come from other SMs, whose writes L1 does not see.
ld_global_cg_f32 = _load("ld.global.cg.f32", cutlass.Float32, Int64, "=f,l")
st_shared_b32 = _store("st.shared.b32", Int32, Uint32, "r,r")
st_shared_f32 = _store("st.shared.f32", Int32, cutlass.Float32, "r,f")
st_global_f32 = _store("st.global.f32", Int64, cutlass.Float32, "l,f")
st_global_u32 = _store("st.relaxed.gpu.global.u32", Int64, Uint32, "l,r")
mul_f16x2 = _packed_mul("mul.rn.f16x2")
mul_bf16x2 = _packed_mul("mul.rn.bf16x2")


@dsl_user_op
def atomic_add_global_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> Uint32:
    operands = [(Int64, addr), (Uint32, value)]
    asm = "atom.global.acq_rel.gpu.add.u32 $0, [$1], $2;"
    return _ptx(Uint32, operands, asm, "=r,l,r", loc=loc, ip=ip)


@dsl_user_op
def mapa_shared(addr: Int32, rank: Int32, *, loc=None, ip=None) -> Int32:
    """The shared::cluster address of this CTA's SMEM address ``addr`` in CTA ``rank``."""
    operands = [(Int32, addr), (Int32, rank)]
    asm = "mapa.shared::cluster.u32 $0, $1, $2;"
    return _ptx(Int32, operands, asm, "=r,r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def mbarrier_wait_cluster(mbar: Int32, phase: Int32, *, loc=None, ip=None) -> None:
    """Wait for the phase of parity ``phase`` of this CTA's mbarrier at ``mbar``, acquiring at
    cluster scope: what another CTA of the cluster released on it is visible after."""
    asm = (
        "{\n.reg .pred P1;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [$0], $1;\n"
        "@!P1 bra LAB_WAIT;\n}"
    )
    _ptx(None, [(Int32, mbar), (Int32, phase)], asm, "r,r", loc=loc, ip=ip)


@dsl_user_op
def mbarrier_arrive_cluster(mbar: Int32, *, loc=None, ip=None) -> None:
    """Arrive, releasing at cluster scope, on the mbarrier at shared::cluster address ``mbar``."""
    asm = "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [$0];"
    _ptx(None, [(Int32, mbar)], asm, "r", loc=loc, ip=ip)


@dsl_user_op
def st_async_v4_f32(addr: Int32, values: list, mbar: Int32, *, loc=None, ip=None) -> None:
    """Four fp32 to the shared::cluster address ``addr``; their bytes complete the transaction
    count of the mbarrier at shared::cluster address ``mbar`` (in the same CTA as ``addr``)."""
    operands = [(Int32, addr)] + [(cutlass.Float32, v) for v in values] + [(Int32, mbar)]
    asm = "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32"
    asm += " [$0], {$1, $2, $3, $4}, [$5];"
    _ptx(None, operands, asm, "r,f,f,f,f,r", loc=loc, ip=ip)


@dsl_user_op
def st_global_v4_b32(addr: Int64, values: list, *, loc=None, ip=None) -> None:
    operands = [(Int64, addr)] + [(Uint32, v) for v in values]
    asm = "st.global.v4.b32 [$0], {$1, $2, $3, $4};"
    _ptx(None, operands, asm, "l,r,r,r,r", loc=loc, ip=ip)


@dsl_user_op
def prmt_zero(a: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """Bytes of ``a`` (selector digits 0..3) or zero bytes (digit 4) -> one word."""
    asm = f"prmt.b32 $0, $1, 0, {selector:#06x};"
    return _ptx(Uint32, [(Uint32, a)], asm, "=r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def e4m3x2_to_f16x2(sf_pair: Uint32, *, loc=None, ip=None) -> Uint32:
    """The two E4M3 bytes in the low 16 bits -> F16x2, byte 0 in the low half (hardware cvt,
    sm_89+; exact, NaN stays NaN)."""
    asm = "{ .reg .b16 t; cvt.u16.u32 t, $1; cvt.rn.f16x2.e4m3x2 $0, t; }"
    return _ptx(Uint32, [(Uint32, sf_pair)], asm, "=r,r", side_effects=False, loc=loc, ip=ip)


@dsl_user_op
def f16_lo_to_bf16x2_prescaled(h: Uint32, *, loc=None, ip=None) -> Uint32:
    """The low F16 half of h -> F32, times 2^118, -> BF16 in both halves (exact for E4M3
    values: 4 significant bits, below 2^9)."""
    asm = (
        "{ .reg .b16 lo, hi; .reg .f32 f; mov.b32 {lo, hi}, $1; "
        f"cvt.f32.f16 f, lo; mul.f32 f, f, 0f{E4M3_BF16_PRESCALE_BITS:08X}; "
        "cvt.rn.bf16x2.f32 $0, f, f; }"
    )
    return _ptx(Uint32, [(Uint32, h)], asm, "=r,r", side_effects=False, loc=loc, ip=ip)


def e4m3_low_factor(sf_bytes: Uint32, prescaled: bool) -> Uint32:
    """The E4M3 scale in the low byte -> the W4A16 multiplier in both halves, exact: BF16
    scale * 2^118 (``prescaled``: times an e2m1 * 2^-126 it gives e2m1 * scale * 2^-8; scale
    < 2^9 keeps it below 2^127) or F16 scale * 2^7."""
    pair = e4m3x2_to_f16x2(sf_bytes)
    if prescaled:
        return f16_lo_to_bf16x2_prescaled(pair)
    return prmt_zero(mul_f16x2(pair, Uint32(F16X2_2POW7)), 0x1010)


@dsl_user_op
def e4m3_to_f16x2(sf_byte: Uint32, *, loc=None, ip=None) -> Uint32:
    """One E4M3 byte -> the same F16 value in both halves (hardware cvt, sm_89+)."""
    return e4m3x2_to_f16x2(sf_byte * Uint32(0x0101), loc=loc, ip=ip)


def fp4x8_to_f16x2(word: Uint32, factors: list) -> list:
    """NVFP4: 8 e2m1 values (one 32-bit word) -> 4 F16x2 words (nibbles (p, p + 4), p = 0..3),
    word p times ``factors[p]``.

    The F16 bits of e2m1 * 2^-14 are one byte, ``sign << 7 | (exp, mant) << 1``, above a zero
    byte (0.5 becomes the F16 subnormal 2^-15).  Two masked shifts build that byte for the four
    even nibbles and two for the odd ones; one byte permute per pair places two of them."""
    even = ((word << 4) & Uint32(0x80808080)) | ((word << 1) & Uint32(0x0E0E0E0E))
    odd = (word & Uint32(0x80808080)) | ((word >> 3) & Uint32(0x0E0E0E0E))
    # (nibble p, nibble p + 4) = bytes p // 2 and p // 2 + 2 of ``even`` / ``odd``.
    bytes_ = [
        prmt_zero(even, 0x2404),
        prmt_zero(odd, 0x2404),
        prmt_zero(even, 0x3414),
        prmt_zero(odd, 0x3414),
    ]
    return [mul_f16x2(b, f) for b, f in zip(bytes_, factors, strict=True)]


def fp4_pair_to_bf16x2(word: Uint32, p: int, factor: Uint32, prescaled=False) -> Uint32:
    """Nibbles p (low half) and p + 4 (high half) of ``word`` -> BF16x2 of e2m1 * ``factor``;
    ``prescaled``: ``factor`` already holds the 2^126 (the result is e2m1 * factor * 2^-126).

    ``word`` is already shifted right by 8 for p = 2, 3 (one shift serves two pairs)."""
    if p % 2 == 0:
        # x * 0x1040 = x << 6 | x << 12 (disjoint bits): magnitude bits to 6..8, sign to 15.
        raw = ((word & Uint32(0x000F000F)) * Uint32(0x1040)) & Uint32(BF16_PAIR_BITS)
    else:
        # the nibble sits 4 bits higher: x << 2 | x << 8 lands on the same bits.
        raw = ((word & Uint32(0x00F000F0)) * Uint32(0x0104)) & Uint32(BF16_PAIR_BITS)
    return _bf16_bits_times(raw, factor, prescaled)


def _bf16_bits_times(raw: Uint32, factor: Uint32, prescaled: bool) -> Uint32:
    """BF16x2 bits e2m1 x 2^-126 -> e2m1 x ``factor`` (``prescaled``: the factor holds the
    2^126)."""
    if prescaled:
        return mul_bf16x2(raw, factor)
    return mul_bf16x2(mul_bf16x2(raw, Uint32(BF16X2_2POW126)), factor)


def _rotate_right(word: Uint32, shift: Uint32) -> Uint32:
    """``word`` rotated right by ``shift`` (0..31) bits; no shift reaches 32, which PTX leaves
    undefined."""
    return (word >> shift) | (word << ((Uint32(32) - shift) & Uint32(31)))


def prepacked_pair_bits(word: Uint32, p: int) -> Uint32:
    """Pair p (0..3) of a prepacked W4A16 word -> its BF16_PAIR_BITS: pair 0 as it sits, pairs
    1 and 2 rotated right by 3 p bits, pair 3 spread by one multiply."""
    if p == 3:
        return ((word & Uint32(PAIR3_BITS)) * Uint32(PAIR3_SPREAD)) & Uint32(BF16_PAIR_BITS)
    return _rotate_right(word, Uint32(3 * p)) & Uint32(BF16_PAIR_BITS)


def prepacked_pair_bits_at(word: Uint32, p: Uint32) -> Uint32:
    """``prepacked_pair_bits`` for a pair p chosen at run time."""
    rotated = _rotate_right(word, Uint32(3) * p) & Uint32(BF16_PAIR_BITS)
    spread = prepacked_pair_bits(word, 3)
    is_3 = Uint32(0) - Uint32(p == Uint32(3))
    return rotated ^ ((rotated ^ spread) & is_3)


def pair_bits_to_mma(bits: Uint32, factor: Uint32, f16: bool, prescaled=False) -> Uint32:
    """A pair's BF16_PAIR_BITS -> F16x2 / BF16x2 of e2m1 x ``factor``, the values of
    ``fp4_pair_lo_to_mma`` (``prescaled``: as ``fp4_pair_to_bf16x2``)."""
    if f16:
        # bits * 9 = bits | bits << 3 (disjoint): the magnitude to 9..11, the sign stays at 15
        return mul_f16x2((bits * Uint32(9)) & Uint32(F16_PAIR_BITS), factor)
    return _bf16_bits_times(bits, factor, prescaled)


def prepacked_fp4x16_to_mma(packed: Uint64, factors: list, f16: bool, prescaled=False) -> list:
    """``fp4x16_to_mma`` on 8 bytes of prepacked W4A16 weights: P_i is pair i % 4 of 32-bit
    word i // 4, times ``factors[i]``."""
    words = (Uint32(packed & Uint64(0xFFFFFFFF)), Uint32(packed >> 32))
    return [
        pair_bits_to_mma(prepacked_pair_bits(words[i // 4], i % 4), factors[i], f16, prescaled)
        for i in range(8)
    ]


def fp4x8_to_bf16x2(word: Uint32, factors: list, prescaled=False) -> list:
    """8 e2m1 values -> 4 BF16x2 words (nibbles (p, p + 4)), word p times ``factors[p]``
    (``fp4_pair_to_bf16x2``)."""
    shifted = word >> 8
    return [
        fp4_pair_to_bf16x2(word if p < 2 else shifted, p, factors[p], prescaled) for p in range(4)
    ]


def fp4_pair_lo_to_mma(x: Uint32, factor: Uint32, f16: bool) -> Uint32:
    """The nibbles at bits 0..3 (low half) and 16..19 (high half) of ``x`` -> F16x2 / BF16x2 of
    e2m1 * ``factor``: the same bit patterns as ``fp4x8_to_f16x2`` / ``fp4x8_to_bf16x2`` build
    (F16: sign to 15, magnitude to 9..11; BF16: to 15 and 6..8), for a pair chosen at run time."""
    if f16:
        bits = ((x & Uint32(0x00080008)) << 12) | ((x & Uint32(0x00070007)) << 9)
        return mul_f16x2(bits, factor)
    return fp4_pair_to_bf16x2(x, 0, factor)


def scale_factor(sf_byte: Uint32, f16: bool) -> Uint32:
    """One scale byte -> the multiplier of ``fp4x16_to_mma`` in both halves, exact: NVFP4
    (F16 MMAs) the F16 value scale * 2^7 (NaN stays NaN), MXFP4 (BF16 MMAs) the BF16 value
    scale.  (NVFP4 with BF16 MMAs: ``e4m3_byte_to_bf16x2`` in ``convert_operands``,
    ``e4m3_low_factor`` in the W4A16 decode mainloop; MXFP4 scales <= 1 on decode:
    ``e8m0_prescaled_factor``.)"""
    if f16:
        return mul_f16x2(e4m3_to_f16x2(sf_byte), Uint32(F16X2_2POW7))
    # E8M0: bits << 7 is the BF16 power of two; byte 0 (2^-127) is the BF16 subnormal 0x0040.
    # NOTE: the NaN byte 255 becomes +inf (0x7F80): D is inf or NaN where the reference has NaN.
    bits = (sf_byte << 7) | (((sf_byte - Uint32(1)) >> 31) << 6)
    return bits | (bits << 16)


def e8m0_prescaled_factor(sf_byte: Uint32) -> Uint32:
    """An E8M0 scale byte e <= 127 (scale <= 1) -> BF16 2^(e - 1) = scale * 2^126 in both halves
    (exponent field e + 126; no carry into the high half), so that one multiply of the e2m1 *
    2^-126 bits of ``fp4_pair_to_bf16x2`` gives e2m1 * scale exactly."""
    return sf_byte * Uint32(0x00800080) + Uint32(0x3F003F00)


def e4m3_byte_to_bf16x2(mags: Uint32, signs: Uint32, q: int, keep=None) -> Uint32:
    """Scale byte q of a word of four E4M3 scales, given as its magnitude bytes (& 0x7f..)
    and sign bytes (& 0x80..), -> the BF16 scale in both halves: magnitude << 4, sign << 8 (the
    BF16 value scale * 2^-120, E4M3 subnormals included) with two byte permutes and one IMAD,
    then times 2^120; the NaN magnitude 0x7f becomes a BF16 NaN.  ``keep`` (all ones or zero)
    zeroes it."""
    bits = prmt_zero(mags, 0x4040 | q << 8 | q) * Uint32(16) + prmt_zero(
        signs, 0x0404 | q << 12 | q << 4
    )
    # (magnitude 0x7f: bits 0x07f0 | 0x7fc0 has the BF16 exponent all ones, a mantissa != 0)
    is_nan = ((mags >> Uint32(8 * q)) & Uint32(0xFF)) == Uint32(0x7F)
    bits = bits | ((Uint32(0) - Uint32(is_nan)) & Uint32(0x7FC07FC0))
    if keep is not None:
        bits = bits & keep
    return mul_bf16x2(bits, Uint32(BF16X2_2POW120))


def fp4x16_to_mma(packed: Uint64, factors: list, f16: bool, prescaled=False) -> list:
    """16 e2m1 values (8 bytes) -> 8 words P_0..P_7 of the MMA type (P_i = nibbles
    (i % 4, i % 4 + 4) of 32-bit word i // 4), P_i times ``factors[i]``: F16 values
    e2m1 * scale * 2^-7, BF16 values e2m1 * scale, or (``prescaled`` BF16 factors)
    e2m1 * factor * 2^-126."""
    lo, hi = Uint32(packed & Uint64(0xFFFFFFFF)), Uint32(packed >> 32)
    if f16:
        return fp4x8_to_f16x2(lo, factors[:4]) + fp4x8_to_f16x2(hi, factors[4:])
    return fp4x8_to_bf16x2(lo, factors[:4], prescaled) + fp4x8_to_bf16x2(hi, factors[4:], prescaled)


def decode_tokens_f16(sf_vec_size: int) -> bool:
    """The W4A4 decode path's MMA type, that of its token copy: F16 for NVFP4 (the cheaper exact
    conversion of e2m1 x E4M3), BF16 for MXFP4 (E8M0 exceeds F16)."""
    return sf_vec_size == 16


def token_chunk_layout(chunk):
    """The tokens' K permutation in ``convert_operands``: 16-byte output chunk ``chunk`` (0..7)
    of a converted 64-wide k-block holds pair P_chunk of each 16-group q = 0..3.  Returns (byte
    offset of its source word in a group's 8 packed bytes, right shift of that word that brings
    the pair's nibbles (chunk % 4, chunk % 4 + 4) to bits 0 and 16, byte offset of the chunk in
    the converted block).  Python or DSL integers."""
    return 4 * (chunk // 4), 4 * (chunk % 4), 16 * chunk


def convert_chunk_words(words, sf4, keep, col0, shift, sf_vec_size: int, f16: bool, chunk=None):
    """One 16-byte chunk of ``convert_operands``: ``words[q]`` is the packed word of 16-group q
    holding the chunk's pair, ``sf4`` the aligned word of the block's scales, ``keep`` all ones
    (zero for the missing groups 2, 3 of a K = 32 x odd tail), ``col0`` the block's first scale
    column, ``shift`` the pair's shift (``token_chunk_layout``) -> the chunk's 4 words.
    ``chunk`` given: prepacked weights (W4A16), whose chunk holds the pair's K values of every
    group, all under the scale of ``pair_k(chunk, 0)``, its bits placed by ``PAIR_BITS``
    (``shift`` unused)."""
    if chunk is not None:
        # one scale for the chunk: bring its byte to byte 0 of sf4 and read that byte below
        sf_col = pair_k(chunk, 0) // sf_vec_size
        sf4 = sf4 >> (Uint32(8) * (Uint32(col0 % 4) + sf_col))
        col0 = 0
    # NVFP4 to BF16: the four E4M3 scales of a block, magnitude and sign bytes apart
    e4m3_bf16 = sf_vec_size == 16 and not f16
    if e4m3_bf16:
        mags, signs = sf4 & Uint32(0x7F7F7F7F), sf4 & Uint32(0x80808080)
    out = []
    for q in range(4):
        word = words[q]
        byte = q if chunk is None else 0
        if e4m3_bf16:
            factor = e4m3_byte_to_bf16x2(mags, signs, byte, keep if q >= 2 else None)
        else:
            if sf_vec_size == 16 or chunk is not None:
                sf = (sf4 >> Uint32(8 * byte)) & Uint32(0xFF)
            else:
                sf = (sf4 >> Uint32(8 * (col0 % 4 + q // 2))) & Uint32(0xFF)
            if q >= 2:
                sf = sf & keep
            factor = scale_factor(sf, f16)
        if q >= 2:
            word = word & keep
        if chunk is None:
            out.append(fp4_pair_lo_to_mma(word >> shift, factor, f16))
        else:
            out.append(pair_bits_to_mma(prepacked_pair_bits_at(word, chunk % 4), factor, f16))
    return out
