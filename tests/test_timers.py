# SPDX-License-Identifier: BSD-3-Clause
"""The benchmarks' timers against an independent measure (any CUDA GPU).

Every figure the benchmarks print comes from one of these timers, and every ratio divides two
of their readings, so a timer that divides by the wrong count, times its warm-up call or skips
calls it was given is wrong everywhere at once. The measure they are checked against: the GPU
spinning a fixed number of cycles (``torch.cuda._sleep``), each spin timed alone between two
events; the calls' first (warm-up) invocation spins far longer than the later ones.
"""

from __future__ import annotations

import os
import statistics

import pytest
import torch

from benchmarks import linear as bench_linear
from benchmarks import sm90 as bench_sm90
from benchmarks import stack as bench_stack
from fp4_ops import devtools

# (a spin timed while other workers' kernels share the GPU runs long by their time slices)
SHARED_GPU = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (any)"),
    pytest.mark.skipif(
        SHARED_GPU, reason="times the GPU, which other xdist workers share: run it without -n"
    ),
]

CYCLES = 400_000  # (a spin of about 0.2 ms: launch gaps of a few microseconds stay under 3%)
WARMUP_FACTOR = 20  # (a first call as slow as a compile: timing it would show)


def _spin(cycles: int):
    """A call whose first invocation spins ``WARMUP_FACTOR`` x ``cycles``, later ones
    ``cycles``, on the current stream."""
    calls = []

    def call():
        torch.cuda._sleep(cycles * (WARMUP_FACTOR if not calls else 1))
        calls.append(None)

    return call


def _alone_us(cycles: int) -> float:
    """Median of five spins of ``cycles``, each between two events of its own."""
    torch.cuda._sleep(cycles)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


# (each: the calls, timed as the benchmarks time them -> microseconds per call)
TIMERS = {
    "devtools.time_graph_us": lambda calls: devtools.time_graph_us(calls[0], 10, 3),
    "devtools.time_eager_us": lambda calls: devtools.time_eager_us(calls[0], 10),
    "linear.time_graph_us": lambda calls: bench_linear.time_graph_us(
        calls, torch.cuda.Stream(), min_calls=10, replays=3
    ),
    "sm90.time_graph": lambda calls: bench_sm90.time_graph(calls, reps=10, replays=3) * 1e6,
}
# (these cycle through several calls; the others time one)
CYCLING = {"linear.time_graph_us", "sm90.time_graph"}


@pytest.mark.parametrize("timer", sorted(TIMERS))
def test_timer_reads_the_mean_of_its_calls_without_the_warmup(timer):
    """The reading is the mean time of one call of those given (two calls of one and three
    spins' length where the timer cycles through several), not of the warm-up call."""
    cycles = [CYCLES, 3 * CYCLES] if timer in CYCLING else [CYCLES]
    want = statistics.mean(_alone_us(c) for c in cycles)
    got = TIMERS[timer]([_spin(c) for c in cycles])
    # (the clock may move between the alone spins and the timed ones; a wrong count, a timed
    # warm-up or one call of two is off by 1.5x or more)
    assert 0.85 * want < got < 1.15 * want, (got, want)


def test_the_copy_bandwidths_agree():
    """The stack benchmark's copy bandwidth (1 GiB, ``time_eager_us``) and the sm90 one's (2 GiB,
    events around each copy): two measures of the same rate, each counting the bytes read and
    written."""
    stack = bench_stack.copy_bandwidth(torch.device("cuda"))
    sm90 = bench_sm90.copy_bandwidth()
    assert 0.9 < stack / sm90 < 1.1, (stack, sm90)
