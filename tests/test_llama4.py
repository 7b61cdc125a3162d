# SPDX-License-Identifier: BSD-3-Clause
"""Llama-4's experts in FP4 (CPU, transformers 4.x and 5.x): ``FP4Llama4Experts`` against the
module's own forward on the dequantized weights, its refusals, ``quantize_model`` on a tiny
Llama-4 model, and checkpoints of per-expert Linears (as llm-compressor writes Llama-4) written
here with ``reference.py``'s quantizer, loaded by ``load_quantized`` and held against the same
model on the dequantized weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from expert_checkpoints import quantize_per_expert, set_dequantized, write_per_expert

import fp4_ops
from fp4_ops import moe

transformers = pytest.importorskip("transformers", reason="needs transformers")
pytest.importorskip("safetensors.torch", reason="needs safetensors")

EXPERTS, HIDDEN, WIDTH, LAYERS = 4, 64, 96, 2  # (no square weight: a transpose shows)
# ours and theirs round h, the activation and y to BF16 in different places (2^-9 relative
# each): 2^-5 of a module's output norm holds them, and 2^-4 of the logits through two layers
# and the head; a misread layout (gate / up order, a transpose, an expert's rows) is off by
# order one
MODULE_BOUND = 2.0**-5
LOGITS_BOUND = 2.0**-4
# W4A4 adds two FP4 roundings, of x and of the activation: about 2^-3 relative each with
# NVFP4's E4M3 block scales, up to 2^-2 with MXFP4's powers of two; a misread layout gives
# uncorrelated values, about sqrt(2) relative
W4A4_BOUND = 0.4


def _llama4(top_k: int = 1):
    config = transformers.Llama4TextConfig(
        vocab_size=96,
        hidden_size=HIDDEN,
        intermediate_size=WIDTH,
        intermediate_size_mlp=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=EXPERTS,
        num_experts_per_tok=top_k,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    with torch.no_grad():  # (from_config leaves the experts at zero: give them values)
        for layer in model.model.layers:
            layer.feed_forward.experts.gate_up_proj.normal_(0.0, 0.1)
            layer.feed_forward.experts.down_proj.normal_(0.0, 0.1)
    return model.eval()


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _dequantized_like(module, fp4: fp4_ops.FP4Llama4Experts):
    """A copy of Llama-4's experts ``module`` holding ``fp4``'s dequantized weights."""
    ref = copy.deepcopy(module)
    with torch.no_grad():
        w13 = fp4.expert_weights("w13").dequantize(torch.float32)
        w2 = fp4.expert_weights("w2").dequantize(torch.float32)
        ref.gate_up_proj.copy_(w13.transpose(1, 2))
        ref.down_proj.copy_(w2.transpose(1, 2))
    return ref


def _scaled_tokens(tokens: int, top_k: int, seed: int, hidden: int = HIDDEN) -> torch.Tensor:
    """Rows [E * T, H] as Llama4TextMoe makes them: each token times its sigmoid router score
    for each of its top_k experts, zero for the others; token 1 is zero (no nonzero row),
    token 2 negative throughout (its rows' largest values below the zero rows')."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    x[1] = 0
    x[2] = -x[2].abs()
    logits = torch.randn(tokens, EXPERTS, generator=gen)
    top = logits.topk(top_k, dim=1)
    scores = torch.full_like(logits, float("-inf")).scatter_(1, top.indices, top.values)
    routed = x.repeat(EXPERTS, 1) * torch.sigmoid(scores).t().reshape(-1, 1)
    return routed.bfloat16()


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
@pytest.mark.parametrize("top_k", [1, 2, EXPERTS])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_llama4_experts_compute_the_modules_forward(fmt, top_k, activations):
    """Each row of the output is the module's own on the dequantized weights: the chosen
    experts' rows within BF16's roundings, every other row exactly zero."""
    module = _llama4(top_k).model.layers[0].feed_forward.experts
    fp4 = fp4_ops.FP4Llama4Experts.from_transformers(module, fmt, activations, top_k=top_k)
    routed = _scaled_tokens(tokens=6, top_k=top_k, seed=1)
    with torch.no_grad():
        got = fp4(routed)
        want = _dequantized_like(module, fp4)(routed)
    zero = routed.view(EXPERTS, 6, HIDDEN).abs().amax(-1) == 0
    assert got.shape == want.shape and got.dtype == routed.dtype
    assert bool((got.view(EXPERTS, 6, HIDDEN)[zero] == 0).all())
    assert _rel(got, want) <= (MODULE_BOUND if activations == "bf16" else W4A4_BOUND)


def test_fp4_llama4_experts_run_each_tokens_top_k_rows_only():
    """Rows outside the block's contract (every row of a token nonzero): each token's top_k
    rows of largest magnitude are its experts', every other output row is zero."""
    module = _llama4(top_k=2).model.layers[0].feed_forward.experts
    fp4 = fp4_ops.FP4Llama4Experts.from_transformers(module, top_k=2)
    gen = torch.Generator().manual_seed(2)
    scales = torch.rand(EXPERTS, 5, 1, generator=gen) + 0.1  # (distinct magnitudes per row)
    rows = (torch.randn(1, 5, HIDDEN, generator=gen).sign() * scales).bfloat16()
    with torch.no_grad():
        got = fp4(rows.reshape(EXPERTS * 5, HIDDEN)).view(EXPERTS, 5, HIDDEN)
        want = _dequantized_like(module, fp4)(rows.reshape(EXPERTS * 5, HIDDEN))
    chosen = torch.zeros(EXPERTS, 5, dtype=torch.bool)
    chosen.scatter_(0, scales.squeeze(-1).topk(2, dim=0).indices, True)
    assert bool((got[~chosen] == 0).all())
    want = want.view(EXPERTS, 5, HIDDEN)[chosen]
    assert _rel(got[chosen], want) <= MODULE_BOUND


def test_fp4_llama4_experts_refusals():
    module = _llama4().model.layers[0].feed_forward.experts
    fp4 = fp4_ops.FP4Llama4Experts.from_transformers(module, top_k=1)
    with pytest.raises(ValueError, match=r"hidden_states must be \[E \* T, H\] = \[4 \* T, 64\]"):
        fp4(torch.zeros(6, HIDDEN, dtype=torch.bfloat16))
    for top_k in (0, -1, EXPERTS + 1):  # (either side of [1, E])
        with pytest.raises(ValueError, match=rf"top_k must be in \[1, 4\] \(E\), got {top_k}"):
            fp4_ops.FP4Llama4Experts.from_transformers(module, top_k=top_k)
    with pytest.raises(TypeError, match="top_k must be an int"):
        fp4_ops.FP4Llama4Experts.from_transformers(module, top_k=1.0)
    narrow = copy.deepcopy(module)
    narrow.down_proj = torch.nn.Parameter(narrow.down_proj[:, :, :32].clone())
    with pytest.raises(ValueError, match=r"are not Llama-4's \[E, H, 2I\] and \[E, I, H\]"):
        moe.llama4_experts(narrow)
    gelu = copy.deepcopy(module)
    gelu.act_fn = torch.nn.GELU()
    with pytest.raises(ValueError, match="is not SiLU"):
        moe.llama4_experts(gelu)

    class UpFirst(type(module)):  # (reads the halves the other way round)
        def forward(self, hidden_states):
            x = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
            up, gate = torch.bmm(x, self.gate_up_proj).chunk(2, dim=-1)
            return torch.bmm(up * self.act_fn(gate), self.down_proj).view(-1, self.hidden_size)

    swapped = copy.deepcopy(module)
    swapped.__class__ = UpFirst
    with pytest.raises(ValueError, match="does not compute the experts as gate_up_proj"):
        moe.llama4_experts(swapped)
    with pytest.raises(TypeError, match="top_k must be an int"):
        fp4_ops.FP4Llama4Experts.from_transformers(module, top_k=True)


class _Scaled(transformers.models.llama4.modeling_llama4.Llama4TextExperts):
    """Llama-4's experts with a stray factor on their output."""

    def forward(self, hidden_states):
        return super().forward(hidden_states) * 1.1


class _NaNRows(transformers.models.llama4.modeling_llama4.Llama4TextExperts):
    """Llama-4's experts whose first expert's rows come out NaN."""

    def forward(self, hidden_states):
        y = super().forward(hidden_states)
        return torch.cat([torch.full_like(y[:1], float("nan")), y[1:]])


class _Clamp(torch.nn.Module):
    def forward(self, x):
        return x.clamp(-7.0, 7.0)


@pytest.mark.parametrize("variant", ["scaled", "nan rows", "a child module", "2-D down_proj"])
def test_llama4_experts_refuse_what_they_do_not_compute(variant):
    """A module that is not exactly Llama-4's experts is no stand-in: one whose output differs
    by a factor of 1.1 or holds NaN (probed), one with a submodule the probe may not reach, one
    with weights of the wrong rank; quantize_model refuses it where asked to replace it, and
    skips it otherwise."""
    model = _llama4(top_k=2)
    module = model.model.layers[0].feed_forward.experts
    if variant in ("scaled", "nan rows"):
        module.__class__ = _Scaled if variant == "scaled" else _NaNRows
    elif variant == "a child module":
        module.clamp = _Clamp()
    else:
        module.down_proj = torch.nn.Parameter(module.down_proj[0].clone())
    with pytest.raises(ValueError):
        moe.llama4_experts(module)
    name = "model.layers.0.feed_forward.experts"
    with pytest.raises(ValueError, match=f"^{name}: "):
        fp4_ops.quantize_model(model, ["*.experts"])
    report = fp4_ops.quantize_model(model, activations="bf16")
    assert name in report.skipped and name not in report.replaced
    assert model.get_submodule(name) is module


# (MXFP4 W4A4: its per-call roundings through two layers exceed W4A4_BOUND)
@pytest.mark.parametrize(
    "top_k, fmt, activations",
    [(k, "nvfp4", a) for k in (1, 2) for a in ("bf16", "dynamic")] + [(2, "mxfp4", "bf16")],
)
def test_quantize_model_replaces_llama4_experts(top_k, fmt, activations):
    """Every Llama-4 experts module becomes an FP4Llama4Experts of the format asked for, with
    its block's top_k; the logits are the model's on the dequantized experts; routers stay
    16-bit."""
    model = _llama4(top_k)
    reference_model = copy.deepcopy(model)
    report = fp4_ops.quantize_model(model, ["*.experts"], fmt, activations=activations)
    names = [f"model.layers.{i}.feed_forward.experts" for i in range(LAYERS)]
    assert report.replaced == names and not report.skipped
    for name in names:
        fp4 = model.get_submodule(name)
        assert isinstance(fp4, fp4_ops.FP4Llama4Experts) and fp4.top_k == top_k
        assert fp4.expert_weights("w13").format == fp4.expert_weights("w2").format == fmt
        parent, _, attr = name.rpartition(".")
        old = reference_model.get_submodule(name)
        setattr(reference_model.get_submodule(parent), attr, _dequantized_like(old, fp4))
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(ids).logits, reference_model(ids).logits
    assert _rel(got, want) <= (LOGITS_BOUND if activations == "bf16" else W4A4_BOUND)
    every = fp4_ops.quantize_model(_llama4(top_k), activations="bf16")
    routers = {f"model.layers.{i}.feed_forward.router" for i in range(LAYERS)}
    assert set(every.skipped) == routers and set(names) <= set(every.replaced)


def _without_top_k(model):
    del model.model.layers[0].feed_forward.top_k


def _zero_top_k(model):
    model.model.layers[0].feed_forward.top_k = 0


@pytest.mark.parametrize(
    "defect, why",
    [(_without_top_k, "has no int top_k"), (_zero_top_k, "has top_k 0")],
    ids=["missing", "zero"],
)
def test_quantize_model_names_a_block_without_top_k(defect, why):
    """Skipped with the reason by default, refused where ``include`` chooses it."""

    def broken():
        model = _llama4()
        defect(model)
        return model

    report = fp4_ops.quantize_model(broken(), activations="bf16")
    reason = report.skipped["model.layers.0.feed_forward.experts"]
    assert reason.startswith(f"its block (Llama4TextMoe) {why}")
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.feed_forward\.experts: its block"):
        fp4_ops.quantize_model(broken(), ["*.experts"], activations="bf16")


def test_per_expert_checkpoint_refuses_a_config_without_experts_per_token(tmp_path):
    """A checkpoint whose config routes each token to no expert (``num_experts_per_tok`` 0):
    refused, naming the experts and their block's top_k, before any weight is loaded."""
    model = _llama4()
    parts = quantize_per_expert(_experts(model), "llama4")
    write_per_expert(tmp_path, model, "modelopt", parts, _names())
    config = json.loads((tmp_path / "config.json").read_text())
    text = config.get("text_config", config)
    text["num_experts_per_tok"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"feed_forward\.experts: its block \(\w+\) has top_k 0"):
        fp4_ops.load_quantized(tmp_path)


def _experts(lm) -> list:
    return [layer.feed_forward.experts for layer in lm.model.layers]


def _names(lm: str = "") -> dict:
    """Per-expert Linears under the language model's prefix ``lm``; everything but the
    experts left out of FP4."""
    return {
        "experts": lm + "model.layers.{}.feed_forward.experts",
        "exclude": ["lm_head", "*self_attn*", "*router", "*shared_expert*"],
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*router$", "re:.*shared_expert.*"],
    }


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_per_expert_checkpoint_loads_into_llama4_experts(checkpoint, top_k, tmp_path):
    model = _llama4(top_k)
    parts = quantize_per_expert(_experts(model), "llama4")
    write_per_expert(tmp_path, model, checkpoint, parts, _names())
    ours = fp4_ops.load_quantized(tmp_path)
    want = copy.deepcopy(model)
    set_dequantized(_experts(want), parts, "llama4")
    for i, layer in enumerate(ours.model.layers):
        ex = layer.feed_forward.experts
        assert isinstance(ex, fp4_ops.FP4Llama4Experts) and ex.top_k == top_k, i
        w13 = ex.expert_weights("w13").dequantize(torch.float32).transpose(1, 2)
        assert torch.equal(w13.bfloat16(), want.model.layers[i].feed_forward.experts.gate_up_proj)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, ref = ours(ids).logits, want(ids).logits
    assert _rel(got, ref) <= LOGITS_BOUND, _rel(got, ref)
    out = ours.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 10)


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_quantize_model_llama4_saves_and_loads_back(checkpoint, tmp_path):
    """save_quantized writes Llama-4's FP4 experts as per-expert Linears; load_quantized gives
    the saved model's logits (bit for bit with ModelOpt's decoding global scales; within
    compressed-tensors' reciprocal's fp32 rounding)."""
    model = _llama4()
    fp4_ops.quantize_model(model, activations="bf16")
    fp4_ops.save_quantized(model, tmp_path, format=checkpoint)
    loaded = fp4_ops.load_quantized(tmp_path)
    assert isinstance(loaded.model.layers[1].feed_forward.experts, fp4_ops.FP4Llama4Experts)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, want = loaded(ids).logits, model(ids).logits
    if checkpoint == "modelopt":
        assert torch.equal(got, want)
    else:
        assert _rel(got, want) <= 2.0**-16, _rel(got, want)


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_llama4_block_with_fp4_experts_compiles_fullgraph(activations):
    """Llama4TextMoe (its router, the scaled tokens, FP4Llama4Experts, the shared expert) under
    torch.compile(fullgraph=True): no graph break, the eager block's values."""
    model = _llama4(top_k=2)
    fp4_ops.quantize_model(model, ["*.experts"], activations=activations)
    block = model.model.layers[0].feed_forward
    x = torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(7)).bfloat16()
    with torch.no_grad():
        want = block(x)
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
    assert all(map(torch.equal, got, want))


def _llama4_vision_language():
    """A tiny Llama-4 with its vision tower (Llama4ForConditionalGeneration, as Scout and
    Maverick are published), its experts given values."""
    text = _llama4().config.to_dict()
    vision = transformers.Llama4VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        vision_output_dim=64,
        projector_input_dim=64,
        projector_output_dim=64,
    )
    config = transformers.Llama4Config(text_config=text, vision_config=vision.to_dict())
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    model.language_model.to(torch.bfloat16)  # (the vision tower keeps its complex buffers)
    with torch.no_grad():
        for layer in model.language_model.model.layers:
            layer.feed_forward.experts.gate_up_proj.normal_(0.0, 0.1)
            layer.feed_forward.experts.down_proj.normal_(0.0, 0.1)
    return model


@pytest.mark.parametrize("checkpoint", ["modelopt", "compressed-tensors"])
def test_vision_language_checkpoint_loads_its_text_model(checkpoint, tmp_path):
    """A Llama-4 checkpoint as published (language_model.model.*, the vision tower beside):
    AutoModelForCausalLM builds its text model (transformers 5), which loads the experts as
    FP4Llama4Experts, leaves the vision tower out with a warning, and gives the language
    model's logits on the dequantized experts; transformers 4 cannot build it (refused)."""
    vlm = _llama4_vision_language()
    parts = quantize_per_expert(_experts(vlm.language_model), "llama4")
    write_per_expert(tmp_path, vlm, checkpoint, parts, _names("language_model."))
    if int(transformers.__version__.split(".")[0]) < 5:
        with pytest.raises(ValueError, match="transformers cannot build the model"):
            fp4_ops.load_quantized(tmp_path)
        return
    with pytest.warns(UserWarning, match=r"vision_model\..*: not loaded: AutoModelForCausalLM"):
        ours = fp4_ops.load_quantized(tmp_path)
    assert isinstance(ours.model.layers[0].feed_forward.experts, fp4_ops.FP4Llama4Experts)
    want = vlm.language_model
    set_dequantized(_experts(want), parts, "llama4")
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got, ref = ours(ids).logits, want(ids).logits
    assert _rel(got, ref) <= LOGITS_BOUND, _rel(got, ref)


# ----------------------------------------------------------------------------- GPU (H100 / H200)

needs_hopper = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs an H100 / H200 GPU",
)
GPU_HIDDEN, GPU_WIDTH = 128, 64  # (the Hopper grouped kernels' K: multiples of 64)


def _gpu_sized_experts():
    """Llama-4's experts module (BF16, on the CPU) at sizes the Hopper kernels take."""
    config = transformers.Llama4TextConfig(
        hidden_size=GPU_HIDDEN, intermediate_size=GPU_WIDTH, num_local_experts=EXPERTS
    )
    torch.manual_seed(3)
    module = transformers.models.llama4.modeling_llama4.Llama4TextExperts(config)
    with torch.no_grad():
        module.gate_up_proj.normal_(0.0, 0.1)
        module.down_proj.normal_(0.0, 0.1)
    return module.to(torch.bfloat16).eval()


@needs_hopper
@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
@pytest.mark.parametrize("top_k", [1, EXPERTS])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_llama4_experts_gpu_compute_the_modules_forward(fmt, top_k, activations):
    """On the GPU (its grouped kernels, the gathers around them): each row is the module's own
    on the dequantized weights (computed on the CPU), every row off a token's top_k zero."""
    module = _gpu_sized_experts()
    fp4 = fp4_ops.FP4Llama4Experts.from_transformers(module, fmt, activations, top_k=top_k)
    fp4 = fp4.cuda()
    routed = _scaled_tokens(tokens=7, top_k=top_k, seed=4, hidden=GPU_HIDDEN)
    with torch.no_grad():
        got = fp4(routed.cuda()).cpu()
        want = _dequantized_like(module, fp4.cpu())(routed)
    zero = routed.view(EXPERTS, 7, GPU_HIDDEN).abs().amax(-1) == 0
    assert got.shape == want.shape and got.dtype == routed.dtype
    assert bool((got.view(EXPERTS, 7, GPU_HIDDEN)[zero] == 0).all())
    assert _rel(got, want) <= (MODULE_BOUND if activations == "bf16" else W4A4_BOUND)


@needs_hopper
def test_fp4_llama4_experts_gpu_cuda_graph_replays_new_tokens():
    """Captured once, a graph of the module gives the eager module's values for new scaled
    tokens (new top_k rows): the choice of rows is made on the device, no host sync."""
    fp4 = fp4_ops.FP4Llama4Experts.from_transformers(_gpu_sized_experts(), top_k=2).cuda()
    routed = _scaled_tokens(tokens=5, top_k=2, seed=5, hidden=GPU_HIDDEN).cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        fp4(routed)  # (compile and workspaces before the capture)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fp4(routed)
        for seed in (6, 7, 8):
            routed.copy_(_scaled_tokens(tokens=5, top_k=2, seed=seed, hidden=GPU_HIDDEN))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, fp4(routed))
