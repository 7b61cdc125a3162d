"""Mutation testing, run by hand: plant one small bug at a time and check that the tests catch it.

    python tools/mutate.py                   # every mutant, one at a time
    python tools/mutate.py --jobs 2          # two mutants at once
    python tools/mutate.py --only ref-       # the mutants whose id starts with "ref-"
    python tools/mutate.py --list            # list them (and any stale ones) without running

The mutants come from ``MUTANTS`` in ``tools/mutants_reference.py``, ``tools/mutants_blackwell.py``,
``tools/mutants_hopper.py`` and ``tools/mutants_library.py`` (those present). Each is a dict::

    {
        "id": "ref-abs-sum-factored",     # unique
        "klass": "abs_product_sum",       # the kind of bug, for the summary
        "file": "reference.py",           # repository-relative
        "old": "...",                     # text that occurs exactly once in the file
        "new": "...",                     # what replaces it
        "tests": ["tests/test_reference.py"],  # pytest arguments
        "equivalent": "...",              # optional: the proof that it cannot change behaviour
    }

Each mutant is applied to a fresh copy, in a temporary folder, of the repository as it was when
the harness started (the files git tracks, plus untracked ones it does not ignore), and
``python -m pytest -x -q -p no:cacheprovider TESTS`` runs there: a failing run (exit status 1),
one killed by a signal (a crash: SIGSEGV, SIGFPE, ...) or one past ``--timeout`` has caught the
mutant, a passing one has not, anything else (a collection error, no tests) is an error. A
mutant whose ``old`` text is missing or occurs more than once is STALE: update it when the code
changes. The tests first run once unmutated per distinct ``tests`` list (the baseline); a
failing baseline makes its mutants errors. Mutants with an ``equivalent`` proof that are not
caught are excluded from the score.

Exit status: 0 when every mutant ran, 1 when any is stale or an error, 2 on bad arguments or a
malformed mutant list.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTS = (
    "mutants_reference.py",
    "mutants_blackwell.py",
    "mutants_hopper.py",
    "mutants_library.py",
)
REQUIRED = {"id": str, "klass": str, "file": str, "old": str, "new": str, "tests": list}
OPTIONAL = {"equivalent": str}

CAUGHT, TIMEOUT, CRASH, MISSED, EXCLUDED, STALE, ERROR = (
    "caught",
    "caught (timeout)",
    "caught (crash)",
    "NOT CAUGHT",
    "excluded (equivalent)",
    "STALE",
    "ERROR",
)


class MutantListError(Exception):
    """A mutant list that cannot be used as written."""


@dataclass
class Outcome:
    mutant: dict
    status: str
    seconds: float = 0.0
    detail: str = ""
    code: int | None = None
    caught_by: str = ""


def load_mutants(root: Path = ROOT) -> list[dict]:
    """Every mutant of root's lists present, validated (keys, types, unique ids, files exist)."""
    mutants: list[dict] = []
    for name in LISTS:
        path = root / "tools" / name
        if not path.exists():
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not isinstance(getattr(module, "MUTANTS", None), list):
            raise MutantListError(f"{name} must define MUTANTS, a list of dicts")
        for i, m in enumerate(module.MUTANTS):
            mutants.append(_validated(m, f"{name}[{i}]", root))
    seen = Counter(m["id"] for m in mutants)
    dup = sorted(i for i, n in seen.items() if n > 1)
    if dup:
        raise MutantListError(f"duplicate mutant ids: {', '.join(dup)}")
    return mutants


def _validated(m: object, where: str, root: Path) -> dict:
    if not isinstance(m, dict):
        raise MutantListError(f"{where} is a {type(m).__name__}, not a dict")
    missing = [k for k in REQUIRED if k not in m]
    unknown = [k for k in m if k not in REQUIRED and k not in OPTIONAL]
    if missing or unknown:
        raise MutantListError(f"{where}: missing keys {missing}, unknown keys {unknown}")
    for key, kind in {**REQUIRED, **OPTIONAL}.items():
        if key in m and not isinstance(m[key], kind):
            raise MutantListError(f"{where}: {key} must be a {kind.__name__}")
    if not m["tests"] or not all(isinstance(t, str) for t in m["tests"]):
        raise MutantListError(f"{where} ({m['id']}): tests must be a non-empty list of strings")
    if m["old"] == m["new"]:
        raise MutantListError(f"{where} ({m['id']}): old and new are the same text")
    if not (root / m["file"]).is_file():
        raise MutantListError(f"{where} ({m['id']}): no file {m['file']}")
    return m


def staleness(m: dict, root: Path = ROOT) -> str:
    """Why the mutant cannot be applied to root's current files, or "" when it can."""
    count = (root / m["file"]).read_text().count(m["old"])
    if count == 1:
        return ""
    return f"old text {'not found' if count == 0 else f'found {count} times'} in {m['file']}"


def repo_files(root: Path = ROOT) -> list[str]:
    """The files git tracks in root, plus the untracked ones it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (root / f).is_file()]


def copy_repo(root: Path, files: list[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def child_env(checkout: Path) -> dict[str, str]:
    """The tests' environment: PYTHONPATH without the checkout's folders (the copy, not the
    checkout, must be the one imported); entries elsewhere (a dependency unpacked into a
    folder) stay."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    paths = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in paths if not Path(p).resolve().is_relative_to(checkout.resolve())]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def run_tests(
    tree: Path, tests: list[str], timeout: float, env: dict[str, str]
) -> tuple[int | None, str, str]:
    """pytest's exit status in ``tree`` (None on timeout), the tail of its output and the first
    failing test."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"no result after {timeout:.0f} s", ""
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, "\n".join(lines[-15:]), first_failure(lines)


def first_failure(lines: list[str]) -> str:
    """The first test that failed or errored, from pytest's short summary ("" if none)."""
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ", 1)[0]
    return ""


def run_one(
    m: dict | None, tests: list[str], root: Path, files: list[str], timeout: float, env: dict
) -> Outcome:
    """Apply ``m`` (None: the baseline) to a fresh copy of root's files; run ``tests`` there."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tree = Path(tmp)
        copy_repo(root, files, tree)
        if m is not None:
            path = tree / m["file"]
            path.write_text(path.read_text().replace(m["old"], m["new"], 1))
        code, tail, failed = run_tests(tree, tests, timeout, env)
    seconds = time.monotonic() - start
    mutant = m or {"id": "baseline", "tests": tests}
    if code is None:
        status = TIMEOUT
    elif code == 1:
        status = CAUGHT
    elif code < 0:  # (pytest killed by a signal: the mutant crashed its process)
        status = CRASH
    elif code == 0:
        status = EXCLUDED if "equivalent" in mutant else MISSED
    else:
        status, tail = ERROR, f"pytest exit status {code}\n{tail}"
    return Outcome(mutant, status, seconds, tail, code, failed)


def print_table(outcomes: list[Outcome]) -> None:
    width = max([len(o.mutant["id"]) for o in outcomes] + [2])
    kwidth = max([len(o.mutant["klass"]) for o in outcomes] + [5])
    fwidth = max([len(o.mutant["file"]) for o in outcomes] + [4])
    print(
        f"\n{'status':<21} {'id':<{width}} {'class':<{kwidth}} {'file':<{fwidth}}   secs  caught by"
    )
    for o in outcomes:
        m = o.mutant
        print(
            f"{o.status:<21} {m['id']:<{width}} {m['klass']:<{kwidth}} {m['file']:<{fwidth}} "
            f"{o.seconds:6.1f}  {o.caught_by if o.status == CAUGHT else ''}".rstrip()
        )


def print_summary(outcomes: list[Outcome], key: str) -> None:
    groups: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        groups[o.mutant[key]][o.status] += 1
    total: Counter = Counter()
    print(f"\nby {key}:")
    for name in sorted(groups):
        total.update(groups[name])
        print("  " + _score_line(name, groups[name]))
    print("  " + _score_line("all", total))


def _score_line(name: str, c: Counter) -> str:
    caught = c[CAUGHT] + c[TIMEOUT] + c[CRASH]
    scored = caught + c[MISSED]
    score = f"{100 * caught / scored:5.1f}%" if scored else "    -"
    extra = ", ".join(f"{c[s]} {s.lower()}" for s in (EXCLUDED, STALE, ERROR) if c[s])
    return f"{name:<28} caught {caught:3d} of {scored:3d} {score}" + (
        f"   ({extra})" if extra else ""
    )


def run_all(mutants: list[dict], args: argparse.Namespace, root: Path, files: list[str]):
    """Baselines, then every mutant that applies; one Outcome per mutant, in list order."""
    env = child_env(args.root)
    stale = {m["id"]: staleness(m, root) for m in mutants}
    live = [m for m in mutants if not stale[m["id"]]]
    broken: dict[tuple, Outcome] = {}  # test lists whose unmutated run does not pass
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if not args.no_baseline:
            suites = sorted({tuple(m["tests"]) for m in live})
            runs = pool.map(
                lambda t: run_one(None, list(t), root, files, args.timeout, env), suites
            )
            for suite, o in zip(suites, runs, strict=True):
                verdict = "passes" if o.code == 0 else "DOES NOT PASS"
                print(f"baseline {' '.join(suite)}: {verdict} ({o.seconds:.0f} s)", flush=True)
                if o.code != 0:
                    broken[suite] = o
        good = [m for m in live if tuple(m["tests"]) not in broken]

        def job(m: dict) -> Outcome:
            o = run_one(m, m["tests"], root, files, args.timeout, env)
            print(f"{o.status:<22} {m['id']} ({o.seconds:.0f} s)", flush=True)
            return o

        ran = dict(zip([m["id"] for m in good], pool.map(job, good), strict=True))
    outcomes = []
    for m in mutants:
        if stale[m["id"]]:
            outcomes.append(Outcome(m, STALE, detail=stale[m["id"]]))
        elif m["id"] in ran:
            outcomes.append(ran[m["id"]])
        else:
            base = broken[tuple(m["tests"])]
            outcomes.append(Outcome(m, ERROR, detail=f"the baseline does not pass:\n{base.detail}"))
    return outcomes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", metavar="PREFIX", help="run the ids starting with PREFIX")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--list", action="store_true", help="list the mutants; run nothing")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per test run")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs")
    p.add_argument("--verbose", action="store_true", help="pytest output of every mutant")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.timeout <= 0:
        p.error(f"--timeout must be positive, got {args.timeout}")
    if not (args.root / ".git").exists():
        p.error(f"--root {args.root} is not a git checkout")
    args.root = args.root.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        mutants = [m for m in load_mutants(args.root) if m["id"].startswith(args.only)]
    except MutantListError as exc:
        print(f"mutate.py: {exc}", file=sys.stderr)
        return 2
    if not mutants:
        print(f"mutate.py: no mutant id starts with {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        stale = {m["id"]: staleness(m, args.root) for m in mutants}
        for m in mutants:
            flag = f"STALE: {stale[m['id']]}" if stale[m["id"]] else ""
            print(f"{m['id']:<40} {m['klass']:<24} {m['file']:<34} {flag}")
        return 1 if any(stale.values()) else 0
    # Every run copies one snapshot, so edits made to the checkout meanwhile do not reach them.
    with tempfile.TemporaryDirectory(prefix="mutate-snapshot-") as snap_dir:
        snapshot, files = Path(snap_dir), repo_files(args.root)
        copy_repo(args.root, files, snapshot)
        outcomes = run_all(mutants, args, snapshot, files)
    print_table(outcomes)
    print_summary(outcomes, "klass")
    print_summary(outcomes, "file")
    for o in outcomes:
        if o.status in (MISSED, STALE, ERROR, EXCLUDED) or args.verbose:
            m = o.mutant
            print(f"\n{o.status}: {m['id']} ({m['file']})\n  - {m['old']!r}\n  + {m['new']!r}")
            if "equivalent" in m:
                print(f"  equivalent: {m['equivalent']}")
            if o.status in (STALE, ERROR) or args.verbose:
                print("  " + o.detail.replace("\n", "\n  "))
    return 1 if any(o.status in (STALE, ERROR) for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
