"""The registered tool-call formats, by the name the router setting `tool_call_parser` takes.

Every module of `services.router.tool_parsers` is imported before a name is looked up, so a
format registers (`base.register_tool_parser`) just by being a module of that package; one
registered elsewhere (a test's, a deployment's own) counts once its module is imported.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

import services.router.tool_parsers as package
from services.router.tool_parsers.base import TOOL_PARSERS, ToolParser


@functools.cache
def _import_formats() -> None:
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def tool_parser_names() -> list[str]:
    """The names `tool_call_parser` accepts, sorted."""
    _import_formats()
    return sorted(TOOL_PARSERS)


def tool_parser_class(name: str) -> type[ToolParser]:
    """The format registered as `name`; ValueError naming the registered ones if none is."""
    _import_formats()
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, not {name!r}")
    return parser
