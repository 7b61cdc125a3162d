# SPDX-License-Identifier: BSD-3-Clause
"""fp4_ops on the CPU: FP4Tensor and its converters (against torchao's and compressed-tensors'
own code where installed), the quantize and GEMM ops (against reference.py), torch.compile,
FP4Linear."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch import nn

import fp4_ops
import fp4_ops.sm100
import reference
from fp4_ops import FP4Tensor


def _torchao_nvfp4():
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except Exception as err:  # an absent or broken torchao both mean: no reference to test against
        pytest.skip(f"torchao's NVFP4Tensor is not importable ({err!r}); pip install torchao")
    return NVFP4Tensor


def _exact_dequant(data, plain_scales, vec, gs) -> torch.Tensor:
    """e2m1 * scale * gs in float64 (exact: at most 2 + 4 + 24 significant bits)."""
    codes = reference.e2m1_to_fp32(reference.unpack_fp4(data)).double()
    per_block = plain_scales.float().double().repeat_interleave(vec, dim=-1)
    return codes * per_block * float(gs)


def _nvfp4(shape, seed=0, gs=None):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x, reference.quantize_nvfp4(x, gs)


# ----------------------------------------------------------------------------- FP4Tensor


# (K / vec below 4 or not a multiple of it: the blocked atoms' padding columns)
@pytest.mark.parametrize("shape", [(200, 96), (3, 130, 64), (3, 32), (7, 96)], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_from_plain_swizzles_and_dequantizes(shape, fmt):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if fmt == "nvfp4":
        data, sc, gs = reference.quantize_nvfp4(x)
    else:
        (data, sc), gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    t = FP4Tensor.from_plain(data, sc, gs, fmt)
    blocked = reference.to_blocked(sc).view(torch.uint8)
    assert torch.equal(t.scale.flatten(-3).view(torch.uint8), blocked)
    assert torch.equal(t.plain_scales().view(torch.uint8), sc.view(torch.uint8))
    assert t.plain_scales().is_contiguous()
    assert t.shape == tuple(shape)
    want = reference.dequantize_fp4(data, sc, fp4_ops.FORMATS[fmt], gs)
    assert torch.equal(t.dequantize(), want)


# (no rows, or no batches: what quantize gives for an x without rows, and a checkpoint's empty
# expert stack; the reference quantizers refuse empty x, so the parts are made here)
@pytest.mark.parametrize("lead, rows, k", [((), 0, 96), ((3,), 0, 64), ((0,), 4, 32)], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_from_plain_of_empty_parts_keeps_every_shape(lead, rows, k, fmt):
    vec = fp4_ops.FORMATS[fmt]
    dtype = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    data = torch.zeros(*lead, rows, k // 2, dtype=torch.uint8)
    sc = torch.zeros(*lead, rows, k // vec, dtype=torch.uint8).view(dtype)
    t = FP4Tensor.from_plain(data, sc, 1.0, fmt)
    assert t.shape == (*lead, rows, k)
    blocked = reference.to_blocked(sc).view(torch.uint8)
    assert torch.equal(t.scale.flatten(-3).view(torch.uint8), blocked)
    assert t.plain_scales().shape == sc.shape
    assert t.dequantize().shape == (*lead, rows, k)


@pytest.mark.parametrize(
    "fmt, byte, match",
    [
        ("nvfp4", 0x7F, "NaN encoding"),
        ("nvfp4", 0xB8, "sign bit set"),
        ("mxfp4", 0xFF, "NaN encoding"),
    ],
)
def test_dequantize_refuses_scale_bytes_without_a_meaning(fmt, byte, match):
    """As fp4_gemm and reference.dequantize_fp4 do: a checkpoint's bad byte never decodes to
    NaN or a sign-flipped block."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    if fmt == "nvfp4":
        data, sc, gs = reference.quantize_nvfp4(x)
    else:
        (data, sc), gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    sc = sc.clone()
    sc.view(torch.uint8)[1, 1] = byte
    with pytest.raises(ValueError, match=match):
        reference.dequantize_fp4(data, sc, fp4_ops.FORMATS[fmt], gs)
    with pytest.raises(ValueError, match=match):
        FP4Tensor.from_plain(data, sc, gs, fmt).dequantize()


def test_plain_scales_are_refused_even_when_the_byte_count_matches():
    # 128 rows x K 64: plain [128, 4] scales have exactly the blocked layout's 512 bytes
    _, (data, sc, gs) = _nvfp4((128, 64))
    assert sc.numel() == fp4_ops.blocked_scale_numel(128, 64, 16)
    with pytest.raises(ValueError, match="plain row layout"):
        FP4Tensor(data, sc, gs, "nvfp4")


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(format="fp4"), "format must be one of"),
        (dict(scale="e8m0"), "needs torch.float8_e4m3fn scales"),
        (dict(scale="short"), "blocked layout needs"),
        (dict(global_scale="1-d"), "0-d float32"),
        (dict(data="int8"), "uint8 or float4_e2m1fn_x2"),
        (dict(data="k0", scale="k0"), "K = 0 is not a positive multiple"),
        (dict(scale="strided"), "must be contiguous"),
        (dict(data="strided"), "must be contiguous"),
        # (the meta device: a device that differs, reachable without a GPU)
        (dict(global_scale="meta-gs"), "parts on different devices"),
        (dict(scale="meta-scale"), "parts on different devices"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_fp4tensor_parts_are_refused(change, match):
    _, (data, sc, gs) = _nvfp4((64, 64))
    blocked = reference.to_blocked(sc).view(fp4_ops.layout.blocked_scale_shape(64, 64, 16))
    parts = dict(data=data, scale=blocked, global_scale=gs, format="nvfp4")
    # (a part of the right shape and values, every other element of a wider tensor)
    wide_scale = torch.zeros(*blocked.shape[:-1], 2 * blocked.shape[-1], dtype=torch.uint8)
    wide_scale[..., ::2] = blocked.view(torch.uint8)
    wide_data = torch.zeros(64, 64, dtype=torch.uint8)
    wide_data[:, ::2] = data
    swaps = {
        "e8m0": parts["scale"].view(torch.uint8).view(torch.float8_e8m0fnu),
        "short": parts["scale"][..., :-4],
        "1-d": gs.reshape(1),
        "int8": data.view(torch.int8),
        "meta-gs": torch.ones((), device="meta"),
        "meta-scale": torch.empty_like(blocked, device="meta"),
        "strided": {"scale": wide_scale[..., ::2].view(blocked.dtype), "data": wide_data[:, ::2]},
        "k0": {
            "data": data[:, :0],
            "scale": blocked.new_zeros(fp4_ops.layout.blocked_scale_shape(64, 0, 16)),
        },
    }
    for key, value in change.items():
        swap = swaps.get(value, value)
        parts[key] = swap[key] if isinstance(swap, dict) else swap
    with pytest.raises(ValueError, match=match):
        FP4Tensor(**parts)


def _saved(t) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("how", ["pickle", "torch.save", "weights_only"])
@pytest.mark.parametrize(
    "fmt, shape", [("nvfp4", (64, 64)), ("mxfp4", (64, 64)), ("nvfp4", (2, 40, 64))]
)
def test_a_bare_fp4tensor_round_trips(fmt, shape, how):
    """An FP4Tensor itself (not a layer holding one) pickles and saves with every part, and
    torch.load's default (weights_only) unpickler takes it."""
    t = fp4_ops.quantize(torch.randn(shape, generator=torch.Generator().manual_seed(4)), fmt)
    if len(shape) == 3:  # (one global scale per batch)
        t = FP4Tensor(t.data, t.scale, torch.tensor([0.5, 2.0]) * t.global_scale, fmt)
    if how == "pickle":
        back = pickle.loads(pickle.dumps(t))
    else:
        back = torch.load(_saved(t), weights_only=how == "weights_only")
    assert type(back) is FP4Tensor and back.format == t.format
    for name in ("data", "scale", "global_scale"):
        got, want = getattr(back, name).reshape(-1), getattr(t, name).reshape(-1)
        assert got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    assert torch.equal(back.dequantize(), t.dequantize())


@pytest.mark.parametrize(
    "tamper, match",
    [
        (
            lambda st: {**st, "scale": (st["scale"][0].reshape(-1), st["scale"][1])},
            "blocked layout",
        ),
        (lambda st: {**st, "scale": st["scale"][0]}, "scales, got torch.uint8"),
        (lambda st: {**st, "format": "nvfp8"}, "format"),
        (lambda st: {**st, "global_scale": torch.tensor(-1.0)}, "finite and positive"),
        (lambda st: {k: v for k, v in st.items() if k != "scale"}, "pickled FP4Tensor holds"),
        (lambda st: {**st, "extra": 1}, "pickled FP4Tensor holds"),
        (lambda st: list(st.items()), "pickled FP4Tensor holds .*got list"),
    ],
    ids=[
        "scale shape",
        "scale dtype",
        "format",
        "global scale",
        "missing part",
        "extra part",
        "not a dict",
    ],
)
@pytest.mark.parametrize("weights_only", [False, True])
def test_a_saved_fp4tensor_is_checked_on_load(tamper, match, weights_only, monkeypatch):
    """A saved FP4Tensor whose parts break the constructor's rules does not load (ValueError),
    with either unpickler: a file is input."""
    t = fp4_ops.quantize(torch.randn(64, 64, generator=torch.Generator().manual_seed(5)))
    saving = FP4Tensor.__getstate__
    monkeypatch.setattr(FP4Tensor, "__getstate__", lambda self: tamper(saving(self)))
    buffer = _saved(t)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=match):
        torch.load(buffer, weights_only=weights_only)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_batched_dequantize_takes_each_batch_global_scale(fmt):
    """[L, rows, K/2] data with one global scale per batch ([L]): batch e dequantizes with its
    own scale, as reference.py does for that batch alone."""
    x = torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(31))
    gs = torch.tensor([0.5, 2.0, 8.0]) if fmt == "nvfp4" else torch.ones(3)
    vec = fp4_ops.FORMATS[fmt]
    parts = []
    for e in range(3):
        if fmt == "nvfp4":
            data, sc, _ = reference.quantize_nvfp4(x[e], gs[e])
        else:
            data, sc = reference.quantize_mxfp4(x[e])
        parts.append((data, sc))
    shape = fp4_ops.layout.blocked_scale_shape(40, 64, vec)
    blocked = torch.stack([reference.to_blocked(p[1]).view(shape) for p in parts])
    t = FP4Tensor(torch.stack([p[0] for p in parts]), blocked, gs, fmt)
    got = t.dequantize(torch.float32)
    for e, (d, s) in enumerate(parts):
        assert torch.equal(got[e], reference.dequantize_fp4(d, s, vec, gs[e]).float()), e


# ----------------------------------------------------------------------------- torchao


@pytest.mark.parametrize("shape", [(200, 96), (3, 128, 64)], ids=str)
@pytest.mark.parametrize("swizzled", [False, True], ids=["plain", "swizzled"])
def test_from_torchao_matches_torchao_dequantize(shape, swizzled):
    nvfp4_tensor = _torchao_nvfp4()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2), dtype=torch.bfloat16)
    # a power-of-two per-tensor scale keeps torchao's (scale * pts) * e2m1 order exact too
    t = nvfp4_tensor.to_nvfp4(
        x, per_tensor_scale=torch.tensor(2.0**-5), is_swizzled_scales=swizzled
    )
    f = FP4Tensor.from_torchao(t)
    assert f.shape == tuple(shape)
    assert torch.equal(f.dequantize(), t.dequantize(torch.float32))


@pytest.mark.parametrize("swizzled", [False, True], ids=["plain", "swizzled"])
def test_to_torchao_matches_reference(swizzled):
    _torchao_nvfp4()
    _, (data, sc, gs) = _nvfp4((200, 160), seed=3)
    f = FP4Tensor.from_plain(data, sc, gs)
    t = f.to_torchao(swizzled=swizzled)
    assert t.is_swizzled_scales == swizzled
    # torchao multiplies (scale * per_tensor_scale) * e2m1, we (e2m1 * scale) * global_scale:
    # each differs from the exact value by at most two fp32 roundings
    exact = _exact_dequant(data, sc, 16, gs)
    for got in (t.dequantize(torch.float32), f.dequantize()):
        assert torch.allclose(got.double(), exact, rtol=2 * 2.0**-24 * 1.01, atol=0)
    assert torch.equal(FP4Tensor.from_torchao(t).dequantize(), f.dequantize())


# ----------------------------------------------------------------------------- checkpoints


def test_from_modelopt_matches_reference():
    # ModelOpt NVFP4: weight uint8 [N, K/2], weight_scale e4m3 [N, K/16] plain, weight_scale_2
    # = amax / (448 * 6), the decoding global scale
    _, (weight, weight_scale, weight_scale_2) = _nvfp4((96, 128), seed=4)
    f = FP4Tensor.from_modelopt(weight, weight_scale, weight_scale_2.reshape(1))
    assert torch.equal(
        f.dequantize(), reference.dequantize_fp4(weight, weight_scale, 16, weight_scale_2)
    )


def test_compressed_tensors_global_scale_is_inverted():
    # compressed-tensors stores weight_global_scale = 448 * 6 / amax, the reciprocal of ours
    gs = torch.tensor(2.0**-7)  # exact reciprocal: the inversion is checked exactly
    _, (packed, sc, gs) = _nvfp4((64, 64), seed=5, gs=gs)
    ct = {"weight_packed": packed, "weight_scale": sc, "weight_global_scale": 1.0 / gs.reshape(1)}
    f = FP4Tensor.from_compressed_tensors(**ct)
    assert float(f.global_scale) == 2.0**-7
    assert torch.equal(f.dequantize(), reference.dequantize_fp4(packed, sc, 16, gs))
    back = f.to_compressed_tensors()
    for name, stored in ct.items():  # (the parts compressed-tensors stores, as it stores them)
        assert (back[name].shape, back[name].dtype) == (stored.shape, stored.dtype), name
    assert float(back["weight_global_scale"]) == 2.0**7
    assert torch.equal(back["weight_packed"], packed)
    assert torch.equal(back["weight_scale"].view(torch.uint8), sc.view(torch.uint8))


def test_compressed_tensors_matches_its_own_unpacking():
    try:
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    except Exception as err:  # its import chain pulls transformers and huggingface_hub
        pytest.skip(f"compressed-tensors is not importable ({err!r})")
    x, (packed, sc, gs) = _nvfp4((64, 64), seed=6)
    f = FP4Tensor.from_compressed_tensors(packed, sc, 1.0 / gs)
    values = unpack_fp4_from_uint8(packed, 64, 64, torch.float32)
    theirs = (values.unflatten(-1, (-1, 16)) * (sc.float() / (1.0 / gs)).unsqueeze(-1)).flatten(-2)
    assert torch.allclose(f.dequantize(), theirs, rtol=2 * 2.0**-24 * 1.01, atol=0)


# ----------------------------------------------------------------------------- quantize (CPU)


@pytest.mark.parametrize("shape", [(1, 32), (130, 96), (2, 200, 64)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["nvfp4-dynamic", "nvfp4-static", "mxfp4"])
def test_quantize_cpu_is_the_reference(shape, dtype, mode):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 3).to(dtype)
    fmt = mode.split("-")[0]
    static = 0.002 if mode == "nvfp4-static" else None
    t = fp4_ops.quantize(x, fmt, global_scale=static)
    if fmt == "nvfp4":
        data, sc, gs = reference.quantize_nvfp4(x, static)
    else:
        (data, sc), gs = reference.quantize_mxfp4(x), torch.tensor(1.0)
    assert torch.equal(t.data, data)
    blocked = reference.to_blocked(sc).view(torch.uint8)
    assert torch.equal(t.scale.flatten(-3).view(torch.uint8), blocked)
    assert t.global_scale.item() == float(gs)
    assert t.shape == tuple(shape) and t.format == fmt


@pytest.mark.parametrize(
    "x, kwargs, match",
    [
        (torch.randn(4, 48), {}, "not a multiple of 32"),
        (torch.randn(4, 0), {}, r"K = 0 \(last dim of x\) is not a multiple of 32"),
        (torch.randn(4, 64), {"format": "mxfp4", "global_scale": 1.0}, "mxfp4 has no global"),
        (torch.randn(4, 64), {"format": "fp8"}, "format must be one of"),
        (torch.randn(4, 64).double(), {}, "float32, bfloat16 or float16"),
        (torch.randn(64), {}, r"\[rows, K\]"),
        (torch.full((4, 64), float("nan")), {}, "NaN or Inf"),
        (torch.randn(4, 64), {"global_scale": -1.0}, "finite and positive"),
    ],
    ids=["k48", "k0", "mx-gs", "format", "float64", "1-d", "nan", "negative-gs"],
)
def test_quantize_refuses_bad_input(x, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fp4_ops.quantize(x, **kwargs)


# ----------------------------------------------------------------------------- GEMM op (CPU)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("mnkl", [(3, 40, 64, 0), (130, 72, 96, 0), (20, 33, 64, 2)], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_fp4_gemm_cpu_matches_reference(fmt, mnkl, out_dtype):
    m, n, k, l = mnkl  # noqa: E741
    gen = torch.Generator().manual_seed(8)
    lead = (l,) if l else ()
    x = torch.randn((*lead, m, k), generator=gen)
    w = torch.randn((*lead, n, k), generator=gen) * 0.01
    a, b = fp4_ops.quantize(x, fmt), fp4_ops.quantize(w, fmt)
    d = fp4_ops.fp4_gemm(a, b, out_dtype=out_dtype, alpha=0.5)
    assert d.shape == (*lead, m, n) and d.dtype == out_dtype
    # by hand from the reference quantizer's plain scales: alpha = gs_a * gs_b * 0.5
    if fmt == "nvfp4":
        (da, sa, ga), (db, sb, gb) = reference.quantize_nvfp4(x), reference.quantize_nvfp4(w)
    else:
        (da, sa), (db, sb) = reference.quantize_mxfp4(x), reference.quantize_mxfp4(w)
        ga = gb = torch.tensor(1.0)
    vec = fp4_ops.FORMATS[fmt]
    ok, info = reference.check_gemm(d, da, db, sa, sb, vec, ga * gb * 0.5)
    assert ok, str(info)


def _pair(fmt="nvfp4", m=16, n=24, k=64):
    gen = torch.Generator().manual_seed(9)
    return (
        fp4_ops.quantize(torch.randn(m, k, generator=gen), fmt),
        fp4_ops.quantize(torch.randn(n, k, generator=gen), fmt),
    )


def test_fp4_gemm_refuses_bad_operands():
    a, b = _pair()
    a_mx, _ = _pair("mxfp4")
    _, b_k = _pair(k=96)
    cases = [
        ((a.data, b), {}, "must be an FP4Tensor"),
        ((a_mx, b), {}, "a is mxfp4 but b is nvfp4"),
        ((a, b_k), {}, "K mismatch"),
        ((a, b), {"out_dtype": torch.int8}, "out_dtype"),
        ((a, b), {"alpha": torch.ones(2)}, "one-element tensor"),
        ((a, b), {"alpha": float("nan")}, "alpha must be finite"),
        ((a, b), {"alpha": -float("inf")}, "alpha must be finite"),
        ((a, b), {"alpha": torch.tensor(float("inf"))}, "alpha must be finite"),
    ]
    for args, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            fp4_ops.fp4_gemm(*args, **kwargs)
        if "alpha" in kwargs:  # (the W4A16 entry takes the same alpha)
            with pytest.raises(ValueError, match=match):
                fp4_ops.fp4_gemm(torch.randn(3, 64, dtype=torch.bfloat16), b, **kwargs)


@pytest.mark.parametrize("la, lb", [(1, 2), (2, 1), (3, 2)], ids=str)
def test_fp4_gemm_refuses_batch_mismatch(la, lb):
    """Batched weights [L, N, K] take activations of the same L only, fewer or more (W4A4 and
    W4A16)."""
    gen = torch.Generator().manual_seed(10)
    b = fp4_ops.quantize(torch.randn(lb, 16, 64, generator=gen))
    x = torch.randn(la, 8, 64, generator=gen)
    match = f"batch mismatch: a has L = {la}, b has L = {lb}"
    for a in (fp4_ops.quantize(x), x.bfloat16()):
        with pytest.raises(ValueError, match=match):
            fp4_ops.fp4_gemm(a, b)


@pytest.mark.parametrize("operand", ["a", "b"])
def test_fp4_gemm_refuses_a_global_scale_per_batch(operand):
    """An FP4Tensor with one global scale per batch (experts' weights) is refused as either
    operand, naming it and fp4_grouped_gemm: the GEMM applies one scalar per operand."""
    gen = torch.Generator().manual_seed(12)
    experts = fp4_ops.quantize_experts(torch.randn(2, 16, 64, generator=gen).bfloat16(), "nvfp4")
    other = fp4_ops.quantize(torch.randn(2, 16, 64, generator=gen))
    args = (experts, other) if operand == "a" else (other, experts)
    match = f"{operand} has one global scale per batch \\(\\(2,\\)\\).*fp4_grouped_gemm"
    with pytest.raises(ValueError, match=match):
        fp4_ops.fp4_gemm(*args)


def _on_meta(t: FP4Tensor) -> FP4Tensor:
    return FP4Tensor.unchecked(
        t.data.to("meta"), t.scale.to("meta"), t.global_scale.to("meta"), t.format
    )


def test_fp4_gemm_refuses_operands_on_different_devices():
    """Operands on two devices (the meta device stands in for a GPU) are a ValueError naming
    both, for W4A4 either way round and for W4A16."""
    a, b = _pair()
    for args in ((a, _on_meta(b)), (_on_meta(a), b), (torch.randn(4, 64).bfloat16(), _on_meta(b))):
        with pytest.raises(ValueError, match="is on (cpu|meta) but b is on (meta|cpu)"):
            fp4_ops.fp4_gemm(*args)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_gives_bfloat16_by_default(fmt):
    a, b = _pair(fmt)
    assert fp4_ops.fp4_gemm(a, b).dtype == torch.bfloat16
    # (W4A16: not x's dtype either, where that can differ: MXFP4 takes BF16 activations only)
    x16 = torch.randn(3, 64).to(torch.float16 if fmt == "nvfp4" else torch.bfloat16)
    assert fp4_ops.fp4_gemm(x16, b).dtype == torch.bfloat16


@pytest.mark.parametrize("shape", [(0, 64), (0, 5, 64), (2, 0, 64)], ids=str)
@pytest.mark.parametrize("scale", [None, 2.0, "tensor"], ids=["dynamic", "number", "tensor"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_without_rows_gives_a_valid_fp4tensor(fmt, scale, shape):
    """x without rows: an FP4Tensor of its format's parts (checked again by the constructor), no
    rows of data, and the global scale it was given (a static one), else 1.0."""
    if fmt == "mxfp4" and scale is not None:
        pytest.skip("mxfp4 takes no global scale")
    gs = torch.tensor(2.0) if scale == "tensor" else scale
    q = fp4_ops.quantize(torch.randn(shape), fmt, gs)
    again = FP4Tensor(q.data, q.scale, q.global_scale, q.format)
    assert again.data.shape == (*shape[:-1], 32) and again.data.dtype == torch.uint8
    assert q.global_scale.shape == () and q.global_scale.dtype == torch.float32
    assert q.global_scale.item() == (1.0 if scale is None else 2.0)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_ops_fake_kernels(fmt):
    a, b = _pair(fmt)
    x3 = torch.randn(2, 50, 64)
    alpha = a.global_scale * b.global_scale
    vec = fp4_ops.FORMATS[fmt]
    for check in ("test_faketensor", "test_aot_dispatch_dynamic"):
        gemm_args = (a.data, a.scale, b.data, b.scale, alpha, None, vec, torch.bfloat16)
        torch.library.opcheck(fp4_ops.ops.gemm_op, gemm_args, test_utils=[check])
        for dtype in (torch.float32, torch.bfloat16, torch.float16):  # (fake outputs' dtypes)
            x3d = (x3.to(dtype), vec, None)
            torch.library.opcheck(fp4_ops.ops.quantize_op, x3d, test_utils=[check])
        w4a16_args = (x3[0].to(torch.bfloat16), b.data, b.scale, b.global_scale, vec)
        torch.library.opcheck(
            fp4_ops.ops.gemm_w4a16_op, (*w4a16_args, torch.float32, False), test_utils=[check]
        )


def test_quantize_and_gemm_compile_fullgraph():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(10)
    x, w = torch.randn(40, 64, generator=gen), torch.randn(24, 64, generator=gen)

    def f(x, w, alpha):
        a = fp4_ops.quantize(x, "nvfp4")
        b = fp4_ops.quantize(w, "nvfp4", global_scale=0.001)
        return fp4_ops.fp4_gemm(a, b, out_dtype=torch.float32, alpha=alpha)

    alpha = torch.tensor(2.0)
    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(x, w, alpha), f(x, w, alpha))


# ----------------------------------------------------------------------------- FP4Linear


def _linear(k=64, n=48, bias=True, seed=11):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fp4_linear_is_quantize_then_gemm(fmt, bias):
    lin = _linear(bias=bias)
    q = fp4_ops.FP4Linear.from_linear(lin, fmt)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(12))
    y = q(x)
    assert y.shape == (2, 5, 48) and y.dtype == x.dtype
    # independent: the reference quantizers on plain scales, check_gemm's error bound
    vec = fp4_ops.FORMATS[fmt]
    rows = x.reshape(10, 64)
    if fmt == "nvfp4":
        (da, sa, ga), (db, sb, gb) = (
            reference.quantize_nvfp4(rows),
            reference.quantize_nvfp4(lin.weight.detach()),
        )
    else:
        (da, sa), (db, sb) = reference.quantize_mxfp4(rows), reference.quantize_mxfp4(lin.weight)
        ga = gb = torch.tensor(1.0)
    want = reference.reference_gemm(da, db, sa, sb, vec, ga * gb, torch.float32)
    if bias:
        want = want + lin.bias.detach()
    assert torch.equal(y.reshape(10, 48), want)
    # and close to the float layer (FP4: a few percent of the output's scale)
    err = (y - lin(x)).abs().max() / lin(x).abs().max()
    assert err < 0.25


def test_fp4_linear_static_activations_use_the_given_scale():
    lin = _linear(bias=False)
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(13))
    q = fp4_ops.FP4Linear.from_linear(lin, activations="static", input_global_scale=0.004)
    w = q.weight
    want = fp4_ops.fp4_gemm(fp4_ops.quantize(x, global_scale=0.004), w, out_dtype=torch.float32)
    assert torch.equal(q(x), want)
    dynamic = fp4_ops.fp4_gemm(fp4_ops.quantize(x), w, out_dtype=torch.float32)
    assert not torch.equal(q(x), dynamic)


def test_fp4_linear_from_modelopt():
    lin = _linear()
    weight, weight_scale, weight_scale_2 = reference.quantize_nvfp4(lin.weight.detach())
    q = fp4_ops.FP4Linear.from_modelopt(
        weight, weight_scale, weight_scale_2, input_scale=torch.tensor([0.003]), bias=lin.bias
    )
    ref = fp4_ops.FP4Linear.from_linear(lin, activations="static", input_global_scale=0.003)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(14))
    assert q.activations == "static"
    assert torch.equal(q(x), ref(x))


def test_fp4_linear_refuses_bad_configuration():
    lin = _linear()
    with pytest.raises(ValueError, match="needs input_global_scale"):
        fp4_ops.FP4Linear.from_linear(lin, activations="static")
    with pytest.raises(ValueError, match="nvfp4 only"):
        fp4_ops.FP4Linear.from_linear(lin, "mxfp4", "static", 0.1)
    with pytest.raises(ValueError, match="activations must be one of"):
        fp4_ops.FP4Linear.from_linear(lin, activations="calibrated")
    with pytest.raises(ValueError, match="features"):
        fp4_ops.FP4Linear.from_linear(lin)(torch.randn(3, 32))
    # (an NVFP4 FP4Tensor may have K = 48, three scale blocks; the kernels take K % 32 == 0)
    k48 = FP4Tensor.from_plain(*reference.quantize_nvfp4(torch.randn(8, 48)), "nvfp4")
    with pytest.raises(ValueError, match="in_features = 48 is not a multiple of 32"):
        fp4_ops.FP4Linear(k48)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.down = nn.Linear(96, 64)
        self.head = nn.Linear(64, 10)
        self.odd = nn.Linear(40, 64)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def test_quantize_model_swaps_the_chosen_linears():
    torch.manual_seed(15)
    model = _Block()
    assert fp4_ops.quantize_model(model).replaced == ["up", "down", "head"]  # odd: 40 % 32
    assert isinstance(model.up, fp4_ops.FP4Linear) and isinstance(model.odd, nn.Linear)
    other = _Block()
    assert fp4_ops.quantize_model(other, include=["up", "do*"]).replaced == ["up", "down"]
    third = _Block()
    report = fp4_ops.quantize_model(third, include=lambda name, m: m.out_features == 10)
    assert report.replaced == ["head"]
    with pytest.raises(ValueError, match="odd: in_features = 40"):
        fp4_ops.quantize_model(_Block(), include=["odd"])
    w16 = _Block()
    assert fp4_ops.quantize_model(w16, include=["up"], activations="bf16").replaced == ["up"]
    assert w16.up.activations == "bf16" and model.up.activations == "dynamic"
    with pytest.raises(ValueError, match="activations must be"):
        fp4_ops.quantize_model(_Block(), activations="static")


def test_quantized_model_compiles_fullgraph():
    torch._dynamo.reset()
    torch.manual_seed(16)
    model = _Block()
    fp4_ops.quantize_model(model, include=["up", "down"])
    fp4_ops.quantize_model(model, include=["head"], format="mxfp4")
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(17))
    compiled = torch.compile(model, fullgraph=True)
    assert torch.equal(compiled(x), model(x))


# ----------------------------------------------------------------------------- on the GPU


def _gemm_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0) and major != 10:
        return f"fp4_gemm has kernels for sm_90 and sm_100; this GPU is sm_{major}{minor}"
    return None


needs_gemm_gpu = pytest.mark.skipif(_gemm_gpu() is not None, reason=str(_gemm_gpu()))


def _gpu_operands(fmt, m=100, n=256, k=512, seed=18):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    return fp4_ops.quantize(x.cuda(), fmt), fp4_ops.quantize(w.cuda(), fmt)


def _check_on_cpu(d, a, b, alpha):
    ok, info = reference.check_gemm(
        d.cpu(),
        a.data.cpu(),
        b.data.cpu(),
        a.plain_scales().cpu(),
        b.plain_scales().cpu(),
        a.sf_vec_size,
        alpha.cpu(),
    )
    assert ok, str(info)


@needs_gemm_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [256, 100])  # (100: D rows the kernels pad to 16 bytes)
def test_fp4_gemm_gpu_eager(fmt, out_dtype, n):
    a, b = _gpu_operands(fmt, n=n)
    d = fp4_ops.fp4_gemm(a, b, out_dtype=out_dtype, alpha=0.75)
    assert d.shape == (100, n) and d.dtype == out_dtype and d.is_cuda and d.is_contiguous()
    _check_on_cpu(d, a, b, a.global_scale * b.global_scale * 0.75)


@needs_gemm_gpu
def test_fp4_gemm_gpu_compiled():
    torch._dynamo.reset()
    try:
        import triton  # noqa: F401

        backend = "inductor"
    except ImportError:  # inductor generates Triton code for CUDA tensors
        backend = "aot_eager"
    a, b = _gpu_operands("nvfp4")

    def f(a, b):
        return fp4_ops.fp4_gemm(a, b, out_dtype=torch.float32)

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    assert torch.equal(compiled(a, b), f(a, b))


@needs_gemm_gpu
def test_fp4_gemm_gpu_cuda_graph_reads_new_global_scales():
    a, b = _gpu_operands("nvfp4")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # first call (compile, workspace) on the capturing stream
        fp4_ops.fp4_gemm(a, b)
    torch.cuda.synchronize()
    from fp4_ops.sm90 import launcher

    kernels = launcher.cache_size()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        d = fp4_ops.fp4_gemm(a, b)
    assert launcher.cache_size() == kernels  # (later calls compile nothing)
    graph.replay()
    torch.cuda.synchronize()
    _check_on_cpu(d, a, b, a.global_scale * b.global_scale)
    a.global_scale.mul_(4.0)  # a new activation scale, read at replay on the device
    b.global_scale.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    _check_on_cpu(d, a, b, a.global_scale * b.global_scale)


@needs_gemm_gpu
@pytest.mark.parametrize("activations", ["dynamic", "static"])
def test_fp4_linear_gpu(activations):
    lin = _linear(k=512, n=256, bias=False).to(torch.bfloat16)
    gs = 0.002 if activations == "static" else None
    q_cpu = fp4_ops.FP4Linear.from_linear(lin, activations=activations, input_global_scale=gs)
    q_gpu = fp4_ops.FP4Linear.from_linear(
        lin.cuda(), activations=activations, input_global_scale=gs
    )
    assert torch.equal(q_gpu.weight_data.cpu(), q_cpu.weight_data)
    x = torch.randn(3, 40, 512, generator=torch.Generator().manual_seed(19)).to(torch.bfloat16)
    y = q_gpu(x.cuda())
    assert y.shape == (3, 40, 256) and y.dtype == torch.bfloat16
    a = fp4_ops.quantize(x.reshape(120, 512), global_scale=gs)  # (CPU: the reference)
    w = q_gpu.weight
    _check_on_cpu(y.reshape(120, 256), a, w, a.global_scale * w.global_scale.cpu())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("mnkl", [(1, 256, 512, 1), (100, 4096, 7168, 2)], ids=str)
def test_blackwell_dispatch_configuration_compiles(fmt, mnkl):
    # no B200 here: the configuration fp4_gemm sends to the Blackwell kernel, cross-compiled
    import blockwise_gemm_fp4 as bw

    vec = fp4_ops.FORMATS[fmt]
    sf_dtype = bw.SF_FORMATS[vec][0]
    tiler, cluster = bw.pick_tile_and_cluster(mnkl)
    assert bw.check_fp4_gemm_config(mnkl, vec, sf_dtype, "BFloat16", tiler, cluster) == []
    if mnkl[0] == 1:
        bw.compile_gemm(vec, sf_dtype, "BFloat16", tiler, cluster, 148)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_blackwell_adapter_hands_the_kernel_alpha_and_out_dtype(monkeypatch, out_dtype):
    """The Blackwell backend through the template's real ``gemm`` (its CUDA-only checks, compile
    and stream replaced; the kernel by a stand-in that writes a known D): A, B, SFA and SFB
    reach the kernel's parameters of their roles, its alpha pointer is the op's alpha tensor,
    used in place (a replayed graph rereads it), D is written in out_dtype at the address the
    kernel gets, and the op gets D [L, M, N] contiguous, without the kernel's row padding."""
    import contextlib
    from types import SimpleNamespace

    import blockwise_gemm_fp4 as bw

    calls, outputs = [], []

    def kernel(**kwargs):
        calls.append(kwargs)
        d = outputs[-1]
        d.copy_(torch.arange(d.numel()).reshape(d.shape))

    empty_d = bw.empty_d

    def recording_empty_d(*args):
        outputs.append(empty_d(*args))
        return outputs[-1]

    monkeypatch.setattr(bw, "empty_d", recording_empty_d)
    monkeypatch.setattr(bw, "_check_cuda_operands", lambda **_: None)
    monkeypatch.setattr(bw, "_compiled_kernel", lambda *_: kernel)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: SimpleNamespace(cuda_stream=5))
    monkeypatch.setattr(torch.cuda, "device", lambda *_: contextlib.nullcontext())
    a, b = _pair(m=20, n=34, k=64)  # N 34: rows padded to 16 bytes (40 or 36 elements)
    alpha = torch.tensor(0.625)
    sfa, sfb = a.scale.reshape(1, -1), b.scale.reshape(1, -1)  # (the op's [L, n] scales)
    d = fp4_ops.sm100.gemm_for_ops(a.data[None], b.data[None], sfa, sfb, 16, alpha, out_dtype)
    (args,) = calls
    roles = {"a_ptr": a.data, "b_ptr": b.data, "sfa_ptr": a.scale, "sfb_ptr": b.scale}
    for name, operand in roles.items():
        assert int(args[name].__tvm_ffi_opaque_ptr__()) == operand.data_ptr(), name
    assert int(args["alpha_ptr"].__tvm_ffi_opaque_ptr__()) == alpha.data_ptr()
    (written,) = outputs
    assert int(args["c_ptr"].__tvm_ffi_opaque_ptr__()) == written.data_ptr()
    kernel_dtypes = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
    assert args["c_ptr"].dtype.__name__ == kernel_dtypes[out_dtype]
    assert written.stride(1) > 34 and written.dtype == out_dtype
    assert d.shape == (1, 20, 34) and d.dtype == out_dtype and d.is_contiguous()
    assert torch.equal(d, torch.arange(20 * 34).reshape(1, 20, 34).to(out_dtype))


# ----------------------------------------------------------------------------- W4A16


def _w4a16_check(d, x, w, alpha):
    """D against reference.check_gemm_w4a16 on the CPU (x: the 16-bit activations)."""
    ok, info = reference.check_gemm_w4a16(
        d.cpu(), x.cpu(), w.data.cpu(), w.plain_scales().cpu(), w.sf_vec_size, alpha.cpu()
    )
    assert ok, str(info)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("shape", [(5, 40, 96), (2, 9, 24, 64)], ids=str)
def test_fp4_gemm_w4a16_cpu_is_the_reference(fmt, shape):
    """A bfloat16 tensor as ``a`` selects W4A16: the weight's global scale times alpha, the
    activations as they are (CPU: ``reference.reference_gemm_w4a16``)."""
    *lead, m, n, k = shape
    gen = torch.Generator().manual_seed(k + n)
    x = torch.randn(*lead, m, k, generator=gen).to(torch.bfloat16)
    w = fp4_ops.quantize(torch.randn(*lead, n, k, generator=gen), fmt)
    d = fp4_ops.fp4_gemm(x, w, out_dtype=torch.float32, alpha=-0.5)
    want = reference.reference_gemm_w4a16(
        x, w.data, w.plain_scales(), w.sf_vec_size, w.global_scale * -0.5, torch.float32
    )
    assert d.shape == (*lead, m, n) and torch.equal(d, want)
    compiled = torch.compile(lambda x, w: fp4_ops.fp4_gemm(x, w), fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, w), fp4_ops.fp4_gemm(x, w))


def test_fp4_gemm_w4a16_refuses_bad_operands():
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = fp4_ops.quantize(torch.randn(8, 64), "mxfp4")
    with pytest.raises(ValueError, match="bfloat16 activations"):
        fp4_ops.fp4_gemm(x.half(), w)
    with pytest.raises(ValueError, match="bfloat16 / float16 activations"):
        fp4_ops.fp4_gemm(x.float(), w)
    with pytest.raises(ValueError, match="K mismatch"):
        fp4_ops.fp4_gemm(x[:, :32], w)
    # (a valid NVFP4 FP4Tensor of K = 48, which the W4A16 kernel's 32-wide K steps cannot take)
    sf48 = torch.zeros(fp4_ops.layout.blocked_scale_shape(8, 48, 16), dtype=torch.float8_e4m3fn)
    w48 = fp4_ops.FP4Tensor(torch.zeros(8, 24, dtype=torch.uint8), sf48, torch.tensor(1.0), "nvfp4")
    with pytest.raises(ValueError, match="K a multiple of 32"):
        fp4_ops.fp4_gemm(torch.randn(4, 48).to(torch.bfloat16), w48)
    with pytest.raises(TypeError, match="FP4Tensor"):
        fp4_ops.fp4_gemm(x, x)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_linear_w4a16_holds_prepacked_weights(fmt):
    """``activations="bf16"``: the weight is stored prepacked (``prepack_weights``), reads back
    as the same FP4Tensor, and the layer is x @ dequant(W)^T + bias on the CPU too."""
    lin = _linear(k=96, n=40).to(torch.bfloat16)
    plain = fp4_ops.FP4Linear.from_linear(lin, fmt)
    w16 = fp4_ops.FP4Linear.from_linear(lin, fmt, activations="bf16")
    assert w16.weight_prepacked.shape == (40, 64)  # K = 96 padded to 128
    # one state-dict naming for both modes: weight_data in plain K order (prepacked at load)
    assert torch.equal(w16.state_dict()["weight_data"], plain.weight_data)
    assert torch.equal(w16.weight.data, plain.weight.data)
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    y = w16(x)
    w = plain.weight
    want = reference.reference_gemm_w4a16(
        x.reshape(6, 96), w.data, w.plain_scales(), w.sf_vec_size, w.global_scale, torch.float32
    )
    assert y.dtype == torch.bfloat16 and y.shape == (2, 3, 40)
    assert torch.equal(y.reshape(6, 40), (want.to(torch.bfloat16) + lin.bias))
    assert "activations=bf16" in repr(w16)


@needs_gemm_gpu
@pytest.mark.parametrize(
    "fmt, a_dtype",
    [("nvfp4", torch.bfloat16), ("nvfp4", torch.float16), ("mxfp4", torch.bfloat16)],
    ids=str,
)
@pytest.mark.parametrize("m", [1, 100, 3000])  # (decode, decode, prefill)
def test_fp4_gemm_w4a16_gpu(fmt, a_dtype, m):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("W4A16 runs on sm_90 only")
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 512, generator=gen).to(a_dtype).cuda()
    w = fp4_ops.quantize((torch.randn(200, 512, generator=gen) * 0.02).cuda(), fmt)
    d = fp4_ops.fp4_gemm(x, w, out_dtype=torch.float32, alpha=0.75)
    assert d.shape == (m, 200) and d.is_contiguous()
    _w4a16_check(d, x, w, w.global_scale * 0.75)


@needs_gemm_gpu
def test_fp4_linear_w4a16_gpu_cuda_graph():
    """FP4Linear(activations="bf16") on the GPU, replayed in a CUDA graph after the weight's
    global scale changed (read on the device at replay)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("W4A16 runs on sm_90 only")
    lin = _linear(k=512, n=256, bias=False).to(torch.bfloat16).cuda()
    layer = fp4_ops.FP4Linear.from_linear(lin, activations="bf16")
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    w = layer.weight
    _w4a16_check(y, x, w, w.global_scale)
    layer.weight_global_scale.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    _w4a16_check(y, x, layer.weight, layer.weight_global_scale)


@needs_gemm_gpu
def test_fp4_gemm_w4a16_gpu_cuda_graph_with_plain_weights():
    """``fp4_gemm(x, w)`` prepacks w on every call: after a first call, that prepacking and the
    GEMM are captured and replayed (new weight global scale read at replay)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("W4A16 runs on sm_90 only")
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(16, 512, generator=gen).to(torch.bfloat16).cuda()
    w = fp4_ops.quantize((torch.randn(200, 512, generator=gen) * 0.02).cuda())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp4_ops.fp4_gemm(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        d = fp4_ops.fp4_gemm(x, w)
    graph.replay()
    torch.cuda.synchronize()
    _w4a16_check(d, x, w, w.global_scale)
    w.global_scale.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    _w4a16_check(d, x, w, w.global_scale)
