"""Settings on the command line: one `--kebab-case` flag per field of a pydantic-settings class.

Every service reads its settings the same way: field defaults, then the QUIRE_* environment,
then the flags actually given (a flag left out never overrides the environment). A value the
settings refuse stops the process with one line per setting on stderr and exit status 2:

    router: error: QUIRE_PORT / --port = 'x': Input should be a valid integer
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn, TypeVar, Union, get_args, get_origin

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from quire.model.checkpoint import checkpoint_problem

SettingsT = TypeVar("SettingsT", bound=BaseSettings)

_SCALARS = (bool, int, float, str)


def _flag_type(annotation: Any) -> type | None:
    """The scalar a flag converts to (`int | None` -> int); None leaves the text to the field's
    own validator (lists given as one comma-separated value)."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation if annotation in _SCALARS else None


def setting_names(settings: type[BaseSettings], name: str) -> str:
    """How a user sets field `name`: "QUIRE_MODEL / --model"."""
    env_prefix = settings.model_config.get("env_prefix", "")
    return f"{env_prefix}{name.upper()} / --{name.replace('_', '-')}"


def exit_bad_setting(
    service: str, settings: type[BaseSettings], name: str, value: object, reason: str
) -> NoReturn:
    """Stop at start-up: one line naming the setting, its value and what is wrong (exit 2)."""
    print(
        f"{service}: error: {setting_names(settings, name)} = {value!r}: {reason}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2)


def check_model_setting(
    service: str, settings: type[BaseSettings], model: str, *, need_weights: bool
) -> None:
    """Exit 2 at once, naming the setting, unless `model` is a checkpoint Quire can serve (a
    directory, config.json with a supported architecture, and weights if `need_weights`)."""
    problem = checkpoint_problem(model, need_weights=need_weights)
    if problem is not None:
        exit_bad_setting(service, settings, "model", model, problem)


def settings_parser(
    settings: type[BaseSettings], prog: str, description: str
) -> argparse.ArgumentParser:
    """A parser with one flag per field of `settings`; absent flags stay out of the result."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    env_prefix = settings.model_config.get("env_prefix", "")
    for name, field in settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        help_text = f"{field.description} [env {env_prefix}{name.upper()}; default {default!r}]"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
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
    """`settings` from the environment, overridden by the flags given in `argv`; a value the
    settings refuse exits 2 with one line per refused setting."""
    overrides = vars(settings_parser(settings, prog, description).parse_args(argv))
    try:
        return settings(**overrides)
    except ValidationError as exc:
        service = prog.removeprefix("python -m services.").replace("_", "-")
        for error in exc.errors():
            print(f"{service}: error: {_describe(settings, error)}", file=sys.stderr)
        raise SystemExit(2) from None


def _describe(settings: type[BaseSettings], error: Any) -> str:
    """One refused value as "QUIRE_X / --x = value: why"; values of secret fields (repr=False)
    and of checks across fields are left out."""
    message = str(error["msg"]).removeprefix("Value error, ")
    name = str(error["loc"][0]) if error["loc"] else ""
    field = settings.model_fields.get(name)
    if field is None:
        return message
    value = repr(error.get("input")) if field.repr else "(hidden)"
    return f"{setting_names(settings, name)} = {value}: {message}"
