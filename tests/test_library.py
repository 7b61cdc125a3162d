# SPDX-License-Identifier: BSD-3-Clause
"""fp4_ops as a PyTorch library, on the CPU (issue 39): FP4Linear through casts, moves, copies,
pickling and checkpoints; quantize_model on torch's and Hugging Face-style transformer blocks;
the state dict's refusals; global scales that would give a silent wrong result; the blocked
scale layout told apart by its shape; leading dimensions, input strides and empty inputs; layers
that share no storage with their source; FP4Linear and FP4MoE loading state dicts as nn.Module
does (pre-hooks, assign, cast biases, all FP4 parts or none); the inference-only backward;
and the type and value checks of every public argument.

Every layer output is held bit for bit against ``reference.py`` (the CPU path is exact: the
same products and the same fp32 sums), computed from the float layer the FP4 one was made of.
"""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

import fp4_ops
import reference
from fp4_ops import FP4Linear, FP4Tensor
from fp4_ops.ops import gemm_op, gemm_w4a16_op, quantize_op

#: (format, activations) of every kind of FP4Linear (static activation scales: NVFP4 only)
LAYER_KINDS = [
    ("nvfp4", "dynamic"),
    ("nvfp4", "static"),
    ("nvfp4", "bf16"),
    ("mxfp4", "dynamic"),
    ("mxfp4", "bf16"),
]
STATIC_GS = 0.004
VEC = fp4_ops.FORMATS
needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200): every kind of layer has its kernels there",
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _linear(k: int = 64, n: int = 48, seed: int = 0, bias: bool = True) -> nn.Linear:
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=_gen(seed)) * 0.1)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=_gen(seed + 1000)))
    return lin


def _layer(lin: nn.Linear, fmt: str, mode: str, gs: float = STATIC_GS) -> FP4Linear:
    return FP4Linear.from_linear(lin, fmt, mode, gs if mode == "static" else None)


def _dtype(mode: str) -> torch.dtype:
    """The activations' dtype a layer of this mode takes in these tests."""
    return torch.bfloat16 if mode == "bf16" else torch.float32


def _x(shape, dtype=torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed)).to(dtype)


def _reference_quantize(x: torch.Tensor, fmt: str, gs=None):
    """(packed, plain scales, global scale) by reference.py."""
    if fmt == "nvfp4":
        return reference.quantize_nvfp4(x, gs)
    data, scales = reference.quantize_mxfp4(x)
    return data, scales, torch.tensor(1.0)


def _reference_linear(lin: nn.Linear, fmt: str, mode: str, x: torch.Tensor, wgs=None):
    """What FP4Linear.from_linear(lin, fmt, mode, weight_global_scale=wgs) gives for x, by
    reference.py alone: the float weight quantized there, x's rows quantized there (W4A4) or
    taken as they are (W4A16), the GEMM in x's dtype, plus the bias in x's dtype."""
    vec, n, k = VEC[fmt], lin.out_features, lin.in_features
    wd, ws, wg = _reference_quantize(lin.weight.detach(), fmt, wgs)
    rows = x.reshape(-1, k)
    if mode == "bf16":
        y = reference.reference_gemm_w4a16(rows, wd, ws, vec, wg, x.dtype)
    else:
        xd, xs, xg = _reference_quantize(rows, fmt, STATIC_GS if mode == "static" else None)
        y = reference.reference_gemm(xd, wd, xs, ws, vec, xg * wg, x.dtype)
    if lin.bias is not None:
        y = y + lin.bias.detach().to(x.dtype)
    return y.reshape(*x.shape[:-1], n)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor as comparable values (one-byte dtypes as their bytes; torch.equal has no
    float8 kernel)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in module.state_dict().items() if isinstance(t, torch.Tensor)}


def _two_layers(fmt: str, mode: str, seed: int = 2) -> nn.Sequential:
    return nn.Sequential(
        _layer(_linear(64, 96, seed), fmt, mode),
        nn.ReLU(),
        _layer(_linear(96, 48, seed + 1), fmt, mode),
    )


# ----------------------------------------------------------------------------- casts and moves

CASTS = {
    "to(bfloat16)": (lambda m: m.to(torch.bfloat16), torch.bfloat16),
    "half": (lambda m: m.half(), torch.float16),
    "bfloat16": (lambda m: m.bfloat16(), torch.bfloat16),
    "float": (lambda m: m.float(), torch.float32),
    "to(cpu, bfloat16)": (lambda m: m.to("cpu", torch.bfloat16), torch.bfloat16),
}


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_casts_keep_the_fp4_parts_and_cast_bias_and_output(fmt, mode, cast):
    """A cast model's FP4 buffers keep their dtypes and bytes, its bias takes the dtype, and its
    forward is the uncast model's at the cast input (which is reference.py's)."""
    apply, dtype = CASTS[cast]
    model = _two_layers(fmt, mode)
    buffers = dict(model.named_buffers())
    cast_model = apply(copy.deepcopy(model))
    for name, b in cast_model.named_buffers():
        assert _same(b, buffers[name]), name
    assert {p.dtype for p in cast_model.parameters()} == {dtype}
    x = _x((2, 5, 64), dtype)
    if mode == "bf16" and (dtype == torch.float32 or (dtype == torch.float16 and fmt == "mxfp4")):
        with pytest.raises(ValueError, match="x of a W4A16 layer must be|bfloat16 activations"):
            cast_model(x)
        return
    y = cast_model(x)
    assert y.dtype == dtype and torch.equal(y, model(x))
    want = _reference_linear(_linear(64, 96, 2), fmt, mode, x)
    assert torch.equal(cast_model[0](x), want)


@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_device_moves_move_the_fp4_parts(fmt, mode):
    """.to(device) moves every FP4 buffer (the meta device stands in for a GPU here), keeping
    its dtype; with a dtype too, only the bias is cast."""
    model = _two_layers(fmt, mode)
    buffers = dict(model.named_buffers())
    for to, bias_dtype in (
        (lambda m: m.to("meta"), torch.float32),
        (lambda m: m.to(torch.device("meta"), torch.float16), torch.float16),
    ):
        moved = to(copy.deepcopy(model))
        for name, b in moved.named_buffers():
            assert b.device.type == "meta" and b.dtype == buffers[name].dtype, name
            assert b.shape == buffers[name].shape
        assert {(p.device.type, p.dtype) for p in moved.parameters()} == {("meta", bias_dtype)}
    back = copy.deepcopy(model).to("cpu")
    x = _x((3, 64), _dtype(mode))
    assert torch.equal(back(x), model(x))


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("trip", ["deepcopy", "pickle", "torch.save", "state_dict"])
@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_round_trips_keep_the_layer(fmt, mode, trip, tmp_path):
    """copy.deepcopy, pickle, torch.save / torch.load of the model, and torch.save of its state
    dict loaded with weights_only=True into a model of other weights (and another static
    activation scale): the same buffers, the same forward."""
    model = _two_layers(fmt, mode, seed=3)
    path = tmp_path / "model.pt"
    if trip == "deepcopy":
        other = copy.deepcopy(model)
    elif trip == "pickle":
        other = pickle.loads(pickle.dumps(model))
    elif trip == "torch.save":
        torch.save(model, path)
        other = torch.load(path, weights_only=False)
    else:
        torch.save(model.state_dict(), path)
        other = nn.Sequential(
            _layer(_linear(64, 96, 30), fmt, mode, gs=2 * STATIC_GS),
            nn.ReLU(),
            _layer(_linear(96, 48, 31), fmt, mode, gs=2 * STATIC_GS),
        )
        assert not _same(other[0].weight_scale, model[0].weight_scale)
        other.load_state_dict(torch.load(path, weights_only=True))
    buffers = dict(other.named_buffers())
    assert all(_same(b, buffers[n]) for n, b in model.named_buffers())
    x = _x((4, 64), _dtype(mode))
    assert torch.equal(other(x), model(x))
    assert other[0].get_extra_state() == {"format": fmt, "activations": mode}


@pytest.mark.parametrize("k", [64, 96])  # (96: prepacked rows are padded to 128)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a4_and_w4a16_checkpoints_load_into_each_other(fmt, k):
    """One state-dict naming for both modes (the weight in plain K order): a W4A4 checkpoint
    loads into a W4A16 layer (prepacked at load) and the other way, and each then computes with
    the checkpoint's weight."""
    lin, other = _linear(k, 40, seed=7), _linear(k, 40, seed=8)
    w4a4, w4a16 = _layer(lin, fmt, "dynamic"), _layer(lin, fmt, "bf16")
    assert w4a4.state_dict().keys() == w4a16.state_dict().keys()
    into16 = _layer(other, fmt, "bf16")
    into16.load_state_dict(w4a4.state_dict())
    assert _same(into16.weight_prepacked, w4a16.weight_prepacked)
    x16 = _x((3, k), torch.bfloat16)
    assert torch.equal(into16(x16), _reference_linear(lin, fmt, "bf16", x16))
    into4 = _layer(other, fmt, "dynamic")
    into4.load_state_dict(w4a16.state_dict())
    x = _x((3, k))
    assert torch.equal(into4(x), _reference_linear(lin, fmt, "dynamic", x))


def _drop(key):
    def edit(sd):
        del sd[key]

    return edit


def _set(key, value):
    def edit(sd):
        sd[key] = value

    return edit


def _edited(fmt, mode, key, value, match):
    """A REFUSALS case: a layer's own state dict with ``key`` set to ``value``, loaded strictly
    into a layer of the same kind."""
    layer = (fmt, mode, 48, 64)
    return layer, layer, _set(key, value), True, match


# name -> (checkpoint layer (format, activations, N, K), target layer, edit of the state
# dict, strict, message)
REFUSALS = {
    "format": (
        ("nvfp4", "dynamic", 48, 64),
        ("mxfp4", "dynamic", 48, 64),
        None,
        True,
        "format differs: the checkpoint is nvfp4, this layer mxfp4",
    ),
    "format-by-dtype": (
        ("nvfp4", "dynamic", 48, 64),
        ("mxfp4", "bf16", 48, 64),
        _drop("_extra_state"),
        False,
        "format differs: the checkpoint's weight_scale is torch.float8_e4m3fn",
    ),
    "rows": (("nvfp4", "dynamic", 48, 64), ("nvfp4", "dynamic", 40, 64), None, True, "shape"),
    "columns": (("mxfp4", "bf16", 48, 128), ("mxfp4", "bf16", 48, 64), None, True, "shape"),
    "static-into-dynamic": (
        ("nvfp4", "static", 48, 64),
        ("nvfp4", "dynamic", 48, 64),
        None,
        True,
        "activations differ",
    ),
    "static-into-bf16-without-extra-state": (
        ("nvfp4", "static", 48, 64),
        ("nvfp4", "bf16", 48, 64),
        _drop("_extra_state"),
        False,
        "activations differ",
    ),
    "dynamic-into-static": (
        ("nvfp4", "dynamic", 48, 64),
        ("nvfp4", "static", 48, 64),
        None,
        True,
        "activations differ",
    ),
    "missing-part": (
        ("nvfp4", "dynamic", 48, 64),
        ("nvfp4", "dynamic", 48, 64),
        _drop("weight_scale"),
        False,
        "lacks weight_scale",
    ),
    "negative-global-scale": _edited(
        "nvfp4", "static", "input_global_scale", torch.tensor(-0.5), "must be finite and positive"
    ),
    # (every part is checked before any is assigned: bias, each global scale)
    "bias-one-element": _edited(
        "nvfp4", "dynamic", "bias", torch.ones(1), r"the checkpoint's bias is torch.float32 \(1,\)"
    ),
    "bias-short": _edited("mxfp4", "bf16", "bias", torch.ones(47), "shape differs: .* bias"),
    "bias-integer": _edited(
        "nvfp4", "bf16", "bias", torch.ones(48, dtype=torch.int32), "dtype differs: .* bias"
    ),
    "float-codes": _edited(
        "nvfp4",
        "dynamic",
        "weight_data",
        torch.zeros(48, 32),
        r"dtype differs: the checkpoint's weight_data is torch.float32 \(48, 32\)",
    ),
    "zero-weight-global-scale": _edited(
        "nvfp4", "dynamic", "weight_global_scale", torch.tensor(0.0), "must be finite and positive"
    ),
    "nan-weight-global-scale": _edited(
        "nvfp4", "bf16", "weight_global_scale", torch.tensor(float("nan")), "finite and positive"
    ),
    "float64-weight-global-scale": _edited(
        "nvfp4",
        "static",
        "weight_global_scale",
        torch.tensor(0.5, dtype=torch.float64),
        "weight_global_scale must be a 0-d float32 tensor, got torch.float64",
    ),
    "1-d-input-global-scale": _edited(
        "nvfp4", "static", "input_global_scale", torch.tensor([0.5]), "must be a 0-d float32"
    ),
    "not-an-fp4-extra-state": (
        ("nvfp4", "dynamic", 48, 64),
        ("nvfp4", "dynamic", 48, 64),
        _set("_extra_state", "nvfp4"),
        True,
        "not an FP4Linear's",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_state_dict_refuses_another_layer_and_loads_nothing(case):
    """A checkpoint of another format, shape or activation mode, or one incomplete or with a
    bad global scale, is a ValueError naming what differs, and the layer is left as it was."""
    (sfmt, smode, sn, sk), (dfmt, dmode, dn, dk), edit, strict, match = REFUSALS[case]
    sd = _layer(_linear(sk, sn, seed=9), sfmt, smode).state_dict()
    if edit is not None:
        edit(sd)
    target = _layer(_linear(dk, dn, seed=10), dfmt, dmode)
    before = _snapshot(target)
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(sd, strict=strict)
    after = _snapshot(target)
    assert all(_same(after[n], t) for n, t in before.items())


def test_state_dict_load_names_the_layer_inside_a_model():
    model = nn.Sequential(nn.ReLU(), _layer(_linear(seed=11), "nvfp4", "dynamic"))
    other = nn.Sequential(nn.ReLU(), _layer(_linear(seed=12), "mxfp4", "dynamic"))
    with pytest.raises(ValueError, match="^1: format differs: the checkpoint is nvfp4"):
        other.load_state_dict(model.state_dict())


def _edit_keys(case: str, sd: dict) -> dict:
    """sd with a stray key under the layer's prefix, without its bias, or both."""
    sd = dict(sd)
    if case in ("stray-key", "both"):
        sd["1.stray"] = torch.zeros(3)
    if case in ("no-bias", "both"):
        del sd["1.bias"]
    return sd


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("case", ["stray-key", "no-bias", "both"])
@pytest.mark.parametrize("fmt, mode", [("nvfp4", "dynamic"), ("mxfp4", "bf16")])
def test_state_dict_keys_are_reported_as_nn_linear_reports_them(fmt, mode, case, strict):
    """A stray key under the layer's prefix and a missing bias are reported as ``nn.Linear``
    reports them (strict: the RuntimeError names them; lenient: the returned key lists)."""
    lin = _linear(seed=13)
    plain, fp4 = nn.Sequential(nn.ReLU(), lin), nn.Sequential(nn.ReLU(), _layer(lin, fmt, mode))
    results = []
    for model in (plain, fp4):
        sd = _edit_keys(case, model.state_dict())
        try:
            keys = model.load_state_dict(sd, strict=strict)
        except RuntimeError as err:
            results.append(("raised", "1.stray" in str(err), "1.bias" in str(err)))
        else:
            results.append(("loaded", sorted(keys.unexpected_keys), sorted(keys.missing_keys)))
    assert results[1] == results[0]
    assert results[0][0] == ("raised" if strict else "loaded")


def test_repr_says_whether_there_is_a_bias():
    assert "bias=True" in repr(_layer(_linear(seed=14), "nvfp4", "dynamic"))
    assert "bias=False" in repr(_layer(_linear(seed=14, bias=False), "nvfp4", "dynamic"))


def test_repr_names_the_features_as_the_linear_it_replaces():
    lin = _linear(k=96, n=40, seed=15)  # (not square: in and out cannot be mistaken)
    want = lin.extra_repr().rsplit(", bias=", 1)[0]
    assert _layer(lin, "nvfp4", "dynamic").extra_repr().startswith(want + ", ")


# (every way a layer comes to be: built, loaded into (copy or assign), cast, copied, pickled)
MADE = {
    "from_linear": lambda layer, other: layer,
    "load": lambda layer, other: (layer.load_state_dict(other.state_dict()), layer)[1],
    "load assign": lambda layer, other: (
        layer.load_state_dict(other.state_dict(), assign=True),
        layer,
    )[1],
    "to(float16)": lambda layer, other: layer.to(torch.float16),
    "deepcopy": lambda layer, other: copy.deepcopy(layer),
    "pickle": lambda layer, other: pickle.loads(pickle.dumps(layer)),
}


@pytest.mark.parametrize("how", sorted(MADE))
@pytest.mark.parametrize("mode", ["dynamic", "bf16"])
def test_no_path_leaves_a_parameter_that_requires_grad(how, mode):
    """An FP4Linear is inference only: whichever way it was made, none of its parameters
    requires grad, so its outputs do not either (x without grad)."""
    layer = _layer(_linear(seed=16), "nvfp4", mode)
    other = _layer(_linear(seed=17), "nvfp4", mode)
    made = MADE[how](layer, other)
    assert not [name for name, p in made.named_parameters() if p.requires_grad]
    x = _x((3, 64), torch.float16 if how == "to(float16)" else _dtype(mode), seed=18)
    assert not made(x).requires_grad


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_a_float64_linear_converts_as_its_float32_copy(fmt):
    """Weights of another floating dtype are quantized from their float32 values, through
    ``from_linear`` and ``quantize_model`` alike."""
    lin = _linear(seed=15)
    want = _layer(lin, fmt, "dynamic").weight
    model = nn.Sequential(copy.deepcopy(lin).double())
    assert fp4_ops.quantize_model(model, format=fmt).replaced == ["0"]
    for got in (_layer(copy.deepcopy(lin).double(), fmt, "dynamic").weight, model[0].weight):
        assert _same(got.data, want.data) and _same(got.scale, want.scale)
        assert _same(got.global_scale, want.global_scale)


# ----------------------------------------------------------------------------- both modules
# FP4Linear and FP4MoE load their state their own way: what nn.Module's load does for its own
# modules (pre-hooks, assign, casts of floating tensors) must hold for them too, all or nothing.

MODULE_KINDS = [
    *(f"linear-{fmt}-{mode}" for fmt, mode in LAYER_KINDS),
    "moe-nvfp4-bf16",
    "moe-mxfp4-dynamic",
]


def _module(kind: str, seed: int, bias: bool = True) -> tuple[nn.Module, tuple]:
    """(a module of this kind, with biases or none, its forward's arguments): an FP4Linear from
    ``_linear`` or an FP4MoE from random experts, both built from FP4Tensors held nowhere else."""
    family, fmt, mode = kind.split("-")
    x_dtype = _dtype(mode)
    if family == "linear":
        lin = _linear(64, 48, seed)
        gs = STATIC_GS if mode == "static" else None
        w = fp4_ops.quantize(lin.weight.detach(), fmt)
        b = lin.bias.detach() if bias else None
        return FP4Linear(w, b, mode, gs), (_x((5, 64), x_dtype, seed + 1),)
    gen = _gen(seed)
    w13, w2 = torch.randn(3, 64, 64, generator=gen), torch.randn(3, 64, 32, generator=gen)
    b13, b2 = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    q13, q2 = fp4_ops.quantize_experts(w13, fmt), fp4_ops.quantize_experts(w2, fmt)
    layer = fp4_ops.FP4MoE(q13, q2, "silu", mode, *((b13, b2) if bias else ()))
    ids = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]])
    weights = torch.rand(4, 2, generator=gen)
    return layer, (_x((4, 64), x_dtype, seed + 1), weights, ids)


def _fp4_keys(module: nn.Module) -> list[str]:
    """The state dict's keys of the module's FP4 parts (not its biases or extra state)."""
    return [k for k in module.state_dict() if "bias" not in k and k != "_extra_state"]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_load_all_of_their_fp4_parts_or_nothing(kind, strict):
    """A checkpoint lacking any one FP4 part (codes, scales, a global scale) is a ValueError
    naming it, strict or not, and the module keeps every value it had: a part kept from before
    would pair one weight's codes with another's scales."""
    source = _module(kind, seed=40)[0].state_dict()
    for key in _fp4_keys(_module(kind, seed=40)[0]):
        target = _module(kind, seed=41)[0]
        before = _snapshot(target)
        partial = {k: v for k, v in source.items() if k != key}
        with pytest.raises(ValueError, match=f"lacks {key}"):
            target.load_state_dict(partial, strict=strict)
        after = _snapshot(target)
        assert all(_same(after[n], t) for n, t in before.items()), key


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_load_with_assign(kind):
    """``load_state_dict(assign=True)`` into a module on the meta device (how large models are
    built) takes the checkpoint's tensors: no buffer stays on meta, the forward is the
    source's bit for bit."""
    source, args = _module(kind, seed=42)
    empty = _module(kind, seed=43)[0].to("meta")
    state = source.state_dict()
    empty.load_state_dict(state, assign=True)
    assert all(t.device.type == "cpu" for t in empty.state_dict().values() if torch.is_tensor(t))
    assert torch.equal(empty(*args), source(*args))
    # (as nn.Module's assign: the module holds the checkpoint's tensors, but the codes, which
    # the W4A16 layers hold prepacked)
    mine = empty.state_dict()
    held = [k for k in state if torch.is_tensor(state[k]) and not k.endswith("_data")]
    assert all(mine[k].data_ptr() == state[k].data_ptr() for k in held), held


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_warn_that_a_load_into_meta_is_a_no_op(kind):
    """``load_state_dict`` without ``assign`` into a module on the meta device cannot take the
    checkpoint's values: as nn.Module's own load, it says so (a UserWarning per tensor naming
    its key) and leaves the module on meta, rather than passing silently."""
    source = _module(kind, seed=46)[0]
    empty = _module(kind, seed=47)[0].to("meta")
    state = source.state_dict()
    no_op = "to a meta tensor in the current model is a no-op"
    with pytest.warns(UserWarning, match=no_op) as seen:
        empty.load_state_dict(state)
    fp4 = _fp4_keys(source)
    assert {str(w.message).split(":")[0] for w in seen} >= {f"for {k}" for k in fp4}
    assert all(t.is_meta for t in empty.state_dict().values() if torch.is_tensor(t))


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_run_load_pre_hooks(kind):
    """A load pre-hook registered on the module runs before it reads the state dict, as on any
    nn.Module: one that renames a legacy checkpoint's keys makes it load."""
    source, args = _module(kind, seed=44)
    target = _module(kind, seed=45)[0]

    def rename(module, state_dict, prefix, *_):
        for key in [k for k in state_dict if k.startswith(prefix + "legacy_")]:
            state_dict[prefix + key[len(prefix + "legacy_") :]] = state_dict.pop(key)

    target.register_load_state_dict_pre_hook(rename)
    model = nn.Sequential(nn.Identity(), target)  # (the hook sees the module's own prefix)
    model.load_state_dict({f"1.legacy_{k}": v for k, v in source.state_dict().items()})
    assert torch.equal(target(*args), source(*args))


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_hold_copies_of_the_fp4tensors_they_were_made_of(kind):
    """The FP4Tensors a module is built from keep their values when a state dict loads into
    the module (its buffers are its own), and the module keeps its when they change."""
    family, fmt, mode = kind.split("-")
    if family == "linear":
        w, b = fp4_ops.quantize(_x((48, 64), seed=46), fmt), _x((48,), seed=56)
        sources, biases = [w], [b]
        layer = FP4Linear(w, b, mode, STATIC_GS if mode == "static" else None)
    else:
        gen = _gen(46)
        sources = [
            fp4_ops.quantize_experts(torch.randn(3, *shape, generator=gen), fmt)
            for shape in ((64, 64), (64, 32))
        ]
        biases = [torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)]
        layer = fp4_ops.FP4MoE(*sources, "silu", mode, *biases)
    parts = [t for q in sources for t in (q.data, q.scale, q.global_scale)] + biases
    before = [t.clone() for t in parts]
    other = _module(kind, seed=47)[0].state_dict()
    layer.load_state_dict(other)
    assert all(_same(t, b) for t, b in zip(parts, before, strict=True))
    with torch.no_grad():
        for t in parts:
            t.reshape(-1).view(torch.uint8).zero_()
    after = _snapshot(layer)
    assert all(_same(after[n], other[n]) for n in after if torch.is_tensor(after[n]))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_refuse_a_checkpoint_of_their_extra_state_alone(kind, strict):
    """The extra state (format, modes) without the weights is a checkpoint of this layer that
    lacks its FP4 parts: a ValueError, not missing keys that a lenient load would pass over."""
    target = _module(kind, seed=57)[0]
    before = _snapshot(target)
    extra = {"_extra_state": _module(kind, seed=58)[0].state_dict()["_extra_state"]}
    with pytest.raises(ValueError, match="lacks"):
        target.load_state_dict(extra, strict=strict)
    after = _snapshot(target)
    assert all(_same(after[n], t) for n, t in before.items())


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("case", ["bias-missing", "bias-unexpected"])
@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_report_bias_keys_as_nn_module_does(kind, case, strict):
    """A checkpoint without the biases the module has, or with biases it has not, is reported as
    nn.Module reports keys (strict: the RuntimeError names them; lenient: the key lists)."""
    has_bias = case == "bias-missing"
    target = _module(kind, seed=59, bias=has_bias)[0]
    state = _module(kind, seed=60, bias=not has_bias)[0].state_dict()
    names = sorted(k for k in (state if not has_bias else target.state_dict()) if "bias" in k)
    if strict:
        with pytest.raises(RuntimeError) as err:
            target.load_state_dict(state)
        assert all(f'"{n}"' in str(err.value) for n in names), str(err.value)
        return
    keys = target.load_state_dict(state, strict=False)
    reported = keys.missing_keys if has_bias else keys.unexpected_keys
    assert sorted(reported) == names


@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_refuse_integer_biases(kind):
    """A bias that is not floating point is a ValueError naming it, and nothing loads."""
    target = _module(kind, seed=61)[0]
    before = _snapshot(target)
    state = dict(_module(kind, seed=62)[0].state_dict())
    name = next(k for k in state if "bias" in k)
    state[name] = state[name].round().long()
    with pytest.raises(ValueError, match="bias"):
        target.load_state_dict(state)
    after = _snapshot(target)
    assert all(_same(after[n], t) for n, t in before.items())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", MODULE_KINDS)
def test_fp4_modules_cast_a_checkpoints_biases_as_nn_module_does(kind, dtype):
    """A module cast to 16 bits loads a float32 checkpoint: its biases take the checkpoint's
    values in their own dtype (as ``nn.Linear`` does), its FP4 parts keep theirs."""
    source = _module(kind, seed=48)[0].state_dict()
    target = _module(kind, seed=49)[0].to(dtype)
    target.load_state_dict(source)
    got = target.state_dict()
    for key, want in source.items():
        if "bias" in key:
            assert got[key].dtype == dtype and torch.equal(got[key], want.to(dtype)), key
        elif torch.is_tensor(want):
            assert _same(got[key], want), key


# ----------------------------------------------------------------------------- global scales

BAD_SCALES = [-1.0, 0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e39, 1e-50]


def _global_scale_calls():
    """where -> (call taking a global scale, the argument name its message must give)."""
    x = _x((8, 64))
    data, scales, gs = reference.quantize_nvfp4(x)
    t = fp4_ops.quantize(x)
    return {
        "quantize": (lambda v: fp4_ops.quantize(x, global_scale=v), "global_scale"),
        "FP4Tensor": (
            lambda v: FP4Tensor(t.data, t.scale, torch.as_tensor(v, dtype=torch.float32), "nvfp4"),
            "FP4Tensor.global_scale",
        ),
        "from_plain": (lambda v: FP4Tensor.from_plain(data, scales, v), "global_scale"),
        "from_modelopt": (lambda v: FP4Tensor.from_modelopt(data, scales, v), "weight_scale_2"),
        "from_compressed_tensors": (
            lambda v: FP4Tensor.from_compressed_tensors(data, scales, v),
            "weight_global_scale",
        ),
        "FP4Linear": (lambda v: FP4Linear(t, None, "static", v), "input_global_scale"),
        "FP4Linear.from_modelopt": (
            lambda v: FP4Linear.from_modelopt(data, scales, gs, input_scale=v),
            "input_scale",
        ),
    }


@pytest.mark.parametrize("as_tensor", [False, True], ids=["number", "tensor"])
@pytest.mark.parametrize("value", BAD_SCALES, ids=str)
@pytest.mark.parametrize("where", list(_global_scale_calls()))
def test_bad_global_scale_values_are_refused(where, value, as_tensor):
    """A zero, negative, NaN or infinite global scale would zero, negate or poison every
    product: refused where it comes in, naming the argument."""
    call, name = _global_scale_calls()[where]
    if where == "FP4Tensor":  # (its global scale: a 0-d float32 tensor)
        value = torch.tensor(value)
    elif as_tensor:
        value = torch.tensor([value])
    with pytest.raises(ValueError, match=f"{name} must be finite and positive"):
        call(value)


# ----------------------------------------------------------------------------- scale layouts


@pytest.mark.parametrize("lead", [(), (2,)], ids=["2-D", "3-D"])
@pytest.mark.parametrize("fmt, k", [("nvfp4", 64), ("mxfp4", 128)])
def test_scale_layout_is_told_by_shape_not_by_rank(fmt, k, lead):
    """128 rows x 4 scale columns: the plain scales have exactly one atom's 512 bytes. Only the
    atom-shaped blocked scales [.., 1, 1, 512] pass; plain ones, flattened or not, and flat
    blocked bytes are refused."""
    x = _x((*lead, 128, k), seed=13)
    data, scales, gs = _reference_quantize(x, fmt)
    blocked = reference.to_blocked(scales)  # [n] or [L, n]
    assert math.prod(scales.shape[-2:]) == blocked.shape[-1] == 512
    t = FP4Tensor(data, blocked.view(*lead, 1, 1, 512), gs, fmt)
    assert torch.equal(t.dequantize(), reference.dequantize_fp4(data, scales, VEC[fmt], gs))
    for bad in (scales, scales.reshape(*lead, -1), blocked):
        with pytest.raises(ValueError, match="FP4Tensor.scale has shape"):
            FP4Tensor(data, bad, gs, fmt)
    assert fp4_ops.quantize(x, fmt).scale.shape == (*lead, 1, 1, 512)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_from_plain_and_quantize_share_the_default_global_scale(fmt):
    """None means quantize's default in both: amax / (448 * 6) for NVFP4 (which from_plain
    cannot know, so it asks for it) and 1.0 for MXFP4."""
    x = _x((40, 64), seed=14) * 3
    q = fp4_ops.quantize(x, fmt)
    data, scales, gs = _reference_quantize(x, fmt)
    assert float(q.global_scale) == float(gs)
    if fmt == "nvfp4":
        assert float(gs) == float(x.abs().amax() / (448.0 * 6.0))
        with pytest.raises(ValueError, match="global_scale is None"):
            FP4Tensor.from_plain(data, scales)
        t = FP4Tensor.from_plain(data, scales, q.global_scale)
    else:
        t = FP4Tensor.from_plain(data, scales, format="mxfp4")
    assert torch.equal(t.dequantize(), q.dequantize())
    assert torch.equal(t.dequantize(), reference.dequantize_fp4(data, scales, VEC[fmt], gs))


# ----------------------------------------------------------------------------- leading dims


def _strided(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x's values in a tensor of another memory layout (not contiguous)."""
    if layout == "transposed":  # (leading dims swapped: rows not in memory order)
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "every-other-row":
        wide = torch.zeros((x.shape[0] * 2, *x.shape[1:]), dtype=x.dtype)
        wide[::2] = x
        return wide[::2]
    wide = torch.zeros((*x.shape[:-1], x.shape[-1] + 32), dtype=x.dtype)  # ("row-pitch")
    wide[..., :-32] = x
    return wide[..., :-32]


@pytest.mark.parametrize("layout", ["transposed", "every-other-row", "row-pitch"])
@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_fp4_linear_takes_any_input_layout(fmt, mode, layout):
    """As nn.Linear, any strides: x not contiguous gives what its contiguous copy gives."""
    lin = _linear(64, 40, seed=15)
    layer = _layer(lin, fmt, mode)
    x = _x((3, 5, 64), _dtype(mode), seed=16)
    xs = _strided(x, layout)
    assert not xs.is_contiguous() and torch.equal(xs, x)
    assert torch.equal(layer(xs), layer(x))
    assert torch.equal(layer(xs), _reference_linear(lin, fmt, mode, x))


@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_fp4_linear_shares_no_storage_with_its_source(fmt, mode):
    """from_linear copies what it keeps: changing the source Linear afterwards (or loading a
    state dict into the layer) leaves the other one as it was."""
    lin = _linear(64, 40, seed=21)
    layer = _layer(lin, fmt, mode)
    x = _x((3, 64), _dtype(mode), seed=22)
    y = layer(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)
        lin.bias.add_(1.0)
    assert torch.equal(layer(x), y)
    source = {n: t.clone() for n, t in lin.state_dict().items()}
    layer.load_state_dict(_layer(_linear(64, 40, seed=23), fmt, mode).state_dict())
    assert all(torch.equal(lin.state_dict()[n], t) for n, t in source.items())


@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (2, 1, 3), (0,), (2, 0, 3)], ids=str)
@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_fp4_linear_takes_any_leading_dims(fmt, mode, lead):
    """x [..., K] -> y [..., N], as nn.Linear: the rows of x are one GEMM (reference.py on the
    2-D rows); no rows, an empty y."""
    lin = _linear(64, 40, seed=15)
    layer = _layer(lin, fmt, mode)
    x = _x((*lead, 64), _dtype(mode), seed=16)
    y = layer(x)
    assert y.shape == (*lead, 40) and y.dtype == x.dtype
    if x.numel():
        assert torch.equal(y, _reference_linear(lin, fmt, mode, x))
        assert torch.equal(y.reshape(-1, 40), layer(x.reshape(-1, 64)))


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 0)], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_w4a16_takes_any_leading_dims(fmt, lead):
    w = _x((24, 64), seed=17) * 0.1
    b = fp4_ops.quantize(w, fmt)
    x = _x((*lead, 7, 64), torch.bfloat16, seed=18)
    d = fp4_ops.fp4_gemm(x, b, torch.float32, alpha=0.5)
    assert d.shape == (*lead, 7, 24) and d.dtype == torch.float32
    if x.numel():
        wd, ws, wg = _reference_quantize(w, fmt)
        rows = x.reshape(-1, 64)
        want = reference.reference_gemm_w4a16(rows, wd, ws, VEC[fmt], wg * 0.5, torch.float32)
        assert torch.equal(d, want.reshape(d.shape))


# (M 50: scales re-blocked as rows; 128: a view; L or M 0: an empty D)
@pytest.mark.parametrize("l, m", [(3, 50), (3, 128), (3, 0), (0, 50), (0, 128)], ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_gemm_3d_fp4_activations_against_2d_weights(fmt, l, m):  # noqa: E741
    """An FP4Tensor [L, M, K] against weights [N, K]: its L * M rows in one GEMM -> [L, M, N]."""
    x, w = _x((l, m, 64), seed=19), _x((24, 64), seed=20) * 0.1
    a, b = fp4_ops.quantize(x, fmt), fp4_ops.quantize(w, fmt)
    d = fp4_ops.fp4_gemm(a, b, torch.float32)
    assert d.shape == (l, m, 24) and d.dtype == torch.float32
    if l * m:
        xd, xs, xg = _reference_quantize(x, fmt)
        wd, ws, wg = _reference_quantize(w, fmt)
        xd, xs = xd.reshape(l * m, 32), xs.reshape(l * m, -1)
        want = reference.reference_gemm(xd, wd, xs, ws, VEC[fmt], xg * wg, torch.float32)
        assert torch.equal(d, want.reshape(l, m, 24))


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_sm90])],
)
@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_leading_dims_compile_fullgraph(fmt, mode, device):
    """The shapes the fake kernels give match (4-D input, and no rows), and the checks on the
    way in trace with symbolic shapes (the third shape recompiles with dynamic ones). On the
    GPU the eager layer may launch another GEMM (its decode path): the same exact products
    summed in another order, each output rounded once, so within 2^-7 of its norm."""
    torch._dynamo.reset()
    layer = _layer(_linear(64, 40, seed=21), fmt, mode).to(device)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for shape in ((2, 3, 4, 64), (0, 64), (5, 64)):
        x = _x(shape, _dtype(mode), seed=22).to(device)
        got, want = compiled(x), layer(x)
        if device == "cpu" or not want.numel():
            assert torch.equal(got, want)
        else:
            assert (got.float() - want.float()).norm() <= 2.0**-7 * want.float().norm()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_ops_pass_opcheck(fmt):
    """Autograd registration, fake kernels (the atom-shaped scales) and AOT dispatch (not the
    schema check: it computes on the inputs, and CPU float8 has no arithmetic)."""
    x = _x((2, 50, 64), seed=23)
    a, b = fp4_ops.quantize(x[0], fmt), fp4_ops.quantize(_x((24, 64), seed=24), fmt)
    vec = VEC[fmt]
    checks = ["test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]
    torch.library.opcheck(quantize_op, (x, vec, None), test_utils=checks)
    args = (a.data, a.scale, b.data, b.scale, a.global_scale, b.global_scale, vec, torch.float32)
    torch.library.opcheck(gemm_op, args, test_utils=checks)
    x16 = x[0].to(torch.bfloat16)
    args = (x16, b.data, b.scale, b.global_scale, vec, torch.bfloat16, False)
    torch.library.opcheck(gemm_w4a16_op, args, test_utils=checks)


# ----------------------------------------------------------------------------- backward


@pytest.mark.parametrize("fmt, mode", LAYER_KINDS)
def test_backward_says_inference_only(fmt, mode):
    """A gradient through an FP4 layer raises the clear message; the forward runs under
    no_grad and inference_mode alike."""
    layer = _layer(_linear(seed=25), fmt, mode)
    x = _x((3, 64), _dtype(mode), seed=26).requires_grad_()
    y = layer(x)
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="^inference only: FP4 layers have no backward"):
        y.sum().backward()
    with torch.no_grad():
        y_no_grad = layer(x)
    with torch.inference_mode():
        y_inference = layer(x)
    assert torch.equal(y_no_grad, y.detach()) and torch.equal(y_inference, y.detach())


def test_fp4_gemm_backward_says_inference_only():
    b = fp4_ops.quantize(_x((24, 64), seed=27))
    a = _x((5, 64), torch.bfloat16, seed=28).requires_grad_()
    with pytest.raises(RuntimeError, match="inference only: FP4 layers have no backward"):
        fp4_ops.fp4_gemm(a, b).sum().backward()
    a32 = _x((5, 64), seed=28).requires_grad_()
    with pytest.raises(RuntimeError, match="inference only: FP4 layers have no backward"):
        fp4_ops.fp4_gemm(fp4_ops.quantize(a32), b).sum().backward()


# ----------------------------------------------------------------------------- quantize_model


def test_from_linear_takes_a_shared_weight_global_scale():
    """``weight_global_scale``: the given NVFP4 global scale (reference.py quantizes the weight
    with it), refused below the weight's own amax / (448 * 6) (its block scales would
    saturate), for MXFP4, and where not finite and positive."""
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.mul_(3.0)
    own = float(lin.weight.detach().abs().amax()) / (448.0 * 6.0)
    layer = FP4Linear.from_linear(lin, weight_global_scale=2 * own, activations="bf16")
    data, scales, gs = reference.quantize_nvfp4(lin.weight.detach(), torch.tensor(2 * own))
    assert torch.equal(layer.weight_global_scale, gs)
    assert torch.equal(layer.weight.data.view(torch.uint8), data.view(torch.uint8))
    assert _same(layer.weight.plain_scales(), scales)
    with pytest.raises(ValueError, match="below the weight's amax / \\(448 \\* 6\\)"):
        FP4Linear.from_linear(lin, weight_global_scale=0.99 * own)
    with pytest.raises(ValueError, match="^weight_global_scale: mxfp4 has no global scale"):
        FP4Linear.from_linear(lin, "mxfp4", weight_global_scale=own)
    for bad in (float("nan"), 0.0, -own, float("inf")):
        with pytest.raises(ValueError, match="^weight_global_scale must be finite and positive"):
            FP4Linear.from_linear(lin, weight_global_scale=bad)


def _attention(scales=(1.0, 1.0, 1.0), names=("q_proj", "k_proj", "v_proj")) -> nn.Module:
    """Linears named ``names`` whose weights are scaled by ``scales`` (0: all zero)."""
    torch.manual_seed(55)
    block = nn.Module()
    for name, scale in zip(names, scales, strict=True):
        lin = nn.Linear(64, 64)
        with torch.no_grad():
            lin.weight.mul_(scale)
        block.add_module(name, lin)
    return block


def _own_scale(lin: nn.Linear) -> float:
    return float(lin.weight.detach().abs().amax()) / (448.0 * 6.0)


def test_quantize_model_shares_scales_among_the_quantized_siblings_only():
    """The shared scale is the largest own scale among the group's Linears that quantize_model
    quantizes: MLA's q_a / kv_a too; not a sibling left out by include, nor one kept 16-bit
    (a weight reader's); 1.0 for a group of zero weights."""
    mla = _attention((3.0, 1.0), ("q_a_proj", "kv_a_proj_with_mqa"))
    want = _own_scale(mla.q_a_proj)
    fp4_ops.quantize_model(mla)
    assert [float(m.weight_global_scale) for m in mla.children()] == [pytest.approx(want)] * 2
    chosen = _attention((1.0, 2.0, 10.0))
    want = _own_scale(chosen.k_proj)
    fp4_ops.quantize_model(chosen, include=["q_proj", "k_proj"])
    assert float(chosen.q_proj.weight_global_scale) == pytest.approx(want)
    reader = _attention((10.0, 1.0, 2.0))
    model = nn.ModuleDict({"attn": reader, "reader": _Casting()})
    model["reader"].proj = reader.q_proj  # (16-bit: its reader reads the weight)
    want = _own_scale(reader.v_proj)
    report = fp4_ops.quantize_model(model, include=["attn.*"])
    assert "attn.q_proj" in report.skipped and type(reader.q_proj) is nn.Linear
    assert float(reader.k_proj.weight_global_scale) == pytest.approx(want)
    zeros = _attention((0.0, 0.0, 0.0))
    fp4_ops.quantize_model(zeros)
    assert [float(m.weight_global_scale) for m in zeros.children()] == [1.0] * 3


#: module names of model blocks -> the groups of them that serving engines run as one GEMM
#: (written out here, not read from fp4_ops): Llama's q / k / v and gate / up, the w1 / w3 of
#: Mixtral's (transformers 4) and LFM2's MLPs, DeepSeek's MLA q_a / kv_a; siblings share a parent
SIBLING_BLOCKS = {
    "llama": (
        "self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj "
        "mlp.gate_proj mlp.up_proj mlp.down_proj",
        [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]]
        + [["mlp.gate_proj", "mlp.up_proj"]],
    ),
    "w1_w3": (
        "feed_forward.w1 feed_forward.w2 feed_forward.w3",
        [["feed_forward.w1", "feed_forward.w3"]],
    ),
    "mla": (
        "self_attn.q_a_proj self_attn.q_b_proj self_attn.kv_a_proj_with_mqa "
        "self_attn.kv_b_proj self_attn.o_proj",
        [["self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"]],
    ),
    "apart": ("a.q_proj b.k_proj c.v_proj a.gate_proj b.up_proj c.w1 d.w3", []),
}


@pytest.mark.parametrize("kind", SIBLING_BLOCKS)
def test_quantize_model_shares_one_scale_in_each_fused_group(kind):
    """Each group that serving engines fuse gets the largest own scale among its Linears (the
    last of each group holds the largest weight), every other Linear its own scale."""
    spelled, groups = SIBLING_BLOCKS[kind]
    names = spelled.split()
    model = nn.Module()
    for i, name in enumerate(names):
        parent, _, attr = name.rpartition(".")
        if not hasattr(model, parent):
            model.add_module(parent, nn.Module())
        linear = nn.Linear(64, 32, bias=False)
        with torch.no_grad():
            linear.weight.mul_(1.0 + i)
        setattr(model.get_submodule(parent), attr, linear)
    amax = {name: float(model.get_submodule(name).weight.abs().amax()) for name in names}
    for group in groups:
        amax.update(dict.fromkeys(group, max(amax[n] for n in group)))
    assert [sorted(g) for g in fp4_ops.nn.fused_groups(names)] == [sorted(g) for g in groups]
    report = fp4_ops.quantize_model(model)
    assert sorted(report.replaced) == sorted(names)
    for name in names:
        # (in float32, as the quantizer divides)
        want = torch.tensor(amax[name]) / torch.tensor(448.0 * 6.0)
        assert torch.equal(model.get_submodule(name).weight_global_scale, want), name


def test_from_linear_refuses_a_scale_below_a_negative_amax():
    """The weight's own scale is its largest |w| / (448 * 6), a negative entry's included;
    anything below it, however close, is refused."""
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.clamp_(-0.5, 0.5)[3, 7] = -3.0
    own = torch.tensor(3.0) / torch.tensor(448.0 * 6.0)
    below = torch.nextafter(own, torch.tensor(0.0))
    with pytest.raises(ValueError, match="below the weight's amax"):
        FP4Linear.from_linear(lin, weight_global_scale=below)
    assert float(FP4Linear.from_linear(lin, weight_global_scale=own).weight_global_scale) == own


class _HFAttention(nn.Module):
    """A Hugging Face-style attention block: q / k / v / o projections, SDPA, a gated MLP."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        self.v_proj, self.o_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.mlp = nn.ModuleDict(
            {
                "gate_proj": nn.Linear(dim, 2 * dim),
                "up_proj": nn.Linear(dim, 2 * dim),
                "down_proj": nn.Linear(2 * dim, dim),
            }
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm(x)

        def split(p):
            return p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)

        att = F.scaled_dot_product_attention(
            split(self.q_proj), split(self.k_proj), split(self.v_proj)
        )
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, t, d))
        mlp = self.mlp
        return x + mlp["down_proj"](F.silu(mlp["gate_proj"](x)) * mlp["up_proj"](x))


class _ReferenceFP4Linear(nn.Module):
    """What an FP4Linear made of ``lin`` computes, by reference.py (``_reference_linear``).
    (Its forward hook turns nn.TransformerEncoderLayer's fused fast path off, as an FP4Linear
    does: both models then run the same path.)"""

    def __init__(self, lin: nn.Linear, fmt: str, mode: str, wgs=None):
        super().__init__()
        self.lin, self.fmt, self.mode, self.wgs = copy.deepcopy(lin), fmt, mode, wgs
        self.register_forward_hook(lambda *_: None)

    def forward(self, x):
        return _reference_linear(self.lin, self.fmt, self.mode, x, self.wgs)


def _block(kind: str) -> nn.Module:
    torch.manual_seed(29)
    if kind == "encoder":
        block = nn.TransformerEncoderLayer(64, 4, dim_feedforward=96, batch_first=True)
    elif kind == "decoder":
        block = nn.TransformerDecoderLayer(64, 4, dim_feedforward=96, batch_first=True)
    else:
        block = _HFAttention()
    return block.eval()


#: the layers of a block that vLLM runs as one GEMM: NVFP4 gives them one weight global scale
FUSED = (("q_proj", "k_proj", "v_proj"), ("mlp.gate_proj", "mlp.up_proj"))


def _fused_scales(block: nn.Module, fmt: str) -> dict[str, torch.Tensor]:
    """name -> the NVFP4 weight global scale FUSED layers share: the largest amax / (448 * 6)
    of the group, in float32 (as the quantizer's own)."""
    out = {}
    for group in FUSED if fmt == "nvfp4" else ():
        linears = dict(block.named_modules())
        names = [n for n in group if isinstance(linears.get(n), nn.Linear)]
        if len(names) > 1:
            amax = max(float(block.get_submodule(n).weight.detach().abs().amax()) for n in names)
            gs = torch.tensor(amax, dtype=torch.float32) / torch.tensor(448.0 * 6.0)
            out.update(dict.fromkeys(names, gs))
    return out


BLOCKS = {
    "encoder": (["linear1", "linear2"], ["self_attn.out_proj"]),
    "decoder": (["linear1", "linear2"], ["self_attn.out_proj", "multihead_attn.out_proj"]),
    "hf": (
        ["q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"],
        [],
    ),
}


@pytest.mark.parametrize("grad", ["no_grad", "inference_mode", "enabled"])
@pytest.mark.parametrize("fmt, mode", [("nvfp4", "dynamic"), ("mxfp4", "bf16")])
@pytest.mark.parametrize("kind", BLOCKS)
def test_quantize_model_runs_transformer_blocks(kind, fmt, mode, grad):
    """nn.TransformerEncoderLayer / DecoderLayer (whose nn.MultiheadAttention reads out_proj's
    weight itself: skipped, and reported) and an HF-style block run after quantize_model, and
    equal the same block with reference.py's FP4 layers, in every grad mode."""
    dtype = _dtype(mode)
    block = _block(kind).to(dtype)
    ref = copy.deepcopy(block)
    report = fp4_ops.quantize_model(block, format=fmt, activations=mode)
    replaced, skipped = BLOCKS[kind]
    assert report.replaced == replaced and list(report.skipped) == skipped
    assert all("reads its weight directly" in why for why in report.skipped.values())
    assert report.unmatched == [] and all(name in str(report) for name in replaced + skipped)
    shared = _fused_scales(ref, fmt)
    assert (kind == "hf") == bool(shared) or fmt == "mxfp4"
    for name in replaced:
        parent, _, child = name.rpartition(".")
        linear = ref.get_submodule(name)
        fp4 = _ReferenceFP4Linear(linear, fmt, mode, shared.get(name))
        setattr(ref.get_submodule(parent), child, fp4)
    for name, gs in shared.items():
        assert torch.equal(block.get_submodule(name).weight_global_scale, gs), name
    x = _x((2, 6, 64), dtype, seed=30)
    args = (x, _x((2, 5, 64), dtype, seed=31)) if kind == "decoder" else (x,)
    context = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "enabled": torch.enable_grad,
    }[grad]
    with context():
        y, want = block(*args), ref(*args)
    assert y.dtype == dtype and torch.equal(y, want)


def test_quantize_model_reports_patterns_and_shared_linears():
    """Glob patterns: what they replaced, skipped and matched nothing (a warning too); a Linear
    reachable by two names becomes one FP4Linear."""
    model = nn.ModuleDict(
        {"attn": nn.MultiheadAttention(64, 4), "up": nn.Linear(64, 96), "odd": nn.Linear(40, 8)}
    )
    model["tied"] = model["up"]
    with pytest.warns(
        UserWarning, match=r"matched no nn.Linear or experts module: \['nothing\*'\]"
    ):
        report = fp4_ops.quantize_model(model, include=["up", "tied", "*proj", "nothing*"])
    assert report.replaced == ["up", "tied"] and model["up"] is model["tied"]
    assert list(report.skipped) == ["attn.out_proj"] and report.unmatched == ["nothing*"]
    assert "nothing*" in str(report) and "attn.out_proj" in str(report)
    default = fp4_ops.quantize_model(nn.Sequential(nn.Linear(40, 8), nn.Linear(8, 8)))
    assert default.replaced == [] and "not a multiple of 32" in default.skipped["0"]
    parent = nn.Sequential(nn.Sequential(nn.Linear(64, 64)), nn.Linear(64, 64))
    with pytest.warns(UserWarning, match=r"matched no nn.Linear or experts module: \['0'\]"):
        report = fp4_ops.quantize_model(parent, include=["0"])  # (a parent: not its Linears)
    assert report.replaced == [] and type(parent[0][0]) is nn.Linear


def test_quantize_model_replaces_a_shared_linear_under_every_name():
    """A Linear reachable by two names that ``include`` chooses by one of them stays one
    module: both names hold the same FP4Linear (the other would keep the 16-bit weight)."""
    model = nn.ModuleDict({"mlp": nn.Sequential(nn.Linear(64, 64))})
    model["shared"] = model["mlp"][0]
    report = fp4_ops.quantize_model(model, include=["mlp.*"])
    assert isinstance(model["shared"], FP4Linear) and model["shared"] is model["mlp"][0]
    assert sorted(report.replaced) == ["mlp.0", "shared"]


@pytest.mark.parametrize(
    "include", [["*"], lambda name, module: True], ids=["patterns", "predicate"]
)
def test_quantize_model_refusal_leaves_the_model_as_it_was(include):
    """A module that ``include`` chooses and quantize_model cannot take raises before any
    module is replaced, wherever it stands among the chosen ones."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 40), nn.Linear(40, 8))
    before = [type(m) for m in model]
    with pytest.raises(ValueError, match="2: in_features = 40 is not a multiple of 32"):
        fp4_ops.quantize_model(model, include=include)
    assert [type(m) for m in model] == before


class _DoubledLinear(nn.Linear):
    """A Linear subclass with a forward of its own, which an FP4Linear would not run."""

    def forward(self, x):
        return 2.0 * super().forward(x)


class _TaggedLinear(nn.Linear):
    """A Linear subclass that keeps nn.Linear's forward: an FP4Linear stands in for it."""


def test_quantize_model_skips_linears_with_a_forward_of_their_own():
    """A Linear subclass that overrides forward is skipped with its reason (an FP4Linear would
    drop what its forward adds), or refused where ``include`` chooses it; one that keeps
    nn.Linear's forward is replaced."""
    model = nn.Sequential(_DoubledLinear(64, 64), _TaggedLinear(64, 64), nn.Linear(64, 32))
    report = fp4_ops.quantize_model(model)
    assert report.replaced == ["1", "2"] and type(model[0]) is _DoubledLinear
    assert "_DoubledLinear has its own forward" in report.skipped["0"]
    chosen = nn.Sequential(_DoubledLinear(64, 64), nn.Linear(64, 32))
    with pytest.raises(ValueError, match="^0: _DoubledLinear has its own forward"):
        fp4_ops.quantize_model(chosen, include=["*"])
    assert type(chosen[1]) is nn.Linear


class _GatedMLP(nn.Module):
    """A dense gated MLP: its ``gate`` Linear is no router (nothing routes here)."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(64, 96), nn.Linear(64, 96), nn.Linear(96, 64)


class _Router(nn.Module):
    """A router module around one Linear (Hunyuan's ``gate.wg``, JetMoE's ``router.layer``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 4)


class _ParallelExperts(nn.Module):
    """Experts as JetMoE and GraniteMoE hold them: no child named ``experts``."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4, 64, 64))


def _moe_block(experts: nn.Module, name: str = "experts") -> nn.Module:
    block = nn.Module()
    block.add_module(name, experts)
    block.gate = nn.Linear(64, 4)  # (Mixtral's, Qwen-MoE's router in transformers 4.x)
    block.shared = _GatedMLP()
    block.shared_gate = nn.Linear(64, 1)
    block.router = _Router()
    block.kv_proj = nn.Linear(64, 32)  # (no router: neither one gate nor a score per expert)
    return block


def test_quantize_model_keeps_moe_routers_16_bit():
    """MoE routers stay nn.Linear whatever ``include`` says: a Linear of a block holding
    experts, outside them, as the block's child or the one Linear of a child. The experts' own
    Linears, a shared expert's and a dense MLP's ``gate`` are quantized."""
    per_expert = nn.ModuleList(_GatedMLP() for _ in range(4))
    # experts counted by a dict's length, or by a num_experts attribute
    by_name = nn.ModuleDict({f"e{i}": _GatedMLP() for i in range(4)})
    counted = _GatedMLP()
    counted.num_experts = 4
    model = nn.ModuleDict(
        {
            "moe": _moe_block(per_expert),
            "parallel": _moe_block(_ParallelExperts(), "input_linear"),
            "by_name": _moe_block(by_name),
            "counted": _moe_block(counted),
            "dense": _GatedMLP(),
        }
    )
    names = ("gate", "shared_gate", "router.proj")
    blocks = ("moe", "parallel", "by_name", "counted")
    routers = [f"{block}.{name}" for block in blocks for name in names]
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    kept = {n: model.get_submodule(n) for n in routers}
    for include in (None, ["*"], lambda name, module: True):
        copied = copy.deepcopy(model)
        report = fp4_ops.quantize_model(copied, include=include, activations="bf16")
        assert sorted(report.skipped) == sorted(routers)
        assert all("an MoE router" in why for why in report.skipped.values())
        assert sorted(report.replaced) == sorted(linears - set(routers))
        assert all(type(copied.get_submodule(n)) is nn.Linear for n in routers)
    fp4_ops.quantize_model(model, activations="bf16")
    assert all(model.get_submodule(n) is kept[n] for n in routers)
    # the block as the model itself; experts held as one Linear in a module (not a router's)
    # that does not say how many they are: every Linear beside them may route, and stays
    lone = nn.Module()
    lone.w = nn.Linear(64, 64)
    block = _moe_block(lone)
    report = fp4_ops.quantize_model(block, activations="bf16")
    assert sorted(report.skipped) == sorted((*names, "kv_proj"))
    assert report.replaced == ["experts.w", "shared.gate", "shared.up", "shared.down"]


class _Kernel(nn.Module):
    """Passes ``fused``'s weight to a kernel (a base class's code, as transformers' mixins)."""

    def _kernel(self, x):
        return F.linear(x, self.fused.weight)


class _Casting(_Kernel):
    """Casts its input to ``proj``'s weight dtype in forward; ``other`` it only calls."""

    def __init__(self):
        super().__init__()
        self.proj, self.fused, self.other = (nn.Linear(64, 64) for _ in range(3))

    def forward(self, x):
        if hasattr(self.other, "weight_tied") and self.other.weight_tied:  # (not .weight)
            x = -x
        return self.other(self.proj(x.to(self.proj.weight.dtype))) + self._kernel(x)


def test_quantize_model_keeps_linears_whose_parent_reads_their_weight():
    """A Linear whose parent's code names ``self.<name>.weight`` (an FP4Linear's weight is an
    FP4Tensor) stays as it is, with the reason, whatever ``include`` says; the model runs."""
    for include in (None, ["*"]):
        model = nn.Sequential(_Casting()).bfloat16()
        report = fp4_ops.quantize_model(model, include=include, activations="bf16")
        assert report.replaced == ["0.other"] and sorted(report.skipped) == ["0.fused", "0.proj"]
        assert "_Casting reads self.proj.weight itself" in report.skipped["0.proj"]
        y = model(_x((3, 64), seed=53).bfloat16())
        assert y.shape == (3, 64) and bool(torch.isfinite(y).all())


def _plain_block() -> type:
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64)

        def forward(self, x):
            return self.proj(x)

    return Block


def _reading_block() -> type:
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64)

        def forward(self, x):
            return self.proj(x.to(self.proj.weight.dtype))

    return Block


def test_quantize_model_reads_each_class_of_the_same_name():
    """Two classes named alike, one reading ``self.proj.weight``: each is judged by its own
    code, whichever comes first."""
    plain, reader = _plain_block(), _reading_block()
    assert plain.__name__ == reader.__name__
    assert fp4_ops.quantize_model(nn.Sequential(plain())).replaced == ["0.proj"]
    assert list(fp4_ops.quantize_model(nn.Sequential(reader())).skipped) == ["0.proj"]
    assert list(fp4_ops.quantize_model(nn.Sequential(_reading_block()())).skipped) == ["0.proj"]
    assert fp4_ops.quantize_model(nn.Sequential(_plain_block()())).replaced == ["0.proj"]


@pytest.mark.parametrize(
    "include", [None, ["a.*"], ["reader.*"]], ids=["all", "other-name", "reader-name"]
)
def test_quantize_model_keeps_a_shared_linear_a_reader_holds(include):
    """One Linear under two names, one of whose parents reads its weight: it stays one
    nn.Linear under both, each name in the report's skipped (the reader would get an FP4Tensor,
    and the two names two modules)."""
    shared = nn.Linear(64, 64)
    reader = _Casting()
    reader.proj = shared
    model = nn.ModuleDict({"a": nn.Sequential(shared), "reader": reader})
    report = fp4_ops.quantize_model(model, include=include, activations="bf16")
    assert model["a"][0] is shared and model["reader"].proj is shared
    assert "reader.proj" in report.skipped and "reader.proj" not in report.replaced
    if include != ["reader.*"]:
        assert report.skipped["a.0"].startswith("also reachable as reader.proj: _Casting reads")
    assert "a.0" not in report.replaced


def test_quantize_model_skips_a_non_dynamically_quantizable_linear():
    """torch marks with NonDynamicallyQuantizableLinear the Linears whose parents read their
    weight: one is skipped wherever it stands."""
    model = nn.Sequential(NonDynamicallyQuantizableLinear(64, 64), nn.Linear(64, 64))
    report = fp4_ops.quantize_model(model)
    assert report.replaced == ["1"] and list(report.skipped) == ["0"]
    assert type(model[0]) is NonDynamicallyQuantizableLinear


def test_quantize_model_takes_a_string_as_one_pattern():
    """``include="ab"`` is one glob pattern, not its characters."""
    model = nn.ModuleDict({"a": nn.Linear(64, 64), "ab": nn.Linear(64, 64)})
    report = fp4_ops.quantize_model(model, include="ab")
    assert report.replaced == ["ab"] and report.unmatched == [] and type(model["a"]) is nn.Linear


@pytest.mark.parametrize("k", [48, 80, 40])
def test_quantize_model_skips_in_features_not_a_multiple_of_32(k):
    model = nn.Sequential(nn.Linear(k, 64), nn.Linear(64, 64))
    report = fp4_ops.quantize_model(model)
    assert (
        report.replaced == ["1"]
        and f"in_features = {k} is not a multiple of 32" in (report.skipped["0"])
    )


def _hooked(kind: str) -> nn.Linear:
    """A Linear carrying what nn.Module runs around forward besides the class's own forward:
    a forward hook, a forward pre-hook, or a forward set on the instance (accelerate's hooks)."""
    linear = nn.Linear(64, 64)
    if kind == "hook":
        linear.register_forward_hook(lambda module, args, out: out * 0)
    elif kind == "pre-hook":
        linear.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
    else:
        plain = linear.forward
        linear.forward = lambda x: plain(x) * 0
    return linear


@pytest.mark.parametrize("kind", ["hook", "pre-hook", "instance forward"])
def test_quantize_model_skips_linears_whose_forward_is_wrapped(kind):
    """A Linear whose call runs more than nn.Linear.forward (hooks, an instance's own forward)
    is skipped with its reason and the model computes as before; refused where ``include``
    chooses it, with the model untouched."""
    model = nn.Sequential(_hooked(kind), nn.Linear(64, 32))
    x = _x((4, 64), seed=56)
    want = model[0](x)
    report = fp4_ops.quantize_model(model)
    assert report.replaced == ["1"] and type(model[0]) is nn.Linear
    assert "FP4Linear would drop" in report.skipped["0"]
    assert torch.equal(model[0](x), want)
    chosen = nn.Sequential(_hooked(kind), nn.Linear(64, 32))
    with pytest.raises(ValueError, match="^0: .*FP4Linear would drop"):
        fp4_ops.quantize_model(chosen, include=["*"])
    assert [type(m) for m in chosen] == [nn.Linear, nn.Linear]


def test_linears_without_inputs_are_refused():
    """nn.Linear(0, N) has no block to quantize: quantize_model skips it with its reason (or
    refuses it where ``include`` chooses it), from_linear refuses it, naming in_features."""
    model = nn.Sequential(nn.Linear(0, 64), nn.Linear(64, 32))
    report = fp4_ops.quantize_model(model)
    assert report.replaced == ["1"] and "in_features = 0" in report.skipped["0"]
    with pytest.raises(ValueError, match="^0: in_features = 0"):
        fp4_ops.quantize_model(nn.Sequential(nn.Linear(0, 64)), include="0")
    with pytest.raises(ValueError, match="^linear: in_features = 0"):
        FP4Linear.from_linear(nn.Linear(0, 64))


@pytest.mark.parametrize("scale", [1.0, 2.0**-126, 1e-43, 0.0], ids=["1", "tiny", "subnormal", "0"])
def test_calibrated_scale_is_the_dynamic_scale_of_the_same_input(scale):
    """One calibration input makes each layer's static scale the global scale its dynamic
    quantization takes of that input, bit for bit (float32 amax / 2688; 1.0 where that is 0
    or underflows), and every layer static."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    fp4_ops.quantize_model(model)
    dynamic = copy.deepcopy(model)
    x = _x((4, 64), seed=57) * scale
    hidden = model[0](x)
    fp4_ops.calibrate(model, lambda m: (m[0](x), m[1](hidden)))
    assert [m.activations for m in model] == ["static", "static"]
    for layer, before, a in zip(model, dynamic, (x, hidden), strict=True):
        want = fp4_ops.quantize(a.detach()).global_scale
        assert torch.equal(layer.input_global_scale, want.reshape(layer.input_global_scale.shape))
        assert before.activations == "dynamic"


def test_calibrate_changes_no_layer_where_making_one_fails(monkeypatch):
    """Where a static layer cannot be made (an error at the second), calibrate raises with
    every layer as it was: all are made before any is swapped in."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    fp4_ops.quantize_model(model)
    before = list(model)
    real, made = FP4Linear.__init__, []

    def init(self, *args, **kwargs):
        made.append(args)
        if len(made) == 2:
            raise ValueError("the second static layer")
        real(self, *args, **kwargs)

    monkeypatch.setattr(FP4Linear, "__init__", init)
    x = _x((4, 64), seed=58)
    with pytest.raises(ValueError, match="the second static layer"):
        fp4_ops.calibrate(model, lambda m: m(x))
    assert list(model) == before and all(m.activations == "dynamic" for m in model)


def test_calibrate_takes_nvfp4_layers_under_every_name_without_gradients():
    """calibrate makes static the NVFP4 layers with dynamic scales only (an MXFP4 layer keeps
    its per-call scales), a layer under two names one static layer under both, and runs the
    forward loop with gradients off."""
    shared = nn.Linear(64, 64)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(64, 64))
    fp4_ops.quantize_model(model, include=["0", "2"])
    fp4_ops.quantize_model(model, include="3", format="mxfp4")
    outputs = []
    x = _x((4, 64), seed=54).requires_grad_()
    assert fp4_ops.calibrate(model, lambda m: outputs.append(m(x))) == ["0", "2"]
    assert model[0] is model[2] and model[0].activations == "static"
    assert model[3].format == "mxfp4" and model[3].activations == "dynamic"
    assert not outputs[0].requires_grad


def test_calibrate_leaves_w4a16_layers_16_bit():
    """A W4A16 layer (16-bit activations) is not calibrated: it keeps its activations and is
    not among the names returned."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32)).bfloat16()
    fp4_ops.quantize_model(model, include="0")
    fp4_ops.quantize_model(model, include="1", activations="bf16")
    x = _x((4, 64), seed=55).bfloat16()
    assert fp4_ops.calibrate(model, lambda m: m(x)) == ["0"]
    assert [m.activations for m in model] == ["static", "bf16"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_quantize_model_names_a_linear_whose_weight_fp4_cannot_encode(bad):
    """A weight holding NaN or Inf is a ValueError naming the module (the GPU quantizer would
    give it NaN scales instead), and the model is left as it was."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    with torch.no_grad():
        model[1].weight[3, 5] = bad
    with pytest.raises(ValueError, match="^1: weight contains NaN or Inf"):
        fp4_ops.quantize_model(model)
    assert [type(m) for m in model] == [nn.Linear, nn.Linear]
    with pytest.raises(ValueError, match="^weight contains NaN or Inf"):
        FP4Linear.from_linear(model[1])


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_quantize_model_keeps_each_modules_mode(train):
    """The FP4 modules put in place keep the train / eval mode of the ones they replace."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Sequential(nn.Linear(64, 32))).train(train)
    model[1][0].train(not train)  # (a module's own mode, not its model's)
    fp4_ops.quantize_model(model, activations="bf16")
    assert [type(m) for m in model.modules()].count(FP4Linear) == 2
    assert [m.training for m in model.modules()] == [train, train, train, not train]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_calibrate_keeps_each_layers_mode(train):
    """The static layers calibrate puts in place keep the train / eval mode of the dynamic
    ones they replace."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32)).train(train)
    fp4_ops.quantize_model(model)
    assert fp4_ops.calibrate(model, lambda m: m(_x((4, 64), seed=52))) == ["0", "1"]
    assert [m.activations for m in model] == ["static", "static"]
    assert [m.training for m in model.modules()] == [train] * 3


def test_fp4tensors_compare_by_identity():
    """``==`` and ``in`` on FP4Tensors compare the objects (as for modules), never the tensors'
    values (whose truth value is ambiguous)."""
    a = fp4_ops.quantize(_x((8, 64), seed=51))
    b = FP4Tensor(a.data, a.scale, a.global_scale, a.format)
    assert a == a and a != b and a in [a] and b not in [a] and len({a, b, a}) == 2


# ----------------------------------------------------------------------------- argument checks


def _argument_cases():
    """(call, exception, message) for wrong argument types and values."""
    x = _x((8, 64), seed=32)
    a = fp4_ops.quantize(x)
    b = fp4_ops.quantize(_x((24, 64), seed=33))
    layer = _layer(_linear(seed=34), "nvfp4", "dynamic")
    model = nn.Sequential(nn.Linear(64, 64))
    data, scales, gs = reference.quantize_nvfp4(x)
    return {
        "quantize x": (lambda: fp4_ops.quantize(x.tolist()), TypeError, "^x must be"),
        "quantize format type": (lambda: fp4_ops.quantize(x, 16), TypeError, "^format must be"),
        "quantize format value": (lambda: fp4_ops.quantize(x, "fp8"), ValueError, "^format"),
        "quantize global_scale str": (
            lambda: fp4_ops.quantize(x, global_scale="0.01"),
            TypeError,
            "^global_scale must be",
        ),
        "quantize global_scale bool": (
            lambda: fp4_ops.quantize(x, global_scale=True),
            TypeError,
            "^global_scale must be",
        ),
        "quantize global_scale int tensor": (
            lambda: fp4_ops.quantize(x, global_scale=torch.tensor(1)),
            ValueError,
            "^global_scale must be a floating-point",
        ),
        "FP4Linear integer bias": (
            lambda: FP4Linear(layer.weight, torch.arange(48)),
            ValueError,
            "^bias must be floating point",
        ),
        "fp4_gemm alpha str": (lambda: fp4_ops.fp4_gemm(a, b, alpha="2"), TypeError, "^alpha"),
        "fp4_gemm alpha bool": (lambda: fp4_ops.fp4_gemm(a, b, alpha=True), TypeError, "^alpha"),
        "fp4_gemm alpha shape": (
            lambda: fp4_ops.fp4_gemm(a, b, alpha=torch.ones(2)),
            ValueError,
            "^alpha",
        ),
        "fp4_gemm out_dtype str": (
            lambda: fp4_ops.fp4_gemm(a, b, "bfloat16"),
            TypeError,
            "^out_dtype must be",
        ),
        "fp4_gemm out_dtype value": (
            lambda: fp4_ops.fp4_gemm(a, b, torch.float64),
            ValueError,
            "^out_dtype must be",
        ),
        "fp4_gemm a": (lambda: fp4_ops.fp4_gemm([1.0], b), TypeError, "^a must be"),
        "fp4_gemm b": (lambda: fp4_ops.fp4_gemm(a, b.data), TypeError, "^b must be"),
        "fp4_gemm 2-D a, batched b": (
            lambda: fp4_ops.fp4_gemm(a, fp4_ops.quantize(_x((2, 24, 64)))),
            ValueError,
            "a must be \\[L, M, K\\]",
        ),
        "quantize_model model": (
            lambda: fp4_ops.quantize_model(layer.state_dict()),
            TypeError,
            "^model must be",
        ),
        "quantize_model include int": (
            lambda: fp4_ops.quantize_model(model, include=123),
            TypeError,
            "^include must be",
        ),
        "quantize_model include items": (
            lambda: fp4_ops.quantize_model(model, include=["0", 1]),
            TypeError,
            "^include must be",
        ),
        "quantize_model include arity": (
            lambda: fp4_ops.quantize_model(model, include=lambda name: True),
            TypeError,
            "^include: a predicate is called as include\\(name, module\\)",
        ),
        "quantize_model include result": (
            lambda: fp4_ops.quantize_model(model, include=lambda name, m: "yes"),
            TypeError,
            "^include\\(name, module\\) must return a bool",
        ),
        "quantize_model activations": (
            lambda: fp4_ops.quantize_model(model, activations=None),
            TypeError,
            "^activations must be",
        ),
        "FP4Linear x 0-d": (lambda: layer(torch.tensor(1.0)), ValueError, "^x must be"),
        "FP4Linear x type": (lambda: layer(x.numpy()), TypeError, "^x must be"),
        "FP4Linear x dtype": (lambda: layer(x.double()), ValueError, "^x must be"),
        "FP4Linear weight": (lambda: FP4Linear(x), TypeError, "^weight must be"),
        "FP4Linear bias": (lambda: FP4Linear(b, bias=[0.0] * 24), TypeError, "^bias must be"),
        "FP4Linear bias shape": (
            lambda: FP4Linear(b, bias=torch.zeros(23)),
            ValueError,
            "^bias must be",
        ),
        "FP4Linear activations": (
            lambda: FP4Linear(b, activations=True),
            TypeError,
            "^activations must be",
        ),
        "FP4Linear.from_linear linear": (
            lambda: FP4Linear.from_linear(nn.Conv1d(64, 8, 1)),
            TypeError,
            "^linear must be",
        ),
        "FP4Linear.from_linear format": (
            lambda: FP4Linear.from_linear(nn.Linear(64, 8), format=None),
            TypeError,
            "^format must be",
        ),
        "FP4Tensor global_scale": (
            lambda: FP4Tensor(a.data, a.scale, 1.0, "nvfp4"),
            TypeError,
            "^FP4Tensor.global_scale must be",
        ),
        "FP4Tensor format": (
            lambda: FP4Tensor(a.data, a.scale, a.global_scale, 16),
            TypeError,
            "^FP4Tensor.format must be",
        ),
        "from_plain data": (
            lambda: FP4Tensor.from_plain(data.numpy(), scales, gs),
            TypeError,
            "^data must be",
        ),
        "from_plain scales": (
            lambda: FP4Tensor.from_plain(data, None, gs),
            TypeError,
            "^scales must be",
        ),
        "from_modelopt weight_scale": (
            lambda: FP4Tensor.from_modelopt(data, scales[:, :2], gs),
            ValueError,
            "^weight_scale has shape",
        ),
        "to_torchao swizzled": (
            lambda: a.to_torchao(swizzled="yes"),
            TypeError,
            "^swizzled must be",
        ),
        "dequantize dtype": (lambda: a.dequantize("float32"), TypeError, "^dtype must be"),
        "dequantize int dtype": (lambda: a.dequantize(torch.int32), ValueError, "^dtype must be"),
        "dequantize bool dtype": (lambda: a.dequantize(torch.bool), ValueError, "^dtype must be"),
        "dequantize FP8 dtype": (
            lambda: a.dequantize(torch.float8_e4m3fn),
            ValueError,
            "^dtype must be one of torch.float32",
        ),
        "F.linear with an FP4 weight": (
            lambda: F.linear(x, layer.weight),
            TypeError,
            "not a torch.Tensor",
        ),
    }


@pytest.mark.parametrize("case", list(_argument_cases()))
def test_arguments_are_checked_by_name(case):
    """A wrong type is a TypeError, a wrong value a ValueError, each naming the argument."""
    call, error, match = _argument_cases()[case]
    with pytest.raises(error, match=match):
        call()


def test_forward_checks_x_only(monkeypatch):
    """The held weights are checked once, at construction and load: a forward builds no
    checked FP4Tensor."""
    layer = _layer(_linear(seed=35), "nvfp4", "static")
    built = []
    monkeypatch.setattr(FP4Tensor, "__post_init__", lambda self: built.append(self))
    layer(_x((4, 64)))
    assert built == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf")], ids=str)
def test_gpu_global_scale_is_refused_by_a_device_side_assert(bad):
    """On CUDA a global scale is checked without a host sync: a device-side assert fails the
    process at its next synchronisation (run in a subprocess, which it ends), while a good
    scale passes the same path."""
    import subprocess
    import sys

    script = (
        "import sys, torch, fp4_ops\n"
        "q = fp4_ops.quantize(torch.randn(4, 64, device='cuda'))\n"
        "gs = torch.tensor(float(sys.argv[1]), device='cuda')\n"
        "fp4_ops.FP4Tensor(q.data, q.scale, gs, 'nvfp4')\n"
        "torch.cuda.synchronize()\n"
        "print('accepted')\n"
    )
    good = subprocess.run([sys.executable, "-c", script, "0.5"], capture_output=True, text=True)
    assert good.returncode == 0 and "accepted" in good.stdout, good.stderr
    r = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "accepted" not in r.stdout
    assert "must be finite and positive" in r.stderr or "device-side assert" in r.stderr, r.stderr


def test_unpickling_an_older_layer_gives_it_every_cache():
    """A pickled FP4Linear from before a derived-value cache existed lacks that attribute in its
    state: unpickled, it has the cache, empty, and computes."""
    layer = fp4_ops.FP4Linear.from_linear(
        torch.nn.Linear(64, 32), activations="static", input_global_scale=0.5
    )
    state = layer.__getstate__()
    for name in layer.CACHES:
        del state[name]
    other = fp4_ops.FP4Linear.__new__(fp4_ops.FP4Linear)
    other.__setstate__(state)
    assert all(getattr(other, name) is None for name in layer.CACHES)
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(other(x), layer(x))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("default", [torch.bfloat16, torch.float64])
def test_cpu_results_ignore_torch_default_dtype(fmt, default, set_default_dtype):
    """torch's default dtype reaches none of the CPU path's constants: under a bfloat16 or a
    float64 default, quantize (dynamic and static scale), dequantize, fp4_gemm and an FP4Linear
    (W4A4 and W4A16) give the same bits as under float32."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, generator=gen, dtype=torch.float32)
    w = torch.randn(40, 64, generator=gen, dtype=torch.float32)
    linear = nn.Linear(64, 40, dtype=torch.float32)
    static = torch.tensor(0.01, dtype=torch.float32) if fmt == "nvfp4" else None

    def results():
        a, b = fp4_ops.quantize(x, fmt), fp4_ops.quantize(w, fmt, static)
        w4a4 = FP4Linear.from_linear(linear, format=fmt)
        w4a16 = FP4Linear.from_linear(
            copy.deepcopy(linear).bfloat16(), format=fmt, activations="bf16"
        )
        outs = [t.data for t in (a, b)] + [t.scale.view(torch.uint8) for t in (a, b)]
        outs += [a.global_scale, b.global_scale, a.dequantize(), fp4_ops.fp4_gemm(a, b)]
        return outs + [w4a4(x), w4a16(x.bfloat16())]

    want = results()
    set_default_dtype(default)
    got = results()
    for i, (g, e) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == e.dtype and torch.equal(g, e), i


def test_dequantize_gives_its_values_in_every_float_dtype():
    """float32 / float64 / bfloat16 / float16: the same values, rounded once into the dtype."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(9), dtype=torch.float32)
    a = fp4_ops.quantize(x)
    exact = a.dequantize(torch.float64)
    assert exact.dtype == torch.float64 and torch.equal(a.dequantize(), exact.float())
    for dtype in (torch.bfloat16, torch.float16):
        got = a.dequantize(dtype)
        assert got.dtype == dtype and torch.equal(got, exact.to(dtype))


@pytest.mark.parametrize("first, second", [(1.0, 2.0), (2.0, 1.0), (0.5, 0.5)])
def test_device_scalar_is_one_tensor_per_value_and_device(first, second):
    """``device_scalar`` keeps one tensor per (value, device): the same value gives the same
    tensor, another value its own, each holding its value whatever was asked for before."""
    from fp4_ops import memory

    cpu = torch.device("cpu")
    a, b = memory.device_scalar(first, cpu), memory.device_scalar(second, cpu)
    assert a.dtype == torch.float32 and a.shape == ()
    assert (a.item(), b.item()) == (first, second)
    assert (a is b) == (first == second) and memory.device_scalar(first, cpu) is a
    assert memory.unit_scale(cpu).item() == 1.0
