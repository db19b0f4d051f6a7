"""Serving benchmark: `--quick --skip-baseline` end to end, and its pure parts without servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.online.cli import parse_args
from benchmarks.online.curve import curve_ratios
from benchmarks.online.main import all_ratios, rescore
from benchmarks.online.plot import plot
from tests.benchmarks.entry import run_quick

STAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 300.0


QUIRE = "quire float32"  # --quick: one dtype, Quire's own client


@pytest.fixture(scope="module")
def results(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("serving")
    return run_quick(
        "benchmarks.serving",
        out,
        "--skip-baseline",
        expect="The curve",
        timeout_s=180,
    )


def test_top_level(results: dict) -> None:
    assert set(results) >= {"config", "slo", "systems", "ratios", "definitions"}
    assert results["slo"]["ttft_ms"] > 0 and results["slo"]["tpot_ms"] > 0
    assert list(results["systems"]) == [QUIRE]  # no peers, every row one system in one dtype
    assert results["systems"][QUIRE]["dtype"] == "float32"
    assert results["ratios"] == {"float32": {}}
    config = results["config"]
    assert config["dtypes"] == ["float32"] and config["clients"] == ["quire"]
    assert config["concurrency"] == [1, None]
    assert config["shared_prefix_len"] == 0
    assert config["quire_num_executors"] == 1
    assert {"slo_load", "max_concurrency", "curve ratios"} <= set(results["definitions"])


def test_quire_curve_points(results: dict) -> None:
    points = results["systems"][QUIRE]["curve"]["quire"]
    config = results["config"]
    assert [p["max_concurrency"] for p in points] == config["concurrency"]
    # "all" sits at its number of requests on the concurrency axis
    assert [p["concurrency"] for p in points] == [1, config["curve_prompts"][1]]
    for point, n in zip(points, config["curve_prompts"], strict=True):
        assert point["status"] == "ok" and point["client"] == "quire"
        assert point["num_prompts"] == point["completed"] == n
        # ignore_eos and the usage chunk: exactly the requested output tokens
        assert point["output_tokens_as_expected"]
        assert point["total_output_tokens"] == point["expected_output_tokens"] >= 2 * n
        assert point["output_throughput"] > 0
        for key in STAT_KEYS:
            assert 0 < point[key]["median"] <= point[key]["p99"] + 1e-9, (key, point[key])


def test_quire_runs_are_sane(results: dict) -> None:
    quire = results["systems"][QUIRE]
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


def test_options() -> None:
    assert parse_args([]).num_executors == 1
    assert parse_args(["--num-executors", "2"]).num_executors == 2
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
    defaults = parse_args([])
    assert defaults.peers == ["vllm", "llamacpp"]
    assert defaults.dtypes == ["float32", "bfloat16", "q4_1", "q8_0"]
    assert defaults.concurrency == [1, 4, 16, None] and defaults.clients == ["vllm"]
    assert len(defaults.curve_prompts) == 4 and defaults.rates == []
    assert args_for("--skip-baseline").peers == []
    assert args_for("--concurrency", "2,all", "--curve-prompts", "5").curve_prompts == [5, 5]
    assert args_for("--concurrency", "", "--rates", "1").concurrency == []
    for bad in (
        ("--dtypes", "float16"),
        ("--clients", "locust"),
        ("--concurrency", "0"),
        ("--concurrency", "1,some"),
        ("--concurrency", "1,4", "--curve-prompts", "1,2,3"),
        ("--concurrency", "", "--rates", ""),  # nothing to run
    ):
        with pytest.raises(SystemExit):
            args_for(*bad)


def test_a_gguf_row_compares_quire_with_llamacpp_alone() -> None:
    # q4_1 and q8_0 are GGUF files Quire and llama.cpp serve; vLLM serves neither.
    ratios = all_ratios({}, ["float32", "q4_1", "q8_0"], ["vllm", "llamacpp"])
    assert {dtype: sorted(peers) for dtype, peers in ratios.items()} == {
        "float32": ["llamacpp", "vllm"],
        "q4_1": ["llamacpp"],
        "q8_0": ["llamacpp"],
    }


def test_curve_ratios_say_above_one_when_quire_is_ahead() -> None:
    def point(c: int | None, tput: float, ttft: float, tpot: float) -> dict:
        return {
            "status": "ok",
            "max_concurrency": c,
            "output_throughput": tput,
            "ttft_ms": {"median": ttft},
            "tpot_ms": {"median": tpot},
        }

    quire = {"curve": {"vllm": [point(1, 30.0, 100.0, 20.0), point(None, 200.0, 900.0, 50.0)]}}
    peer = {"curve": {"vllm": [point(1, 20.0, 300.0, 10.0)]}}  # no "all" point
    assert curve_ratios(quire, peer) == {
        "vllm": [
            {
                "max_concurrency": 1,
                "output_throughput": pytest.approx(1.5),
                "ttft_p50": pytest.approx(3.0),  # the peer's first token takes 3x as long
                "tpot_p50": pytest.approx(0.5),  # the peer decodes twice as fast
            }
        ]
    }
    failed = {"curve": {"vllm": [{**point(1, 0.0, 1.0, 1.0), "status": "failed"}]}}
    assert curve_ratios(quire, failed)["vllm"][0]["output_throughput"] is None


def test_plot_draws_the_curves_and_the_slo_load_panel(tmp_path: Path) -> None:
    def system(name: str, loads: list[float | None], rate: float, censored: bool) -> dict:
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
        curve = [
            {
                "max_concurrency": c,
                "concurrency": c or 8,
                "completed": 8,
                "output_throughput": 5.0 * (c or 8),
                "ttft_ms": {"median": 100.0 * (c or 8), "p99": 300.0 * (c or 8)},
                "tpot_ms": {"median": 10.0 * (c or 8), "p99": None},
            }
            for c in (1, 4, None)
        ]
        sus = {"rate": rate, "censored": censored, "max_rate_under_slo": 0.0}
        system_name, dtype = name.split()
        return {
            "system": system_name,
            "dtype": dtype,
            "status": "ok",
            "curve": {"vllm": curve},
            "runs": runs,
            "sustainable": sus,
        }

    results = {
        "config": {
            "model": "models/quire-bench",
            "dataset": "random",
            "clients": ["vllm", "quire"],  # the second drew nothing: no row for it
            "rates": [1, 2, 4],
            "shared_prefix_len": 64,
            "num_shared_prefixes": 4,
        },
        "slo": {"ttft_ms": SLO_TTFT_MS, "tpot_ms": SLO_TPOT_MS},
        "systems": {
            "quire float32": system("quire float32", [0.2, 0.5, 0.9], 4.0, True),
            "transformers float32": system("transformers float32", [1.5, None, None], 0.0, False),
            "llamacpp q4_1": system("llamacpp q4_1", [0.5, 3.0, None], 1.2, False),
            "vllm bfloat16": {"status": "skipped", "reason": "--skip-it"},
        },
    }
    plot(results, tmp_path / "serving.png")
    assert (tmp_path / "serving.png").stat().st_size > 0


def test_rescore_judges_a_finished_run_at_other_slos(results: dict, tmp_path: Path) -> None:
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(results))
    quire = results["systems"][QUIRE]
    strict = rescore(source, 1e-6, 1e-6, tmp_path / "strict")
    assert strict["slo"]["rescored_from"] == {
        "ttft_ms": results["slo"]["ttft_ms"],
        "tpot_ms": results["slo"]["tpot_ms"],
    }
    # Nothing meets a microsecond target: over at the lowest rate, rate 0.
    assert strict["systems"][QUIRE]["sustainable"]["rate"] == 0.0
    loose = rescore(tmp_path / "strict" / "serving.json", 1e9, 1e9, tmp_path / "loose")
    assert loose["slo"]["rescored_from"] == strict["slo"]["rescored_from"]
    sustainable = loose["systems"][QUIRE]["sustainable"]
    assert sustainable["censored"] and sustainable["rate"] == max(results["config"]["rates"])
    # The measured runs themselves are untouched.
    runs = loose["systems"][QUIRE]["runs"]
    assert [r["ttft_ms"] for r in runs] == [r["ttft_ms"] for r in quire["runs"]]
    assert (tmp_path / "loose" / "serving.png").stat().st_size > 0
