"""Cut a well-formed trace into batches of events without scanning every byte.

The exact scanner (``jsonscan``) tracks every quote and bracket of the document,
which costs about as much as parsing it. For a complete document this module only
guesses: the ``traceEvents`` array runs from the ``[`` after its key to the last
``]`` that leaves a valid header, and batches end at a ``},{`` (with any
whitespace) near every few megabytes.

The guesses are checked by parsing, so a wrong one can never go unnoticed: each
batch is decoded as ``[`` + bytes + ``]``, and a batch that starts outside any
string at the array's own depth and parses as a complete array of values must end
there too. By induction from the first batch, which starts right after the ``[``,
every batch boundary is a true boundary between two events. A batch that fails to
parse sends the loader to the exact scanner from that batch on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from . import rawcontrols
from .jsonscan import BATCH_BYTES, scan_structure

_KEY = b'"traceEvents"'
_AFTER_KEY = re.compile(rb"\s*:\s*\[")
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_SPACE = re.compile(rb"\s*")
_CLOSE_TRIES = 16


@dataclass(frozen=True)
class Layout:
    header: dict  # every top-level key except traceEvents ({} for a bare array)
    start: int  # just after the array's '['
    stop: int  # at the array's ']'


def guess_layout(data: bytes | bytearray) -> Layout | None:
    """The header and event array bounds of a complete trace document, or None to scan exactly."""
    first = _SPACE.match(data).end()
    if data[first : first + 1] == b"[":
        end = _last_non_space(data)
        if data[end - 1 : end] != b"]":
            return None
        return Layout({}, first + 1, end - 1)
    if data[first : first + 1] != b"{":
        return None
    opened = events_array_start(data)
    if opened is None:
        return None
    found = _events_array_end(data, opened)
    if found is None:
        return None
    close, header = found
    return Layout(header, opened + 1, close)


def events_array_start(data: bytes | bytearray) -> int | None:
    """Offset of the '[' that opens the top-level traceEvents array (None when not found)."""
    key = data.find(_KEY)
    while key >= 0:
        match = _AFTER_KEY.match(data, key + len(_KEY))
        if match:
            head = scan_structure(memoryview(data)[:key])
            if not head.in_string and len(head.depths) and head.depths[-1] == 1:
                return match.end() - 1
        key = data.find(_KEY, key + 1)
    return None


def _events_array_end(data: bytes | bytearray, opened: int) -> tuple[int, dict] | None:
    """The array's closing ']' and the header: the last ']' whose tail makes a valid object."""
    head = bytes(data[:opened])
    close = len(data)
    for _ in range(_CLOSE_TRIES):
        close = data.rfind(b"]", opened + 1, close)
        if close < 0:
            return None
        try:
            header = rawcontrols.loads(head + b"[]" + data[close + 1 :])
        except orjson.JSONDecodeError:
            continue
        if isinstance(header, dict):
            header.pop("traceEvents", None)
            return close, header
    return None


def next_cut(data: bytes | bytearray, start: int, stop: int, at_least: int = BATCH_BYTES) -> tuple[int, int]:
    """A likely event boundary at least ``at_least`` bytes after ``start``: (end of this batch, start of next).

    Returns (stop, stop) when the rest of the array is shorter or has no boundary.
    """
    if stop - start <= at_least:
        return stop, stop
    boundary = _BOUNDARY.search(data, start + at_least, stop)
    if boundary is None:
        return stop, stop
    return boundary.start() + 1, boundary.end() - 1


def last_cut(data: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """The last likely event boundary in ``data`` after ``start``, as ``next_cut`` gives it, or None."""
    look = 1 << 16
    while True:
        found = None
        for found in _BOUNDARY.finditer(data, max(start, len(data) - look)):
            pass
        if found is not None:
            return found.start() + 1, found.end() - 1
        if len(data) - look <= start:
            return None
        look *= 4


def _last_non_space(data: bytes | bytearray) -> int:
    """Length of ``data`` without trailing whitespace, looking only at its end."""
    end = len(data)
    while end > 0:
        tail = data[max(0, end - 4096) : end].rstrip()
        if tail:
            return max(0, end - 4096) + len(tail)
        end -= 4096
    return 0
