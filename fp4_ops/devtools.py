# SPDX-License-Identifier: BSD-3-Clause
"""Tools the kernels' command lines, the benchmarks and the tests share: GPU checks, CUDA-graph
timing, cold-L2 operand sets, cuobjdump look-ups and command-line parsing.

(``blockwise_gemm_fp4.py`` at the repository root keeps its own copies: it is a template that
must run copied alone.)
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sysconfig


class UsageError(Exception):
    """A bad command line or an unsupported configuration: printed, exit code 2."""


def parse_ints(text: str, count: int, flag: str) -> tuple[int, ...]:
    """``count`` comma-separated integers of option ``flag`` (argparse's ``type``)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} expects {count} comma-separated integers"
        ) from None
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"{flag} expects {count} integers, got {text!r}")
    return values


def gpu_runs(capabilities, device=None) -> tuple[bool, str]:
    """(is ``device`` (default: the current GPU) one of the compute ``capabilities``, its
    description)."""
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    return (major, minor) in capabilities, f"{name} (sm_{major}{minor})"


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, or from the ``nvidia-cuda-cuobjdump`` wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    pattern = os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "*", "bin", "cuobjdump")
    matches = sorted(glob.glob(pattern))
    return matches[0] if matches else None


def cubin_resource_usage(cubin_path: str) -> dict[str, int | str]:
    """Name, REG, STACK, SHARED, LOCAL of the first kernel in a cubin (``cuobjdump -res-usage``)."""
    tool = find_cuobjdump()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    text = subprocess.run(
        [tool, "-res-usage", cubin_path], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump output:\n{text}")
    name, *counts = found.groups()
    usage: dict[str, int | str] = {"name": name}
    usage.update(zip(("REG", "STACK", "SHARED", "LOCAL"), map(int, counts), strict=True))
    return usage


def files_written(folder: str, before: dict[str, int], suffix: str) -> list[str]:
    """Files of ``folder`` ending in ``suffix`` that are new or changed since ``before``
    (``snapshot(folder)``)."""
    paths = (os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(suffix))
    return sorted(p for p in paths if before.get(p) != os.stat(p).st_mtime_ns)


def snapshot(folder: str) -> dict[str, int]:
    """path -> modification time (ns) of every file in ``folder``."""
    return {
        os.path.join(folder, f): os.stat(os.path.join(folder, f)).st_mtime_ns
        for f in os.listdir(folder)
    }


def time_us(calls, stream, warmup_iterations: int, iterations: int) -> float:
    """Mean time of one call in microseconds, from ``cutlass.testing.benchmark`` with CUDA
    graphs: warm-up and timed calls each captured into a graph on ``stream``, rotating through
    ``calls`` (one per operand set). Every call must enqueue its work on ``stream``."""
    import cuda.bindings.driver as cuda_driver
    from cutlass.testing import JitArguments, benchmark

    workspaces = iter([JitArguments(call) for call in calls])
    return benchmark(
        _call,
        workspace_generator=lambda: next(workspaces),
        workspace_count=len(calls),
        warmup_iterations=warmup_iterations,
        iterations=iterations,
        stream=cuda_driver.CUstream(stream.cuda_stream),
        use_cuda_graphs=True,
    )


def _call(launch) -> None:
    launch()


def operand_sets(tensors, use_cold_l2: bool, warmup_iterations: int, iterations: int):
    """``[tensors]``, plus copies (``use_cold_l2``) so that rotating through them reads the
    operands from DRAM: as many sets as ``cutlass.testing.get_workspace_count`` asks for."""
    from cutlass.testing import get_workspace_count

    sets = [tuple(tensors)]
    if use_cold_l2:
        one = sum(t.numel() * t.element_size() for t in tensors if t is not None)
        count = get_workspace_count(one, warmup_iterations, iterations)
        sets += [tuple(t if t is None else t.clone() for t in tensors) for _ in range(count - 1)]
    return sets


def captured_graph(fn, iterations: int):
    """A CUDA graph of ``iterations`` calls of ``fn``, captured on a side stream after one call
    that compiles and warms up there, and replayed once."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(iterations):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graph_us(fn, iterations: int = 20, repeats: int = 5) -> float:
    """Mean microseconds per call of ``fn`` (enqueue-only, no host sync), from a CUDA graph of
    ``iterations`` calls replayed ``repeats`` times on a side stream."""
    import torch

    graph = captured_graph(fn, iterations)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (iterations * repeats)


def time_eager_us(fn, iterations: int = 5) -> float:
    """Mean microseconds per call of ``fn`` run eagerly (for code that syncs with the host)."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iterations
