"""make bench-moe's plumbing on one tiny shape: every path measured at every point, the loop's
ratio 1, JSON and PNG written."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import moe_experts


def test_quick_run_writes_every_point(tmp_path: Path) -> None:
    out = tmp_path / "moe.json"
    report = moe_experts.main(
        ["--quick", "--token-counts", "1", "7", "--repeats", "1", "--output", str(out)]
    )
    rows = report["results"]
    points = {(r["dtype"], r["num_tokens"], r["path"]) for r in rows}
    assert points == {
        (dtype, n, path)
        for dtype in ("float32", "bfloat16")
        for n in (1, 7)
        for path in ("loop", "grouped")
    }
    assert all(r["speedup_over_loop"] == 1.0 for r in rows if r["path"] == "loop")
    assert all(r["tokens_per_s"] > 0 and r["best_ms"] <= r["median_ms"] for r in rows)
    assert json.loads(out.read_text()) == report
    assert out.with_suffix(".png").stat().st_size > 0
