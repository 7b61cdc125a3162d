# SPDX-License-Identifier: BSD-3-Clause
"""The whole tree is ruff-clean (lint and format) at line length 100 (ruff.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    if shutil.which("ruff"):
        return ["ruff"]
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.skip("ruff is not installed (pip install ruff)")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=" ".join)
def test_ruff(command):
    proc = subprocess.run([*_ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kept_ptx_goes_to_a_dump_dir():
    """``--keep-ptx`` without ``--dump-dir`` writes PTX files into the working directory: a test
    run (or a user following a docstring) would litter the checkout. Tests take
    ``conftest.ptx_options``."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.glob("**/*.py"))
        if not {"build", ".device"} & set(path.relative_to(ROOT).parts)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "--keep-ptx" in line and "--dump-dir" not in line
    ]
    assert not offenders, offenders
