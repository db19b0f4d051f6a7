"""gRPC keepalive at both ends: clients that hold long streams ping the connection, and every
server accepts those pings.

A stream can carry no data for minutes: a Generate stream waits through its prefill before the
first token, and a large model's prefill of a burst of prompts takes that long. Its client pings
every `KEEPALIVE_TIME_MS` to find out that a peer died (the router then moves the request). A
gRPC server by default treats pings that come more often than every five minutes without data
as abuse and, after two, closes the connection with GOAWAY "too_many_pings", ending every
stream on it: so each server lets pings come twice as often as clients send them.
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 20_000  # a client's ping interval on an otherwise quiet connection
KEEPALIVE_TIMEOUT_MS = 10_000  # an unanswered ping after this marks the connection dead


def client_options(keepalive_time_ms: int = KEEPALIVE_TIME_MS) -> list[tuple[str, int]]:
    """Channel options of a client that pings every `keepalive_time_ms`, with or without
    calls and data."""
    return [
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def server_options(keepalive_time_ms: int = KEEPALIVE_TIME_MS) -> list[tuple[str, int]]:
    """Server options that accept the pings of clients with `client_options(keepalive_time_ms)`."""
    return [
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive_time_ms // 2),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
