"""Serving benchmark: `--quick --skip-baseline` end to end, and its pure parts without servers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from benchmarks import serving as bench
from quire.tools.make_model import make_checkpoint
from quire.workloads.lengths import lognormal_lengths

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models" / "quire-tiny"
STAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


@pytest.fixture(scope="module")
def tiny() -> Path:
    if not (TINY / "config.json").is_file():
        make_checkpoint(TINY, "tiny")
    return TINY


@pytest.fixture(scope="module")
def results(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
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


SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 300.0


def run(rate: float, ttft_p99: float | None, tpot_p99: float | None, failed: int = 0) -> dict:
    return {
        "request_rate": rate,
        "failed": failed,
        "ttft_ms": {"p99": ttft_p99},
        "tpot_ms": {"p99": tpot_p99},
    }


def sustainable(runs: list[dict]) -> dict[str, Any]:
    return bench.sustainable_rate(runs, SLO_TTFT_MS, SLO_TPOT_MS)


def test_slo_load_is_the_worse_of_the_two_ratios() -> None:
    assert bench.slo_load(run(1, 1000, 60), SLO_TTFT_MS, SLO_TPOT_MS) == 0.5
    assert bench.slo_load(run(1, 200, 450), SLO_TTFT_MS, SLO_TPOT_MS) == 1.5
    assert math.isinf(bench.slo_load(run(1, 200, 60, failed=1), SLO_TTFT_MS, SLO_TPOT_MS))
    assert math.isinf(bench.slo_load(run(1, 200, None), SLO_TTFT_MS, SLO_TPOT_MS))
    assert math.isinf(bench.slo_load(run(1, None, 60), SLO_TTFT_MS, SLO_TPOT_MS))


def test_sustainable_rate_crosses_on_tpot_while_ttft_stays_low() -> None:
    # TTFT p99 stays far under its SLO (an admit-everything scheduler past capacity), while
    # TPOT's load goes 0.5, 0.8, 2.0: it crosses between 2 and 4 at 2 + 2 * 0.2 / 1.2.
    runs = [run(4, 300, 600), run(1, 100, 150), run(2, 200, 240)]  # unsorted on purpose
    s = sustainable(runs)
    assert not s["censored"]
    assert s["rate"] == pytest.approx(7 / 3)
    assert s["max_rate_under_slo"] == 2


def test_sustainable_rate_interpolates_between_ttft_and_tpot_loads() -> None:
    # Loads 0.9 (TTFT 1800/2000) then 1.9 (TPOT 570/300): crossing at 1 + 0.1 * (3 - 1).
    s = sustainable([run(1, 1800, 150), run(3, 2000, 570), run(5, 3000, 900)])
    assert s == {"rate": pytest.approx(1.2), "censored": False, "max_rate_under_slo": 1}
    s = sustainable([run(1, 100, 150), run(2, 300, 200), run(4, 2200, 100)])
    assert s["rate"] == pytest.approx(2 + 2 * (1 - 2 / 3) / (1.1 - 2 / 3))


def test_sustainable_rate_is_zero_when_the_lowest_rate_fails() -> None:
    s = sustainable([run(0.5, 100, 310), run(1, 100, 400)])
    assert s == {"rate": 0.0, "censored": False, "max_rate_under_slo": 0.0}


def test_sustainable_rate_is_censored_when_never_over() -> None:
    # A load of exactly 1.0 meets the SLO.
    s = sustainable([run(1, 100, 150), run(2, 2000, 200), run(4, 1000, 300)])
    assert s == {"rate": 4, "censored": True, "max_rate_under_slo": 4}


def test_sustainable_rate_with_failed_requests_takes_the_failing_rate() -> None:
    # Failures make the load infinite: no interpolation, the crossing rate itself (frac 1).
    s = sustainable([run(1, 100, 150), run(2, 200, 200), run(4, 300, 250, failed=1)])
    assert s == {"rate": 4.0, "censored": False, "max_rate_under_slo": 2}
    s = sustainable([run(1, 100, 150), run(2, 200, None), run(4, 300, 250)])
    assert s == {"rate": 2.0, "censored": False, "max_rate_under_slo": 1}


def test_prefix_cache_hit_rate_counts_only_what_the_server_reports() -> None:
    hit = bench.Result(success=True, prompt_tokens=100, cached_tokens=64)
    miss = bench.Result(success=True, prompt_tokens=50, cached_tokens=0)
    silent = bench.Result(success=True, prompt_tokens=70)
    assert bench.cache_hit_rate([hit, miss, silent]) == pytest.approx(64 / 150)
    assert bench.cache_hit_rate([silent]) is None


def test_summarize_stores_slo_load() -> None:
    ok = bench.Result(success=True, ttft=0.5, e2e=2.5, output_tokens=11)  # TPOT 200 ms
    summary = bench.summarize([ok, ok], 3.0, 1.0, SLO_TTFT_MS, SLO_TPOT_MS)
    assert summary["slo_load"] == pytest.approx(2 / 3)
    failed = bench.Result(error="HTTP 503")
    summary = bench.summarize([ok, failed], 3.0, 1.0, SLO_TTFT_MS, SLO_TPOT_MS)
    assert summary["slo_load"] is None  # infinite; JSON has no infinity


def args_for(*flags: str) -> Any:
    return bench.parse_args(["--quick", *flags])


def test_num_executors_defaults() -> None:
    assert bench.parse_args([]).num_executors == 2
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
    assert bench.parse_args([]).peers == ["vllm", "transformers"]
    assert args_for("--skip-baseline").peers == []


def test_sharegpt_plan_splits_one_seeded_sample(tiny: Path) -> None:
    args = args_for("--burst", "3", "--num-prompts", "2", "--warmup", "1")
    assert args.dataset == "sharegpt"
    plan = bench.plan_requests(tiny, args, num_rates=2)
    pool = bench.sharegpt_requests(tiny, 3 + 1 + 2 * 2, args)
    assert plan.burst == pool[:3]  # the head: what vLLM's client samples with the same seed
    assert plan.warmup == pool[3:4]
    assert plan.rates == [pool[4:6], pool[6:8]]
    for r in pool:  # --quick caps both lengths
        assert r.prompt_len <= args.max_input_len and 1 <= r.output_len <= args.max_output_len


def test_requests_without_shared_prefix_are_the_lognormal_lengths(tiny: Path) -> None:
    args = args_for()
    assert args.shared_prefix_len == 0
    requests = bench.make_requests(tiny, 12, args, seed=7)
    rng = np.random.default_rng(args.seed)
    sigma = bench.LENGTH_SIGMA
    prompt_lens = lognormal_lengths(rng, args.input_len, sigma, 12, 4, args.random_max_input_len)
    prompt_lens = prompt_lens.tolist()
    output_lens = lognormal_lengths(rng, args.output_len, sigma, 12, 2, args.random_max_output_len)
    output_lens = output_lens.tolist()
    assert [r.prompt_len for r in requests] == prompt_lens
    assert [r.output_len for r in requests] == output_lens
    assert requests == bench.make_requests(tiny, 12, args, seed=7)
    # Another rate: the same lengths, other prompts.
    other = bench.make_requests(tiny, 12, args, seed=8)
    assert [(r.prompt_len, r.output_len) for r in other] == list(
        zip(prompt_lens, output_lens, strict=True)
    )
    assert all(a.prompt != b.prompt for a, b in zip(requests, other, strict=True))


def test_requests_with_shared_prefixes(tiny: Path) -> None:
    k, n = 3, 24
    args = args_for(
        "--dataset", "random", "--shared-prefix-len", str(n), "--num-shared-prefixes", str(k)
    )
    requests = bench.make_requests(tiny, 10, args, seed=5)
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    # The prefixes come from the run's seed, so every rate's requests share the same tenants.
    ids = bench.shared_prefix_ids(tokenizer.get_vocab_size(), k, n, seed=args.seed)
    assert [len(p) for p in ids] == [n] * k
    texts = [tokenizer.decode(p) for p in ids]
    assert len(set(texts)) == k and all(texts)
    for i, req in enumerate(requests):
        assert req.prompt.startswith(texts[i % k])
        assert not any(req.prompt.startswith(t) for j, t in enumerate(texts) if j != i % k)
        if i + k < len(requests):
            prefix = texts[i % k]
            assert requests[i + k].prompt[: len(prefix)] == req.prompt[: len(prefix)]
    # The suffixes, their lengths and the output lengths are those of the same seed without
    # a prefix; prompt_len counts the prefix too.
    plain = bench.make_requests(tiny, 10, args_for(), seed=5)
    for i, (req, base) in enumerate(zip(requests, plain, strict=True)):
        assert req.prompt == texts[i % k] + base.prompt
        assert req.prompt_len == n + base.prompt_len
        assert req.output_len == base.output_len
    assert requests == bench.make_requests(tiny, 10, args, seed=5)
    next_rate = bench.make_requests(tiny, 10, args, seed=6)
    assert requests != next_rate
    assert all(r.prompt.startswith(texts[i % k]) for i, r in enumerate(next_rate))
    other = bench.shared_prefix_ids(tokenizer.get_vocab_size(), k, n, seed=6)
    assert other != ids


def test_plot_draws_the_slo_load_panel(tmp_path: Path) -> None:
    def system(loads: list[float | None], rate: float, censored: bool) -> dict:
        runs = [
            {
                **run(r, 100.0, 100.0),
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
    bench.plot(results, tmp_path / "serving.png")
    assert (tmp_path / "serving.png").stat().st_size > 0


def test_arrivals_are_seeded_poisson() -> None:
    a = bench.arrival_times(4.0, 2000, seed=3)
    assert a == bench.arrival_times(4.0, 2000, seed=3)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    assert a[-1] / (len(a) - 1) == pytest.approx(0.25, rel=0.1)


def test_rescore_judges_a_finished_run_at_other_slos(results: dict, tmp_path: Path) -> None:
    source = tmp_path / "measured.json"
    source.write_text(json.dumps(results))
    quire = results["systems"]["quire"]
    strict = bench.rescore(source, 1e-6, 1e-6, tmp_path / "strict")
    assert strict["slo"]["rescored_from"] == {
        "ttft_ms": results["slo"]["ttft_ms"],
        "tpot_ms": results["slo"]["tpot_ms"],
    }
    # Nothing meets a microsecond target: over at the lowest rate, rate 0.
    assert strict["systems"]["quire"]["sustainable"]["rate"] == 0.0
    loose = bench.rescore(tmp_path / "strict" / "serving.json", 1e9, 1e9, tmp_path / "loose")
    assert loose["slo"]["rescored_from"] == strict["slo"]["rescored_from"]
    sustainable = loose["systems"]["quire"]["sustainable"]
    assert sustainable["censored"] and sustainable["rate"] == max(results["config"]["rates"])
    # The measured runs themselves are untouched.
    runs = loose["systems"]["quire"]["runs"]
    assert [r["ttft_ms"] for r in runs] == [r["ttft_ms"] for r in quire["runs"]]
    assert (tmp_path / "loose" / "serving.png").stat().st_size > 0
