"""Settings on the command line: one `--kebab-case` flag per field of a pydantic-settings class.

Every service reads its settings the same way: field defaults, then the QUIRE_* environment,
then the flags actually given (a flag left out never overrides the environment).
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Sequence
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic_settings import BaseSettings

SettingsT = TypeVar("SettingsT", bound=BaseSettings)

_SCALARS = (bool, int, float, str)


def _flag_type(annotation: Any) -> type | None:
    """The scalar a flag converts to (`int | None` -> int); None leaves the text to the field's
    own validator (lists given as one comma-separated value)."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation if annotation in _SCALARS else None


def settings_parser(
    settings: type[BaseSettings], prog: str, description: str
) -> argparse.ArgumentParser:
    """A parser with one flag per field of `settings`; absent flags stay out of the result."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    env_prefix = settings.model_config.get("env_prefix", "")
    for name, field in settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        help_text = f"{field.description} [env {env_prefix}{name.upper()}; default {default!r}]"
        kind = _flag_type(field.annotation)
        # --flag / --no-flag for booleans (bool("false") would be True)
        options: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction}
            if kind is bool
            else ({"type": kind} if kind is not None else {})
        )
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=argparse.SUPPRESS,
            help=help_text,
            **options,
        )
    return parser


def parse_settings(
    settings: type[SettingsT], argv: Sequence[str] | None, prog: str, description: str
) -> SettingsT:
    """`settings` from the environment, overridden by the flags given in `argv`."""
    overrides = vars(settings_parser(settings, prog, description).parse_args(argv))
    return settings(**overrides)
