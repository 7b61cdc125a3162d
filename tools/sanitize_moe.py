"""The MoE layer's GPU paths for compute-sanitizer: FP4MoE forwards and grouped GEMMs over the
shapes where memory bugs hide (one and a few tokens, a tail of tokens, an expert in every
token's top-k, empty experts first, between and last, one group taking every row, K splits).

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 \\
        python -m tools.sanitize_moe

(also ``--tool racecheck`` and ``--tool synccheck``; ``--report-api-errors no`` because torch
probes driver symbols that the driver lacks, which the sanitizer counts as API errors). Each call
must give finite values; their correctness is the GPU tests' subject, not this driver's.
"""

from __future__ import annotations

import argparse
import sys

import torch

import fp4_ops
from fp4_ops import moe

EXPERTS, HIDDEN, INTERMEDIATE = 12, 256, 128
#: (format, activation, activations, top-k, biases)
LAYERS = [
    ("nvfp4", "silu", "bf16", 4, False),
    ("nvfp4", "silu", "dynamic", 4, False),
    ("mxfp4", "swigluoai", "bf16", 2, True),
    ("mxfp4", "swigluoai", "dynamic", 2, True),
]
TOKENS = (1, 3, 37, 300)
#: tokens per group of grouped GEMMs: empty groups first, between and last; one taking all
GROUPS = ([0, 5, 0, 7, 0, 0, 9, 0, 0, 3, 0, 0], [0] * 6 + [40] + [0] * 5)
#: 1-3 rows over experts of SPLIT_NK, where the pick splits K (2 rows: beside K groups)
SPLIT_NK = (1024, 4096)
SPLIT_GROUPS = ([0] * 5 + [1] + [0] * 6, [0, 1] + [0] * 8 + [1, 0], [1, 0, 0, 1] + [0] * 7 + [1])


def _experts(fmt: str, n: int, k: int, gen: torch.Generator):
    w = torch.randn(EXPERTS, n, k, generator=gen) * 0.05
    return moe.quantize_experts(w.to(torch.bfloat16).cuda(), fmt)


def _routing(tokens: int, k: int, skew: bool, gen: torch.Generator) -> torch.Tensor:
    """topk ids [T, k]; ``skew``: expert 3 in every token's first slot, experts 0-2 in none."""
    if not skew:
        return torch.randint(0, EXPERTS, (tokens, k), generator=gen, dtype=torch.int32)
    ids = torch.randint(4, EXPERTS, (tokens, k), generator=gen, dtype=torch.int32)
    ids[:, 0] = 3
    return ids


def run_layers(gen: torch.Generator) -> bool:
    ok = True
    for case, (fmt, activation, activations, k, biases) in enumerate(LAYERS):
        w13 = _experts(fmt, 2 * INTERMEDIATE, HIDDEN, gen)
        w2 = _experts(fmt, HIDDEN, INTERMEDIATE, gen)
        b13 = torch.randn(EXPERTS, 2 * INTERMEDIATE, generator=gen).cuda() if biases else None
        b2 = torch.randn(EXPERTS, HIDDEN, generator=gen).cuda() if biases else None
        for i, tokens in enumerate(TOKENS):
            x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16).cuda()
            ids = _routing(tokens, k, skew=(i + case) % 2 == 1, gen=gen).cuda()
            weights = torch.softmax(torch.randn(tokens, k, generator=gen), -1).cuda()
            y = fp4_ops.fp4_moe(
                x,
                w13,
                w2,
                weights,
                ids,
                activation,
                w13_bias=b13,
                w2_bias=b2,
                activations=activations,
            )
            finite = bool(torch.isfinite(y).all())
            ok &= finite
            print(f"fp4_moe {fmt} {activation} {activations} T={tokens} k={k}: finite {finite}")
    return ok


def run_grouped(gen: torch.Generator) -> bool:
    ok = True
    small = _experts("nvfp4", 192, 256, gen)
    wide = _experts("nvfp4", *SPLIT_NK, gen)
    for b, counts in [*((small, c) for c in GROUPS), *((wide, c) for c in SPLIT_GROUPS)]:
        offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
        a = torch.randn(sum(counts), b.shape[-1], generator=gen).to(torch.bfloat16).cuda()
        for operand in (a, fp4_ops.quantize(a, "nvfp4")):
            d = fp4_ops.fp4_grouped_gemm(operand, b, offsets.cuda(), out_dtype=torch.bfloat16)
            finite = bool(torch.isfinite(d).all())
            ok &= finite
            print(f"fp4_grouped_gemm {type(operand).__name__} groups {counts}: finite {finite}")
    return ok


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print("error: tools.sanitize_moe runs the GPU paths: it needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    ok = run_layers(gen) & run_grouped(gen)
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
