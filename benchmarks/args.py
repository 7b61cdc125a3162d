# SPDX-License-Identifier: BSD-3-Clause
"""The command-line values the benchmarks share: comma lists of positive integers or of names,
and positive integers, each refused through ``argparse`` (exit 2, the option named); output paths
checked before a run; the GPU's label in the results' file names."""

from __future__ import annotations

import argparse
import os
import re
import tempfile


def parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by its docstring's first paragraph."""
    first = " ".join(doc.split("\n\n")[0].split())
    return argparse.ArgumentParser(prog=f"python -m {module}", description=first.rstrip(":.") + ".")


def positive_ints(p: argparse.ArgumentParser, flag: str, text: str, example: str) -> list[int]:
    """``text`` as comma-separated positive integers, each once, in the order given."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        p.error(f"{flag} takes comma-separated positive integers ({example}), got {text!r}")
    if min(values) < 1:
        p.error(f"{flag} takes positive integers, got {values}")
    return list(dict.fromkeys(values))


def names(p: argparse.ArgumentParser, flag: str, text: str, allowed, ordered: bool) -> list[str]:
    """``text`` as comma-separated names out of ``allowed``, each once: in ``allowed``'s order
    (``ordered``) or in the order given."""
    given = text.split(",")
    unknown = [n for n in given if n not in allowed]
    if unknown:
        p.error(
            f"{flag}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(allowed)}"
        )
    return [n for n in allowed if n in given] if ordered else list(dict.fromkeys(given))


def positive_int(p: argparse.ArgumentParser, flag: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        p.error(f"{flag} takes a positive integer, got {text!r}")
    return int(text)


def output_path(p: argparse.ArgumentParser, flag: str, text: str | None) -> str | None:
    """``text`` as a file path (or prefix) the run can write at its end: not a folder, and in a
    folder (made now where missing) that takes a new file; refused now, not after the run."""
    if text is None:
        return None
    path = os.path.abspath(text)
    if not text or text.endswith(os.sep) or os.path.isdir(path):
        p.error(f"{flag} {text!r}: a folder, not a file path")
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        # (a file made and removed, not os.access: root passes that even where no one can write)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".write-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        p.error(f"{flag} {text}: {parent} is not a folder this run can write in ({err.strerror})")
    return text


def gpu_label(name: str | None) -> str:
    """The results' file-name label of a GPU from its name: "h200", "h100", "b200", "gb200",
    ...; "cpu" without a GPU (None), "gpu" for a name without a model number."""
    if name is None:
        return "cpu"
    found = re.search(r"\b(G?[A-Z]\d{2,3})\b", name)
    return found.group(1).lower() if found else "gpu"
