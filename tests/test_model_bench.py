# SPDX-License-Identifier: BSD-3-Clause
"""``benchmarks.model`` on the CPU: its arguments, the configurations' sizes (built on the meta
device), a decode step that computes what a full forward computes, the variants it swaps and
their bytes counted by hand, the step timing and a row's figures against hand-computed values,
the profile's categories, and a whole run of the tiny configuration: table and JSON."""

from __future__ import annotations

import json
import pathlib
import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fp4_ops

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e .[hf])"
)
bench = pytest.importorskip("benchmarks.model")
#: the decode steps reset transformers 5's StaticCache write position; 4.x's has none to reset
needs_cache_position = pytest.mark.skipif(
    int(transformers.__version__.split(".")[0]) < 5,
    reason="benchmarks.model's decode steps need transformers 5's StaticCache (cumulative_length)",
)


# ----------------------------------------------------------------------------- arguments


def test_defaults(monkeypatch):
    monkeypatch.setattr(bench, "memory_bytes", lambda device: 1 << 40)  # (qwen3-32b: 100 GB)
    args = bench.parse_args(["--device", "cpu"])
    assert args.config == ["llama-3.1-8b", "qwen3-32b"] and args.batch == [1, 16, 64]
    assert args.layers is None and args.context == 512 and args.format == "nvfp4"
    assert args.lm_head == "bf16" and not args.eager and not args.profile and args.out is None


def test_arguments_parse():
    args = bench.parse_args(
        ["--config", "qwen3-32b,tiny", "--batch", "2,8", "--layers", "2", "--device", "cpu"]
    )
    assert args.config == ["qwen3-32b", "tiny"] and args.batch == [2, 8] and args.layers == 2
    again = ["--config", "tiny,tiny", "--batch", "1,2,1", "--device", "cpu"]
    args = bench.parse_args(again)  # (repeats measured once)
    assert args.config == ["tiny"] and args.batch == [1, 2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "llama-70b"], "unknown config llama-70b"),
        (["--config", ""], "unknown config"),
        (["--batch", "0"], "batch sizes must be at least 1"),
        (["--batch", "a"], "expects comma-separated integers"),
        (["--layers", "0"], "--layers must be at least 1"),
        (["--config", "tiny", "--layers", "3"], "tiny has 2 decoder layers"),
        (["--context", "0"], "--context must be at least 1"),
        (["--device", "tpu"], "--device must be cuda or cpu"),
        (["--eager"], "on the CPU every step is eager"),
        (["--lm_head", "int8"], "invalid choice"),
        (["--config", "tiny", "--context", "897"], "tiny takes at most 1024 positions"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args([*argv, "--device", "cpu"] if "--device" not in argv else argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_longest_context_the_model_takes_is_accepted():
    assert bench.parse_args(["--config", "tiny", "--context", "896", "--device", "cpu"])
    assert bench.cache_length(896) == 1024 and bench.cache_length(897) == 1088


def test_kv_cache_bytes_by_hand():
    # tiny: 2 layers x 2 KV heads x 32 dims, keys and values in BF16: 512 bytes a position
    assert bench.kv_cache_bytes("tiny", 3, 100, None) == 2 * 3 * 256 * 2 * 2 * 32 * 2
    assert bench.kv_cache_bytes("tiny", 3, 100, 1) == 3 * 256 * 2 * 2 * 32 * 2
    # a config's own head_dim (Qwen3: 128, not 5120 / 64 = 80)
    assert bench.kv_cache_bytes("qwen3-32b", 1, 512, None) == 64 * 640 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("name", [n for n in bench.CONFIGS])
@pytest.mark.parametrize("layers", [None, 1])
def test_weight_bytes_count_the_model_transformers_builds(name, layers):
    """BF16 bytes against the parameters of the model built on the meta device; the Linear
    shapes against its Linear modules, lm_head last."""
    model = bench.build_model(name, layers, "meta")
    bf16, _ = bench.weight_bytes(name, layers, "nvfp4", "bf16")
    assert bf16 == 2 * sum(p.numel() for p in model.parameters())
    linears = [m.weight.shape for m in model.modules() if isinstance(m, nn.Linear)]
    assert sorted(bench.linear_shapes(name, layers)) == sorted(tuple(s) for s in linears)
    assert bench.linear_shapes(name, layers)[-1] == tuple(model.lm_head.weight.shape)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("lm_head", ["bf16", "fp4"])
def test_weight_bytes_are_what_the_variants_hold(fmt, lm_head):
    """The BF16 model's bytes and one FP4 copy's against the tensors of the tiny model and of
    the FP4Linear modules that ``make_variants`` quantized from it (rotary buffers aside)."""
    model = bench.build_model("tiny", None, "cpu")
    variants = bench.make_variants(model, fmt, lm_head)
    bf16, fp4 = bench.weight_bytes("tiny", None, fmt, lm_head)
    assert bf16 == sum(p.numel() * p.element_size() for p in model.parameters())
    for variant in ("w4a16", "w4a4"):
        assert fp4 == bench.tensor_bytes(variants[variant].values()), variant


_RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


def _recorded_runs():
    for path in sorted(_RESULTS.glob("*_model.json")):
        record = json.loads(path.read_text())
        runs = record["arguments"]
        runs = runs if isinstance(runs, list) else [runs]
        configs = [(run, name) for run in runs for name in run["config"]]
        assert len(record["results"]) <= len(configs)  # (a run cut short keeps what it measured)
        for (run, name), result in zip(configs, record["results"], strict=False):
            assert result["config"] == name
            yield pytest.param(run, result, id=f"{path.stem}-{name}-{run['batch']}")


@pytest.mark.parametrize("run, result", list(_recorded_runs()))
def test_memory_need_bounds_the_recorded_gpu_runs(run, result):
    """Against what runs on a GPU measured: one FP4 copy's bytes (a variant's bytes less BF16's
    Linear weights), and the peak of allocated memory, above the need without its headroom and
    below the need with it."""
    args = SimpleNamespace(**run)
    bf16, fp4 = bench.weight_bytes(result["config"], args.layers, args.format, args.lm_head)
    shapes = bench.linear_shapes(result["config"], args.layers)
    quantized = shapes if args.lm_head == "fp4" else shapes[:-1]
    bf16_linears = 2 * sum(n * k for n, k in quantized)
    for variant in ("w4a16", "w4a4"):
        assert result["bytes"][variant] - result["bytes"]["bf16"] == fp4 - bf16_linears, variant
    need, _ = bench.memory_need(result["config"], args)
    peak = result["max_memory_allocated"]
    assert need - bench.MEMORY_HEADROOM < peak < need


def test_a_run_larger_than_the_device_exits_2_naming_the_layers_that_fit(monkeypatch, capsys):
    argv = ["--config", "tiny", "--batch", "1,3", "--device", "cpu"]
    fits = bench.parse_args([*argv, "--layers", "1"])
    one_layer, _ = bench.memory_need("tiny", fits)
    two_layers, parts = bench.memory_need("tiny", bench.parse_args(argv))
    bf16, fp4 = bench.weight_bytes("tiny", None, "nvfp4", "bf16")
    assert two_layers == bf16 + 2 * fp4 + bench.kv_cache_bytes("tiny", 3, 512, None) + (2 << 30)
    assert parts.startswith("BF16 weights 0.0, two FP4 copies") and "headroom 2.0" in parts
    monkeypatch.setattr(bench, "memory_bytes", lambda device: two_layers)
    assert bench.parse_args(argv).config == ["tiny"]
    for memory, tail in [(two_layers - 1, "; --layers 1 fits"), (one_layer - 1, " GiB")]:
        monkeypatch.setattr(bench, "memory_bytes", lambda device, memory=memory: memory)
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "--batch 3 --context 512: tiny needs about 2.0 GiB (BF16 weights" in err
        assert err.endswith(tail), err
    with pytest.raises(SystemExit):
        bench.parse_args([*argv, "--layers", "1"])
    assert "tiny with --layers 1 needs about" in capsys.readouterr().err
    # the most layers that fit: 20 of Llama-3.1-8B's 32 in exactly their need
    llama = SimpleNamespace(layers=20, format="nvfp4", lm_head="bf16", batch=[1, 3], context=512)
    twenty, _ = bench.memory_need("llama-3.1-8b", llama)
    monkeypatch.setattr(bench, "memory_bytes", lambda device: twenty)
    with pytest.raises(SystemExit):
        bench.parse_args(["--config", "llama-3.1-8b", *argv[2:]])
    assert capsys.readouterr().err.strip().endswith("; --layers 20 fits")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without a GPU")
def test_cuda_without_a_gpu_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args([])
    assert exc.value.code == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the models


@pytest.mark.parametrize(
    "name, billions, linears",
    # (the parameter counts the model cards give: 8.03B and 32.8B)
    [("llama-3.1-8b", 8.03, 7 * 32 + 1), ("qwen3-32b", 32.8, 7 * 64 + 1)],
)
def test_configs_are_the_real_sizes(name, billions, linears):
    model = bench.build_model(name, None, "meta")
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / 1e9 - billions) < 0.01 * billions, count
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == linears
    assert (
        type(model).__name__
        == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[
            bench.CONFIGS[name]["model_type"]
        ]
    )
    short = bench.build_model(name, 3, "meta")
    assert short.config.num_hidden_layers == 3 and len(short.model.layers) == 3


# (not W4A4: its dynamic global scale is the amax of all the rows quantized together)
@needs_cache_position
@pytest.mark.parametrize("variant", ["bf16", "w4a16"])
def test_decode_steps_compute_a_full_forward(variant):
    """Tokens fed one step at a time from position 0 give the logits of one forward over the
    whole sequence: the mask, the positions and the cache writes are right."""
    model = bench.build_model("tiny", None, "cpu")
    variants = bench.make_variants(model, "nvfp4", "bf16")
    bench.swap_modules(model, variants[variant])
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(0))
    step = bench.DecodeStep(model, 2, 0, "cpu")
    step.reset(6)
    stepped = []
    with torch.inference_mode():
        full = model(ids).logits
        for i in range(6):
            step.ids.copy_(ids[:, i : i + 1])
            stepped.append(step())
    assert int(step.position) == 6
    # (one row of tokens at a time against all of them: the same numbers, summed otherwise)
    torch.testing.assert_close(torch.cat(stepped, 1), full, rtol=0.02, atol=0.02)


@needs_cache_position
def test_reset_refuses_more_steps_than_the_cache_holds():
    step = bench.DecodeStep(bench.build_model("tiny", None, "cpu"), 1, 3, "cpu")
    with pytest.raises(ValueError, match="spare positions"):
        step.reset(bench.CACHE_MARGIN + 1)
    step.reset(2)
    assert int(step.position) == 3
    assert all(int(layer.cumulative_length) == 3 for layer in step.cache.layers)


@pytest.mark.parametrize("lm_head", ["bf16", "fp4"])
def test_variants(lm_head):
    model = bench.build_model("tiny", None, "cpu")
    variants = bench.make_variants(model, "nvfp4", lm_head)
    assert list(variants) == ["bf16", "w4a16", "w4a4"]
    names = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if lm_head == "bf16":
        names.discard("lm_head")
    for variant, modules in variants.items():
        assert set(modules) == names, variant
    assert all(type(m) is nn.Linear for m in variants["bf16"].values())
    modes = {v: {m.activations for m in variants[v].values()} for v in ("w4a16", "w4a4")}
    assert modes == {"w4a16": {"bf16"}, "w4a4": {"dynamic"}}
    # (the model is left BF16)
    assert not any(isinstance(m, fp4_ops.FP4Linear) for m in model.modules())


def test_variants_refuse_a_model_with_skipped_linears():
    """A Linear that quantize_model leaves as it is (its parent reads the weight directly) ends
    the run: a variant timed with a BF16 layer in it would not be the model it names."""
    model = nn.ModuleDict({"attn": nn.MultiheadAttention(64, 2), "proj": nn.Linear(64, 64)})
    with pytest.raises(ValueError, match="skipped layers: {'attn.out_proj'"):
        bench.make_variants(model.to(torch.bfloat16), "nvfp4", "bf16")


@needs_cache_position
def test_model_bytes_count_every_weight():
    """Each variant's bytes, counted by hand from the tiny configuration: BF16 embedding,
    norms and lm_head (kept BF16), the rotary buffers, and per decoder layer its seven Linear
    weights in BF16 or as NVFP4 (codes N K / 2, 128 x 4 blocked E4M3 scales, global scale)."""
    args = bench.parse_args(["--config", "tiny", "--device", "cpu", "--batch", "1"])
    got = bench.run_config("tiny", args, lambda row: None)["bytes"]
    hidden, inter, kv, vocab, layers = 128, 256, 2 * 32, 512, 2
    linears = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    linears += [(inter, hidden), (inter, hidden), (hidden, inter)]  # (N, K): q k v o gate up down
    model = bench.build_model("tiny", None, "cpu")
    rotary = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "rotary" in n)
    rest = 2 * (vocab * hidden + layers * 2 * hidden + hidden + hidden * vocab) + rotary

    def nvfp4(n, k):
        return n * k // 2 + -(-n // 128) * 128 * (-(-k // 64) * 4) + 4

    assert got["bf16"] == rest + layers * sum(2 * n * k for n, k in linears)
    for variant in ("w4a16", "w4a4"):
        assert got[variant] == rest + layers * sum(nvfp4(n, k) for n, k in linears), variant


# ----------------------------------------------------------------------------- timing


def test_a_row_s_figures_by_hand():
    """Step milliseconds, tokens per second (batch / step time) and speed-up over BF16."""
    row = {"config": "tiny", "layers": 2, "batch": 4, "mode": "graph"}
    row.update(bf16_us=2000.0, w4a16_us=1000.0, w4a4_us=500.0)
    lead, *cells = (c.split() for c in bench.format_row(row).split(" | "))
    assert lead == ["tiny", "2", "4", "graph"]
    assert cells == [
        ["2.000", "2000.0"],
        ["1.000", "4000.0", "2.00x"],
        ["0.500", "8000.0", "4.00x"],
    ]


class _Clock:
    """A fake perf_counter and decode step: the first call after a reset takes 10 s (a
    warm-up, untimed), each later one 0.25 s."""

    def __init__(self):
        self.now, self.calls, self.reset_to = 0.0, 0, None

    def perf_counter(self):
        return self.now

    def reset(self, steps):
        self.reset_to, self.calls = steps, 0

    def __call__(self):
        self.now += 10.0 if self.calls == 0 else 0.25
        self.calls += 1


def test_cpu_step_time_is_the_mean_of_the_timed_steps(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    assert bench.time_step_us(clock, "cpu") == 0.25e6
    assert clock.calls == 1 + bench.CPU_STEPS and clock.reset_to == 1 + bench.CPU_STEPS


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_cuda_step_time_resets_the_cache_for_every_step_it_runs(mode, monkeypatch):
    """The cache is set back for the warm-up and every timed step (a graph's capture too)."""
    seen = {}

    def timer(step, steps, replays=None):
        seen.update(steps=steps, replays=replays)
        return 7.0

    monkeypatch.setattr(bench.devtools, "time_graph_us", timer)
    monkeypatch.setattr(bench.devtools, "time_eager_us", timer)
    clock = _Clock()
    assert bench.time_step_us(clock, mode) == 7.0
    if mode == "graph":
        assert seen == {"steps": bench.GRAPH_STEPS, "replays": bench.GRAPH_REPLAYS}
        assert clock.reset_to == 1 + bench.GRAPH_STEPS * (bench.GRAPH_REPLAYS + 1)
    else:
        assert seen["steps"] == bench.EAGER_STEPS and clock.reset_to == 1 + bench.EAGER_STEPS


@pytest.mark.parametrize("mode", ["eager", "graph", "cpu"])
def test_variants_are_timed_in_turn_and_eager_rounds_give_their_median(mode, monkeypatch):
    """Eager: EAGER_ROUNDS rounds, each timing every variant in turn with its modules swapped
    in, each variant's figure the median of its rounds (not the least or the mean); graph and
    CPU steps: one round."""
    rounds = bench.EAGER_ROUNDS if mode == "eager" else 1
    by_round = [4.0, 1.0, 9.0, 2.0, 8.0][:rounds]  # (median 4, least 1, mean 4.8)
    order, current = [], [None]

    def swap(model, modules):
        current[0] = modules["tag"]

    def step_us(step, step_mode):
        assert step is model.step and step_mode == mode
        order.append(current[0])
        scale = 1 + bench.VARIANTS.index(current[0])
        return scale * by_round[order.count(current[0]) - 1]

    monkeypatch.setattr(bench, "swap_modules", swap)
    monkeypatch.setattr(bench, "time_step_us", step_us)
    model = SimpleNamespace(step=object())
    variants = {v: {"tag": v} for v in bench.VARIANTS}
    got = bench.time_variants(model, variants, model.step, mode)
    assert order == list(bench.VARIANTS) * rounds
    assert got == {v: (1 + i) * 4.0 for i, v in enumerate(bench.VARIANTS)}


@pytest.mark.parametrize(
    "name, inside, want",
    [
        ("kernel_cutlass_QuantizeFp4_kernel_0", False, "quantize"),
        ("amax_kernel", True, "quantize"),
        ("nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NTN", False, "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", True, "gemm"),
        ("kernel_cutlass_BlockwiseGemmFp4Sm90_kernel_0", False, "gemm"),
        ("aten::mm", False, "gemm"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", False, "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", True, "attention"),
        ("void at::native::elementwise_kernel<128, 2>", True, "attention"),
        ("void at::native::elementwise_kernel<128, 2>", False, "other"),
        ("aten::mul", False, "other"),
    ],
)
def test_profile_categories(name, inside, want):
    assert bench.category(name, inside) == want


def test_profile_counts_kernels_that_no_operator_launched():
    """GPU profile: a kernel attached to an operator counts once; a kernel launched outside the
    dispatcher (ours, through TVM-FFI) has no operator and still counts, by its name; a
    record_function range on the GPU timeline is no kernel."""
    from torch.autograd import DeviceType

    def kernel(name, start, end, annotation=False):
        span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start)
        return SimpleNamespace(
            name=name, device_type=DeviceType.CUDA, time_range=span, is_user_annotation=annotation
        )

    gemm = kernel("nvjet_hsh_128x64", 0.0, 7.0)
    silu = kernel("void at::native::elementwise_kernel<128, 2>", 8.0, 9.5)
    ours = kernel("kernel_cutlass_BlockwiseGemmFp4Sm90_kernel_0", 10.0, 30.0)
    again = kernel("nvjet_hsh_128x64", 31.0, 38.0)  # (same name and time as an attached one)
    quant = kernel("kernel_cutlass_QuantizeFp4_kernel_0", 40.0, 42.0)

    def op(name, kernels, parent=None):
        attached = [
            SimpleNamespace(name=k.name, duration=k.time_range.elapsed_us()) for k in kernels
        ]
        return SimpleNamespace(
            name=name, device_type=DeviceType.CPU, kernels=attached, cpu_parent=parent
        )

    label = op(bench._ATTENTION_LABEL, [])
    events = [label, op("aten::mm", [gemm]), op("aten::silu", [silu], label)]
    # (the attention label's range, drawn on the GPU timeline over the kernels inside it)
    range_ = kernel(bench._ATTENTION_LABEL, 8.0, 9.5, annotation=True)
    device = [gemm, silu, ours, again, quant, range_]
    got = bench.split_times(events, device)
    assert got == {"gemm": 7.0 + 20.0 + 7.0, "attention": 1.5, "quantize": 2.0, "other": 0.0}


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_profile_lines_print_each_category_and_their_sum(gpu):
    """Each profiled step's row: its categories in the header's order, the total of all four
    and, on the GPU, the span and idle time, as the profile holds them."""
    cats = ("gemm", "attention", "quantize", "other")
    profiles = []
    for i, (batch, variant, quantize) in enumerate(((1, "w4a4", 8.5), (16, "bf16", 0.0))):
        p = {"config": "tiny", "batch": batch, "variant": variant}
        p |= {"gemm": 1.0 + i, "attention": 2.5, "quantize": quantize, "other": 4.5}
        profiles.append(p | ({"span": 100.0 + i, "idle": 30.0 + i} if gpu else {}))
    lines = bench.profile_lines(profiles)
    header = lines[1].replace("|", " ").split()
    for p, line in zip(profiles, lines[2 : 2 + len(profiles)], strict=True):
        row = (str(p["batch"]), p["variant"])
        cells = dict(zip(header, line.replace("|", " ").split(), strict=True))
        assert (cells["config"], cells["batch"], cells["variant"]) == ("tiny", *row)
        want = {c: p[c] for c in cats} | {"total": sum(p[c] for c in cats)}
        want |= {"span": p["span"], "idle": p["idle"]} if gpu else {}
        # (printed to 0.1 us)
        assert {c: float(cells[c]) for c in header[3:]} == pytest.approx(want, abs=0.05)


# ----------------------------------------------------------------------------- a whole run


@needs_cache_position
def test_tiny_run_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "model.json"
    argv = ["--config", "tiny", "--device", "cpu", "--batch", "1,3", "--profile"]
    assert bench.main([*argv, "--context", "8", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = re.findall(r"^tiny +2 +(\d+) cpu +\|(.*)$", text, re.MULTILINE)
    assert [b for b, _ in rows] == ["1", "3"]
    for _, cells in rows:
        assert len(re.findall(r"\d+\.\d+x", cells)) == 2
    assert "profile of one eager decode step, us (its operators' own CPU times):" in text
    assert len(re.findall(r"^tiny +\d+ (bf16|w4a16|w4a4) +\|", text, re.MULTILINE)) == 6
    assert f"wrote {out}" in text
    record = json.loads(out.read_text())
    assert {"date", "torch", "transformers", "cuda", "gpu"} <= record["environment"].keys()
    assert record["environment"]["transformers"] == transformers.__version__
    assert record["configs"]["tiny"]["hidden_size"] == 128
    (result,) = record["results"]
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    assert all(r[f"{v}_us"] > 0 for r in result["rows"] for v in bench.VARIANTS)
    assert result["bytes"]["w4a16"] < result["bytes"]["bf16"]
    profile = result["profiles"][0]
    assert profile["gemm"] > 0 and profile["attention"] > 0 and profile["variant"] == "bf16"
    assert any(p["quantize"] > 0 for p in result["profiles"] if p["variant"] == "w4a4")
