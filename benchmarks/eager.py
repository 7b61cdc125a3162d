# SPDX-License-Identifier: BSD-3-Clause
"""Eager (no CUDA graph) cost of one call, as a model run without compilation pays it:

    python -m benchmarks.eager                  # the shapes below, on the current GPU
    python -m benchmarks.eager --calls 50

For each shape M x N x K it prints two figures per call: host time (enqueueing ``calls`` calls
while a sleep kernel holds the GPU, so that no call waits for the GPU or for a full launch
queue: the host's own cost) and wall time (``calls`` calls after a warm-up, up to the GPU
finishing them), medians of 5 rounds that each time every row in turn. Rows: BF16
``F.linear``; ``FP4Linear`` W4A16 and W4A4 (activation quantization included; dynamic and
static ("st") activation scales); ``fp4_gemm`` on operands quantized beforehand; and
``quantize`` (dynamic, and with a static CUDA global scale) beside ``torch.empty_like`` plus one
elementwise op. Ratios are host times against ``F.linear``'s (quantize: against the
empty_like + op pair).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fp4_ops
from benchmarks import args as cli

SHAPES = ((1, 8192, 8192), (16, 8192, 8192), (1, 4096, 4096))


def time_rows(fns: dict, calls: int, rounds: int = 5) -> dict[str, tuple[float, float]]:
    """name -> (host us per call, wall us per call) of ``fns``' calls: medians over ``rounds``
    rounds, each timing every row once in turn (so that a slow phase of the host falls on all
    rows alike); host: ``calls`` calls enqueued behind a sleep kernel long enough to cover them
    (RuntimeError if the GPU caught up, which would make it a GPU time); wall: ``calls`` calls
    up to the GPU finishing them."""
    for fn in fns.values():  # (the first call of a shape compiles and leaves its plan)
        fn()
        fn()
    torch.cuda.synchronize()
    host = {name: [] for name in fns}
    wall = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda._sleep(SLEEP_CYCLES)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            host[name].append((time.perf_counter() - start) / calls * 1e6)
            if torch.cuda.current_stream().query():
                raise RuntimeError("the GPU finished its sleep before the calls were enqueued")
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            wall[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: (statistics.median(host[name]), statistics.median(wall[name])) for name in fns}


# (about 0.1 s of GPU clock cycles: longer than enqueueing any row's calls)
SLEEP_CYCLES = 200_000_000


def rows_for(m: int, n: int, k: int, calls: int) -> list[tuple[str, float, float]]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    w16 = fp4_ops.FP4Linear.from_linear(linear, activations="bf16")
    w4 = fp4_ops.FP4Linear.from_linear(linear)
    gs = torch.full((), 0.01, device="cuda")
    w4s = fp4_ops.FP4Linear.from_linear(linear, activations="static", input_global_scale=gs)
    a, b = fp4_ops.quantize(x), w4.weight
    fns = {
        "F.linear (BF16)": lambda: F.linear(x, linear.weight),
        "FP4Linear W4A16": lambda: w16(x),
        "FP4Linear W4A4": lambda: w4(x),
        "FP4Linear W4A4 st": lambda: w4s(x),
        "fp4_gemm W4A4": lambda: fp4_ops.fp4_gemm(a, b),
        "quantize": lambda: fp4_ops.quantize(x),
        "quantize static": lambda: fp4_ops.quantize(x, global_scale=gs),
        "empty_like + mul": lambda: torch.empty_like(x).mul_(2),
    }
    with torch.inference_mode():
        times = time_rows(fns, calls)
    return [(name, *times[name]) for name in fns]


def main(argv=None) -> int:
    p = cli.parser("benchmarks.eager", __doc__)
    p.add_argument(
        "--calls", type=int, default=100, help="calls per timed run (default 100, at most 150)"
    )
    args = p.parse_args(argv)
    if not 1 <= args.calls <= 150:
        # (more would fill the GPU's launch queue behind the sleep: the host would wait)
        print("error: --calls must be 1 .. 150", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: benchmarks.eager needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.calls} calls a run")
    print(f"{'shape':>18} {'call':<18} {'host us':>8} {'wall us':>8} {'host / base':>11}")
    for m, n, k in SHAPES:
        rows = rows_for(m, n, k, args.calls)
        base = {name: host for name, host, _ in rows}
        for name, host, wall in rows:
            quantizing = name.startswith("quantize") or name == "empty_like + mul"
            ref = base["empty_like + mul"] if quantizing else base["F.linear (BF16)"]
            print(f"{f'{m}x{n}x{k}':>18} {name:<18} {host:8.1f} {wall:8.1f} {host / ref:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
