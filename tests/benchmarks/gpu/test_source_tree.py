"""benchmarks.source_tree: Quire importable from the checkout by a Python that never installed it."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from benchmarks import source_tree

REPO = Path(__file__).resolve().parents[3]

# A Python that has not installed Quire: no site module, so no .pth (the editable install's
# finder is one); this environment's site-packages folder (argv[1]) on the path, for torch.
UNINSTALLED = """
import importlib.util, sys
sys.path.append(sys.argv[1])
assert importlib.util.find_spec("quire") is None, "quire importable before install()"
from benchmarks import source_tree
source_tree.install()
source_tree.install()  # idempotent
import quire.kernels
from quire.kernels import reference
from quire import kernels
assert kernels is quire.kernels
print(quire.kernels.__file__)
print(reference.__file__)
print(sum(type(f).__name__ == "_KernelsFinder" for f in sys.meta_path))
"""


def test_install_maps_kernels_for_an_interpreter_without_quire() -> None:
    done = subprocess.run(
        [sys.executable, "-S", "-c", UNINSTALLED, sysconfig.get_paths()["purelib"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    package, module, num_finders = done.stdout.split()
    assert Path(package) == REPO / "kernels" / "__init__.py"
    assert Path(module) == REPO / "kernels" / "reference.py"
    assert num_finders == "1"


def test_children_started_with_child_env_install_it_at_start_up(tmp_path: Path) -> None:
    code = (
        "import sys, sitecustomize, quire.kernels;"
        "print(sitecustomize.__file__);"
        "print(any(type(f).__name__ == '_KernelsFinder' for f in sys.meta_path))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # not the checkout: the path entries must do it alone
        env=source_tree.child_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": "/elsewhere"}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    site_file, has_finder = done.stdout.split()
    assert Path(site_file) == REPO / "benchmarks" / "site" / "sitecustomize.py"
    assert has_finder == "True"


def test_child_env_keeps_the_callers_path_after_its_own() -> None:
    env = source_tree.child_env({"PYTHONPATH": "/elsewhere"})
    parts = env["PYTHONPATH"].split(":")
    assert parts[0] == str(REPO / "benchmarks" / "site")
    assert parts[1:3] == [str(REPO / "libs"), str(REPO)]
    assert parts[-1] == "/elsewhere"
