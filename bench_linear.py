# SPDX-License-Identifier: BSD-3-Clause
"""W4A4 linear layer (fp4_ops.FP4Linear: quantize the activations + fp4_gemm) against BF16
``F.linear`` on the GPU, with the accuracy of both FP4 recipes (ours, torchao's NVFP4) against
the BF16 layer on the same inputs and weights.

    python bench_linear.py                                  # every M and (N, K) below
    python bench_linear.py --m 16,4096 --nk 8192x8192 --json linear.json --png linear.png

Times come from CUDA graphs of many calls (``quantize_fp4.time_graph_us``); with ``--cold_l2``
the calls rotate through enough copies of the weights (and activations) to exceed twice the L2.
Accuracy: ``||y - y_bf16|| / ||y_bf16||`` (Frobenius) with y_bf16 the BF16 layer's output;
torchao's column dequantizes its NVFP4Tensors of the same x and W and multiplies in fp32.
Only measured numbers are printed; what could not be measured says so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

M_DEFAULT = (1, 16, 128, 1024, 4096, 8192)
NK_DEFAULT = ((8192, 8192), (7168, 2048), (4096, 7168), (18432, 7168))
L2_BYTES = 60 * 2**20


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default=",".join(map(str, M_DEFAULT)))
    p.add_argument("--nk", default=",".join(f"{n}x{k}" for n, k in NK_DEFAULT))
    p.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4")
    p.add_argument("--cold_l2", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    args = p.parse_args(argv)
    try:
        args.m = [int(v) for v in args.m.split(",")]
        args.nk = [tuple(int(v) for v in s.split("x")) for s in args.nk.split(",")]
    except ValueError:
        args.m = args.nk = None
    ok = args.m and args.nk and min(args.m) >= 1 and all(len(t) == 2 for t in args.nk)
    if not ok or any(k % 32 or n < 1 for n, k in args.nk):
        p.error("--m takes positive ints, --nk NxK pairs with K % 32 == 0")
    return args


def _rel_err(y, ref) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def _torchao_err(x, w, y_ref) -> float | None:
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    except Exception:  # (absent, or built for another torch)
        return None
    import torch

    def q(t):
        scale = per_tensor_amax_to_scale(t.abs().amax().float())
        return NVFP4Tensor.to_nvfp4(t, per_tensor_scale=scale).dequantize(torch.float32)

    return _rel_err(q(x) @ q(w).t(), y_ref)


def measure(m, n, k, fmt, cold_l2):
    import torch
    import torch.nn.functional as F

    import fp4_ops
    from quantize_fp4 import time_graph_us

    gen = torch.Generator(device="cuda").manual_seed(m * 131 + n * 7 + k)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = fp4_ops.FP4Linear.from_linear(linear, fmt)
    y_bf16 = F.linear(x, linear.weight)
    row = {"m": m, "n": n, "k": k, "format": fmt}
    row["rel_err_fp4"] = _rel_err(layer(x), y_bf16)
    row["rel_err_torchao"] = _torchao_err(x, linear.weight, y_bf16) if fmt == "nvfp4" else None
    copies = max(1, math.ceil(2 * L2_BYTES / (n * k // 2))) if cold_l2 else 1
    layers = [layer] + [fp4_ops.FP4Linear.from_linear(linear, fmt) for _ in range(copies - 1)]
    bf16_copies = max(1, math.ceil(2 * L2_BYTES / (2 * n * k))) if cold_l2 else 1
    weights = [linear.weight] + [linear.weight.clone() for _ in range(bf16_copies - 1)]
    state = {"i": 0, "j": 0}

    def fp4_call():
        state["i"] = (state["i"] + 1) % len(layers)
        layers[state["i"]](x)

    def bf16_call():
        state["j"] = (state["j"] + 1) % len(weights)
        F.linear(x, weights[state["j"]])

    iterations = max(len(layers), len(weights), 20)
    row["us_fp4"] = time_graph_us(fp4_call, iterations=iterations)
    row["us_bf16"] = time_graph_us(bf16_call, iterations=iterations)
    return row


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "error: bench_linear.py needs a CUDA GPU (sm_90 or the sm_100 family)", file=sys.stderr
        )
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; format {args.format}")
    print(
        f"{'M':>6} {'N':>6} {'K':>6} {'bf16 us':>9} {'fp4 us':>9} {'speedup':>8} "
        f"{'err fp4':>9} {'err torchao':>11}"
    )
    rows = []
    for n, k in args.nk:
        for m in args.m:
            r = measure(m, n, k, args.format, args.cold_l2)
            rows.append(r)
            tao = "not run" if r["rel_err_torchao"] is None else f"{r['rel_err_torchao']:.4f}"
            print(
                f"{m:>6} {n:>6} {k:>6} {r['us_bf16']:>9.2f} {r['us_fp4']:>9.2f} "
                f"{r['us_bf16'] / r['us_fp4']:>8.2f} {r['rel_err_fp4']:>9.4f} {tao:>11}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "cold_l2": args.cold_l2,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for n, k in args.nk:
            pts = [(r["m"], r["us_bf16"] / r["us_fp4"]) for r in rows if (r["n"], r["k"]) == (n, k)]
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"N={n}, K={k}")
        ax.set(xscale="log", xlabel="M (tokens)", ylabel="BF16 time / W4A4 time")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.legend()
        fig.savefig(args.png, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
