"""The suite's own setup (tests/conftest.py): which tests count as GPU tests and get a timeout.

A pytest subprocess collects a file of stand-in tests next to a copy of the conftest; a small
plugin prints each collected test's ``gpu`` and ``timeout`` marks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import conftest

STAND_INS = """
import pytest

no_gpu = pytest.mark.skipif(False, reason="needs a B200 (sm_100) GPU")

def test_plain():
    pass

def test_gpu_named():
    pass

def test_cuda_named():
    pass

@pytest.mark.gpu
def test_marked():
    pass

@no_gpu
def test_skipped_without_a_gpu():
    pass

@pytest.mark.skipif(False, reason="no CUDA device")
def test_needs_cuda():
    pass

@pytest.mark.skipif(False, reason="needs an sm_90 GPU (H100 / H200)")
def test_needs_hopper():
    pass

@pytest.mark.skipif(False, reason="python too old")
def test_other_skip():
    pass

@pytest.mark.gpu
@pytest.mark.timeout(900, method="thread")
def test_own_timeout():
    pass

@pytest.mark.parametrize("message", ["a CUDA tensor", "other"])
def test_param_id_names_a_device(message):
    pass
"""

REPORTER = """
def pytest_report_collectionfinish(items):
    lines = []
    for item in items:
        gpu = item.get_closest_marker("gpu") is not None
        t = item.get_closest_marker("timeout")
        timeout = (t.args, t.kwargs.get("method")) if t else None
        lines.append(f"MARKS|{item.name}|gpu={gpu} timeout={timeout}")
    return lines
"""


def test_gpu_tests_get_the_gpu_mark_and_a_thread_timeout(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(conftest.__file__, tests / "conftest.py")
    (tests / "test_stand_ins.py").write_text(STAND_INS)
    (tmp_path / "marks_reporter.py").write_text(REPORTER)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-p", "marks_reporter", "tests"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    marks = dict(
        line.split("|")[1:] for line in proc.stdout.splitlines() if line.startswith("MARKS|")
    )
    default = f"gpu=True timeout=(({conftest.GPU_TIMEOUT_S},), 'thread')"
    expected = {
        "test_plain": "gpu=False timeout=None",
        "test_gpu_named": default,
        "test_cuda_named": default,
        "test_marked": default,
        "test_skipped_without_a_gpu": default,
        "test_needs_cuda": default,
        "test_needs_hopper": default,
        "test_other_skip": "gpu=False timeout=None",
        "test_own_timeout": "gpu=True timeout=((900,), 'thread')",
        # a parameter id that mentions CUDA does not make a CPU test a GPU test
        "test_param_id_names_a_device[a CUDA tensor]": "gpu=False timeout=None",
        "test_param_id_names_a_device[other]": "gpu=False timeout=None",
    }
    assert marks == expected
