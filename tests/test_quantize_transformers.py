# SPDX-License-Identifier: BSD-3-Clause
"""Which Linears of transformers' models quantize_model keeps 16-bit (CPU), under transformers
4.x and 5.x, each against a list written from the models' code:

* MoE routers, as FP4 checkpoints and serving engines keep them: the routers that are nn.Linear
  there (Mixtral's and Qwen-MoE's ``gate`` in 4.x; Qwen2-MoE's ``shared_expert_gate``,
  Hunyuan's ``gate.wg``, AFMoE's ``router.gate``, PhiMoE's ``router`` in 5.x);
* Linears whose weight their parent reads itself (Mamba's mixer passes ``x_proj``, ``dt_proj``
  and ``out_proj``'s weights to its kernels, its LM casts to ``lm_head.weight.dtype``), which
  an FP4Linear holds as an FP4Tensor.

Every other Linear becomes an FP4Linear, and the model runs. A checkpoint that quantizes
Linears of the second kind anyway loads them dequantized (load_quantized)."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import re
import warnings
import weakref

import pytest
import torch

import fp4_ops

transformers = pytest.importorskip("transformers", reason="needs transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs safetensors")

#: model type -> its routers' names inside a decoder layer, as either transformers major
#: spells them (the ones that are nn.Linear in the installed version are expected)
ROUTERS = {
    "mixtral": ("block_sparse_moe.gate", "mlp.gate"),
    "qwen2_moe": ("mlp.gate", "mlp.shared_expert_gate"),
    "qwen3_moe": ("mlp.gate",),
    "hunyuan_v1_moe": ("mlp.gate.wg",),
    "afmoe": ("mlp.router.gate",),
    "phimoe": ("block_sparse_moe.gate", "mlp.router"),
    # (attention holds experts too; its kv_proj is no router)
    "jetmoe": ("mlp.router.layer", "self_attention.experts.router.layer"),
}


def _tiny(model_type: str) -> torch.nn.Module:
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} model")
    config = transformers.AutoConfig.for_model(model_type)
    sizes = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_local_experts=4,
        num_experts_per_tok=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    for key, value in sizes.items():
        if hasattr(config, key):
            setattr(config, key, value)
    torch.manual_seed(0)
    with warnings.catch_warnings():  # (transformers' notes on tiny configs)
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", sorted(ROUTERS))
def test_quantize_model_keeps_transformers_routers(model_type):
    model = _tiny(model_type)
    suffix = "|".join(re.escape(r) for r in ROUTERS[model_type])
    linears = {
        n: m
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear or isinstance(m, torch.nn.Linear) and "router" in n
    }
    in_layers = {n for n in linears if re.fullmatch(r"model\.layers\.\d+\..+", n)}
    routers = {n for n in in_layers if re.fullmatch(rf"model\.layers\.\d+\.({suffix})", n)}
    if not routers:
        pytest.skip(
            f"{model_type}'s routers are no nn.Linear in transformers {transformers.__version__}"
        )
    kept = {n: linears[n] for n in routers}

    report = fp4_ops.quantize_model(model, ["model.layers.*"], activations="bf16")
    assert {n for n, why in report.skipped.items() if "an MoE router" in why} == routers
    assert in_layers - routers <= set(report.replaced)
    assert all(model.get_submodule(n) is kept[n] for n in routers)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model.to(torch.bfloat16)(ids).logits
    assert logits.shape == (1, 6, 96) and bool(torch.isfinite(logits).all())


#: Mamba's Linears whose weights its code reads (modeling_mamba.py), per layer and at the top
MAMBA_READS = ("mixer.x_proj", "mixer.dt_proj", "mixer.out_proj")


def _mamba(use_bias: bool = False):
    """A tiny two-layer Mamba LM in eval mode, float32, its weights from seed 0."""
    config = transformers.MambaConfig(
        vocab_size=96,
        hidden_size=64,
        state_size=8,
        intermediate_size=128,
        time_step_rank=8,
        num_hidden_layers=2,
        use_bias=use_bias,
    )
    torch.manual_seed(0)
    return transformers.MambaForCausalLM(config).eval()


def test_quantize_model_keeps_linears_mamba_reads():
    model = _mamba().bfloat16()
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    read = {f"backbone.layers.{i}.{n}" for i in range(2) for n in MAMBA_READS} | {"lm_head"}
    assert read < linears

    report = fp4_ops.quantize_model(model, activations="bf16")
    assert set(report.skipped) == read
    assert all("itself, which an FP4Linear" in why for why in report.skipped.values())
    assert set(report.replaced) == linears - read
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():  # (its note on the slow path)
        warnings.simplefilter("ignore")
        logits = model(ids).logits
    assert logits.shape == (1, 6, 96) and bool(torch.isfinite(logits).all())


def _mamba_with_fp4_reads(dtype: torch.dtype, activations: str):
    """A tiny Mamba (biased projections) whose Linears are FP4Linears, as a writer that
    quantizes every Linear makes them, Mamba's weight reads included: (model, the Linears it
    reads, the others)."""
    model = _mamba(use_bias=True).to(dtype)
    read = [f"backbone.layers.{i}.mixer.{n}" for i in range(2) for n in ("x_proj", "out_proj")]
    fp4 = [f"backbone.layers.{i}.mixer.in_proj" for i in range(2)]
    gs = {"input_global_scale": 0.01} if activations == "static" else {}
    for name in read + fp4:
        parent, _, attr = name.rpartition(".")
        layer = fp4_ops.FP4Linear.from_linear(
            model.get_submodule(name), activations=activations, **gs
        )
        setattr(model.get_submodule(parent), attr, layer)
    return model, read, fp4


@pytest.mark.parametrize(
    "dtype, activations", [(torch.bfloat16, "bf16"), (torch.float16, "static")]
)
def test_load_quantized_dequantizes_linears_mamba_reads(tmp_path, dtype, activations):
    """A checkpoint that quantizes Linears whose weights Mamba's code reads loads them as Linears
    of the model's dtype holding the dequantized FP4 weights and their biases, frozen as every
    loaded tensor, with a warning that names them; the other quantized Linears load as
    FP4Linear, and the model gives the logits of the same layers held that way before saving."""
    model, read, fp4 = _mamba_with_fp4_reads(dtype, activations)
    fp4_ops.save_quantized(model, tmp_path)
    with pytest.warns(UserWarning, match="dequantized") as caught:
        back = fp4_ops.load_quantized(tmp_path)
    message = str(caught[0].message)
    assert all(name in message for name in read) and f"as {str(dtype)[6:]} Linear" in message
    assert not any(p.requires_grad for p in back.parameters())

    for name in read:  # (the reference: the same FP4 weights, dequantized by hand)
        parent, _, attr = name.rpartition(".")
        layer = model.get_submodule(name)
        linear = torch.nn.Linear(layer.in_features, layer.out_features, layer.bias is not None)
        linear = linear.to(dtype).requires_grad_(False)
        linear.weight.copy_(layer.weight.dequantize(dtype))
        if layer.bias is not None:
            linear.bias.copy_(layer.bias)
        setattr(model.get_submodule(parent), attr, linear)
        got = back.get_submodule(name)
        assert type(got) is torch.nn.Linear and torch.equal(got.weight, linear.weight), name
        assert (got.bias is None) == (linear.bias is None), name
        assert got.bias is None or torch.equal(got.bias, linear.bias), name
    assert any(model.get_submodule(name).bias is not None for name in read)
    assert all(isinstance(back.get_submodule(name), fp4_ops.FP4Linear) for name in fp4)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():  # (its note on the slow path)
        warnings.simplefilter("ignore")
        assert torch.equal(back(ids).logits, model(ids).logits)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), 1e-40])
def test_load_quantized_checks_input_scales_of_dequantized_linears(tmp_path, bad):
    """A dequantized Linear's stored input scale is unused, and checked as any other: a scale
    that is not a finite positive number (either way round) is refused, naming its tensor."""
    model, read, _ = _mamba_with_fp4_reads(torch.bfloat16, "static")
    fp4_ops.save_quantized(model, tmp_path)
    (file,) = tmp_path.glob("*.safetensors")
    tensors = safetensors_torch.load_file(file)
    key = f"{read[-1]}.input_global_scale"
    tensors[key] = torch.full_like(tensors[key], bad)
    safetensors_torch.save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(key)):
        fp4_ops.load_quantized(tmp_path)


def test_load_quantized_dequantized_linears_take_the_config_dtype(tmp_path):
    """A dequantized Linear's weight and bias are of the config's dtype, whatever the stored
    bias's."""
    model, read, _ = _mamba_with_fp4_reads(torch.bfloat16, "bf16")
    fp4_ops.save_quantized(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "float16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = fp4_ops.load_quantized(tmp_path)
    for name in read:
        layer, got = model.get_submodule(name), back.get_submodule(name)
        assert torch.equal(got.weight, layer.weight.dequantize(torch.float16)), name
        want = None if layer.bias is None else layer.bias.to(torch.float16)
        assert got.bias is want is None or torch.equal(got.bias, want), name
        assert {p.dtype for p in got.parameters()} == {torch.float16}, name


class _Mixer(transformers.models.mamba.modeling_mamba.MambaMixer):
    """Mamba's mixer with its own constructor only: the weight reads are its base's."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)


def test_quantize_model_keeps_linears_a_base_class_reads():
    model = _mamba().bfloat16()
    for layer in model.backbone.layers:
        layer.mixer.__class__ = _Mixer
    report = fp4_ops.quantize_model(model, ["backbone.*"], activations="bf16")
    read = {f"backbone.layers.{i}.{n}" for i in range(2) for n in MAMBA_READS}
    assert read <= set(report.skipped)


def test_quantize_model_keeps_multihead_attentions_out_proj():
    """nn.MultiheadAttention passes its out_proj's weight to its functional form: out_proj
    stays an nn.Linear, the model's other Linear becomes an FP4Linear, and the model runs."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.fc(self.attn(x, x, x, need_weights=False)[0])

    torch.manual_seed(0)
    block = Block().bfloat16().eval()
    report = fp4_ops.quantize_model(block, activations="bf16")
    assert list(report.replaced) == ["fc"] and list(report.skipped) == ["attn.out_proj"]
    assert type(block.attn.out_proj) is torch.nn.modules.linear.NonDynamicallyQuantizableLinear
    with torch.no_grad():
        y = block(torch.randn(1, 5, 64, dtype=torch.bfloat16))
    assert y.shape == (1, 5, 64) and bool(torch.isfinite(y).all())


def test_quantize_model_names_gpt2s_conv1d():
    """GPT-2's projections are transformers' Conv1D (a Linear storing its weight transposed),
    which FP4Linear does not replace: named with the reason by default and under a predicate
    (which is asked of Linears only), refused where ``include`` patterns choose one, before the
    model changes."""
    config = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=2,
        vocab_size=96,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval().bfloat16()
    conv = {f"transformer.h.{i}.{n}" for i in range(2) for n in GPT2_CONV1D}
    with pytest.raises(ValueError, match=r"^transformer\.h\.0\.mlp\.c_fc: transformers' Conv1D"):
        fp4_ops.quantize_model(model, ["lm_head", "*.mlp.*"], activations="bf16")
    assert type(model.lm_head) is torch.nn.Linear  # (nothing changed before the refusal)
    report = fp4_ops.quantize_model(model, ["lm_head"], activations="bf16")
    assert not conv & {*report.replaced, *report.skipped}
    for include in (None, lambda name, m: m.in_features > 0):
        report = fp4_ops.quantize_model(model, include, activations="bf16")
        assert {n: why for n, why in report.skipped.items() if n in conv} == dict.fromkeys(
            conv, fp4_ops.nn.CONV1D_REASON
        )
        assert not conv & set(report.replaced)


def test_quantize_model_names_subclasses_of_conv1d_only():
    """A subclass of transformers' Conv1D is one (named); another class called Conv1D is not."""

    class Conv1D(torch.nn.Module):  # (a convolution of one's own, named alike)
        pass

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = type("MyConv1D", (transformers.pytorch_utils.Conv1D,), {})(64, 64)
            self.conv = Conv1D()

    report = fp4_ops.quantize_model(Net(), activations="bf16")
    assert report.skipped == {"proj": fp4_ops.nn.CONV1D_REASON} and not report.replaced


#: GPT-2's Conv1D modules in each block (modeling_gpt2.py)
GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


RESIZE_REFUSED = r"^resize_token_embeddings: the output embedding is an FP4Linear, "


def _tied_lm(arch: str, tie: bool) -> torch.nn.Module:
    """A tiny Qwen2 LM, or a Llava model around one (its text config a submodel's)."""
    text = transformers.Qwen2Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM(text).eval().bfloat16()
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = transformers.LlavaConfig(
        text_config=text, vision_config=vision, image_token_index=95, tie_word_embeddings=tie
    )
    return transformers.LlavaForConditionalGeneration(config).eval().bfloat16()


@pytest.mark.parametrize("include", [None, ["lm_head"]], ids=["all", "lm_head"])
@pytest.mark.parametrize("arch", ["qwen2", "llava"])
def test_quantize_model_unties_a_tied_lm_head(arch, include):
    """A tied lm_head becomes an FP4Linear of its own (the input embedding keeps the 16-bit
    weight): named in the report and a warning, the configs say untied, so that
    ``model.tie_weights()`` leaves it be; the logits are those of the same weights untied."""
    tied, untied = _tied_lm(arch, tie=True), _tied_lm(arch, tie=False)
    untied.load_state_dict(tied.state_dict() | {"lm_head.weight": tied.lm_head.weight})
    embedding_name = next(n for n, m in tied.named_modules() if m is tied.get_input_embeddings())
    embedding = tied.get_input_embeddings().weight.clone()
    with pytest.warns(UserWarning, match=rf"untied lm_head from {re.escape(embedding_name)}: "):
        report = fp4_ops.quantize_model(tied, include, activations="bf16")
    assert report.untied == {"lm_head": [embedding_name]}
    assert f"untied lm_head from {embedding_name}" in str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not fp4_ops.quantize_model(untied, include, activations="bf16").untied
    for config in {id(m.config): m.config for m in tied.modules() if hasattr(m, "config")}.values():
        for c in (config, config.get_text_config(decoder=True)):
            assert not getattr(c, "tie_word_embeddings", False)
    tied.tie_weights()
    if hasattr(tied, "all_tied_weights_keys"):  # (transformers 5: the map its loaders use)
        tied.tie_weights(recompute_mapping=False)
    assert isinstance(tied.lm_head, fp4_ops.FP4Linear)
    assert torch.equal(tied.get_input_embeddings().weight, embedding)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(tied(ids).logits, untied(ids).logits)


@pytest.mark.parametrize("include", [None, ["*mlp*"], ["lm_head"]], ids=["all", "mlp", "lm_head"])
@pytest.mark.parametrize("arch", ["qwen2", "llava"])
def test_quantized_model_refuses_what_transformers_would_do_half_way(tmp_path, arch, include):
    """transformers' save_pretrained cannot write FP4 layers, nor resize_token_embeddings an
    FP4 lm_head: on a quantized model, and on each transformers model inside it that holds
    FP4 layers (a language or vision tower), each raises ValueError (naming what to do
    instead) before anything is written or resized; inner models without FP4 layers keep their
    methods; with lm_head left 16-bit the resize works. The refusals survive deepcopy and
    pickling, and keep no reference cycle to the model."""
    model = _tied_lm(arch, tie=False)
    fp4_ops.quantize_model(model, include, activations="bf16")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"^save_pretrained: .*fp4_ops\.save_quantized"):
        model.save_pretrained(out)
    assert not out.exists()
    inner = [m for m in model.modules() if m is not model and hasattr(m, "save_pretrained")]
    assert inner  # (the decoder; Llava's towers too)
    for module in inner:
        holds = any(isinstance(m, fp4_ops.FP4Linear) for m in module.modules())
        assert ("save_pretrained" in vars(module)) == holds, type(module).__name__
    embedding = model.get_input_embeddings().weight.detach().clone()
    if isinstance(model.get_output_embeddings(), fp4_ops.FP4Linear):
        for refusing in (model, copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            with pytest.raises(ValueError, match=RESIZE_REFUSED):
                refusing.resize_token_embeddings(100)
            with pytest.raises(ValueError, match=r"^save_pretrained: "):
                refusing.save_pretrained(out)
        assert torch.equal(model.get_input_embeddings().weight, embedding)
    else:
        model.resize_token_embeddings(100, mean_resizing=False)
        assert model.get_input_embeddings().weight.shape[0] == 100
        assert model.get_output_embeddings().weight.shape[0] == 100
    gone = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert gone() is None, "the refusals hold the model in a reference cycle"
    finally:
        gc.enable()


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_a_model_quantize_model_leaves_keeps_its_methods(tmp_path, arch):
    """Nothing replaced (Qwen2: an include that matches nothing; GPT-2: a predicate that takes
    nothing, its Conv1Ds skipped): save_pretrained is transformers' own and works."""
    if arch == "qwen2":
        model = _tied_lm("qwen2", tie=False)
        with pytest.warns(UserWarning, match="matched no nn.Linear"):
            report = fp4_ops.quantize_model(model, ["nothing.*"])
    else:
        config = transformers.GPT2Config(vocab_size=96, n_embd=64, n_layer=1, n_head=4)
        model = transformers.GPT2LMHeadModel(config)
        report = fp4_ops.quantize_model(model, lambda name, module: False)
        assert report.skipped
    assert not report.replaced
    assert "save_pretrained" not in vars(model) and "resize_token_embeddings" not in vars(model)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file()


def test_quantize_model_unties_a_tied_lm_head_beside_other_shared_linears():
    """A second pair of Linears sharing a weight does not hide the tied lm_head: the config
    says untied, and tie_weights leaves every FP4Linear in place."""
    model = _tied_lm("qwen2", tie=True)
    mlp = model.model.layers[0].mlp
    mlp.up_proj.weight = mlp.gate_proj.weight
    with pytest.warns(UserWarning, match="untied"):
        report = fp4_ops.quantize_model(model, activations="bf16")
    assert set(report.untied) == {
        "lm_head",
        "model.layers.0.mlp.gate_proj",
        *["model.layers.0.mlp.up_proj"],
    }
    assert model.config.tie_word_embeddings is False
    model.tie_weights()
    assert isinstance(model.lm_head, fp4_ops.FP4Linear)


def test_quantize_model_unties_nothing_it_keeps():
    """A Linear that shares its weight and stays 16-bit (its parent reads its weight) is not
    untied: not in the report, no warning."""

    class Reader(torch.nn.Module):
        def forward(self, x):
            return x @ self.proj.weight.t()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 64)
            self.lin = torch.nn.Linear(64, 64, bias=False)
            self.reader = Reader()

    net = Net()
    net.lin.weight = net.emb.weight
    net.reader.proj = net.lin
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = fp4_ops.quantize_model(net, activations="bf16")
    assert (
        not report.untied and not report.replaced and set(report.skipped) == {"lin", "reader.proj"}
    )


def test_quantize_model_unties_linears_sharing_a_weight():
    """Two Linears holding one weight each become an FP4Linear of their own (a model without a
    config); one Linear under two names is one module, shared with no other."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (torch.nn.Linear(64, 64) for _ in range(3))
            self.d = self.c

    net = Net()
    net.b.weight = net.a.weight  # (here: a class whose code names it reads it, to quantize_model)
    with pytest.warns(UserWarning, match=r"untied a from b; b from a: "):
        report = fp4_ops.quantize_model(net, activations="bf16")
    assert report.untied == {"a": ["b"], "b": ["a"]}
    assert sorted(report.replaced) == ["a", "b", "c", "d"] and net.c is net.d
    assert torch.equal(net.a.weight.data, net.b.weight.data)


def test_quantize_model_takes_a_parametrized_linear():
    """A Linear whose weight a parametrization computes (weight_norm) quantizes that weight,
    as a plain Linear holding it does; it shares the weight with no other module."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 32))
    torch.nn.utils.parametrizations.weight_norm(net[0])
    plain = torch.nn.Linear(64, 32)
    with torch.no_grad():
        plain.weight.copy_(net[0].weight)
        plain.bias.copy_(net[0].bias)
    report = fp4_ops.quantize_model(net, activations="bf16")
    assert report.replaced == ["0"] and not report.untied
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = fp4_ops.FP4Linear.from_linear(plain, activations="bf16")(x)
    assert torch.equal(net(x), want)


FLAG = True  # (a module-level condition: unknown to quantize_model)


class _Gated(torch.nn.Module):
    """Reads ``proj.weight`` only where ``mode`` selects it."""

    def __init__(self, mode: str, value=False):
        super().__init__()
        self.mode, self.value, self.proj = mode, value, torch.nn.Linear(64, 64)
        self.depth = 1
        self.gate = torch.nn.Parameter(torch.zeros(()))  # (a weight: no configuration)

    def forward(self, x):
        if self.mode == "flag" and self.value:
            return x @ self.proj.weight.t()
        if self.mode == "else":
            if not self.value:
                return self.proj(x)
            else:
                return x @ self.proj.weight.t()
        if self.mode == "depth" and self.depth > 1 and self.value:
            return x @ self.proj.weight.t()
        if self.mode == "training" and self.training:
            return x @ self.proj.weight.t()
        if self.mode == "global" and FLAG and self.value:
            return x @ self.proj.weight.t()
        if self.mode == "global-else":
            y = self.proj(x)
            if FLAG and self.value:
                y = y + 1
            else:
                y = x @ self.proj.weight.t()
            return y
        if self.mode == "test" and self.proj.weight.dtype == x.dtype:
            return self.proj(x)
        if self.mode == "param" and self.gate > 0:
            return x @ self.proj.weight.t()
        if self.mode == "later" and self.fused:  # (set after quantize_model, if ever)
            return x @ self.proj.weight.t()
        if self.mode == "chain":
            if 1 < self.value < 4:
                return self.proj(x)
            else:
                return x @ self.proj.weight.t()
        if self.mode == "and-expr":  # (an and / or as an expression, not a condition)
            return (self.value and x @ self.proj.weight.t()) or self.proj(x)
        return self.proj(x)


@pytest.mark.parametrize(
    "mode, value, reads",
    [
        ("flag", False, False),  # (the read's branch is off as configured)
        ("flag", True, True),
        ("else", False, False),
        ("else", True, True),
        ("depth", True, False),  # (depth 1: the comparison rules it out)
        ("training", False, True),  # (train / eval is a mode, not configuration)
        ("global", True, True),  # (a module global: not known, taken as a read)
        ("global-else", True, True),  # (so is an unknown condition's other branch)
        ("test", False, True),  # (the condition itself reads it)
        ("flag", 0, False),  # (falsy values that are no bool rule it out too)
        ("flag", "", False),
        ("param", False, True),  # (a parameter's value is no configuration)
        ("later", False, True),  # (an attribute the parent does not hold yet)
        ("chain", 8, True),  # (a chained comparison, false as a whole)
        ("and-expr", 0, False),
        ("and-expr", 1, True),
    ],
)
def test_quantize_model_reads_only_the_branches_its_configuration_takes(mode, value, reads):
    """A parent class's ``self.proj.weight`` counts unless its branch is ruled out by the
    parent's own attributes (constants, comparisons, not / and / or): then it quantizes."""
    parent = _Gated(mode, value).eval()
    report = fp4_ops.quantize_model(parent, activations="bf16")
    assert ("proj" in report.skipped) is reads and ("proj" in report.replaced) is not reads


@pytest.mark.parametrize("slow_but_exact", [False, True])
def test_quantize_model_takes_blooms_projections_unless_slow_but_exact(slow_but_exact):
    """Bloom reads its dense projections' weights only under ``pretraining_tp > 1 and
    slow_but_exact``: otherwise they quantize, and the model runs."""
    config = transformers.BloomConfig(
        vocab_size=96, hidden_size=64, n_layer=2, n_head=4, pretraining_tp=2
    )
    config.slow_but_exact = slow_but_exact
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    report = fp4_ops.quantize_model(model, activations="bf16")
    dense = {f"transformer.h.{i}.{n}" for i in range(2) for n in BLOOM_READS}
    assert (dense <= set(report.skipped)) is slow_but_exact
    assert (dense <= set(report.replaced)) is not slow_but_exact
    with torch.no_grad():
        logits = model(torch.tensor([[3, 4, 5, 6]])).logits
    assert bool(torch.isfinite(logits).all())


#: Bloom's Linears whose weights its code reads when slow_but_exact (modeling_bloom.py)
BLOOM_READS = ("self_attention.dense", "mlp.dense_4h_to_h")
