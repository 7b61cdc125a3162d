# SPDX-License-Identifier: BSD-3-Clause
"""FP4Experts in place of transformers' experts modules (CPU): the adapter against the module's
own forward on the dequantized weights (Qwen3-MoE's layout and gpt-oss's), its refusals, and
quantize_model on a tiny Qwen3-MoE model."""

from __future__ import annotations

import copy

import pytest
import torch

import fp4_ops
from fp4_ops import moe

transformers = pytest.importorskip("transformers", reason="the adapter's tests need transformers")
pytestmark = pytest.mark.fused_experts

# ours round h, the activation, y and the output to BF16 (2^-9 relative each), amplified by
# the down projection's sums at most a few times: 2^-5 relative (Frobenius) holds them, a
# misread layout (gate / up order, a transpose, a bias) is off by order one
BF16_BOUND = 2.0**-5


def _qwen3_moe(experts=8, hidden=64, width=32, layers=1):
    config = transformers.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=128,
        moe_intermediate_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=experts,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _gpt_oss(experts=4, hidden=64):
    config = transformers.GptOssConfig(
        vocab_size=96,
        hidden_size=hidden,
        intermediate_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=experts,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    experts_module = model.model.layers[0].mlp.experts
    with torch.no_grad():  # (from_config leaves the biases at zero: give them values)
        for p in (experts_module.gate_up_proj_bias, experts_module.down_proj_bias):
            p.normal_(0.0, 0.1)
    return model


def _experts(kind):
    if kind == "qwen3-moe":
        return _qwen3_moe().model.layers[0].mlp.experts
    return _gpt_oss().model.layers[0].mlp.experts


def _dequantized_like(module, fp4: fp4_ops.FP4Experts):
    """A float32 copy of ``module`` holding the FP4 experts' dequantized weights in its own
    layout (gpt-oss: transposed)."""
    ref = copy.deepcopy(module).float()
    w13 = fp4.expert_weights("w13").dequantize(torch.float32)
    w2 = fp4.expert_weights("w2").dequantize(torch.float32)
    if "gate_up_proj_bias" in dict(ref.named_parameters()):
        w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
    with torch.no_grad():
        ref.gate_up_proj.copy_(w13)
        ref.down_proj.copy_(w2)
    return ref


def _routing(tokens, experts, k=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, k, generator=gen), -1)
    return ids, weights


def _rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("kind", ["qwen3-moe", "gpt-oss"])
def test_fp4experts_computes_the_module_on_its_dequantized_weights(kind, fmt):
    module = _experts(kind)
    e, h = module.gate_up_proj.shape[0], module.down_proj.shape[1 if kind == "qwen3-moe" else 2]
    fp4 = fp4_ops.FP4Experts.from_transformers(module, fmt, "bf16")
    # (W4A16 is the default, as for FP4MoE)
    assert fp4_ops.FP4Experts.from_transformers(module, fmt).activations == "bf16"
    ref = _dequantized_like(module, fp4)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, h, generator=gen).bfloat16()
    ids, weights = _routing(6, e)
    want = ref(x.float(), ids, weights)
    got = fp4(x, ids, weights)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert _rel(got, want) <= BF16_BOUND, (kind, fmt, _rel(got, want))
    # W4A4: the same experts, the activations quantized per call (within FP4's error of W4A16)
    w4a4 = fp4_ops.FP4Experts.from_transformers(module, fmt, "dynamic")
    assert 0.0 < _rel(w4a4(x, ids, weights), got) < 0.5


def _routed(experts, glu, hidden_states, top_k_index, top_k_weights):
    """A transformers experts forward, token by token: ``glu`` of each chosen expert's
    gate_up_proj product, through its down_proj, weighted and summed."""
    out = torch.zeros_like(hidden_states)
    for t in range(hidden_states.shape[0]):
        for slot, e in enumerate(top_k_index[t].tolist()):
            y = glu(hidden_states[t] @ experts.gate_up_proj[e].t()) @ experts.down_proj[e].t()
            out[t] += top_k_weights[t, slot] * y
    return out


@pytest.mark.parametrize(
    "dtype, limit",
    [(torch.bfloat16, 10.0), (torch.bfloat16, 40.0), (torch.bfloat16, 150.0)]
    + [(torch.float16, 10.0), (torch.float16, 40.0), (torch.float32, 150.0)],
)
def test_transformers_experts_refuses_a_clamp_in_the_forward(dtype, limit):
    """DeepSeek-V4's experts (SiLU act_fn; gate and up clamped at ``swiglu_limit`` in the
    forward, a limit its config may set) are refused whatever the limit up to the probe's
    reach for the dtype and whatever the weights' scale: FP4Experts would drop the clamp."""
    module = _experts("qwen3-moe")

    class Clamped(type(module)):
        def forward(self, hidden_states, top_k_index, top_k_weights):
            def glu(gate_up):
                gate, up = gate_up.chunk(2)
                return self.act_fn(gate.clamp(max=limit)) * up.clamp(-limit, limit)

            return _routed(self, glu, hidden_states, top_k_index, top_k_weights)

    clamped = copy.deepcopy(module).to(dtype)
    clamped.__class__ = Clamped
    with torch.no_grad():  # (a trained model's scale: unit inputs never reach the clamp)
        for p in clamped.parameters():
            p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="does not compute the experts"):
        moe.transformers_experts(clamped)


@pytest.mark.parametrize("kind", ["hook", "pre-hook", "instance forward"])
def test_quantize_model_skips_experts_whose_forward_is_wrapped(kind):
    """An experts module carrying forward hooks or an instance forward is skipped with its
    reason (refused where ``include`` chooses it), before any check runs its forward: the
    hooks see no probe tokens, and the module is kept as it was."""
    calls = []

    def wrap(model):
        experts = model.model.layers[0].mlp.experts
        if kind == "hook":
            experts.register_forward_hook(lambda *args: calls.append(kind))
        elif kind == "pre-hook":
            experts.register_forward_pre_hook(lambda *args: calls.append(kind))
        else:
            plain = experts.forward
            experts.forward = lambda *args: calls.append(kind) or plain(*args)
        return model, experts

    model, experts = wrap(_qwen3_moe(layers=2))
    report = fp4_ops.quantize_model(model, activations="bf16")
    assert model.model.layers[0].mlp.experts is experts and calls == []
    assert "FP4Experts would drop" in report.skipped["model.layers.0.mlp.experts"]
    assert isinstance(model.model.layers[1].mlp.experts, fp4_ops.FP4Experts)
    model, experts = wrap(_qwen3_moe(layers=2))
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.mlp\.experts: .*would drop"):
        fp4_ops.quantize_model(model, include=["*.experts"], activations="bf16")
    assert model.model.layers[0].mlp.experts is experts and calls == []


def test_transformers_experts_refuses_what_it_cannot_stand_in_for():
    module = _experts("qwen3-moe")
    gelu = copy.deepcopy(module)
    gelu.act_fn = torch.nn.GELU()
    with pytest.raises(ValueError, match="is not SiLU"):
        moe.transformers_experts(gelu)

    class UpFirst(type(module)):
        """Up rows first: the same parameters, another layout."""

        def forward(self, hidden_states, top_k_index, top_k_weights):
            def glu(gate_up):
                up, gate = gate_up.chunk(2)
                return self.act_fn(gate) * up

            return _routed(self, glu, hidden_states, top_k_index, top_k_weights)

    swapped = copy.deepcopy(module)
    swapped.__class__ = UpFirst
    with pytest.raises(ValueError, match="does not compute the experts"):
        moe.transformers_experts(swapped)

    class DenseScores(type(module)):
        """Transformers 4.x's forward: routing scores over every expert, [T, E]."""

        def forward(self, hidden_states, router_indices, routing_weights):
            top_k = routing_weights.gather(1, router_indices)
            return _routed(self, self._glu, hidden_states, router_indices, top_k)

        def _glu(self, gate_up):
            gate, up = gate_up.chunk(2)
            return self.act_fn(gate) * up

    dense = copy.deepcopy(module)
    dense.__class__ = DenseScores
    with pytest.raises(ValueError, match=r"DenseScores: its forward does not take .* top-k"):
        moe.transformers_experts(dense)
    extra = copy.deepcopy(module)
    extra.register_parameter("gate_bias", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ValueError, match="beyond the experts'"):
        moe.transformers_experts(extra)
    oss = _experts("gpt-oss")
    oss.limit = 10.0
    with pytest.raises(ValueError, match=r"\(alpha, limit\) = \(1.702, 10.0\)"):
        moe.transformers_experts(oss)
    assert not moe.is_experts_module(torch.nn.Linear(4, 4))


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_quantize_model_replaces_transformers_experts(activations):
    model = _qwen3_moe(layers=2).to(torch.bfloat16)
    reference = copy.deepcopy(model)
    report = fp4_ops.quantize_model(model, ["*.mlp.experts"], activations=activations)
    names = [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert report.replaced == names and not report.skipped
    for i, name in enumerate(names):
        fp4 = model.get_submodule(name)
        assert isinstance(fp4, fp4_ops.FP4Experts) and fp4.activations == activations
        with torch.no_grad():
            ref = _dequantized_like(reference.get_submodule(name), fp4).to(torch.bfloat16)
        reference.model.layers[i].mlp.experts = ref
    ids = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    # (W4A16: both models differ in their roundings only; W4A4 adds FP4's activation error)
    assert _rel(got, want) <= (BF16_BOUND if activations == "bf16" else 0.25)
    gelu = _qwen3_moe()
    gelu.model.layers[0].mlp.experts.act_fn = torch.nn.GELU()
    report = fp4_ops.quantize_model(gelu, activations="bf16")
    assert "is not SiLU" in report.skipped["model.layers.0.mlp.experts"]
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts: .*is not SiLU"):
        fp4_ops.quantize_model(gelu, ["*.experts"], activations="bf16")


@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_moe_block_with_fp4experts_compiles_fullgraph(activations):
    """transformers' sparse MoE block (its router, then FP4Experts) under
    torch.compile(fullgraph=True): no graph break, the eager block's values."""
    model = _qwen3_moe(layers=1).to(torch.bfloat16)
    fp4_ops.quantize_model(model, ["*.mlp.experts"], activations=activations)
    block = model.model.layers[0].mlp
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    with torch.no_grad():
        want = block(x)
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, want)


def other_moe_config(arch: str):
    common = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_experts_per_tok=2)
    if arch == "mixtral":
        return transformers.MixtralConfig(
            intermediate_size=64,
            num_hidden_layers=1,
            num_key_value_heads=2,
            num_local_experts=4,
            **common,
        )
    if arch == "qwen2-moe":
        return transformers.Qwen2MoeConfig(
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_hidden_layers=1,
            num_key_value_heads=2,
            num_experts=4,
            **common,
        )
    return transformers.DeepseekV3Config(  # (layer 0 dense, layer 1 MoE)
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_group=1,
        topk_group=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        **common,
    )


@pytest.mark.parametrize("arch", ["mixtral", "qwen2-moe", "deepseek-v3"])
def test_quantize_model_takes_other_architectures_experts(arch):
    """Mixtral, Qwen2-MoE (beside its shared expert) and DeepSeek-V3 (beside its dense layer)
    hold their experts alike: each experts module becomes FP4Experts, and the model computes
    what it computes on the dequantized weights, up to BF16 roundings."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(other_moe_config(arch))
    model = model.to(torch.bfloat16).eval()
    reference = copy.deepcopy(model)
    report = fp4_ops.quantize_model(model, ["*.mlp.experts"], activations="bf16")
    assert report.replaced and not report.skipped
    for name in report.replaced:
        fp4 = model.get_submodule(name)
        ref = _dequantized_like(reference.get_submodule(name), fp4).to(torch.bfloat16)
        parent, _, attr = name.rpartition(".")
        setattr(reference.get_submodule(parent), attr, ref)
    ids = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    assert _rel(got, want) <= BF16_BOUND, _rel(got, want)


def _same_bits(a, b) -> bool:
    """State-dict values alike, tensors bit for bit (FP8 ones as bytes), others by ==."""
    if isinstance(a, torch.Tensor):
        if a.element_size() == 1:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_bits(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("kind", ["qwen3-moe", "gpt-oss"])
def test_quantize_model_ignores_torch_default_dtype(kind, set_default_dtype):
    """torch's default dtype reaches none of quantize_model's probes of an experts module: under
    a bfloat16 default it holds the same FP4 experts, bit for bit, as under float32."""
    model = (_qwen3_moe() if kind == "qwen3-moe" else _gpt_oss()).to(torch.bfloat16)
    states = []
    for default in (torch.float32, torch.bfloat16):
        quantized = copy.deepcopy(model)
        set_default_dtype(default)
        report = fp4_ops.quantize_model(quantized, ["*.mlp.experts"], activations="bf16")
        assert report.replaced == ["model.layers.0.mlp.experts"]
        states.append(quantized.state_dict())
    assert states[0].keys() == states[1].keys()
    for key, value in states[0].items():
        assert _same_bits(value, states[1][key]), key
