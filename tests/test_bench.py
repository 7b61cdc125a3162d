# SPDX-License-Identifier: BSD-3-Clause
"""``benchmarks.sm90`` without a GPU: cold-L2 input copies, the W4A16 ratios and targets, the
tables, the result files, the options, ``main``'s loop and the humming adapter."""

import json
import sys

import pytest
import torch

import reference
from benchmarks import sm90 as bench

MIB = 2**20


def _bench(l2_bytes=60 * MIB, warm=False):
    return bench.Bench(roof=4e12, l2_bytes=l2_bytes, warm=warm, tri=None, lut=None, humming=None)


def test_cold_l2_copies_exceed_three_l2s_and_warm_uses_one_set():
    assert bench.l2_copies(37_834_752, 60 * MIB) == 5  # 1 x 8192 x 8192 NVFP4: 5 x 37.8 MB
    assert bench.l2_copies(37_834_752, 60 * MIB, warm=True) == 1
    assert bench.l2_copies(400 * MIB, 60 * MIB) == 1
    a, b = torch.arange(100, dtype=torch.uint8), torch.ones(50, dtype=torch.float32)
    sets = bench.input_sets(_bench(l2_bytes=100), (a, None, b), extra_bytes=200)
    assert len(sets) == 1  # 100 + 200 + 200 bytes = 500 > 3 x 100
    sets = bench.input_sets(_bench(l2_bytes=1000), (a, None, b))
    assert len(sets) == 11  # ceil(3000 / 300)
    assert sets[0][0] is a and all(s[1] is None for s in sets)
    ptrs = {s[0].data_ptr() for s in sets} | {s[2].data_ptr() for s in sets}
    assert len(ptrs) == 22
    assert all(torch.equal(s[0], a) and torch.equal(s[2], b) for s in sets)
    assert len(bench.input_sets(_bench(l2_bytes=1000, warm=True), (a, b))) == 1


def _w16_row(m, n, k, ours_us, humming_us=None, cublas_us=None, roof_pct=50.0, check=True):
    row = {"m": m, "n": n, "k": k}
    for fmt in ("nvfp4", "mxfp4"):
        row[f"ours-w4a16-{fmt}"] = dict(
            us=ours_us, tflops=1.0, roof_pct=roof_pct, err=0.5, check=check
        )
        if humming_us is not None:
            row[f"humming-{fmt}"] = dict(us=humming_us, tflops=1.0, err=1.5, within_bound=False)
    if cublas_us is not None:
        row["cublas-bf16"] = dict(us=cublas_us, tflops=1.0, err=1.0, within_bound=False)
    row["ours-w4a4-nvfp4"] = dict(us=9.0, tflops=1.0)
    row["ratios"] = bench.w4a16_ratios(row)
    return row


def test_w4a16_ratios_are_peer_time_over_ours_and_none_when_unmeasured():
    r = _w16_row(16, 64, 64, ours_us=10.0, humming_us=15.0, cublas_us=25.0)["ratios"]
    assert r == {
        "nvfp4/humming": 1.5,
        "nvfp4/cublas-bf16": 2.5,
        "mxfp4/humming": 1.5,
        "mxfp4/cublas-bf16": 2.5,
    }
    row = _w16_row(16, 64, 64, ours_us=10.0, cublas_us=25.0)
    row["humming-mxfp4"] = dict(error="RuntimeError: no kernel")
    r = bench.w4a16_ratios(row)
    assert r["nvfp4/humming"] is None and r["mxfp4/humming"] is None
    assert r["mxfp4/cublas-bf16"] == 2.5


def test_w4a16_targets_by_shape():
    rows = [
        _w16_row(1, 8192, 8192, ours_us=10.0, humming_us=12.5, cublas_us=30.0, roof_pct=80.0),
        _w16_row(16, 7168, 2048, ours_us=10.0, humming_us=11.0, cublas_us=30.0),
        _w16_row(1024, 8192, 8192, ours_us=100.0, humming_us=101.0, cublas_us=90.0),
        _w16_row(64, 8192, 8192, ours_us=10.0),
        _w16_row(1, 4096, 4096, ours_us=10.0, humming_us=15.0, roof_pct=10.0),
    ]
    targets = bench.w4a16_targets(rows)
    got = {(t["shape"], t["target"]): (t["met"], t["min"]) for t in targets}
    assert len(targets) == 2 * (2 + 1 + 2 + 1 + 1)
    assert got[("1x8192x8192", "nvfp4/humming")] == (True, 1.2)  # 1.25x
    assert got[("1x8192x8192", "mxfp4 %roof")] == (True, 75.0)
    assert got[("16x7168x2048", "nvfp4/humming")] == (False, 1.2)  # 1.10x
    assert got[("1024x8192x8192", "mxfp4/humming")] == (True, 1.0)  # 1.01x
    assert got[("1024x8192x8192", "nvfp4/cublas-bf16")] == (False, 0.95)  # 0.90x
    assert got[("1x4096x4096", "nvfp4/humming")] == (True, 1.2)  # no %roof target here
    assert got[("64x8192x8192", "mxfp4/humming")] == (None, 1.2)  # no humming
    text = bench.format_targets(targets)
    assert text.splitlines()[0] == "W4A16 targets: 8 of 14 met, 4 missed, 2 not measured"
    assert "  missed: 16x7168x2048 nvfp4/humming 1.10 < 1.2" in text
    assert "  missed: 1024x8192x8192 mxfp4/cublas-bf16 0.90 < 0.95" in text
    assert "not measured: 64x8192x8192 nvfp4/humming, 64x8192x8192 mxfp4/humming" in text
    slow = _w16_row(1, 8192, 8192, ours_us=10.0, humming_us=20.0, roof_pct=74.9)
    assert [t["met"] for t in bench.w4a16_targets([slow]) if "%roof" in t["target"]] == [
        False,
        False,
    ]


def test_w4a16_table_prints_times_errors_speedups_and_failures():
    ok = _w16_row(16, 64, 64, ours_us=10.0, humming_us=15.0, cublas_us=25.0)
    bad = _w16_row(32, 64, 64, ours_us=10.0, cublas_us=25.0, check=False)
    bad["humming-nvfp4"] = dict(error="RuntimeError: no kernel")
    bad["ratios"] = bench.w4a16_ratios(bad)
    lines = bench.format_w4a16_table([ok, bad]).splitlines()
    assert lines[0].startswith("W4A16")
    head = lines[1]
    for name in bench.W4A16_METHODS:
        assert name in head
    first, second = (line for line in lines if line.lstrip().startswith(("16 ", "32 ")))
    assert first.count("1.50x") == 2 and first.count("2.50x") == 2
    assert "50.0" in first and "0.5" in first and "1.5" in first and "9.0" in first
    assert "CHECK FAILED" not in first
    assert "CHECK FAILED" in second and "failed" in second
    assert "1.50x" not in second and second.count("2.50x") == 2


def test_write_results_json_text_and_png(tmp_path):
    w4a4 = dict(us=10.0, tflops=1.0, gbps=100.0, roof_pct=50.0, check=True)
    rows = [{"m": 1, "n": 8192, "k": 8192, "ours-nvfp4": w4a4, "cublas-bf16": dict(us=20.0)}]
    w16 = [_w16_row(1, 8192, 8192, ours_us=10.0, humming_us=15.0, cublas_us=25.0)]
    meta = dict(gpu="NVIDIA H200", copy_bandwidth_Bps=4e12, l2=bench.l2_mode(False, 60 * MIB))
    text = bench.write_results(str(tmp_path / "h200"), meta, rows, w16)
    saved = json.loads((tmp_path / "h200.json").read_text())
    assert set(saved) == {"meta", "rows", "w4a16", "targets"}
    assert saved["w4a16"][0]["ratios"]["nvfp4/humming"] == 1.5
    assert saved["w4a16"][0]["ours-w4a16-nvfp4"]["roof_pct"] == 50.0
    assert {t["target"] for t in saved["targets"]} == {
        "nvfp4/humming",
        "mxfp4/humming",
        "nvfp4 %roof",
        "mxfp4 %roof",
    }
    assert (tmp_path / "h200.txt").read_text() == text + "\n"
    assert text.startswith("timing: cold L2 (each call reads the next of input copies over 3x")
    assert "60 MiB L2)" in text.splitlines()[0]
    for needle in ("copy bandwidth (roof)", "W4A16: BF16", "W4A16 targets: 2 of 4 met"):
        assert needle in text
    assert (tmp_path / "h200.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("m, n, k, sec", [(1, 8192, 8192, 15e-6), (4096, 28672, 8192, 2.8e-3)])
def test_rate_counts_a_multiply_add_as_two_operations(m, n, k, sec):
    """A row's rate: microseconds, and TFLOP/s of the M x N x K products' multiplies and adds
    (2 M N K operations) in that time; the other fields pass through."""
    row = bench._rate(m, n, k, sec, gbps=1.5, check=True)
    flops = sum(2 * n * k for _ in range(m))
    assert row == pytest.approx(
        dict(us=sec * 1e6, tflops=flops / sec * 1e-12, gbps=1.5, check=True)
    )


@pytest.mark.parametrize("rows, k", [(1, 32), (3, 64), (130, 256)])
def test_torch_dequant_is_the_reference_dequantization(rows, k):
    """The torch-dq+cublas peer's dequantization, bit for bit the reference's (every e2m1 x E4M3
    product is a BF16 value), each byte's low nibble first."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 100
    packed, scales, _ = reference.quantize_nvfp4(x, 1.0)
    lut = reference.e2m1_to_fp32(torch.arange(16, dtype=torch.uint8)).to(torch.bfloat16)
    got = bench.torch_dequant(packed, scales, 16, lut)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.float(), reference.dequantize_fp4(packed, scales, 16))


def test_options():
    args = bench.parse_args([])
    assert not args.warm_l2 and not args.quick and args.name is None
    args = bench.parse_args(["--warm_l2", "--quick", "--name", "x"])
    assert args.warm_l2 and args.quick and args.name == "x"
    assert bench.l2_mode(True, 60 * MIB).startswith("warm L2")
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--cold"])
    assert exc.value.code == 2


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
    reason="an H100 / H200 is here: main would run the whole benchmark",
)
def test_main_refuses_a_machine_without_sm90(capsys):
    assert bench.main(["--quick"]) == 2
    assert "needs an sm_90 GPU" in capsys.readouterr().err


def test_humming_absent_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "humming", None)
    monkeypatch.setitem(sys.modules, "humming.layer", None)
    layer_cls, why = bench.load_humming()
    assert layer_cls is None
    assert why.startswith("humming-kernels==0.1.20 is not installed")


class _FakeHummingLayer:
    """Records what ``humming_layer`` gives humming's HummingLayer and checks it against the
    tensors humming 0.1.20's ModelOpt NVFP4 and mxfp4 weight schemas declare."""

    def __init__(self, *, shape_n, shape_k, weight_config, torch_dtype):
        self.shape = (shape_n, shape_k)
        self.config, self.torch_dtype = weight_config, torch_dtype
        self.steps = []

    def cuda(self):
        self.steps.append("cuda")
        return self

    def load_from_tensors(self, tensors):
        n, k = self.shape
        want = {"weight": ((n, k // 2), torch.uint8)}
        if self.config == {"quant_method": "modelopt", "quant_algo": "nvfp4"}:
            want["weight_scale"] = ((n, k // 16), torch.float8_e4m3fn)
            want["weight_scale_2"] = ((1,), torch.float32)
        elif self.config == {"quant_method": "mxfp4"}:
            want["weight_scale"] = ((n, k // 32), torch.uint8)
        else:
            raise AssertionError(f"unexpected weight_config {self.config}")
        assert {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()} == want
        self.tensors = tensors
        self.steps.append("load")

    def transform(self):
        self.steps.append("transform")


@pytest.mark.parametrize("vec", [16, 32], ids=["nvfp4", "mxfp4"])
def test_humming_adapter_loads_the_weights_and_global_scale(vec):
    ops = reference.make_fp4_operands(2, 32, 64, 1, vec, seed=3)
    layer = bench.humming_layer(_FakeHummingLayer, ops)
    assert layer.steps == ["cuda", "load", "transform"]
    assert layer.shape == (32, 64) and layer.torch_dtype == torch.bfloat16
    assert torch.equal(layer.tensors["weight"], ops.b[0])
    assert torch.equal(
        layer.tensors["weight_scale"].view(torch.uint8), ops.sfb[0].view(torch.uint8)
    )
    if vec == 16:
        assert float(layer.tensors["weight_scale_2"]) == float(ops.global_scale_b)


def test_main_runs_every_shape_and_writes_one_result_set(tmp_path, monkeypatch, capsys):
    """``main`` around fake measurements: the shapes of ``--quick``, the mode it was given, the
    progress lines and the three result files."""
    seen = []

    def fake_shape(b, m, n, k):
        seen.append((m, n, k, b.warm))
        w4a4 = dict(us=10.0, tflops=1.0, gbps=100.0, roof_pct=50.0, check=True)
        row = {"m": m, "n": n, "k": k, "ours-nvfp4": w4a4, "cublas-fp8": dict(error="x")}
        return row, _w16_row(m, n, k, ours_us=10.0, humming_us=15.0, cublas_us=25.0)

    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(bench, "setup", lambda warm: _bench(warm=warm))
    monkeypatch.setattr(bench, "bench_shape", fake_shape)
    assert bench.main(["--quick", "--warm_l2", "--out_dir", str(tmp_path)]) == 0
    assert seen == [(*shape, True) for shape in bench.QUICK]
    out = capsys.readouterr().out
    assert "1x8192x8192: W4A4 {'ours-nvfp4': 10.0} W4A16 {'ours-w4a16-nvfp4': 10.0," in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["h200_sm90.json", "h200_sm90.png", "h200_sm90.txt"]
    saved = json.loads((tmp_path / "h200_sm90.json").read_text())
    assert saved["meta"]["l2"].startswith("warm L2") and saved["meta"]["gpu"] == "NVIDIA H200"
    assert [(r["m"], r["n"], r["k"]) for r in saved["w4a16"]] == bench.QUICK


def test_shards_combine_into_one_result_set_in_shape_order(tmp_path):
    """``--shard I/N`` runs measure every N-th shape; ``--combine N`` writes one result set with
    the rows in the benchmark's shape order and the lowest copy bandwidth of the shards."""
    shapes = bench.SHAPES[:3]
    parts = [[shapes[0], shapes[2]], [shapes[1]]]
    for i, part in enumerate(parts):
        w4a4 = dict(us=10.0, tflops=1.0, gbps=100.0, roof_pct=50.0, check=True)
        rows = [{"m": m, "n": n, "k": k, "ours-nvfp4": w4a4} for m, n, k in part]
        w16 = [_w16_row(m, n, k, ours_us=10.0 + i) for m, n, k in part]
        meta = dict(gpu="NVIDIA H200", copy_bandwidth_Bps=4e12 + i, l2="cold")
        with open(tmp_path / f"h200_sm90.shard{i}.json", "w") as f:
            json.dump(dict(meta=meta, rows=rows, w4a16=w16), f)
    assert bench.main(["--combine", "2", "--out_dir", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "h200_sm90.json").read_text())
    assert [(r["m"], r["n"], r["k"]) for r in saved["rows"]] == [tuple(s) for s in shapes]
    assert [r["ours-w4a16-nvfp4"]["us"] for r in saved["w4a16"]] == [10.0, 11.0, 10.0]
    assert saved["meta"]["copy_bandwidth_Bps"] == 4e12 and len(saved["meta"]["shards"]) == 2
    assert bench.main(["--combine", "3", "--out_dir", str(tmp_path)]) == 2  # (no shard 2)
    with pytest.raises(SystemExit):
        bench.parse_args(["--combine", "0"])
    args = bench.parse_args(["--shard", "1/3"])
    assert args.shard == (1, 3)
    for bad in ("3/3", "x/2"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--shard", bad])


def test_combine_finds_the_one_run_s_shards_and_refuses_to_guess(tmp_path, capsys):
    """Without --name, --combine combines the shards of the one run in --out_dir, whatever GPU
    named them (an H100's run: h100_sm90); none, or two runs' shards, is exit 2 asking for it."""
    assert bench.main(["--combine", "1", "--out_dir", str(tmp_path)]) == 2
    assert "the shards of 0 runs (no *_sm90.shard0.json): name one with --name" in (
        capsys.readouterr().err
    )
    (m, n, k) = bench.SHAPES[0]
    w4a4 = dict(us=10.0, tflops=1.0, gbps=100.0, roof_pct=50.0, check=True)
    shard = dict(
        meta=dict(gpu="NVIDIA H100 80GB HBM3", copy_bandwidth_Bps=3e12, l2="cold"),
        rows=[{"m": m, "n": n, "k": k, "ours-nvfp4": w4a4}],
        w4a16=[_w16_row(m, n, k, ours_us=10.0)],
    )
    (tmp_path / "h100_sm90.shard0.json").write_text(json.dumps(shard))
    assert bench.main(["--combine", "1", "--out_dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "h100_sm90.json").read_text())["meta"]["gpu"].endswith("HBM3")
    (tmp_path / "h200_sm90.shard0.json").write_text(json.dumps(shard))
    capsys.readouterr()
    assert bench.main(["--combine", "1", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the shards of 2 runs (h100_sm90, h200_sm90): name one with --name" in err
    assert bench.main(["--combine", "1", "--out_dir", str(tmp_path), "--name", "h200_sm90"]) == 0


@pytest.mark.parametrize(
    "shard, why",
    [("{bad", "Expecting property name"), ('{"rows": [], "meta": {}}', "lacks 'w4a16'")],
    ids=["not-json", "no-w4a16"],
)
def test_combine_refuses_a_shard_that_is_no_result(tmp_path, capsys, shard, why):
    """A shard file that is not JSON, or lacks a part of a result, is exit 2 naming the run's
    shards and what is wrong, not a traceback."""
    (tmp_path / "h200_sm90.shard0.json").write_text(shard)
    assert bench.main(["--combine", "1", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"a shard of {tmp_path / 'h200_sm90'}" in err and why in err


@pytest.mark.parametrize(
    "args, why",
    [
        (["--combine", "1", "--quick"], "--combine writes what the shards measured"),
        (["--combine", "1", "--shard", "0/2"], "--combine writes what the shards measured"),
        (["--name", ""], "--name '': a file name"),
        (["--name", "a/b"], "--name 'a/b': a file name"),
        (["--out_dir", "FILE"], "is not a folder this run can write in"),
    ],
)
def test_sm90_bench_refuses_what_it_would_ignore_or_fail_on_late(tmp_path, capsys, args, why):
    """Options --combine would ignore, a --name that is no file name, and an --out_dir it
    cannot write in are refused at the start (exit 2), not ignored or found after the run."""
    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(args)
    assert exit_.value.code == 2 and why in capsys.readouterr().err


@pytest.mark.parametrize("calls", ["0", "151"])
def test_eager_bench_refuses_calls_out_of_range(calls, capsys):
    """More calls than fit the launch queue behind the sleep kernel would time the GPU."""
    from benchmarks import eager

    assert eager.main(["--calls", calls]) == 2
    assert "--calls must be 1 .. 150" in capsys.readouterr().err


def test_eager_bench_sets_each_row_against_its_own_base(monkeypatch, capsys):
    """The layers' and fp4_gemm's host times are ratios to F.linear's, quantize's (dynamic and
    static) to the empty_like + elementwise op pair's, within each shape."""
    from benchmarks import eager

    host = {"F.linear (BF16)": 20.0, "FP4Linear W4A16": 30.0, "FP4Linear W4A4": 40.0}
    host |= {"FP4Linear W4A4 st": 50.0, "fp4_gemm W4A4": 10.0, "quantize": 15.0}
    host |= {"quantize static": 12.0, "empty_like + mul": 8.0}
    monkeypatch.setattr(eager, "SHAPES", [(1, 64, 64)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a GPU")
    monkeypatch.setattr(eager, "rows_for", lambda *_: [(n, h, 2 * h) for n, h in host.items()])
    assert eager.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    # (columns: shape, the row's name (18 wide), host us, wall us, host / base)
    rows = [(line[19:37].strip(), line.split()[-1]) for line in lines[2:]]
    ratios = {name: float(ratio.rstrip("x")) for name, ratio in rows}
    base = {name: 8.0 if name.startswith(("quantize", "empty")) else 20.0 for name in host}
    assert ratios == {name: round(h / base[name], 2) for name, h in host.items()}


def test_eager_bench_times_every_row_in_each_round(monkeypatch):
    """The eager benchmark's rounds each time every row in turn (a slow phase of the host falls
    on all rows alike), and a row's figure is the median of its rounds."""
    from types import SimpleNamespace

    from benchmarks import eager

    order, clock = [], [0.0]
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(query=lambda: False))
    monkeypatch.setattr(eager.time, "perf_counter", lambda: clock[0])

    def row(name, cost):
        def call():
            order.append(name)
            clock[0] += cost * (3.0 if len(order) > 60 else 1.0)  # (a slow phase at the end)

        return call

    times = eager.time_rows({"a": row("a", 1e-6), "b": row("b", 2e-6)}, calls=2, rounds=5)
    timed = order[4:]  # (two warm-up calls per row)
    rounds = [timed[i : i + 8] for i in range(0, len(timed), 8)]
    assert len(rounds) == 5 and all(r == ["a"] * 4 + ["b"] * 4 for r in rounds)
    assert times["a"][0] == pytest.approx(1.0) and times["b"][0] == pytest.approx(2.0)
