# SPDX-License-Identifier: BSD-3-Clause
"""fp4_ops.moe: quantize_experts, fp4_grouped_gemm, fp4_moe and FP4MoE against reference.py.

The oracle is a plain loop over experts in float64 on reference.py's dequantization. The MoE
tests build w13 and x on the E2M1 grid with power-of-two scales, so that the first GEMM is exact
in fp32 and the only differences left are the float32 activation (a few ulps), the rounding of
the intermediates to x's dtype, the second GEMM's fp32 sums and the combine: each bounded in
``_moe_tolerance``. GPU tests (H200) compare the CUDA path with the same oracle.
"""

import pytest
import torch

import fp4_ops
import reference
from fp4_ops import moe
from fp4_ops.tensor import FP4Tensor

FMTS = ["nvfp4", "mxfp4"]
VEC = {"nvfp4": 16, "mxfp4": 32}
SCALE_DTYPE = {"nvfp4": torch.float8_e4m3fn, "mxfp4": torch.float8_e8m0fnu}
GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
U32 = 2.0**-24
# float32 silu / sigmoid / clamp products: Sleef's exp is within 1 ulp, and the activation adds
# at most 6 roundings of half an ulp; 2^-19 (32 ulps) bounds it with room to spare
ACT_REL = 2.0**-19
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (H200)")


# ----------------------------------------------------------------------------- operands


def _plain_scales(t: FP4Tensor) -> torch.Tensor:
    e, n, k = t.shape
    return reference.from_blocked(t.scale.reshape(e, -1), n, k // t.sf_vec_size)


def _ref_weights(t: FP4Tensor) -> torch.Tensor:
    """float64 [E, N, K]: reference.py's e2m1 * scale, times each expert's global scale."""
    values = reference.dequantize_fp4(t.data, _plain_scales(t), t.sf_vec_size).double()
    gs = t.global_scale.double().expand(t.shape[0])
    return values * gs[:, None, None]


def _grid_experts(e, n, k, fmt, gen, shift=0) -> FP4Tensor:
    """Random codes, block scales in {1/2, 1, 2} and per-expert global scales 2^-1 .. 2^-e
    (times 2^-shift)."""
    codes = torch.randint(0, 16, (e, n, k), generator=gen, dtype=torch.uint8)
    exps = torch.randint(-1, 2, (e, n, k // VEC[fmt]), generator=gen)
    scales = torch.pow(2.0, exps.float()).to(SCALE_DTYPE[fmt])
    blocked = reference.to_blocked(scales).view(e, -1, (k // VEC[fmt] + 3) // 4, 512)
    gs = torch.pow(2.0, -torch.arange(1 + shift, e + 1 + shift).float())
    return FP4Tensor(reference.pack_fp4(codes), blocked, gs, fmt)


def _grid_rows(rows, k, dtype, gen) -> torch.Tensor:
    """Values on the E2M1 grid (times 1 or 1/2), signed, each row reaching 6 (amax 6)."""
    x = GRID[torch.randint(0, 8, (rows, k), generator=gen)]
    x = x * torch.pow(2.0, -torch.randint(0, 2, (rows, k), generator=gen).float())
    x = x * (torch.randint(0, 2, (rows, k), generator=gen) * 2 - 1)
    x[:, 0] = 6.0
    return x.to(dtype)


def _offsets(counts) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)


COUNTS = {
    "ragged": [3, 0, 7, 1],
    "one-expert-takes-all": [0, 0, 11, 0],
    "atoms": [130, 0, 5, 70],  # (row groups across 128-row scale atoms)
    "single-row": [0, 1, 0, 0],
}


# ----------------------------------------------------------------------------- quantize_experts


@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_experts_is_reference_per_expert(fmt):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, 32, 64, generator=gen) * torch.tensor([1.0, 30.0, 0.01])[:, None, None]
    q = fp4_ops.quantize_experts(w, fmt)
    assert q.shape == (3, 32, 64) and q.global_scale.shape == (3,)
    plain = _plain_scales(q)
    for e in range(3):
        if fmt == "nvfp4":
            packed, scales, gs = reference.quantize_nvfp4(w[e])
        else:
            (packed, scales), gs = reference.quantize_mxfp4(w[e]), torch.tensor(1.0)
        assert torch.equal(q.data[e], packed)
        assert torch.equal(plain[e].view(torch.uint8), scales.view(torch.uint8))
        assert q.global_scale[e] == gs
    assert torch.equal(
        q.dequantize()[1],
        FP4Tensor.unchecked(q.data[1], q.scale[1], q.global_scale[1], fmt).dequantize(),
    )


def test_quantize_experts_refuses_bad_weights():
    with pytest.raises(ValueError, match=r"w must be \[E, N, K\]"):
        fp4_ops.quantize_experts(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"E >= 1 experts, got \(0, 32, 32\)"):
        fp4_ops.quantize_experts(torch.zeros(0, 32, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_ops.quantize_experts(torch.randn(2, 4, 48))
    with pytest.raises(TypeError, match="format"):
        fp4_ops.quantize_experts(torch.randn(2, 4, 64), 16)


def test_fp4tensor_per_expert_global_scale_checks():
    q = fp4_ops.quantize_experts(torch.randn(3, 8, 32), "nvfp4")
    with pytest.raises(ValueError, match="finite and positive"):
        FP4Tensor(q.data, q.scale, torch.tensor([1.0, 0.0, 1.0]), "nvfp4")
    with pytest.raises(ValueError, match="0-d float32"):
        FP4Tensor(q.data, q.scale, torch.ones(2), "nvfp4")
    with pytest.raises(ValueError, match="0-d float32"):
        FP4Tensor(q.data[0], q.scale[0], torch.ones(8), "nvfp4")


# ----------------------------------------------------------------------------- grouped GEMM


def _check_groups(d, a_rows, b, offsets, w4a4_a=None):
    """Every group of D against reference.check_gemm(_w4a16) with its expert: derived bound."""
    plain_b = _plain_scales(b)
    bounds = offsets.tolist()
    gs = b.global_scale.expand(b.shape[0])
    for e in range(b.shape[0]):
        r0, r1 = bounds[e], bounds[e + 1]
        if r1 == r0:
            continue
        if w4a4_a is None:
            ok, info = reference.check_gemm_w4a16(
                d[r0:r1], a_rows[r0:r1], b.data[e], plain_b[e], b.sf_vec_size, gs[e]
            )
        else:
            a_plain = reference.from_blocked(
                w4a4_a.scale.reshape(-1), w4a4_a.shape[0], w4a4_a.shape[1] // b.sf_vec_size
            )
            alpha = w4a4_a.global_scale * gs[e]
            ok, info = reference.check_gemm(
                d[r0:r1],
                w4a4_a.data[r0:r1],
                b.data[e],
                a_plain[r0:r1],
                plain_b[e],
                b.sf_vec_size,
                alpha,
            )
        assert ok, f"expert {e}: {info}"


@pytest.mark.parametrize("counts", list(COUNTS.values()), ids=list(COUNTS))
@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_gemm_w4a16_is_each_experts_gemm(fmt, counts):
    gen = torch.Generator().manual_seed(2)
    b = fp4_ops.quantize_experts(torch.randn(4, 48, 64, generator=gen), fmt)
    offsets = _offsets(counts)
    a = torch.randn(sum(counts), 64, generator=gen).bfloat16()
    d = fp4_ops.fp4_grouped_gemm(a, b, offsets, out_dtype=torch.float32)
    assert d.shape == (sum(counts), 48)
    _check_groups(d, a, b, offsets)


@pytest.mark.parametrize("counts", list(COUNTS.values()), ids=list(COUNTS))
@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_gemm_w4a4_is_each_experts_gemm(fmt, counts):
    gen = torch.Generator().manual_seed(3)
    b = fp4_ops.quantize_experts(torch.randn(4, 40, 96, generator=gen), fmt)
    offsets = _offsets(counts)
    a = fp4_ops.quantize(torch.randn(sum(counts), 96, generator=gen), fmt)
    d = fp4_ops.fp4_grouped_gemm(a, b, offsets, out_dtype=torch.bfloat16)
    _check_groups(d, None, b, offsets, w4a4_a=a)


def test_grouped_gemm_reads_only_the_experts_with_rows():
    """An expert without rows is never read: NaN scale bytes there change nothing (and the CPU
    path refuses them where the expert has rows)."""
    gen = torch.Generator().manual_seed(4)
    b = fp4_ops.quantize_experts(torch.randn(3, 32, 64, generator=gen), "nvfp4")
    poisoned = b.scale.clone()
    poisoned[1].view(torch.uint8).fill_(0x7F)
    bad = FP4Tensor(b.data, poisoned, b.global_scale, "nvfp4")
    a = torch.randn(6, 64, generator=gen).bfloat16()
    offsets = _offsets([2, 0, 4])
    assert torch.equal(
        fp4_ops.fp4_grouped_gemm(a, bad, offsets), fp4_ops.fp4_grouped_gemm(a, b, offsets)
    )
    with pytest.raises(ValueError, match="NaN encoding"):
        fp4_ops.fp4_grouped_gemm(a, bad, _offsets([2, 1, 3]))


def test_grouped_gemm_without_rows_is_empty():
    b = fp4_ops.quantize_experts(torch.randn(2, 16, 32), "nvfp4")
    d = fp4_ops.fp4_grouped_gemm(torch.empty(0, 32, dtype=torch.bfloat16), b, _offsets([0, 0]))
    assert d.shape == (0, 16)


def _bad_offsets():
    ok = _offsets([2, 1, 3])
    return {
        "int64": (ok.long(), ValueError, "must be int32"),
        "short": (ok[:-1], ValueError, r"must be \[E \+ 1\]"),
        "2-D": (ok[None], ValueError, r"must be \[E \+ 1\]"),
        "not-monotone": (
            torch.tensor([0, 3, 2, 6], dtype=torch.int32),
            ValueError,
            "non-decreasing",
        ),
        "not-from-0": (torch.tensor([1, 3, 4, 6], dtype=torch.int32), ValueError, "start at 0"),
        "not-to-rows": (torch.tensor([0, 3, 4, 5], dtype=torch.int32), ValueError, "end at"),
        "list": ([0, 2, 3, 6], TypeError, "group_offsets must be"),
    }


@pytest.mark.parametrize("case", list(_bad_offsets()))
def test_bad_group_offsets_are_refused(case):
    offsets, error, match = _bad_offsets()[case]
    b = fp4_ops.quantize_experts(torch.randn(3, 16, 32), "nvfp4")
    a = torch.randn(6, 32).bfloat16()
    with pytest.raises(error, match=match):
        fp4_ops.fp4_grouped_gemm(a, b, offsets)


def test_bad_grouped_operands_are_refused():
    b = fp4_ops.quantize_experts(torch.randn(3, 16, 32), "nvfp4")
    offsets = _offsets([2, 1, 3])
    a = torch.randn(6, 32).bfloat16()
    with pytest.raises(ValueError, match=r"experts \[E, N, K\]"):
        fp4_ops.fp4_grouped_gemm(a, fp4_ops.quantize(torch.randn(16, 32)), offsets)
    with pytest.raises(ValueError, match="K = 32"):
        fp4_ops.fp4_grouped_gemm(torch.randn(6, 64).bfloat16(), b, offsets)
    with pytest.raises(ValueError, match="bfloat16 / float16 activations"):
        fp4_ops.fp4_grouped_gemm(a.float(), b, offsets)
    with pytest.raises(ValueError, match="a is mxfp4 but b is nvfp4"):
        fp4_ops.fp4_grouped_gemm(fp4_ops.quantize(a.float(), "mxfp4"), b, offsets)
    with pytest.raises(ValueError, match="out_dtype"):
        fp4_ops.fp4_grouped_gemm(a, b, offsets, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="b must be"):
        fp4_ops.fp4_grouped_gemm(a, b.data, offsets)
    # (W4A4: the caller's activations' block scales are checked as the weights' are)
    q = fp4_ops.quantize(a.float())
    q.scale.view(torch.uint8).view(-1)[1] = 0x7F  # an E4M3 NaN: row 0, block 1
    with pytest.raises(ValueError, match="NaN"):
        fp4_ops.fp4_grouped_gemm(q, b, offsets)


# ----------------------------------------------------------------------------- fp4_moe oracle


def _ref_activation(h: torch.Tensor, activation: str) -> torch.Tensor:
    """float64 activations of float64 h [..., 2I]: silu(gate) * up with the gate half first, or
    gpt-oss's clamped SwiGLU on interleaved rows (transformers' GptOssExperts)."""
    if activation == "silu":
        gate, up = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2 :]
        return gate * torch.sigmoid(gate) * up
    gate, up = h[..., 0::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
    return (up + 1) * gate * torch.sigmoid(1.702 * gate)


def _half_ulp(mag: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return torch.zeros_like(mag)
    _, e = torch.frexp(mag)
    return torch.ldexp(torch.full_like(mag, torch.finfo(dtype).eps / 2), e - 1)


def _moe_reference(x, w13, w2, tw, ids, activation, b13, b2, w4a4):
    """(out float64 [T, H], its bound): fp4_moe's definition for every (token, slot) pair
    against its expert's float64 weights, then the weighted sum over the slots."""
    dtype, (t, k), i = x.dtype, ids.shape, w2.shape[2]
    experts = ids.reshape(-1).long()
    W13, W2 = _ref_weights(w13)[experts], _ref_weights(w2)[experts]
    x64 = _ref_quantized(x, w13.format) if w4a4 else x.double()
    rows = x64.repeat_interleave(k, dim=0)
    # (grid operands: this sum is exact, so it rounds to x's dtype once, as fp4_moe's does)
    h = torch.einsum("pnk,pk->pn", W13, rows).to(dtype).double()
    if b13 is not None:
        h = h + b13.double()[experts]
    a = _ref_activation(h, activation)
    if w4a4:
        # the activations, quantized per call as one tensor; fp4_moe's differ by ACT_REL at
        # most, which moves no code (asserted), only their global scale (by ACT_REL)
        a = _ref_quantized(a.float(), w2.format, robust=True)
        d_a = None
    else:
        d_a = ACT_REL * a.abs() + _half_ulp(a.abs() * (1 + ACT_REL), dtype)
    y = torch.einsum("pnk,pk->pn", W2, a)
    abs_sum = torch.einsum("pnk,pk->pn", W2.abs(), a.abs())
    d_y = reference.gemm_tolerance(i, dtype, y.float(), (abs_sum * (1 + ACT_REL)).float())
    d_y = d_y + (2 * ACT_REL * abs_sum if w4a4 else torch.einsum("pnk,pk->pn", W2.abs(), d_a))
    if b2 is not None:
        y = y + b2.double()[experts]
    w = tw.double().reshape(-1, 1)
    out = (w * y).view(t, k, -1).sum(1)
    bound = (w.abs() * (d_y + (k + 2) * U32 * (y.abs() + d_y))).view(t, k, -1).sum(1)
    return out, bound + _half_ulp(out.abs() + bound, dtype)


def _ref_quantized(v: torch.Tensor, fmt: str, robust: bool = False) -> torch.Tensor:
    """float64 values of reference.py's quantization of v [rows, K] (one dynamic global scale);
    ``robust``: asserted to be the same codes and block scales for every input within ACT_REL of
    v (nothing on a rounding boundary)."""
    factors = (1 - 2 * ACT_REL, 1.0, 1 + 2 * ACT_REL) if robust else (1.0,)
    variants = []
    for f in factors:
        u = (v.double() * f).float()
        if fmt == "nvfp4":
            # (the global scale of v itself: its drift is in the bound, not in the codes)
            packed, scales, gs = reference.quantize_nvfp4(u, v.abs().amax() / 2688.0)
        else:
            (packed, scales), gs = reference.quantize_mxfp4(u), torch.tensor(1.0)
        variants.append((packed, scales, gs))
    packed, scales, gs = variants[len(variants) // 2]
    for other in variants:
        same = torch.equal(other[0], packed)
        same = same and torch.equal(other[1].view(torch.uint8), scales.view(torch.uint8))
        assert same, "test data: an activation sits on a rounding boundary; pick another seed"
    values = reference.dequantize_fp4(packed, scales, VEC[fmt]).double()
    return values * gs.double()


# ----------------------------------------------------------------------------- fp4_moe


def _routing(case, t, k, e, gen):
    """(topk_ids int64 [T, k], topk_weights float32 [T, k]) of a routing case."""
    if case == "random":
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    elif case == "one-expert-takes-all":
        ids = torch.full((t, k), 2)
    elif case == "empty-experts":  # (experts 1 and 2 get nothing)
        ids = torch.tensor([0, 3])[torch.randint(0, 2, (t, k), generator=gen)]
    else:  # "ties": equal weights, and a token's slots may repeat an expert
        ids = torch.randint(0, e, (t, k), generator=gen)
        return ids, torch.full((t, k), 0.5)
    return ids, torch.rand(t, k, generator=gen)


def _moe_case(fmt, activation, t=6, k=3, e=4, h=64, i=32, bias=False, seed=5, dtype=None):
    gen = torch.Generator().manual_seed(seed)
    # (W4A4: h mostly inside gpt-oss's clamp, whose equal clamped values would put quantized
    # activations exactly on rounding ties)
    shift = 5 if dtype == torch.float32 else 0
    w13 = _grid_experts(e, 2 * i, h, fmt, gen, shift)
    w2 = fp4_ops.quantize_experts(torch.randn(e, h, i, generator=gen), fmt)
    x = _grid_rows(t, h, dtype or torch.bfloat16, gen)
    b13 = b2 = None
    if bias:  # (multiples of 1/16 below 4: exact in every dtype and in the float32 sums)
        b13 = torch.randint(-64, 64, (e, 2 * i), generator=gen).float() / 16
        b2 = torch.randint(-64, 64, (e, h), generator=gen).float() / 16
    return x, w13, w2, b13, b2, gen


def _assert_within(out, ref, bound, what=""):
    err = (out.double() - ref).abs()
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"{what}: {int((err > bound).sum())} of {err.numel()} outside the bound; worst at "
        f"{worst}: {out.flatten()[worst].item()} vs {ref.flatten()[worst].item()} "
        f"(bound {bound.flatten()[worst].item():.3e})"
    )


ROUTINGS = ["random", "one-expert-takes-all", "empty-experts", "ties"]


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4_moe_w4a16_is_the_per_expert_loop(fmt, activation, routing):
    x, w13, w2, b13, b2, gen = _moe_case(fmt, activation, bias=activation == "swigluoai")
    ids, tw = _routing(routing, x.shape[0], 3, 4, gen)
    out = fp4_ops.fp4_moe(x, w13, w2, tw, ids.int(), activation, w13_bias=b13, w2_bias=b2)
    assert out.shape == x.shape and out.dtype == x.dtype
    ref, bound = _moe_reference(x, w13, w2, tw, ids, activation, b13, b2, w4a4=False)
    _assert_within(out, ref, bound, f"{fmt} {activation} {routing}")


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4_moe_combine_rounds_once(fmt, activation):
    """The combine, bit for bit: each (token, slot) pair's expert output y (the layer run on that
    token alone, one slot of weight 1: y exactly) times its weight, summed in float32 and rounded
    to x's dtype once. Signed weights and a token whose slots repeat one expert with weights that
    cancel (1, -0.99) make a rounding per slot visible."""
    x, w13, w2, _, _, gen = _moe_case(fmt, activation, t=5, k=4)
    ids = torch.randint(0, 4, (5, 4), generator=gen)
    tw = torch.randn(5, 4, generator=gen)
    ids[0], tw[0] = torch.tensor([1, 1, 1, 2]), torch.tensor([1.0, -0.99, 0.25, 0.5])
    out = fp4_ops.fp4_moe(x, w13, w2, tw, ids.int(), activation)
    one = torch.ones(1, 1)
    want = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            pair = ids[t : t + 1, s : s + 1].int()
            y = fp4_ops.fp4_moe(x[t : t + 1], w13, w2, one, pair, activation)
            want[t] += tw[t, s] * y[0].float()
    assert torch.equal(out, want.to(x.dtype))


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4_moe_w4a4_is_the_per_expert_loop(fmt, activation):
    x, w13, w2, b13, b2, gen = _moe_case(fmt, activation, dtype=torch.float32, bias=True)
    ids, tw = _routing("random", x.shape[0], 3, 4, gen)
    args = (x, w13, w2, tw, ids, activation)
    out = fp4_ops.fp4_moe(*args, w13_bias=b13, w2_bias=b2, activations="dynamic")
    ref, bound = _moe_reference(x, w13, w2, tw, ids, activation, b13, b2, w4a4=True)
    _assert_within(out, ref, bound, f"W4A4 {fmt} {activation}")


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fp4_moe_adds_float32_biases_at_their_own_precision(dtype, activation):
    """x = 0, so each pair's h is its expert's w13 bias as given: a float32 bias and the same
    bias rounded to x's dtype (values that differ below x's precision) give different outputs;
    the same bias gives the same bits."""
    _, w13, w2, _, _, gen = _moe_case("nvfp4", activation, t=4, k=2)
    x = torch.zeros(4, 64, dtype=dtype)
    ids, tw = _routing("random", 4, 2, 4, gen)
    b13 = torch.randn(4, 64, generator=gen) * 2  # (float32: not representable in x's dtype)
    assert not torch.equal(b13, b13.to(dtype).float())

    def run(bias):
        return fp4_ops.fp4_moe(x, w13, w2, tw, ids, activation, w13_bias=bias)

    assert torch.equal(run(b13), run(b13.clone()))
    assert not torch.equal(run(b13), run(b13.to(dtype).float()))


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_moe_activation_is_the_published_formula_past_every_clamp(activation):
    """``apply_activation`` in float32 against the formulas written out in float64, with gate
    and up values past gpt-oss's clamp (7) on both sides: SiLU(gate) * up with gate and up the
    two halves; gpt-oss's (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7), gate
    and up interleaved."""
    gen = torch.Generator().manual_seed(9)
    h = (torch.rand(16, 64, generator=gen) - 0.5) * 24  # (-12 .. 12)
    got = moe.apply_activation(h, activation).double()
    h = h.double()
    if activation == "silu":
        gate, up = h[:, :32], h[:, 32:]
        z = gate
        want = gate * torch.sigmoid(z) * up
    else:
        gate, up = h[:, 0::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
        z = 1.702 * gate
        want = (up + 1) * gate * torch.sigmoid(z)
    assert bool((h[:, 0::2] < -7).any() and (h[:, 0::2] > 7).any())
    # (float32: a few roundings of 2^-24 each, and sigmoid's tail e^z carries z's own rounding,
    # |z| 2^-24 relative, into the result)
    bound = (2.0**-20 + 2.0**-22 * z.abs()) * want.abs() + 2.0**-126
    assert bool(((got - want).abs() <= bound).all())


def test_fp4_moe_decode_token_and_no_tokens():
    x, w13, w2, _, _, gen = _moe_case("nvfp4", "silu", t=1)
    ids, tw = _routing("random", 1, 3, 4, gen)
    ref, bound = _moe_reference(x, w13, w2, tw, ids, "silu", None, None, w4a4=False)
    _assert_within(fp4_ops.fp4_moe(x, w13, w2, tw, ids), ref, bound, "one token")
    empty = fp4_ops.fp4_moe(x[:0], w13, w2, tw[:0], ids[:0])
    assert empty.shape == (0, 64)


def test_expert_routing_sorts_pairs_stably_without_host_values():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])
    order, sorted_ids, offsets = moe.expert_routing(ids, 5)
    assert order.tolist() == [1, 4, 0, 2, 5, 3]
    assert sorted_ids.tolist() == [0, 0, 2, 2, 2, 3]
    assert offsets.dtype == torch.int32 and offsets.tolist() == [0, 2, 2, 5, 6, 6]


def _bad_routing():
    ids = torch.tensor([[0, 1], [2, 3]])
    w = torch.rand(2, 2)
    return {
        "id-too-large": (ids + 1, w, ValueError, r"topk_ids must lie in \[0, 4\)"),
        "id-negative": (ids - 1, w, ValueError, r"topk_ids must lie in \[0, 4\)"),
        "float-ids": (ids.float(), w, ValueError, "int32 or int64"),
        "1-d-ids": (ids.reshape(-1), w, ValueError, r"\[T, k\]"),
        "wrong-tokens": (ids[:1], w[:1], ValueError, r"\[T, k\] = \[2"),
        "weights-shape": (ids, w[:, :1], ValueError, "one shape"),
        "int-weights": (ids, ids, ValueError, "floating point"),
        "ids-list": (ids.tolist(), w, TypeError, "topk_ids must be"),
    }


@pytest.mark.parametrize("case", list(_bad_routing()))
def test_bad_routing_is_refused(case):
    ids, w, error, match = _bad_routing()[case]
    x, w13, w2, _, _, _ = _moe_case("nvfp4", "silu", t=2)
    with pytest.raises(error, match=match):
        fp4_ops.fp4_moe(x, w13, w2, w, ids)


def test_bad_moe_arguments_are_refused():
    x, w13, w2, _, _, _ = _moe_case("nvfp4", "silu", t=2)
    ids, w = torch.tensor([[0, 1], [2, 3]]), torch.rand(2, 2)
    cases = [
        (dict(activation="gelu"), ValueError, "activation must be one of"),
        (dict(activations="static"), ValueError, "activations must be one of"),
        (dict(w2=w13), ValueError, r"\[E, 2I, H\] and \[E, H, I\]"),
        (
            dict(w2=fp4_ops.quantize_experts(torch.randn(4, 64, 32), "mxfp4")),
            ValueError,
            "w13 is nvfp4 but w2 is mxfp4",
        ),
        (dict(x=x.float()), ValueError, "bfloat16 / float16"),
        (dict(x=x[:, :32]), ValueError, r"x must be \[T, H\]"),
        (dict(w13_bias=torch.zeros(4, 63)), ValueError, r"w13_bias must be floating point"),
        (dict(w2_bias=torch.zeros(4, 64, dtype=torch.int32)), ValueError, "w2_bias"),
        (
            dict(  # (NVFP4 experts of I = 48: valid for W4A16, not for per-call quantization)
                w13=FP4Tensor.from_plain(*reference.quantize_nvfp4(torch.randn(4, 96, 64))),
                w2=FP4Tensor.from_plain(*reference.quantize_nvfp4(torch.randn(4, 64, 48))),
                activations="dynamic",
            ),
            ValueError,
            r"H = 64 and I = 48 per call: both must be multiples of 32",
        ),
    ]
    for change, error, match in cases:
        args = dict(x=x, w13=w13, w2=w2, topk_weights=w, topk_ids=ids) | change
        with pytest.raises(error, match=match):
            fp4_ops.fp4_moe(**args)


def test_no_backward():
    x, w13, w2, _, _, gen = _moe_case("nvfp4", "silu", t=2)
    ids, tw = _routing("random", 2, 3, 4, gen)
    tw.requires_grad_(True)
    x = x.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference only"):
        fp4_ops.fp4_moe(x, w13, w2, tw, ids).float().sum().backward()


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_compile_fullgraph_matches_eager(activations):
    torch._dynamo.reset()
    x, w13, w2, b13, b2, gen = _moe_case("mxfp4", "swigluoai", bias=True)
    ids, tw = _routing("random", x.shape[0], 3, 4, gen)

    def f(x, tw, ids, offsets):
        out = fp4_ops.fp4_moe(
            x, w13, w2, tw, ids, "swigluoai", w13_bias=b13, w2_bias=b2, activations=activations
        )
        return out, fp4_ops.fp4_grouped_gemm(
            x[:5], w2.__class__(w13.data, w13.scale, w13.global_scale, "mxfp4"), offsets
        )

    offsets = _offsets([2, 0, 3, 0])
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(x, tw, ids, offsets), f(x, tw, ids, offsets), strict=True):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------- FP4MoE


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4moe_module_is_fp4_moe_on_its_experts(fmt, activations):
    gen = torch.Generator().manual_seed(6)
    w13, w2 = torch.randn(4, 64, 64, generator=gen), torch.randn(4, 64, 32, generator=gen)
    b13, b2 = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    layer = fp4_ops.FP4MoE.from_experts(w13, w2, fmt, "swigluoai", activations, b13, b2)
    q13, q2 = fp4_ops.quantize_experts(w13, fmt), fp4_ops.quantize_experts(w2, fmt)
    x = torch.randn(5, 64, generator=gen).bfloat16()
    ids, tw = _routing("random", 5, 2, 4, gen)
    want = fp4_ops.fp4_moe(
        x, q13, q2, tw, ids, "swigluoai", w13_bias=b13, w2_bias=b2, activations=activations
    )
    assert torch.equal(layer(x, tw, ids), want)
    for name, q in (("w13", q13), ("w2", q2)):
        got = layer.expert_weights(name)
        assert torch.equal(got.data, q.data) and torch.equal(got.global_scale, q.global_scale)


def test_fp4moe_state_dict_round_trip_and_refusals():
    gen = torch.Generator().manual_seed(7)
    w13, w2 = torch.randn(3, 64, 32, generator=gen), torch.randn(3, 32, 32, generator=gen)
    layer = fp4_ops.FP4MoE.from_experts(w13, w2, "nvfp4")
    state = layer.state_dict()
    assert state["w13_data"].shape == (3, 64, 16) and state["w13_global_scale"].shape == (3,)
    fresh = fp4_ops.FP4MoE.from_experts(torch.randn(3, 64, 32), torch.randn(3, 32, 32), "nvfp4")
    fresh.load_state_dict(state)
    x = torch.randn(4, 32, generator=gen).bfloat16()
    ids, tw = _routing("random", 4, 2, 3, gen)
    assert torch.equal(fresh(x, tw, ids), layer(x, tw, ids))
    w4a4 = fp4_ops.FP4MoE.from_experts(torch.randn(3, 64, 32), w2, activations="dynamic")
    w4a4.load_state_dict(state)
    assert torch.equal(w4a4.expert_weights("w13").data, state["w13_data"])
    other = fp4_ops.FP4MoE.from_experts(w13, w2, "mxfp4")
    with pytest.raises(ValueError, match="format differs"):
        other.load_state_dict(state)
    # (same keys and shapes: only the extra state tells the gated activations apart)
    swiglu = fp4_ops.FP4MoE.from_experts(w13, w2, "nvfp4", "swigluoai")
    with pytest.raises(ValueError, match="activation differs: the checkpoint's is 'silu'"):
        swiglu.load_state_dict(state)
    bad = dict(state, w2_global_scale=torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="w2_global_scale must be finite and positive"):
        fresh.load_state_dict(bad)
    bigger = fp4_ops.FP4MoE.from_experts(torch.randn(4, 64, 32), torch.randn(4, 32, 32))
    with pytest.raises(ValueError, match="w13_data differs"):
        bigger.load_state_dict(state)
    # (packed codes come as uint8 or float4_e2m1fn_x2 only: other bytes are other values)
    for dtype in (torch.float16, torch.int8, torch.float8_e4m3fn):
        wrong = dict(state, w2_data=state["w2_data"].view(dtype))
        with pytest.raises(ValueError, match=f"w2_data differs: the checkpoint's is {dtype}"):
            fresh.load_state_dict(wrong)
    assert torch.equal(fresh(x, tw, ids), layer(x, tw, ids))  # (nothing loaded half-way)


FP4_PARTS = ("_codes", "_scale", "_global_scale")  # (the buffers whose dtype is a format's)


def _biased_layer(seed: int, cls=fp4_ops.FP4MoE):
    """A swigluoai layer with both biases: every optional buffer present."""
    gen = torch.Generator().manual_seed(seed)
    w13, w2 = torch.randn(3, 64, 32, generator=gen), torch.randn(3, 32, 32, generator=gen)
    b13, b2 = torch.randn(3, 64, generator=gen), torch.randn(3, 32, generator=gen)
    return cls.from_experts(w13, w2, "mxfp4", "swigluoai", w13_bias=b13, w2_bias=b2)


@pytest.mark.parametrize("cls", [fp4_ops.FP4MoE, fp4_ops.FP4Experts])
def test_fp4moe_state_dict_carries_every_buffer(cls):
    """A layer with every optional part: its state dict, loaded strictly into a layer of other
    values, makes every buffer (and so the output) the source's: no buffer left out of the
    state dict, or skipped on load."""
    layer, fresh = _biased_layer(8, cls), _biased_layer(9, cls)
    fresh.load_state_dict(layer.state_dict(), strict=True)
    for name, mine in layer.named_buffers():
        theirs = fresh.get_buffer(name)
        assert theirs.dtype == mine.dtype and torch.equal(
            theirs.view(torch.uint8), mine.view(torch.uint8)
        ), name
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(4, 32, generator=gen).bfloat16()
    ids, tw = _routing("random", 4, 2, 3, gen)
    # (transformers' experts modules take the ids before the weights)
    args = (x, ids, tw) if cls is fp4_ops.FP4Experts else (x, tw, ids)
    assert torch.equal(fresh(*args), layer(*args))


CASTS = {  # (each nn.Module cast, and the dtype it gives floating buffers)
    "half": (lambda m: m.half(), torch.float16),
    "bfloat16": (lambda m: m.bfloat16(), torch.bfloat16),
    "to(float16)": (lambda m: m.to(torch.float16), torch.float16),
    "double": (lambda m: m.double(), torch.float64),
}


@pytest.mark.parametrize("cast", list(CASTS))
def test_fp4moe_casts_reach_every_buffer_but_the_fp4_parts(cast):
    """``.half()`` / ``.bfloat16()`` / ``.to(dtype)`` cast the biases, as nn.Module casts any
    floating buffer; the FP4 parts (codes, scales, global scales) keep their dtypes."""
    layer = _biased_layer(11)
    before = {n: b.dtype for n, b in layer.named_buffers()}
    apply, dtype = CASTS[cast]
    apply(layer)
    for name, buffer in layer.named_buffers():
        fp4 = name.endswith(FP4_PARTS)
        assert buffer.dtype == (before[name] if fp4 else dtype), name
    assert {n for n in before if not n.endswith(FP4_PARTS)} == {"w13_bias", "w2_bias"}


def test_fp4moe_keeps_fp4_dtypes_through_casts_and_pickles():
    import pickle

    layer = fp4_ops.FP4MoE.from_experts(torch.randn(2, 64, 32), torch.randn(2, 32, 32))
    layer.half()
    assert layer.w13_scale.dtype == torch.float8_e4m3fn
    assert layer.w2_global_scale.dtype == torch.float32
    back = pickle.loads(pickle.dumps(layer))
    assert torch.equal(back.w13_scale.view(torch.uint8), layer.w13_scale.view(torch.uint8))


@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_side_hands_the_kernel_what_it_reads(fmt, monkeypatch):
    """The CUDA side of the grouped ops on Hopper, on CPU tensors with the sm_90 checks and the
    launcher stubbed: prepacked weights go to the kernel as they are, plain ones prepacked
    once; W4A4 hands over its rows as exact BF16 values with alpha to match; scales per expert,
    alpha and offsets as given."""
    from fp4_ops.sm90 import k_order, launcher

    calls = []
    monkeypatch.setattr(moe, "check_sm90", lambda *_: None)
    monkeypatch.setattr(moe, "runs_hopper_kernels", lambda _: True)
    monkeypatch.setattr(launcher, "grouped_gemm_for_ops", lambda *args: calls.append(args))
    gen = torch.Generator().manual_seed(14)
    b = fp4_ops.quantize_experts(torch.randn(3, 64, 96, generator=gen), fmt)
    a = torch.randn(5, 96, generator=gen).bfloat16()
    offsets, alpha = _offsets([2, 0, 3]), b.global_scale.float().expand(3).contiguous()
    prepacked = k_order.prepack_weights(b.data)
    for data, is_prepacked in ((prepacked, True), (b.data, False)):
        args = (a, data, b.scale, alpha, offsets, b.sf_vec_size, torch.float32, is_prepacked)
        moe.gpu_grouped_w4a16(*args)
        got_a, got_b, got_scale, vec, got_alpha, got_offsets, out_dtype, scale = calls.pop()
        assert torch.equal(got_a, a) and torch.equal(got_b, prepacked), is_prepacked
        assert scale is None
        assert got_b is data if is_prepacked else got_b is not data
        same_scales = torch.equal(
            got_scale.view(torch.uint8), b.scale.reshape(3, -1).view(torch.uint8)
        )
        assert same_scales and vec == b.sf_vec_size
        assert got_alpha is alpha and got_offsets is offsets and out_dtype == torch.float32
    q = fp4_ops.quantize(a.float(), fmt)
    a_alpha = q.global_scale * alpha
    args = (q.data, q.scale, prepacked, b.scale, a_alpha, offsets, b.sf_vec_size, torch.bfloat16)
    moe.gpu_grouped_w4a4(*args, True)
    got_a, got_b, _, _, got_alpha, _, out_dtype, _ = calls.pop()
    exact = reference.dequantize_fp4(q.data, _plain_scales_2d(q), b.sf_vec_size).double()
    assert got_a.dtype == torch.bfloat16 and out_dtype == torch.bfloat16
    assert torch.equal(got_a.double() * (got_alpha / a_alpha).double()[0], exact)
    assert torch.equal(got_b, prepacked)


@pytest.mark.parametrize("fmt", FMTS)
def test_w4a4_kernel_path_scales_alpha_by_what_undoes_its_exact_rows(fmt, monkeypatch):
    """The W4A4 layer's kernel path on Hopper (CPU tensors, kernels stubbed): the rows go to
    ``quantize_exact_rows`` in w's format, and the grouped GEMM gets its exact rows, each
    expert's global scale as alpha as it is, and its scalar for all alphas (its values and
    scalar: test_quantize_fp4.py, test_quantizer_ptx.py)."""
    from fp4_ops import quantizer
    from fp4_ops.sm90 import k_order, launcher

    calls, quantized = [], []
    exact = (torch.zeros(5, 96, dtype=torch.bfloat16), torch.tensor(3.0))
    monkeypatch.setattr(moe, "check_sm90", lambda *_: None)
    monkeypatch.setattr(moe, "runs_hopper_kernels", lambda _: True)
    monkeypatch.setattr(launcher, "grouped_gemm_for_ops", lambda *args: calls.append(args))
    monkeypatch.setattr(
        quantizer, "quantize_exact_rows", lambda *args: quantized.append(args) or exact
    )
    gen = torch.Generator().manual_seed(15)
    w = fp4_ops.quantize_experts(torch.randn(3, 64, 96, generator=gen), fmt)
    rows = torch.randn(5, 96, generator=gen).bfloat16() * 7
    offsets, gs = _offsets([2, 0, 3]), w.global_scale.float().expand(3).contiguous()
    prepacked = k_order.prepack_weights(w.data)
    moe._expert_gemm(rows, w, gs, offsets, "dynamic", prepacked, kernels=True)
    ((got_rows, vec),) = quantized
    assert got_rows is rows and vec == w.sf_vec_size
    values, got_b, _, vec, alpha, got_offsets, out_dtype, scale = calls.pop()
    assert values is exact[0] and scale is exact[1]
    assert got_b is prepacked and vec == w.sf_vec_size and got_offsets is offsets
    assert alpha is gs and out_dtype == torch.bfloat16


class _KernelStandIns:
    """``moe_kernels``' route / activate / combine_tokens on CPU tensors, each the torch
    step's arithmetic over the kernel's own contract (Routing's tables, float32 sums of each
    token's rows, the dtypes the kernels read: a float64 bias or weight is refused)."""

    def __init__(self):
        self.handed = {}

    def route(self, topk_ids, num_experts, x):
        order, sorted_ids, offsets = moe.expert_routing(topk_ids, num_experts)
        pairs = torch.arange(order.numel(), dtype=torch.int32)
        row_of = torch.empty_like(pairs).index_copy_(0, order, pairs)
        token_of = (order // topk_ids.shape[1]).int()
        ok = torch.ones(1, dtype=torch.int32)
        rows = x.index_select(0, token_of)
        return moe.moe_kernels.Routing(offsets, row_of, token_of, sorted_ids.int(), ok, rows)

    def activate(self, h, name, bias, expert_of):
        self.handed["w13_bias"] = bias
        hf = h.float() if bias is None else h.float() + self._read(bias).index_select(0, expert_of)
        return moe.apply_activation(hf, name).to(h.dtype)

    def combine_tokens(self, y, topk_weights, routes, bias):
        self.handed["topk_weights"], self.handed["w2_bias"] = topk_weights, bias
        yf = y.float()
        if bias is not None:
            yf = yf + self._read(bias).index_select(0, routes.expert_of)
        pairs = yf.index_select(0, routes.row_of).view(*topk_weights.shape, -1)
        return (pairs * self._read(topk_weights).unsqueeze(-1)).sum(1).to(y.dtype)

    @staticmethod
    def _read(t: torch.Tensor) -> torch.Tensor:
        assert t.dtype in moe.IN_DTYPES, f"the kernels read no {t.dtype}"
        return t.float()


KERNEL_PATH_CASES = {  # x, topk_weights and bias dtypes, activation, activations
    "bf16-silu": (torch.bfloat16, torch.float32, None, "silu", "bf16"),
    "bf16-swigluoai-float64": (torch.bfloat16, torch.float64, torch.float64, "swigluoai", "bf16"),
    "f16-swigluoai-bf16": (torch.float16, torch.bfloat16, torch.bfloat16, "swigluoai", "bf16"),
    "float32-silu-w4a4": (torch.float32, torch.float16, torch.float32, "silu", "dynamic"),
}


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("case", list(KERNEL_PATH_CASES))
def test_kernel_path_composes_its_kernels_as_the_torch_steps_do(monkeypatch, case, fmt):
    """``fp4_moe``'s path for plain CUDA tensors, taken with CPU tensors (the kernels' stand-ins
    above, the GPU checks stubbed, the grouped GEMMs' CPU side; W4A4 as on the sm_100 family):
    the routing tables, biases and routing weights it hands the kernels give the torch path's
    result bit for bit, and reach them in dtypes the kernels read."""
    x_dtype, weights_dtype, bias_dtype, activation, activations = KERNEL_PATH_CASES[case]
    if fmt == "mxfp4" and x_dtype == torch.float16 and activations == "bf16":
        pytest.skip("W4A16 takes float16 activations with NVFP4 only")
    gen = torch.Generator().manual_seed(16)
    w13 = fp4_ops.quantize_experts(torch.randn(5, 64, 64, generator=gen), fmt)
    w2 = fp4_ops.quantize_experts(torch.randn(5, 64, 32, generator=gen), fmt)
    x = (torch.randn(7, 64, generator=gen) * 2).to(x_dtype)
    ids, _ = _routing("ties", 7, 3, 5, gen)
    tw = torch.rand(7, 3, generator=gen, dtype=torch.float64).to(weights_dtype)
    biases = {}
    if bias_dtype is not None:
        biases = dict(
            w13_bias=torch.randn(5, 64, generator=gen, dtype=torch.float64).to(bias_dtype),
            w2_bias=torch.randn(5, 64, generator=gen, dtype=torch.float64).to(bias_dtype),
        )
    args = (x, w13, w2, tw, ids.int(), activation)
    want = fp4_ops.fp4_moe(*args, **biases, activations=activations)

    kernels = _KernelStandIns()
    for name in ("route", "activate", "combine_tokens"):
        monkeypatch.setattr(moe.moe_kernels, name, getattr(kernels, name))
    monkeypatch.setattr(moe, "eager", lambda *_: True)
    monkeypatch.setattr(moe, "check_sm90", lambda *_: None)
    monkeypatch.setattr(moe, "runs_hopper_kernels", lambda _: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # (x's index: a CPU's None)
    got = fp4_ops.fp4_moe(*args, **biases, activations=activations)
    assert kernels.handed["topk_weights"].dtype == (
        torch.float32 if weights_dtype == torch.float64 else weights_dtype
    )
    assert got.dtype == want.dtype and torch.equal(got, want)


def _plain_scales_2d(t: FP4Tensor) -> torch.Tensor:
    rows, k = t.shape
    return reference.from_blocked(t.scale.reshape(-1), rows, k // t.sf_vec_size)


def test_exact_bf16_rows_holds_every_code_at_every_scale():
    """The Hopper W4A4 path's activations in BF16: e2m1 x block scale for every code and every
    scale byte (E4M3: the non-negative, non-NaN ones; E8M0: all but NaN), exact once alpha's
    power of two is applied, where a plain cast would overflow or round."""
    codes = torch.arange(16, dtype=torch.uint8)
    for fmt, scale_bytes in (("nvfp4", range(0x7F)), ("mxfp4", range(0xFF))):
        vec = VEC[fmt]
        scales = torch.tensor(list(scale_bytes), dtype=torch.uint8).view(SCALE_DTYPE[fmt])
        rows = scales.numel()
        # row r: all 16 codes, (vec / 16) times, under scale r
        data = reference.pack_fp4(codes.repeat(rows, vec // 16))
        plain = scales.reshape(rows, 1)
        alpha = torch.ones(3)
        values, got_alpha = moe.exact_bf16_rows(data, reference.to_blocked(plain), alpha, vec)
        # (float64 by hand: float32 itself overflows at 6 x 2^127)
        signed = torch.cat((GRID, -GRID)).double()
        want = signed[codes.long()].repeat(rows, vec // 16) * plain.double()
        assert values.dtype == torch.bfloat16
        assert torch.equal(values.double() * got_alpha[0].double(), want), fmt
        assert torch.equal(got_alpha, alpha * got_alpha[0])


# ----------------------------------------------------------------------------- GPU (H200)


def _gpu_is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _gpu_is_hopper(), reason="needs an H100 / H200 GPU")


def _cuda(t: FP4Tensor) -> FP4Tensor:
    return FP4Tensor(t.data.cuda(), t.scale.cuda(), t.global_scale.cuda(), t.format)


@needs_cuda
def test_routing_and_checks_gpu_run_without_host_sync():
    """The torch routing steps (the traced path's) and the offsets check on CUDA tensors: no
    host sync (the sync debug mode turns one into an error), the same metadata as on the
    CPU. The kernel path's own no-sync test is in test_moe_kernels.py."""
    gen = torch.Generator().manual_seed(10)
    ids_cpu, tw_cpu = _routing("random", 16, 4, 32, gen)
    ids, tw = ids_cpu.int().cuda(), tw_cpu.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe.check_routing(tw, ids, 16, 32, ids.device)
        order, sorted_ids, offsets = moe.expert_routing(ids, 32)
        moe.check_group_offsets(offsets, 32, 64, ids.device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = moe.expert_routing(ids_cpu, 32)
    for got, expect in zip((order, sorted_ids, offsets), want, strict=True):
        assert torch.equal(got.cpu(), expect)


@needs_hopper
@pytest.mark.parametrize("counts", list(COUNTS.values()), ids=list(COUNTS))
@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_gemm_w4a4_gpu_is_each_experts_gemm(fmt, counts):
    """W4A4 on Hopper (activations made exact BF16, then the grouped kernel): every group
    against reference.check_gemm with its expert."""
    gen = torch.Generator().manual_seed(13)
    b = fp4_ops.quantize_experts(torch.randn(4, 256, 192, generator=gen), fmt)
    a = fp4_ops.quantize(torch.randn(sum(counts), 192, generator=gen), fmt)
    offsets = _offsets(counts)
    d = fp4_ops.fp4_grouped_gemm(_cuda(a), _cuda(b), offsets.cuda(), out_dtype=torch.float32)
    _check_groups(d.cpu(), None, b, offsets, w4a4_a=a)


# (experts, N, K, rows per expert, activations): decode (a few single rows among many
# experts, K groups), groups of several token tiles, ragged N and a K of whole 32s only
GROUPED_GPU_CASES = {
    "decode-8-of-32": (32, 384, 512, [int(e % 4 == 1) for e in range(32)], torch.bfloat16),
    "k-groups": (8, 512, 2048, [2, 0, 3, 0, 0, 1, 0, 2], torch.bfloat16),
    "tiles-per-group": (4, 256, 192, [300, 0, 5, 0], torch.bfloat16),
    "ragged-n-k-f16": (3, 200, 160, [17, 40, 0], torch.float16),
    "mid-tile-groups": (5, 128, 256, [70, 1, 0, 90, 33], torch.bfloat16),
    # (the schedule sums the groups' tiles 32 groups at a time)
    "groups-past-a-warp": (70, 256, 256, [0] * 40 + [5] + [0] * 27 + [17, 1], torch.bfloat16),
    "whole-warps-of-groups": (64, 128, 256, [e % 3 for e in range(64)], torch.bfloat16),
}


@needs_hopper
@pytest.mark.parametrize("case", list(GROUPED_GPU_CASES), ids=list(GROUPED_GPU_CASES))
@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_gemm_w4a16_gpu_cases(fmt, case):
    """The grouped kernel on the shapes it must tile: every group against its expert's
    reference GEMM (derived bound), on random weights and rows."""
    e, n, k, counts, dtype = GROUPED_GPU_CASES[case]
    if dtype == torch.float16 and fmt == "mxfp4":
        pytest.skip("MXFP4 weights need bfloat16 activations (E8M0 scales exceed float16)")
    gen = torch.Generator().manual_seed(11)
    b = fp4_ops.quantize_experts(torch.randn(e, n, k, generator=gen), fmt)
    a = torch.randn(sum(counts), k, generator=gen).to(dtype)
    offsets = _offsets(counts)
    for out_dtype in (torch.float32, torch.bfloat16):
        d = fp4_ops.fp4_grouped_gemm(a.cuda(), _cuda(b), offsets.cuda(), out_dtype=out_dtype)
        assert d.shape == (a.shape[0], n) and d.dtype == out_dtype
        _check_groups(d.float().cpu() if out_dtype == torch.float32 else d.cpu(), a, b, offsets)


# (experts, N, K, rows per expert, token tile, weight rows, K split, K groups): one row (the
# pick's own case), empty experts first, between and last, groups of several token tiles,
# a split that leaves its last unit short, ragged N, K groups beside the split
GROUPED_SPLIT_CASES = {
    "one-row": (16, 512, 2048, [0] * 9 + [1] + [0] * 6, 8, 128, 6, 1),
    "ragged-groups": (6, 384, 1024, [0, 3, 0, 9, 1, 0], 8, 128, 3, 1),
    "tiles-per-group": (4, 256, 2048, [70, 0, 5, 17], 16, 64, 4, 1),
    "ragged-n": (3, 200, 1536, [2, 5, 1], 8, 128, 2, 1),
    "k-groups": (8, 512, 4096, [2, 0, 3, 0, 0, 1, 0, 2], 8, 64, 2, 4),
}


def _forced_config(monkeypatch, tile, split, k_groups):
    """Make the grouped launcher pick ``tile`` (token tile, weight rows), ``split`` and
    ``k_groups`` for every problem, past its caches."""
    from fp4_ops.sm90 import launcher as r90

    def for_groups(
        cls,
        rows,
        n,
        k,
        experts,
        sf_vec_size=16,
        c_dtype="BFloat16",
        a_dtype="BFloat16",
        num_sms=None,
    ):
        return cls(sf_vec_size, c_dtype, a_dtype, "decode", tile, split, k_groups, grouped=True)

    monkeypatch.setattr(r90.GemmConfig, "for_groups", classmethod(for_groups))
    monkeypatch.setattr(r90, "_PICKED", {})
    monkeypatch.setattr(r90, "_LAUNCHES", {})


@needs_hopper
@pytest.mark.parametrize("case", list(GROUPED_SPLIT_CASES), ids=list(GROUPED_SPLIT_CASES))
def test_grouped_gemm_gpu_split_k(case, monkeypatch):
    """The grouped kernel with its K split (the partials of a unit's token tile among all
    groups', summed in split order by the split that arrives last): every group against its
    expert's reference GEMM, the same bits on a second launch (the tile counters left at
    zero by the first), and in a CUDA graph replayed with new routings of the rows."""
    e, n, k, counts, cols, rows, split, k_groups = GROUPED_SPLIT_CASES[case]
    _forced_config(monkeypatch, (cols, rows), split, k_groups)
    gen = torch.Generator().manual_seed(21)
    b = fp4_ops.quantize_experts(torch.randn(e, n, k, generator=gen), "nvfp4")
    a = torch.randn(sum(counts), k, generator=gen).bfloat16()
    bc, ac, offsets = _cuda(b), a.cuda(), _offsets(counts).cuda()
    first = fp4_ops.fp4_grouped_gemm(ac, bc, offsets, out_dtype=torch.float32)
    _check_groups(first.cpu(), a, b, _offsets(counts))
    again = fp4_ops.fp4_grouped_gemm(ac, bc, offsets, out_dtype=torch.float32)
    assert torch.equal(first, again)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # (the workspace is the stream's: made before the capture)
        fp4_ops.fp4_grouped_gemm(ac, bc, offsets, out_dtype=torch.float32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        d = fp4_ops.fp4_grouped_gemm(ac, bc, offsets, out_dtype=torch.float32)
    rows_in_all = sum(counts)
    for routing in (counts[::-1], [rows_in_all] + [0] * (e - 1), _spread(rows_in_all, e)):
        offsets.copy_(_offsets(routing))
        graph.replay()
        torch.cuda.synchronize()
        _check_groups(d.cpu(), a, b, _offsets(routing))


def _spread(rows: int, groups: int) -> list[int]:
    """``rows`` rows dealt one at a time over the groups: as many groups as rows hold rows (the
    most token tiles a routing makes)."""
    return [rows // groups + (g < rows % groups) for g in range(groups)]


@needs_hopper
def test_grouped_gemm_gpu_experts_past_2_31_bytes():
    """One launch over experts whose weights together pass 2^31 bytes (TMA steps from expert
    to expert in 64 bits; 146 of these experts fit below 2^31): the groups of experts below,
    astride and past that mark against their experts' reference GEMMs. Each expert's codes
    differ (a byte of its own XORed in) and so does its global scale."""
    e, n, k = 160, 4096, 7168  # (160 x 14.7 MB of FP4)
    gen = torch.Generator(device="cuda").manual_seed(13)
    base = fp4_ops.quantize_experts(torch.randn(4, n, k, device="cuda", generator=gen), "nvfp4")
    flip = (torch.arange(e, device="cuda") * 37 % 256).to(torch.uint8)
    data = base.data.repeat(e // 4, 1, 1) ^ flip[:, None, None]
    gs = base.global_scale.repeat(e // 4) * (1 + torch.arange(e, device="cuda") / e)
    b = FP4Tensor(data, base.scale.repeat(e // 4, 1, 1, 1), gs, "nvfp4")
    counts = [0] * e
    for expert, rows in ((0, 2), (145, 1), (146, 3), (147, 2), (151, 1), (159, 4)):
        counts[expert] = rows
    a = torch.randn(sum(counts), k, device="cuda", generator=gen).bfloat16()
    offsets = _offsets(counts)
    d = fp4_ops.fp4_grouped_gemm(a, b, offsets.cuda(), out_dtype=torch.float32).cpu()
    bounds = offsets.tolist()
    for expert in (x for x in range(e) if counts[x]):
        r0, r1 = bounds[expert], bounds[expert + 1]
        plain = reference.from_blocked(b.scale[expert].reshape(-1).cpu(), n, k // 16)
        ok, info = reference.check_gemm_w4a16(
            d[r0:r1], a[r0:r1].cpu(), b.data[expert].cpu(), plain, 16, gs[expert].cpu()
        )
        assert ok, (expert, info)


@needs_hopper
def test_grouped_gemm_gpu_graph_replay_reads_new_offsets():
    """Captured once, replayed with other group offsets (the same rows): the kernel reads them
    on the device at every replay."""
    gen = torch.Generator().manual_seed(12)
    b = fp4_ops.quantize_experts(torch.randn(6, 256, 256, generator=gen), "nvfp4")
    a = torch.randn(12, 256, generator=gen).bfloat16()
    bc, ac = _cuda(b), a.cuda()
    offsets = _offsets([2, 0, 4, 1, 0, 5]).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp4_ops.fp4_grouped_gemm(ac, bc, offsets)  # (compile and workspace before the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        d = fp4_ops.fp4_grouped_gemm(ac, bc, offsets)
    for counts in ([12, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 12], [1, 2, 3, 0, 4, 2]):
        offsets.copy_(_offsets(counts))
        graph.replay()
        torch.cuda.synchronize()
        _check_groups(d.cpu(), a, b, _offsets(counts))


@needs_hopper
@pytest.mark.parametrize("counts", list(COUNTS.values()), ids=list(COUNTS))
@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_gemm_w4a16_gpu_is_each_experts_gemm(fmt, counts):
    gen = torch.Generator().manual_seed(8)
    b = fp4_ops.quantize_experts(torch.randn(4, 256, 192, generator=gen), fmt)
    a = torch.randn(sum(counts), 192, generator=gen).bfloat16()
    offsets = _offsets(counts)
    d = fp4_ops.fp4_grouped_gemm(a.cuda(), _cuda(b), offsets.cuda(), out_dtype=torch.float32)
    _check_groups(d.cpu(), a, b, offsets)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values as a column slice of a wider CUDA tensor: not contiguous, not at offset 0."""
    wide = torch.zeros(t.shape[0], t.shape[1] + 3, dtype=t.dtype, device="cuda")
    wide[:, 1 : t.shape[1] + 1] = t.cuda()
    return wide[:, 1 : t.shape[1] + 1]


@needs_hopper
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("routing", ROUTINGS)
def test_fp4_moe_gpu_is_the_per_expert_loop(routing, layout):
    """Also with x, the routing weights and the ids as strided views (column slices)."""
    x, w13, w2, b13, b2, gen = _moe_case("mxfp4", "swigluoai", t=9, h=128, i=64, bias=True)
    ids, tw = _routing(routing, x.shape[0], 3, 4, gen)
    place = _strided if layout == "strided" else torch.Tensor.cuda
    out = fp4_ops.fp4_moe(
        place(x),
        _cuda(w13),
        _cuda(w2),
        place(tw),
        place(ids),
        "swigluoai",
        w13_bias=b13.cuda(),
        w2_bias=b2.cuda(),
    )
    ref, bound = _moe_reference(x, w13, w2, tw, ids, "swigluoai", b13, b2, w4a4=False)
    _assert_within(out.cpu(), ref, bound, f"GPU {routing}")


@needs_hopper
@pytest.mark.parametrize("fmt", FMTS)
def test_fp4_moe_w4a4_gpu_is_the_per_expert_loop(fmt):
    """The CPU W4A4 case (float32 x, as the oracle's roundings assume) on the GPU."""
    x, w13, w2, b13, b2, gen = _moe_case(fmt, "silu", dtype=torch.float32, bias=True)
    ids, tw = _routing("random", x.shape[0], 3, 4, gen)
    args = (_cuda(w13), _cuda(w2), tw.cuda(), ids.cuda())
    biases = dict(w13_bias=b13.cuda(), w2_bias=b2.cuda())
    out = fp4_ops.fp4_moe(x.cuda(), *args, **biases, activations="dynamic")
    ref, bound = _moe_reference(x, w13, w2, tw, ids, "silu", b13, b2, w4a4=True)
    _assert_within(out.cpu(), ref, bound, f"GPU W4A4 {fmt}")


@needs_hopper
def test_fp4moe_gpu_cuda_graph_replays_new_routing():
    gen = torch.Generator().manual_seed(9)
    layer = fp4_ops.FP4MoE.from_experts(
        torch.randn(8, 256, 128, generator=gen), torch.randn(8, 128, 128, generator=gen)
    ).cuda()
    x = torch.randn(4, 128, generator=gen).bfloat16().cuda()
    ids, tw = _routing("random", 4, 2, 8, gen)
    ids, tw = ids.cuda(), tw.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x, tw, ids)  # (compile and workspaces before the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = layer(x, tw, ids)
    for seed in range(3):
        new_ids, new_tw = _routing("random", 4, 2, 8, torch.Generator().manual_seed(seed))
        ids.copy_(new_ids)
        tw.copy_(new_tw)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(x, tw, ids))
