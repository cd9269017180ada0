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
_OTHER_COMPRESSIONS = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
_MEMORY_TIMELINE = re.compile(rb"\s*\[\s*\[\s*-?\d")
_SPACE = re.compile(rb"\s*")


def read_source(path: Path, on_fraction: Callable[[float], None] | None = None) -> tuple[bytearray | bytes | mmap.mmap, bool]:
    """The file's whole text, gunzipped when needed; the flag is True when a gzip stream was cut short.

    A large uncompressed file is mapped rather than read: the loader gives back the pages it
    has parsed (``release``), so the file never sits whole in memory beside its columns. The
    loader reads a large .json.gz as a stream instead (``GzipText``, ``gzstream``).
    """
    if is_gzip(path):
        text = GzipText(path, on_fraction)
        try:
            data, _ = text.read_head(None)
        except MemoryError:
            raise TraceError(f"{path}: not enough memory to decompress it") from None
        return data, text.cut
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size >= max(MAP_FROM_BYTES, 1):
                head = handle.read(3)
                if head != _BOM:
                    return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), False
        raw = path.read_bytes()
    except OSError as error:
        raise TraceError(f"{path}: cannot read the file ({error.strerror or error})") from None
    return without_bom(raw), False


def is_gzip(path: Path) -> bool:
    """Whether the file starts with the gzip magic bytes (whatever its name says)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == _GZIP_MAGIC
    except OSError as error:
        raise TraceError(f"{path}: cannot read the file ({error.strerror or error})") from None


def release(data: bytes | bytearray | mmap.mmap, upto: int) -> None:
    """Drop the pages of a mapped file before ``upto`` from memory (read again from the file if touched)."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        aligned = upto - upto % mmap.PAGESIZE
        if aligned > 0:
            data.madvise(mmap.MADV_DONTNEED, 0, aligned)


def without_bom(data: bytes) -> bytes:
    """The bytes without a leading UTF-8 byte order mark (some editors on Windows write one; JSON has none)."""
    return data[3:] if data[:3] == _BOM else data


class GzipText:
    """The decompressed text of a gzip file, piece by piece as the file is read: never whole in memory.

    Every gzip member is read in turn. A UTF-8 BOM is dropped, and the first megabyte is
    looked at before more is inflated, so that what cannot be a trace (a gzip of zeros)
    fails early. Like gzip -d, it stops quietly at corrupt data or at a stream cut short,
    after giving what decompressed before; ``cut`` then says so. ``on_fraction`` hears the
    share of the file on disk read so far.
    """

    def __init__(self, path: Path, on_fraction: Callable[[float], None] | None = None) -> None:
        self.path = path
        self.on_fraction = on_fraction
        self.cut = False
        self._error: zlib.error | None = None
        self._pieces = self._checked()

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces

    def declared_size(self) -> int | None:
        """The text's size as the gzip trailer states it (of the last member only, modulo 4 GiB); None if unknown."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(-4, os.SEEK_END)
                size = int.from_bytes(handle.read(4), "little")
        except OSError:
            return None
        return size or None

    def read_head(self, limit: int | None) -> tuple[bytearray, bool]:
        """The next ``limit`` bytes or more (None: all of the rest); True when that is the whole rest."""
        head = bytearray()
        for piece in self._pieces:
            head += piece
            if limit is not None and len(head) >= limit:
                return head, False
        return head, True

    def _checked(self) -> Iterator[bytes]:
        pieces = self._inflated()
        head = bytearray()
        for piece in pieces:
            head += piece
            if len(head) >= _HEAD_BYTES:
                break
        if head[:3] == _BOM:
            del head[:3]
        if len(head) >= _HEAD_BYTES:
            _reject_foreign(bytes(head), self.path)
        if head:
            yield bytes(head)
        elif self._error is not None:
            raise TraceError(f"{self.path}: corrupt gzip data ({self._error})")
        elif self.cut:
            raise TraceError(f"{self.path}: the gzip stream is cut off before any data")
        del head
        yield from pieces

    def _inflated(self) -> Iterator[bytes]:
        try:
            handle = open(self.path, "rb")
        except OSError as error:
            raise TraceError(f"{self.path}: cannot read the file ({error.strerror or error})") from None
        with handle:
            size = max(os.fstat(handle.fileno()).st_size, 1)
            decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
            pending = b""
            while True:
                if not pending:
                    pending = handle.read(_IN_CHUNK)
                    if self.on_fraction is not None:
                        self.on_fraction(handle.tell() / size)
                    if not pending:
                        break
                try:
                    while pending and not decompressor.eof:
                        piece = decompressor.decompress(pending, _OUT_CHUNK)
                        pending = decompressor.unconsumed_tail
                        if piece:
                            yield piece
                except zlib.error as error:
                    self._error, self.cut = error, True
                    return
                if decompressor.eof:
                    pending = decompressor.unused_data  # the next member, if any, starts here
                    while len(pending) < 2 and (more := handle.read(_IN_CHUNK)):
                        pending += more
                    if not pending:
                        break
                    if pending[:2] != _GZIP_MAGIC:
                        return  # padding or trailing garbage after the last member: ignored, as gzip does
                    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
            self.cut = not decompressor.eof


def _reject_foreign(head: bytes, path: Path) -> None:
    """Fail early when the first megabyte of a document shows that it is not a trace."""
    foreign = describe_foreign(head)
    if foreign is not None and not head.isspace():
        raise TraceError(f"{path}: {foreign}")


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), or what the address-space limit leaves when lower; None where unknown."""
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
            with open("/proc/self/statm", "rb") as handle:
                in_use = int(handle.read().split()[0]) * mmap.PAGESIZE
            limits.append(max(soft - in_use, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


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
