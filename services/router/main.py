"""Builds the router's two FastAPI apps over one RouterState: the public API (--port) and the
admin app (--admin-port, services.router.admin); middleware, error handlers, routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI

from services.router.admin import create_admin_app
from services.router.admission.door import AdmissionGate
from services.router.auth import ApiKeyMiddleware, ApiKeys
from services.router.body_limits import BodyLimitMiddleware
from services.router.deps import count_request
from services.router.errors import install_error_handlers
from services.router.router_metrics import RequestContextMiddleware, RouterMetrics
from services.router.router_settings import RouterSettings
from services.router.routes import chat, completions, models, ops, tokenize
from services.router.sse import ClientDisconnected, client_closed
from services.router.state import RouterState


@dataclass(frozen=True)
class RouterApps:
    """What one router process serves; both apps share `state`."""

    public: FastAPI  # --port: /v1/*, /health, /tokenize, /detokenize; no docs, no schema
    admin: FastAPI  # --admin-port: /metrics, /dashboard, /cluster/status, /docs, /openapi.json
    state: RouterState


def create_apps(settings: RouterSettings | None = None) -> RouterApps:
    """The router's apps; loads the tokenizer now, reaches Redis and executors on demand."""
    settings = settings or RouterSettings()
    metrics = RouterMetrics()
    state = RouterState.build(settings, metrics)
    api_keys = ApiKeys(settings.api_keys, settings.api_keys_file)
    public = create_public_app(state, api_keys)
    return RouterApps(public, create_admin_app(state, api_keys, public), state)


def create_public_app(state: RouterState, api_keys: ApiKeys) -> FastAPI:
    """The API clients use. Its lifespan closes `state` (the admin app has none of its own)."""
    settings = state.settings
    metrics = state.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.stall_watch.start()
        yield
        await state.stall_watch.stop()
        await state.close()

    # Operational pages (docs, schema, metrics, dashboard) live on the admin app only.
    app = FastAPI(
        title="Quire router",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
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
    for module in (completions, chat, ops):
        app.include_router(module.router)
    app.include_router(models.router, dependencies=[Depends(count_request)])
    app.include_router(tokenize.router, dependencies=[Depends(count_request)])
    return app
