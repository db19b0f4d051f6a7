"""FastAPI dependencies, typed with Annotated."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.router.state import RouterState


def get_state(request: Request) -> RouterState:
    """The app's RouterState (set by main.create_app)."""
    state: RouterState = request.app.state.router
    return state


StateDep = Annotated[RouterState, Depends(get_state)]
