# SPDX-License-Identifier: BSD-3-Clause
"""Hugging Face checkpoints of FP4 models: ``load_quantized`` and ``save_quantized``.

Two on-disk formats, both a folder of safetensors (one ``model.safetensors``, or shards and their
``model.safetensors.index.json``) beside ``config.json``:

compressed-tensors (``config.json`` -> ``quantization_config``, ``quant_method:
compressed-tensors``, format ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``)
    per quantized Linear ``weight_packed`` uint8 [N, K/2], ``weight_scale`` (NVFP4:
    float8_e4m3fn [N, K/16]; MXFP4: E8M0 bytes, uint8 [N, K/32]), NVFP4's
    ``weight_global_scale`` and, with static activation scales, ``input_global_scale``: fp32
    [1], both the *encoding* scale ``448 * 6 / amax``, the reciprocal of this package's.
NVIDIA ModelOpt (``hf_quant_config.json``, ``quant_algo`` ``NVFP4`` (W4A4) or ``W4A16_NVFP4``)
    per quantized Linear ``weight`` uint8 [N, K/2], ``weight_scale`` float8_e4m3fn [N, K/16],
    ``weight_scale_2`` and (W4A4) ``input_scale``: fp32 scalars in the decoding convention
    ``amax / (448 * 6)``, as ``FP4Tensor.global_scale``.

MoE models: transformers' fused experts modules (gate_up_proj / down_proj) load from one
quantized Linear per expert and projection (``{experts}.{e}.gate_proj`` / ``up_proj`` /
``down_proj``, either format above, gate and up sharing their global scale) into
``FP4Experts``. Mixtral checkpoints name them ``block_sparse_moe.experts.{e}.w1`` / ``w3`` /
``w2`` (what ``save_quantized`` writes) or, as llm-compressor writes them,
``block_sparse_moe.experts.{e}.gate_proj`` / ...; both load (``_CHECKPOINT_SPELLINGS``).
OpenAI's gpt-oss MXFP4 (``config.json`` -> ``quantization_config``, ``quant_method: mxfp4``;
``format="gpt-oss-mxfp4"`` to write it)
    the experts only, per experts module ``gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16] (rows:
    gate and up interleaved), ``gate_up_proj_scales`` E8M0 bytes [E, 2I, H/32],
    ``down_proj_blocks`` [E, H, I/32, 16], ``down_proj_scales`` [E, H, I/32], and the biases
    ``gate_up_proj_bias`` [E, 2I], ``down_proj_bias`` [E, H]; into ``FP4Experts``.

Everything else (embeddings, norms, an unquantized ``lm_head``) is stored as usual. transformers
and safetensors are imported on first use (``pip install fp4-ops[hf]``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from fp4_ops.cpu import check_scales
from fp4_ops.layout import FORMATS, SCALE_DTYPES
from fp4_ops.moe import (
    FP4Experts,
    FP4Llama4Experts,
    check_experts_forward,
    is_experts_module,
    takes_scaled_tokens,
)
from fp4_ops.nn import (
    FP4Linear,
    block_top_k,
    fused_groups,
    output_embedding,
    refuse_transformers_methods,
    weight_reader,
)
from fp4_ops.tensor import (
    FP4Tensor,
    check_global_scale_value,
    check_type,
    global_scale_tensor,
)

__all__ = ["checkpoint_folder", "load_quantized", "save_quantized", "CHECKPOINT_FORMATS"]

#: ``save_quantized``'s formats
# OpenAI's gpt-oss MXFP4 (experts only)
GPT_OSS_MXFP4 = "gpt-oss-mxfp4"
CHECKPOINT_FORMATS = ("compressed-tensors", "modelopt", GPT_OSS_MXFP4)
_HF_HINT = "pip install 'fp4-ops[hf]' (transformers, safetensors)"
_CT_FORMATS = {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4"}
_CT_FORMAT_OF = {fmt: name for name, fmt in _CT_FORMATS.items()}
# compressed-tensors' strategy of each format's weights (NVFP4 has a per-tensor global scale)
_CT_STRATEGY = {"nvfp4": "tensor_group", "mxfp4": "group"}
_CT_SCALE_DTYPE = {"nvfp4": "torch.float8_e4m3fn", "mxfp4": "torch.uint8"}
_MODELOPT_ALGOS = {"NVFP4": "static", "W4A16_NVFP4": "none"}
_WEIGHTS_NAME = "model.safetensors"
_INDEX_NAME = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_SAFETENSORS_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
_SCALAR_SHAPES = ((), (1,))
_LOAD_ACTIVATIONS = (None, "bf16", "dynamic", "fp4")
_MAX_LISTED = 8
_MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _hf():
    """transformers, after checking that it and safetensors import."""
    try:
        import safetensors  # noqa: F401
        import transformers
    except ImportError as err:
        raise ImportError(f"checkpoints need transformers and safetensors: {_HF_HINT}") from err
    return transformers


def _listed(names) -> str:
    names = sorted(names)
    more = f" (and {len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


# ----------------------------------------------------------------------------- the schemes


@dataclass(frozen=True)
class _Scheme:
    """How a checkpoint stores one quantized Linear: its FP4 format, its activations ("static":
    a stored input global scale; "dynamic": scales computed per call; "none": weight-only) and
    the tensor names and global-scale convention of the checkpoint format."""

    format: str
    inputs: str
    checkpoint: str  # "compressed-tensors" | "modelopt" (gpt-oss's MXFP4 has no per-Linear one)
    origin: str  # where the config says so, for messages

    @property
    def names(self) -> dict[str, str]:
        """role -> tensor name (after the module's prefix)."""
        if self.checkpoint == "modelopt":
            names = {"data": "weight", "scales": "weight_scale", "global": "weight_scale_2"}
            if self.inputs == "static":
                names["input"] = "input_scale"
            return names
        names = {"data": "weight_packed", "scales": "weight_scale"}
        if self.format == "nvfp4":
            names["global"] = "weight_global_scale"
        if self.inputs == "static":
            names["input"] = "input_global_scale"
        return names

    @property
    def reciprocal(self) -> bool:
        """True where the stored global scales are encoding scales (compressed-tensors)."""
        return self.checkpoint == "compressed-tensors"

    def describe(self) -> str:
        mode = {"static": "W4A4, static input scale", "dynamic": "W4A4, dynamic", "none": "W4A16"}
        return f"{self.format} {mode[self.inputs]} ({self.origin})"


@dataclass
class _QuantConfig:
    """A checkpoint's quantization config: which Linear modules hold which scheme."""

    checkpoint: str
    # compressed-tensors: (group name, targets, scheme) in the config's order
    groups: list = field(default_factory=list)
    ignore: list = field(default_factory=list)
    # modelopt: the one scheme of every Linear not excluded
    scheme: _Scheme | None = None
    # the FP8 KV-cache quantization the config declares (its scales are checked, not used)
    kv_cache: str | None = None

    def quantizes_experts(self, name: str, module: nn.Module) -> bool:
        """Whether the checkpoint holds ``module``, an experts module, in FP4 (gpt-oss)."""
        if self.checkpoint != GPT_OSS_MXFP4 or not is_experts_module(module):
            return False
        return not any(
            fnmatch.fnmatchcase(name, p) or name.startswith(p + ".") for p in self.ignore
        )

    def scheme_for(self, names: tuple[str, ...], module: nn.Module) -> _Scheme | None:
        """The scheme of ``module``, which the checkpoint may name any of ``names``."""
        if self.checkpoint == GPT_OSS_MXFP4:  # (its experts only: ``quantizes_experts``)
            return None
        if self.checkpoint == "modelopt":
            if any(n == p or fnmatch.fnmatchcase(n, p) for n in names for p in self.ignore):
                return None
            return self.scheme if isinstance(module, nn.Linear) else None
        if any(_ct_match(n, module, p) for n in names for p in self.ignore):
            return None
        # compressed-tensors' precedence: exact names, then regexes, then class names (each in
        # sorted order); a target of several groups belongs to the last group that lists it
        by_target = {t: scheme for _, targets, scheme in self.groups for t in targets}
        ordered = sorted(by_target, key=lambda t: (t.startswith("re:"), t))
        for target in ordered:
            if any(_ct_match_name(n, target) for n in names):
                return by_target[target]
        for target in ordered:
            if _ct_match_class(module, target):
                return by_target[target]
        return None


def _ct_match_name(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def _ct_match_class(module: nn.Module, target: str) -> bool:
    return any(cls.__name__ == target for cls in type(module).__mro__ if cls is not object)


def _ct_match(name: str, module: nn.Module, target: str) -> bool:
    """compressed-tensors' matching of a module against a target / ignore entry: its exact
    name, a ``re:`` regular expression (``re.match``) or a class name in its MRO."""
    return _ct_match_name(name, target) or _ct_match_class(module, target)


def _fail(where: str, what: str):
    raise ValueError(f"{where}: {what}")


def _str_list(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(where, f"expected a list of module names / patterns, got {value!r}")
    return value


def _ct_args(args, fp4: str, where: str, role: str) -> None:
    """Checks compressed-tensors QuantizationArgs (a dict) of ``role`` for format ``fp4``."""
    if not isinstance(args, dict):
        _fail(where, f"expected a dict of quantization arguments, got {args!r}")
    vec = FORMATS[fp4]
    fmt = _CT_FORMAT_OF[fp4]
    if args.get("num_bits") != 4 or args.get("type") != "float":
        _fail(
            where,
            f"{fmt} needs num_bits 4, type float; got num_bits {args.get('num_bits')!r}, type "
            f"{args.get('type')!r}",
        )
    if args.get("symmetric", True) is not True:
        _fail(where, "asymmetric quantization (symmetric: false) has no FP4 form here")
    if args.get("group_size") != vec:
        _fail(where, f"group_size {args.get('group_size')!r}: {fmt} uses {vec}")
    if args.get("strategy") != _CT_STRATEGY[fp4]:
        _fail(where, f"strategy {args.get('strategy')!r}: {fmt} uses {_CT_STRATEGY[fp4]!r}")
    for key in ("block_structure", "actorder"):
        if args.get(key) not in (None, False):
            _fail(where, f"{key} {args[key]!r} is not supported")
    if args.get("scale_dtype") not in (None, _CT_SCALE_DTYPE[fp4]):
        _fail(where, f"scale_dtype {args['scale_dtype']!r}: {fmt} uses {_CT_SCALE_DTYPE[fp4]}")
    if role == "weights" and args.get("dynamic", False) is not False:
        _fail(where, f"dynamic {args['dynamic']!r}: weights need static scales (dynamic: false)")


def _ct_inputs(args, fp4: str, where: str) -> str:
    """The activation mode of compressed-tensors' input_activations."""
    if args is None:
        return "none"
    _ct_args(args, fp4, where, "input_activations")
    dynamic = args.get("dynamic")
    if fp4 == "nvfp4":
        # "local": block scales per call under a calibrated (stored) global scale
        if dynamic == "local":
            return "static"
        _fail(
            where,
            f"dynamic {dynamic!r}: NVFP4 activations load with a stored global scale "
            "(dynamic: local); static group scales (false) or no global scale (true) have no "
            "FP4Linear form",
        )
    if dynamic in (True, "local"):
        return "dynamic"
    _fail(where, f"dynamic {dynamic!r}: MXFP4 activations have per-call scales (dynamic: true)")


def _compressed_tensors_config(qc: dict) -> _QuantConfig:
    where = "config.json quantization_config"
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        _fail(where, f"quantization_status {status!r}: only packed ('compressed') weights load")
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key):
            _fail(f"{where}.{key}", f"{qc[key]!r} is not supported (only FP4 Linear weights)")
    kv = qc.get("kv_cache_scheme")
    if kv and not _ct_fp8_kv_cache(kv):
        _fail(f"{where}.kv_cache_scheme", f"{kv!r}: only static per-tensor FP8 is understood")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        _fail(f"{where}.config_groups", f"expected a non-empty dict, got {groups!r}")
    top = qc.get("format")
    config = _QuantConfig(
        "compressed-tensors",
        ignore=_str_list(qc.get("ignore"), where),
        kv_cache="FP8" if kv else None,
    )
    for name, group in groups.items():
        here = f"{where}.config_groups.{name}"
        if not isinstance(group, dict):
            _fail(here, f"expected a dict, got {group!r}")
        fmt = group.get("format") or top
        if fmt not in _CT_FORMATS:
            _fail(here, f"format {fmt!r}: supported are {sorted(_CT_FORMATS)}")
        fp4 = _CT_FORMATS[fmt]
        _ct_args(group.get("weights"), fp4, f"{here}.weights", "weights")
        inputs = _ct_inputs(group.get("input_activations"), fp4, f"{here}.input_activations")
        if group.get("output_activations") is not None:
            _fail(f"{here}.output_activations", "output quantization is not supported")
        targets = _str_list(group.get("targets"), f"{here}.targets")
        if not targets:
            _fail(f"{here}.targets", "no targets")
        config.groups.append((name, targets, _Scheme(fp4, inputs, "compressed-tensors", here)))
    return config


def _modelopt_config(q: dict, where: str) -> _QuantConfig:
    algo = str(q.get("quant_algo") or "").upper()
    if algo not in _MODELOPT_ALGOS:
        _fail(where, f"quant_algo {q.get('quant_algo')!r}: supported are {list(_MODELOPT_ALGOS)}")
    group_size = q.get("group_size", FORMATS["nvfp4"])
    if group_size != FORMATS["nvfp4"]:
        _fail(where, f"group_size {group_size!r}: NVFP4 uses {FORMATS['nvfp4']}")
    kv = q.get("kv_cache_quant_algo") or q.get("kv_cache_scheme")
    # (config.json's embedded form may spell it as compressed-tensors does)
    fp8 = _ct_fp8_kv_cache(kv) if isinstance(kv, dict) else str(kv).upper() == "FP8"
    if kv and not fp8:
        _fail(where, f"kv-cache quantization {kv!r}: only static per-tensor FP8 is understood")
    exclude = q["exclude_modules"] if "exclude_modules" in q else q.get("ignore")
    scheme = _Scheme("nvfp4", _MODELOPT_ALGOS[algo], "modelopt", f"{where} quant_algo {algo}")
    ignore = _str_list(exclude, where)
    return _QuantConfig("modelopt", ignore=ignore, scheme=scheme, kv_cache="FP8" if kv else None)


def _modelopt_says(config: _QuantConfig) -> str:
    """What a ModelOpt config decides of the layers and the KV cache (its exclusions are
    spelled variously and the tensors check them)."""
    mode = "W4A16" if config.scheme.inputs == "none" else "W4A4"
    return f"{config.scheme.format} {mode}, KV cache {config.kv_cache or '16-bit'}"


def _ct_fp8_kv_cache(kv) -> bool:
    """Whether a ``kv_cache_scheme`` is static per-tensor FP8 (E4M3): compressed-tensors' form,
    or ModelOpt's in config.json, which leaves the (per-tensor) strategy out."""
    return (
        isinstance(kv, dict)
        and kv.get("num_bits") == 8
        and kv.get("type") == "float"
        and kv.get("strategy", "tensor") == "tensor"
        and not kv.get("dynamic")
    )


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            value = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path.name}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path.name}: expected a JSON object")
    return value


def _quant_config(folder: Path, config: dict) -> _QuantConfig:
    """The checkpoint's quantization config, from config.json or hf_quant_config.json."""
    hf_quant = folder / "hf_quant_config.json"
    qc = config.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise ValueError(f"config.json quantization_config: expected a dict, got {qc!r}")
        method = str(qc.get("quant_method", ""))
        if method == "compressed-tensors":
            return _compressed_tensors_config(qc)
        if method == "mxfp4":
            ignore = _str_list(qc.get("modules_to_not_convert") or [], "modules_to_not_convert")
            return _QuantConfig(GPT_OSS_MXFP4, ignore=ignore)
        if not method.lower().startswith("modelopt"):
            raise ValueError(
                f"config.json quantization_config: quant_method {method!r}: supported are "
                "'compressed-tensors', 'modelopt' (NVFP4) and 'mxfp4' (gpt-oss)"
            )
        embedded = qc.get("quantization", qc)
        if not hf_quant.exists():
            return _modelopt_config(embedded, "config.json quantization_config")
    if hf_quant.exists():
        q = _read_json(hf_quant).get("quantization")
        if not isinstance(q, dict):
            raise ValueError("hf_quant_config.json: no 'quantization' object")
        config = _modelopt_config(q, "hf_quant_config.json quantization")
        # (where config.json repeats the scheme, the two must agree)
        if qc is not None and isinstance(embedded, dict) and "quant_algo" in embedded:
            said = _modelopt_says(_modelopt_config(embedded, "config.json quantization_config"))
            if said != _modelopt_says(config):
                raise ValueError(
                    f"config.json's quantization_config says {said}, hf_quant_config.json "
                    f"{_modelopt_says(config)}: which one holds?"
                )
        return config
    raise ValueError(
        f"{folder}: not a quantized checkpoint: config.json has no quantization_config and "
        "there is no hf_quant_config.json"
    )


# ----------------------------------------------------------------------------- the tensors


# Name parts that some model types' checkpoints spell otherwise than transformers names the
# model's modules (what its checkpoint conversion mapping renames): (what precedes the part,
# or None for the name's start; the checkpoints' spelling; transformers'). save_quantized
# writes the checkpoints' spelling.
_MIXTRAL = (
    ("", "block_sparse_moe", "mlp"),
    (r"\.experts\.\d+", "w1", "gate_proj"),
    (r"\.experts\.\d+", "w3", "up_proj"),
    (r"\.experts\.\d+", "w2", "down_proj"),
)
_GRANITE_MOE = (
    (r"\.block_sparse_moe", "router.layer", "router"),
    (r"\.block_sparse_moe", "input_linear.weight", "experts.gate_up_proj"),
    (r"\.block_sparse_moe", "output_linear.weight", "experts.down_proj"),
)
_CHECKPOINT_SPELLINGS = {
    "mixtral": _MIXTRAL,
    "minimax": _MIXTRAL,
    "minimax_m2": _MIXTRAL,
    # (its router: the checkpoints' gate; a rule that reads either spelling of the block)
    "phimoe": (*_MIXTRAL, (r"\.(?:block_sparse_moe|mlp)", "gate", "router")),
    "granitemoe": _GRANITE_MOE,
    "granitemoeshared": _GRANITE_MOE,
    "ernie4_5_moe": ((r"\.mlp", "moe_statics", "gate.moe_statics"),),
    "gpt_neox": ((None, "embed_out", "lm_head"),),
    # (Llama-4's vision-language checkpoints, whose text model AutoModelForCausalLM builds)
    "llama4": (
        (None, "language_model.model", "model"),
        (None, "language_model.lm_head", "lm_head"),
    ),
    # (Qwen3.5's and Qwen3.5-MoE's vision-language checkpoints, whose text model
    # AutoModelForCausalLM builds)
    "qwen3_5": ((None, "model.language_model", "model"),),
    "qwen3_5_moe": ((None, "model.language_model", "model"),),
    "nemotron_h": ((None, "backbone", "model"),),
    # (Gemma-3's vision-language checkpoints, as llava's)
    "gemma3": (
        (None, "language_model.model", "model.language_model"),
        (None, "language_model.lm_head", "lm_head"),
        (None, "vision_tower", "model.vision_tower"),
        (None, "multi_modal_projector", "model.multi_modal_projector"),
    ),
}


def _part(before: str | None, part: str) -> str:
    """The regular expression of name part ``part`` after ``before`` (group 1; the name's
    start where None), a whole part."""
    start = "^()" if before is None else rf"({before}\.)"
    return rf"{start}{re.escape(part)}(?=\.|$)"


def _respelled(name: str, model_type: str | None, to_model: bool) -> str:
    """``name`` (a key or module name) with ``model_type``'s checkpoint spelling of its parts
    turned into transformers' (``to_model``) or back."""
    for rule in _CHECKPOINT_SPELLINGS.get(model_type, ()):
        name = _respell(name, rule, to_model)
    return name


def _respell(name: str, rule: tuple, to_model: bool) -> str:
    before, stored, model = rule
    old, new = (stored, model) if to_model else (model, stored)
    return re.sub(_part(before, old), rf"\g<1>{new}", name)


def _spellings(name: str, model_type: str | None) -> set[str]:
    """Every spelling of the model's module ``name`` with some of ``model_type``'s rules turned
    back into the checkpoints' (writers' configs mix them: PhiMoE's name the router
    ``block_sparse_moe.router``, stored as ``block_sparse_moe.gate``)."""
    names = {name}
    for rule in _CHECKPOINT_SPELLINGS.get(model_type, ()):
        names |= {_respell(n, rule, to_model=False) for n in names}
    return names


def _spelled_as_stored(model_type: str | None, model: nn.Module | None) -> bool:
    """Whether ``model`` names a module as ``model_type``'s checkpoints spell it."""
    spellings = _CHECKPOINT_SPELLINGS.get(model_type, ())
    return model is not None and any(
        re.search(_part(before, stored), name)
        for name, _ in model.named_modules()
        for before, stored, _ in spellings
    )


class _Checkpoint:
    """The safetensors of a folder: names, dtypes and shapes from the headers (no data read),
    under the model's names for them (``_CHECKPOINT_SPELLINGS``); tensors on demand."""

    def __init__(self, folder: Path, model_type: str | None = None):
        from safetensors import SafetensorError, safe_open

        single, index = folder / _WEIGHTS_NAME, folder / _INDEX_NAME
        if single.exists() and index.exists():
            raise ValueError(f"both {_WEIGHTS_NAME} and {_INDEX_NAME}: which one holds the model?")
        if index.exists():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{_INDEX_NAME}: no weight_map")
            files = sorted(set(weight_map.values()))
        elif single.exists():
            weight_map, files = None, [_WEIGHTS_NAME]
        else:
            raise FileNotFoundError(f"{folder}: no {_WEIGHTS_NAME} or {_INDEX_NAME}")
        self.file_of: dict[str, str] = {}
        self.header: dict[str, tuple] = {}
        for name in files:
            path = folder / name
            if not path.is_file():
                raise FileNotFoundError(f"{_INDEX_NAME} names {name}, which is not in {folder}")
            try:
                opened = safe_open(path, framework="pt")
            except SafetensorError as err:
                raise ValueError(f"{path}: not a safetensors file ({err})") from None
            with opened as f:
                for key in f.keys():
                    if key in self.file_of:
                        raise ValueError(f"{key}: in both {self.file_of[key]} and {name}")
                    sl = f.get_slice(key)
                    dtype = sl.get_dtype()
                    self.header[key] = (
                        _SAFETENSORS_DTYPES.get(dtype, dtype),
                        tuple(sl.get_shape()),
                    )
                    self.file_of[key] = name
        if weight_map is not None:
            for key, name in weight_map.items():
                if self.file_of.get(key) != name:
                    raise ValueError(f"{_INDEX_NAME} puts {key} in {name}, which does not hold it")
            unlisted = set(self.file_of) - set(weight_map)
            if unlisted:
                raise ValueError(
                    f"tensors in the shards but not in {_INDEX_NAME}: {_listed(unlisted)}"
                )
        self.folder, self.model_type, self.file_header = folder, model_type, self.header
        self.use_names_of(None)

    def use_names_of(self, model: nn.Module | None) -> None:
        """The keys under ``model``'s names from here on: its type's checkpoint spellings turned
        into transformers' (``_CHECKPOINT_SPELLINGS``), or, where the model is spelled as its
        checkpoints are (transformers 4.x), transformers' spellings turned into those."""
        as_stored = _spelled_as_stored(self.model_type, model)
        self.kind = None if as_stored else self.model_type
        by_name: dict[str, list[str]] = {}
        for key in self.file_of:
            # (a model spelled as the checkpoints: keys in transformers' spelling turned back)
            name = _respelled(key, self.model_type, to_model=not as_stored)
            by_name.setdefault(name, []).append(key)
        for name, keys in by_name.items():
            if len(keys) > 1:
                raise ValueError(f"{_listed(keys)}: all name the model's {name}")
        # model's name -> stored key; the headers and module names under the model's names
        self.stored = {name: keys[0] for name, keys in by_name.items()}
        self.header = {name: self.file_header[key] for name, key in self.stored.items()}
        self.module_names = {
            name.rpartition(".")[0]: key.rpartition(".")[0] for name, key in self.stored.items()
        }

    def stored_names(self, module: str) -> tuple[str, ...]:
        """The checkpoint's names of a module the model calls ``module`` (what its quantization
        config's targets and ignore lists name): as its nearest module with tensors there is
        named, the rest as the model names it; and in any mix of the model type's spellings
        and the model's (``_spellings``)."""
        head, rest = module, ""
        while head and head not in self.module_names:
            head, _, last = head.rpartition(".")
            rest = f".{last}{rest}"
        near = self.module_names[head] + rest if head else module
        return (near, *sorted(_spellings(module, self.kind) - {near}))

    def __contains__(self, key: str) -> bool:
        return key in self.header

    def keys(self):
        return self.header.keys()

    @contextlib.contextmanager
    def reader(self, device: torch.device):
        """A function key -> tensor on ``device``, with every file open once meanwhile."""
        from safetensors import safe_open

        with contextlib.ExitStack() as stack:
            files = {
                name: stack.enter_context(
                    safe_open(self.folder / name, framework="pt", device=str(device))
                )
                for name in sorted(set(self.file_of.values()))
            }
            yield lambda key: files[self.file_of[self.stored[key]]].get_tensor(self.stored[key])


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _dtype_str(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _expect(ck: _Checkpoint, key: str, dtypes: tuple, shapes: tuple, what: str) -> None:
    """ValueError naming ``key`` unless the checkpoint holds it with one of ``dtypes`` (none
    given: any floating-point dtype) and one of ``shapes``."""
    want = f"{what}: {' or '.join(_dtype_str(d) for d in dtypes) if dtypes else 'floating point'}"
    want += f" {' or '.join(_shape_str(s) for s in shapes)}"
    if key not in ck:
        hint = _renames_not_applied(ck.model_type)
        raise ValueError(f"{key}: missing from the checkpoint; expected {want}{hint}")
    dtype, shape = ck.header[key]
    ok_dtype = (
        dtype in dtypes if dtypes else isinstance(dtype, torch.dtype) and dtype.is_floating_point
    )
    if not ok_dtype or shape not in shapes:
        raise ValueError(f"{key}: expected {want}, got {_dtype_str(dtype)} {_shape_str(shape)}")


def _renames_not_applied(model_type: str | None) -> str:
    """Where transformers renames ``model_type``'s checkpoint names on load and this loader
    knows no spelling of that type (``_CHECKPOINT_SPELLINGS``), what a missing key's error
    adds: a few of those renames; else ''."""
    if model_type is None or model_type in _CHECKPOINT_SPELLINGS:
        return ""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # (transformers 4.x renames nothing on load)
        return ""
    renames = [
        f"{source} -> {target}"
        for rule in get_checkpoint_conversion_mapping(model_type) or ()
        if type(rule).__name__ in ("WeightRenaming", "PrefixChange")
        for source, target in zip(rule.source_patterns, rule.target_patterns, strict=False)
    ]
    if not renames:
        return ""
    return (
        f" ({model_type} checkpoints may spell names as transformers renames them on load, "
        f"e.g. {', '.join(renames[:3])}; fp4_ops does not translate this model type's names)"
    )


@dataclass
class _Layer:
    """A quantized Linear to be: its name, its scheme and its checkpoint tensors (role -> key)."""

    name: str
    scheme: _Scheme
    keys: dict[str, str]


def _plan_layer(ck: _Checkpoint, name: str, module: nn.Linear, scheme: _Scheme) -> _Layer:
    """Checks (headers only) the tensors of one quantized Linear."""
    fmt = scheme.format
    prefix = f"{name}." if name else ""
    n, k = module.out_features, module.in_features
    if k % 32:
        raise ValueError(f"{name}: in_features = {k} is not a multiple of 32 (FP4Linear)")
    vec = FORMATS[fmt]
    keys = {role: prefix + tensor for role, tensor in scheme.names.items()}
    data_key = keys["data"]
    dtype, shape = ck.header.get(prefix + "weight", (None, None))
    # (ModelOpt's packed codes are called weight too: a float one is a 16-bit layer)
    floating = isinstance(dtype, torch.dtype) and dtype.is_floating_point
    if dtype is not None and (data_key not in ck or floating):
        raise ValueError(
            f"{data_key}: {scheme.describe()} covers {name}, but the checkpoint holds "
            f"{prefix}weight ({_dtype_str(dtype)} {_shape_str(shape)}), not packed codes (is "
            f"{name} missing from the config's ignore / exclude_modules?)"
        )
    _expect(ck, data_key, (torch.uint8,), ((n, k // 2),), f"packed {fmt} codes of [{n}, {k}]")
    scale_dtypes = (SCALE_DTYPES[vec],) if fmt == "nvfp4" else (torch.uint8, SCALE_DTYPES[vec])
    _expect(ck, keys["scales"], scale_dtypes, ((n, k // vec),), f"{fmt} block scales")
    convention = "encoding (448 * 6 / amax)" if scheme.reciprocal else "decoding (amax / 2688)"
    for role in ("global", "input"):
        if role in keys:
            what = f"a float32 {convention} global scale"
            _expect(ck, keys[role], (torch.float32,), _SCALAR_SHAPES, what)
    if module.bias is not None:
        keys["bias"] = prefix + "bias"
        _expect(ck, keys["bias"], (), ((n,),), "the bias")
    return _Layer(name, scheme, keys)


def _read_scalar(t: torch.Tensor, key: str, reciprocal: bool) -> torch.Tensor:
    """A stored global scale as this package's (decoding) 0-d float32, checked."""
    value = global_scale_tensor(t, t, key)
    if reciprocal:
        value = global_scale_tensor(1.0 / value, value, f"1 / {key}")
    return value


def _checked_scales(layer: _Layer, t: dict) -> torch.Tensor:
    """A planned layer's block scales as their dtype (MXFP4: E8M0), checked by their key."""
    key = layer.keys["scales"]
    scales = t[key]
    if layer.scheme.format == "mxfp4":
        scales = scales.view(torch.float8_e8m0fnu)
    try:
        check_scales(scales)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
    return scales


def _weight_parts(layer: _Layer, t: dict):
    """(packed data, plain scales, decoding global scale) of one planned Linear's weight."""
    keys, scheme = layer.keys, layer.scheme
    scales = _checked_scales(layer, t)
    gs = torch.ones((), dtype=torch.float32)
    if "global" in keys:
        gs = _read_scalar(t[keys["global"]].cpu(), keys["global"], scheme.reciprocal)
    return t[keys["data"]], scales, gs


def _layer_weight(layer: _Layer, t: dict) -> FP4Tensor:
    """The FP4 weight of one planned layer from its loaded tensors."""
    data, scales, gs = _weight_parts(layer, t)
    try:
        return FP4Tensor.from_plain(data, scales, gs, layer.scheme.format)
    except ValueError as err:
        raise ValueError(f"{layer.name}: {err}") from None


def _input_scale(layer: _Layer, t: dict) -> torch.Tensor | None:
    """The planned layer's static input scale, checked, or None where it stores none."""
    key = layer.keys.get("input")
    return None if key is None else _read_scalar(t[key].cpu(), key, layer.scheme.reciprocal)


def _build_layer(layer: _Layer, t: dict, activations: str, dtype: torch.dtype) -> FP4Linear:
    """The FP4Linear of one planned layer from its loaded tensors."""
    keys = layer.keys
    input_gs = _input_scale(layer, t)
    weight = _layer_weight(layer, t)
    bias = t[keys["bias"]].to(dtype) if "bias" in keys else None
    if activations != "static":
        input_gs = None
    return FP4Linear(weight, bias, activations, input_gs)


def _dequantize_into(linear: nn.Linear, layer: _Layer, t: dict, dtype: torch.dtype) -> None:
    """``linear`` (its parent reads its weight itself) given the planned layer's weight
    dequantized to ``dtype``, and its bias; its input scale, if any, is checked and unused."""
    keys = layer.keys
    _input_scale(layer, t)
    linear.weight = nn.Parameter(_layer_weight(layer, t).dequantize(dtype), requires_grad=False)
    if "bias" in keys:
        linear.bias = nn.Parameter(t[keys["bias"]].to(dtype), requires_grad=False)


@dataclass
class _Experts:
    """gpt-oss MXFP4 experts to be: the module's name, its tensors (role -> key), (E, H, I)."""

    name: str
    keys: dict[str, str]
    shape: tuple[int, int, int]


_EXPERTS_ROLES = ("gate_up_proj", "down_proj")


def _plan_experts(ck: _Checkpoint, name: str, module: nn.Module) -> _Experts:
    """Checks (headers only) the MXFP4 tensors of one gpt-oss experts module."""
    params = dict(module.named_parameters(recurse=False))
    kind = type(module).__name__
    if {"gate_up_proj_bias", "down_proj_bias"} - set(params):
        raise ValueError(f"{name}: a {kind} without biases; gpt-oss MXFP4 holds GptOssExperts")
    check_experts_forward(module, name, "swigluoai")
    # (GptOssExperts' own layout: gate_up_proj [E, H, 2I], down_proj [E, I, H])
    e, h, two_i = params["gate_up_proj"].shape
    i = two_i // 2
    if tuple(params["down_proj"].shape) != (e, i, h) or two_i % 2 or h % 32 or i % 32:
        raise ValueError(
            f"{name}: gate_up_proj {_shape_str(params['gate_up_proj'].shape)} and down_proj "
            f"{_shape_str(params['down_proj'].shape)}: not experts of MXFP4-sized H and I"
        )
    keys = {}
    for proj, rows, k in (("gate_up_proj", two_i, h), ("down_proj", h, i)):
        keys |= {f"{proj}_{part}": f"{name}.{proj}_{part}" for part in ("blocks", "scales", "bias")}
        what = f"MXFP4 {proj} of [{e}, {rows}, {k}]"
        _expect(ck, keys[f"{proj}_blocks"], (torch.uint8,), ((e, rows, k // 32, 16),), what)
        _expect(ck, keys[f"{proj}_scales"], (torch.uint8,), ((e, rows, k // 32),), f"{what}: E8M0")
        _expect(ck, keys[f"{proj}_bias"], (), ((e, rows),), f"the bias of {proj}")
    return _Experts(name, keys, (e, h, i))


def _build_experts(plan: _Experts, t: dict, activations: str, dtype: torch.dtype) -> FP4Experts:
    """The FP4Experts of one planned gpt-oss experts module from its loaded tensors."""
    e, h, i = plan.shape
    weights = {}
    for proj, rows, k in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):
        key = plan.keys[f"{proj}_scales"]
        scales = t[key].view(torch.float8_e8m0fnu)
        try:
            check_scales(scales)
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
        data = t[plan.keys[f"{proj}_blocks"]].reshape(e, rows, k // 2)
        weights[proj] = FP4Tensor.from_plain(data, scales, 1.0, "mxfp4")
    b13 = t[plan.keys["gate_up_proj_bias"]].to(dtype)
    b2 = t[plan.keys["down_proj_bias"]].to(dtype)
    w13, w2 = weights["gate_up_proj"], weights["down_proj"]
    return FP4Experts(w13, w2, "swigluoai", activations, b13, b2)


@dataclass
class _LinearExperts:
    """A fused experts module whose checkpoint holds one quantized Linear per expert and
    projection (``{name}.{e}.gate_proj`` / ``up_proj`` / ``down_proj``: compressed-tensors and
    ModelOpt MoE checkpoints): its name, the planned Linears [e][proj], (E, H, I)."""

    name: str
    layers: list[list[_Layer]]
    shape: tuple[int, int, int]
    top_k: int | None  # (Llama-4's experts: its block's; None for the others)

    @property
    def keys(self) -> dict[str, str]:
        return {k: k for row in self.layers for layer in row for k in layer.keys.values()}


_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _plan_linear_experts(ck, qconfig, model, name: str, module) -> _LinearExperts | None:
    """Checks (headers only) the per-expert FP4 Linears of a fused experts module
    (gate_up_proj [E, 2I, H], gate rows first, and down_proj [E, H, I]; Llama-4's [E, H, 2I]
    and [E, I, H]; SiLU), or None where the checkpoint holds no quantized Linear for its first
    expert."""
    params = dict(module.named_parameters(recurse=False))
    scaled = takes_scaled_tokens(module)
    if scaled:
        e, h, two_i = params["gate_up_proj"].shape
    else:
        e, two_i, h = params["gate_up_proj"].shape
    i = two_i // 2
    with torch.device("meta"):  # (stand-ins, for the config's class and name matching)
        stand_in = {
            "gate_proj": nn.Linear(h, i, bias=False),
            "up_proj": nn.Linear(h, i, bias=False),
            "down_proj": nn.Linear(i, h, bias=False),
        }
    schemes = {
        (x, proj): qconfig.scheme_for(ck.stored_names(f"{name}.{x}.{proj}"), stand_in[proj])
        for x in range(e)
        for proj in _PROJECTIONS
    }
    if schemes[0, "gate_proj"] is None:
        return None
    formats = {None if s is None else s.format for s in schemes.values()}
    if len(formats) != 1:
        raise ValueError(
            f"{name}: the config quantizes some of its experts' projections and not others "
            f"({sorted(map(str, formats))}); FP4Experts holds all of them in one format"
        )
    down = (e, i, h) if scaled else (e, h, i)
    if set(params) != {"gate_up_proj", "down_proj"} or tuple(params["down_proj"].shape) != down:
        raise ValueError(
            f"{name}: a {type(module).__name__} other than gate_up_proj [E, 2I, H] and "
            "down_proj [E, H, I] (Llama-4's: [E, H, 2I] and [E, I, H]); per-expert FP4 Linears "
            "load into those only"
        )
    check_experts_forward(module, name, "silu")
    try:
        top_k = block_top_k(model, name) if scaled else None
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    layers = [
        [_plan_layer(ck, f"{name}.{x}.{p}", stand_in[p], schemes[x, p]) for p in _PROJECTIONS]
        for x in range(e)
    ]
    return _LinearExperts(name, layers, (e, h, i), top_k)


def _build_linear_experts(plan: _LinearExperts, t: dict, activations: str) -> FP4Experts:
    """FP4Experts from per-expert Linears: gate and up stacked as w13 (they must share their
    global scale, as llm-compressor and ModelOpt write them), down as w2. Stored input scales
    are checked as a Linear's are; FP4Experts has no static-scale W4A4 and does not use them."""
    fmt = plan.layers[0][0].scheme.format
    w13, w2, gs13, gs2 = [], [], [], []
    for layer in (layer for row in plan.layers for layer in row if "input" in layer.keys):
        key = layer.keys["input"]
        _read_scalar(t[key].cpu(), key, layer.scheme.reciprocal)
    for gate, up, down in plan.layers:
        (gd, gsc, ggs), (ud, usc, ugs) = _weight_parts(gate, t), _weight_parts(up, t)
        if not torch.equal(ggs, ugs):
            raise ValueError(
                f"{gate.name} and {up.name}: global scales {float(ggs)} and {float(ugs)} "
                "differ; FP4Experts takes one per expert for both (re-export with them fused)"
            )
        w13.append((torch.cat((gd, ud)), torch.cat((gsc, usc))))
        gs13.append(ggs)
        dd, dsc, dgs = _weight_parts(down, t)
        w2.append((dd, dsc))
        gs2.append(dgs)

    def stacked(parts, scales) -> FP4Tensor:
        data = torch.stack([d for d, _ in parts])
        blocked = FP4Tensor.from_plain(data, torch.stack([sc for _, sc in parts]), 1.0, fmt)
        # (one decoding global scale per expert)
        return FP4Tensor(data, blocked.scale, torch.stack(scales).to(data.device), fmt)

    w13, w2 = stacked(w13, gs13), stacked(w2, gs2)
    if plan.top_k is None:
        return FP4Experts(w13, w2, "silu", activations)
    return FP4Llama4Experts(w13, w2, "silu", activations, top_k=plan.top_k)


def _warn_unused_expert_input_scales(experts: list, activations: str | None) -> None:
    """One UserWarning naming the experts modules whose checkpoint stores static input scales,
    which FP4Experts does not use (W4A16, or W4A4 with per-call scales)."""
    stored = [
        plan.name
        for plan in experts
        if isinstance(plan, _LinearExperts)
        and any("input" in layer.keys for row in plan.layers for layer in row)
    ]
    if stored and activations not in ("bf16", "dynamic"):
        mode = "W4A4 with per-call scales" if activations == "fp4" else "W4A16"
        warnings.warn(
            f"{len(stored)} experts modules ({stored[0]}, ...) store static input scales: they "
            f"are checked and not used, as FP4Experts has no static-scale W4A4; they run {mode} "
            "(activations='bf16' or 'dynamic' asks for this explicitly)",
            stacklevel=3,  # (load_quantized's caller)
        )


# ----------------------------------------------------------------------------- the model


def _remake_buffers(model: nn.Module) -> None:
    """The model's non-persistent buffers made again by its own initializer, outside the
    16-bit default dtype of its construction, as from_pretrained does (GPT-J's sinusoid table
    divides integers, which BF16 rounds); parameters are on the meta device."""
    init = getattr(model, "_init_weights", None)
    if not callable(init):
        return
    with torch.no_grad():
        for module in model.modules():
            if module._non_persistent_buffers_set:
                init(module)


@contextlib.contextmanager
def _parameters_on_meta():
    """Parameters made inside go to the meta device as they are registered, before any
    initializer fills them (as accelerate's ``init_empty_weights(include_buffers=False)``);
    buffers, such as rotary frequencies, are made for real."""
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _config_dtype(config: dict) -> torch.dtype:
    value = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    if value == "auto":
        value = "bfloat16"
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if dtype not in _MODEL_DTYPES:
        raise ValueError(f"config.json: dtype {value!r}: expected one of {_MODEL_DTYPES}")
    return dtype


def _ties_output_embeddings(model: nn.Module) -> bool:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", False))


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent, _, attr = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr


def _parse_device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise TypeError(f"device must be None, a str, an int or a torch.device, got {device!r}")
    try:
        # (an int is a CUDA device's index, as in torch.cuda)
        parsed = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device {device!r} is not a torch device, e.g. 'cpu' or 'cuda:0'"
        ) from None
    if parsed.type == "meta":
        raise ValueError("device 'meta' holds no data: load to a real device")
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: FP4 layers run on the CPU or on CUDA devices")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (parsed.index is not None and parsed.index >= count):
            raise ValueError(f"device {device!r}: this machine has {count} CUDA device(s)")
        if parsed.index is None:
            parsed = torch.device("cuda", torch.cuda.current_device())
    return parsed


def load_quantized(
    path: str | os.PathLike,
    device: str | torch.device | None = None,
    activations: str | None = None,
    *,
    revision: str | None = None,
) -> nn.Module:
    """A transformers causal LM, in eval mode, from a folder holding a compressed-tensors
    (``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``) or ModelOpt (``NVFP4`` /
    ``W4A16_NVFP4``) checkpoint, its quantized Linear modules as ``FP4Linear``, or a gpt-oss
    MXFP4 one (``quant_method: mxfp4``), its experts modules as ``FP4Experts`` (W4A16 unless
    the checkpoint or ``activations`` asks for W4A4).

    ``path`` may also be a Hugging Face Hub repository id (``"org/name"``, at ``revision``)
    that is no local path: ``checkpoint_folder`` fetches the files this function reads into
    huggingface_hub's cache (or finds them there: ``HF_HUB_OFFLINE=1`` works offline).

    The model is built by ``AutoModelForCausalLM.from_config`` with its parameters on the meta
    device (no 16-bit weight is made or initialized for a quantized layer); the checkpoint's
    FP4 tensors go straight into the FP4Linear buffers, everything else loads in the config's
    dtype (bfloat16 where it names none, or where W4A16 layers cannot take it: float32, float16
    with MXFP4 weights; a UserWarning says so), on ``device`` (default CPU; a CPU or a present CUDA
    device, an int naming a CUDA device's index, else ValueError). Tied weights stay tied
    as the model ties them when it is built (its config's ``tie_word_embeddings``); a quantized
    output embedding of a tied config is refused.
    Which Linear modules are quantized: compressed-tensors' ``config_groups`` targets less its
    ``ignore`` list (exact names, ``re:`` regexes, class names, as compressed-tensors matches);
    ModelOpt's every Linear not in ``exclude_modules`` (names or glob patterns). One whose parent
    reads its weight itself (``fp4_ops.nn.weight_reader``, e.g. Mamba's mixers) loads as a
    16-bit Linear holding the dequantized weight (a UserWarning names them).

    ``activations``: None takes the checkpoint's mode: W4A4 with a static input scale
    (FP4Linear ``"static"``) where it stores input scales (NVFP4), W4A4 with per-call scales
    (``"dynamic"``) for MXFP4 W4A4, W4A16 (``"bf16"``) for weight-only checkpoints. ``"bf16"``
    forces W4A16 and ``"dynamic"`` W4A4 with per-call scales (stored input scales are checked,
    then unused); ``"fp4"`` W4A4 for every layer: static where the checkpoint stores input
    scales, per-call scales where it is weight-only. Experts modules (``FP4Experts``) have no
    static-scale W4A4: W4A4 with per-call scales where the checkpoint's experts have dynamic
    input scales or ``activations`` is ``"fp4"`` or ``"dynamic"``, else W4A16; their stored
    input scales are checked, then unused (a UserWarning says so where ``activations`` did not
    ask for that). A declared FP8 KV cache (ModelOpt's ``kv_cache_quant_algo``,
    compressed-tensors' ``kv_cache_scheme``) loads: its scales (one finite, positive number each,
    on a K / V projection or the module holding it) are checked and not used, the KV cache stays
    16-bit (a UserWarning says so).

    ValueError naming the config entry or tensor and what was expected, for: an unsupported
    format or scheme (another group size, asymmetric, dynamic weights, NVFP4 activations without
    a stored global scale, static group scales, output quantization, a KV cache other than
    static per-tensor FP8, transforms, sparsity, a quantized embedding), a config.json
    transformers cannot build a model from, a tensor missing, mis-shaped, of the wrong dtype
    or left over (all checked on the safetensors headers before any tensor is read; what
    transformers' own loading skips for the model, e.g. DeepSeek-V3's multi-token-prediction
    layer, is not read), a global
    or KV-cache scale that is not finite and positive, a NaN or negative block scale (checked
    as they are read). A missing config.json or safetensors file: FileNotFoundError. Nothing
    is returned unless all of it passed. The model refuses ``save_pretrained`` (use
    ``save_quantized``) and, where its lm_head is FP4, ``resize_token_embeddings``.
    """
    if activations not in _LOAD_ACTIVATIONS:
        check_type(activations, str, "activations", f"None or one of {_LOAD_ACTIVATIONS[1:]}")
        raise ValueError(
            f"activations must be None (the checkpoint's mode), 'bf16', 'dynamic' or 'fp4', got "
            f"{activations!r} (static scales come from the checkpoint)"
        )
    device = _parse_device(device)
    transformers = _hf()
    folder = checkpoint_folder(path, revision)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config_dict = _read_json(folder / "config.json")
    _warn_newer_transformers(folder, config_dict, transformers.__version__)
    qconfig = _quant_config(folder, config_dict)
    dtype = _config_dtype(config_dict)
    ck = _Checkpoint(folder, config_dict.get("model_type"))

    model, layers, experts = _build_and_plan(transformers, folder, ck, qconfig, dtype)
    fits = _w4a16_dtype(layers, experts, activations, dtype)
    if fits != dtype:
        why = (
            "W4A16 layers take 16-bit activations"
            if dtype == torch.float32
            else "MXFP4 W4A16 layers take bfloat16 ones (E8M0 scales exceed float16's range)"
        )
        warnings.warn(
            f"{folder / 'config.json'}: dtype {_dtype_str(dtype)}, but {why}: the model loads "
            f"in {_dtype_str(fits)} (activations='fp4' keeps the config's dtype, every layer "
            "W4A4)",
            stacklevel=2,
        )
        dtype = fits
        model, layers, experts = _build_and_plan(transformers, folder, ck, qconfig, dtype)
    planned = [*layers, *experts]
    consumed = {key for layer in planned for key in layer.keys.values()}
    plain = _plan_plain(ck, model, {layer.name for layer in planned})
    consumed.update(n for _, names, _ in plain for n in names if n in ck)
    kv_scales = _plan_kv_scales(ck, model) if qconfig.kv_cache else []
    left = set(ck.keys()) - consumed - set(kv_scales)
    towers = _other_towers(ck.model_type, model, left)
    _refuse_left_over(left - towers - _ignored_by_transformers(model, left), planned)
    _check_kv_scales(ck, kv_scales)

    dequantized = _load(model, ck, device, (layers, experts, plain), activations, dtype)
    if dequantized:
        warnings.warn(
            f"{_listed(dequantized)}: loaded as {_dtype_str(dtype)} Linear layers, their FP4 "
            f"weights dequantized (16-bit inputs), as their parents read their weights "
            f"themselves ({next(iter(dequantized.values()))})",
            stacklevel=2,
        )
    _warn_unused_expert_input_scales(experts, activations)
    if towers:
        warnings.warn(
            f"{_listed(towers)}: not loaded: AutoModelForCausalLM builds the checkpoint's text "
            "model only",
            stacklevel=2,
        )
    if qconfig.kv_cache:
        warnings.warn(
            f"{folder}: the checkpoint declares an {qconfig.kv_cache} KV cache; its "
            f"{len(kv_scales)} KV-cache scales are checked and not used: the KV cache stays "
            f"in {_dtype_str(dtype)}",
            stacklevel=2,
        )
    if (folder / "generation_config.json").is_file() and hasattr(model, "generation_config"):
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder)
    refuse_transformers_methods(model)
    return model.to(device).eval()


def _warn_newer_transformers(folder: Path, config: dict, installed: str) -> None:
    """A UserWarning where config.json was written by a newer major transformers version than
    the installed one, which may read its fields otherwise (and build another model)."""

    def major(version) -> int | None:
        head = str(version).split(".")[0]
        return int(head) if head.isdigit() else None

    written = config.get("transformers_version")
    if major(written) is not None and major(installed) is not None:
        if major(written) > major(installed):
            warnings.warn(
                f"{folder / 'config.json'}: written by transformers {written}, read by "
                f"{installed}, which may read some of its fields otherwise (RoPE parameters, "
                f"expert counts) and build another model: install transformers >= "
                f"{major(written)}",
                stacklevel=3,
            )


#: what checkpoint_folder fetches of a Hub repository besides the weight files: the configs and
#: the tokenizer's files
HUB_FILES = (
    "config.json",
    "generation_config.json",
    "hf_quant_config.json",
    _INDEX_NAME,
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
#: a Hugging Face Hub repository id, org/name
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def checkpoint_folder(path: str | os.PathLike, revision: str | None = None) -> Path:
    """The local folder of a checkpoint: ``path`` itself where it exists (``revision`` must be
    None); else, for a Hub repository id (``"org/name"``), huggingface_hub's snapshot of the
    files ``load_quantized`` reads: ``HUB_FILES`` that the repository has, then the weight
    files (``model.safetensors``, or the shards its index names). FileNotFoundError for a
    missing path that is no repository id; huggingface_hub's errors for the Hub's refusals."""
    check_type(path, (str, os.PathLike), "path", "a str or os.PathLike folder")
    if revision is not None:
        check_type(revision, str, "revision", "None or a str")
    local = Path(path)
    if local.exists():
        if revision is not None:
            raise ValueError(f"revision={revision!r} is for a Hub repository; {local} is a folder")
        return local
    if not isinstance(path, str) or not REPO_ID.fullmatch(path):
        raise FileNotFoundError(f"{path}: no such folder (nor a Hub repository id, org/name)")
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(path, revision=revision, allow_patterns=list(HUB_FILES)))
    weights = [_WEIGHTS_NAME]
    if (folder / _INDEX_NAME).is_file():
        weight_map = _read_json(folder / _INDEX_NAME).get("weight_map")
        names = set(weight_map.values()) if isinstance(weight_map, dict) else set()
        # (exact names: a pattern could also match a copy in a subfolder)
        weights = sorted(n for n in names if isinstance(n, str) and "/" not in n)
    # (the snapshot's commit, so that both sets of files come from one revision)
    return Path(snapshot_download(path, revision=folder.name, allow_patterns=weights))


def _build_and_plan(transformers, folder: Path, ck, qconfig, dtype: torch.dtype) -> tuple:
    """(model on meta, its planned FP4 layers, its planned experts): every check on the
    headers, nothing read yet."""
    model = _build_model(transformers, folder, dtype)
    ck.use_names_of(model)
    _check_not_a_base_model(ck, model)
    # (tied parameters are one object from here on: the model ties them as it is built)
    ties = _ties_output_embeddings(model)
    output = output_embedding(model)
    return model, *_plan_quantized(ck, qconfig, model, output if ties else None)


def _check_not_a_base_model(ck: _Checkpoint, model: nn.Module) -> None:
    """ValueError where the checkpoint names the tensors of ``model``'s base model without its
    prefix (as a base model saved without its head names them), which no name matches."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    if not isinstance(base, nn.Module) or any(k.startswith(f"{prefix}.") for k in ck.keys()):
        return
    children = {name for name, _ in base.named_children()}
    stray = sorted(k for k in ck.keys() if k.partition(".")[0] in children)
    if stray:
        raise ValueError(
            f"{ck.folder}: the checkpoint names {type(base).__name__}'s tensors without "
            f"'{prefix}.' (e.g. {stray[0]}), as a base model saved without its head does; "
            f"load_quantized builds {type(model).__name__}: save the model with its head"
        )


def _w4a16_dtype(layers: list, experts: list, activations, dtype: torch.dtype) -> torch.dtype:
    """``dtype``, or bfloat16 where the planned W4A16 layers cannot take it: float32, or float16
    with MXFP4 weights (E8M0 scales exceed its range)."""
    formats = {layer.scheme.format for layer in layers if _layer_mode(layer, activations) == "bf16"}
    formats.update(
        _experts_format(plan) for plan in experts if _experts_mode(plan, activations) == "bf16"
    )
    if not formats or dtype == torch.bfloat16 or dtype == torch.float16 and formats == {"nvfp4"}:
        return dtype
    return torch.bfloat16


def _layer_mode(layer: _Layer, activations) -> str:
    """The FP4Linear activation mode of a planned layer under ``load_quantized``'s
    ``activations``: the checkpoint's where None; "fp4" keeps stored input scales, else per call."""
    inputs = layer.scheme.inputs
    if activations == "fp4":
        return "dynamic" if inputs == "none" else inputs
    return activations or {"none": "bf16"}.get(inputs, inputs)


def _experts_mode(plan, activations) -> str:
    """The FP4Experts activation mode of planned experts (no static-scale W4A4 there): per call
    where ``activations`` asks for W4A4 or the checkpoint's experts have per-call scales, else
    W4A16."""
    asked = {"fp4": "dynamic"}.get(activations, activations)
    dynamic = isinstance(plan, _LinearExperts) and plan.layers[0][0].scheme.inputs == "dynamic"
    return asked or ("dynamic" if dynamic else "bf16")


def _experts_format(plan) -> str:
    return plan.layers[0][0].scheme.format if isinstance(plan, _LinearExperts) else "mxfp4"


def _build_model(transformers, folder: Path, dtype: torch.dtype) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` of the folder's config.json, parameters on the meta
    device; ValueError naming config.json where transformers cannot build what it describes."""
    try:
        config = transformers.AutoConfig.from_pretrained(folder)
        with _parameters_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        _remake_buffers(model)
        return model
    except (ImportError, OSError, MemoryError, torch.OutOfMemoryError):
        raise  # (a model class that needs another package; files; memory: not the config)
    except Exception as err:  # (transformers' config and module checks raise several types)
        text = " ".join(str(err).split())  # (one line: some of them span several)
        raise ValueError(
            f"{folder / 'config.json'}: transformers cannot build the model it describes: "
            f"{type(err).__name__}: {text}"
        ) from err


def _plan_quantized(ck: _Checkpoint, qconfig, model: nn.Module, tied_output) -> tuple:
    """(the FP4 Linear layers, the experts modules) the checkpoint quantizes, their tensors
    checked on the headers; ``tied_output`` the output embedding where the config ties it."""
    layers: list[_Layer] = []
    for name, module in model.named_modules():
        scheme = qconfig.scheme_for(ck.stored_names(name), module)
        if scheme is None:
            continue
        if isinstance(module, nn.Embedding):
            raise ValueError(
                f"{name}: {scheme.describe()} covers this {type(module).__name__}; FP4 "
                "checkpoints load into nn.Linear modules only"
            )
        if not isinstance(module, nn.Linear):
            continue  # (as compressed-tensors: a container that a pattern matches)
        if module is tied_output:
            raise ValueError(
                f"{name}: the checkpoint quantizes the output embedding, but the config ties it "
                "to the input embedding (tie_word_embeddings)"
            )
        layers.append(_plan_layer(ck, name, module, scheme))
    experts: list = [
        _plan_experts(ck, name, module)
        for name, module in model.named_modules()
        if qconfig.quantizes_experts(name, module)
    ]
    if qconfig.checkpoint != GPT_OSS_MXFP4:
        for name, module in model.named_modules():
            if is_experts_module(module):
                plan = _plan_linear_experts(ck, qconfig, model, name, module)
                experts += [] if plan is None else [plan]
    return layers, experts


def _plan_plain(ck: _Checkpoint, model: nn.Module, quantized: set[str]) -> list[tuple]:
    """(checkpoint keys, the model's names for it, its tensor) of every other parameter and
    persistent buffer, grouped by tensor (tied names share one: every key the checkpoint holds
    for them, the first read, the others compared with it), checked on the headers."""

    def in_quantized(name: str) -> bool:
        return name.rpartition(".")[0] in quantized

    aliases: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for name, t in model.named_parameters(remove_duplicate=False):
        if not in_quantized(name):
            aliases.setdefault(id(t), (t, []))[1].append(name)
    for name, t in model.named_buffers(remove_duplicate=False):
        owner, attr = _owner(model, name)
        if not in_quantized(name) and attr not in owner._non_persistent_buffers_set:
            aliases.setdefault(id(t), (t, []))[1].append(name)
    plain: list[tuple[list[str], list[str], torch.Tensor]] = []
    for t, names in aliases.values():
        present = [n for n in names if n in ck]
        if not present:
            raise ValueError(
                f"{names[0]}: missing from the checkpoint; expected {_dtype_str(t.dtype)} "
                f"{_shape_str(t.shape)}"
            )
        for n in present:
            if t.is_floating_point():
                _expect(ck, n, (), (tuple(t.shape),), f"{names[0]}")
            else:
                _expect(ck, n, (t.dtype,), (tuple(t.shape),), f"{names[0]}")
        plain.append((present, names, t))
    return plain


#: the parts of vision-language checkpoints that AutoModelForCausalLM leaves out (its text model)
_OTHER_TOWERS = {"llama4": ("vision_model", "multi_modal_projector")}


def _other_towers(model_type: str | None, model: nn.Module, keys: set[str]) -> set[str]:
    """The ``keys`` of the parts of a vision-language checkpoint that ``model``, its text model,
    does not hold (``_OTHER_TOWERS``)."""
    towers = set(_OTHER_TOWERS.get(model_type, ())) - {n for n, _ in model.named_children()}
    return {key for key in keys if key.partition(".")[0] in towers}


def _ignored_by_transformers(model: nn.Module, keys: set[str]) -> set[str]:
    """The ``keys`` that transformers' own loading drops for ``model`` (``re.search``, as it
    matches them): its modules' ``_keys_to_ignore_on_load_unexpected`` (multi-token-prediction
    layers: DeepSeek-V3's ``model.layers.61``, Qwen3-Next's ``mtp``; transformers 4.x sets some
    on the inner model only) and buffers that older checkpoints stored (``rotary_emb.inv_freq``,
    ``position_ids``)."""
    patterns = []
    for module in model.modules():
        found = getattr(module, "_keys_to_ignore_on_load_unexpected", None)
        if isinstance(found, (list, tuple, set, frozenset)):
            patterns += [p for p in found if isinstance(p, str)]
    buffers = [name for name, _ in model.named_buffers()]
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        patterns.append(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        patterns.append(r"(^|\.)position_ids$")
    if not patterns:
        return set()
    ignored = re.compile("|".join(f"({p})" for p in patterns))
    return {key for key in keys if ignored.search(key)}


def _refuse_left_over(left: set[str], planned: list) -> None:
    """ValueError naming the checkpoint's tensors that no module takes, by layer if one's."""
    for layer in planned:
        prefix = f"{layer.name}."
        extra = {k for k in left if k.startswith(prefix)}
        if extra:
            what = layer.scheme.describe() if isinstance(layer, _Layer) else "FP4 experts"
            raise ValueError(
                f"{_listed(extra)}: unexpected for {layer.name}, a {what} layer (its tensors: "
                f"{', '.join(sorted(layer.keys.values()))})"
            )
    if left:
        raise ValueError(f"unexpected tensors that no module of the model holds: {_listed(left)}")


#: KV-cache scales: ModelOpt's on the K and V projections, compressed-tensors' on the attention
_KV_SCALE = re.compile(r"(?P<owner>.+)\.(?P<which>[kv])_scale")


def _plan_kv_scales(ck: _Checkpoint, model: nn.Module) -> list[str]:
    """The checkpoint's FP8 KV-cache scales (``{k,v}_proj.{k,v}_scale`` or ``{k,v}_scale`` on a
    module holding that projection), one number each, checked on the headers."""
    modules = dict(model.named_modules())
    found = []
    for key in ck.keys():
        m = _KV_SCALE.fullmatch(key)
        if m is None or m["owner"] not in modules:
            continue
        owner, proj = m["owner"], f"{m['which']}_proj"
        if owner.rpartition(".")[2] != proj and f"{owner}.{proj}" not in modules:
            continue
        _expect(ck, key, (), ((), (1,)), "an FP8 KV-cache scale")
        found.append(key)
    return sorted(found)


def _check_kv_scales(ck: _Checkpoint, keys: list[str]) -> None:
    """ValueError naming a KV-cache scale that is not finite and positive."""
    if not keys:
        return
    with ck.reader(torch.device("cpu")) as read:
        for key in keys:
            check_global_scale_value(read(key).float(), key)


def _load(model: nn.Module, ck: _Checkpoint, device, planned: tuple, activations, dtype) -> dict:
    """Reads the planned tensors and sets the FP4 layers, the experts and the other tensors:
    {name: why} of the quantized Linears that stay Linears, dequantized (``weight_reader``)."""
    layers, experts, plain = planned
    dequantized = {}
    with torch.no_grad(), ck.reader(device) as read:
        for layer in layers:
            tensors = {key: read(key) for key in layer.keys.values()}
            owner, attr = _owner(model, layer.name)
            linear = getattr(owner, attr)
            why = weight_reader(linear, attr, owner)
            if why is not None:
                _dequantize_into(linear, layer, tensors, dtype)
                dequantized[layer.name] = why
                continue
            act = _layer_mode(layer, activations)
            setattr(owner, attr, _build_layer(layer, tensors, act, dtype))
        for plan in experts:
            tensors = {key: read(key) for key in plan.keys.values()}
            owner, attr = _owner(model, plan.name)
            mode = _experts_mode(plan, activations)
            if isinstance(plan, _LinearExperts):
                setattr(owner, attr, _build_linear_experts(plan, tensors, mode))
            else:
                setattr(owner, attr, _build_experts(plan, tensors, mode, dtype))
        for (key, *tied), names, t in plain:
            value = read(key)
            for other in tied:
                if not torch.equal(read(other), value):
                    raise ValueError(
                        f"{other}: differs from {key} in the checkpoint, and the model ties "
                        "them (tie_word_embeddings): one tensor cannot hold both"
                    )
            value = value.to(t.dtype) if t.is_floating_point() else value
            if isinstance(t, nn.Parameter):
                value = nn.Parameter(value, requires_grad=False)
            for name in names:
                owner, attr = _owner(model, name)
                setattr(owner, attr, value)
    return dequantized


# ----------------------------------------------------------------------------- save


def _fp4_layers(model: nn.Module) -> dict[str, FP4Linear]:
    return {
        n: m for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, FP4Linear)
    }


def _inputs_of(name: str, layer: FP4Linear, activations: str | None) -> str:
    """The activation mode that ``layer`` is saved with: "static", "dynamic" or "none"."""
    if activations == "bf16" or layer.activations == "bf16":
        return "none"
    if layer.activations == "dynamic" and layer.format == "nvfp4":
        raise ValueError(
            f"{name}: NVFP4 activations with dynamic (per-call) global scales have no checkpoint "
            "form (compressed-tensors and ModelOpt store a calibrated static input scale): "
            "fp4_ops.calibrate(model, forward_loop) gives the layers one; or pass "
            "activations='bf16' to save a weight-only (W4A16) checkpoint (load it back with "
            "activations='dynamic' for W4A4)"
        )
    return layer.activations


def _layer_tensors(prefix: str, layer: FP4Linear | FP4Tensor, inputs: str, format: str) -> dict:
    """One quantized Linear's tensors: an FP4Linear's, or a per-expert weight's (no bias, no
    static input scale)."""
    w = layer if isinstance(layer, FP4Tensor) else layer.weight
    out = {}
    if format == "modelopt":
        out[prefix + "weight"] = w.data.view(torch.uint8)
        out[prefix + "weight_scale"] = w.plain_scales()
        out[prefix + "weight_scale_2"] = w.global_scale.reshape(())
        if inputs == "static":
            out[prefix + "input_scale"] = layer.input_global_scale.reshape(())
    else:
        out[prefix + "weight_packed"] = w.data.view(torch.uint8)
        if w.format == "nvfp4":
            out[prefix + "weight_scale"] = w.plain_scales()
            out[prefix + "weight_global_scale"] = (1.0 / w.global_scale).reshape(1)
        elif not bool((w.global_scale == 1.0).all()):
            where = prefix.rstrip(".")
            raise ValueError(
                f"{where}: an MXFP4 global scale other than 1 has no compressed-tensors form"
            )
        else:  # (E8M0 bytes, as compressed-tensors stores them)
            out[prefix + "weight_scale"] = w.plain_scales().view(torch.uint8)
        if inputs == "static":
            out[prefix + "input_global_scale"] = (1.0 / layer.input_global_scale).reshape(1)
    if isinstance(layer, FP4Linear) and layer.bias is not None:
        out[prefix + "bias"] = layer.bias
    return out


def _experts_layers(model: nn.Module) -> dict[str, FP4Experts]:
    return {
        n: m for n, m in model.named_modules(remove_duplicate=False) if isinstance(m, FP4Experts)
    }


def _check_silu_experts(name: str, experts: FP4Experts) -> None:
    """ValueError unless ``experts`` can be written as per-expert gate / up / down Linears."""
    if experts.activation != "silu":
        raise ValueError(
            f"{name}: FP4Experts with the {experts.activation!r} activation; save_quantized "
            "writes SiLU experts (as per-expert gate / up / down Linears) only"
        )
    if experts.w13_bias is not None or experts.w2_bias is not None:
        raise ValueError(
            f"{name}: SiLU FP4Experts with biases; the per-expert Linears save_quantized "
            "writes have none, and the checkpoint would compute another layer"
        )


def _expert_linear_names(name: str, experts: FP4Experts) -> list[str]:
    return [
        f"{name}.{e}.{proj}"
        for e in range(experts.num_experts)
        for proj in ("gate_proj", "up_proj", "down_proj")
    ]


def _host_weights(experts: FP4Experts, which: str) -> FP4Tensor:
    """``experts.expert_weights(which)`` copied to the host (one module's worth at a time: a
    W4A16 module's plain copy is made on its device)."""
    w = experts.expert_weights(which)
    parts = (t.detach().to("cpu") for t in (w.data, w.scale, w.global_scale))
    return FP4Tensor.unchecked(*parts, w.format)


def _expert_linears(name: str, experts: FP4Experts) -> dict[str, FP4Tensor]:
    """``{name}.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` of SiLU experts as FP4Tensors on
    the host (gate and up: w13's two row halves, sharing the expert's global scale)."""
    w13, w2 = _host_weights(experts, "w13"), _host_weights(experts, "w2")
    i = experts.intermediate
    plain13, plain2 = w13.plain_scales(), w2.plain_scales()
    out = {}
    for e in range(experts.num_experts):
        gs13, gs2 = (
            w13.global_scale.expand(experts.num_experts)[e],
            w2.global_scale.expand(experts.num_experts)[e],
        )
        for proj, rows in (("gate_proj", slice(0, i)), ("up_proj", slice(i, 2 * i))):
            data, scales = w13.data[e, rows], plain13[e, rows]
            out[f"{name}.{e}.{proj}"] = FP4Tensor.from_plain(data, scales, gs13, w13.format)
        out[f"{name}.{e}.down_proj"] = FP4Tensor.from_plain(w2.data[e], plain2[e], gs2, w2.format)
    return out


def _gpt_oss_tensors(name: str, experts: FP4Experts) -> dict[str, torch.Tensor]:
    """An FP4Experts in gpt-oss's MXFP4 layout: blocks [E, rows, K/32, 16], E8M0 scale bytes
    [E, rows, K/32] and the biases (zeros where it has none), per projection."""
    if experts.format != "mxfp4" or experts.activation != "swigluoai":
        raise ValueError(
            f"{name}: gpt-oss MXFP4 checkpoints hold MXFP4 experts with gpt-oss's SwiGLU; these "
            f"are {experts.format} with {experts.activation!r}"
        )
    out = {}
    for proj, w, bias in (
        ("gate_up_proj", _host_weights(experts, "w13"), experts.w13_bias),
        ("down_proj", _host_weights(experts, "w2"), experts.w2_bias),
    ):
        if not bool((w.global_scale == 1.0).all()):
            raise ValueError(f"{name}: an MXFP4 global scale other than 1 has no gpt-oss form")
        e, rows, k = w.shape
        out[f"{name}.{proj}_blocks"] = w.data.view(torch.uint8).reshape(e, rows, k // 32, 16)
        out[f"{name}.{proj}_scales"] = w.plain_scales().view(torch.uint8)
        if bias is None:
            bias = torch.zeros((e, rows), dtype=torch.bfloat16)
        out[f"{name}.{proj}_bias"] = bias.detach().to("cpu")
    return out


def _ct_quantization_config(modes: dict[str, tuple[str, str]], ignore: list[str]) -> dict:
    """compressed-tensors' quantization_config for layers name -> (format, inputs)."""
    by_scheme: dict[tuple[str, str], list[str]] = {}
    for name, scheme in modes.items():
        by_scheme.setdefault(scheme, []).append(name)
    groups = {}
    for i, ((fp4, inputs), names) in enumerate(sorted(by_scheme.items())):
        args = {
            "num_bits": 4,
            "type": "float",
            "symmetric": True,
            "group_size": FORMATS[fp4],
            "strategy": _CT_STRATEGY[fp4],
            "dynamic": False,
            "scale_dtype": _CT_SCALE_DTYPE[fp4],
        }
        input_args = None
        if inputs != "none":
            input_args = {**args, "dynamic": "local" if inputs == "static" else True}
        groups[f"group_{i}"] = {
            "targets": ["Linear"] if len(by_scheme) == 1 else sorted(names),
            "weights": args,
            "input_activations": input_args,
            "output_activations": None,
            "format": _CT_FORMAT_OF[fp4],
        }
    formats = {g["format"] for g in groups.values()}
    return {
        "quant_method": "compressed-tensors",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
        "global_compression_ratio": None,
    }


def _write_safetensors(folder: Path, tensors: dict, max_shard_size: int | None) -> None:
    from safetensors.torch import save_file

    for stale in folder.iterdir():
        if stale.name in (_WEIGHTS_NAME, _INDEX_NAME) or _SHARD.fullmatch(stale.name):
            stale.unlink()
    shards: list[dict] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_size is not None and shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], folder / _WEIGHTS_NAME, metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / name, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(folder / _INDEX_NAME, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def save_quantized(
    model: nn.Module,
    path: str | os.PathLike,
    format: str = "compressed-tensors",
    *,
    tokenizer=None,
    activations: str | None = None,
    max_shard_size: int | None = None,
) -> None:
    """Write a transformers model whose quantized layers are FP4Linear and FP4Experts
    (``quantize_model``, ``load_quantized``) as a checkpoint that ``load_quantized`` (and
    vLLM-style loaders) read: safetensors, ``config.json`` with the format's quantization config
    (``format="compressed-tensors"``, or ``"gpt-oss-mxfp4"``: MXFP4 experts with gpt-oss's
    SwiGLU and nothing else quantized) or ``hf_quant_config.json`` (``"modelopt"``), the model's
    generation config, and ``tokenizer``'s files when one is given. FP4Experts with SiLU are
    written as per-expert Linears (``{experts}.{e}.gate_proj`` / ``up_proj`` / ``down_proj``).

    Modes: NVFP4 W4A4 with a static input scale -> compressed-tensors ``NVFP4`` (input
    ``dynamic: local``) / ModelOpt ``NVFP4``; W4A16 -> ``NVFP4A16`` / ``W4A16_NVFP4`` (and
    compressed-tensors ``MXFP4A16``); MXFP4 W4A4 (per-call scales) -> compressed-tensors
    ``MXFP4``. NVFP4 W4A4 with dynamic global scales (``quantize_model``'s default) has no
    checkpoint form: ValueError, unless ``activations="bf16"``, which saves every layer
    weight-only (load back with ``activations="dynamic"`` for W4A4 again). ModelOpt holds NVFP4
    only, one mode for all layers (an MXFP4 or mixed model: ValueError).

    Global scales: ModelOpt stores ours; compressed-tensors their fp32 reciprocals, which come
    back as ``1 / (1 / g)``: the same value, or one fp32 ulp from it for some (about one in
    seven). Tied 16-bit tensors are stored once; a tied output embedding that is now an
    FP4Linear is saved untied (``tie_word_embeddings: false``); config.json's dtype is that of
    the 16-bit tensors. ``max_shard_size`` (bytes): shards
    ``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``; earlier weight
    files of those names in the folder are removed first.
    """
    _check_save_arguments(model, path, format, activations, max_shard_size, tokenizer)
    _hf()
    layers = _fp4_layers(model)
    experts = _experts_layers(model)
    if not layers and not experts:
        raise ValueError(
            "model has no FP4Linear or FP4Experts: nothing quantized (use save_pretrained)"
        )
    gpt_oss = {}
    if format == GPT_OSS_MXFP4:
        if layers:
            raise ValueError(
                f"{next(iter(layers))}: gpt-oss MXFP4 checkpoints hold FP4 experts only, this "
                "model has FP4Linear layers too (save it as compressed-tensors)"
            )
        gpt_oss = {k: v for n, m in experts.items() for k, v in _gpt_oss_tensors(n, m).items()}
    modes = _save_modes(layers, experts, format, activations)
    _warn_unshared_scales(layers, modes)
    tensors, floats = _checkpoint_tensors(model, layers, experts, modes, format, gpt_oss)
    # (the model type's own checkpoint names, where transformers renames them; a model that
    # already names its modules so, e.g. Qwen3.5's vision-language model, keeps its names)
    kind = getattr(model.config, "model_type", None)
    kind = None if _spelled_as_stored(kind, model) else kind
    tensors = {
        _respelled(k, kind, to_model=False): t.detach().to("cpu").contiguous()
        for k, t in tensors.items()
    }
    config_dict, hf_quant_config = _checkpoint_configs(model, layers, modes, floats, format, kind)

    # (everything checked: now it is written)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant_config is None:
        hf_quant.unlink(missing_ok=True)
    else:
        with open(hf_quant, "w") as f:
            json.dump(hf_quant_config, f, indent=2)
            f.write("\n")
    _write_safetensors(folder, tensors, max_shard_size)
    with open(folder / "config.json", "w") as f:
        json.dump(config_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    generation_config = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", lambda: generation_config is not None)
    if generation_config is not None and can_generate():
        generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _warn_unshared_scales(layers: dict[str, FP4Linear], modes: dict) -> None:
    """A UserWarning naming the NVFP4 layers that serving engines run as one GEMM
    (``FUSED_SIBLINGS``) but that hold different global scales: vLLM and SGLang take the
    largest for all of them, which scales the others' values."""
    unshared = []
    for names in fused_groups(n for n, layer in layers.items() if layer.format == "nvfp4"):
        weight = {float(layers[n].weight_global_scale) for n in names}
        inputs = {float(layers[n].input_global_scale) for n in names if modes[n][1] == "static"}
        if len(weight) > 1 or len(inputs) > 1:
            unshared.append(", ".join(names))
    if unshared:
        warnings.warn(
            f"{'; '.join(unshared)}: layers that vLLM and SGLang run as one GEMM hold different "
            "global scales; those engines take the largest for all of them, which scales the "
            "others' values (quantize_model gives such layers one weight scale)",
            stacklevel=3,
        )


def _check_save_arguments(model, path, format, activations, max_shard_size, tokenizer) -> None:
    """``save_quantized``'s argument checks (the model's contents are checked later)."""
    check_type(model, nn.Module, "model", "an nn.Module (a transformers model)")
    check_type(path, (str, os.PathLike), "path", "a str or os.PathLike folder")
    check_type(format, str, "format", f"one of {CHECKPOINT_FORMATS}")
    if format not in CHECKPOINT_FORMATS:
        raise ValueError(f"format must be one of {CHECKPOINT_FORMATS}, got {format!r}")
    if activations not in (None, "bf16"):
        raise ValueError(
            f"activations must be None (as the layers are) or 'bf16', got {activations!r}"
        )
    if max_shard_size is not None and (
        isinstance(max_shard_size, bool)
        or not isinstance(max_shard_size, int)
        or max_shard_size < 1
    ):
        raise ValueError(
            f"max_shard_size must be None or a positive int (bytes), got {max_shard_size!r}"
        )
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(
            "tokenizer must be None or have save_pretrained (a transformers tokenizer or "
            f"processor), got {type(tokenizer).__name__}"
        )
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ValueError("model has no transformers config (model.config): config.json needs one")


def _save_modes(layers: dict, experts: dict, format: str, activations: str | None):
    """name -> (format, inputs) of every quantized Linear, FP4Experts' per-expert Linears
    included, refusing what ``format`` cannot hold."""
    modes = {}
    for name, layer in layers.items():
        if format == "modelopt" and layer.format != "nvfp4":
            raise ValueError(f"{name}: ModelOpt checkpoints hold NVFP4 only, this layer is mxfp4")
        modes[name] = (layer.format, _inputs_of(name, layer, activations))
    for name, module in experts.items() if format != GPT_OSS_MXFP4 else ():
        if format == "modelopt" and module.format != "nvfp4":
            raise ValueError(f"{name}: ModelOpt checkpoints hold NVFP4 only, these are mxfp4")
        inputs = "none" if activations == "bf16" or module.activations == "bf16" else "dynamic"
        if inputs == "dynamic" and module.format == "nvfp4":
            raise ValueError(
                f"{name}: NVFP4 experts with dynamic (per-call) activation scales have no "
                "checkpoint form: quantize them W4A16 (quantize_model(model, ['*.experts'], "
                "activations='bf16')), or pass activations='bf16' to save every layer "
                "weight-only"
            )
        _check_silu_experts(name, module)
        modes.update(dict.fromkeys(_expert_linear_names(name, module), (module.format, inputs)))
    return modes


def _checkpoint_tensors(model, layers, experts, modes, format: str, gpt_oss):
    """(the checkpoint's tensors on the host, each module's copied there before the next
    one's are made: the experts' (per-expert Linears, or gpt-oss's), then the rest in
    state-dict order, a tensor shared by several names stored once; the dtypes of the 16-bit
    tensors, one per tensor)."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set = set()
    floats: list[torch.dtype] = []
    for name, module in experts.items() if format != GPT_OSS_MXFP4 else ():
        for linear, weight in _expert_linears(name, module).items():
            tensors.update(_layer_tensors(f"{linear}.", weight, modes[linear][1], format))
    tensors.update(gpt_oss)
    for name, module in _state_modules(model, set(experts) | set(layers)):
        prefix = f"{name}." if name else ""
        if name in layers:
            parts = _layer_tensors(prefix, layers[name], modes[name][1], format).items()
            tensors.update((k, v.detach().to("cpu")) for k, v in parts)
            del parts  # (before the next layer's copy is made)
            continue
        if name in experts:
            continue
        own: dict = {}
        module._save_to_state_dict(own, prefix, True)
        for key, t in own.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(
                    f"{key}: not a tensor ({type(t).__name__}), safetensors holds tensors"
                )
            identity = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.device)
            if identity in seen and t.numel():
                continue
            seen.add(identity)
            tensors[key] = t.detach().to("cpu")
            if t.is_floating_point():
                floats.append(t.dtype)
    return tensors, floats


def _state_modules(model: nn.Module, fp4: set[str]):
    """(name, module) in ``model.state_dict``'s order, each name of a shared module, without
    descending into the FP4 modules named in ``fp4`` (whose state-dict form would make every
    W4A16 module's plain copy at once)."""
    for name, module in model.named_modules(remove_duplicate=False):
        parts = name.split(".")
        if not any(".".join(parts[:i]) in fp4 for i in range(1, len(parts))):
            yield name, module


def _linear_like(module: nn.Module) -> bool:
    """An nn.Linear, or a module that another transformers version builds as one: a 2-D weight
    of its own that is no embedding (an MoE router, an nn.Linear in transformers 4.x)."""
    weight = module._parameters.get("weight")
    linear = isinstance(weight, torch.Tensor) and weight.ndim == 2
    return isinstance(module, nn.Linear) or linear and not isinstance(module, nn.Embedding)


def _checkpoint_configs(model, layers, modes, floats, format: str, kind: str | None):
    """(config.json's dict with the format's quantization config, hf_quant_config.json's dict
    or None); module names as model type ``kind``'s checkpoints spell them."""
    modes = {_respelled(name, kind, to_model=False): mode for name, mode in modes.items()}
    unquantized = sorted(
        _respelled(n, kind, to_model=False)
        for n, m in model.named_modules(remove_duplicate=False)
        if _linear_like(m) and n not in layers
    )
    # (16-bit experts modules: every reader would take their per-expert Linears as quantized)
    plain_experts = sorted(
        _respelled(n, kind, to_model=False)
        for n, m in model.named_modules(remove_duplicate=False)
        if is_experts_module(m)
    )
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    output = output_embedding(model)
    if isinstance(output, FP4Linear):
        # (quantize_model untied a tied output embedding: the checkpoint holds both)
        for d in (config_dict, config_dict.get("text_config")):
            if isinstance(d, dict) and d.get("tie_word_embeddings"):
                d["tie_word_embeddings"] = False
    if floats:
        dtype = max(set(floats), key=floats.count)
        key = "dtype" if "dtype" in config_dict else "torch_dtype"
        config_dict[key] = _dtype_str(dtype)
    if format == "compressed-tensors":
        ignore = unquantized + [f"re:^{re.escape(n)}\\." for n in plain_experts]
        config_dict["quantization_config"] = _ct_quantization_config(modes, ignore)
        return config_dict, None
    if format == GPT_OSS_MXFP4:
        config_dict["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": unquantized + plain_experts,
        }
        return config_dict, None
    inputs = {m[1] for m in modes.values()}
    if len(inputs) > 1:
        raise ValueError(
            "ModelOpt checkpoints have one mode: these layers mix W4A4 (static) and W4A16; "
            "pass activations='bf16' for a W4A16_NVFP4 checkpoint"
        )
    quantization = {
        "quant_algo": "NVFP4" if inputs == {"static"} else "W4A16_NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": FORMATS["nvfp4"],
        "exclude_modules": unquantized + [f"{n}.*" for n in plain_experts],
    }
    producer = {"name": "fp4_ops", "version": _version()}
    return config_dict, {"producer": producer, "quantization": quantization}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fp4-ops")
    except PackageNotFoundError:
        return "unknown"
