# SPDX-License-Identifier: BSD-3-Clause
"""quantize_model keeps the routers of transformers' MoE models in 16 bits (CPU), as FP4
checkpoints and serving engines do, under transformers 4.x and 5.x: the routers that are
nn.Linear there (Mixtral's and Qwen-MoE's ``gate`` in 4.x; Qwen2-MoE's ``shared_expert_gate``,
Hunyuan's ``gate.wg``, AFMoE's ``router.gate``, PhiMoE's ``router`` in 5.x) stay the same
modules, every other Linear of the decoder layers becomes an FP4Linear, and the model runs
(Hunyuan's router reads its weight's dtype, which an FP4Linear's weight has not)."""

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
