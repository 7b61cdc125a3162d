# SPDX-License-Identifier: BSD-3-Clause
"""The Hopper kernel's command line: ``python -m fp4_ops.sm90 --mnkl M,N,K,L [options]``.

On an H100 / H200 it quantizes random operands, runs the kernel, checks D against
the float64 product of the exactly dequantized operands (a derived bound) and times it;
``--compile_only`` cross-compiles for sm_90a anywhere.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from fp4_ops import cpu
from fp4_ops.devtools import (
    UsageError,
    cubin_resource_usage,
    files_written,
    find_cuobjdump,
    gpu_runs,
    operand_sets,
    parse_ints,
    snapshot,
    time_us,
)
from fp4_ops.sm90 import k_order
from fp4_ops.sm90.gemm import (
    A_DTYPES,
    C_DTYPES,
    DEFAULT_GPU_ARCH,
    GPU_ARCHS,
    H200_SM_COUNT,
    PATHS,
    SF_DTYPES,
    SF_FORMATS,
    SM90_SMEM_CAPACITY,
    W4A4,
    alpha_reason,
    check_fp4_gemm_config,
    compile_gemm,
    torch_dtype,
)
from fp4_ops.sm90.launcher import GemmConfig, gemm, gpu_sm_count


def check_against_exact(d, a, b, alpha: float, tolerance: float = 1.0):
    """(passed, summary) of D [L, M, N] against alpha * a @ b^T computed in float64 from the
    exactly dequantized operands a [L, M, K] and b [L, N, K]. Bound per element: fp32 sums of K
    exact products in any order, the epilogue's product and the fp32 comparison's own rounding
    (2 gamma_K |alpha| sum |a_i b_i|, gamma_K = K u / (1 - K u), u = 2^-24 x ``tolerance``), plus
    half an ulp of D's type (at most 2^-p of the magnitude, p its significand bits)."""
    import torch

    k = a.shape[-1]
    u = 2.0**-24 * tolerance
    gamma = k * u / (1 - k * u)
    exact = alpha * torch.matmul(a, b.transpose(-1, -2))
    bound = 2 * gamma * abs(alpha) * torch.matmul(a.abs(), b.abs().transpose(-1, -2))
    bits = {torch.bfloat16: 8, torch.float16: 11}.get(d.dtype)
    if bits is not None:
        bound = bound + (exact.abs() + bound) * 2.0**-bits
    err = (d.double() - exact).abs()
    bad = int((~(err <= bound)).sum())
    worst = float((err / bound.clamp(min=1e-300)).max())
    return (
        bad == 0,
        f"{bad}/{err.numel()} elements outside the bound; worst err / bound {worst:.3f}",
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp4_ops.sm90",
        description="NVFP4/MXFP4 GEMM for Hopper (sm_90a): exact dequantization, F16/BF16 wgmma.",
    )
    parser.add_argument(
        "--mnkl", type=lambda s: parse_ints(s, 4, "--mnkl"), default=(8192, 8192, 8192, 1)
    )
    parser.add_argument("--path", choices=("auto",) + PATHS, default="auto")
    parser.add_argument(
        "--mma_tiler_mn",
        type=lambda s: parse_ints(s, 2, "--mma_tiler_mn"),
        default=None,
        help="output tile M,N (decode: M = tokens, N = weight rows); default: default_config",
    )
    parser.add_argument(
        "--cluster_shape_mn",
        type=lambda s: parse_ints(s, 2, "--cluster_shape_mn"),
        default=None,
        help="CTAs per cluster along M,N (decode 2,1: a tile's two K splits, --split_k 2); "
        "default: 2,1 on prefill, on decode GemmConfig.for_problem's",
    )
    parser.add_argument("--split_k", type=int, default=None, help="default: default_config")
    parser.add_argument(
        "--k_groups",
        type=int,
        default=None,
        help="decode: groups of consumer warpgroups splitting K in a CTA; default: default_config",
    )
    parser.add_argument(
        "--a_dtype",
        choices=A_DTYPES,
        default=W4A4,
        help="activations: Float4E2M1FN (W4A4, with scales) or BFloat16 / Float16 (W4A16)",
    )
    parser.add_argument("--sf_vec_size", type=int, choices=tuple(SF_FORMATS), default=16)
    parser.add_argument(
        "--sf_dtype",
        choices=tuple(SF_DTYPES),
        default=None,
        help="default: Float8E4M3FN for sf_vec_size 16, Float8E8M0FNU for 32",
    )
    parser.add_argument("--c_dtype", choices=tuple(C_DTYPES), default="BFloat16")
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="epilogue scale; default: the product of the NVFP4 global scales",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1.0,
        help="multiplier on the derived elementwise tolerance (check_against_exact)",
    )
    parser.add_argument("--warmup_iterations", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--skip_ref_check", action="store_true")
    parser.add_argument(
        "--use_cold_l2",
        action="store_true",
        help="time calls that rotate through copies of the operands (> 2x L2), read from DRAM",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--compile_only",
        action="store_true",
        help="cross-compile for sm_90a (no GPU needed) and print a summary",
    )
    parser.add_argument(
        "--dump_dir",
        default=None,
        help="--compile_only writes the PTX and cubin into a folder per configuration here "
        "(default ./dump)",
    )
    return parser


def _validated(args: argparse.Namespace) -> argparse.Namespace:
    """Checks the command line and fills in the defaults (``default_config``)."""
    if args.dump_dir is not None and not args.compile_only:
        raise UsageError("--dump_dir is where --compile_only writes: give both or neither")
    args.dump_dir = args.dump_dir or "./dump"
    if args.sf_dtype is None:
        args.sf_dtype = SF_FORMATS[args.sf_vec_size][0]
    if args.iterations < 1 or args.warmup_iterations < 0:
        raise UsageError("--iterations must be >= 1 and --warmup_iterations >= 0")
    if not math.isfinite(args.tolerance) or args.tolerance <= 0:
        raise UsageError("--tolerance must be a finite number > 0")
    # (the bound's gamma_K needs K u < 1: past it the bound divides by zero or turns negative;
    # a K < 1 is the problem check's to refuse)
    k_limit = 1.0 / (max(args.mnkl[2], 1) * 2.0**-24)
    if not args.compile_only and args.tolerance >= k_limit:
        raise UsageError(
            f"--tolerance {args.tolerance:g} is too large for K = {args.mnkl[2]}: the bound "
            f"needs --tolerance < {k_limit:g}"
        )
    if not 0 <= args.seed < 2**64:
        raise UsageError(f"--seed must be in [0, 2^64), got {args.seed}")
    # (a tile or a split given completes the pick without K groups)
    args.config = GemmConfig.for_problem(
        args.mnkl,
        args.sf_vec_size,
        args.c_dtype,
        args.a_dtype,
        gpu_sm_count(),
        path=None if args.path == "auto" else args.path,
        mma_tiler_mn=args.mma_tiler_mn,
        split_k=args.split_k,
        k_groups=args.k_groups,
        cluster_shape_mn=args.cluster_shape_mn,
    )
    picked = args.config
    args.path, args.mma_tiler_mn, args.split_k = picked.path, picked.mma_tiler_mn, picked.split_k
    args.k_groups, args.cluster_shape_mn = picked.k_groups, picked.cluster_shape_mn
    config = (args.path, args.mma_tiler_mn, args.cluster_shape_mn, args.split_k, args.k_groups)
    formats = (args.sf_vec_size, args.sf_dtype, args.c_dtype)
    reasons = check_fp4_gemm_config(args.mnkl, *formats, *config, args.a_dtype)
    if args.alpha is not None:
        reason = alpha_reason(args.alpha, args.sf_vec_size, args.path, args.a_dtype)
        if reason:
            reasons.append(f"--alpha: {reason}")
    if reasons:
        raise UsageError("this configuration cannot run:\n  - " + "\n  - ".join(reasons))
    return args


def _print_config(args: argparse.Namespace) -> None:
    fmt = SF_FORMATS[args.sf_vec_size][1]
    print(f"Running Hopper {fmt} GEMM (fp4_ops.sm90):")
    print(f"  mnkl: {args.mnkl}")
    print(f"  A dtype: {args.a_dtype}, B dtype: Float4E2M1FN")
    print(f"  SF dtype: {args.sf_dtype}, SF vec size: {args.sf_vec_size}")
    print(f"  C dtype: {args.c_dtype}, acc dtype: Float32")
    print(
        f"  path: {args.path}, MMA tiler (M, N): {args.mma_tiler_mn}, cluster shape (M, N): "
        f"{args.cluster_shape_mn}, split_k: {args.split_k}, k_groups: {args.k_groups}"
    )


def dump_folder_name(args: argparse.Namespace) -> str:
    """The configuration's own folder under --dump_dir: the DSL names its files after the kernel
    only, so configurations sharing one folder would overwrite each other's PTX and cubin."""
    (tm, tn), fmt = args.mma_tiler_mn, SF_FORMATS[args.sf_vec_size][1].lower()
    return (
        f"{fmt}_{args.a_dtype}_{args.c_dtype}_{args.path}_tile{tm}x{tn}_split{args.split_k}"
        f"_kgroups{args.k_groups}_sm_90a"
    )


def run_compile_only(args: argparse.Namespace) -> int:
    try:
        os.makedirs(args.dump_dir, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--dump_dir {args.dump_dir}: cannot create the folder ({err})") from None
    if not os.access(args.dump_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--dump_dir {args.dump_dir}: the folder is not writable")
    folder = os.path.join(args.dump_dir, dump_folder_name(args))
    os.makedirs(folder, exist_ok=True)
    before = snapshot(folder)
    options = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir={folder}"
    config = (args.sf_vec_size, args.c_dtype, args.path, args.mma_tiler_mn, args.split_k)
    cluster, tma_store = args.cluster_shape_mn, args.config.tma_store
    kernel, _ = compile_gemm(
        *config, H200_SM_COUNT, options, cluster, tma_store, args.k_groups, args.a_dtype
    )
    # (only what this compile wrote: an older cubin in the folder is never reported)
    cubins = files_written(folder, before, ".cubin")
    ptx_files = files_written(folder, before, ".ptx")
    print("Compile only: sm_90a, no GPU used")
    print(f"  PTX:   {ptx_files[-1] if ptx_files else 'not written'}")
    print(f"  cubin: {cubins[-1] if cubins else 'not written'}")
    if cubins and find_cuobjdump():
        usage = cubin_resource_usage(cubins[-1])
        print(f"  kernel: {usage['name']}")
        print(f"  registers per thread: {usage['REG']}")
        print(f"  local memory per thread: {usage['LOCAL']} bytes (stack {usage['STACK']})")
    else:
        print("  registers / local memory: not read (cuobjdump not found)")
    smem = kernel.shared_storage.size_in_bytes()
    print(f"  shared memory per CTA: {smem} bytes of {SM90_SMEM_CAPACITY}")
    print(f"  pipeline stages: {kernel.num_stages} of K {kernel.stage_k}")
    print(
        f"  threads per CTA: {kernel.threads_per_cta} ({kernel.k_groups} K group(s)), "
        f"{kernel.occupancy} CTA(s) per SM, setmaxregister producer {kernel.producer_regs} / "
        f"consumers {kernel.mma_regs}"
    )
    print(f"  epilogue: {'TMA store' if kernel.tma_store else 'direct stores'}")
    prologue = "none" if not kernel.convert_b else f"launched with PDL: {kernel.prologue_pdl}"
    print(f"  prologue (convert_operands): {prologue}")
    return 0


def run_on_gpu(args: argparse.Namespace) -> int:
    """Quantize random data, run the kernel, check it against the exact product, time it."""
    is_hopper, gpu = gpu_runs(GPU_ARCHS[DEFAULT_GPU_ARCH])
    if not is_hopper:
        raise UsageError(
            f"this kernel needs a Hopper H100/H200 (sm_90) GPU; found {gpu}.\n"
            "  Cross-compile and inspect it on any machine with --compile_only."
        )
    import torch

    from fp4_ops.ops import quantize

    m, n, k, l = args.mnkl  # noqa: E741
    vec, w4a4 = args.sf_vec_size, args.a_dtype == W4A4
    fmt = "nvfp4" if vec == 16 else "mxfp4"
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.randn((l, m, k), generator=gen, device="cuda")
    wq = quantize(torch.randn((l, n, k), generator=gen, device="cuda"), fmt)
    if w4a4:
        xq = quantize(x, fmt)
        a, sfa = xq.data, xq.scale.reshape(l, -1)
        default_alpha = xq.global_scale * wq.global_scale
    else:
        # W4A16: activations of the given type, the weights prepacked
        a, sfa = x.to(torch_dtype(args.a_dtype)), None
        default_alpha = wq.global_scale
    # (gemm takes the blocked scales [L, bytes])
    b, sfb = (wq.data if w4a4 else k_order.prepack_weights(wq.data)), wq.scale.reshape(l, -1)
    alpha = float(default_alpha) if args.alpha is None else args.alpha
    d = torch.full((l, m, n), float("nan"), dtype=torch_dtype(args.c_dtype), device="cuda")
    # (the kernel reads alpha from device memory when it runs)
    alpha_t = torch.full((1,), alpha, dtype=torch.float32, device="cuda")
    gemm(a, b, sfa, sfb, alpha_t, d, args.config)
    torch.cuda.synchronize()
    passed = True
    if args.skip_ref_check:
        print("Reference check: skipped (--skip_ref_check)")
    else:
        # (e2m1 x block scale is exact in float32; the global scales are in alpha)
        a_exact = cpu.dequantize(xq.data, xq.plain_scales(), vec) if w4a4 else a
        b_exact = cpu.dequantize(wq.data, wq.plain_scales(), vec)
        a_exact, b_exact = a_exact.double(), b_exact.double()
        passed, info = check_against_exact(d, a_exact, b_exact, alpha, args.tolerance)
        print(f"Reference check (float64 product of the dequantized operands): {info}")

    # The calls run on a side stream that the timing graphs capture; with --use_cold_l2 they
    # rotate through operand copies.
    stream = torch.cuda.Stream()
    tensors = (a, b, sfa, sfb, d)
    sets = operand_sets(tensors, args.use_cold_l2, args.warmup_iterations, args.iterations)
    # (the operands and their copies were written on the current stream)
    stream.wait_stream(torch.cuda.current_stream())
    # the first call on a stream allocates its workspace, outside the timing graphs
    calls = [lambda s=s: _launch_on(stream, *s[:4], alpha_t, s[4], args.config) for s in sets]
    calls[0]()
    mean_us = time_us(calls, stream, args.warmup_iterations, args.iterations)
    print(f"Mean time: {mean_us:.2f} us")
    print(f"Throughput: {2.0 * m * n * k * l / (mean_us * 1e-6) / 1e12:.1f} TFLOP/s")
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


def _launch_on(stream, *args) -> None:
    """``gemm(*args)`` on ``stream``: the timing graphs capture that stream."""
    import torch

    with torch.cuda.stream(stream):
        gemm(*args)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args = _validated(args)
        _print_config(args)
        if args.compile_only:
            return run_compile_only(args)
        return run_on_gpu(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
