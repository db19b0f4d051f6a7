"""structlog to stderr as JSON lines (one event per line, ISO timestamps, `service` field).

Stdlib loggers (grpc, redis) are rendered as the same JSON lines. Step lines carry the
executor's `request_ids` (its Step calls' `x-request-ids` metadata).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

SERVICE = "memory-manager"


def configure_logging(level: str = "info") -> None:
    """Route structlog events to stderr as JSON at `level` and above."""
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
    root.setLevel(max(numeric, logging.WARNING))


def _add_service(_logger: Any, _method: str, event: Any) -> Any:
    event.setdefault("service", SERVICE)
    return event
