# SPDX-License-Identifier: BSD-3-Clause
"""The GitHub Actions workflows and run_tests.sh: parsed and checked on the CPU.

.github/workflows/cpu.yml runs ./run_tests.sh on ubuntu-latest with a CPU torch;
.github/workflows/b200.yml runs it and the CLI at its defaults on a self-hosted B200 runner and
keeps their output. run_tests.sh announces the GPU suite the tests' skip conditions run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import blockwise_gemm_fp4 as bw

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict), name
    # (YAML 1.1 reads the key "on" as the boolean True)
    data["on"] = data.pop(True, data.get("on"))
    return data


def _steps(workflow: dict) -> list[dict]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


def _runs(workflow: dict) -> list[str]:
    return [step["run"] for step in _steps(workflow) if "run" in step]


def test_every_workflow_file_is_checked_here():
    assert sorted(p.name for p in WORKFLOWS.iterdir()) == ["b200.yml", "cpu.yml"]


@pytest.mark.parametrize("name", ["cpu.yml", "b200.yml"])
def test_workflow_structure(name):
    workflow = _workflow(name)
    assert workflow["name"] and workflow["on"]
    (job,) = workflow["jobs"].values()
    assert 0 < job["timeout-minutes"] <= 90
    steps = job["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    for step in steps:
        assert ("run" in step) != ("uses" in step), step
        if "run" in step:
            # bash -eo pipefail: a failing command in "cmd | tee log" fails the step
            assert step.get("shell") == "bash", step
            proc = subprocess.run(["bash", "-n"], input=step["run"], text=True, capture_output=True)
            assert proc.returncode == 0, proc.stderr
    # the suite itself, through the one test command
    assert any(re.search(r"(^|\s)\./run_tests\.sh(\s|$)", run) for run in _runs(workflow))


def test_cpu_workflow_uses_a_cpu_torch_on_ubuntu():
    workflow = _workflow("cpu.yml")
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    runs = _runs(workflow)
    install = [r for r in runs if "pip install torch" in r]
    assert len(install) == 1 and "--index-url https://download.pytorch.org/whl/cpu" in install[0]
    # the same torch run_tests.sh would install, installed before run_tests.sh runs
    pinned = re.search(r"pip install -q (torch==\S+)", (ROOT / "run_tests.sh").read_text())
    assert pinned and pinned.group(1) in install[0]
    assert runs.index(install[0]) < next(i for i, r in enumerate(runs) if "./run_tests.sh" in r)
    assert {"push", "pull_request"} <= set(workflow["on"])


def test_b200_workflow_runs_suite_and_cli_defaults_and_keeps_output():
    workflow = _workflow("b200.yml")
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "b200"]
    runs = _runs(workflow)
    suite = next(r for r in runs if "./run_tests.sh" in r)
    cli = next(r for r in runs if "blockwise_gemm_fp4.py" in r)
    # the CLI at its defaults: no option at all
    assert re.search(r"python blockwise_gemm_fp4\.py 2>&1 \| tee (\S+)", cli)
    logs = re.findall(r"tee (\S+)", suite + cli)
    assert len(logs) >= 2
    upload = next(s for s in _steps(workflow) if s.get("uses", "").startswith("actions/upload"))
    assert upload["if"] == "always()"
    folder = upload["with"]["path"].rstrip("/")
    assert all(log.startswith(folder + "/") for log in logs), (logs, folder)


def _run_tests_gpu_probe() -> str:
    text = (ROOT / "run_tests.sh").read_text()
    found = re.search(r"<<'PYEOF'\n(.*?)\nPYEOF\n", text, re.S)
    assert found, "run_tests.sh's GPU probe not found"
    return found.group(1)


@pytest.mark.parametrize(
    "capability,family",
    [((10, 0), "blackwell"), ((10, 3), "blackwell"), ((9, 0), "hopper"), ((12, 0), "other")],
)
def test_run_tests_announces_the_suite_the_skips_run(tmp_path, capability, family):
    """run_tests.sh's GPU probe, run against a stand-in torch reporting a GPU, names the suite
    the tests' skip conditions (bw.BLACKWELL_CAPABILITIES) run."""
    stub = tmp_path / "torch"
    stub.mkdir()
    (stub / "__init__.py").write_text(
        "class cuda:\n"
        "    is_available = staticmethod(lambda: True)\n"
        f"    get_device_capability = staticmethod(lambda *_: {capability!r})\n"
        "    get_device_name = staticmethod(lambda *_: 'Stand-in GPU')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _run_tests_gpu_probe()],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    major, minor = capability
    assert proc.stdout.split() == [family, "Stand-in", "GPU", f"(sm_{major}{minor})"]
    assert (family == "blackwell") == (capability in bw.BLACKWELL_CAPABILITIES)
