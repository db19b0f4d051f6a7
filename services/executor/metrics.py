"""Prometheus metrics under vLLM's names with the `quire:` prefix.

Each executor owns its registry (so several can live in one test process); the engine
loop thread updates it, prometheus_client's HTTP server thread reads it.

Exposed series (every one labelled `model_name`; counters get prometheus_client's
`_total` suffix, histograms `_bucket`/`_sum`/`_count`, as vLLM's `vllm:*` do):

    quire:num_requests_running             gauge      sequences running
    quire:num_requests_waiting             gauge      sequences waiting to be scheduled
    quire:kv_cache_usage_perc              gauge      0..1, blocks in use / all blocks
    quire:prefix_cache_queries_total       counter    prompt tokens looked up at admission
    quire:prefix_cache_hits_total          counter    of those, tokens found cached
    quire:num_preemptions_total            counter
    quire:prompt_tokens_total              counter    prompt tokens of admitted requests
    quire:generation_tokens_total          counter
    quire:time_to_first_token_seconds      histogram  request added -> first token
    quire:inter_token_latency_seconds      histogram  between a request's token steps
    quire:e2e_request_latency_seconds      histogram  request added -> finished
    quire:request_queue_time_seconds       histogram  request added -> first scheduled
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from quire.cluster.registry import ExecutorLoad
from quire.engine.stats import StepStats

# vLLM's buckets (seconds).
_TTFT_BUCKETS: tuple[float, ...] = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
_ITL_BUCKETS: tuple[float, ...] = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
_E2E_BUCKETS: tuple[float, ...] = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0),
    *(60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)


class ExecutorMetrics:
    """The executor's Prometheus series, labelled with the served model name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.num_requests_running = gauge(
            "quire:num_requests_running", "Sequences running on the executor."
        )
        self.num_requests_waiting = gauge(
            "quire:num_requests_waiting", "Sequences waiting to be scheduled."
        )
        self.kv_cache_usage_perc = gauge(
            "quire:kv_cache_usage_perc", "KV-cache usage: 1 means every block is in use."
        )
        self.prefix_cache_queries = counter(
            "quire:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter(
            "quire:prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.num_preemptions = counter("quire:num_preemptions", "Cumulative preemptions.")
        self.prompt_tokens = counter("quire:prompt_tokens", "Prompt tokens admitted.")
        self.generation_tokens = counter("quire:generation_tokens", "Tokens generated.")
        self.time_to_first_token = histogram(
            "quire:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "quire:inter_token_latency_seconds", "Time between a request's tokens.", _ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "quire:e2e_request_latency_seconds", "End-to-end request latency.", _E2E_BUCKETS
        )
        self.request_queue_time = histogram(
            "quire:request_queue_time_seconds",
            "Time a request waited before it was first scheduled.",
            _E2E_BUCKETS,
        )
        self._prefix_totals: tuple[int, int] | None = None  # (queries, hits) last seen

    def observe_load(self, load: ExecutorLoad) -> None:
        """Set the load gauges."""
        self.num_requests_running.set(load.num_running)
        self.num_requests_waiting.set(load.num_waiting)
        self.kv_cache_usage_perc.set(load.kv_cache_usage)

    def observe_prefix_cache(self, num_queries: int, num_hits: int) -> None:
        """Advance the prefix-cache counters from the allocator's totals (in tokens).

        The first call only sets the baseline (a pool that re-registered with its memory
        manager may not start from zero); totals that go back (a restarted manager forgot
        them) never count negative.
        """
        last_queries, last_hits = self._prefix_totals or (num_queries, num_hits)
        self.prefix_cache_queries.inc(max(0, num_queries - last_queries))
        self.prefix_cache_hits.inc(max(0, num_hits - last_hits))
        self._prefix_totals = (num_queries, num_hits)

    def observe_step(self, stats: StepStats) -> None:
        """Count one engine step's generated tokens and preemptions."""
        if stats.num_sampled:
            self.generation_tokens.inc(stats.num_sampled)
        if stats.num_preempted:
            self.num_preemptions.inc(stats.num_preempted)

    def serve(self, host: str, port: int) -> Any:
        """Start the /metrics HTTP server thread; returns the server (call shutdown())."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
