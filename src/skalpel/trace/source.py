"""Read a trace file's bytes (gunzipping as needed) and recognise files that are not traces."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Callable

import orjson

from ..errors import TraceError

_GZIP_MAGIC = b"\x1f\x8b"
_IN_CHUNK = 1 << 20
_OUT_CHUNK = 1 << 20  # zlib doubles its output buffer up to this: keep the transient small
_OTHER_COMPRESSIONS = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
_MEMORY_TIMELINE = re.compile(rb"\s*\[\s*\[\s*-?\d")
_SPACE = re.compile(rb"\s*")


def read_source(path: Path, on_fraction: Callable[[float], None] | None = None) -> tuple[bytearray | bytes, bool]:
    """The file's bytes, gunzipped when needed; the flag is True when a gzip stream was cut short."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read the file ({error.strerror or error})") from None
    if raw[:2] != _GZIP_MAGIC:
        return raw, False
    return _gunzip(raw, path, on_fraction)


def _gunzip(raw: bytes, path: Path, on_fraction: Callable[[float], None] | None) -> tuple[bytearray, bool]:
    """Decompress every gzip member into one buffer sized from the gzip trailer (no regrowth copies).

    Keeps what decompressed when the stream ends early or turns corrupt, as for a cut-off file.
    """
    out = bytearray(_expected_size(raw))
    filled = 0
    view = memoryview(raw)
    position = 0
    while position < len(raw):
        decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            while position < len(raw) and not decompressor.eof:
                pending = view[position : position + _IN_CHUNK]
                position += len(pending)
                while pending and not decompressor.eof:
                    piece = decompressor.decompress(pending, _OUT_CHUNK)
                    out[filled : filled + len(piece)] = piece  # grows the buffer only past the trailer's size
                    filled += len(piece)
                    pending = decompressor.unconsumed_tail
                if on_fraction is not None:
                    on_fraction(position / len(raw))
        except zlib.error as error:
            if not filled:
                raise TraceError(f"{path}: corrupt gzip data ({error})") from None
            return _trimmed(out, filled), True
        if not decompressor.eof:
            if not filled:
                raise TraceError(f"{path}: the gzip stream is cut off before any data")
            return _trimmed(out, filled), True
        position -= len(decompressor.unused_data)  # the next member, if any, starts here
        if raw[position : position + 2] != _GZIP_MAGIC:
            break  # padding or trailing garbage after the last member: ignored, as gzip does
    return _trimmed(out, filled), False


def _expected_size(raw: bytes) -> int:
    """The uncompressed size from the gzip trailer (modulo 4 GiB; 0 when implausible, e.g. a cut file)."""
    size = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
    return size if size <= 40 * len(raw) else 0  # traces compress 10-20x; a cut file has no trailer


def _trimmed(out: bytearray, filled: int) -> bytearray:
    if filled < len(out):
        del out[filled:]
    return out


def describe_foreign(data: bytes | bytearray) -> str | None:
    """Say what the bytes are when they clearly are not a JSON trace document; None when they may be."""
    if len(data) >= 262 and data[257:262] == b"ustar":
        return "a tar archive, not a trace: extract it first (tar xf FILE) and analyse the trace files inside"
    if data[:4] == b"PK\x03\x04":
        return "a zip archive, not a trace: extract it first and analyse the trace files inside"
    for magic, name in _OTHER_COMPRESSIONS.items():
        if data[: len(magic)] == magic:
            return f"{name}-compressed; skalpel reads .json and .json.gz traces: decompress it first"
    first_at = _SPACE.match(data).end()
    if first_at == len(data):
        return "the file is empty"
    first = data[first_at : first_at + 1]
    if first == b"{":
        return None
    if first == b"[":
        return _describe_array(data, first_at)
    return _describe_scalar(data)


def _describe_array(data: bytes | bytearray, first_at: int) -> str | None:
    has_objects = b"{" in data[first_at : first_at + (1 << 20)]
    if _MEMORY_TIMELINE.match(data, first_at) and not has_objects:
        return "a memory timeline (export_memory_timeline) file, not a trace: load the trace it came from"
    element_at = _SPACE.match(data, first_at + 1).end()
    element = data[element_at : element_at + 1]
    if element in (b"{", b"]", b"") or has_objects:
        return None  # events (the JSON Array Format, maybe after stray values), an empty array, or a cut-off one
    kind = "arrays" if element == b"[" else "strings" if element == b'"' else "numbers or other values"
    return f"JSON of another shape: a list of {kind}, not trace events"


def _describe_scalar(data: bytes | bytearray) -> str:
    if len(data) <= 1 << 20:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
        else:
            kind = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "null")
            return f"JSON of another shape: the whole document is {kind}, not a trace"
    start = bytes(data[:8])
    if start.isascii() and start.decode().isprintable():
        return f"not JSON: it starts with {start.decode()!r}"
    return f"not JSON (binary data starting with bytes {start.hex(' ')})"
