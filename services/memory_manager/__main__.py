"""`python -m services.memory_manager [--port N] [--redis-url URL] ...`: run one memory manager.

Every flag has a QUIRE_* environment variable (see settings.py); a flag wins over
the environment. SIGTERM / SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import signal

from services.common import cli
from services.memory_manager.manager_logging import configure_logging
from services.memory_manager.manager_server import MemoryManagerServer
from services.memory_manager.manager_settings import Settings


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from the environment, overridden by the flags given in `argv`."""
    return cli.parse_settings(
        Settings,
        argv,
        prog="python -m services.memory_manager",
        description="Quire memory manager: block tables, refcounts and prefix index over gRPC.",
    )


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = MemoryManagerServer(settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Entry point: parse flags, configure logging, serve."""
    settings = parse_settings(argv)
    configure_logging(settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
