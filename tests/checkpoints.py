"""Where the tests find quire-tiny, the random-weight checkpoint `make model` writes."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "models" / "quire-tiny"


def tiny_checkpoint() -> Path:
    """models/quire-tiny, made first where it is missing (a few seconds)."""
    from quire_tools.make_model import ensure_checkpoint

    return ensure_checkpoint(TINY, "tiny")
