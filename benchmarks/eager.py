# SPDX-License-Identifier: BSD-3-Clause
"""Eager (no CUDA graph) cost of one call, as a model run without compilation pays it:

    python -m benchmarks.eager                  # the shapes below, on the current GPU
    python -m benchmarks.eager --calls 500

For each shape M x N x K it times ``calls`` back-to-back calls after a warm-up and prints two
figures per call: host time (enqueueing the calls, nothing synchronised) and wall time (the
same calls up to the GPU finishing them). Rows: BF16 ``F.linear``; ``FP4Linear`` W4A16 and W4A4
(activation quantization included); ``fp4_gemm`` on operands quantized beforehand; and
``quantize`` beside ``torch.empty_like`` plus one elementwise op. Ratios are host times against
``F.linear``'s (quantize: against the empty_like + op pair).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import fp4_ops

SHAPES = ((1, 8192, 8192), (16, 8192, 8192), (1, 4096, 4096))


def time_calls(fn, calls: int, repeats: int = 5) -> tuple[float, float]:
    """(host us per call, wall us per call), medians over ``repeats`` runs of ``calls`` calls."""
    fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        host.append((enqueued - start) / calls * 1e6)
        wall.append((done - start) / calls * 1e6)
    return sorted(host)[len(host) // 2], sorted(wall)[len(wall) // 2]


def rows_for(m: int, n: int, k: int, calls: int) -> list[tuple[str, float, float]]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    w16 = fp4_ops.FP4Linear.from_linear(linear, activations="bf16")
    w4 = fp4_ops.FP4Linear.from_linear(linear)
    a, b = fp4_ops.quantize(x), w4.weight
    out = []
    with torch.inference_mode():
        out.append(("F.linear (BF16)", *time_calls(lambda: F.linear(x, linear.weight), calls)))
        out.append(("FP4Linear W4A16", *time_calls(lambda: w16(x), calls)))
        out.append(("FP4Linear W4A4", *time_calls(lambda: w4(x), calls)))
        out.append(("fp4_gemm W4A4", *time_calls(lambda: fp4_ops.fp4_gemm(a, b), calls)))
        out.append(("quantize", *time_calls(lambda: fp4_ops.quantize(x), calls)))
        out.append(("empty_like + mul", *time_calls(lambda: torch.empty_like(x).mul_(2), calls)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200, help="calls per timed run (default 200)")
    args = p.parse_args(argv)
    if args.calls < 1:
        print("error: --calls must be >= 1", file=sys.stderr)
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
            quantizing = name in ("quantize", "empty_like + mul")
            ref = base["empty_like + mul"] if quantizing else base["F.linear (BF16)"]
            print(f"{f'{m}x{n}x{k}':>18} {name:<18} {host:8.1f} {wall:8.1f} {host / ref:10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
