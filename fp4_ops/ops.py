# SPDX-License-Identifier: BSD-3-Clause
"""The ops: ``quantize`` and ``fp4_gemm`` as ``torch.library`` custom ops with fake kernels, and
their dispatch to the CPU implementation, the Hopper kernel (sm_90) and the Blackwell kernel
(sm_100 family).

The custom ops take and give the FP4Tensor parts as they are (scales [..., row blocks, column
blocks, 512]; the GEMMs also take them flat, [n] or [L, n]), and hand the kernels their bytes.
They are inference only: their autograd formula raises ``NO_BACKWARD``.

Each op is a plain implementation (``quantize_impl``, ``gemm_impl``, ``gemm_w4a16_impl``) under
its registration. An eager call on plain CUDA tensors that is not traced and tracks no gradient
(``eager``) runs the implementation directly, without the dispatcher's cost; every other call
(``torch.compile``, fake or subclassed tensors, autograd) goes through the registered op.
"""

from __future__ import annotations

import math

import torch

from fp4_ops import cpu
from fp4_ops.layout import (
    DSL_DTYPE_NAMES,
    FORMATS,
    OUT_DTYPES,
    SCALE_DTYPES,
    to_blocked,
)
from fp4_ops.memory import aligned_rows, capturing, current_device, stream_handle
from fp4_ops.sm90 import k_order
from fp4_ops.tensor import (
    FP4Tensor,
    blocked_shape_of,
    check_format,
    check_type,
    device_scalars,
    global_scale_tensor,
    is_number,
)

#: what a backward through any FP4 op raises
NO_BACKWARD = (
    "inference only: FP4 layers have no backward (fp4_ops' quantize and GEMM ops have no "
    "gradient; keep them out of the autograd graph, e.g. under torch.no_grad())"
)
#: activation dtypes the quantizer takes
IN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _no_backward(ctx, *grads):
    raise RuntimeError(NO_BACKWARD)


def _fake_quantized(x: torch.Tensor, sf_vec_size: int):
    rows, k = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    data = x.new_empty((*lead, rows, k // 2), dtype=torch.uint8)
    scale = x.new_empty(blocked_shape_of(data, sf_vec_size), dtype=SCALE_DTYPES[sf_vec_size])
    return data, scale, x.new_empty((), dtype=torch.float32)


def quantize_impl(x: torch.Tensor, sf_vec_size: int, global_scale: torch.Tensor | None):
    """The quantize op's CPU and CUDA implementation, for arguments ``check_quantize_input``
    has passed: (packed data, blocked scales shaped by atoms, global scale)."""
    if x.device.type == "cuda":
        from fp4_ops import quantizer

        data, scale, gs = quantizer.launch_quantize(x, sf_vec_size, global_scale)
    elif x.device.type != "cpu":
        raise ValueError(f"quantize runs on CPU and CUDA tensors, got one on {x.device}")
    elif sf_vec_size == FORMATS["nvfp4"]:
        data, scale, gs = cpu.quantize_nvfp4(x, global_scale)
    else:
        data, scale, gs = cpu.quantize_mxfp4(x)
    # (the backends write the blocked bytes flat; FP4Tensor.scale is shaped by its atoms)
    return data, scale.view(blocked_shape_of(data, sf_vec_size)), gs


@torch.library.custom_op("fp4_ops::quantize", mutates_args=())
def quantize_op(
    x: torch.Tensor, sf_vec_size: int, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantize_impl(x, sf_vec_size, global_scale)


@quantize_op.register_fake
def _(x, sf_vec_size, global_scale):
    return _fake_quantized(x, sf_vec_size)


def check_quantize_input(x, sf_vec_size: int, name: str = "x") -> None:
    """What the quantizer takes: a float32 / bfloat16 / float16 tensor [rows, K] or
    [L, rows, K], K a positive multiple of 32 (on CUDA also the kernel's size limits)."""
    check_type(x, torch.Tensor, name, "a torch.Tensor")
    if x.dtype not in IN_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim not in (2, 3):
        raise ValueError(f"{name} must be [rows, K] or [L, rows, K], got {tuple(x.shape)}")
    if x.shape[-1] == 0 or x.shape[-1] % 32:
        raise ValueError(f"K = {x.shape[-1]} (last dim of {name}) is not a multiple of 32")
    if x.is_cuda and x.numel():
        from fp4_ops import quantizer

        reason = quantizer.shape_reason(tuple(x.shape), sf_vec_size)
        if reason:
            raise ValueError(reason)


def quantize(
    x: torch.Tensor, format: str = "nvfp4", global_scale: torch.Tensor | float | None = None
) -> FP4Tensor:
    """Quantize x [rows, K] or [L, rows, K] (float32 / bfloat16 / float16) to an FP4Tensor.

    ``global_scale`` (NVFP4 only; decoding convention): None computes ``amax / (448 * 6)`` over
    the whole tensor on its device (no host sync; 1.0 for an all-zero or empty x); a number or
    one-element tensor is used as is (a static scale, e.g. ModelOpt's ``input_scale``), and must
    be finite and positive. MXFP4's global scale is 1.0. An x without rows gives an FP4Tensor
    without rows. CPU tensors go through ``fp4_ops.cpu`` (NaN / Inf input or a bad scale raise
    ValueError); CUDA tensors through ``fp4_ops.quantizer``, which cannot raise without a sync:
    a block holding NaN / Inf gets the NaN scale byte and zero codes instead (and a dynamic
    global scale becomes non-finite), and a float32 CUDA ``global_scale`` that is not finite and
    positive, read as the kernel runs, makes every scale byte NaN: every product that reads
    them is NaN.
    """
    if type(x) is torch.Tensor and x.is_cuda and type(format) is str:
        if torch.compiler.is_compiling():
            return _quantize(x, format, global_scale)
        # (eager on CUDA: a shape already quantized on this stream launches its plan)
        index = x.get_device()
        key = (x.shape, x.dtype, format, global_scale is None, index, stream_handle(index))
        plan = _QUANTIZE_PLANS.get(key)
        if plan is not None and _quantize_takes(x, global_scale, index):
            return FP4Tensor.unchecked(*plan(x, global_scale, key[-1]), format)
        q = _quantize(x, format, global_scale)
        if plannable(x, index) and _quantize_takes(x, global_scale, index):
            from fp4_ops import quantizer

            if len(_QUANTIZE_PLANS) >= _MAX_PLANS:
                _QUANTIZE_PLANS.clear()
            _QUANTIZE_PLANS[key] = quantizer.plan_quantize(x, q.sf_vec_size, global_scale)
        return q
    return _quantize(x, format, global_scale)


def _quantize(x, format, global_scale) -> FP4Tensor:
    """``quantize`` through every check."""
    vec = check_format(format)
    check_quantize_input(x, vec)
    if global_scale is not None and vec != FORMATS["nvfp4"]:
        raise ValueError("global_scale: mxfp4 has no global scale (E8M0 scales span the range)")
    gs = None if global_scale is None else _quantize_scale(global_scale, x)
    if x.numel() == 0:
        data = x.new_empty((*x.shape[:-1], x.shape[-1] // 2), dtype=torch.uint8)
        scale = x.new_empty(blocked_shape_of(data, vec), dtype=SCALE_DTYPES[vec])
        gs = torch.ones((), dtype=torch.float32, device=x.device) if gs is None else gs.clone()
        return FP4Tensor.unchecked(data, scale, gs, format)
    x = x.contiguous()
    run = quantize_impl if eager(x, gs) else quantize_op
    data, scale, out_gs = run(x, vec, gs)
    return FP4Tensor.unchecked(data, scale, out_gs, format)


def _quantize_scale(global_scale, x: torch.Tensor) -> torch.Tensor:
    """``quantize``'s global scale as the quantizer reads it: a float32 one-element tensor on
    x's CUDA device as it is (the kernel poisons a bad value: no host sync, no assert);
    anything else through ``global_scale_tensor``'s checks."""
    if x.is_cuda and device_scalars(global_scale, x.get_device()):
        return global_scale.reshape(())
    return global_scale_tensor(global_scale, x)


def _quantize_takes(x: torch.Tensor, global_scale, index: int) -> bool:
    """What a planned quantization needs besides x's shape and dtype, the format and the
    stream: ``launchable`` x; a dynamic scale outside CUDA-graph capture (its partials buffer
    is the stream's), a static one a float32 one-element tensor on x's device."""
    if not launchable(x, index):
        return False
    if global_scale is None:
        return not capturing()
    return (
        type(global_scale) is torch.Tensor
        and device_scalars(global_scale, index)
        and not (global_scale.requires_grad and torch.is_grad_enabled())
    )


def launchable(x: torch.Tensor, index: int) -> bool:
    """What a planned eager launch needs of a tensor besides its shape, dtype and stream:
    contiguous and 16-byte aligned (TMA), no gradient asked for, on the current device
    (``index``)."""
    return (
        x.is_contiguous()
        and not x.data_ptr() % 16
        and not (x.requires_grad and torch.is_grad_enabled())
        and current_device() == index
    )


def plannable(x: torch.Tensor, index: int) -> bool:
    """Whether an eager call on x that has just passed every check may leave a plan for the
    next calls of its shape: ``launchable`` x with elements, outside CUDA-graph capture (a
    graph keeps what it allocates)."""
    return x.numel() > 0 and launchable(x, index) and not capturing()


# ----------------------------------------------------------------------------- GEMM


def _flat(scale: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """Blocked scales of packed data [..., rows, K/2], shaped by atoms or flat -> [..., n]."""
    return scale.reshape(*data.shape[:-2], -1)


def gemm_impl(a_data, a_scale, b_data, b_scale, alpha, alpha_scale, sf_vec_size: int, out_dtype):
    """The W4A4 GEMM op's CPU and CUDA implementation, for operands ``fp4_gemm`` (or
    ``FP4Linear``) has checked: D = alpha * alpha_scale (None: 1, else a one-element float32
    tensor, typically the weights' global scale) * a @ b^T, the product formed in fp32."""
    where = a_data.device.type
    if where not in ("cpu", "cuda"):
        raise ValueError(f"fp4_gemm runs on CPU and CUDA tensors, got {a_data.device}")
    if where == "cuda" and _capability(a_data) == (9, 0):
        from fp4_ops.sm90 import launcher

        # (the kernel reads both scalars and multiplies them: no product kernel here)
        args = (a_data, b_data, a_scale, b_scale, sf_vec_size, alpha, out_dtype)
        return launcher.gemm_for_ops(*args, scale=alpha_scale)
    # (one product for the CPU and the Blackwell kernel, which reads a single alpha)
    alpha = alpha if alpha_scale is None else alpha * alpha_scale
    if where == "cpu":
        a_scale, b_scale = _flat(a_scale, a_data), _flat(b_scale, b_data)
        return cpu.gemm(a_data, a_scale, b_data, b_scale, alpha, sf_vec_size, out_dtype)
    from fp4_ops import sm100

    return sm100.gemm_for_ops(a_data, b_data, a_scale, b_scale, sf_vec_size, alpha, out_dtype)


# The GPUs the Blackwell kernel's family build (sm_100f) runs on: B200 / GB200 and B300 / GB300
# (blockwise_gemm_fp4.BLACKWELL_CAPABILITIES, which stands alone; a test holds the two equal)
BLACKWELL_CAPABILITIES = ((10, 0), (10, 3))


def _capability(t: torch.Tensor) -> tuple[int, int]:
    """(major, minor) of a CUDA tensor's GPU, looked up once per device; ValueError unless the
    GEMMs have a kernel for it (sm_90, or the sm_100 family's ``BLACKWELL_CAPABILITIES``)."""
    index = t.get_device()
    if index not in _CAPABILITIES:
        major, minor = torch.cuda.get_device_capability(index)
        if (major, minor) != (9, 0) and (major, minor) not in BLACKWELL_CAPABILITIES:
            raise ValueError(
                f"fp4_gemm has kernels for sm_90 (H100 / H200) and the sm_100 family (B200 / "
                f"GB200 / B300); {torch.cuda.get_device_name(index)} is sm_{major}{minor}"
            )
        _CAPABILITIES[index] = (major, minor)
    return _CAPABILITIES[index]


def runs_hopper_kernels(t: torch.Tensor) -> bool:
    """Whether CUDA tensor ``t``'s GPU is an sm_90 (H100 / H200); ValueError for a GPU the
    GEMMs have no kernel for."""
    return _capability(t) == (9, 0)


def runs_blackwell_kernels(t: torch.Tensor) -> bool:
    """Whether ``t`` is a CUDA tensor on an sm_100 family GPU (``BLACKWELL_CAPABILITIES``);
    False for any other tensor, without an error."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) in BLACKWELL_CAPABILITIES


@torch.library.custom_op("fp4_ops::gemm", mutates_args=())
def gemm_op(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    alpha: torch.Tensor,
    alpha_scale: torch.Tensor | None,
    sf_vec_size: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return gemm_impl(a_data, a_scale, b_data, b_scale, alpha, alpha_scale, sf_vec_size, out_dtype)


@gemm_op.register_fake
def _(a_data, a_scale, b_data, b_scale, alpha, alpha_scale, sf_vec_size, out_dtype):
    shape = (*a_data.shape[:-1], b_data.shape[-2])
    return a_data.new_empty(shape, dtype=out_dtype)


def check_sm90(t: torch.Tensor, what: str, advice: str = "") -> None:
    """ValueError unless the GPU of CUDA tensor ``t`` is an sm_90 (H100 / H200): ``what`` has
    a kernel for it only."""
    major, minor = _capability(t)
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name(t.device)
        raise ValueError(
            f"{what} has a kernel for sm_90 (H100 / H200) only; {name} is sm_{major}{minor}"
            + (f": {advice}" if advice else "")
        )


def check_w4a16_gpu(t: torch.Tensor) -> None:
    """ValueError unless the GPU of CUDA tensor ``t`` has the W4A16 kernels (sm_90)."""
    what = "W4A16 (16-bit activations with FP4 weights)"
    check_sm90(t, what, "quantize the activations too (W4A4)")


def gemm_w4a16_impl(a, b_data, b_scale, alpha, sf_vec_size: int, out_dtype, b_prepacked: bool):
    """The W4A16 GEMM op's CPU and CUDA implementation, for operands ``fp4_gemm`` (or
    ``FP4Linear``) has checked."""
    if a.device.type == "cpu":
        b = k_order.unprepack_weights(b_data, a.shape[-1]) if b_prepacked else b_data
        b_scale = _flat(b_scale, b)
        return cpu.gemm_w4a16(a, b, b_scale, alpha, sf_vec_size, out_dtype)
    if a.device.type != "cuda":
        raise ValueError(f"fp4_gemm runs on CPU and CUDA tensors, got {a.device}")
    check_w4a16_gpu(a)
    from fp4_ops.sm90 import launcher

    b = b_data if b_prepacked else k_order.prepack_weights(b_data.view(torch.uint8))
    a = aligned_rows(a)
    a_dtype = _A_DTYPES[a.dtype]
    return launcher.gemm_for_ops(a, b, None, b_scale, sf_vec_size, alpha, out_dtype, a_dtype)


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
    return gemm_w4a16_impl(a, b_data, b_scale, alpha, sf_vec_size, out_dtype, b_prepacked)


@gemm_w4a16_op.register_fake
def _(a, b_data, b_scale, alpha, sf_vec_size, out_dtype, b_prepacked):
    return a.new_empty((*a.shape[:-1], b_data.shape[-2]), dtype=out_dtype)


for _op in (quantize_op, gemm_op, gemm_w4a16_op):
    _op.register_autograd(_no_backward)


def eager(*tensors) -> bool:
    """Whether a call on ``tensors`` (None allowed) may run its op's implementation directly,
    skipping the dispatcher: plain CUDA tensors, nothing traced, no gradient asked for. Traced,
    fake, subclassed and gradient-tracking calls go through the registered op."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or not t.is_cuda):
            return False
        if grad and t is not None and t.requires_grad:
            return False
    return True


def fp4_gemm(
    a: FP4Tensor | torch.Tensor,
    b: FP4Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    alpha: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """D = alpha * dequant(a) @ dequant(b)^T in ``out_dtype`` (bfloat16, float16 or float32).

    Shapes: weights b [N, K] take activations a [..., K] -> D [..., N], as ``nn.Linear`` does
    (the leading dims are rows of one GEMM; an FP4Tensor a has at most one, [L, M, K] -> [L, M,
    N], its scales re-blocked as rows unless M % 128 == 0). Batched weights b [L, N, K] take
    a [L, M, K] -> D [L, M, N], one GEMM per batch. Empty a (M or L = 0) or b (N = 0) give an
    empty D.

    W4A4: ``a`` an FP4Tensor.  W4A16: ``a`` a bfloat16 / float16 tensor of activations (float16
    with NVFP4 only), run on sm_90 by the Hopper kernel's W4A16 path, which takes the weights
    through ``prepack_weights`` (here every call: one pass over the weights; ``FP4Linear``
    prepacks once); Blackwell refuses it.

    The scalar applied to the fp32 accumulator is ``a.global_scale * b.global_scale * alpha``
    (W4A16: ``b.global_scale * alpha``), formed on the device: both kernels read it from device
    memory when they run, so there is no host sync and a replayed CUDA graph uses the scales
    current then. CPU tensors run ``fp4_ops.cpu``.
    Under CUDA-graph capture, call the op once on that stream and shape before capturing (the
    kernels compile and the Hopper workspace is zeroed at the first call). Eager calls of a
    problem already run on a stream (alpha None, Hopper) launch its checked kernel directly.
    Inference only: a backward through it raises ``NO_BACKWARD``.
    """
    if alpha is None and type(a) is FP4Tensor and type(b) is FP4Tensor and a.data.is_cuda:
        if type(out_dtype) is torch.dtype and not torch.compiler.is_compiling():
            return _fp4_gemm_planned(a, b, out_dtype)
    return _fp4_gemm(a, b, out_dtype, alpha)


def _fp4_gemm_planned(a: FP4Tensor, b: FP4Tensor, out_dtype) -> torch.Tensor:
    """``fp4_gemm`` of FP4Tensors on CUDA with alpha None, eager: a problem already run on this
    stream launches its plan (the launcher's checked ``Launch``) after the checks of what an
    FP4Tensor leaves open; else the full path, which leaves a plan (Hopper, a and b of one
    rank)."""
    ad, bd = a.data, b.data
    index = ad.get_device()
    key = (ad.shape, ad.dtype, bd.shape, bd.dtype, a.format, b.format, out_dtype, index)
    key += (stream_handle(index),)
    launch = _GEMM_PLANS.get(key)
    if launch is not None and _gemm_takes(a, b, index):
        out = ad.new_empty(*ad.shape[:-1], bd.shape[-2], dtype=out_dtype)
        launch(ad, bd, a.scale, b.scale, out, a.global_scale, key[-1], scale=b.global_scale)
        return out
    d = _fp4_gemm(a, b, out_dtype, None)
    if ad.ndim == bd.ndim and plannable(ad, index) and _gemm_takes(a, b, index):
        if runs_hopper_kernels(ad):
            from fp4_ops.sm90 import launcher

            if len(_GEMM_PLANS) >= _MAX_PLANS:
                _GEMM_PLANS.clear()
            _GEMM_PLANS[key] = launcher.launch_for_ops(
                ad,
                bd,
                a.scale,
                b.scale,
                a.sf_vec_size,
                a.global_scale,
                out_dtype,
                scale=b.global_scale,
            )
    return d


def _gemm_takes(a: FP4Tensor, b: FP4Tensor, index: int) -> bool:
    """What a planned ``fp4_gemm`` needs besides the parts' shapes, dtypes and formats and the
    stream (an FP4Tensor's parts are contiguous and on one device): 0-d global scales, b on
    a's device, which is the current one, 16-byte aligned data and scales, and no gradient
    asked for."""
    if a.global_scale.ndim or b.global_scale.ndim or b.data.get_device() != index:
        return False
    for t in (a.data, a.scale, b.data, b.scale):
        if t.data_ptr() % 16:
            return False
    if torch.is_grad_enabled() and (a.global_scale.requires_grad or b.global_scale.requires_grad):
        return False
    return current_device() == index


def _fp4_gemm(a, b, out_dtype, alpha) -> torch.Tensor:
    """``fp4_gemm`` through every check."""
    check_type(b, FP4Tensor, "b", "an FP4Tensor (fp4_ops.quantize)")
    check_out_dtype(out_dtype)
    check_alpha(alpha)
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, FP4Tensor) and t.global_scale.numel() != 1:
            raise ValueError(
                f"{name} has one global scale per batch ({tuple(t.global_scale.shape)}); "
                "fp4_gemm takes one per operand (per-expert weights: fp4_ops.fp4_grouped_gemm)"
            )
    if isinstance(a, torch.Tensor):
        return _fp4_gemm_w4a16(a, b, out_dtype, alpha)
    check_type(a, FP4Tensor, "a", "an FP4Tensor (W4A4) or a bfloat16 / float16 tensor (W4A16)")
    if a.format != b.format:
        raise ValueError(f"a is {a.format} but b is {b.format}")
    _check_k_and_device(a.shape, a.device, b)
    if b.data.ndim == 3:
        _check_batch(a.data.ndim, a.shape, b)
    out_shape = (*a.shape[:-1], b.shape[-2])
    if math.prod(out_shape) == 0:
        return a.data.new_empty(out_shape, dtype=out_dtype)
    # (batched b: batch by batch; else the rows of a against one weight matrix)
    data, scale = (a.data, a.scale) if b.data.ndim == 3 else _as_rows(a)
    if alpha is None:
        # (the kernels multiply the two global scales themselves)
        alpha, alpha_scale = a.global_scale, b.global_scale
    else:
        alpha, alpha_scale = device_alpha(a.global_scale * b.global_scale, alpha), None
    run = gemm_impl if eager(data, scale, b.data, b.scale, alpha) else gemm_op
    d = run(data, scale, b.data, b.scale, alpha, alpha_scale, a.sf_vec_size, out_dtype)
    return d if d.shape == out_shape else d.reshape(out_shape)


def _as_rows(a: FP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [rows, K/2], its blocked scales) of an FP4Tensor [rows, K] or [L, M, K] taken as
    L * M rows: the scales of consecutive batches are consecutive row blocks when M % 128 == 0
    (a view); otherwise re-blocked."""
    if a.data.ndim == 2:
        return a.data, a.scale
    l, m, half = a.data.shape  # noqa: E741
    data = a.data.reshape(l * m, half)
    if m % 128 == 0:
        return data, a.scale.reshape(-1, *a.scale.shape[-2:])
    return data, to_blocked(a.plain_scales().reshape(l * m, -1))


def _fp4_gemm_w4a16(a, b, out_dtype, alpha):
    """``fp4_gemm`` with 16-bit activations ``a`` (W4A16)."""
    check_w4a16_activations(a, b.format, "a must be an FP4Tensor (W4A4) or")
    if a.ndim == 0:
        raise ValueError("a must be [..., K], got a 0-d tensor")
    _check_k_and_device(a.shape, a.device, b)
    if a.shape[-1] % 32:
        raise ValueError(f"W4A16 needs K a multiple of 32, got K = {a.shape[-1]}")
    if b.data.ndim == 3:
        _check_batch(a.ndim, a.shape, b)
        rows = a
    else:
        rows = a.reshape(-1, a.shape[-1])
    out_shape = (*a.shape[:-1], b.shape[-2])
    if math.prod(out_shape) == 0:
        return a.new_empty(out_shape, dtype=out_dtype)
    alpha = device_alpha(b.global_scale, alpha)
    run = gemm_w4a16_impl if eager(rows, b.data, b.scale, alpha) else gemm_w4a16_op
    d = run(rows, b.data, b.scale, alpha, b.sf_vec_size, out_dtype, False)
    return d.reshape(out_shape)


def _check_k_and_device(a_shape, a_device, b: FP4Tensor) -> None:
    if a_shape[-1] != b.shape[-1]:
        raise ValueError(f"K mismatch: a has K = {a_shape[-1]}, b has K = {b.shape[-1]}")
    if a_device != b.device:
        raise ValueError(f"a is on {a_device} but b is on {b.device}")


def _check_batch(a_ndim: int, a_shape, b: FP4Tensor) -> None:
    """Batched weights b [L, N, K] take a [L, M, K] only."""
    if a_ndim != 3:
        raise ValueError(
            f"b is batched weights {tuple(b.shape)} [L, N, K]: a must be [L, M, K], got "
            f"{tuple(a_shape)}"
        )
    if a_shape[0] != b.data.shape[0]:
        raise ValueError(f"batch mismatch: a has L = {a_shape[0]}, b has L = {b.data.shape[0]}")


def check_out_dtype(out_dtype, name: str = "out_dtype") -> None:
    check_type(out_dtype, torch.dtype, name, "a torch.dtype")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{name} must be bfloat16, float16 or float32, got {out_dtype}")


def check_alpha(alpha) -> None:
    """alpha: None, a finite number or a one-element floating-point tensor, finite where it is
    on the CPU (a CUDA one is read as the kernel runs: no host sync)."""
    if alpha is None:
        return
    if is_number(alpha):
        if not math.isfinite(alpha):
            raise ValueError(f"alpha must be finite, got {alpha}")
        return
    check_type(alpha, torch.Tensor, "alpha", "None, a number or a one-element tensor")
    if alpha.numel() != 1:
        raise ValueError(f"alpha must be a number or a one-element tensor, got {alpha.shape}")
    if not alpha.is_floating_point():
        raise ValueError(f"alpha must be a floating-point tensor, got {alpha.dtype}")
    if alpha.device.type == "cpu" and not torch.compiler.is_compiling():
        if not math.isfinite(float(alpha)):
            raise ValueError(f"alpha must be finite, got {float(alpha)}")


def check_w4a16_activations(a, format: str, what: str) -> None:
    """W4A16 activations: bfloat16, or float16 with NVFP4 weights; ``what`` opens the message."""
    if a.dtype not in _A_DTYPES:
        raise ValueError(f"{what} bfloat16 / float16 activations (W4A16), got a {a.dtype} tensor")
    if a.dtype == torch.float16 and format == "mxfp4":
        raise ValueError("mxfp4 weights need bfloat16 activations (E8M0 exceeds float16's range)")


def device_alpha(scale: torch.Tensor, alpha) -> torch.Tensor:
    """The scalar the kernels apply to the accumulator: the global scales' product ``scale``
    times ``alpha`` (checked by ``check_alpha``), a 0-d float32 tensor, no host sync."""
    if isinstance(alpha, torch.Tensor):
        scale = scale * alpha.reshape(())
    elif alpha is not None:
        scale = scale * float(alpha)
    return scale.float().reshape(())


# ----------------------------------------------------------------------------- kernel lookup

# plans kept per op (shapes x streams); more start the collection over
_MAX_PLANS = 256
# quantize: (x's shape and dtype, format, dynamic, device index, stream) -> QuantizePlan
_QUANTIZE_PLANS: dict[tuple, object] = {}
# fp4_gemm: (a's and b's data shapes and dtypes, formats, D's dtype, device index, stream) ->
# the Hopper launcher's Launch
_GEMM_PLANS: dict[tuple, object] = {}
# (CUDA device index -> compute capability, of GPUs the GEMMs have kernels for)
_CAPABILITIES: dict[int, tuple[int, int]] = {}
# W4A16 activations: the 16-bit D types
_A_DTYPES = {t: name for t, name in DSL_DTYPE_NAMES.items() if t != torch.float32}
