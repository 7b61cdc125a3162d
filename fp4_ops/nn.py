# SPDX-License-Identifier: BSD-3-Clause
"""``FP4Linear`` and ``quantize_model``: FP4 linear layers for torch models."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

import torch
from torch import nn

from fp4_ops.layout import format_vec
from fp4_ops.ops import (
    check_w4a16_activations,
    device_alpha,
    fp4_gemm,
    gemm_w4a16_op,
    quantize,
)
from fp4_ops.sm90 import k_order
from fp4_ops.tensor import FP4Tensor, global_scale_tensor

_ACTIVATIONS = ("dynamic", "static", "bf16")


class FP4Linear(nn.Module):
    """FP4 linear layer: y = fp4_gemm(quantize(x), W) + bias (W4A4), or fp4_gemm(x, W) + bias
    (``activations="bf16"``: W4A16, x bfloat16, or float16 with NVFP4 weights; Hopper only).

    The weight is held quantized (an FP4Tensor's parts as buffers; W4A16: its data prepacked
    once for the Hopper kernel, ``fp4_ops.sm90.k_order.prepack_weights``); W4A4
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
            self.register_buffer("weight_prepacked", k_order.prepack_weights(data))
        else:
            self.register_buffer("weight_data", data)
        self.register_buffer("weight_scale", weight.scale)
        self.register_buffer("weight_global_scale", weight.global_scale)
        gs = global_scale_tensor(input_global_scale, weight.data) if static else None
        self.register_buffer("input_global_scale", gs)
        if bias is not None:
            if bias.shape != (self.out_features,):
                raise ValueError(f"bias must be [{self.out_features}], got {tuple(bias.shape)}")
            bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.bias = bias

    @property
    def weight(self) -> FP4Tensor:
        if self.activations == "bf16":
            data = k_order.unprepack_weights(self.weight_prepacked, self.in_features)
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
            check_w4a16_activations(rows, self.format, "x of a W4A16 layer must be")
            if rows.device != self.weight_prepacked.device:
                raise ValueError(
                    f"x is on {rows.device} but the layer is on {self.weight_prepacked.device}"
                )
            alpha = device_alpha(self.weight_global_scale, None)
            vec = format_vec(self.format)
            y = gemm_w4a16_op(
                rows, self.weight_prepacked, self.weight_scale, alpha, vec, x.dtype, True
            )
        else:
            a = quantize(rows, self.format, self.input_global_scale)
            # (the held weights are checked once, at construction)
            w = FP4Tensor.unchecked(
                self.weight_data, self.weight_scale, self.weight_global_scale, self.format
            )
            y = fp4_gemm(a, w, out_dtype=x.dtype)
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
    format_vec(format)
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
