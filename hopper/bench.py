# SPDX-License-Identifier: BSD-3-Clause
"""Benchmark of the Hopper FP4 GEMM (blockwise_gemm_fp4_sm90.py) against its peers: same run,
same process, same data, on an H100 / H200.

Methods (time per GEMM, inputs rotated through enough copies to exceed 3x the L2, CUDA-graph
replays so launch gaps do not count):
    ours-nvfp4       this kernel on NVFP4 operands (packed A, B + 128x4 blocked E4M3 scales)
    ours-mxfp4       this kernel on MXFP4 operands (E8M0 scales)
    cublas-bf16      torch.matmul on BF16 operands dequantized beforehand (not timed)
    triton-dq+cublas a fused Triton dequant kernel (packed FP4 + row-major scales -> BF16, both
                     operands, every call) followed by torch.matmul
    torch-dq+cublas  the same dequantization with plain torch ops, then torch.matmul
    cublas-fp8       torch._scaled_mm, E4M3 operands with per-row / per-column fp32 scales
                     (different numerics: a peer for speed, not for the result)
    triton-dot_scaled tl.dot_scaled(e2m1, e8m0) on the MXFP4 operands (software-emulated on sm_90)
Columns for ours: us, TFLOP/s, GB/s and % of the HBM roof, where the roof is the copy bandwidth
(bytes read + written by a large device-to-device copy) measured in the same run and the bytes
are packed A and B, their scales and D, each moved once.

    python -m hopper.bench           # all shapes -> hopper/results/h200.{txt,json,png} on an H200
    python -m hopper.bench --quick   # four shapes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import torch

import reference
from hopper import blockwise_gemm_fp4_sm90 as k90

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [(m, 8192, 8192) for m in (1, 16, 128, 1024, 4096, 8192)] + [
    (m, n, k)
    for m in (16, 4096)
    for n, k in ((7168, 2048), (4096, 7168), (18432, 7168), (7168, 16384))
]
QUICK = [(1, 8192, 8192), (16, 8192, 8192), (4096, 8192, 8192), (16, 7168, 2048)]
METHODS = (
    "ours-nvfp4",
    "ours-mxfp4",
    "cublas-bf16",
    "triton-dq+cublas",
    "torch-dq+cublas",
    "cublas-fp8",
    "triton-dot_scaled",
)


# ------------------------------------------------------------------------------------- timing
def copy_bandwidth() -> float:
    """Bytes read + written per second by a 4 GiB device-to-device copy (median of 10)."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del src, dst
    return 2 * (2 << 30) / sorted(times[2:])[len(times[2:]) // 2]


def time_graph(calls, reps: int = 20, replays: int = 7) -> float:
    """Median seconds per call: ``reps`` calls (cycling over ``calls``) captured in one CUDA
    graph, replayed ``replays`` times."""
    for c in calls:  # warm-up: compilation, allocations, split-K workspace
        c()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(reps):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3 / reps)
    return sorted(times)[len(times) // 2]


# ------------------------------------------------------------------------------------- peers
try:  # Triton is optional: without it, its two peers are reported as not measured
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:

    @triton.jit
    def _e2m1(c):
        mag = c & 7
        e = (mag >> 1).to(tl.float32)
        m = (mag & 1).to(tl.float32)
        v = tl.where(e == 0.0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2(e - 1.0))
        return tl.where((c & 8) != 0, -v, v)

    @triton.jit
    def _dequant_fp4(
        packed_ptr,
        scale_ptr,
        out_ptr,
        rows,
        k,
        VEC: tl.constexpr,
        E8M0: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # packed [rows, k/2] uint8, scales [rows, k/VEC] (row-major), out [rows, k] bf16
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cb = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        mask = (r[:, None] < rows) & (cb[None, :] < k // 2)
        p = tl.load(packed_ptr + r[:, None] * (k // 2) + cb[None, :], mask=mask, other=0)
        s = tl.load(
            scale_ptr + r[:, None] * (k // VEC) + cb[None, :] // (VEC // 2), mask=mask, other=0
        )
        if E8M0:
            sf = tl.exp2(s.to(tl.float32) - 127.0)
        else:
            sf = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        lo = _e2m1(p & 0xF) * sf
        hi = _e2m1(p >> 4) * sf
        out = tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_K))
        oc = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        omask = (r[:, None] < rows) & (oc[None, :] < k)
        tl.store(out_ptr + r[:, None] * k + oc[None, :], out.to(tl.bfloat16), mask=omask)

    @triton.jit
    def _mxfp4_dot_scaled(
        a_ptr,
        b_ptr,
        as_ptr,
        bs_ptr,
        c_ptr,
        m,
        n,
        k,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # a [m, k/2], b [n, k/2] packed e2m1; as [m, k/32], bs [n, k/32] e8m0; c [m, n] bf16
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        kb = tl.arange(0, BLOCK_K // 2)
        ks = tl.arange(0, BLOCK_K // 32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, k, BLOCK_K):
            a = tl.load(
                a_ptr + rm[:, None] * (k // 2) + (k0 // 2 + kb)[None, :],
                mask=rm[:, None] < m,
                other=0,
            )
            b = tl.load(
                b_ptr + rn[None, :] * (k // 2) + (k0 // 2 + kb)[:, None],
                mask=rn[None, :] < n,
                other=0,
            )
            sa = tl.load(
                as_ptr + rm[:, None] * (k // 32) + (k0 // 32 + ks)[None, :],
                mask=rm[:, None] < m,
                other=0,
            )
            sb = tl.load(
                bs_ptr + rn[:, None] * (k // 32) + (k0 // 32 + ks)[None, :],
                mask=rn[:, None] < n,
                other=0,
            )
            acc = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)
        tl.store(
            c_ptr + rm[:, None] * n + rn[None, :],
            acc.to(tl.bfloat16),
            mask=(rm[:, None] < m) & (rn[None, :] < n),
        )


def triton_dequant(triton, kernel, packed, scales, vec, out):
    rows, kh = packed.shape
    grid = (triton.cdiv(rows, 32), triton.cdiv(2 * kh, 256))
    kernel[grid](
        packed, scales, out, rows, 2 * kh, VEC=vec, E8M0=vec == 32, BLOCK_R=32, BLOCK_K=256
    )


_E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def torch_dequant(packed, scales, vec, lut):
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    sf = scales.to(torch.bfloat16).repeat_interleave(vec, dim=-1)
    return lut[codes.long()] * sf


# ------------------------------------------------------------------------------------- main
def _rate(m, n, k, sec, **extra):
    return dict(us=sec * 1e6, tflops=2 * m * n * k / sec / 1e12, **extra)


def _l2_copies(one_set_bytes: int) -> int:
    """Copies of the inputs whose total exceeds 3x the L2 (cold-cache timing)."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, math.ceil(3 * l2 / one_set_bytes))


def bench_ours(ops, m, n, k, roof, runners):
    """(result, D) of the default configuration."""
    a, b = ops.a[0], ops.b[0]
    vec = ops.sf_vec_size
    sfa, sfb = k90.blocked_scales(ops.sfa)[0], k90.blocked_scales(ops.sfb)[0]
    d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    one = a.numel() + b.numel() + sfa.numel() + sfb.numel() + d.numel() * 2
    sets = [(a, b, sfa, sfb)] + [
        tuple(t.clone() for t in (a, b, sfa, sfb)) for _ in range(_l2_copies(one) - 1)
    ]
    path, tiler, split, k_groups = k90.default_config(m, n, k, 1, k90.gpu_sm_count())
    key = (vec, path, tiler, split, k_groups)
    if key not in runners:
        runners[key] = k90.Fp4GemmSm90Runner(vec, "BFloat16", path, tiler, split, k_groups=k_groups)
    run, alpha = runners[key], float(ops.alpha)
    sec = time_graph([lambda s=s: run(*s, d, m, n, k, 1, alpha) for s in sets])
    ok, info = reference.check_gemm(d, a, b, ops.sfa[0], ops.sfb[0], vec, alpha)
    res = _rate(
        m,
        n,
        k,
        sec,
        gbps=one / sec / 1e9,
        roof_pct=100 * one / roof / sec,
        bytes=one,
        check=ok,
        config=f"{path} {tiler} split_k={split} k_groups={k_groups}",
    )
    if not ok:
        res["check_info"] = str(info)
    return res, d


def bench_bf16_peers(ops, m, n, k, tri, lut):
    """cuBLAS BF16, the two dequantize-then-cuBLAS pipelines and cuBLAS FP8 (NVFP4 data)."""
    rows = {}
    a, b, sa, sb = ops.a[0], ops.b[0], ops.sfa[0], ops.sfb[0]
    da = reference.dequantize_fp4(a, sa, 16).to(torch.bfloat16)
    db = reference.dequantize_fp4(b, sb, 16).to(torch.bfloat16)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    bf = [(da, db)] + [
        (da.clone(), db.clone()) for _ in range(_l2_copies(2 * (da.numel() + db.numel())) - 1)
    ]
    rows["cublas-bf16"] = _rate(
        m, n, k, time_graph([lambda x=x, y=y: torch.matmul(x, y.t(), out=out) for x, y in bf])
    )
    del bf

    sa8, sb8 = sa.view(torch.uint8), sb.view(torch.uint8)
    if tri is not None:
        triton, dq_kernel, _ = tri
        qa = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        qb = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")

        def tdq():
            triton_dequant(triton, dq_kernel, a, sa8, 16, qa)
            triton_dequant(triton, dq_kernel, b, sb8, 16, qb)
            torch.matmul(qa, qb.t(), out=out)

        tdq()
        torch.cuda.synchronize()
        if not torch.equal(qb, db):
            raise AssertionError("the Triton dequant kernel differs from reference.dequantize")
        rows["triton-dq+cublas"] = _rate(m, n, k, time_graph([tdq]))

    def pdq():
        torch.matmul(torch_dequant(a, sa, 16, lut), torch_dequant(b, sb, 16, lut).t(), out=out)

    rows["torch-dq+cublas"] = _rate(m, n, k, time_graph([pdq], reps=5))

    try:
        fa_s = da.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        fb_s = db.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        fa = (da.float() / fa_s).to(torch.float8_e4m3fn)
        fbt = (db.float() / fb_s).to(torch.float8_e4m3fn).t()
        fb_st = fb_s.t()

        def fp8():
            torch._scaled_mm(fa, fbt, scale_a=fa_s, scale_b=fb_st, out_dtype=torch.bfloat16)

        rows["cublas-fp8"] = _rate(m, n, k, time_graph([fp8]))
    except Exception as exc:  # e.g. cuBLASLt FP8 shape limits
        rows["cublas-fp8"] = dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
    return rows


def bench_dot_scaled(ops, m, n, k, tri, d_ours):
    """Triton tl.dot_scaled on the MXFP4 operands; also says whether it matches ours."""
    triton, _, ds_kernel = tri
    a, b = ops.a[0], ops.b[0]
    sa8, sb8 = ops.sfa[0].view(torch.uint8), ops.sfb[0].view(torch.uint8)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    bm = 16 if m <= 16 else 128
    grid = (triton.cdiv(m, bm), triton.cdiv(n, 128))

    def ds():
        ds_kernel[grid](a, b, sa8, sb8, out, m, n, k, BLOCK_M=bm, BLOCK_N=128, BLOCK_K=128)

    try:
        sec = time_graph([ds])
    except Exception as exc:
        return dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
    scale = float(d_ours.float().abs().max())
    same = bool(torch.allclose(out.float(), d_ours.float(), rtol=2e-2, atol=1e-2 * scale))
    return _rate(m, n, k, sec, matches_ours=same)


def bench_shape(m, n, k, roof, runners, tri, lut):
    row = {"m": m, "n": n, "k": k}
    ops = reference.make_fp4_operands(m, n, k, 1, 16, "cuda", seed=1)
    row["ours-nvfp4"], _ = bench_ours(ops, m, n, k, roof, runners)
    row.update(bench_bf16_peers(ops, m, n, k, tri, lut))
    del ops
    ops = reference.make_fp4_operands(m, n, k, 1, 32, "cuda", seed=1)
    row["ours-mxfp4"], d = bench_ours(ops, m, n, k, roof, runners)
    if tri is not None:
        row["triton-dot_scaled"] = bench_dot_scaled(ops, m, n, k, tri, d)
    del ops, d
    torch.cuda.empty_cache()
    return row


def _fmt(row, name):
    r = row.get(name)
    if r is None:
        return "-"
    if "error" in r:
        return "err"
    return f"{r['us']:.1f}"


def format_table(rows, roof) -> str:
    lines = [f"copy bandwidth (roof): {roof / 1e12:.2f} TB/s"]
    head = (
        f"{'M':>5} {'N':>6} {'K':>6} | {'ours-nv us':>10} {'TFLOP/s':>8} {'GB/s':>7} "
        f"{'%roof':>6} | {'ours-mx us':>10} | "
        + " ".join(f"{n:>17}" for n in METHODS[2:])
        + " | ours/bf16  ours/tdq"
    )
    lines += [head, "-" * len(head)]
    for row in rows:
        o = row["ours-nvfp4"]
        bf = row.get("cublas-bf16", {}).get("us")
        tdq = row.get("triton-dq+cublas", {}).get("us")
        ratio_bf = f"{bf / o['us']:.2f}x" if bf else "-"
        ratio_tdq = f"{tdq / o['us']:.2f}x" if tdq else "-"
        checks = [row[name]["check"] for name in METHODS[:2] if name in row]
        lines.append(
            f"{row['m']:>5} {row['n']:>6} {row['k']:>6} | {o['us']:>10.1f} {o['tflops']:>8.1f} "
            f"{o['gbps']:>7.0f} {o['roof_pct']:>5.1f}% | {_fmt(row, 'ours-mxfp4'):>10} | "
            + " ".join(f"{_fmt(row, n):>17}" for n in METHODS[2:])
            + f" | {ratio_bf:>9} {ratio_tdq:>8}"
            + ("" if all(checks) else "  CHECK FAILED")
        )
    lines.append(
        "(times in us; ours/bf16 and ours/tdq = speed-up of ours-nvfp4 over cublas-bf16 and "
        "triton-dq+cublas; cublas-fp8 has different numerics)"
    )
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = [r for r in rows if r["n"] == 8192 and r["k"] == 8192]
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in METHODS:
        pts = [(r["m"], r[name]["tflops"]) for r in sel if name in r and "tflops" in r[name]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (tokens), N = K = 8192")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"FP4 GEMM on {torch.cuda.get_device_name()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _dist_version(name: str):
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def gpu_label() -> str:
    """ "h200" / "h100" from the device name (the results' file name), else "gpu"."""
    found = re.search(r"\bH\d00\b", torch.cuda.get_device_name())
    return found.group(0).lower() if found else "gpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out_dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default=None, help="file name of the results; default: h200 / h100")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("bench.py needs an sm_90 GPU (H100 / H200)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    tri = None if triton is None else (triton, _dequant_fp4, _mxfp4_dot_scaled)
    if tri is None:
        print("triton is not installed: triton-dq+cublas and triton-dot_scaled not measured")
    lut = _E2M1.to(torch.bfloat16).cuda()
    roof = copy_bandwidth()
    runners, rows = {}, []
    t0 = time.time()
    for m, n, k in QUICK if args.quick else SHAPES:
        row = bench_shape(m, n, k, roof, runners, tri, lut)
        rows.append(row)
        print(
            f"[{time.time() - t0:6.1f}s] {m}x{n}x{k}: "
            + json.dumps(
                {
                    kk: (round(v["us"], 2) if isinstance(v, dict) and "us" in v else v)
                    for kk, v in row.items()
                    if kk not in ("m", "n", "k")
                }
            ),
            flush=True,
        )
    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        copy_bandwidth_Bps=roof,
        triton=getattr(tri[0], "__version__", None) if tri else None,
        cutlass_dsl=_dist_version("nvidia-cutlass-dsl"),
    )
    table = format_table(rows, roof) + "\n" + json.dumps(meta)
    print(table)
    name = os.path.join(args.out_dir, args.name or gpu_label())
    os.makedirs(args.out_dir, exist_ok=True)
    with open(name + ".txt", "w") as f:
        f.write(table + "\n")
    with open(name + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    plot(rows, name + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
