# SPDX-License-Identifier: BSD-3-Clause
"""Benchmark of the Hopper FP4 GEMM (``fp4_ops.sm90.launcher.gemm``) against its peers: same
run, same process, same data, on an H100 / H200.

Every time is per GEMM, from CUDA-graph replays (launch gaps do not count) of calls that read
the next of several input copies, together over 3x the L2, so every call finds the weights in
HBM (cold L2, as in decode, where each layer's weights are read once per token); ``--warm_l2``
times one input set over and over instead.

W4A4 table (FP4 activations and weights):
    ours-nvfp4       this kernel on NVFP4 operands (packed A, B + 128x4 blocked E4M3 scales)
    ours-mxfp4       this kernel on MXFP4 operands (E8M0 scales)
    cublas-bf16      torch.matmul on BF16 operands dequantized beforehand (not timed)
    triton-dq+cublas a fused Triton dequant kernel (packed FP4 + row-major scales -> BF16, both
                     operands, every call) followed by torch.matmul
    torch-dq+cublas  the same dequantization with plain torch ops, then torch.matmul
    cublas-fp8       torch._scaled_mm, E4M3 operands with per-row / per-column fp32 scales
                     (different numerics: a peer for speed, not for the result)
    triton-dot_scaled tl.dot_scaled(e2m1, e8m0) on the MXFP4 operands (software-emulated on sm_90)
W4A16 table (BF16 activations, the same FP4 weights; err = max |D - exact|, exact = the fp64
product of the BF16 activations and the dequantized weights):
    ours-w4a16-nvfp4 / -mxfp4   this kernel on BF16 activations and prepacked FP4 weights,
                                checked by reference.check_gemm_w4a16
    humming-nvfp4 / -mxfp4      humming-kernels (optional) W4A16, weights loaded through its
                                ModelOpt NVFP4 / mxfp4 loaders, its own kernel pick
    cublas-bf16      torch.matmul on the weights dequantized beforehand (global scale included)
    triton-dq+cublas the Triton dequant kernel on the weights, every call, then torch.matmul
    ours-w4a4-nvfp4  the W4A4 table's ours-nvfp4 time, for reference
Columns for ours: us, TFLOP/s, GB/s and % of the HBM roof, where the roof is the copy bandwidth
(bytes read + written by a large device-to-device copy) measured in the same run and the bytes
are the operands as stored (packed FP4, scales, BF16 activations) and D, each moved once.
The W4A16 table ends with the targets: ours at least 1.2x humming at M <= 128; at M >= 1024 at
least 1.0x humming and 0.95x cuBLAS BF16; 75% of the roof at 1 x 8192 x 8192.

    python -m benchmarks.sm90            # all shapes -> results/<gpu>_sm90.{txt,json,png}
    python -m benchmarks.sm90 --quick    # four shapes
    python -m benchmarks.sm90 --warm_l2  # one input set, L2-resident where it fits

The humming peers need ``pip install humming-kernels==0.1.20`` (and, where no CUDA toolkit
headers are installed, nvidia-cuda-cccl==13.0.85); without it they are reported not measured.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from dataclasses import dataclass

import torch

import reference
from benchmarks import args as cli
from fp4_ops.sm90 import k_order
from fp4_ops.sm90 import launcher as r90

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [(m, 8192, 8192) for m in (1, 16, 32, 64, 128, 1024, 4096, 8192)] + [
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
W4A16_METHODS = (
    "ours-w4a16-nvfp4",
    "ours-w4a16-mxfp4",
    "humming-nvfp4",
    "humming-mxfp4",
    "cublas-bf16",
    "triton-dq+cublas",
)
FORMATS = ((16, "nvfp4"), (32, "mxfp4"))
HUMMING = "humming-kernels==0.1.20"
#: Input copies of a cold-L2 timing exceed this many L2s together.
L2_MULTIPLE = 3


@dataclass
class Bench:
    """What every measurement of a run shares."""

    roof: float  # copy bandwidth, bytes / s
    l2_bytes: int
    warm: bool  # --warm_l2: one input set
    tri: tuple | None  # (triton, dequant kernel, dot_scaled kernel), or None
    lut: torch.Tensor | None  # E2M1 values (BF16) for torch-dq+cublas
    humming: type | None  # humming.layer.HummingLayer, or None


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
    """Median seconds per call: at least ``reps`` calls (cycling over ``calls``, each of them
    at least once) captured in one CUDA graph, replayed ``replays`` times."""
    reps = max(reps, len(calls))
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    # warm-up on the capture stream: compilation, and our kernel's per-stream workspaces
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.synchronize()
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


def l2_copies(one_set_bytes: int, l2_bytes: int, warm: bool = False) -> int:
    """Input copies whose total exceeds L2_MULTIPLE x the L2 (cold L2); 1 with ``warm``."""
    return 1 if warm else L2_MULTIPLE * l2_bytes // one_set_bytes + 1


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def input_sets(bench: Bench, tensors, extra_bytes: int = 0) -> list[tuple]:
    """``tensors`` (None stays None) and clones of them, one set per call of a cold-L2 timing;
    ``extra_bytes`` (an output written every call) counts towards a set's size."""
    n = l2_copies(_nbytes(*tensors) + extra_bytes, bench.l2_bytes, bench.warm)
    copy = [tuple(None if t is None else t.clone() for t in tensors) for _ in range(n - 1)]
    return [tuple(tensors)] + copy


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
        global_scale,
        VEC: tl.constexpr,
        E8M0: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # packed [rows, k/2] uint8, scales [rows, k/VEC] (row-major), out [rows, k] bf16;
        # (e2m1 x scale) is exact, then one fp32 rounding by the global scale (reference's order)
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
        lo = _e2m1(p & 0xF) * sf * global_scale
        hi = _e2m1(p >> 4) * sf * global_scale
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


def triton_dequant(triton, kernel, packed, scales, vec, out, global_scale=1.0):
    rows, kh = packed.shape
    grid = (triton.cdiv(rows, 32), triton.cdiv(2 * kh, 256))
    kernel[grid](
        packed,
        scales,
        out,
        rows,
        2 * kh,
        global_scale,
        VEC=vec,
        E8M0=vec == 32,
        BLOCK_R=32,
        BLOCK_K=256,
    )


_E2M1 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def torch_dequant(packed, scales, vec, lut):
    """Packed FP4 [.., K/2] (low nibble first) with plain scales [.., K/vec] -> BF16 [.., K]:
    ``lut`` (the 16 E2M1 values in BF16) times each value's block scale, exact in BF16."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)
    sf = scales.to(torch.bfloat16).repeat_interleave(vec, dim=-1)
    return lut[codes.long()] * sf


# ------------------------------------------------------------------------------------- W4A4, ours
def _rate(m, n, k, sec, **extra):
    return dict(us=sec * 1e6, tflops=2 * m * n * k / sec / 1e12, **extra)


def bench_ours(bench: Bench, ops, m, n, k, w4a16=None):
    """(result, D [1, M, N]) of the default configuration: W4A4 on ``ops``, or with ``w4a16`` =
    (BF16 activations x [M, K], exact D float64) on x and ops' weights, prepacked, with their
    global scale as alpha."""
    vec = ops.sf_vec_size
    sfb = r90.blocked_scales(ops.sfb)
    if w4a16 is None:
        a_dtype, alpha = "Float4E2M1FN", float(ops.alpha)
        inputs = (ops.a, ops.b, r90.blocked_scales(ops.sfa), sfb)
    else:
        a_dtype, alpha = "BFloat16", float(ops.global_scale_b)
        inputs = (w4a16[0].unsqueeze(0), k_order.prepack_weights(ops.b), None, sfb)
    d = torch.empty((1, m, n), dtype=torch.bfloat16, device="cuda")
    one = _nbytes(*inputs, d)
    sets = input_sets(bench, inputs, _nbytes(d))
    config = r90.GemmConfig.for_problem((m, n, k, 1), vec, "BFloat16", a_dtype)
    alpha_t = torch.full((1,), alpha, dtype=torch.float32, device="cuda")
    sec = time_graph([lambda s=s: r90.gemm(*s, alpha_t, d, config) for s in sets])
    if w4a16 is None:
        ok, info = reference.check_gemm(
            d[0], ops.a[0], ops.b[0], ops.sfa[0], ops.sfb[0], vec, alpha
        )
        extra = {}
    else:
        x, exact = w4a16
        ok, info = reference.check_gemm_w4a16(d[0], x, ops.b[0], ops.sfb[0], vec, alpha)
        extra = dict(err=max_error(d[0], exact))
    res = _rate(
        m,
        n,
        k,
        sec,
        gbps=one / sec / 1e9,
        roof_pct=100 * one / bench.roof / sec,
        bytes=one,
        check=ok,
        config=f"{config.path} {config.mma_tiler_mn} split_k={config.split_k} "
        f"k_groups={config.k_groups}",
        **extra,
    )
    if not ok:
        res["check_info"] = str(info)
    return res, d


def bench_bf16_peers(bench: Bench, ops, m, n, k):
    """cuBLAS BF16, the two dequantize-then-cuBLAS pipelines and cuBLAS FP8 (NVFP4 data)."""
    rows = {}
    a, b, sa, sb = ops.a[0], ops.b[0], ops.sfa[0], ops.sfb[0]
    da = reference.dequantize_fp4(a, sa, 16).to(torch.bfloat16)
    db = reference.dequantize_fp4(b, sb, 16).to(torch.bfloat16)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    sets = input_sets(bench, (da, db))
    rows["cublas-bf16"] = _rate(
        m, n, k, time_graph([lambda x=x, y=y: torch.matmul(x, y.t(), out=out) for x, y in sets])
    )
    del sets

    if bench.tri is not None:
        triton, dq_kernel, _ = bench.tri
        qa = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        qb = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")

        def tdq(a, b, sa8, sb8):
            triton_dequant(triton, dq_kernel, a, sa8, 16, qa)
            triton_dequant(triton, dq_kernel, b, sb8, 16, qb)
            torch.matmul(qa, qb.t(), out=out)

        sets = input_sets(bench, (a, b, sa.view(torch.uint8), sb.view(torch.uint8)))
        tdq(*sets[0])
        torch.cuda.synchronize()
        if not torch.equal(qb, db):
            raise AssertionError("the Triton dequant kernel differs from reference.dequantize")
        rows["triton-dq+cublas"] = _rate(m, n, k, time_graph([lambda s=s: tdq(*s) for s in sets]))
        del sets, qa, qb

    def pdq(a, sa, b, sb):
        da, db = torch_dequant(a, sa, 16, bench.lut), torch_dequant(b, sb, 16, bench.lut)
        torch.matmul(da, db.t(), out=out)

    if not torch.equal(torch_dequant(b, sb, 16, bench.lut), db):
        raise AssertionError("torch_dequant differs from reference.dequantize_fp4")
    sets = input_sets(bench, (a, sa, b, sb))
    rows["torch-dq+cublas"] = _rate(m, n, k, time_graph([lambda s=s: pdq(*s) for s in sets], 5))
    del sets

    try:
        fa_s = da.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        fb_s = db.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 448
        fa = (da.float() / fa_s).to(torch.float8_e4m3fn)
        fbt = (db.float() / fb_s).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        fb_st = fb_s.t()
        sets = input_sets(bench, (fa, fbt))

        def fp8(x, y):
            torch._scaled_mm(x, y, scale_a=fa_s, scale_b=fb_st, out_dtype=torch.bfloat16)

        rows["cublas-fp8"] = _rate(m, n, k, time_graph([lambda s=s: fp8(*s) for s in sets]))
    except Exception as exc:  # e.g. cuBLASLt FP8 shape limits
        rows["cublas-fp8"] = dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
    return rows


def bench_dot_scaled(bench: Bench, ops, m, n, k, d_ours):
    """Triton tl.dot_scaled on the MXFP4 operands; also says whether it matches ours."""
    triton, _, ds_kernel = bench.tri
    sets = input_sets(
        bench, (ops.a[0], ops.b[0], ops.sfa[0].view(torch.uint8), ops.sfb[0].view(torch.uint8))
    )
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    bm = 16 if m <= 16 else 128
    grid = (triton.cdiv(m, bm), triton.cdiv(n, 128))

    def ds(a, b, sa8, sb8):
        ds_kernel[grid](a, b, sa8, sb8, out, m, n, k, BLOCK_M=bm, BLOCK_N=128, BLOCK_K=128)

    try:
        sec = time_graph([lambda s=s: ds(*s) for s in sets])
    except Exception as exc:
        return dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
    scale = float(d_ours.float().abs().max())
    same = bool(torch.allclose(out.float(), d_ours.float(), rtol=2e-2, atol=1e-2 * scale))
    return _rate(m, n, k, sec, matches_ours=same)


# ------------------------------------------------------------------------------------- W4A16
def activations(m: int, k: int) -> torch.Tensor:
    """BF16 activations [M, K], standard normal, drawn on the CPU (the same on every GPU)."""
    gen = torch.Generator().manual_seed(2)
    return torch.randn((m, k), generator=gen).to(torch.bfloat16).cuda()


def max_error(d, exact) -> float:
    """max |d - exact|, ``exact`` float64."""
    return float((d.double() - exact).abs().max())


def load_humming():
    """(humming's ``HummingLayer``, None), or (None, why it is not there)."""
    try:
        from humming.layer import HummingLayer
    except ImportError as exc:
        return None, f"{HUMMING} is not installed ({exc})"
    return HummingLayer, None


def humming_layer(layer_cls, ops):
    """A humming layer for BF16 activations holding ``ops``' weights: NVFP4 through its ModelOpt
    NVFP4 loader (weight_scale_2 = the global scale), MXFP4 through its mxfp4 loader."""
    b, sfb = ops.b[0], ops.sfb[0]
    if ops.sf_vec_size == 16:
        config = {"quant_method": "modelopt", "quant_algo": "nvfp4"}
        gs = ops.global_scale_b.reshape(1).float()
        tensors = {"weight": b, "weight_scale": sfb, "weight_scale_2": gs}
    else:
        config = {"quant_method": "mxfp4"}
        tensors = {"weight": b, "weight_scale": sfb.view(torch.uint8)}
    n, k = b.shape[0], 2 * b.shape[1]
    layer = layer_cls(shape_n=n, shape_k=k, weight_config=config, torch_dtype=torch.bfloat16)
    layer = layer.cuda()
    layer.load_from_tensors(tensors)
    layer.transform()  # repacks the weights for its kernels, which it picks per call
    return layer


def bench_humming(bench: Bench, x, ops, exact):
    """humming's W4A16 GEMM, one layer (its own copy of the weights) per input set."""
    m, k = x.shape
    n = ops.b.shape[-2]
    d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    copies = l2_copies(_nbytes(x, ops.b, ops.sfb, d), bench.l2_bytes, bench.warm)
    try:
        sets = [(x.clone(), humming_layer(bench.humming, ops)) for _ in range(copies)]
        sec = time_graph([lambda s=s: s[1](s[0], outputs=d) for s in sets])
    except Exception as exc:  # a shape or format this version refuses
        return dict(error=f"{type(exc).__name__}: {str(exc)[:160]}")
    return _rate(m, n, k, sec, err=max_error(d, exact))


def bench_w4a16_bf16_peers(bench: Bench, x, ops, exact):
    """cuBLAS BF16 on the NVFP4 weights dequantized beforehand (global scale in), and the Triton
    dequant kernel on them every call followed by cuBLAS."""
    rows = {}
    m, k = x.shape
    b, sfb, gs = ops.b[0], ops.sfb[0], float(ops.global_scale_b)
    n = b.shape[0]
    wd = reference.dequantize_fp4(b, sfb, 16, gs).to(torch.bfloat16)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    sets = input_sets(bench, (x, wd))
    sec = time_graph([lambda s=s: torch.matmul(s[0], s[1].t(), out=out) for s in sets])
    rows["cublas-bf16"] = _rate(m, n, k, sec, err=max_error(out, exact))
    del sets
    if bench.tri is not None:
        triton, dq_kernel, _ = bench.tri
        qb = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")

        def tdq(x, b, sb8):
            triton_dequant(triton, dq_kernel, b, sb8, 16, qb, gs)
            torch.matmul(x, qb.t(), out=out)

        sets = input_sets(bench, (x, b, sfb.view(torch.uint8)))
        tdq(*sets[0])
        torch.cuda.synchronize()
        if torch.equal(qb, wd):
            sec = time_graph([lambda s=s: tdq(*s) for s in sets])
            rows["triton-dq+cublas"] = _rate(m, n, k, sec, err=max_error(out, exact))
        else:
            rows["triton-dq+cublas"] = dict(
                error="its weights differ from reference.dequantize_fp4"
            )
    return rows


def bench_shape(bench: Bench, m, n, k):
    """(W4A4 row, W4A16 row) of one shape: the same FP4 weights in both tables."""
    row, w16 = {"m": m, "n": n, "k": k}, {"m": m, "n": n, "k": k}
    x = activations(m, k)
    for vec, fmt in FORMATS:
        ops = reference.make_fp4_operands(m, n, k, 1, vec, "cuda", seed=1)
        row[f"ours-{fmt}"], d = bench_ours(bench, ops, m, n, k)
        if vec == 16:
            row.update(bench_bf16_peers(bench, ops, m, n, k))
        elif bench.tri is not None:
            row["triton-dot_scaled"] = bench_dot_scaled(bench, ops, m, n, k, d[0])
        del d
        exact = reference.reference_gemm_w4a16(
            x,
            ops.b[0],
            ops.sfb[0],
            vec,
            ops.global_scale_b,
            torch.float64,
            accum_dtype=torch.float64,
        )
        w16[f"ours-w4a16-{fmt}"], _ = bench_ours(bench, ops, m, n, k, (x, exact))
        if bench.humming is not None:
            w16[f"humming-{fmt}"] = bench_humming(bench, x, ops, exact)
        if vec == 16:
            w16.update(bench_w4a16_bf16_peers(bench, x, ops, exact))
        del ops, exact
        torch.cuda.empty_cache()
    w16["ours-w4a4-nvfp4"] = {key: row["ours-nvfp4"][key] for key in ("us", "tflops")}
    w16["ratios"] = w4a16_ratios(w16)
    return row, w16


# ------------------------------------------------------------------------------------- report
def _us(row, name):
    r = row.get(name)
    return r.get("us") if isinstance(r, dict) else None


def w4a16_ratios(row) -> dict:
    """Speed-ups of ours W4A16 (peer time / ours) over humming and cuBLAS BF16, per format;
    None where either was not measured."""
    out = {}
    for _, fmt in FORMATS:
        ours = _us(row, f"ours-w4a16-{fmt}")
        for key, peer in (("humming", f"humming-{fmt}"), ("cublas-bf16", "cublas-bf16")):
            theirs = _us(row, peer)
            out[f"{fmt}/{key}"] = theirs / ours if ours and theirs else None
    return out


def w4a16_targets(rows) -> list[dict]:
    """Every W4A16 target that applies to a row: at least 1.2x humming at M <= 128; at least
    1.0x humming and 0.95x cuBLAS BF16 at M >= 1024; 75% of the roof at 1 x 8192 x 8192.
    ``met`` is None where the value was not measured."""
    out = []
    for r in rows:
        m, n, k = r["m"], r["n"], r["k"]
        for _, fmt in FORMATS:
            need = []
            if m <= 128:
                need.append((f"{fmt}/humming", r["ratios"].get(f"{fmt}/humming"), 1.2))
            if m >= 1024:
                need.append((f"{fmt}/humming", r["ratios"].get(f"{fmt}/humming"), 1.0))
                need.append((f"{fmt}/cublas-bf16", r["ratios"].get(f"{fmt}/cublas-bf16"), 0.95))
            if (m, n, k) == (1, 8192, 8192):
                ours = r.get(f"ours-w4a16-{fmt}") or {}
                need.append((f"{fmt} %roof", ours.get("roof_pct"), 75.0))
            for target, value, minimum in need:
                met = None if value is None else value >= minimum
                out.append(
                    dict(shape=f"{m}x{n}x{k}", target=target, value=value, min=minimum, met=met)
                )
    return out


def _fmt(row, name, key="us", spec=".1f"):
    r = row.get(name)
    if r is None:
        return "-"
    if "error" in r:
        return "failed"
    return format(r[key], spec) if key in r else "-"


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
        bf = _us(row, "cublas-bf16")
        tdq = _us(row, "triton-dq+cublas")
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


def format_w4a16_table(rows) -> str:
    """The W4A16 table: per method us and max |err|, ours' % of the roof, the speed-ups."""
    ours = [f"ours-w4a16-{fmt}" for _, fmt in FORMATS]
    peers = [f"humming-{fmt}" for _, fmt in FORMATS] + ["cublas-bf16", "triton-dq+cublas"]
    ratios = [f"{fmt}/{p}" for _, fmt in FORMATS for p in ("humming", "cublas-bf16")]
    head = (
        f"{'M':>5} {'N':>6} {'K':>6} | "
        + " | ".join(f"{name:>16} {'%roof':>6} {'err':>6}" for name in ours)
        + " | "
        + " | ".join(f"{name:>16} {'err':>6}" for name in peers)
        + f" | {'ours-w4a4-nv':>12} | "
        + " ".join(ratios)
    )
    lines = ["W4A16: BF16 activations x FP4 weights", head, "-" * len(head)]
    for row in rows:
        checks = [row[name]["check"] for name in ours if "check" in row.get(name, {})]
        speedups = [row["ratios"].get(r) for r in ratios]
        lines.append(
            f"{row['m']:>5} {row['n']:>6} {row['k']:>6} | "
            + " | ".join(
                f"{_fmt(row, name):>16} {_fmt(row, name, 'roof_pct'):>6} "
                f"{_fmt(row, name, 'err', '.3g'):>6}"
                for name in ours
            )
            + " | "
            + " | ".join(
                f"{_fmt(row, name):>16} {_fmt(row, name, 'err', '.3g'):>6}" for name in peers
            )
            + f" | {_fmt(row, 'ours-w4a4-nvfp4'):>12} | "
            + " ".join(
                f"{'-' if s is None else f'{s:.2f}x':>{len(r)}}"
                for r, s in zip(ratios, speedups, strict=True)
            )
            + ("" if all(checks) else "  CHECK FAILED")
        )
    lines.append(
        "(times in us; err = max |D - exact|, exact = fp64 product of the BF16 activations and "
        "the dequantized weights, which cublas-bf16 and triton-dq+cublas round to BF16; "
        "fmt/peer = speed-up of ours-w4a16-fmt over the peer; ours-w4a4-nv = ours-nvfp4 of "
        "the W4A4 table)"
    )
    return "\n".join(lines)


def format_targets(targets) -> str:
    missed = [t for t in targets if t["met"] is False]
    unmeasured = [t for t in targets if t["met"] is None]
    lines = [
        f"W4A16 targets: {len(targets) - len(missed) - len(unmeasured)} of {len(targets)} met, "
        f"{len(missed)} missed, {len(unmeasured)} not measured"
    ]
    lines += [
        f"  missed: {t['shape']} {t['target']} {t['value']:.2f} < {t['min']:g}" for t in missed
    ]
    if unmeasured:
        lines.append(
            "  not measured: " + ", ".join(f"{t['shape']} {t['target']}" for t in unmeasured)
        )
    return "\n".join(lines)


def plot(rows, w16_rows, gpu, path):
    """TFLOP/s against M at N = K = 8192: W4A4 on the left, W4A16 on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, table, names, title in (
        (axes[0], rows, METHODS, "W4A4 (FP4 activations)"),
        (axes[1], w16_rows, W4A16_METHODS, "W4A16 (BF16 activations)"),
    ):
        sel = [r for r in table if r["n"] == 8192 and r["k"] == 8192]
        for name in names:
            pts = [(r["m"], r[name]["tflops"]) for r in sel if "tflops" in r.get(name, {})]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (tokens), N = K = 8192")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("TFLOP/s")
    fig.suptitle(f"FP4 GEMM on {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(path, meta, rows, w16_rows) -> str:
    """``path``.txt (the tables), .json (everything) and .png; returns the text."""
    targets = w4a16_targets(w16_rows)
    text = "\n\n".join(
        (
            f"timing: {meta['l2']}\n" + format_table(rows, meta["copy_bandwidth_Bps"]),
            format_w4a16_table(w16_rows),
            format_targets(targets),
        )
    )
    text += "\n" + json.dumps(meta)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".txt", "w") as f:
        f.write(text + "\n")
    with open(path + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, w4a16=w16_rows, targets=targets), f, indent=1)
    plot(rows, w16_rows, meta["gpu"], path + ".png")
    return text


def _dist_version(name: str):
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def shard_runs(out_dir: str) -> list[str]:
    """The names (``<gpu>_sm90``) of the runs whose shards ``out_dir`` holds."""
    found = glob.glob(os.path.join(out_dir, "*_sm90.shard0.json"))
    return sorted(os.path.basename(path).removesuffix(".shard0.json") for path in found)


def l2_mode(warm: bool, l2_bytes: int) -> str:
    if warm:
        return "warm L2 (--warm_l2: one input set, timed over and over)"
    return f"cold L2 (each call reads the next of input copies over {L2_MULTIPLE}x the " + (
        f"{l2_bytes / 2**20:.0f} MiB L2)"
    )


def parse_args(argv=None):
    ap = cli.parser("benchmarks.sm90", __doc__)
    ap.add_argument("--quick", action="store_true", help="four shapes instead of all")
    ap.add_argument(
        "--warm_l2",
        action="store_true",
        help="time one input set over and over (default: cold L2, rotating input copies)",
    )
    ap.add_argument("--out_dir", default=os.path.join(os.path.dirname(HERE), "results"))
    ap.add_argument(
        "--name",
        default=None,
        help="file name of the results; default: <gpu>_sm90 (e.g. h200_sm90); --combine: the "
        "name of the one run whose shards --out_dir holds",
    )
    ap.add_argument(
        "--shard",
        default=None,
        help="I/N: measure every N-th shape from the I-th (a run in N parts) into NAME.shardI.json",
    )
    ap.add_argument(
        "--combine",
        type=int,
        default=None,
        metavar="N",
        help="write the results from the N shards of a run (no GPU needed; --name as the shards')",
    )
    args = ap.parse_args(argv)
    if args.combine is not None and args.combine < 1:
        ap.error(f"--combine expects a number of shards >= 1, got {args.combine}")
    if args.combine is not None and (args.shard or args.quick or args.warm_l2):
        ap.error("--combine writes what the shards measured: no --shard, --quick or --warm_l2")
    if args.name == "" or (args.name and os.sep in args.name):
        ap.error(f"--name {args.name!r}: a file name, not empty nor a path")
    # (checked now, not after the run: the results are written into it at the end)
    cli.output_path(ap, "--out_dir", os.path.join(args.out_dir, args.name or "sm90"))
    if args.shard is not None:
        try:
            i, n = (int(v) for v in args.shard.split("/"))
        except ValueError:
            ap.error(f"--shard expects I/N, got {args.shard!r}")
        if not 0 <= i < n:
            ap.error(f"--shard {args.shard}: I must lie in 0..N-1")
        args.shard = (i, n)
    return args


def combine_shards(path: str, count: int) -> str:
    """The results of a run measured in ``count`` shards: rows in shape order, the first
    shard's environment with every shard's copy bandwidth (each row's % roof is its own)."""
    shards = []
    for i in range(count):
        with open(f"{path}.shard{i}.json") as f:
            shards.append(json.load(f))
    order = {tuple(s): j for j, s in enumerate(SHAPES)}

    def shape_key(row):
        return order.get((row["m"], row["n"], row["k"]), len(order))

    rows = sorted((r for s in shards for r in s["rows"]), key=shape_key)
    w16_rows = sorted((r for s in shards for r in s["w4a16"]), key=shape_key)
    meta = dict(shards[0]["meta"])
    meta["copy_bandwidth_Bps"] = min(s["meta"]["copy_bandwidth_Bps"] for s in shards)
    meta["shards"] = [s["meta"] for s in shards]
    return write_results(path, meta, rows, w16_rows)


def setup(warm: bool) -> Bench:
    """The run's shared state on the current GPU; says which optional peers are missing."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    tri = None if triton is None else (triton, _dequant_fp4, _mxfp4_dot_scaled)
    if tri is None:
        print("triton is not installed: triton-dq+cublas and triton-dot_scaled not measured")
    humming_cls, why = load_humming()
    if humming_cls is None:
        print(f"{why}: humming-nvfp4 and humming-mxfp4 not measured")
    return Bench(
        roof=copy_bandwidth(),
        l2_bytes=torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size,
        warm=warm,
        tri=tri,
        lut=_E2M1.to(torch.bfloat16).cuda(),
        humming=humming_cls,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.combine is not None:
        runs = [args.name] if args.name else shard_runs(args.out_dir)
        if len(runs) != 1:
            print(
                f"--combine {args.combine}: --out_dir holds the shards of {len(runs)} runs "
                f"({', '.join(runs) or 'no *_sm90.shard0.json'}): name one with --name",
                file=sys.stderr,
            )
            return 2
        path = os.path.join(args.out_dir, runs[0])
        try:
            print(combine_shards(path, args.combine))
        except FileNotFoundError as err:
            print(f"--combine {args.combine}: {err.filename} is missing", file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError) as err:  # (JSONDecodeError is a ValueError)
            why = f"lacks {err}" if isinstance(err, KeyError) else str(err)
            print(
                f"--combine {args.combine}: a shard of {path} is not a result: {why}",
                file=sys.stderr,
            )
            return 2
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("benchmarks.sm90 needs an sm_90 GPU (H100 / H200)", file=sys.stderr)
        return 2
    bench = setup(args.warm_l2)
    rows, w16_rows = [], []
    t0 = time.time()
    shapes = QUICK if args.quick else SHAPES
    if args.shard is not None:
        shapes = shapes[args.shard[0] :: args.shard[1]]
    for m, n, k in shapes:
        row, w16 = bench_shape(bench, m, n, k)
        rows.append(row)
        w16_rows.append(w16)
        w4a4, w4a16 = (
            {name: round(r["us"], 2) for name, r in table.items() if _us(table, name)}
            for table in (row, w16)
        )
        print(f"[{time.time() - t0:6.1f}s] {m}x{n}x{k}: W4A4 {w4a4} W4A16 {w4a16}", flush=True)
    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        copy_bandwidth_Bps=bench.roof,
        l2=l2_mode(bench.warm, bench.l2_bytes),
        triton=getattr(bench.tri[0], "__version__", None) if bench.tri else None,
        cutlass_dsl=_dist_version("nvidia-cutlass-dsl"),
        humming=_dist_version("humming-kernels"),
    )
    label = cli.gpu_label(torch.cuda.get_device_name())
    path = os.path.join(args.out_dir, args.name or f"{label}_sm90")
    if args.shard is not None:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(f"{path}.shard{args.shard[0]}.json", "w") as f:
            json.dump(dict(meta=meta, rows=rows, w4a16=w16_rows), f, indent=1)
        print(f"shard {args.shard[0]} of {args.shard[1]} -> {path}.shard{args.shard[0]}.json")
        return 0
    print(write_results(path, meta, rows, w16_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
