# SPDX-License-Identifier: BSD-3-Clause
"""The ops: ``quantize`` and ``fp4_gemm`` as ``torch.library`` custom ops with fake kernels, and
their dispatch to the CPU implementation, the Hopper kernel (sm_90) and the Blackwell kernel
(sm_100 family)."""

from __future__ import annotations

import torch

from fp4_ops import cpu
from fp4_ops.layout import (
    DSL_DTYPE_NAMES,
    FORMATS,
    OUT_DTYPES,
    SCALE_DTYPES,
    blocked_scale_numel,
    format_vec,
)
from fp4_ops.sm90 import k_order
from fp4_ops.tensor import FP4Tensor, global_scale_tensor


def _fake_quantized(x: torch.Tensor, sf_vec_size: int):
    rows, k = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    data = x.new_empty((*lead, rows, k // 2), dtype=torch.uint8)
    scale = x.new_empty(
        (*lead, blocked_scale_numel(rows, k, sf_vec_size)),
        dtype=SCALE_DTYPES[sf_vec_size],
    )
    return data, scale, x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("fp4_ops::quantize", mutates_args=())
def quantize_op(
    x: torch.Tensor, sf_vec_size: int, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.device.type == "cuda":
        from fp4_ops import quantizer

        return quantizer.launch_quantize(x, sf_vec_size, global_scale)
    if x.device.type != "cpu":
        raise ValueError(f"quantize runs on CPU and CUDA tensors, got one on {x.device}")
    if sf_vec_size == FORMATS["nvfp4"]:
        return cpu.quantize_nvfp4(x, global_scale)
    return cpu.quantize_mxfp4(x)


@quantize_op.register_fake
def _(x, sf_vec_size, global_scale):
    return _fake_quantized(x, sf_vec_size)


def quantize(
    x: torch.Tensor, format: str = "nvfp4", global_scale: torch.Tensor | float | None = None
) -> FP4Tensor:
    """Quantize x [rows, K] or [L, rows, K] (float32 / bfloat16 / float16) to an FP4Tensor.

    ``global_scale`` (NVFP4 only; decoding convention): None computes ``amax / (448 * 6)`` over
    the whole tensor on its device (no host sync); a number or one-element tensor is used as is
    (a static scale, e.g. ModelOpt's ``input_scale``). CPU tensors go through ``fp4_ops.cpu``
    (NaN / Inf raise ValueError); CUDA tensors through ``fp4_ops.quantizer``, which cannot raise
    without a sync: a block holding NaN / Inf gets the NaN scale byte and zero codes instead
    (and a dynamic global scale becomes non-finite), so every product that reads it is NaN.
    """
    vec = format_vec(format)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim not in (2, 3) or x.numel() == 0:
        raise ValueError(f"x must be a non-empty [rows, K] or [L, rows, K], got {tuple(x.shape)}")
    if x.shape[-1] % 32:
        raise ValueError(f"K = {x.shape[-1]} (last dim of x) is not a multiple of 32")
    if global_scale is not None and vec != FORMATS["nvfp4"]:
        raise ValueError("mxfp4 has no global scale (its E8M0 block scales span the range)")
    if x.is_cuda:
        from fp4_ops import quantizer

        reason = quantizer.shape_reason(tuple(x.shape), vec)
        if reason:
            raise ValueError(reason)
    gs = None if global_scale is None else global_scale_tensor(global_scale, x)
    data, scale, out_gs = quantize_op(x.contiguous(), vec, gs)
    return FP4Tensor.unchecked(data, scale, out_gs, format)


# ----------------------------------------------------------------------------- GEMM


@torch.library.custom_op("fp4_ops::gemm", mutates_args=())
def gemm_op(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    alpha: torch.Tensor,
    sf_vec_size: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    m, n, k = a_data.shape[-2], b_data.shape[-2], 2 * a_data.shape[-1]
    if a_data.device.type == "cpu":
        return cpu.gemm(a_data, a_scale, b_data, b_scale, alpha, sf_vec_size, out_dtype)
    if a_data.device.type != "cuda":
        raise ValueError(f"fp4_gemm runs on CPU and CUDA tensors, got {a_data.device}")
    batched = a_data.ndim == 3
    l = a_data.shape[0] if batched else 1  # noqa: E741
    args = (
        a_data.view(torch.uint8).reshape(l, m, k // 2),
        b_data.view(torch.uint8).reshape(l, n, k // 2),
        a_scale.reshape(l, -1),
        b_scale.reshape(l, -1),
        sf_vec_size,
    )
    major, minor = torch.cuda.get_device_capability(a_data.device)
    if (major, minor) == (9, 0):
        out = _gemm_sm90(*args, alpha, out_dtype)
    elif major == 10:
        out = _gemm_sm100(*args, alpha, out_dtype)
    else:
        name = torch.cuda.get_device_name(a_data.device)
        raise ValueError(
            f"fp4_gemm has kernels for sm_90 (H100 / H200) and the sm_100 family (B200 / GB200 "
            f"/ B300); {name} is sm_{major}{minor}"
        )
    return out if batched else out[0]


@gemm_op.register_fake
def _(a_data, a_scale, b_data, b_scale, alpha, sf_vec_size, out_dtype):
    shape = (*a_data.shape[:-1], b_data.shape[-2])
    return a_data.new_empty(shape, dtype=out_dtype)


@torch.library.custom_op("fp4_ops::gemm_w4a16", mutates_args=())
def gemm_w4a16_op(
    a: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    alpha: torch.Tensor,
    sf_vec_size: int,
    out_dtype: torch.dtype,
    b_prepacked: bool,
) -> torch.Tensor:
    m, k = a.shape[-2], a.shape[-1]
    l = a.shape[0] if a.ndim == 3 else 1  # noqa: E741
    if a.device.type == "cpu":
        b = k_order.unprepack_weights(b_data, k) if b_prepacked else b_data
        return cpu.gemm_w4a16(a, b, b_scale, alpha, sf_vec_size, out_dtype)
    if a.device.type != "cuda":
        raise ValueError(f"fp4_gemm runs on CPU and CUDA tensors, got {a.device}")
    major, minor = torch.cuda.get_device_capability(a.device)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(a.device)
        raise ValueError(
            f"W4A16 (16-bit activations with FP4 weights) has a kernel for sm_90 (H100 / H200) "
            f"only; on {name} (sm_{major}{minor}) quantize the activations too (W4A4)"
        )
    b = b_data.view(torch.uint8)
    b = b if b_prepacked else k_order.prepack_weights(b)
    n = b.shape[-2]
    args = (a.contiguous().reshape(l, m, k), b.reshape(l, n, -1), None, b_scale.reshape(l, -1))
    out = _gemm_sm90(*args, sf_vec_size, alpha, out_dtype, a_dtype=_A_DTYPES[a.dtype])
    return out if a.ndim == 3 else out[0]


@gemm_w4a16_op.register_fake
def _(a, b_data, b_scale, alpha, sf_vec_size, out_dtype, b_prepacked):
    return a.new_empty((*a.shape[:-1], b_data.shape[-2]), dtype=out_dtype)


def fp4_gemm(
    a: FP4Tensor | torch.Tensor,
    b: FP4Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """D = alpha * dequant(a) @ dequant(b)^T: a [M, K] and b [N, K] (or [L, M, K] and
    [L, N, K]) -> D [M, N] (or [L, M, N]) in ``out_dtype`` (bfloat16, float16 or float32).

    W4A4: ``a`` an FP4Tensor.  W4A16: ``a`` a bfloat16 / float16 tensor of activations (float16
    with NVFP4 only), run on sm_90 by the Hopper kernel's W4A16 path, which takes the weights
    through ``prepack_weights`` (here every call: one pass over the weights; ``FP4Linear``
    prepacks once); Blackwell refuses it.

    The scalar applied to the fp32 accumulator is ``a.global_scale * b.global_scale * alpha``
    (W4A16: ``b.global_scale * alpha``), formed on the device: both kernels read it from device
    memory when they run, so there is no host sync and a replayed CUDA graph uses the scales
    current then. CPU tensors run ``fp4_ops.cpu``.
    Under CUDA-graph capture, call the op once on that stream and shape before capturing (the
    kernels compile and the Hopper workspace is zeroed at the first call).
    """
    if isinstance(a, torch.Tensor):
        return _fp4_gemm_w4a16(a, b, out_dtype, alpha)
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, FP4Tensor):
            raise ValueError(f"{name} must be an FP4Tensor (fp4_ops.quantize), got {type(t)}")
    if a.format != b.format:
        raise ValueError(f"a is {a.format} but b is {b.format}")
    _check_pair(a.data.ndim, a.shape, a.device, b, b.shape[-1], out_dtype)
    alpha = device_alpha(a.global_scale * b.global_scale, alpha)
    return gemm_op(a.data, a.scale, b.data, b.scale, alpha, a.sf_vec_size, out_dtype)


def _fp4_gemm_w4a16(a, b, out_dtype, alpha):
    """``fp4_gemm`` with 16-bit activations ``a`` (W4A16)."""
    if not isinstance(b, FP4Tensor):
        raise ValueError(f"b must be an FP4Tensor (fp4_ops.quantize), got {type(b)}")
    check_w4a16_activations(a, b.format, "a must be an FP4Tensor (fp4_ops.quantize) or")
    _check_pair(a.ndim, a.shape, a.device, b, b.shape[-1], out_dtype)
    if a.shape[-1] % 32:
        raise ValueError(f"W4A16 needs K a multiple of 32, got K = {a.shape[-1]}")
    alpha = device_alpha(b.global_scale, alpha)
    return gemm_w4a16_op(a, b.data, b.scale, alpha, b.sf_vec_size, out_dtype, False)


def _check_pair(a_ndim, a_shape, a_device, b, b_k, out_dtype):
    """``fp4_gemm``'s checks of a (rank, [L,] M, K, device) against the weights b (b_k: their
    K) and of out_dtype, W4A4 and W4A16 alike."""
    if a_ndim != b.data.ndim:
        raise ValueError(f"a is {a_ndim}-D but b is {b.data.ndim}-D; both need the same rank")
    if a_shape[-1] != b_k:
        raise ValueError(f"K mismatch: a has K = {a_shape[-1]}, b has K = {b_k}")
    if a_ndim == 3 and a_shape[0] != b.data.shape[0]:
        raise ValueError(f"batch mismatch: a has L = {a_shape[0]}, b has L = {b.data.shape[0]}")
    if a_device != b.device:
        raise ValueError(f"a is on {a_device} but b is on {b.device}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")


def check_w4a16_activations(a, format: str, what: str) -> None:
    """W4A16 activations: bfloat16, or float16 with NVFP4 weights; ``what`` opens the message."""
    if a.dtype not in _A_DTYPES:
        raise ValueError(f"{what} bfloat16 / float16 activations (W4A16), got a {a.dtype} tensor")
    if a.dtype == torch.float16 and format == "mxfp4":
        raise ValueError("mxfp4 weights need bfloat16 activations (E8M0 exceeds float16's range)")


def device_alpha(scale: torch.Tensor, alpha) -> torch.Tensor:
    """The scalar the kernels apply to the accumulator: the global scales' product ``scale``
    times ``alpha`` (a number or a one-element tensor), a 0-d float32 tensor, no host sync."""
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() != 1:
            raise ValueError(f"alpha must be a number or a one-element tensor, got {alpha.shape}")
        scale = scale * alpha
    elif alpha is not None:
        scale = scale * float(alpha)
    return scale.float().reshape(())


# ----------------------------------------------------------------------------- kernel adapters
# One function per backend, written against its kernel's Python API: D = alpha * A @ B^T
# [L, M, N] in out_dtype on the current stream (arguments: each adapter's docstring).

# W4A16 activations: the 16-bit D types
_A_DTYPES = {t: name for t, name in DSL_DTYPE_NAMES.items() if t != torch.float32}


def _gemm_sm100(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype):
    from fp4_ops import sm100

    return sm100.gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype)


def _gemm_sm90(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype="Float4E2M1FN"):
    from fp4_ops.sm90 import launcher

    return launcher.gemm_for_ops(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype)
