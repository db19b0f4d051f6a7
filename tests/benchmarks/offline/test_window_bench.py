"""The engine benchmark's window run: freeing blocks outside the window against keeping them."""

from __future__ import annotations

from pathlib import Path

import pytest
from quire_tools.make_model import ensure_checkpoint, make_checkpoint

from benchmarks.offline import workloads
from benchmarks.offline.window import freeable_window, run_window_freeing

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"


@pytest.fixture(scope="module")
def window_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mw"), "tiny-mistral-window", seed=8)


def test_window_run_fits_more_sequences_with_the_same_tokens(window_model: Path) -> None:
    assert freeable_window(str(ensure_checkpoint(TINY, "tiny"))) is None
    assert freeable_window(str(window_model)) == 24
    workload = workloads.make_workload(
        workloads.SYNTHETIC["synthetic-alpaca"],
        10,
        0,
        4096,
        2048,
        max_prompt_len=40,
        max_output_len=80,
    )
    result = run_window_freeing(str(window_model), workload, 16, "float32", 24)
    assert result["tokens_identical"]
    freed, kept = result["freed"], result["kept"]
    # Kept blocks fill the pool as outputs grow: more sequences are preempted (block usage
    # depends only on token counts, so these counts are exact).
    assert kept["num_preemptions"] > freed["num_preemptions"]
    assert freed["peak_running"] == kept["peak_running"] == 10  # every prompt fits at once
    assert result["tok_s_ratio"] > 0
