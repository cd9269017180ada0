"""Bounded resources: a gzip is inflated as a stream, and what cannot be a trace is rejected early.

A gzip of zeros (the issue's 4.7 MB file inflated to gigabytes before "not JSON") is
rejected after its first decompressed megabyte; a document whose gzip trailer cannot
be trusted (a ratio beyond what traces reach) is counted first and read into a buffer
of exactly its size. The memory test measures the peak RSS of a real `skalpel analyze`
subprocess (``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process, so no
earlier child of the test session counts).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from skalpel.errors import TraceError
from skalpel.trace import load

MEMBER_MB = 64
_PEAK_OF_CHILD = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "skalpel", "analyze", sys.argv[1]], capture_output=True, text=True)
print(done.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stdout.write(done.stderr)
"""


def _gzip_of(chunk: bytes, times: int, *, members: int = 1) -> bytes:
    """``chunk`` repeated ``times`` in one gzip member, that member repeated ``members`` times (a valid gzip)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = b"".join(compressor.compress(chunk) for _ in range(times)) + compressor.flush()
    return member * members


def _analyze_peak(path: Path) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of `skalpel analyze PATH` in its own process."""
    done = subprocess.run([sys.executable, "-c", _PEAK_OF_CHILD, str(path)], capture_output=True, text=True, timeout=600)
    status, peak_kib, stderr = done.stdout.split("\n", 2)
    return int(status), int(peak_kib) * 1024, stderr


@pytest.mark.slow
def test_gzip_of_zeros_is_rejected_in_bounded_memory(tmp_path: Path) -> None:
    """4.8 GB of zeros in a 4.9 MB gzip (75 members, as the issue's 4.7 MB file): under 1 GB, one line."""
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(_gzip_of(bytes(1 << 20), MEMBER_MB, members=75))
    assert bomb.stat().st_size < 6 << 20
    status, peak, stderr = _analyze_peak(bomb)
    assert status == 2 and stderr.startswith("skalpel: error: ") and stderr.count("\n") == 1, stderr
    assert "not JSON (binary data starting with bytes 00 00" in stderr
    assert peak < 1 << 30, f"peak RSS {peak / 2**20:.0f} MiB"


def test_single_member_bomb_is_rejected_before_it_inflates(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(_gzip_of(bytes(1 << 20), 256))  # 256 MB of zeros: a ratio no trace has, so it is counted first
    with pytest.raises(TraceError, match="not JSON"):
        load(bomb)


def test_gzip_of_whitespace_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "blank.json.gz"
    path.write_bytes(_gzip_of(b" " * (1 << 20), 64))
    with pytest.raises(TraceError, match=r"the file is empty \(only whitespace\)"):
        load(path)


def test_valid_document_with_an_untrusted_trailer_loads_whole(tmp_path: Path) -> None:
    """A repetitive trace compresses beyond the plausible ratio: it is counted, then read exactly."""
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 20}).encode()
    count = 200_000
    body = b'{"traceEvents": [' + b",".join([event] * count) + b"]}"
    path = tmp_path / "repetitive.json.gz"
    path.write_bytes(gzip.compress(body, compresslevel=9))
    assert len(body) > 40 * path.stat().st_size  # beyond the ratio the trailer is trusted for
    assert len(load(path)) == count


def test_members_after_the_first_and_a_cut_stream_still_load(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100 + 10 * i, "dur": 5} for i in range(2000)]
    text = json.dumps({"traceEvents": events}).encode()
    half = len(text) // 2
    two_members = tmp_path / "two.json.gz"
    two_members.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert len(load(two_members)) == 2000
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(text)[: len(gzip.compress(text)) * 3 // 4])
    trace = load(cut)
    assert 0 < len(trace) < 2000 and trace.ranks[0].truncated


@pytest.mark.slow
def test_nested_brackets_are_scanned_in_bounded_memory(tmp_path: Path) -> None:
    """50 MB of '[' then ']' (a 49 KB gzip) inside traceEvents: the exact scanner keeps only the top-level
    brackets, so its memory follows the events, not the nesting (it peaked at 1.9 GB)."""
    depth = 25_000_000
    path = tmp_path / "brackets.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b"[" * depth + b"]" * depth + b"]}", compresslevel=6))
    status, peak, stderr = _analyze_peak(path)
    assert status == 2 and "the trace holds no events" in stderr and stderr.count("\n") == 1, stderr
    assert peak < 1 << 30, f"peak RSS {peak / 2**20:.0f} MiB"
