"""Hostile and damaged traces: analysed with a note that says what was set aside, never a traceback or a wild number.

One test per case that once gave a traceback or a silent wrong number (issue 15): step
markers that overlap, repeat or share a start; every ts 0; events 10^18 us away or at
-2^70; deviceProperties that is not a list; step numbers beyond 64 bits; args nested
1,000 deep; call stacks deeper than the renderers can recurse; events without 'ph'.
And names that try to drive the terminal (escape sequences) or rich (markup).
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path

import numpy as np
import orjson
import pytest

from skalpel.analysis.breakdown import step_breakdown
from skalpel.analysis.call_tree import FOLDED, MAX_DEPTH, flame_tree
from skalpel.analysis.steps import segment_steps
from skalpel.cli import main
from skalpel.job.report_of import report_of
from skalpel.report import flamegraph, terminal
from skalpel.trace import load

from .conftest import corpus

RESNET = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op", **extra) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, **extra}


def _step(number: int | str, ts: float, dur: float) -> dict:
    return _event(f"ProfilerStep#{number}", ts, dur, "user_annotation")


OPS = [_event("aten::mm", 10 + 100 * i, 20) for i in range(6)] + [_event("aten::add", 40 + 100 * i, 30) for i in range(6)]


def _write(path: Path, events: list, **header) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **header, "traceEvents": events}))  # json: ints beyond 64 bits
    return path


def _report(path: Path):
    return report_of(path).report


def _notes(report) -> str:
    return " | ".join(report.warnings)


@pytest.fixture(scope="module")
def resnet() -> dict:
    return orjson.loads(gzip.decompress(corpus(RESNET).read_bytes()))


@pytest.fixture(scope="module")
def resnet_report(resnet, tmp_path_factory):
    return _report(_write(tmp_path_factory.mktemp("clean") / "clean.json", resnet["traceEvents"], **_header(resnet)))


def _header(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "traceEvents"}


# Item 1: step markers that do not tile.


@pytest.mark.parametrize(
    ("markers", "kept", "note"),
    [
        ([_step(1, 0, 200), _step(2, 100, 200), _step(3, 300, 300)], 3, "began before the step before them ended"),
        ([_step(1, 0, 200), _step(1, 0, 200), _step(2, 200, 400)], 2, "repeat or lie inside the step before them"),
        ([_step(1, 0, 200), _step(2, 0, 100), _step(3, 200, 400)], 2, "repeat or lie inside the step before them"),
        ([_step(1, 0, 600), _step(2, 100, 100), _step(3, 250, 100)], 1, "repeat or lie inside the step before them"),
    ],
    ids=["overlapping", "duplicate", "same-start", "nested"],
)
def test_step_markers_that_do_not_tile_are_made_to(tmp_path: Path, markers, kept, note) -> None:
    report = _report(_write(tmp_path / "t.json", markers + OPS))
    assert report.steps.count == kept and note in _notes(report)
    trace = load(tmp_path / "t.json")
    steps = segment_steps(trace).steps
    assert all(a.end_us <= b.start_us for a, b in zip(steps, steps[1:]))  # they tile: no microsecond counted twice
    breakdown = step_breakdown(trace, segment_steps(trace)).ranks[0]
    assert sum(breakdown.pct.values()) == pytest.approx(100.0)
    assert sum(breakdown.ms_per_step.values()) == pytest.approx(np.mean(breakdown.step_ms))


def test_markers_that_tile_get_no_note(tmp_path: Path) -> None:
    report = _report(_write(tmp_path / "t.json", [_step(1, 0, 200), _step(2, 200, 200), _step(3, 400, 200)] + OPS))
    assert report.steps.count == 3 and "ProfilerStep" not in _notes(report)


def test_every_ts_zero(tmp_path: Path, capsys) -> None:
    events = [dict(event, ts=0) for event in [_step(1, 0, 200), _step(2, 200, 200)] + OPS]
    path = _write(tmp_path / "zero.json", events)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 steps: median 0.20 ms" in out and "ProfilerStep range(s) left out" in out


def test_every_ts_zero_in_a_real_gpu_trace(resnet, tmp_path: Path) -> None:
    events = [dict(event, ts=0) if isinstance(event, dict) and "ts" in event else event for event in resnet["traceEvents"]]
    report = _report(_write(tmp_path / "zero.json", events, **_header(resnet)))
    assert report.steps.count == 1 and "left out" in _notes(report)


def test_step_number_beyond_64_bits(tmp_path: Path) -> None:
    report = _report(_write(tmp_path / "t.json", [_step("9" * 40, 0, 200), _step(2, 200, 200)] + OPS))
    assert report.steps.count == 2
    assert "1 ProfilerStep marker(s) without a readable step number" in _notes(report)


@pytest.mark.parametrize("value", [5, "gpu", {"name": "A100"}, [None, 3, {"name": "H100"}], None])
def test_device_properties_of_any_shape(tmp_path: Path, value) -> None:
    trace = load(_write(tmp_path / "t.json", OPS, deviceProperties=value))
    assert trace.ranks[0].device_names == (("H100",) if isinstance(value, list) else ())


@pytest.mark.parametrize(
    ("file_name", "distributed", "rank", "world"),
    [("rank3.json", {"rank": 2**40, "world_size": 2**40}, 3, None), ("rank99999999999999.json", {}, 0, None),
     ("t.json", {"rank": True, "world_size": -2}, 0, None), ("t.json", {"rank": 1, "world_size": 2}, 1, 2)],
)  # fmt: skip
def test_ranks_beyond_the_rank_column(tmp_path: Path, file_name, distributed, rank, world) -> None:
    info = load(_write(tmp_path / file_name, OPS, distributedInfo=distributed)).ranks[0]
    assert (info.rank, info.world_size) == (rank, world)


def test_args_nested_a_thousand_deep(tmp_path: Path) -> None:
    deep = "1"
    for _ in range(1000):
        deep = '{"a": ' + deep + "}"
    document = orjson.dumps({"traceEvents": OPS}).replace(b'"aten::add"', b'"aten::add","args":' + deep.encode(), 1)
    path = tmp_path / "deep.json"
    path.write_bytes(document)
    report = _report(path)
    assert "skipped 1 malformed events" in _notes(report) and "nesting too deep" in _notes(report)
    assert sum(row.calls for row in report.ranks[0].top_ops) == len(OPS) - 1


def _deep_stack_trace(path: Path, depth: int) -> Path:
    """One step whose Python stack is ``depth`` frames deep, each frame 98.5% of its caller."""
    events, duration = [_step(1, 0, 100_000)], 99_000.0
    for level in range(depth):
        events.append(_event(f"train.py({level}): f{level}", 1 + level, duration, "python_function"))
        duration *= 0.985
    events.append(_event("aten::mm", 400, 50))
    return _write(path, events)


def test_call_stack_deeper_than_the_renderers_recurse(tmp_path: Path) -> None:
    path = _deep_stack_trace(tmp_path / "deep.json", 200)
    page = tmp_path / "report.html"
    assert main(["analyze", str(path), "--html", str(page)]) == 0
    assert FOLDED in page.read_text()
    trace = load(path)
    svg = flamegraph.render_svg(trace)
    assert svg.count("<g>") == MAX_DEPTH + 2  # root, MAX_DEPTH frames, the folded frame
    assert json.loads(flamegraph.render_speedscope(trace))["profiles"]
    tree = flame_tree(trace)
    depth, node = 0, tree
    while node["children"]:
        node, depth = node["children"][0], depth + 1
    assert node["name"] == FOLDED and depth <= MAX_DEPTH + 1


# Item 2: no silent wrong numbers.


def test_one_kernel_at_ts_zero_is_set_aside(resnet, resnet_report, tmp_path: Path) -> None:
    """The issue's case: one such kernel turned 'GPU idle 39%' into 'idle 100% (270,523,770,653 ms/step)'."""
    kernel = {"ph": "X", "cat": "kernel", "name": "stray", "pid": 0, "tid": 7, "ts": 0, "dur": 1,
              "args": {"device": 0, "stream": 7, "correlation": 1}}  # fmt: skip
    report = _report(_write(tmp_path / "t.json", resnet["traceEvents"] + [kernel], **_header(resnet)))
    assert report.ranks[0].gpu.idle_pct == resnet_report.ranks[0].gpu.idle_pct == pytest.approx(39.4, abs=0.1)
    assert "set aside 1 event(s)" in _notes(report) and "'stray' at ts 0 us" in _notes(report)


@pytest.mark.parametrize("ts", [-(2**70), 10**18])
def test_one_op_far_away_leaves_the_step_times_alone(resnet, resnet_report, tmp_path: Path, ts) -> None:
    op = {"ph": "X", "cat": "cpu_op", "name": "far", "pid": 1, "tid": 1, "ts": ts, "dur": 5}
    report = _report(_write(tmp_path / "t.json", resnet["traceEvents"] + [op], **_header(resnet)))
    assert report.ranks[0].step_ms == resnet_report.ranks[0].step_ms
    assert "set aside 1 event(s)" in _notes(report)


def test_unmarked_trace_with_a_far_event_keeps_its_span(tmp_path: Path) -> None:
    report = _report(_write(tmp_path / "t.json", OPS + [_event("late", 10**18, 5)]))
    assert report.steps.median_ms == pytest.approx(0.56)  # 10 us to 570 us, not 10^15 ms
    assert "set aside 1 event(s)" in _notes(report)


def test_corpus_traces_set_nothing_aside(resnet_report) -> None:
    assert "set aside" not in _notes(resnet_report) and "phase" not in _notes(resnet_report)


def test_events_without_ph_or_with_invalid_fields_are_counted(resnet, resnet_report, tmp_path: Path) -> None:
    events = copy.deepcopy(resnet["traceEvents"])
    steps = [event for event in events if str(event.get("name", "")).startswith("ProfilerStep#")]
    del steps[0]["ph"]  # a step marker without its phase: the step is gone, and the report says why
    steps[1]["ts"] = "soon"
    events.append({"ph": "Q", "name": "unknown phase"})
    events.append({"ph": "i", "name": "[memory]", "ts": "x", "args": {"Bytes": 8}})
    report = _report(_write(tmp_path / "t.json", events, **_header(resnet)))
    notes = _notes(report)
    assert report.steps.count == resnet_report.steps.count - 2
    assert "ignored 1 events without a valid 'ph'" in notes
    assert "skipped 2 malformed events" in notes  # the step with ts 'soon' and the memory event with ts 'x'
    assert "ignored 1 events of phases the trace format does not define ('Q')" in notes


# Item 4: output that cannot be hijacked.

ESCAPES = ["evil\x1b[2J\x1b[H", "title\x1b]0;pwned\x07", "\x1b]8;;http://example.com\x1b\\link\x1b]8;;\x1b\\", "c1\x9b31m"]
MARKUP = ["aten::mm[/]", "[memory]", "[bold red]loud[/bold red]"]


def test_names_are_printed_as_text(tmp_path: Path, capsys) -> None:
    names = ESCAPES + MARKUP
    events = [_step(1, 0, 2000)] + [_event(name, 10 + 100 * i, 50 + i) for i, name in enumerate(names)]
    path = _write(tmp_path / "evil.json", events)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    summary = terminal.render_text(_report(path), width=200)
    for text in (out, summary):
        assert not any(code in text for code in ("\x1b", "\x07", "\x9b")), repr(text[:2000])
        assert "evil\\x1b[2J\\x1b[H" in text and "c1\\x9b31m" in text
        for name in MARKUP:
            assert name in text


def test_markup_names_in_diff(tmp_path: Path, capsys) -> None:
    before = _write(tmp_path / "a.json", [_step(1, 0, 1000)] + [_event(name, 10 + 100 * i, 50) for i, name in enumerate(MARKUP + ESCAPES)])
    after = _write(tmp_path / "b.json", [_step(1, 0, 1000)] + [_event(name, 10 + 100 * i, 80) for i, name in enumerate(MARKUP + ESCAPES)])
    assert main(["diff", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "aten::mm[/]" in out and "[memory]" in out and "\x1b" not in out


def test_a_five_megabyte_name_is_cut_for_display(tmp_path: Path) -> None:
    name = "aten::" + "x" * 5_000_000
    report = _report(_write(tmp_path / "big.json", [_step(1, 0, 1000), _event(name, 10, 500)]))
    text = terminal.render_text(report)
    assert len(text) < 50_000 and "(5,000,006chars)" in re.sub(r"[\s│]", "", text)  # the table folds the name
    assert name in {row.name for row in report.ranks[0].top_ops}  # cut for display only: the report keeps it


DEEP_SCRIPT = '''
import torch

def recurse(depth, x):
    if depth == 0:
        return x @ x
    return recurse(depth - 1, x)

x = torch.randn(64, 64)
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = model(recurse(160, x)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


@pytest.mark.slow
def test_skalpel_run_on_a_script_160_frames_deep_keeps_its_report(tmp_path: Path) -> None:
    """Through the real command: the run folder gets its HTML report and flame graph, the deep frames folded."""
    import subprocess
    import sys

    script = tmp_path / "deep.py"
    script.write_text(DEEP_SCRIPT)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "skalpel", "run", "--out", str(out), "--wait", "0", "--warmup", "1",
                           "--active", "3", "--stop-after-capture", str(script)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert FOLDED in (out / "report.html").read_text()
    assert (out / "flamegraph.svg").stat().st_size > 0 and (out / "report.json").is_file()
