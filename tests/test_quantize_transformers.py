# SPDX-License-Identifier: BSD-3-Clause
"""Which Linears of transformers' models quantize_model keeps 16-bit (CPU), under transformers
4.x and 5.x, each against a list written from the models' code:

* MoE routers, as FP4 checkpoints and serving engines keep them: the routers that are nn.Linear
  there (Mixtral's and Qwen-MoE's ``gate`` in 4.x; Qwen2-MoE's ``shared_expert_gate``,
  Hunyuan's ``gate.wg``, AFMoE's ``router.gate``, PhiMoE's ``router`` in 5.x);
* Linears whose weight their parent reads itself (Mamba's mixer passes ``x_proj``, ``dt_proj``
  and ``out_proj``'s weights to its kernels, its LM casts to ``lm_head.weight.dtype``), which
  an FP4Linear holds as an FP4Tensor.

Every other Linear becomes an FP4Linear, and the model runs."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import fp4_ops

transformers = pytest.importorskip("transformers", reason="needs transformers")

#: model type -> its routers' names inside a decoder layer, as either transformers major
#: spells them (the ones that are nn.Linear in the installed version are expected)
ROUTERS = {
    "mixtral": ("block_sparse_moe.gate", "mlp.gate"),
    "qwen2_moe": ("mlp.gate", "mlp.shared_expert_gate"),
    "qwen3_moe": ("mlp.gate",),
    "hunyuan_v1_moe": ("mlp.gate.wg",),
    "afmoe": ("mlp.router.gate",),
    "phimoe": ("block_sparse_moe.gate", "mlp.router"),
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


def test_quantize_model_keeps_linears_mamba_reads():
    config = transformers.MambaConfig(
        vocab_size=96,
        hidden_size=64,
        state_size=8,
        intermediate_size=128,
        time_step_rank=8,
        num_hidden_layers=2,
    )
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(config).eval().bfloat16()
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


def test_load_quantized_dequantizes_linears_mamba_reads(tmp_path):
    """A checkpoint that quantizes Linears whose weights Mamba's code reads (as a writer that
    quantizes every Linear does) loads them as 16-bit Linears holding the dequantized FP4
    weights, with a warning that names them; the other quantized Linears load as FP4Linear,
    and the model gives the logits of the same layers held that way before saving."""
    config = transformers.MambaConfig(
        vocab_size=96,
        hidden_size=64,
        state_size=8,
        intermediate_size=128,
        time_step_rank=8,
        num_hidden_layers=2,
    )
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(config).eval().bfloat16()
    read = [f"backbone.layers.{i}.mixer.{n}" for i in range(2) for n in ("x_proj", "out_proj")]
    fp4 = [f"backbone.layers.{i}.mixer.in_proj" for i in range(2)]
    for name in read + fp4:
        parent, _, attr = name.rpartition(".")
        linear = model.get_submodule(name)
        setattr(
            model.get_submodule(parent),
            attr,
            fp4_ops.FP4Linear.from_linear(linear, activations="bf16"),
        )
    fp4_ops.save_quantized(model, tmp_path)
    with pytest.warns(UserWarning, match="dequantized") as caught:
        back = fp4_ops.load_quantized(tmp_path)
    assert all(name in str(caught[0].message) for name in read)

    for name in read:  # (the reference: the same FP4 weights, dequantized by hand)
        parent, _, attr = name.rpartition(".")
        layer = model.get_submodule(name)
        linear = torch.nn.Linear(layer.in_features, layer.out_features, layer.bias is not None)
        linear = linear.bfloat16().requires_grad_(False)
        linear.weight.copy_(layer.weight.dequantize(torch.bfloat16))
        if layer.bias is not None:
            linear.bias.copy_(layer.bias)
        setattr(model.get_submodule(parent), attr, linear)
        got = back.get_submodule(name)
        assert type(got) is torch.nn.Linear and torch.equal(got.weight, linear.weight), name
    assert all(isinstance(back.get_submodule(name), fp4_ops.FP4Linear) for name in fp4)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():  # (its note on the slow path)
        warnings.simplefilter("ignore")
        assert torch.equal(back(ids).logits, model(ids).logits)
