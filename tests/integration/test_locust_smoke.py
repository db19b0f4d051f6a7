"""Locust, headless, against the real stack: a short run with small lengths and no failures."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from services.stack.runner import Stack
from tests.integration.conftest import REPO, wait_idle

LOCUST = Path(sys.executable).with_name("locust")
# Small lengths keep the run short; everything else is the real workload.
SMOKE_ENV = {
    "QUIRE_LOAD_MAX_PROMPT_TOKENS": "48",
    "QUIRE_LOAD_MAX_TOKENS": "24",
    "QUIRE_LOAD_SYSTEM_TOKENS": "64",
    "QUIRE_LOAD_NUM_TENANTS": "2",
    "QUIRE_LOAD_THINK_S": "0.2",
    # ShareGPT prompts (the default), counted with the served model's tokenizer.
    "QUIRE_LOAD_TOKENIZER": str(REPO / "models" / "quire-tiny"),
    "QUIRE_LOAD_POOL_SIZE": "50",
}


def test_locust_run_has_requests_and_no_failures(stack: Stack, tmp_path: Path) -> None:
    prefix = tmp_path / "smoke"
    argv = [
        str(LOCUST),
        "-f",
        "loadtests/locustfile.py",
        "--headless",
        "-u",
        "4",
        "-r",
        "4",
        "-t",
        # 8 s finished no request on a 2-core AVX2 machine (the CSV holds what finished within
        # -t; what finished during --stop-timeout is only printed)
        "20s",
        "--stop-timeout",
        "10",
        "--host",
        stack.config.router_url,
        "--exit-code-on-error",
        "1",
        "--csv",
        str(prefix),
        "--only-summary",
    ]
    env = {**os.environ, **SMOKE_ENV}
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    log = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, log

    with (prefix.parent / "smoke_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    total = rows[("", "Aggregated")]
    assert int(total["Failure Count"]) == 0, log
    for key in [("POST", "/v1/chat/completions"), ("POST", "/v1/completions")]:
        assert int(rows[key]["Request Count"]) > 0, (key, log)
        assert int(rows[key]["Failure Count"]) == 0, (key, log)
    for name in ["TTFT chat", "ITL chat", "TTFT completion", "ITL completion"]:
        assert int(rows[("SSE", name)]["Request Count"]) > 0, (name, log)
    wait_idle(stack)
