# SPDX-License-Identifier: BSD-3-Clause
"""What the library compiles or makes once per device is kept per device.

Each compiled launcher bakes in its device's SM count (the persistent grids' size) and each kept
scalar lives in its device's memory, so a cache keyed without the device index hands a second
GPU the first one's kernel or a pointer into another GPU's memory: a silent error on a
multi-GPU host that a one-GPU test machine never sees. Here two fake CUDA devices with different
SM counts stand in for them (no GPU needed): torch.cuda.device, the SM-count queries and the
compilers are replaced by recorders, and every per-device cache must compile (or make) once per
device, under that device, with its SM count, and reuse the entry on a second call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from fp4_ops import memory, moe_kernels, quantizer
from fp4_ops.sm90 import launcher, tokens_step

SMS = {0: 132, 1: 78}  # two devices that differ in what a compiled launcher bakes in


class FakeGpus:
    """torch.cuda.device and get_device_properties over ``SMS``; ``made`` records, for each
    compilation, the device current while it ran and the SM count it was given."""

    def __init__(self, monkeypatch):
        self.current = None
        self.made = []
        monkeypatch.setattr(torch.cuda, "device", self.device)
        props = lambda d: SimpleNamespace(multi_processor_count=SMS[self.index(d)])  # noqa: E731
        monkeypatch.setattr(torch.cuda, "get_device_properties", props)

    @staticmethod
    def index(device) -> int:
        return device if isinstance(device, int) else torch.device(device).index

    def device(self, device):
        gpus = self

        class Current:
            def __enter__(self):
                self.outer, gpus.current = gpus.current, gpus.index(device)

            def __exit__(self, *exc):
                gpus.current = self.outer

        return Current()

    def compiled(self, sms=None):
        """A stand-in compiled program made under the current device."""
        made = (self.current, sms)
        self.made.append(made)
        return SimpleNamespace(__tvm_ffi_object__=lambda: made)


@pytest.fixture
def gpus(monkeypatch):
    return FakeGpus(monkeypatch)


def _check_per_device(gpus, get, expect):
    """``get(index)`` for devices 0 and 1, then again: each device's entry is ``expect(index)``
    (made under that device, with its SM count, where the function sets them), made once."""
    first = {i: get(i) for i in (0, 1)}
    for i in (0, 1):
        assert first[i] == expect(i), f"device {i} got another device's entry"
    assert (get(0), get(1)) == (first[0], first[1])
    assert len(gpus.made) == 2, "a device's entry was made again, or one served both"


def test_device_scalar_is_made_on_each_device(monkeypatch):
    monkeypatch.setattr(memory, "_SCALARS", {})
    monkeypatch.setattr(memory, "persistent", lambda make, device: ("made on", device))
    for value in (1.0, 0.5):
        for index in (0, 1, 0):
            device = torch.device("cuda", index)
            assert memory.device_scalar(value, device) == ("made on", device)


def test_quantizer_launcher_per_device(gpus, monkeypatch):
    monkeypatch.setattr(quantizer, "_KERNELS", {})
    monkeypatch.setattr(quantizer, "_LAUNCHERS", {})
    monkeypatch.setattr(quantizer, "compile_quantizer", lambda *a, **k: gpus.compiled())

    def get(index):
        return quantizer._kernel(torch.bfloat16, 16, True, index)

    _check_per_device(gpus, get, lambda i: ((i, None), SMS[i]))


def test_gemm_launcher_per_device(gpus, monkeypatch):
    @dataclass(frozen=True)
    class Config:  # the part of a GemmConfig that _compiled reads
        c_dtype: str = "BFloat16"

        def kernel(self):
            return "kernel"

    monkeypatch.setattr(launcher, "_KERNELS", {})
    monkeypatch.setattr(launcher, "gpu_sm_count", lambda index: SMS[index])
    compile_kernel = lambda kernel, c_dtype, sms, options: gpus.compiled(sms)  # noqa: E731
    monkeypatch.setattr(launcher, "compile_kernel", compile_kernel)
    # (it compiles under the current device, which its callers make x's)
    get = lambda i: launcher._compiled(Config(), i)  # noqa: E731
    _check_per_device(gpus, get, lambda i: ("kernel", (None, SMS[i])))


def test_tokens_step_per_device(gpus, monkeypatch):
    monkeypatch.setattr(tokens_step, "_STEPS", {})
    monkeypatch.setattr(tokens_step, "gpu_sm_count", lambda index: SMS[index])
    step = lambda quantizer, gemm, sms, options: gpus.compiled(sms)  # noqa: E731
    monkeypatch.setattr(tokens_step, "compile_tokens_step", step)

    def get(index):
        return tokens_step._function("quantizer config", "gemm config", index)

    _check_per_device(gpus, get, lambda i: (i, SMS[i]))


def test_moe_kernels_per_device(gpus, monkeypatch):
    @dataclass(frozen=True)
    class Config:
        name: str = "routing"

        def compile(self, options):
            return gpus.compiled()

    monkeypatch.setattr(moe_kernels, "_KERNELS", {})

    def get(index):
        return moe_kernels._function(Config(), torch.device("cuda", index))

    _check_per_device(gpus, get, lambda i: ((i, None), SMS[i]))
