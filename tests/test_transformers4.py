# SPDX-License-Identifier: BSD-3-Clause
"""What the library does under transformers 4.x (CPU), whose MoE models differ from 5.x's: experts
as a ModuleList of per-expert MLPs (Qwen3-MoE, Mixtral, DeepSeek-V3), which quantize, save and
load as FP4Linears like any Linear; gpt-oss's fused experts with a forward on dense routing
scores, which FP4Experts cannot stand in for: refused with a ValueError that says so, before
anything loads. Under transformers 5 the ``fused_experts`` tests cover the MoE paths instead.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import fp4_ops
import reference

transformers = pytest.importorskip("transformers", reason="needs transformers")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs safetensors")
pytestmark = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) >= 5,
    reason="transformers 4.x's behaviour (CI runs these under 4.57 too: .ci/run)",
)

EXPERTS = 4


def _qwen3_moe() -> torch.nn.Module:
    config = transformers.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


def _mixtral() -> torch.nn.Module:
    config = transformers.MixtralConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


#: kind -> (builder, the experts' path in a layer, their projections' names)
PER_EXPERT = {
    "qwen3-moe": (_qwen3_moe, "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
    # (4.x names Mixtral's modules as its checkpoints do: nothing is respelled)
    "mixtral": (_mixtral, "block_sparse_moe.experts", ("w1", "w3", "w2")),
}


def _gpt_oss() -> torch.nn.Module:
    config = transformers.GptOssConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("kind", list(PER_EXPERT))
def test_per_expert_mlps_quantize_save_and_load_as_fp4linears(kind, tmp_path):
    """Each expert's projections are FP4Linears; the checkpoint loads back the same codes and
    scales (global scales to compressed-tensors' 1 / (1 / g)), and the loaded model computes
    what the BF16 model on reference.py's dequantized weights computes."""
    build, path, projections = PER_EXPERT[kind]
    model, base = build(), build()
    base_weights = {
        n: m.weight.detach().clone()
        for n, m in base.named_modules()
        if isinstance(m, torch.nn.Linear)
    }
    report = fp4_ops.quantize_model(model, [f"*.{path}.*"], activations="bf16")
    names = [
        f"model.layers.{i}.{path}.{e}.{proj}"
        for i in range(2)
        for e in range(EXPERTS)
        for proj in projections
    ]
    assert sorted(report.replaced) == sorted(names) and not report.skipped
    fp4_ops.save_quantized(model, tmp_path)
    loaded = fp4_ops.load_quantized(tmp_path)
    for name in names:
        ours, back = model.get_submodule(name), loaded.get_submodule(name)
        assert isinstance(back, fp4_ops.FP4Linear) and back.activations == "bf16", name
        assert torch.equal(back.weight.data, ours.weight.data), name
        assert torch.equal(back.weight.scale.view(torch.uint8), ours.weight.scale.view(torch.uint8))
        gs = ours.weight.global_scale
        assert torch.equal(back.weight.global_scale, 1.0 / (1.0 / gs)), name
        w = back.weight
        plain = fp4_ops.layout.from_blocked(
            w.scale.reshape(-1), *w.data.shape[:1], w.shape[1] // 16
        )
        dequantized = reference.dequantize_fp4(w.data, plain, 16, w.global_scale)
        with torch.no_grad():
            base.get_submodule(name).weight.copy_(dequantized.to(torch.bfloat16))
    for i in range(2):  # (gate and up of an expert: one GEMM in vLLM, one global scale)
        for e in range(EXPERTS):
            gate, up, down = (f"model.layers.{i}.{path}.{e}.{p}" for p in projections)
            weights = [base_weights[n] for n in (gate, up)]
            shared = max(float(w.abs().amax()) for w in weights) / (448.0 * 6.0)
            for n in (gate, up):
                assert float(model.get_submodule(n).weight_global_scale) == pytest.approx(
                    shared, rel=2**-23
                ), n
            own = float(base_weights[down].abs().amax()) / (448.0 * 6.0)
            assert float(model.get_submodule(down).weight_global_scale) == pytest.approx(own)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(1))
    # (both round to BF16 in the same places but for W4A16's product order: 2^-6 holds it, a
    # wrong expert, nibble or scale is off by order one)
    assert _rel(_logits(loaded, ids), _logits(base, ids)) < 2.0**-6


#: Mixtral's spellings of its experts in other writers' checkpoints: (before, after) parts
RESPELLINGS = {
    # llm-compressor under transformers 5: the block's name kept, the projections' new
    "llm-compressor": ((r"(experts\.\d+\.)w1\b", r"\1gate_proj"),),
    "transformers 5": (
        (r"\.block_sparse_moe\.", ".mlp."),
        (r"(experts\.\d+\.)w1\b", r"\1gate_proj"),
    ),
}


@pytest.mark.parametrize("writer", list(RESPELLINGS))
def test_mixtral_experts_load_under_other_writers_names(writer, tmp_path):
    """A Mixtral checkpoint that spells its experts as transformers 5 names them loads into
    4.x's w1 / w3 / w2 modules: the same model as from the checkpoint in 4.x's names."""
    model = _mixtral()
    fp4_ops.quantize_model(model, ["*.block_sparse_moe.experts.*"], activations="bf16")
    fp4_ops.save_quantized(model, tmp_path / "ours")
    folder = tmp_path / writer
    folder.mkdir()
    rules = RESPELLINGS[writer] + (
        (r"(experts\.\d+\.)w3\b", r"\1up_proj"),
        (r"(experts\.\d+\.)w2\b", r"\1down_proj"),
    )

    def respelled(name: str) -> str:
        for before, after in rules:
            name = re.sub(before, after, name)
        return name

    tensors = safetensors_torch.load_file(tmp_path / "ours" / "model.safetensors")
    renamed = {respelled(k): v for k, v in tensors.items()}
    assert len(renamed) == len(tensors) and renamed.keys() != tensors.keys()
    safetensors_torch.save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    qc = config["quantization_config"]
    qc["ignore"] = [respelled(n) for n in qc["ignore"]]
    (folder / "config.json").write_text(json.dumps(config))
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(2))
    want = _logits(fp4_ops.load_quantized(tmp_path / "ours"), ids)
    assert torch.equal(_logits(fp4_ops.load_quantized(folder), ids), want)


def test_fused_experts_are_refused_with_the_version_that_would_take_them(tmp_path):
    """gpt-oss's experts: quantize_model and load_quantized raise ValueError naming the
    forward transformers 5 has, and the model is not half-converted."""
    model = _gpt_oss()
    with pytest.raises(ValueError, match=r"GptOssExperts: its forward does not take .*4\.\d+"):
        fp4_ops.quantize_model(model, ["*.mlp.experts"])
    assert not any(isinstance(m, fp4_ops.FP4Linear) for m in model.modules())
    # the checkpoint as OpenAI writes it: MXFP4 blocks [E, rows, K/32, 16], E8M0 scale bytes
    tensors = {
        k: v
        for k, v in model.state_dict().items()
        if ".mlp.experts." not in k or k.endswith("_bias")
    }
    experts = model.model.layers[0].mlp.experts
    for proj in ("gate_up_proj", "down_proj"):
        w = getattr(experts, proj).detach().float().transpose(1, 2).contiguous()
        e, rows, k = w.shape
        q = fp4_ops.quantize_experts(w, "mxfp4")
        plain = fp4_ops.layout.from_blocked(q.scale.reshape(e, -1), rows, k // 32)
        prefix = f"model.layers.0.mlp.experts.{proj}"
        tensors[prefix + "_blocks"] = q.data.reshape(e, rows, k // 32, 16).contiguous()
        tensors[prefix + "_scales"] = plain.view(torch.uint8).contiguous()
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"experts: GptOssExperts: its forward does not take"):
        fp4_ops.load_quantized(tmp_path)
