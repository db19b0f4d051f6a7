"""Per-key rate limits shared by every router replica: requests and tokens per minute in Redis.

Each API key (by `auth.key_id`, a SHA-256 digest; one shared "anonymous" bucket when auth
is off) has two fixed-window counters under `<prefix>:ratelimit:<key id>:{requests,tokens}`.
A window opens with the first request after the last one expired and lasts `WINDOW_S`. One
Lua script checks both limits and, only if both hold, charges both, so a refused request
costs nothing and concurrent replicas cannot overshoot.

A generation request is charged once, by the route, after it has validated and tokenized
the prompts: the same token ids are counted, so nothing is parsed or tokenized twice, and a
request refused as malformed costs nothing. Tokens are charged up front and not reconciled:
the prompt's tokens plus `max_tokens` (chat without `max_tokens`: the rest of the context)
times `n`. That is what a request may cost, known before it runs; a reply that stops early is
not refunded. /v1/models counts as a request with no tokens (`deps.count_request`).

Over a limit: 429 in OpenAI's shape, code `rate_limit_exceeded`, `Retry-After` = seconds
until the window resets. Redis unreachable: the request is allowed (fail open) and a warning
logged once per outage, because refusing all traffic when Redis blips would turn a metadata
outage into a full one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog
from fastapi import Request
from redis.exceptions import RedisError

from services.common import redis_client
from services.router.auth import ANONYMOUS
from services.router.errors import ApiError
from services.router.router_settings import RouterSettings

log = structlog.get_logger("router.ratelimit")

WINDOW_S = 60.0

# KEYS: requests counter, tokens counter. ARGV: window ms, rpm, tpm, tokens.
# Returns {allowed (1/0), ms until the window resets, which limit refused (1 rpm, 2 tpm)}.
_CHECK_AND_CHARGE_LUA = """
local window = tonumber(ARGV[1])
local limits = {tonumber(ARGV[2]), tonumber(ARGV[3])}
local amounts = {1, tonumber(ARGV[4])}
for i = 1, 2 do
  if limits[i] > 0 then
    local used = tonumber(redis.call('GET', KEYS[i]) or '0')
    if used + amounts[i] > limits[i] then
      local ttl = redis.call('PTTL', KEYS[i])
      if ttl < 0 then ttl = window end
      return {0, ttl, i}
    end
  end
end
for i = 1, 2 do
  if limits[i] > 0 and amounts[i] > 0 then
    redis.call('INCRBY', KEYS[i], amounts[i])
    if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], window) end
  end
end
return {1, 0, 0}
"""


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused and when to come back."""

    limit: str  # "requests" or "tokens"
    retry_after_s: int


class RateLimiter:
    """Fixed-window requests- and tokens-per-minute counters per key id, in Redis."""

    def __init__(
        self, redis_url: str, prefix: str, rpm: int, tpm: int, timeout_s: float = 0.25
    ) -> None:
        self.prefix = prefix
        self.rpm = rpm
        self.tpm = tpm
        self.redis: aioredis.Redis | None = None
        if self.is_enabled:
            self.redis = redis_client.connect(redis_url, timeout_s)
            self._script = self.redis.register_script(_CHECK_AND_CHARGE_LUA)
        self._failing = False

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> RateLimiter:
        return cls(
            settings.redis_url,
            settings.redis_prefix,
            settings.rate_limit_rpm,
            settings.rate_limit_tpm,
            settings.redis_timeout_s,
        )

    @property
    def is_enabled(self) -> bool:
        return bool(self.rpm or self.tpm)

    def keys(self, key_id: str) -> list[str]:
        base = f"{self.prefix}:ratelimit:{key_id}"
        return [f"{base}:requests", f"{base}:tokens"]

    async def charge(self, key_id: str, num_tokens: int) -> Refusal | None:
        """Count one request of `num_tokens` for `key_id`; a Refusal if a limit is spent.

        None (allowed) when limits are off or Redis cannot be reached.
        """
        if self.redis is None:
            return None
        args = [int(WINDOW_S * 1000), self.rpm, self.tpm, num_tokens]
        try:
            allowed, ttl_ms, which = await self._script(keys=self.keys(key_id), args=args)
        except (RedisError, OSError) as exc:
            if not self._failing:
                log.warning("rate limits not enforced: redis unreachable", error=repr(exc))
                self._failing = True
            return None
        if self._failing:
            log.info("rate limits enforced again: redis reachable")
            self._failing = False
        if allowed:
            return None
        return Refusal(
            limit="requests" if which == 1 else "tokens",
            retry_after_s=max(1, math.ceil(int(ttl_ms) / 1000)),
        )

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()


def requested_tokens(
    prompts: list[list[int]], n: int, max_tokens: int | None, max_model_len: int
) -> int:
    """What a request may cost: each prompt's tokens plus `n` times its `max_tokens` (None:
    the rest of the context)."""
    total = 0
    for prompt in prompts:
        rest = max(0, max_model_len - len(prompt))
        total += len(prompt) + n * (rest if max_tokens is None else max_tokens)
    return total


async def charge_request(request: Request, limiter: RateLimiter, num_tokens: int) -> None:
    """429 when the caller's key has spent its requests or tokens; else both are charged."""
    if not limiter.is_enabled:
        return
    key = getattr(request.state, "api_key_id", ANONYMOUS)
    refusal = await limiter.charge(key, num_tokens)
    if refusal is None:
        return
    limit = limiter.rpm if refusal.limit == "requests" else limiter.tpm
    raise ApiError(
        429,
        f"Rate limit reached: {limit} {refusal.limit} per minute for this API key. "
        f"Try again in {refusal.retry_after_s} s.",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(refusal.retry_after_s)},
    )
