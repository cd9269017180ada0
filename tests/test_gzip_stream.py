"""A large .json.gz is read as a stream (``gzstream``): the same Trace as its uncompressed text, in bounded memory.

Every document here is longer than ``WHOLE_GZIP_BYTES``, so the gzip goes through the
window by window path while the plain file goes through the whole-document path; the two
must agree on every column, name, kept arg, header field and note. The memory test runs the
load in a fresh process and bounds its peak RSS by the size of the columns it built.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from skalpel.trace import load
from skalpel.trace.jsonscan import BATCH_BYTES
from skalpel.trace.loader import WHOLE_GZIP_BYTES

from .conftest import corpus

RESNET = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
BOM = b"\xef\xbb\xbf"


def _assert_same_trace(streamed, whole) -> None:
    """Every column, name, kept arg and header-derived field equal; notes equal up to the file's name."""
    for key, value in vars(whole).items():
        other = getattr(streamed, key)
        if isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and np.array_equal(value, other, equal_nan=True), key
    for key, value in vars(whole.memory).items():
        assert np.array_equal(value, getattr(streamed.memory, key)), f"memory.{key}"
    assert streamed.names == whole.names and streamed.extra == whole.extra and streamed.origin_us == whole.origin_us
    assert [dataclasses.replace(info, path="") for info in streamed.ranks] == [
        dataclasses.replace(info, path="") for info in whole.ranks
    ]
    assert [w.replace(".json.gz", ".json") for w in streamed.warnings] == whole.warnings


def _pair(tmp_path: Path, text: bytes) -> tuple[Path, Path]:
    """The same text as trace.json.gz and trace.json."""
    assert len(text) > WHOLE_GZIP_BYTES > 4 * BATCH_BYTES  # streamed, in many windows
    packed, plain = tmp_path / "trace.json.gz", tmp_path / "trace.json"
    packed.write_bytes(gzip.compress(text, compresslevel=1))
    plain.write_bytes(text)
    return packed, plain


def _replicated(min_bytes: int) -> tuple[list[bytes], dict]:
    """The ResNet trace's events (as JSON) repeated with shifted times up to ``min_bytes``, and its header."""
    document = orjson.loads(gzip.decompress(corpus(RESNET).read_bytes()))
    events = document.pop("traceEvents")
    texts: list[bytes] = []
    size, copy = 0, 0
    while size < min_bytes:
        for event in events:
            if copy and isinstance(event.get("ts"), (int, float)):
                event = {**event, "ts": event["ts"] + copy * 2_000_000}
            texts.append(orjson.dumps(event))
            size += len(texts[-1]) + 2
        copy += 1
    return texts, document


def test_streamed_kineto_gzip_equals_its_plain_text(tmp_path: Path) -> None:
    """The real ResNet trace (35 MB of JSON in a 1.1 MB gzip): same Trace; progress in bytes on disk to the end."""
    packed = corpus(RESNET)
    plain = tmp_path / "resnet.json"
    plain.write_bytes(gzip.decompress(packed.read_bytes()))
    assert plain.stat().st_size > WHOLE_GZIP_BYTES
    calls: list[tuple[int, int]] = []
    streamed = load(packed, on_progress=lambda done, total: calls.append((done, total)))
    _assert_same_trace(streamed, load(plain))
    done = [d for d, _ in calls]
    assert done == sorted(done) and calls[-1] == (packed.stat().st_size,) * 2 and len(calls) > 2


@pytest.mark.parametrize("layout", ["header_after", "header_both_sides", "bare_array"])
def test_header_anywhere_and_bare_arrays_stream_alike(tmp_path: Path, layout: str) -> None:
    """Kineto writes header keys before and after traceEvents; a BOM may lead; the JSON Array Format has none."""
    texts, header = _replicated(24 << 20)
    events = b"[\n" + b",\n".join(texts) + b"\n]"
    after = {"distributedInfo": {"rank": 3, "world_size": 4, "backend": "nccl"}, "traceName": "resnet"}
    if layout == "header_after":
        text = BOM + b'{"traceEvents": ' + events + b", " + orjson.dumps({**header, **after})[1:]
    elif layout == "header_both_sides":
        text = orjson.dumps(header)[:-1] + b', "traceEvents": ' + events + b", " + orjson.dumps(after)[1:]
    else:
        text = b"  " + events
    packed, plain = _pair(tmp_path, text)
    streamed = load(packed)
    _assert_same_trace(streamed, load(plain))
    if layout != "bare_array":
        info = streamed.ranks[0]
        assert (info.rank, info.world_size, info.backend) == (3, 4, "nccl")
        assert info.device_names[0] == "Tesla V100-DGXS-32GB"


def test_cut_off_gzip_keeps_every_whole_event(tmp_path: Path) -> None:
    """A gzip cut at 60% of its bytes: the events of the text that inflates, and the "cut off" note, as a plain cut file."""
    texts, header = _replicated(24 << 20)
    text = orjson.dumps(header)[:-1] + b', "traceEvents": [\n' + b",\n".join(texts) + b"\n]}"
    compressed = gzip.compress(text, compresslevel=1)
    cut = compressed[: len(compressed) * 6 // 10]
    packed, plain = tmp_path / "trace.json.gz", tmp_path / "trace.json"
    packed.write_bytes(cut)
    plain.write_bytes(zlib.decompressobj(31).decompress(cut))  # what gzip -d writes before its error
    assert plain.stat().st_size > WHOLE_GZIP_BYTES
    streamed = load(packed)
    _assert_same_trace(streamed, load(plain))
    assert streamed.ranks[0].truncated and any("cut off" in w for w in streamed.warnings)
    ranges = sum(b'"ph":"X"' in event for event in texts)
    assert 0.4 * ranges < len(streamed) < 0.8 * ranges


def test_damaged_event_mid_stream_is_recovered_exactly(tmp_path: Path) -> None:
    """One event with invalid JSON in the middle: its batch goes through the exact scanner, only that event is lost."""
    texts, header = _replicated(24 << 20)
    middle = len(texts) // 2
    while b'"dur":' not in texts[middle]:
        middle += 1
    texts[middle] = texts[middle].replace(b'"dur":', b'"dur":x', 1)
    text = orjson.dumps(header)[:-1] + b', "traceEvents": [' + b",".join(texts) + b"]}"
    packed, plain = _pair(tmp_path, text)
    streamed = load(packed)
    _assert_same_trace(streamed, load(plain))
    assert any("skipped 1 malformed events" in w for w in streamed.warnings)


EVENT = (b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1669783687352244, '
         b'"dur": 20, "args": {"External id": 7, "Sequence number": 3, "Fwd thread id": 0}}')  # fmt: skip


def _write_repetitive(path: Path, size_bytes: int) -> int:
    """A valid trace of one op repeated to ``size_bytes`` of JSON, gzipped (some 300x) as it is written; its event count."""
    blocks = size_bytes // (10_000 * (len(EVENT) + 2))
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        out.write(compressor.compress(b'{"traceEvents": [' + EVENT))
        block = b",\n" + b",\n".join([EVENT] * 10_000)
        for _ in range(blocks):
            out.write(compressor.compress(block))
        out.write(compressor.compress(b'], "traceName": "repetitive"}') + compressor.flush())
    return 1 + blocks * 10_000


_PEAK_OF_LOAD = """
import resource, sys
import numpy as np
from skalpel.trace import load
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
trace = load(sys.argv[1])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
arrays = [v for v in [*vars(trace).values(), *vars(trace.memory).values()] if isinstance(v, np.ndarray)]
print(before, peak, sum(array.nbytes for array in arrays), len(trace))
"""


@pytest.mark.slow
def test_large_repetitive_gzip_loads_in_the_memory_of_its_columns(tmp_path: Path) -> None:
    """200 MB of JSON in a ~1 MB gzip: the load's peak above the imports is bounded by its columns, not the document.

    Inflating the document whole (as before) grew the peak by about 3x the columns (here 299 MiB
    for 96 MiB of columns; streamed: 92 MiB); the bound is 1.5x the columns plus 40 MiB.
    """
    path = tmp_path / "repetitive.json.gz"
    events = _write_repetitive(path, 200 << 20)
    assert path.stat().st_size < 4 << 20
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_LOAD, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    before, peak, columns, loaded = (int(value) for value in done.stdout.split())
    assert loaded == events
    grown = peak - before
    assert grown < 1.5 * columns + (40 << 20), f"peak grew {grown >> 20} MiB for {columns >> 20} MiB of columns"


_LOAD_UNDER_LIMIT = """
import resource, sys
from skalpel.errors import TraceError
from skalpel.trace import load
in_use = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (in_use + (48 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    load(sys.argv[1])
except TraceError as error:
    print(error)
"""


@pytest.mark.slow
def test_columns_beyond_the_memory_left_are_one_clear_error(tmp_path: Path) -> None:
    """Under an address-space limit that leaves 48 MiB, a gzip whose columns need ~96 MiB fails after its first window,
    projected from the gzip trailer: one line, not a MemoryError."""
    path = tmp_path / "repetitive.json.gz"
    _write_repetitive(path, 200 << 20)
    done = subprocess.run([sys.executable, "-c", _LOAD_UNDER_LIMIT, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    found = re.fullmatch(r".*: its events need about (\d+) MiB of memory for their columns, more than the (\d+) MiB available\n",
                         done.stdout)  # fmt: skip
    assert found and 64 < int(found[1]) < 160 and int(found[2]) <= 48, done.stdout


@pytest.mark.slow
def test_damage_no_window_can_hold_loses_the_rest_as_a_cut_does(tmp_path: Path) -> None:
    """A string left open 24 MB into the events, then 70 MB of text with no event end: the events before it are
    kept with the "cut off" note, as the whole-document path gives; the window stops growing at 64 MB, so the
    peak grows by that window scanned exactly (~180 MiB), not by the document (whole: 267 MiB)."""
    texts, header = _replicated(24 << 20)
    text = (orjson.dumps(header)[:-1] + b', "traceEvents": [' + b",".join(texts)
            + b', {"ph": "X", "name": "' + b"a" * (70 << 20) + b"]}")  # fmt: skip
    packed, plain = _pair(tmp_path, text)
    streamed = load(packed)
    _assert_same_trace(streamed, load(plain))
    assert len(streamed) > 0 and any("the file is cut off" in w for w in streamed.warnings)
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_LOAD, str(packed)], capture_output=True, text=True, timeout=300)
    before, peak, _, _ = (int(value) for value in done.stdout.split())
    assert peak - before < 3 * (64 << 20) + (32 << 20), f"peak grew {(peak - before) >> 20} MiB"
