"""The services' own flag parsers, to prove every flag a deployment passes really exists.

`parse(module, args, env)` runs the parser of `python -m <module>` on `args` with exactly the
QUIRE_* variables of `env` set, and returns the resulting settings; an unknown flag or a value
of the wrong type fails the test with the parser's message.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from services.executor.executor_settings import ExecutorSettings
from services.executor.executor_settings import parse_settings as parse_executor
from services.memory_manager.__main__ import parse_settings as parse_memory_manager
from services.memory_manager.manager_settings import Settings as MemoryManagerSettings
from services.router.__main__ import parse_settings as parse_router
from services.router.router_settings import RouterSettings

PARSERS: dict[str, Callable[[list[str]], Any]] = {
    "services.router": parse_router,
    "services.executor": parse_executor,
    "services.memory_manager": parse_memory_manager,
}
SETTINGS: dict[str, Any] = {
    "services.router": RouterSettings,
    "services.executor": ExecutorSettings,
    "services.memory_manager": MemoryManagerSettings,
}


@contextlib.contextmanager
def quire_environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with its QUIRE_* variables replaced by those of `env`."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("QUIRE_")}
    for k in saved:
        del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k.startswith("QUIRE_")})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("QUIRE_")]:
            del os.environ[k]
        os.environ.update(saved)


def setting_names(module: str) -> set[str]:
    """The QUIRE_* variables `module` reads."""
    return {f"QUIRE_{name.upper()}" for name in SETTINGS[module].model_fields}


def parse(module: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Any:
    """The settings `python -m module *args` would run with under `env`."""
    stderr = io.StringIO()
    with quire_environment(env or {}), contextlib.redirect_stderr(stderr):
        try:
            return PARSERS[module](list(args))
        except SystemExit as exc:
            raise AssertionError(f"{module} rejects {list(args)}: {stderr.getvalue()}") from exc
