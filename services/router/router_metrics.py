"""Prometheus metrics of one router (its own registry, so several apps can share a process).

Names, types and labels: docs/metrics.md (`make docs-metrics` writes it from this registry).
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.router.router_logging import request_id_from_header

_log = structlog.get_logger("router.http")
# Polled constantly: counted, not logged.
_QUIET_ROUTES = {"/health", "/metrics", "/dashboard/state"}
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DURATION_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    *(20.0, 30.0, 60.0, 120.0, 300.0, 600.0),
)


class RouterMetrics:
    """Counters and histograms served at /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "quire_router_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "quire_router_request_duration_seconds",
            "HTTP request duration by route, until the last byte of the response",
            ["route"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.routing_decisions = Counter(
            "quire_router_routing_decisions", "Routing decisions by reason", ["reason"], registry=r
        )
        self.prompt_tokens = Counter(
            "quire_router_prompt_tokens", "Prompt tokens sent to executors", registry=r
        )
        self.cached_prompt_tokens = Counter(
            "quire_router_cached_prompt_tokens",
            "Prompt tokens the executors served from their prefix cache",
            registry=r,
        )
        self.prefix_hit_ratio = Gauge(
            "quire_router_prefix_hit_ratio",
            "Cached prompt tokens / prompt tokens since start",
            registry=r,
        )
        self.generation_tokens = Counter(
            "quire_router_generation_tokens", "Tokens generated for clients", registry=r
        )
        self.admission_rejections = Counter(
            "quire_router_admission_rejections",
            "Requests refused by admission control, by HTTP status",
            ["code"],
            registry=r,
        )
        self.executor_retries = Counter(
            "quire_router_executor_retries",
            "Requests retried on another executor after UNAVAILABLE",
            registry=r,
        )
        self.migrations = Counter(
            "quire_router_migrations",
            "Streams whose executor was lost mid-stream, by outcome: continued (their "
            "unfinished outputs went on elsewhere), exhausted (the request had no migration "
            "left) or failed (no executor took the continuation); the last two end the "
            "client's stream with an error event",
            ["outcome"],
            registry=r,
        )
        self.stalled_executors = Counter(
            "quire_router_stalled_executors",
            "Executors this router declared hung: a read waited on one for --executor-stall-s "
            "while its liveness record showed no engine step (or was gone); its streams migrate",
            registry=r,
        )
        self.handoffs = Counter(
            "quire_router_handoffs",
            "Outputs a prefill executor handed on after their first token (--role prefill), "
            "by outcome: continued (a decode executor took the rest) or failed (none did: the "
            "client's stream ends with an error event)",
            ["outcome"],
            registry=r,
        )
        self.ttft = Histogram(
            "quire_router_time_to_first_token_seconds",
            "From request arrival to the first generated token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "quire_router_in_flight_requests", "Executor requests in flight", registry=r
        )
        self.healthy_executors = Gauge(
            "quire_router_healthy_executors",
            "Executors this router can send work to (live, not draining, not marked down); "
            "at 0 its /health answers 503. Set when /metrics is scraped.",
            registry=r,
        )
        self.hash_params_mismatch = Gauge(
            "quire_router_hash_params_mismatch",
            "1 while executors of the served model announce different block sizes or hash "
            "extra keys (prefix hits then come only from the majority)",
            registry=r,
        )
        self.hash_params_disagreeing = Gauge(
            "quire_router_hash_params_disagreeing_executors",
            "Executors whose announced block hashing differs from the majority's",
            registry=r,
        )
        self._prompt_total = 0
        self._cached_total = 0

    def observe_prompt(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        """Count one executor request's prompt and how much of it was a prefix-cache hit."""
        self.prompt_tokens.inc(num_prompt_tokens)
        self.cached_prompt_tokens.inc(num_cached_tokens)
        self._prompt_total += num_prompt_tokens
        self._cached_total += num_cached_tokens
        if self._prompt_total:
            self.prefix_hit_ratio.set(self._cached_total / self._prompt_total)


class RequestContextMiddleware:
    """Gives every request an id (x-request-id in and out, bound in the logs) and counts it."""

    def __init__(self, app: ASGIApp, metrics: RouterMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = request_id_from_header(headers.get(b"x-request-id", b"").decode("latin-1"))
        scope.setdefault("state", {})["request_id"] = request_id
        scope["state"]["arrival"] = time.monotonic()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode("latin-1")),
                ]
            await send(message)

        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = _route_of(scope)
            duration = time.monotonic() - scope["state"]["arrival"]
            self.metrics.requests.labels(route=route, status=str(status)).inc()
            if route not in _QUIET_ROUTES:
                self.metrics.request_duration.labels(route=route).observe(duration)
                _log.info(
                    "request",
                    method=scope.get("method"),
                    route=route,
                    status=status,
                    duration_ms=round(duration * 1000, 1),
                )
            structlog.contextvars.unbind_contextvars("request_id")


def _route_of(scope: Scope) -> str:
    route: Any = scope.get("route")
    return str(getattr(route, "path", None) or "unmatched")
