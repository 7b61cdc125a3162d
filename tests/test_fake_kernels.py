# SPDX-License-Identifier: BSD-3-Clause
"""The registered ops' fake kernels describe what the real ones return, over everything the
public API takes.

``torch.compile``, ``torch.export`` and FakeTensor tracing never run the kernels: they take
the output's shape, dtype and strides from each op's fake kernel, so a fake kernel that is wrong
for one kind of input (batched operands, one format, one output dtype, W4A16) breaks or silently
mis-shapes compiled models while every eager test passes. Here each public call runs twice, on
real CPU tensors and under ``FakeTensorMode`` (where every op answers from its fake kernel),
over the formats, 2-D and batched operands, output dtypes, W4A4 and W4A16, grouped GEMMs and
the MoE layer, and every output tensor must agree in shape, dtype and strides.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_ops
from fp4_ops import FP4Tensor

OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _x(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=gen).to(dtype)


def _to_fake(mode: FakeTensorMode, value):
    if isinstance(value, FP4Tensor):
        parts = (mode.from_tensor(p) for p in (value.data, value.scale, value.global_scale))
        return FP4Tensor.unchecked(*parts, value.format)
    if isinstance(value, torch.Tensor):
        return mode.from_tensor(value)
    return value


def _tensors(value) -> list:
    if isinstance(value, FP4Tensor):
        return [value.data, value.scale, value.global_scale]
    return [value]


def _check_traced_like_eager(fn, *args, **kwargs):
    """``fn`` on the real arguments and on fake copies of them, as a compiler traces it (value
    checks become device asserts): the same output metadata."""
    real = _tensors(fn(*args, **kwargs))
    mode = FakeTensorMode()
    fake_args = [_to_fake(mode, a) for a in args]
    fake_kwargs = {k: _to_fake(mode, v) for k, v in kwargs.items()}
    with mode, mock.patch.object(torch.compiler, "is_compiling", return_value=True):
        fake = _tensors(fn(*fake_args, **fake_kwargs))
    for i, (r, f) in enumerate(zip(real, fake, strict=True)):
        got, want = (f.shape, f.dtype, f.stride()), (r.shape, r.dtype, r.stride())
        assert got == want, f"output {i}: traced {got}, eager {want}"


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("shape", [(5, 64), (2, 5, 64), (130, 96)])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize(fmt, dtype, shape, static):
    if static and fmt == "mxfp4":
        pytest.skip("MXFP4 has no global scale")
    scale = 0.01 if static else None
    _check_traced_like_eager(fp4_ops.quantize, _x(*shape, dtype=dtype), fmt, scale)


# (a's shape, b's shape): one GEMM, batched activations against one weight, batch against batch
GEMM_SHAPES = [((5, 64), (24, 64)), ((2, 5, 64), (24, 64)), ((2, 5, 64), (2, 24, 64))]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shapes", GEMM_SHAPES, ids=["2d", "batched-a", "batched"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_w4a4(fmt, shapes, out_dtype):
    a, b = (fp4_ops.quantize(_x(*s, seed=i), fmt) for i, s in enumerate(shapes))
    _check_traced_like_eager(fp4_ops.fp4_gemm, a, b, out_dtype)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shapes", GEMM_SHAPES, ids=["2d", "batched-a", "batched"])
@pytest.mark.parametrize("fmt, x_dtype", [("nvfp4", torch.float16), ("mxfp4", torch.bfloat16)])
def test_fp4_gemm_w4a16(fmt, x_dtype, shapes, out_dtype):
    x = _x(*shapes[0], dtype=x_dtype)
    b = fp4_ops.quantize(_x(*shapes[1], seed=1), fmt)
    _check_traced_like_eager(fp4_ops.fp4_gemm, x, b, out_dtype)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("w4a16", [False, True], ids=["w4a4", "w4a16"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_grouped_gemm(fmt, w4a16, out_dtype):
    w = fp4_ops.quantize_experts(_x(3, 24, 64, seed=2), fmt)
    x = _x(9, 64, dtype=torch.bfloat16, seed=3)
    a = x if w4a16 else fp4_ops.quantize(x, fmt)
    offsets = torch.tensor([0, 4, 4, 9], dtype=torch.int32)  # (an empty expert between)
    _check_traced_like_eager(fp4_ops.fp4_grouped_gemm, a, w, offsets, out_dtype)


@pytest.mark.parametrize(
    "activations, x_dtype",
    [("bf16", torch.bfloat16), ("dynamic", torch.float32), ("dynamic", torch.float16)],
)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_moe(fmt, activations, x_dtype):
    hidden, inter, experts, top_k = 64, 32, 4, 2
    w13 = fp4_ops.quantize_experts(_x(experts, 2 * inter, hidden, seed=4), fmt)
    w2 = fp4_ops.quantize_experts(_x(experts, hidden, inter, seed=5), fmt)
    x = _x(5, hidden, dtype=x_dtype, seed=6)
    ids = torch.tensor([[0, 3], [1, 3], [3, 0], [2, 1], [0, 2]], dtype=torch.int32)
    weights = torch.rand(5, top_k, generator=torch.Generator().manual_seed(7))
    _check_traced_like_eager(fp4_ops.fp4_moe, x, w13, w2, weights, ids, activations=activations)
