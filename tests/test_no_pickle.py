"""Nothing is pickled across a process boundary: no pickle in the source tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SOURCES = ("libs", "services", "benchmarks", "loadtests", "scripts", "tests")
_PICKLE = re.compile(r"^\s*(import pickle|from pickle import)|pickle\.loads?\(|cPickle", re.M)


def test_no_pickle_in_the_repository() -> None:
    offenders = []
    for top in _SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            if _PICKLE.search(path.read_text(encoding="utf-8", errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], f"pickle used in {offenders}: use protobuf or msgpack"
