# SPDX-License-Identifier: BSD-3-Clause
"""gpt-oss MXFP4 checkpoints (OpenAI's expert blocks and scales) through ``load_quantized``,
held against transformers' own reader of the format (it dequantizes them to BF16 on a CPU),
and the refusals of malformed ones."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import fp4_ops
from fp4_ops.layout import from_blocked

transformers = pytest.importorskip("transformers", reason="needs transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs safetensors")
pytestmark = pytest.mark.fused_experts

# both models round their activations to BF16 in different places (ours: h, the activation,
# y; theirs: its own), each 2^-9 relative, through two layers and the head: 2^-4 holds them;
# a misread block layout, nibble order or scale bias is off by order one
LOGITS_BOUND = 2.0**-4
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens"]


def _gpt_oss(experts=4, hidden=64, width=64, layers=2):
    config = transformers.GptOssConfig(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=experts,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    with torch.no_grad():  # (from_config leaves the biases and router at zero: give them values)
        for name, p in model.named_parameters():
            if name.endswith("_bias") or ".router." in name:
                p.normal_(0.0, 0.1)
    return model


def _write(folder: Path, model, corrupt=None) -> None:
    """The model as a gpt-oss MXFP4 checkpoint: its experts quantized (fp4_ops.quantize_experts,
    MXFP4: global scale 1) and written as OpenAI's blocks [E, rows, K/32, 16] and E8M0 scale
    bytes [E, rows, K/32]; everything else in BF16. ``corrupt(tensors)`` edits them first."""
    tensors = {}
    for name, t in model.state_dict().items():
        if ".mlp.experts." in name and not name.endswith("_bias"):
            continue
        tensors[name] = t.contiguous()
    for i, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        prefix = f"model.layers.{i}.mlp.experts"
        for proj in ("gate_up_proj", "down_proj"):
            # (GptOssExperts holds [E, K, N]: the checkpoint's rows are its columns)
            w = getattr(ex, proj).detach().float().transpose(1, 2).contiguous()
            q = fp4_ops.quantize_experts(w, "mxfp4")
            e, rows, k = w.shape
            plain = from_blocked(q.scale.reshape(e, -1), rows, k // 32)
            tensors[f"{prefix}.{proj}_blocks"] = q.data.reshape(e, rows, k // 32, 16).contiguous()
            tensors[f"{prefix}.{proj}_scales"] = plain.view(torch.uint8).contiguous()
    if corrupt is not None:
        corrupt(tensors)
    _save(folder, model, tensors)


def _save(folder: Path, model, tensors: dict) -> None:
    """``tensors`` as the model's gpt-oss MXFP4 checkpoint in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(tensors, str(folder / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": NOT_CONVERTED + ["lm_head"],
    }
    (folder / "config.json").write_text(json.dumps(config))


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("activations", [None, "fp4"])
def test_gpt_oss_mxfp4_checkpoint_loads_as_transformers_reads_it(activations, tmp_path):
    _write(tmp_path, _gpt_oss())
    dequantize = transformers.Mxfp4Config(dequantize=True)  # (its CPU reader)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.bfloat16, quantization_config=dequantize
    )
    ours = fp4_ops.load_quantized(tmp_path, activations=activations)
    for i, layer in enumerate(ours.model.layers):
        ex = layer.mlp.experts
        assert isinstance(ex, fp4_ops.FP4Experts), i
        assert ex.activation == "swigluoai" and ex.format == "mxfp4"
        assert ex.activations == ("bf16" if activations is None else "dynamic")
        # the experts' weights exactly as transformers dequantizes them
        mine = ex.expert_weights("w13").dequantize(torch.float32)
        ref = theirs.model.layers[i].mlp.experts.gate_up_proj.float().transpose(1, 2)
        assert torch.equal(mine, ref)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, want = ours(ids).logits, theirs(ids).logits
    bound = LOGITS_BOUND if activations is None else 0.25  # (W4A4: FP4 activations too)
    assert _rel(got, want) <= bound, _rel(got, want)


def _nan_scale(tensors):
    key = "model.layers.0.mlp.experts.down_proj_scales"
    tensors[key] = tensors[key].clone()
    tensors[key][1, 2, 0] = 255


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (
            lambda t: t.pop("model.layers.1.mlp.experts.down_proj_scales"),
            r"model.layers.1.mlp.experts.down_proj_scales: missing from the checkpoint",
        ),
        (
            lambda t: t.update(
                {
                    "model.layers.0.mlp.experts.gate_up_proj_blocks": t[
                        "model.layers.0.mlp.experts.gate_up_proj_blocks"
                    ].reshape(4, 128, 1, 32)
                }
            ),
            r"gate_up_proj_blocks: expected MXFP4 gate_up_proj of \[4, 128, 64\]: uint8 "
            r"\[4, 128, 2, 16\], got uint8 \[4, 128, 1, 32\]",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.experts.extra": torch.zeros(2)}),
            r"model.layers.0.mlp.experts.extra: unexpected for model.layers.0.mlp.experts",
        ),
        (_nan_scale, r"down_proj_scales: a block scale is a NaN encoding"),
    ],
    ids=["missing", "mis-shaped", "left-over", "nan-scale"],
)
def test_gpt_oss_mxfp4_checkpoint_refusals(corrupt, match, tmp_path):
    _write(tmp_path, _gpt_oss(), corrupt)
    with pytest.raises(ValueError, match=match):
        fp4_ops.load_quantized(tmp_path)


def test_gpt_oss_experts_mxfp4_cannot_block_are_refused_on_the_headers(tmp_path):
    """Experts of I = 48 (not whole 32-element blocks) are refused by name from the headers,
    before any tensor is read, though the blocks' shapes agree with their own K // 32."""
    model = _gpt_oss(width=48)
    tensors = {
        n: t.contiguous()
        for n, t in model.state_dict().items()
        if ".mlp.experts." not in n or n.endswith("_bias")
    }
    for i in range(len(model.model.layers)):
        for proj, rows, blocks in (("gate_up_proj", 96, 2), ("down_proj", 64, 1)):
            prefix = f"model.layers.{i}.mlp.experts.{proj}"
            tensors[f"{prefix}_blocks"] = torch.zeros(4, rows, blocks, 16, dtype=torch.uint8)
            tensors[f"{prefix}_scales"] = torch.full((4, rows, blocks), 127, dtype=torch.uint8)
    _save(tmp_path, model, tensors)
    with pytest.raises(ValueError, match=r"^model.layers.0.mlp.experts: .* not experts of MXFP4"):
        fp4_ops.load_quantized(tmp_path)


def test_save_quantized_writes_gpt_oss_mxfp4_that_both_readers_load(tmp_path):
    """quantize_model's MXFP4 experts of a gpt-oss model saved in gpt-oss's format: transformers'
    reader of that format computes what our model computes (within BF16 roundings), and
    load_quantized gives back the same experts, bit for bit."""
    model = _gpt_oss()
    fp4_ops.quantize_model(model, ["*.mlp.experts"], "mxfp4", activations="bf16")
    fp4_ops.save_quantized(model, tmp_path, "gpt-oss-mxfp4")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    dequantize = transformers.Mxfp4Config(dequantize=True)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.bfloat16, quantization_config=dequantize
    )
    back = fp4_ops.load_quantized(tmp_path)
    for mine, again in zip(model.model.layers, back.model.layers, strict=True):
        for w in ("w13", "w2"):
            a, b = mine.mlp.experts.expert_weights(w), again.mlp.experts.expert_weights(w)
            assert torch.equal(a.data, b.data) and torch.equal(a.global_scale, b.global_scale)
            assert torch.equal(
                a.plain_scales().view(torch.uint8), b.plain_scales().view(torch.uint8)
            )
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ours, read_by_them = model(ids).logits, theirs(ids).logits
        assert torch.equal(back(ids).logits, ours)
    assert _rel(ours, read_by_them) <= LOGITS_BOUND, _rel(ours, read_by_them)


def test_save_quantized_gpt_oss_mxfp4_refusals(tmp_path):
    nvfp4 = _gpt_oss()
    fp4_ops.quantize_model(nvfp4, ["*.mlp.experts"], "nvfp4", activations="bf16")
    with pytest.raises(
        ValueError, match="hold MXFP4 experts with gpt-oss's SwiGLU; these are nvfp4"
    ):
        fp4_ops.save_quantized(nvfp4, tmp_path, "gpt-oss-mxfp4")
    both = _gpt_oss()
    fp4_ops.quantize_model(both, ["*.mlp.experts", "*.q_proj"], "mxfp4", activations="bf16")
    with pytest.raises(ValueError, match="q_proj: gpt-oss MXFP4 checkpoints hold FP4 experts only"):
        fp4_ops.save_quantized(both, tmp_path, "gpt-oss-mxfp4")


def test_expert_biases_load_in_the_config_dtype(tmp_path):
    """Biases stored in float32 under a bfloat16 config load as bfloat16, both of them, as every
    other tensor does: what the state dict holds, and what a save writes back."""

    def float32_biases(tensors):
        for key in tensors:
            if key.endswith("_proj_bias"):
                tensors[key] = tensors[key].float() + 2.0**-12  # (not a BF16 value)

    _write(tmp_path, _gpt_oss(), float32_biases)
    ours = fp4_ops.load_quantized(tmp_path)
    for layer in ours.model.layers:
        ex = layer.mlp.experts
        assert ex.w13_bias.dtype == ex.w2_bias.dtype == torch.bfloat16
    biases = {k: v for k, v in ours.state_dict().items() if k.endswith("_bias")}
    assert biases and {v.dtype for v in biases.values()} == {torch.bfloat16}


@pytest.mark.parametrize("activations, want", [(None, torch.bfloat16), ("fp4", torch.float16)])
def test_float16_config_loads_w4a16_experts_in_bfloat16(activations, want, tmp_path):
    """MXFP4 experts run W4A16 on bfloat16 only (E8M0 scales exceed float16): under a float16
    config the model loads in bfloat16, with a warning, and runs; W4A4 keeps float16."""
    _write(tmp_path, _gpt_oss())
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = fp4_ops.load_quantized(tmp_path, activations=activations)
    said = [str(w.message) for w in caught if "E8M0 scales exceed float16" in str(w.message)]
    assert len(said) == (want == torch.bfloat16), said
    assert {p.dtype for n, p in ours.named_parameters() if "norm" not in n} == {want}
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert ours(ids).logits.isfinite().all()


@pytest.mark.parametrize(
    "entry", ["model.layers.1.mlp", "model.layers.1.mlp.experts", "model.layers.1.*"]
)
def test_modules_not_converted_keep_their_experts_16_bit(entry, tmp_path):
    """``modules_to_not_convert`` naming an experts module, a parent of one, or a glob over one:
    those experts are read as the 16-bit tensors the checkpoint holds for them, bit for bit, and
    the others as MXFP4."""
    model = _gpt_oss()
    prefix = "model.layers.1.mlp.experts"
    ex = model.model.layers[1].mlp.experts

    def keep_layer_1_in_bf16(tensors):
        for proj in ("gate_up_proj", "down_proj"):
            del tensors[f"{prefix}.{proj}_blocks"], tensors[f"{prefix}.{proj}_scales"]
            tensors[f"{prefix}.{proj}"] = getattr(ex, proj).detach().contiguous()

    _write(tmp_path, model, keep_layer_1_in_bf16)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"].append(entry)
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours = fp4_ops.load_quantized(tmp_path)
    assert isinstance(ours.model.layers[0].mlp.experts, fp4_ops.FP4Experts)
    kept = ours.model.layers[1].mlp.experts
    assert not isinstance(kept, fp4_ops.FP4Experts)
    for proj in ("gate_up_proj", "down_proj"):
        assert torch.equal(getattr(kept, proj), getattr(ex, proj)), proj
