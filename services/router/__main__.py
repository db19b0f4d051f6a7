"""`python -m services.router`: flags (over QUIRE_* env) -> settings -> two uvicorn servers.

One process, one event loop, one RouterState: the public app on --port and the admin app on
--admin-port (unless it is 0). SIGTERM or SIGINT drains both: they stop accepting connections
(readiness probes fail), open requests and streams finish within --shutdown-grace-s, then the
process exits; a second SIGINT stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator, Sequence

import structlog
import uvicorn
from fastapi import FastAPI

from services.common import cli
from services.router.router_logging import configure_logging
from services.router.router_settings import RouterSettings


def parse_settings(argv: Sequence[str] | None = None) -> RouterSettings:
    """Settings from QUIRE_* variables, each overridden by its `--kebab-case` flag."""
    return cli.parse_settings(
        RouterSettings,
        argv,
        prog="python -m services.router",
        description="Quire's OpenAI-compatible router.",
    )


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to `serve`: uvicorn's own handlers would hand
    every signal to the server started last."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _server(app: FastAPI, host: str, port: int, settings: RouterSettings) -> _Server:
    return _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=settings.log_level.lower(),
            log_config=None,  # uvicorn's loggers go through our JSON handler
            access_log=False,
            timeout_graceful_shutdown=round(settings.shutdown_grace_s),
        )
    )


async def serve(public: FastAPI, admin: FastAPI, settings: RouterSettings) -> int:
    """Serve both apps until SIGTERM or SIGINT; the exit status (uvicorn's, non-zero, when a
    port cannot be bound: then the other server stops too)."""
    servers = [_server(public, settings.host, settings.port, settings)]
    if settings.admin_port:
        admin_host = settings.admin_host or settings.host
        servers.append(_server(admin, admin_host, settings.admin_port, settings))

    def stop(signum: int) -> None:
        for server in servers:
            server.force_exit = server.should_exit and signum == signal.SIGINT
            server.should_exit = True

    async def run(server: _Server) -> int:
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits when it cannot bind (it logged why)
            stop(signal.SIGTERM)
            return int(exc.code or 1)
        return 0

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    return max(await asyncio.gather(*(run(server) for server in servers)))


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    cli.check_model_setting("router", RouterSettings, settings.model, need_weights=False)
    configure_logging(settings.log_level)
    from services.router.main import create_apps

    try:
        apps = create_apps(settings)
    except ValueError as exc:  # a setting the router cannot start with (tokenizer, keys file)
        print(f"router: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 2
    structlog.get_logger("router").info(
        "router starting",
        host=settings.host,
        port=settings.port,
        admin_host=settings.admin_host or settings.host,
        admin_port=settings.admin_port or None,
        model=settings.model_name,
        executors=settings.executors,
    )
    return asyncio.run(serve(apps.public, apps.admin, settings))


if __name__ == "__main__":
    sys.exit(main())
