"""A model the services cannot serve stops them at start: exit 2 and one line naming the setting.

Each case runs the real entry point (`python -m services.<name>`) in a subprocess, as `make up`,
compose and Kubernetes do, with the model given through QUIRE_MODEL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quire.model.model_config import SUPPORTED_ARCHITECTURES

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "quire-tiny"


def _run(module: str, model: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIRE_")}
    env["QUIRE_MODEL"] = model
    return subprocess.run(
        [sys.executable, "-m", module, "--redis-url", "", "--port", "0", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _checkpoint(tmp_path: Path, case: str) -> Path:
    """A directory that is wrong in the way `case` says."""
    path = tmp_path / case
    if case == "missing":
        return path
    path.mkdir()
    if case == "gpt2":
        config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
        (path / "config.json").write_text(json.dumps(config))
    elif case == "no-weights":
        shutil.copy(TINY / "config.json", path / "config.json")
    return path


@pytest.mark.parametrize(
    ("module", "case", "reason"),
    [
        ("services.executor", "missing", "does not exist"),
        ("services.executor", "no-config", "has no config.json"),
        ("services.executor", "gpt2", "has an unsupported architecture (GPT2LMHeadModel)"),
        ("services.executor", "no-weights", "no *.safetensors weight files"),
        ("services.router", "missing", "does not exist"),
        ("services.router", "gpt2", "has an unsupported architecture (GPT2LMHeadModel)"),
    ],
)
def test_a_bad_model_exits_2_with_one_line(
    tmp_path: Path, module: str, case: str, reason: str
) -> None:
    model = str(_checkpoint(tmp_path, case))
    result = _run(module, model)
    service = module.removeprefix("services.")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{service}: error: QUIRE_MODEL / --model = {model!r}: "), line
    assert reason in line
    if case == "gpt2":
        assert line.endswith(f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def test_a_bad_value_names_its_variable(tmp_path: Path) -> None:
    result = _run("services.executor", str(TINY), "--dtype", "fp8")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("executor: error: QUIRE_DTYPE / --dtype = 'fp8': Input should be")
