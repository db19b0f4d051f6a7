"""The admin app: what operators and Prometheus read, on a port of its own (--admin-port).

GET /metrics, /cluster/status, /dashboard (and /dashboard/state), /health, and the public
API's OpenAPI schema with its pages (/openapi.json, /docs, /redoc). It shares the public
app's RouterState; none of these paths is served on the public port, which faces clients.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from services.router.auth import ApiKeyMiddleware, ApiKeys
from services.router.errors import install_error_handlers
from services.router.router_metrics import RequestContextMiddleware
from services.router.routes import dashboard, ops
from services.router.state import RouterState


def create_admin_app(state: RouterState, api_keys: ApiKeys, public: FastAPI) -> FastAPI:
    """The admin app over `state`; its /openapi.json describes `public`, the clients' API."""
    app = FastAPI(
        title=f"{public.title} (admin)",
        version=public.version,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.router = state
    # /cluster/status and /dashboard/state still need a key when keys are configured.
    app.add_middleware(ApiKeyMiddleware, keys=api_keys)
    app.add_middleware(RequestContextMiddleware, metrics=state.metrics)
    install_error_handlers(app)
    app.include_router(ops.router)
    app.include_router(ops.admin)
    app.include_router(dashboard.router)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict[str, Any]:
        """The public API's schema (the admin paths are not in it)."""
        return public.openapi()

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title=f"{public.title} - Swagger UI"
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{public.title} - ReDoc")

    return app
