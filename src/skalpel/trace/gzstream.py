"""Read the events of a .json.gz trace as it inflates, holding a few batches of its text at a time.

A gzip of a few megabytes can hold gigabytes of JSON (repetitive traces compress 300x), so
the text goes through a window instead of one buffer:

- the start of the document, up to the ``[`` of ``traceEvents``, is kept: it is the start
  of the header;
- each time the window holds ``WINDOW_BYTES``, the events up to its last likely boundary
  (``},{``) are decoded in the batches ``fastsplit`` cuts (each checked by parsing), and the
  unfinished event at its end is carried on to the next window;
- a batch that does not parse sends the rest of that window through ``jsonscan``'s exact
  scanner, which decodes every whole event in it; the next window starts after the last one;
- what is left when the text ends (the last events, the ``]`` and the header keys after it,
  or a cut-off end) is read as a small document, the kept start before it, by the loader's
  path for whole documents: same header, same recovery of a cut-off end, same notes.

Memory is then the columns plus the window, whatever the size of the document.
"""

from __future__ import annotations

import re
from typing import Iterator, Protocol

import numpy as np

from ..errors import TraceError
from .fastsplit import events_array_start, last_cut
from .jsonscan import BATCH_BYTES, split_document

WINDOW_BYTES = 3 * BATCH_BYTES  # text gathered before the events in it are decoded
_LONGEST_EVENT = 64 << 20  # a window with no whole event grows up to this; past it, the rest counts as damaged
_LONGEST_HEADER = 64 << 20  # text read before traceEvents is found, and after its events end
_SPACE = re.compile(rb"\s*")
_SEPARATOR = re.compile(rb"\s*,?\s*")


class Outcome(Protocol):
    header: dict
    truncated: bool
    recovered_bytes: int


class Decoder(Protocol):
    """How text becomes one file's columns: the loader's paths, the same for a streamed and a whole file."""

    def batches(self, text: bytearray, stop: int) -> int | None:
        """Decode the events in text[:stop] in guessed batches; the offset of a batch that fails, else None."""

    def spans(self, text: bytearray, spans: np.ndarray) -> None:
        """Decode the events at these exact byte ranges of ``text``."""

    def document(self, text: bytes | bytearray) -> Outcome:
        """Decode a whole document (its header and events) as the loader reads a file."""

    def column_bytes(self) -> int:
        """Memory taken by the columns decoded so far."""


class _Window:
    """The inflated text not yet decoded; ``base`` is the offset of its first byte in the document."""

    def __init__(self, pieces: Iterator[bytes], first: bytearray) -> None:
        self.pieces = pieces
        self.text = first
        self.base = 0
        self.skipped = 0  # bytes passed over unread after damage

    def fill(self, size: int) -> bool:
        """Read on until the window holds ``size`` bytes; False when the text ends first."""
        while len(self.text) < size:
            piece = next(self.pieces, None)
            if piece is None:
                return False
            self.text += piece
        return True

    def drop(self, upto: int) -> None:
        del self.text[:upto]  # cheap: a bytearray moves its start, not its bytes
        self.base += upto

    def skip_rest(self) -> None:
        """Pass over the rest of the text unread: counted, not kept."""
        self.skipped = len(self.text) + sum(len(piece) for piece in self.pieces)
        self.text.clear()


def read_events(
    pieces: Iterator[bytes], first: bytearray, decoder: Decoder, path, declared_size: int | None, available: int | None
) -> tuple[Outcome, int]:
    """Decode the events of the text ``first`` + ``pieces``; returns the outcome and the length of the text.

    ``declared_size`` (the gzip trailer's, when plausible) lets the check against
    ``available`` memory project the columns of the whole file from its first window.
    """
    window = _Window(pieces, first)
    opened = _events_array(window, path)
    if opened is None:  # no traceEvents in sight: not a trace as we know them; read whole so that it is named
        _read_rest(window, None, path)
        return decoder.document(window.text), window.base + len(window.text)
    head = bytes(window.text[:opened])
    window.drop(opened + 1)
    if _decode_windows(window, decoder, path, declared_size, available):
        _read_rest(window, _LONGEST_HEADER, path)
    start = window.base  # of the text left, in the whole document
    outcome = decoder.document(head + b"[" + window.text)
    outcome.recovered_bytes += start - len(head) - 1
    return outcome, start + len(window.text) + window.skipped


def _events_array(window: _Window, path) -> int | None:
    """Offset in the window of the '[' that opens the events, reading on as needed; None when not found."""
    while True:
        first = _SPACE.match(window.text).end()
        if first == len(window.text):  # only whitespace so far
            window.drop(first)
            if not window.fill(1):
                raise TraceError(f"{path}: the file is empty (only whitespace)")
            continue
        opening = window.text[first : first + 1]
        if opening == b"[":
            return first
        if opening != b"{":
            return None
        opened = events_array_start(window.text)
        if opened is not None:
            return opened
        if len(window.text) >= _LONGEST_HEADER or not window.fill(2 * len(window.text)):
            return None


def _decode_windows(window: _Window, decoder: Decoder, path, declared_size: int | None, available: int | None) -> bool:
    """Decode whole events window by window; True when the events array closed inside a window (the rest is unread)."""
    target = WINDOW_BYTES
    checked_projection = False
    while window.fill(target):
        cut = last_cut(window.text)
        failed_at = 0 if cut is None else decoder.batches(window.text, cut[0])
        if failed_at is None:
            window.drop(cut[1])
            target = WINDOW_BYTES
        else:
            window.drop(failed_at)
            carry = _decode_exactly(window.text, decoder)
            if carry is None:
                return True
            if carry == 0 and len(window.text) >= _LONGEST_EVENT:
                window.skip_rest()  # damaged beyond what a window can recover: the rest is lost, as after a cut
                return False
            window.drop(carry)
            target = WINDOW_BYTES if carry else min(2 * len(window.text), _LONGEST_EVENT)
        projected = not checked_projection and declared_size is not None and declared_size > window.base
        _check_memory(decoder.column_bytes(), declared_size / window.base if projected else 1.0, available, path)
        checked_projection = checked_projection or projected
    return False


def _decode_exactly(text: bytearray, decoder: Decoder) -> int | None:
    """Decode every whole event of ``text`` (which starts between two events); where the next window starts.

    None when the events array closes inside ``text``: the rest is the end of the document.
    """
    document = split_document(b"[" + text)
    if not document.truncated:
        return None
    spans = document.event_spans - 1
    if not len(spans):
        return 0
    decoder.spans(text, spans)
    return _SEPARATOR.match(text, int(spans[-1, 1])).end()


def _read_rest(window: _Window, limit: int | None, path) -> None:
    """Read the rest of the text into the window: all of it, or at most ``limit`` bytes more than it holds."""
    if limit is None:
        window.fill(1 << 62)
    elif window.fill(len(window.text) + limit):
        raise TraceError(
            f"{path}: not valid JSON: the traceEvents array closes {window.base + len(window.text):,} bytes into "
            f"the document, and more than {limit >> 20} MB of text follows it"
        )


def _check_memory(column_bytes: int, scale: float, available: int | None, path) -> None:
    """A clear error, before the machine runs out, when the columns (projected to the whole file) exceed free memory."""
    needed = column_bytes * scale
    if available is not None and needed > available:
        raise TraceError(
            f"{path}: its events need about {_amount(needed)} of memory for their columns, more than the "
            f"{_amount(available)} available"
        )


def _amount(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
