# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks.moe on the CPU: its arguments and refusals, humming's routing against a plain loop,
the touched bytes, tolerance, ratio and target arithmetic against hand-computed figures, the
float64 reference against a per-pair loop, every contestant (tiny layers, a fake humming that
runs its indexed GEMM from the routing as its kernel reads it) held to its check, the whole
measure path with a fake timer (cold-weight copies, a wrong contestant refused a time, a raising
or absent one not measured), and the table and JSON of a faked run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import reference
from benchmarks import moe as bench_moe
from benchmarks import sm90 as bench_sm90
from benchmarks.moe import MoEConfig

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
TINY = MoEConfig(6, 2, 64, 32, "silu", "nvfp4", False)
TINY_OSS = MoEConfig(5, 2, 64, 32, "swigluoai", "mxfp4", True)
TINY_CONFIGS = {"tiny": TINY, "tiny-oss": TINY_OSS}


# ----------------------------------------------------------------------------- arguments


def test_defaults():
    args = bench_moe.parse_args([])
    assert args.tokens == [1, 4, 16, 64, 256, 4096] and args.reps == 5 and args.json is None
    assert args.config == [
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "llama-4-scout",
        "llama-4-maverick",
    ]
    assert args.contestants == list(bench_moe.CONTESTANTS)
    args = bench_moe.parse_args(["--tokens", "4,1,4", "--config", "deepseek-v3", "--reps", "2"])
    assert args.tokens == [4, 1] and args.config == ["deepseek-v3"] and args.reps == 2
    # a subset keeps the table's order, whatever order it is given in
    args = bench_moe.parse_args(["--contestants", "bf16_grouped,ours_w4a16"])
    assert args.contestants == ["ours_w4a16", "bf16_grouped"]


def test_configurations_are_the_issue_s():
    c = bench_moe.CONFIGS
    assert c["qwen3-30b-a3b"] == MoEConfig(128, 8, 2048, 768, "silu", "nvfp4", False)
    assert c["qwen3-235b-a22b"] == MoEConfig(128, 8, 4096, 1536, "silu", "nvfp4", False)
    assert c["deepseek-v3"] == MoEConfig(256, 8, 7168, 2048, "silu", "nvfp4", False)
    assert c["gpt-oss-20b"] == MoEConfig(32, 4, 2880, 2880, "swigluoai", "mxfp4", True)
    assert c["gpt-oss-120b"] == MoEConfig(128, 4, 2880, 2880, "swigluoai", "mxfp4", True)
    assert c["llama-4-scout"] == MoEConfig(16, 1, 5120, 8192, "silu", "nvfp4", False)
    assert c["llama-4-maverick"] == MoEConfig(128, 1, 5120, 8192, "silu", "nvfp4", False)


@pytest.mark.parametrize(
    "argv",
    [["--tokens", "0"], ["--tokens", "a"], ["--tokens", ""], ["--tokens", "1,,2"]]
    + [["--tokens", "-1"], ["--tokens", "1.5"], ["--config", "qwen3"]]
    + [["--config", "deepseek-v3,nope"], ["--reps", "0"], ["--reps", "1.5"], ["--reps", "-3"]]
    + [["--reps", "two"], ["--contestants", "ours"], ["--contestants", "ours_w4a16,"]],
    ids=" ".join,
)
def test_bad_arguments_exit_2_with_a_reason(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_moe.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert argv[0] in err  # the message names the option


def test_command_line_refusal_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.moe", "--config", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--config: unknown 'nope'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: main would run")
def test_main_without_a_gpu_exits_2(capsys):
    assert bench_moe.main(["--tokens", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------- humming's routing


def _loop_routing(ids, num_experts, block):
    """vLLM's moe_align_block_size written as a loop: each expert's pairs in pair order, padded
    with the pair count to whole blocks; the expert of each block."""
    flat = ids.reshape(-1).tolist()
    sorted_ids, experts = [], []
    for e in range(num_experts):
        mine = [pair for pair, got in enumerate(flat) if got == e]
        blocks = -(-len(mine) // block)
        sorted_ids += mine + [len(flat)] * (blocks * block - len(mine))
        experts += [e] * blocks
    return sorted_ids, experts


def _routing_case(case):
    gen = torch.Generator().manual_seed(3)
    if case == "random":
        return torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(7)]), 8
    if case == "empty-experts":  # (only experts 1 and 6 of 8 get pairs)
        return torch.tensor([1, 6])[torch.randint(0, 2, (9, 2), generator=gen)], 8
    if case == "one-expert-takes-all":
        return torch.full((9, 2), 3), 5
    if case == "one-token":
        return torch.tensor([[4, 0, 7]]), 8
    return torch.randint(0, 4, (40, 4), generator=gen), 4  # "many-blocks-per-expert"


ROUTING_CASES = ["random", "empty-experts", "one-expert-takes-all", "one-token"]
ROUTING_CASES += ["many-blocks-per-expert"]


@pytest.mark.parametrize("block", [1, 4, 16])
@pytest.mark.parametrize("case", ROUTING_CASES)
def test_humming_routing_is_the_loop(case, block):
    ids, num_experts = _routing_case(case)
    sorted_ids, experts, padded = bench_moe.humming_routing(ids.int(), num_experts, block)
    want_ids, want_experts = _loop_routing(ids, num_experts, block)
    assert sorted_ids.dtype == experts.dtype == padded.dtype == torch.int32
    assert padded.shape == (1,) and int(padded[0]) == len(want_ids)
    n = len(want_ids)
    assert sorted_ids[:n].tolist() == want_ids
    assert (sorted_ids[n:] == ids.numel()).all()  # the rest: padding the kernel skips
    assert experts[: n // block].tolist() == want_experts
    capacity = bench_moe.padded_capacity(ids.numel(), num_experts, block)
    assert sorted_ids.shape == (capacity,) and experts.shape == (capacity // block,)
    assert capacity % block == 0 and capacity >= n
    assert int(experts.max()) < num_experts  # (blocks past the end stay valid expert ids)


def test_padded_capacity_is_reached_by_the_worst_routing():
    # every pair its own expert: each pads to a whole block
    ids = torch.arange(6).view(3, 2)
    assert bench_moe.padded_capacity(6, 8, 16) == 96
    _, _, padded = bench_moe.humming_routing(ids.int(), 8, 16)
    assert int(padded[0]) == 96
    # fewer experts than pairs: at most E partial blocks
    assert bench_moe.padded_capacity(40, 4, 16) == 96  # 40 + 4 x 15 = 100: 6 whole blocks
    ids = torch.tensor([0] * 37 + [1, 2, 3]).view(10, 4)  # (1, 1, 1, 37 pairs: 16 + 16 + 16 + 48)
    assert int(bench_moe.humming_routing(ids.int(), 4, 16)[2][0]) == 96
    assert bench_moe.padded_capacity(10, 3, 1) == 10


def test_humming_plan_picks_the_interval_that_holds_the_rows():
    a, b = {"block_shape": [8, 128, 64]}, {"block_shape": [48, 128, 64]}
    intervals = [(0, 8, a), (8, 1 << 30, b)]
    assert bench_moe.humming_plan(intervals, 8) == (8, json.dumps([[0, 8, a]]))
    block, tuning = bench_moe.humming_plan(intervals, 9)
    # (from 0: humming's launcher first looks its kernel up for one row)
    assert block == 48 and json.loads(tuning) == [[0, 1 << 30, b]]
    with pytest.raises(ValueError, match="no kernel for 0 routed rows"):
        bench_moe.humming_plan(intervals, 0)


# ----------------------------------------------------------------------------- arithmetic


def test_touched_bytes_by_hand():
    ids = torch.tensor([[0, 5], [9, 5], [0, 9]])
    assert bench_moe.touched_experts(ids) == [0, 5, 9]
    qwen = bench_moe.CONFIGS["qwen3-30b-a3b"]
    # w13 1536 x 2048: 1572864 codes + 196608 E4M3 scales; w2 2048 x 768: 786432 + 98304
    assert bench_moe.expert_bytes(qwen, "ours_w4a16") == 2654208
    assert bench_moe.touched_bytes(qwen, ids, "ours_w4a16") == 3 * 2654208
    assert bench_moe.touched_bytes(qwen, ids, "humming_moe") == 3 * 2654208
    # BF16: 2 bytes a weight, 3145728 + 1572864 weights
    assert bench_moe.touched_bytes(qwen, ids, "bf16_grouped") == 3 * 9437184
    # MXFP4: one E8M0 scale per 32; w13 5760 x 2880 and w2 2880 x 2880
    oss = bench_moe.CONFIGS["gpt-oss-120b"]
    one = torch.tensor([[7, 7, 7, 7]])
    assert bench_moe.touched_bytes(oss, one, "ours_w4a4") == 8294400 + 518400 + 4147200 + 259200
    deepseek = bench_moe.CONFIGS["deepseek-v3"]
    assert bench_moe.expert_bytes(deepseek, "ours_w4a16") == 22020096 + 2752512


def test_ratios():
    r = bench_moe.ratios(
        {"ours_w4a16": 10.0, "humming_moe": 14.0, "bf16_grouped": 30.0, "ours_w4a4": 12.0}
    )
    assert r["humming_vs_ours_w4a16"] == pytest.approx(1.4)
    assert r["bf16_vs_ours_w4a16"] == pytest.approx(3.0)
    assert r["w4a4_over_w4a16"] == pytest.approx(1.2)
    r = bench_moe.ratios({"ours_w4a16": 10.0, "bf16_grouped": 30.0})
    assert r["humming_vs_ours_w4a16"] is None and r["w4a4_over_w4a16"] is None
    assert all(v is None for v in bench_moe.ratios({"humming_moe": 1.0}).values())


def test_finish_row_percent_of_copy_bandwidth():
    row = {"touched_bytes": {"fp4": 21233664, "bf16": 75497472}, "ratios": {}}
    row["contestants"] = {
        "ours_w4a16": {"us": 8.0},
        "bf16_grouped": {"us": 40.0},
        "humming_moe": {"us": None, "status": "not measured: absent"},
    }
    bench_moe.finish_row(row, 4.0e12)
    # 21233664 bytes in 8 us is 2.65 TB/s: 66.4% of 4 TB/s
    assert row["contestants"]["ours_w4a16"]["pct_copy_bandwidth"] == pytest.approx(66.355, 1e-4)
    assert row["contestants"]["bf16_grouped"]["pct_copy_bandwidth"] == pytest.approx(47.186, 1e-4)
    assert "pct_copy_bandwidth" not in row["contestants"]["humming_moe"]
    assert row["ratios"]["bf16_vs_ours_w4a16"] == 5.0
    assert row["ratios"]["humming_vs_ours_w4a16"] is None


def test_graph_calls_use_every_copy_as_often():
    assert [bench_moe.graph_calls(c) for c in (1, 3, 8, 12)] == [10, 12, 16, 12]


def test_tolerance_formula_by_hand():
    parts = {"rho1": 10.0, "kappa_act": 2.0, "rho2": 5.0, "kappa_comb": 1.5}
    cfg = bench_moe.CONFIGS["qwen3-30b-a3b"]  # H 2048, I 768, top-8
    u, u32 = 2.0**-8, 2.0**-24
    g_h, g_i, g_k = (n * u32 / (1 - n * u32) for n in (2048, 768, 8))
    for contestant, (n1, n2) in (("ours_w4a16", (1, 1)), ("humming_moe", (2, 2))):
        e_h = n1 * u + g_h * 10.0
        e_y = 2.0 * e_h + u + 2.0**-19 + n2 * u + g_i * 5.0
        want = 1.5 * (e_y + g_k) + u
        assert bench_moe.moe_tolerance(contestant, cfg, parts) == pytest.approx(want, rel=1e-12)
    ours = bench_moe.moe_tolerance("ours_w4a16", cfg, parts)
    assert ours == pytest.approx(0.03135, abs=1e-5)
    assert bench_moe.moe_tolerance("bf16_grouped", cfg, parts) > ours
    assert bench_moe.moe_tolerance("ours_w4a4", cfg, parts) == ours


def test_targets_apply_where_the_issue_sets_them():
    def row(tokens, ratios, pct=None):
        ours = {"us": 1.0} if pct is None else {"us": 1.0, "pct_copy_bandwidth": pct}
        return {
            "config": "c",
            "tokens": tokens,
            "ratios": ratios,
            "contestants": {"ours_w4a16": ours},
        }

    rows = [
        row(1, {"humming_vs_ours_w4a16": 1.42, "bf16_vs_ours_w4a16": 2.4}, pct=71.0),
        row(256, {"humming_vs_ours_w4a16": 0.5, "bf16_vs_ours_w4a16": 0.5}),
        row(4096, {"humming_vs_ours_w4a16": None, "bf16_vs_ours_w4a16": 0.95}),
    ]
    found = bench_moe.targets(rows)
    summary = [(t["tokens"], t["target"], t["min"], t["met"]) for t in found]
    assert summary == [
        (1, "speed-up over humming MoE", 1.3, True),
        (1, "speed-up over BF16 grouped", 2.5, False),
        (1, "% of copy bandwidth", 70.0, True),
        (4096, "speed-up over humming MoE", 1.0, None),
        (4096, "speed-up over BF16 grouped", 0.9, True),
    ]
    lines = bench_moe.format_targets(found)
    assert lines[0] == "targets (ours W4A16): 3 of 5 met, 1 missed, 1 not measured"
    assert lines[1] == "  c T=1: speed-up over humming MoE 1.42x (target >= 1.3x): met"
    assert lines[2] == "  c T=1: speed-up over BF16 grouped 2.40x (target >= 2.5x): MISSED"
    assert lines[3] == "  c T=1: % of copy bandwidth 71% (target >= 70%): met"
    assert lines[4] == "  c T=4096: speed-up over humming MoE (target >= 1.0x): not measured"
    assert "None" not in "\n".join(lines)


# ----------------------------------------------------------------------------- the reference


def _pair_loop_moe(weights, cfg, x, tw, ids):
    """The MoE written out per (token, slot) pair in float64, apart from the module's code."""
    vec = 16 if cfg.format == "nvfp4" else 32
    w13, w2 = weights["w13"], weights["w2"]
    e = cfg.experts
    plain13 = reference.from_blocked(
        w13.scale.reshape(e, -1), 2 * cfg.intermediate, cfg.hidden // vec
    )
    plain2 = reference.from_blocked(w2.scale.reshape(e, -1), cfg.hidden, cfg.intermediate // vec)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(ids.shape[0]):
        for s in range(ids.shape[1]):
            ex = int(ids[t, s])
            a13 = reference.dequantize_fp4(w13.data[ex], plain13[ex], vec).double()
            a2 = reference.dequantize_fp4(w2.data[ex], plain2[ex], vec).double()
            h = a13 @ x[t].double() * float(w13.global_scale[ex])
            if weights["b13"] is not None:
                h = h + weights["b13"][ex].double()
            if cfg.activation == "silu":
                gate, up = h[: cfg.intermediate], h[cfg.intermediate :]
                a = gate * torch.sigmoid(gate) * up
            else:
                gate, up = h[0::2].clamp(max=7.0), h[1::2].clamp(-7.0, 7.0)
                a = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            y = a2 @ a * float(w2.global_scale[ex])
            if weights["b2"] is not None:
                y = y + weights["b2"][ex].double()
            out[t] += float(tw[t, s]) * y
    return out


@pytest.mark.parametrize("tokens", [1, 7])
def test_routing_weights_are_each_token_s_softmax_over_its_top_k(tokens):
    """Each token's weights: positive, summing to 1, in the order of its top-k logits (largest
    first), over distinct experts."""
    cfg = next(iter(TINY_CONFIGS.values()))
    p = bench_moe.routing_problem(cfg, tokens, CPU)
    w, ids = p.topk_weights.double(), p.topk_ids
    assert w.shape == ids.shape == (tokens, cfg.top_k) and (w > 0).all()
    assert torch.allclose(w.sum(dim=1), torch.ones(tokens, dtype=torch.float64), atol=1e-6)
    assert (w[:, :-1] >= w[:, 1:]).all()
    assert all(len(set(row.tolist())) == cfg.top_k for row in ids)
    assert torch.equal(ids.long(), p.ids_host)


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_reference_is_the_pair_loop(name):
    cfg = TINY_CONFIGS[name]
    weights = bench_moe.make_experts(cfg, CPU)
    p = bench_moe.routing_problem(cfg, 5, CPU)
    ref = bench_moe.moe_reference(weights, cfg, p.x, p.topk_weights, p.topk_ids)
    want = _pair_loop_moe(weights, cfg, p.x, p.topk_weights, p.topk_ids)
    assert torch.allclose(ref["out"], want, rtol=1e-12, atol=1e-12)
    assert ref["rho1"] > 1 and ref["rho2"] > 1 and ref["kappa_comb"] >= 1
    assert 1 < ref["kappa_act"] < 4  # (about 2: both inputs of the gated product err)


@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_activation_sensitivity_is_the_derivative(activation):
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(6, 16, generator=gen, dtype=torch.float64) * 2
    if activation == "swigluoai":  # (away from the clamps, where the derivative is smooth)
        h = h.clamp(-6.5, 6.5)
    sens = bench_moe.activation_sensitivity(h, activation)
    act = bench_moe.moe_ops.apply_activation
    eps = 1e-7
    gate_cols = list(range(0, 16, 2)) if activation == "swigluoai" else list(range(8))
    up_cols = list(range(1, 16, 2)) if activation == "swigluoai" else list(range(8, 16))
    want = torch.zeros(6, 8, dtype=torch.float64)
    for cols in (gate_cols, up_cols):
        step = torch.zeros_like(h)
        step[:, cols] = eps * h[:, cols]  # (a relative step: d act / d ln v)
        want += ((act(h + step, activation) - act(h - step, activation)) / (2 * eps)).abs()
    assert torch.allclose(sens, want, rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------- contestants


class FakeHummingLayer:
    """Stands in for humming's HummingLayer on the CPU: takes the expert tensors that
    ``humming_experts`` gives it and runs its indexed GEMM as the kernel reads the routing: the
    blocks up to num_tokens_padded, block b against expert expert_ids[b], each id below rows x
    top_k reading input row id // top_k and writing output row id."""

    def __init__(self, *, shape_n, shape_k, weight_config, num_experts, has_bias, torch_dtype):
        assert torch_dtype == torch.bfloat16
        self.shape, self.config, self.experts = (shape_n, shape_k), weight_config, num_experts
        self.has_bias = has_bias

    def cuda(self):
        return self

    def load_from_tensors(self, tensors):
        self.tensors = dict(tensors)

    def transform(self):
        t = self.tensors
        if self.config == {"quant_method": "modelopt", "quant_algo": "nvfp4"}:
            w = reference.dequantize_fp4(t["weight"], t["weight_scale"], 16)
            self.w = w * t["weight_scale_2"].view(-1, 1, 1)
        else:
            assert self.config == {"quant_method": "mxfp4"} and "weight_scale_2" not in t
            scales = t["weight_scale"].view(torch.float8_e8m0fnu)
            self.w = reference.dequantize_fp4(t["weight"], scales, 32)
        assert self.w.shape == (self.experts, *self.shape)
        assert ("bias" in t) == self.has_bias
        self.bias = t.get("bias")
        self.humming_config = ("fake", *self.shape)

    def __call__(self, inputs, *, sorted_ids, expert_ids, num_tokens_padded, top_k, **configs):
        assert json.loads(configs["compute_config"])["gemm_type"] == "indexed"
        ((lo, hi, config),) = json.loads(configs["tuning_config"])
        block, rows = config["block_shape"][0], inputs.shape[0] * top_k
        assert lo < rows <= hi
        out = torch.zeros((rows, self.shape[0]), dtype=torch.bfloat16)
        for b in range(int(num_tokens_padded[0]) // block):
            e = int(expert_ids[b])
            for pair in sorted_ids[b * block : (b + 1) * block].tolist():
                if pair < rows:
                    v = self.w[e] @ inputs[pair // top_k].float()
                    out[pair] = (v if self.bias is None else v + self.bias[e].float()).bfloat16()
        return out


def fake_heuristics(*, layer_config, gemm_type):
    """Two intervals of rows, block sizes that differ between the two GEMMs (shape_k 32: down)."""
    assert gemm_type == "indexed"
    block = 4 if layer_config[2] == 32 else 8
    return [(0, 4, {"block_shape": [block, 64, 64]}), (4, 1 << 30, {"block_shape": [2 * block]})]


FAKE_HUMMING = SimpleNamespace(layer_cls=FakeHummingLayer, heuristics=fake_heuristics)


@pytest.mark.parametrize("contestant", bench_moe.CONTESTANTS)
@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_each_contestant_passes_its_check(name, contestant):
    cfg = TINY_CONFIGS[name]
    weights = bench_moe.make_experts(cfg, CPU)
    (layer,) = bench_moe.build_contestant(contestant, weights, cfg, 1, FAKE_HUMMING)
    for tokens in (1, 7):
        p = bench_moe.routing_problem(cfg, tokens, CPU)
        with torch.no_grad():
            out = layer(p.x, p.topk_weights, p.topk_ids)
        assert out.shape == (tokens, cfg.hidden) and out.dtype == torch.bfloat16
        quantized = contestant == "ours_w4a4"
        args = (p.x, p.topk_weights, p.topk_ids)
        ref = bench_moe.moe_reference(weights, cfg, *args, quantized=quantized)
        check = bench_moe.check_output(contestant, cfg, out, ref)
        assert check["ok"] and check["rel_err"] < check["tol"] / 1.5, check
        if not quantized:  # (a BF16 result of the pair loop: a few BF16 roundings off)
            want = _pair_loop_moe(weights, cfg, *args)
            assert bench_moe.rel_err(out, want) < 8 * 2.0**-8


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_bf16_grouped_steps_match_a_per_expert_loop(name):
    """grouped_moe with torch._grouped_mm and with the float32 per-expert loop: one result up to
    BF16 roundings, both within the check."""
    cfg = TINY_CONFIGS[name]
    weights = bench_moe.make_experts(cfg, CPU)
    d13 = bench_moe.dequantized_experts(weights["w13"])
    d2 = bench_moe.dequantized_experts(weights["w2"])
    assert torch.equal(d13[3], weights["w13"].dequantize(torch.bfloat16)[3])
    p = bench_moe.routing_problem(cfg, 9, CPU)
    args = (p.x, p.topk_weights, p.topk_ids)
    ref = bench_moe.moe_reference(weights, cfg, *args)
    outs = []
    for gemm in (bench_moe.torch_grouped_gemm, bench_moe.loop_grouped_gemm):
        layer = bench_moe.BF16GroupedMoE(
            d13, d2, cfg.activation, weights["b13"], weights["b2"], gemm
        )
        outs.append(layer(*args))
        assert bench_moe.check_output("bf16_grouped", cfg, outs[-1], ref)["ok"]
    assert bench_moe.rel_err(outs[0], outs[1].double()) < 4 * 2.0**-8


def test_copies_hold_distinct_weights():
    weights = bench_moe.make_experts(TINY, CPU)
    ours = bench_moe.build_contestant("ours_w4a16", weights, TINY, 3)
    ptrs = {(m.w13_codes.data_ptr(), m.w13_scale.data_ptr(), m.w2_scale.data_ptr()) for m in ours}
    assert len({p for t in ptrs for p in t}) == 9
    bf16 = bench_moe.build_contestant("bf16_grouped", weights, TINY, 2)
    assert bf16[0].w13.data_ptr() != bf16[1].w13.data_ptr()
    assert torch.equal(bf16[0].w2, bf16[1].w2)


# ----------------------------------------------------------------------------- measuring


def _run(cfg=TINY, tokens=(1, 5), humming=FAKE_HUMMING, l2_bytes=10_000, contestants=None):
    timed = []

    def fake_timer(fn, calls, reps):
        for _ in range(calls):  # every call of the graph runs, as captured
            fn()
        timed.append(calls)
        return 10.0 * len(timed)

    run = SimpleNamespace(reps=3, copy_bps=4e12, l2_bytes=l2_bytes, humming=humming)
    run.contestants = list(contestants or bench_moe.CONTESTANTS)
    run.timer, run.progress = fake_timer, lambda text: None
    notes: list[str] = []
    rows = bench_moe.measure_config("tiny", cfg, list(tokens), CPU, run, notes)
    return rows, notes, timed


def _counting_builds(monkeypatch, wrong=None, raising=None):
    """build_contestant with every layer counting its calls; ``wrong``: a contestant 10% off;
    ``raising``: one whose calls raise (ours W4A4 on CUDA does)."""
    original, counts = bench_moe.build_contestant, {}

    def build(contestant, weights, cfg, copies, humming=None):
        layers = original(contestant, weights, cfg, copies, humming)
        counts[contestant] = [0] * len(layers)

        def wrap(i, layer):
            def call(x, tw, ids):
                counts[contestant][i] += 1
                if contestant == raising:
                    raise ValueError("fp4_moe with FP4 activations (W4A4) on CUDA: no kernel")
                out = layer(x, tw, ids)
                return (out.float() * 1.1).bfloat16() if contestant == wrong else out

            return call

        return [wrap(i, layer) for i, layer in enumerate(layers)]

    monkeypatch.setattr(bench_moe, "build_contestant", build)
    return counts


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_all_contestants_checked_then_timed_on_cold_copies(name, monkeypatch):
    cfg = TINY_CONFIGS[name]
    counts = _counting_builds(monkeypatch)
    rows, notes, timed = _run(cfg)
    assert notes == [] and [r["tokens"] for r in rows] == [1, 5]
    assert len(timed) == 4 * 2  # four contestants, two T
    for contestant in bench_moe.CONTESTANTS:
        least = min(
            r["touched_bytes"]["bf16" if contestant == "bf16_grouped" else "fp4"] for r in rows
        )
        copies = bench_sm90.l2_copies(least, 10_000)
        assert rows[0]["contestants"][contestant]["copies"] == copies
        # per T: one checked call of copy 0, then the graph's calls spread evenly
        per_copy = bench_moe.graph_calls(copies) // copies
        want = [2 * per_copy + 2] + [2 * per_copy] * (copies - 1)
        assert counts[contestant] == want
    assert rows[0]["contestants"]["ours_w4a16"]["copies"] > 1  # (the tiny L2 of this run)
    for row in rows:
        assert row["touched_bytes"]["fp4"] == row["touched_experts"] * bench_moe.expert_bytes(
            cfg, "ours_w4a16"
        )
        for contestant in bench_moe.CONTESTANTS:
            r = row["contestants"][contestant]
            assert r["status"] == "measured" and r["check"]["ok"] and r["us"] > 0
            kind = "bf16" if contestant == "bf16_grouped" else "fp4"
            assert r["pct_copy_bandwidth"] == pytest.approx(
                100 * row["touched_bytes"][kind] / (r["us"] * 1e-6) / 4e12
            )
        ours = row["contestants"]["ours_w4a16"]["us"]
        assert (
            row["ratios"]["bf16_vs_ours_w4a16"] == row["contestants"]["bf16_grouped"]["us"] / ours
        )
        line = bench_moe.format_row(row)
        assert "not measured" not in line and "check failed" not in line


def test_a_wrong_contestant_gets_no_time(monkeypatch):
    counts = _counting_builds(monkeypatch, wrong="bf16_grouped")
    rows, notes, timed = _run(l2_bytes=1)
    assert len(timed) == 3 * 2  # BF16 grouped never timed
    assert counts["bf16_grouped"] == [2]  # its checked calls only
    for row in rows:
        r = row["contestants"]["bf16_grouped"]
        assert not r["check"]["ok"] and r["us"] is None and "pct_copy_bandwidth" not in r
        assert r["check"]["rel_err"] > r["check"]["tol"]
        assert r["status"].startswith("check failed, not timed: relative error")
        assert "| check failed |" in bench_moe.format_row(row)
        assert row["ratios"]["bf16_vs_ours_w4a16"] is None
        assert row["contestants"]["ours_w4a16"]["us"] is not None
    assert [n.split(": relative")[0] for n in notes] == [
        "tiny bf16_grouped T=1: check failed, not timed",
        "tiny bf16_grouped T=5: check failed, not timed",
    ]


def test_a_contestant_that_raises_is_not_measured(monkeypatch):
    _counting_builds(monkeypatch, raising="ours_w4a4")
    rows, notes, timed = _run(l2_bytes=1)
    assert len(timed) == 3 * 2
    for row in rows:
        r = row["contestants"]["ours_w4a4"]
        assert r["us"] is None and "check" not in r
        assert r["status"] == (
            "not measured: it raised ValueError: fp4_moe with FP4 activations (W4A4) on CUDA: "
            "no kernel"
        )
        line = bench_moe.format_row(row)
        assert line.endswith("| not measured | not measured |")
    assert notes == [
        "tiny ours_w4a4 T=1,5: not measured: it raised ValueError: fp4_moe with FP4 activations "
        "(W4A4) on CUDA: no kernel"
    ]


def test_absent_peers_are_not_measured(monkeypatch):
    monkeypatch.delattr(torch, "_grouped_mm")
    rows, notes, timed = _run(
        humming=None, l2_bytes=1, contestants=["ours_w4a16", "humming_moe", "bf16_grouped"]
    )
    assert len(timed) == 1 * 2
    for row in rows:
        c = row["contestants"]
        assert c["humming_moe"] == {
            "us": None,
            "status": "not measured: humming-kernels is not installed",
        }
        assert c["bf16_grouped"]["us"] is None
        assert c["bf16_grouped"]["status"].startswith("not measured: building it raised ValueError")
        assert c["ours_w4a4"]["status"] == "not measured: not among --contestants"
        assert bench_moe.format_row(row).count("| not measured") == 4
    assert len(notes) == 1 and "has no torch._grouped_mm" in notes[0]


# ----------------------------------------------------------------------------- main, faked

FAKE_ENV = {
    "date": "2030-01-02 03:04 UTC",
    "gpu": "NVIDIA H200",
    "capability": "sm_90",
    "driver": "999.1.2",
    "cuda": "13.9",
    "torch": "9.9.9",
    "nvidia-cutlass-dsl": "4.8.1",
    "humming-kernels": None,
}


def test_main_prints_the_table_and_writes_json(monkeypatch, tmp_path, capsys):
    """main on the CPU: tiny configurations, a fake timer, no humming: the table, the targets,
    the notes and the JSON, rewritten after each configuration."""
    timings = iter(range(1000))
    writes = []
    original_write = bench_moe.write_json
    for name, cfg in TINY_CONFIGS.items():
        monkeypatch.setitem(bench_moe.CONFIGS, name, cfg)
    monkeypatch.setattr(bench_moe.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_moe, "run_device", lambda: CPU)
    monkeypatch.setattr(bench_moe, "environment", lambda device: dict(FAKE_ENV))
    monkeypatch.setattr(bench_moe, "copy_bandwidth", lambda device: 4.0e12)
    monkeypatch.setattr(bench_moe, "l2_bytes_of", lambda device: 2**12)
    monkeypatch.setattr(bench_moe, "load_humming_moe", lambda: (None, "absent here"))
    monkeypatch.setattr(
        bench_moe, "time_graph_us", lambda fn, calls, reps: (fn(), 10.0 + next(timings))[1]
    )
    monkeypatch.setattr(
        bench_moe, "write_json", lambda *a: (writes.append(len(a[-1])), original_write(*a))
    )
    out = tmp_path / "r" / "moe.json"
    argv = ["--config", "tiny,tiny-oss", "--tokens", "1,4", "--json", str(out)]
    assert bench_moe.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == bench_moe.HUMMING_ABSENT
    assert bench_moe.HEAD in printed and "copy bandwidth 4.00 TB/s" in printed
    assert "copies over 3x the 0.003906 MiB L2" in printed
    table = [line for line in printed.splitlines() if line.startswith("| tiny")]
    assert len(table) == 4  # two configurations x two T
    assert all(line.count(" | ") == 7 for line in table)
    assert table[0].startswith("| tiny | 1 |") and table[2].startswith("| tiny-oss | 1 |")
    # times in call order: ours T = 1, 4, then W4A4, then BF16 grouped (humming absent)
    assert table[0] == "| tiny | 1 | 10.0 | 0% | not measured | 14.0 (1.40x) | 12.0 | 1.20 |"
    assert writes == [2, 4]  # the JSON after each configuration
    assert "targets (ours W4A16): 0 of 10 met, 6 missed, 4 not measured" in printed
    assert "  tiny T=1: speed-up over humming MoE (target >= 1.3x): not measured" in printed
    data = json.loads(out.read_text())
    assert data["environment"] == FAKE_ENV and data["copy_bandwidth_Bps"] == 4.0e12
    assert data["settings"]["tokens"] == [1, 4] and data["settings"]["l2_bytes"] == 2**12
    assert data["settings"]["configs"]["tiny-oss"]["activation"] == "swigluoai"
    assert data["notes"] == [f"{bench_moe.HUMMING_ABSENT} (absent here)"]
    assert [(r["config"], r["tokens"]) for r in data["rows"]] == [
        ("tiny", 1),
        ("tiny", 4),
        ("tiny-oss", 1),
        ("tiny-oss", 4),
    ]
    assert len(data["targets"]) == 2 * (3 + 2)  # (T = 4 has no copy-bandwidth target)
    for r in data["rows"]:
        c = r["contestants"]
        assert c["humming_moe"]["status"] == "not measured: humming-kernels is not installed"
        assert c["ours_w4a16"]["check"]["ok"] and c["ours_w4a16"]["us"] > 0
        assert f"| {c['ours_w4a16']['us']:.1f} |" in printed
        for name in ("ours_w4a4", "bf16_grouped"):
            assert c[name]["status"] == "measured"


# ----------------------------------------------------------------------------- the profile


def test_profile_arguments_and_refusals():
    from benchmarks import moe_profile

    args = moe_profile.parse_args([])
    assert args.tokens == [1] and args.contestants == ["ours_w4a16"]
    assert args.config == list(bench_moe.CONFIGS)
    for bad in (["--tokens", "0"], ["--config", "llama"], ["--contestants", "cublas"]):
        with pytest.raises(SystemExit) as exit_info:
            moe_profile.parse_args(bad)
        assert exit_info.value.code == 2


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the refusal of a machine without a GPU needs such a machine"
)
def test_profile_without_a_gpu_exits_2():
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.moe_profile"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("contestant", ["ours_w4a16", "ours_w4a4", "humming_moe"])
def test_profile_reports_humming_refusals_and_raises_our_failures(contestant, monkeypatch, capsys):
    def refuses(*_):
        raise RuntimeError("these shapes are refused")

    from benchmarks import moe_profile

    monkeypatch.setattr(moe_profile, "profile_one", refuses)
    args = ("gpt-oss-120b", 4, contestant, None, None, 0)
    if contestant != "humming_moe":
        with pytest.raises(RuntimeError, match="these shapes are refused"):
            moe_profile.profile_or_report(*args)
        return
    assert moe_profile.profile_or_report(*args) is None
    out = capsys.readouterr().out
    assert "## gpt-oss-120b T=4 humming_moe: not profiled: " in out
    assert "these shapes are refused" in out


@pytest.mark.parametrize(
    "kernels, count, means",
    [
        ([("a", 1.0), ("b", 4.0), ("a", 3.0), ("b", 6.0)], 2, [("a", 2.0), ("b", 5.0)]),
        ([("a", 1.0), ("a", 2.0), ("a", 6.0)], 3, [("a", 3.0)]),
        ([("a", 1.0), ("b", 2.0), ("c", 3.0)], 1, [("a", 1.0), ("b", 2.0), ("c", 3.0)]),
    ],
)
def test_profile_means_per_kernel_in_launch_order(kernels, count, means):
    from benchmarks import moe_profile

    assert moe_profile.per_call_means(kernels, count) == means


@pytest.mark.parametrize(
    "kernels, count",
    [([("a", 1.0), ("b", 1.0), ("a", 1.0)], 2), ([("a", 1.0), ("b", 1.0)], 2), ([], 1)],
)
def test_profile_refuses_calls_that_differ(kernels, count):
    from benchmarks import moe_profile

    with pytest.raises(ValueError, match="the calls differ"):
        moe_profile.per_call_means(kernels, count)
