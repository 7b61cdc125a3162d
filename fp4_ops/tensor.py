# SPDX-License-Identifier: BSD-3-Clause
"""``FP4Tensor``: one quantized NVFP4 / MXFP4 operand (codes, 128x4 blocked scales, global
scale), its converters from and to torchao and checkpoint formats, and the argument checks that
the package's public functions share (a wrong type: TypeError, a wrong value: ValueError, each
naming the argument)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from fp4_ops import cpu
from fp4_ops.layout import (
    FORMATS,
    PACKED_DTYPES,
    SCALE_DTYPES,
    blocked_scale_shape,
    format_vec,
    from_blocked,
    round_up,
    to_blocked,
)

# ----------------------------------------------------------------------------- argument checks


def check_type(value, types, name: str, what: str) -> None:
    """TypeError naming the argument ``name`` unless ``value`` is an instance of ``types``."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


def is_number(value) -> bool:
    """A real Python / NumPy number; a bool is not one here."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_format(format, name: str = "format") -> int:
    """The scale block size of a format name: TypeError for a non-str, ValueError for an unknown
    name."""
    check_type(format, str, name, f"a str, one of {sorted(FORMATS)}")
    return format_vec(format)


def device_scalars(t, index: int, count: int = 1) -> bool:
    """Whether ``t`` is a contiguous float32 tensor of ``count`` elements on device ``index``
    (``get_device()``'s numbering): what a kernel reads as its scalars."""
    return (
        isinstance(t, torch.Tensor)
        and t.dtype == torch.float32
        and t.numel() == count
        and t.is_contiguous()
        and t.get_device() == index
    )


def check_global_scale_value(t: torch.Tensor, name: str) -> None:
    """A global scale must be finite and positive (a zero, negative, NaN or infinite one makes
    every product wrong): ValueError for a CPU tensor; a CUDA one is checked without a host sync,
    by a device-side assert (``torch._assert_async``), as is anything under torch.compile."""
    if t.device.type == "meta":
        return
    ok = torch.isfinite(t) & (t > 0)
    if t.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(ok.all()):
            value = float(t.reshape(-1)[~ok.reshape(-1)][0])
            raise ValueError(f"{name} must be finite and positive, got {value}")
    else:
        torch._assert_async(ok.all(), f"{name} must be finite and positive")


def check_packed_data(data: torch.Tensor, name: str, vec: int, format: str) -> int:
    """K of packed FP4 data [rows, K/2] or [L, rows, K/2]; ValueError naming ``name`` for another
    dtype or rank, or a K that is not a positive multiple of the format's block ``vec``."""
    if data.dtype not in PACKED_DTYPES:
        raise ValueError(f"{name} must be uint8 or float4_e2m1fn_x2, got {data.dtype}")
    if data.ndim not in (2, 3):
        raise ValueError(f"{name} must be [rows, K/2] or [L, rows, K/2], got {tuple(data.shape)}")
    k = 2 * data.shape[-1]
    if k == 0 or k % vec:
        raise ValueError(f"{name}: K = {k} is not a positive multiple of the {format} block {vec}")
    return k


def global_scale_tensor(value, like: torch.Tensor, name: str = "global_scale") -> torch.Tensor:
    """A global scale (a number or a one-element floating-point tensor) as a new 0-d float32
    tensor on ``like``'s device, checked by ``check_global_scale_value`` (on the host where the
    host holds the value: a number or a CPU tensor)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must have one element, got shape {tuple(value.shape)}")
        if not value.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {value.dtype}")
        t = value.detach().reshape(()).to(torch.float32)
        check_global_scale_value(t, name)
        return t.to(like.device).clone()
    if not is_number(value):
        raise TypeError(
            f"{name} must be a number or a one-element tensor, got {type(value).__name__}"
        )
    # (checked as the float32 it becomes: 1e39 would be inf there, 1e-50 zero)
    scale = torch.tensor(float(value), dtype=torch.float32)
    if not (math.isfinite(float(scale)) and float(scale) > 0):
        raise ValueError(f"{name} must be finite and positive as a float32, got {float(value)}")
    return scale.to(like.device)


def blocked_shape_of(data: torch.Tensor, sf_vec_size: int) -> tuple[int, ...]:
    """The shape of ``FP4Tensor.scale`` for packed data [..., rows, K/2]: the data's leading dims,
    then (row blocks, column blocks, 512) (``fp4_ops.layout.blocked_scale_shape``)."""
    rows, k = data.shape[-2], 2 * data.shape[-1]
    return (*data.shape[:-2], *blocked_scale_shape(rows, k, sf_vec_size))


def picklable(t):
    """``t`` as plain pickle can take it: a float8 tensor as (its bytes, its dtype), as torch's
    pickling of float8 tensors cannot be read back by ``pickle.loads`` (``torch.save`` can);
    anything else as it is. ``unpickled`` inverts it."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() == 1:
        return (t.view(torch.uint8), t.dtype)
    return t


def unpickled(value):
    """The inverse of ``picklable``."""
    if isinstance(value, tuple):
        data, dtype = value
        return data.view(dtype)
    return value


# what ``FP4Tensor.dequantize`` may return: the float dtypes that hold its values as values
DEQUANTIZE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)

_NOT_A_TENSOR = (
    "an FP4Tensor (e.g. FP4Linear.weight) is not a torch.Tensor but packed FP4 codes, block "
    "scales and a global scale: use fp4_ops.fp4_gemm, or .dequantize() for its values"
)


@dataclass(frozen=True, eq=False)
class FP4Tensor:
    """A quantized NVFP4 / MXFP4 operand: ``x ~= e2m1(data) * scale * global_scale``.

    * ``data``: packed codes, uint8 or ``torch.float4_e2m1fn_x2``, [rows, K/2] or [L, rows, K/2],
      contiguous, element 2i in the low nibble.
    * ``scale``: block scales in the 128x4 blocked layout, shaped by it: [row blocks, column
      blocks, 512] (or [L, row blocks, column blocks, 512]), one 128-row x 4-column atom per
      [i, j] (``fp4_ops.layout.blocked_scale_shape``; ``to_blocked``'s bytes in their order);
      float8_e4m3fn (NVFP4, per 16) or float8_e8m0fnu (MXFP4, per 32). The shape tells the two
      layouts apart: plain [rows, K/vec] scales, flattened or not, are refused (from_plain takes
      them).
    * ``global_scale``: 0-d float32 tensor on the data's device, finite and positive, decoding
      convention (1.0 for MXFP4); [L] for [L, rows, K] data takes one per batch (MoE experts,
      ``fp4_ops.moe``; ``fp4_gemm`` takes 0-d ones only).
    * ``format``: "nvfp4" or "mxfp4".

    Every part is checked here (a CUDA global scale by a device-side assert, no host sync);
    ``FP4Tensor.unchecked`` skips that for parts that are right by construction.
    """

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    format: str

    def __post_init__(self) -> None:
        vec = check_format(self.format, "FP4Tensor.format")
        d, s, g = self.data, self.scale, self.global_scale
        for name, t in (("data", d), ("scale", s), ("global_scale", g)):
            check_type(t, torch.Tensor, f"FP4Tensor.{name}", "a torch.Tensor")
        k = check_packed_data(d, "FP4Tensor.data", vec, self.format)
        want = SCALE_DTYPES[vec]
        if s.dtype != want:
            raise ValueError(f"{self.format} needs {want} scales, got {s.dtype}")
        expect = blocked_shape_of(d, vec)
        if tuple(s.shape) != expect:
            if tuple(s.shape) == (*d.shape[:-1], k // vec):
                hint = "that is the plain row layout: use FP4Tensor.from_plain"
            else:
                hint = (
                    "flat scale bytes are refused, as plain scales flattened can have as many: "
                    "FP4Tensor.from_plain takes plain ones, to_blocked(plain).view(shape) blocked"
                )
            raise ValueError(
                f"FP4Tensor.scale has shape {tuple(s.shape)}; data {tuple(d.shape)} in the "
                f"128x4 blocked layout needs {expect} ([L,] row blocks, column blocks, 512); "
                + hint
            )
        # (batched data [L, rows, K] may carry one global scale per batch: MoE experts)
        per_batch = d.ndim == 3 and tuple(g.shape) == d.shape[:1]
        if not (g.ndim == 0 or per_batch) or g.dtype != torch.float32:
            raise ValueError(
                "FP4Tensor.global_scale must be a 0-d float32 tensor (or [L] for data "
                f"[L, rows, K/2]), got {g.dtype} {tuple(g.shape)}"
            )
        if not (s.device == d.device == g.device):
            raise ValueError(
                f"FP4Tensor parts on different devices: data {d.device}, scale {s.device}, "
                f"global_scale {g.device}"
            )
        if not (d.is_contiguous() and s.is_contiguous()):
            raise ValueError("FP4Tensor.data and FP4Tensor.scale must be contiguous")
        check_global_scale_value(g, "FP4Tensor.global_scale")

    @classmethod
    def unchecked(
        cls, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, format: str
    ) -> FP4Tensor:
        """An FP4Tensor from parts that are right by construction (this package's ops' outputs):
        no validation, for the hot path."""
        self = object.__new__(cls)
        # (a frozen dataclass's fields live in its __dict__: one dict, no __setattr__ calls)
        fields = self.__dict__
        fields["data"], fields["scale"] = data, scale
        fields["global_scale"], fields["format"] = global_scale, format
        return self

    def __getstate__(self) -> dict:
        return {name: picklable(getattr(self, name)) for name in self.__dataclass_fields__}

    def __setstate__(self, state: dict) -> None:
        # (a pickle is input: exactly the fields, then every check the constructor makes)
        if not isinstance(state, dict) or set(state) != set(self.__dataclass_fields__):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"a pickled FP4Tensor holds {list(self.__dataclass_fields__)}, got {got}"
            )
        for name, value in state.items():
            object.__setattr__(self, name, unpickled(value))
        self.__post_init__()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # (torch functions given an FP4Tensor land here: a clear error instead of torch's
        # "must be Tensor"; and code that checks has_torch_function, such as
        # nn.TransformerEncoderLayer's fast path reading an FP4Linear's weight, backs off)
        raise TypeError(f"{getattr(func, '__name__', func)}(): {_NOT_A_TENSOR}")

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
        return from_blocked(self.scale.flatten(-3), rows, k // self.sf_vec_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``e2m1 * scale * global_scale`` as ``dtype`` (computed in float32). On the CPU, scale
        bytes that no kernel gives a meaning (a signed or NaN E4M3, E8M0 0xFF) raise ValueError,
        as in ``fp4_gemm``; on CUDA they decode to what they encode (no host sync)."""
        check_type(dtype, torch.dtype, "dtype", "a torch.dtype")
        if dtype not in DEQUANTIZE_DTYPES:
            # (an integer or bool dtype would truncate the values, an FP8 one round them anew)
            names = ", ".join(str(d) for d in DEQUANTIZE_DTYPES)
            raise ValueError(f"dtype must be one of {names}, got {dtype}")
        if self.scale.device.type == "cpu" and not torch.compiler.is_compiling():
            cpu.check_scales(self.scale)
        values = cpu.dequantize(self.data, self.plain_scales(), self.sf_vec_size)
        gs = self.global_scale
        return (values * gs.reshape(*gs.shape, 1, 1)).to(dtype)

    # -- constructors and converters

    @classmethod
    def from_plain(
        cls,
        data: torch.Tensor,
        scales: torch.Tensor,
        global_scale: torch.Tensor | float | None = None,
        format: str = "nvfp4",
    ) -> FP4Tensor:
        """From scales in the plain row layout [rows, K/vec] (or [L, rows, K/vec], as checkpoints
        store them). ``global_scale``: the decoding global scale the data were quantized with,
        as ``quantize`` takes and gives it. None is what ``quantize`` uses by default: 1.0 for
        MXFP4, and for NVFP4 ``amax / (448 * 6)`` of values that only the data's producer saw,
        so NVFP4 data need it given (1.0 where they have none)."""
        return _from_plain(
            data, scales, global_scale, format, ("data", "scales", "global_scale", "format")
        )

    @classmethod
    def from_torchao(cls, t) -> FP4Tensor:
        """From torchao's ``NVFP4Tensor`` (``qdata``, ``scale`` swizzled or not,
        ``per_tensor_scale`` in the same decoding convention, or None = 1.0). 2-D or 3-D,
        K-major (not transposed) only."""
        if not all(hasattr(t, a) for a in ("qdata", "scale", "block_size", "per_tensor_scale")):
            raise TypeError(f"t must be a torchao NVFP4Tensor, got {type(t).__name__}")
        if t.block_size != FORMATS["nvfp4"]:
            raise ValueError(f"NVFP4Tensor block_size {t.block_size}; NVFP4 uses 16")
        q = t.qdata
        if q.ndim not in (2, 3) or q.stride(-1) != 1:
            raise ValueError("only K-major (untransposed) 2-D / 3-D NVFP4Tensors convert")
        rows, k = q.shape[-2], 2 * q.shape[-1]
        lead = q.shape[:-2]
        sc = t.scale.view(torch.float8_e4m3fn)
        if t.is_swizzled_scales:
            # torchao swizzles all leading dims together as one [L * rows, K/16] matrix
            sc = from_blocked(sc.reshape(-1), math.prod(lead) * rows, k // 16)
        plain = sc.reshape(*lead, rows, k // 16)
        pts = t.per_tensor_scale
        if pts is not None and pts.ndim != 0:
            raise ValueError("per-expert (3-D) per_tensor_scale has no FP4Tensor equivalent")
        return cls.from_plain(q.view(torch.uint8), plain, 1.0 if pts is None else pts, "nvfp4")

    def to_torchao(self, swizzled: bool = True, orig_dtype: torch.dtype = torch.bfloat16):
        """As torchao's ``NVFP4Tensor`` (NVFP4 only); ``swizzled`` picks its scale layout."""
        check_type(swizzled, bool, "swizzled", "a bool")
        check_type(orig_dtype, torch.dtype, "orig_dtype", "a torch.dtype")
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
            sc = to_blocked(plain.reshape(-1, k // 16))
            # torchao's swizzled shape: [rows padded to 128 / 4, scale columns padded to 4 x 4]
            rows_pad, cols_pad = round_up(rows, 128), round_up(k // 16, 4)
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
        names = ("weight", "weight_scale", "weight_scale_2", "format")
        return _from_plain(weight, weight_scale, weight_scale_2, "nvfp4", names)

    @classmethod
    def from_compressed_tensors(
        cls,
        weight_packed: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_global_scale: torch.Tensor,
    ) -> FP4Tensor:
        """From compressed-tensors' NVFP4 tensors. NOTE: ``weight_global_scale`` there is the
        *encoding* scale, the reciprocal of ours (448 * 6 / amax); it is inverted here."""
        check_type(weight_packed, torch.Tensor, "weight_packed", "a torch.Tensor")
        inv = global_scale_tensor(weight_global_scale, weight_packed, "weight_global_scale")
        names = ("weight_packed", "weight_scale", "weight_global_scale", "format")
        return _from_plain(weight_packed, weight_scale, 1.0 / inv, "nvfp4", names)

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


# (torch.load's default weights_only unpickler takes an FP4Tensor: its state is checked on load)
torch.serialization.add_safe_globals([FP4Tensor])


def _from_plain(data, scales, global_scale, format, names) -> FP4Tensor:
    """``FP4Tensor.from_plain`` with the caller's argument ``names`` (data, scales, global
    scale, format) in its messages."""
    data_name, scales_name, gs_name, format_name = names
    vec = check_format(format, format_name)
    check_type(data, torch.Tensor, data_name, "a torch.Tensor of packed FP4 bytes")
    check_type(scales, torch.Tensor, scales_name, "a torch.Tensor of block scales")
    k = check_packed_data(data, data_name, vec, format)
    expect = (*data.shape[:-1], k // vec)
    if tuple(scales.shape) != expect:
        raise ValueError(
            f"{scales_name} has shape {tuple(scales.shape)}; plain scales of {data_name} "
            f"{tuple(data.shape)} are {expect}"
        )
    if scales.dtype != SCALE_DTYPES[vec]:
        raise ValueError(f"{scales_name}: {format} needs {SCALE_DTYPES[vec]}, got {scales.dtype}")
    if global_scale is not None:
        gs = global_scale_tensor(global_scale, data, gs_name)
    elif vec == FORMATS["mxfp4"]:
        gs = torch.ones((), dtype=torch.float32, device=data.device)
    else:
        raise ValueError(
            f"{gs_name} is None: NVFP4 data need the global scale they were quantized with "
            "(quantize's default is amax / (448 * 6) of the values); pass 1.0 for none"
        )
    data = data.view(torch.uint8).contiguous()
    blocked = to_blocked(scales).view(blocked_shape_of(data, vec))
    return FP4Tensor(data, blocked, gs, format)
