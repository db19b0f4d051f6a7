"""How the benchmarks write what they measured: JSON files, table cells and matplotlib figures."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def model_parser(doc: str, out: Path) -> argparse.ArgumentParser:
    """The flags of a benchmark that loads one model offline per dtype: --model, --dtypes
    (float32,bfloat16) and --out (`out`); its description is `doc`'s first paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", type=Path, default=out)
    return parser


def write_json(path: Path, results: dict[str, Any]) -> None:
    """`results` as indented JSON ending in a newline; the parent folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def fmt(value: Any, spec: str = ".1f") -> str:
    """A table cell: `value` in `spec`, or n/a."""
    return "n/a" if value is None else format(value, spec)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: the benchmarks run where there is no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def annotate_bars(ax: Any, rects: Any, values: Sequence[float | None], fontsize: int) -> None:
    """Each bar's value, rounded, above it (n/a where it was not measured)."""
    for rect, value in zip(rects, values, strict=True):
        text = "n/a" if value is None else f"{value:.0f}"
        ax.annotate(
            text,
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            fontsize=fontsize,
        )
