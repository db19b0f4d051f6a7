"""Builds the router's FastAPI app: state, middleware, error handlers, routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from services.router.admission.door import AdmissionGate
from services.router.auth import ApiKeyMiddleware, ApiKeys
from services.router.body_limits import BodyLimitMiddleware
from services.router.deps import count_request
from services.router.errors import install_error_handlers
from services.router.metrics import RequestContextMiddleware, RouterMetrics
from services.router.routes import chat, completions, dashboard, models, ops, tokenize
from services.router.settings import RouterSettings
from services.router.sse import ClientDisconnected, client_closed
from services.router.state import RouterState


def create_app(settings: RouterSettings | None = None) -> FastAPI:
    """The router app; loads the tokenizer now, reaches Redis and executors on demand."""
    settings = settings or RouterSettings()
    metrics = RouterMetrics()
    state = RouterState.build(settings, metrics)
    api_keys = ApiKeys(settings.api_keys, settings.api_keys_file)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await state.close()

    app = FastAPI(title="Quire router", version="0.1.0", lifespan=lifespan)
    app.state.router = state
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    # Overload is refused before the body is read or parsed (after auth: 401 comes first).
    app.add_middleware(
        AdmissionGate,
        admission=state.admission,
        directory=state.directory,
        metrics=metrics,
        retry_after_s=settings.retry_after_s,
    )
    # Outside the body limit, inside the request context: 401s get request ids and counts.
    app.add_middleware(ApiKeyMiddleware, keys=api_keys)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnected, client_closed)
    # Generation routes charge their rate limits themselves, once the prompt is tokenized.
    for module in (completions, chat, ops, dashboard):
        app.include_router(module.router)
    app.include_router(models.router, dependencies=[Depends(count_request)])
    app.include_router(tokenize.router, dependencies=[Depends(count_request)])
    return app
