"""Memory-manager logging: the shared JSON setup (services/common/json_logging.py).

Step lines carry the executor's `request_ids` (its Step calls' `x-request-ids` metadata).
"""

from __future__ import annotations

from services.common import json_logging

SERVICE = "memory-manager"


def configure_logging(level: str = "info") -> None:
    """JSON logs to stderr at `level` and above."""
    json_logging.configure_logging(SERVICE, level)
