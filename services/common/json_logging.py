"""JSON logs for every service: structlog and stdlib loggers as one JSON object per line.

Each line carries `service`, an ISO timestamp, the level, anything bound globally with
`bind_global` (e.g. `executor_id`) and the request context (`request_id`) bound with
structlog's contextvars. Request ids travel between services as gRPC metadata; only safe
tokens are accepted so a header cannot inject anything into logs or metadata.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# What may travel as a request id in headers, gRPC metadata and logs.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:/@+=~-]{1,128}")

_GLOBAL_FIELDS: dict[str, Any] = {}


def bind_global(**fields: Any) -> None:
    """Add fields to every log line from now on, in every thread."""
    _GLOBAL_FIELDS.update(fields)


def safe_request_id(value: str | None) -> str | None:
    """`value` if it can travel as a request id, else None."""
    if value and REQUEST_ID_PATTERN.fullmatch(value):
        return value
    return None


def _add_global_fields(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in _GLOBAL_FIELDS.items():
        event.setdefault(key, value)
    return event


def configure_logging(service: str, level: str = "info", quiet_stdlib: bool = True) -> None:
    """JSON logs to stderr at `level`. With `quiet_stdlib`, third-party stdlib loggers
    (grpc, redis) only speak from WARNING up."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    bind_global(service=service)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _add_global_fields,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,  # lets structlog.testing.capture_logs see every logger
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
    root.setLevel(max(numeric, logging.WARNING) if quiet_stdlib else numeric)
