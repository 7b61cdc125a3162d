# SPDX-License-Identifier: BSD-3-Clause
"""MoE checkpoints that hold one quantized Linear per expert and projection (compressed-tensors
and ModelOpt, as llm-compressor and ModelOpt export Qwen3-MoE or DeepSeek models) through
``load_quantized`` into transformers' fused experts modules: written here with ``reference.py``'s
quantizer in each format's conventions, held against the same model on the dequantized weights,
and the refusals."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from expert_checkpoints import quantize_per_expert, set_dequantized, write_per_expert

import fp4_ops
from fp4_ops.sm90.k_order import PREPACK_ROWS, unprepack_weights

transformers = pytest.importorskip("transformers", reason="needs transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs safetensors")
pytestmark = pytest.mark.fused_experts

EXPERTS, HIDDEN, WIDTH, LAYERS = 4, 64, 32, 2
# both models round to BF16 in different places (ours: h, the activation, y; theirs: its
# own), 2^-9 relative each, through two layers and the head: 2^-4 holds them; a misread
# projection, expert order or global-scale convention is off by order one
LOGITS_BOUND = 2.0**-4
NOT_QUANTIZED = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]


def _tiny_moe(config_class, **sizes):
    """A BF16 model of ``config_class``: LAYERS layers of hidden size HIDDEN, 4 heads, 2 of
    ``sizes``' EXPERTS experts per token, untied, seeded."""
    config = config_class(
        vocab_size=96,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        initializer_range=0.1,
        **sizes,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


def _qwen3_moe():
    return _tiny_moe(
        transformers.Qwen3MoeConfig,
        intermediate_size=128,
        moe_intermediate_size=WIDTH,
        num_experts=EXPERTS,
    )


#: the names this file's checkpoints give the experts, and what their configs leave out
NAMES = {
    "experts": "model.layers.{}.mlp.experts",
    "exclude": NOT_QUANTIZED,
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"],
}


def _per_expert(model, fuse_gate_up=True):
    return quantize_per_expert(
        [layer.mlp.experts for layer in model.model.layers], "fused", fuse_gate_up
    )


def _write(folder: Path, model, checkpoint: str, parts, corrupt=None) -> None:
    write_per_expert(folder, model, checkpoint, parts, NAMES, corrupt)


def _dequantized_model(model, parts):
    """The model with its fused experts set to the checkpoint's dequantized values (BF16)."""
    set_dequantized([layer.mlp.experts for layer in model.model.layers], parts, "fused")
    return model


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_per_expert_checkpoint_loads_into_fused_experts(checkpoint, tmp_path):
    model = _qwen3_moe()
    parts = _per_expert(model)
    _write(tmp_path, model, checkpoint, parts)
    ours = fp4_ops.load_quantized(tmp_path)
    want = _dequantized_model(model, parts)
    for i, layer in enumerate(ours.model.layers):
        ex = layer.mlp.experts
        assert isinstance(ex, fp4_ops.FP4Experts) and ex.activations == "bf16", i
        assert type(layer.self_attn.q_proj) is torch.nn.Linear  # (excluded: not quantized)
        w13 = ex.expert_weights("w13").dequantize(torch.float32)
        assert torch.equal(w13.bfloat16(), want.model.layers[i].mlp.experts.gate_up_proj)
        gs = ex.w13_global_scale
        assert torch.equal(gs, torch.stack([parts[i, e, "gate_proj"][2] for e in range(4)]))
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, ref = ours(ids).logits, want(ids).logits
    assert _rel(got, ref) <= LOGITS_BOUND, _rel(got, ref)
    w4a4 = fp4_ops.load_quantized(tmp_path, activations="fp4")
    assert w4a4.model.layers[0].mlp.experts.activations == "dynamic"


def test_per_expert_checkpoint_refusals(tmp_path):
    model = _qwen3_moe()
    unfused = _per_expert(model, fuse_gate_up=False)
    _write(tmp_path / "unfused", model, "modelopt", unfused)
    with pytest.raises(ValueError, match=r"experts.0.gate_proj and .*experts.0.up_proj: global"):
        fp4_ops.load_quantized(tmp_path / "unfused")
    parts = _per_expert(model)
    up = "model.layers.0.mlp.experts.1.up_proj.weight_scale_2"

    def one_ulp_apart(t):  # (a scale close to its gate's is still another scale)
        t[up] = torch.nextafter(t[up], torch.full_like(t[up], float("inf")))

    _write(tmp_path / "ulp", model, "modelopt", parts, one_ulp_apart)
    with pytest.raises(ValueError, match=r"experts.1.gate_proj and .*experts.1.up_proj: global"):
        fp4_ops.load_quantized(tmp_path / "ulp")
    key = "model.layers.1.mlp.experts.3.down_proj.weight_scale"
    _write(tmp_path / "missing", model, "modelopt", parts, lambda t: t.pop(key))
    with pytest.raises(ValueError, match=rf"{key}: missing from the checkpoint"):
        fp4_ops.load_quantized(tmp_path / "missing")
    _write(tmp_path / "mixed", model, "modelopt", parts)
    quant = json.loads((tmp_path / "mixed" / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"].append("model.layers.0.mlp.experts.2.up_proj")
    (tmp_path / "mixed" / "hf_quant_config.json").write_text(json.dumps(quant))
    with pytest.raises(ValueError, match="quantizes some of its experts' projections"):
        fp4_ops.load_quantized(tmp_path / "mixed")


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_experts_whose_forward_is_not_their_act_fn_are_refused(checkpoint, tmp_path, monkeypatch):
    """An experts class whose forward does more than its SiLU act_fn says (DeepSeek-V4 clamps
    its SwiGLU) must not load as plain-SiLU FP4Experts: the loader runs the class's forward on
    a probe, as quantize_model does on the weights."""
    model = _qwen3_moe()
    _write(tmp_path, model, checkpoint, _per_expert(model))
    experts = type(model.model.layers[0].mlp.experts)
    plain = experts.forward

    def clamped(self, hidden, *args, **kwargs):
        return plain(self, hidden, *args, **kwargs).clamp(-0.01, 0.01)

    monkeypatch.setattr(experts, "forward", clamped)
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.experts: .*its forward does not"):
        fp4_ops.load_quantized(tmp_path)


def _write_static_inputs(
    folder: Path, model, parts, checkpoint: str, bad_key=None, gate_weight_only=False
) -> None:
    """A W4A4 checkpoint (ModelOpt NVFP4, or compressed-tensors NVFP4 with a stored global
    activation scale) whose expert projections store input scales: every one, or all but the
    gate projections (one more config group for those, weight-only); ``bad_key``'s is -1."""
    old, new = ("weight_scale_2", "input_scale")
    if checkpoint == "compressed-tensors":
        old, new = ("weight_global_scale", "input_global_scale")

    def add(tensors):
        for key in [k for k in tensors if k.endswith(old)]:
            if gate_weight_only and ".gate_proj." in key:
                continue
            name = key.replace(old, new)
            value = -1.0 if name == bad_key else 0.01
            # (compressed-tensors stores the reciprocal, [1])
            tensors[name] = (
                torch.tensor(value) if new == "input_scale" else torch.tensor([1 / value])
            )

    _write(folder, model, checkpoint, parts, add)
    if checkpoint == "modelopt":
        quant = json.loads((folder / "hf_quant_config.json").read_text())
        quant["quantization"]["quant_algo"] = "NVFP4"
        (folder / "hf_quant_config.json").write_text(json.dumps(quant))
        return
    config = json.loads((folder / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    weights = groups["group_0"]["weights"]
    groups["group_0"]["input_activations"] = {**weights, "dynamic": "local"}
    if gate_weight_only:
        groups["group_0"]["targets"] = ["re:.*(up|down)_proj$"]
        groups["group_1"] = {"targets": ["re:.*gate_proj$"], "weights": weights}
    (folder / "config.json").write_text(json.dumps(config))


CHECKPOINTS = ["modelopt", "compressed-tensors"]


@pytest.mark.parametrize(
    "activations, mode, warns",
    [
        (None, "bf16", True),
        ("fp4", "dynamic", True),
        ("bf16", "bf16", False),
        ("dynamic", "dynamic", False),
    ],
)
@pytest.mark.parametrize("gate_weight_only", [False, True], ids=["all", "not-gate"])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_static_input_scales_of_experts_are_checked_and_not_used(
    checkpoint, gate_weight_only, activations, mode, warns, tmp_path
):
    """FP4Experts has no static-scale W4A4: a W4A4 checkpoint's experts run W4A16 or per-call
    W4A4, with a warning unless asked for, also where only some projections store input scales;
    their weights load as a weight-only checkpoint's."""
    if gate_weight_only and checkpoint == "modelopt":
        pytest.skip("ModelOpt's quant_algo is one scheme for every layer")
    model = _qwen3_moe()
    parts = _per_expert(model)
    _write_static_inputs(tmp_path, model, parts, checkpoint, gate_weight_only=gate_weight_only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = fp4_ops.load_quantized(tmp_path, activations=activations)
    said = [w for w in caught if issubclass(w.category, UserWarning)]
    unused = [w for w in said if "store static input scales" in str(w.message)]
    assert len(unused) == (1 if warns else 0), [str(w.message) for w in said]
    if warns:
        message = str(unused[0].message)
        assert message.startswith(f"{LAYERS} experts modules (model.layers.0.mlp.experts, ")
        assert unused[0].filename == __file__  # (it points at the caller of load_quantized)
    want = _dequantized_model(_qwen3_moe(), parts)
    for i, layer in enumerate(ours.model.layers):
        assert layer.mlp.experts.activations == mode
        w13 = layer.mlp.experts.expert_weights("w13").dequantize(torch.float32)
        assert torch.equal(w13.bfloat16(), want.model.layers[i].mlp.experts.gate_up_proj)


@pytest.mark.parametrize("activations", [None, "bf16"])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_a_bad_input_scale_of_an_expert_is_refused(checkpoint, activations, tmp_path):
    model = _qwen3_moe()
    name = "input_scale" if checkpoint == "modelopt" else "input_global_scale"
    key = f"model.layers.1.mlp.experts.2.up_proj.{name}"
    _write_static_inputs(tmp_path, model, _per_expert(model), checkpoint, bad_key=key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=rf"{key}.*finite and positive"):
            fp4_ops.load_quantized(tmp_path, activations=activations)
    # (no word that the scales were checked: one was refused)
    assert not [w for w in caught if "store static input scales" in str(w.message)]


def _deepseek_v3():
    """A DeepSeek-V3-style model: layer 0 dense, layer 1 routed experts beside a shared one."""
    from test_moe_transformers import other_moe_config

    torch.manual_seed(0)
    # (built in BF16 as from_pretrained builds it: the router in fp32 where its class demands
    # it, e.g. transformers 5.25's; 5.17's keeps only the router's bias in fp32)
    config = other_moe_config("deepseek-v3")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fp32 = "gate.weight" in (getattr(type(model), "_keep_in_fp32_modules_strict", None) or ())
    want = torch.float32 if fp32 else torch.bfloat16
    assert model.model.layers[1].mlp.gate.weight.dtype == want
    return model.eval()


# (what is quantized: the experts, and DeepSeek-V3's dense MLP and shared expert as Linears)
ARCHS = {
    "qwen3-moe": (_qwen3_moe, ["*.mlp.experts"]),
    "deepseek-v3": (_deepseek_v3, ["*.mlp.experts", "*.mlp.shared_experts.*", "*.0.mlp.*"]),
}


@pytest.mark.parametrize(
    "arch, checkpoint, fmt, activations",
    [
        ("qwen3-moe", "modelopt", "nvfp4", "bf16"),
        ("qwen3-moe", "compressed-tensors", "nvfp4", "bf16"),
        ("qwen3-moe", "compressed-tensors", "mxfp4", "bf16"),
        ("qwen3-moe", "compressed-tensors", "mxfp4", "dynamic"),
        ("deepseek-v3", "modelopt", "nvfp4", "bf16"),
        ("deepseek-v3", "compressed-tensors", "mxfp4", "bf16"),
        ("deepseek-v3", "compressed-tensors", "mxfp4", "dynamic"),
    ],
)
def test_quantize_model_experts_save_and_load_back(arch, checkpoint, fmt, activations, tmp_path):
    """quantize_model's FP4Experts (and FP4Linears) saved as per-expert Linears and loaded
    back in the checkpoint's own mode (W4A16, or MXFP4 W4A4 with per-call scales): the same
    experts bit for bit (one compressed-tensors global scale may come back one ulp off: its
    reciprocal convention), the same outputs, the same logits."""
    build, patterns = ARCHS[arch]
    model = build()
    report = fp4_ops.quantize_model(model, patterns, fmt, activations=activations)
    assert report.replaced and not report.skipped
    fp4_ops.save_quantized(model, tmp_path, checkpoint)
    # (the routers, nn.Linears in transformers 4.x, are listed 16-bit for its readers too)
    if checkpoint == "modelopt":
        quantization = json.loads((tmp_path / "hf_quant_config.json").read_text())
        listed = quantization["quantization"]["exclude_modules"]
    else:
        listed = json.loads((tmp_path / "config.json").read_text())["quantization_config"]["ignore"]
    routers = [n for n, m in model.named_modules() if n.endswith("mlp.gate")]
    assert routers and set(routers) <= set(listed), listed
    back = fp4_ops.load_quantized(tmp_path)
    experts = [n for n, m in model.named_modules() if isinstance(m, fp4_ops.FP4Experts)]
    assert experts == [n for n, m in back.named_modules() if isinstance(m, fp4_ops.FP4Experts)]
    assert len(experts) == (LAYERS if arch == "qwen3-moe" else 1)
    for name in experts:
        mine, theirs = model.get_submodule(name), back.get_submodule(name)
        for w in ("w13", "w2"):
            a, b = mine.expert_weights(w), theirs.expert_weights(w)
            assert torch.equal(a.data, b.data) and torch.equal(a.plain_scales(), b.plain_scales())
            ratio = b.global_scale / a.global_scale
            assert bool(((ratio - 1).abs() <= 2.0**-23).all()), w
        assert theirs.activations == mine.activations == activations
        x = torch.randn(5, mine.hidden, generator=torch.Generator().manual_seed(1)).bfloat16()
        ids, weights = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 3], [2, 0]]), torch.rand(5, 2)
        with torch.no_grad():
            assert torch.equal(theirs(x, ids, weights), mine(x, ids, weights))
    linears = {n for n, m in model.named_modules() if isinstance(m, fp4_ops.FP4Linear)}
    assert linears == {n for n, m in back.named_modules() if isinstance(m, fp4_ops.FP4Linear)}
    # (the test's .to(bfloat16) cast RoPE's inv_freq too; the loader keeps it float32, as
    # from_pretrained does: W4A4 re-quantizes what that difference moves)
    for name, buffer in back.named_buffers():
        if name.endswith("inv_freq"):
            model.get_buffer(name).data = buffer.clone()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got, want = back(ids).logits, model(ids).logits
    assert _rel(got, want) <= 2.0**-7


def _mixtral():
    return _tiny_moe(transformers.MixtralConfig, intermediate_size=WIDTH, num_local_experts=EXPERTS)


# Mixtral's checkpoint spellings of what transformers calls model.layers.N.mlp.experts.E.*_proj:
# its original checkpoints' (save_quantized writes them), llm-compressor's, transformers'
MIXTRAL_SPELLINGS = {
    "original": (".block_sparse_moe.", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}),
    "llm-compressor": (".block_sparse_moe.", {}),
    "transformers": (".mlp.", {}),
}


def _respell(folder: Path, spelling: str) -> None:
    """The checkpoint's keys and config names from the original spelling to ``spelling``."""
    block, projections = MIXTRAL_SPELLINGS[spelling]
    original = MIXTRAL_SPELLINGS["original"][1]

    def name(n: str) -> str:
        n = n.replace(".block_sparse_moe.", block).replace(".block_sparse_moe", block[:-1])
        for proj, w in original.items():
            n = re.sub(rf"(\.experts\.\d+)\.{w}(?=\.|$)", rf"\1.{projections.get(proj, proj)}", n)
        return n

    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    safetensors_torch.save_file({name(k): v for k, v in tensors.items()}, str(path))
    for config_file in ("config.json", "hf_quant_config.json"):
        if (folder / config_file).exists():
            text = (folder / config_file).read_text()
            text = text.replace("block_sparse_moe", block.strip("."))  # (regexes too)
            (folder / config_file).write_text(text)


@pytest.mark.parametrize("spelling", list(MIXTRAL_SPELLINGS))
@pytest.mark.parametrize("checkpoint", ["compressed-tensors", "modelopt"])
def test_mixtral_checkpoints_load_in_each_spelling(checkpoint, spelling, tmp_path):
    """save_quantized writes a Mixtral's experts as its original checkpoints name them
    (block_sparse_moe.experts.E.w1 / w3 / w2, the router's gate beside them, the config's
    names alike); load_quantized takes that, llm-compressor's (gate_proj / up_proj /
    down_proj under block_sparse_moe) and transformers' own names: the same experts, the same
    logits."""
    model = _mixtral()
    report = fp4_ops.quantize_model(model, ["model.layers.0.mlp.experts"], activations="bf16")
    assert report.replaced == ["model.layers.0.mlp.experts"]  # (layer 1's stay 16-bit)
    fp4_ops.save_quantized(model, tmp_path, checkpoint)
    keys = list(safetensors_torch.load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight_scale" in keys
    assert "model.layers.1.block_sparse_moe.experts.gate_up_proj" in keys
    assert "model.layers.0.block_sparse_moe.gate.weight" in keys
    assert not [k for k in keys if ".mlp." in k or "_proj." in k and ".experts." in k]
    # (the config names layer 1's 16-bit experts as the keys do: as left out of FP4)
    config = tmp_path / ("config.json" if checkpoint != "modelopt" else "hf_quant_config.json")
    text = config.read_text()
    assert "block_sparse_moe" in text and "mlp" not in text
    _respell(tmp_path, spelling)
    back = fp4_ops.load_quantized(tmp_path)
    mine, theirs = model.model.layers[0].mlp.experts, back.model.layers[0].mlp.experts
    for w in ("w13", "w2"):
        a, b = mine.expert_weights(w), theirs.expert_weights(w)
        assert torch.equal(a.data, b.data) and torch.equal(a.plain_scales(), b.plain_scales())
    plain, loaded = model.model.layers[1].mlp.experts, back.model.layers[1].mlp.experts
    assert torch.equal(loaded.gate_up_proj, plain.gate_up_proj)
    for name, buffer in back.named_buffers():  # (see the round trip above: RoPE's inv_freq)
        if name.endswith("inv_freq"):
            model.get_buffer(name).data = buffer.clone()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert _rel(back(ids).logits, model(ids).logits) <= 2.0**-7


@pytest.mark.parametrize("spelling", ["original", "llm-compressor"])
@pytest.mark.parametrize("schemes", [1, 2])
def test_mixtral_groups_and_ignore_lists_by_name_load(schemes, spelling, tmp_path):
    """Layer 1's experts left 16-bit and named one projection at a time in ``ignore``, as a
    tool that expands its patterns writes them (in either spelling); with two schemes
    (attention in MXFP4 too) compressed-tensors lists each group's layers by name: the same
    model loads."""
    model = _mixtral()
    fp4_ops.quantize_model(model, ["model.layers.0.mlp.experts"], activations="bf16")
    if schemes == 2:
        fp4_ops.quantize_model(model, ["*.self_attn.*"], "mxfp4", activations="bf16")
    fp4_ops.save_quantized(model, tmp_path)
    _respell(tmp_path, spelling)
    config = json.loads((tmp_path / "config.json").read_text())
    qc = config["quantization_config"]
    projections = MIXTRAL_SPELLINGS[spelling][1]
    qc["ignore"] = [n for n in qc["ignore"] if not n.startswith("re:")] + [
        f"model.layers.1.block_sparse_moe.experts.{e}.{projections.get(p, p)}"
        for e in range(EXPERTS)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    (tmp_path / "config.json").write_text(json.dumps(config))
    back = fp4_ops.load_quantized(tmp_path)
    assert schemes == 1 or back.model.layers[0].self_attn.q_proj.format == "mxfp4"
    mine, theirs = model.model.layers[0].mlp.experts, back.model.layers[0].mlp.experts
    assert torch.equal(mine.expert_weights("w2").data, theirs.expert_weights("w2").data)
    plain, loaded = model.model.layers[1].mlp.experts, back.model.layers[1].mlp.experts
    assert torch.equal(loaded.down_proj, plain.down_proj)


def test_mixtral_checkpoint_naming_one_tensor_twice_is_refused(tmp_path):
    """A checkpoint holding a tensor under both spellings (block_sparse_moe and mlp) names one
    tensor of the model twice: a ValueError naming both keys, not one of them taken."""
    model = _mixtral()
    fp4_ops.quantize_model(model, ["*.mlp.experts"], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    tensors["model.layers.0.mlp.gate.weight"] = tensors[
        "model.layers.0.block_sparse_moe.gate.weight"
    ]
    safetensors_torch.save_file({k: v.clone() for k, v in tensors.items()}, str(path))
    with pytest.raises(ValueError, match="block_sparse_moe.gate.weight, .*mlp.gate.weight: all"):
        fp4_ops.load_quantized(tmp_path)


def test_mixtral_w4a16_experts_under_a_float32_config_load_in_bfloat16(tmp_path):
    """W4A16 experts (and no FP4 Linear) under a float32 config: the model loads in bfloat16,
    with a warning, and runs."""
    model = _mixtral()
    fp4_ops.quantize_model(model, ["*.mlp.experts"], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    with pytest.warns(UserWarning, match="W4A16 layers take 16-bit activations"):
        back = fp4_ops.load_quantized(tmp_path)
    assert back.model.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert back(ids).logits.isfinite().all()


def test_save_quantized_refuses_experts_without_a_checkpoint_form(tmp_path):
    model = _qwen3_moe()
    fp4_ops.quantize_model(model, ["*.mlp.experts"], "nvfp4", activations="dynamic")
    with pytest.raises(ValueError, match="NVFP4 experts with dynamic .* activations='bf16'"):
        fp4_ops.save_quantized(model, tmp_path)
    fp4_ops.save_quantized(model, tmp_path, activations="bf16")  # (weight-only: it has one)
    with pytest.raises(ValueError, match="ModelOpt checkpoints hold NVFP4 only"):
        mx = _qwen3_moe()
        fp4_ops.quantize_model(mx, ["*.mlp.experts"], "mxfp4", activations="bf16")
        fp4_ops.save_quantized(mx, tmp_path, "modelopt")
    biased = _qwen3_moe()
    fp4_ops.quantize_model(biased, ["*.mlp.experts"], "nvfp4", activations="bf16")
    ex = biased.model.layers[0].mlp.experts
    e, two_i = ex.num_experts, 2 * ex.intermediate
    biased.model.layers[0].mlp.experts = fp4_ops.FP4Experts(
        ex.expert_weights("w13"),
        ex.expert_weights("w2"),
        "silu",
        "bf16",
        torch.ones(e, two_i),
        None,
    )
    for checkpoint in ("compressed-tensors", "modelopt"):
        with pytest.raises(ValueError, match=r"layers\.0\.mlp\.experts: SiLU FP4Experts with bias"):
            fp4_ops.save_quantized(biased, tmp_path / checkpoint, checkpoint)


@pytest.mark.parametrize(
    "arch, patterns, checkpoint",
    [
        ("qwen3-moe", ["*.self_attn.*"], "compressed-tensors"),
        ("qwen3-moe", ["*.self_attn.*"], "modelopt"),
        ("gpt-oss", ["model.layers.0.mlp.experts"], "gpt-oss-mxfp4"),
    ],
)
def test_experts_left_16_bit_save_and_load_back(arch, patterns, checkpoint, tmp_path):
    """A model whose experts modules stay 16-bit (some or all): the checkpoint's config names
    them as not quantized (every reader would take their per-expert Linears for FP4), and they
    load back as the same 16-bit modules."""
    if arch == "gpt-oss":
        from test_gpt_oss_checkpoint import _gpt_oss as build
    else:
        build = _qwen3_moe
    model = build()
    fp4_ops.quantize_model(model, patterns, "mxfp4" if arch == "gpt-oss" else "nvfp4", "bf16")
    fp4_ops.save_quantized(model, tmp_path, checkpoint)
    back = fp4_ops.load_quantized(tmp_path)
    kinds = {n: type(m) for n, m in model.named_modules() if fp4_ops.moe.is_experts_module(m)}
    assert kinds and kinds == {n: type(m) for n, m in back.named_modules() if n in kinds}
    for name in kinds:
        theirs = dict(back.get_submodule(name).named_parameters())
        for key, p in model.get_submodule(name).named_parameters():
            assert torch.equal(p, theirs[key]), f"{name}.{key}"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="W4A16 runs on sm_90 (H100 / H200) only",
)
def test_gpu_save_makes_one_modules_plain_copy_at_a_time(tmp_path):
    """save_quantized of a W4A16 model on the GPU (FP4Linears and FP4Experts, whose weights
    are held prepacked) copies each module's tensors to the host before it makes the next
    one's plain copy: the GPU memory it adds stays under two modules' worth and the
    unprepacking's temporaries, where making every plain copy first (as ``model.state_dict()``
    does) adds the whole model's, and it keeps none of it. On the CPU the host copy is the
    tensor itself, so only a GPU can tell the two apart."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to("cuda", torch.bfloat16)
    fp4_ops.quantize_model(model, ["model.layers.*"], activations="bf16")
    fp4 = [m for m in model.modules() if isinstance(m, (fp4_ops.FP4Linear, fp4_ops.FP4Experts))]
    held = [sum(b.numel() * b.element_size() for b in m.buffers()) for m in fp4]
    # (unprepack_weights's int32 half-words, their lookups and its gather: 7 bytes per byte of
    # one PREPACK_ROWS-row chunk, whose rows hold at most hidden_size / 2 bytes here)
    temporaries = 8 * PREPACK_ROWS * config.hidden_size // 2
    bound = 2 * max(held) + temporaries + (1 << 16)  # (64 KB: scalars, the allocator's rounding)
    assert len(fp4) == 12 * 5 and sum(held) > 2 * bound  # (the bound tells them apart)
    # (the unprepacking's bit tables are made once per device and kept: made before measuring)
    unprepack_weights(torch.zeros((1, 32), dtype=torch.uint8, device="cuda"), 64)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fp4_ops.save_quantized(model, tmp_path)
    added = torch.cuda.max_memory_allocated() - before
    assert added <= bound, (added, max(held), sum(held))
    assert torch.cuda.memory_allocated() - before < 1 << 16  # (it keeps no copy)
    back = fp4_ops.load_quantized(tmp_path)
    for name, module in model.named_modules():
        if isinstance(module, fp4_ops.FP4Experts):
            mine, theirs = module, back.get_submodule(name)
            for w in ("w13", "w2"):
                a, b = mine.expert_weights(w), theirs.expert_weights(w)
                assert torch.equal(a.data.cpu(), b.data) and torch.equal(a.scale.cpu(), b.scale)


def _spelled_moe(model_type: str):
    """A tiny BF16 MoE model of a type whose checkpoints spell some names otherwise."""
    common = dict(
        vocab_size=96,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    if model_type == "ernie4_5_moe":
        config = transformers.Ernie4_5_MoeConfig(
            intermediate_size=128,
            moe_intermediate_size=WIDTH,
            moe_num_experts=EXPERTS,
            moe_k=2,
            moe_layer_start_index=0,
            **common,
        )
    else:
        config = transformers.AutoConfig.for_model(
            model_type,
            intermediate_size=WIDTH,
            num_local_experts=EXPERTS,
            num_experts_per_tok=2,
            head_dim=16,
            **common,
        )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


#: a key each model type's checkpoints hold under their own spelling (from transformers'
#: conversion mappings), with its experts and attention quantized: (the key, how transformers
#: names it)
STORED_KEYS = {
    "minimax": ("model.layers.0.block_sparse_moe.experts.1.w3.weight_scale", ".mlp."),
    "phimoe": ("model.layers.0.block_sparse_moe.gate.weight", ".mlp.router."),
    "granitemoe": ("model.layers.0.block_sparse_moe.router.layer.weight", ".router.weight"),
    "granitemoeshared": (
        "model.layers.0.block_sparse_moe.router.layer.weight",
        ".router.weight",
    ),
    "minimax_m2": ("model.layers.0.block_sparse_moe.experts.1.w3.weight_scale", ".mlp."),
    "ernie4_5_moe": ("model.layers.0.mlp.moe_statics.e_score_correction_bias", ".gate.moe_"),
}


@pytest.mark.parametrize("model_type", sorted(STORED_KEYS))
def test_moe_checkpoints_in_their_own_spelling_load(model_type, tmp_path):
    """MiniMax (as Mixtral), PhiMoE (its router stored as gate), Granite-MoE (router.layer,
    input_linear / output_linear) and ERNIE-4.5-MoE (moe_statics outside the gate) checkpoints
    spell names otherwise than transformers 5's models: save_quantized writes their spelling,
    load_quantized reads it back (the same experts, the same logits), also where the config's
    ignore list mixes both spellings (PhiMoE's, as llm-compressor writes it)."""
    model = _spelled_moe(model_type)
    fp4_ops.quantize_model(model, ["*.experts", "*.self_attn.*"], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path, "modelopt")
    keys = set(safetensors_torch.load_file(str(tmp_path / "model.safetensors")))
    stored, model_spelling = STORED_KEYS[model_type]
    assert stored in keys and not [k for k in keys if model_spelling in k]
    if model_type == "phimoe":  # (the router named as transformers' module, under the block's)
        path = tmp_path / "hf_quant_config.json"
        quant = json.loads(path.read_text())
        quant["quantization"]["exclude_modules"] = ["lm_head", "*.block_sparse_moe.router"]
        path.write_text(json.dumps(quant))
    back = fp4_ops.load_quantized(tmp_path)
    for name, module in model.named_modules():
        if isinstance(module, fp4_ops.FP4Experts):
            theirs = back.get_submodule(name)
            for w in ("w13", "w2"):
                assert torch.equal(module.expert_weights(w).data, theirs.expert_weights(w).data)
    for name, buffer in back.named_buffers():  # (RoPE's inv_freq: see the round trip above)
        if name.endswith("inv_freq"):
            model.get_buffer(name).data = buffer.clone()
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_qwen3_5_moe_vision_language_checkpoints_load_into_the_causal_lm(checkpoint, tmp_path):
    """Qwen3.5-MoE's vision-language model, its experts and attention quantized, saves under its
    own names (model.language_model.*, as its checkpoints spell them); load_quantized builds the
    causal LM of its language model from that checkpoint: the same experts, the same logits."""
    if not hasattr(transformers, "Qwen3_5MoeConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3_5MoeConfig")
    text = dict(
        vocab_size=96,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        moe_intermediate_size=WIDTH,
        shared_expert_intermediate_size=WIDTH,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        initializer_range=0.1,
    )
    vision = dict(hidden_size=64, intermediate_size=128, depth=1, num_heads=4, patch_size=8)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.Qwen3_5MoeConfig(
            text_config=text,
            vision_config=vision | dict(out_hidden_size=HIDDEN),
            tie_word_embeddings=False,
        )
        vl = transformers.Qwen3_5MoeForConditionalGeneration(config).to(torch.bfloat16).eval()
    patterns = ["*.language_model.*.experts", "*.language_model.*.self_attn.*"]
    fp4_ops.quantize_model(vl, patterns, activations="bf16")
    fp4_ops.save_quantized(vl, tmp_path, checkpoint)
    keys = set(safetensors_torch.load_file(str(tmp_path / "model.safetensors")))
    stored = [k for k in keys if ".mlp.experts.1." in k]
    assert stored and all(k.startswith("model.language_model.layers.") for k in stored)
    back = fp4_ops.load_quantized(tmp_path)
    assert back.config.model_type == "qwen3_5_moe_text"
    for name, module in vl.named_modules():
        if isinstance(module, fp4_ops.FP4Experts):
            theirs = back.get_submodule(name.replace("model.language_model.", "model.", 1))
            for w in ("w13", "w2"):
                assert torch.equal(module.expert_weights(w).data, theirs.expert_weights(w).data)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, vl(input_ids=ids).logits)
