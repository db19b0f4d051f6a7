"""FastAPI dependencies, typed with Annotated."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.router.admission.rate_limits import charge_request
from services.router.state import RouterState


def get_state(request: Request) -> RouterState:
    """The app's RouterState (set by main.create_app)."""
    state: RouterState = request.app.state.router
    return state


StateDep = Annotated[RouterState, Depends(get_state)]


async def count_request(request: Request, state: StateDep) -> None:
    """Dependency of metered routes that generate nothing (/v1/models): one request, no
    tokens, against the caller's rate limits (429 past them)."""
    await charge_request(request, state.rate_limiter, 0)
