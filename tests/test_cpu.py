"""The library's own CPU implementation (fp4_ops.cpu, fp4_ops.layout) against the oracle,
reference.py, bit for bit: layouts, packing, quantization at and around every rounding boundary,
dequantization and both GEMMs; and its refusals."""

from __future__ import annotations

import pytest
import torch

import reference
from fp4_ops import cpu, layout

SCALE_DTYPES = [torch.float8_e4m3fn, torch.float8_e8m0fnu]
IN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("rows, cols", [(1, 1), (100, 3), (128, 4), (129, 5), (300, 17)])
@pytest.mark.parametrize("batch", [None, 3])
def test_blocked_layout_equals_the_oracle(rows, cols, batch):
    shape = (rows, cols) if batch is None else (batch, rows, cols)
    g = torch.Generator().manual_seed(rows * 31 + cols)
    plain = torch.randint(0, 126, shape, generator=g, dtype=torch.uint8)
    for dtype in SCALE_DTYPES:
        scales = plain.view(dtype)
        ours = layout.to_blocked(scales)
        assert ours.dtype == dtype
        assert torch.equal(_bytes(ours), _bytes(reference.to_blocked(scales)))
        assert ours.shape[-1] == layout.blocked_numel(rows, cols)
        assert torch.equal(_bytes(layout.from_blocked(ours, rows, cols)), plain)


def test_blocked_byte_positions():
    """The documented address of (r, c) in an atom: 16 (r % 32) + 4 (r // 32) + c."""
    rows, cols = 256, 8
    plain = torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols)
    index = torch.empty(rows * cols, dtype=torch.int64)
    for r in range(rows):
        for c in range(cols):
            atom = (r // 128) * (cols // 4) + c // 4
            index[atom * 512 + 16 * (r % 32) + 4 * (r % 128 // 32) + c % 4] = plain[r, c]
    values = layout.to_blocked(plain.to(torch.uint8).view(torch.float8_e4m3fn))
    assert torch.equal(_bytes(values).long(), index % 256)


def test_packing_equals_the_oracle():
    codes = torch.randint(0, 16, (3, 7, 64), dtype=torch.uint8)
    packed = layout.pack_fp4(codes)
    assert torch.equal(packed, reference.pack_fp4(codes))
    assert torch.equal(layout.unpack_fp4(packed), codes)
    assert torch.equal(layout.unpack_fp4(packed.view(torch.float4_e2m1fn_x2)), codes)


def _boundary_values(gen) -> torch.Tensor:
    """Rows of 32 values that put element / scale quotients on and next to every E2M1 midpoint
    and code, with zeros, negative zeros and a block amax that makes every scale byte."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    near = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    rows = []
    for exponent in range(-12, 13, 3):
        scale = 2.0**exponent
        vals = near[torch.randperm(len(near), generator=gen)[:31]] * scale
        signs = torch.where(torch.rand(31, generator=gen) < 0.5, -1.0, 1.0)
        rows.append(torch.cat([torch.tensor([6.0 * scale]), vals * signs]))
    rows.append(torch.zeros(32))
    rows.append(-torch.zeros(32))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["normal", "wide", "boundaries"])
@pytest.mark.parametrize("static", [None, 1000.0, 10000.0])
def test_quantize_nvfp4_equals_the_oracle(dtype, dist, static):
    """``static``: None for the dynamic global scale, else amax / static (past 2688 the block
    scales of the largest blocks saturate at 448)."""
    gen = torch.Generator().manual_seed(7)
    if dist == "boundaries":
        x = _boundary_values(gen).repeat(1, 4)
    else:
        x = torch.randn(3, 40, 128, generator=gen)
        if dist == "wide":
            span = 8 if dtype == torch.float16 else 20  # (float16 overflows past 2^15)
            powers = torch.randint(-span, span, (3, 40, 8), generator=gen)
            x = x * 2.0 ** powers.repeat_interleave(16, -1)
    x = x.to(dtype)
    gs = None if static is None else torch.tensor(x.float().abs().amax().item() / static)
    data, scale, out_gs = cpu.quantize_nvfp4(x, gs)
    want_data, want_scale, want_gs = reference.quantize_nvfp4(x, gs)
    assert torch.equal(data, want_data)
    assert torch.equal(_bytes(scale), _bytes(reference.to_blocked(want_scale)))
    assert torch.equal(out_gs, want_gs) and out_gs.shape == ()


def _tiny_blocks(gen: torch.Generator) -> torch.Tensor:
    """MXFP4 blocks whose amax / 6 lies at or below E8M0's smallest scale, 2^-127 (float32
    subnormals there): the amax itself, one ulp either side, and smaller values beside it."""
    amax = torch.tensor([6 * 2.0**-127, 3 * 2.0**-127, 2.0**-126, 6 * 2.0**-126, 1e-40, 1e-45])
    amax = torch.cat([amax, torch.nextafter(amax, amax + 1), torch.nextafter(amax, amax * 0)])
    x = torch.rand(len(amax), 32, generator=gen) * amax[:, None]
    x[:, 5] = amax
    return x * torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0)


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["normal", "wide", "boundaries", "tiny"])
def test_quantize_mxfp4_equals_the_oracle(dtype, dist):
    gen = torch.Generator().manual_seed(11)
    if dist == "boundaries":
        x = _boundary_values(gen)
    elif dist == "tiny":
        x = _tiny_blocks(gen)
    else:
        x = torch.randn(2, 33, 96, generator=gen)
        if dist == "wide":
            span = 8 if dtype == torch.float16 else 60
            powers = torch.randint(-span, span, (2, 33, 3), generator=gen)
            x = x * 2.0 ** powers.repeat_interleave(32, -1)
    x = x.to(dtype)
    data, scale, out_gs = cpu.quantize_mxfp4(x)
    want_data, want_scale = reference.quantize_mxfp4(x)
    assert torch.equal(data, want_data)
    assert torch.equal(_bytes(scale), _bytes(reference.to_blocked(want_scale)))
    assert float(out_gs) == 1.0


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["+0", "-0"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_all_zero_input_equals_the_oracle(fmt, sign, dtype):
    """An all-zero x (either sign) is a tensor like any other: the oracle's codes and scale bytes
    and, for NVFP4's dynamic global scale, 1.0 (amax 0 gives no scale)."""
    x = (sign * torch.zeros(2, 130, 64)).to(dtype)
    if fmt == "nvfp4":
        data, scale, out_gs = cpu.quantize_nvfp4(x, None)
        want_data, want_scale, want_gs = reference.quantize_nvfp4(x)
    else:
        data, scale, out_gs = cpu.quantize_mxfp4(x)
        (want_data, want_scale), want_gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    assert torch.equal(data, want_data)
    assert torch.equal(_bytes(scale), _bytes(reference.to_blocked(want_scale)))
    assert float(out_gs) == float(want_gs) == 1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_quantize_refuses_non_finite_input(bad):
    x = torch.ones(2, 32)
    x[1, 5] = bad
    for run in (lambda: cpu.quantize_nvfp4(x, None), lambda: cpu.quantize_mxfp4(x)):
        with pytest.raises(ValueError, match="NaN or Inf"):
            run()


@pytest.mark.parametrize("vec", [16, 32])
def test_dequantize_equals_the_oracle(vec):
    ops = reference.make_fp4_operands(40, 24, 128, 2, vec, seed=5, dist="wide")
    ours = cpu.dequantize(ops.a, ops.sfa, vec)
    assert torch.equal(ours, reference.dequantize_fp4(ops.a, ops.sfa, vec))


@pytest.mark.parametrize("vec", [16, 32])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gemm_equals_the_oracle(vec, out_dtype):
    ops = reference.make_fp4_operands(33, 40, 256, 2, vec, seed=9, dist="wide")
    alpha = torch.tensor(0.375)
    sfa, sfb = reference.to_blocked(ops.sfa), reference.to_blocked(ops.sfb)
    ours = cpu.gemm(ops.a, sfa, ops.b, sfb, alpha, vec, out_dtype)
    want = reference.reference_gemm(ops.a, ops.b, ops.sfa, ops.sfb, vec, alpha, out_dtype)
    assert ours.dtype == out_dtype and torch.equal(ours, want)


@pytest.mark.parametrize(
    "vec, a_dtype", [(16, torch.bfloat16), (16, torch.float16), (32, torch.bfloat16)]
)
def test_gemm_w4a16_equals_the_oracle(vec, a_dtype):
    ops = reference.make_fp4_operands(17, 48, 192, 1, vec, seed=2)
    a = torch.randn(1, 17, 192, generator=torch.Generator().manual_seed(3)).to(a_dtype)
    alpha = torch.tensor(1.25)
    ours = cpu.gemm_w4a16(a, ops.b, reference.to_blocked(ops.sfb), alpha, vec, torch.float32)
    want = reference.reference_gemm_w4a16(a, ops.b, ops.sfb, vec, alpha, torch.float32)
    assert torch.equal(ours, want)


@pytest.mark.parametrize(
    "dtype, byte, message",
    [
        (torch.float8_e4m3fn, 0x81, "sign bit"),
        (torch.float8_e4m3fn, 0x7F, "NaN"),
        (torch.float8_e8m0fnu, 0xFF, "NaN"),
    ],
)
def test_gemm_refuses_scales_without_a_meaning(dtype, byte, message):
    vec = 16 if dtype == torch.float8_e4m3fn else 32
    ops = reference.make_fp4_operands(8, 8, 64, 1, vec, seed=1)
    sfa = _bytes(reference.to_blocked(ops.sfa)).clone()
    sfa[0, 5] = byte
    with pytest.raises(ValueError, match=message):
        cpu.gemm(
            ops.a, sfa.view(dtype), ops.b, reference.to_blocked(ops.sfb), 1.0, vec, torch.float32
        )


@pytest.mark.parametrize("activations", ["dynamic", "bf16"])
def test_layer_cpu_weight_follows_its_buffers(activations):
    """A weight written in place (load_state_dict copies in place; a loader writes through
    ``.data``, which no version counter sees) is the one the next eager CPU call uses."""
    from torch import nn

    import fp4_ops

    torch.manual_seed(0)
    first, second = nn.Linear(64, 48), nn.Linear(64, 48)
    layer = fp4_ops.FP4Linear.from_linear(first, activations=activations)
    other = fp4_ops.FP4Linear.from_linear(second, activations=activations)
    x = torch.randn(5, 64, dtype=torch.bfloat16 if activations == "bf16" else torch.float32)
    before = layer(x)
    assert torch.equal(layer(x), before)
    layer.load_state_dict(other.state_dict())
    assert torch.equal(layer(x), other(x)) and not torch.equal(layer(x), before)
    third = fp4_ops.FP4Linear.from_linear(nn.Linear(64, 48), activations=activations)
    for name, buffer in [*third.kept_buffers().items(), ("bias", third.bias)]:
        getattr(layer, name).data.copy_(buffer)
    assert torch.equal(layer(x), third(x))


@pytest.mark.parametrize("activations", ["dynamic", "static", "bf16"])
def test_layers_made_under_inference_mode_run_and_follow_their_weights(activations):
    """A model quantized under ``torch.inference_mode`` holds inference tensors, which have no
    version counter: its layers still run (eagerly, and again under inference mode), give what
    the same layer made outside gives, and a weight copied in under inference mode is used at
    the next call, not a stale dequantized copy."""
    from torch import nn

    import fp4_ops

    torch.manual_seed(3)
    first, second = nn.Linear(64, 48), nn.Linear(64, 48)
    gs = 0.05 if activations == "static" else None
    make = fp4_ops.FP4Linear.from_linear
    plain = make(first, activations=activations, input_global_scale=gs)
    with torch.inference_mode():
        layer = make(first, activations=activations, input_global_scale=gs)
        other = make(second, activations=activations, input_global_scale=gs)
    x = torch.randn(5, 64, dtype=torch.bfloat16 if activations == "bf16" else torch.float32)
    want = plain(x)
    with torch.no_grad():
        assert torch.equal(layer(x), want)
    with torch.inference_mode():
        assert torch.equal(layer(x), want)
        layer.load_state_dict(other.state_dict())
        assert torch.equal(layer(x), other(x)) and not torch.equal(layer(x), want)
