"""Split a Chrome trace document into its header and batches of events, in bounded memory.

Parsing a 1 GB trace with ``json.load`` builds some 8 GB of Python dicts. Instead we
find the structure of the document with vectorised byte scans (numpy over the raw
bytes), cut the ``traceEvents`` array at object boundaries, and hand batches of a few
megabytes to orjson. Only one batch of dicts is alive at a time.

The scan works on any JSON layout (one event per line, pretty-printed, or all on
one line) because it tracks string literals and nesting depth exactly: a brace
inside a string (a C++ kernel name, a Python frame) is never taken for structure.

A document cut short (a killed process) yields every event that closed before the
cut; ``ScanResult.truncated`` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import orjson

from . import rawcontrols

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENERS = (ord("{"), ord("["))
_CLOSERS = (ord("}"), ord("]"))
_SCAN_CHUNK = 4 << 20  # bounds the per-chunk arrays (a few words per byte at worst) to some 200 MB
BATCH_BYTES = 1 << 20  # of JSON per batch: its decoded objects take some 5x that while it is turned into columns
_LEADING_SPACE = re.compile(rb"\s*")


class NotATraceError(ValueError):
    """The bytes are not a Chrome trace document; the message says what they look like."""


@dataclass(frozen=True)
class Structure:
    """Positions of structural characters outside string literals, with the depth after each.

    Only brackets at the top levels are kept (opening to or closing from at most depth
    ``KEPT_DEPTH`` + 1: the document, the events array and the events themselves); the
    brackets inside an event are counted for the depth but not stored, so memory follows
    the number of events, not the nesting a hostile document may pile up.
    """

    positions: np.ndarray  # int64 byte offsets of { } [ ] outside strings, at the top levels
    depths: np.ndarray  # int32 nesting depth *after* the character at that position
    truncated: bool  # the document ends inside a string or with unclosed brackets
    in_string: bool = False  # the bytes end inside a string literal


KEPT_DEPTH = 2


def scan_structure(data: bytes | bytearray | memoryview) -> Structure:
    """Locate the top-level brackets of ``data`` that are not inside a string literal."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    positions_parts: list[np.ndarray] = []
    depths_parts: list[np.ndarray] = []
    depth = 0  # after the chunks so far
    in_string = False
    escape_pending = False  # the chunk before ended on an odd run of backslashes
    for start in range(0, len(buffer), _SCAN_CHUNK):
        chunk = buffer[start : start + _SCAN_CHUNK]
        quotes = np.flatnonzero(chunk == _QUOTE)
        quotes, escape_pending = _drop_escaped_quotes(chunk, quotes, escape_pending)
        # { [ } ] are the only bytes b with b & 0xD9 == 0x59 besides Y _ y and DEL: one cheap pass, then a check.
        candidates = np.flatnonzero((chunk & 0xD9) == 0x59)
        values = chunk[candidates]
        is_open = (values == _OPENERS[0]) | (values == _OPENERS[1])
        is_bracket = is_open | (values == _CLOSERS[0]) | (values == _CLOSERS[1])
        brackets, is_open = candidates[is_bracket], is_open[is_bracket]
        # A bracket is structural when an even number of quotes precede it (plus the carried state).
        outside = (np.searchsorted(quotes, brackets) % 2 == 0) != in_string
        opens = is_open[outside]
        depths = np.cumsum(np.where(opens, 1, -1)) + depth
        depth = int(depths[-1]) if len(depths) else depth
        shallow = depths <= KEPT_DEPTH + opens  # an open from KEPT_DEPTH, a close to it, and all above
        positions_parts.append(brackets[outside][shallow].astype(np.int64) + start)
        depths_parts.append(depths[shallow].astype(np.int32))
        if len(quotes) % 2:
            in_string = not in_string
    positions = np.concatenate(positions_parts) if positions_parts else np.zeros(0, np.int64)
    depths = np.concatenate(depths_parts) if depths_parts else np.zeros(0, np.int32)
    truncated = in_string or depth != 0
    return Structure(positions, depths, truncated, in_string)


def _drop_escaped_quotes(chunk: np.ndarray, quotes: np.ndarray, pending: bool) -> tuple[np.ndarray, bool]:
    """Remove quotes preceded by an odd run of backslashes.

    ``pending`` says the chunk before ended on an odd run of backslashes (which continues
    into this chunk or escapes its first byte); the flag returned says the same of this chunk.
    """
    backslashes = np.flatnonzero(chunk == _BACKSLASH)
    if len(backslashes) == 0:
        if pending and len(quotes) and quotes[0] == 0:
            quotes = quotes[1:]
        return quotes, False
    run_starts = np.flatnonzero(np.diff(backslashes, prepend=-2) != 1)
    run_ends = np.append(run_starts[1:], len(backslashes)) - 1
    lengths = run_ends - run_starts + 1
    if pending and backslashes[0] == 0:
        lengths[0] += 1  # the run started in the chunk before
    elif pending and len(quotes) and quotes[0] == 0:
        quotes = quotes[1:]
    escaped = backslashes[run_ends[lengths % 2 == 1]] + 1  # the byte after an odd run is escaped
    ends_pending = bool(len(escaped)) and int(escaped[-1]) == len(chunk)
    if len(escaped) and len(quotes):
        quotes = quotes[~np.isin(quotes, escaped, assume_unique=True)]
    return quotes, ends_pending


@dataclass(frozen=True)
class Document:
    """A trace document split for incremental parsing."""

    header: dict  # every top-level key except traceEvents
    event_spans: np.ndarray  # (n, 2) int64 byte ranges [start, end) of each complete event object
    truncated: bool
    recovered_bytes: int  # bytes of the file up to the end of the last complete event
    total_bytes: int


def split_document(data: bytes) -> Document:
    """Find the header and the byte span of every complete event in a Chrome trace."""
    first_at = _first_non_space(data)
    if first_at == len(data):
        raise NotATraceError("the file is empty")
    first = data[first_at : first_at + 1]
    if first == b"[":
        return _split_bare_array(data)
    if first != b"{":
        raise NotATraceError("not JSON (it does not start with '{' or '[')")
    structure = scan_structure(data)
    array_open = _trace_events_array(data, structure)
    if array_open is None:
        header = _parse_header(data, structure, None)
        raise NotATraceError(_describe_foreign(header))
    return _split_array(data, structure, array_open)


def _first_non_space(data: bytes | bytearray) -> int:
    return _LEADING_SPACE.match(data).end()


def _split_bare_array(data: bytes) -> Document:
    """The JSON Array Format of the Chrome trace spec: just ``[event, event, ...]``."""
    structure = scan_structure(data)
    array_index = int(np.searchsorted(structure.positions, data.index(b"[")))
    document = _split_array(data, structure, array_index, header_from_rest=False)
    return document


def _trace_events_array(data: bytes, structure: Structure) -> int | None:
    """Index (into structure.positions) of the '[' that opens the top-level traceEvents array."""
    search_from = 0
    while True:
        key = data.find(b'"traceEvents"', search_from)
        if key < 0:
            return None
        index = int(np.searchsorted(structure.positions, key))
        # The key is a top-level member when the bracket before it leaves depth 1.
        depth_here = structure.depths[index - 1] if index > 0 else 0
        if depth_here == 1 and index < len(structure.positions) and data[structure.positions[index]] == ord("["):
            between = data[key + len(b'"traceEvents"') : structure.positions[index]].strip()
            if between == b":":
                return index
        search_from = key + 1


def _split_array(data: bytes, structure: Structure, array_index: int, *, header_from_rest: bool = True) -> Document:
    positions, depths = structure.positions, structure.depths
    array_depth = int(depths[array_index])
    # The array ends at the first bracket after it whose depth drops below the array's depth.
    after = depths[array_index + 1 :]
    below = np.flatnonzero(after < array_depth)
    array_close = array_index + 1 + int(below[0]) if len(below) else None
    stop = array_close if array_close is not None else len(positions)
    inner_positions = positions[array_index + 1 : stop]
    inner_depths = depths[array_index + 1 : stop]
    inner_chars = np.frombuffer(data, dtype=np.uint8)[inner_positions] if len(inner_positions) else np.zeros(0, np.uint8)
    opens = inner_positions[(inner_depths == array_depth + 1) & (inner_chars == ord("{"))]
    closes = inner_positions[(inner_depths == array_depth) & (inner_chars == ord("}"))]
    complete = min(len(opens), len(closes))
    spans = np.stack([opens[:complete], closes[:complete] + 1], axis=1) if complete else np.zeros((0, 2), np.int64)
    truncated = array_close is None
    header: dict = {}
    if header_from_rest and not truncated:
        try:
            header = _parse_header(data, structure, (int(positions[array_index]), int(positions[array_close]) + 1))
        except NotATraceError:
            if not structure.truncated:
                raise
            truncated = True  # cut off after the events: keep them all and the header keys before them
            header = _parse_truncated_header(data, int(positions[array_index]))
    elif header_from_rest:
        header = _parse_truncated_header(data, int(positions[array_index]))
    recovered = int(spans[-1, 1]) if complete else int(positions[array_index]) + 1
    return Document(header, spans, truncated, recovered, len(data))


def _parse_header(data: bytes, structure: Structure, array_span: tuple[int, int] | None) -> dict:
    if array_span is None:
        text = data
    else:
        text = data[: array_span[0]] + b"[]" + data[array_span[1] :]
    try:
        header = rawcontrols.loads(text)
    except orjson.JSONDecodeError as error:
        if structure.truncated:
            raise NotATraceError("the JSON document is cut off before its trace events begin") from error
        raise NotATraceError(f"not valid JSON ({error})") from error
    if not isinstance(header, dict):
        raise NotATraceError("JSON of another shape: the top level is not an object")
    header.pop("traceEvents", None)
    return header


def _parse_truncated_header(data: bytes, array_start: int) -> dict:
    """Header keys written before traceEvents, when the document never closes."""
    prefix = data[:array_start].rstrip()
    key_start = prefix.rfind(b'"traceEvents"')
    prefix = prefix[:key_start].rstrip().rstrip(b",")
    try:
        header = rawcontrols.loads(prefix + b"}")
    except orjson.JSONDecodeError:
        return {}
    return header if isinstance(header, dict) else {}


def _describe_foreign(header: dict) -> str:
    """Say what a JSON object that is not a Kineto trace looks like."""
    if not header:
        return "JSON of another shape: an empty object with no 'traceEvents'"
    if "nodes" in header and ("schema" in header or "pid" in header):
        return "a PyTorch execution trace (ExecutionTraceObserver output), not a torch.profiler trace"
    if "nodes" in header:
        return "a graph document with 'nodes', not a torch.profiler trace"
    if "schema" in header and str(header.get("schema", "")).startswith("skalpel."):
        return "a skalpel report, not a trace (use 'skalpel diff' or load it as a report)"
    if "shared" in header and "frames" in header.get("shared", {}):
        return "a speedscope profile, not a torch.profiler trace"
    keys = ", ".join(sorted(header)[:5])
    return f"JSON of another shape: no 'traceEvents' array (top-level keys: {keys})"


def iter_batch_ranges(spans: np.ndarray, batch_bytes: int = BATCH_BYTES) -> Iterator[tuple[int, int]]:
    """Split ``spans`` into runs [first, last) of about ``batch_bytes`` of JSON each."""
    count = len(spans)
    first = 0
    while first < count:
        last = int(np.searchsorted(spans[:, 1], spans[first, 0] + batch_bytes, side="right"))
        last = max(last, first + 1)
        yield first, last
        first = last
