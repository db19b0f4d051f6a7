"""Request-body limits, enforced before any parsing: size (413), media type (415), UTF-8 (400).

`BodyLimitMiddleware` is plain ASGI. A `Content-Length` over the limit is refused before a
byte of the body is read; a chunked body is counted as it arrives and refused as soon as it
passes the limit, so an oversized body is never held in memory. A body within the limit is
read whole (FastAPI reads it whole anyway) and replayed to the app, after which the app sees
the client's own `receive` (disconnect detection keeps working).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.router.errors import error_body

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json_media_type(content_type: str) -> bool:
    """application/json or any +json type (parameters such as charset allowed)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class BodyLimitMiddleware:
    """413 past `max_body_bytes`, 415 for a non-JSON body, 400 for a body that is not UTF-8."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                await _reply(send, 400, "Content-Length is not a number")
                return
            if int(length) > self.max_body_bytes:
                await _reply(send, 413, self._too_large())
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _reply(send, 413, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = headers.get("content-type")
        if body and not is_json_media_type(content_type or ""):
            got = "none" if content_type is None else repr(content_type)
            await _reply(send, 415, f"Content-Type must be application/json, got {got}")
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await _reply(send, 400, f"the body is not valid UTF-8 (byte {exc.start})")
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> str:
        return f"the request body is larger than the limit of {self.max_body_bytes} bytes"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Send, status: int, message: str) -> None:
    payload: dict[str, Any] = error_body(status, message, code=_CODES.get(status))
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                # An oversized body is left unread: the connection cannot be reused.
                *([(b"connection", b"close")] if status == 413 else []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


_CODES = {413: "request_too_large", 415: "unsupported_media_type", 400: "invalid_body"}
