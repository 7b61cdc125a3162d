"""Shared pytest setup.

* The package is installed (``pip install -e .``, as ``run_tests.sh`` does); the test oracle
  ``reference.py`` and the benchmarks are importable from the repository root through pytest's
  ``pythonpath`` setting (pytest.ini).
* Every GPU test has a timeout, so a kernel that hangs (a multicast or pipeline bug) fails the
  run instead of stalling it. A test is a GPU test when it is marked ``@pytest.mark.gpu``, when
  its function name contains ``gpu`` or ``cuda``, or when one of its ``skipif`` marks gives a
  reason that names a GPU ("CUDA", "GPU", "B200", "sm_100", ...). Such a test gets the ``gpu``
  mark (select with ``-m gpu`` / ``-m "not gpu"``) and
  ``@pytest.mark.timeout(GPU_TIMEOUT_S, method="thread")`` unless it has a ``timeout`` mark of
  its own; give a longer test its own ``@pytest.mark.timeout(seconds, method="thread")``.

NOTE: the thread method is the one that ends a hang inside a CUDA call (a signal handler runs
only once the call returns); it prints every thread's stack and exits pytest with an error.
A test of FP4Experts standing in for transformers' experts modules is marked ``fused_experts``:
it is skipped under transformers 4.x, whose MoE models hold per-expert MLPs instead.
The timeouts come from pytest-timeout (``pip install -e .[test]``); without it they are off, and the
report header says so.
"""

import atexit
import functools
import re
import shutil
import tempfile
from importlib import metadata

import pytest

#: Seconds a GPU test may run: a JIT compile plus the run takes well under a minute.
GPU_TIMEOUT_S = 300

#: what a ``fused_experts`` test needs; skipped under transformers 4.x
FUSED_EXPERTS_REASON = (
    "needs transformers 5's fused experts modules (gate_up_proj / down_proj [E, ...], forward "
    "on top-k ids and weights); transformers 4.x has per-expert MLPs (FP4Linear each)"
)
_GPU_NAME = re.compile(r"gpu|cuda", re.IGNORECASE)
_GPU_REASON = re.compile(r"\b(CUDA|GPUs?|B200|GB200|B300|H100|H200|sm_\d+a?)\b")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"gpu: runs on a CUDA GPU; gets a {GPU_TIMEOUT_S} s timeout unless it has its own "
        "timeout mark (tests/conftest.py)",
    )
    config.addinivalue_line("markers", f"fused_experts: {FUSED_EXPERTS_REASON}")
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line(
            "markers", "timeout(seconds, method): a time limit (needs pytest-timeout)"
        )


@functools.cache
def _transformers_major() -> int | None:
    try:
        return int(metadata.version("transformers").split(".")[0])
    except metadata.PackageNotFoundError:
        return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    # (transformers 4.x keeps MoE experts as a ModuleList of MLPs, with another forward)
    if item.get_closest_marker("fused_experts") is None:
        return
    major = _transformers_major()
    if major is not None and major < 5:
        pytest.skip(FUSED_EXPERTS_REASON)


def pytest_report_header(config: pytest.Config) -> str:
    if config.pluginmanager.hasplugin("timeout"):
        return f"GPU tests: {GPU_TIMEOUT_S} s timeout each unless marked otherwise"
    return "GPU tests: NO timeout (pytest-timeout is missing: pip install -e .[test])"


def is_gpu_test(item: pytest.Item) -> bool:
    """True for a test marked ``gpu``, named for a GPU, or skipped for want of one."""
    if item.get_closest_marker("gpu") is not None:
        return True
    if _GPU_NAME.search(getattr(item, "originalname", item.name)):
        return True
    return any(
        _GPU_REASON.search(str(mark.kwargs.get("reason", "")))
        for mark in item.iter_markers("skipif")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not is_gpu_test(item):
            continue
        if item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(GPU_TIMEOUT_S, method="thread"))


@functools.cache
def _ptx_folder() -> str:
    folder = tempfile.mkdtemp(prefix="fp4-ptx-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def ptx_options(arch: str = "sm_90a") -> str:
    """``cute.compile`` options that cross-compile for ``arch`` and keep the PTX (``__ptx__``)
    in a folder of this process, not in the working directory (where PTX kept without a dump
    folder goes)."""
    return f"--gpu-arch {arch} --keep-ptx --dump-dir={_ptx_folder()}"


def exported_tvm_ffi_function(compiled, tmp_path):
    """A TVM-FFI compiled kernel exported ahead of time and loaded back: callable without a GPU
    up to the CUDA runtime, which fails (no driver), after the arguments were checked."""
    import subprocess

    import cutlass.cute as cute

    compiled.export_to_c(str(tmp_path / "kernel.o"), function_name="kernel")
    libraries = cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)
    so = tmp_path / "kernel.so"
    subprocess.run(
        ["gcc", "-shared", "-o", str(so), str(tmp_path / "kernel.o"), *libraries], check=True
    )
    return cute.runtime.load_module(str(so), enable_tvm_ffi=True).kernel


@pytest.fixture
def set_default_dtype():
    """``torch.set_default_dtype`` for the rest of a test; its end restores the default."""
    import torch

    old = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(old)
