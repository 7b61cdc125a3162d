# SPDX-License-Identifier: BSD-3-Clause
"""MoE checkpoints of one quantized Linear per expert and projection (as llm-compressor and
ModelOpt export them), written here with ``reference.py``'s quantizer in each format's
conventions, and the same experts dequantized into the model: what the MoE checkpoint tests
load and hold ``load_quantized`` against. Experts modules come in two layouts: "fused"
(gate_up_proj [E, 2I, H], down_proj [E, H, I]: Qwen3-MoE, Mixtral, ...) and "llama4"
([E, H, 2I] and [E, I, H])."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import reference

GS_DIVISOR = 448.0 * 6.0
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _linears(experts, e: int, layout: str) -> tuple[torch.Tensor, ...]:
    """Expert ``e``'s (gate, up, down) as Linear weights [out, in], float32."""
    gate_up, down = experts.gate_up_proj[e].detach().float(), experts.down_proj[e].detach().float()
    if layout == "llama4":
        gate_up, down = gate_up.t(), down.t()
    return (*gate_up.chunk(2), down)


def quantize_per_expert(blocks: list, layout: str, fuse_gate_up: bool = True) -> dict:
    """{(layer, expert, projection): (packed, plain E4M3 scales, decoding global scale)} of each
    layer's experts module in ``blocks``, by reference.quantize_nvfp4; gate and up share their
    expert's global scale when fused (as serving engines run them)."""
    out = {}
    for i, experts in enumerate(blocks):
        for e in range(experts.gate_up_proj.shape[0]):
            gate, up, down = _linears(experts, e, layout)
            shared = torch.maximum(gate.abs().amax(), up.abs().amax()) / GS_DIVISOR
            for proj, w in zip(PROJECTIONS, (gate, up, down), strict=True):
                own = proj == "down_proj" or not fuse_gate_up
                gs = w.abs().amax() / GS_DIVISOR if own else shared
                out[i, e, proj] = reference.quantize_nvfp4(w, gs)
    return out


def write_per_expert(folder: Path, model, checkpoint: str, parts: dict, names: dict, corrupt=None):
    """The experts of ``parts`` as per-expert Linears under ``names["experts"]`` (a format
    string of the layer index) in ``checkpoint``'s names and global-scale convention (ModelOpt:
    weight / weight_scale / weight_scale_2, decoding; compressed-tensors: weight_packed /
    weight_scale / weight_global_scale, its reciprocal), the model's other tensors in BF16;
    ``names["exclude"]`` / ``names["ignore"]``: what each format's config leaves out.
    ``corrupt(tensors)`` may change the tensors before they are written."""
    tensors = {n: t.contiguous() for n, t in model.state_dict().items() if ".experts." not in n}
    for (i, e, proj), (data, scales, gs) in parts.items():
        prefix = f"{names['experts'].format(i)}.{e}.{proj}"
        if checkpoint == "modelopt":
            named = {"weight": data, "weight_scale": scales, "weight_scale_2": gs.reshape(())}
        else:
            encoding = (1.0 / gs).reshape(1)
            named = {"weight_packed": data, "weight_scale": scales, "weight_global_scale": encoding}
        tensors |= {f"{prefix}.{k}": v.clone() for k, v in named.items()}
    if corrupt is not None:
        corrupt(tensors)
    from safetensors.torch import save_file  # (the tests that write checkpoints skip without it)

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = model.config.to_dict()
    if checkpoint == "modelopt":
        quant = {"quant_algo": "W4A16_NVFP4", "group_size": 16, "exclude_modules": names["exclude"]}
        (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": quant}))
    else:
        weights = dict(num_bits=4, type="float", symmetric=True, group_size=16)
        weights |= dict(strategy="tensor_group", dynamic=False, scale_dtype="torch.float8_e4m3fn")
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": names["ignore"],
        }
    (folder / "config.json").write_text(json.dumps(config))


def set_dequantized(blocks: list, parts: dict, layout: str) -> None:
    """Each layer's experts module in ``blocks`` set to the checkpoint's dequantized values."""
    with torch.no_grad():
        for i, experts in enumerate(blocks):
            for e in range(experts.gate_up_proj.shape[0]):
                gate, up, down = (
                    reference.dequantize_fp4(*parts[i, e, p][:2], 16, parts[i, e, p][2])
                    for p in PROJECTIONS
                )
                gate_up = torch.cat((gate, up))
                if layout == "llama4":
                    gate_up, down = gate_up.t(), down.t()
                experts.gate_up_proj[e].copy_(gate_up)
                experts.down_proj[e].copy_(down)
