"""benchmarks.preemption on a tiny run: both modes, same requests, preempted and swapped."""

from __future__ import annotations

from pathlib import Path

from benchmarks import preemption

TINY = Path(__file__).resolve().parents[2] / "models" / "quire-tiny"


def test_preemption_quick_run(tmp_path: Path) -> None:
    assert (TINY / "config.json").is_file(), f"{TINY} is missing: `make model` builds it"
    out = tmp_path / "preemption.json"
    results = preemption.main(
        [
            *("--model", str(TINY), "--num-requests", "12", "--max-output-len", "64"),
            *("--block-sizes", "16", "--repeats", "1", "--pool-fraction", "0.15"),
            *("--out", str(out)),
        ]
    )
    assert out.exists() and out.with_suffix(".png").stat().st_size > 0
    by_mode = {r["mode"]: r for r in results["summary"]}
    recompute, swap = by_mode["recompute"], by_mode["swap"]
    # The same requests preempt in both modes; swapping loads blocks back and so computes
    # fewer prefill tokens.
    assert recompute["num_preemptions"] > 0 and swap["num_preemptions"] > 0
    assert recompute["swap_blocks_in"] == 0 < swap["swap_blocks_in"]
    assert swap["prefill_tokens_computed"] < recompute["prefill_tokens_computed"]
    assert results["ratios"]["16"]["throughput_swap_over_recompute"] > 0
