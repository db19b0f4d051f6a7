"""`python -m services.router`: flags (over QUIRE_* env) -> settings -> uvicorn."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import structlog
import uvicorn

from services.router.log import configure_logging
from services.router.settings import RouterSettings


def parse_settings(argv: Sequence[str] | None = None) -> RouterSettings:
    """Settings from QUIRE_* variables, each overridden by its `--kebab-case` flag."""
    parser = argparse.ArgumentParser(
        prog="python -m services.router", description="Quire's OpenAI-compatible router."
    )
    for name, field in RouterSettings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        # --flag / --no-flag for booleans, like the other services
        action: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction} if field.annotation is bool else {}
        )
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=argparse.SUPPRESS,
            help=f"{field.description} (env QUIRE_{name.upper()}; default {default!r})",
            **action,
        )
    overrides = vars(parser.parse_args(argv))
    return RouterSettings(**overrides)


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
