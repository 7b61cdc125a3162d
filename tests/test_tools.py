"""tools/mutate.py, the mutation harness: its mutant lists still apply to the code, and it tells
caught, missed, excluded, stale and hanging mutants apart (on a toy repository)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
sys.modules["mutate"] = mutate  # dataclasses look their module up there
_spec.loader.exec_module(mutate)


def test_every_mutant_applies_to_the_current_code() -> None:
    mutants = mutate.load_mutants()
    assert sum(m["file"] == "reference.py" for m in mutants) >= 20
    assert {m["id"]: mutate.staleness(m) for m in mutants if mutate.staleness(m)} == {}
    for m in mutants:
        paths = [t.split("::")[0] for t in m["tests"] if t.startswith("tests/")]
        assert paths and all((ROOT / p).exists() for p in paths), m["id"]


TOY_MODULE = """def add(a, b):
    return a + b


def spin():
    return 0
"""

TOY_TEST = """from mod import add


def test_add():
    assert add(2, 3) == 5
    assert add(-1, 1) == 0
"""

TOY_MUTANTS = """T = ["tests/test_mod.py"]
M = {"file": "mod.py", "tests": T, "klass": "arith"}
MUTANTS = [
    {**M, "id": "toy-minus", "old": "return a + b", "new": "return a - b"},
    {**M, "id": "toy-swapped", "old": "return a + b", "new": "return b + a"},
    {**M, "id": "toy-proved", "old": "return a + b", "new": "return (a + b)",
     "equivalent": "parentheses around the whole expression"},
    {**M, "id": "toy-gone", "old": "return a * b", "new": "return a"},
    {**M, "id": "toy-twice", "old": "return", "new": "return -1 +"},
    {**M, "id": "toy-hangs", "klass": "loop", "old": "return a + b",
     "new": "while True: pass"},
    {**M, "id": "toy-crashes", "klass": "loop", "old": "return a + b",
     "new": "import os; os.abort()"},
]
"""


def test_harness_on_a_toy_repository(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "mod.py").write_text(TOY_MODULE)
    (tmp_path / "tests" / "test_mod.py").write_text(TOY_TEST)
    (tmp_path / "tools" / "mutants_reference.py").write_text(TOY_MUTANTS)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)

    code = mutate.main(["--root", str(tmp_path), "--jobs", "2", "--timeout", "6"])
    out = capsys.readouterr().out
    assert code == 1  # stale mutants
    table = out[out.index("\nstatus") :]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.strip():
            break
        status, rest = line[:21].strip(), line[21:].split()
        rows[rest[0]] = (status, rest[-1])
    assert {k: v[0] for k, v in rows.items()} == {
        "toy-minus": "caught",
        "toy-swapped": "NOT CAUGHT",
        "toy-proved": "excluded (equivalent)",
        "toy-gone": "STALE",
        "toy-twice": "STALE",
        "toy-hangs": "caught (timeout)",
        "toy-crashes": "caught (crash)",
    }
    assert rows["toy-minus"][1] == "tests/test_mod.py::test_add"
    assert "arith                        caught   1 of   2  50.0%" in out
    assert "loop                         caught   2 of   2 100.0%" in out
    assert "old text not found in mod.py" in out and "old text found 2 times in mod.py" in out


def test_harness_keeps_dependencies_found_through_pythonpath(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dependency that only PYTHONPATH finds (a DSL unpacked into a folder) stays importable
    in the copies, while PYTHONPATH's entries inside the repository are dropped (the copy must
    be the one imported): the baseline passes and a mutant is caught."""
    repo, deps = tmp_path / "repo", tmp_path / "deps"
    (repo / "tests").mkdir(parents=True)
    (repo / "tools").mkdir()
    deps.mkdir()
    (deps / "toydep.py").write_text("ONE = 1\n")
    (repo / "mod.py").write_text("import toydep\n\n\ndef inc(a):\n    return a + toydep.ONE\n")
    # (a file the copies lack: git ignores it; the root's PYTHONPATH entry must not reach it)
    (repo / ".gitignore").write_text("leak.py\n")
    (repo / "leak.py").write_text("")
    (repo / "tests" / "test_mod.py").write_text(
        "import importlib.util\n\nfrom mod import inc\n\n\ndef test_inc():\n"
        "    assert inc(2) == 3\n    assert importlib.util.find_spec('leak') is None\n"
    )
    (repo / "tools" / "mutants_reference.py").write_text(
        'MUTANTS = [{"id": "toy-dec", "klass": "arith", "file": "mod.py", '
        '"old": "a + toydep.ONE", "new": "a - toydep.ONE", "tests": ["tests/test_mod.py"]}]\n'
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(repo), str(deps)]))

    code = mutate.main(["--root", str(repo), "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "passes" in out and "caught   1 of   1 100.0%" in out


@pytest.mark.parametrize("driver", ["sanitize_moe", "sanitize_layers"])
@pytest.mark.parametrize("argv", [["--bogus"], ["extra"]])
def test_sanitizer_drivers_refuse_arguments_they_do_not_take(driver, argv, capsys):
    """The sanitizer drivers take no option: anything given is refused (exit 2), not ignored
    while a full sanitizer run starts."""
    import importlib

    tool = importlib.import_module(f"tools.{driver}")
    with pytest.raises(SystemExit) as exit_:
        tool.main(argv)
    assert exit_.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["\u00b2", "\u0663", "0", "-1", "1.5", ""])
def test_benchmark_positive_int_refuses_what_int_does_not_take(text, capsys):
    """str.isdigit() accepts superscripts and other scripts' digits, which int() refuses:
    such a --reps must be refused by argparse (exit 2), never a traceback."""
    import argparse

    from benchmarks import args

    with pytest.raises(SystemExit) as exit_:
        args.positive_int(argparse.ArgumentParser(), "--reps", text)
    assert exit_.value.code == 2
    assert "--reps takes a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module, flag",
    [
        ("linear", "--out"),
        ("model", "--out"),
        ("moe", "--json"),
        ("stack", "--json"),
    ],
)
@pytest.mark.parametrize("where", ["folder", "under-a-file", "virtual", "virtual-file"])
def test_benchmark_output_paths_are_refused_before_the_run(module, flag, where, tmp_path, capsys):
    """A results path the run could not write at its end (a folder; a path under a file; under a
    virtual file system's folder, which root's os.access calls writable) is refused with exit 2
    as the arguments are read, not by a traceback after the measurements; a path under folders
    still to be made is taken."""
    import importlib

    bench = importlib.import_module(f"benchmarks.{module}")
    (tmp_path / "afile").write_text("")
    bad = {
        "folder": str(tmp_path),
        "under-a-file": str(tmp_path / "afile" / "out.json"),
        "virtual": "/proc/fp4-ops-none/out.json",
        "virtual-file": "/proc/fp4-ops-out.json",
    }[where]
    if where.startswith("virtual") and not os.path.isdir("/proc"):
        pytest.skip("no /proc on this machine")
    # (benchmarks.model refuses a machine without a GPU unless told to run on the CPU)
    runs_here = ["--config", "tiny", "--device", "cpu"] if module == "model" else []
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args([*runs_here, flag, bad])
    assert exit_.value.code == 2
    assert f"{flag} " in (err := capsys.readouterr().err) and bad in err
    good = str(tmp_path / "new" / "deeper" / "out.json")
    assert getattr(bench.parse_args([*runs_here, flag, good]), flag[2:]) == good
    # (the folders are made now; the probe that showed them writable is gone)
    assert list((tmp_path / "new" / "deeper").iterdir()) == []


@pytest.mark.parametrize(
    "module", ["eager", "linear", "model", "moe", "moe_profile", "sm90", "stack"]
)
def test_benchmark_help_names_the_command_and_describes_it(module, capsys):
    """--help: usage names ``python -m benchmarks.<module>``, and the description is the
    docstring's whole first paragraph, one sentence to its full stop."""
    import importlib

    bench = importlib.import_module(f"benchmarks.{module}")
    entry = getattr(bench, "parse_args", None) or bench.main
    with pytest.raises(SystemExit) as exit_:
        entry(["--help"])
    assert exit_.value.code == 0
    # (argparse wraps lines, at hyphens too: compare with whitespace and hyphen breaks undone)
    out = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    assert out.startswith(f"usage: python -m benchmarks.{module} ")
    first = " ".join(bench.__doc__.split("\n\n")[0].split()).rstrip(":.")
    assert f"{first.replace('- ', '-')}. options:" in out


@pytest.mark.parametrize("ordered", [True, False], ids=["allowed-order", "given-order"])
def test_benchmark_names_are_each_taken_once(ordered):
    """A name given twice (``--stack a,a``, ``--config x,x``) is measured and reported once,
    in either order the benchmark asks for."""
    import argparse

    from benchmarks import args

    allowed = ("a", "b", "c")
    got = args.names(argparse.ArgumentParser(), "--stack", "c,a,c,a", allowed, ordered)
    assert got == (["a", "c"] if ordered else ["c", "a"])
