"""structlog as JSON lines on stderr, with the request id bound per request.

The request id is the client's `x-request-id` when it is a safe token (else a fresh one);
`RequestContextMiddleware` binds it for every log line of the request, returns it in the
response's `x-request-id` header, and the dispatcher passes it to the executor as gRPC
metadata. Uvicorn's and other stdlib loggers are rendered as the same JSON lines.
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from typing import Any

import structlog

SERVICE = "router"
# What may travel as a request id in gRPC metadata and logs (printable ASCII, no separators).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/@+=~-]{1,128}")


def configure_logging(level: str) -> None:
    """JSON logs at `level` (debug, info, warning, error) for structlog and stdlib loggers."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_service,
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)


def _add_service(_logger: Any, _method: str, event: Any) -> Any:
    event.setdefault("service", SERVICE)
    return event


def request_id_from_header(value: str | None) -> str:
    """The client's request id if it is a safe token (<= 128 of [A-Za-z0-9._:/@+=~-]),
    else a fresh one."""
    if value and _REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    """The request id bound for the request being served (None outside a request)."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None
