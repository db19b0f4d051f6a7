"""Files the project writes from its own code (compose.yaml, docs/metrics.md, ...): each
generator's `--check` compares, its plain run writes, and both say the same things."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def write_or_check(path: Path, text: str, check: bool, remedy: str) -> int:
    """Write `text` to `path` unless it holds it already (exit status 0); with `check` only
    compare, and name `remedy` (the command that rewrites it) on stderr when it is stale (1)."""
    current = path.read_text() if path.is_file() else ""
    if check:
        if current != text:
            print(f"{path} is out of date: run `{remedy}`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        path.write_text(text)
    print(f"{path.name}: {'unchanged' if current == text else 'written'}")
    return 0


def generator_main(
    prog: str, path: Path, render: Callable[[], str], remedy: str, argv: Sequence[str] | None
) -> int:
    """`python -m PROG [--check]` for a file rendered whole by `render()`."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    return write_or_check(path, render(), args.check, remedy)
