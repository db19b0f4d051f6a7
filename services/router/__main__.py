"""`python -m services.router`: flags (over QUIRE_* env) -> settings -> uvicorn."""

from __future__ import annotations

from collections.abc import Sequence

import structlog
import uvicorn

from services.common import cli
from services.router.log import configure_logging
from services.router.settings import RouterSettings


def parse_settings(argv: Sequence[str] | None = None) -> RouterSettings:
    """Settings from QUIRE_* variables, each overridden by its `--kebab-case` flag."""
    return cli.parse_settings(
        RouterSettings,
        argv,
        prog="python -m services.router",
        description="Quire's OpenAI-compatible router.",
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    configure_logging(settings.log_level)
    from services.router.main import create_app

    app = create_app(settings)
    structlog.get_logger("router").info(
        "router starting",
        host=settings.host,
        port=settings.port,
        model=settings.model_name,
        redis_url=settings.redis_url,
        executors=settings.executors,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's loggers go through our JSON handler
        access_log=False,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
