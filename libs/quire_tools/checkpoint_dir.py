"""Write a checkpoint directory whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A fresh sibling folder of `out` to write into; on success it replaces `out` in one
    rename (files made readable by all: safetensors writes 0600), on failure it is removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    try:
        tmp.chmod(0o755)
        yield tmp
        for path in tmp.iterdir():
            path.chmod(0o644)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    """A checkpoint's JSON file, stable across runs (sorted keys, 2-space indent)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
