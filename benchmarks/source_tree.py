"""Run Quire from its source tree, uninstalled: `quire` from libs/, `quire.kernels` from kernels/.

    python -m benchmarks.source_tree MODULE [ARGS...]      # e.g. pytest -q tests/kernels

An install maps kernels/ to `quire.kernels` (pyproject's package-dir); a Python that has not
installed Quire (a GPU machine's own image, say) finds `quire` on PYTHONPATH=libs but not that
mapping. `install()` adds it to the running interpreter: libs/ on sys.path where `quire` is not
importable, and a finder, consulted after the ordinary ones, that answers `quire.kernels` (and so
its submodules) from kernels/. Where Quire is installed, the installed mapping answers first and
nothing changes. `child_env()` gives subprocesses the same view: its PYTHONPATH holds
benchmarks/site, whose sitecustomize calls `install()` when any Python starts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBS_DIR = REPO_ROOT / "libs"
KERNELS_DIR = REPO_ROOT / "kernels"
SITE_DIR = Path(__file__).resolve().parent / "site"


class _KernelsFinder(importlib.abc.MetaPathFinder):
    """Finds `quire.kernels` in kernels/ when no other finder does."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "quire.kernels":
            return None
        return importlib.util.spec_from_file_location(
            fullname, KERNELS_DIR / "__init__.py", submodule_search_locations=[str(KERNELS_DIR)]
        )


def install() -> None:
    """Make `quire` and `quire.kernels` importable in this interpreter (idempotent)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.append(str(REPO_ROOT))  # benchmarks/, tests/ (a run from elsewhere)
    if importlib.util.find_spec("quire") is None:
        sys.path.insert(0, str(LIBS_DIR))
    if not any(isinstance(finder, _KernelsFinder) for finder in sys.meta_path):
        sys.meta_path.append(_KernelsFinder())


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with PYTHONPATH set so that children `install()` too."""
    env = dict(os.environ if env is None else env)
    parts = [str(SITE_DIR), str(LIBS_DIR), str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    install()
    os.environ.update(child_env())
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
