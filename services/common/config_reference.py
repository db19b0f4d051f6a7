"""docs/configuration.md's reference: every flag and variable of every service, from the code.

The tables are written from the settings classes (each field: its flag, its QUIRE_* variable,
its default and its description) and from `StackConfig` (the QUIRE_STACK_* variables of
`make up`, described by the comments beside its fields), between two markers in
docs/configuration.md; the hand-written part around them is kept as it is.

    python -m services.common.config_reference           # rewrite it (`make docs-config`)
    python -m services.common.config_reference --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path

from pydantic_settings import BaseSettings

from services.common.cli import setting_names
from services.common.generated_files import write_or_check
from services.executor.executor_settings import ExecutorSettings
from services.memory_manager.manager_settings import Settings as MemoryManagerSettings
from services.router.router_settings import RouterSettings
from services.stack import spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN reference: written by `make docs-config` from the settings classes -->"
END = "<!-- END reference -->"
# (heading, command, settings class), in the order a request meets them
SERVICES: list[tuple[str, str, type[BaseSettings]]] = [
    ("Router", "python -m services.router", RouterSettings),
    ("Executor", "python -m services.executor", ExecutorSettings),
    ("Memory manager", "python -m services.memory_manager", MemoryManagerSettings),
]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | tuple) and not value:
        return "none"
    if value == "":
        return "`''`"
    return f"`{value}`"


def settings_table(settings: type[BaseSettings]) -> str:
    """One row per field: flag(s), variable, default, description."""
    rows = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    for name, field in settings.model_fields.items():
        env, flag = setting_names(settings, name).split(" / ")
        if field.annotation is bool:
            flag = f"{flag}, --no-{flag.removeprefix('--')}"
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        rows.append(f"| `{flag}` | `{env}` | {_code(default)} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def stack_fields() -> list[tuple[str, str, str]]:
    """(field, default as written in the source, comment) of every StackConfig field."""
    source = inspect.getsource(spec.StackConfig)
    lines = source.splitlines()
    (cls,) = ast.parse(source).body
    assert isinstance(cls, ast.ClassDef), "StackConfig is a class"
    fields = []
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        assert node.value is not None, f"StackConfig.{node.target.id} has no default"
        default = ast.get_source_segment(source, node.value) or ""
        trailing = lines[node.lineno - 1].partition("  # ")[2]
        above: list[str] = []
        for line in reversed(lines[: node.lineno - 1]):
            if not line.strip().startswith("#"):
                break
            above.insert(0, line.strip().removeprefix("#").strip())
        comment = " ".join([*above, trailing]).strip()
        fields.append((node.target.id, default, comment))
    return fields


def stack_table() -> str:
    """The variables `make up` reads (`StackConfig.from_env`)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, comment in stack_fields():
        value = ast.literal_eval(default) if default != "sys.executable" else default
        shown = "the Python running `make up`" if default == "sys.executable" else _code(value)
        rows.append(f"| `{spec.env_variable(name)}` | {shown} | {_cell(comment)} |")
    return "\n".join(rows)


def reference() -> str:
    """The generated part of docs/configuration.md, markers excluded."""
    parts = [
        "## Reference",
        "",
        "Every flag of every service, with its environment variable and default. Booleans take "
        "`--x` / `--no-x` as flags and `true` / `false` as variables; lists are comma "
        "separated.",
    ]
    for heading, command, settings in SERVICES:
        parts += ["", f"### {heading}: `{command}`", "", settings_table(settings)]
    parts += [
        "",
        "### `make up`: the local stack",
        "",
        "`make up` (`python -m services.stack up`) reads these (`StackConfig` in "
        "`services/stack/spec.py`) and gives the services the flags and variables above. "
        "`QUIRE_MODEL`, `QUIRE_NUM_KV_BLOCKS` and `QUIRE_DTYPE` are the services' own "
        "variables; the others belong to the local stack alone.",
        "",
        stack_table(),
    ]
    return "\n".join(parts) + "\n"


def render(text: str) -> str:
    """`text` (docs/configuration.md) with the part between the markers written anew."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC.name} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{reference()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.config_reference")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--doc", type=Path, default=DOC, help="the file to write")
    args = parser.parse_args(argv)
    return write_or_check(args.doc, render(args.doc.read_text()), args.check, "make docs-config")


if __name__ == "__main__":
    sys.exit(main())
