"""Reference numerics for the NVFP4 / MXFP4 block-scaled GEMM (plain PyTorch, CPU or CUDA).

This module is the single source of truth for what the kernels must compute. It imports nothing
from the CuTe DSL.

Formats
-------
E2M1 (FP4)
    1 sign, 2 exponent and 1 mantissa bit, no Inf/NaN. The 8 magnitudes are
    {0, 0.5, 1, 1.5, 2, 3, 4, 6}; a 4-bit code is ``sign << 3 | index``. Rounding from real values
    is round-to-nearest, ties to even (the even neighbour is the one whose mantissa bit, i.e. bit 0
    of the index, is clear); magnitudes >= 6 saturate to 6; the sign of zero is kept. Two codes
    share a byte: element ``2i`` in the low nibble, ``2i + 1`` in the high nibble (the
    ``torch.float4_e2m1fn_x2`` / cuBLAS / torchao convention), so a K-major row of K values takes
    K/2 bytes.
NVFP4
    Blocks of 16 consecutive K elements share one ``float8_e4m3fn`` scale, and the whole tensor
    has one fp32 global scale: ``x ~= e2m1 * block_scale * global_scale``. The default global
    scale ``amax / (448 * 6)`` lets the largest block scale use the top of E4M3's range. This
    global scale is the decoding one (a GEMM's alpha is the product of both operands'); some
    libraries (FlashInfer, TensorRT-LLM) pass its reciprocal, ``448 * 6 / amax``, instead. Block
    scales are unsigned (PTX ``ue4m3``): a scale with its sign bit set is refused, and so is
    the NaN encoding 0x7F (0xFF has the sign bit set), for the same reason: the MMA's ue4m3
    type gives neither a meaning, so no kernel result on it can be checked.
MXFP4 (OCP microscaling)
    Blocks of 32 share one ``float8_e8m0fnu`` scale, a bare power of two ``2^(bits - 127)``
    (bits 0..254; 255 is NaN and is refused, as E4M3's NaN is). The scale is
    ``2^ceil(log2(amax_block / 6))``, so it never clips (the round-up rule of cuBLAS-style
    quantizers; the OCP v1.0 example rule ``2^(floor(log2(amax_block)) - 2)`` gives half that
    scale for some blocks and clips their largest elements).
128x4 scale layout
    What tcgen05 block-scaled MMA, cuBLASLt and ``torch._scaled_mm`` read. The [rows, K/vec]
    scale matrix is zero-padded to multiples of 128 rows and 4 columns and cut into 512-byte atoms
    of 128 rows x 4 columns, stored row-block-major (all column-blocks of row-block 0 first).
    Inside an atom, element (r, c) sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``.

Every function takes an optional leading batch dimension L ([L, R, K] etc.), and accepts
``torch.float4_e2m1fn_x2`` wherever it accepts packed ``uint8``. Bad input raises ValueError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
E8M0_BIAS = 127
#: Scale dtype that goes with each ``sf_vec_size``.
SCALE_DTYPES = {NVFP4_BLOCK: torch.float8_e4m3fn, MXFP4_BLOCK: torch.float8_e8m0fnu}
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: fp32 unit roundoff (half of fp32 epsilon).
FP32_UNIT_ROUNDOFF = 2.0**-24

_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Halfway points between neighbouring magnitudes, i.e. the rounding thresholds.
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_REAL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DISTS = ("normal", "uniform", "wide")


# ----------------------------------------------------------------------------- validation helpers


def _require_tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _require_rank(t: torch.Tensor, name: str, last: str) -> None:
    if t.ndim not in (2, 3):
        raise ValueError(
            f"{name} must be 2-D [R, {last}] or 3-D [L, R, {last}], got shape {tuple(t.shape)}"
        )


def _packed_as_uint8(packed: object, name: str) -> torch.Tensor:
    t = _require_tensor(packed, name)
    if t.dtype == torch.float4_e2m1fn_x2:
        return t.view(torch.uint8)
    if t.dtype != torch.uint8:
        raise ValueError(
            f"{name} must hold packed FP4 as uint8 or torch.float4_e2m1fn_x2, got {t.dtype}"
        )
    return t


def _require_codes(codes: object, name: str) -> torch.Tensor:
    t = _require_tensor(codes, name)
    if t.dtype != torch.uint8:
        raise ValueError(f"{name} must be uint8 E2M1 codes, got {t.dtype}")
    if t.numel() and int(t.max()) > 15:
        raise ValueError(f"{name} holds values above 15, which are not 4-bit E2M1 codes")
    return t


def _require_vec_size(sf_vec_size: object) -> int:
    if isinstance(sf_vec_size, bool) or sf_vec_size not in SCALE_DTYPES:
        raise ValueError(
            f"sf_vec_size must be {NVFP4_BLOCK} (NVFP4) or {MXFP4_BLOCK} (MXFP4), "
            f"got {sf_vec_size!r}"
        )
    return int(sf_vec_size)


def _scalar(value: object, name: str, device: torch.device, *, positive: bool) -> torch.Tensor:
    """A finite (and, if asked, positive) scalar as a 0-dim float32 tensor on ``device``."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{name} must be a number or a one-element tensor, got shape {tuple(value.shape)}"
            )
        t = value.detach().to(device=device, dtype=torch.float32).reshape(())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        t = torch.tensor(float(value), dtype=torch.float32, device=device)
    else:
        raise ValueError(f"{name} must be a number or a one-element tensor, got {value!r}")
    v = float(t)
    if not math.isfinite(v) or (positive and v <= 0.0):
        kind = "finite and positive" if positive else "finite"
        raise ValueError(f"{name} must be {kind} in float32, got {v}")
    return t


def _divide(t: torch.Tensor, value: float) -> torch.Tensor:
    """``t / value`` correctly rounded on every device. (CUDA turns division by a Python scalar
    into multiplication by its rounded reciprocal, which can differ in the last bit.)"""
    return t / torch.full((), value, dtype=t.dtype, device=t.device)


def _real_input(x: object, block: int) -> torch.Tensor:
    """Validate a real [R, K] / [L, R, K] tensor to quantize; return it as float32."""
    t = _require_tensor(x, "x")
    if t.dtype not in _REAL_DTYPES:
        raise ValueError(f"x must be float32, bfloat16, float16 or float64, got {t.dtype}")
    _require_rank(t, "x", "K")
    if t.numel() == 0:
        raise ValueError(f"x must not be empty, got shape {tuple(t.shape)}")
    k = t.shape[-1]
    if k % block:
        raise ValueError(f"K = {k} (last dim of x) is not a multiple of the block size {block}")
    xf = t.float()
    if not bool(torch.isfinite(xf).all()):
        raise ValueError("x contains NaN or Inf (or float64 values beyond float32's range)")
    return xf


def _fp4_operand(
    packed: object, scales: object, sf_vec_size: int, pname: str, sname: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate packed data + unswizzled scales of one operand; return (uint8 data, scales)."""
    data = _packed_as_uint8(packed, pname)
    _require_rank(data, pname, "K/2")
    sc = _require_tensor(scales, sname)
    want = SCALE_DTYPES[sf_vec_size]
    if sc.dtype != want:
        raise ValueError(
            f"{sname} has dtype {sc.dtype}, but sf_vec_size {sf_vec_size} needs {want} scales "
            f"(NVFP4: float8_e4m3fn with 16, MXFP4: float8_e8m0fnu with 32)"
        )
    bits = sc.view(torch.uint8)
    if want == torch.float8_e4m3fn:
        signed = int((bits & 0x80).ne(0).sum())
        if signed:
            raise ValueError(
                f"{sname} has {signed} E4M3 scale(s) with the sign bit set; NVFP4 block scales "
                "are unsigned (PTX ue4m3)"
            )
    # NaN scale bytes: E4M3 0x7F (0xFF is refused above), E8M0 0xFF.
    nans = int(bits.eq(0x7F if want == torch.float8_e4m3fn else 0xFF).sum())
    if nans:
        raise ValueError(
            f"{sname} has {nans} NaN scale(s); a block scale must be a number (the MMA's "
            "unsigned scale types give NaN encodings no meaning)"
        )
    k = 2 * data.shape[-1]
    if k == 0 or k % sf_vec_size:
        raise ValueError(
            f"K = {k} ({pname} has {data.shape[-1]} bytes per row) is not a positive multiple "
            f"of sf_vec_size {sf_vec_size}"
        )
    expected = (*data.shape[:-1], k // sf_vec_size)
    if tuple(sc.shape) != expected:
        raise ValueError(
            f"{sname} has shape {tuple(sc.shape)}, but {pname} of shape {tuple(data.shape)} "
            f"(K = {k}) with sf_vec_size {sf_vec_size} needs scales of shape {expected}"
        )
    if sc.device != data.device:
        raise ValueError(f"{sname} is on {sc.device} but {pname} is on {data.device}")
    return data, sc


def _gemm_operands(
    a: object, b: object, sfa: object, sfb: object, sf_vec_size: object
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    vec = _require_vec_size(sf_vec_size)
    a8, sa = _fp4_operand(a, sfa, vec, "a", "sfa")
    b8, sb = _fp4_operand(b, sfb, vec, "b", "sfb")
    if a8.ndim != b8.ndim:
        raise ValueError(f"a is {a8.ndim}-D but b is {b8.ndim}-D; both need the same rank")
    if a8.ndim == 3 and a8.shape[0] != b8.shape[0]:
        raise ValueError(f"batch mismatch: a has L = {a8.shape[0]}, b has L = {b8.shape[0]}")
    if a8.shape[-1] != b8.shape[-1]:
        raise ValueError(f"K mismatch: a has K = {2 * a8.shape[-1]}, b has K = {2 * b8.shape[-1]}")
    if a8.device != b8.device:
        raise ValueError(f"a is on {a8.device} but b is on {b8.device}")
    return vec, a8, sa, b8, sb


# ----------------------------------------------------------------------------- E2M1 codes


def fp32_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round a real tensor (any shape) to E2M1 codes (uint8, 0..15).

    Round to nearest, ties to even mantissa; ``|x| >= 6`` (Inf included) saturates to magnitude
    code 7; -0.0 and negative values that round to zero give code 0x8. The comparison happens in
    the input dtype (float16/bfloat16/float32/float64), where all midpoints are exact. NaN raises.
    """
    t = _require_tensor(x, "x")
    if t.dtype not in _REAL_DTYPES:
        raise ValueError(f"x must be float32, bfloat16, float16 or float64, got {t.dtype}")
    if bool(torch.isnan(t).any()):
        raise ValueError("x contains NaN, which has no E2M1 code")
    mag = t.abs()
    index = torch.zeros(t.shape, dtype=torch.uint8, device=t.device)
    for i, mid in enumerate(_E2M1_MIDPOINTS):
        # At a tie the even neighbour wins: that is index i + 1 when i is odd, else index i.
        passed = mag >= mid if i % 2 else mag > mid
        index += passed.to(torch.uint8)
    return index | (torch.signbit(t).to(torch.uint8) << 3)


def e2m1_to_fp32(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (uint8, 0..15, any shape) to float32; code 0x8 gives -0.0."""
    c = _require_codes(codes, "codes")
    table = _E2M1_MAGNITUDES + tuple(-m for m in _E2M1_MAGNITUDES)
    lut = torch.tensor(table, dtype=torch.float32, device=c.device)
    return lut[c.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes [..., K] into bytes [..., K/2]: element 2i low nibble, 2i+1 high nibble."""
    c = _require_codes(codes, "codes")
    if c.ndim == 0 or c.shape[-1] % 2:
        raise ValueError(
            f"codes must have an even last dim to pack two per byte, got shape {tuple(c.shape)}"
        )
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_fp4: bytes [..., K/2] (uint8 or float4_e2m1fn_x2) -> codes [..., K]."""
    p = _packed_as_uint8(packed, "packed")
    if p.ndim == 0:
        raise ValueError("packed must have at least one dimension")
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


# ----------------------------------------------------------------------------- quantization


def _encode_blocks(blocks: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """Pack ``fp32_to_e2m1(blocks / divisor)``; a block whose divisor is 0 encodes as zeros.

    ``blocks`` is [..., nblocks, vec] float32 and ``divisor`` [..., nblocks] float32. Zero-divisor
    blocks keep each element's sign of zero, as rounding a tiny value to zero would.
    """
    live = (divisor > 0).unsqueeze(-1)
    safe = torch.where(live, divisor.unsqueeze(-1), torch.ones_like(blocks[..., :1]))
    y = torch.where(live, blocks / safe, blocks * 0.0)
    return pack_fp4(fp32_to_e2m1(y).flatten(-2))


def quantize_nvfp4(
    x: torch.Tensor, global_scale: float | torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize x [R, K] or [L, R, K] to NVFP4.

    Returns ``(packed uint8 [.., R, K/2], scales float8_e4m3fn [.., R, K/16], global_scale)``
    with ``x ~= e2m1 * scale * global_scale``. x is converted to float32 first.

    * ``global_scale``: default ``amax(|x|) / (448 * 6)`` over the whole tensor (all L batches),
      or 1.0 where that is 0; returned as a 0-dim float32 tensor on x's device.
    * block scale: ``e4m3(min(amax_block / 6 / global_scale, 448))`` (round to nearest even).
    * codes: ``fp32_to_e2m1(x / (scale * global_scale))``; a block whose scale rounds to 0 (an
      all-zero block included) gets zero codes. A scale that rounded down can push the block's
      largest element past 6; it saturates.
    """
    xf = _real_input(x, NVFP4_BLOCK)
    if global_scale is None:
        gs = _divide(xf.abs().amax(), E4M3_MAX * E2M1_MAX)
        gs = torch.where(gs > 0, gs, torch.ones_like(gs))
    else:
        gs = _scalar(global_scale, "global_scale", xf.device, positive=True)
    blocks = xf.unflatten(-1, (-1, NVFP4_BLOCK))
    amax = blocks.abs().amax(dim=-1)
    scales = (_divide(amax, E2M1_MAX) / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    packed = _encode_blocks(blocks, scales.float() * gs)
    return packed, scales, gs


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [R, K] or [L, R, K] to MXFP4.

    Returns ``(packed uint8 [.., R, K/2], scales float8_e8m0fnu [.., R, K/32])`` with
    ``x ~= e2m1 * scale``. x is converted to float32 first. The block scale is
    ``2^ceil(log2(amax_block / 6))`` (computed exactly, never clips), with the exponent clamped to
    E8M0's [-127, 127]; an all-zero block gets the clamp of log2(0), i.e. E8M0 bits 0x00 = 2^-127,
    and zero codes.
    """
    xf = _real_input(x, MXFP4_BLOCK)
    blocks = xf.unflatten(-1, (-1, MXFP4_BLOCK))
    # float64 holds amax / 6 closely enough that frexp's exponent is exactly ceil(log2(.)).
    target = _divide(blocks.abs().amax(dim=-1).double(), E2M1_MAX)
    mantissa, exponent = torch.frexp(target)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)  # exact powers of two
    exponent = torch.where(target > 0, exponent, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scales = (exponent + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
    packed = _encode_blocks(blocks, scales.float())
    return packed, scales


def _dequantize(data: torch.Tensor, scales: torch.Tensor, vec: int, dtype: torch.dtype):
    """e2m1 * scale in ``dtype`` (float32 or float64); exact in both for NVFP4 and MXFP4."""
    values = e2m1_to_fp32(unpack_fp4(data)).to(dtype)
    per_block = scales.float().to(dtype).unsqueeze(-1)
    return (values.unflatten(-1, (-1, vec)) * per_block).flatten(-2)


def dequantize_fp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    sf_vec_size: int,
    global_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Decode packed FP4 [.., R, K/2] with unswizzled scales [.., R, K/vec] to float32 [.., R, K].

    ``(e2m1 * scale)`` is formed first (exact in float32: at most 2 + 4 significant bits), then
    multiplied by ``global_scale`` (one rounding).
    """
    vec = _require_vec_size(sf_vec_size)
    data, sc = _fp4_operand(packed, scales, vec, "packed", "scales")
    gs = _scalar(global_scale, "global_scale", data.device, positive=True)
    return _dequantize(data, sc, vec, torch.float32) * gs


# ----------------------------------------------------------------------------- 128x4 layout


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def blocked_numel(rows: int, cols: int) -> int:
    """Elements per batch of [rows, cols] scales in the 128x4 layout (zero padding included)."""
    return _round_up(rows, 128) * _round_up(cols, 4)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Swizzle scales [R, C] (or [L, R, C]) into the 128x4 atom layout, 1-D (or [L, n]).

    Rows are zero-padded to a multiple of 128 and columns to a multiple of 4 (zero bytes); the
    dtype is kept (1-byte dtypes are permuted as uint8).
    """
    s = _require_tensor(scales, "scales")
    _require_rank(s, "scales", "C")
    batched = s.ndim == 3
    raw = s if batched else s.unsqueeze(0)
    if raw.element_size() == 1:
        raw = raw.view(torch.uint8)
    n_batch, rows, cols = raw.shape
    rp, cp = _round_up(rows, 128), _round_up(cols, 4)
    padded = raw.new_zeros((n_batch, rp, cp))
    padded[:, :rows, :cols] = raw
    # [L, row-block, r // 32, r % 32, col-block, c] -> [L, row-block, col-block, r % 32, r // 32, c]
    atoms = padded.view(n_batch, rp // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = atoms.reshape(n_batch, rp * cp).view(s.dtype)
    return out if batched else out[0]


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`to_blocked`: 1-D (or [L, n]) swizzled scales -> [R, C] (or [L, R, C])."""
    t = _require_tensor(blocked, "blocked")
    if t.ndim not in (1, 2):
        raise ValueError(f"blocked must be 1-D [n] or 2-D [L, n], got shape {tuple(t.shape)}")
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    batched = t.ndim == 2
    raw = t if batched else t.unsqueeze(0)
    if raw.element_size() == 1:
        raw = raw.view(torch.uint8)
    rp, cp = _round_up(rows, 128), _round_up(cols, 4)
    if raw.shape[1] != blocked_numel(rows, cols):
        raise ValueError(
            f"blocked has {raw.shape[1]} elements per batch, but {rows} x {cols} scales pad to "
            f"{rp} x {cp} = {rp * cp}"
        )
    n_batch = raw.shape[0]
    atoms = raw.reshape(n_batch, rp // 128, cp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    out = atoms.reshape(n_batch, rp, cp)[:, :rows, :cols].contiguous().view(t.dtype)
    return out if batched else out[0]


# ----------------------------------------------------------------------------- GEMM


def reference_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    sf_vec_size: int,
    alpha: float | torch.Tensor = 1.0,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """D = alpha * dequant(A) @ dequant(B)^T, accumulated in ``accum_dtype``, cast to out_dtype.

    A is [M, K/2] and B [N, K/2] (or [L, ., K/2]), both K-major packed FP4; sfa [M, K/vec] and
    sfb [N, K/vec] unswizzled. Returns [M, N] (or [L, M, N]). alpha is rounded to float32, as a
    kernel's epilogue receives it, and applied to the accumulator before the final cast.

    Each dequantized value has at most 6 significant bits, so it is exact in fp32 and in TF32,
    and every product a_i * b_i is exact in fp32 (barring MXFP4 scales so extreme that it
    underflows, or that a dequantized value overflows fp32, which makes the result inf or NaN):
    an fp32 result differs from the exact one only by the summation's rounding.
    ``accum_dtype=torch.float64`` (with ``out_dtype=torch.float64``) gives a nearly exact result
    for tests.
    """
    vec, a8, sa, b8, sb = _gemm_operands(a, b, sfa, sfb, sf_vec_size)
    if out_dtype not in (*OUT_DTYPES, torch.float64):
        raise ValueError(
            f"out_dtype must be bfloat16, float16, float32 (or float64 for tests), got {out_dtype}"
        )
    if accum_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"accum_dtype must be float32 or float64, got {accum_dtype}")
    scale = _scalar(alpha, "alpha", a8.device, positive=False).to(accum_dtype)
    da = _dequantize(a8, sa, vec, accum_dtype)
    db = _dequantize(b8, sb, vec, accum_dtype)
    return (torch.matmul(da, db.transpose(-1, -2)) * scale).to(out_dtype)


def abs_product_sum(
    a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor, sf_vec_size: int
) -> torch.Tensor:
    """``sum_i |a_i * b_i|`` for every output, i.e. ``|dequant(A)| @ |dequant(B)|^T`` in fp32."""
    vec, a8, sa, b8, sb = _gemm_operands(a, b, sfa, sfb, sf_vec_size)
    da = _dequantize(a8, sa, vec, torch.float32).abs()
    db = _dequantize(b8, sb, vec, torch.float32).abs()
    return torch.matmul(da, db.transpose(-1, -2))


def _ulp(mag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype``'s numbers in the binade of ``mag`` (>= 0, float64), subnormals too."""
    info = torch.finfo(dtype)
    min_exp = round(math.log2(info.tiny))
    _, e = torch.frexp(mag)
    exp = torch.where(mag > 0, e - 1, min_exp).clamp(min=min_exp)
    return torch.ldexp(torch.full_like(mag, info.eps), exp)


def gemm_tolerance(
    k: int,
    out_dtype: torch.dtype,
    ref: torch.Tensor,
    abs_sum: torch.Tensor,
    alpha: float | torch.Tensor = 1.0,
    *,
    unit_roundoff: float = FP32_UNIT_ROUNDOFF,
) -> torch.Tensor:
    """Elementwise bound on ``|D_kernel - ref|`` for an fp32-accumulating kernel (float64 tensor).

    ``ref`` is ``reference_gemm(..., out_dtype=torch.float32)`` (not rounded to out_dtype),
    ``abs_sum`` is :func:`abs_product_sum` and ``D_kernel`` is the kernel's out_dtype output.

    Derivation (u = ``unit_roundoff``, 2^-24 for fp32; gamma_n = n u / (1 - n u)):

    1. Every product p_i = (e2m1 * sa)(e2m1 * sb) is exact in fp32 (<= 12 significant bits).
    2. Summing K exact terms in fp32 in any order or tree (serial, pairwise, split-K, MMA
       fragments) gives s^ with |s^ - s| <= gamma_{K-1} * S, where S = sum |p_i| (Higham,
       Accuracy and Stability of Numerical Algorithms, sec. 4.2).
    3. The epilogue's z = fl(alpha * s^) adds one rounding: |z - alpha s| <= gamma_K |alpha| S.
    4. Kernel (with u) and fp32 reference (with u32 = 2^-24) each obey 3, so
       |z_kernel - ref| <= delta = (gamma_K(u) + gamma_K(u32)) |alpha| S, which is
       2 gamma_K |alpha| S ~= K * eps_fp32 * |alpha| * S for an fp32 kernel.
    5. S is itself summed in fp32 from non-negative terms: S <= abs_sum / (1 - gamma_{K-1}(u32)).
    6. The kernel rounds z_kernel to out_dtype: at most half an ulp of out_dtype at
       |z_kernel| <= |ref| + delta (nothing for float32 output, where z_kernel is the output).

    tol = delta + ulp_out(|ref| + delta) / 2. A kernel whose accumulator holds fewer bits than
    fp32 needs a larger ``unit_roundoff``.
    """
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if not 0.0 < unit_roundoff < 1.0:
        raise ValueError(f"unit_roundoff must lie in (0, 1), got {unit_roundoff}")
    ref = _require_tensor(ref, "ref")
    abs_sum = _require_tensor(abs_sum, "abs_sum")
    if ref.shape != abs_sum.shape:
        raise ValueError(
            f"ref has shape {tuple(ref.shape)} but abs_sum has shape {tuple(abs_sum.shape)}"
        )
    if bool((abs_sum < 0).any()):
        raise ValueError("abs_sum must be >= 0 (a sum of absolute products)")
    if k * unit_roundoff >= 0.5:
        raise ValueError(
            f"k = {k} is too large for a rounding-error bound with u = {unit_roundoff}"
        )

    def gamma(n: int, u: float) -> float:
        return n * u / (1 - n * u)

    a = abs(float(_scalar(alpha, "alpha", ref.device, positive=False)))
    s_bound = abs_sum.double() / (1 - gamma(k - 1, FP32_UNIT_ROUNDOFF))
    delta = (gamma(k, unit_roundoff) + gamma(k, FP32_UNIT_ROUNDOFF)) * a * s_bound
    if out_dtype == torch.float32:
        return delta
    return delta + _ulp(ref.double().abs() + delta, out_dtype) / 2


@dataclass(frozen=True)
class GemmCheck:
    """Summary of :func:`check_gemm`; the worst element is the one with the largest err / tol."""

    num_bad: int
    num_elements: int
    max_abs_err: float
    worst_ratio: float
    worst_index: tuple[int, ...]
    kernel_value: float
    reference_value: float
    tolerance: float

    def __str__(self) -> str:
        return (
            f"{self.num_bad}/{self.num_elements} elements outside tolerance; "
            f"max |err| {self.max_abs_err:.3e}; worst err/tol {self.worst_ratio:.3g} at "
            f"{self.worst_index}: kernel {self.kernel_value:.6e}, reference "
            f"{self.reference_value:.6e}, tol {self.tolerance:.3e}"
        )


def check_gemm(
    d_kernel: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    sf_vec_size: int,
    alpha: float | torch.Tensor = 1.0,
    *,
    unit_roundoff: float = FP32_UNIT_ROUNDOFF,
) -> tuple[bool, GemmCheck]:
    """Compare a kernel's output with :func:`reference_gemm` elementwise under
    :func:`gemm_tolerance`. The output dtype is ``d_kernel.dtype``; an infinity passes where the
    reference rounded to that dtype is the same infinity. NaN fails. Where the bound itself is
    not finite (the reference or its sum of absolute products overflowed fp32), only the
    reference's own value rounded to the output dtype passes.
    Returns ``(ok, GemmCheck)``.
    """
    d = _require_tensor(d_kernel, "d_kernel")
    if d.dtype not in OUT_DTYPES:
        raise ValueError(f"d_kernel must be bfloat16, float16 or float32, got {d.dtype}")
    ref = reference_gemm(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype=torch.float32)
    k = 2 * _packed_as_uint8(a, "a").shape[-1]
    abs_sum = abs_product_sum(a, b, sfa, sfb, sf_vec_size)
    return _check_against(d, ref, abs_sum, k, alpha, unit_roundoff)


def reference_gemm_w4a16(
    a: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    sf_vec_size: int,
    alpha: float | torch.Tensor = 1.0,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    accum_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """W4A16 (weight-only FP4): D = alpha * A @ dequant(B)^T, A bfloat16 / float16 activations
    [M, K] (or [L, M, K]), B packed FP4 [N, K/2] with unswizzled scales sfb, accumulated in
    ``accum_dtype``. Every product of a 16-bit activation (<= 11 significant bits) and a
    dequantized weight (<= 6) is exact in fp32 unless it underflows fp32 (activations below
    about 2^-100), so :func:`gemm_tolerance` holds unchanged for inputs in the usual range."""
    a = _require_tensor(a, "a")
    if a.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"a must be bfloat16 or float16 activations, got {a.dtype}")
    vec = _require_vec_size(sf_vec_size)
    b8, sb = _fp4_operand(b, sfb, vec, "b", "sfb")
    if a.ndim != b8.ndim or a.shape[-1] != 2 * b8.shape[-1] or a.shape[:-2] != b8.shape[:-2]:
        raise ValueError(
            f"a of shape {tuple(a.shape)} and b of shape {tuple(b8.shape)} (K/2 bytes per row) "
            "need the same rank, batch and K"
        )
    if a.device != b8.device:
        raise ValueError(f"a is on {a.device} but b is on {b8.device}")
    if out_dtype not in (*OUT_DTYPES, torch.float64):
        raise ValueError(
            f"out_dtype must be bfloat16, float16, float32 or float64, got {out_dtype}"
        )
    scale = _scalar(alpha, "alpha", a.device, positive=False).to(accum_dtype)
    db = _dequantize(b8, sb, vec, accum_dtype)
    return (torch.matmul(a.to(accum_dtype), db.transpose(-1, -2)) * scale).to(out_dtype)


def check_gemm_w4a16(
    d_kernel: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    sf_vec_size: int,
    alpha: float | torch.Tensor = 1.0,
    *,
    unit_roundoff: float = FP32_UNIT_ROUNDOFF,
) -> tuple[bool, GemmCheck]:
    """:func:`check_gemm` for W4A16: against :func:`reference_gemm_w4a16`, same bound."""
    d = _require_tensor(d_kernel, "d_kernel")
    if d.dtype not in OUT_DTYPES:
        raise ValueError(f"d_kernel must be bfloat16, float16 or float32, got {d.dtype}")
    ref = reference_gemm_w4a16(a, b, sfb, sf_vec_size, alpha, out_dtype=torch.float32)
    b8, sb = _fp4_operand(b, sfb, _require_vec_size(sf_vec_size), "b", "sfb")
    db = _dequantize(b8, sb, sf_vec_size, torch.float32).abs()
    abs_sum = torch.matmul(a.float().abs(), db.transpose(-1, -2))
    return _check_against(d, ref, abs_sum, a.shape[-1], alpha, unit_roundoff)


def _check_against(
    d: torch.Tensor,
    ref: torch.Tensor,
    abs_sum: torch.Tensor,
    k: int,
    alpha: float | torch.Tensor,
    unit_roundoff: float,
) -> tuple[bool, GemmCheck]:
    """``d`` against the fp32 reference ``ref`` under :func:`gemm_tolerance`."""
    if d.shape != ref.shape:
        raise ValueError(
            f"d_kernel has shape {tuple(d.shape)}, but the operands give {tuple(ref.shape)}"
        )
    if d.device != ref.device:
        raise ValueError(f"d_kernel is on {d.device} but the operands are on {ref.device}")
    tol = gemm_tolerance(k, d.dtype, ref, abs_sum, alpha, unit_roundoff=unit_roundoff)
    err = (d.double() - ref.double()).abs()
    exact = d == ref.to(d.dtype)
    # An infinity that matches the reference's own overflow in out_dtype counts as no error.
    err = torch.where(torch.isinf(d) & exact, 0.0, err).nan_to_num(nan=math.inf)
    # Without a finite bound only the reference's own value passes.
    unbounded_miss = ~torch.isfinite(tol) & ~exact
    ratio = torch.where(err == 0, 0.0, err / tol)
    ratio = torch.where(unbounded_miss, math.inf, ratio)
    bad = ~(err <= tol) | unbounded_miss
    flat = int(ratio.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(d.shape)))
    info = GemmCheck(
        num_bad=int(bad.sum()),
        num_elements=d.numel(),
        max_abs_err=float(err.max()),
        worst_ratio=float(ratio[index]),
        worst_index=index,
        kernel_value=float(d[index]),
        reference_value=float(ref[index]),
        tolerance=float(tol[index]),
    )
    return info.num_bad == 0, info


@dataclass(frozen=True)
class LibraryCheck:
    """Summary of :func:`check_gemm_or_library`: which rule held, and both errors."""

    passed: bool
    rule: str
    ours: GemmCheck
    library_max_abs_err: float | None

    def __str__(self) -> str:
        library = (
            "not available"
            if self.library_max_abs_err is None
            else f"max |err| {self.library_max_abs_err:.3e}"
        )
        return (
            f"{'PASS' if self.passed else 'FAIL'} ({self.rule}); ours: {self.ours}; "
            f"library: {library}"
        )


def check_gemm_or_library(
    d_kernel: torch.Tensor,
    d_library: torch.Tensor | None,
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    sf_vec_size: int,
    alpha: float | torch.Tensor = 1.0,
    *,
    unit_roundoff: float = FP32_UNIT_ROUNDOFF,
) -> tuple[bool, LibraryCheck]:
    """:func:`check_gemm`, with a second library's result (e.g. cuBLASLt's, alpha applied) as
    a second oracle for accumulators that round differently from fp32.

    :func:`gemm_tolerance` assumes exact products summed with fp32 rounding; how a tensor core
    adds inside one block-scaled MMA is not documented. The check passes when our error
    against :func:`reference_gemm` is within the derived bound (rule "derived bound"), or when
    our largest elementwise error is at most twice the library's largest elementwise error
    against the same reference (rule "within 2x the library's error"). The second rule is
    not used when either result has a NaN or an infinity the reference lacks.
    """
    ok, ours = check_gemm(d_kernel, a, b, sfa, sfb, sf_vec_size, alpha, unit_roundoff=unit_roundoff)
    library_err = None
    if d_library is not None:
        ref = reference_gemm(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype=torch.float32)
        if d_library.shape != ref.shape:
            raise ValueError(
                f"d_library has shape {tuple(d_library.shape)}, but the operands give "
                f"{tuple(ref.shape)}"
            )
        library_err = float((d_library.double() - ref.double()).abs().max())
        if math.isnan(library_err):
            library_err = math.inf
    if ok:
        return True, LibraryCheck(True, "derived bound", ours, library_err)
    if library_err is not None and math.isfinite(library_err) and math.isfinite(ours.max_abs_err):
        if ours.max_abs_err <= 2 * library_err:
            return True, LibraryCheck(True, "within 2x the library's error", ours, library_err)
    return False, LibraryCheck(False, "neither rule held", ours, library_err)


# ----------------------------------------------------------------------------- test inputs


@dataclass(frozen=True)
class FP4Operands:
    """Quantized GEMM inputs from :func:`make_fp4_operands` (all on one device).

    a [L, M, K/2] and b [L, N, K/2] uint8 (packed, K-major); sfa [L, M, K/vec] and
    sfb [L, N, K/vec] unswizzled scales; 0-dim float32 global scales (1.0 for MXFP4) and
    ``alpha = global_scale_a * global_scale_b`` (float32).
    """

    a: torch.Tensor
    b: torch.Tensor
    sfa: torch.Tensor
    sfb: torch.Tensor
    sf_vec_size: int
    global_scale_a: torch.Tensor
    global_scale_b: torch.Tensor
    alpha: torch.Tensor

    @property
    def gemm_args(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """``(a, b, sfa, sfb, sf_vec_size, alpha)``, for reference_gemm / check_gemm."""
        return self.a, self.b, self.sfa, self.sfb, self.sf_vec_size, self.alpha


def _random_real(
    shape: tuple[int, int, int], vec: int, dist: str, gen: torch.Generator
) -> torch.Tensor:
    if dist == "uniform":
        return torch.rand(shape, generator=gen) * 2 - 1
    x = torch.randn(shape, generator=gen)
    if dist == "wide":
        # every scale block gets its own power-of-two magnitude in 2^-8 .. 2^8
        exps = torch.randint(-8, 9, (*shape[:-1], shape[-1] // vec, 1), generator=gen)
        x = (x.unflatten(-1, (-1, vec)) * torch.exp2(exps.float())).flatten(-2)
    return x


def make_fp4_operands(
    m: int,
    n: int,
    k: int,
    l: int,  # noqa: E741 (the GEMM's batch extent is called L everywhere)
    sf_vec_size: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    dist: str = "normal",
) -> FP4Operands:
    """Random real A [L, M, K] and B [L, N, K], quantized with quantize_nvfp4 (sf_vec_size 16)
    or quantize_mxfp4 (32).

    The real data is drawn on the CPU from ``torch.Generator().manual_seed(seed)`` (the same on
    every device) and quantized on ``device``. ``dist``: "normal" (standard normal), "uniform"
    (on [-1, 1)) or "wide" (normal times a random power of two 2^-8..2^8 per scale block, so that
    block scales vary widely and a kernel that reads the wrong scale shows it).
    """
    vec = _require_vec_size(sf_vec_size)
    for name, v in (("m", m), ("n", n), ("k", k), ("l", l)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if k % vec:
        raise ValueError(f"k = {k} is not a multiple of sf_vec_size {vec}")
    if dist not in _DISTS:
        raise ValueError(f"dist must be one of {_DISTS}, got {dist!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    gen = torch.Generator().manual_seed(seed)
    xa = _random_real((l, m, k), vec, dist, gen).to(device)
    xb = _random_real((l, n, k), vec, dist, gen).to(device)
    if vec == NVFP4_BLOCK:
        a, sfa, gsa = quantize_nvfp4(xa)
        b, sfb, gsb = quantize_nvfp4(xb)
    else:
        (a, sfa), (b, sfb) = quantize_mxfp4(xa), quantize_mxfp4(xb)
        gsa = gsb = torch.ones((), dtype=torch.float32, device=a.device)
    return FP4Operands(a, b, sfa, sfb, vec, gsa, gsb, gsa * gsb)
