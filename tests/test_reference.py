"""Tests for reference.py: E2M1 rounding and packing, the 128x4 scale layout, NVFP4 / MXFP4
quantization error, the reference GEMM and its tolerance, test-input generation and validation.

The expected values come from independent formulations (brute-force nearest-value search,
Python index loops, float64 arithmetic), not from re-running reference.py's own code paths.
"""

from __future__ import annotations

import math

import pytest
import torch

import reference as R

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
REAL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FORMATS = {"nvfp4": 16, "mxfp4": 32}


# ----------------------------------------------------------------------------- independent oracles


def nearest_e2m1_code(v: float) -> int:
    """Brute force: the grid point closest to |v|, ties to the even index; sign bit from v."""
    mag = abs(v)
    dist = [abs(mag - g) for g in E2M1_GRID]
    best = min(dist)
    index = min(i for i, d in enumerate(dist) if d == best and (i % 2 == 0 or dist.count(d) == 1))
    return index | (8 if math.copysign(1.0, v) < 0 else 0)


# Decoders written from the format definitions (sign, exponent and mantissa bit fields), sharing
# nothing with reference.py or torch's float8 casts.


def e2m1_value(code: int) -> float:
    """E2M1: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 is subnormal."""
    exp, man = (code >> 1) & 0x3, code & 0x1
    mag = man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1)
    return -mag if code & 0x8 else mag


def e4m3_value(bits: int) -> float:
    """E4M3 (fn): bit 7 sign, bits 6-3 exponent (bias 7), bits 2-0 mantissa; no Inf, S.1111.111
    is NaN; exponent 0 is subnormal (man / 8 * 2^-6)."""
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    mag = man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
    return -mag if bits & 0x80 else mag


def e8m0_value(bits: int) -> float:
    """E8M0: an unsigned biased exponent, 2^(bits - 127); 0xFF is NaN."""
    return math.nan if bits == 0xFF else 2.0 ** (bits - 127)


E2M1_TABLE = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
SCALE_TABLES = {
    16: torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64),
    32: torch.tensor([e8m0_value(b) for b in range(256)], dtype=torch.float64),
}


def decode64(packed: torch.Tensor, scales: torch.Tensor, vec: int) -> torch.Tensor:
    """float64 e2m1 * scale from packed bytes (element 2i in the low nibble) and raw scale bits."""
    p = packed.view(torch.uint8).cpu().long()
    codes = torch.empty((*p.shape[:-1], 2 * p.shape[-1]), dtype=torch.long)
    codes[..., 0::2] = p % 16
    codes[..., 1::2] = p // 16
    scale = SCALE_TABLES[vec][scales.view(torch.uint8).cpu().long()]
    return E2M1_TABLE[codes] * scale.repeat_interleave(vec, dim=-1)


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, scales, global scale) for either format; MXFP4's global scale is 1."""
    if fmt == "nvfp4":
        return R.quantize_nvfp4(x)
    packed, scales = R.quantize_mxfp4(x)
    return packed, scales, torch.tensor(1.0)


def grid_gap(y: torch.Tensor) -> torch.Tensor:
    """Spacing of the E2M1 grid around |y| (|y| <= 6): 0.5 below 2, 1 below 4, else 2."""
    a = y.abs()
    return torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).double()


def per_element_bound(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize-dequantize x; return (|error|, derived bound), both float64.

    With d = scale * global_scale and y = x / d, rounding y to the grid errs by at most half the
    grid gap, so |x^ - x| <= d * gap(y) / 2. NVFP4 alone can have |y| > 6: the E4M3 scale s was
    rounded below s* = amax_block / 6 / gs, and the clipped error is |x| - 6 d <=
    6 gs (s* - s); for a normal E4M3 scale s >= s* (1 - 2^-4), so this is <= 0.4 d, inside the top
    gap's half step, but subnormal (or zero) scales round further. Two fp32 roundings (x / d and
    the final * gs) add at most 2^-23 relative each: the slack term.
    """
    vec = FORMATS[fmt]
    packed, scales, gs = quantize(x, fmt)
    xhat = R.dequantize_fp4(packed, scales, vec, gs).double()
    x64 = x.double()
    s = scales.float().double()
    g = gs.double()
    d = (s * g).repeat_interleave(vec, dim=-1)
    y = torch.where(d > 0, x64 / d.clamp(min=1e-300), math.inf)
    if fmt == "mxfp4":
        assert bool((y.abs() <= 6).all()), "an MXFP4 scale clipped"
    s_true = x64.abs().unflatten(-1, (-1, vec)).amax(-1) / 6 / g
    clip = (6 * g * (s_true - s).clamp(min=0)).repeat_interleave(vec, dim=-1)
    bound = torch.where(y.abs() <= 6, d * grid_gap(y.clamp(-6, 6)) / 2, clip)
    slack = 2.0**-21 * (x64.abs() + xhat.abs())
    return (xhat - x64).abs(), bound + slack


def sqnr_db(x: torch.Tensor, noise_power: torch.Tensor) -> float:
    return 10 * math.log10(float((x.double() ** 2).sum()) / float(noise_power.sum()))


def real_data(shape: tuple[int, ...], dist: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dist == "uniform":
        return torch.rand(shape, generator=gen) * 2 - 1
    x = torch.randn(shape, generator=gen)
    if dist == "wide":  # a power of two 2^-8..2^8 per 16 elements
        e = torch.randint(-8, 9, (*shape[:-1], shape[-1] // 16, 1), generator=gen).float()
        x = (x.unflatten(-1, (-1, 16)) * torch.exp2(e)).flatten(-2)
    return x


def blocked_reference(data: list[list[int]], rows: int, cols: int) -> list[int]:
    """The 128x4 layout written as a loop over elements, straight from its definition."""
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    out = [0] * (rp * cp)
    for r in range(rows):
        for c in range(cols):
            atom = (r // 128) * (cp // 4) + c // 4
            out[atom * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4] = data[r][c]
    return out


def bump(t: torch.Tensor, steps: int) -> torch.Tensor:
    """Step positive floats by ``steps`` units in the last place of their own dtype."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return (t.view(ints) + steps).view(t.dtype)


# ----------------------------------------------------------------------------- E2M1


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.0, 0x0),
        (-0.0, 0x8),
        (0.1, 0x0),
        (-0.1, 0x8),
        (0.25, 0x0),  # tie 0 | 0.5 -> 0
        (-0.25, 0x8),
        (0.2500001, 0x1),
        (0.5, 0x1),
        (0.7499999, 0x1),
        (0.75, 0x2),  # tie 0.5 | 1 -> 1
        (1.0, 0x2),
        (1.25, 0x2),  # tie 1 | 1.5 -> 1
        (1.2500001, 0x3),
        (1.5, 0x3),
        (1.75, 0x4),  # tie 1.5 | 2 -> 2
        (-1.75, 0xC),
        (2.5, 0x4),  # tie 2 | 3 -> 2
        (2.75, 0x5),
        (3.0, 0x5),
        (3.5, 0x6),  # tie 3 | 4 -> 4
        (4.99, 0x6),
        (5.0, 0x6),  # tie 4 | 6 -> 4
        (5.01, 0x7),
        (6.0, 0x7),
        (6.5, 0x7),  # saturates
        (1e30, 0x7),
        (-1e30, 0xF),
        (math.inf, 0x7),
        (-math.inf, 0xF),
    ],
)
def test_e2m1_hand_picked(value: float, code: int) -> None:
    got = R.fp32_to_e2m1(torch.tensor([value], dtype=torch.float32))
    assert got.dtype == torch.uint8
    assert int(got[0]) == code


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_e2m1_matches_brute_force_nearest(dtype: torch.dtype) -> None:
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=dtype)
    probes = torch.cat(
        [
            mids,
            bump(mids, 1),
            bump(mids, -1),
            torch.tensor(E2M1_GRID, dtype=dtype),
            torch.linspace(0, 7, 1401).to(dtype),
        ]
    )
    x = torch.cat([probes, -probes])
    expected = [nearest_e2m1_code(float(v)) for v in x]
    assert R.fp32_to_e2m1(x).tolist() == expected


def test_e2m1_decode_table_and_round_trip() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = R.e2m1_to_fp32(codes)
    assert values.dtype == torch.float32
    assert values.tolist() == list(E2M1_GRID) + [-g for g in E2M1_GRID]
    assert bool(torch.signbit(values[8])) and not bool(torch.signbit(values[0]))
    assert torch.equal(R.fp32_to_e2m1(values), codes)


def test_independent_decoders_agree_with_the_grid_and_torch() -> None:
    # The bit-field decoders that the GEMM tests use as their oracle: E2M1 against the value list,
    # E4M3 / E8M0 against torch's float8 casts (a second, independent implementation).
    assert E2M1_TABLE.tolist() == list(E2M1_GRID) + [-g for g in E2M1_GRID]
    assert torch.equal(R.e2m1_to_fp32(torch.arange(16, dtype=torch.uint8)).double(), E2M1_TABLE)
    bits = torch.arange(256, dtype=torch.uint8)
    for vec, dtype in ((16, torch.float8_e4m3fn), (32, torch.float8_e8m0fnu)):
        torch_values = bits.view(dtype).double()
        torch.testing.assert_close(SCALE_TABLES[vec], torch_values, rtol=0, atol=0, equal_nan=True)
    assert e4m3_value(0x7E) == 448.0 and e4m3_value(0x01) == 2.0**-9
    assert e8m0_value(0) == 2.0**-127 and e8m0_value(254) == 2.0**127


# ----------------------------------------------------------------------------- packing


def test_pack_nibble_order() -> None:
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x8], [0x7, 0x0, 0x0, 0x9]], dtype=torch.uint8)
    packed = R.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x8F], [0x07, 0x90]]
    assert torch.equal(R.unpack_fp4(packed), codes)


@pytest.mark.parametrize("shape", [(1, 2), (3, 64), (2, 5, 32)])
def test_pack_unpack_round_trip(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)
    packed = R.pack_fp4(codes)
    assert packed.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(R.unpack_fp4(packed), codes)
    assert torch.equal(R.unpack_fp4(packed.view(torch.float4_e2m1fn_x2)), codes)
    assert torch.equal(R.pack_fp4(R.unpack_fp4(packed)), packed)


def test_float4_e2m1fn_x2_agrees_with_torch() -> None:
    """torch.float4_e2m1fn_x2 is a shell dtype (no casts; pytorch issue 146414): a byte of two
    E2M1 codes. torch writes its nibble order and shape down in its ONNX exporter (FLOAT4E2M1);
    the values it means are checked by test_torch_scaled_mm_agrees on a B200."""
    try:
        from torch.onnx._internal.exporter._type_casting import (
            get_float4_shape,
            unpack_float4x2_as_uint8,
        )
    except ImportError as exc:
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2 unpacking helper: {exc}")
    gen = torch.Generator().manual_seed(18)
    codes = torch.randint(0, 16, (3, 5, 40), generator=gen, dtype=torch.uint8)
    fp4 = R.pack_fp4(codes).view(torch.float4_e2m1fn_x2)
    assert fp4.element_size() == 1 and fp4.shape == (3, 5, 20)
    assert get_float4_shape(fp4) == codes.shape
    assert unpack_float4x2_as_uint8(fp4).tolist() == codes.tolist()
    assert torch.equal(R.unpack_fp4(fp4), codes)


def test_float4_views_accepted_everywhere() -> None:
    ops = R.make_fp4_operands(8, 8, 64, 1, 16, seed=3)
    a4, b4 = ops.a.view(torch.float4_e2m1fn_x2), ops.b.view(torch.float4_e2m1fn_x2)
    assert torch.equal(
        R.dequantize_fp4(a4, ops.sfa, 16, ops.global_scale_a),
        R.dequantize_fp4(ops.a, ops.sfa, 16, ops.global_scale_a),
    )
    d_u8 = R.reference_gemm(*ops.gemm_args, out_dtype=torch.float32)
    d_f4 = R.reference_gemm(a4, b4, ops.sfa, ops.sfb, 16, ops.alpha, out_dtype=torch.float32)
    assert torch.equal(d_u8, d_f4)


# ----------------------------------------------------------------------------- 128x4 layout


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 300])
@pytest.mark.parametrize("cols", [1, 3, 4, 5, 9])
def test_to_blocked_matches_index_loop(rows: int, cols: int) -> None:
    data = torch.arange(1, rows * cols + 1, dtype=torch.int32).reshape(rows, cols)
    blocked = R.to_blocked(data)
    assert blocked.ndim == 1
    assert blocked.tolist() == blocked_reference(data.tolist(), rows, cols)
    assert torch.equal(R.from_blocked(blocked, rows, cols), data)


@pytest.mark.parametrize("scale_dtype", [torch.float8_e4m3fn, torch.float8_e8m0fnu], ids=str)
@pytest.mark.parametrize(("rows", "cols"), [(129, 5), (300, 9), (1, 1)])
def test_to_blocked_fp8_batched_round_trip(scale_dtype: torch.dtype, rows: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(2)
    raw = torch.randint(1, 120, (3, rows, cols), generator=gen, dtype=torch.uint8)
    scales = raw.view(scale_dtype)
    blocked = R.to_blocked(scales)
    assert blocked.dtype == scale_dtype
    assert blocked.shape == (3, -(-rows // 128) * 128 * -(-cols // 4) * 4)
    for i in range(3):
        expected = blocked_reference(raw[i].tolist(), rows, cols)
        assert blocked[i].view(torch.uint8).tolist() == expected
    back = R.from_blocked(blocked, rows, cols)
    assert back.dtype == scale_dtype
    assert torch.equal(back.view(torch.uint8), raw)


# ----------------------------------------------------------------------------- quantization


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("magnitude", [1e-30, 1.0, 1e30])
@pytest.mark.parametrize("dist", ["normal", "uniform", "wide"])
def test_quantization_error_within_half_step(fmt: str, magnitude: float, dist: str) -> None:
    x = real_data((2, 8, 256), dist) * magnitude
    err, bound = per_element_bound(x, fmt)
    worst = float((err / bound).max())
    assert worst <= 1.0, f"error reaches {worst:.3f} of the derived bound"


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantization_exact_on_representable_values(fmt: str) -> None:
    # Each block holds grid values times one scale that the scale format represents exactly, and
    # a +-6 so that amax / 6 is exactly that scale: decoding must give x back bit for bit.
    vec = FORMATS[fmt]
    if fmt == "nvfp4":
        block_scales = [2.0**-9, 0.375, 1.0, 13.0, 448.0]
    else:
        block_scales = [2.0**-127, 2.0**-3, 1.0, 2.0**100]
    gen = torch.Generator().manual_seed(4)
    grid = torch.tensor(E2M1_GRID + tuple(-g for g in E2M1_GRID))
    blocks = grid[torch.randint(0, 16, (len(block_scales), vec), generator=gen)]
    blocks[:, 0] = torch.tensor([6.0, -6.0] * 3)[: len(block_scales)]
    x = (blocks * torch.tensor(block_scales).unsqueeze(-1)).reshape(1, -1)
    if fmt == "nvfp4":
        packed, scales, gs = R.quantize_nvfp4(x, global_scale=1.0)
        assert float(gs) == 1.0
    else:
        packed, scales = R.quantize_mxfp4(x)
        gs = 1.0
    assert scales.float().flatten().tolist() == block_scales
    assert torch.equal(R.dequantize_fp4(packed, scales, vec, gs), x)


def test_nvfp4_block_scale_is_nearest_e4m3() -> None:
    # Oracle: the E4M3 value nearest to min(amax / 6 / gs, 448), ties to the even encoding,
    # searched over all 127 finite non-negative E4M3 values.
    x = real_data((4, 512), "wide", seed=5)
    _, scales, gs = R.quantize_nvfp4(x)
    table = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    target = (x.double().abs().unflatten(-1, (-1, 16)).amax(-1) / 6 / float(gs)).clamp(max=448)
    dist = (table - target.reshape(-1, 1)).abs()
    best = dist.min(dim=1, keepdim=True).values
    candidates = torch.where(dist <= best * (1 + 1e-12), torch.arange(127), 1000)
    even = torch.where(candidates % 2 == 0, candidates, 1000).min(dim=1).values
    pick = torch.where(even < 1000, even, candidates.min(dim=1).values)
    assert scales.view(torch.uint8).flatten().tolist() == pick.tolist()
    assert float(gs) == pytest.approx(float(x.abs().max()) / 2688, rel=2**-23)


def test_mxfp4_scale_is_smallest_non_clipping_power_of_two() -> None:
    x = real_data((4, 512), "wide", seed=6)
    _, scales = R.quantize_mxfp4(x)
    amax = x.double().abs().unflatten(-1, (-1, 32)).amax(-1)
    s = scales.float().double()
    assert bool((amax <= 6 * s).all()), "a scale clips"
    assert bool((amax > 3 * s).all()), "half the scale would not clip"


@pytest.mark.parametrize(
    ("amax", "exponent"),
    [
        (6.0, 0),
        (float(bump(torch.tensor(6.0), 1)), 1),
        (3.0, -1),
        (float(bump(torch.tensor(3.0), 1)), 0),
        (7.0, 1),
        (12.0, 1),
        (float(bump(torch.tensor(12.0), 1)), 2),
        (0.75, -3),
        (3e38, 126),
        (6 * 2.0**-127, -127),
        (1e-40, -127),  # below 2^-127 * 6: clamped
        (0.0, -127),  # all-zero block: E8M0 bits 0x00
    ],
)
def test_mxfp4_scale_exponent(amax: float, exponent: int) -> None:
    x = torch.zeros(1, 32)
    x[0, 7] = -amax
    packed, scales = R.quantize_mxfp4(x)
    assert int(scales.view(torch.uint8)[0, 0]) == exponent + 127
    assert float(scales.float()[0, 0]) == 2.0**exponent
    assert int(R.unpack_fp4(packed)[0, 7]) == nearest_e2m1_code(-amax / 2.0**exponent)


@pytest.mark.parametrize(
    ("fmt", "dist", "floor_db"),
    [
        # seeds 7..16 of these 2^16 values measured 20.40-20.47, 18.72-18.80, 19.83-19.88 and
        # 20.06-20.14 dB: a seed-to-seed spread under 0.1 dB, so 1 dB below is a wide margin.
        ("nvfp4", "normal", 19.4),
        ("mxfp4", "normal", 17.7),
        ("nvfp4", "uniform", 18.8),
        ("mxfp4", "uniform", 19.0),
    ],
)
def test_sqnr(fmt: str, dist: str, floor_db: float) -> None:
    """SQNR on 128 x 512 random values, checked three ways.

    * Guaranteed: each |error| <= its bound (above), so SQNR >= 10 log10(sum x^2 / sum bound^2)
      (about 14-15 dB: the worst case puts every error at its extreme).
    * Model: rounding errors spread uniformly over +-half a step have mean square (d gap)^2 / 12;
      the measurement must be no more than 1 dB below that prediction (it measured -0.03 to
      +1.14 dB from it: block maxima and values that round to 0 err less than the model says).
    * Regression floor: ~1 dB under the values measured when this test was written.
    """
    vec = FORMATS[fmt]
    x = real_data((128, 512), dist, seed=7)
    packed, scales, gs = quantize(x, fmt)
    xhat = R.dequantize_fp4(packed, scales, vec, gs).double()
    measured = sqnr_db(x, (xhat - x.double()) ** 2)
    err, bound = per_element_bound(x, fmt)
    d = (scales.float().double() * gs.double()).repeat_interleave(vec, dim=-1)
    model = sqnr_db(x, (d * grid_gap((x.double() / d).clamp(-6, 6))) ** 2 / 12)
    assert measured >= sqnr_db(x, bound**2)
    assert measured >= model - 1.0
    assert measured >= floor_db


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_blocks(fmt: str) -> None:
    vec = FORMATS[fmt]
    x = real_data((2, 4, 4 * vec), "normal", seed=8)
    x[0, 1, :vec] = 0.0
    x[1, 3, 2 * vec : 3 * vec] = -0.0
    packed, scales, gs = quantize(x, fmt)
    codes = R.unpack_fp4(packed)
    zero_scale = 0.0 if fmt == "nvfp4" else 2.0**-127
    for (batch, row, blk), sign in (((0, 1, 0), 0x0), ((1, 3, 2), 0x8)):
        assert float(scales[batch, row, blk].float()) == zero_scale
        assert codes[batch, row, blk * vec : (blk + 1) * vec].tolist() == [sign] * vec
    xhat = R.dequantize_fp4(packed, scales, vec, gs)
    assert bool(torch.isfinite(xhat).all())
    assert xhat[0, 1, :vec].tolist() == [0.0] * vec
    assert bool((xhat[1, 3, 2 * vec : 3 * vec] == 0).all())


@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_tensor(fmt: str) -> None:
    vec = FORMATS[fmt]
    x = torch.zeros(3, 2 * vec)
    packed, scales, gs = quantize(x, fmt)
    assert float(gs) == 1.0
    assert packed.tolist() == [[0] * vec] * 3
    assert scales.view(torch.uint8).tolist() == [[0, 0]] * 3  # e4m3 0.0 / e8m0 2^-127
    assert R.dequantize_fp4(packed, scales, vec, gs).tolist() == x.tolist()


def test_nvfp4_scale_clamps_to_448_and_saturates() -> None:
    # A global scale far too small asks for block scales past E4M3's 448: clamp, then saturate.
    x = torch.tensor([[1.0, -2.0, 0.5] + [0.0] * 13])
    packed, scales, gs = R.quantize_nvfp4(x, global_scale=1e-6)
    assert float(scales.float()[0, 0]) == 448.0
    d = 448.0 * float(torch.tensor(1e-6))
    expected = [nearest_e2m1_code(float(v) / d) for v in x[0]]
    assert R.unpack_fp4(packed)[0].tolist() == expected
    assert R.unpack_fp4(packed)[0, :2].tolist() == [0x7, 0xF]
    assert bool(torch.isfinite(R.dequantize_fp4(packed, scales, 16, gs)).all())


def test_nvfp4_scale_underflow_gives_zero_codes() -> None:
    # With a huge global scale the block scale rounds to 0 in E4M3: zero codes, never NaN.
    x = torch.tensor([[1.0, -2.0] + [0.25] * 14])
    packed, scales, gs = R.quantize_nvfp4(x, global_scale=1e6)
    assert float(scales.float()[0, 0]) == 0.0
    assert R.unpack_fp4(packed)[0].tolist() == [0x0, 0x8] + [0x0] * 14
    assert R.dequantize_fp4(packed, scales, 16, gs)[0].abs().max() == 0


def test_nvfp4_global_scale_is_correctly_rounded() -> None:
    # amax / 2688 rounded once to float32 (a multiplication by the rounded reciprocal is often
    # one ulp off), the float64 quotient rounded to float32 as the independent value.
    gen = torch.Generator().manual_seed(24)
    for _ in range(64):
        x = torch.randn(4, 64, generator=gen) * 100
        _, _, gs = R.quantize_nvfp4(x)
        assert float(gs) == float((x.abs().max().double() / 2688).float())


def test_nvfp4_global_scale_spans_batches() -> None:
    x = real_data((3, 4, 32), "normal", seed=9)
    x[2] *= 100
    _, scales, gs = R.quantize_nvfp4(x)
    assert gs.shape == () and gs.dtype == torch.float32
    assert float(gs) == pytest.approx(float(x.abs().max()) / 2688, rel=2**-23)
    assert float(scales.float().max()) == 448.0


# ----------------------------------------------------------------------------- GEMM


def gemm_dist(out_dtype: torch.dtype) -> str:
    """Widely varying block scales, except where they would overflow float16's 65504."""
    return "normal" if out_dtype == torch.float16 else "wide"


GEMM_SHAPES = [(None, 5, 7, 64), (1, 16, 9, 128), (3, 33, 17, 96)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("alpha", [1.0, -0.37], ids=["alpha", "alpha*-0.37"])
def test_reference_gemm_matches_float64(
    fmt: str, out_dtype: torch.dtype, shape: tuple, alpha: float
) -> None:
    batch, m, n, k = shape
    vec = FORMATS[fmt]
    ops = R.make_fp4_operands(m, n, k, batch or 1, vec, seed=10, dist=gemm_dist(out_dtype))
    a, b, sfa, sfb = ops.a, ops.b, ops.sfa, ops.sfb
    if batch is None:
        a, b, sfa, sfb = a[0], b[0], sfa[0], sfb[0]
    # alpha = gs_a * gs_b (NVFP4; 1 for MXFP4) times the factor, once as a float, once a tensor
    alpha_arg = float(ops.alpha) if alpha == 1.0 else ops.alpha * alpha
    d = R.reference_gemm(a, b, sfa, sfb, vec, alpha_arg, out_dtype=out_dtype)
    assert d.dtype == out_dtype
    assert d.shape == ((m, n) if batch is None else (batch, m, n))

    a64, b64 = decode64(a, sfa, vec), decode64(b, sfb, vec)
    alpha32 = float(alpha_arg)  # already float32-exact
    exact = alpha32 * (a64 @ b64.transpose(-1, -2))
    abs_sum = a64.abs() @ b64.abs().transpose(-1, -2)
    tol = R.gemm_tolerance(k, out_dtype, exact, abs_sum, alpha32)
    assert bool(((d.double() - exact).abs() <= tol).all())

    # float64 accumulation: only float64 summation-order differences remain
    d64 = R.reference_gemm(a, b, sfa, sfb, vec, alpha_arg, torch.float64, accum_dtype=torch.float64)
    assert bool(((d64 - exact).abs() <= 2 * k * 2.0**-53 * abs(alpha32) * abs_sum).all())


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_gemm_hand_computed(fmt: str) -> None:
    # a = [1, 0.5, 0, ...] * 2 in block 0 and [-6, 0, ...] * 0.25 in block 1;
    # b0 = 1.5 * 4 everywhere, b1 = -b0. a . b0 = (2 + 1 - 1.5) * 6 = 9; alpha 0.5 -> 4.5.
    vec = FORMATS[fmt]
    a_codes = torch.zeros(1, 2 * vec, dtype=torch.uint8)
    a_codes[0, 0], a_codes[0, 1], a_codes[0, vec] = 0x2, 0x1, 0xF
    b_codes = torch.tensor([[0x3] * 2 * vec, [0xB] * 2 * vec], dtype=torch.uint8)
    sfa = torch.tensor([[2.0, 0.25]]).to(R.SCALE_DTYPES[vec])
    sfb = torch.full((2, 2), 4.0).to(R.SCALE_DTYPES[vec])
    a, b = R.pack_fp4(a_codes), R.pack_fp4(b_codes)
    d = R.reference_gemm(a, b, sfa, sfb, vec, 0.5, torch.float32)
    assert d.tolist() == [[4.5, -4.5]]
    d = R.reference_gemm(a.unsqueeze(0), b.unsqueeze(0), sfa[None], sfb[None], vec)
    assert d.dtype == torch.bfloat16 and d.float().tolist() == [[[9.0, -9.0]]]


def test_reference_gemm_float64_holds_extreme_mxfp4_scales() -> None:
    # 6 x 2^127 overflows float32 but not float64: float64 accumulation must dequantize in
    # float64. Each product is 6 x 2^127 x 0.5 x 2^-127 = 3, so D = 32 x 3.
    a = R.pack_fp4(torch.full((1, 32), 0x7, dtype=torch.uint8))  # all 6
    b = R.pack_fp4(torch.full((1, 32), 0x1, dtype=torch.uint8))  # all 0.5
    sfa = torch.full((1, 1), 254, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # 2^127
    sfb = torch.full((1, 1), 0, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # 2^-127
    exact = decode64(a, sfa, 32) @ decode64(b, sfb, 32).T
    assert exact.tolist() == [[96.0]]
    d = R.reference_gemm(a, b, sfa, sfb, 32, 1.0, torch.float64, accum_dtype=torch.float64)
    assert d.tolist() == [[96.0]]


def test_reference_gemm_rounds_alpha_to_float32() -> None:
    # A kernel's epilogue gets alpha as a float32: 0.1 becomes 13421773 x 2^-27, also when the
    # reference accumulates in float64; 1e39 has no float32 value at all.
    ops = R.make_fp4_operands(4, 3, 64, 1, 16, seed=23)
    product = decode64(ops.a, ops.sfa, 16) @ decode64(ops.b, ops.sfb, 16).transpose(-1, -2)
    alpha32 = 13421773 * 2.0**-27
    assert abs(alpha32 - 0.1) < 2.0**-28  # the float32 nearest 0.1
    for alpha in (0.1, torch.tensor(0.1, dtype=torch.float64)):
        d = R.reference_gemm(*ops.gemm_args[:5], alpha, torch.float64, accum_dtype=torch.float64)
        assert torch.allclose(d, alpha32 * product, rtol=1e-13, atol=0), alpha
    with pytest.raises(ValueError, match="alpha must be finite in float32"):
        R.reference_gemm(*ops.gemm_args[:5], 1e39)


def split_k_fp32(ops: R.FP4Operands, chunks: int) -> torch.Tensor:
    """An fp32 GEMM summed in a different order: K split into chunks, summed last to first."""
    vec = ops.sf_vec_size
    a = decode64(ops.a, ops.sfa, vec).float()
    b = decode64(ops.b, ops.sfb, vec).float()
    parts = [
        x @ y.transpose(-1, -2)
        for x, y in zip(a.chunk(chunks, dim=-1), b.chunk(chunks, dim=-1), strict=True)
    ]
    total = torch.zeros_like(parts[0])
    for p in reversed(parts):
        total = total + p
    return total * ops.alpha


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_check_gemm_accepts_other_summation_order(fmt: str, out_dtype: torch.dtype) -> None:
    ops = R.make_fp4_operands(24, 20, 512, 2, FORMATS[fmt], seed=11, dist=gemm_dist(out_dtype))
    d = split_k_fp32(ops, chunks=8).to(out_dtype)
    ok, info = R.check_gemm(d, *ops.gemm_args)
    assert ok, str(info)
    assert info.num_bad == 0 and 0.0 <= info.worst_ratio <= 1.0
    assert info.num_elements == 2 * 24 * 20


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(None, 9, 7, 96), (2, 16, 12, 2048)], ids=str)
def test_abs_product_sum_matches_float64(fmt: str, shape: tuple) -> None:
    # sum_i |a_i b_i| from the bit-field decoders in float64. Signs vary, so |A| |B|^T differs
    # from |A B^T|, and (sum |a|)(sum |b|) is K times too large. Each product is exact in fp32 and
    # the terms are non-negative, so fp32 summation errs by at most gamma_{K-1} relative.
    batch, m, n, k = shape
    vec = FORMATS[fmt]
    ops = R.make_fp4_operands(m, n, k, batch or 1, vec, seed=19, dist="wide")
    a, b, sfa, sfb = ops.a, ops.b, ops.sfa, ops.sfb
    if batch is None:
        a, b, sfa, sfb = a[0], b[0], sfa[0], sfb[0]
    got = R.abs_product_sum(a, b, sfa, sfb, vec)
    assert got.dtype == torch.float32
    assert got.shape == ((m, n) if batch is None else (batch, m, n))
    exact = decode64(a, sfa, vec).abs() @ decode64(b, sfb, vec).abs().transpose(-1, -2)
    u = (k - 1) * 2.0**-24
    assert bool(((got.double() - exact).abs() <= u / (1 - u) * exact).all())


def out_ulp(v: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Spacing of out_dtype's numbers at |v| (float64): 2^(e - p + 1) in v's binade 2^e, with p
    the precision (8 bfloat16, 11 float16, 24 float32) and e no lower than the normal minimum."""
    p, e_min = {torch.bfloat16: (8, -126), torch.float16: (11, -14), torch.float32: (24, -126)}[
        out_dtype
    ]
    _, e = torch.frexp(v.abs())
    return torch.exp2((e - 1).clamp(min=e_min) - p + 1).double()


def must_be_rejected(d: torch.Tensor, exact: torch.Tensor, s: torch.Tensor, k: int) -> torch.Tensor:
    """Elements of d that check_gemm must reject, whatever the exact form of its window.

    With u = 2^-24 and S = sum |a_i b_i|, an fp32 sum of K exact products lies within K u S of
    the exact value (to first order), the kernel's and the fp32 reference's alike. A window
    around the reference needs no more than 2 K u S plus half an output ulp to pass every such
    kernel, and the reference is within K u S of the exact value: an element further than
    B = 3 K u S + ulp / 2 (1% spare) from the exact value is outside any window no wider than
    needed.
    """
    spread = 3.03 * k * 2.0**-24 * s
    bound = spread + out_ulp(exact.abs() + spread, d.dtype) / 2
    return (d.double() - exact).abs() > bound


def gemm64(ops: R.FP4Operands) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, alpha * A B^T, |alpha| |A| |B|^T) in float64 from the bit-field decoders."""
    a = decode64(ops.a, ops.sfa, ops.sf_vec_size)
    b = decode64(ops.b, ops.sfb, ops.sf_vec_size)
    alpha = float(ops.alpha)
    exact = alpha * (a @ b.transpose(-1, -2))
    return a, b, exact, abs(alpha) * (a.abs() @ b.abs().transpose(-1, -2))


def assert_rejects_exactly(ops: R.FP4Operands, exact, wrong, s, out_dtype, min_fraction) -> None:
    """Write ``wrong`` where it is out of any sound window, the exact value elsewhere: check_gemm
    must flag exactly the wrong elements, and they must be at least ``min_fraction`` of all."""
    k = 2 * ops.a.shape[-1]
    wrong = wrong.to(out_dtype)
    bad = must_be_rejected(wrong, exact, s, k)
    assert float(bad.double().mean()) >= min_fraction, "the planted error is too small to test"
    d = torch.where(bad, wrong, exact.to(out_dtype))
    ok, info = R.check_gemm(d, *ops.gemm_args)
    assert not ok
    assert info.num_bad == int(bad.sum()), str(info)
    ok, info = R.check_gemm(exact.to(out_dtype), *ops.gemm_args)
    assert ok, str(info)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_check_gemm_rejects_half_a_percent_at_k256(fmt: str, out_dtype: torch.dtype) -> None:
    # D = 1.005 x the exact result at K = 256. (bfloat16's half ulp, up to 0.4%, hides it in up
    # to a third of the elements.)
    ops = R.make_fp4_operands(32, 24, 256, 2, FORMATS[fmt], seed=12)
    _, _, exact, s = gemm64(ops)
    frac = 0.6 if out_dtype == torch.bfloat16 else 0.9
    assert_rejects_exactly(ops, exact, exact * 1.005, s, out_dtype, min_fraction=frac)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_check_gemm_rejects_a_missing_k_block_at_k7168(fmt: str, out_dtype: torch.dtype) -> None:
    # A kernel that skips one 16-element K block (of 448) of every output at K = 7168.
    ops = R.make_fp4_operands(64, 48, 7168, 1, FORMATS[fmt], seed=20)
    a, b, exact, s = gemm64(ops)
    j = slice(224 * 16, 225 * 16)
    missing = float(ops.alpha) * (a[..., j] @ b[..., j].transpose(-1, -2))
    assert_rejects_exactly(ops, exact, exact - missing, s, out_dtype, min_fraction=0.1)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_check_gemm_rejects_one_wrong_element(out_dtype: torch.dtype) -> None:
    ops = R.make_fp4_operands(16, 12, 256, 2, 16, seed=12)
    _, _, exact, s = gemm64(ops)
    d = exact.to(out_dtype)
    assert R.check_gemm(d, *ops.gemm_args)[0]
    where = (1, 5, 7)
    d[where] = (exact[where] * 1.02).to(out_dtype)  # 2%: twice bfloat16's ulp and more
    assert bool(must_be_rejected(d, exact, s, 256)[where])
    ok, info = R.check_gemm(d, *ops.gemm_args)
    assert not ok
    assert info.num_bad == 1 and info.worst_index == where and info.worst_ratio > 1
    assert info.kernel_value == float(d[where])
    assert info.reference_value == pytest.approx(float(exact[where]), rel=2**-20)
    assert info.max_abs_err == pytest.approx(abs(float(d[where]) - float(exact[where])), rel=1e-3)
    assert "1/384 elements outside tolerance" in str(info)
    for wrong in (math.nan, math.inf, -math.inf):  # the reference is finite here
        d[where] = wrong
        ok, info = R.check_gemm(d, *ops.gemm_args)
        assert not ok and info.worst_index == where and info.worst_ratio == math.inf, wrong


def test_check_gemm_window_widens_for_a_coarser_accumulator() -> None:
    # An accumulator with unit roundoff u may err by up to K u S: with u = 2^-12 at K = 256 that
    # is S / 16, so 1.005 x the exact value (0.5% of |exact| <= S) must pass, as it must not
    # with an fp32 accumulator.
    ops = R.make_fp4_operands(32, 24, 256, 2, 16, seed=12)
    _, _, exact, s = gemm64(ops)
    d = (exact * 1.005).float()
    assert bool(((d.double() - exact).abs() < s / 16).all())
    assert not R.check_gemm(d, *ops.gemm_args)[0]
    ok, info = R.check_gemm(d, *ops.gemm_args, unit_roundoff=2.0**-12)
    assert ok, str(info)


def test_check_gemm_reports_the_element_furthest_outside_its_window() -> None:
    # Row 0 of A is 2^12 times larger, and so are its sums S: an error there that an fp32 kernel
    # may make (K u S / 2, inside the 2 K u S a sound window allows) is larger in absolute terms
    # than a 1% error in row 2, yet only row 2's is wrong, and it is the one to report.
    gen = torch.Generator().manual_seed(22)
    xa = torch.randn(4, 256, generator=gen)
    xa[0] *= 2.0**12
    (a, sfa), (b, sfb) = R.quantize_mxfp4(xa), R.quantize_mxfp4(torch.randn(3, 256, generator=gen))
    one = torch.tensor(1.0)
    ops = R.FP4Operands(a, b, sfa, sfb, 32, one, one, one)
    _, _, exact, s = gemm64(ops)
    d = exact.float()
    d[0, 0] = exact[0, 0] + 256 * 2.0**-24 * s[0, 0] / 2
    d[2, 1] = exact[2, 1] * 1.01
    assert abs(float(d[0, 0] - exact[0, 0])) > 10 * abs(float(d[2, 1] - exact[2, 1]))
    assert must_be_rejected(d, exact, s, 256).nonzero().tolist() == [[2, 1]]
    ok, info = R.check_gemm(d, *ops.gemm_args)
    assert not ok and info.num_bad == 1 and info.worst_index == (2, 1), str(info)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_check_gemm_window_is_two_fp32_sums(fmt: str, out_dtype: torch.dtype) -> None:
    # The window is the kernel's plus the reference's fp32 summation bound, 2 K u |alpha| S to
    # first order with K the full depth (not the packed bytes) and S from the bit-field decoders,
    # plus half an output ulp.
    k = 1024
    ops = R.make_fp4_operands(8, 8, k, 1, FORMATS[fmt], seed=21, dist="wide")
    _, _, exact, s = gemm64(ops)
    ok, info = R.check_gemm(exact.to(out_dtype), *ops.gemm_args)
    assert ok, str(info)
    delta = 2 * k * 2.0**-24 * float(s[info.worst_index])
    half_ulp = float(out_ulp(exact[info.worst_index].abs() + delta, out_dtype)) / 2
    expected = delta + (half_ulp if out_dtype != torch.float32 else 0.0)
    assert info.tolerance == pytest.approx(expected, rel=1e-3)


def test_gemm_tolerance_values() -> None:
    # Hand values: with abs_sum = 0 only half an ulp of the output dtype remains.
    ref = torch.tensor([1.0, 0.0, 3.0])
    zero = torch.zeros(3)
    assert R.gemm_tolerance(64, torch.bfloat16, ref, zero).tolist() == [2.0**-8, 2.0**-134, 2**-7]
    assert R.gemm_tolerance(64, torch.float16, ref, zero).tolist() == [2.0**-11, 2.0**-25, 2**-10]
    assert R.gemm_tolerance(64, torch.float32, ref, zero).tolist() == [0.0, 0.0, 0.0]
    # float16 below 2^-14 is subnormal, spaced 2^-24 all the way down
    tiny = torch.tensor([2.0**-20, 2.0**-14])
    assert R.gemm_tolerance(64, torch.float16, tiny, torch.zeros(2)).tolist() == [2.0**-25] * 2
    # the half ulp is taken at |ref| + delta: 1 - 2^-9 lies in bfloat16's binade [0.5, 1) of
    # ulp 2^-8, but a window of delta ~ 2^-8 (K = 1024, S = 32) reaches into [1, 2), ulp 2^-7
    below_one, s32 = torch.tensor([1 - 2.0**-9]), torch.tensor([32.0])
    delta = float(R.gemm_tolerance(1024, torch.float32, below_one, s32)[0])
    assert 2.0**-9 < delta < 2.0**-7
    bf16 = float(R.gemm_tolerance(1024, torch.bfloat16, below_one, s32)[0])
    assert bf16 - delta == pytest.approx(2.0**-8, rel=1e-9)
    # fp32 output: exactly 2 gamma_K |alpha| S / (1 - gamma_{K-1})
    u, k = 2.0**-24, 1024
    gamma_k, gamma_k1 = k * u / (1 - k * u), (k - 1) * u / (1 - (k - 1) * u)
    s = torch.tensor([10.0])
    got = float(R.gemm_tolerance(k, torch.float32, s, s, alpha=-0.5)[0])
    assert got == pytest.approx(2 * gamma_k * 0.5 * 10 / (1 - gamma_k1), rel=1e-15)
    assert got == pytest.approx(k * 2.0**-23 * 0.5 * 10, rel=1e-3)  # ~ K eps |alpha| S
    # grows with K and with a coarser accumulator
    bigger = R.gemm_tolerance(2 * k, torch.float32, s, s, alpha=-0.5)
    assert float(bigger[0]) > got
    loose = R.gemm_tolerance(k, torch.float32, s, s, alpha=-0.5, unit_roundoff=2.0**-14)
    assert float(loose[0]) > 500 * got


def test_check_gemm_matching_infinity_passes() -> None:
    # fp16 overflows at 65520: a kernel writing inf where the reference rounds to inf is right.
    codes = torch.full((1, 32), 0x7, dtype=torch.uint8)  # all 6
    sf = torch.full((1, 2), 448.0).to(torch.float8_e4m3fn)
    a = R.pack_fp4(codes)
    d = R.reference_gemm(a, a, sf, sf, 16, 1.0, torch.float16)  # 32 * 2688^2 > 65504
    assert d.tolist() == [[math.inf]]
    ok, info = R.check_gemm(d, a, a, sf, sf, 16)
    assert ok and info.max_abs_err == 0.0
    ok, _ = R.check_gemm(torch.full((1, 1), 65504.0, dtype=torch.float16), a, a, sf, sf, 16)
    assert not ok


def test_check_gemm_without_a_finite_bound_takes_only_the_reference() -> None:
    # MXFP4 scales of 2^63 on both operands: every product (36 x 2^126) overflows fp32, so the
    # reference and its bound are infinite; no finite value may pass, the reference's own may.
    codes = torch.full((1, 32), 0x7, dtype=torch.uint8)  # all 6
    sf = torch.full((1, 1), 127 + 63, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    a = R.pack_fp4(codes)
    for out_dtype in (torch.float32, torch.bfloat16):
        ref = R.reference_gemm(a, a, sf, sf, 32, 1.0, out_dtype)
        assert ref.tolist() == [[math.inf]]
        assert R.check_gemm(ref, a, a, sf, sf, 32)[0]
        for wrong in (0.0, 1e30, -math.inf):
            ok, info = R.check_gemm(torch.full((1, 1), wrong, dtype=out_dtype), a, a, sf, sf, 32)
            assert not ok and info.worst_ratio == math.inf, (out_dtype, wrong)


# ----------------------------------------------------------------------------- make_fp4_operands


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dist", ["normal", "uniform", "wide"])
def test_make_fp4_operands(fmt: str, dist: str) -> None:
    vec = FORMATS[fmt]
    ops = R.make_fp4_operands(40, 24, 256, 2, vec, seed=13, dist=dist)
    assert ops.a.shape == (2, 40, 128) and ops.a.dtype == torch.uint8
    assert ops.b.shape == (2, 24, 128) and ops.b.dtype == torch.uint8
    assert ops.sfa.shape == (2, 40, 256 // vec) and ops.sfa.dtype == R.SCALE_DTYPES[vec]
    assert ops.sfb.shape == (2, 24, 256 // vec) and ops.sfb.dtype == R.SCALE_DTYPES[vec]
    assert float(ops.alpha) == float(ops.global_scale_a * ops.global_scale_b)
    again = R.make_fp4_operands(40, 24, 256, 2, vec, seed=13, dist=dist)
    other = R.make_fp4_operands(40, 24, 256, 2, vec, seed=14, dist=dist)
    assert torch.equal(ops.a, again.a) and torch.equal(ops.sfb.float(), again.sfb.float())
    assert not torch.equal(ops.a, other.a)

    # Quantized from real data, not random codes: every block's largest code is +-6 for NVFP4
    # (a normal E4M3 scale is within 2^-4 of amax / 6, so amax / d > 5.6), and >= 3 for MXFP4
    # (amax / 2^ceil(log2(amax / 6)) lies in (3, 6]).
    block_max = R.e2m1_to_fp32(R.unpack_fp4(ops.a)).abs().unflatten(-1, (-1, vec)).amax(-1)
    if fmt == "nvfp4":
        assert bool((block_max[ops.sfa.float() >= 2.0**-6] == 6).all())
    else:
        assert bool((block_max >= 3).all())
    values = R.dequantize_fp4(ops.b, ops.sfb, vec, ops.global_scale_b)
    if dist == "normal":
        assert float(values.std()) == pytest.approx(1.0, abs=0.05)
    elif dist == "uniform":
        assert float(values.abs().mean()) == pytest.approx(0.5, abs=0.05)
        assert float(values.std()) == pytest.approx(1 / math.sqrt(3), abs=0.05)
    else:
        assert len(torch.unique(ops.sfa.float())) >= 12
    if fmt == "mxfp4":
        assert float(ops.global_scale_a) == float(ops.global_scale_b) == 1.0
    else:
        assert float(ops.sfa.float().max()) == 448.0


# ----------------------------------------------------------------------------- bad input


def _ops() -> R.FP4Operands:
    return R.make_fp4_operands(4, 4, 64, 2, 16)


def _mx_ops() -> R.FP4Operands:
    return R.make_fp4_operands(4, 4, 64, 2, 32)


BAD_INPUTS = {
    "e2m1_nan": (lambda: R.fp32_to_e2m1(torch.tensor([math.nan])), "NaN"),
    "e2m1_int": (lambda: R.fp32_to_e2m1(torch.tensor([1])), "x must be float32"),
    "codes_dtype": (lambda: R.e2m1_to_fp32(torch.tensor([1.0])), "codes must be uint8"),
    "codes_range": (lambda: R.e2m1_to_fp32(torch.tensor([16], dtype=torch.uint8)), "above 15"),
    "pack_odd": (lambda: R.pack_fp4(torch.zeros(3, dtype=torch.uint8)), "even last dim"),
    "unpack_dtype": (
        lambda: R.unpack_fp4(torch.zeros(2, dtype=torch.int16)),
        "uint8 or torch.float4_e2m1fn_x2",
    ),
    "nvfp4_k": (lambda: R.quantize_nvfp4(torch.ones(2, 24)), "K = 24 .* block size 16"),
    "mxfp4_k": (lambda: R.quantize_mxfp4(torch.ones(2, 48)), "K = 48 .* block size 32"),
    "nvfp4_nan": (
        lambda: R.quantize_nvfp4(torch.tensor([[math.nan] + [0.0] * 15])),
        "NaN or Inf",
    ),
    "mxfp4_inf": (
        lambda: R.quantize_mxfp4(torch.tensor([[math.inf] + [0.0] * 31])),
        "NaN or Inf",
    ),
    "fp64_overflow": (
        lambda: R.quantize_nvfp4(torch.full((1, 16), 1e300, dtype=torch.float64)),
        "NaN or Inf",
    ),
    "quant_rank": (lambda: R.quantize_nvfp4(torch.ones(32)), "x must be 2-D"),
    "quant_dtype": (
        lambda: R.quantize_mxfp4(torch.ones(2, 32, dtype=torch.int32)),
        "x must be float32",
    ),
    "quant_type": (lambda: R.quantize_nvfp4([[1.0] * 16]), "x must be a torch.Tensor"),
    "quant_empty": (lambda: R.quantize_mxfp4(torch.ones(0, 32)), "must not be empty"),
    "gs_zero": (
        lambda: R.quantize_nvfp4(torch.ones(1, 16), global_scale=0.0),
        "global_scale must be finite and positive",
    ),
    "gs_nan": (
        lambda: R.quantize_nvfp4(torch.ones(1, 16), global_scale=torch.tensor(math.nan)),
        "global_scale must be finite and positive",
    ),
    "gs_shape": (
        lambda: R.quantize_nvfp4(torch.ones(1, 16), global_scale=torch.ones(2)),
        "global_scale must be a number or a one-element tensor",
    ),
    "dequant_gs_negative": (
        lambda: R.dequantize_fp4(_ops().a, _ops().sfa, 16, -1.0),
        "global_scale must be finite and positive",
    ),
    "vec_size": (
        lambda: R.dequantize_fp4(_ops().a, _ops().sfa, 8),
        "sf_vec_size must be 16 .* or 32",
    ),
    "sf_dtype_nv": (
        lambda: R.dequantize_fp4(_ops().a, _ops().sfa.float(), 16),
        "needs torch.float8_e4m3fn scales",
    ),
    "sf_dtype_mx": (
        lambda: R.dequantize_fp4(_mx_ops().a, _mx_ops().sfa, 16),
        "scales has dtype torch.float8_e8m0fnu, but sf_vec_size 16 needs torch.float8_e4m3fn",
    ),
    "sf_dtype_vec": (
        lambda: R.dequantize_fp4(_ops().a, _ops().sfa, 32),
        "sf_vec_size 32 needs torch.float8_e8m0fnu",
    ),
    "sf_shape": (
        lambda: R.dequantize_fp4(_ops().a, _ops().sfa[:, :3], 16),
        "scales has shape \\(2, 3, 4\\)",
    ),
    "data_k": (
        lambda: R.dequantize_fp4(_ops().a[..., :4], _ops().sfa, 16),
        "K = 8 .* not a positive multiple of sf_vec_size 16",
    ),
    "gemm_k": (
        lambda: R.reference_gemm(_ops().a, _ops().b[..., :16], _ops().sfa, _ops().sfb[..., :2], 16),
        "K mismatch: a has K = 64, b has K = 32",
    ),
    "gemm_batch": (
        lambda: R.reference_gemm(_ops().a, _ops().b[:1], _ops().sfa, _ops().sfb[:1], 16),
        "batch mismatch: a has L = 2, b has L = 1",
    ),
    "gemm_rank": (
        lambda: R.reference_gemm(_ops().a, _ops().b[0], _ops().sfa, _ops().sfb[0], 16),
        "a is 3-D but b is 2-D",
    ),
    "gemm_sfb": (
        lambda: R.reference_gemm(_ops().a, _ops().b, _ops().sfa, _ops().sfa[:, :3], 16),
        "sfb has shape",
    ),
    "gemm_mixed_formats": (
        lambda: R.reference_gemm(_ops().a, _ops().b, _ops().sfa, _mx_ops().sfb, 16),
        "sfb has dtype torch.float8_e8m0fnu",
    ),
    "gemm_out_dtype": (
        lambda: R.reference_gemm(*_ops().gemm_args, out_dtype=torch.int8),
        "out_dtype must be",
    ),
    "gemm_accum": (
        lambda: R.reference_gemm(*_ops().gemm_args, accum_dtype=torch.float16),
        "accum_dtype must be",
    ),
    "gemm_alpha_nan": (
        lambda: R.reference_gemm(*_ops().gemm_args[:5], math.nan),
        "alpha must be finite",
    ),
    "gemm_alpha_shape": (
        lambda: R.reference_gemm(*_ops().gemm_args[:5], torch.ones(3)),
        "alpha must be a number or a one-element tensor",
    ),
    "gemm_data_dtype": (
        lambda: R.reference_gemm(_ops().a.float(), *_ops().gemm_args[1:]),
        "a must hold packed FP4",
    ),
    "blocked_rank": (lambda: R.to_blocked(torch.zeros(4)), "scales must be 2-D"),
    "unblocked_size": (
        lambda: R.from_blocked(torch.zeros(100, dtype=torch.uint8), 5, 3),
        "blocked has 100 elements per batch, but 5 x 3 scales pad to 128 x 4 = 512",
    ),
    "unblocked_rank": (
        lambda: R.from_blocked(torch.zeros(1, 1, 512), 5, 3),
        "blocked must be 1-D",
    ),
    "tol_k": (
        lambda: R.gemm_tolerance(0, torch.float32, torch.ones(1), torch.ones(1)),
        "k must be a positive int",
    ),
    "tol_shapes": (
        lambda: R.gemm_tolerance(16, torch.float32, torch.ones(2), torch.ones(3)),
        "abs_sum has shape",
    ),
    "tol_out_dtype": (
        lambda: R.gemm_tolerance(16, torch.int32, torch.ones(1), torch.ones(1)),
        "out_dtype must be",
    ),
    "tol_huge_k": (
        lambda: R.gemm_tolerance(2**23, torch.float32, torch.ones(1), torch.ones(1)),
        "too large",
    ),
    "check_shape": (
        lambda: R.check_gemm(torch.zeros(2, 4, 5), *_ops().gemm_args),
        "d_kernel has shape \\(2, 4, 5\\), but the operands give \\(2, 4, 4\\)",
    ),
    "check_dtype": (
        lambda: R.check_gemm(torch.zeros(2, 4, 4, dtype=torch.int32), *_ops().gemm_args),
        "d_kernel must be",
    ),
    "make_k": (lambda: R.make_fp4_operands(4, 4, 40, 1, 16), "k = 40 is not a multiple"),
    "make_dist": (
        lambda: R.make_fp4_operands(4, 4, 64, 1, 16, dist="cauchy"),
        "dist must be one of",
    ),
    "make_vec": (lambda: R.make_fp4_operands(4, 4, 64, 1, 64), "sf_vec_size must be"),
    "make_dims": (lambda: R.make_fp4_operands(0, 4, 64, 1, 16), "m must be a positive int"),
    "make_seed": (lambda: R.make_fp4_operands(4, 4, 64, 1, 16, seed=1.5), "seed must be an int"),
    "unblocked_rows": (
        lambda: R.from_blocked(torch.zeros(512, dtype=torch.uint8), 5.0, 3),
        "rows must be a non-negative int",
    ),
    "unblocked_cols_bool": (
        lambda: R.from_blocked(torch.zeros(512, dtype=torch.uint8), 5, True),
        "cols must be a non-negative int",
    ),
    "tol_negative_abs_sum": (
        lambda: R.gemm_tolerance(16, torch.float32, torch.ones(1), -torch.ones(1)),
        "abs_sum must be >= 0",
    ),
    "gemm_signed_e4m3_scale": (
        lambda: R.reference_gemm(
            _ops().a, _ops().b, (-_ops().sfa.float().abs()).to(torch.float8_e4m3fn), _ops().sfb, 16
        ),
        "sfa has .* E4M3 scale\\(s\\) with the sign bit set",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_raises_value_error(case: str) -> None:
    call, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        call()


# ----------------------------------------------------------------------------- scale bytes


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_scale_byte_is_used_or_refused_by_the_format(fmt: str) -> None:
    """All 256 bytes of one block scale: a byte the format decodes (e4m3_value / e8m0_value,
    from the bit fields) to NaN, or an E4M3 byte with the sign bit set (PTX ue4m3 is unsigned),
    raises ValueError naming it; any other gives D = vec * scale exactly (A and B all 1.0, the
    other operand's scale 1.0, K one block)."""
    vec = FORMATS[fmt]
    one = 0x38 if vec == 16 else 0x7F  # 1.0 in E4M3 / E8M0
    sf_dtype = R.SCALE_DTYPES[vec]
    ones = torch.full((1, vec // 2), 0x22, dtype=torch.uint8)  # vec E2M1 codes of 1.0
    sfb = torch.tensor([[one]], dtype=torch.uint8).view(sf_dtype)
    for byte in range(256):
        value = SCALE_TABLES[vec][byte].item()
        sfa = torch.tensor([[byte]], dtype=torch.uint8).view(sf_dtype)
        for name, args in (("sfa", (ones, ones, sfa, sfb)), ("sfb", (ones, ones, sfb, sfa))):
            signed = vec == 16 and byte & 0x80
            if math.isnan(value) or signed:
                why = "sign bit" if signed else "NaN"  # (E4M3 0xFF is both)
                with pytest.raises(ValueError, match=f"{name} has 1 .*{why}"):
                    R.reference_gemm(*args, vec, out_dtype=torch.float64)
            else:
                d = R.reference_gemm(*args, vec, out_dtype=torch.float64, accum_dtype=torch.float64)
                assert d.item() == vec * value, (name, hex(byte))


# ----------------------------------------------------------------------------- second oracle


def _all_ones_gemm(n: int = 4):
    """A [1, 64] and B [n, 64], every value 1.0 (scales 1.0): D is 64 in every column, exactly.
    With K 64 and sum |a b| 64, the derived fp32 bound is about K * 2^-23 * 64 = 2^-11."""
    a = torch.full((1, 32), 0x22, dtype=torch.uint8)
    b = torch.full((n, 32), 0x22, dtype=torch.uint8)
    sfa = torch.full((1, 4), 1.0).to(torch.float8_e4m3fn)
    sfb = torch.full((n, 4), 1.0).to(torch.float8_e4m3fn)
    return a, b, sfa, sfb, 16


def _off_by(*errors: float) -> torch.Tensor:
    """A float32 [1, 4] result: 64 plus the given error in each column."""
    return torch.tensor([[64.0 + e for e in errors]], dtype=torch.float32)


NAN = math.nan
LIBRARY_CASES = {
    # name: (our errors, the library's errors or None, passes, rule)
    "ours-exact-no-library": ((0, 0, 0, 0), None, True, "derived bound"),
    "ours-within-bound": ((2**-14, 0, 0, 0), None, True, "derived bound"),
    "ours-within-bound-library-worse": ((2**-14, 0, 0, 0), (1, 1, 1, 1), True, "derived bound"),
    "ours-outside-no-library": ((2**-4, 0, 0, 0), None, False, "neither rule held"),
    # The rule compares the largest errors: ours 1/16 <= 2 x the library's 1/32 (elsewhere).
    "twice-the-library-exactly": ((2**-4, 0, 0, 0), (0, 0, 0, 2**-5), True, "within 2x"),
    "same-result-as-library": ((2**-4, 0, 0, 0), (2**-4, 0, 0, 0), True, "within 2x"),
    "four-times-the-library": ((2**-3, 0, 0, 0), (0, 0, 0, 2**-5), False, "neither rule held"),
    "just-over-twice": ((2**-4 + 2**-12, 0, 0, 0), (2**-5, 0, 0, 0), False, "neither rule"),
    "library-exact": ((2**-4, 0, 0, 0), (0, 0, 0, 0), False, "neither rule held"),
    "library-nan": ((2**-4, 0, 0, 0), (NAN, 1, 1, 1), False, "neither rule held"),
    "ours-nan": ((NAN, 0, 0, 0), (1, 1, 1, 1), False, "neither rule held"),
    "both-nan": ((NAN, 0, 0, 0), (NAN, 0, 0, 0), False, "neither rule held"),
    "ours-inf": ((math.inf, 0, 0, 0), (math.inf, 0, 0, 0), False, "neither rule held"),
}


@pytest.mark.parametrize("case", LIBRARY_CASES)
def test_check_gemm_or_library_rule(case: str) -> None:
    """Hand-made results around an exact D of 64: which rule holds, and the errors reported."""
    ours, library, passes, rule = LIBRARY_CASES[case]
    d_library = None if library is None else _off_by(*library)
    ok, info = R.check_gemm_or_library(_off_by(*ours), d_library, *_all_ones_gemm())
    assert ok == info.passed == passes, str(info)
    assert info.rule.startswith(rule), str(info)
    if library is None:
        assert info.library_max_abs_err is None
    elif not any(math.isnan(e) or math.isinf(e) for e in library):
        assert info.library_max_abs_err == max(library)
    if all(math.isfinite(e) for e in ours):
        assert info.ours.max_abs_err == max(ours)


def test_check_gemm_or_library_refuses_a_library_result_of_another_shape() -> None:
    with pytest.raises(ValueError, match=r"d_library has shape \(1, 3\)"):
        R.check_gemm_or_library(_off_by(0, 0, 0, 0), _off_by(0, 0, 0), *_all_ones_gemm())


# ----------------------------------------------------------------------------- CUDA


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_cuda_global_scale_is_correctly_rounded() -> None:
    # CUDA turns division by a Python scalar into multiplication by a rounded reciprocal, which
    # is often one ulp off; amax / 2688 must be a true division on every device.
    gen = torch.Generator().manual_seed(17)
    for _ in range(64):
        x = torch.randn(4, 64, generator=gen) * 100
        _, _, gs = R.quantize_nvfp4(x.cuda())
        assert float(gs) == float((x.abs().max().double() / 2688).float())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_matches_cpu(fmt: str) -> None:
    vec = FORMATS[fmt]
    cpu = R.make_fp4_operands(96, 80, 512, 2, vec, seed=15, dist="wide")
    gpu = R.make_fp4_operands(96, 80, 512, 2, vec, device="cuda", seed=15, dist="wide")
    for name in ("a", "b", "sfa", "sfb", "global_scale_a", "global_scale_b", "alpha"):
        c, g = getattr(cpu, name), getattr(gpu, name).cpu()
        assert c.dtype == g.dtype, name
        if c.element_size() == 1:  # fp8 equality is not implemented everywhere: compare bytes
            c, g = c.view(torch.uint8), g.view(torch.uint8)
        assert torch.equal(c, g), f"{name} differs between CPU and CUDA"
    assert torch.equal(
        R.to_blocked(gpu.sfa).cpu().view(torch.uint8), R.to_blocked(cpu.sfa).view(torch.uint8)
    )
    ref_cpu = R.reference_gemm(*cpu.gemm_args, out_dtype=torch.float32)
    ref_gpu = R.reference_gemm(*gpu.gemm_args, out_dtype=torch.float32).cpu()
    abs_sum = R.abs_product_sum(*cpu.gemm_args[:5])
    tol = R.gemm_tolerance(512, torch.float32, ref_cpu, abs_sum, cpu.alpha)
    assert bool(((ref_gpu.double() - ref_cpu.double()).abs() <= tol).all())
    ok, info = R.check_gemm(R.reference_gemm(*gpu.gemm_args), *gpu.gemm_args)
    assert ok, str(info)


def _scaled_mm_fp4_skip_reason() -> str | None:
    """Why torch._scaled_mm cannot run FP4 here, or None where it must."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major != 10:
        name = torch.cuda.get_device_name()
        return (
            f"FP4 torch._scaled_mm needs an sm_100 / sm_103 GPU; found {name} (sm_{major}{minor})"
        )
    cuda = torch.version.cuda
    if cuda is None or tuple(int(v) for v in cuda.split(".")[:2]) < (12, 8):
        return f"torch {torch.__version__} is built for CUDA {cuda}; FP4 GEMMs need CUDA 12.8+"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(
    _scaled_mm_fp4_skip_reason() is not None, reason=str(_scaled_mm_fp4_skip_reason())
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_scaled_mm_agrees(fmt: str) -> None:
    # Any error here is a failure: on an sm_100 GPU with CUDA 12.8+, torch runs both formats.
    vec = FORMATS[fmt]
    ops = R.make_fp4_operands(256, 128, 512, 1, vec, device="cuda", seed=16)
    a, b, sfa, sfb = ops.a[0], ops.b[0], ops.sfa[0], ops.sfb[0]
    d = torch._scaled_mm(
        a.view(torch.float4_e2m1fn_x2),
        b.view(torch.float4_e2m1fn_x2).t(),
        R.to_blocked(sfa),
        R.to_blocked(sfb),
        out_dtype=torch.bfloat16,
    )
    ok, info = R.check_gemm(d, a, b, sfa, sfb, vec)
    assert ok, str(info)


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 4), (129, 5), (300, 17), (7, 448)])
def test_blocked_numel_is_the_length_to_blocked_writes(rows, cols):
    scales = torch.ones(rows, cols, dtype=torch.uint8)
    assert R.blocked_numel(rows, cols) == R.to_blocked(scales).numel()


@pytest.mark.parametrize("a_dtype", [torch.bfloat16, torch.float16])
def test_reference_gemm_w4a16_hand_computed(a_dtype: torch.dtype) -> None:
    """W4A16: activations as they are times the dequantized weights, in float64 by hand."""
    k = 32
    a = torch.tensor([[0.1 * (i - 16) for i in range(k)]], dtype=a_dtype)
    codes = torch.tensor([[(3 * i) % 16 for i in range(k)]], dtype=torch.uint8)
    b = R.pack_fp4(codes)
    sfb = torch.tensor([[2.0, 0.375]], dtype=torch.float8_e4m3fn)
    w = R.e2m1_to_fp32(codes).double() * torch.tensor([2.0] * 16 + [0.375] * 16).double()
    want = (a.double() * w).sum() * -0.75
    got = R.reference_gemm_w4a16(a, b, sfb, 16, -0.75, torch.float64, accum_dtype=torch.float64)
    assert got.shape == (1, 1) and float(got) == float(want)
    ok, _ = R.check_gemm_w4a16(got.float(), a, b, sfb, 16, -0.75)
    assert ok
    ok, info = R.check_gemm_w4a16((got * 1.001).float(), a, b, sfb, 16, -0.75)
    assert not ok and info.num_bad == 1
    with pytest.raises(ValueError, match="bfloat16 or float16 activations"):
        R.reference_gemm_w4a16(a.float(), b, sfb, 16)
    with pytest.raises(ValueError, match="same rank, batch and K"):
        R.reference_gemm_w4a16(a[:, :16], b, sfb, 16)
