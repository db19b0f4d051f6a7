"""structlog as JSON lines on stderr, with the request id bound per request.

The request id is the client's `x-request-id` when it is a safe token (else a fresh one);
`RequestContextMiddleware` binds it for every log line of the request, returns it in the
response's `x-request-id` header, and the dispatcher passes it to the executor as gRPC
metadata. Uvicorn's and other stdlib loggers are rendered as the same JSON lines.
"""

from __future__ import annotations

import uuid

import structlog

from services.common import json_logging

SERVICE = "router"


def configure_logging(level: str) -> None:
    """JSON logs at `level` (debug, info, warning, error) for structlog and stdlib loggers."""
    json_logging.configure_logging(SERVICE, level, quiet_stdlib=False)


def request_id_from_header(value: str | None) -> str:
    """The client's request id if it is a safe token (<= 128 of [A-Za-z0-9._:/@+=~-]),
    else a fresh one."""
    return json_logging.safe_request_id(value) or uuid.uuid4().hex


def current_request_id() -> str | None:
    """The request id bound for the request being served (None outside a request)."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None
