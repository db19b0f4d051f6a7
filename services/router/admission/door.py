"""Refuse generation requests at the door while the router has no free admission slot.

Under overload most requests must be refused, and a refusal is only useful if it is fast and
cheap: a client told 429 + Retry-After within milliseconds backs off or tries another
replica, while one kept waiting adds to the load it is meant to shed. `AdmissionGate` is
plain ASGI and sits outside the body parsing, validation, tokenization and routing: when no
slot is free it answers from the request line alone, without reading the body. Requests that
pass still meet the exact checks in `Dispatcher` (per-executor bounds, n > 1 needing several
slots), so the door only ever refuses what would be refused later anyway.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from services.router.admission.slots import ALL_EXECUTORS_FULL, Admission, current_ticket
from services.router.directory import ExecutorDirectory
from services.router.errors import error_body
from services.router.router_metrics import RouterMetrics

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class AdmissionGate:
    """429 before any parsing when the overall bound is reached or every executor is full;
    otherwise the request runs holding a ticket (see `admission.slots`)."""

    def __init__(
        self,
        app: ASGIApp,
        admission: Admission,
        directory: ExecutorDirectory,
        metrics: RouterMetrics,
        retry_after_s: int,
    ) -> None:
        self.app = app
        self.admission = admission
        self.directory = directory
        self.metrics = metrics
        self.retry_after = str(retry_after_s).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in GENERATION_PATHS
        ):
            await self.app(scope, receive, send)
            return
        a = self.admission
        usable = self.directory.cached_usable_executors()
        if usable and usable <= a.full_executors():
            await self.refuse(send, ALL_EXECUTORS_FULL)
            return
        ticket = a.enter()
        if ticket is None:
            await self.refuse(send, a.overall_full_message())
            return
        token = current_ticket.set(ticket)
        try:
            await self.app(scope, receive, send)
        finally:
            current_ticket.reset(token)
            a.leave(ticket)

    async def refuse(self, send: Send, message: str) -> None:
        self.metrics.admission_rejections.labels(code="429").inc()
        await _reply_429(send, message, self.retry_after)


async def _reply_429(send: Send, message: str, retry_after: bytes) -> None:
    body = json.dumps(error_body(429, message, code="rate_limit_exceeded")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", retry_after),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
