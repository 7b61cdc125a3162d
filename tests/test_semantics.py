# SPDX-License-Identifier: BSD-3-Clause
"""Library semantics on the CPU against reference.py and float64 hand math: alpha multiplies
the global scales' product (fp4_gemm W4A4 / W4A16, FP4Linear), both W4A16 weight paths
(prepacked or not), the converters' refusals, and the Hopper kernel-cache key."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import reference
from fp4_ops import FP4Tensor, fp4_gemm, quantize
from fp4_ops.nn import FP4Linear
from fp4_ops.ops import gemm_w4a16_op
from fp4_ops.sm90 import k_order
from fp4_ops.sm90 import launcher as r90

U32 = 2.0**-24  # fp32 unit roundoff


def _values64(t: FP4Tensor) -> torch.Tensor:
    """e2m1 * scale * global_scale in float64, from reference.py's decoding."""
    plain = reference.from_blocked(t.scale.reshape(-1), t.shape[-2], t.shape[-1] // t.sf_vec_size)
    return reference.dequantize_fp4(t.data, plain, t.sf_vec_size).double() * float(t.global_scale)


def _assert_close(d: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor, scale: float, ops: int):
    """d (float32) against scale * a64 @ b64^T: fp32 sums of exact products round K times, the
    scalar's product ``ops`` more times, each by at most one unit roundoff."""
    ref = scale * (a64 @ b64.T)
    bound = (a64.shape[-1] + ops) * U32 * abs(scale) * (a64.abs() @ b64.abs().T) + 1e-30
    err = (d.double() - ref).abs()
    assert bool((err <= bound).all()), float((err / bound).max())


def _x(rows, k, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen).to(dtype)


@pytest.mark.parametrize("alpha", [torch.tensor(0.75), torch.tensor([3.0]), 0.75, None])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_alpha_multiplies_the_global_scales(fmt, alpha):
    """W4A4: D = alpha * gs_a * gs_b * A @ B^T with static global scales far from 1 (NVFP4; MXFP4
    has none), alpha a tensor, a number or None."""
    gs_a, gs_b = (0.37, 2.5) if fmt == "nvfp4" else (None, None)
    a = quantize(_x(20, 96, 1), fmt, gs_a)
    b = quantize(_x(24, 96, 2), fmt, gs_b)
    d = fp4_gemm(a, b, torch.float32, alpha)
    scale = 1.0 if alpha is None else float(torch.as_tensor(alpha).reshape(()))
    _assert_close(d, _values64(a), _values64(b), scale, 4)


@pytest.mark.parametrize("alpha", [torch.tensor(0.75), 3.0])
def test_fp4_gemm_w4a16_alpha_multiplies_the_weights_global_scale(alpha):
    """W4A16: D = alpha * gs_b * x @ B^T, x bfloat16 activations as they are."""
    b = quantize(_x(24, 96, 2), "nvfp4", 2.5)
    x = _x(20, 96, 3, torch.bfloat16)
    d = fp4_gemm(x, b, torch.float32, alpha)
    _assert_close(d, x.double(), _values64(b), float(torch.as_tensor(alpha)), 3)


@pytest.mark.parametrize("activations", ["static", "bf16"])
def test_fp4_linear_scales_by_both_global_scales(activations):
    """FP4Linear: static W4A4 is x quantized by reference.py with the input scale, times the
    weight; W4A16 is x times the weight; both global scales != 1, bias added last."""
    w = quantize(_x(24, 96, 4), "nvfp4", 0.02)
    bias = torch.linspace(-1, 1, 24)
    gs_in = 0.013 if activations == "static" else None
    layer = FP4Linear(w, bias, activations, gs_in)
    x = _x(5, 96, 5, torch.bfloat16 if activations == "bf16" else torch.float32)
    with torch.no_grad():
        y = layer(x).float() - bias
    # (float32 output: the bias is added after the fp32 result, exactly undone here)
    if activations == "static":
        codes, scales, gs = reference.quantize_nvfp4(x, gs_in)
        x64 = reference.dequantize_fp4(codes, scales, 16).double() * float(gs)
        ops = 3
    else:
        x64, ops = x.double(), 2
    w64 = _values64(w)
    if activations == "static":
        _assert_close(y, x64, w64, 1.0, ops)
        return
    # bfloat16 output: the product, the bias and their sum each rounded (unit roundoff 2^-8)
    ref = x64 @ w64.T
    b64 = bias.double()
    bound = 2.0**-8 * (ref.abs() + b64.abs() + (ref + b64).abs()) * (1 + 2.0**-7)
    bound = bound + (96 + ops) * U32 * (x64.abs() @ w64.abs().T)
    with torch.no_grad():
        err = (layer(x).double() - (ref + b64)).abs()
    assert bool((err <= bound).all()), float((err / bound).max())


def _plain_scales(w: FP4Tensor) -> torch.Tensor:
    rows, cols = w.shape[-2], w.shape[-1] // w.sf_vec_size
    return reference.from_blocked(w.scale.reshape(-1), rows, cols)


# (what is built from a caller's scale tensor s: a function of s, and the scale it keeps)
KEEPS_A_SCALE = {
    "quantize": lambda w, s: quantize(_x(8, 64, 6), "nvfp4", s).global_scale,
    "from_plain": lambda w, s: FP4Tensor.from_plain(w.data, _plain_scales(w), s).global_scale,
    "from_modelopt": lambda w, s: FP4Tensor.from_modelopt(w.data, _plain_scales(w), s).global_scale,
    "FP4Linear": lambda w, s: FP4Linear(w, None, "static", s).input_global_scale,
    "FP4Linear.from_modelopt": lambda w, s: (
        FP4Linear.from_modelopt(
            w.data, _plain_scales(w), torch.tensor(0.02), input_scale=s
        ).input_global_scale
    ),
}


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("case", sorted(KEEPS_A_SCALE))
def test_scales_given_as_tensors_are_copied(case, shape):
    """What is built from a caller's float32 scale tensor keeps its own copy: changing that
    tensor in place afterwards (a calibration updating its running amax) changes nothing
    built before."""
    w = quantize(_x(8, 64, 7), "nvfp4", 0.02)
    s = torch.full(shape, 0.013)
    kept = KEEPS_A_SCALE[case](w, s)
    s.mul_(2)
    assert float(kept) == float(torch.tensor(0.013)), f"{case} kept the caller's tensor"


@pytest.mark.parametrize("n", [24, 2 * k_order.PREPACK_ROWS + 88])
@pytest.mark.parametrize("k", [96, 128, 160])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a16_prepacked_and_plain_weights_agree_with_the_reference(fmt, k, n):
    """The W4A16 op with prepacked weights (FP4Linear's) and with plain ones (fp4_gemm's) on the
    CPU: each against reference.reference_gemm_w4a16 in float64 (K not a multiple of 64
    included: the prepacked rows are padded; N past prepack_weights' row chunks, the last one
    ragged)."""
    b = quantize(_x(n, k, 6), fmt)
    x = _x(7, k, 7, torch.bfloat16)
    plain = reference.from_blocked(b.scale.reshape(-1), n, k // b.sf_vec_size)
    ref = reference.reference_gemm_w4a16(
        x, b.data, plain, b.sf_vec_size, 1.0, torch.float64, accum_dtype=torch.float64
    )
    alpha = torch.tensor(1.0)
    w64 = reference.dequantize_fp4(b.data, plain, b.sf_vec_size).double()
    prepacked = k_order.prepack_weights(b.data)
    for data, is_prepacked in ((b.data, False), (prepacked, True)):
        d = gemm_w4a16_op(x, data, b.scale, alpha, b.sf_vec_size, torch.float32, is_prepacked)
        _assert_close(d, x.double(), w64, 1.0, 1)
        bound = (k + 1) * U32 * (x.double().abs() @ w64.abs().T)
        assert bool(((d.double() - ref).abs() <= bound).all()), is_prepacked


# ------------------------------------------------------------------------------ converters
def _modelopt(n=24, k=64):
    gen = torch.Generator().manual_seed(8)
    weight = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    scale = torch.randint(0x20, 0x50, (n, k // 16), generator=gen, dtype=torch.uint8)
    return weight, scale.view(torch.float8_e4m3fn), torch.tensor(0.01)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda w, s, g: (w.to(torch.int16), s, g), "uint8 or float4_e2m1fn_x2"),
        (lambda w, s, g: (w, s.float(), g), "float8_e4m3fn"),
        (lambda w, s, g: (w, s[:, :-1], g), "plain scales"),
        (lambda w, s, g: (w[:, :16], s, g), "plain scales"),
        (lambda w, s, g: (w.t().contiguous().t()[:0], s, g), ""),
        (lambda w, s, g: (w, s, torch.tensor([0.01, 0.02])), "one element"),
        (lambda w, s, g: (w, s, torch.tensor(0.0)), "finite and positive"),
        (lambda w, s, g: (w, s, torch.tensor(1)), "floating-point"),
    ],
    ids=[
        "int16-weight",
        "f32-scales",
        "short-scales",
        "narrow-weight",
        "empty",
        "gs-2",
        "gs-0",
        "gs-int",
    ],
)
def test_from_modelopt_refuses_bad_tensors(change, match):
    """Wrong dtypes, shapes and global scales are ValueErrors that say what is wrong."""
    with pytest.raises(ValueError, match=match):
        FP4Tensor.from_modelopt(*change(*_modelopt()))


def test_converters_take_strided_tensors_by_their_values():
    """A non-contiguous weight or scale view (transposed twice, sliced) converts to exactly
    the FP4Tensor of its contiguous copy: the logical values, never the memory order."""
    w, s, g = _modelopt(24, 128)
    want = FP4Tensor.from_modelopt(w[:, :32].contiguous(), s[:, :4].contiguous(), g)
    got = FP4Tensor.from_modelopt(w[:, :32], s[:, :4], g)
    assert torch.equal(got.data, want.data) and torch.equal(
        got.scale.view(torch.uint8), want.scale.view(torch.uint8)
    )
    wt = w.t().contiguous().t()  # the same values, column-major
    assert not wt.is_contiguous()
    got = FP4Tensor.from_compressed_tensors(wt, s, torch.tensor(1 / 0.01))
    assert torch.equal(got.data, w)
    assert float(got.global_scale) == pytest.approx(0.01, rel=U32 * 4)


def _torchao_like(qdata, scale, swizzled=False, block_size=16, pts=None):
    return SimpleNamespace(
        qdata=qdata,
        scale=scale,
        block_size=block_size,
        per_tensor_scale=pts,
        is_swizzled_scales=swizzled,
    )


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda w, s: _torchao_like(w.t(), s), "K-major"),
        (lambda w, s: _torchao_like(w, s, block_size=32), "block_size"),
        (lambda w, s: _torchao_like(w, s, pts=torch.ones(2)), "per-expert"),
        (lambda w, s: _torchao_like(w[0], s), "K-major"),
    ],
    ids=["transposed", "block-32", "per-expert-scale", "1-d"],
)
def test_from_torchao_refuses_what_it_cannot_convert(make, match):
    w, s, _ = _modelopt()
    with pytest.raises(ValueError, match=match):
        FP4Tensor.from_torchao(make(w, s))


# ------------------------------------------------------------------------------ cache keys
def test_gemm_config_key_changes_with_every_kernel_choice():
    """Every field of ``GemmConfig`` that changes the compiled kernel gives another key (and
    ``GemmConfig.kernel`` hands each field to the kernel): no two kernels share a cache slot."""
    base = r90.GemmConfig(16, "BFloat16", "Float4E2M1FN", "decode", (16, 128), 2, 1, (1, 1), True)
    variants = {
        "sf_vec_size": 32,
        "c_dtype": "Float16",
        "a_dtype": "BFloat16",
        "path": "prefill",
        "mma_tiler_mn": (32, 128),
        "split_k": 3,
        "k_groups": 2,
        "cluster_shape_mn": (2, 1),
        "tma_store": False,
        "grouped": True,
        "tokens_converted": True,
    }
    assert set(variants) == {f.name for f in dataclasses.fields(r90.GemmConfig)}
    keys = {base} | {dataclasses.replace(base, **{name: v}) for name, v in variants.items()}
    assert len(keys) == len(variants) + 1


def _batch_values64(t: FP4Tensor) -> torch.Tensor:
    """``_values64`` of every batch of a 3-D FP4Tensor (each batch's scales blocked alone)."""
    rows, k, vec = t.shape[-2], t.shape[-1], t.sf_vec_size
    out = []
    for data, scale in zip(t.data, t.scale, strict=True):
        plain = reference.from_blocked(scale.reshape(-1), rows, k // vec)
        out.append(reference.dequantize_fp4(data, plain, vec).double() * float(t.global_scale))
    return torch.stack(out)


@pytest.mark.parametrize("m", [1, 32, 64, 96, 128, 130, 192, 256])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_batched_activations_against_one_weight(fmt, m):
    """a [L, M, K] against weights [N, K] (the L * M rows of one GEMM) and against batched
    weights [L, N, K], for M on and off the 128-row scale blocks: every batch's rows against
    their own scales."""
    l, n, k = 3, 40, 96  # noqa: E741
    x = torch.stack([_x(m, k, 10 + i) for i in range(l)])
    a = quantize(x, fmt)
    w = quantize(_x(n, k, 20), fmt)
    wb = quantize(torch.stack([_x(n, k, 30 + i) for i in range(l)]), fmt)
    a64 = _batch_values64(a)
    d = fp4_gemm(a, w, torch.float32)
    assert d.shape == (l, m, n)
    for i in range(l):
        _assert_close(d[i], a64[i], _values64(w), 1.0, 4)
    d = fp4_gemm(a, wb, torch.float32)
    b64 = _batch_values64(wb)
    for i in range(l):
        _assert_close(d[i], a64[i], b64[i], 1.0, 4)


def test_fp4_gemm_refuses_per_batch_global_scales():
    """Weights quantized per expert carry one global scale per batch: fp4_gemm, which applies
    one scalar per operand, refuses them by name instead of failing inside a reshape."""
    from fp4_ops import quantize_experts

    b = quantize_experts(torch.stack([_x(24, 64, 40 + i) for i in range(3)]), "nvfp4")
    assert b.global_scale.shape == (3,)
    a = quantize(torch.stack([_x(5, 64, 50 + i) for i in range(3)]))
    with pytest.raises(ValueError, match="b has one global scale per batch"):
        fp4_gemm(a, b)
    with pytest.raises(ValueError, match="b has one global scale per batch"):
        fp4_gemm(torch.stack([_x(5, 64, 60 + i) for i in range(3)]).bfloat16(), b)
