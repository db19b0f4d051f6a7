"""Smoke test of the offline engine benchmark: `--quick` runs end to end and writes sane JSON."""

from __future__ import annotations

from pathlib import Path

import pytest
from quire_tools.make_model import ensure_checkpoint

from benchmarks.offline import workloads
from benchmarks.offline.quire_run import run_quire
from quire import LLM
from tests.benchmarks.entry import run_quick

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "quire-tiny"

THROUGHPUT_KEYS = ("quire_tok_s", "hf_static_tok_s", "hf_continuous_tok_s")
RATIO_KEYS = ("ratio_vs_hf_static", "ratio_vs_hf_continuous")
UTILIZATION_KEYS = (
    "kv_utilization",
    "contiguous_kv_utilization",
    "contiguous_kv_utilization_full_context",
    "matmul_fraction",
)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    ensure_checkpoint(TINY, "tiny")
    out = tmp_path_factory.mktemp("bench")
    return run_quick("benchmarks.engine", out, expect="quire / hf static", timeout_s=300)


def test_top_level_sections(results: dict) -> None:
    assert set(results) >= {"workloads", "machine", "config", "definitions"}
    assert set(results["workloads"]) == {"sharegpt"}
    assert results["machine"]["matmul_gflop_s"]["float32"] > 0
    assert results["config"]["quick"] is True


def test_workload_figures_are_sane(results: dict) -> None:
    w = results["workloads"]["sharegpt"]
    assert w["num_requests"] == 4
    assert w["output_len"]["min"] >= 1
    assert w["concurrency"]["concurrency_ratio"] > 0
    run = w["dtypes"]["float32"]
    assert run["vllm_tok_s"] is None and "skipped" in run["vllm_error"]
    for key in THROUGHPUT_KEYS:
        assert run[key] is not None and run[key] > 0, (key, run.get("hf_continuous_error"))
    for key in RATIO_KEYS:
        assert run[key] is not None and run[key] > 0, key
    for key in UTILIZATION_KEYS:
        assert 0 < run[key] <= 1, (key, run[key])
    assert run["quire_peak_rss_mib"] > 0
    w = {**w, **run}
    # Paged blocks waste at most the tail of each block; contiguous reservation wastes more.
    assert w["kv_utilization"] >= w["contiguous_kv_utilization"]
    assert w["contiguous_kv_utilization"] >= w["contiguous_kv_utilization_full_context"]
    concurrency = w["concurrency"]
    assert concurrency["quire_peak_running"] >= concurrency["quire_mean_running_saturated"] > 0
    assert concurrency["contiguous_num_seqs"] >= concurrency["contiguous_num_seqs_full_context"]
    assert all(0 < u <= 1 for u in w["kv_timeline"]["quire"])


def test_stub_forward_holds_the_same_blocks_as_the_model() -> None:
    """The concurrency run stubs the forward; block usage must not depend on it."""
    ensure_checkpoint(TINY, "tiny")
    workload = workloads.make_workload(
        workloads.SYNTHETIC["synthetic-alpaca"],
        12,
        0,
        4096,
        2048,
        max_prompt_len=40,
        max_output_len=24,
    )
    traces = []
    for stub in (False, True):
        llm = LLM(model=str(TINY), num_kv_blocks=12, max_num_seqs=64)
        run = run_quire(llm, workload, f"stub={stub}", stub_forward=stub)
        steps = [
            (s.num_running, s.num_waiting, s.num_tokens, s.num_block_slots) for s in run.samples
        ]
        traces.append((steps, run.num_preemptions, run.num_tokens_computed))
    assert traces[0] == traces[1]
    assert traces[0][1] > 0, "the budget should be tight enough to preempt"
