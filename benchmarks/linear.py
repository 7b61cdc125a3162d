# SPDX-License-Identifier: BSD-3-Clause
"""The whole W4A4 linear layer (``fp4_ops.FP4Linear``: quantize the activations + ``fp4_gemm``)
against BF16 ``F.linear`` on the GPU, with the accuracy of both FP4 recipes (ours, torchao's
NVFP4) against the BF16 layer on the same inputs and weights.

    python -m benchmarks.linear       # M x (N, K) below -> results/<gpu>_linear.{txt,json,png}
    python -m benchmarks.linear --quick    # 2 shapes x 2 M, printed only (smoke test)
    python -m benchmarks.linear --warm_l2  # one copy of each layer (warm L2)
    python -m benchmarks.linear --m 16,4096 --nk 8192x8192 --out /tmp/linear

Layers, same x (randn, BF16) and same weights (``nn.Linear``'s initialisation, BF16):
    bf16         ``nn.Linear`` (``F.linear``, cuBLAS)
    w4a4         ``FP4Linear.from_linear``: weights quantized once, x per call (dynamic scale)
    w4a4-static  the same with a static activation global scale, calibrated once on a separate
                 batch of CALIB_ROWS rows (NVFP4 only)
    w4a16        ``FP4Linear.from_linear(..., activations="bf16")`` where the library has it
Timing: CUDA graphs of at least MIN_CALLS calls, median of REPLAYS replays, one stream for all
(the library keeps its compiled kernels per stream; first calls, compiles included, untimed).
Cold L2 (default): each call reads the next of several copies of the layer whose weights
together exceed twice the L2, as between a model's layers; ``--warm_l2`` times one copy.
Accuracy: ``||y - y_bf16||_F / ||y_bf16||_F`` with y_bf16 the BF16 layer's output. torchao's
column follows its NVFP4 recipe (``NVFP4Tensor.to_nvfp4``, dynamic per-tensor scales from
``per_tensor_amax_to_scale``, the product of ``_addmm_nvfp4_dispatch``: a BF16 GEMM output
times the two per-tensor scales rounded to BF16), emulated by dequantizing the block scales
and multiplying in fp32, since its ``_scaled_mm`` path needs Blackwell. ``ours-tao`` is the
distance of the two outputs, ``ours-tao*`` the same with torchao's scale product applied as
fp4_gemm applies it (to the fp32 accumulator, one rounding); ``x!=%``, ``w!=%`` the share of
FP4 codes of x, W that differ: expected where x / (scale * global scale) lies within float32
rounding of an E2M1 tie (one division here, a reciprocal product in torchao).
Only measured numbers are printed; what was not measured says so. On a machine without a GPU
the accuracy columns run on CPU tensors (``fp4_ops``' reference path), no time is measured and
nothing is written unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import math
import os
import subprocess
import sys
import time

from benchmarks import args as cli

M_DEFAULT = (1, 16, 128, 1024, 4096, 8192)
NK_DEFAULT = ((8192, 8192), (7168, 2048), (4096, 7168), (18432, 7168))
M_QUICK = (16, 1024)
NK_QUICK = ((7168, 2048), (4096, 7168))
#: calls per CUDA graph (at least; a multiple of the copies) and replays of it
MIN_CALLS, REPLAYS = 20, 7
#: rows of the batch the static activation scale is calibrated on
CALIB_ROWS = 256
#: the layers, in table order
LAYERS = ("bf16", "w4a4", "w4a4-static", "w4a16")
HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.linear", __doc__)
    p.add_argument("--m", default=None, help="tokens, comma-separated (default: all)")
    p.add_argument("--nk", default=None, help="NxK pairs, comma-separated (default: all)")
    p.add_argument("--quick", action="store_true", help="2 shapes x 2 M; nothing written")
    p.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--warm_l2", action="store_true", help="time one copy of each layer")
    p.add_argument("--out", default=None, help="results path prefix (default results/<gpu>_linear)")
    args = p.parse_args(argv)
    args.out = cli.output_path(p, "--out", args.out)
    m = M_QUICK if args.quick and args.m is None else M_DEFAULT
    if args.m is not None:
        m = cli.positive_ints(p, "--m", args.m, "1,16")
    nk = NK_QUICK if args.quick and args.nk is None else NK_DEFAULT
    if args.nk is not None:
        nk = _pairs(p, args.nk)
    # (the kernels' 32-bit strides; past them the layers could not be built either)
    big = [f"{mm}x{n}x{k}" for n, k in nk for mm in m if max(mm * k, n * k) >= 2**31]
    if big:
        p.error(f"--m / --nk: M x K and N x K must be < 2^31 elements, got {', '.join(big)}")
    args.m, args.nk = list(m), list(nk)
    return args


def _pairs(p: argparse.ArgumentParser, text: str) -> list[tuple[int, int]]:
    """``--nk``'s comma-separated NxK pairs, each once: N positive, K a positive multiple of
    32."""
    pairs = []
    for item in text.split(","):
        try:
            n, k = (int(v) for v in item.split("x"))
        except ValueError:
            p.error(f"--nk takes NxK pairs (8192x8192,7168x2048), got {item!r} in {text!r}")
        if n < 1 or k < 32 or k % 32:
            p.error(f"--nk {item}: N must be positive and K a positive multiple of 32")
        pairs.append((n, k))
    return list(dict.fromkeys(pairs))


def shapes(args) -> list[tuple[int, int, int]]:
    """(M, N, K) in run and table order: every M of one (N, K), then the next (N, K)."""
    return [(m, n, k) for n, k in args.nk for m in args.m]


# ----------------------------------------------------------------------------- cold L2


def l2_copies(one_copy_bytes: int, l2_bytes: int) -> int:
    """The fewest copies of a layer whose weights together exceed twice the L2."""
    return 2 * l2_bytes // one_copy_bytes + 1


def weight_bytes(module) -> int:
    """Bytes of a layer's parameters and buffers (what each call of it reads besides x)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- accuracy


def rel_err(y, ref) -> float:
    """Relative Frobenius error of y against ref, in float32."""
    ref = ref.float()
    return float((y.float() - ref).norm() / ref.norm())


def torchao_nvfp4():
    """(NVFP4Tensor, per_tensor_amax_to_scale) from torchao, or the reason it is unusable."""
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except Exception as err:  # absent, or built for another torch
        return f"absent ({type(err).__name__}: {str(err)[:80]})"
    return NVFP4Tensor, per_tensor_amax_to_scale


def torchao_recipe(x, w, api):
    """torchao's NVFP4 linear y = x @ w.T on any device: (y, y_one_rounding, FP4Tensor of x,
    FP4Tensor of w), both outputs in x's dtype.

    Quantization is torchao's own; y is its ``_addmm_nvfp4_dispatch``'s product, a GEMM of the
    codes times the block scales with fp32 accumulation and a BF16 (x's dtype) result, then
    multiplied by the product of the per-tensor scales cast to x's dtype. y_one_rounding
    applies that product to the fp32 accumulator instead and rounds once, as fp4_gemm does:
    it differs from ours only where the codes do (and by the summation order)."""

    import fp4_ops
    import reference

    nvfp4_tensor, amax_to_scale = api
    parts = []
    for t in (x, w):
        q = nvfp4_tensor.to_nvfp4(t.contiguous(), per_tensor_scale=amax_to_scale(t.abs().amax()))
        parts.append(fp4_ops.FP4Tensor.from_torchao(q))
    qx, qw = parts
    blocks = [reference.dequantize_fp4(q.data, q.plain_scales(), 16) for q in parts]
    acc = blocks[0] @ blocks[1].t()
    scale = qx.global_scale * qw.global_scale
    y = acc.to(x.dtype) * scale.to(x.dtype)
    return y, (acc * scale).to(x.dtype), qx, qw


def _mismatch(ours, theirs) -> float:
    """Share of unequal FP4 codes (nibbles) of two FP4Tensors of the same data."""
    import torch

    import reference

    differ = reference.unpack_fp4(ours.data) != reference.unpack_fp4(theirs.data)
    return float(differ.to(torch.float32).mean())


def accuracy(x, layers: dict, fmt: str, api, outputs: dict | None = None) -> dict:
    """The accuracy columns of one row: each FP4 layer (and torchao's recipe) against the BF16
    layer on x; ``api`` is ``torchao_nvfp4()``'s answer; ``outputs``: the layers' outputs on x
    where already computed (``first_calls``)."""
    import fp4_ops

    if outputs is None:
        outputs = {name: layer(x) for name, layer in layers.items()}
    y_bf16 = outputs["bf16"]
    row = {f"rel_err_{name}": None for name in LAYERS[1:]}
    for name in LAYERS[1:]:
        if name in layers:
            row[f"rel_err_{name}"] = rel_err(outputs[name], y_bf16)
    keys = ("rel_err_torchao", "ours_vs_torchao", "ours_vs_torchao_one_rounding")
    row.update({key: None for key in (*keys, "codes_differ_x", "codes_differ_w")})
    if fmt == "nvfp4" and not isinstance(api, str):
        y_tao, y_one, qx, qw = torchao_recipe(x, layers["bf16"].weight.detach(), api)
        ref_norm = y_bf16.float().norm()
        row["rel_err_torchao"] = rel_err(y_tao, y_bf16)
        for key, y in zip(keys[1:], (y_tao, y_one), strict=True):
            row[key] = float((outputs["w4a4"].float() - y.float()).norm() / ref_norm)
        row["codes_differ_x"] = _mismatch(fp4_ops.quantize(x, fmt), qx)
        row["codes_differ_w"] = _mismatch(layers["w4a4"].weight, qw)
    return row


# ----------------------------------------------------------------------------- layers


def build_layers(m, n, k, fmt, device, notes: list) -> tuple:
    """(x, {name: layer}) for one shape: the BF16 layer and the FP4 ones made from it; a layer
    the library cannot make is left out with a note."""
    import torch

    import fp4_ops

    gen = torch.Generator(device=device).manual_seed(m * 131 + n * 7 + k)
    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    calib = torch.randn(CALIB_ROWS, k, device=device, generator=gen).to(torch.bfloat16)
    torch.manual_seed(n * 7 + k)
    linear = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    linear.requires_grad_(False)
    layers = {"bf16": linear, "w4a4": fp4_ops.FP4Linear.from_linear(linear, fmt)}
    if fmt == "nvfp4":
        scale = calib.abs().amax().float() / fp4_ops.GLOBAL_SCALE_DIVISOR
        layers["w4a4-static"] = fp4_ops.FP4Linear.from_linear(linear, fmt, "static", scale)
    try:
        layers["w4a16"] = fp4_ops.FP4Linear.from_linear(linear, fmt, activations="bf16")
    except Exception as err:  # (optional: a library without W4A16 raises here)
        _note(
            notes,
            "w4a16 not measured: FP4Linear.from_linear(activations='bf16') raised "
            f"{type(err).__name__}: {err}",
        )
    return x, layers


def _note(notes: list, text: str) -> None:
    """Add a note for the table's footer, once."""
    if text not in notes:
        notes.append(text)


def first_calls(x, layers: dict, notes: list) -> tuple[dict, dict]:
    """Run each layer once (compiles, workspaces): (the seconds each took, its output); a layer
    whose first call raises is dropped with a note (the optional W4A16 path only)."""
    import torch

    seconds, outputs = {}, {}
    for name in list(layers):
        start = time.perf_counter()
        try:
            outputs[name] = layers[name](x)
        except Exception as err:
            if name != "w4a16":
                raise
            _note(notes, f"w4a16 not measured: its first call raised {type(err).__name__}: {err}")
            del layers[name]
            continue
        if x.is_cuda:
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    return seconds, outputs


# ----------------------------------------------------------------------------- timing


def time_graph_us(calls, stream, min_calls: int = MIN_CALLS, replays: int = REPLAYS) -> float:
    """Median microseconds per call: ``calls`` cycled through one CUDA graph of at least
    ``min_calls`` calls (a whole number of cycles) on ``stream``, replayed ``replays`` times."""
    import torch

    reps = len(calls) * math.ceil(min_calls / len(calls))
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up, on the capturing stream
            call()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(reps):
                calls[i % len(calls)]()
        graph.replay()
        times = []
        for _ in range(replays):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
    del graph
    return sorted(times)[len(times) // 2]


def time_layers(x, layers: dict, l2_bytes: int | None, stream) -> dict:
    """Microseconds per call of each layer and the copies it rotated through (``l2_bytes`` None:
    one copy, warm L2)."""
    import torch

    row = {}
    for name, layer in layers.items():
        copies = 1 if l2_bytes is None else l2_copies(weight_bytes(layer), l2_bytes)
        instances = [layer] + [copy.deepcopy(layer) for _ in range(copies - 1)]
        calls = [lambda inst=inst: inst(x) for inst in instances]
        row[f"us_{name}"] = time_graph_us(calls, stream)
        row[f"copies_{name}"] = copies
        del instances, calls
        torch.cuda.empty_cache()
    return row


def make_timer(device, args):
    """(stream, timer) on a GPU, (None, None) without one: ``timer(x, layers)`` is
    ``time_layers`` on that one stream, which the accuracy pass uses too (the library keeps its
    compiled kernels per stream)."""
    import torch

    if device.type != "cuda":
        return None, None
    stream = torch.cuda.Stream(device)
    l2 = None if args.warm_l2 else torch.cuda.get_device_properties(device).L2_cache_size
    return stream, functools.partial(time_layers, l2_bytes=l2, stream=stream)


def bench_row(m, n, k, args, device, api, notes: list, timer=None) -> dict:
    """One table row: accuracy on ``device``, then times if there is a ``timer``."""
    x, layers = build_layers(m, n, k, args.format, device, notes)
    row = {"m": m, "n": n, "k": k, "format": args.format}
    row["first_call_s"], outputs = first_calls(x, layers, notes)
    row.update(accuracy(x, layers, args.format, api, outputs))
    for name in LAYERS:
        row[f"us_{name}"] = row[f"copies_{name}"] = None
    if timer is not None:
        row.update(timer(x, layers))
    for name in LAYERS[1:]:
        ours, bf16 = row[f"us_{name}"], row["us_bf16"]
        row[f"ratio_{name}"] = None if ours is None or bf16 is None else ours / bf16
    return row


# ----------------------------------------------------------------------------- environment


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def driver_version() -> str:
    """The NVIDIA driver's version from nvidia-smi, else the CUDA driver API's, else unknown."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if int(err) == 0:
            return f"unknown (CUDA driver API {version // 1000}.{version % 1000 // 10})"
    except Exception:  # (cuda-bindings absent or too old)
        pass
    return "unknown"


def environment(device, api) -> dict:
    """Date, GPU and versions, recorded with every result."""
    import torch

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": None,
        "capability": None,
        "l2_bytes": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"),
        "torchao": api if isinstance(api, str) else _dist_version("torchao"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}")
        env.update(l2_bytes=props.L2_cache_size, driver=driver_version())
    return env


# ----------------------------------------------------------------------------- output


def _cell(value, spec: str, width: int) -> str:
    return f"{'n/m' if value is None else format(value, spec):>{width}}"


def header_lines(env: dict, args) -> list[str]:
    if env["gpu"] is None:
        where = f"no CUDA GPU, {env['date']}: accuracy only (CPU tensors), no time measured"
        cache = ""
    else:
        where = (
            f"{env['gpu']} ({env['capability']}), {env['date']}, driver {env['driver']}, "
            f"CUDA {env['cuda']}"
        )
        l2 = env["l2_bytes"] / 2**20
        cache = (
            "; warm L2 (one copy of each layer)"
            if args.warm_l2
            else f"; cold L2 (each call reads the next of copies > 2 x the {l2:.0f} MiB L2)"
        )
    versions = (
        f"torch {env['torch']}, nvidia-cutlass-dsl {env['nvidia-cutlass-dsl']}, "
        f"torchao {env['torchao']}"
    )
    title = f"W4A4 FP4Linear (quantize x + fp4_gemm) vs BF16 F.linear, {args.format}{cache}"
    head = (
        f"{'M':>5} {'N':>6} {'K':>6} | {'bf16 us':>8} | {'w4a4 us':>8} {'ratio':>6} | "
        f"{'static us':>9} {'ratio':>6} | {'w4a16 us':>8} {'ratio':>6} | {'err w4a4':>8} "
        f"{'err static':>10} {'err torchao':>11} {'ours-tao':>8} {'ours-tao*':>9} {'x!=%':>6} "
        f"{'w!=%':>6} | {'err w4a16':>9}"
    )
    return [title, where, versions, head, "-" * len(head)]


def format_row(row: dict) -> str:
    def pct(v):
        return None if v is None else 100 * v

    return (
        f"{row['m']:>5} {row['n']:>6} {row['k']:>6} | {_cell(row['us_bf16'], '.1f', 8)} | "
        f"{_cell(row['us_w4a4'], '.1f', 8)} {_cell(row['ratio_w4a4'], '.2f', 6)} | "
        f"{_cell(row['us_w4a4-static'], '.1f', 9)} {_cell(row['ratio_w4a4-static'], '.2f', 6)} | "
        f"{_cell(row['us_w4a16'], '.1f', 8)} {_cell(row['ratio_w4a16'], '.2f', 6)} | "
        f"{_cell(row['rel_err_w4a4'], '.4f', 8)} {_cell(row['rel_err_w4a4-static'], '.4f', 10)} "
        f"{_cell(row['rel_err_torchao'], '.4f', 11)} {_cell(row['ours_vs_torchao'], '.4f', 8)} "
        f"{_cell(row['ours_vs_torchao_one_rounding'], '.4f', 9)} "
        f"{_cell(pct(row['codes_differ_x']), '.3f', 6)} "
        f"{_cell(pct(row['codes_differ_w']), '.3f', 6)} | {_cell(row['rel_err_w4a16'], '.4f', 9)}"
    )


def footer_lines(rows: list, notes: list, run_s: float) -> list[str]:
    first = sum(sum(r["first_call_s"].values()) for r in rows)
    return [
        "ratio: our time / F.linear's (below 1: faster); us: median per call of CUDA graphs of "
        f">= {MIN_CALLS} calls",
        "err: ||y - y_bf16||_F / ||y_bf16||_F, y_bf16 the BF16 layer's output on the same x; "
        f"static: activation scale calibrated on {CALIB_ROWS} other rows",
        "torchao: its NVFP4 recipe, GEMM emulated; ours-tao: ||y_w4a4 - y_torchao||_F / "
        "||y_bf16||_F; ours-tao*: the same with torchao's",
        "per-tensor scales applied to its fp32 accumulator in fp32 (ours: one rounding) instead "
        "of to its BF16 output in BF16; x!=%, w!=%: FP4 codes of x, W unlike torchao's",
        f"run: {run_s:.0f} s, of which first calls (compiles included, not timed) {first:.1f} s; "
        "n/m: not measured",
        *(f"note: {n}" for n in notes),
    ]


def format_table(rows: list, env: dict, args, notes: list, run_s: float) -> str:
    lines = header_lines(env, args) + [format_row(r) for r in rows]
    lines += footer_lines(rows, notes, run_s)
    return "\n".join(lines)


def results_json(rows: list, env: dict, args, notes: list, run_s: float) -> dict:
    settings = {
        "format": args.format,
        "cold_l2": not args.warm_l2,
        "min_calls": MIN_CALLS,
        "replays": REPLAYS,
        "calib_rows": CALIB_ROWS,
    }
    return {"environment": env, "settings": settings, "run_s": run_s, "notes": notes, "rows": rows}


def plot(rows: list, env: dict, path: str) -> None:
    """Time ratio (ours / F.linear) against M, one colour per (N, K), one style per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"w4a4": "-", "w4a4-static": ":", "w4a16": "--"}
    nks = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    for i, (n, k) in enumerate(nks):
        for name, style in styles.items():
            pts = [
                (r["m"], r[f"ratio_{name}"])
                for r in rows
                if (r["n"], r["k"]) == (n, k) and r[f"ratio_{name}"] is not None
            ]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    style,
                    marker="o",
                    color=f"C{i}",
                    label=f"{name} N={n} K={k}",
                )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ms = sorted({r["m"] for r in rows})
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("time / BF16 F.linear time")
    ax.set_title(f"FP4Linear vs F.linear, {env['gpu']}, {env['date']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    api = torchao_nvfp4()
    env = environment(device, api)
    notes: list[str] = []
    if args.format != "nvfp4":
        notes.append("w4a4-static and torchao: NVFP4 only (MXFP4 has no global scale)")
    elif isinstance(api, str):
        notes.append(f"torchao {api}: its columns not measured")
    stream, timer = make_timer(device, args)
    print("\n".join(header_lines(env, args)), flush=True)
    rows = []
    for m, n, k in shapes(args):
        try:
            with torch.cuda.stream(stream):  # (None: no-op)
                row = bench_row(m, n, k, args, device, api, notes, timer)
        except ValueError as err:  # e.g. a GPU the library has no kernel for
            print(f"error: {err}", file=sys.stderr)
            return 2
        rows.append(row)
        print(format_row(row), flush=True)
    label = cli.gpu_label(env["gpu"])
    default = os.path.join(os.path.dirname(HERE), "results", f"{label}_linear")
    out = args.out or (None if args.quick or device.type != "cuda" else default)
    timed = any(r["us_bf16"] is not None for r in rows)
    if out and not timed:
        notes.append("no PNG: no time was measured")
    run_s = time.perf_counter() - start
    print("\n".join(footer_lines(rows, notes, run_s)))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out + ".txt", "w") as f:
            f.write(format_table(rows, env, args, notes, run_s) + "\n")
        with open(out + ".json", "w") as f:
            json.dump(results_json(rows, env, args, notes, run_s), f, indent=1)
        if timed:
            plot(rows, env, out + ".png")
        print(f"wrote {out}.txt, {out}.json" + (f", {out}.png" if timed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
