"""The offline benchmark's printed table: one column per workload and dtype."""

from __future__ import annotations

from typing import Any

from benchmarks.common.report import fmt


def print_table(results: dict[str, Any]) -> None:
    """Throughput, ratios, KV utilization, FLOPs and memory per column; then concurrency."""
    batch = results["config"]["hf_batch_size"]
    columns = [
        (f"{name} {dtype}", run)
        for name, w in results["workloads"].items()
        for dtype, run in w["dtypes"].items()
    ]
    rows: list[tuple[str, str, str]] = [
        ("output tok/s: quire", "quire_tok_s", ".1f"),
        ("output tok/s: vllm", "vllm_tok_s", ".1f"),
        (f"output tok/s: hf static (B={batch})", "hf_static_tok_s", ".1f"),
        ("output tok/s: hf continuous", "hf_continuous_tok_s", ".1f"),
        ("quire / vllm", "ratio_vs_vllm", ".2f"),
        ("quire / hf static", "ratio_vs_hf_static", ".2f"),
        ("quire / hf continuous", "ratio_vs_hf_continuous", ".2f"),
        ("requests with vllm's exact tokens", "tokens_identical_to_vllm", "d"),
        ("KV utilization: quire (paged)", "kv_utilization", ".3f"),
        ("KV utilization: contiguous, prompt+max_tokens", "contiguous_kv_utilization", ".3f"),
        (
            "KV utilization: contiguous, full context",
            "contiguous_kv_utilization_full_context",
            ".3f",
        ),
        ("achieved GFLOP/s (quire)", "quire_achieved_gflop_s", ".1f"),
        ("matmul fraction (quire)", "matmul_fraction", ".3f"),
        ("matmul fraction (vllm, same FLOPs)", "vllm_matmul_fraction", ".3f"),
        ("KV bytes per token, every layer: quire", "quire_kv_bytes_per_token", ".0f"),
        ("peak RSS MiB: quire", "quire_peak_rss_mib", ".0f"),
        ("peak RSS MiB: vllm", "vllm_peak_rss_mib", ".0f"),
    ]
    width = 46
    col = max(16, *(len(c) + 2 for c, _ in columns))
    lines = [f"{'':<{width}}" + "".join(f"{c:>{col}}" for c, _ in columns)]
    for title, key, spec in rows:
        lines.append(
            f"{title:<{width}}" + "".join(f"{fmt(r.get(key), spec):>{col}}" for _, r in columns)
        )
    names = list(results["workloads"])
    for title, key, spec in [
        ("concurrency: quire mean (saturated)", "quire_mean_running_saturated", ".1f"),
        ("concurrency: quire peak", "quire_peak_running", "d"),
        ("concurrency: contiguous, workload max", "contiguous_num_seqs", "d"),
        ("concurrency: contiguous oracle (simulated)", "contiguous_oracle_mean_running", ".1f"),
        ("concurrency ratio (mean / workload max)", "concurrency_ratio", ".2f"),
        ("concurrency ratio vs oracle", "concurrency_ratio_vs_oracle", ".2f"),
    ]:
        cells = "".join(
            f"{fmt(results['workloads'][n]['concurrency'][key], spec):>{col}}" for n in names
        )
        lines.append(f"{title:<{width}}" + cells)
    windows = [results["workloads"][n].get("window_freeing") for n in names]
    window_rows = [
        ("window: running peak, freed / kept", "peak_running", "d"),
        ("window: running mean (every step), freed / kept", "mean_running", ".1f"),
        ("window: steps, freed / kept", "num_steps", "d"),
        ("window: running mean (saturated), freed / kept", "mean_running_saturated", ".1f"),
        ("window: output tok/s, freed / kept", "tok_s", ".1f"),
        ("window: preemptions, freed / kept", "num_preemptions", "d"),
    ]
    for title, key, spec in window_rows if any(windows) else []:
        cells = "".join(f"{_freed_kept(w, key, spec):>{col}}" for w in windows)
        lines.append(f"{title:<{width}}" + cells)
    print("\n".join(lines))
    for label, run in columns:
        for key in ("vllm_error", "hf_static_error", "hf_continuous_error"):
            if run.get(key) and "skipped" not in run[key]:
                print(f"{key.removesuffix('_error')} on {label}: {run[key]}")
    machine = results["machine"]
    peaks = ", ".join(f"{d} {v:.1f}" for d, v in machine["matmul_gflop_s"].items())
    print(
        f"matmul peak GFLOP/s: {peaks} on {machine['logical_cpus']} CPUs; "
        f"load average at start {machine['load_average_start'][0]:.2f}"
    )


def _freed_kept(window: dict[str, Any] | None, key: str, spec: str) -> str:
    if window is None:
        return ""
    return f"{fmt(window['freed'][key], spec)} / {fmt(window['kept'][key], spec)}"
