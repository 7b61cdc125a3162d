# SPDX-License-Identifier: BSD-3-Clause
"""The CPU implementation of the ops: quantize, dequantize and the GEMMs in torch.

Quantization follows the formats' definition (NVFP4: E4M3 block scale of amax / 6 / global
scale, round to nearest even; MXFP4: the smallest power of two that keeps amax / scale <= 6);
the GEMMs dequantize each operand once to fp32 (a 256-entry table per byte: both nibbles at
once) and run one matmul, as the GPU kernels' exact products and fp32 sums do. The tests hold
all of it against ``reference.py``, bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp4_ops.layout import E2M1_MAX, GLOBAL_SCALE_DIVISOR, from_blocked, pack_fp4, to_blocked

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# rounding thresholds between neighbouring magnitudes; at a tie the even code (index) wins
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E8M0_BIAS = 127
_BYTE_TABLES: dict = {}


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2] float32: the two E2M1 values of every byte, low nibble first."""
    if device not in _BYTE_TABLES:
        values = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), dtype=torch.float32)
        byte = torch.arange(256)
        _BYTE_TABLES[device] = torch.stack((values[byte & 0xF], values[byte >> 4]), 1).to(device)
    return _BYTE_TABLES[device]


def dequantize(data: torch.Tensor, scales: torch.Tensor, sf_vec_size: int) -> torch.Tensor:
    """e2m1 * block scale in float32 (exact): packed [..., rows, K/2], plain scales
    [..., rows, K/V] -> [..., rows, K]."""
    # (embedding takes int32 indices: half the index bytes of a long gather; the scales
    # multiply in place)
    values = F.embedding(data.view(torch.uint8).int(), _byte_table(data.device)).flatten(-2)
    values.unflatten(-1, (-1, sf_vec_size)).mul_(scales.float().unsqueeze(-1))
    return values


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Round float32 values to E2M1 codes (uint8): nearest, ties to the even code, saturating
    at 6; the sign bit follows y's (so -0.0 gives 0x8)."""
    mids = torch.tensor(_MIDPOINTS, dtype=y.dtype, device=y.device)
    mag = y.abs()
    below = torch.bucketize(mag, mids, right=False)  # midpoints strictly below |y|
    # a tie sits on midpoint `below`, between codes below and below + 1: the even one wins
    tie = (below < len(_MIDPOINTS)) & (mag == mids[below.clamp(max=len(_MIDPOINTS) - 1)])
    code = torch.where(tie & (below % 2 == 1), below + 1, below)
    return code.to(torch.uint8) | (torch.signbit(y).to(torch.uint8) << 3)


def _encode(blocks: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """Packed codes of blocks [..., n, V] / divisor [..., n]; zero-divisor blocks give zeros
    that keep each element's sign."""
    live = divisor > 0
    d = torch.where(live, divisor, torch.ones_like(divisor)).unsqueeze(-1)
    y = torch.where(live.unsqueeze(-1), blocks / d, blocks * 0.0)
    return pack_fp4(_e2m1_codes(y).flatten(-2))


def _finite_float(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        raise ValueError("x contains NaN or Inf, which FP4 cannot encode")
    return xf


def dynamic_global_scale(xf: torch.Tensor) -> torch.Tensor:
    """amax / (448 * 6) of a float32 tensor, 1.0 where that is 0 (a 0-d tensor)."""
    return global_scales_of_amax(xf.abs().amax())


def global_scales_of_amax(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 global scales of float32 amaxes: amax / (448 * 6) in float32, 1.0 where that is 0
    (an all-zero tensor, or an amax so small that the quotient underflows)."""
    gs = amax / torch.tensor(GLOBAL_SCALE_DIVISOR, dtype=torch.float32)
    return torch.where(gs > 0, gs, torch.ones_like(gs))


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None):
    """(packed uint8 [..., K/2], blocked E4M3 scales, 0-d fp32 global scale) of x [..., K]."""
    xf = _finite_float(x)
    gs = dynamic_global_scale(xf) if global_scale is None else global_scale.float().reshape(())
    blocks = xf.unflatten(-1, (-1, 16))
    amax = blocks.abs().amax(dim=-1)
    six = torch.tensor(E2M1_MAX, dtype=torch.float32)
    scales = (amax / six / gs).clamp(max=448.0).to(torch.float8_e4m3fn)
    data = _encode(blocks, scales.float() * gs)
    return data, to_blocked(scales), gs.clone()


def quantize_mxfp4(x: torch.Tensor):
    """(packed uint8 [..., K/2], blocked E8M0 scales, 0-d fp32 1.0) of x [..., K]."""
    blocks = _finite_float(x).unflatten(-1, (-1, 32))
    amax = blocks.abs().amax(dim=-1)
    # the smallest e with amax <= 6 * 2^e: frexp of amax / 6 (exact in float64)
    mantissa, exponent = torch.frexp(amax.double() / E2M1_MAX)
    exponent = exponent - (mantissa == 0.5).int()
    exponent = torch.where(amax > 0, exponent, -_E8M0_BIAS).clamp(-_E8M0_BIAS, _E8M0_BIAS)
    scales = (exponent + _E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
    data = _encode(blocks, scales.float())
    return data, to_blocked(scales), torch.ones((), dtype=torch.float32)


def check_scales(scales: torch.Tensor) -> None:
    """ValueError for scale bytes that no kernel gives a meaning: an E4M3 with the sign bit set
    (the MMA's scales are unsigned) or a NaN encoding (E4M3 0x7F, E8M0 0xFF)."""
    bits = scales.view(torch.uint8)
    if scales.dtype == torch.float8_e4m3fn:
        if bool((bits & 0x80).any()):
            raise ValueError("an E4M3 block scale has its sign bit set; NVFP4 scales are unsigned")
        nan = 0x7F
    else:
        nan = 0xFF
    if bool((bits == nan).any()):
        raise ValueError("a block scale is a NaN encoding; every block scale must be a number")


def plain_operand(data, blocked_scales, sf_vec_size: int) -> torch.Tensor:
    """Float32 e2m1 * scale of a packed operand [..., rows, K/2] with blocked scales (flat, or
    shaped by atoms)."""
    rows, k = data.shape[-2], 2 * data.shape[-1]
    check_scales(blocked_scales)
    flat = blocked_scales.reshape(*data.shape[:-2], -1)
    return dequantize(data, from_blocked(flat, rows, k // sf_vec_size), sf_vec_size)


def gemm(a_data, a_scale, b_data, b_scale, alpha, sf_vec_size: int, out_dtype) -> torch.Tensor:
    """W4A4: alpha * dequant(a) @ dequant(b)^T, fp32 products and sums, cast to out_dtype."""
    da = plain_operand(a_data, a_scale, sf_vec_size)
    db = plain_operand(b_data, b_scale, sf_vec_size)
    return (torch.matmul(da, db.transpose(-1, -2)) * alpha).to(out_dtype)


def gemm_w4a16(a, b_data, b_scale, alpha, sf_vec_size: int, out_dtype) -> torch.Tensor:
    """W4A16: alpha * a @ dequant(b)^T for 16-bit activations a, fp32 sums."""
    db = plain_operand(b_data, b_scale, sf_vec_size)
    return (torch.matmul(a.float(), db.transpose(-1, -2)) * alpha).to(out_dtype)


def gemm_dequantized(a_data, a_scale, weight, alpha, sf_vec_size: int, out_dtype) -> torch.Tensor:
    """``gemm`` with the weight dequantized beforehand (float32 [N, K], ``plain_operand``)."""
    da = plain_operand(a_data, a_scale, sf_vec_size)
    return (torch.matmul(da, weight.transpose(-1, -2)) * alpha).to(out_dtype)


def gemm_w4a16_dequantized(a, weight, alpha, out_dtype) -> torch.Tensor:
    """``gemm_w4a16`` with the weight dequantized beforehand (float32 [N, K])."""
    return (torch.matmul(a.float(), weight.transpose(-1, -2)) * alpha).to(out_dtype)
