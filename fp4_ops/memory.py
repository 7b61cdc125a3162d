# SPDX-License-Identifier: BSD-3-Clause
"""Memory that an op keeps across calls (workspaces, index tables), made outside every CUDA graph's
memory pool; the one rule for the operand memory the kernels read (``aligned_rows``); and the
current stream's handle, device and capture state, which every eager launch asks for.

While CUDA-graph trees (``torch.compile(mode="reduce-overhead")``) warm up or record a graph, torch
routes the allocations of the recording thread and stream into the graph's private pool, and it
refuses a graph that leaves a tensor alive there which is none of its outputs. So what an op keeps
for later calls is made on a thread of its own, which no graph pool serves.
"""

from __future__ import annotations

import threading

import torch


def persistent(make, device: torch.device):
    """``make()`` on a thread of its own with ``device`` current, its GPU work finished before
    this returns (so any stream may use the result); its exception is raised here. CPU devices
    run ``make()`` as it is. Callers refuse to get here under CUDA-graph capture."""
    if device.type != "cuda":
        return make()
    result = {}

    def run():
        try:
            with torch.cuda.device(device):
                result["value"] = make()
                torch.cuda.current_stream(device).synchronize()
        except BaseException as err:  # (handed to the calling thread)
            result["error"] = err

    thread = threading.Thread(target=run, name="fp4_ops-persistent-memory")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def kept(cache: dict, key, make, device: torch.device):
    """``cache[key]``, made by ``make()`` (a tensor or a tuple of them, used on the current
    stream) through ``persistent`` at its first use; None under CUDA-graph capture, where a
    graph must keep its own tensors (a replay could otherwise race eager calls that share them).
    A cache of ``MAX_KEPT`` entries starts over: what callers still hold stays alive, and what
    they drop is freed once the kernels queued on its stream have finished."""
    if torch.cuda.is_current_stream_capturing():
        return None
    found = cache.get(key)
    if found is None:
        if len(cache) >= MAX_KEPT:
            cache.clear()
        found = cache[key] = persistent(make, device)
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            for t in found if isinstance(found, tuple) else (found,):
                t.record_stream(stream)
    return found


#: entries past which a ``kept`` cache starts over (one per shape would grow it forever)
MAX_KEPT = 64


def aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """t, contiguous from a 16-byte aligned base (what TMA and the kernels' 16-byte vector
    loads read): copied only if it is not."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def stream_handle(device_index: int) -> int:
    """The raw handle of ``device_index``'s current CUDA stream, what the kernels launch on:
    torch's own getter (the one Triton launches with), without building a Stream object; the
    public API where a torch build lacks it."""
    if _RAW_STREAM is None:
        return torch.cuda.current_stream(device_index).cuda_stream
    return _RAW_STREAM(device_index)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_device() -> int:
    """``torch.cuda.current_device()`` for a caller that holds a CUDA tensor (so CUDA is
    initialised): torch's getter without the lazy-initialisation check around it."""
    return _GET_DEVICE()


def capturing() -> bool:
    """``torch.cuda.is_current_stream_capturing()`` for a caller that holds a CUDA tensor,
    without the initialisation check around torch's getter."""
    return _CAPTURING()


_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_CAPTURING = getattr(
    torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
)


def unit_scale(device: torch.device) -> torch.Tensor:
    """A float32 1.0 on ``device``: the scale of a kernel's alpha where the caller gives none."""
    return device_scalar(1.0, device)


def device_scalar(value: float, device: torch.device) -> torch.Tensor:
    """A 0-d float32 ``value`` on ``device``, made once outside every graph pool, for kernels
    that read a constant scale from device memory."""
    key = (value, device.type, device.index)
    if key not in _SCALARS:
        make = lambda: torch.full((), value, dtype=torch.float32, device=device)  # noqa: E731
        _SCALARS[key] = persistent(make, device)
    return _SCALARS[key]


# ((value, device type, index) -> its device_scalar)
_SCALARS: dict[tuple, torch.Tensor] = {}
