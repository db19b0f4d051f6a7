"""Where a JSON value ends in text still being written: what tells a call's arguments apart
from the format's text after them, before the whole output is there."""

from __future__ import annotations

from services.router.tool_parsers.base import CallDelta, ParsedDelta


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


def read_arguments(text: str, start: int, arguments: str) -> tuple[int, int | None, str]:
    """How far a call's JSON arguments, starting at `start` in `text` (still being written),
    have come since `arguments` were read: (start, end, new).

    White space before the value is skipped while nothing is read (`start` moves past it);
    `end` is just past the value, None while it is unfinished; `new` is the text after
    `arguments` up to `end` or, unfinished, to the end of `text`."""
    while not arguments and text[start : start + 1].isspace():
        start += 1
    end = json_value_end(text, start)
    stop = len(text) if end is None else end
    return start, end, text[start + len(arguments) : stop]


def stream_arguments(
    text: str, start: int, call: CallDelta, out: ParsedDelta
) -> tuple[int, int | None]:
    """Read on in `call`'s arguments (`read_arguments`): the new text is added to the call and
    streamed in `out`. Returns where they start and where they end (None while unfinished)."""
    start, end, new = read_arguments(text, start, call.arguments)
    if new:
        call.arguments += new
        out.calls.append(CallDelta(call.index, new))
    return start, end
