"""The eager layer paths for compute-sanitizer: FP4Linear, quantize and fp4_gemm called the way
an eager model calls them (first call of a shape through the registered ops, later calls through
the planned launches, W4A4 decode's quantizer grid and GEMM from one host call), over the shapes
where memory bugs hide: one and a few tokens, a ragged token tile, an x past the one-grid
quantizer's size, prefill, K not a multiple of 64, N not a multiple of the tile.

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 \\
        python -m tools.sanitize_layers

(also ``--tool racecheck`` and ``--tool synccheck``; ``--report-api-errors no`` as in
``tools.sanitize_moe``). Each call must give finite values; their correctness is the GPU tests'
subject, not this driver's.
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp4_ops

#: (out_features, in_features): K a multiple of 64, and one of 32 only
SHAPES = ((384, 256), (200, 288))
#: (format, activations)
LAYERS = (("nvfp4", "bf16"), ("nvfp4", "dynamic"), ("nvfp4", "static"), ("mxfp4", "bf16"))
#: tokens: decode tiles, a ragged tail, an x over 32 KB (two quantizer grids), prefill (> 2048)
TOKENS = (1, 3, 37, 300, 2100)
#: calls per shape: the first goes through the registered ops, the later ones through the plan
CALLS = 3


def _layer(fmt: str, activations: str, n: int, k: int, gen: torch.Generator):
    linear = torch.nn.Linear(k, n, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        linear.bias.copy_(torch.randn(n, generator=gen))
    scale = 4.0 / (448 * 6) if activations == "static" else None
    return fp4_ops.FP4Linear.from_linear(linear.cuda(), fmt, activations, scale)


def run_layers(gen: torch.Generator) -> bool:
    ok = True
    for fmt, activations in LAYERS:
        for n, k in SHAPES:
            layer = _layer(fmt, activations, n, k, gen)
            for tokens in TOKENS:
                x = torch.randn(tokens, k, generator=gen).to(torch.bfloat16).cuda()
                finite = all(bool(torch.isfinite(layer(x)).all()) for _ in range(CALLS))
                ok &= finite
                print(f"FP4Linear {fmt} {activations} {tokens} x {n} x {k}: finite {finite}")
    return ok


def run_ops(gen: torch.Generator) -> bool:
    ok = True
    for n, k in SHAPES:
        w = fp4_ops.quantize(torch.randn(n, k, generator=gen).to(torch.bfloat16).cuda())
        for tokens in TOKENS:
            x = torch.randn(tokens, k, generator=gen).to(torch.bfloat16).cuda()
            finite = True
            for _ in range(CALLS):
                a = fp4_ops.quantize(x)
                ys = (a.global_scale, fp4_ops.fp4_gemm(a, w), fp4_ops.fp4_gemm(x, w))
                finite &= all(bool(torch.isfinite(y).all()) for y in ys)
            ok &= finite
            print(f"quantize + fp4_gemm {tokens} x {n} x {k}: finite {finite}")
    return ok


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "error: tools.sanitize_layers runs the GPU paths: it needs a CUDA GPU", file=sys.stderr
        )
        return 2
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        ok = run_layers(gen) & run_ops(gen)
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
