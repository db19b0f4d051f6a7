"""`python -m services.router`: flags (over QUIRE_* env) -> settings -> uvicorn."""

from __future__ import annotations

import sys
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


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    cli.check_model_setting("router", RouterSettings, settings.model, need_weights=False)
    configure_logging(settings.log_level)
    from services.router.main import create_app

    try:
        app = create_app(settings)
    except ValueError as exc:  # a setting the router cannot start with (tokenizer, keys file)
        print(f"router: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 2
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
