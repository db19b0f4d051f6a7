"""Serving benchmark: `--quick --skip-baseline` end to end, and its pure parts without servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.online.cli import parse_args
from benchmarks.online.main import rescore
from benchmarks.online.plot import plot
from tests.benchmarks.entry import run_quick

STAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 300.0


@pytest.fixture(scope="module")
def results(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("serving")
    return run_quick(
        "benchmarks.serving",
        out,
        "--skip-baseline",
        expect="sustainable rate ratio",
        timeout_s=180,
    )


def test_top_level(results: dict) -> None:
    assert set(results) >= {"config", "slo", "systems", "sustainable_rate_ratio", "definitions"}
    assert results["slo"]["ttft_ms"] > 0 and results["slo"]["tpot_ms"] > 0
    assert results["systems"]["transformers"]["status"] == "skipped"
    assert results["sustainable_rate_ratio"] is None
    assert results["sustainable_rate_ratio_note"] == "needs both systems"
    assert results["config"]["shared_prefix_len"] == 0
    assert results["config"]["quire_num_executors"] == 1
    assert "slo_load" in results["definitions"]


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
        assert 0 <= run["prefix_cache_hit_rate"] <= 1  # Quire reports cached prompt tokens
        assert run["slo_load"] == pytest.approx(
            max(
                run["ttft_ms"]["p99"] / results["slo"]["ttft_ms"],
                run["tpot_ms"]["p99"] / results["slo"]["tpot_ms"],
            )
        )
    assert quire["sustainable"]["rate"] >= 0


def args_for(*flags: str) -> Any:
    return parse_args(["--quick", *flags])


def test_num_executors_defaults() -> None:
    assert parse_args([]).num_executors == 2
    assert args_for().num_executors == 1
    assert args_for("--num-executors", "3").num_executors == 3
    with pytest.raises(SystemExit):
        args_for("--shared-prefix-len", "-1")
    with pytest.raises(SystemExit):
        args_for("--num-shared-prefixes", "0")
    with pytest.raises(SystemExit):  # ShareGPT prompts have no synthetic tenant prefix
        args_for("--shared-prefix-len", "16")
    with pytest.raises(SystemExit):
        args_for("--peers", "vllm,sglang")
    assert parse_args([]).peers == ["vllm", "transformers"]
    assert args_for("--skip-baseline").peers == []


def test_plot_draws_the_slo_load_panel(tmp_path: Path) -> None:
    def system(loads: list[float | None], rate: float, censored: bool) -> dict:
        runs = [
            {
                "request_rate": r,
                "failed": 0,
                "ttft_ms": {"p99": 100.0},
                "tpot_ms": {"p99": 100.0},
                "output_throughput": 10.0 * r,
                "slo_load": load,
            }
            for r, load in zip([1, 2, 4], loads, strict=True)
        ]
        sus = {"rate": rate, "censored": censored, "max_rate_under_slo": 0.0}
        return {"status": "ok", "runs": runs, "sustainable": sus}

    results = {
        "config": {
            "model": "models/quire-bench",
            "rates": [1, 2, 4],
            "shared_prefix_len": 64,
            "num_shared_prefixes": 4,
        },
        "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": SLO_TPOT_MS},
        "systems": {
            "quire": system([0.2, 0.5, 0.9], 4.0, True),
            "transformers": system([1.5, None, None], 0.0, False),
            "other": system([0.5, 3.0, None], 1.2, False),
            "skipped": {"status": "skipped", "reason": "--skip-it"},
        },
    }
    plot(results, tmp_path / "serving.png")
    assert (tmp_path / "serving.png").stat().st_size > 0


def test_rescore_judges_a_finished_run_at_other_slos(results: dict, tmp_path: Path) -> None:
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(results))
    quire = results["systems"]["quire"]
    strict = rescore(source, 1e-6, 1e-6, tmp_path / "strict")
    assert strict["slo"]["rescored_from"] == {
        "ttft_ms": results["slo"]["ttft_ms"],
        "tpot_ms": results["slo"]["tpot_ms"],
    }
    # Nothing meets a microsecond target: over at the lowest rate, rate 0.
    assert strict["systems"]["quire"]["sustainable"]["rate"] == 0.0
    loose = rescore(tmp_path / "strict" / "serving.json", 1e9, 1e9, tmp_path / "loose")
    assert loose["slo"]["rescored_from"] == strict["slo"]["rescored_from"]
    sustainable = loose["systems"]["quire"]["sustainable"]
    assert sustainable["censored"] and sustainable["rate"] == max(results["config"]["rates"])
    # The measured runs themselves are untouched.
    runs = loose["systems"]["quire"]["runs"]
    assert [r["ttft_ms"] for r in runs] == [r["ttft_ms"] for r in quire["runs"]]
    assert (tmp_path / "loose" / "serving.png").stat().st_size > 0
