"""`python -m services.executor [flags]`: serve until SIGTERM/SIGINT, then drain and exit 0."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

import structlog

from services.common import cli
from services.executor.executor_logging import configure_logging
from services.executor.executor_server import ExecutorServer
from services.executor.executor_settings import ExecutorSettings, parse_settings

log = structlog.get_logger("quire.executor")


async def serve(settings: ExecutorSettings) -> int:
    """Run one executor until a signal; the first drains, a second hands what is left back
    to the routers at once.

    Exit status 0 after a drain; 1 if the memory manager declared this incarnation stale.
    """
    server = ExecutorServer(settings)
    signals_seen = 0
    tasks: set[asyncio.Task[None]] = set()

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        log.info("signal received", signal=signal.Signals(signum).name, count=signals_seen)
        server.request_stop()
        if signals_seen > 1:
            task = asyncio.get_running_loop().create_task(server.hand_off())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        if await server.start():
            await server.wait_stop_requested()
            await server.drain()
    finally:
        await server.close()
    return server.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    cli.check_model_setting("executor", ExecutorSettings, settings.model, need_weights=True)
    configure_logging(settings.log_level)
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
