"""Running a benchmark as its make target does: `python -m benchmarks.<name>` from the repo root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_quick(module: str, out: Path, *flags: str, expect: str, timeout_s: float) -> dict[str, Any]:
    """Run `python -m <module> --quick <flags> --out <out>` and check that it exited 0, printed
    `expect` and drew <out>/<name>.png, <name> being the module's last part (engine, serving);
    return what it wrote to <out>/<name>.json."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", *flags, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expect in proc.stdout, proc.stdout
    name = module.rpartition(".")[2]
    assert (out / f"{name}.png").stat().st_size > 0
    result: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    return result
