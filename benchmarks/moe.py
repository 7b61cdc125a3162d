# SPDX-License-Identifier: BSD-3-Clause
"""One MoE layer per call, in a CUDA graph: ours (W4A16, W4A4), humming-kernels, BF16 grouped.

Every contestant starts from the same quantized experts; per configuration and token count T.
    python -m benchmarks.moe                          # every configuration, T = 1 ... 4096
    python -m benchmarks.moe --config deepseek-v3 --tokens 1,64 --reps 3
    python -m benchmarks.moe --json results/h200_moe.json

Configurations (``CONFIGS``: experts E, top-k, hidden H, expert width I, activation, format):
    qwen3-30b-a3b     128, 8, 2048,  768, SiLU, NVFP4
    qwen3-235b-a22b   128, 8, 4096, 1536, SiLU, NVFP4
    deepseek-v3       256 routed experts, 8, 7168, 2048, SiLU, NVFP4 (no shared expert)
    gpt-oss-20b        32, 4, 2880, 2880, gpt-oss's clamped SwiGLU ("swigluoai") with biases, MXFP4
    gpt-oss-120b      128, 4, 2880, 2880, the same
    llama-4-scout      16, 1, 5120, 8192, SiLU, NVFP4 (no shared expert; the router weight
                      scales the expert's output, as vLLM does, not its input: the same work)
    llama-4-maverick  128, 1, 5120, 8192, the same
Experts: w13 [E, 2I, H] = randn / sqrt(H) (gate rows first; interleaved with the up rows for
swigluoai, as ``fp4_ops.moe`` reads them), w2 [E, H, I] = randn / sqrt(I), drawn on the device
(seeded) and quantized once, one global scale per expert (``fp4_ops.quantize_experts``; 1.0 for
MXFP4); gpt-oss's biases randn / 10 in BF16. Routing per token count T: router logits randn(T, E)
drawn on the CPU, seeded by T (the same on every GPU); topk_ids the top-k experts of each token,
topk_weights the softmax of their logits; x randn(T, H) in BF16.

Contestants, each a call (x, topk_weights, topk_ids) -> BF16 [T, H] that builds its own routing
on the device (no host sync) and reads the same quantized tensors:
    ours_w4a16    ``fp4_ops.FP4MoE(w13, w2, activation, "bf16", biases)``: BF16 x
    ours_w4a4     the same with ``activations="dynamic"``: x and the activation quantized per call
                  (a contestant that raises is recorded as "not measured" with the reason)
    humming_moe   humming-kernels' indexed (MoE) GEMM (optional: absent, not measured). Each of
                  w13 and w2 is one ``HummingLayer(shape_n=N, shape_k=K, num_experts=E,
                  weight_config, has_bias, torch_dtype=torch.bfloat16)``, loaded with
                  ``load_from_tensors`` (NVFP4: its ModelOpt loader, weight / weight_scale (plain
                  E4M3) / weight_scale_2 (the [E] global scales); MXFP4: its mxfp4 loader; gpt-oss:
                  bias) and ``transform()``ed. The timed call (``HummingMoE``):
                      routing = humming_routing(topk_ids, E, block)   # torch ops, below
                      h = gate_up(x, sorted_ids=..., expert_ids=..., num_tokens_padded=...,
                                  top_k=k, compute_config=HUMMING_COMPUTE, tuning_config=...)
                      a = fp4_ops.moe.apply_activation(h.float(), activation).to(bfloat16)
                      y = down(a, <routing for down's block>, top_k=1, ...)   # [T k, H]
                      out = (y.float().view(T, k, H) * topk_weights[..., None]).sum(1)
                  i.e. ``HummingLayer.forward``'s path to ``humming.ops.humming_gemm`` with
                  gemm_type "indexed": row t k + s reads input row t and writes row t k + s.
                  tuning_config: the one interval [0, hi, config] of
                  ``humming.tune.get_heuristics_config(layer_config=layer.humming_config,
                  gemm_type="indexed")`` with lo < T k <= hi, the kernel humming's launcher picks
                  for T k rows (as humming's benchmarks/bench_humming.py drives it); its
                  block_shape[0] is the routing's block size. ``humming_routing`` lays the pairs
                  out as vLLM's ``moe_align_block_size`` does, in fixed worst-case buffers (no
                  host sync; ``padded_capacity``).
    bf16_grouped  ``torch._grouped_mm`` on the experts dequantized to BF16 beforehand (global
                  scales in): the routing of ``fp4_ops.moe.expert_routing``, x's rows gathered,
                  gate/up grouped GEMM, ``apply_activation`` in float32, down grouped GEMM, the
                  weighted sum in float32 (``grouped_moe``, ``fp4_moe``'s own steps); absent or
                  refused: not measured.
Timing (``fp4_ops.devtools.time_graph_us``): CALLS_PER_GRAPH layer calls (at least one per copy,
below) captured in one CUDA graph (the first call, compiles included, runs before the capture),
replayed ``--reps`` times; the mean per call. Cold weights: each contestant holds
``benchmarks.sm90.l2_copies(b, L2)`` distinct copies of the layer, b its weight bytes touched at
the smallest T measured, and the calls cycle through them, so every call reads the experts it
touches from HBM (together the copies' touched bytes exceed 3x the L2).
Touched bytes (host, from the fixed routing, before any timing): the FP4 codes + block scales of
w13 and w2 of every expert that some token routes to (BF16 for bf16_grouped), and
    % of copy bandwidth = touched bytes / time per call / copy bandwidth,
the copy bandwidth measured in the same run as ``benchmarks.stack.copy_bandwidth`` does (a
COPY_BYTES device-to-device copy run eagerly, timed with events, bytes read + written). Ratios:
humming / ours W4A16 and BF16 grouped / ours W4A16 (speed-ups of ours), ours W4A4 / W4A16.

Correctness, per contestant and T before any timing (``check_output``): the output against a
float64 MoE on the exact experts (``moe_reference``; ours_w4a4's quantizes x and the activation
with reference.py's oracle and mirrors ``fp4_moe``'s roundings), within a first-order tolerance
(``moe_tolerance``) derived in docs/moe_design.md section 7. A contestant that fails gets no
time: the table says "check failed".

Output: a markdown table (per configuration and T: us per layer call, % of copy bandwidth,
speed-ups), the issue's targets for ours W4A16 beside it (at T = 1 ... 64: at least 1.3x humming
and 2.5x BF16 grouped, and 70% of the copy bandwidth at T = 1; at T = 4096 at least 1.0x humming
and 0.9x BF16 grouped), and, with ``--json PATH``, every figure measured with the GPU, versions
and date, rewritten after each configuration. Only measured figures are printed; whatever was
not measured says "not measured" and why.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from types import SimpleNamespace

import torch

import fp4_ops
import reference
from benchmarks import args as cli
from benchmarks import sm90 as bench_sm90
from benchmarks import stack as bench_stack
from benchmarks.stack import (
    copy_bandwidth,
    describe,
    environment,
    note,
    pct_of_copy_bandwidth,
)
from fp4_ops import moe as moe_ops
from fp4_ops.devtools import time_graph_us
from fp4_ops.tensor import FP4Tensor


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """One MoE layer's sizes: experts E, top-k, hidden H, expert width I."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    activation: str  # a key of fp4_ops.moe.ACTIVATIONS
    format: str  # "nvfp4" or "mxfp4"
    bias: bool


CONFIGS = {
    "qwen3-30b-a3b": MoEConfig(128, 8, 2048, 768, "silu", "nvfp4", False),
    "qwen3-235b-a22b": MoEConfig(128, 8, 4096, 1536, "silu", "nvfp4", False),
    "deepseek-v3": MoEConfig(256, 8, 7168, 2048, "silu", "nvfp4", False),
    "gpt-oss-20b": MoEConfig(32, 4, 2880, 2880, "swigluoai", "mxfp4", True),
    "gpt-oss-120b": MoEConfig(128, 4, 2880, 2880, "swigluoai", "mxfp4", True),
    "llama-4-scout": MoEConfig(16, 1, 5120, 8192, "silu", "nvfp4", False),
    "llama-4-maverick": MoEConfig(128, 1, 5120, 8192, "silu", "nvfp4", False),
}
TOKENS_DEFAULT = (1, 4, 16, 64, 256, 4096)
REPS_DEFAULT = 5
CALLS_PER_GRAPH = 10
#: tokens the float64 reference checks (the first ones), ours_w4a4 apart
CHECK_TOKENS = 256
#: experts drawn, quantized or dequantized at a time (a whole layer in float32 would not fit)
EXPERT_CHUNK = 16
WEIGHT_SEED = 0
ROUTER_SEED = 1000
BIAS_SCALE = 0.1
CONTESTANTS = ("ours_w4a16", "ours_w4a4", "humming_moe", "bf16_grouped")
#: roundings to BF16 of (the gate/up GEMM's, the down GEMM's) result (module docstring)
ROUNDINGS = {
    "ours_w4a16": (1, 1),
    "ours_w4a4": (1, 1),
    "humming_moe": (2, 2),
    "bf16_grouped": (3, 3),
}
BF16_U = 2.0**-8
FP32_U = 2.0**-24
#: float32 SiLU / SwiGLU: a few ulps (tests/test_moe.py's bound)
ACT_REL = 2.0**-19
NOT_MEASURED = "not measured"
HUMMING_ABSENT = "humming-kernels: not installed, humming_moe not measured"
HUMMING_COMPUTE = json.dumps(
    {"use_f16_accum": False, "use_m_major_input_scale": False, "gemm_type": "indexed"}
)
#: the issue's targets for ours W4A16: (first T, last T, what, ratio key, minimum)
TARGETS = (
    (1, 64, "speed-up over humming MoE", "humming_vs_ours_w4a16", 1.3),
    (1, 64, "speed-up over BF16 grouped", "bf16_vs_ours_w4a16", 2.5),
    (1, 1, "% of copy bandwidth", "pct_copy_bandwidth", 70.0),
    (4096, 4096, "speed-up over humming MoE", "humming_vs_ours_w4a16", 1.0),
    (4096, 4096, "speed-up over BF16 grouped", "bf16_vs_ours_w4a16", 0.9),
)


# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.moe", __doc__)
    p.add_argument(
        "--tokens",
        default=",".join(map(str, TOKENS_DEFAULT)),
        help="tokens T per layer call, e.g. 1,4,16,64,256,4096",
    )
    p.add_argument("--config", default=",".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--reps", default=str(REPS_DEFAULT), help="CUDA-graph replays timed")
    p.add_argument(
        "--contestants", default=",".join(CONTESTANTS), help=f"of {', '.join(CONTESTANTS)}"
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write every figure here")
    args = p.parse_args(argv)
    args.json = cli.output_path(p, "--json", args.json)
    args.tokens = cli.positive_ints(p, "--tokens", args.tokens, "1,16,4096")
    args.config = cli.names(p, "--config", args.config, list(CONFIGS), ordered=False)
    args.contestants = cli.names(p, "--contestants", args.contestants, CONTESTANTS, True)
    args.reps = cli.positive_int(p, "--reps", args.reps)
    return args


# ----------------------------------------------------------------------------- arithmetic


def expert_bytes(cfg: MoEConfig, contestant: str) -> int:
    """Weight bytes of one expert as a contestant reads them: w13 (2I x H) and w2 (H x I) as FP4
    codes + one scale byte per block, or BF16 for bf16_grouped."""
    weights = 3 * cfg.hidden * cfg.intermediate
    if contestant == "bf16_grouped":
        return 2 * weights
    return weights // 2 + weights // fp4_ops.FORMATS[cfg.format]


def touched_experts(topk_ids) -> list[int]:
    """The experts that some token routes to (host values)."""
    return sorted(set(topk_ids.reshape(-1).tolist()))


def touched_bytes(cfg: MoEConfig, topk_ids, contestant: str) -> int:
    """Weight bytes a layer call reads: those of every expert the routing touches."""
    return len(touched_experts(topk_ids)) * expert_bytes(cfg, contestant)


#: ratios' keys and the peers they compare ours W4A16 with
PEERS = (("humming_vs_ours_w4a16", "humming_moe"), ("bf16_vs_ours_w4a16", "bf16_grouped"))


def ratios(times: dict) -> dict:
    """Speed-ups of ours W4A16 (peer time / ours) and W4A4 / W4A16; None where not measured."""
    return bench_stack.ratios(times, PEERS)


def graph_calls(copies: int) -> int:
    """Calls per CUDA graph: about CALLS_PER_GRAPH, each copy of the layer as often."""
    return copies * math.ceil(CALLS_PER_GRAPH / copies)


def gamma(n: int) -> float:
    """The fp32 bound on a sum of n products, relative to the sum of their magnitudes."""
    return n * FP32_U / (1 - n * FP32_U)


def moe_tolerance(contestant: str, cfg: MoEConfig, parts: dict) -> float:
    """The relative Frobenius tolerance of the module docstring; ``parts``: rho1, kappa_act,
    rho2, kappa_comb of the reference."""
    n1, n2 = ROUNDINGS[contestant]
    e_h = n1 * BF16_U + gamma(cfg.hidden) * parts["rho1"]
    e_a = parts["kappa_act"] * e_h + BF16_U + ACT_REL
    e_y = e_a + n2 * BF16_U + gamma(cfg.intermediate) * parts["rho2"]
    return parts["kappa_comb"] * (e_y + gamma(cfg.top_k)) + BF16_U


# ----------------------------------------------------------------------------- the layer


def make_experts(cfg: MoEConfig, device, seed: int = WEIGHT_SEED) -> dict:
    """The layer's quantized experts (w13, w2: FP4Tensor [E, N, K], global scales [E]), their
    plain block scales [E, N, K / vec] (plain13, plain2) and biases (b13, b2, or None)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i = cfg.experts, cfg.hidden, cfg.intermediate
    w13 = quantized_experts(gen, e, 2 * i, h, cfg.format, device)
    w2 = quantized_experts(gen, e, h, i, cfg.format, device)
    b13 = b2 = None
    if cfg.bias:
        b13 = (torch.randn(e, 2 * i, generator=gen, device=device) * BIAS_SCALE).bfloat16()
        b2 = (torch.randn(e, h, generator=gen, device=device) * BIAS_SCALE).bfloat16()
    return {
        "w13": w13,
        "w2": w2,
        "plain13": plain_scales(w13),
        "plain2": plain_scales(w2),
        "b13": b13,
        "b2": b2,
    }


def quantized_experts(gen, experts: int, n: int, k: int, fmt: str, device) -> FP4Tensor:
    """randn(experts, n, k) / sqrt(k), quantized per expert, EXPERT_CHUNK experts at a time."""
    parts = []
    for first in range(0, experts, EXPERT_CHUNK):
        count = min(EXPERT_CHUNK, experts - first)
        w = torch.randn(count, n, k, generator=gen, device=device).div_(math.sqrt(k))
        parts.append(fp4_ops.quantize_experts(w, fmt))
        del w
    return FP4Tensor.unchecked(
        torch.cat([p.data for p in parts]),
        torch.cat([p.scale for p in parts]),
        torch.cat([p.global_scale for p in parts]),
        fmt,
    )


def plain_scales(w: FP4Tensor) -> torch.Tensor:
    """The block scales of experts w [E, N, K] in the plain row layout, [E, N, K / vec]."""
    e, n, k = w.shape
    return reference.from_blocked(w.scale.reshape(e, -1), n, k // w.sf_vec_size)


def routing_problem(cfg: MoEConfig, tokens: int, device) -> SimpleNamespace:
    """x, topk_weights, topk_ids (int32) of T tokens on ``device``, and the ids on the host:
    seeded router logits and x drawn on the CPU (the same on every device)."""
    gen = torch.Generator().manual_seed(ROUTER_SEED + tokens)
    logits = torch.randn(tokens, cfg.experts, generator=gen)
    top, ids = logits.topk(cfg.top_k, dim=1)
    x = torch.randn(tokens, cfg.hidden, generator=gen).to(torch.bfloat16)
    return SimpleNamespace(
        x=x.to(device),
        topk_weights=torch.softmax(top, dim=1).to(device),
        topk_ids=ids.to(torch.int32).to(device),
        ids_host=ids,
    )


def copy_experts(w: FP4Tensor, index: int) -> FP4Tensor:
    """Copy ``index`` of experts w: w itself first, then clones (distinct memory)."""
    if index == 0:
        return w
    parts = (w.data.clone(), w.scale.clone(), w.global_scale.clone())
    return FP4Tensor.unchecked(*parts, w.format)


def dequantized_experts(w: FP4Tensor) -> torch.Tensor:
    """BF16 [E, N, K]: e2m1 x block scale x global scale, EXPERT_CHUNK experts at a time."""
    e = w.shape[0]
    gs = w.global_scale.float().expand(e)
    out = torch.empty(w.shape, dtype=torch.bfloat16, device=w.device)
    for first in range(0, e, EXPERT_CHUNK):
        end = min(first + EXPERT_CHUNK, e)
        part = FP4Tensor.unchecked(w.data[first:end], w.scale[first:end], gs[first:end], w.format)
        out[first:end] = part.dequantize(torch.bfloat16)
    return out


def combine(pairs: torch.Tensor, topk_weights: torch.Tensor, dtype) -> torch.Tensor:
    """out[t] = sum over slots s of w[t, s] pairs[t k + s], in float32, rounded to ``dtype``."""
    tokens, k = topk_weights.shape
    weighted = pairs.float().view(tokens, k, -1) * topk_weights.float().unsqueeze(-1)
    return weighted.sum(1).to(dtype)


# ----------------------------------------------------------------------------- BF16 grouped


def grouped_moe(x, topk_weights, topk_ids, num_experts, gemm13, gemm2, activation, b13, b2):
    """``fp4_moe``'s steps with 16-bit grouped GEMMs: gemm(rows, offsets) -> BF16 [rows, N], the
    rows sorted by expert, offsets int32 [E + 1] (``fp4_ops.moe.expert_routing``)."""
    k = topk_ids.shape[1]
    order, sorted_ids, offsets = moe_ops.expert_routing(topk_ids, num_experts)
    h = gemm13(x.index_select(0, order // k), offsets).float()
    if b13 is not None:
        h = h + b13.float().index_select(0, sorted_ids)
    act = moe_ops.apply_activation(h, activation).to(x.dtype)
    y = gemm2(act, offsets).float()
    if b2 is not None:
        y = y + b2.float().index_select(0, sorted_ids)
    # (back to (token, slot) order for the weighted sum)
    return combine(y.new_empty(y.shape).index_copy_(0, order, y), topk_weights, x.dtype)


def torch_grouped_gemm(w: torch.Tensor):
    """rows [P, K] x experts w [E, N, K] (BF16) by ``torch._grouped_mm`` (group ends offs)."""
    return lambda rows, offsets: torch._grouped_mm(rows, w.transpose(-2, -1), offs=offsets[1:])


def loop_grouped_gemm(w: torch.Tensor):
    """The same product one expert at a time in float32, rounded to the rows' dtype (the CPU
    stand-in that checks ``grouped_moe``'s steps apart from ``torch._grouped_mm``)."""

    def gemm(rows, offsets):
        out = rows.new_zeros((rows.shape[0], w.shape[1]))
        bounds = offsets.tolist()
        for e in range(w.shape[0]):
            r0, r1 = bounds[e], bounds[e + 1]
            if r1 > r0:
                out[r0:r1] = (rows[r0:r1].float() @ w[e].float().t()).to(rows.dtype)
        return out

    return gemm


class BF16GroupedMoE:
    """The layer on BF16 experts w13 [E, 2I, H], w2 [E, H, I] (``grouped_moe``)."""

    def __init__(self, w13, w2, activation, b13=None, b2=None, gemm=torch_grouped_gemm):
        self.w13, self.w2, self.activation, self.b13, self.b2 = w13, w2, activation, b13, b2
        self.gemm13, self.gemm2 = gemm(w13), gemm(w2)

    def __call__(self, x, topk_weights, topk_ids):
        return grouped_moe(
            x,
            topk_weights,
            topk_ids,
            self.w13.shape[0],
            self.gemm13,
            self.gemm2,
            self.activation,
            self.b13,
            self.b2,
        )


# ----------------------------------------------------------------------------- humming


def load_humming_moe():
    """(humming's MoE entry points: layer_cls = HummingLayer, heuristics =
    humming.tune.get_heuristics_config), or (None, why they are not there)."""
    layer_cls, why = bench_sm90.load_humming()
    if layer_cls is None:
        return None, why
    try:
        from humming.tune import get_heuristics_config
    except ImportError as exc:
        return None, f"{bench_sm90.HUMMING}: no humming.tune.get_heuristics_config ({exc})"
    return SimpleNamespace(layer_cls=layer_cls, heuristics=get_heuristics_config), None


def padded_capacity(pairs: int, num_experts: int, block: int) -> int:
    """Entries of sorted_ids that any routing of ``pairs`` fits: each touched expert (at most
    min(E, pairs)) pads its pairs by less than a block, and the padded total is whole blocks."""
    most = pairs + min(num_experts, pairs) * (block - 1)
    return most // block * block


def humming_routing(topk_ids: torch.Tensor, num_experts: int, block: int):
    """(sorted_ids int32 [capacity], expert_ids int32 [capacity / block], num_tokens_post_padded
    int32 [1]) of vLLM's ``moe_align_block_size``, by torch ops on the device (no host sync):
    each expert's pairs (token t, slot s) -> t k + s in pair order, padded with T k to a
    multiple of ``block``, the experts in order; entries past the padded length hold T k (ids)
    and E - 1 (experts), which the kernel does not read."""
    pairs = topk_ids.numel()
    device = topk_ids.device
    order, sorted_ids, offsets = moe_ops.expert_routing(topk_ids, num_experts)
    offsets = offsets.long()
    padded = (offsets[1:] - offsets[:-1] + block - 1) // block * block
    ends = padded.cumsum(0)
    rank = torch.arange(pairs, device=device) - offsets.index_select(0, sorted_ids)
    slots = (ends - padded).index_select(0, sorted_ids) + rank
    capacity = padded_capacity(pairs, num_experts, block)
    ids = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    ids.index_copy_(0, slots, order.to(torch.int32))
    starts = torch.arange(0, capacity, block, device=device)
    experts = torch.searchsorted(ends, starts, right=True).clamp_(max=num_experts - 1)
    return ids, experts.to(torch.int32), ends[-1:].to(torch.int32)


def humming_plan(intervals, routed: int) -> tuple[int, str]:
    """(block size, tuning_config) of the kernel humming's launcher picks for ``routed`` rows:
    the heuristic interval (lo, hi] that holds them, passed alone as (0, hi] (its launcher
    looks the kernel up for one row first, to learn the GEMM type)."""
    for lo, hi, config in intervals:
        if lo < routed <= hi:
            return int(config["block_shape"][0]), json.dumps([[0, hi, config]])
    raise ValueError(f"humming's heuristics give no kernel for {routed} routed rows")


def humming_experts(humming, w: FP4Tensor, plain: torch.Tensor, bias):
    """A HummingLayer holding experts w [E, N, K] (and their bias [E, N]) for BF16 inputs."""
    e, n, k = w.shape
    tensors = {"weight": w.data.view(torch.uint8)}
    if w.format == "nvfp4":
        config = {"quant_method": "modelopt", "quant_algo": "nvfp4"}
        tensors["weight_scale"] = plain
        tensors["weight_scale_2"] = w.global_scale.float().expand(e).contiguous()
    else:
        config = {"quant_method": "mxfp4"}
        tensors["weight_scale"] = plain.view(torch.uint8)
    if bias is not None:
        tensors["bias"] = bias.to(torch.bfloat16)
    layer = humming.layer_cls(
        shape_n=n,
        shape_k=k,
        weight_config=config,
        num_experts=e,
        has_bias=bias is not None,
        torch_dtype=torch.bfloat16,
    ).cuda()
    layer.load_from_tensors(tensors)
    layer.transform()  # (repacks the weights for its kernels)
    return layer


class HummingMoE:
    """humming-kernels' MoE layer: its indexed GEMM for w13 and for w2, the activation and the
    weighted sum by torch ops (the module docstring's timed call)."""

    def __init__(self, humming, weights: dict, cfg: MoEConfig):
        self.gate_up = humming_experts(humming, weights["w13"], weights["plain13"], weights["b13"])
        self.down = humming_experts(humming, weights["w2"], weights["plain2"], weights["b2"])
        self.heuristics, self.cfg, self.plans = humming.heuristics, cfg, {}

    def plan(self, which: str, routed: int) -> tuple[int, str]:
        if (which, routed) not in self.plans:
            layer = getattr(self, which)
            intervals = self.heuristics(layer_config=layer.humming_config, gemm_type="indexed")
            self.plans[which, routed] = humming_plan(intervals, routed)
        return self.plans[which, routed]

    def __call__(self, x, topk_weights, topk_ids):
        tokens, k = topk_ids.shape
        (block13, tune13), (block2, tune2) = (self.plan(w, tokens * k) for w in ("gate_up", "down"))
        route13 = humming_routing(topk_ids, self.cfg.experts, block13)
        route2 = (
            route13 if block2 == block13 else humming_routing(topk_ids, self.cfg.experts, block2)
        )
        h = self.gemm(self.gate_up, x, route13, k, tune13)
        act = moe_ops.apply_activation(h.float(), self.cfg.activation).to(x.dtype)
        return combine(self.gemm(self.down, act, route2, 1, tune2), topk_weights, x.dtype)

    @staticmethod
    def gemm(layer, inputs, route, top_k: int, tuning: str):
        sorted_ids, expert_ids, padded = route
        return layer(
            inputs,
            sorted_ids=sorted_ids,
            expert_ids=expert_ids,
            num_tokens_padded=padded,
            top_k=top_k,
            compute_config=HUMMING_COMPUTE,
            tuning_config=tuning,
        )


# ----------------------------------------------------------------------------- contestants


def build_contestant(contestant: str, weights: dict, cfg: MoEConfig, copies: int, humming=None):
    """``copies`` layers of one contestant, each a call (x, topk_weights, topk_ids) -> out with
    its own copy of the experts."""
    w13, w2, b13, b2 = (weights[key] for key in ("w13", "w2", "b13", "b2"))
    if contestant in ("ours_w4a16", "ours_w4a4"):
        mode = "bf16" if contestant == "ours_w4a16" else "dynamic"
        return [
            fp4_ops.FP4MoE(copy_experts(w13, i), copy_experts(w2, i), cfg.activation, mode, b13, b2)
            for i in range(copies)
        ]
    if contestant == "humming_moe":
        if humming is None:
            raise ValueError("humming-kernels is not installed")
        return [HummingMoE(humming, weights, cfg) for _ in range(copies)]
    if contestant == "bf16_grouped":
        if not hasattr(torch, "_grouped_mm"):
            raise ValueError(f"torch {torch.__version__} has no torch._grouped_mm")
        d13, d2 = dequantized_experts(w13), dequantized_experts(w2)
        layers = [BF16GroupedMoE(d13, d2, cfg.activation, b13, b2)]
        layers += [
            BF16GroupedMoE(d13.clone(), d2.clone(), cfg.activation, b13, b2)
            for _ in range(copies - 1)
        ]
        return layers
    raise ValueError(f"unknown contestant {contestant!r}")


def cycling(calls):
    """One call that runs ``calls`` in turn (a graph of it reads each copy as often)."""
    turn = itertools.cycle(calls)

    def call():
        with torch.no_grad():
            return next(turn)()

    return call


# ----------------------------------------------------------------------------- correctness


def exact_expert(w: FP4Tensor, plain: torch.Tensor, e: int) -> torch.Tensor:
    """Expert e of w as float64 [N, K]: e2m1 x block scale (exact) x global scale (exact)."""
    values = reference.dequantize_fp4(w.data[e].view(torch.uint8), plain[e], w.sf_vec_size)
    return values.double() * w.global_scale.double().expand(w.shape[0])[e]


def per_expert(w: FP4Tensor, plain, rows, flat_ids):
    """(rows[p] W[e_p]^T, |rows[p]| |W[e_p]|^T) in float64 for every pair p, e_p = flat_ids[p]."""
    n = w.shape[1]
    out = rows.new_zeros((rows.shape[0], n))
    out_abs = rows.new_zeros((rows.shape[0], n))
    for e in torch.unique(flat_ids).tolist():
        pairs = (flat_ids == e).nonzero().squeeze(1)
        weight = exact_expert(w, plain, e)
        part = rows.index_select(0, pairs)
        out.index_copy_(0, pairs, part @ weight.t())
        out_abs.index_copy_(0, pairs, part.abs() @ weight.abs().t())
    return out, out_abs


def quantized_values(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 values of v [rows, K] quantized by reference.py (one dynamic global scale)."""
    if fmt == "nvfp4":
        data, scales, gs = reference.quantize_nvfp4(v)
        return reference.dequantize_fp4(data, scales, 16).double() * gs.double()
    data, scales = reference.quantize_mxfp4(v)
    return reference.dequantize_fp4(data, scales, 32).double()


def activation_sensitivity(h: torch.Tensor, activation: str) -> torch.Tensor:
    """|d act/d gate| |gate| + |d act/d up| |up| of h [P, 2I] (float64): the first-order change of
    the activation when every element of h moves by the same relative amount (the clamped
    SwiGLU's derivatives taken unclamped at the clamped values: an upper bound)."""
    if moe_ops.ACTIVATIONS[activation]:
        gate, up = h[:, 0::2], h[:, 1::2]
        alpha, limit = moe_ops.SWIGLUOAI_ALPHA, moe_ops.SWIGLUOAI_LIMIT
        g = gate.clamp(max=limit)
        s = torch.sigmoid(alpha * g)
        d_gate = (up.clamp(-limit, limit) + 1) * s * (1 + alpha * g * (1 - s))
        d_up = g * s
    else:
        gate, up = h.chunk(2, dim=-1)
        s = torch.sigmoid(gate)
        d_gate = up * s * (1 + gate * (1 - s))
        d_up = gate * s
    return (d_gate * gate).abs() + (d_up * up).abs()


def norm_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a.norm() / b.norm()) if float(b.norm()) > 0 else math.inf


def moe_reference(weights: dict, cfg: MoEConfig, x, topk_weights, topk_ids, quantized=False):
    """The float64 MoE of x [n, H] on the exact experts (module docstring): {"out": [n, H], and
    rho1, kappa_act, rho2, kappa_comb for its tolerance}. ``quantized`` (ours_w4a4): x and the
    activation quantized by the oracle, fp4_moe's roundings before them mirrored."""
    tokens, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    pair_token = torch.arange(tokens * k, device=x.device) // k
    x64 = quantized_values(x, cfg.format) if quantized else x.double()
    g, g_abs = per_expert(weights["w13"], weights["plain13"], x64.index_select(0, pair_token), flat)
    h, h_abs, b13 = g, g_abs, weights["b13"]
    if b13 is not None:
        bias = b13.double().index_select(0, flat)
        h, h_abs = g + bias, g_abs + bias.abs()
    a_exact = moe_ops.apply_activation(h, cfg.activation)
    if quantized:
        hf = g.to(x.dtype).float()
        if b13 is not None:
            hf = hf + b13.float().index_select(0, flat)
        act = moe_ops.apply_activation(hf, cfg.activation).to(x.dtype)
        a = quantized_values(act, cfg.format)
    else:
        a = a_exact
    y, y_abs = per_expert(weights["w2"], weights["plain2"], a, flat)
    if weights["b2"] is not None:
        bias = weights["b2"].double().index_select(0, flat)
        y, y_abs = y + bias, y_abs + bias.abs()
    w = topk_weights.double().reshape(tokens, k, 1)
    out = (y.view(tokens, k, -1) * w).sum(1)
    out_abs = (y.abs().view(tokens, k, -1) * w.abs()).sum(1)
    return {
        "out": out,
        "rho1": norm_ratio(h_abs, h),
        "kappa_act": norm_ratio(activation_sensitivity(h, cfg.activation), a_exact),
        "rho2": norm_ratio(y_abs, y),
        "kappa_comb": norm_ratio(out_abs, out),
    }


def rel_err(y, ref) -> float:
    ref = ref.double()
    return float((y.double() - ref).norm() / ref.norm())


def check_output(contestant: str, cfg: MoEConfig, out: torch.Tensor, ref: dict) -> dict:
    """A contestant's output [T, H] against the reference of its first tokens."""
    n, hidden = ref["out"].shape
    if out.ndim != 2 or out.shape[0] < n or out.shape[1] != hidden:
        raise ValueError(f"the output is {tuple(out.shape)}, not [T, {hidden}]")
    err = rel_err(out[:n], ref["out"])
    tol = moe_tolerance(contestant, cfg, ref)
    parts = {key: ref[key] for key in ("rho1", "kappa_act", "rho2", "kappa_comb")}
    return {"ok": bool(err <= tol), "rel_err": err, "tol": tol, "tokens_checked": n, **parts}


# ----------------------------------------------------------------------------- measuring


def measure_config(name, cfg: MoEConfig, tokens, device, run, notes: list) -> list[dict]:
    """Rows (one per T) of one configuration: every contestant checked, then timed. ``run``:
    reps, copy_bps, l2_bytes, contestants, humming (None: absent), timer(fn, calls, reps) -> us
    per call, progress(text) (one line per step, so that a run cut short shows where)."""
    run.progress(f"{name}: drawing and quantizing {cfg.experts} experts")
    weights = make_experts(cfg, device)
    problems = {t: routing_problem(cfg, t, device) for t in tokens}
    rows = {t: new_row(name, cfg, problems[t].ids_host) for t in tokens}
    refs: dict = {}

    def reference_for(t: int, quantized: bool) -> dict:
        if (t, quantized) not in refs:
            p, n = problems[t], t if quantized else min(t, CHECK_TOKENS)
            run.progress(f"{name} T={t}: float64 reference of {n} tokens")
            args = (p.x[:n], p.topk_weights[:n], p.topk_ids[:n])
            refs[t, quantized] = moe_reference(weights, cfg, *args, quantized=quantized)
        return refs[t, quantized]

    for contestant in CONTESTANTS:
        why = None
        if contestant not in run.contestants:
            why = f"{NOT_MEASURED}: not among --contestants"
        elif contestant == "humming_moe" and run.humming is None:
            why = f"{NOT_MEASURED}: humming-kernels is not installed"
        if why:
            for row in rows.values():
                row["contestants"][contestant] = {"us": None, "status": why}
            continue
        least = min(touched_bytes(cfg, p.ids_host, contestant) for p in problems.values())
        copies = bench_sm90.l2_copies(least, run.l2_bytes)
        run.progress(f"{name} {contestant}: building {copies} copies of the layer")
        try:
            layers = build_contestant(contestant, weights, cfg, copies, run.humming)
        except Exception as err:  # (a peer or a library that refuses these shapes)
            why = f"{NOT_MEASURED}: building it raised {describe(err)}"
            note(notes, f"{name} {contestant}: {why}")
            for row in rows.values():
                row["contestants"][contestant] = {"us": None, "status": why}
            continue
        for t in tokens:
            run.progress(f"{name} {contestant} T={t}: checking, then timing")
            result = measure_one(contestant, cfg, layers, problems[t], run, reference_for)
            rows[t]["contestants"][contestant] = result
        note_statuses(notes, name, contestant, rows)
        del layers
        free(device)
    for row in rows.values():
        finish_row(row, run.copy_bps)
    refs.clear()
    return list(rows.values())


def measure_one(contestant, cfg, layers, problem, run, reference_for) -> dict:
    """Check one contestant at one T on its first copy, then time it cycling through its copies
    (no time where the check fails or a step raises)."""
    result = {"us": None, "status": None, "copies": len(layers)}
    args = (problem.x, problem.topk_weights, problem.topk_ids)
    calls = [lambda layer=layer: layer(*args) for layer in layers]
    try:
        with torch.no_grad():
            out = calls[0]()
        ref = reference_for(problem.x.shape[0], contestant == "ours_w4a4")
        check = result["check"] = check_output(contestant, cfg, out, ref)
        del out
        if not check["ok"]:
            result["status"] = (
                f"check failed, not timed: relative error {check['rel_err']:.3g} > tolerance "
                f"{check['tol']:.3g} (first {check['tokens_checked']} tokens)"
            )
            return result
        result["us"] = run.timer(cycling(calls), graph_calls(len(calls)), run.reps)
        result["status"] = "measured"
    except Exception as err:  # (its first call, its check or its capture raised: not timed)
        result["status"] = f"{NOT_MEASURED}: it raised {describe(err)}"
    return result


def note_statuses(notes: list, name: str, contestant: str, rows: dict) -> None:
    """One note per reason a contestant went untimed, with the T it applies to."""
    by_status: dict[str, list[str]] = {}
    for t, row in rows.items():
        status = row["contestants"][contestant]["status"]
        if status != "measured":
            by_status.setdefault(status, []).append(str(t))
    for status, ts in by_status.items():
        note(notes, f"{name} {contestant} T={','.join(ts)}: {status}")


def new_row(name: str, cfg: MoEConfig, ids_host) -> dict:
    return {
        "config": name,
        "tokens": int(ids_host.shape[0]),
        "touched_experts": len(touched_experts(ids_host)),
        "touched_bytes": {
            "fp4": touched_bytes(cfg, ids_host, "ours_w4a16"),
            "bf16": touched_bytes(cfg, ids_host, "bf16_grouped"),
        },
        "contestants": {},
        "ratios": {},
    }


def finish_row(row: dict, copy_bps: float | None = None) -> None:
    """% of copy bandwidth and the ratios from the row's measured times."""
    times = {}
    for name, r in row["contestants"].items():
        if r.get("us") is None:
            continue
        times[name] = r["us"]
        kind = "bf16" if name == "bf16_grouped" else "fp4"
        if copy_bps and r["us"] > 0:
            r["pct_copy_bandwidth"] = pct_of_copy_bandwidth(
                row["touched_bytes"][kind], r["us"], copy_bps
            )
    row["ratios"] = ratios(times)


def targets(rows: list[dict]) -> list[dict]:
    """Every target of TARGETS that applies to a row; ``met`` None where not measured."""
    out = []
    for row in rows:
        for first, last, what, key, minimum in TARGETS:
            if not first <= row["tokens"] <= last:
                continue
            if key == "pct_copy_bandwidth":
                value = (row["contestants"].get("ours_w4a16") or {}).get(key)
            else:
                value = row["ratios"].get(key)
            out.append(
                {
                    "config": row["config"],
                    "tokens": row["tokens"],
                    "target": what,
                    "value": value,
                    "min": minimum,
                    "met": None if value is None else bool(value >= minimum),
                }
            )
    return out


def free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- output

HEAD = (
    "| configuration | T | ours W4A16 (us) | % of copy bandwidth | humming MoE (us, ours' "
    "speed-up) | BF16 grouped (us, ours' speed-up) | ours W4A4 (us) | W4A4 / W4A16 |"
)


def cell(row: dict, contestant: str, ratio_key: str | None = None) -> str:
    """A contestant's time (and a speed-up), "check failed", or "not measured"."""
    r = row["contestants"].get(contestant)
    if r is None or r.get("us") is None:
        check = (r or {}).get("check")
        return "check failed" if check and not check["ok"] else NOT_MEASURED
    ratio = row["ratios"].get(ratio_key) if ratio_key else None
    text = f"{r['us']:.1f}"
    return text if ratio is None else f"{text} ({ratio:.2f}x)"


def format_row(row: dict) -> str:
    pct = (row["contestants"].get("ours_w4a16") or {}).get("pct_copy_bandwidth")
    w4a4 = row["ratios"].get("w4a4_over_w4a16")
    cells = [
        row["config"],
        str(row["tokens"]),
        cell(row, "ours_w4a16"),
        NOT_MEASURED if pct is None else f"{pct:.0f}%",
        cell(row, "humming_moe", "humming_vs_ours_w4a16"),
        cell(row, "bf16_grouped", "bf16_vs_ours_w4a16"),
        cell(row, "ours_w4a4"),
        NOT_MEASURED if w4a4 is None else f"{w4a4:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def format_targets(found: list[dict]) -> list[str]:
    """The targets' lines: a count, then each with its measured value or "not measured"."""
    missed = sum(t["met"] is False for t in found)
    unmeasured = sum(t["met"] is None for t in found)
    lines = [
        f"targets (ours W4A16): {len(found) - missed - unmeasured} of {len(found)} met, "
        f"{missed} missed, {unmeasured} not measured"
    ]
    for t in found:
        pct = t["target"].startswith("%")
        least = f"{t['min']:.0f}%" if pct else f"{t['min']:.1f}x"
        where = f"  {t['config']} T={t['tokens']}: {t['target']}"
        if t["met"] is None:
            lines.append(f"{where} (target >= {least}): {NOT_MEASURED}")
        else:
            value = f"{t['value']:.0f}%" if pct else f"{t['value']:.2f}x"
            lines.append(f"{where} {value} (target >= {least}): {'met' if t['met'] else 'MISSED'}")
    return lines


def header_lines(env: dict, copy_bps: float | None, l2_bytes: int, args) -> list[str]:
    bandwidth = NOT_MEASURED if copy_bps is None else f"{copy_bps / 1e12:.2f} TB/s"
    return [
        f"{env['gpu']}, {env['date']}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"nvidia-cutlass-dsl {env['nvidia-cutlass-dsl']}, humming-kernels "
        f"{env['humming-kernels'] or 'not installed'}",
        f"one MoE layer per call, about {CALLS_PER_GRAPH} per CUDA graph, {args.reps} replays, "
        f"cold weights (copies over 3x the {l2_bytes / 2**20:.4g} MiB L2); copy bandwidth "
        f"{bandwidth}",
        "",
        HEAD,
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]


def footer_lines(notes: list) -> list[str]:
    return [
        "",
        "us per layer call (routing, both GEMMs, activation, weighted sum); % of copy bandwidth: "
        "FP4 data + block scales of the experts the routing touches / time / copy bandwidth;",
        f"speed-up = peer time / ours W4A16; every time follows a passed check (float64 "
        f"reference, the first {CHECK_TOKENS} tokens at most)",
        *(f"note: {n}" for n in notes),
    ]


def write_json(path: str, env: dict, args, copy_bps, l2_bytes, notes: list, rows: list) -> None:
    settings = {
        "configs": {name: dataclasses.asdict(CONFIGS[name]) for name in args.config},
        "tokens": args.tokens,
        "reps": args.reps,
        "contestants": args.contestants,
        "calls_per_graph": CALLS_PER_GRAPH,
        "check_tokens": CHECK_TOKENS,
        "roundings": ROUNDINGS,
        "l2_bytes": l2_bytes,
        "copy_bytes": bench_stack.COPY_BYTES,
        "weight_seed": WEIGHT_SEED,
        "router_seed": ROUTER_SEED,
    }
    data = {"environment": env, "settings": settings, "copy_bandwidth_Bps": copy_bps}
    data.update(notes=notes, rows=rows, targets=targets(rows))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


# ----------------------------------------------------------------------------- main


def run_device() -> torch.device:
    return torch.device("cuda")


def l2_bytes_of(device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.moe times CUDA graphs: it needs a CUDA GPU", file=sys.stderr)
        return 2
    device = run_device()
    env = environment(device)
    notes: list[str] = []
    humming, why = load_humming_moe()
    if humming is None and "humming_moe" in args.contestants:
        print(HUMMING_ABSENT, flush=True)
        notes.append(f"{HUMMING_ABSENT} ({why})")
    start = time.perf_counter()
    copy_bps = copy_bandwidth(device)
    l2_bytes = l2_bytes_of(device)
    run = SimpleNamespace(reps=args.reps, copy_bps=copy_bps, l2_bytes=l2_bytes, humming=humming)
    run.contestants, run.timer = args.contestants, time_graph_us
    run.progress = lambda text: print(
        f"[{time.perf_counter() - start:5.0f} s] {text}", file=sys.stderr, flush=True
    )
    print("\n".join(header_lines(env, copy_bps, l2_bytes, args)), flush=True)
    rows: list[dict] = []
    for name in args.config:
        config_rows = measure_config(name, CONFIGS[name], args.tokens, device, run, notes)
        for row in config_rows:
            print(format_row(row), flush=True)
        rows += config_rows
        free(device)  # (the configuration's experts went with measure_config)
        if args.json:  # (after each configuration: a run cut short keeps what it measured)
            write_json(args.json, env, args, copy_bps, l2_bytes, notes, rows)
    print("\n".join(footer_lines(notes)))
    print("\n".join(["", *format_targets(targets(rows))]))
    print(f"run: {time.perf_counter() - start:.0f} s")
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
