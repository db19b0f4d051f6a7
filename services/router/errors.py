"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with its status."""

from __future__ import annotations

from typing import Any

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = structlog.get_logger("router")

_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error the client sees; `status` picks the HTTP status and the default type."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object for one status."""
    error_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_grpc(error: grpc.aio.AioRpcError, executor_id: str) -> ApiError:
    """Translate an executor's gRPC status into the client's error."""
    code = error.code()
    details = error.details() or code.name
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return bad_request(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ApiError(429, details, code="executor_busy")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ApiError(504, "the request timed out", code="timeout")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ApiError(503, f"executor {executor_id} is unavailable", code="executor_unavailable")
    return ApiError(502, f"executor {executor_id} failed: {details}", code=code.name.lower())


def _field_name(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    # Union members show up as their type names (e.g. "list[int]"); keep the field path only.
    parts = [p for p in parts if "[" not in p and p not in ("str", "int", "float", "bool")]
    return ".".join(parts) or None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if not errors:
        return JSONResponse(error_body(400, "invalid request"), status_code=400)
    first = errors[0]
    if first.get("type") == "json_invalid":
        message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}"
        return JSONResponse(error_body(400, message), status_code=400)
    # A validator that names its own parameter (a whole-body check) puts it in ctx.
    param = first.get("ctx", {}).get("param") or _field_name(tuple(first.get("loc", ())))
    if first.get("type") == "unsupported_parameter":
        return JSONResponse(error_body(400, str(first.get("msg")), param), status_code=400)
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return JSONResponse(error_body(400, message, param), status_code=400)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        error_body(exc.status_code, str(exc.detail)),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", error=repr(exc))
    return JSONResponse(error_body(500, "internal error"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app returns, including FastAPI's own, in OpenAI's shape."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
