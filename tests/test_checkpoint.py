# SPDX-License-Identifier: BSD-3-Clause
"""``fp4_ops.load_quantized`` / ``save_quantized`` on tiny random transformers models (Llama,
Qwen2 with biases, Qwen3; built from configs, nothing downloaded), CPU only:

* round trips in both formats, every mode, sharded or not: identical FP4 buffers, logits equal
  bit for bit to the FP4 model before saving and to a ``reference.py`` model fed the raw
  checkpoint tensors, within FP4 error of the BF16 model; no 16-bit weight made for an FP4
  layer;
* compressed-tensors' own code both ways: checkpoints its compressor writes (NVFP4A16, NVFP4,
  MXFP4A16, MXFP4; its target / ignore matching) load here, and ours load in transformers'
  compressed-tensors integration, logits within BF16 rounding of each other; its ModelOpt
  converter turns our ModelOpt tensors into our compressed-tensors ones;
* refusals: each unsupported scheme, missing / mis-shaped / wrong-dtype / left-over tensor, bad
  scale values, broken shards, bad arguments.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shutil
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import fp4_ops
import reference
from fp4_ops import FP4Linear

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e .[hf])"
)
safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="safetensors is not installed (pip install -e .[hf])"
)

VOCAB = 256
RESIZE_REFUSED = r"^resize_token_embeddings: the output embedding is an FP4Linear, "
GS_DIVISOR = 448.0 * 6.0


def _needs_compressed_tensors():
    return pytest.importorskip(
        "compressed_tensors", reason="compressed-tensors is not installed (pip install -e .[hf])"
    )


# ----------------------------------------------------------------------------- tiny models


def _config(arch: str, tie: bool = False):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        initializer_range=0.1,
        dtype="bfloat16",
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":  # (q, k, v with biases)
        return transformers.Qwen2Config(**common)
    if arch == "mistral":
        return transformers.MistralConfig(head_dim=16, **common)
    return transformers.Qwen3Config(head_dim=16, **common)


def _model(arch: str, tie: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, tie)).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.normal_(0, 0.5)  # (zero at init: make them count)
    return model


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _input_amax(model, ids) -> dict[str, float]:
    """Calibration: the largest |input| of every Linear over ``ids``."""
    amax: dict[str, float] = {}

    def hook(name):
        def record(_module, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().amax()))

        return record

    handles = [
        m.register_forward_pre_hook(hook(n))
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear)
    ]
    _logits(model, ids)
    for h in handles:
        h.remove()
    return amax


def _quantize(model, layers: dict[str, tuple[str, str]]) -> None:
    """``layers``: glob -> (format, activations). Dynamic and W4A16 layers by quantize_model;
    static ones (which it does not make) by FP4Linear.from_linear with calibrated scales."""
    amax = _input_amax(model, _ids(99))
    for pattern, (fmt, mode) in layers.items():
        if mode != "static":
            report = fp4_ops.quantize_model(model, [pattern], fmt, mode)
            assert report.replaced and not report.skipped
            continue
        names = [
            n
            for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and fnmatch.fnmatchcase(n, pattern)
        ]
        assert names
        for name in names:
            linear = model.get_submodule(name)
            layer = FP4Linear.from_linear(linear, fmt, "static", amax[name] / GS_DIVISOR)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)


def _fp4(model) -> dict[str, FP4Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, FP4Linear)}


def _raw(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder, read with plain safetensors."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


class _ReferenceLinear(nn.Module):
    """A quantized Linear computed by ``reference.py`` from a checkpoint's raw tensors, each
    format's conventions written out here (independently of the loader)."""

    def __init__(self, raw: dict, prefix: str, checkpoint: str, fmt: str, mode: str):
        super().__init__()
        if checkpoint == "modelopt":
            self.data, self.scales = raw[prefix + "weight"], raw[prefix + "weight_scale"]
            self.gs = raw[prefix + "weight_scale_2"].reshape(())  # decoding convention
            inp = raw.get(prefix + "input_scale")
        else:
            self.data, self.scales = raw[prefix + "weight_packed"], raw[prefix + "weight_scale"]
            if fmt == "nvfp4":  # encoding convention: 448 * 6 / amax
                self.gs = 1.0 / raw[prefix + "weight_global_scale"].reshape(())
            else:  # E8M0 bytes, no global scale
                self.scales = self.scales.view(torch.float8_e8m0fnu)
                self.gs = torch.tensor(1.0)
            inp = raw.get(prefix + "input_global_scale")
            inp = None if inp is None else 1.0 / inp
        self.input_gs = None if inp is None else inp.reshape(())
        self.bias = raw.get(prefix + "bias")
        self.fmt, self.mode = fmt, mode

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        vec = fp4_ops.FORMATS[self.fmt]
        if self.mode == "bf16":
            y = reference.reference_gemm_w4a16(rows, self.data, self.scales, vec, self.gs, x.dtype)
        else:
            if self.mode == "static":
                a, sa, gsa = reference.quantize_nvfp4(rows, self.input_gs)
            else:
                a, sa = reference.quantize_mxfp4(rows)
                gsa = torch.tensor(1.0)
            y = reference.reference_gemm(a, self.data, sa, self.scales, vec, gsa * self.gs, x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], -1)


def _reference_model(bf16_model, folder: Path, checkpoint: str, modes: dict) -> nn.Module:
    """The BF16 model with each quantized Linear (name -> (format, mode)) replaced by a
    ``_ReferenceLinear`` over the checkpoint's raw tensors."""
    model = copy.deepcopy(bf16_model)
    raw = _raw(folder)
    for name, (fmt, mode) in modes.items():
        parent, _, attr = name.rpartition(".")
        layer = _ReferenceLinear(raw, name + ".", checkpoint, fmt, mode)
        setattr(model.get_submodule(parent), attr, layer)
    return model


# ----------------------------------------------------------------------------- round trips


@dataclass
class Case:
    arch: str
    checkpoint: str
    layers: dict
    tie: bool = False
    shard: int | None = None  # max_shard_size in bytes

    def __str__(self):
        modes = "+".join(f"{f}-{m}" for f, m in self.layers.values())
        lm = "-lm_head" if "lm_head" in self.layers else ""
        tie = "-tied" if self.tie else ""
        return f"{self.arch}{tie}-{self.checkpoint}-{modes}{lm}{'-sharded' if self.shard else ''}"


LAYERS = "model.layers.*"
CASES = [
    Case("llama", "compressed-tensors", {LAYERS: ("nvfp4", "static")}),
    Case("llama", "modelopt", {LAYERS: ("nvfp4", "static")}, shard=20_000),
    Case("qwen2", "compressed-tensors", {LAYERS: ("mxfp4", "dynamic")}),
    Case("qwen2", "modelopt", {LAYERS: ("nvfp4", "bf16")}),
    Case("qwen3", "compressed-tensors", {LAYERS: ("nvfp4", "bf16")}, shard=30_000),
    Case("qwen3", "compressed-tensors", {LAYERS: ("mxfp4", "bf16")}),
    Case("mistral", "modelopt", {LAYERS: ("nvfp4", "static")}),
    Case("mistral", "compressed-tensors", {LAYERS: ("nvfp4", "bf16")}),
    # a quantized output embedding of a tied model: saved untied
    Case("qwen2", "compressed-tensors", {"*": ("nvfp4", "static")}, tie=True),
    # tied 16-bit embeddings: stored once, tied again on load
    Case("qwen3", "modelopt", {LAYERS: ("nvfp4", "static")}, tie=True),
    # mixed formats and modes: one compressed-tensors group each
    Case(
        "llama",
        "compressed-tensors",
        {
            "*.self_attn.*": ("nvfp4", "static"),
            "*.mlp.*": ("mxfp4", "dynamic"),
            "lm_head": ("nvfp4", "bf16"),
        },
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_round_trip(case, tmp_path, monkeypatch):
    bf16 = _model(case.arch, case.tie)
    model = copy.deepcopy(bf16)
    _quantize(model, case.layers)
    before = _fp4(model)
    modes = {n: (m.format, m.activations) for n, m in before.items()}
    ct = case.checkpoint == "compressed-tensors"

    fp4_ops.save_quantized(model, tmp_path, case.checkpoint, max_shard_size=case.shard)
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    if case.shard:
        assert len(shards) > 1 and index.is_file() and "model.safetensors" not in shards
    else:
        assert shards == ["model.safetensors"] and not index.exists()
    assert (tmp_path / "hf_quant_config.json").is_file() != ct

    made = []  # (the device of every nn.Linear weight initialized while loading)
    reset = nn.Linear.reset_parameters
    monkeypatch.setattr(
        nn.Linear, "reset_parameters", lambda self: (made.append(self.weight.device), reset(self))
    )
    loaded = fp4_ops.load_quantized(tmp_path)
    monkeypatch.undo()
    assert made and {d.type for d in made} == {"meta"}
    assert not loaded.training and loaded.dtype == torch.bfloat16
    # (transformers' own writer would fail half-way on the FP4 layers: refused up front)
    with pytest.raises(ValueError, match=r"^save_pretrained: .*fp4_ops\.save_quantized"):
        loaded.save_pretrained(tmp_path / "again")
    assert not (tmp_path / "again").exists()
    vocab = loaded.get_input_embeddings().weight.shape[0]
    if isinstance(loaded.get_output_embeddings(), FP4Linear):
        with pytest.raises(ValueError, match=RESIZE_REFUSED):
            loaded.resize_token_embeddings(vocab + 8)
        assert loaded.get_input_embeddings().weight.shape[0] == vocab

    after = _fp4(loaded)
    assert after.keys() == before.keys()
    for name, old in before.items():
        new = after[name]
        assert (new.format, new.activations) == (old.format, old.activations), name
        assert torch.equal(new.weight.data, old.weight.data), name
        assert torch.equal(new.weight.scale.view(torch.uint8), old.weight.scale.view(torch.uint8))
        for attr in ("weight_global_scale", "input_global_scale"):
            g = getattr(old, attr)
            if g is None:
                assert getattr(new, attr) is None
                continue
            # compressed-tensors stores 1 / g in fp32: g comes back as 1 / (1 / g)
            want = 1.0 / (1.0 / g) if ct else g
            assert torch.equal(getattr(new, attr), want), (name, attr)
            if ct:
                assert abs(float(want) - float(g)) <= float(g) * 2.0**-23
                with torch.no_grad():
                    getattr(old, attr).copy_(want)  # (now the FP4 model saved is the one loaded)
        if old.bias is not None:
            assert new.bias.dtype == torch.bfloat16 and torch.equal(new.bias, old.bias)
    for name, m in bf16.named_modules():
        if isinstance(m, nn.Linear) and name not in before:
            assert type(loaded.get_submodule(name)) is nn.Linear, name
    embed = loaded.get_input_embeddings().weight
    tied = loaded.get_output_embeddings().weight is embed
    assert tied == (case.tie and "lm_head" not in before)
    assert torch.equal(embed, bf16.get_input_embeddings().weight)

    ids = _ids(1)
    got = _logits(loaded, ids)
    assert torch.equal(got, _logits(model, ids))
    assert torch.equal(got, _logits(_reference_model(bf16, tmp_path, case.checkpoint, modes), ids))
    assert 0.01 < _rel(got, _logits(bf16, ids)) < 0.6  # (FP4 error of the BF16 model)


def test_dynamic_nvfp4_saves_weight_only_and_loads_back_dynamic(tmp_path):
    """quantize_model's default (NVFP4 W4A4, dynamic global scales) has no checkpoint form:
    refused, or saved weight-only with activations="bf16"; activations="dynamic" at load makes
    the same model again."""
    model = _model("llama")
    fp4_ops.quantize_model(model, [LAYERS])
    with pytest.raises(ValueError, match="dynamic .*activations='bf16'"):
        fp4_ops.save_quantized(model, tmp_path)
    assert not (tmp_path / "config.json").exists()
    fp4_ops.save_quantized(model, tmp_path, activations="bf16")
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["input_activations"] is None
    w4a16 = fp4_ops.load_quantized(tmp_path)
    assert {m.activations for m in _fp4(w4a16).values()} == {"bf16"}
    again = fp4_ops.load_quantized(tmp_path, device="cpu", activations="dynamic")
    assert {m.activations for m in _fp4(again).values()} == {"dynamic"}
    ids = _ids(1)
    assert torch.equal(_logits(again, ids), _logits(model, ids))
    assert not torch.equal(_logits(w4a16, ids), _logits(model, ids))


def test_generation_config_and_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    model = _model("qwen3")
    fp4_ops.quantize_model(model, [LAYERS], activations="bf16")
    model.generation_config.max_new_tokens = 7
    fp4_ops.save_quantized(model, tmp_path, "modelopt", tokenizer=tokenizer)
    loaded = fp4_ops.load_quantized(tmp_path)
    assert loaded.generation_config.max_new_tokens == 7
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert again("w3 w7 zz")["input_ids"] == [3, 7, VOCAB - 1]


# ------------------------------------------------------------ compressed-tensors' own code


def _ct_write(folder: Path, bf16_model, scheme: str, targets=("Linear",), ignore=("lm_head",)):
    """A checkpoint written by compressed-tensors: its QuantizationConfig applied to the BF16
    model, weight (and input) scales from its own qparam functions, its ModelCompressor packing,
    transformers' save_pretrained. Returns the names it quantized."""
    ct = _needs_compressed_tensors()
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
        quant_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    model = copy.deepcopy(bf16_model)
    amax = _input_amax(model, _ids(99))
    scheme_args = getattr(quant_scheme, scheme)
    groups = {"group_0": QuantizationScheme(targets=list(targets), **scheme_args)}
    apply_quantization_config(model, QuantizationConfig(config_groups=groups, ignore=list(ignore)))
    quantized = []
    with torch.no_grad():
        for name, m in model.named_modules():
            if getattr(m, "quantization_scheme", None) is None:
                continue
            quantized.append(name)
            w, args = m.weight, m.quantization_scheme.weights
            gs = None
            if hasattr(m, "weight_global_scale"):
                gs = generate_gparam(w.amin(), w.amax())
                m.weight_global_scale.copy_(gs)
            blocks = w.unflatten(-1, (-1, args.group_size))
            m.weight_scale.data = calculate_qparams(blocks.amin(-1), blocks.amax(-1), args, gs)[0]
            if hasattr(m, "input_global_scale"):
                a = torch.tensor(amax[name])
                m.input_global_scale.copy_(generate_gparam(-a, a))
    compressor = ct.compressors.ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    return quantized


def _ct_dequantized(folder: Path):
    """The checkpoint as transformers' compressed-tensors integration loads it, decompressed to
    16-bit weights."""
    _needs_compressed_tensors()
    from compressed_tensors.quantization import disable_quantization

    try:
        config = transformers.CompressedTensorsConfig(dequantize=True)
    except TypeError:
        config = transformers.CompressedTensorsConfig(run_compressed=False)
    with warnings.catch_warnings():  # (that the folder's own quantization_config is used)
        warnings.simplefilter("ignore", UserWarning)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, quantization_config=config
            )
        except ImportError as err:  # (transformers 4.x loads quantized models with accelerate)
            pytest.skip(f"transformers' compressed-tensors loading needs {err.name}")
    if any(
        isinstance(m, torch.nn.Linear) and "weight" not in m._parameters for m in model.modules()
    ):
        pytest.skip(
            f"transformers {transformers.__version__}'s compressed-tensors loading kept the "
            "weights compressed (no 16-bit reference)"
        )
    # (some versions keep the scheme's fake quantization of inputs and weights in forward)
    model.apply(disable_quantization)
    return model.eval()


def _check_against_ct(ours_bf16_mode, theirs, bf16, names) -> None:
    """Our W4A16 model against compressed-tensors' decompressed one: each weight within BF16
    rounding of theirs, logits an order of magnitude closer to theirs than FP4 is to BF16."""
    for name in names:
        ours = ours_bf16_mode.get_submodule(name).weight.dequantize()
        their = theirs.get_submodule(name).weight.float()
        assert torch.all((ours - their).abs() <= ours.abs() * 2.0**-8), name
    ids = _ids(1)
    got, want = _logits(ours_bf16_mode, ids), _logits(theirs, ids)
    assert _rel(got, want) < 0.1 * _rel(want, _logits(bf16, ids))


@pytest.mark.parametrize("scheme", ["NVFP4A16", "NVFP4", "MXFP4A16", "MXFP4"])
def test_compressed_tensors_checkpoint_loads(scheme, tmp_path):
    bf16 = _model("qwen2" if scheme.startswith("NV") else "llama")
    names = _ct_write(tmp_path, bf16, scheme)
    ours = fp4_ops.load_quantized(tmp_path)
    want = {"NVFP4A16": "bf16", "NVFP4": "static", "MXFP4A16": "bf16", "MXFP4": "dynamic"}[scheme]
    assert {n: m.activations for n, m in _fp4(ours).items()} == dict.fromkeys(names, want)
    raw = _raw(tmp_path)
    for name in names:
        layer = ours.get_submodule(name)
        if scheme == "NVFP4":  # (their input_global_scale is 448 * 6 / amax)
            want_gs = 1.0 / raw[name + ".input_global_scale"].reshape(())
            assert torch.equal(layer.input_global_scale, want_gs)
        assert torch.equal(layer.weight.data, raw[name + ".weight_packed"])
    theirs = _ct_dequantized(tmp_path)
    _check_against_ct(fp4_ops.load_quantized(tmp_path, activations="bf16"), theirs, bf16, names)


#: how each model type's checkpoints spell what transformers 5 names otherwise (written out here,
#: from transformers' conversion mappings): (transformers' prefix, the checkpoints')
STORED_PREFIXES = {
    "gpt_neox": [("lm_head.", "embed_out.")],
    "gemma3": [
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ],
}


def _renamed_model(model_type: str) -> nn.Module:
    """A tiny BF16 model of a type whose checkpoints spell some modules otherwise."""
    if model_type == "gpt_neox":
        config = transformers.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
        )
    else:  # (Gemma-3 with its vision tower, as the 4B-27B checkpoints; SigLIP without a head)
        text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, head_dim=16)
        text |= dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1)
        vision |= dict(num_attention_heads=4, image_size=32, patch_size=8, vision_use_head=False)
        text["tie_word_embeddings"] = False  # (its lm_head stored too, under its spelling)
        config = transformers.Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            image_token_index=255,
            tie_word_embeddings=False,
        )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(torch.bfloat16).eval()


def _stored_spelling(folder: Path, model_type: str) -> None:
    """The folder's tensors renamed to the checkpoints' spelling, where transformers' own
    save_pretrained (4.x) wrote its model's names."""
    raw = _raw(folder)
    renamed = {}
    for key, t in raw.items():
        for model_prefix, stored in STORED_PREFIXES[model_type]:
            if key.startswith(model_prefix):
                key = stored + key[len(model_prefix) :]
                break
        renamed[key] = t
    for f in folder.glob("*.safetensors"):
        f.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    safetensors_torch.save_file(renamed, str(folder / "model.safetensors"))


@pytest.mark.parametrize("model_type", sorted(STORED_PREFIXES))
def test_checkpoints_spelled_otherwise_than_the_model_load(model_type, tmp_path):
    """GPT-NeoX's checkpoints name lm_head embed_out, Gemma-3's vision-language ones put the
    language model under language_model.model (and so on), which transformers 5 renames: such
    a checkpoint written by compressed-tensors loads, within BF16 of compressed-tensors' own
    decompressed model; save_quantized writes that spelling, which transformers reads."""
    bf16 = _renamed_model(model_type)
    skipped = ("re:.*lm_head", "re:.*embed_out", "re:.*vision_tower.*", "re:.*multi_modal.*")
    names = _ct_write(tmp_path, bf16, "NVFP4A16", ignore=skipped)
    _stored_spelling(tmp_path, model_type)
    stored = {k for k in _raw(tmp_path)}
    assert any(k.startswith(s) for k in stored for _, s in STORED_PREFIXES[model_type][:1])
    ours = fp4_ops.load_quantized(tmp_path)
    assert set(_fp4(ours)) == set(names)
    saved = tmp_path / "saved"
    fp4_ops.save_quantized(ours, saved)
    assert {k for k in _raw(saved) if "weight_packed" not in k} <= stored
    major_minor = tuple(int(v) for v in transformers.__version__.split(".")[:2])
    if (5, 0) <= major_minor < (5, 23):
        pytest.skip(
            f"transformers {transformers.__version__} loads these spellings of a "
            "compressed-tensors checkpoint wrongly (5.23 on read them): no reference"
        )
    _check_against_ct(ours, _ct_dequantized(tmp_path), bf16, names)
    _check_against_ct(ours, _ct_dequantized(saved), bf16, names)


def _wider_model(model_type: str):
    """A tiny BF16 model whose checkpoints transformers renames as it loads them into its
    causal LM, and that renaming: (model, name -> stored key, name -> the causal LM's name).
    Qwen3.5: the vision-language model (its language model under model.language_model), of
    which AutoModelForCausalLM builds the language model alone; Nemotron-H: backbone. stored
    for model. (an attention and an MLP block)."""
    config_class = {"qwen3_5": "Qwen3_5Config", "nemotron_h": "NemotronHConfig"}[model_type]
    if not hasattr(transformers, config_class):
        pytest.skip(f"transformers {transformers.__version__} has no {config_class}")
    heads = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, **heads)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if model_type == "qwen3_5":
            layers = dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
            text = common | layers | dict(linear_num_value_heads=4, linear_num_key_heads=2)
            text |= dict(linear_key_head_dim=16, linear_value_head_dim=16)
            vision = dict(hidden_size=64, intermediate_size=128, depth=1, num_heads=4)
            vision |= dict(out_hidden_size=64, patch_size=8)
            config = transformers.Qwen3_5Config(
                text_config=text, vision_config=vision, tie_word_embeddings=False
            )
            model = transformers.Qwen3_5ForConditionalGeneration(config)
            renames = (lambda n: n, lambda n: n.replace("model.language_model.", "model.", 1))
        else:
            config = transformers.NemotronHConfig(
                layers_block_type=["attention", "mlp"], tie_word_embeddings=False, **common
            )
            model = transformers.AutoModelForCausalLM.from_config(config)
            renames = (lambda n: n.replace("model.", "backbone.", 1), lambda n: n)
    return model.to(torch.bfloat16).eval(), *renames


@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
def test_checkpoints_that_transformers_renames_load_into_its_causal_lm(model_type, tmp_path):
    """A compressed-tensors checkpoint of Qwen3.5's vision-language model and one of
    Nemotron-H, as transformers' save_pretrained spells them, load as transformers loads them:
    into the causal LM, each layer's codes as stored, the model within BF16 of
    compressed-tensors' own decompressed one."""
    bf16, stored, renamed = _wider_model(model_type)
    skipped = ("lm_head", "re:.*visual.*", "re:.*linear_attn.*")
    names = _ct_write(tmp_path, bf16, "NVFP4A16", ignore=skipped)
    raw = _raw(tmp_path)
    assert names and all(stored(n) + ".weight_packed" in raw for n in names)
    ours = fp4_ops.load_quantized(tmp_path)
    assert set(_fp4(ours)) == {renamed(n) for n in names}
    for name in names:
        layer = ours.get_submodule(renamed(name))
        assert torch.equal(layer.weight.data, raw[stored(name) + ".weight_packed"]), name
    # (save_quantized spells the names as transformers' own save_pretrained of that model)
    fp4_ops.save_quantized(ours, tmp_path / "saved")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = transformers.AutoModelForCausalLM.from_config(ours.config)
    plain.save_pretrained(tmp_path / "plain")
    tops = [{k.split(".")[0] for k in _raw(tmp_path / f)} for f in ("saved", "plain")]
    assert tops[0] == tops[1], tops
    major_minor = tuple(int(v) for v in transformers.__version__.split(".")[:2])
    if major_minor < (5, 23):
        pytest.skip(f"transformers {transformers.__version__}: no reference load of these")
    _check_against_ct(ours, _ct_dequantized(tmp_path), bf16, [renamed(n) for n in names])
    _check_against_ct(ours, _ct_dequantized(tmp_path / "saved"), bf16, [renamed(n) for n in names])


def test_a_model_named_as_its_checkpoints_saves_under_its_own_names(tmp_path):
    """Qwen3.5's vision-language model itself, quantized, names its modules as its checkpoints
    do (model.language_model.*): save_quantized keeps those names (no second language_model),
    and the checkpoint loads into the causal LM with the same codes."""
    vl, stored, renamed = _wider_model("qwen3_5")
    patterns = ["*.language_model.*.self_attn.*", "*.language_model.*.mlp.*"]
    fp4_ops.quantize_model(vl, patterns, activations="bf16")
    names = sorted(_fp4(vl))
    assert names and all(stored(n) == n for n in names)
    fp4_ops.save_quantized(vl, tmp_path, "modelopt")
    raw = _raw(tmp_path)
    assert all(n + ".weight" in raw for n in names)
    assert not [k for k in raw if "language_model.language_model" in k]
    ours = fp4_ops.load_quantized(tmp_path)
    assert set(_fp4(ours)) == {renamed(n) for n in names}
    for name in names:
        mine = ours.get_submodule(renamed(name))
        assert torch.equal(mine.weight.data, vl.get_submodule(name).weight.data), name


def test_a_checkpoint_spelled_as_transformers_renames_it_is_named_so(tmp_path):
    """A model type whose checkpoint names transformers renames on load and this loader does
    not know (EXAONE's transformer.h.*: its model is transformers' Llama) is refused, the
    missing key's error naming transformers' renames rather than leaving a plain "missing"."""
    cm = pytest.importorskip("transformers.conversion_mapping")
    if not cm.get_checkpoint_conversion_mapping("exaone") or not hasattr(
        transformers, "ExaoneConfig"
    ):
        pytest.skip(f"transformers {transformers.__version__} does not rename EXAONE's names")
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2)
    config = transformers.ExaoneConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bf16 = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    _ct_write(tmp_path, bf16, "NVFP4A16")
    assert any(k.startswith("transformer.h.") for k in _raw(tmp_path))
    renamed = r"missing .*\(exaone checkpoints may spell names as transformers renames them"
    with pytest.raises(ValueError, match=renamed + r".*\^transformer\\\.h\\\. -> model\.layers\."):
        fp4_ops.load_quantized(tmp_path)


@pytest.mark.parametrize(
    "groups, ignore",
    [
        ({"nvfp4": ["re:.*mlp\\..*_proj$"]}, ["re:.*layers\\.1\\..*"]),
        ({"nvfp4": ["Linear"]}, ["lm_head", "re:.*k_proj", "model.layers.0.mlp.up_proj"]),
        (
            {"nvfp4": ["model.layers.0.self_attn.q_proj", "re:model\\.layers\\.1\\.self_attn"]},
            ["v_proj"],
        ),
        ({"nvfp4": ["re:.*proj"]}, ["re:mlp", "re:.*layers.1.*"]),  # (re.match: at the start)
        ({"nvfp4": ["Linear"], "mxfp4": ["re:.*mlp.*"]}, ["lm_head"]),  # (a regex beats a class)
        (
            {"nvfp4": ["re:.*mlp.*"], "mxfp4": ["model.layers.0.mlp.up_proj"]},
            [],
        ),  # (a name beats both)
        ({"nvfp4": ["Linear"], "mxfp4": ["Linear"]}, ["lm_head"]),  # (two groups, one target)
    ],
    ids=["regex", "class-and-ignore", "names", "anchored", "precedence", "name-first", "twice"],
)
def test_compressed_tensors_matching(groups, ignore, tmp_path):
    """Which Linear gets which scheme from config_groups' targets and ignore (exact names,
    ``re:`` regexes, class names, and their precedence): compressed-tensors' own
    apply_quantization_config decides on a BF16 copy; a checkpoint of those layers, its config
    given the patterns, loads here with the same layers in the same formats."""
    _needs_compressed_tensors()
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
        quant_scheme,
    )

    bf16 = _model("llama")
    oracle = copy.deepcopy(bf16)
    presets = {"nvfp4": quant_scheme.NVFP4A16, "mxfp4": quant_scheme.MXFP4A16}
    config = QuantizationConfig(
        config_groups={
            fmt: QuantizationScheme(targets=targets, **presets[fmt])
            for fmt, targets in groups.items()
        },
        ignore=ignore,
    )
    apply_quantization_config(oracle, config, show_progress=False)
    want = {
        n: {16: "nvfp4", 32: "mxfp4"}[m.quantization_scheme.weights.group_size]
        for n, m in oracle.named_modules()
        if getattr(m, "quantization_scheme", None) is not None
    }
    assert 0 < len(want) < 15

    model = copy.deepcopy(bf16)
    for name, fmt in want.items():
        parent, _, attr = name.rpartition(".")
        setattr(
            model.get_submodule(parent),
            attr,
            FP4Linear.from_linear(model.get_submodule(name), fmt, "bf16"),
        )
    fp4_ops.save_quantized(model, tmp_path)
    # (each format's group as save_quantized writes it, whichever formats this model holds)
    both = _model("llama")
    for name, fmt in (("model.layers.0.mlp.up_proj", "nvfp4"), ("lm_head", "mxfp4")):
        parent, _, attr = name.rpartition(".")
        layer = FP4Linear.from_linear(both.get_submodule(name), fmt, "bf16")
        setattr(both.get_submodule(parent) if parent else both, attr, layer)
    fp4_ops.save_quantized(both, tmp_path / "both")
    written = json.loads((tmp_path / "both/config.json").read_text())["quantization_config"]
    saved = {g["format"]: g for g in written["config_groups"].values()}

    def patterns(qc):
        qc["config_groups"] = {
            fmt: {**saved[f"{fmt}-pack-quantized"], "targets": targets}
            for fmt, targets in groups.items()
        }
        qc["ignore"] = ignore

    _qc(patterns)(tmp_path)
    loaded = fp4_ops.load_quantized(tmp_path)
    assert {n: m.format for n, m in _fp4(loaded).items()} == want


@pytest.mark.parametrize("fmt, mode", [("nvfp4", "static"), ("mxfp4", "dynamic")])
def test_our_checkpoint_loads_in_compressed_tensors(fmt, mode, tmp_path):
    bf16 = _model("qwen3")
    model = copy.deepcopy(bf16)
    _quantize(model, {LAYERS: (fmt, mode)})
    fp4_ops.save_quantized(model, tmp_path)
    theirs = _ct_dequantized(tmp_path)
    w4a16 = copy.deepcopy(model)
    for name, layer in _fp4(w4a16).items():  # (the same weights, 16-bit activations)
        parent, _, attr = name.rpartition(".")
        setattr(w4a16.get_submodule(parent), attr, FP4Linear(layer.weight, None, "bf16"))
    _check_against_ct(w4a16, theirs, bf16, list(_fp4(model)))


def test_modelopt_tensors_convert_to_ours_with_compressed_tensors(tmp_path):
    """compressed-tensors' ModelOpt -> compressed-tensors converter (renames, 1 / x of the
    global scales) takes our ModelOpt checkpoint to our compressed-tensors one, bit for bit."""
    ct = _needs_compressed_tensors()
    if tuple(int(v) for v in ct.__version__.split(".")[:2]) < (0, 20):
        pytest.skip(
            f"compressed-tensors {ct.__version__}'s converter renames unquantized weights too "
            "(model.embed_tokens.weight -> weight_packed; 0.20 on do not)"
        )
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )

    model = _model("qwen2")
    _quantize(model, {LAYERS: ("nvfp4", "static")})
    fp4_ops.save_quantized(model, tmp_path / "mo", "modelopt")
    fp4_ops.save_quantized(model, tmp_path / "ct", "compressed-tensors")
    exclude = json.loads((tmp_path / "mo/hf_quant_config.json").read_text())["quantization"]
    converter = ModelOptNvfp4Converter(ignore=exclude["exclude_modules"])
    converted = converter.validate(_raw(tmp_path / "mo"))
    ours = _raw(tmp_path / "ct")
    assert converted.keys() == ours.keys()
    for key, t in ours.items():
        assert torch.equal(converted[key].reshape(t.shape), t), key


def test_modelopt_exclude_globs(tmp_path):
    model = _model("llama")
    _quantize(model, {"model.layers.0.*": ("nvfp4", "static")})
    fp4_ops.save_quantized(model, tmp_path, "modelopt")
    path = tmp_path / "hf_quant_config.json"
    q = json.loads(path.read_text())
    assert "model.layers.1.mlp.down_proj" in q["quantization"]["exclude_modules"]
    q["quantization"]["exclude_modules"] = ["lm_head", "model.layers.1*"]
    path.write_text(json.dumps(q))
    loaded = fp4_ops.load_quantized(tmp_path)
    assert sorted(_fp4(loaded)) == sorted(_fp4(model))
    ids = _ids(1)
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))


# ----------------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Checkpoints to break: name -> folder."""
    specs = {
        "ct": ("qwen2", "compressed-tensors", {LAYERS: ("nvfp4", "static")}, None),
        "ct_lm_head": ("qwen2", "compressed-tensors", {"*": ("nvfp4", "bf16")}, None),
        "ct_mx": ("llama", "compressed-tensors", {LAYERS: ("mxfp4", "dynamic")}, None),
        "mo": ("llama", "modelopt", {LAYERS: ("nvfp4", "static")}, None),
        "sharded": ("llama", "compressed-tensors", {LAYERS: ("nvfp4", "bf16")}, 40_000),
    }
    out = {}
    for name, (arch, checkpoint, layers, shard) in specs.items():
        model = _model(arch)
        _quantize(model, layers)
        folder = tmp_path_factory.mktemp(name)
        fp4_ops.save_quantized(model, folder, checkpoint, max_shard_size=shard)
        out[name] = folder
    return out


def _json_edit(file: str, edit):
    def mutate(folder: Path):
        path = folder / file
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return mutate


def _qc(edit):
    return _json_edit("config.json", lambda c: edit(c["quantization_config"]))


def _group(edit, part=None):
    def on_group(qc):
        group = qc["config_groups"]["group_0"]
        edit(group[part] if part else group)

    return _qc(on_group)


def _mo(edit):
    return _json_edit("hf_quant_config.json", lambda c: edit(c["quantization"]))


def _tensors(edit):
    def mutate(folder: Path):
        path = folder / "model.safetensors"
        tensors = safetensors_torch.load_file(path)
        edit(tensors)
        safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})

    return mutate


DOWN = "model.layers.0.mlp.down_proj"
Q = "model.layers.0.self_attn.q_proj"


def _set(key, value):
    return lambda t: t.__setitem__(key, value(t))


def _nan_scale(t):
    s = t[f"{DOWN}.weight_scale"].view(torch.uint8).clone()
    s[0, 0] = 0x7F
    t[f"{DOWN}.weight_scale"] = s.view(torch.float8_e4m3fn)


def _unlisted(index):
    del index["weight_map"]["model.norm.weight"]


def _misplaced(index):
    shards = sorted(set(index["weight_map"].values()))
    index["weight_map"]["model.norm.weight"] = next(
        s for s in shards if s != index["weight_map"]["model.norm.weight"]
    )


def _twice(folder: Path):
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    home = index["model.norm.weight"]
    other = folder / next(s for s in sorted(set(index.values())) if s != home)
    tensors = safetensors_torch.load_file(other)
    tensors["model.norm.weight"] = safetensors_torch.load_file(folder / home)["model.norm.weight"]
    safetensors_torch.save_file(tensors, other, metadata={"format": "pt"})


def _second_file(folder: Path):
    safetensors_torch.save_file({"x": torch.zeros(1)}, folder / "model.safetensors")


REFUSALS = {
    # the config: format and scheme
    "not-quantized": (
        "ct",
        _json_edit("config.json", lambda c: c.pop("quantization_config")),
        "not a quantized checkpoint",
    ),
    "quant-method": ("ct", _qc(lambda q: q.update(quant_method="awq")), "quant_method 'awq'"),
    "format": (
        "ct",
        _group(lambda g: g.update(format="float-quantized")),
        "format 'float-quantized'",
    ),
    "status": (
        "ct",
        _qc(lambda q: q.update(quantization_status="frozen")),
        "quantization_status 'frozen'",
    ),
    "status-null": (
        "ct",
        _qc(lambda q: q.update(quantization_status=None)),
        "quantization_status None",
    ),
    "kv-cache": (
        "ct",
        _qc(lambda q: q.update(kv_cache_scheme={"num_bits": 8})),
        "kv_cache_scheme.*only static per-tensor FP8",
    ),
    "transform": (
        "ct",
        _qc(lambda q: q.update(transform_config={"hadamard": {}})),
        "transform_config",
    ),
    "sparsity": ("ct", _qc(lambda q: q.update(sparsity_config={"format": "x"})), "sparsity_config"),
    "group-size-16": (
        "ct",
        _group(lambda a: a.update(group_size=32), "weights"),
        "group_size 32: nvfp4-pack-quantized uses 16",
    ),
    "group-size-absent": (
        "ct",
        _group(lambda a: a.pop("group_size"), "weights"),
        "group_size None: nvfp4-pack-quantized uses 16",
    ),
    "group-size-32": (
        "ct_mx",
        _group(lambda a: a.update(group_size=16), "weights"),
        "group_size 16: mxfp4-pack-quantized uses 32",
    ),
    "asymmetric": ("ct", _group(lambda a: a.update(symmetric=False), "weights"), "asymmetric"),
    "num-bits": ("ct", _group(lambda a: a.update(num_bits=8), "weights"), "num_bits 4"),
    "strategy": ("ct", _group(lambda a: a.update(strategy="group"), "weights"), "strategy 'group'"),
    "dynamic-weights": (
        "ct",
        _group(lambda a: a.update(dynamic=True), "weights"),
        "weights need static scales",
    ),
    "nvfp4-dynamic-inputs": (
        "ct",
        _group(lambda a: a.update(dynamic=True), "input_activations"),
        "no global scale",
    ),
    "nvfp4-static-group-inputs": (
        "ct",
        _group(lambda a: a.update(dynamic=False), "input_activations"),
        "static group scales",
    ),
    "mxfp4-static-group-inputs": (
        "ct_mx",
        _group(lambda a: a.update(dynamic=False), "input_activations"),
        "per-call",
    ),
    "output-activations": (
        "ct",
        _group(lambda g: g.update(output_activations={"num_bits": 4})),
        "output quantization",
    ),
    "dtype": (
        "ct",
        _json_edit("config.json", lambda c: c.update(dtype="float8_e4m3fn")),
        "dtype 'float8_e4m3fn'",
    ),
    "modelopt-algo": (
        "mo",
        _mo(lambda q: q.update(quant_algo="NVFP4_AWQ")),
        "quant_algo 'NVFP4_AWQ'",
    ),
    "modelopt-fp8": ("mo", _mo(lambda q: q.update(quant_algo="FP8")), "quant_algo 'FP8'"),
    "modelopt-group-size": ("mo", _mo(lambda q: q.update(group_size=32)), "group_size 32"),
    "modelopt-configs-disagree": (
        "mo",
        _json_edit(
            "config.json",
            lambda c: c.update(
                quantization_config={"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"}
            ),
        ),
        "config.json's quantization_config says nvfp4 W4A16, KV cache 16-bit, "
        "hf_quant_config.json nvfp4 W4A4, KV cache 16-bit: which one holds",
    ),
    "modelopt-kv-cache": (
        "mo",
        _mo(lambda q: q.update(kv_cache_quant_algo="NVFP4")),
        "kv-cache quantization 'NVFP4': only static per-tensor FP8",
    ),
    "block-structure": (
        "ct",
        _group(lambda a: a.update(block_structure=[16, 16]), "weights"),
        "block_structure",
    ),
    "actorder": (
        "ct",
        _group(lambda a: a.update(actorder="group"), "weights"),
        "actorder 'group' is not supported",
    ),
    "scale-dtype-arg": (
        "ct",
        _group(lambda a: a.update(scale_dtype="torch.uint8"), "weights"),
        "scale_dtype 'torch.uint8'",
    ),
    "no-targets": ("ct", _group(lambda g: g.update(targets=[])), "no targets"),
    "ignore-not-list": ("ct", _qc(lambda q: q.update(ignore="lm_head")), "expected a list"),
    # which layers
    "embedding-target": (
        "ct",
        _group(lambda g: g["targets"].append("Embedding")),
        "model.embed_tokens: .*nn.Linear modules only",
    ),
    "ignore-dropped": (
        "ct",
        _qc(lambda q: q.update(ignore=[])),
        r"lm_head.weight_packed: .* holds lm_head.weight \(bfloat16 \[256, 64\]\), not packed "
        r"codes \(is lm_head missing from the config's ignore / exclude_modules\?\)",
    ),
    "exclude-dropped": (
        "mo",
        _mo(lambda q: q.update(exclude_modules=[])),
        r"lm_head.weight: .* holds lm_head.weight \(bfloat16 \[256, 64\]\), not packed codes "
        r"\(is lm_head missing from the config's ignore / exclude_modules\?\)",
    ),
    "tied-quantized-lm-head": (
        "ct_lm_head",
        _json_edit("config.json", lambda c: c.update(tie_word_embeddings=True)),
        "lm_head: .*ties it",
    ),
    "config-not-json": (
        "mo",
        lambda f: (f / "hf_quant_config.json").write_text("{"),
        "hf_quant_config.json: not valid JSON",
    ),
    "no-quantization-object": (
        "mo",
        _json_edit("hf_quant_config.json", lambda c: c.pop("quantization")),
        "no 'quantization' object",
    ),
    # tensors
    "missing-scale": (
        "ct",
        _tensors(lambda t: t.pop(f"{DOWN}.weight_scale")),
        f"{DOWN}.weight_scale: missing",
    ),
    "missing-input-scale": (
        "mo",
        _tensors(lambda t: t.pop(f"{DOWN}.input_scale")),
        f"{DOWN}.input_scale: missing",
    ),
    "missing-norm": (
        "ct",
        _tensors(lambda t: t.pop("model.norm.weight")),
        "model.norm.weight: missing",
    ),
    "packed-shape": (
        "ct",
        _tensors(
            _set(f"{DOWN}.weight_packed", lambda t: t[f"{DOWN}.weight_packed"].reshape(128, 32))
        ),
        rf"{DOWN}.weight_packed: expected .*uint8 \[64, 64\], got uint8 \[128, 32\]",
    ),
    "scale-shape": (
        "mo",
        _tensors(
            _set(f"{DOWN}.weight_scale", lambda t: t[f"{DOWN}.weight_scale"][:, :4].contiguous())
        ),
        rf"{DOWN}.weight_scale: expected .*\[64, 8\]",
    ),
    "global-shape": (
        "mo",
        _tensors(_set(f"{DOWN}.weight_scale_2", lambda t: torch.ones(2))),
        rf"{DOWN}.weight_scale_2: expected .* or \[1\], got float32 \[2\]",
    ),
    "bias-shape": (
        "ct",
        _tensors(_set(f"{Q}.bias", lambda t: t[f"{Q}.bias"][:-1])),
        rf"{Q}.bias: expected the bias",
    ),
    "packed-dtype": (
        "ct",
        _tensors(
            _set(f"{DOWN}.weight_packed", lambda t: t[f"{DOWN}.weight_packed"].view(torch.int8))
        ),
        "expected .*uint8 .*got int8",
    ),
    "scale-dtype": (
        "ct",
        _tensors(_set(f"{DOWN}.weight_scale", lambda t: t[f"{DOWN}.weight_scale"].bfloat16())),
        "weight_scale: expected .*float8_e4m3fn .*got bfloat16",
    ),
    # (NVFP4 scales as their bytes: MXFP4 may store uint8, NVFP4 may not; refused on the header)
    **{
        f"nvfp4-scale-bytes-{base}": (
            base,
            _tensors(
                _set(f"{DOWN}.weight_scale", lambda t: t[f"{DOWN}.weight_scale"].view(torch.uint8))
            ),
            "weight_scale: expected .*float8_e4m3fn .*got uint8",
        )
        for base in ("ct", "mo")
    },
    "mx-scale-dtype": (
        "ct_mx",
        _tensors(
            _set(f"{DOWN}.weight_scale", lambda t: t[f"{DOWN}.weight_scale"].view(torch.int8))
        ),
        "expected .*uint8 or float8_e8m0fnu .*got int8",
    ),
    "global-dtype": (
        "ct",
        _tensors(
            _set(
                f"{DOWN}.weight_global_scale", lambda t: t[f"{DOWN}.weight_global_scale"].bfloat16()
            )
        ),
        "weight_global_scale: expected a float32",
    ),
    "norm-dtype": (
        "ct",
        _tensors(_set("model.norm.weight", lambda t: t["model.norm.weight"].to(torch.uint8))),
        "model.norm.weight: expected .*floating point",
    ),
    "leftover-in-layer": (
        "ct",
        _tensors(_set(f"{DOWN}.weight_zero_point", lambda t: torch.zeros(64, 8))),
        f"{DOWN}.weight_zero_point: unexpected for {DOWN}",
    ),
    "awq-pre-quant-scale": (
        "mo",
        _tensors(_set(f"{DOWN}.pre_quant_scale", lambda t: torch.ones(128))),
        "pre_quant_scale: unexpected",
    ),
    "leftover": (
        "ct",
        _tensors(_set("foo.bar", lambda t: torch.ones(1))),
        "unexpected tensors .*foo.bar",
    ),
    "mx-global-scale": (
        "ct_mx",
        _tensors(_set(f"{DOWN}.weight_global_scale", lambda t: torch.ones(1))),
        "weight_global_scale: unexpected",
    ),
    # values
    "zero-global": (
        "ct",
        _tensors(_set(f"{DOWN}.weight_global_scale", lambda t: torch.zeros(1))),
        "weight_global_scale must be finite and positive",
    ),
    "negative-input": (
        "mo",
        _tensors(_set(f"{DOWN}.input_scale", lambda t: -t[f"{DOWN}.input_scale"])),
        "input_scale must be finite and positive",
    ),
    "subnormal-reciprocal": (
        "ct",
        _tensors(_set(f"{DOWN}.input_global_scale", lambda t: torch.full((1,), 1e-45))),
        "1 / .*input_global_scale must be finite",
    ),
    "nan-scale": ("mo", _tensors(_nan_scale), f"{DOWN}.weight_scale: .*NaN"),
    # config values transformers refuses or cannot build from
    "negative-size": (
        "ct",
        _json_edit("config.json", lambda c: c.update(hidden_size=-c["hidden_size"])),
        "config.json: transformers cannot build the model it describes: RuntimeError",
    ),
    "heads-not-dividing": (
        "mo",
        _json_edit("config.json", lambda c: c.update(num_attention_heads=3)),
        # (transformers 4.x builds the model; its projections' shapes then refuse the weights)
        "config.json: transformers cannot build .*not a multiple of the number of attention"
        r"|self_attn\.q_proj\.weight: expected packed nvfp4 codes of \[48, 64\]",
    ),
    "unknown-model-type": (
        "ct",
        _json_edit("config.json", lambda c: c.update(model_type="no-such-model")),
        "config.json: transformers cannot build .*no-such-model",
    ),
    # files
    "two-weight-files": ("sharded", _second_file, "both model.safetensors and"),
    "unlisted-tensor": (
        "sharded",
        _json_edit("model.safetensors.index.json", _unlisted),
        "not in model.safetensors.index.json: model.norm.weight",
    ),
    "tensor-in-two-shards": ("sharded", _twice, "model.norm.weight: in both"),
    "misplaced-tensor": (
        "sharded",
        _json_edit("model.safetensors.index.json", _misplaced),
        "puts model.norm.weight in",
    ),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusals(name, bases, tmp_path):
    base, mutate, match = REFUSALS[name]
    folder = tmp_path / "ckpt"
    shutil.copytree(bases[base], folder)
    fp4_ops.load_quantized(folder)  # (loads before it is broken)
    mutate(folder)
    with pytest.raises(ValueError, match=match):
        fp4_ops.load_quantized(folder)


#: an FP8 KV cache as each tool declares it (and undeclares), where it puts the scales (per
#: layer) and their shape
_CT_FP8_KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
FP8_KV = {
    "modelopt": (
        "mo",
        _mo(lambda q: q.update(kv_cache_quant_algo="FP8")),
        _mo(lambda q: q.pop("kv_cache_quant_algo")),
        ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
        (),
    ),
    # (the form of a ModelOpt config embedded in config.json: no strategy, per-tensor)
    "modelopt-scheme": (
        "mo",
        _mo(lambda q: q.update(kv_cache_scheme={"dynamic": False, "num_bits": 8, "type": "float"})),
        _mo(lambda q: q.pop("kv_cache_scheme")),
        ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
        (),
    ),
    # (newer ModelOpt exports: all of it in config.json, as ModelOpt converts it there)
    "modelopt-config.json": (
        "mo",
        lambda folder: _modelopt_fp8_kv_in_config(folder),
        _qc(lambda q: q.pop("kv_cache_scheme")),
        ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"),
        (),
    ),
    "compressed-tensors": (
        "ct",
        _qc(lambda q: q.update(kv_cache_scheme={**_CT_FP8_KV, "symmetric": True})),
        _qc(lambda q: q.pop("kv_cache_scheme")),
        ("self_attn.k_scale", "self_attn.v_scale"),
        (1,),
    ),
}


def _modelopt_fp8_kv_in_config(folder: Path) -> None:
    _modelopt_in_config(nested=False)(folder)
    kv = {"dynamic": False, "num_bits": 8, "type": "float"}
    _qc(lambda q: q.update(kv_cache_scheme=kv))(folder)


def _with_fp8_kv(kind: str, bases, folder: Path) -> list[str]:
    """A copy of ``kind``'s base with an FP8 KV cache declared and its scales stored; their
    keys."""
    base, declare, _, names, shape = FP8_KV[kind]
    shutil.copytree(bases[base], folder)
    declare(folder)
    keys = [f"model.layers.{i}.{n}" for i in range(2) for n in names]
    _tensors(lambda t: t.update({k: torch.full(shape, 0.05 + i) for i, k in enumerate(keys)}))(
        folder
    )
    return keys


@pytest.mark.parametrize("kind", list(FP8_KV))
def test_an_fp8_kv_cache_checkpoint_loads_with_its_scales_checked_and_unused(kind, bases, tmp_path):
    """ModelOpt's and compressed-tensors' NVFP4 checkpoints often declare an FP8 KV cache: they
    load (the KV cache stays 16-bit, a UserWarning says so) into the model they hold without."""
    _with_fp8_kv(kind, bases, tmp_path / "ckpt")
    with pytest.warns(UserWarning, match=r"FP8 KV cache; its 4 KV-cache scales are checked"):
        model = fp4_ops.load_quantized(tmp_path / "ckpt")
    ids, base = _ids(3), FP8_KV[kind][0]
    assert torch.equal(_logits(model, ids), _logits(fp4_ops.load_quantized(bases[base]), ids))


def test_a_config_json_that_only_names_modelopt_defers_to_hf_quant_config(bases, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(bases["mo"], folder)
    qc = {"quant_method": "modelopt"}
    _json_edit("config.json", lambda c: c.update(quantization_config=qc))(folder)
    ids = _ids(6)
    want = _logits(fp4_ops.load_quantized(bases["mo"]), ids)
    assert torch.equal(_logits(fp4_ops.load_quantized(folder), ids), want)


def test_modelopt_configs_in_both_files_that_agree_load(bases, tmp_path):
    """Newer ModelOpt exports write the config twice (config.json and hf_quant_config.json);
    where both say the same (their exclusions spelled as they like), the checkpoint loads."""
    folder = tmp_path / "ckpt"
    _with_fp8_kv("modelopt", bases, folder)
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head*"]}
    qc["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
    _json_edit("config.json", lambda c: c.update(quantization_config=qc))(folder)
    with pytest.warns(UserWarning, match="FP8 KV cache"):
        model = fp4_ops.load_quantized(folder)
    ids = _ids(5)
    assert torch.equal(_logits(model, ids), _logits(fp4_ops.load_quantized(bases["mo"]), ids))


def test_save_warns_where_fused_layers_hold_different_scales(tmp_path):
    """Layers that vLLM runs as one GEMM (q / k / v, gate / up) with their own weight global
    scales: save_quantized warns, naming them (those engines take the largest for all); the ones
    quantize_model makes share one, and save without a word."""
    model = _model("llama")
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and name.startswith("model.layers."):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, FP4Linear.from_linear(m, "nvfp4", "bf16"))
    attn, mlp = "model.layers.0.self_attn", "model.layers.0.mlp"
    unshared = f"{attn}.q_proj, {attn}.k_proj, {attn}.v_proj; {mlp}.gate_proj, {mlp}.up_proj"
    with pytest.warns(UserWarning, match=f"^{re.escape(unshared)}; .*hold different global"):
        fp4_ops.save_quantized(model, tmp_path / "own")
    model = _model("llama")
    fp4_ops.quantize_model(model, [LAYERS], activations="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp4_ops.save_quantized(model, tmp_path / "shared")


@pytest.mark.parametrize("case", ["input scales", "mxfp4 sibling"])
def test_save_warns_about_fused_input_scales_not_formats(case, tmp_path):
    """One weight scale but different static input scales among q / k / v: a warning naming
    them; an NVFP4 gate beside an MXFP4 up (no one GEMM, no shared scale to have): none."""
    model = _model("llama")
    mlp, attn = model.model.layers[0].mlp, model.model.layers[0].self_attn
    if case == "input scales":
        names = ("q_proj", "k_proj", "v_proj")
        gs = max(float(getattr(attn, n).weight.abs().amax()) for n in names) / GS_DIVISOR
        for i, n in enumerate(names):
            lin = getattr(attn, n)
            setattr(
                attn,
                n,
                FP4Linear.from_linear(
                    lin, "nvfp4", "static", 0.01 * (i + 1), weight_global_scale=gs
                ),
            )
        prefix = "model.layers.0.self_attn"
        with pytest.warns(
            UserWarning, match=f"^{prefix}.q_proj, {prefix}.k_proj, {prefix}.v_proj:"
        ):
            fp4_ops.save_quantized(model, tmp_path)
        return
    mlp.gate_proj = FP4Linear.from_linear(mlp.gate_proj, "nvfp4", "bf16")
    mlp.up_proj = FP4Linear.from_linear(mlp.up_proj, "mxfp4", "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp4_ops.save_quantized(model, tmp_path)


def test_save_writes_every_name_and_what_extends_one(tmp_path):
    """A module under two names (an FP4Linear, a 16-bit one) is written under both, and a
    module whose name merely extends an FP4 module's (``q_proj_norm`` beside ``q_proj``) with
    its own tensors; an empty buffer beside another is written too."""
    model = _model("llama")
    attn = model.model.layers[0].self_attn
    attn.q_proj_norm = nn.LayerNorm(64)
    model.model.layers[0].mlp.alias = model.model.layers[0].mlp.up_proj
    model.model.register_buffer("a", torch.zeros(0))
    model.model.register_buffer("b", torch.zeros(0))
    fp4_ops.quantize_model(model, ["*.q_proj", "*.mlp.up_proj"], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path)
    keys = set(_raw(tmp_path))
    layer = "model.layers.0"
    for key in (
        f"{layer}.self_attn.q_proj_norm.weight",
        f"{layer}.self_attn.q_proj_norm.bias",
        f"{layer}.mlp.up_proj.weight_packed",
        f"{layer}.mlp.alias.weight_packed",
        "model.a",
        "model.b",
    ):
        assert key in keys, key


def _deepseek_v3_dense() -> nn.Module:
    """A tiny DeepSeek-V3 (MLA attention), every layer dense."""
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        q_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        initializer_range=0.1,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize(
    "extra, loads",
    [
        # (DeepSeek-V3 checkpoints hold a multi-token-prediction layer after the last one)
        ("model.layers.61.self_attn.kv_a_proj_with_mqa.weight_packed", True),
        ("model.layers.61.enorm.weight", True),
        ("model.layers.0.self_attn.rotary_emb.inv_freq", True),  # (an older checkpoint's buffer)
        ("llama: model.layers.0.self_attn.rotary_emb.inv_freq", True),  # (no class patterns)
        ("mtp.fc.weight", False),  # (Qwen3-Next's, not DeepSeek-V3's)
        ("model.layers.2.mlp.up_proj.weight", False),
    ],
)
def test_load_skips_the_tensors_transformers_skips(extra, loads, tmp_path):
    """Tensors that transformers' own loading drops for the model class (its
    ``_keys_to_ignore_on_load_unexpected``, old rotary buffers) are not read, and the model
    loads as saved; any other tensor no module holds is refused."""
    arch, _, key = extra.rpartition(": ")
    model = _model("llama") if arch == "llama" else _deepseek_v3_dense()
    extra = key
    fp4_ops.quantize_model(model, [LAYERS], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path)
    _tensors(lambda t: t.__setitem__(extra, torch.ones(4, 2, dtype=torch.uint8)))(tmp_path)
    if not loads:
        with pytest.raises(ValueError, match=f"^unexpected tensors .*: {re.escape(extra)}$"):
            fp4_ops.load_quantized(tmp_path)
        return
    ids = _ids(6)
    assert torch.equal(_logits(fp4_ops.load_quantized(tmp_path), ids), _logits(model, ids))


def _kv_edit(key: str, value):
    return _tensors(lambda t: t.__setitem__(key, value))


#: what -> (the edit of a checkpoint with an FP8 KV cache, from its kind and scale keys; error)
KV_REFUSALS = {
    "nan": (lambda _, keys: _kv_edit(keys[1], torch.tensor(float("nan"))), "finite and positive"),
    "zero": (lambda _, keys: _kv_edit(keys[0], torch.zeros(())), "finite and positive"),
    "negative": (lambda _, keys: _kv_edit(keys[2], -torch.ones(1)), "finite and positive"),
    "two values": (lambda _, keys: _kv_edit(keys[0], torch.ones(2)), "KV-cache scale: floating"),
    "integer": (
        lambda _, keys: _kv_edit(keys[3], torch.ones((), dtype=torch.int32)),
        "KV-cache scale: floating",
    ),
    "not declared": (lambda kind, _: FP8_KV[kind][2], "unexpected"),
    "inf": (lambda _, keys: _kv_edit(keys[0], torch.tensor(float("inf"))), "finite and positive"),
    "another module": (
        lambda _, keys: _kv_edit("model.layers.0.mlp.k_scale", torch.ones(())),
        "unexpected tensors that no module of the model holds: model.layers.0.mlp.k_scale",
    ),
    "a layer the model lacks": (
        lambda _, keys: _kv_edit("model.layers.9.self_attn.k_proj.k_scale", torch.ones(())),
        r"unexpected tensors .*: model.layers.9.self_attn.k_proj.k_scale",
    ),
    # (a query scale: attention quantization, which nothing here reads)
    "query scale": (
        lambda _, keys: _kv_edit("model.layers.0.self_attn.q_scale", torch.ones(1)),
        r"unexpected tensors .*: model.layers.0.self_attn.q_scale",
    ),
}


@pytest.mark.parametrize(
    "field, value",
    [("num_bits", 4), ("type", "int"), ("strategy", "channel"), ("dynamic", True)],
)
@pytest.mark.parametrize("kind", ["compressed-tensors", "modelopt-scheme"])
def test_kv_cache_schemes_other_than_static_per_tensor_fp8_are_refused(
    kind, field, value, bases, tmp_path
):
    """Each part of the FP8 rule on its own: 4-bit, integer, per-channel or dynamic KV caches
    are refused, not loaded under an 'FP8 KV cache' warning."""
    _with_fp8_kv(kind, bases, tmp_path / "ckpt")
    scheme = {**_CT_FP8_KV, field: value}
    edit = _qc if kind == "compressed-tensors" else _mo
    edit(lambda q: q.update(kv_cache_scheme=scheme))(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="only static per-tensor FP8 is understood"):
        fp4_ops.load_quantized(tmp_path / "ckpt")


def test_modelopt_fp8_kv_cache_in_any_case_loads_and_warns_at_the_caller(bases, tmp_path):
    _with_fp8_kv("modelopt", bases, tmp_path / "ckpt")
    _mo(lambda q: q.update(kv_cache_quant_algo="fp8"))(tmp_path / "ckpt")
    with pytest.warns(UserWarning, match="FP8 KV cache") as caught:
        fp4_ops.load_quantized(tmp_path / "ckpt")
    assert {Path(w.filename).name for w in caught if "KV cache" in str(w.message)} == {
        Path(__file__).name
    }


@pytest.mark.parametrize("what", list(KV_REFUSALS))
@pytest.mark.parametrize("kind", list(FP8_KV))
def test_fp8_kv_cache_scales_are_checked(kind, what, bases, tmp_path):
    keys = _with_fp8_kv(kind, bases, tmp_path / "ckpt")
    edit, match = KV_REFUSALS[what]
    edit(kind, keys)(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=match):
        fp4_ops.load_quantized(tmp_path / "ckpt")


@pytest.mark.parametrize(
    "written, warns",
    [("99.1.0", True), (f"{transformers.__version__.split('.')[0]}.99.0", False), ("4.0", False)]
    + [(None, False), ("dev", False)],
)
def test_a_config_from_a_newer_transformers_major_warns(written, warns, bases, tmp_path):
    """transformers 4.x reads some of 5.x's config fields otherwise (rope_parameters for
    rope_theta, num_local_experts for num_experts): a model unlike the one quantized, which
    a newer major version's config.json is warned about."""
    folder = tmp_path / "ckpt"
    shutil.copytree(bases["ct"], folder)
    edit = (lambda c: c.pop("transformers_version", None)) if written is None else None
    edit = edit or (lambda c: c.update(transformers_version=written))
    _json_edit("config.json", edit)(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fp4_ops.load_quantized(folder)
    said = [str(w.message) for w in caught if "written by transformers" in str(w.message)]
    assert bool(said) == warns, said
    if warns:
        assert f"written by transformers 99.1.0, read by {transformers.__version__}" in said[0]
        assert said[0].endswith("install transformers >= 99")


class _FakeHub:
    """huggingface_hub.snapshot_download over local folders: a repository id's files that the
    allow patterns match (relative paths, as huggingface_hub matches them) copied into a
    snapshot folder named by the commit, as the cache is laid out."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict, cache: Path):
        self.repos, self.cache, self.calls = repos, cache, []

    def __call__(self, repo_id, revision=None, allow_patterns=None, **kwargs):
        self.calls.append((repo_id, revision, list(allow_patterns)))
        if repo_id not in self.repos:
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError(f"{repo_id}: not in the cache, and offline")
        source, snapshot = self.repos[repo_id], self.cache / repo_id / self.COMMIT
        for f in source.rglob("*"):
            rel = f.relative_to(source).as_posix()
            if f.is_file() and any(fnmatch.fnmatchcase(rel, p) for p in allow_patterns):
                (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, snapshot / rel)
        snapshot.mkdir(parents=True, exist_ok=True)
        return str(snapshot)


@pytest.mark.parametrize("base", ["ct", "sharded", "mo"])
def test_a_hub_repository_id_loads_what_the_checkpoint_needs(base, bases, tmp_path, monkeypatch):
    """``load_quantized("org/name")``: the configs, then exactly the weight files (the index's
    shards), from one commit; not the repository's other weights; the model the folder gives."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    repo = tmp_path / "repo"
    shutil.copytree(bases[base], repo)
    (repo / "original").mkdir()
    shutil.copy(next(repo.glob("model*.safetensors")), repo / "original" / "model.safetensors")
    (repo / "pytorch_model.bin").write_bytes(b"other weights")
    hub = _FakeHub({"org/name": repo}, tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    model = fp4_ops.load_quantized("org/name", revision="v1")
    ids = _ids(4)
    assert torch.equal(_logits(model, ids), _logits(fp4_ops.load_quantized(bases[base]), ids))
    (_, first, configs), (_, second, weights) = hub.calls
    assert first == "v1" and second == hub.COMMIT and "config.json" in configs
    fetched = {
        f.relative_to(tmp_path / "cache" / "org/name" / hub.COMMIT).as_posix()
        for f in (tmp_path / "cache").rglob("*")
        if f.is_file()
    }
    stored = {f.name for f in bases[base].iterdir()}
    assert fetched == stored, fetched ^ stored
    assert sorted(weights) == sorted(n for n in stored if n.endswith(".safetensors"))


def test_a_missing_path_or_repository_is_refused(bases, tmp_path, monkeypatch):
    """A missing path that is no org/name id (relative ones too) never reaches the Hub."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    hub = _FakeHub({}, tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    missing = [str(tmp_path / "nope"), tmp_path / "nope", "a/b/c", "./x/y", "../x", ".x/y"]
    for path in [*missing, "ckpt", Path("org/name")]:
        with pytest.raises(FileNotFoundError, match="no such folder"):
            fp4_ops.load_quantized(path)
    assert not hub.calls
    with pytest.raises(OSError, match="not in the cache"):
        fp4_ops.load_quantized("org/absent")


@pytest.mark.parametrize(
    "base, missing",
    [
        ("ct", "config.json"),
        ("ct", "model.safetensors"),
        ("sharded", "model-00002-of-00003.safetensors"),
    ],
)
def test_missing_files(base, missing, bases, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(bases[base], folder)
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.split(".")[0]):
        fp4_ops.load_quantized(folder)


@pytest.mark.parametrize("content", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00not json"])
@pytest.mark.parametrize(
    "base, damaged", [("ct", "model.safetensors"), ("sharded", "model-00002-of-00003.safetensors")]
)
def test_damaged_weight_files_are_refused_by_name(base, damaged, content, bases, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(bases[base], folder)
    (folder / damaged).write_bytes(content)
    with pytest.raises(ValueError, match=rf"{damaged}: not a safetensors file"):
        fp4_ops.load_quantized(folder)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(activations="static"), ValueError, "static scales come from the checkpoint"),
        (dict(activations=1), TypeError, "activations must be"),
        (dict(device="meta"), ValueError, "meta"),
        (dict(device="tpu"), ValueError, "^device 'tpu' is not a torch device"),
        (dict(device=True), TypeError, "^device must be None, a str, an int"),  # (not index 1)
        (dict(device="xpu"), ValueError, "^device 'xpu': FP4 layers run on the CPU or on CUDA"),
        (dict(device="cuda:64"), ValueError, r"^device 'cuda:64': this machine has \d+ CUDA"),
        (dict(path=1), TypeError, "path must be"),
        (dict(revision="main"), ValueError, "revision='main' is for a Hub repository"),
        (dict(revision=3), TypeError, "revision must be"),
    ],
)
def test_load_arguments(kwargs, error, match, bases):
    kwargs = {"path": bases["ct"], **kwargs}
    with pytest.raises(error, match=match):
        fp4_ops.load_quantized(**kwargs)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
def test_load_refuses_a_base_model_saved_without_its_head(fmt, tie, tmp_path):
    """A base model (LlamaModel) saves, but its names lack the causal LM's ``model.``: the load
    names that, whether or not a tied head would need no tensor of its own."""
    base = _model("llama", tie).model
    fp4_ops.quantize_model(base, activations="bf16")
    fp4_ops.save_quantized(base, tmp_path, fmt)
    with pytest.raises(ValueError, match=r"names LlamaModel's tensors without 'model\.' "):
        fp4_ops.load_quantized(tmp_path)


@pytest.mark.parametrize(
    "count, device",
    [(0, "cuda"), (0, "cuda:0"), (0, 0), (1, "cuda:1"), (1, 1), (2, torch.device("cuda", 2))],
)
def test_load_refuses_a_cuda_device_the_machine_lacks(count, device, bases, monkeypatch):
    """As if the machine had ``count`` CUDA devices: a CUDA device past them (an int is an
    index) is a ValueError naming it, before anything loads."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ValueError, match=rf"^device .*: this machine has {count} CUDA device"):
        fp4_ops.load_quantized(bases["ct"], device=device)


@pytest.mark.parametrize("error", [ImportError, FileNotFoundError, MemoryError])
def test_errors_that_are_not_the_config_s_pass_through(error, bases, monkeypatch):
    """Only what transformers says of the config becomes a ValueError naming config.json: a
    missing package, a file or memory keep their own type and message."""
    import transformers

    def build(*args, **kwargs):
        raise error("not the config's fault")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", build)
    with pytest.raises(error, match="not the config's fault"):
        fp4_ops.load_quantized(bases["ct"])


@pytest.mark.parametrize(
    "base, activations, want",
    [
        ("ct", "fp4", {"static"}),  # (the stored input scales)
        ("ct_lm_head", "fp4", {"dynamic"}),  # (weight-only: per-call scales)
        ("ct_mx", "fp4", {"dynamic"}),
        ("mo", "fp4", {"static"}),
        ("sharded", "fp4", {"dynamic"}),
        ("ct", "dynamic", {"dynamic"}),
        ("ct", "bf16", {"bf16"}),
        ("ct_mx", None, {"dynamic"}),
        ("sharded", None, {"bf16"}),
    ],
)
def test_activation_modes(base, activations, want, bases):
    loaded = fp4_ops.load_quantized(bases[base], activations=activations)
    assert {m.activations for m in _fp4(loaded).values()} == want


def test_without_safetensors(bases, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ImportError, match=r"pip install 'fp4-ops\[hf\]'"):
        fp4_ops.load_quantized(bases["ct"])
    model = _model("llama")
    fp4_ops.quantize_model(model, [LAYERS], activations="bf16")
    with pytest.raises(ImportError, match="transformers and safetensors"):
        fp4_ops.save_quantized(model, tmp_path)


@pytest.mark.parametrize(
    "layers, kwargs, match",
    [
        ({LAYERS: ("mxfp4", "dynamic")}, dict(format="modelopt"), "NVFP4 only"),
        ({LAYERS: ("mxfp4", "bf16")}, dict(format="modelopt"), "NVFP4 only"),
        (
            {"*.self_attn.*": ("nvfp4", "static"), "*.mlp.*": ("nvfp4", "bf16")},
            dict(format="modelopt"),
            "one mode",
        ),
        ({}, {}, "no FP4Linear"),
        ({LAYERS: ("nvfp4", "bf16")}, dict(format="gguf"), "format must be one of"),
        ({LAYERS: ("nvfp4", "bf16")}, dict(activations="dynamic"), "activations must be"),
        ({LAYERS: ("nvfp4", "bf16")}, dict(max_shard_size=0), "max_shard_size"),
    ],
    ids=[
        "modelopt-mxfp4",
        "modelopt-mxfp4-w4a16",
        "modelopt-mixed",
        "nothing",
        "format",
        "activations",
        "shard",
    ],
)
def test_save_refusals(layers, kwargs, match, tmp_path):
    model = _model("llama")
    _quantize(model, layers)
    with pytest.raises(ValueError, match=match):
        fp4_ops.save_quantized(model, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("tokenizer", [5, types.SimpleNamespace(save_pretrained=None)])
def test_save_refuses_a_tokenizer_it_cannot_save_before_writing(tokenizer, tmp_path):
    model = _model("llama")
    _quantize(model, {LAYERS: ("nvfp4", "bf16")})
    with pytest.raises(TypeError, match="^tokenizer must be None or have save_pretrained"):
        fp4_ops.save_quantized(model, tmp_path / "out", tokenizer=tokenizer)
    assert not (tmp_path / "out").exists()


class _Extra(nn.Module):
    def get_extra_state(self):
        return {"not": "a tensor"}

    def set_extra_state(self, state):
        pass


def _mxfp4_layer_scaled(model):
    """An MXFP4 layer with a global scale other than 1 (from_plain takes one)."""
    layer = model.model.layers[0].mlp.down_proj
    w = fp4_ops.quantize(layer.weight.dequantize(), "mxfp4")
    half = fp4_ops.FP4Tensor.from_plain(w.data, w.plain_scales(), 0.5, "mxfp4")
    model.model.layers[0].mlp.down_proj = FP4Linear(half, layer.bias, "bf16")
    return model


def _with_extra_state(model):
    model.model.extra = _Extra()
    return model


@pytest.mark.parametrize(
    "wrap, match",
    [
        (_with_extra_state, "model.extra._extra_state: not a tensor"),
        (lambda model: nn.Sequential(*_fp4(model).values()), "no transformers config"),
        (_mxfp4_layer_scaled, r"mlp\.down_proj: an MXFP4 global scale other than 1 has no"),
    ],
    ids=["extra-state", "no-config", "mxfp4-global-scale"],
)
def test_save_refusals_of_the_model(wrap, match, tmp_path):
    model = _model("llama")
    _quantize(model, {LAYERS: ("nvfp4", "bf16")})
    with pytest.raises(ValueError, match=match):
        fp4_ops.save_quantized(wrap(model), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_shards_hold_at_most_max_shard_size_bytes(tmp_path):
    """max_shard_size is the most tensor bytes a file holds: every tensor in one file at the
    total, two files one byte below it; the shards hold the same tensors as the one file."""
    from safetensors import safe_open

    model = _model("llama")
    _quantize(model, {LAYERS: ("nvfp4", "bf16")})
    fp4_ops.save_quantized(model, tmp_path / "one")
    with safe_open(tmp_path / "one/model.safetensors", "pt") as f:
        whole = {k: f.get_tensor(k) for k in f.keys()}
    total = sum(t.numel() * t.element_size() for t in whole.values())
    fp4_ops.save_quantized(model, tmp_path / "at", max_shard_size=total)
    assert sorted(p.name for p in (tmp_path / "at").glob("*.safetensors*")) == ["model.safetensors"]
    fp4_ops.save_quantized(model, tmp_path / "below", max_shard_size=total - 1)
    index = json.loads((tmp_path / "below/model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert index["weight_map"].keys() == whole.keys()


def test_save_over_previous_checkpoint(tmp_path):
    """Weight files and hf_quant_config.json of an earlier save into the folder go; other files
    stay."""
    model = _model("llama")
    _quantize(model, {LAYERS: ("nvfp4", "static")})
    fp4_ops.save_quantized(model, tmp_path, "modelopt", max_shard_size=30_000)
    (tmp_path / "notes.txt").write_text("mine")
    fp4_ops.save_quantized(model, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "notes.txt"]
    ids = _ids(1)
    loaded = fp4_ops.load_quantized(tmp_path)
    fp4_ops.save_quantized(model, tmp_path, "modelopt", max_shard_size=30_000)
    assert not (tmp_path / "model.safetensors").exists()
    assert torch.equal(_logits(fp4_ops.load_quantized(tmp_path), ids), _logits(loaded, ids))


@pytest.mark.parametrize(
    "how, fmt, activations, want",
    [
        ("config-float16", "nvfp4", None, torch.float16),
        ("config-none", "nvfp4", None, torch.bfloat16),
        ("model-half", "nvfp4", None, torch.float16),
        # (W4A16 layers take 16-bit activations, MXFP4 ones bfloat16 only: a warning says so)
        ("config-float32", "nvfp4", None, torch.bfloat16),
        ("config-float16", "mxfp4", None, torch.bfloat16),
        ("config-float32", "nvfp4", "fp4", torch.float32),
        ("config-float16", "mxfp4", "dynamic", torch.float16),
        ("config-float16", "mixed", None, torch.bfloat16),  # (one MXFP4 layer is enough)
    ],
)
def test_dtype(how, fmt, activations, want, tmp_path):
    """The 16-bit tensors load in config.json's dtype (bfloat16 where it names none), which
    save_quantized writes as the model's, unless W4A16 layers cannot take it: then in bfloat16,
    with a warning, and the model runs."""
    model = _model("qwen2")
    if fmt == "mixed":
        _quantize(model, {"*.q_proj": ("nvfp4", "bf16"), "*.v_proj": ("mxfp4", "bf16")})
    else:
        _quantize(model, {LAYERS: (fmt, "bf16")})
    if how == "model-half":
        model.half()
    fp4_ops.save_quantized(model, tmp_path, "compressed-tensors")
    if how.startswith("config"):
        dtype = None if how == "config-none" else how.removeprefix("config-")
        _json_edit("config.json", lambda c: c.update(dtype=dtype))(tmp_path)
    moved = want == torch.bfloat16 and how not in ("config-none",)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = fp4_ops.load_quantized(tmp_path, activations=activations)
    said = [str(w.message) for w in caught if "W4A16 layers take" in str(w.message)]
    assert len(said) == int(moved) and (not moved or "loads in bfloat16" in said[0]), said
    why = "take 16-bit activations" if how == "config-float32" else "E8M0 scales exceed float16"
    assert not moved or why in said[0], said
    floats = {t.dtype for t in loaded.parameters()}
    assert floats == {want}, floats
    ids = _ids(1)
    if activations is None:
        assert _rel(_logits(loaded, ids), _logits(model, ids)) < 0.05
    else:  # (W4A4 layers: another model, which runs in the config's dtype)
        assert {m.activations for m in _fp4(loaded).values()} == {"dynamic"}
        assert _logits(loaded, ids).isfinite().all()


def test_checkpoint_spellings_apply_to_models_named_otherwise_only(tmp_path, monkeypatch):
    """A model type's checkpoint spellings become transformers' names only where the model is
    not itself named so (older transformers versions name Mixtral's modules as its checkpoints
    do): a pretend spelling of llama's mlp, which its modules use, changes nothing."""
    from fp4_ops import checkpoint

    model = _model("llama")
    _quantize(model, {LAYERS: ("nvfp4", "bf16")})
    fp4_ops.save_quantized(model, tmp_path)
    want = _logits(fp4_ops.load_quantized(tmp_path), _ids(1))
    monkeypatch.setitem(checkpoint._CHECKPOINT_SPELLINGS, "llama", (("", "mlp", "ffn"),))
    assert torch.equal(_logits(fp4_ops.load_quantized(tmp_path), _ids(1)), want)


def _scalars_as(shape):
    def edit(t):
        for key in t:
            if key.endswith(("global_scale", "scale_2", "input_scale")):
                t[key] = t[key].reshape(shape)

    return edit


def _modelopt_in_config(nested: bool):
    def mutate(folder: Path):
        q = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
        (folder / "hf_quant_config.json").unlink()
        if nested:
            qc = {"quant_method": "modelopt", "quantization": q}
        else:  # (newer ModelOpt exports: the compressed-tensors-like keys)
            qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": q["exclude_modules"]}
        _json_edit("config.json", lambda c: c.update(quantization_config=qc))(folder)

    return mutate


def _e8m0_scales(t):
    for key in t:
        if key.endswith("weight_scale"):
            t[key] = t[key].view(torch.float8_e8m0fnu)


VARIANTS = {
    "ct-0d-scalars": ("ct", _tensors(_scalars_as(()))),
    "modelopt-1-element-scalars": ("mo", _tensors(_scalars_as((1,)))),
    "mxfp4-e8m0-dtype-scales": ("ct_mx", _tensors(_e8m0_scales)),
    "modelopt-in-config-json": ("mo", _modelopt_in_config(nested=True)),
    "modelopt-in-config-json-flat": ("mo", _modelopt_in_config(nested=False)),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_accepted_variants(name, bases, tmp_path):
    """Other spellings of the same checkpoint load to the same model."""
    base, mutate = VARIANTS[name]
    folder = tmp_path / "ckpt"
    shutil.copytree(bases[base], folder)
    mutate(folder)
    ids = _ids(1)
    want = _logits(fp4_ops.load_quantized(bases[base]), ids)
    assert torch.equal(_logits(fp4_ops.load_quantized(folder), ids), want)


def test_compressed_tensors_in_features_not_a_multiple_of_32(tmp_path):
    config = _config("llama")
    config.hidden_size, config.head_dim = 48, 12
    torch.manual_seed(0)
    bf16 = transformers.AutoModelForCausalLM.from_config(config).eval()
    _ct_write(tmp_path, bf16, "NVFP4A16")
    with pytest.raises(
        ValueError,
        match=r"^model.layers.0.self_attn.q_proj: in_features = 48 is not a multiple of 32",
    ):
        fp4_ops.load_quantized(tmp_path)


# ----------------------------------------------------------------------------- on the GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_MODES = {
    # (W4A16 runs on sm_90 only; W4A4 on sm_90 and the sm_100 family)
    "w4a16": {LAYERS: ("nvfp4", "bf16")},
    "w4a4-static": {LAYERS: ("nvfp4", "static")},
}


def _needs_w4a16(mode: str) -> None:
    if mode == "w4a16" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("W4A16 runs on sm_90 (H100 / H200) only")


@pytest.fixture(scope="module")
def gpu_checkpoints(tmp_path_factory):
    """(format, mode) -> (folder, the BF16 model it was quantized from), saved from the CPU."""
    out = {}
    for checkpoint in CHECKPOINT_FORMATS:
        for mode, layers in GPU_MODES.items():
            bf16 = _model("llama", seed=3)
            model = copy.deepcopy(bf16)
            _quantize(model, layers)
            folder = tmp_path_factory.mktemp(f"gpu-{checkpoint}-{mode}")
            fp4_ops.save_quantized(model, folder, checkpoint)
            out[checkpoint, mode] = (folder, bf16)
    return out


CHECKPOINT_FORMATS = ("compressed-tensors", "modelopt")
GPU_CASES = [(c, m) for c in CHECKPOINT_FORMATS for m in GPU_MODES]


def _gpu_tolerance(mode: str, cpu_logits, bf16_logits) -> float:
    """How far (relative Frobenius norm) the GPU's logits may be from the CPU's. W4A16: the
    same products (FP4 x BF16 is exact in fp32) summed in another order, each layer's output
    rounded to BF16 (2^-8 relative at most) on both sides: a few such roundings, 2^-6. W4A4:
    those differences can move an activation across an FP4 rounding boundary, one code step
    (up to 1/3 of that element), so the GPU may differ as much as a fraction of the FP4 error
    itself: half the CPU model's distance from the BF16 model."""
    if mode == "w4a16":
        return 2.0**-6
    return 0.5 * _rel(cpu_logits, bf16_logits)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("checkpoint, mode", GPU_CASES)
def test_gpu_load_equals_cpu_load(checkpoint, mode, gpu_checkpoints):
    """The same checkpoint loaded onto the CPU and onto CUDA: the same FP4 buffers, and logits
    within the tolerance of ``_gpu_tolerance``."""
    _needs_w4a16(mode)
    folder, bf16 = gpu_checkpoints[checkpoint, mode]
    cpu = fp4_ops.load_quantized(folder)
    gpu = fp4_ops.load_quantized(folder, device="cuda")
    assert {p.device.type for p in gpu.parameters()} == {"cuda"}
    assert {b.device.type for b in gpu.buffers()} == {"cuda"}
    for name, layer in _fp4(cpu).items():
        other = gpu.get_submodule(name)
        assert (other.format, other.activations) == (layer.format, layer.activations)
        assert torch.equal(other.weight.data.cpu(), layer.weight.data), name
        assert torch.equal(
            other.weight_scale.cpu().view(torch.uint8), layer.weight_scale.view(torch.uint8)
        )
        assert torch.equal(other.weight_global_scale.cpu(), layer.weight_global_scale)
    ids = _ids(2)
    want = _logits(cpu, ids)
    got = _logits(gpu, ids.cuda()).cpu()
    assert torch.isfinite(got).all()
    tol = _gpu_tolerance(mode, want, _logits(bf16, ids))
    print(f"{checkpoint} {mode}: |gpu - cpu| / |cpu| = {_rel(got, want):.5f} (allowed {tol:.5f})")
    assert _rel(got, want) <= tol


def _path_logits(model, sequences: torch.Tensor, steps: int) -> torch.Tensor:
    """The logits that predict the last ``steps`` tokens of ``sequences``, from one forward of
    the tokens before them (teacher forcing), as float32 on the host."""
    with torch.no_grad():
        return _logits(model, sequences[:, :-1].to(model.device))[:, -steps:].float().cpu()


def _check_path(out, cpu, bf16, mode: str, label: str) -> None:
    """A GPU generate's step logits against the CPU model's on the GPU's own tokens, within
    ``_gpu_tolerance``: a check along one path, so a near tie, where the two devices' greedy
    paths may part, does not matter."""
    got = torch.stack(out.logits, 1).float().cpu()
    assert torch.isfinite(got).all()
    steps = got.shape[1]
    want = _path_logits(cpu, out.sequences, steps)
    tol = _gpu_tolerance(mode, want, _path_logits(bf16, out.sequences, steps))
    print(f"{label}: |gpu - cpu| / |cpu| over {steps} steps = {_rel(got, want):.5f} ({tol:.5f})")
    assert _rel(got, want) <= tol


GENERATE = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
GENERATE.update(output_logits=True, return_dict_in_generate=True)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("checkpoint, mode", GPU_CASES)
def test_gpu_greedy_generate_follows_the_cpu_logits(checkpoint, mode, gpu_checkpoints):
    """Greedy generate on the GPU (a prefill, then decode steps of one token per row through a
    dynamic cache): every step's logits are the CPU model's on the same tokens (``_check_path``)."""
    _needs_w4a16(mode)
    folder, bf16 = gpu_checkpoints[checkpoint, mode]
    cpu = fp4_ops.load_quantized(folder)
    gpu = fp4_ops.load_quantized(folder, device="cuda")
    ids = _ids(4).cuda()
    with torch.no_grad():
        out = gpu.generate(
            ids, attention_mask=torch.ones_like(ids), disable_compile=True, **GENERATE
        )
    _check_path(out, cpu, bf16, mode, f"{checkpoint} {mode}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_gpu_greedy_generate_under_cuda_graphs_follows_the_cpu_logits(mode, gpu_checkpoints):
    """generate with a static cache, compiled in reduce-overhead mode (CUDA graphs), as
    ``examples/generate.py --compile`` runs it: twice, the second call replaying the captured
    graphs and giving the first's tokens and logits exactly, each step's logits the CPU model's
    on the same tokens (``_check_path``). Compiled with eager's roundings
    (``emulate_precision_casts``) to hold W4A4 to eager's bound (``test_transformers`` holds
    Inductor's own numerics to one)."""
    _needs_w4a16(mode)
    folder, bf16 = gpu_checkpoints["compressed-tensors", mode]
    cpu = fp4_ops.load_quantized(folder)
    gpu = fp4_ops.load_quantized(folder, device="cuda")
    graphs = dict(GENERATE, cache_implementation="static")
    graphs["compile_config"] = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    ids = _ids(4).cuda()
    from torch._inductor import config as inductor

    torch._dynamo.reset()
    with torch.inference_mode(), inductor.patch(emulate_precision_casts=True):
        first, again = (
            gpu.generate(ids, attention_mask=torch.ones_like(ids), **graphs) for _ in range(2)
        )
        assert torch.equal(again.sequences, first.sequences)
        assert all(map(torch.equal, again.logits, first.logits))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    _check_path(first, cpu, bf16, mode, f"CUDA graphs {mode}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_gpu_decode_step_under_a_cuda_graph(mode, gpu_checkpoints):
    """A loaded model's decode step (``benchmarks.model.DecodeStep``: static cache, device-side
    position) captured in a CUDA graph and replayed gives the eager step's logits, bit for bit,
    and those equal a full forward's last-position logits (within the GPU's rounding)."""
    _needs_w4a16(mode)
    bench = pytest.importorskip("benchmarks.model")
    folder, _ = gpu_checkpoints["compressed-tensors", mode]
    model = fp4_ops.load_quantized(folder, device="cuda")
    ids = _ids(5).cuda()
    step = bench.DecodeStep(model, ids.shape[0], 0, "cuda")
    with torch.inference_mode():
        step.reset(ids.shape[1])
        for i in range(ids.shape[1]):  # (fills the cache eagerly)
            step.ids.copy_(ids[:, i : i + 1])
            eager = step().clone()
        full = model(ids).logits[:, -1:]
        # the last step again, captured: warm-up on the capturing stream, then a replay
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step.reset(2)
            step.position.fill_(ids.shape[1] - 1)
            for layer in step.cache.layers:
                layer.cumulative_length.fill_(ids.shape[1] - 1)
            step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            replayed = step()
        step.position.fill_(ids.shape[1] - 1)
        for layer in step.cache.layers:
            layer.cumulative_length.fill_(ids.shape[1] - 1)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(replayed, eager)
    assert int(step.position) == ids.shape[1]
    if mode == "w4a16":  # (W4A4's dynamic scales see one row here, all of them in the forward)
        assert _rel(eager.float(), full.float()) <= 2.0**-6


def _fp4_model_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the model with its FP4 layers counted from their shapes: packed codes N*K/2,
    blocked scales padded to 128-row x 4-column blocks, fp32 scalars; the largest one layer's)"""
    total, largest = 0, 0
    seen = set()
    for module in model.modules():
        if isinstance(module, FP4Linear):
            n, k = module.out_features, module.in_features
            vec = fp4_ops.FORMATS[module.format]
            size = n * k // 2 + fp4_ops.blocked_scale_numel(n, k, vec) + 2 * 4
            size += 0 if module.bias is None else 2 * n
            total += size
            largest = max(largest, size)
            continue
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total, largest


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_gpu_load_peak_memory_is_the_fp4_size(mode, tmp_path):
    """Loading onto the GPU allocates the FP4 model and, for a moment, one layer's working
    copies: its codes and scales as read, its blocked scales, and W4A16's prepacking (codes
    unpacked to a byte per value, 2x, padded and permuted, 2x + 2x, packed again, 1x). So
    peak <= the model's bytes from its parameter counts + 12 x the largest FP4 layer; BF16
    weights made for the FP4 layers would add 3.5x all their FP4 bytes (here 6x the slack)."""
    _needs_w4a16(mode)
    config = transformers.LlamaConfig(
        vocab_size=4096,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=4,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    linear_params = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n != "lm_head"
    )
    _quantize_for_memory(model, mode)
    fp4_ops.save_quantized(model, tmp_path)
    expected, largest = _fp4_model_bytes(model)
    del model
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loaded = fp4_ops.load_quantized(tmp_path, device="cuda")
    peak = torch.cuda.max_memory_allocated() - base
    held = torch.cuda.memory_allocated() - base
    print(
        f"{mode}: GPU peak {peak / 2**20:.1f} MiB, held {held / 2**20:.1f} MiB, model from its "
        f"parameter counts {expected / 2**20:.1f} MiB (largest FP4 layer {largest / 2**20:.2f} "
        f"MiB; its linear weights in BF16 would be {2 * linear_params / 2**20:.1f} MiB)"
    )
    assert _fp4_model_bytes(loaded)[0] == expected
    assert held <= expected + 2**20
    assert peak <= expected + 12 * largest + 2**20


def _quantize_for_memory(model: nn.Module, mode: str) -> None:
    if mode == "w4a16":
        fp4_ops.quantize_model(model, [LAYERS], activations="bf16")
        return
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and fnmatch.fnmatchcase(name, LAYERS):
            parent, _, attr = name.rpartition(".")
            layer = FP4Linear.from_linear(m, "nvfp4", "static", 0.01)
            setattr(model.get_submodule(parent), attr, layer)


# ----------------------------------------------------------------------------- calibrate


def _calibration_batches() -> list[torch.Tensor]:
    # (the second batch's inputs are larger at some layers: a max over calls, not the last)
    return [_ids(21), _ids(22)[:, :3], _ids(23)]


def _loop(batches, device="cpu"):
    def forward_loop(model):
        for ids in batches:
            model(ids.to(device))

    return forward_loop


def _record_per_call_amax(model) -> tuple[dict[str, list[float]], list]:
    """Hooks that record every FP4Linear's largest |input| in each call, by name (a record of
    the run separate from calibrate's), and their handles."""
    seen: dict[str, list[float]] = {}
    handles = [
        m.register_forward_pre_hook(
            lambda _m, args, n=n: seen.setdefault(n, []).append(float(args[0].abs().max()))
        )
        for n, m in model.named_modules()
        if isinstance(m, FP4Linear)
    ]
    return seen, handles


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]
)
def test_calibrate_sets_each_layers_input_amax_as_its_static_scale(device):
    model = _model("llama", seed=4)
    fp4_ops.quantize_model(model, [LAYERS])
    model.to(device)
    calls, handles = _record_per_call_amax(model)
    names = fp4_ops.calibrate(model, _loop(_calibration_batches(), device))
    for h in handles:
        h.remove()
    assert any(max(c) != c[-1] for c in calls.values())  # (the batches test the max over calls)
    assert sorted(names) == sorted(calls)
    for name, amaxes in calls.items():
        layer = model.get_submodule(name)
        assert isinstance(layer, FP4Linear) and layer.activations == "static", name
        assert layer.input_global_scale.device.type == device, name
        want = torch.tensor(max(amaxes) / (448.0 * 6.0), dtype=torch.float32)
        assert torch.equal(layer.input_global_scale.cpu(), want), name
    ct = pytest.importorskip("compressed_tensors.quantization.utils.helpers")
    # (compressed-tensors' calibration convention: the reciprocal, equal to one ulp)
    for name, amaxes in calls.items():
        a = torch.tensor(max(amaxes))
        theirs = 1.0 / ct.generate_gparam(-a, a).reshape(())
        ours = model.get_submodule(name).input_global_scale.cpu()
        assert abs(float(theirs / ours) - 1.0) <= 2.0**-23, name


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_calibrated_model_saves_as_static_w4a4_and_loads_back(checkpoint, tmp_path):
    model = _model("qwen3", seed=5)
    fp4_ops.quantize_model(model, [LAYERS])
    fp4_ops.calibrate(model, _loop(_calibration_batches()))
    fp4_ops.save_quantized(model, tmp_path, checkpoint)
    back = fp4_ops.load_quantized(tmp_path)
    ours = {n: m for n, m in model.named_modules() if isinstance(m, FP4Linear)}
    theirs = {n: m for n, m in back.named_modules() if isinstance(m, FP4Linear)}
    assert ours.keys() == theirs.keys()
    for name, layer in ours.items():
        assert theirs[name].activations == "static", name
        ratio = float(theirs[name].input_global_scale / layer.input_global_scale)
        # (ModelOpt stores the decoding scale; compressed-tensors its reciprocal: one ulp)
        assert ratio == 1.0 if checkpoint == "modelopt" else abs(ratio - 1.0) <= 2.0**-23, name
    if checkpoint == "modelopt":
        assert torch.equal(_logits(back, _ids(7)), _logits(model, _ids(7)))


def test_calibrate_takes_keyword_inputs_and_skips_empty_ones():
    """A layer called as ``layer(x=...)`` is calibrated like one called positionally, and an
    input without rows (which the layers take) adds nothing to the max."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    fp4_ops.quantize_model(model)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))

    def loop(m):
        m(torch.zeros(0, 64))
        m[2](x=m[1](m[0](x=x)))

    fp4_ops.calibrate(model, loop)
    assert torch.equal(model[0].input_global_scale, x.abs().amax() / (448.0 * 6.0))
    with torch.no_grad():
        hidden = torch.relu(fp4_ops.FP4Linear(model[0].weight, model[0].bias, "dynamic")(x))
    assert torch.equal(model[2].input_global_scale, hidden.abs().amax() / (448.0 * 6.0))


def test_calibrate_refusals_leave_the_model_as_it_was():
    model = _model("llama", seed=6)
    with pytest.raises(ValueError, match="no NVFP4 FP4Linear with dynamic activation scales"):
        fp4_ops.calibrate(model, _loop([_ids(1)]))
    fp4_ops.quantize_model(model, [LAYERS])
    with pytest.raises(TypeError, match="forward_loop must be callable"):
        fp4_ops.calibrate(model, None)
    before = {n: type(m) for n, m in model.named_modules()}

    def attention_only(m):  # (the MLPs never see an input)
        m.model.layers[0].self_attn.q_proj(torch.randn(2, 64))

    with pytest.raises(ValueError, match=r"forward_loop ran no input through model\.layers\.0\."):
        fp4_ops.calibrate(model, attention_only)

    def poisoned(m):
        m(_ids(2))
        try:  # (the CPU path refuses it as it runs; a GPU's quantizer poisons instead)
            m.model.layers[1].mlp.down_proj(torch.full((1, 128), float("inf")))
        except ValueError:
            pass

    with pytest.raises(ValueError, match=r"a non-finite input reached model\.layers\.1\.mlp\.down"):
        fp4_ops.calibrate(model, poisoned)
    after = {n: type(m) for n, m in model.named_modules()}
    assert before == after
    assert all(m.activations == "dynamic" for m in model.modules() if isinstance(m, FP4Linear))


@pytest.mark.parametrize("same", [True, False], ids=["equal", "different"])
def test_tied_model_takes_a_stored_head_only_if_it_equals_the_embedding(same, tmp_path):
    """A tied config whose checkpoint also stores ``lm_head.weight``: equal to the embedding,
    it loads; different, one tied tensor cannot hold both, and the loader names it."""
    model = _model("qwen3", tie=True)
    _quantize(model, {LAYERS: ("nvfp4", "bf16")})
    fp4_ops.save_quantized(model, tmp_path, "compressed-tensors")
    embed = model.model.embed_tokens.weight.detach()
    head = embed.clone() if same else embed + 1.0
    _tensors(_set("lm_head.weight", lambda t: head))(tmp_path)
    if same:
        back = fp4_ops.load_quantized(tmp_path)
        assert back.lm_head.weight is back.model.embed_tokens.weight
        assert torch.equal(_logits(back, _ids(3)), _logits(model, _ids(3)))
    else:
        with pytest.raises(ValueError, match=r"lm_head\.weight: differs from model\.embed_"):
            fp4_ops.load_quantized(tmp_path)


def _mixtral(layers: int = 2) -> nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


#: Mixtral's checkpoint names (save_quantized's) -> transformers 5's
MIXTRAL_TO_TRANSFORMERS = (
    (r"\.block_sparse_moe(?=\.|\b)", ".mlp"),
    (r"(\.experts\.\d+)\.w1(?=\.|\b)", r"\1.gate_proj"),
    (r"(\.experts\.\d+)\.w3(?=\.|\b)", r"\1.up_proj"),
    (r"(\.experts\.\d+)\.w2(?=\.|\b)", r"\1.down_proj"),
)


def test_mixtral_checkpoint_in_transformers_spelling_loads_under_either_major(tmp_path):
    """A Mixtral checkpoint whose keys and exclude list use transformers 5's names (mlp,
    gate_proj, its router mlp.gate excluded by name) loads into transformers 4's model too
    (block_sparse_moe, w1): every name matched through the key it stands for; the same
    logits."""
    model = _mixtral()
    fp4_ops.quantize_model(model, activations="bf16")
    fp4_ops.save_quantized(model, tmp_path, "modelopt")

    def respelled(text: str) -> str:
        for pattern, name in MIXTRAL_TO_TRANSFORMERS:
            text = re.sub(pattern, name, text)
        return text

    raw = _raw(tmp_path)
    safetensors_torch.save_file(
        {respelled(k): v for k, v in raw.items()}, str(tmp_path / "model.safetensors")
    )
    path = tmp_path / "hf_quant_config.json"
    quant = json.loads(path.read_text())
    quant["quantization"]["exclude_modules"] = [f"model.layers.{i}.mlp.gate" for i in range(2)]
    path.write_text(json.dumps(quant))
    assert any(".mlp.experts.0.gate_proj." in k for k in _raw(tmp_path))
    back = fp4_ops.load_quantized(tmp_path)
    for layer in back.model.layers:  # (block_sparse_moe in transformers 4, mlp in 5)
        block = getattr(layer, "block_sparse_moe", None) or layer.mlp
        assert not isinstance(block.gate, fp4_ops.FP4Linear)
    for name, buffer in back.named_buffers():  # (RoPE's: float32 there, cast here)
        if name.endswith("inv_freq"):
            model.get_buffer(name).data = buffer.clone()
    with torch.no_grad():
        assert torch.equal(back(_ids(3)).logits, model(_ids(3)).logits)


@pytest.mark.parametrize("arch", ["gptj", "llama"])
def test_loaded_buffers_are_from_pretrained_s(arch, tmp_path):
    """The buffers a model makes as it is built (rotary tables) are those of transformers'
    from_pretrained in the same dtype, not made in the 16-bit default dtype of construction
    (GPT-J's sinusoid table divides integers, which BF16 rounds); a saved model
    loads back with bit-identical logits."""
    if arch == "gptj":
        config = transformers.GPTJConfig(
            vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, rotary_dim=8
        )
    else:
        config = _config("llama")
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "bf16")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "bf16", dtype=torch.bfloat16
    )
    fp4_ops.quantize_model(model.eval(), activations="bf16")
    fp4_ops.save_quantized(model, tmp_path / "fp4", "modelopt")
    back = fp4_ops.load_quantized(tmp_path / "fp4")
    theirs = dict(model.named_buffers())
    for name, buffer in back.named_buffers():
        if name in theirs and buffer.is_floating_point():
            assert buffer.dtype == theirs[name].dtype and torch.equal(buffer, theirs[name]), name
    with torch.no_grad():
        assert torch.equal(back(_ids(4)).logits, model(_ids(4)).logits)
