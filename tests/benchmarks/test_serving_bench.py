"""Smoke test of the serving benchmark: `--quick --skip-baseline` runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import serving as bench
from quire.tools.make_model import make_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models" / "quire-tiny"
STAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not (TINY / "config.json").is_file():
        make_checkpoint(TINY, "tiny")
    out = tmp_path_factory.mktemp("serving")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.serving",
            "--quick",
            "--skip-baseline",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sustainable rate ratio" in proc.stdout, proc.stdout
    assert (out / "serving.png").stat().st_size > 0
    return json.loads((out / "serving.json").read_text())


def test_top_level(results: dict) -> None:
    assert set(results) >= {"config", "slo", "systems", "sustainable_rate_ratio", "definitions"}
    assert results["slo"]["ttft_ms"] > 0 and results["slo"]["tpot_ms"] > 0
    assert results["systems"]["transformers"]["status"] == "skipped"
    assert results["sustainable_rate_ratio"] is None


def test_quire_runs_are_sane(results: dict) -> None:
    quire = results["systems"]["quire"]
    assert quire["status"] == "ok"
    runs = quire["runs"]
    assert [r["request_rate"] for r in runs] == results["config"]["rates"]
    for run in runs:
        assert run["completed"] == run["num_prompts"] and run["failed"] == 0
        assert run["request_throughput"] > 0 and run["output_throughput"] > 0
        assert 0 <= run["goodput"] <= run["request_throughput"] + 1e-9
        # ignore_eos: every request produces at least the minimum output length
        assert run["total_output_tokens"] >= 2 * run["num_prompts"]
        for key in STAT_KEYS:
            s = run[key]
            assert 0 < s["median"] <= s["p99"] + 1e-9, (key, s)
        assert run["ttft_ms"]["p99"] <= run["e2el_ms"]["p99"] + 1e-9
    assert quire["sustainable"]["rate"] >= 0


def test_sustainable_rate_interpolates() -> None:
    def run(rate: float, p99: float) -> dict:
        return {"request_rate": rate, "failed": 0, "ttft_ms": {"p99": p99}}

    s = bench.sustainable_rate([run(1, 100), run(2, 300), run(4, 1100)], 700)
    assert s == {"rate": 3.0, "censored": False, "max_rate_under_slo": 2}
    s = bench.sustainable_rate([run(1, 100), run(2, 300)], 700)
    assert s["rate"] == 2 and s["censored"]
    assert bench.sustainable_rate([run(1, 900)], 700)["rate"] == 0.0


def test_arrivals_are_seeded_poisson() -> None:
    a = bench.arrival_times(4.0, 2000, seed=3)
    assert a == bench.arrival_times(4.0, 2000, seed=3)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert a[-1] / (len(a) - 1) == pytest.approx(0.25, rel=0.1)
