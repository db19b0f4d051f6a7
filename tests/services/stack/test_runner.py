"""`make up` with a model the executors cannot serve fails at the first executor, showing why."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.stack.ports import stack_ports
from services.stack.runner import Stack, StackError
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[3]


def test_a_bad_model_stops_make_up_with_the_executors_line(tmp_path: Path) -> None:
    ports = stack_ports(2)
    config = StackConfig(
        model=str(tmp_path / "no-such-model"),
        **ports,
        redis_prefix=f"quire-test-{ports['executor_base_port']}",
        python=sys.executable,
    )
    stack = Stack(config, tmp_path / "run", cwd=REPO)
    started = time.monotonic()
    with pytest.raises(StackError) as failure:
        stack.start(timeout_s=60)
    assert time.monotonic() - started < 30  # at once, not after the readiness timeout
    message = str(failure.value)
    assert message.startswith("executor-0 exited with 2")
    assert f"executor: error: QUIRE_MODEL / --model = '{config.model}': does not exist" in message
    assert all(proc.poll() is not None for proc in stack.procs.values())  # nothing left behind


def test_make_up_refuses_a_renamed_variable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.stack", "up", "--run-dir", str(tmp_path)],
        cwd=REPO,
        env={"QUIRE_STACK_MODEL": "models/quire-tiny", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "QUIRE_STACK_MODEL is not read: set QUIRE_MODEL" in result.stderr
