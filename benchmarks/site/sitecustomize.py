"""Imported by site.py when a Python starts with this folder on PYTHONPATH (see
benchmarks/source_tree.py, whose child_env() puts it there): Quire's source tree, importable
as if installed. A sitecustomize this one shadows (a distribution's) runs after it."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_here = Path(__file__).resolve().parent
sys.path.append(str(_here.parents[1]))
from benchmarks import source_tree  # noqa: E402

source_tree.install()

_others = [p for p in sys.path if Path(p or ".").resolve() != _here]
_shadowed = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _shadowed is not None and _shadowed.loader is not None:
    _shadowed.loader.exec_module(importlib.util.module_from_spec(_shadowed))
