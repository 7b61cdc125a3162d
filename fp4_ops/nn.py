# SPDX-License-Identifier: BSD-3-Clause
"""``FP4Linear`` and ``quantize_model``: FP4 linear layers for torch models."""

from __future__ import annotations

import ast
import fnmatch
import functools
import inspect
import textwrap
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from fp4_ops import cpu
from fp4_ops.buffers import FP4Buffers
from fp4_ops.layout import (
    DSL_DTYPE_NAMES,
    FORMATS,
    GLOBAL_SCALE_DIVISOR,
    PACKED_DTYPES,
    SCALE_DTYPES,
)
from fp4_ops.memory import capturing, current_device, stream_handle
from fp4_ops.moe import FP4Experts, FP4Llama4Experts, is_experts_module, takes_scaled_tokens
from fp4_ops.ops import (
    IN_DTYPES,
    check_quantize_input,
    check_w4a16_activations,
    eager,
    gemm_impl,
    gemm_op,
    gemm_w4a16_impl,
    gemm_w4a16_op,
    launchable,
    plannable,
    quantize,
    quantize_op,
    runs_hopper_kernels,
)
from fp4_ops.sm90 import k_order
from fp4_ops.tensor import (
    FP4Tensor,
    blocked_shape_of,
    check_format,
    check_global_scale_value,
    check_type,
    global_scale_tensor,
)

_ACTIVATIONS = ("dynamic", "static", "bf16")
# the buffers that hold FP4 parts: they follow device moves, never dtype casts
_FP4_BUFFERS = (
    "weight_data",
    "weight_prepacked",
    "weight_scale",
    "weight_global_scale",
    "input_global_scale",
)
# a state dict's keys for one FP4Linear (besides the extra state), W4A4 and W4A16 alike
_STATE_NAMES = ("weight_data", "weight_scale", "weight_global_scale", "input_global_scale", "bias")
_EXTRA_STATE = "_extra_state"


def _check_weight_global_scale(scale, w: torch.Tensor, format: str) -> None:
    """ValueError unless ``scale`` can be ``w``'s NVFP4 global scale: finite, positive and at
    least its own ``amax / (448 * 6)`` (a smaller one would saturate its block scales)."""
    if format != "nvfp4":
        raise ValueError("weight_global_scale: mxfp4 has no global scale (E8M0 scales span it)")
    given = global_scale_tensor(scale, w, "weight_global_scale")
    own = w.abs().amax().float() / torch.tensor(GLOBAL_SCALE_DIVISOR, device=w.device)
    if bool(given < own):
        raise ValueError(
            f"weight_global_scale {float(given)} is below the weight's amax / (448 * 6) = "
            f"{float(own)}: its block scales would saturate"
        )


def _check_activations(activations, allowed=_ACTIVATIONS) -> None:
    check_type(activations, str, "activations", f"a str, one of {allowed}")
    if activations not in allowed:
        raise ValueError(f"activations must be one of {allowed}, got {activations!r}")


class FP4Linear(FP4Buffers):
    """FP4 linear layer: y = fp4_gemm(quantize(x), W) + bias (W4A4), or fp4_gemm(x, W) + bias
    (``activations="bf16"``: W4A16, x bfloat16, or float16 with NVFP4 weights; Hopper only).

    x [..., in_features] -> y [..., out_features] in x's dtype (an x without rows gives an
    empty y). W4A4 quantizes the activations at each call with a dynamic global scale (amax of
    this x) or the static ``input_global_scale`` (decoding convention, e.g. ModelOpt's
    ``input_scale``). Inference only: a backward through the layer raises
    ``fp4_ops.ops.NO_BACKWARD``.

    The weight is held quantized, as buffers (copies of ``weight``'s tensors): ``weight_data``
    (packed codes [N, K/2]; W4A16 holds ``weight_prepacked`` instead, prepacked once for the
    Hopper kernel, ``fp4_ops.sm90.k_order.prepack_weights``), ``weight_scale`` (blocked,
    ``FP4Tensor.scale``), ``weight_global_scale`` and ``input_global_scale`` (static only).
    These keep their dtypes through ``.to(dtype)`` / ``.half()`` / ``.bfloat16()`` /
    ``.float()`` and follow device moves; the bias follows both, and the output follows x.

    State dict: ``weight_data`` (plain K order, W4A16 too: a checkpoint of one mode loads into
    the other, prepacked at load), ``weight_scale``, ``weight_global_scale``,
    ``input_global_scale`` (static), ``bias``, and the extra state ``{"format", "activations"}``.
    Loading checks all of it before it assigns anything: another format, shape, static /
    dynamic activation scales, or a part missing, is a ValueError that names what differs.

    Eager calls on an H100 / H200: after the first call of an input shape and dtype on a
    stream, the next ones launch its plan, the kernels with this layer's buffers bound, behind
    the checks that can change between calls. Values changed in place are read at the next
    launch; a buffer or bias replaced, or a move, drops the plans.
    """

    def __init__(
        self,
        weight: FP4Tensor,
        bias: torch.Tensor | None = None,
        activations: str = "dynamic",
        input_global_scale: torch.Tensor | float | None = None,
    ):
        super().__init__()
        check_type(weight, FP4Tensor, "weight", "an FP4Tensor [out_features, in_features]")
        if weight.data.ndim != 2:
            raise ValueError(
                f"weight must be a 2-D FP4Tensor [out_features, in_features], got {weight.shape}"
            )
        _check_activations(activations)
        static = activations == "static"
        if static != (input_global_scale is not None):
            raise ValueError(
                'activations="static" needs input_global_scale; "dynamic" and "bf16" take none'
            )
        if static and weight.format != "nvfp4":
            raise ValueError("static activation scales exist for nvfp4 only (mxfp4 has none)")
        out_features, in_features = weight.shape
        if in_features % 32:
            raise ValueError(f"in_features = {in_features} is not a multiple of 32")
        if bias is not None:
            check_type(bias, torch.Tensor, "bias", "None or a torch.Tensor")
            if tuple(bias.shape) != (out_features,):
                raise ValueError(f"bias must be [{out_features}], got {tuple(bias.shape)}")
            if not bias.is_floating_point():
                raise ValueError(f"bias must be floating point, got {bias.dtype}")
            if bias.device != weight.device:
                raise ValueError(f"bias is on {bias.device} but weight is on {weight.device}")
            bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        gs = None
        if static:
            gs = global_scale_tensor(input_global_scale, weight.data, "input_global_scale")
        self.format = weight.format
        self.out_features, self.in_features = out_features, in_features
        self.activations = activations
        data = weight.data.view(torch.uint8)
        if activations == "bf16":
            # (the state dict holds weight_data in plain K order instead: _save_to_state_dict)
            prepacked = k_order.prepack_weights(data)
            self.register_buffer("weight_prepacked", prepacked, persistent=False)
        else:
            self.register_buffer("weight_data", data.clone())
        # (copies: a load_state_dict writes into the layer's buffers, never into the caller's)
        self.register_buffer("weight_scale", weight.scale.clone())
        self.register_buffer("weight_global_scale", weight.global_scale.clone())
        self.register_buffer("input_global_scale", None if gs is None else gs.clone())
        self.bias = bias
        # (x's shape, dtype, device index, stream) -> _Plan of an eager CUDA forward
        self._plans: dict[tuple, _Plan] | None = None

    @property
    def weight(self) -> FP4Tensor:
        """The quantized weight [out_features, in_features] (W4A16: unprepacked, a copy)."""
        data = self._plain_weight_data()
        return FP4Tensor.unchecked(data, self.weight_scale, self.weight_global_scale, self.format)

    def _plain_weight_data(self) -> torch.Tensor:
        if self.activations == "bf16":
            return k_order.unprepack_weights(self.weight_prepacked, self.in_features)
        return self.weight_data

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        format: str = "nvfp4",
        activations: str = "dynamic",
        input_global_scale: torch.Tensor | float | None = None,
        *,
        weight_global_scale: torch.Tensor | float | None = None,
    ) -> FP4Linear:
        """Quantize ``linear``'s weight once (on its device: the GPU quantizer on CUDA); a weight
        holding NaN or Inf is a ValueError. ``weight_global_scale`` (NVFP4, decoding
        convention): None takes the weight's ``amax / (448 * 6)``; a given one, e.g. shared by
        layers that a serving engine fuses, must be finite, positive and at least that."""
        check_type(linear, nn.Linear, "linear", "an nn.Linear")
        check_format(format)
        _check_activations(activations)
        why = _in_features_reason(linear.in_features)
        if why:
            raise ValueError(f"linear: {why}")
        w = linear.weight.detach()
        if w.dtype not in IN_DTYPES:
            w = w.float()
        # (on CUDA the quantizer cannot raise: such a block would decode to NaN at every call)
        if not bool(torch.isfinite(w).all()):
            raise ValueError("weight contains NaN or Inf, which FP4 cannot encode")
        if weight_global_scale is not None:
            _check_weight_global_scale(weight_global_scale, w, format)
        return cls(
            quantize(w, format, weight_global_scale), linear.bias, activations, input_global_scale
        )

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
        if input_scale is None:
            return cls(w, bias, "dynamic")
        return cls(w, bias, "static", global_scale_tensor(input_scale, w.data, "input_scale"))

    # -- casts, moves and the state dict

    CACHES = ("_plans",)

    def kept_buffers(self) -> dict[str, torch.Tensor]:
        return {n: self._buffers[n] for n in _FP4_BUFFERS if self._buffers.get(n) is not None}

    def get_extra_state(self) -> dict:
        return {"format": self.format, "activations": self.activations}

    def set_extra_state(self, state) -> None:
        # (what the extra state carries is checked, not set: it must agree with this layer)
        self._check_extra_state(state, "FP4Linear")

    def _check_extra_state(self, state, where: str) -> None:
        if not (isinstance(state, dict) and {"format", "activations"} <= state.keys()):
            raise ValueError(f"{where}: the extra state {state!r} is not an FP4Linear's")
        if state["format"] != self.format:
            raise ValueError(
                f"{where}: format differs: the checkpoint is {state['format']}, this layer "
                f"{self.format}"
            )
        if (state["activations"] == "static") != (self.activations == "static"):
            raise ValueError(
                f"{where}: activations differ: the checkpoint is {state['activations']!r}, this "
                f"layer {self.activations!r} (static activation scales load only into a static "
                "layer)"
            )

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        names = [n for n in _STATE_NAMES if n != "weight_data" and getattr(self, n) is not None]
        return {"weight_data": self._plain_weight_data(), **{n: getattr(self, n) for n in names}}

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, t in self._state_tensors().items():
            destination[prefix + name] = t if keep_vars else t.detach()
        destination[prefix + _EXTRA_STATE] = self.get_extra_state()

    def _load_fp4_state(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys
    ) -> None:
        expected = list(self._state_tensors())
        found = {n: state_dict[prefix + n] for n in _STATE_NAMES if prefix + n in state_dict}
        extra = state_dict.get(prefix + _EXTRA_STATE)
        if strict:
            known = (*_STATE_NAMES, _EXTRA_STATE)
            unexpected_keys.extend(
                k for k in state_dict if k.startswith(prefix) and k[len(prefix) :] not in known
            )
        if not found and extra is None:  # (nothing of this layer)
            missing_keys.extend(prefix + n for n in (*expected, _EXTRA_STATE))
            return
        where = prefix.rstrip(".") or "FP4Linear"
        if extra is None:
            missing_keys.append(prefix + _EXTRA_STATE)
        else:
            self._check_extra_state(extra, where)
        checked = self._check_state(found, where)
        if "bias" in found and self.bias is None:
            unexpected_keys.append(prefix + "bias")
        elif "bias" not in found and self.bias is not None:
            missing_keys.append(prefix + "bias")
        # (everything checked: now it all loads)
        assign = local_metadata.get("assign_to_params_buffers", False)
        with torch.no_grad():
            for key, value in checked.items():
                name = key
                if name == "weight_data" and self.activations == "bf16":
                    name, value = "weight_prepacked", k_order.prepack_weights(value)
                if not assign:
                    self._load_into(name, value, prefix + key)
                elif name == "bias":
                    self.bias = nn.Parameter(value, requires_grad=False)
                else:
                    self._buffers[name] = value

    def _check_state(self, found: dict, where: str) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors of this layer, checked against it: ValueError naming what
        differs; the tensors to load (weight_data as uint8)."""
        static = self.activations == "static"
        parts = ["weight_data", "weight_scale", "weight_global_scale"]
        if static:
            parts.append("input_global_scale")
        missing = [n for n in parts if n not in found]
        if "input_global_scale" in found and not static:
            raise ValueError(
                f"{where}: activations differ: the checkpoint has static activation scales "
                f"(input_global_scale), this layer is {self.activations!r}"
            )
        if missing:
            raise ValueError(f"{where}: the checkpoint lacks {', '.join(missing)}")
        for name, t in found.items():
            check_type(t, torch.Tensor, f"{where}.{name}", "a torch.Tensor")
        data, scale = found["weight_data"], found["weight_scale"]
        want = SCALE_DTYPES[FORMATS[self.format]]
        if scale.dtype != want:
            raise ValueError(
                f"{where}: format differs: the checkpoint's weight_scale is {scale.dtype}, this "
                f"{self.format} layer's {want}"
            )
        shape = (self.out_features, self.in_features // 2)
        if data.dtype not in PACKED_DTYPES or tuple(data.shape) != shape:
            what = "shape" if data.dtype in PACKED_DTYPES else "dtype"
            raise ValueError(
                f"{where}: {what} differs: the checkpoint's weight_data is {data.dtype} "
                f"{tuple(data.shape)}, this [{self.out_features}, {self.in_features}] layer's "
                f"uint8 {shape}"
            )
        want = blocked_shape_of(data, FORMATS[self.format])
        if tuple(scale.shape) != want:
            raise ValueError(
                f"{where}: shape differs: the checkpoint's weight_scale is {tuple(scale.shape)}, "
                f"this layer's {want}"
            )
        checked = {n: found[n] for n in parts} | {"weight_data": data.view(torch.uint8)}
        for name in parts[2:]:
            t = found[name]
            if t.shape != () or t.dtype != torch.float32:
                raise ValueError(
                    f"{where}: {name} must be a 0-d float32 tensor, got {t.dtype} {tuple(t.shape)}"
                )
            check_global_scale_value(t, f"{where}.{name}")
        if self.bias is not None and "bias" in found:
            bias = checked["bias"] = found["bias"]
            if tuple(bias.shape) != (self.out_features,) or not bias.is_floating_point():
                what = "shape" if bias.is_floating_point() else "dtype"
                raise ValueError(
                    f"{where}: {what} differs: the checkpoint's bias is {bias.dtype} "
                    f"{tuple(bias.shape)}, this layer's [{self.out_features}]"
                )
        return checked

    # -- forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or type(x) is not torch.Tensor or not x.is_cuda:
            return self._forward(x)
        # (eager on CUDA: a shape already run on this stream launches its plan, past every check)
        index = x.get_device()
        key = (x.shape, x.dtype, index, stream_handle(index))
        plan = self._plans.get(key) if self._plans else None
        if plan is not None:
            if not plan.current(self):
                self._plans = None  # (stale: they all hold the replaced buffers)
            elif plan.takes(x, index):
                return plan(x, key[3])
        y = self._forward(x)
        plan = _Plan.make(self, x) if plannable(x, index) and runs_hopper_kernels(x) else None
        if plan is not None:
            if self._plans is None or len(self._plans) >= _MAX_PLANS:
                self._plans = {}
            self._plans[key] = plan
        return y

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        check_type(x, torch.Tensor, "x", "a torch.Tensor")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"x must be [..., {self.in_features}] (in_features), got {tuple(x.shape)}"
            )
        if x.device != self.weight_scale.device:
            raise ValueError(f"x is on {x.device} but the layer is on {self.weight_scale.device}")
        rows = x.reshape(-1, self.in_features)
        vec = FORMATS[self.format]
        # (the held weights are checked once, at construction and load)
        if self.activations == "bf16":
            check_w4a16_activations(x, self.format, "x of a W4A16 layer must be")
        else:
            check_quantize_input(rows, vec)
        # (eager on the CPU: one matmul on the weight dequantized once, not at every call; a
        # gradient asked for goes through the ops, which refuse it)
        on_cpu = rows.device.type == "cpu" and not torch.compiler.is_compiling()
        on_cpu = on_cpu and not (torch.is_grad_enabled() and x.requires_grad)
        # (eager on CUDA: the ops' implementations without the dispatcher)
        direct = eager(rows)
        if rows.shape[0] == 0:
            y = rows.new_empty((0, self.out_features))
        elif self.activations == "bf16" and on_cpu:
            y = cpu.gemm_w4a16_dequantized(
                rows, self._cpu_weight(), self.weight_global_scale, x.dtype
            )
        elif self.activations == "bf16":
            run = gemm_w4a16_impl if direct else gemm_w4a16_op
            w, scale = self.weight_prepacked, self.weight_scale
            y = run(rows, w, scale, self.weight_global_scale, vec, x.dtype, True)
        else:
            y = self._forward_w4a4(rows.contiguous(), vec, direct, on_cpu)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _forward_w4a4(self, rows, vec: int, direct: bool, on_cpu: bool) -> torch.Tensor:
        """W4A4 on rows [M, K] (checked): eagerly on Hopper's decode path, one quantizer grid
        writes the GEMM's token copy (no prologue grid); else the activations' FP4 parts, then
        the GEMM."""
        gs_in = self.input_global_scale
        if direct:
            y = self._forward_tokens(rows, vec)
            if y is not None:
                return y
            # (eager on CUDA: the activations' FP4 parts go to scratch that the GEMM reads next
            # on this stream, rather than to three new tensors per call)
            from fp4_ops import quantizer

            scratch = quantizer.scratch_buffers(rows, vec)
            data, scale, gs = quantizer.launch_quantize(rows, vec, gs_in, scratch)
        else:
            data, scale, gs = quantize_op(rows, vec, gs_in)
        if on_cpu:
            alpha = gs * self.weight_global_scale
            return cpu.gemm_dequantized(data, scale, self._cpu_weight(), alpha, vec, rows.dtype)
        # (the kernel multiplies the two global scales itself)
        run = gemm_impl if direct else gemm_op
        wgs = self.weight_global_scale
        return run(data, scale, self.weight_data, self.weight_scale, gs, wgs, vec, rows.dtype)

    def _forward_tokens(self, rows, vec: int) -> torch.Tensor | None:
        """W4A4 on rows [M, K] (checked, contiguous) through ``_tokens_route``, launched; None
        where it does not apply."""
        route = self._tokens_route(rows, vec)
        if route is None:
            return None
        route.step(rows.data_ptr(), route.y.data_ptr(), stream_handle(rows.get_device()))
        return route.y

    def _tokens_route(self, rows, vec: int) -> _TokensRoute | None:
        """``_TokensRoute`` of rows [M, K] on an H100 / H200 and the GEMM's decode path, rows
        16-byte aligned on the current device and the weights contiguous; else None."""
        if rows.data_ptr() % 16 or rows.get_device() != current_device():
            return None  # (the quantize-then-GEMM route copies or switches devices)
        w, sw, gw = self.weight_data, self.weight_scale, self.weight_global_scale
        if not (runs_hopper_kernels(rows) and w.is_contiguous() and sw.is_contiguous()):
            return None
        from fp4_ops import quantizer
        from fp4_ops.sm90 import launcher, tokens_step

        gs_in = self.input_global_scale
        # (the quantizer writes the global scale it used: never into the layer's own buffer)
        gs_out = quantizer.tokens_scale(rows)
        alpha = gs_out if gs_in is None else gs_in
        found = launcher.launch_for_tokens(rows, w, sw, vec, alpha, rows.dtype, scale=gw)
        if found is None:
            return None
        launch, copy, y = found
        sms = launcher.gpu_sm_count(rows.device)
        quantize = quantizer.bind_tokens(rows, vec, copy, gs_in, gs_out, sms)
        # (the copy stands in for SFA, which the tokens_converted kernel does not read)
        step = tokens_step.fuse(quantize, launch.bind(w, sw, sw, alpha, gw), copy)
        return _TokensRoute(step, y)

    def _cpu_weight(self) -> torch.Tensor:
        """The weight dequantized (e2m1 x block scale, float32: exact) for the eager CPU path,
        made at every call: a copy kept across calls goes stale when the buffers are written
        through ``.data`` or a NumPy view, which no version counter sees."""
        vec = FORMATS[self.format]
        return cpu.plain_operand(self._plain_weight_data(), self.weight_scale, vec)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.format}, activations={self.activations}, bias={self.bias is not None}"
        )


# ----------------------------------------------------------------------------- eager plans


@dataclass(frozen=True)
class _TokensRoute:
    """An eager W4A4 call on the Hopper decode path: the quantizer's tokens grid writes the
    GEMM's token copy, then the GEMM runs without its prologue grid, on the same stream, both
    from one host call."""

    step: object  # tokens_step.BoundStep: x's and D's addresses, the stream
    y: torch.Tensor  # a new D [M, N]


def _address(t: torch.Tensor | None) -> int:
    """Where a plan's bound buffer lives (0 for an absent one: a dynamic layer's input scale)."""
    return 0 if t is None else t.data_ptr()


# plans an FP4Linear keeps (input shapes x streams); more start the collection over
_MAX_PLANS = 16


@dataclass(frozen=True)
class _Plan:
    """An eager CUDA forward of an ``FP4Linear`` for one input shape and dtype on one stream,
    made after a call that passed every check: the kernels it launched with the layer's
    buffers and the activations' scratch bound. It holds the buffers it bound: a buffer or
    bias replaced (a load with ``assign=True``, an assignment) or a buffer's storage swapped
    (``.data =``) makes it stale (``current``); values changed in place are read at the next
    launch."""

    parts: tuple[tuple[str, torch.Tensor, int], ...]  # (buffer name, tensor, address) as bound
    bias: torch.Tensor | None
    out_shape: tuple[int, ...]
    quantize: object | None  # W4A4 off the token route: quantizer.BoundQuantize into scratch
    gemm: object  # launcher.BoundGemm, or (token route) tokens_step.BoundStep; takes x or a
    a: int | None  # W4A4 off the token route: the scratch codes' address
    scratch: bool  # W4A4: it binds the activations' scratch (or token copy) of this stream

    def takes(self, x: torch.Tensor, index: int) -> bool:
        """Whether this call may launch the plan: ``launchable`` x and, where it binds scratch
        (W4A4), outside CUDA-graph capture, as a graph keeps its own."""
        if not launchable(x, index):
            return False
        return not self.scratch or not capturing()

    def current(self, layer: FP4Linear) -> bool:
        """Whether the layer still holds the buffers and bias this plan bound."""
        buffers = layer._buffers
        for name, t, address in self.parts:
            if buffers[name] is not t or _address(t) != address:
                return False
        return layer._parameters.get("bias") is self.bias

    @classmethod
    def make(cls, layer: FP4Linear, x: torch.Tensor) -> _Plan | None:
        """The plan of a call on x that has just run; None where a buffer to bind is not
        contiguous (the full path copies it at every call)."""
        from fp4_ops import quantizer
        from fp4_ops.sm90 import launcher

        if not all(t is None or t.is_contiguous() for t in layer._buffers.values()):
            return None
        rows = x.view(-1, layer.in_features)
        vec = FORMATS[layer.format]
        if layer.activations == "bf16":
            names = ("weight_prepacked", "weight_scale", "weight_global_scale")
            w, sw, gw = (layer._buffers[n] for n in names)
            a_dtype = DSL_DTYPE_NAMES[x.dtype]
            launch = launcher.launch_for_ops(rows, w, None, sw, vec, gw, x.dtype, a_dtype)
            gemm = launch.bind(w, None, sw, gw)
            quantize, a = None, None
        else:
            names = ("weight_data", "weight_scale", "weight_global_scale", "input_global_scale")
            w, sw, gw, gs_in = (layer._buffers[n] for n in names)
            # decode: one host call launches the tokens grid and the GEMM behind it
            route = layer._tokens_route(rows, vec)
            if route is not None:
                quantize, gemm, a = None, route.step, None
            else:
                scratch = quantizer.scratch_buffers(rows, vec)
                quantize = quantizer.plan_quantize(rows, vec, gs_in).bind(scratch, gs_in)
                q, sq, gs = scratch
                launch = launcher.launch_for_ops(q, w, sq, sw, vec, gs, x.dtype, scale=gw)
                gemm, a = launch.bind(w, sq, sw, gs, gw), q.data_ptr()
        parts = tuple((n, layer._buffers[n], _address(layer._buffers[n])) for n in names)
        out_shape = (*x.shape[:-1], layer.out_features)
        scratch = layer.activations != "bf16"
        return cls(parts, layer._parameters.get("bias"), out_shape, quantize, gemm, a, scratch)

    def __call__(self, x: torch.Tensor, stream: int) -> torch.Tensor:
        y = x.new_empty(*self.out_shape)
        if self.quantize is None:
            self.gemm(x.data_ptr(), y.data_ptr(), stream)
        else:
            self.quantize(x.data_ptr(), stream)
            self.gemm(self.a, y.data_ptr(), stream)
        bias = self.bias
        if bias is None:
            return y
        return y.add_(bias) if bias.dtype == y.dtype else y + bias.to(y.dtype)


# ----------------------------------------------------------------------------- quantize_model


@dataclass
class QuantizeReport:
    """What ``quantize_model`` did: ``replaced``, the names of the nn.Linear modules now
    FP4Linear; ``skipped``, name -> why a chosen nn.Linear (or transformers Conv1D) stays as
    it is; ``unmatched``, the ``include`` patterns that matched no nn.Linear; ``untied``, name
    -> the other modules that shared a parameter with a replaced Linear (a tied ``lm_head``'s
    input embedding) and keep it, while the FP4Linear holds its own copy."""

    replaced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    untied: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)}: {', '.join(self.replaced) or '-'}"]
        lines += [f"skipped {name or '(the model)'}: {why}" for name, why in self.skipped.items()]
        lines += [f"untied {name} from {', '.join(o)}" for name, o in self.untied.items()]
        if self.unmatched:
            lines.append(f"patterns that matched no nn.Linear: {', '.join(self.unmatched)}")
        return "\n".join(lines)


def _holds_experts(name: str, module: nn.Module) -> bool:
    """Whether ``module``, a child ``name`` of its parent, holds an MoE block's experts: a
    child ``experts`` (a ModuleList, transformers' fused 3-D weights), or a class named so
    (FP4Experts, JetMoE's and GraniteMoE's parallel experts)."""
    return (
        name == "experts" or is_experts_module(module) or type(module).__name__.endswith("Experts")
    )


def _expert_count(experts: nn.Module) -> int | None:
    """How many experts an MoE block's ``experts`` holds, where it says so: a list's length, a
    ``num_experts`` attribute, or the first dim of a 3-D weight of its own; else None."""
    if isinstance(experts, (nn.ModuleList, nn.ModuleDict)):
        return len(experts)
    count = getattr(experts, "num_experts", None)
    if isinstance(count, int):
        return count
    return next((p.shape[0] for p in experts.parameters(recurse=False) if p.ndim == 3), None)


def _router(model: nn.Module, name: str) -> str | None:
    """Why the Linear ``name`` stays as it is if it routes tokens in an MoE block, else None: a
    Linear of a block that holds experts, outside them, that is the block's child (Mixtral's and
    Qwen2-MoE's ``gate``, ``shared_expert_gate``) or the one Linear of a child (Hunyuan's
    ``gate.wg``, JetMoE's ``router.layer``), and gives one score per expert or one gate where
    the experts' count is known (JetMoE attention's ``kv_proj`` is no router)."""
    parts = name.split(".")
    block = model.get_submodule(".".join(parts[:-1]))
    if len(parts) > 1 and not any(_holds_experts(n, c) for n, c in block.named_children()):
        child_name, child = parts[-2], block
        block = model.get_submodule(".".join(parts[:-2]))
        alone = sum(isinstance(m, nn.Linear) for m in child.modules()) == 1
        if _holds_experts(child_name, child) or not alone:
            return None
    experts = [c for n, c in block.named_children() if _holds_experts(n, c)]
    if not experts:
        return None
    counts = {_expert_count(c) for c in experts}
    if None not in counts and model.get_submodule(name).out_features not in counts | {1}:
        return None
    return (
        "an MoE router (its outputs choose or weigh experts): FP4 checkpoints and serving "
        "engines keep routers in 16 bits"
    )


def weight_reader(linear: nn.Linear, attr: str, parent: nn.Module) -> str | None:
    """Why ``parent`` reads its Linear ``linear`` (its attribute ``attr``)'s weight itself, not
    only through its forward, or None: torch's attention modules, or a parent class whose code
    names ``self.{attr}.weight`` (to cast an input to the weight's dtype, or to pass it to a
    fused kernel, as some transformers models do) outside branches that the parent's own
    attributes rule out (``_reads``). Such a Linear cannot be an FP4Linear."""
    if isinstance(parent, nn.MultiheadAttention) or isinstance(
        linear, NonDynamicallyQuantizableLinear
    ):
        return (
            f"its parent ({type(parent).__name__}) reads its weight directly, not through "
            "forward (e.g. nn.MultiheadAttention.out_proj)"
        )
    trees = _class_trees(type(parent))
    if attr in _named_weights(type(parent)) and any(_reads(t, attr, parent) for t in trees):
        return (
            f"{type(parent).__name__} reads self.{attr}.weight itself, which an FP4Linear "
            "holds as an FP4Tensor"
        )
    return None


@functools.cache
def _class_trees(cls: type) -> tuple[ast.AST, ...]:
    """The parsed source of ``cls`` and of its bases outside torch (none for those Python has
    no source of, e.g. compiled ones)."""
    trees = []
    for base in cls.__mro__:
        if base is object or base.__module__.split(".")[0] == "torch":
            continue
        try:
            trees.append(ast.parse(textwrap.dedent(inspect.getsource(base))))
        except (OSError, TypeError, SyntaxError):
            pass
    return tuple(trees)


@functools.cache
def _named_weights(cls: type) -> frozenset[str]:
    """The attributes ``a`` whose ``self.a.weight`` the code of ``cls`` names anywhere (only
    these need ``_reads``' walk, which depends on the instance)."""
    return frozenset(
        node.value.attr
        for tree in _class_trees(cls)
        for node in ast.walk(tree)
        if _is_weight_of(node)
    )


def _is_weight_of(node: ast.AST, attr: str | None = None) -> bool:
    """Whether ``node`` is ``self.<attr>.weight`` (any attribute where ``attr`` is None)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "weight"
        and isinstance(node.value, ast.Attribute)
        and attr in (None, node.value.attr)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    )


def _reads(node: ast.AST, attr: str, parent: nn.Module) -> bool:
    """Whether code ``node`` names ``self.{attr}.weight`` outside the branches that ``parent``'s
    own attributes rule out (Bloom's ``if self.pretraining_tp > 1 and self.slow_but_exact``,
    GPT-2's ``if self.model_parallel``, false as configured)."""
    if isinstance(node, (ast.If, ast.IfExp)):
        taken = _truth(node.test, parent)
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        live = [node.test, *(body if taken is not False else ()), *(orelse if not taken else ())]
        return any(_reads(n, attr, parent) for n in live)
    if isinstance(node, ast.BoolOp):  # (operands after a deciding one are not evaluated)
        decisive = isinstance(node.op, ast.Or)
        for value in node.values:
            if _reads(value, attr, parent):
                return True
            known = _truth(value, parent)
            if known is not None and bool(known) is decisive:
                return False
        return False
    if _is_weight_of(node, attr):
        return True
    return any(_reads(n, attr, parent) for n in ast.iter_child_nodes(node))


_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}
_PLAIN = (bool, int, float, str, type(None))


def _truth(test: ast.AST, parent: nn.Module):
    """The value of a condition made of constants, ``self.<name>`` attributes of plain types
    (not ``self.training``), comparisons, ``not``, ``and`` and ``or``; None where it is
    anything else."""
    if isinstance(test, ast.Constant) and isinstance(test.value, _PLAIN):
        return test.value
    if isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name):
        # (not the train / eval mode, which changes: Mamba's fused training path reads them)
        own = test.value.id == "self" and test.attr != "training"
        value = getattr(parent, test.attr, None) if own else None
        return value if isinstance(value, _PLAIN) else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _truth(test.operand, parent)
        return None if value is None else not value
    if isinstance(test, ast.BoolOp):
        values = [_truth(v, parent) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # (a true value decides an or, a false an and)
        if any(v is not None and bool(v) is decisive for v in values):
            return decisive
        return None if None in values else not decisive
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARE:
        a, b = _truth(test.left, parent), _truth(test.comparators[0], parent)
        if a is None or b is None:
            return None
        try:
            return bool(_COMPARE[type(test.ops[0])](a, b))
        except TypeError:
            return None
    return None


def _selection(include):
    """(glob patterns or None, predicate or None) of ``quantize_model``'s ``include``."""
    if include is None:
        return None, None
    if isinstance(include, str):
        return [include], None
    if callable(include):
        try:
            signature = inspect.signature(include)
        except (TypeError, ValueError):  # (some builtins have none: called as they are)
            return None, include
        try:
            signature.bind("name", nn.Linear(1, 1))
        except TypeError:
            raise TypeError(
                f"include: a predicate is called as include(name, module) -> bool; this one "
                f"takes {signature}"
            ) from None
        return None, include
    if not isinstance(include, Iterable):
        raise TypeError(
            "include must be None, a glob pattern, an iterable of them or a predicate "
            f"(name, module) -> bool, got {type(include).__name__}"
        )
    patterns = list(include)
    for p in patterns:
        check_type(p, str, "include", "glob patterns (str)")
    return patterns, None


def quantize_model(
    model: nn.Module,
    include: Iterable[str] | str | Callable[[str, nn.Linear], bool] | None = None,
    format: str = "nvfp4",
    activations: str = "dynamic",
) -> QuantizeReport:
    """Replace ``model``'s ``nn.Linear`` modules by FP4Linear, and its transformers experts
    modules (3-D ``gate_up_proj`` / ``down_proj``: Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss,
    ...) by ``FP4Experts``, in place: W4A4 with dynamic activation scales, or
    ``activations="bf16"`` (W4A16: 16-bit activations, Hopper). NVFP4 Linears that serving
    engines run as one GEMM (``FUSED_SIBLINGS``: q / k / v, gate / up) share one weight global
    scale, the largest of theirs.

    ``include``: glob patterns of module names (``["*.mlp.*"]``) or a predicate
    ``(name, module) -> bool``; None takes every Linear and experts module. Experts modules
    whose layout or forward ``fp4_ops.moe.transformers_experts`` does not recognise, or that
    carry forward hooks or an instance forward, are skipped, with the reason in the report
    (one that ``include`` chooses raises ValueError).
    Skipped, with the reason in the report: MoE routers (a Linear of a block that holds
    experts, outside them: Mixtral's ``gate``, Qwen2-MoE's ``shared_expert_gate``, Hunyuan's
    ``gate.wg``), which FP4 checkpoints and serving engines keep in 16 bits; Linears whose
    parent reads their weight itself (``nn.MultiheadAttention``'s ``out_proj``, any
    ``NonDynamicallyQuantizableLinear``, a parent class whose code names
    ``self.<name>.weight``: Mamba's mixer, DeepSeek-V3.2's indexer); and, by default, those
    whose in_features is not a positive multiple of 32, whose class or instance overrides
    ``nn.Linear.forward`` (accelerate's hooks) or that has forward hooks or pre-hooks (one
    that ``include`` chooses raises ValueError); transformers' ``Conv1D`` (GPT-2's),
    whatever a predicate says (one that ``include`` patterns choose raises ValueError).
    The new modules keep the old ones' train / eval mode. A module
    reachable by several names becomes one FP4 module under all of them, whichever ``include``
    chose, or stays as it is under all of them where one name may not hold an FP4Linear (a
    router's, a weight reader's; each name skipped in the report). A Linear whose weight
    another module holds too (a tied ``lm_head``'s input embedding) gets an FP4 copy of its
    own (``untied`` in the report, and a warning: the model grows); a transformers model's
    configs then say ``tie_word_embeddings=False``, as ``save_quantized`` writes. Each
    transformers model in ``model`` that now holds FP4 layers refuses ``save_pretrained`` (use
    ``save_quantized``) and, where its lm_head is FP4, ``resize_token_embeddings``: ValueError
    (``refuse_transformers_methods``). Returns a ``QuantizeReport`` (and warns about patterns
    that matched no nn.Linear).
    """
    check_type(model, nn.Module, "model", "an nn.Module")
    check_format(format)
    _check_activations(activations, ("dynamic", "bf16"))
    patterns, predicate = _selection(include)
    modules = [
        (name, module)
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, nn.Linear) or is_experts_module(module) or _is_conv1d(module)
    ]
    report = QuantizeReport()
    if patterns is not None:
        names = [name for name, _ in modules]
        report.unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    # (every replacement is built, and every refusal raised, before the model changes)
    linears: dict[int, tuple[str, nn.Linear]] = {}  # (to quantize: a name of each, the module)
    converted: dict[int, nn.Module] = {}
    for name, module in modules:
        if _is_conv1d(module):
            if patterns is None:  # (every one, whatever a predicate says: it is asked of Linears)
                report.skipped[name] = CONV1D_REASON
            elif _chosen(name, module, patterns, None):
                raise ValueError(f"{name}: {CONV1D_REASON}")
            continue
        if not _chosen(name, module, patterns, predicate):
            continue
        if isinstance(module, nn.Linear):
            if _linear_fits(model, name, module, include, report):
                linears.setdefault(id(module), (name, module))
            continue
        how = (format, activations, include, converted.get(id(module)))
        fp4 = _experts_replacement(model, name, module, how, report)
        if fp4 is not None:
            converted[id(module)] = fp4.train(module.training)
    # (a module reachable by several names is one module: it changes under every name, or under
    # none where one name may not hold an FP4Linear, e.g. a weight reader's)
    kept: dict[int, tuple[str, str]] = {}
    for name, module in modules:
        if id(module) in linears:
            why = _held_as(model, name, module)
            if why is not None:
                kept.setdefault(id(module), (name, why))
    linears = {key: found for key, found in linears.items() if key not in kept}
    report.untied = _sharers(model, linears)
    shared = _shared_global_scales(linears) if format == "nvfp4" else {}
    for key, (name, module) in linears.items():
        try:
            fp4 = FP4Linear.from_linear(
                module, format, activations, weight_global_scale=shared.get(key)
            )
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        converted[key] = fp4.train(module.training)
    for name, module in modules:
        if id(module) in kept:
            where, why = kept[id(module)]
            report.skipped[name] = why if name == where else f"also reachable as {where}: {why}"
        elif id(module) in converted:
            report.replaced.append(name)
            model.set_submodule(name, converted[id(module)])
    refuse_transformers_methods(model)
    if report.untied:
        _untie_output_embedding(model, report.untied)
        pairs = "; ".join(f"{n} from {', '.join(o)}" for n, o in report.untied.items())
        warnings.warn(
            f"quantize_model: untied {pairs}: the FP4Linear holds an FP4 copy of the weight, "
            "the other modules keep it in 16 bits, so the model grows (a tied output "
            "embedding's config now says tie_word_embeddings=False, as save_quantized writes)",
            stacklevel=2,
        )
    if report.unmatched:
        warnings.warn(
            "quantize_model: include patterns that matched no nn.Linear or experts module: "
            f"{report.unmatched}",
            stacklevel=2,
        )
    return report


class Refused:
    """A transformers model method that cannot work once the model holds FP4 layers, set on
    the instance in its place: calling it raises ValueError with the reason before anything
    changes. It holds no reference to the model (no cycle; it pickles and deep-copies)."""

    def __init__(self, method: str, reason: str):
        self.method, self.reason = method, reason

    def __call__(self, *args, **kwargs):
        raise ValueError(f"{self.method}: {self.reason}")

    def __repr__(self) -> str:
        return f"Refused({self.method!r})"


SAVE_PRETRAINED_REASON = (
    "transformers cannot write FP4Linear / FP4Experts layers (its state-dict path would fail "
    "after writing config.json); write the checkpoint with fp4_ops.save_quantized(model, "
    "folder) instead (compressed-tensors or ModelOpt format, read back by "
    "fp4_ops.load_quantized)"
)
RESIZE_REASON = (
    "the output embedding is an FP4Linear, which transformers cannot resize (it would fail "
    "after resizing the input embedding); resize the 16-bit model's token embeddings before "
    "quantizing it"
)


def refuse_transformers_methods(model: nn.Module) -> None:
    """Replace, on each transformers model in ``model`` (itself, a vision-language model's
    language model, ...) that holds FP4 layers after ``quantize_model`` or ``load_quantized``,
    the methods that would fail half-way by ``Refused`` ones: ``save_pretrained``, and
    ``resize_token_embeddings`` where the output embedding is an FP4Linear. Other modules are
    left as they are."""
    for module in model.modules():
        if not callable(getattr(module, "save_pretrained", None)):
            continue
        if not any(isinstance(m, FP4Buffers) for m in module.modules()):
            continue
        module.save_pretrained = Refused("save_pretrained", SAVE_PRETRAINED_REASON)
        resize = getattr(module, "resize_token_embeddings", None)
        if callable(resize) and isinstance(output_embedding(module), FP4Linear):
            module.resize_token_embeddings = Refused("resize_token_embeddings", RESIZE_REASON)


def output_embedding(model: nn.Module) -> nn.Module | None:
    """A transformers model's output embedding (``get_output_embeddings()``), or None for a
    model without one."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _chosen(name: str, module: nn.Module, patterns, predicate) -> bool:
    """Whether quantize_model's ``include`` (patterns, a predicate, or None) takes the module."""
    if patterns is not None:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)
    if predicate is None:
        return True
    chosen = predicate(name, module)
    if not isinstance(chosen, bool):
        raise TypeError(f"include(name, module) must return a bool, got {type(chosen).__name__}")
    return chosen


CONV1D_REASON = (
    "transformers' Conv1D (GPT-2's Linear, its weight stored transposed), which FP4Linear does "
    "not replace"
)


def _is_conv1d(module: nn.Module) -> bool:
    """An instance of transformers' Conv1D (or of a subclass), without importing transformers."""
    return any(
        cls.__name__ == "Conv1D" and cls.__module__ == "transformers.pytorch_utils"
        for cls in type(module).__mro__
    )


def _linear_fits(model, name: str, module: nn.Linear, include, report) -> bool:
    """Whether quantize_model quantizes the Linear ``name``: else False with the reason in the
    report (ValueError where ``include`` chose a Linear that FP4Linear cannot stand in for)."""
    why = _held_as(model, name, module)
    if why is None:
        why = _unfit(module)
        if why is not None and include is not None:
            raise ValueError(f"{name}: {why}")
    if why is not None:
        report.skipped[name] = why
        return False
    return True


#: sibling Linears that serving engines run as one GEMM with one global weight scale (vLLM's
#: and SGLang's qkv_proj, gate_up_proj, Mixtral's w13, MLA's fused_qkv_a_proj): it is the
#: largest of theirs, so a checkpoint holds theirs shared (as llm-compressor and ModelOpt write)
FUSED_SIBLINGS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("w1", "w3"),
    ("q_a_proj", "kv_a_proj_with_mqa"),
)


def fused_groups(names) -> list[list[str]]:
    """The groups of two or more among the module ``names`` that ``FUSED_SIBLINGS`` makes
    siblings (one parent, one group's names), in ``names``' order."""
    groups: dict[tuple[str, int], list[str]] = {}
    for name in names:
        parent, _, attr = name.rpartition(".")
        for i, siblings in enumerate(FUSED_SIBLINGS):
            if attr in siblings:
                groups.setdefault((parent, i), []).append(name)
    return [group for group in groups.values() if len(group) > 1]


def _shared_global_scales(linears: dict[int, tuple[str, nn.Linear]]) -> dict[int, torch.Tensor]:
    """The NVFP4 weight global scale of each Linear that ``FUSED_SIBLINGS`` groups with others
    among ``linears`` (id -> a name of it, the module): the largest of the group's own
    ``amax / (448 * 6)``, which its largest weight would take alone."""
    by_name = {name: key for key, (name, _) in linears.items()}
    shared: dict[int, torch.Tensor] = {}
    for names in fused_groups(by_name):
        keys = [by_name[n] for n in names]
        weights = [(linears[k][0], linears[k][1].weight.detach()) for k in keys]
        for name, w in weights:  # (the refusal FP4Linear.from_linear would give it)
            if not bool(torch.isfinite(w).all()):
                raise ValueError(f"{name}: weight contains NaN or Inf, which FP4 cannot encode")
        device = weights[0][1].device
        amax = torch.stack([w.abs().amax().float().to(device) for _, w in weights])
        shared.update(dict.fromkeys(keys, cpu.dynamic_global_scale(amax)))
    return shared


def _sharers(model: nn.Module, linears: dict[int, tuple[str, nn.Linear]]) -> dict[str, list[str]]:
    """name -> the other modules holding its weight, for each Linear in ``linears`` (id -> a
    name of it, the module) whose weight another module holds too (a tied lm_head's input
    embedding): an FP4Linear in its place unties them."""
    holders: dict[int, dict[int, str]] = {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            holders.setdefault(id(p), {}).setdefault(id(module), name)
    sharers = {}
    for key, (name, linear) in linears.items():
        # (a parametrized weight is computed at each read: held by no module)
        others = [n for k, n in holders.get(id(linear.weight), {}).items() if k != key]
        if others:
            sharers[name] = others
    return sharers


def _untie_output_embedding(model: nn.Module, untied) -> None:
    """Where a transformers model's output embedding is among the ``untied`` FP4Linears, make
    its configs and tied-weights map say it is untied (as save_quantized writes it), so that
    ``model.tie_weights()`` does not tie it back (an FP4Linear has no weight parameter)."""
    output = output_embedding(model)
    if output is None or not any(model.get_submodule(n) is output for n in untied):
        return
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "tie_word_embeddings", False):  # (a submodel's: its text config)
            config.tie_word_embeddings = False
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        for target, source in list(tied.items()):
            if {target.rpartition(".")[0], source.rpartition(".")[0]} & set(untied):
                del tied[target]


def _held_as(model: nn.Module, name: str, linear: nn.Linear) -> str | None:
    """Why the Linear may not become an FP4Linear under ``name`` (where it stands, not what it
    is), or None: the model itself, a router, or one whose parent reads its weight."""
    if not name:
        return "the model is an nn.Linear itself: FP4Linear.from_linear"
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    return _router(model, name) or weight_reader(linear, attr, parent)


def _unfit(linear: nn.Linear) -> str | None:
    """Why FP4Linear cannot stand in for ``linear``, or None."""
    if type(linear).forward is not nn.Linear.forward:
        return f"{type(linear).__name__} has its own forward, which FP4Linear would drop"
    return _wrapped(linear, "FP4Linear") or _in_features_reason(linear.in_features)


def _wrapped(module: nn.Module, replacement: str) -> str | None:
    """Why ``replacement`` would drop what runs around ``module``'s class forward (forward
    hooks, pre-hooks, a forward set on the instance: accelerate's hooks), or None."""
    if "forward" in vars(module):
        return f"its instance has its own forward, which {replacement} would drop"
    hooks = [n for n in _FORWARD_HOOKS if getattr(module, n, None)]
    if hooks:
        return f"it has forward hooks ({', '.join(hooks)}), which {replacement} would drop"
    return None


#: nn.Module's per-instance forward hooks, which a module put in a Linear's place does not carry
_FORWARD_HOOKS = ("_forward_pre_hooks", "_forward_hooks")


def _in_features_reason(k: int) -> str | None:
    """Why a Linear of ``k`` inputs cannot become an FP4Linear, or None."""
    if k == 0:
        return "in_features = 0: an FP4Linear needs at least one block of 32 inputs"
    if k % 32:
        return f"in_features = {k} is not a multiple of 32"
    return None


def _experts_replacement(model: nn.Module, name: str, module: nn.Module, how: tuple, report):
    """quantize_model's FP4Experts (FP4Llama4Experts for Llama-4's) for one experts module
    (``made``, the one built for another name of it, if any), or None with the reason in the
    report (ValueError where ``include`` chose it)."""
    format, activations, include, made = how
    if not name:
        report.skipped[name] = "the model is an experts module itself: FP4Experts"
        return None
    if made is not None:
        return made
    # (checked first: the checks below run the module's forward, hooks included)
    wrapped = _wrapped(module, "FP4Experts")
    if wrapped is not None:
        if include is not None:
            raise ValueError(f"{name}: {wrapped}")
        report.skipped[name] = wrapped
        return None
    try:
        if takes_scaled_tokens(module):
            top_k = block_top_k(model, name)
            return FP4Llama4Experts.from_transformers(module, format, activations, top_k=top_k)
        return FP4Experts.from_transformers(module, format, activations)
    except ValueError as err:
        if include is not None:
            raise ValueError(f"{name}: {err}") from None
        report.skipped[name] = str(err)
        return None


def block_top_k(model: nn.Module, name: str) -> int:
    """The ``top_k`` of the MoE block holding Llama-4's experts module ``name`` (how many
    experts each token's scores choose); ValueError where the block has none, or one < 1."""
    block = model.get_submodule(name.rpartition(".")[0])
    top_k = getattr(block, "top_k", None)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(
            f"its block ({type(block).__name__}) has no int top_k, which its scaled tokens "
            "need to be routed"
        )
    if top_k < 1:
        raise ValueError(
            f"its block ({type(block).__name__}) has top_k {top_k}: each token must choose at "
            "least one expert"
        )
    return top_k


# ----------------------------------------------------------------------------- calibrate


def calibrate(model: nn.Module, forward_loop: Callable[[nn.Module], object]) -> list[str]:
    """Static activation scales for ``model``'s NVFP4 FP4Linear layers with dynamic ones, in
    place: ``forward_loop(model)`` runs the model on calibration data (gradients off), the
    largest |x| each such layer sees over all its calls is recorded, and the layer is replaced
    by a new FP4Linear (in the same train / eval mode; references to the old module keep the
    dynamic layer) with ``activations="static"`` and ``input_global_scale = amax / (448 * 6)``
    (in float32, as the dynamic scale; the decoding convention; ModelOpt's ``input_scale``,
    the reciprocal of compressed-tensors' ``input_global_scale``; 1.0 where every input was zero
    or the quotient underflows). ``save_quantized`` then writes a
    W4A4 checkpoint with static input scales, the form vLLM serves. Returns the names of the
    layers made static (each name of a layer reachable by several). ValueError, with no layer
    changed, where there is none to calibrate, or one saw no input or a non-finite one.
    """
    check_type(model, nn.Module, "model", "an nn.Module")
    if not callable(forward_loop):
        raise TypeError(
            f"forward_loop must be callable as forward_loop(model), got {forward_loop!r}"
        )
    names: dict[int, list[str]] = {}
    layers: dict[int, FP4Linear] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, FP4Linear) and module.format == "nvfp4":
            if module.activations == "dynamic":
                names.setdefault(id(module), []).append(name)
                layers[id(module)] = module
    if not layers:
        raise ValueError("model has no NVFP4 FP4Linear with dynamic activation scales to calibrate")
    if "" in names.get(id(model), []):
        raise ValueError("model is itself an FP4Linear: calibrate a module that holds it")
    amax: dict[int, torch.Tensor] = {}

    def record(module: nn.Module, args, kwargs) -> None:
        x = args[0] if args else kwargs["x"]
        if not x.numel():  # (an input without rows has no amax: it calibrates nothing)
            return
        seen = x.detach().abs().amax().float()
        key = id(module)
        amax[key] = seen if key not in amax else torch.maximum(amax[key], seen)

    hooks = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers.values()]
    try:
        with torch.no_grad():
            forward_loop(model)
    finally:
        for hook in hooks:
            hook.remove()
    unseen = [names[key][0] for key in layers if key not in amax]
    if unseen:
        raise ValueError(f"calibrate: forward_loop ran no input through {', '.join(unseen)}")
    keys = list(layers)
    seen = torch.stack([amax[key].cpu() for key in keys])  # (host syncs at the end only)
    finite = torch.isfinite(seen).tolist()
    bad = [names[key][0] for key, ok in zip(keys, finite, strict=True) if not ok]
    if bad:
        raise ValueError(f"calibrate: a non-finite input reached {', '.join(bad)}")
    # (in float32, as the dynamic scale is: 1.0 where amax is 0 or the quotient underflows)
    gs = cpu.global_scales_of_amax(seen).tolist()
    static = {
        key: FP4Linear(layer.weight, layer.bias, "static", s).train(layer.training)
        for (key, layer), s in zip(layers.items(), gs, strict=True)
    }
    for key in keys:  # (every layer built before any is swapped in)
        for name in names[key]:
            model.set_submodule(name, static[key])
    return [name for key in keys for name in names[key]]
