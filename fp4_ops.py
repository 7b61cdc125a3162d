# SPDX-License-Identifier: BSD-3-Clause
"""FP4 (NVFP4 / MXFP4) as a library: one quantized-operand type, a quantizer, one GEMM op, a Linear.

    import fp4_ops
    a = fp4_ops.quantize(x, "nvfp4")                 # FP4Tensor: codes, 128x4 scales, global scale
    y = fp4_ops.fp4_gemm(a, w, out_dtype=torch.bfloat16)     # y = dequant(a) @ dequant(w)^T
    model = fp4_ops.quantize_model(model)           # nn.Linear -> FP4Linear (W4A4)

``FP4Tensor``
    Packed E2M1 codes [rows, K/2] (or [L, rows, K/2]), the block scales in the 128x4 blocked layout
    of ``reference.to_blocked`` (1-D, or [L, n]) and the fp32 per-tensor global scale as a 0-d
    tensor on the data's device, in the decoding convention ``x ~= e2m1 * scale * global_scale``
    (``amax / (448 * 6)``; 1.0 for MXFP4). Scales in the plain row layout are refused: they have
    the data's rank, blocked ones one dimension less (``FP4Tensor.from_plain`` swizzles them).
    Converters: torchao's ``NVFP4Tensor`` (both ways), ModelOpt NVFP4 checkpoint tensors and
    compressed-tensors' NVFP4 tensors (whose ``*_global_scale`` is the reciprocal, the encoding
    scale ``448 * 6 / amax``).
``quantize(x, format, global_scale=None)``
    ``torch.library`` op: CPU tensors through ``reference.quantize_nvfp4`` / ``quantize_mxfp4``
    (bit-exact by construction), CUDA tensors through the CuTe DSL quantizer (``quantize_fp4.py``,
    bit-exact with the reference). ``global_scale`` None: dynamic (amax pass on the device).
``fp4_gemm(a, b, out_dtype, alpha=None)``
    ``torch.library`` op with a fake kernel (``torch.compile(fullgraph=True)``): CPU ->
    ``reference.reference_gemm``, sm_90 -> the Hopper kernel, sm_100 family -> the Blackwell kernel.
    alpha = a.global_scale * b.global_scale (* alpha) is formed on the device, and the kernels
    read it there. ``a`` a bfloat16 / float16 tensor: W4A16 (weight-only FP4, Hopper).
``FP4Linear``, ``quantize_model``
    FP4 linear layers: weights quantized once, activations quantized per call (W4A4, dynamic or
    static global scale) or kept in 16 bits (``activations="bf16"``, W4A16), ``fp4_gemm``, bias.

Importing this module needs no GPU and no CuTe DSL: the kernels are imported on first use.
"""

from __future__ import annotations

import fnmatch
import importlib
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

import reference

#: format name -> scale block size (sf_vec_size)
FORMATS = {"nvfp4": reference.NVFP4_BLOCK, "mxfp4": reference.MXFP4_BLOCK}
_FORMAT_OF_VEC = {v: k for k, v in FORMATS.items()}
#: NVFP4 global scale = amax / GLOBAL_SCALE_DIVISOR (decoding convention)
GLOBAL_SCALE_DIVISOR = reference.E4M3_MAX * reference.E2M1_MAX
_PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)
_HERE = os.path.dirname(os.path.abspath(__file__))


def _format_vec(format: str) -> int:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    return FORMATS[format]


def blocked_scale_numel(rows: int, k: int, sf_vec_size: int) -> int:
    """Scale bytes of one [rows, K] operand (one batch) in the 128x4 layout (zero padded)."""
    return reference.blocked_numel(rows, k // sf_vec_size)


# ----------------------------------------------------------------------------- FP4Tensor


@dataclass(frozen=True)
class FP4Tensor:
    """A quantized NVFP4 / MXFP4 operand: ``x ~= e2m1(data) * scale * global_scale``.

    * ``data``: packed codes, uint8 or ``torch.float4_e2m1fn_x2``, [rows, K/2] or [L, rows, K/2],
      contiguous, element 2i in the low nibble.
    * ``scale``: block scales in the 128x4 blocked layout (``reference.to_blocked``): 1-D for 2-D
      data, [L, n] for 3-D data; float8_e4m3fn (NVFP4, per 16) or float8_e8m0fnu (MXFP4, per 32).
    * ``global_scale``: 0-d float32 tensor on the data's device, decoding convention (1.0 for
      MXFP4).
    * ``format``: "nvfp4" or "mxfp4".
    """

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    format: str

    def __post_init__(self) -> None:
        vec = _format_vec(self.format)
        d, s, g = self.data, self.scale, self.global_scale
        for name, t in (("data", d), ("scale", s), ("global_scale", g)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"FP4Tensor.{name} must be a torch.Tensor, got {type(t).__name__}")
        if d.dtype not in _PACKED_DTYPES:
            raise ValueError(f"FP4Tensor.data must be uint8 or float4_e2m1fn_x2, got {d.dtype}")
        if d.ndim not in (2, 3):
            raise ValueError(
                f"FP4Tensor.data must be [rows, K/2] or [L, rows, K/2], got {tuple(d.shape)}"
            )
        k = 2 * d.shape[-1]
        if k == 0 or k % vec:
            raise ValueError(f"K = {k} is not a positive multiple of the {self.format} block {vec}")
        want = reference.SCALE_DTYPES[vec]
        if s.dtype != want:
            raise ValueError(f"{self.format} needs {want} scales, got {s.dtype}")
        if s.ndim == d.ndim:
            raise ValueError(
                f"FP4Tensor.scale has the data's rank ({tuple(s.shape)} for data "
                f"{tuple(d.shape)}): that is the plain row layout; the 128x4 blocked layout is "
                "1-D (or [L, n]): use FP4Tensor.from_plain or reference.to_blocked"
            )
        n = blocked_scale_numel(d.shape[-2], k, vec)
        expect = (n,) if d.ndim == 2 else (d.shape[0], n)
        if tuple(s.shape) != expect:
            raise ValueError(
                f"FP4Tensor.scale has shape {tuple(s.shape)}; data {tuple(d.shape)} in the "
                f"128x4 blocked layout needs {expect}"
            )
        if g.ndim != 0 or g.dtype != torch.float32:
            raise ValueError(
                f"FP4Tensor.global_scale must be a 0-d float32 tensor, got {g.dtype} "
                f"{tuple(g.shape)}"
            )
        if not (s.device == d.device == g.device):
            raise ValueError(
                f"FP4Tensor parts on different devices: data {d.device}, scale {s.device}, "
                f"global_scale {g.device}"
            )
        if not (d.is_contiguous() and s.is_contiguous()):
            raise ValueError("FP4Tensor.data and FP4Tensor.scale must be contiguous")

    # -- properties

    @property
    def sf_vec_size(self) -> int:
        return FORMATS[self.format]

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (unpacked) shape: [rows, K] or [L, rows, K]."""
        return (*self.data.shape[:-1], 2 * self.data.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.data.device

    def plain_scales(self) -> torch.Tensor:
        """The block scales in the plain row layout, [rows, K/vec] (or [L, rows, K/vec])."""
        rows, k = self.shape[-2], self.shape[-1]
        return reference.from_blocked(self.scale, rows, k // self.sf_vec_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``e2m1 * scale * global_scale`` as ``dtype`` (computed in float32)."""
        out = reference.dequantize_fp4(
            self.data, self.plain_scales(), self.sf_vec_size, self.global_scale
        )
        return out.to(dtype)

    # -- constructors and converters

    @classmethod
    def from_plain(
        cls,
        data: torch.Tensor,
        scales: torch.Tensor,
        global_scale: torch.Tensor | float | None = None,
        format: str = "nvfp4",
    ) -> FP4Tensor:
        """From scales in the plain row layout [rows, K/vec] (what ``reference.quantize_*``
        return); ``global_scale`` in the decoding convention (None: 1.0)."""
        data = reference._packed_as_uint8(data, "data")
        if scales.ndim != data.ndim:
            raise ValueError(
                f"plain scales must have the data's rank: data {tuple(data.shape)}, "
                f"scales {tuple(scales.shape)}"
            )
        expect = (*data.shape[:-1], 2 * data.shape[-1] // _format_vec(format))
        if tuple(scales.shape) != expect:
            raise ValueError(f"scales have shape {tuple(scales.shape)}; data needs {expect}")
        return cls(data.contiguous(), reference.to_blocked(scales), _gs(global_scale, data), format)

    @classmethod
    def from_torchao(cls, t) -> FP4Tensor:
        """From torchao's ``NVFP4Tensor`` (``qdata``, ``scale`` swizzled or not,
        ``per_tensor_scale`` in the same decoding convention, or None = 1.0). 2-D or 3-D,
        K-major (not transposed) only."""
        if t.block_size != reference.NVFP4_BLOCK:
            raise ValueError(f"NVFP4Tensor block_size {t.block_size}; NVFP4 uses 16")
        q = t.qdata
        if q.ndim not in (2, 3) or q.stride(-1) != 1:
            raise ValueError("only K-major (untransposed) 2-D / 3-D NVFP4Tensors convert")
        rows, k = q.shape[-2], 2 * q.shape[-1]
        lead = q.shape[:-2]
        sc = t.scale.view(torch.float8_e4m3fn)
        if t.is_swizzled_scales:
            # torchao swizzles all leading dims together as one [L * rows, K/16] matrix
            sc = reference.from_blocked(sc.reshape(-1), math.prod(lead) * rows, k // 16)
        plain = sc.reshape(*lead, rows, k // 16)
        pts = t.per_tensor_scale
        if pts is not None and pts.ndim != 0:
            raise ValueError("per-expert (3-D) per_tensor_scale has no FP4Tensor equivalent")
        return cls.from_plain(q.view(torch.uint8), plain, pts, "nvfp4")

    def to_torchao(self, swizzled: bool = True, orig_dtype: torch.dtype = torch.bfloat16):
        """As torchao's ``NVFP4Tensor`` (NVFP4 only); ``swizzled`` picks its scale layout."""
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

        if self.format != "nvfp4":
            raise ValueError("torchao's NVFP4Tensor holds NVFP4 only")
        plain = self.plain_scales()
        rows, k = self.shape[-2], self.shape[-1]
        lead = self.data.shape[:-2]
        if swizzled:
            if lead and rows % 128:
                raise ValueError(
                    "torchao swizzles the scales of a 3-D tensor as one matrix; that matches a "
                    f"layout only for rows % 128 == 0, got {rows} (use swizzled=False)"
                )
            sc = reference.to_blocked(plain.reshape(-1, k // 16))
            # torchao's swizzled shape: [rows padded to 128 / 4, scale columns padded to 4 x 4]
            rows_pad, cols_pad = reference._round_up(rows, 128), reference._round_up(k // 16, 4)
            sc = sc.view(*lead, rows_pad // 4, cols_pad * 4)
        else:
            sc = plain
        return NVFP4Tensor(
            self.data.view(torch.uint8),
            sc,
            16,
            orig_dtype,
            self.global_scale.clone(),
            is_swizzled_scales=swizzled,
        )

    @classmethod
    def from_modelopt(
        cls, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor
    ) -> FP4Tensor:
        """From a ModelOpt NVFP4 checkpoint's tensors: ``weight`` uint8 [N, K/2] (element 2i in
        the low nibble), ``weight_scale`` float8_e4m3fn [N, K/16] (plain row layout) and
        ``weight_scale_2`` (the decoding global scale, amax / (448 * 6))."""
        return cls.from_plain(weight, weight_scale, weight_scale_2, "nvfp4")

    @classmethod
    def from_compressed_tensors(
        cls,
        weight_packed: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_global_scale: torch.Tensor,
    ) -> FP4Tensor:
        """From compressed-tensors' NVFP4 tensors. NOTE: ``weight_global_scale`` there is the
        *encoding* scale, the reciprocal of ours (448 * 6 / amax); it is inverted here."""
        inv = _gs(weight_global_scale, weight_packed)
        return cls.from_plain(weight_packed, weight_scale, 1.0 / inv, "nvfp4")

    def to_compressed_tensors(self) -> dict[str, torch.Tensor]:
        """``weight_packed``, ``weight_scale`` (plain layout) and ``weight_global_scale`` (the
        reciprocal of ``global_scale``, compressed-tensors' convention)."""
        if self.format != "nvfp4" or self.data.ndim != 2:
            raise ValueError("compressed-tensors' NVFP4 weights are 2-D NVFP4")
        return {
            "weight_packed": self.data.view(torch.uint8),
            "weight_scale": self.plain_scales(),
            "weight_global_scale": (1.0 / self.global_scale).reshape(1),
        }


def _gs(value, like: torch.Tensor) -> torch.Tensor:
    """A global scale (number, one-element tensor or None = 1.0) as a 0-d float32 tensor on
    ``like``'s device. Checks positivity and finiteness on CPU tensors only (no host sync)."""
    if value is None:
        return torch.ones((), dtype=torch.float32, device=like.device)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"a global scale has one element, got shape {tuple(value.shape)}")
        t = value.detach().to(device=like.device, dtype=torch.float32).reshape(()).clone()
    else:
        t = torch.tensor(float(value), dtype=torch.float32, device=like.device)
    if t.device.type == "cpu" and not (math.isfinite(float(t)) and float(t) > 0):
        raise ValueError(f"a global scale must be finite and positive, got {float(t)}")
    return t


# ----------------------------------------------------------------------------- quantize


def _fake_quantized(x: torch.Tensor, sf_vec_size: int):
    rows, k = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    data = x.new_empty((*lead, rows, k // 2), dtype=torch.uint8)
    scale = x.new_empty(
        (*lead, blocked_scale_numel(rows, k, sf_vec_size)),
        dtype=reference.SCALE_DTYPES[sf_vec_size],
    )
    return data, scale, x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("fp4_ops::quantize", mutates_args=())
def _quantize_op(
    x: torch.Tensor, sf_vec_size: int, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.device.type == "cuda":
        import quantize_fp4

        return quantize_fp4.quantize_cuda(x, sf_vec_size, global_scale)
    if x.device.type != "cpu":
        raise ValueError(f"quantize runs on CPU and CUDA tensors, got one on {x.device}")
    if sf_vec_size == reference.NVFP4_BLOCK:
        data, sc, gs = reference.quantize_nvfp4(x, global_scale)
        gs = gs.clone()  # (an op's outputs must not alias its inputs)
    else:
        data, sc = reference.quantize_mxfp4(x)
        gs = torch.ones((), dtype=torch.float32)
    return data, reference.to_blocked(sc), gs


@_quantize_op.register_fake
def _(x, sf_vec_size, global_scale):
    return _fake_quantized(x, sf_vec_size)


def quantize(
    x: torch.Tensor, format: str = "nvfp4", global_scale: torch.Tensor | float | None = None
) -> FP4Tensor:
    """Quantize x [rows, K] or [L, rows, K] (float32 / bfloat16 / float16) to an FP4Tensor.

    ``global_scale`` (NVFP4 only; decoding convention): None computes ``amax / (448 * 6)`` over
    the whole tensor on its device (no host sync); a number or one-element tensor is used as is
    (a static scale, e.g. ModelOpt's ``input_scale``). CPU tensors go through ``reference.py``
    (NaN / Inf raise ValueError); CUDA tensors through ``quantize_fp4.py``, which cannot raise
    without a sync: a block holding NaN / Inf gets the NaN scale byte and zero codes instead
    (and a dynamic global scale becomes non-finite), so every product that reads it is NaN.
    """
    vec = _format_vec(format)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim not in (2, 3) or x.numel() == 0:
        raise ValueError(f"x must be a non-empty [rows, K] or [L, rows, K], got {tuple(x.shape)}")
    if x.shape[-1] % 32:
        raise ValueError(f"K = {x.shape[-1]} (last dim of x) is not a multiple of 32")
    if global_scale is not None and vec != reference.NVFP4_BLOCK:
        raise ValueError("mxfp4 has no global scale (its E8M0 block scales span the range)")
    gs = None if global_scale is None else _gs(global_scale, x)
    data, scale, out_gs = _quantize_op(x.contiguous(), vec, gs)
    return FP4Tensor(data, scale, out_gs, format)


# ----------------------------------------------------------------------------- GEMM


@torch.library.custom_op("fp4_ops::gemm", mutates_args=())
def _gemm_op(
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
        sfa = reference.from_blocked(a_scale, m, k // sf_vec_size)
        sfb = reference.from_blocked(b_scale, n, k // sf_vec_size)
        return reference.reference_gemm(
            a_data, b_data, sfa, sfb, sf_vec_size, alpha, out_dtype=out_dtype
        )
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


@_gemm_op.register_fake
def _(a_data, a_scale, b_data, b_scale, alpha, sf_vec_size, out_dtype):
    shape = (*a_data.shape[:-1], b_data.shape[-2])
    return a_data.new_empty(shape, dtype=out_dtype)


@torch.library.custom_op("fp4_ops::gemm_w4a16", mutates_args=())
def _gemm_w4a16_op(
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
        b = _hopper("k_order").unprepack_weights(b_data, k) if b_prepacked else b_data
        sfb = reference.from_blocked(b_scale, b.shape[-2], k // sf_vec_size)
        return reference.reference_gemm_w4a16(a, b, sfb, sf_vec_size, alpha, out_dtype)
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
    b = b if b_prepacked else _hopper("k_order").prepack_weights(b)
    n = b.shape[-2]
    args = (a.contiguous().reshape(l, m, k), b.reshape(l, n, -1), None, b_scale.reshape(l, -1))
    out = _gemm_sm90(*args, sf_vec_size, alpha, out_dtype, a_dtype=_A_DTYPES[a.dtype])
    return out if a.ndim == 3 else out[0]


@_gemm_w4a16_op.register_fake
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
    current then. CPU tensors run ``reference.reference_gemm`` (``reference_gemm_w4a16``).
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
    alpha = _device_alpha(a.global_scale * b.global_scale, alpha)
    return _gemm_op(a.data, a.scale, b.data, b.scale, alpha, a.sf_vec_size, out_dtype)


def _fp4_gemm_w4a16(a, b, out_dtype, alpha):
    """``fp4_gemm`` with 16-bit activations ``a`` (W4A16)."""
    if not isinstance(b, FP4Tensor):
        raise ValueError(f"b must be an FP4Tensor (fp4_ops.quantize), got {type(b)}")
    _check_w4a16_activations(a, b.format, "a must be an FP4Tensor (fp4_ops.quantize) or")
    _check_pair(a.ndim, a.shape, a.device, b, b.shape[-1], out_dtype)
    if a.shape[-1] % 32:
        raise ValueError(f"W4A16 needs K a multiple of 32, got K = {a.shape[-1]}")
    alpha = _device_alpha(b.global_scale, alpha)
    return _gemm_w4a16_op(a, b.data, b.scale, alpha, b.sf_vec_size, out_dtype, False)


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
    if out_dtype not in reference.OUT_DTYPES:
        raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")


def _check_w4a16_activations(a, format: str, what: str) -> None:
    """W4A16 activations: bfloat16, or float16 with NVFP4 weights; ``what`` opens the message."""
    if a.dtype not in _A_DTYPES:
        raise ValueError(f"{what} bfloat16 / float16 activations (W4A16), got a {a.dtype} tensor")
    if a.dtype == torch.float16 and format == "mxfp4":
        raise ValueError("mxfp4 weights need bfloat16 activations (E8M0 exceeds float16's range)")


def _device_alpha(scale: torch.Tensor, alpha) -> torch.Tensor:
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

_SM90_RUNNERS: dict = {}
_C_DTYPES = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
# W4A16 activations: the 16-bit D types
_A_DTYPES = {t: name for t, name in _C_DTYPES.items() if t != torch.float32}


def _sm100_config(
    m: int,
    n: int,
    k: int,
    l: int,  # noqa: E741
    sf_vec_size: int,
    out_dtype: torch.dtype,
) -> dict:
    """``prepare_gemm``'s configuration for a shape: the Blackwell module's own tile and cluster
    rule (``pick_tile_and_cluster``), with D in ``out_dtype``."""
    _importable(_HERE)
    import blockwise_gemm_fp4

    tiler, cluster = blockwise_gemm_fp4.pick_tile_and_cluster((m, n, k, l))
    return {
        "c_dtype": _C_DTYPES[out_dtype],
        "mma_tiler_mn": tiler,
        "cluster_shape_mn": cluster,
    }


def _gemm_sm100(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype):
    """Blackwell: packed uint8 a [L, M, K/2] and b [L, N, K/2], blocked scales [L, n] through
    ``prepare_gemm`` (compiled kernels cached per configuration inside it), with alpha's device
    tensor: the kernel reads it when it runs, so no host sync.

    CUDA graphs: the launch reads alpha's address at replay, so the tensor must hold alpha then.
    ``fp4_gemm`` forms it on the stream just before the call, so under capture the product is
    recomputed at each replay into memory of the graph's own pool, which lasts as long as the
    graph. D comes back contiguous: a copy only when N leaves the kernel a padded row pitch."""
    _importable(_HERE)
    import blockwise_gemm_fp4

    (l, m, half_k), n = a.shape, b.shape[1]  # noqa: E741
    config = _sm100_config(m, n, 2 * half_k, l, sf_vec_size, out_dtype)
    launch, d = blockwise_gemm_fp4.prepare_gemm(
        a, b, sfa.contiguous(), sfb.contiguous(), sf_vec_size, alpha=alpha, **config
    )
    launch()
    return d.contiguous()


def _gemm_sm90(a, b, sfa, sfb, sf_vec_size, alpha, out_dtype, a_dtype="Float4E2M1FN"):
    """Hopper: ``default_config``'s path, tile, split and K groups for the shape; one
    ``Fp4GemmSm90Runner`` per configuration and device (it keeps a workspace per stream; its
    first call on a shape and stream allocates it, so warm up before CUDA-graph capture).  The
    kernel reads alpha's device tensor when it runs and writes D in ``out_dtype``.  W4A4:
    packed uint8 a [L, M, K/2] and b [L, N, K/2], blocked scales [L, n]; W4A16: ``a`` the
    16-bit activations [L, M, K], ``b`` prepacked weights, ``sfa`` None."""
    k90 = _hopper("blockwise_gemm_fp4_sm90")
    l, m = a.shape[0], a.shape[1]  # noqa: E741
    k = 2 * a.shape[2] if a_dtype == "Float4E2M1FN" else a.shape[2]
    n, device = b.shape[1], a.device
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    path, tiler, split, k_groups = k90.default_config(m, n, k, l, num_sms, a_dtype=a_dtype)
    c_dtype = _C_DTYPES[out_dtype]
    key = (sf_vec_size, c_dtype, a_dtype, path, tuple(tiler), split, k_groups, device.index)
    if key not in _SM90_RUNNERS:
        with torch.cuda.device(device):
            _SM90_RUNNERS[key] = _hopper("runner").Fp4GemmSm90Runner(
                sf_vec_size, c_dtype, path, tiler, split, k_groups=k_groups, a_dtype=a_dtype
            )
    d = torch.empty((l, m, n), dtype=out_dtype, device=device)
    sfa = None if sfa is None else sfa.contiguous()
    with torch.cuda.device(device):
        _SM90_RUNNERS[key](a, b, sfa, sfb.contiguous(), d, m, n, k, l, alpha.reshape(1))
    return d


def _hopper(module: str):
    """A module of the Hopper folder, imported on first use (``k_order``, the W4A16 weight
    prepacking, needs torch only; the kernel and its runner need the CuTe DSL)."""
    _importable(_HERE)
    return importlib.import_module(f"hopper.{module}")


def _importable(folder: str) -> None:
    """Make a kernel folder importable (the kernels are flat files beside this one)."""
    if folder not in sys.path:
        sys.path.insert(0, folder)


# ----------------------------------------------------------------------------- FP4Linear

_ACTIVATIONS = ("dynamic", "static", "bf16")


class FP4Linear(nn.Module):
    """FP4 linear layer: y = fp4_gemm(quantize(x), W) + bias (W4A4), or fp4_gemm(x, W) + bias
    (``activations="bf16"``: W4A16, x bfloat16, or float16 with NVFP4 weights; Hopper only).

    The weight is held quantized (an FP4Tensor's parts as buffers; W4A16: its data prepacked
    once for the Hopper kernel, ``hopper.k_order.prepack_weights``); W4A4
    quantizes the activations (x [..., K] flattened to rows) at each call with a dynamic global
    scale (amax of this x) or the static ``input_global_scale`` (decoding convention, e.g.
    ModelOpt's ``input_scale``). The output has x's dtype (bfloat16, float16 or float32; W4A16:
    bfloat16, or float16 with NVFP4).
    """

    def __init__(
        self,
        weight: FP4Tensor,
        bias: torch.Tensor | None = None,
        activations: str = "dynamic",
        input_global_scale: torch.Tensor | float | None = None,
    ):
        super().__init__()
        if not isinstance(weight, FP4Tensor) or weight.data.ndim != 2:
            raise ValueError("weight must be a 2-D FP4Tensor [out_features, in_features]")
        if activations not in _ACTIVATIONS:
            raise ValueError(f"activations must be one of {_ACTIVATIONS}, got {activations!r}")
        static = activations == "static"
        if static != (input_global_scale is not None):
            raise ValueError(
                'activations="static" needs input_global_scale; "dynamic" and "bf16" take none'
            )
        if static and weight.format != "nvfp4":
            raise ValueError("static activation scales exist for nvfp4 only (mxfp4 has none)")
        self.format = weight.format
        self.out_features, self.in_features = weight.shape
        if self.in_features % 32:
            raise ValueError(f"in_features = {self.in_features} is not a multiple of 32")
        self.activations = activations
        data = weight.data.view(torch.uint8)
        if activations == "bf16":
            # (its own name: a state_dict of the plain layout cannot load into the prepacked one)
            self.register_buffer("weight_prepacked", _hopper("k_order").prepack_weights(data))
        else:
            self.register_buffer("weight_data", data)
        self.register_buffer("weight_scale", weight.scale)
        self.register_buffer("weight_global_scale", weight.global_scale)
        gs = _gs(input_global_scale, weight.data) if static else None
        self.register_buffer("input_global_scale", gs)
        if bias is not None:
            if bias.shape != (self.out_features,):
                raise ValueError(f"bias must be [{self.out_features}], got {tuple(bias.shape)}")
            bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.bias = bias

    @property
    def weight(self) -> FP4Tensor:
        if self.activations == "bf16":
            data = _hopper("k_order").unprepack_weights(self.weight_prepacked, self.in_features)
        else:
            data = self.weight_data
        return FP4Tensor(data, self.weight_scale, self.weight_global_scale, self.format)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        format: str = "nvfp4",
        activations: str = "dynamic",
        input_global_scale: torch.Tensor | float | None = None,
    ) -> FP4Linear:
        """Quantize ``linear``'s weight once (on its device: the GPU quantizer on CUDA)."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            w = w.float()
        return cls(quantize(w, format), linear.bias, activations, input_global_scale)

    @classmethod
    def from_modelopt(
        cls,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_scale_2: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> FP4Linear:
        """From a ModelOpt NVFP4 checkpoint's tensors (see ``FP4Tensor.from_modelopt``);
        ``input_scale`` (decoding convention) gives static activation scales, None dynamic."""
        w = FP4Tensor.from_modelopt(weight, weight_scale, weight_scale_2)
        mode = "dynamic" if input_scale is None else "static"
        return cls(w, bias, mode, input_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features; this layer takes {self.in_features}")
        rows = x.reshape(-1, self.in_features)
        if self.activations == "bf16":
            # (the held weights are checked once, at construction)
            _check_w4a16_activations(rows, self.format, "x of a W4A16 layer must be")
            if rows.device != self.weight_prepacked.device:
                raise ValueError(
                    f"x is on {rows.device} but the layer is on {self.weight_prepacked.device}"
                )
            alpha = _device_alpha(self.weight_global_scale, None)
            vec = _format_vec(self.format)
            y = _gemm_w4a16_op(
                rows, self.weight_prepacked, self.weight_scale, alpha, vec, x.dtype, True
            )
        else:
            a = quantize(rows, self.format, self.input_global_scale)
            y = fp4_gemm(a, self.weight, out_dtype=x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.format}, activations={self.activations}, bias={self.bias is not None}"
        )


def quantize_model(
    model: nn.Module,
    include: Iterable[str] | Callable[[str, nn.Linear], bool] | None = None,
    format: str = "nvfp4",
    activations: str = "dynamic",
) -> list[str]:
    """Replace ``model``'s ``nn.Linear`` modules by FP4Linear, in place: W4A4 with dynamic
    activation scales, or ``activations="bf16"`` (W4A16: 16-bit activations, Hopper).

    ``include``: glob patterns of module names (``["*.mlp.*"]``) or a predicate
    ``(name, linear) -> bool``; None takes every Linear whose in_features is a multiple of 32.
    A Linear that ``include`` names explicitly but cannot be quantized raises ValueError.
    Returns the names replaced.
    """
    _format_vec(format)
    if activations not in ("dynamic", "bf16"):
        raise ValueError(f'activations must be "dynamic" or "bf16", got {activations!r}')
    if include is None or callable(include):
        patterns = None
    else:
        patterns = [include] if isinstance(include, str) else list(include)
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not name:  # (a bare Linear: FP4Linear.from_linear)
            continue
        if patterns is not None:
            chosen = any(fnmatch.fnmatchcase(name, p) for p in patterns)
        elif include is not None:
            chosen = bool(include(name, module))
        else:
            chosen = module.in_features % 32 == 0
        if not chosen:
            continue
        if module.in_features % 32:
            raise ValueError(f"{name}: in_features = {module.in_features} is not a multiple of 32")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, FP4Linear.from_linear(module, format, activations))
        replaced.append(name)
    return replaced
