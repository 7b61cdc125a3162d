# SPDX-License-Identifier: BSD-3-Clause
"""benchmarks.linear on the CPU: its arguments and shape list, the cold-L2 copy rule, the bytes a
layer reads, the accuracy columns against reference.py and torchao, the table, JSON and PNG
from fake timings, and the --quick path on CPU tensors (accuracy only, nothing written)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

import fp4_ops
import reference
from benchmarks import args as cli
from benchmarks import linear as bench_linear

L2 = 60 * 2**20  # an H200's L2


# ----------------------------------------------------------------------------- arguments


def test_default_shapes():
    args = bench_linear.parse_args([])
    assert args.m == [1, 16, 128, 1024, 4096, 8192]
    assert args.nk == [(8192, 8192), (7168, 2048), (4096, 7168), (18432, 7168)]
    got = bench_linear.shapes(args)
    assert len(got) == 24 and len(set(got)) == 24
    # every M of one (N, K) before the next (N, K): the table's and the plot's order
    assert got[:6] == [(m, 8192, 8192) for m in args.m]
    assert not args.warm_l2 and args.format == "nvfp4" and args.out is None


def test_quick_is_two_shapes_by_two_m():
    args = bench_linear.parse_args(["--quick"])
    got = bench_linear.shapes(args)
    assert len(got) == 4
    assert len({m for m, _, _ in got}) == 2 and len({(n, k) for _, n, k in got}) == 2
    # explicit sizes win over --quick's
    assert bench_linear.parse_args(["--quick", "--m", "3"]).m == [3]


def test_explicit_sizes_parse():
    args = bench_linear.parse_args(["--m", "2,64", "--nk", "96x128,64x32", "--warm_l2"])
    assert bench_linear.shapes(args) == [(2, 96, 128), (64, 96, 128), (2, 64, 32), (64, 64, 32)]
    assert args.warm_l2


@pytest.mark.parametrize(
    "argv",
    [["--m", "0"], ["--m", "a"], ["--m", ""], ["--nk", "8192x100"], ["--nk", "8192"]]
    + [["--nk", "0x64"], ["--nk", "64x0"], ["--format", "fp4"]],
    ids=" ".join,
)
def test_bad_arguments_exit_2_with_a_reason(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_linear.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--m", "0"], "--m takes positive integers, got [0]"),
        (["--nk", "8192x100"], "--nk 8192x100: N must be positive and K a positive multiple"),
        (["--nk", "64x64,8192"], "got '8192' in '64x64,8192'"),
        (["--m", "99999999999", "--nk", "64x64"], "got 99999999999x64x64"),
        (["--nk", "64x9999999999968"], "N x K must be < 2^31 elements"),
    ],
)
def test_bad_sizes_are_named_before_anything_is_allocated(argv, why, capsys):
    """A bad or too large size is refused naming it (the kernels' 32-bit strides bound M x K
    and N x K), not found as an allocation error later."""
    with pytest.raises(SystemExit):
        bench_linear.parse_args(argv)
    assert why in capsys.readouterr().err


def _library_takes_k(k: int) -> bool:
    """Whether fp4_ops quantizes a row of K values (the layers' activations and weights)."""
    try:
        fp4_ops.quantize(torch.ones(1, k))
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("k", range(0, 161, 8))
def test_nk_takes_exactly_the_ks_the_library_takes(k, capsys):
    """--nk's K check is the library's: every K it would quantize is taken, every other one is
    refused with status 2 before anything runs."""
    argv = ["--nk", f"64x{k}"]
    if _library_takes_k(k):
        assert bench_linear.parse_args(argv).nk == [(64, k)]
        return
    with pytest.raises(SystemExit) as exc:
        bench_linear.parse_args(argv)
    assert exc.value.code == 2
    assert f"--nk 64x{k}" in capsys.readouterr().err


def test_repeated_sizes_are_measured_once():
    args = bench_linear.parse_args(["--m", "1,16,1", "--nk", "64x64,96x128,64x64"])
    assert args.m == [1, 16] and args.nk == [(64, 64), (96, 128)]


# ----------------------------------------------------------------------------- cold L2


@pytest.mark.parametrize("size", [1, 4096, 20 * 2**20, 40 * 2**20, 40 * 2**20 + 1, 2**27, 2**30])
def test_l2_copies_is_the_fewest_that_exceed_twice_the_l2(size):
    copies = bench_linear.l2_copies(size, L2)
    assert copies * size > 2 * L2
    assert copies == 1 or (copies - 1) * size <= 2 * L2


def test_l2_copies_of_the_benchmark_s_layers():
    # BF16 8192 x 8192: 128 MiB, already over 120 MiB; NVFP4: 32 MiB codes + 2 MiB scales
    assert bench_linear.l2_copies(2 * 8192 * 8192, L2) == 1
    assert bench_linear.l2_copies(8192 * 8192 // 2 + 8192 * 8192 // 16 + 4, L2) == 4
    # exactly 2 x L2 in three copies is not more than it
    assert bench_linear.l2_copies(40 * 2**20, L2) == 4


@pytest.mark.parametrize("l2", [None, 2**16])
def test_time_layers_rotates_distinct_copies(monkeypatch, l2):
    timed = {}

    def fake_time_graph_us(calls, stream):
        outputs = [call() for call in calls]
        timed[len(timed)] = (calls, outputs)
        return 1.0

    monkeypatch.setattr(bench_linear, "time_graph_us", fake_time_graph_us)
    _, layers = _layers(n=64, k=128)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    row = bench_linear.time_layers(x, layers, l2, stream=None)
    for i, name in enumerate(layers):
        calls, outputs = timed[i]
        want = (
            1 if l2 is None else bench_linear.l2_copies(bench_linear.weight_bytes(layers[name]), l2)
        )
        assert row[f"copies_{name}"] == want == len(calls) and row[f"us_{name}"] == 1.0
        assert want > 1 or l2 is None
        # each call reads its own copy of the weights, all copies of the same layer
        instances = [call.__defaults__[0] for call in calls]
        assert instances[0] is layers[name] and len({id(inst) for inst in instances}) == want
        pointers = {t.data_ptr() for inst in instances for t in inst.buffers()}
        pointers |= {t.data_ptr() for inst in instances for t in inst.parameters()}
        assert len(pointers) == want * len([*layers[name].buffers(), *layers[name].parameters()])
        assert all(torch.equal(out, outputs[0]) for out in outputs)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_weight_bytes_counts_the_fp4_buffers(fmt):
    n, k = 200, 96
    torch.manual_seed(0)
    linear = torch.nn.Linear(k, n, bias=True)
    assert bench_linear.weight_bytes(linear) == 4 * (n * k + n)
    layer = fp4_ops.FP4Linear.from_linear(linear, fmt)
    vec = fp4_ops.FORMATS[fmt]
    scales = reference.blocked_numel(n, k // vec)  # one byte each
    assert bench_linear.weight_bytes(layer) == n * k // 2 + scales + 4 + 4 * n


# ----------------------------------------------------------------------------- accuracy


def _layers(n=64, k=128, seed=0, static_scale=0.01):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=False).to(torch.bfloat16).requires_grad_(False)
    layers = {
        "bf16": linear,
        "w4a4": fp4_ops.FP4Linear.from_linear(linear),
        "w4a4-static": fp4_ops.FP4Linear.from_linear(linear, "nvfp4", "static", static_scale),
    }
    return linear, layers


def _frobenius(y, ref) -> float:
    return math.sqrt(((y.double() - ref.double()) ** 2).sum() / (ref.double() ** 2).sum())


def test_accuracy_columns_against_the_reference_gemm():
    linear, layers = _layers()
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    row = bench_linear.accuracy(x, layers, "nvfp4", "absent (test)")
    w = linear.weight
    y_bf16 = x @ w.t()
    da, sa, ga = reference.quantize_nvfp4(x)
    db, sb, gb = reference.quantize_nvfp4(w)
    dynamic = reference.reference_gemm(da, db, sa, sb, 16, ga * gb, torch.bfloat16)
    ds, ss, gs = reference.quantize_nvfp4(x, 0.01)
    static = reference.reference_gemm(ds, db, ss, sb, 16, gs * gb, torch.bfloat16)
    assert row["rel_err_w4a4"] == pytest.approx(_frobenius(dynamic, y_bf16), rel=1e-5)
    assert row["rel_err_w4a4-static"] == pytest.approx(_frobenius(static, y_bf16), rel=1e-5)
    assert row["rel_err_w4a4"] != row["rel_err_w4a4-static"]
    assert 0.02 < row["rel_err_w4a4"] < 0.3  # FP4 on both operands: some percent
    absent = ("rel_err_w4a16", "rel_err_torchao", "ours_vs_torchao", "codes_differ_x")
    absent += ("ours_vs_torchao_one_rounding", "codes_differ_w")
    assert all(row[key] is None for key in absent)


def _torchao():
    api = bench_linear.torchao_nvfp4()
    if isinstance(api, str):
        pytest.skip(f"torchao {api}; pip install --no-deps torchao")
    return api


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    return reference.unpack_fp4(packed.view(torch.uint8))


def test_torchao_recipe_is_torchao_s_quantization_and_a_close_product():
    api = _torchao()
    nvfp4_tensor, amax_to_scale = api
    x = torch.randn(33, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    w = torch.randn(80, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    y, y_one, qx, qw = bench_linear.torchao_recipe(x, w, api)
    assert y.dtype == torch.bfloat16 and y.shape == (33, 80)
    theirs = [
        nvfp4_tensor.to_nvfp4(t, per_tensor_scale=amax_to_scale(t.abs().amax())) for t in (x, w)
    ]
    for ours, t in zip((qx, qw), theirs, strict=True):
        assert torch.equal(ours.data, t.qdata.view(torch.uint8))
    # exact product of torchao's dequantized operands (float64); the recipe rounds the fp32
    # accumulator to BF16, the scale product to BF16 and the result to BF16: <= 2^-8 (BF16's
    # unit roundoff) relative each, plus the fp32 summation (<= K x 2^-24 of sum |terms|)
    dx, dw = (t.dequantize(torch.float64) for t in theirs)
    exact = dx @ dw.t()
    summation = 256 * 2.0**-24 * (dx.abs() @ dw.abs().t())
    assert ((y.double() - exact).abs() <= (3 * 2.0**-8 * exact.abs() + summation) * 1.01).all()
    # one rounding of the scaled fp32 accumulator, as fp4_gemm's: 2^-8 (+ the fp32 scale's)
    assert ((y_one.double() - exact).abs() <= (2.0**-8 * exact.abs() + summation) * 1.01).all()
    assert not torch.equal(y.double(), exact) and not torch.equal(y, y_one)


def test_torchao_columns_count_the_codes_that_differ():
    api = _torchao()
    _, layers = _layers(n=96, k=256, seed=4)
    # this x has E2M1 ties that the two quantizers round apart (x / (scale * global scale):
    # one division here, a reciprocal product in torchao)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    row = bench_linear.accuracy(x, layers, "nvfp4", api)
    y_tao, y_one, qx, qw = bench_linear.torchao_recipe(x, layers["bf16"].weight, api)
    differ = _nibbles(fp4_ops.quantize(x).data) != _nibbles(qx.data)
    assert differ.any()
    assert row["codes_differ_x"] == pytest.approx(float(differ.double().mean()), rel=1e-6)
    differ = _nibbles(layers["w4a4"].weight_data) != _nibbles(qw.data)
    assert row["codes_differ_w"] == pytest.approx(float(differ.double().mean()), rel=1e-6)
    y_ours, y_bf16 = layers["w4a4"](x), layers["bf16"](x)
    want = math.sqrt(((y_ours.double() - y_tao.double()) ** 2).sum() / (y_bf16.double() ** 2).sum())
    assert row["ours_vs_torchao"] == pytest.approx(want, rel=1e-5)
    want = math.sqrt(((y_ours.double() - y_one.double()) ** 2).sum() / (y_bf16.double() ** 2).sum())
    assert row["ours_vs_torchao_one_rounding"] == pytest.approx(want, rel=1e-5)
    assert row["rel_err_torchao"] == pytest.approx(_frobenius(y_tao, y_bf16), rel=1e-5)


# ----------------------------------------------------------------------------- output


FAKE_ENV = {
    "date": "2030-01-02 03:04 UTC",
    "gpu": "NVIDIA H200",
    "capability": "sm_90",
    "l2_bytes": L2,
    "driver": "999.1.2",
    "cuda": "13.9",
    "torch": "9.9.9",
    "nvidia-cutlass-dsl": "4.8.1",
    "torchao": "absent (ImportError: no torchao)",
}


def _fake_timer(x, layers):
    """Times that name their shape: bf16 = M + N / 1000 us, the FP4 layers fractions of it."""
    m, n = x.shape[0], layers["bf16"].out_features
    bf16 = m + n / 1000
    out = {"us_bf16": bf16, "copies_bf16": 2}
    for i, name in enumerate(("w4a4", "w4a4-static", "w4a16")):
        if name in layers:
            out[f"us_{name}"] = bf16 * (0.5 + 0.125 * i)
            out[f"copies_{name}"] = 3 + i
    return out


def _run_faked(monkeypatch, tmp_path, capsys, extra=()):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # accuracy on CPU tensors
    monkeypatch.setattr(bench_linear, "environment", lambda device, api: dict(FAKE_ENV))
    monkeypatch.setattr(bench_linear, "torchao_nvfp4", lambda: FAKE_ENV["torchao"])
    monkeypatch.setattr(bench_linear, "make_timer", lambda device, args: (None, _fake_timer))
    out = tmp_path / "res" / "fake"
    argv = ["--m", "3,40", "--nk", "64x128,32x64", "--out", str(out), *extra]
    assert bench_linear.main(argv) == 0
    return out, capsys.readouterr().out


def test_table_json_and_png_from_fake_timings(monkeypatch, tmp_path, capsys):
    out, printed = _run_faked(monkeypatch, tmp_path, capsys)
    table = (tmp_path / "res" / "fake.txt").read_text()
    # the file is the table as printed (then the line naming the files)
    assert printed.splitlines()[:-1] == table.splitlines()
    assert all(v in table for v in ("NVIDIA H200", "2030-01-02 03:04 UTC", "999.1.2", "13.9"))
    assert all(v in table for v in ("torch 9.9.9", "nvidia-cutlass-dsl 4.8.1", "torchao absent"))
    data = json.loads((tmp_path / "res" / "fake.json").read_text())
    assert data["environment"] == FAKE_ENV
    assert data["settings"]["cold_l2"] is True
    assert f"run: {data['run_s']:.0f} s" in table and data["run_s"] > 0
    rows = data["rows"]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(3, 64, 128), (40, 64, 128)] + [
        (3, 32, 64),
        (40, 32, 64),
    ]
    for r in rows:
        bf16 = r["m"] + r["n"] / 1000
        assert r["us_bf16"] == pytest.approx(bf16)
        assert r["ratio_w4a4"] == pytest.approx(0.5)  # ours / F.linear
        assert r["ratio_w4a4-static"] == pytest.approx(0.625)
        assert r["ratio_w4a16"] == pytest.approx(0.75)  # (fp4_ops has W4A16)
        assert r["copies_w4a4"] == 3 and r["copies_w4a16"] == 5
        assert 0.02 < r["rel_err_w4a4"] < 0.3 and 0.02 < r["rel_err_w4a16"] < r["rel_err_w4a4"]
    assert (tmp_path / "res" / "fake.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _columns(header: str, line: str) -> dict[str, str]:
    """A table line's cells by their header's labels (right-aligned under them)."""
    labels = ["bf16 us", "w4a4 us", "static us", "w4a16 us", "err w4a4", "err static"]
    labels += ["err torchao", "ours-tao", "ours-tao*", "x!=%", "w!=%", "err w4a16"]
    cells = {}
    for label in labels:
        (found,) = re.finditer(rf"(?<!\S){re.escape(label)}(?!\S)", header)
        cells[label] = line[: found.end()].split()[-1]
    ratios = re.finditer(r"\bratio\b", header)
    for name, found in zip(("w4a4", "static", "w4a16"), ratios, strict=True):
        cells[f"ratio {name}"] = line[: found.end()].split()[-1]
    return cells


def test_table_cells_sit_under_their_labels(monkeypatch, tmp_path, capsys):
    _run_faked(monkeypatch, tmp_path, capsys)
    lines = (tmp_path / "res" / "fake.txt").read_text().splitlines()
    header = next(line for line in lines if line.lstrip().startswith("M "))
    row = next(line for line in lines if line.split()[:3] == ["40", "32", "64"])
    assert len(row) == len(header)
    cells = _columns(header, row)
    assert cells["bf16 us"] == "40.0"  # 40 + 32 / 1000, one decimal
    assert cells["w4a4 us"] == "20.0" and cells["ratio w4a4"] == "0.50"
    assert cells["static us"] == "25.0" and cells["ratio static"] == "0.62"
    assert cells["w4a16 us"] == "30.0" and cells["ratio w4a16"] == "0.75"
    assert cells["err torchao"] == "n/m" and cells["err w4a16"] != "n/m"
    assert cells["ours-tao"] == cells["ours-tao*"] == cells["x!=%"] == "n/m"
    err = float(cells["err w4a4"])
    assert 0.02 < err < 0.3 and cells["err static"] != "n/m"


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("Tesla T4", "gpu"),
        (None, "cpu"),
    ],
)
def test_label_names_the_results_file(name, label):
    """One label for every benchmark's results files: the model number, not the memory size."""
    assert cli.gpu_label(name) == label


def test_quick_path_runs_on_cpu_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    results = Path(bench_linear.HERE) / "results"
    before = set(results.glob("*"))
    assert bench_linear.main(["--quick", "--m", "2", "--nk", "64x128"]) == 0
    assert bench_linear.main(["--m", "2", "--nk", "64x128"]) == 0  # (no GPU: no results file)
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.split()[:3] == ["2", "64", "128"])
    assert row.count("n/m") >= 7  # no time, no ratio on a CPU
    assert "no CUDA GPU" in printed and "wrote" not in printed
    assert list(tmp_path.iterdir()) == [] and set(results.glob("*")) == before


class _FakeW4A16(torch.nn.Module):
    """A stand-in W4A16 layer: NVFP4 weights dequantized to BF16, BF16 activations."""

    def __init__(self, linear, fail: bool):
        super().__init__()
        self.register_buffer(
            "w", fp4_ops.quantize(linear.weight.detach()).dequantize(torch.bfloat16)
        )
        self.fail = fail

    def forward(self, x):
        if self.fail:
            raise NotImplementedError("no W4A16 kernel here")
        return x @ self.w.t()


@pytest.mark.parametrize("fail", [False, True], ids=["w4a16", "w4a16-raises"])
def test_w4a16_column_appears_when_the_library_has_it(monkeypatch, tmp_path, capsys, fail):
    original = fp4_ops.FP4Linear.from_linear

    def from_linear(linear, format="nvfp4", activations="dynamic", input_global_scale=None):
        if activations == "bf16":
            return _FakeW4A16(linear, fail)
        return original(linear, format, activations, input_global_scale)

    monkeypatch.setattr(fp4_ops.FP4Linear, "from_linear", staticmethod(from_linear))
    out, printed = _run_faked(monkeypatch, tmp_path, capsys)
    data = json.loads(out.with_suffix(".json").read_text())
    w4a16_notes = [n for n in data["notes"] if n.startswith("w4a16")]
    for r in data["rows"]:
        if fail:
            assert r["us_w4a16"] is None and r["rel_err_w4a16"] is None
            continue
        assert r["ratio_w4a16"] == pytest.approx(0.75) and r["copies_w4a16"] == 5
        x, layers = bench_linear.build_layers(r["m"], r["n"], r["k"], "nvfp4", "cpu", [])
        y_bf16 = layers["bf16"](x)
        want = _frobenius(x @ layers["w4a16"].w.t(), y_bf16)
        assert r["rel_err_w4a16"] == pytest.approx(want, rel=1e-5)
        assert r["rel_err_w4a16"] < r["rel_err_w4a4"]  # one operand quantized, not two
    if fail:
        assert w4a16_notes == [
            "w4a16 not measured: its first call raised NotImplementedError: no W4A16 kernel here"
        ]
        assert "w4a16 not measured" in printed
    else:
        assert w4a16_notes == []


def test_static_scale_is_calibrated_on_other_rows_than_the_measured_ones():
    """The static W4A4 layer's input scale is the amax of CALIB_ROWS rows drawn after x from the
    shape's generator, / (448 x 6): not x's own amax, which would flatter its error."""
    m, n, k = 4, 64, 128
    x, layers = bench_linear.build_layers(m, n, k, "nvfp4", "cpu", [])
    gen = torch.Generator().manual_seed(m * 131 + n * 7 + k)
    x_again = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    calib = torch.randn(bench_linear.CALIB_ROWS, k, generator=gen).to(torch.bfloat16)
    assert torch.equal(x, x_again)
    got = layers["w4a4-static"].input_global_scale.item()
    assert got == pytest.approx(calib.abs().amax().item() / (448 * 6), rel=1e-6)
    assert got != pytest.approx(x.abs().amax().item() / (448 * 6), rel=1e-3)
