"""The service path's CPU profile: processes named by role, CPU seconds differenced between
samples, and a real child's work seen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.online import cpu


@pytest.mark.parametrize(
    ("cmdline", "name", "expected"),
    [
        (
            ["python", "-m", "services.executor", "--executor-id", "executor-1"],
            "python",
            "executor-1",
        ),
        (["python", "-m", "services.router", "--port", "1"], "python", "router"),
        (["python", "-m", "services.memory_manager"], "python", "memory-manager"),
        (["redis-server", "*:6379"], "redis-server", "redis"),
        ([".peer-llamacpp/bin/llama-server", "-m", "x.gguf"], "llama-server", "llama-server"),
        (
            ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
            "python",
            "vllm-api",
        ),
        ([".venv-vllm/bin/python", "benchmarks/peers/vllm_bench_serve.py"], "python", None),
        (["/v/bin/vllm", "serve", "models/x"], "vllm", "vllm-api"),
        ([], "VLLM::EngineCore", "vllm-engine"),
        (["bash"], "bash", None),
    ],
)
def test_roles_come_from_the_command_line(
    cmdline: list[str], name: str, expected: str | None
) -> None:
    assert cpu.role(cmdline, name) == expected


def test_usage_differences_processes_and_counts_new_ones_from_zero() -> None:
    before = cpu.Sample(0.0, {1: ("router", 2.0), 2: ("executor-0", 5.0)}, 1.0)
    after = cpu.Sample(
        1.0, {1: ("router", 2.5), 2: ("executor-0", 6.0), 3: ("executor-0", 0.25)}, 1.5
    )
    assert cpu.usage(before, after) == {"client": 0.5, "executor-0": 1.25, "router": 0.5}


def test_a_waited_child_counts_as_the_client() -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    _, profile = cpu.measured(lambda: subprocess.run([sys.executable, "-c", spin], check=True))
    assert profile["cpu_s"]["client"] >= 0.3
    per = cpu.per_token(profile, 100)
    assert per["total"] >= per["client"] >= 3.0  # 0.3 s over 100 tokens
