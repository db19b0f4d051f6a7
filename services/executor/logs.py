"""structlog: one JSON object per line on stderr, with process-wide fields on every line."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_GLOBAL_FIELDS: dict[str, Any] = {}


def bind_global(**fields: Any) -> None:
    """Add fields (e.g. executor_id) to every log line from now on, in every thread."""
    _GLOBAL_FIELDS.update(fields)


def _add_global_fields(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key, value in _GLOBAL_FIELDS.items():
        event.setdefault(key, value)
    return event


def configure_logging(level: str = "info", service: str = "executor") -> None:
    """JSON logs to stderr at `level`; the stdlib root logger (grpc, ...) goes there too."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"unknown log level {level!r}")
    bind_global(service=service)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_global_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(numeric, logging.WARNING), stream=sys.stderr, format="%(message)s"
    )
