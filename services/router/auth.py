"""Optional API keys: `Authorization: Bearer <key>` on /v1/*, /tokenize, /detokenize,
/dashboard/state and /cluster/status.

Keys come from `--api-keys` (env QUIRE_API_KEYS, comma separated) and/or `--api-keys-file`
(one key a line; blank lines and `#` comments skipped). The file is read at start (a missing
or unreadable file stops the router) and again whenever its mtime, size or inode changes, so
a rotated Kubernetes secret takes effect without a restart; if a later read fails, the last
keys stay in force. With no key configured and no file, auth is off.

A presented key is compared with `hmac.compare_digest` against every configured key, without
stopping at a match, so the time taken says nothing about which key (or how much of one)
matched. Refusals are 401 in OpenAI's shape and never repeat the presented key; keys are never
logged. Downstream (rate limits) a request is known by `key_id(key)`, a SHA-256 digest.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable
from pathlib import Path

import structlog
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.router.errors import error_body

log = structlog.get_logger("router.auth")

ANONYMOUS = "anonymous"  # the key id of requests when auth is off
# Open routes: /health and /metrics are polled by load balancers and Prometheus, which hold
# no key, and say nothing about prompts; /dashboard is a static page (its data, in
# /dashboard/state, is protected). The same rule holds on both ports: /cluster/status and
# /dashboard/state live on the admin port and still need a key there.
_PROTECTED_PREFIX = "/v1/"
_PROTECTED_PATHS = frozenset(
    {"/v1", "/dashboard/state", "/cluster/status", "/tokenize", "/detokenize"}
)


def key_id(key: str) -> str:
    """What stands for a key in Redis and metrics: a SHA-256 hex digest, never the key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_protected(path: str) -> bool:
    """Whether `path` needs a key when auth is on."""
    return path.startswith(_PROTECTED_PREFIX) or path in _PROTECTED_PATHS


def parse_keys(lines: Iterable[str]) -> list[str]:
    """Keys from a comma list or file lines: stripped, blanks and `#` comments dropped."""
    keys = [line.strip() for line in lines]
    return [key for key in keys if key and not key.startswith("#")]


class ApiKeys:
    """The configured keys (flag/env plus file) and the constant-time check against them."""

    def __init__(self, keys: Iterable[str] = (), path: str = "") -> None:
        self._static = [k.encode("utf-8") for k in parse_keys(keys)]
        self.path = Path(path) if path else None
        self._from_file: list[bytes] = []
        self._file_stamp: tuple[int, int, int] | None = None
        if self.path is not None:
            self._load(initial=True)

    @property
    def is_enabled(self) -> bool:
        """Auth is on once any key or a key file is configured."""
        return bool(self._static) or self.path is not None

    @property
    def num_keys(self) -> int:
        return len(self._static) + len(self._from_file)

    def check(self, presented: str) -> bool:
        """True if `presented` equals a configured key (every key is compared, in constant
        time, whatever matched)."""
        self._reload_if_changed()
        candidate = presented.encode("utf-8")
        matched = False
        for key in (*self._static, *self._from_file):
            matched |= hmac.compare_digest(candidate, key)
        return matched

    def _reload_if_changed(self) -> None:
        if self.path is None:
            return
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            log.warning("api key file unreadable; keeping the last keys", error=type(exc).__name__)
            return
        if (stat.st_mtime_ns, stat.st_size, stat.st_ino) != self._file_stamp:
            self._load(initial=False)

    def _load(self, initial: bool) -> None:
        assert self.path is not None, "no key file configured"
        try:
            stat = os.stat(self.path)
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            if initial:
                raise ValueError(f"cannot read --api-keys-file {self.path}: {exc}") from exc
            log.warning("api key file unreadable; keeping the last keys", error=type(exc).__name__)
            return
        self._from_file = [k.encode("utf-8") for k in parse_keys(text.splitlines())]
        self._file_stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        log.info("api keys loaded", path=str(self.path), num_keys=self.num_keys)


def bearer_token(scope: Scope) -> str | None:
    """The token of the request's `Authorization: Bearer <token>` header, if any."""
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def _unauthorized(message: str) -> JSONResponse:
    return JSONResponse(
        error_body(401, message, code="invalid_api_key"),
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


class ApiKeyMiddleware:
    """401 for protected routes without a valid key; sets `request.state.api_key_id`."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["api_key_id"] = ANONYMOUS
        if self.keys.is_enabled and is_protected(scope.get("path", "")):
            token = bearer_token(scope)
            if token is None:
                response = _unauthorized(
                    "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
                )
                await response(scope, receive, send)
                return
            if not self.keys.check(token):
                await _unauthorized("Incorrect API key provided.")(scope, receive, send)
                return
            state["api_key_id"] = key_id(token)
        await self.app(scope, receive, send)
