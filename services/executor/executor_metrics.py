"""Prometheus metrics of one executor: vLLM's series, named `quire_executor_<vLLM name>`.

Each executor owns its registry (so several can live in one test process); the engine
loop thread updates it, prometheus_client's HTTP server thread reads it.

Every series is labelled `model_name`. Those with a vLLM equivalent measure what vLLM's
`vllm:<name>` of the same name measures, so a vLLM dashboard ports by replacing `vllm:` with
`quire_executor_`; the swap series (preemption mode swap, quire.engine.swap) have no vLLM v1
equivalent and are named `quire_executor_<what>` by the same scheme.
Names, types, labels and the vLLM equivalents are listed in docs/metrics.md
(`make docs-metrics` writes it from this registry).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from quire.cluster.redis_keys import ExecutorLoad
from quire.engine.stats import StepStats

PREFIX = "quire_executor_"
VLLM_PREFIX = "vllm:"

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

# Preemption by swap (quire.engine.swap): series name, the StepStats.swap field it counts, help.
_SWAP_SERIES = (
    (
        "swap_out_blocks",
        "num_blocks_out",
        "KV blocks of preempted sequences copied to the host pool.",
    ),
    (
        "swap_out_bytes",
        "num_bytes_out",
        "Bytes of KV copied to the host pool from preempted sequences.",
    ),
    (
        "swap_in_blocks",
        "num_blocks_in",
        "KV blocks loaded back from the host pool into resumed sequences (swap-in hits).",
    ),
    (
        "swap_in_bytes",
        "num_bytes_in",
        "Bytes of KV loaded back from the host pool into resumed sequences.",
    ),
    (
        "swap_in_misses",
        "num_blocks_missed",
        "Full blocks a resumed sequence looked for in the host pool and had to recompute.",
    ),
)

# Blocks copied from peers instead of computed (the memory manager's PullOffers): series
# name, the StepStats.pull field it counts, help.
_PULL_SERIES = (
    ("pulls", "num_pulls", "Offers of a peer's blocks this executor pulled from."),
    ("pulled_blocks", "num_blocks", "KV blocks copied from peers, checked and written."),
    ("pulled_bytes", "num_bytes", "Bytes of KV copied from peers."),
    ("pull_seconds", "seconds", "Wall seconds spent pulling (transfer, checks and writes)."),
    (
        "pull_fallbacks",
        "num_fallbacks",
        "Pulls that got fewer blocks than offered (source gone, slow or refusing): the rest "
        "was computed.",
    ),
    (
        "pulls_declined",
        "num_declined",
        "Offers of a peer's blocks not taken because computing them was measured cheaper.",
    ),
)


class ExecutorMetrics:
    """The executor's Prometheus series, labelled with the served model name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        # Series name (counters without `_total`) -> the vLLM series it mirrors.
        self.vllm_equivalents: dict[str, str] = {}
        labels = ["model_name"]
        r = self.registry

        def name(vllm_name: str) -> str:
            self.vllm_equivalents[PREFIX + vllm_name] = VLLM_PREFIX + vllm_name
            return PREFIX + vllm_name

        def gauge(vllm_name: str, doc: str) -> Any:
            return Gauge(name(vllm_name), doc, labels, registry=r).labels(model_name)

        def counter(vllm_name: str, doc: str) -> Any:
            return Counter(name(vllm_name), doc, labels, registry=r).labels(model_name)

        def own_counter(what: str, doc: str) -> Any:
            return Counter(PREFIX + what, doc, labels, registry=r).labels(model_name)

        def histogram(vllm_name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            metric = Histogram(name(vllm_name), doc, labels, buckets=buckets, registry=r)
            return metric.labels(model_name)

        self.num_requests_running = gauge(
            "num_requests_running", "Sequences running on the executor."
        )
        self.num_requests_waiting = gauge(
            "num_requests_waiting", "Sequences waiting to be scheduled."
        )
        self.kv_cache_usage_perc = gauge(
            "kv_cache_usage_perc",
            "KV-cache usage as a fraction 0..1 (vLLM's name): 1 means every block is in use.",
        )
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.num_preemptions = counter("num_preemptions", "Cumulative preemptions.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens admitted.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.spec_decode_num_draft_tokens = counter(
            "spec_decode_num_draft_tokens",
            "N-gram draft tokens run after decoding streams' last tokens.",
        )
        self.spec_decode_num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens",
            "Draft tokens kept (each one more token from its step).",
        )
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "From the request's arrival at the executor to its first token.",
            _TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between a request's tokens.", _ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds",
            "From the request's arrival at the executor to its end.",
            _E2E_BUCKETS,
        )
        self.request_queue_time = histogram(
            "request_queue_time_seconds",
            "Time a request waited before it was first scheduled.",
            _E2E_BUCKETS,
        )
        self.cpu_cache_usage_perc = gauge(
            "cpu_cache_usage_perc",
            "Host (CPU) swap pool usage as a fraction 0..1 of --swap-space (vLLM v0's name); "
            "0 when preempted sequences are recomputed.",
        )

        def counted(series: tuple[tuple[str, str, str], ...]) -> list[tuple[Any, str]]:
            """Each series' counter (an attribute under its name) with the stats field it
            counts."""
            fields = []
            for name, field, doc in series:
                setattr(self, name, own_counter(name, doc))
                fields.append((getattr(self, name), field))
            return fields

        # Preemption by swap (quire.engine.swap) and blocks pulled from peers: no vLLM v1
        # equivalent (its KV connectors count their own).
        self._swap_fields = counted(_SWAP_SERIES)  # StepStats.swap's fields
        self._pull_fields = counted(_PULL_SERIES)  # StepStats.pull's fields
        self._prefix_totals: tuple[int, int] | None = None  # (queries, hits) last seen
        memory_manager_steps = Counter(
            PREFIX + "memory_manager_steps",
            "Engine steps by whether they called the memory manager (call=sent) or needed "
            "nothing from it and made no call (call=quiet: their tokens went with the next one).",
            [*labels, "call"],
            registry=r,
        )
        self._steps_sent = memory_manager_steps.labels(model_name, "sent")
        self._steps_quiet = memory_manager_steps.labels(model_name, "quiet")
        self._allocator_totals = (0, 0)  # (sent, quiet) last seen

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

    def observe_allocator_steps(self, num_sent: int, num_quiet: int) -> None:
        """Advance the memory-manager step counters from the allocator's totals."""
        last_sent, last_quiet = self._allocator_totals
        self._steps_sent.inc(max(0, num_sent - last_sent))
        self._steps_quiet.inc(max(0, num_quiet - last_quiet))
        self._allocator_totals = (num_sent, num_quiet)

    def observe_step(self, stats: StepStats) -> None:
        """Count one engine step's generated tokens, preemptions, swapped and pulled blocks."""
        if stats.num_sampled:
            self.generation_tokens.inc(stats.num_sampled)
        if stats.num_preempted:
            self.num_preemptions.inc(stats.num_preempted)
        if stats.num_draft_tokens:
            self.spec_decode_num_draft_tokens.inc(stats.num_draft_tokens)
            self.spec_decode_num_accepted_tokens.inc(stats.num_kept_drafts)
        swap = stats.swap
        if swap.host_bytes_capacity:
            self.cpu_cache_usage_perc.set(swap.host_bytes_used / swap.host_bytes_capacity)
        for counter, field in self._swap_fields:
            if value := getattr(swap, field):
                counter.inc(value)
        for counter, field in self._pull_fields:
            if value := getattr(stats.pull, field):
                counter.inc(value)

    def serve(self, host: str, port: int) -> Any:
        """Start the /metrics HTTP server thread; returns the server (call shutdown())."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
