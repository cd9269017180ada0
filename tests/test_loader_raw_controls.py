"""Raw control characters inside the strings of a real torch.profiler trace load as those characters.

torch wrote a frame's name holding a raw U+0004 (a lazy import inside the profiled window of
nanoGPT) straight into the JSON; strict readers refuse such a string and the loader used to skip
every event holding one as "malformed". Here a real profiler trace gets raw control bytes planted
in op names, an annotation and Python frames, as torch writes them: every event loads, the names
hold the characters, and only an event that really does not parse is skipped, with a note saying
what is wrong with it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from skalpel.job.report_of import report_of_trace
from skalpel.report import html
from skalpel.report.terminal import render_text
from skalpel.trace import load, loader
from skalpel.trace.rawcontrols import escape_raw_controls

# (marker written by the profiled code, the raw bytes planted in its place)
PLANTS = {
    b"step_PLANT_A": b"step\x07\x1b[2J\x00",  # an annotation: bell, a terminal escape, NUL
    b"work_PLANT_B": b"work\x04",  # a Python frame's function name, as in the nanoGPT trace
    b"helper_PLANT_C": b"help\ter\nline\r\x1f",  # tab, newline and return inside a string: not whitespace there
}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[bytes, bytes]:
    """A small real CPU run under torch.profiler with stacks: (its exported trace, the same with raw bytes planted)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    inputs = torch.randn(16, 32)

    def work_PLANT_B(x):  # noqa: N802 (the marker is replaced in the trace)
        return helper_PLANT_C(model(x))

    def helper_PLANT_C(y):  # noqa: N802
        return y.relu().sum()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(3):
            with torch.profiler.record_function("step_PLANT_A"):
                work_PLANT_B(inputs).backward()
    path = tmp_path_factory.mktemp("raw") / "trace.json"
    prof.export_chrome_trace(str(path))
    original = path.read_bytes()
    planted = original
    for marker, raw in PLANTS.items():
        assert marker in original, f"the profiler did not record {marker!r}"
        planted = planted.replace(marker, raw)
    with pytest.raises(json.JSONDecodeError):
        json.loads(planted)  # strict JSON refuses it, as orjson does: the bytes are raw
    return original, planted


def _names_planted(trace) -> dict[bytes, list[str]]:
    """For each plant, the trace's names that hold its raw characters."""
    return {marker: [name for name in trace.names if raw.decode() in name] for marker, raw in PLANTS.items()}


def _strict_false_ranges(document: bytes) -> int:
    """The X events other than the profiler's own, as Python's json.loads(strict=False) reads them."""
    events = json.loads(document, strict=False)["traceEvents"]
    return sum(1 for event in events if event.get("ph") == "X" and event.get("cat") != "Trace")


def test_raw_control_characters_load_every_event_with_names_intact(tmp_path: Path, profiled) -> None:
    original, planted = profiled
    before = load(_write(tmp_path / "original.json", original))
    trace = load(_write(tmp_path / "planted.json", planted))
    assert len(trace) == len(before) == _strict_false_ranges(planted)
    assert trace.warnings == []
    found = _names_planted(trace)
    assert all(found.values()), found
    assert any(name.endswith(": work\x04") for name in found[b"work_PLANT_B"])  # the frame, as torch names it
    assert "step\x07\x1b[2J\x00" in trace.names  # the annotation, exactly
    # the planted names stand where the markers stood: same events, same order of names otherwise
    renamed = [name.encode() for name in before.names]
    for marker, raw in PLANTS.items():
        renamed = [name.replace(marker, raw) for name in renamed]
    assert [name.encode() for name in trace.names] == renamed


def test_reports_show_them_as_visible_escapes(profiled, tmp_path: Path) -> None:
    """The model keeps the characters; the HTML report and the terminal show them as escapes, raw nowhere."""
    trace = load(_write(tmp_path / "planted.json", profiled[1]))
    report = report_of_trace(trace)
    page = html.render(report)
    terminal = render_text(report, width=200)
    assert "step\\x07\\x1b[2J\\x00" in page and "step\\x07\\x1b[2J\\x00" in terminal  # the annotation's row
    for shown in (page, terminal):
        assert not any(ord(char) < 0x20 and char not in "\n\t\r" for char in shown)


@pytest.mark.parametrize("streamed", [False, True])
def test_gzip_variant(tmp_path: Path, profiled, monkeypatch: pytest.MonkeyPatch, streamed: bool) -> None:
    original, planted = profiled
    if streamed:  # a large .json.gz is decoded a window at a time: make this one large
        monkeypatch.setattr(loader, "WHOLE_GZIP_BYTES", 4096)
    trace = load(_write(tmp_path / "planted.json.gz", gzip.compress(planted)))
    assert len(trace) == _strict_false_ranges(planted)
    assert trace.warnings == []
    assert all(_names_planted(trace).values())


def test_really_malformed_event_still_skipped_with_a_clear_note(tmp_path: Path, profiled) -> None:
    original, planted = profiled
    first_op = planted.index(b'"name": "aten::')
    broken = planted[:first_op] + b'"oops" ' + planted[first_op:]  # a string where a key belongs: not JSON
    trace = load(_write(tmp_path / "broken.json", broken))
    assert len(trace) == _strict_false_ranges(planted) - 1
    assert all(_names_planted(trace).values())  # the other events, control characters and all, still load
    (note,) = trace.warnings
    assert "skipped 1 malformed events that do not parse as JSON" in note
    assert "unexpected character" in note and '"cat": "cpu_op", "oops"' in note  # what is wrong, and where


def test_control_byte_outside_strings_is_still_malformed(tmp_path: Path, profiled) -> None:
    planted = profiled[1]
    at = planted.index(b'"dur": ') + len(b'"dur": ')
    broken = planted[:at] + b"\x04" + planted[at:]  # a raw control byte where a number belongs
    trace = load(_write(tmp_path / "broken.json", broken))
    assert len(trace) == _strict_false_ranges(planted) - 1
    assert any("skipped 1 malformed events that do not parse as JSON" in note for note in trace.warnings)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'["a\x04b", "c\\"\x01"]', ["a\x04b", 'c"\x01']),  # after an escaped quote: still inside the string
        (b'[\n\t"x\ny", "\\\\\x1f"]', ["x\ny", "\\\x1f"]),  # whitespace outside strings kept; after an escaped \
    ],
)
def test_escape_raw_controls(text: bytes, expected: list) -> None:
    assert json.loads(escape_raw_controls(text)) == expected == json.loads(text, strict=False)


def test_escape_raw_controls_leaves_what_no_escape_makes_whole() -> None:
    assert escape_raw_controls(b'["plain", 1]') is None
    assert escape_raw_controls(b'[\n  "plain",\t1\r\n]') is None  # only whitespace
    assert escape_raw_controls(b'["\\\x04"]') is None  # a backslash escaping a raw byte: not JSON either way


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path
