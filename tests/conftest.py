"""Shared pytest setup: make the repository root importable (``import reference``) however pytest
is started (``pytest tests``, ``python -m pytest``, from another directory)."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
