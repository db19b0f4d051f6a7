"""structlog: one JSON object per line on stderr, with process-wide fields on every line.

Request ids: the router's id of a request (its `x-request-id`) arrives as gRPC metadata on
Generate. The executor logs it as `request_id` and forwards the ids a step touches to the
memory manager as `x-request-ids` metadata on the Step call (`RequestIds`).
"""

from __future__ import annotations

from quire.block.allocator import StepAllocation
from services.common import json_logging

MAX_STEP_REQUEST_IDS = 32  # most ids sent with one Step call (a decode step touches all)
bind_global = json_logging.bind_global
safe_request_id = json_logging.safe_request_id


def configure_logging(level: str = "info", service: str = "executor") -> None:
    """JSON logs to stderr at `level`; the stdlib loggers (grpc, ...) go there as JSON too."""
    json_logging.configure_logging(service, level)


class RequestIds:
    """Engine request id -> the caller's request id, for the Step calls' metadata.

    Used on the engine thread only. A finished request's frees reach the allocator in the
    step after it finished, so its id is kept until the step after `release`.
    """

    def __init__(self, max_ids: int = MAX_STEP_REQUEST_IDS) -> None:
        self.max_ids = max_ids
        self._ids: dict[str, str] = {}
        self._released: list[str] = []  # since the last step
        self._retiring: list[str] = []  # released before the last step: dropped after the next

    def bind(self, engine_request_id: str, request_id: str) -> None:
        self._ids[engine_request_id] = request_id

    def release(self, engine_request_id: str) -> None:
        self._released.append(engine_request_id)

    def step_done(self) -> None:
        """Called after every engine step: forget the requests whose frees went out."""
        for engine_request_id in self._retiring:
            self._ids.pop(engine_request_id, None)
        self._retiring, self._released = self._released, []

    def step_metadata(self, step: StepAllocation) -> tuple[tuple[str, str], ...]:
        """`x-request-ids` for a Step call: the requests it admits, frees or forks first,
        then those it extends; at most `max_ids`, comma separated."""
        seq_ids = [
            *(a.seq_id for a in step.admits),
            *step.frees,
            *(f.child_seq_id for f in step.forks),
            *(a.seq_id for a in step.appends),
        ]
        ids: dict[str, None] = {}
        for seq_id in seq_ids:
            # seq ids are "<engine request id>#<index>"
            request_id = self._ids.get(seq_id.rpartition("#")[0])
            if request_id is not None:
                ids[request_id] = None
                if len(ids) >= self.max_ids:
                    break
        if not ids:
            return ()
        return (("x-request-ids", ",".join(ids)),)
