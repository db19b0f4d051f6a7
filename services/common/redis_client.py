"""The services' Redis clients, opened one way.

Redis holds only metadata that can be rebuilt, so every caller bounds each call by a short
timeout and treats a failure as "Redis is down for now" rather than waiting on it.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def connect(
    url: str,
    timeout_s: float,
    *,
    connect_timeout_s: float | None = None,
    client_retries: bool = True,
) -> aioredis.Redis:
    """An asyncio client for `url`; each call gives up after `timeout_s` (connecting after
    `connect_timeout_s`, default the same). `client_retries=False` turns off redis-py's own
    retries, for callers that retry in a loop of their own and want a dead Redis to fail fast."""
    connect_timeout = timeout_s if connect_timeout_s is None else connect_timeout_s
    if client_retries:
        return aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout
        )
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 0),
    )
