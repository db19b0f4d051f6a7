"""Where a JSON value ends in text still being written: what tells a call's arguments apart
from the format's text after them, before the whole output is there."""

from __future__ import annotations


def json_value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value starting at `start`, or None if it is unfinished."""
    depth, in_string, escaped = 0, False, False
    i = start
    while i < len(text):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            if depth == 0:  # a scalar value ends at its container's close
                return i if i > start else None
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and c in ", \n\t":
            return i if i > start else None
        i += 1
    return None
