"""benchmarks.step_size on a tiny run: both protocols measured, the delta responses smaller."""

from __future__ import annotations

from pathlib import Path

from benchmarks import step_size


def test_step_size_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "step_size.json"
    results = step_size.main(
        [
            "--seqs",
            "4,32",
            "--steps",
            "20",
            "--warmup",
            "2",
            "--min-context",
            "40",
            "--max-context",
            "80",
            "--out",
            str(out),
        ]
    )
    assert out.exists() and out.with_suffix(".png").stat().st_size > 0
    runs = {(r["num_seqs"], r["mode"]): r for r in results["runs"]}
    assert set(runs) == {(n, m) for n in (4, 32) for m in ("full", "delta")}
    for n in (4, 32):
        full, delta = runs[(n, "full")], runs[(n, "delta")]
        assert delta["response_bytes_mean"] < full["response_bytes_mean"]
        assert delta["request_bytes_mean"] < full["request_bytes_mean"]
        assert full["rpc_ms_mean"] > 0 and set(full["cpu_ms"]) == set(step_size.InProcess.PARTS)
    # Full tables grow with the running sequences; most decode steps change no table.
    assert runs[(32, "full")]["response_bytes_mean"] > 4 * runs[(4, "full")]["response_bytes_mean"]
    assert (
        runs[(32, "delta")]["response_bytes_mean"] < runs[(32, "full")]["response_bytes_mean"] / 4
    )
