"""Raw control characters inside JSON strings, as torch.profiler writes them, read as those characters.

Kineto writes names and Python frames into the trace as it finds them: a frame whose function
name holds U+0004 (seen for a module imported lazily inside the profiled window) lands in the
file as that raw byte, which strict JSON readers (orjson, msgspec) refuse. Python's
``json.loads(strict=False)`` reads such a string as the characters it holds, and so does
skalpel: a batch that fails to decode is tried again with each raw byte below 0x20 that sits
inside a string written as its ``\\u00XX`` escape. The names keep the characters; every
renderer escapes them for display (``display.plain``). Bytes below 0x20 outside strings are
whitespace or damage and are left as they are, so a really malformed event still fails.
"""

from __future__ import annotations

import numpy as np
import orjson

_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def escape_raw_controls(text: bytes | bytearray | memoryview) -> bytes | None:
    """``text`` (starting outside any string) with the raw control bytes inside its strings escaped, or None if none."""
    data = np.frombuffer(text, np.uint8)
    controls = np.flatnonzero(data < 0x20)
    if not len(controls):
        return None
    escaped = _escaped_positions(data)
    quotes = np.flatnonzero(data == _QUOTE)
    if len(escaped):
        quotes = quotes[~np.isin(quotes, escaped, assume_unique=True)]
        controls = controls[~np.isin(controls, escaped, assume_unique=True)]  # '\' + raw byte: no escape makes it whole
    inside = controls[np.searchsorted(quotes, controls) % 2 == 1]  # an odd number of quotes before: in a string
    if not len(inside):
        return None
    source = bytes(text)
    pieces, previous = [], 0
    for position in inside.tolist():
        pieces.append(source[previous:position])
        pieces.append(b"\\u%04x" % source[position])
        previous = position + 1
    pieces.append(source[previous:])
    return b"".join(pieces)


def loads(text: bytes | bytearray) -> object:
    """``orjson.loads``, reading raw control characters inside strings as ``json.loads(strict=False)`` does."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        escaped = escape_raw_controls(text)
        if escaped is None:
            raise
        return orjson.loads(escaped)


def _escaped_positions(data: np.ndarray) -> np.ndarray:
    """Positions of the bytes that follow an odd run of backslashes (escaped)."""
    backslashes = np.flatnonzero(data == _BACKSLASH)
    if not len(backslashes):
        return backslashes
    run_starts = np.flatnonzero(np.diff(backslashes, prepend=-2) != 1)
    run_ends = np.append(run_starts[1:], len(backslashes)) - 1
    return backslashes[run_ends[(run_ends - run_starts) % 2 == 0]] + 1
