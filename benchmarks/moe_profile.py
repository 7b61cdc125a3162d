# SPDX-License-Identifier: BSD-3-Clause
"""Where one MoE layer's time goes: every kernel of a call, timed by the CUDA profiler.

    python -m benchmarks.moe_profile                                   # T = 1, every config
    python -m benchmarks.moe_profile --config deepseek-v3 --tokens 16,64 --contestants \\
        ours_w4a16,humming_moe

The layers, experts and routing are ``benchmarks.moe``'s (same seeds, same copies of the
experts, so that every call reads the experts it touches from HBM). Each contestant's copies
are called eagerly, cycling, CALLS times after WARMUP calls, under ``torch.profiler``; printed
per kernel (in launch order within a call): its mean GPU time per call and its share of the
call's; per call: the bytes of the experts it touches and the bandwidth of reading them in the
kernels' summed time. The call's wall time between kernels (launch gaps, host work) is not a GPU
time and is not in the sum; ``benchmarks.moe`` times the whole layer in a CUDA graph.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import args as cli
from benchmarks import moe as bench_moe
from benchmarks import sm90 as bench_sm90
from benchmarks.stack import copy_bandwidth, describe, environment

WARMUP = 3
CALLS = 20
#: kernels shown by name: the first this many characters of it
NAME_CHARS = 72


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser("benchmarks.moe_profile", __doc__)
    p.add_argument("--config", default=",".join(bench_moe.CONFIGS))
    p.add_argument("--tokens", default="1")
    p.add_argument("--contestants", default="ours_w4a16")
    args = p.parse_args(argv)
    args.tokens = cli.positive_ints(p, "--tokens", args.tokens, "1,16")
    args.config = cli.names(p, "--config", args.config, list(bench_moe.CONFIGS), ordered=False)
    args.contestants = cli.names(p, "--contestants", args.contestants, bench_moe.CONTESTANTS, True)
    return args


def kernel_times(calls, count: int) -> list[tuple[str, float]]:
    """(name, mean us per call) of every kernel a call launches, in launch order: ``calls``
    cycled ``count`` times under the profiler (each call launches the same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for i in range(WARMUP):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(count):
                calls[i % len(calls)]()
            torch.cuda.synchronize()
    kernels = [
        (e.name, e.device_time)
        for e in sorted(prof.events(), key=lambda e: e.time_range.start)
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0
    ]
    return per_call_means(kernels, count)


def per_call_means(kernels: list[tuple[str, float]], count: int) -> list[tuple[str, float]]:
    """(name, mean us) of the i-th kernel of a call, from the kernels of ``count`` calls in
    launch order; ValueError unless every call launched the same kernels."""
    if not kernels or len(kernels) % count:
        raise ValueError(f"{len(kernels)} kernels in {count} calls: the calls differ")
    per_call = len(kernels) // count
    names = [name for name, _ in kernels[:per_call]]
    sums = [0.0] * per_call
    for i, (name, us) in enumerate(kernels):
        if name != names[i % per_call]:
            raise ValueError(
                f"call {i // per_call} launched {name!r} where the first had "
                f"{names[i % per_call]!r}: the calls differ"
            )
        sums[i % per_call] += us
    return [(name, total / count) for name, total in zip(names, sums, strict=True)]


def profile_one(cfg, tokens, contestant, weights, humming, l2_bytes):
    problem = bench_moe.routing_problem(cfg, tokens, "cuda")
    touched = bench_moe.touched_bytes(cfg, problem.ids_host, contestant)
    copies = bench_sm90.l2_copies(touched, l2_bytes)
    layers = bench_moe.build_contestant(contestant, weights, cfg, copies, humming)
    args = (problem.x, problem.topk_weights, problem.topk_ids)
    calls = [lambda layer=layer: layer(*args) for layer in layers]
    times = kernel_times(calls, max(CALLS, len(calls)))
    return touched, times


def profile_or_report(name, tokens, contestant, weights, humming, l2_bytes):
    """``profile_one`` of configuration ``name``; None, said on stdout, where humming refuses
    the shapes; any other failure (ours included) raises."""
    try:
        return profile_one(bench_moe.CONFIGS[name], tokens, contestant, weights, humming, l2_bytes)
    except Exception as err:
        if contestant != "humming_moe":
            raise
        print(f"\n## {name} T={tokens} {contestant}: not profiled: {describe(err)}")
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: benchmarks.moe_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    env = environment(device)
    humming = None
    if "humming_moe" in args.contestants:
        humming, why = bench_moe.load_humming_moe()
        if humming is None:
            print(f"humming-kernels not installed ({why}): humming_moe not profiled")
    copy_bps = copy_bandwidth(device)
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    print(f"# {env['gpu']}, torch {env['torch']}, {env['date']}")
    print(f"# copy bandwidth {copy_bps / 1e12:.2f} TB/s (read + written, eager copy)")
    for name in args.config:
        cfg = bench_moe.CONFIGS[name]
        weights = bench_moe.make_experts(cfg, device)
        for tokens in args.tokens:
            for contestant in args.contestants:
                if contestant == "humming_moe" and humming is None:
                    continue
                profiled = profile_or_report(name, tokens, contestant, weights, humming, l2_bytes)
                if profiled is None:
                    bench_moe.free(device)
                    continue
                touched, times = profiled
                total = sum(us for _, us in times)
                print(
                    f"\n## {name} T={tokens} {contestant}: {len(times)} kernels, "
                    f"{total:.1f} us of GPU time, {touched / 1e6:.1f} MB of experts touched "
                    f"({touched / (total * 1e-6) / 1e12:.2f} TB/s over the kernels' sum)"
                )
                print("| # | kernel | us per call | share |")
                print("|---|---|---:|---:|")
                for i, (kernel, us) in enumerate(times):
                    print(f"| {i} | `{kernel[:NAME_CHARS]}` | {us:.2f} | {100 * us / total:.0f}% |")
                bench_moe.free(device)
        del weights
        bench_moe.free(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
