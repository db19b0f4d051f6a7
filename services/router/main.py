"""Builds the router's FastAPI app: state, middleware, error handlers, routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.router.errors import install_error_handlers
from services.router.metrics import RequestContextMiddleware, RouterMetrics
from services.router.routes import chat, completions, dashboard, models, ops
from services.router.settings import RouterSettings
from services.router.state import RouterState
from services.router.streaming import ClientDisconnected, client_closed


def create_app(settings: RouterSettings | None = None) -> FastAPI:
    """The router app; loads the tokenizer now, reaches Redis and executors on demand."""
    settings = settings or RouterSettings()
    metrics = RouterMetrics()
    state = RouterState.build(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.close()

    app = FastAPI(title="Quire router", version="0.1.0", lifespan=lifespan)
    app.state.router = state
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnected, client_closed)
    for module in (completions, chat, models, ops, dashboard):
        app.include_router(module.router)
    return app
