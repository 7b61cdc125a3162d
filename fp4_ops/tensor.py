# SPDX-License-Identifier: BSD-3-Clause
"""``FP4Tensor``: one quantized NVFP4 / MXFP4 operand (codes, 128x4 blocked scales, global
scale), and its converters from and to torchao and checkpoint formats."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp4_ops import cpu
from fp4_ops.layout import (
    FORMATS,
    PACKED_DTYPES,
    SCALE_DTYPES,
    blocked_scale_numel,
    format_vec,
    from_blocked,
    round_up,
    to_blocked,
)


@dataclass(frozen=True)
class FP4Tensor:
    """A quantized NVFP4 / MXFP4 operand: ``x ~= e2m1(data) * scale * global_scale``.

    * ``data``: packed codes, uint8 or ``torch.float4_e2m1fn_x2``, [rows, K/2] or [L, rows, K/2],
      contiguous, element 2i in the low nibble.
    * ``scale``: block scales in the 128x4 blocked layout (``to_blocked``): 1-D for 2-D
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
        vec = format_vec(self.format)
        d, s, g = self.data, self.scale, self.global_scale
        for name, t in (("data", d), ("scale", s), ("global_scale", g)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"FP4Tensor.{name} must be a torch.Tensor, got {type(t).__name__}")
        if d.dtype not in PACKED_DTYPES:
            raise ValueError(f"FP4Tensor.data must be uint8 or float4_e2m1fn_x2, got {d.dtype}")
        if d.ndim not in (2, 3):
            raise ValueError(
                f"FP4Tensor.data must be [rows, K/2] or [L, rows, K/2], got {tuple(d.shape)}"
            )
        k = 2 * d.shape[-1]
        if k == 0 or k % vec:
            raise ValueError(f"K = {k} is not a positive multiple of the {self.format} block {vec}")
        want = SCALE_DTYPES[vec]
        if s.dtype != want:
            raise ValueError(f"{self.format} needs {want} scales, got {s.dtype}")
        if s.ndim == d.ndim:
            raise ValueError(
                f"FP4Tensor.scale has the data's rank ({tuple(s.shape)} for data "
                f"{tuple(d.shape)}): that is the plain row layout; the 128x4 blocked layout is "
                "1-D (or [L, n]): use FP4Tensor.from_plain or to_blocked"
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

    @classmethod
    def unchecked(
        cls, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, format: str
    ) -> FP4Tensor:
        """An FP4Tensor from parts that are right by construction (this package's ops' outputs):
        no validation, for the hot path."""
        self = object.__new__(cls)
        for name, value in (
            ("data", data),
            ("scale", scale),
            ("global_scale", global_scale),
            ("format", format),
        ):
            object.__setattr__(self, name, value)
        return self

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
        return from_blocked(self.scale, rows, k // self.sf_vec_size)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``e2m1 * scale * global_scale`` as ``dtype`` (computed in float32)."""
        values = cpu.dequantize(self.data, self.plain_scales(), self.sf_vec_size)
        return (values * self.global_scale).to(dtype)

    # -- constructors and converters

    @classmethod
    def from_plain(
        cls,
        data: torch.Tensor,
        scales: torch.Tensor,
        global_scale: torch.Tensor | float | None = None,
        format: str = "nvfp4",
    ) -> FP4Tensor:
        """From scales in the plain row layout [rows, K/vec] (as checkpoints store them);
        ``global_scale`` in the decoding convention (None: 1.0)."""
        if not isinstance(data, torch.Tensor) or data.dtype not in PACKED_DTYPES:
            raise ValueError("data must be packed FP4 bytes (uint8 or float4_e2m1fn_x2)")
        data = data.view(torch.uint8)
        if scales.ndim != data.ndim:
            raise ValueError(
                f"plain scales must have the data's rank: data {tuple(data.shape)}, "
                f"scales {tuple(scales.shape)}"
            )
        expect = (*data.shape[:-1], 2 * data.shape[-1] // format_vec(format))
        if tuple(scales.shape) != expect:
            raise ValueError(f"scales have shape {tuple(scales.shape)}; data needs {expect}")
        return cls(
            data.contiguous(), to_blocked(scales), global_scale_tensor(global_scale, data), format
        )

    @classmethod
    def from_torchao(cls, t) -> FP4Tensor:
        """From torchao's ``NVFP4Tensor`` (``qdata``, ``scale`` swizzled or not,
        ``per_tensor_scale`` in the same decoding convention, or None = 1.0). 2-D or 3-D,
        K-major (not transposed) only."""
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
        inv = global_scale_tensor(weight_global_scale, weight_packed)
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


def global_scale_tensor(value, like: torch.Tensor) -> torch.Tensor:
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
