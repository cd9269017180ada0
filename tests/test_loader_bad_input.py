"""Bad input gets one clear line (TraceError; the CLI prints 'skalpel: error: ...' and exits 2), never a traceback."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from skalpel.cli import main
from skalpel.errors import TraceError
from skalpel.trace import load

from .conftest import corpus

GOOD_EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 20,
     "args": {"External id": 1, "Input Dims": [[4, 4], [4, 4]]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 105, "dur": 5,
     "args": {"External id": 1, "correlation": 7}},
    {"ph": "X", "cat": "kernel", "name": "gemm {\"weird\"} \\ name", "pid": 0, "tid": 7, "ts": 110, "dur": 30,
     "args": {"correlation": 7, "device": 0, "stream": 7}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 130, "dur": 4, "args": {"External id": 2}},
]  # fmt: skip


def _write(path: Path, content: bytes | str) -> Path:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _trace_bytes(events: list[dict], indent: int | None = 2) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x]y"}, indent=indent).encode()


def _cli_error(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `skalpel analyze PATH`; check it failed with exit 2 and one 'skalpel: error:' line; return that line."""
    code = main(["analyze", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("skalpel: error: ") and "\n" not in err and "Traceback" not in err
    return err


def _load_error(path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "the file is empty"),
        (b"   \n ", "the file is empty"),
        (b"{}", "an empty object with no 'traceEvents'"),
        (b"[1, 2, 3]", "a list of numbers"),
        (b'"just a string"', "the whole document is a string"),
        (b"42", "the whole document is a number"),
        (b'{"a": {"b": {"c": [1, 2]}}, "d": "e"}', "no 'traceEvents' array (top-level keys: a, d)"),
        (b'[{"file": "x.json", "batch_size": 32}]', "object(s) with no 'ph' field"),
        (b'{"traceEvents": []}', "holds no events"),
        (b"hello world", "not JSON"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "cut off before its first complete event"),
    ],
)
def test_bad_documents_get_one_clear_line(tmp_path: Path, content: bytes, expected: str, capsys) -> None:
    path = _write(tmp_path / "bad.json", content)
    assert expected in _load_error(path)
    assert expected in _cli_error(path, capsys)


def test_random_bytes(tmp_path: Path, capsys) -> None:
    rng = random.Random(3)
    for index in range(20):
        path = _write(tmp_path / f"random{index}.json", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000))))
        _load_error(path)
        _cli_error(path, capsys)


def test_random_bytes_gzipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "random.json.gz", gzip.compress(bytes(random.Random(4).randrange(256) for _ in range(5000))))
    _load_error(path)


def test_execution_trace_is_named() -> None:
    message = _load_error(corpus("hta/execution_trace/benchmark_simple_add_et.json.gz"))
    assert "execution trace" in message


def test_memory_timeline_is_named(capsys) -> None:
    path = corpus("hta/memory_analysis/memory_timeline.raw.gz")
    assert "a memory timeline (export_memory_timeline) file, not a trace" in _load_error(path)
    _cli_error(path, capsys)


def test_tar_archive_says_extract_first(tmp_path: Path, capsys) -> None:
    assert "tar archive" in _load_error(corpus("extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto.tar.gz"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("rank0.json")
        payload = _trace_bytes(GOOD_EVENTS)
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    path = _write(tmp_path / "traces.tar.json.gz", buffer.getvalue())
    assert "extract it first" in _cli_error(path, capsys)


def test_truncated_gzip_stream_recovers_whole_events(tmp_path: Path) -> None:
    events = [dict(GOOD_EVENTS[0], ts=100 + 10 * i) for i in range(3000)]
    compressed = gzip.compress(_trace_bytes(events))
    path = _write(tmp_path / "cut.json.gz", compressed[: len(compressed) // 2])
    trace = load(path)
    assert 0 < len(trace) < 3000
    assert any("cut off" in warning for warning in trace.warnings)
    assert trace.ranks[0].truncated


def test_gzip_cut_in_its_header(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path / "cut.json.gz", gzip.compress(_trace_bytes(GOOD_EVENTS))[:12])
    assert "gzip" in _cli_error(path, capsys)


def test_cut_mid_array_at_every_point(tmp_path: Path) -> None:
    """A killed process: every cut loads the events that closed before it, with a warning, or says it is too short."""
    document = _trace_bytes(GOOD_EVENTS)
    event_ends = [document.index(b"\n    }", document.index(json.dumps(e["name"]).encode())) for e in GOOD_EVENTS]
    string_at = document.index(b"gemm {")
    cuts = sorted({*range(string_at, string_at + 22), *range(0, len(document), 7)})  # inside the braces/quotes string too
    for cut in cuts:
        path = _write(tmp_path / "cut.json", document[:cut])
        complete = sum(1 for end in event_ends if end + 6 <= cut)  # the closing brace is at end + 5
        if complete == 0:
            _load_error(path)
            continue
        trace = load(path)
        assert len(trace) == complete, cut
        assert any(f"the {complete:,} events before the cut were read" in warning for warning in trace.warnings), cut


def test_cut_loads_through_cli_with_warning(tmp_path: Path, capsys) -> None:
    document = _trace_bytes(GOOD_EVENTS)
    path = _write(tmp_path / "cut.json", document[: document.index(b"aten::relu")])
    assert main(["analyze", str(path), "--json", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert "cut off" in json.dumps(report)


def test_malformed_events_are_skipped_and_counted(tmp_path: Path) -> None:
    events = GOOD_EVENTS + [
        {"ph": "X", "cat": "cpu_op", "name": "negative", "pid": 1, "tid": 1, "ts": 50, "dur": -5},
        {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 50, "dur": 5},  # no name
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "string ts", "pid": 1, "tid": 1, "ts": "soon", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "null dur", "pid": 1, "tid": 1, "ts": 5, "dur": None},
        17,
        "not an event",
    ]
    trace = load(_write(tmp_path / "t.json", _trace_bytes(events)))
    assert len(trace) == len(GOOD_EVENTS)
    assert any("skipped 7 malformed events" in warning for warning in trace.warnings)
    assert np.all(trace.dur >= 0)


def test_folder_without_traces_and_missing_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert "no trace files" in _cli_error(tmp_path, capsys)
    assert "no such file or folder" in _cli_error(tmp_path / "missing.json", capsys)


def test_unreadable_file(tmp_path: Path, capsys) -> None:
    if os.geteuid() != 0:
        path = _write(tmp_path / "secret.json", _trace_bytes(GOOD_EVENTS))
        path.chmod(0)
        assert "cannot read the file (Permission denied)" in _cli_error(path, capsys)
    # root reads anything: /proc/self/mem is a file whose read fails for everyone
    assert "cannot read the file" in _cli_error(Path("/proc/self/mem"), capsys)


def test_invalid_utf8_inside_a_string_is_replaced(tmp_path: Path) -> None:
    document = _trace_bytes(GOOD_EVENTS).replace(b"aten::relu", b"aten::r\xffl\xc3u")
    trace = load(_write(tmp_path / "t.json", document))
    assert len(trace) == len(GOOD_EVENTS)
    assert "aten::r\ufffdl\ufffdu" in trace.names
    assert any("not UTF-8" in warning for warning in trace.warnings)


def test_string_pids_and_numeric_strings(tmp_path: Path) -> None:
    events = [dict(GOOD_EVENTS[2], pid="Spans", tid="stream 7", args={"correlation": "7", "device": "0x1", "stream": 3.0})]
    trace = load(_write(tmp_path / "t.json", _trace_bytes(events + GOOD_EVENTS[:2])))
    assert trace.tid[0] == 7 and trace.pid[0] < 0 and trace.correlation[0] == 7
    assert trace.device[0] == 1 and trace.stream[0] == 3


def test_single_line_and_bare_array_documents_load(tmp_path: Path) -> None:
    documents = [_trace_bytes(GOOD_EVENTS, indent=None), json.dumps(GOOD_EVENTS).encode(), json.dumps([None, [0], *GOOD_EVENTS]).encode()]
    for index, content in enumerate(documents):
        trace = load(_write(tmp_path / f"t{index}.json", content))
        assert len(trace) == len(GOOD_EVENTS)
        assert trace.names[trace.name[2]] == 'gemm {"weird"} \\ name'


@pytest.mark.slow
def test_cli_subprocess_prints_no_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.json", b"\x00\x01garbage{[")
    result = subprocess.run([sys.executable, "-m", "skalpel", "analyze", str(path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("skalpel: error: ") and "Traceback" not in result.stderr
