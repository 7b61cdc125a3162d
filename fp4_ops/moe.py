# SPDX-License-Identifier: BSD-3-Clause
"""Mixture-of-experts on FP4 experts: a grouped GEMM, a fused MoE layer and ``FP4MoE``.

    w13 = fp4_ops.quantize_experts(w13_bf16, "nvfp4")   # [E, 2I, H], one global scale per expert
    y = fp4_ops.fp4_grouped_gemm(a, w13, group_offsets)  # rows of group e against expert e
    out = fp4_ops.fp4_moe(x, w13, w2, topk_weights, topk_ids)

Experts: one FP4Tensor [E, N, K] whose ``global_scale`` is [E] (ModelOpt's per-expert
``weight_scale_2``; a 0-d one is shared by all experts). ``quantize_experts`` quantizes each
expert with its own dynamic global scale.

``fp4_grouped_gemm(a, b, group_offsets, out_dtype)``
    D[r] = a[r] @ dequant(b[e])^T for offsets[e] <= r < offsets[e + 1]: ``a`` the rows of all
    groups stacked ([rows, K], 16-bit: W4A16, or an FP4Tensor: W4A4, alpha = a.global_scale *
    b.global_scale[e]), ``group_offsets`` int32 [E + 1], 0 first, rows last, non-decreasing
    (groups may be empty). CPU tensors are checked on the host (ValueError); CUDA and traced
    ones by device-side asserts, without a host sync.
``fp4_moe(x, w13, w2, topk_weights, topk_ids, activation, ...)``
    vLLM's conventions: x [T, H]; w13 [E, 2I, H], w2 [E, H, I]; topk_ids int32 / int64 [T, k];
    topk_weights [T, k] weigh the experts' outputs. Per (token, slot) pair p with expert e:
        h = gemm(x[t], w13[e])                 in x's dtype (W4A4: x quantized per call)
        a = act(h + w13_bias[e])               in float32, then rounded to x's dtype
        y = gemm(a, w2[e])                     in x's dtype (W4A4: a quantized per call)
        out[t] = sum_slots w * (y + w2_bias[e])  in float32, then rounded to x's dtype
    ``activation="silu"``: silu(gate) * up with the gate rows first (w13 = [w1; w3]).
    ``activation="swigluoai"``: gpt-oss's clamped SwiGLU (below), rows interleaved.
    On CUDA tensors outside tracing, kernels of ``fp4_ops.moe_kernels`` do the routing (one
    CTA: group offsets, each pair's row and, for decode, the rows' gather), the activation, the
    weighted combine and (W4A4) the exact BF16 rows; traced and gradient-tracking calls run
    the same steps as torch ops (argsort, searchsorted, gathers). No host sync either way.
``FP4MoE``
    The experts as buffers (``from_experts`` quantizes 16-bit ones), forward(x, topk_weights,
    topk_ids); state dict with the format and activation as extra state.

Every op is a ``torch.library`` custom op with a fake kernel (``torch.compile(fullgraph=True)``)
and inference only (a backward raises ``fp4_ops.ops.NO_BACKWARD``). CPU: each expert that has
rows is dequantized to float32 and multiplied (``fp4_ops.cpu``). CUDA (sm_90): the routing and
checks run on the device; the grouped GEMMs run the Hopper kernel's grouped W4A16 variant
(``fp4_ops.sm90.gemm``, ``grouped``), which reads the group offsets on the device and runs
only the touched experts' token tiles; W4A4 first turns its FP4 activations into exact BF16
values (``moe_kernels.exact_bf16``, or ``exact_bf16_rows`` in the registered op). The sm_100
family (compiled, never run here): W4A4 on the Blackwell grouped template
(``blockwise_grouped_gemm_fp4``, through ``fp4_ops.sm100``), its rows copied into the kernel's
tile-padded layout and D's rows gathered back on the device (``FP4MoE`` holds its W4A4 experts
in plain K order there); W4A16 raises ValueError there, as do other GPUs.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from importlib import metadata

import torch
import torch.nn.functional as F

from fp4_ops import cpu, moe_kernels
from fp4_ops.buffers import FP4Buffers
from fp4_ops.layout import FORMATS, MXFP4_BF16_SHIFT, PACKED_DTYPES, from_blocked
from fp4_ops.memory import aligned_rows
from fp4_ops.moe_kernels.gating import ACTIVATIONS, SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT
from fp4_ops.ops import (
    IN_DTYPES,
    NO_BACKWARD,
    check_out_dtype,
    check_quantize_input,
    check_sm90,
    check_w4a16_activations,
    eager,
    quantize,
    runs_blackwell_kernels,
    runs_hopper_kernels,
)
from fp4_ops.sm90 import k_order
from fp4_ops.tensor import FP4Tensor, check_format, check_global_scale_value, check_type

#: fp4_moe's activation modes: 16-bit activations (W4A16) or quantized per call (W4A4)
MODES = ("bf16", "dynamic")
MXFP4_VEC = 32
W4A16_GROUPED = "W4A16 fp4_grouped_gemm / fp4_moe / FP4MoE (16-bit activations)"
PREPACKED_ON_BLACKWELL = (
    "experts prepacked for the Hopper kernel reached the Blackwell grouped kernel, which "
    "cannot read them: move the FP4MoE with .to(device) (it reorders them), or call "
    'fp4_ops.fp4_moe(x, layer.expert_weights("w13"), layer.expert_weights("w2"), ..., '
    'activations="dynamic")'
)


def _no_backward(ctx, *grads):
    raise RuntimeError(NO_BACKWARD)


def _host_checks(*tensors) -> bool:
    """Whether values can be checked on the host: eager CPU tensors (CUDA and traced ones are
    checked by device-side asserts instead, without a sync)."""
    return not torch.compiler.is_compiling() and all(t.device.type == "cpu" for t in tensors)


def _require(ok: torch.Tensor, message: str, host: bool) -> None:
    """ValueError(message) unless every element of ``ok`` holds (host), else a device assert."""
    if host:
        if not bool(ok.all()):
            raise ValueError(message)
    else:
        torch._assert_async(ok.all(), message)


# ----------------------------------------------------------------------------- experts


def quantize_experts(w: torch.Tensor, format: str = "nvfp4") -> FP4Tensor:
    """Expert weights w [E, N, K] (float32 / bfloat16 / float16) -> FP4Tensor [E, N, K] with one
    global scale per expert ([E]: each expert's amax / (448 * 6); 1.0 for MXFP4): ``quantize``
    of each expert, on w's device."""
    check_format(format)
    check_type(w, torch.Tensor, "w", "a torch.Tensor [E, N, K]")
    if w.ndim != 3 or w.shape[0] == 0:
        raise ValueError(f"w must be [E, N, K] with E >= 1 experts, got {tuple(w.shape)}")
    check_quantize_input(w, FORMATS[format], "w")
    parts = [quantize(w[e], format) for e in range(w.shape[0])]
    data = torch.stack([p.data for p in parts])
    scale = torch.stack([p.scale for p in parts])
    gs = torch.stack([p.global_scale for p in parts])
    return FP4Tensor(data, scale, gs, format)


def check_experts(b, name: str) -> torch.Tensor:
    """Expert weights: an FP4Tensor [E, N, K], E >= 1; their global scales as an [E] tensor."""
    check_type(b, FP4Tensor, name, "an FP4Tensor [E, N, K] (fp4_ops.quantize_experts)")
    if b.data.ndim != 3 or b.data.shape[0] == 0:
        raise ValueError(f"{name} must be experts [E, N, K] with E >= 1, got {b.shape}")
    return b.global_scale.float().expand(b.data.shape[0]).contiguous()


# ----------------------------------------------------------------------------- grouped GEMM ops


def _cpu_groups(offsets: torch.Tensor):
    """(expert, first row, end row) of every non-empty group (CPU implementations only)."""
    bounds = offsets.tolist()
    return [
        (e, bounds[e], bounds[e + 1]) for e in range(len(bounds) - 1) if bounds[e + 1] > bounds[e]
    ]


def gpu_grouped_w4a16(
    a, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked, scale=None
):
    """The CUDA side of the W4A16 grouped op: sm_90's grouped kernel (it reads the offsets, and
    ``scale`` times each alpha, on the device: no host sync) on the weights prepacked, as given
    or here."""
    check_sm90(a, W4A16_GROUPED, "quantize the activations too (W4A4)")
    from fp4_ops.sm90 import launcher

    b = b_data if prepacked else k_order.prepack_weights(b_data.view(torch.uint8))
    a = aligned_rows(a)
    sfb = b_scale.reshape(b.shape[0], -1)
    return launcher.grouped_gemm_for_ops(a, b, sfb, sf_vec_size, alpha, offsets, out_dtype, scale)


def gpu_grouped_w4a4(
    a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked
):
    """The CUDA side of the W4A4 grouped op. sm_90: the activations made exact BF16
    (``exact_bf16_rows``; Hopper has no FP4 tensor cores: its W4A4 kernels convert FP4 to 16
    bits too), then ``gpu_grouped_w4a16``. The sm_100 family: the Blackwell grouped kernel
    (``fp4_ops.sm100``) on the experts in plain K order."""
    if not runs_hopper_kernels(a_data):
        if prepacked:
            raise ValueError(PREPACKED_ON_BLACKWELL)
        from fp4_ops import sm100

        args = (a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype)
        return sm100.grouped_gemm_for_ops(*args)
    values, alpha = exact_bf16_rows(a_data, a_scale, alpha, sf_vec_size)
    args = (values, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked)
    return gpu_grouped_w4a16(*args)


def grouped_w4a16_impl(a, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked):
    """The W4A16 grouped op on checked operands: CPU per expert in float32, CUDA
    ``gpu_grouped_w4a16``."""
    if a.device.type == "cuda":
        args = (a, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked)
        return gpu_grouped_w4a16(*args)
    if a.device.type != "cpu":
        raise ValueError(f"fp4_grouped_gemm runs on CPU and CUDA tensors, got {a.device}")
    out = a.new_zeros((a.shape[0], b_data.shape[1]), dtype=out_dtype)
    for e, r0, r1 in _cpu_groups(offsets):
        data = k_order.unprepack_weights(b_data[e], a.shape[1]) if prepacked else b_data[e]
        scale = b_scale[e].reshape(-1)
        out[r0:r1] = cpu.gemm_w4a16(a[r0:r1], data, scale, alpha[e], sf_vec_size, out_dtype)
    return out


def grouped_w4a4_impl(
    a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked
):
    """The W4A4 grouped op on checked operands: CPU per expert in float32, CUDA
    ``gpu_grouped_w4a4``."""
    rows, k = a_data.shape[0], 2 * a_data.shape[1]
    if a_data.device.type == "cuda":
        args = (a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype)
        return gpu_grouped_w4a4(*args, prepacked)
    if a_data.device.type != "cpu":
        raise ValueError(f"fp4_grouped_gemm runs on CPU and CUDA tensors, got {a_data.device}")
    cpu.check_scales(a_scale)
    a_plain = from_blocked(a_scale.reshape(-1), rows, k // sf_vec_size)
    out = a_data.new_zeros((rows, b_data.shape[1]), dtype=out_dtype)
    for e, r0, r1 in _cpu_groups(offsets):
        da = cpu.dequantize(a_data[r0:r1], a_plain[r0:r1], sf_vec_size)
        data = k_order.unprepack_weights(b_data[e], k) if prepacked else b_data[e]
        db = cpu.plain_operand(data, b_scale[e], sf_vec_size)
        out[r0:r1] = (torch.matmul(da, db.transpose(0, 1)) * alpha[e]).to(out_dtype)
    return out


def exact_bf16_rows(a_data, a_scale, alpha, sf_vec_size: int):
    """(BF16 e2m1 x block scale of packed FP4 rows, alpha to match): exact, as every such
    product has at most 6 significant bits; MXFP4's values carry 2^-2 (alpha 2^2) so that
    6 x 2^127 stays finite and 0.5 x 2^-127 a BF16 subnormal. Device asserts, no sync."""
    rows, k = a_data.shape[0], 2 * a_data.shape[1]
    bits = a_scale.view(torch.uint8)
    if a_scale.dtype == torch.float8_e4m3fn:
        torch._assert_async((bits & 0x80 == 0).all(), "an E4M3 block scale has its sign bit set")
    plain = from_blocked(a_scale.reshape(-1), rows, k // sf_vec_size)
    if sf_vec_size == MXFP4_VEC:
        # (on the scales, before the products: 6 x 2^127 overflows float32 too)
        values = cpu.dequantize(a_data, plain.float() * MXFP4_BF16_SHIFT, sf_vec_size)
        return values.to(torch.bfloat16), alpha / MXFP4_BF16_SHIFT
    return cpu.dequantize(a_data, plain, sf_vec_size).to(torch.bfloat16), alpha


@torch.library.custom_op("fp4_ops::grouped_gemm_w4a16", mutates_args=())
def grouped_w4a16_op(
    a: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    alpha: torch.Tensor,
    offsets: torch.Tensor,
    sf_vec_size: int,
    out_dtype: torch.dtype,
    prepacked: bool,
) -> torch.Tensor:
    return grouped_w4a16_impl(a, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked)


@grouped_w4a16_op.register_fake
def _(a, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked):
    return a.new_empty((a.shape[0], b_data.shape[1]), dtype=out_dtype)


@torch.library.custom_op("fp4_ops::grouped_gemm", mutates_args=())
def grouped_w4a4_op(
    a_data: torch.Tensor,
    a_scale: torch.Tensor,
    b_data: torch.Tensor,
    b_scale: torch.Tensor,
    alpha: torch.Tensor,
    offsets: torch.Tensor,
    sf_vec_size: int,
    out_dtype: torch.dtype,
    prepacked: bool,
) -> torch.Tensor:
    args = (a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype)
    return grouped_w4a4_impl(*args, prepacked)


@grouped_w4a4_op.register_fake
def _(a_data, a_scale, b_data, b_scale, alpha, offsets, sf_vec_size, out_dtype, prepacked):
    return a_data.new_empty((a_data.shape[0], b_data.shape[1]), dtype=out_dtype)


for _op in (grouped_w4a16_op, grouped_w4a4_op):
    _op.register_autograd(_no_backward)


def check_group_offsets(group_offsets, num_experts: int, rows: int, device) -> None:
    """int32 [E + 1] on ``device``: 0 first, ``rows`` last, non-decreasing (host check for CPU
    tensors, device asserts for CUDA and traced ones)."""
    check_type(group_offsets, torch.Tensor, "group_offsets", "an int32 tensor [E + 1]")
    if group_offsets.dtype != torch.int32:
        raise ValueError(f"group_offsets must be int32, got {group_offsets.dtype}")
    if tuple(group_offsets.shape) != (num_experts + 1,):
        raise ValueError(
            f"group_offsets must be [E + 1] = [{num_experts + 1}] for {num_experts} experts, "
            f"got {tuple(group_offsets.shape)}"
        )
    if group_offsets.device != device:
        raise ValueError(f"group_offsets is on {group_offsets.device}, a on {device}")
    host = _host_checks(group_offsets)
    ends = torch.stack((group_offsets[0], group_offsets[-1] - rows))
    _require(ends == 0, f"group_offsets must start at 0 and end at the rows of a ({rows})", host)
    steps = group_offsets[1:] >= group_offsets[:-1]
    _require(steps, "group_offsets must be non-decreasing (group e: offsets[e]..[e+1])", host)


def fp4_grouped_gemm(
    a: FP4Tensor | torch.Tensor,
    b: FP4Tensor,
    group_offsets: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """D [rows, N]: rows offsets[e] .. offsets[e + 1] - 1 of ``a`` times expert e of ``b``
    ([E, N, K], global scale [E] or 0-d), alpha = b.global_scale[e] (W4A16: ``a`` a bfloat16 /
    float16 tensor [rows, K]) or a.global_scale * b.global_scale[e] (W4A4: ``a`` an FP4Tensor
    [rows, K] of b's format). ``group_offsets``: ``check_group_offsets``. Inference only."""
    gs = check_experts(b, "b")
    check_out_dtype(out_dtype)
    num_experts, n, k = b.shape
    w4a16 = isinstance(a, torch.Tensor)
    if w4a16:
        check_w4a16_activations(a, b.format, "a must be an FP4Tensor (W4A4) or")
        rows_data = a
    else:
        check_type(a, FP4Tensor, "a", "an FP4Tensor (W4A4) or a bfloat16 / float16 tensor")
        if a.format != b.format:
            raise ValueError(f"a is {a.format} but b is {b.format}")
        rows_data = a.data
    if rows_data.ndim != 2 or a.shape[-1] != k:
        raise ValueError(f"a must be [rows, K] with b's K = {k}, got {tuple(a.shape)}")
    if rows_data.device != b.device:
        raise ValueError(f"a is on {rows_data.device} but b is on {b.device}")
    rows = rows_data.shape[0]
    check_group_offsets(group_offsets, num_experts, rows, b.device)
    if rows == 0 or n == 0:
        return rows_data.new_empty((rows, n), dtype=out_dtype)
    if w4a16:
        return _grouped_w4a16(a, b, gs, group_offsets, out_dtype)
    alpha = a.global_scale.float() * gs
    args = (a.data, a.scale, b.data, b.scale, alpha, group_offsets, b.sf_vec_size, out_dtype)
    run = grouped_w4a4_impl if eager(*args[:6]) else grouped_w4a4_op
    return run(*args, False)


def _grouped_w4a16(a, b: FP4Tensor, alpha, offsets, out_dtype, prepacked_data=None):
    """The W4A16 grouped op on checked operands; ``prepacked_data``: b's data prepacked
    beforehand for the Hopper kernel (``FP4MoE`` keeps it), None: as b holds it."""
    data = b.data if prepacked_data is None else prepacked_data
    args = (a, data, b.scale, alpha, offsets, b.sf_vec_size, out_dtype, prepacked_data is not None)
    run = grouped_w4a16_impl if eager(*args[:5]) else grouped_w4a16_op
    return run(*args)


# ----------------------------------------------------------------------------- routing


def check_routing(topk_weights, topk_ids, tokens: int, num_experts: int, device) -> None:
    """topk_ids int32 / int64 [T, k] in [0, E), topk_weights floating-point [T, k], on
    ``device``. The ids' values are checked here for CPU tensors; for CUDA and traced ones by
    a device assert in the layer (``_moe``), without a host sync."""
    check_type(topk_ids, torch.Tensor, "topk_ids", "an int32 / int64 tensor [T, k]")
    check_type(topk_weights, torch.Tensor, "topk_weights", "a floating-point tensor [T, k]")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_ids.ndim != 2 or topk_ids.shape[0] != tokens or topk_ids.shape[1] == 0:
        raise ValueError(f"topk_ids must be [T, k] = [{tokens}, k >= 1], got {topk_ids.shape}")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} "
            "must have one shape [T, k]"
        )
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, x on {device}")
    if _host_checks(topk_ids):
        _require(_ids_in_range(topk_ids, num_experts), _range_message(num_experts), True)


def _ids_in_range(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    return (topk_ids >= 0) & (topk_ids < num_experts)


def _range_message(num_experts: int) -> str:
    return f"topk_ids must lie in [0, {num_experts}) (the experts of w13 and w2)"


def expert_routing(topk_ids: torch.Tensor, num_experts: int):
    """(order, sorted_ids, group_offsets) of the T * k (token, slot) pairs, on the device: pair
    ``order[i]`` (= token * k + slot) is row i of the grouped GEMMs, ``sorted_ids[i]`` its
    expert; ``group_offsets`` int32 [E + 1]. A stable sort: ties keep token order."""
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    sorted_ids = flat[order]
    bounds = torch.arange(num_experts + 1, device=flat.device, dtype=torch.int64)
    offsets = torch.searchsorted(sorted_ids, bounds, out_int32=True)
    return order, sorted_ids, offsets


# ----------------------------------------------------------------------------- fused MoE


def apply_activation(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The gated activation of fp4_moe in float32: h [P, 2I] float32 -> [P, I]."""
    if ACTIVATIONS[activation]:
        gate, up = h[:, 0::2], h[:, 1::2]
        gate = gate.clamp(max=SWIGLUOAI_LIMIT)
        up = up.clamp(min=-SWIGLUOAI_LIMIT, max=SWIGLUOAI_LIMIT)
        return (up + 1) * (gate * torch.sigmoid(gate * SWIGLUOAI_ALPHA))
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def _check_bias(bias, name: str, shape: tuple[int, int], device) -> None:
    if bias is None:
        return
    check_type(bias, torch.Tensor, name, f"None or a floating-point tensor {list(shape)}")
    if tuple(bias.shape) != shape or not bias.is_floating_point():
        raise ValueError(
            f"{name} must be floating point {list(shape)}, got {bias.dtype} {bias.shape}"
        )
    if bias.device != device:
        raise ValueError(f"{name} is on {bias.device}, x on {device}")


def check_moe(x, w13, w2, activation, mode, w13_bias, w2_bias):
    """fp4_moe's checks of everything but the routing: (global scales of w13, of w2)."""
    check_type(activation, str, "activation", f"a str, one of {sorted(ACTIVATIONS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    check_type(mode, str, "activations", f"a str, one of {MODES}")
    if mode not in MODES:
        raise ValueError(f"activations must be one of {MODES}, got {mode!r}")
    gs13, gs2 = check_experts(w13, "w13"), check_experts(w2, "w2")
    if w13.format != w2.format:
        raise ValueError(f"w13 is {w13.format} but w2 is {w2.format}")
    (e, two_i, h), (e2, h2, i) = w13.shape, w2.shape
    if e2 != e or h2 != h or two_i != 2 * i:
        raise ValueError(
            f"w13 {w13.shape} and w2 {w2.shape} must be [E, 2I, H] and [E, H, I] (one E, H, I)"
        )
    check_type(x, torch.Tensor, "x", "a torch.Tensor [T, H]")
    if x.ndim != 2 or x.shape[1] != h:
        raise ValueError(f"x must be [T, H] with the experts' H = {h}, got {tuple(x.shape)}")
    if x.device != w13.device or w2.device != w13.device:
        raise ValueError(f"x, w13 and w2 on {x.device}, {w13.device}, {w2.device}: one device")
    if mode == "bf16":
        check_w4a16_activations(x, w13.format, 'x with activations="bf16" must be')
    elif x.dtype not in IN_DTYPES:
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    elif h % 32 or i % 32:  # (W4A4 quantizes x [T, H] and the activation [rows, I] per call)
        raise ValueError(
            f'activations="dynamic" quantizes rows of H = {h} and I = {i} per call: both must '
            "be multiples of 32"
        )
    _check_bias(w13_bias, "w13_bias", (e, two_i), x.device)
    _check_bias(w2_bias, "w2_bias", (e, h), x.device)
    return gs13, gs2


def fp4_moe(
    x: torch.Tensor,
    w13: FP4Tensor,
    w2: FP4Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    *,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    activations: str = "bf16",
) -> torch.Tensor:
    """The MoE layer of the module docstring: x [T, H] -> [T, H] in x's dtype. ``activations``
    "bf16": x bfloat16 / float16 (W4A16, float16 with NVFP4 only); "dynamic": x float32 /
    bfloat16 / float16, x and the activation quantized per call to w13's format with a
    dynamic global scale (W4A4). Biases (gpt-oss): w13_bias [E, 2I] in w13's row order,
    w2_bias [E, H]. Inference only."""
    gs13, gs2 = check_moe(x, w13, w2, activation, activations, w13_bias, w2_bias)
    num_experts = w13.shape[0]
    check_routing(topk_weights, topk_ids, x.shape[0], num_experts, x.device)
    return _moe(
        x, w13, w2, gs13, gs2, topk_weights, topk_ids, activation, activations, w13_bias, w2_bias
    )


def _moe(
    x,
    w13,
    w2,
    gs13,
    gs2,
    topk_weights,
    topk_ids,
    activation,
    mode,
    w13_bias,
    w2_bias,
    prepacked=(None, None),
):
    """fp4_moe on checked arguments; ``prepacked``: w13's and w2's data prepacked (W4A16 on
    Hopper; ``FP4MoE`` keeps them) or None."""
    tokens, k = topk_ids.shape
    if tokens == 0:
        return x.new_empty(x.shape)
    weights = (w13, w2, gs13, gs2, prepacked)
    if not torch.is_grad_enabled():  # (nn.Parameter biases, e.g. transformers' own, as tensors)
        w13_bias, w2_bias = (_plain(b) for b in (w13_bias, w2_bias))
    kernels = w13.shape[0] <= moe_kernels.MAX_EXPERTS
    if kernels and eager(x, topk_weights, topk_ids, w13_bias, w2_bias):
        return _moe_kernels(
            x, *weights, topk_weights, topk_ids, activation, mode, w13_bias, w2_bias
        )
    if not _host_checks(topk_ids):
        in_range = _ids_in_range(topk_ids, w13.shape[0])
        _require(in_range, _range_message(w13.shape[0]), False)
    order, sorted_ids, offsets = expert_routing(topk_ids, w13.shape[0])
    rows = x.index_select(0, order // k)
    h = _expert_gemm(rows, w13, gs13, offsets, mode, prepacked[0])
    hf = h.float()
    if w13_bias is not None:
        hf = hf + w13_bias.float().index_select(0, sorted_ids)
    act = apply_activation(hf, activation).to(x.dtype)
    y = _expert_gemm(act, w2, gs2, offsets, mode, prepacked[1]).float()
    if w2_bias is not None:
        y = y + w2_bias.float().index_select(0, sorted_ids)
    # (back to (token, slot) order, then each token's slots weighted and summed in float32)
    pairs = y.new_empty(y.shape).index_copy_(0, order, y)
    weighted = pairs.view(tokens, k, -1) * topk_weights.float().unsqueeze(-1)
    return weighted.sum(1).to(x.dtype)


def _moe_kernels(
    x, w13, w2, gs13, gs2, prepacked, topk_weights, topk_ids, activation, mode, w13_bias, w2_bias
):
    """``_moe`` on plain CUDA tensors outside tracing: the routing (with the rows' gather),
    the activation, the combine and W4A4's exact rows as ``fp4_ops.moe_kernels``' kernels
    around the grouped GEMMs, on x's device (made current for the call if it is not)."""
    if mode == "bf16":
        check_sm90(x, W4A16_GROUPED, 'quantize the activations too (activations="dynamic")')
    elif any(p is not None for p in prepacked) and not runs_hopper_kernels(x):
        raise ValueError(PREPACKED_ON_BLACKWELL)
    here = x.device.index == torch.cuda.current_device()
    with contextlib.nullcontext() if here else torch.cuda.device(x.device):
        num_experts = w13.shape[0]
        routes = moe_kernels.route(topk_ids.contiguous(), num_experts, x)
        torch._assert_async(routes.ok, _range_message(num_experts))
        h = _expert_gemm(routes.rows, w13, gs13, routes.offsets, mode, prepacked[0], kernels=True)
        a = moe_kernels.activate(h, activation, _float_bias(w13_bias), routes.expert_of)
        y = _expert_gemm(a, w2, gs2, routes.offsets, mode, prepacked[1], kernels=True)
        weights = topk_weights if topk_weights.dtype in IN_DTYPES else topk_weights.float()
        return moe_kernels.combine_tokens(y, weights, routes, _float_bias(w2_bias))


def _plain(t):
    return t if t is None or type(t) is torch.Tensor else t.detach()


def _float_bias(bias):
    """A bias in a dtype the kernels read (float64 ones as float32, as the float32 math
    of the torch path rounds them)."""
    return bias if bias is None or bias.dtype in IN_DTYPES else bias.float()


def _expert_gemm(rows, w: FP4Tensor, gs, offsets, mode, prepacked_data, kernels=False):
    """One grouped GEMM of fp4_moe: rows in their dtype against the experts ``w``;
    ``kernels`` (plain CUDA tensors): W4A4's rows quantized straight into their exact BF16
    values on Hopper (``quantizer.quantize_exact_rows``; the registered op quantizes, then
    makes them exact with torch steps)."""
    if mode == "bf16":
        return _grouped_w4a16(rows, w, gs, offsets, rows.dtype, prepacked_data)
    data = w.data if prepacked_data is None else prepacked_data
    if kernels and runs_hopper_kernels(rows):
        # (one grid quantizes the rows into their exact BF16 values; the kernel multiplies each
        # expert's global scale by the activations' scale: no product kernel)
        from fp4_ops.quantizer import quantize_exact_rows  # (the DSL: imported on a GPU)

        values, scale = quantize_exact_rows(rows, w.sf_vec_size)
        args = (values, data, w.scale, gs, offsets, w.sf_vec_size, rows.dtype)
        return gpu_grouped_w4a16(*args, prepacked_data is not None, scale)
    a = quantize(rows, w.format)
    alpha = a.global_scale * gs
    args = (a.data, a.scale, data, w.scale, alpha, offsets, w.sf_vec_size, rows.dtype)
    run = grouped_w4a4_impl if eager(*args[:6]) else grouped_w4a4_op
    return run(*args, prepacked_data is not None)


# ----------------------------------------------------------------------------- FP4MoE

# the experts' parts in the state dict, per weight ("w13", "w2"); the layer holds *_codes
# instead of *_data (in its kernels' K order), and saves *_data in plain order
_PARTS = ("data", "scale", "global_scale")
_EXTRA_STATE = "_extra_state"


class FP4MoE(FP4Buffers):
    """The experts of an MoE layer in FP4: forward(x, topk_weights, topk_ids) = ``fp4_moe``.

    Buffers per weight w in (w13 [E, 2I, H], w2 [E, H, I]): ``{w}_codes`` (the packed codes in
    the K order of the kernels where the layer is: prepacked for the Hopper kernel, plain for
    W4A4 on the sm_100 family, reordered when a move changes it), ``{w}_scale`` (blocked),
    ``{w}_global_scale`` [E]; the biases ``w13_bias`` / ``w2_bias`` (or None). The FP4 parts keep
    their dtypes through ``.to(dtype)`` / ``.half()`` and follow device moves. State dict:
    ``{w}_data`` in plain K order, scales, global scales, biases, and the extra state {format,
    activation, activations}; loading checks everything before it assigns anything
    (ValueError naming what differs; a bias missing is a missing key, as ``nn.Module`` reports
    it). The layer holds copies of ``w13``'s and ``w2``'s tensors. Inference only."""

    def __init__(
        self,
        w13: FP4Tensor,
        w2: FP4Tensor,
        activation: str = "silu",
        activations: str = "bf16",
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ):
        super().__init__()
        check_experts(w13, "w13")
        x_like = torch.empty((0, w13.shape[2]), dtype=torch.bfloat16, device=w13.device)
        check_moe(x_like, w13, w2, activation, activations, w13_bias, w2_bias)
        self.format, self.activation, self.activations = w13.format, activation, activations
        self.num_experts, self.hidden, self.intermediate = w2.shape
        self.plain_k_order = False
        for name, w in (("w13", w13), ("w2", w2)):
            data = k_order.prepack_weights(w.data.view(torch.uint8))
            self.register_buffer(f"{name}_codes", data, persistent=False)
            # (copies: a load_state_dict writes into the layer's buffers, never the caller's)
            self.register_buffer(f"{name}_scale", w.scale.clone())
            gs = w.global_scale.float().expand(self.num_experts).clone()
            self.register_buffer(f"{name}_global_scale", gs)
        for name, bias in (("w13_bias", w13_bias), ("w2_bias", w2_bias)):
            self.register_buffer(name, None if bias is None else bias.detach().clone())
        self._settle_k_order()

    @classmethod
    def from_experts(
        cls,
        w13: torch.Tensor,
        w2: torch.Tensor,
        format: str = "nvfp4",
        activation: str = "silu",
        activations: str = "bf16",
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> FP4MoE:
        """From 16-bit (or float32) expert weights w13 [E, 2I, H] and w2 [E, H, I], quantized
        once per expert (``quantize_experts``) on their device."""
        q13, q2 = quantize_experts(w13, format), quantize_experts(w2, format)
        return cls(q13, q2, activation, activations, w13_bias, w2_bias)

    def expert_weights(self, name: str) -> FP4Tensor:
        """``name`` ("w13" or "w2") as an FP4Tensor [E, N, K] (plain K order: a copy for W4A16)."""
        if name not in ("w13", "w2"):
            raise ValueError(f'name must be "w13" or "w2", got {name!r}')
        data = self._plain_data(name)
        scale, gs = getattr(self, f"{name}_scale"), getattr(self, f"{name}_global_scale")
        return FP4Tensor.unchecked(data, scale, gs, self.format)

    def _plain_data(self, name: str) -> torch.Tensor:
        codes = getattr(self, f"{name}_codes")
        if self.plain_k_order:
            return codes
        return k_order.unprepack_weights(codes, self.hidden if name == "w13" else self.intermediate)

    def _settle_k_order(self) -> None:
        """The codes in the K order of the kernels where the layer is: plain for W4A4 on the
        sm_100 family (the Blackwell grouped kernel), prepacked everywhere else."""
        plain = self.activations == "dynamic" and runs_blackwell_kernels(self.w13_scale)
        if plain == self.plain_k_order:
            return
        reorder = self._plain_data if plain else self._prepacked_data
        codes = {f"{name}_codes": reorder(name) for name in ("w13", "w2")}
        self._buffers.update(codes)
        self.plain_k_order = plain

    def _prepacked_data(self, name: str) -> torch.Tensor:
        codes = getattr(self, f"{name}_codes")
        return k_order.prepack_weights(codes) if self.plain_k_order else codes

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._settle_k_order()
        return self

    def forward(self, x, topk_weights, topk_ids):
        check_type(x, torch.Tensor, "x", "a torch.Tensor [T, H]")
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x must be [T, H] = [T, {self.hidden}], got {tuple(x.shape)}")
        if x.device != self.w13_scale.device:
            raise ValueError(f"x is on {x.device} but the layer is on {self.w13_scale.device}")
        if self.activations == "bf16":
            check_w4a16_activations(x, self.format, 'x of a W4A16 (activations="bf16") MoE must be')
        elif x.dtype not in IN_DTYPES:
            raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
        check_routing(topk_weights, topk_ids, x.shape[0], self.num_experts, x.device)
        gs13, gs2 = self.w13_global_scale, self.w2_global_scale
        w13 = FP4Tensor.unchecked(self.w13_codes, self.w13_scale, gs13, self.format)
        w2 = FP4Tensor.unchecked(self.w2_codes, self.w2_scale, gs2, self.format)
        prepacked = (None, None) if self.plain_k_order else (self.w13_codes, self.w2_codes)
        return _moe(
            x,
            w13,
            w2,
            gs13,
            gs2,
            topk_weights,
            topk_ids,
            self.activation,
            self.activations,
            self.w13_bias,
            self.w2_bias,
            prepacked,
        )

    # -- casts, pickling and the state dict

    def kept_buffers(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in self._buffers.items() if t is not None and "bias" not in n}

    def get_extra_state(self) -> dict:
        return {
            "format": self.format,
            "activation": self.activation,
            "activations": self.activations,
        }

    def set_extra_state(self, state) -> None:
        mine = self.get_extra_state()
        if not isinstance(state, dict) or set(state) != set(mine):
            raise ValueError(f"FP4MoE: the extra state {state!r} is not an FP4MoE's")
        # (the activation mode is not the weights': a checkpoint loads into W4A16 and W4A4)
        for key in ("format", "activation"):
            value = mine[key]
            if state[key] != value:
                raise ValueError(
                    f"FP4MoE: {key} differs: the checkpoint's is {state[key]!r}, this layer's "
                    f"{value!r}"
                )

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name in ("w13", "w2"):
            out[f"{name}_data"] = self._plain_data(name)
            out[f"{name}_scale"] = getattr(self, f"{name}_scale")
            out[f"{name}_global_scale"] = getattr(self, f"{name}_global_scale")
        for name in ("w13_bias", "w2_bias"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, t in self._state_tensors().items():
            destination[prefix + name] = t if keep_vars else t.detach()
        destination[prefix + _EXTRA_STATE] = self.get_extra_state()

    def _load_fp4_state(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys
    ) -> None:
        expected = self._state_tensors()
        where = prefix.rstrip(".") or "FP4MoE"
        known = (*expected, _EXTRA_STATE)
        if strict:
            unexpected_keys.extend(
                k for k in state_dict if k.startswith(prefix) and k[len(prefix) :] not in known
            )
        if not any(prefix + name in state_dict for name in known):  # (nothing of this layer)
            missing_keys.extend(prefix + name for name in known)
            return
        if prefix + _EXTRA_STATE in state_dict:
            self.set_extra_state(state_dict[prefix + _EXTRA_STATE])
        else:
            missing_keys.append(prefix + _EXTRA_STATE)
        # (a bias missing is torch's missing key; an FP4 part missing would mix two weights)
        lacking = [n for n in expected if "bias" not in n and prefix + n not in state_dict]
        if lacking:
            raise ValueError(f"{where}: the checkpoint lacks {', '.join(lacking)}")
        found = {}
        for name, mine in expected.items():
            if prefix + name not in state_dict:
                missing_keys.append(prefix + name)
                continue
            t = state_dict[prefix + name]
            check_type(t, torch.Tensor, f"{where}.{name}", "a torch.Tensor")
            plain = name.endswith("_data") and t.dtype in PACKED_DTYPES
            # (a bias loads from any floating dtype, cast as nn.Module's load casts it)
            cast = "bias" in name and t.is_floating_point()
            if tuple(t.shape) != tuple(mine.shape) or not (plain or cast or t.dtype == mine.dtype):
                raise ValueError(
                    f"{where}: {name} differs: the checkpoint's is {t.dtype} {tuple(t.shape)}, "
                    f"this layer's {mine.dtype} {tuple(mine.shape)}"
                )
            if name.endswith("global_scale"):
                check_global_scale_value(t, f"{where}.{name}")
            found[name] = t.view(torch.uint8) if plain else t
        assign = local_metadata.get("assign_to_params_buffers", False)
        with torch.no_grad():  # (everything checked: now it all loads)
            for key, t in found.items():
                name = key
                if name.endswith("_data"):
                    name = name.replace("_data", "_codes")
                    t = t if self.plain_k_order else k_order.prepack_weights(t)
                if assign:
                    self._buffers[name] = t
                else:
                    self._load_into(name, t, prefix + key)
        self._settle_k_order()  # (assigned tensors may be elsewhere than the layer was)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
            f"format={self.format}, activation={self.activation}, activations={self.activations}"
        )


# ----------------------------------------------------------------------------- transformers


class FP4Experts(FP4MoE):
    """A transformers experts module in FP4 (``quantize_model`` puts it in their place):
    forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) as theirs, through
    ``fp4_moe``. ``from_transformers`` takes the experts' tensors as ``transformers_experts``
    reads them."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return super().forward(hidden_states, top_k_weights, top_k_index)

    @classmethod
    def from_transformers(
        cls, module: torch.nn.Module, format: str = "nvfp4", activations: str = "bf16"
    ) -> FP4Experts:
        """The experts of ``module`` quantized once per expert (``quantize_experts``) on their
        device; ValueError where ``transformers_experts`` refuses the module."""
        w13, w2, activation, b13, b2 = transformers_experts(module)
        q13, q2 = quantize_experts(w13, format), quantize_experts(w2, format)
        return cls(q13, q2, activation, activations, b13, b2)


class FP4Llama4Experts(FP4Experts):
    """Llama-4's experts module (``Llama4TextExperts``) in FP4. Its block runs every expert
    on every token, scaled first by the token's router score for it (0 for experts not among
    its ``top_k``): forward(hidden_states [E * T, H]) -> [E * T, H], row e * T + t for expert
    e and token t. Here each token's ``top_k`` rows of largest magnitude (the chosen experts';
    where fewer are nonzero, the others are zero rows, which give zero) run through
    ``fp4_moe`` with unit weights, and every other row of the output is zero, as theirs."""

    def __init__(self, w13, w2, activation="silu", activations="bf16", *, top_k: int):
        super().__init__(w13, w2, activation, activations)
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
        if not 1 <= top_k <= self.num_experts:
            raise ValueError(f"top_k must be in [1, {self.num_experts}] (E), got {top_k}")
        self.top_k = top_k

    def forward(self, hidden_states):
        check_type(hidden_states, torch.Tensor, "hidden_states", "a torch.Tensor [E * T, H]")
        e, h = self.num_experts, self.hidden
        if hidden_states.ndim != 2 or hidden_states.shape[1] != h or hidden_states.shape[0] % e:
            raise ValueError(
                f"hidden_states must be [E * T, H] = [{e} * T, {h}], got "
                f"{tuple(hidden_states.shape)}"
            )
        t, k = hidden_states.shape[0] // e, self.top_k
        size = hidden_states.abs().amax(-1).view(e, t)
        chosen = size.topk(k, dim=0).indices.t().reshape(t * k, 1)  # (token, slot) -> expert
        tokens = torch.arange(t, device=hidden_states.device).repeat_interleave(k)
        at = chosen.view(-1) * t + tokens  # (their rows)
        rows = hidden_states.index_select(0, at)
        ones = torch.ones((t * k, 1), dtype=torch.float32, device=hidden_states.device)
        y = FP4Experts.forward(self, rows, chosen, ones)
        return hidden_states.new_zeros(hidden_states.shape).index_copy_(0, at, y)

    @classmethod
    def from_transformers(
        cls,
        module: torch.nn.Module,
        format: str = "nvfp4",
        activations: str = "bf16",
        *,
        top_k: int,
    ) -> FP4Llama4Experts:
        """The experts of ``module`` quantized once per expert on their device; ValueError
        where ``llama4_experts`` refuses it. ``top_k``: its block's (``Llama4TextMoe.top_k``)."""
        w13, w2 = llama4_experts(module)
        q13, q2 = quantize_experts(w13, format), quantize_experts(w2, format)
        return cls(q13, q2, "silu", activations, top_k=top_k)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, top_k={self.top_k}"


def _experts_params(module: torch.nn.Module, extra=frozenset()) -> dict:
    """An experts module's own parameters: 3-D gate_up_proj and down_proj, and ``extra``;
    ValueError where it holds others, or a submodule but its act_fn."""
    params = dict(module.named_parameters(recurse=False))
    name = type(module).__name__
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if gate_up is None or down is None or gate_up.ndim != 3 or down.ndim != 3:
        raise ValueError(f"{name}: no 3-D gate_up_proj and down_proj parameters")
    known = {"gate_up_proj", "down_proj", *extra}
    act = getattr(module, "act_fn", None)
    if set(params) != known or list(module.children()) not in ([], [act]):
        raise ValueError(f"{name}: parameters or submodules beyond the experts' {sorted(known)}")
    return params


def _check_paired(module: torch.nn.Module, w13, w2, why: str) -> None:
    """ValueError (``why``) unless w13 [E, 2I, H] and w2 [E, H, I], as read from the module's
    gate_up_proj and down_proj, pair as experts."""
    (e, two_i, h), (e2, h2, i) = w13.shape, w2.shape
    if e2 != e or h2 != h or two_i != 2 * i:
        gate_up, down = module.gate_up_proj.shape, module.down_proj.shape
        raise ValueError(
            f"{type(module).__name__}: gate_up_proj {tuple(gate_up)} and down_proj "
            f"{tuple(down)} {why}"
        )


def takes_scaled_tokens(module: torch.nn.Module) -> bool:
    """Whether an experts module's forward takes one argument, the tokens already scaled per
    expert (Llama-4's), rather than tokens and their routing (transformers 5's others)."""
    try:
        return len(inspect.signature(module.forward).parameters) == 1
    except (TypeError, ValueError):
        return False


def llama4_experts(module: torch.nn.Module):
    """(w13 [E, 2I, H], w2 [E, H, I]) of a Llama-4 experts module, in ``fp4_moe``'s
    conventions: gate_up_proj [E, H, 2I] (gate columns first) and down_proj [E, I, H], SiLU,
    forward(hidden_states [E * T, H]) as ``FP4Llama4Experts`` describes, checked on the module's
    own forward (rows of three tokens per expert); ValueError names what does not fit."""
    name = type(module).__name__
    params = _experts_params(module)
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    check_silu(module, name)
    w13, w2 = gate_up.detach().transpose(1, 2), down.detach().transpose(1, 2)
    _check_paired(module, w13, w2, "are not Llama-4's [E, H, 2I] and [E, I, H]")
    _check_scaled_forward(module, w13, w2)
    return w13, w2


def _check_scaled_forward(module, w13, w2) -> None:
    """ValueError unless the module's forward on rows [E * 3, H] is each expert's SiLU MLP of
    its rows, to within its dtype's rounding (``_check_forward``'s bound)."""
    e, h = w13.shape[0], w13.shape[2]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(e, 3, h, generator=gen, dtype=torch.float32).to(w13.device, w13.dtype)
    with torch.no_grad():
        try:
            got = module(x.reshape(e * 3, h)).float().view(e, 3, h)
        except Exception as err:  # (not Llama-4's forward)
            raise ValueError(
                f"{type(module).__name__}: its forward does not take the scaled tokens [E * T, "
                f"H] as Llama-4's experts do: {type(err).__name__}: {err}"
            ) from None
        hid = torch.bmm(x.float(), w13.float().transpose(1, 2))
        want = torch.bmm(apply_activation(hid, "silu"), w2.float().transpose(1, 2))
    tol = 8 * torch.finfo(w13.dtype).eps * want.norm(dim=2, keepdim=True) + 1e-6
    if not bool(torch.isfinite(got).all()) or bool(
        ((got - want).norm(dim=2, keepdim=True) > tol).any()
    ):
        raise ValueError(
            f"{type(module).__name__}: its forward does not compute the experts as "
            "gate_up_proj [E, H, 2I] (gate columns first) and down_proj [E, I, H] read here"
        )


def is_experts_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds its experts as transformers does: a 3-D ``gate_up_proj``."""
    w = module._parameters.get("gate_up_proj")
    return isinstance(w, torch.Tensor) and w.ndim == 3


def check_silu(module: torch.nn.Module, name: str) -> None:
    """ValueError unless the experts module's ``act_fn`` is SiLU (checked on values: its class
    varies with the library that made it)."""
    act = getattr(module, "act_fn", None)
    probe = torch.linspace(-8.0, 8.0, 65, dtype=torch.float32)
    if not callable(act) or not torch.equal(act(probe), F.silu(probe)):
        raise ValueError(f"{name}: its act_fn {act!r} is not SiLU")


def check_swigluoai(module: torch.nn.Module, name: str) -> None:
    """ValueError unless the experts module's clamped SwiGLU (``alpha``, ``limit``) is
    fp4_moe's "swigluoai"."""
    clamp = (getattr(module, "alpha", None), getattr(module, "limit", None))
    if clamp != (SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT):
        raise ValueError(
            f"{name}: its SwiGLU's (alpha, limit) = {clamp}; fp4_moe's is "
            f"({SWIGLUOAI_ALPHA}, {SWIGLUOAI_LIMIT})"
        )


def transformers_experts(module: torch.nn.Module):
    """(w13 [E, 2I, H], w2 [E, H, I], activation, w13_bias, w2_bias) of a transformers experts
    module, in ``fp4_moe``'s conventions:
      * gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I], ``act_fn`` SiLU:
        Qwen2/3-MoE, Mixtral, DeepSeek-V3 and the many models written alike; "silu";
      * gate_up_proj [E, H, 2I] (gate and up interleaved) and down_proj [E, I, H] with their
        biases and gpt-oss's clamped SwiGLU (``alpha``, ``limit``): "swigluoai".
    The convention is checked on the module's own forward (two tokens, routed to three
    experts, on the weights as they are); ValueError names what does not fit."""
    name = type(module).__name__
    biases = {"gate_up_proj_bias", "down_proj_bias"}
    biased = biases <= set(module._parameters)
    params = _experts_params(module, biases if biased else set())
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    if biased:
        w13, w2 = gate_up.detach().transpose(1, 2), down.detach().transpose(1, 2)
        b13, b2 = params["gate_up_proj_bias"].detach(), params["down_proj_bias"].detach()
        activation = "swigluoai"
        check_swigluoai(module, name)
    else:
        w13, w2, b13, b2, activation = gate_up.detach(), down.detach(), None, None, "silu"
        check_silu(module, name)
    _check_paired(module, w13, w2, "do not pair as experts")
    _check_forward(module, w13, w2, activation, b13, b2)
    return w13, w2, activation, b13, b2


def _transformers_version() -> str:
    """The installed transformers' version, for messages."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "not installed"


#: how far ``_check_forward``'s large tokens drive the largest gate / up value, by the experts'
#: dtype (float16 keeps the probe's gate x up products finite): past the clamps in use (7-10),
#: with most values past a clamp of a few tens
PROBE_REACH = {torch.float16: 128.0}
PROBE_REACH_DEFAULT = 512.0


def check_experts_forward(module: torch.nn.Module, name: str, activation: str) -> None:
    """ValueError unless the experts module's forward is ``fp4_moe``'s ``activation`` layer on
    its own layout (``transformers_experts``' check, or ``llama4_experts``'), also for a module
    built on the meta
    device (a loader's): its forward runs on a CPU copy whose experts all hold one expert's
    seeded random weights (expanded: one expert's memory). A module whose class computes more
    than its act_fn says (a clamp, a scale) is refused here."""
    probe = module
    params = dict(module.named_parameters(recurse=False))
    if any(p.is_meta for p in params.values()):
        probe = copy.deepcopy(module)
        gen = torch.Generator().manual_seed(0)
        for key, p in params.items():  # (weights ~ 1 / sqrt(fan-in); biases ~ 1)
            spread = p.shape[-1] ** -0.5 if p.ndim == 3 else 1.0
            one = torch.randn((1, *p.shape[1:]), generator=gen, dtype=torch.float32)
            one = (one * spread).to(p.dtype)
            probe._parameters[key] = torch.nn.Parameter(one.expand(p.shape), requires_grad=False)
    try:
        if takes_scaled_tokens(probe):
            llama4_experts(probe)
            found = "silu"
        else:
            found = transformers_experts(probe)[2]
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if found != activation:
        raise ValueError(f"{name}: its forward is a {found} layer, not {activation}")


def _check_forward(module, w13, w2, activation, b13, b2) -> None:
    """ValueError unless the module's forward computes fp4_moe's definition on its own weights
    (float32, four tokens routed to three experts) to within its dtype's rounding. Two tokens
    are scaled so that the largest gate / up value reaches ``PROBE_REACH`` (of the dtype): a
    forward that clamps them (DeepSeek-V4's ``swiglu_limit``) differs there, whatever the
    weights' scale."""
    e, h = w13.shape[0], w13.shape[2]
    gen = torch.Generator().manual_seed(0)
    dtype, device = w13.dtype, w13.device
    ids = torch.tensor([[0, e - 1], [e // 2, 0]] * 2, device=device)
    # (float32 whatever torch's default dtype: the probe's sums are float32 throughout)
    x = torch.randn(4, h, generator=gen, dtype=torch.float32).to(device)
    target = PROBE_REACH.get(dtype, PROBE_REACH_DEFAULT)
    with torch.no_grad():
        for t in (2, 3):
            reach = max(float((w13[int(ex)].float() @ x[t]).abs().max()) for ex in ids[t])
            if reach > 0:
                x[t] *= target / reach
    x = x.to(dtype)
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5]] * 2, device=device, dtype=dtype)
    with torch.no_grad():
        try:
            got = module(x, ids, weights).float()
        except Exception as err:  # (another signature: transformers 4.x, or not experts at all)
            raise ValueError(
                f"{type(module).__name__}: its forward does not take (hidden states [T, H], top-k "
                f"expert ids [T, k], top-k weights [T, k]) as transformers 5's experts modules do "
                f"(transformers {_transformers_version()} here): {type(err).__name__}: {err}"
            ) from None
        want = torch.zeros(4, h, device=device, dtype=torch.float32)
        for t in range(4):
            for slot in range(2):
                ex = int(ids[t, slot])
                hid = x[t].float() @ w13[ex].float().t()
                if b13 is not None:
                    hid = hid + b13[ex].float()
                y = apply_activation(hid[None], activation)[0] @ w2[ex].float().t()
                if b2 is not None:
                    y = y + b2[ex].float()
                want[t] += float(weights[t, slot]) * y
    # (the module rounds h, the activation, y and the weighted sum in its dtype, each by at
    # most eps / 2 relative: 8 eps a token covers them; a misread layout is off by order one)
    tol = 8 * torch.finfo(dtype).eps * want.norm(dim=1) + 1e-6
    if not bool(torch.isfinite(got).all()) or bool(((got - want).norm(dim=1) > tol).any()):
        raise ValueError(
            f"{type(module).__name__}: its forward does not compute the experts as "
            "gate_up_proj / down_proj are read here (gate and up order, transposes, biases)"
        )
