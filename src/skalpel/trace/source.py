"""Read a trace file's bytes (gunzipping as needed) and recognise files that are not traces."""

from __future__ import annotations

import mmap
import os
import re
import zlib
from pathlib import Path
from typing import Callable, Iterator

import orjson

from ..errors import TraceError

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
MAP_FROM_BYTES = 8 << 20  # smaller files are read whole: mapping saves too little
_IN_CHUNK = 1 << 20
_OUT_CHUNK = 1 << 20  # zlib doubles its output buffer up to this: keep the transient small
_HEAD_BYTES = 1 << 20  # decompressed bytes looked at before deciding that a file cannot be a trace
_PLAUSIBLE_RATIO = 40  # traces compress 10-20x; a trailer claiming more is checked by counting
_OTHER_COMPRESSIONS = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
_MEMORY_TIMELINE = re.compile(rb"\s*\[\s*\[\s*-?\d")
_SPACE = re.compile(rb"\s*")


def read_source(path: Path, on_fraction: Callable[[float], None] | None = None) -> tuple[bytearray | bytes | mmap.mmap, bool]:
    """The file's bytes, gunzipped when needed; the flag is True when a gzip stream was cut short.

    A large uncompressed file is mapped rather than read: the loader gives back the pages it
    has parsed (``release``), so the file never sits whole in memory beside its columns.
    """
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size >= max(MAP_FROM_BYTES, 1):
                head = handle.read(3)
                if head[:2] != _GZIP_MAGIC and head != _BOM:
                    return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), False
        raw = path.read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read the file ({error.strerror or error})") from None
    if raw[:2] != _GZIP_MAGIC:
        return without_bom(raw), False
    try:
        data, cut = _gunzip(raw, path, on_fraction)
    except MemoryError:
        raise TraceError(f"{path}: not enough memory to decompress it") from None
    if data[:3] == _BOM:
        del data[:3]
    return data, cut


def release(data: bytes | bytearray | mmap.mmap, upto: int) -> None:
    """Drop the pages of a mapped file before ``upto`` from memory (read again from the file if touched)."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        aligned = upto - upto % mmap.PAGESIZE
        if aligned > 0:
            data.madvise(mmap.MADV_DONTNEED, 0, aligned)


def without_bom(data: bytes) -> bytes:
    """The bytes without a leading UTF-8 byte order mark (some editors on Windows write one; JSON has none)."""
    return data[3:] if data[:3] == _BOM else data


class _Inflater:
    """Yields the decompressed bytes of every gzip member in ``raw``, in pieces of at most _OUT_CHUNK.

    Stops quietly at corrupt data (``error``) or at a stream cut short (``cut``), as gzip -d
    would after writing what it could; ``position`` is how far into ``raw`` it has read.
    """

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.position = 0
        self.error: zlib.error | None = None
        self.cut = False

    def __iter__(self) -> Iterator[bytes]:
        raw, view = self.raw, memoryview(self.raw)
        while self.position < len(raw):
            decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
            try:
                while self.position < len(raw) and not decompressor.eof:
                    pending = view[self.position : self.position + _IN_CHUNK]
                    self.position += len(pending)
                    while pending and not decompressor.eof:
                        yield decompressor.decompress(pending, _OUT_CHUNK)
                        pending = decompressor.unconsumed_tail
            except zlib.error as error:
                self.error = error
                return
            if not decompressor.eof:
                self.cut = True
                return
            self.position -= len(decompressor.unused_data)  # the next member, if any, starts here
            if raw[self.position : self.position + 2] != _GZIP_MAGIC:
                return  # padding or trailing garbage after the last member: ignored, as gzip does


def _gunzip(raw: bytes, path: Path, on_fraction: Callable[[float], None] | None) -> tuple[bytearray, bool]:
    """Decompress every gzip member into one buffer of the exact size (no regrowth copies).

    The size comes from the gzip trailer when it is plausible, else from a first pass that
    only counts (and rejects a file that cannot be a trace after its first megabyte, such
    as a gzip of zeros, before inflating gigabytes). Keeps what decompressed when the
    stream ends early or turns corrupt, as for a cut-off file.
    """
    size = _trailer_size(raw)
    if size is None:
        size = _counted_size(raw, path)
    _check_memory(size, path)
    out = bytearray(size)
    filled = 0
    inflater = _Inflater(raw)
    checked = False
    for piece in inflater:
        out[filled : filled + len(piece)] = piece  # grows the buffer only past the expected size
        filled += len(piece)
        if not checked and filled >= _HEAD_BYTES:
            _reject_foreign(bytes(out[:filled]), path)
            checked = True
        if on_fraction is not None:
            on_fraction(inflater.position / len(raw))
    if not filled:
        if inflater.error is not None:
            raise TraceError(f"{path}: corrupt gzip data ({inflater.error})")
        if inflater.cut:
            raise TraceError(f"{path}: the gzip stream is cut off before any data")
    return _trimmed(out, filled), inflater.error is not None or inflater.cut


def _trailer_size(raw: bytes) -> int | None:
    """The uncompressed size from the gzip trailer (modulo 4 GiB); None when implausible, e.g. a cut file."""
    size = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
    return size if 0 < size <= _PLAUSIBLE_RATIO * len(raw) else None


def _counted_size(raw: bytes, path: Path) -> int:
    """Inflate without keeping the output, to learn its size; reject non-traces as soon as they show."""
    size = 0
    head = bytearray()
    blank = True  # only whitespace so far
    for piece in _Inflater(raw):
        size += len(piece)
        if len(head) < _HEAD_BYTES:
            head += piece[: _HEAD_BYTES - len(head)]
            if len(head) >= _HEAD_BYTES:
                _reject_foreign(bytes(head), path)
        if blank and piece.strip():
            blank = False
    if blank and size:
        raise TraceError(f"{path}: the file is empty (only whitespace)")
    return size


def _reject_foreign(head: bytes, path: Path) -> None:
    """Fail early when the first megabyte of a document shows that it is not a trace."""
    foreign = describe_foreign(head)
    if foreign is not None and not head.isspace():
        raise TraceError(f"{path}: {foreign}")


def _check_memory(size: int, path: Path) -> None:
    """A clear error instead of a MemoryError (or the OOM killer) for a document larger than free memory."""
    available = _available_memory()
    if available is not None and size > available:
        raise TraceError(
            f"{path}: decompresses to {size / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB of "
            "memory available"
        )


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or the address-space limit when lower; None where unknown."""
    limits = []
    try:
        with open("/proc/meminfo", "rb") as handle:
            limits += [int(line.split()[1]) * 1024 for line in handle if line.startswith(b"MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else None


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
            value = orjson.loads(bytes(data))  # a mapped file is not bytes
        except orjson.JSONDecodeError:
            pass
        else:
            kind = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "null")
            return f"JSON of another shape: the whole document is {kind}, not a trace"
    start = bytes(data[:8])
    if start.isascii() and start.decode().isprintable():
        return f"not JSON: it starts with {start.decode()!r}"
    return f"not JSON (binary data starting with bytes {start.hex(' ')})"
