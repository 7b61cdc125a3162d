# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks.stack on the CPU: its arguments and refusals, the stacks' shapes, the per-layer,
bandwidth and ratio arithmetic against hand-computed figures, every contestant's stack (small
shapes, the same code path as on the GPU, no graph) against a float64 reference, a wrong
contestant refused a time, and the table and JSON of a faked run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reference
from benchmarks import sm90 as bench_sm90
from benchmarks import stack as bench_stack

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
SMALL = [(128, 64), (64, 128), (128, 64)]  # three layers, each K the N before it


# ----------------------------------------------------------------------------- arguments


def test_defaults():
    args = bench_stack.parse_args([])
    assert args.m == [1, 16, 64, 128, 4096] and args.stack == ["8192x8192", "llama70b_mlp"]
    assert args.layers == 8 and args.reps == 10 and args.json is None
    args = bench_stack.parse_args(["--m", "2,3", "--stack", "llama70b_mlp", "--layers", "4"])
    assert args.m == [2, 3] and args.stack == ["llama70b_mlp"] and args.layers == 4
    assert args.contestants == list(bench_stack.CONTESTANTS)
    # a subset keeps the table's order, whatever order it is given in
    args = bench_stack.parse_args(["--contestants", "cublas_bf16,ours_w4a16"])
    assert args.contestants == ["ours_w4a16", "cublas_bf16"]


def test_stack_shapes_are_the_issue_s_patterns():
    assert bench_stack.stack_shapes("8192x8192", 8) == [(8192, 8192)] * 8
    llama = bench_stack.stack_shapes("llama70b_mlp", 8)
    assert llama == [(28672, 8192), (8192, 28672)] * 4
    for name in bench_stack.STACKS:
        shapes = bench_stack.stack_shapes(name, 5)
        assert all(k == n_before for (_, k), (n_before, _) in zip(shapes[1:], shapes, strict=False))


@pytest.mark.parametrize(
    "argv",
    [["--m", "0"], ["--m", "a"], ["--m", ""], ["--m", "1,,2"], ["--m", "-1"]]
    + [["--stack", "8192"], ["--stack", "8192x8192,llama"], ["--layers", "0"]]
    + [["--layers", "two"], ["--reps", "0"], ["--reps", "1.5"], ["--reps", "-3"]]
    + [["--contestants", "ours"], ["--contestants", "ours_w4a16,"]],
    ids=" ".join,
)
def test_bad_arguments_exit_2_with_a_reason(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_stack.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert argv[0] in err  # the message names the option


def test_command_line_refusal_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.stack", "--stack", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--stack: unknown 'nope'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: main would run")
def test_main_without_a_gpu_exits_2(capsys):
    assert bench_stack.main(["--m", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------- arithmetic


def test_per_layer_time():
    assert bench_stack.per_layer_us(1000.0, 40.0, 8) == 120.0
    assert bench_stack.per_layer_us(171.0, 39.0, 8) == 16.5


def test_weight_bytes_per_layer():
    square = bench_stack.stack_shapes("8192x8192", 8)
    # 8192 x 8192 FP4: 32 MiB codes + 4 MiB E4M3 scales; BF16: 128 MiB
    assert bench_stack.weight_bytes(square, "ours_w4a16") == 33554432 + 4194304
    assert bench_stack.weight_bytes(square, "ours_w4a4") == 37748736
    assert bench_stack.weight_bytes(square, "humming_w4a16") == 37748736
    assert bench_stack.weight_bytes(square, "cublas_bf16") == 134217728
    llama = bench_stack.stack_shapes("llama70b_mlp", 8)
    # 28672 x 8192 = 234881024 weights either way round: 117440512 + 14680064 bytes
    assert bench_stack.weight_bytes(llama, "ours_w4a16") == 132120576
    assert bench_stack.weight_bytes(llama, "cublas_bf16") == 469762048
    # a mean over unequal layers
    assert bench_stack.weight_bytes([(32, 64), (64, 32), (64, 64)], "cublas_bf16") == (
        (4096 + 4096 + 8192) / 3
    )


def test_percent_of_copy_bandwidth():
    # the issue's first row: 37748736 bytes in 16.5 us at 4.13 TB/s is 55%
    pct = bench_stack.pct_of_copy_bandwidth(37748736, 16.5, 4.13e12)
    assert pct == pytest.approx(55.39, abs=0.01)
    assert bench_stack.pct_of_copy_bandwidth(4e6, 1.0, 4e12) == pytest.approx(100.0)


def test_ratios():
    times = {"ours_w4a16": 16.5, "humming_w4a16": 19.4, "cublas_bf16": 34.2, "ours_w4a4": 21.9}
    r = bench_stack.ratios(times | {"ours_w4a4_static": 17.0})
    assert r["humming_vs_ours_w4a16"] == pytest.approx(1.1758, abs=1e-4)
    assert r["cublas_vs_ours_w4a16"] == pytest.approx(2.0727, abs=1e-4)
    assert r["w4a4_over_w4a16"] == pytest.approx(1.3273, abs=1e-4)
    assert r["w4a4_static_over_w4a16"] == pytest.approx(1.0303, abs=1e-4)
    r = bench_stack.ratios({"ours_w4a16": 16.5, "cublas_bf16": 34.2})
    assert r["humming_vs_ours_w4a16"] is None and r["w4a4_over_w4a16"] is None
    assert r["w4a4_static_over_w4a16"] is None
    assert all(v is None for v in bench_stack.ratios({"humming_w4a16": 1.0}).values())


def test_finish_row_from_measured_times():
    row = bench_stack.new_row("8192x8192", [(8192, 8192)] * 8, 1)
    row["silu_only_us"] = 39.0
    ours = {"stack_us": 171.0, "weight_bytes_per_layer": 37748736.0, "check": {"ok": True}}
    row["contestants"] = {"ours_w4a16": ours, "cublas_bf16": {"stack_us": None}}
    bench_stack.finish_row(row, 4.13e12)
    assert ours["per_layer_us"] == 16.5
    assert ours["pct_copy_bandwidth"] == pytest.approx(55.39, abs=0.01)
    assert row["ratios"]["cublas_vs_ours_w4a16"] is None


def test_bare_read_layers_read_the_fp4_layer_s_bytes_once():
    shapes = [(8, 64), (4, 32), (16, 96)]
    layers = bench_stack.bare_read_layers(shapes, CPU)
    for layer, (n, k) in zip(layers, shapes, strict=True):
        (buf,) = layer.__defaults__
        assert buf.dtype == torch.bfloat16 and buf.is_contiguous()
        assert buf.numel() * buf.element_size() == n * k // 2 + n * k // 16
        y = layer(torch.zeros(3, k))
        assert torch.equal(y, buf.sum(dim=1).unsqueeze(0))
    with pytest.raises(ValueError, match="K = 16"):
        bench_stack.bare_read_layers([(2, 16)], CPU)


def test_copy_bandwidth_counts_bytes_read_and_written(monkeypatch):
    seen = []

    def fake_timer(fn, iterations):
        seen.append(fn())
        return 0.5  # us

    monkeypatch.setattr(bench_stack, "time_eager_us", fake_timer)
    assert bench_stack.copy_bandwidth(CPU, 1000) == pytest.approx(4e9)  # 2 x 1000 B / 0.5 us
    (copied,) = seen
    assert copied.numel() == 1000 and copied.dtype == torch.uint8


# ----------------------------------------------------------------------------- the stacks


class FakeHummingLayer:
    """Stands in for humming's HummingLayer on the CPU: takes the ModelOpt NVFP4 tensors that
    ``benchmarks.sm90.humming_layer`` gives it and runs their W4A16 product in fp32."""

    def __init__(self, *, shape_n, shape_k, weight_config, torch_dtype):
        assert weight_config == {"quant_method": "modelopt", "quant_algo": "nvfp4"}
        self.shape, self.torch_dtype = (shape_n, shape_k), torch_dtype

    def cuda(self):
        return self

    def load_from_tensors(self, tensors):
        self.tensors = tensors

    def transform(self):
        t = self.tensors
        self.w = reference.dequantize_fp4(t["weight"], t["weight_scale"], 16)
        self.gs = float(t["weight_scale_2"])

    def __call__(self, inputs, outputs=None):
        return ((inputs.float() @ self.w.t()) * self.gs).to(self.torch_dtype)


def _run(timer=None, humming=FakeHummingLayer, shapes=SMALL, ms=(1, 5)):
    calls = []

    def fake_timer(fn, forwards, reps):
        fn()  # the timed call runs, as on the GPU
        calls.append(fn)
        return 10.0 * len(calls)

    run = bench_stack.SimpleNamespace(reps=3, copy_bps=4e12, humming_cls=humming)
    run.timer = timer or fake_timer
    run.contestants, run.progress = bench_stack.CONTESTANTS, lambda text: None
    notes: list[str] = []
    rows = bench_stack.measure_stack("small", shapes, list(ms), CPU, run, notes)
    return rows, notes, calls


def _float64_stack(weights, x, quantize_input=False, input_scale=None):
    """The stack written out here, apart from the module's reference: float64 GEMMs on the
    dequantized weights (W4A4: on the activations quantized by the oracle, with the static
    ``input_scale`` if given), float64 SiLU."""
    h = x
    for i, t in enumerate(weights):
        w = reference.dequantize_fp4(t["weight"], t["weight_scale"], 16).double()
        a, scale = h.double(), float(t["weight_scale_2"])
        if quantize_input:
            data, scales, gs = reference.quantize_nvfp4(h, input_scale)
            a, scale = reference.dequantize_fp4(data, scales, 16).double(), scale * float(gs)
        h = (a @ w.t()) * scale
        if i + 1 < len(weights):
            h = torch.nn.functional.silu(h)
    return h


@pytest.mark.parametrize("contestant", bench_stack.CONTESTANTS)
def test_each_contestant_s_stack_matches_a_float64_reference(contestant):
    weights = bench_stack.modelopt_weights(SMALL, CPU)
    humming = FakeHummingLayer if contestant == "humming_w4a16" else None
    scales = bench_stack.calibrated_input_scales(weights, CPU)
    layers = bench_stack.build_layers(contestant, weights, humming, scales)
    assert len(layers) == len(SMALL)
    x = bench_stack.activations(5, SMALL[0][1], CPU)
    with torch.no_grad():
        y = bench_stack.forward(layers, x)
    assert y.dtype == torch.bfloat16 and y.shape == (5, SMALL[-1][0])
    exact = _float64_stack(weights, x)
    err = math.sqrt(((y.double() - exact) ** 2).sum() / (exact**2).sum())
    if contestant in bench_stack.W4A4_MODES:
        # FP4 activations: some percent off the BF16-activation stack, but exact on its own
        assert 0.02 < err < 0.4
        trace: list = []
        bench_stack.forward(layers, x, trace)
        static = scales if contestant == "ours_w4a4_static" else [None] * len(weights)
        for (a, out), t, s in zip(trace, weights, static, strict=True):
            want = _float64_stack([t], a, quantize_input=True, input_scale=s)
            assert ((out.double() - want).norm() / want.norm()) < 2.0**-8
    else:
        assert err < len(SMALL) * 2 * 2.0**-8
    check = bench_stack.check_stack(
        contestant, layers, weights, x, bench_stack.reference_stack(weights, x), scales
    )
    assert check["ok"], check
    assert all(e < t / 1.5 for e, t in zip(check["layer_rel_err"], check["layer_tol"], strict=True))
    assert check["stack_rel_err"] == pytest.approx(err, rel=1e-9)


def test_static_input_scales_are_each_layer_s_calibration_amax():
    weights = bench_stack.modelopt_weights(SMALL, CPU)
    scales = bench_stack.calibrated_input_scales(weights, CPU)
    gen = torch.Generator().manual_seed(bench_stack.CALIBRATION_SEED)
    x = torch.randn(bench_stack.CALIBRATION_TOKENS, SMALL[0][1], generator=gen)
    h = x.to(torch.bfloat16).double()
    assert not torch.equal(h, bench_stack.activations(len(h), SMALL[0][1], CPU).double())
    for t, s in zip(weights, scales, strict=True):
        assert s.dtype == torch.float32 and s.shape == ()
        assert float(s) == pytest.approx(float(h.abs().max()) / (448 * 6), rel=2**-23)
        h = torch.nn.functional.silu(_float64_stack([t], h))


def test_the_humming_stack_goes_through_the_sm90_adapter(monkeypatch):
    seen = []
    original = bench_sm90.humming_layer

    def spy(layer_cls, ops):
        seen.append(ops)
        return original(layer_cls, ops)

    monkeypatch.setattr(bench_sm90, "humming_layer", spy)
    weights = bench_stack.modelopt_weights(SMALL, CPU)
    layers = bench_stack.build_layers("humming_w4a16", weights, FakeHummingLayer)
    assert len(seen) == len(SMALL)
    for ops, t, layer in zip(seen, weights, layers, strict=True):
        assert torch.equal(ops.b[0], t["weight"]) and ops.sf_vec_size == 16
        assert layer.shape == (t["weight"].shape[0], 2 * t["weight"].shape[1])
        assert layer.tensors["weight_scale_2"].shape == (1,)


def test_all_contestants_checked_then_timed_on_the_cpu():
    rows, notes, calls = _run()
    assert notes == [] and [r["m"] for r in rows] == [1, 5]
    # the SiLU-only stack per M, the bare read (two stacks), then each contestant (five) per M
    assert len(calls) == 2 + 2 + 5 * 2
    for row in rows:
        assert row["layers"] == 3 and row["silu_only_us"] in (10.0, 20.0)
        # (once per stack, M = 1: its own one-row SiLU-only stack, then the bare reads)
        read = row["bare_read"]
        assert (read["silu_only_us"], read["stack_us"], read["layers"]) == (30.0, 40.0, 3)
        assert read["weight_bytes_per_layer"] == sum(n * k * 9 // 16 for n, k in SMALL) / 3
        assert read["per_layer_us"] == 10 / 3
        assert read["pct_copy_bandwidth"] == pytest.approx(
            100 * read["weight_bytes_per_layer"] / (10 / 3 * 1e-6) / 4e12
        )
        for name in bench_stack.CONTESTANTS:
            r = row["contestants"][name]
            assert r["check"]["ok"] and r["stack_us"] is not None
            assert r["per_layer_us"] == (r["stack_us"] - row["silu_only_us"]) / 3
            assert r["pct_copy_bandwidth"] == pytest.approx(
                100 * r["weight_bytes_per_layer"] / (r["per_layer_us"] * 1e-6) / 4e12
            )
        for name in bench_stack.W4A4_MODES:
            assert row["contestants"][name]["check"]["stack_tol"] is None
        line = bench_stack.format_row(row)
        assert "not measured" not in line and "check failed" not in line


def test_a_wrong_contestant_gets_no_time(monkeypatch):
    original = bench_stack.build_layers

    def build(contestant, weights, humming_cls=None, input_scales=None):
        layers = original(contestant, weights, humming_cls, input_scales)
        if contestant == "cublas_bf16":  # a layer one percent off
            wrong = layers[1]
            layers[1] = lambda h: wrong(h) * 1.02
        return layers

    monkeypatch.setattr(bench_stack, "build_layers", build)
    rows, notes, calls = _run()
    assert len(calls) == 2 + 2 + 4 * 2  # cuBLAS never timed
    for row in rows:
        r = row["contestants"]["cublas_bf16"]
        assert not r["check"]["ok"] and r["stack_us"] is None and r["per_layer_us"] is None
        assert r["check"]["layer_rel_err"][1] > r["check"]["layer_tol"][1]
        assert "check failed" in bench_stack.format_row(row)
        assert row["ratios"]["cublas_vs_ours_w4a16"] is None
    assert len(notes) == 2 and all(
        "cublas_bf16: check failed, not timed: layer 1" in n for n in notes
    )


def _layers_pass(check: dict) -> bool:
    """Whether every layer of a stack check is within its tolerance."""
    return all(e <= t for e, t in zip(check["layer_rel_err"], check["layer_tol"], strict=True))


@pytest.mark.parametrize("contestant", ["ours_w4a16", "cublas_bf16"])
def test_the_stack_output_is_held_to_its_documented_tolerance(contestant):
    """The layers' tolerances summed plus one BF16 unit roundoff per SiLU (one fewer than the
    layers); a stack output off by twice that fails the check though every layer passes."""
    weights = bench_stack.modelopt_weights(SMALL, CPU)
    layers = bench_stack.build_layers(contestant, weights)
    x = bench_stack.activations(5, SMALL[0][1], CPU)
    exact = bench_stack.reference_stack(weights, x)
    check = bench_stack.check_stack(contestant, layers, weights, x, exact)
    rule = sum(check["layer_tol"]) + (len(SMALL) - 1) * 2.0**-8
    assert check["ok"] and check["stack_tol"] == pytest.approx(rule, rel=1e-12)
    wrong = bench_stack.check_stack(contestant, layers, weights, x, exact * (1 + 2 * rule))
    assert _layers_pass(wrong) and wrong["stack_rel_err"] > wrong["stack_tol"] and not wrong["ok"]


def test_a_stack_output_off_its_reference_gets_no_time(monkeypatch):
    """Every layer right, the stack output held to a reference 5% off: the contestants held
    to a stack tolerance get no time, and the note names the stack output, not a layer."""
    original = bench_stack.reference_stack
    monkeypatch.setattr(bench_stack, "reference_stack", lambda *a: original(*a) * 1.05)
    rows, notes, calls = _run()
    held = [n for n in bench_stack.CONTESTANTS if n not in bench_stack.W4A4_MODES]
    assert len(calls) == 2 + 2 + (5 - len(held)) * 2
    for row in rows:
        for name in held:
            r = row["contestants"][name]
            assert _layers_pass(r["check"]) and not r["check"]["ok"] and r["stack_us"] is None
        for name in bench_stack.W4A4_MODES:
            assert row["contestants"][name]["stack_us"] is not None
    assert len(notes) == 2 * len(held)
    assert all("check failed, not timed: stack output relative error" in n for n in notes)


def test_a_contestant_that_raises_is_not_measured():
    class Broken(FakeHummingLayer):
        def __call__(self, inputs, outputs=None):
            raise RuntimeError("no kernel for this shape")

    rows, notes, _ = _run(humming=Broken, ms=(2,))
    (row,) = rows
    assert row["contestants"]["humming_w4a16"]["error"].startswith("RuntimeError: no kernel")
    assert "| not measured |" in bench_stack.format_row(row)
    assert notes == [
        "small M=2 humming_w4a16: not measured, it raised RuntimeError: no kernel for this shape"
    ]


def test_a_bare_read_that_raises_leaves_the_gemms_measured(monkeypatch):
    def broken(shapes, device):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(bench_stack, "bare_read_layers", broken)
    rows, notes, calls = _run(ms=(2,))
    (row,) = rows
    assert row["bare_read"] is None and len(calls) == 1 + 1 + 5  # (its SiLU-only stack ran)
    assert all(r["per_layer_us"] is not None for r in row["contestants"].values())
    assert notes == ["small bare read: not measured, it raised RuntimeError: out of memory"]
    assert "| 10.0 | not measured |" not in bench_stack.format_row(row)
    assert bench_stack.format_row(row).split(" | ")[4] == "not measured"


def test_the_bare_read_s_silus_see_one_row_between_its_layers(monkeypatch):
    seen = []
    real = bench_stack.F.silu
    monkeypatch.setattr(bench_stack.F, "silu", lambda t: seen.append(tuple(t.shape)) or real(t))
    read = bench_stack.time_bare_read(SMALL, CPU, lambda fn, forwards, reps: (fn(), 1.0)[1], 3)
    # its SiLU-only stack, then its forward pass: the outputs of every layer but the last
    assert seen == [(1, n) for n, _ in SMALL[:-1]] * 2 and read["layers"] == 3


def test_table_rows_have_the_head_s_columns():
    rows, _, _ = _run(ms=(1,))
    head = bench_stack.header_lines(FAKE_ENV, 4e12, bench_stack.SimpleNamespace(layers=3, reps=3))
    widths = {line.count("|") for line in head[3:5]} | {bench_stack.format_row(rows[0]).count("|")}
    assert widths == {bench_stack.HEAD.count("|")}


def test_each_figure_sits_under_its_own_header():
    """Per-layer times and ratios all distinct, so a cell in another column shows."""
    row = bench_stack.new_row("8192x8192", [(8192, 8192)] * 8, 1)
    row["silu_only_us"] = 0.0
    times = {"ours_w4a16": 16.0, "humming_w4a16": 20.0, "cublas_bf16": 36.0}
    times |= {"ours_w4a4": 24.0, "ours_w4a4_static": 17.6}
    for name, us in times.items():
        row["contestants"][name] = {"stack_us": 8 * us, "weight_bytes_per_layer": 1.0}
        row["contestants"][name]["check"] = {"ok": True}
    bench_stack.finish_row(row)
    head = bench_stack.HEAD.strip("| ").split(" | ")
    cells = dict(zip(head, bench_stack.format_row(row).strip("| ").split(" | "), strict=True))
    want = {
        "ours W4A16 (us / layer)": "16.0",
        "humming W4A16 (us / layer, ours' speed-up)": "20.0 (1.25x)",
        "cuBLAS BF16 (us / layer, ours' speed-up)": "36.0 (2.25x)",
        "ours W4A4 incl. activation quantization (us / layer)": "24.0",
        "W4A4 / W4A16": "1.50",
        "ours W4A4, static input scale (us / layer)": "17.6",
        "W4A4 static / W4A16": "1.10",
    }
    assert {k: cells[k] for k in want} == want


def test_static_layers_keep_the_calibration_s_scales_at_every_m(monkeypatch):
    """The static scales come from the calibration batch, not from the timed inputs."""
    held, original = [], bench_stack.build_layers

    def build(contestant, weights, humming_cls=None, input_scales=None):
        layers = original(contestant, weights, humming_cls, input_scales)
        if contestant == "ours_w4a4_static":
            held.append([float(layer.input_global_scale) for layer in layers])
        return layers

    monkeypatch.setattr(bench_stack, "build_layers", build)
    rows = _run(ms=(1,))[0] + _run(ms=(5,))[0]
    weights = bench_stack.modelopt_weights(SMALL, CPU)
    want = [float(s) for s in bench_stack.calibrated_input_scales(weights, CPU)]
    assert held == [want, want]
    assert all(r["contestants"]["ours_w4a4_static"]["input_scales"] == want for r in rows)


def test_every_ours_layer_rounds_its_result_once():
    ours = ("ours_w4a16", *bench_stack.W4A4_MODES)
    assert {name: bench_stack.ROUNDINGS[name] for name in ours} == dict.fromkeys(ours, 1)


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
    """main around the CPU stacks: small shapes in place of the stacks', a fake timer, no
    humming: the table, the notes and the JSON."""
    real = bench_stack.measure_stack
    timings = iter(range(1000))

    def small(name, shapes, ms, device, run, notes):
        return real(name, SMALL[: len(shapes)], ms, CPU, run, notes)

    monkeypatch.setattr(bench_stack.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_stack, "environment", lambda device: dict(FAKE_ENV))
    monkeypatch.setattr(bench_stack, "copy_bandwidth", lambda device: 4.0e12)
    monkeypatch.setattr(bench_sm90, "load_humming", lambda: (None, "absent here"))
    monkeypatch.setattr(bench_stack, "measure_stack", small)
    monkeypatch.setattr(
        bench_stack, "time_graph_us", lambda fn, forwards, reps: (fn(), 10.0 + next(timings))[1]
    )
    out = tmp_path / "r" / "stack.json"
    argv = ["--m", "1,4", "--layers", "3", "--json", str(out)]
    assert bench_stack.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == bench_stack.HUMMING_ABSENT
    assert bench_stack.HEAD in printed and "copy bandwidth 4.00 TB/s" in printed
    table = [line for line in printed.splitlines() if line.startswith("| ") and "M |" not in line]
    assert len(table) == 4  # two stacks x two M
    assert all(line.count(" | ") == 10 and "| not measured |" in line for line in table)
    assert table[0].startswith("| 8192 x 8192 | 1 |")
    assert table[2].startswith("| Llama-70B MLP (28672 x 8192, 8192 x 28672) | 1 |")
    data = json.loads(out.read_text())
    assert data["environment"] == FAKE_ENV and data["copy_bandwidth_Bps"] == 4.0e12
    assert data["settings"]["layers"] == 3 and data["settings"]["m"] == [1, 4]
    calibration = {"tokens": bench_stack.CALIBRATION_TOKENS, "seed": bench_stack.CALIBRATION_SEED}
    assert data["settings"]["calibration"] == calibration
    assert data["notes"] == [f"{bench_stack.HUMMING_ABSENT} (absent here)"]
    assert [(r["stack"], r["m"]) for r in data["rows"]] == [
        ("8192x8192", 1),
        ("8192x8192", 4),
        ("llama70b_mlp", 1),
        ("llama70b_mlp", 4),
    ]
    for r in data["rows"]:
        assert "humming_w4a16" not in r["contestants"]
        ours = r["contestants"]["ours_w4a16"]
        assert ours["check"]["ok"] and ours["per_layer_us"] > 0
        assert f"| {ours['per_layer_us']:.1f} |" in printed


def test_describe_names_where_a_bare_assert_was_raised(tmp_path):
    """A peer's error reaches the results as its type and message; a bare ``assert`` (no
    message) as the file, line and source of the assert, so a reader knows what failed."""
    import importlib.util

    from benchmarks.stack import describe

    assert describe(ValueError("bad shape\nmore")) == "ValueError: bad shape"
    source = tmp_path / "peer" / "kernel.py"  # (outside pytest's assert rewriting)
    source.parent.mkdir()
    source.write_text("def check(k):\n    assert k % 128 == 0\n")
    spec = importlib.util.spec_from_file_location("peer_kernel", source)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    with pytest.raises(AssertionError) as info:
        peer.check(2880)
    assert describe(info.value) == "AssertionError: at peer/kernel.py:2 (assert k % 128 == 0)"
