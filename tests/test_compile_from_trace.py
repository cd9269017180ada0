"""torch.compile judged from the trace alone (no compile log from `skalpel run`): compile ranges and nested regions.

A trace from elsewhere still shows compilation (dynamo's ``(dynamo_timed)`` ranges, dynamo's and
inductor's compile functions in the Python stacks) and graph breaks (a resume frame's
``Torch-Compiled Region: K/0`` inside its caller's ``N/M``). Each planted case is paired with a
look-alike that must stay quiet: compiled code running, compiling before the window, two compiled
functions side by side.
"""

from __future__ import annotations

import pytest

from skalpel.api import analyze
from skalpel.diagnose import thresholds

from .test_findings_rules import TraceBuilder

STEP_US = 100_000.0  # 100 ms steps: compile_overhead's floor is 50 ms


def _steps(builder: TraceBuilder, count: int = 4) -> None:
    for number in range(count):
        builder.step(number + 1, number * STEP_US, STEP_US - 1)


def _by_id(builder: TraceBuilder, tmp_path, finding_id: str):
    report = analyze(builder.write(tmp_path / "trace.json"))
    return [finding for finding in report.findings if finding.id == finding_id], report


def _kernels(builder: TraceBuilder, count: int = 4) -> None:
    for number in range(count):
        start = number * STEP_US
        builder.launch(start + 90_000, 5, work_ts=start + 90_010, work_dur=9000)


# -- compile_overhead ------------------------------------------------------------------------------
def test_compile_ranges_in_later_steps_are_compile_overhead(tmp_path):
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    for number in (2, 3):  # recompiling in steady state: 60 ms of each 100 ms step
        start = number * STEP_US
        builder.host("_compile.compile_inner (dynamo_timed)", start + 100, 60_000)
        builder.host("OutputGraph.call_user_compiler (dynamo_timed)", start + 20_000, 30_000)
    builder.frame("train.py(42): train_step", 2 * STEP_US + 50, 80_000)
    (finding,), _ = _by_id(builder, tmp_path, "compile_overhead")
    assert finding.severity == "warning"
    assert finding.evidence["compile_ms"] == pytest.approx(120.0)  # the union: the nested range is not counted twice
    assert finding.evidence["steady_state_ms"] == pytest.approx(120.0) and finding.evidence["compilations"] == 2
    assert "120 ms inside the profiled steps (30% of their time)" in finding.title
    assert finding.locations == ("train.py:42 in train_step",)
    assert "warm up" in finding.fix


def test_compile_frames_in_python_stacks_without_steps(tmp_path):
    """No ProfilerStep and no record_function from dynamo: its compile functions in the stacks still say it compiled."""
    builder = TraceBuilder()
    builder.frame("train.py(10): <module>", 0, 400_000)
    builder.host("aten::randn", 20, 30)  # the batch, made before the first call compiles
    builder.frame("/venv/lib/python3.11/site-packages/torch/_dynamo/convert_frame.py(1130): _compile", 100, 200_000)
    builder.frame("/venv/lib/python3.11/site-packages/torch/_dynamo/convert_frame.py(980): compile_inner", 200, 190_000)
    builder.frame("/venv/lib/python3.11/site-packages/torch/_inductor/compile_fx.py(1500): compile_fx", 5000, 100_000)
    for number in range(8):
        builder.host("aten::mm", 209_990 + number * 20_000, 30)
        builder.launch(210_000 + number * 20_000, 5, work_ts=210_010 + number * 20_000, work_dur=15_000)
    (finding,), _ = _by_id(builder, tmp_path, "compile_overhead")
    assert finding.evidence["compile_ms"] == pytest.approx(200.0) and finding.evidence["steps_marked"] is False
    assert finding.locations == ("train.py:10 in <module>",)
    assert "in the profiled window (no steps marked)" in finding.title
    # a trace from elsewhere can hold the first compilation: the fix cannot send the user to a recompilation finding
    assert "recompilation finding" not in finding.fix and "mark the steps" in finding.fix


def test_compiling_in_the_first_step_only_is_info(tmp_path):
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    builder.host("_compile.compile_inner (dynamo_timed)", 100, 60_000)
    (finding,), _ = _by_id(builder, tmp_path, "compile_overhead")
    assert finding.severity == "info" and "first profiled step only" in finding.title
    assert finding.evidence["steady_state_ms"] == 0


def test_compiled_code_running_is_not_compilation(tmp_path):
    """The look-alike: compiled regions, AOTAutograd's functions and inductor's run-time wrappers, every step."""
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    for number in range(4):
        start = number * STEP_US
        builder.host("Torch-Compiled Region: 0/0", start + 100, 80_000)
        builder.host("CompiledFunction", start + 200, 70_000)
        builder.frame("/venv/torch/_inductor/compile_fx.py(2735): wrapper", start + 300, 60_000)
        builder.frame("/venv/torch/_inductor/standalone_compile.py(62): __call__", start + 400, 50_000)
    builder.host("_compile.compile_inner (dynamo_timed)", 4 * STEP_US + 100, 60_000)  # after the steps
    findings, report = _by_id(builder, tmp_path, "compile_overhead")
    assert findings == []
    assert not [f for f in report.findings if f.id == "graph_break"]


def test_compile_below_the_floor_is_quiet(tmp_path):
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder, 4)
    floor = thresholds.COMPILE_OVERHEAD.floor  # 50 ms; 45 ms is 11% of the steps, above the share
    builder.host("_compile.compile_inner (dynamo_timed)", 2 * STEP_US + 10, (floor - 5) * 1000)
    assert _by_id(builder, tmp_path, "compile_overhead")[0] == []


# -- graph_break from nested regions -----------------------------------------------------------------
def _regions(builder: TraceBuilder, *, nested: bool) -> None:
    """Each step: frame 0's region; a second frame inside it (a resume function after a break) or after it."""
    for number in range(4):
        start = number * STEP_US
        builder.host("Torch-Compiled Region: 0/0", start + 100, 80_000)
        builder.host("CompiledFunction", start + 150, 20_000)
        second = start + (40_000 if nested else 82_000)
        builder.host("Torch-Compiled Region: 1/0", second, 15_000)
        builder.host("CompiledFunction", second + 50, 14_000)


def test_a_resume_frame_inside_its_caller_is_a_graph_break(tmp_path):
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    _regions(builder, nested=True)
    builder.frame("model.py(30): forward", 90, 81_000)
    builder.frame("model.py(33): forward", 39_990, 16_000)
    (finding,), report = _by_id(builder, tmp_path, "graph_break")
    assert finding.severity == "warning"
    assert finding.evidence["graph_breaks"] == 1 and finding.evidence["frames"] == ["1/0 inside 0/0"]
    assert finding.evidence["region_ms_per_step"] == pytest.approx(80.0)
    assert finding.evidence["eager_ms_per_step"] == pytest.approx(80.0 - 20.0 - 15.0)  # the region minus its graphs
    assert finding.locations[0] == "model.py:33 in forward"
    assert "skalpel run" in finding.fix and "fullgraph=True" in finding.fix
    assert not [f for f in report.findings if f.id == "not_judged" and "graph_break" in f.title]


def test_a_graph_break_without_python_stacks_quotes_no_hint_as_a_line(tmp_path):
    """A trace without stacks: the title names the compiled frame, never "ran inside no Python stacks in this
    trace: profile with ..." (the hint stays in the finding's where)."""
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    _regions(builder, nested=True)
    (finding,), _ = _by_id(builder, tmp_path, "graph_break")
    assert "ran inside compiled frame 0/0" in finding.title and "with_stack" not in finding.title
    assert finding.evidence["lines"] == []


def test_two_compiled_functions_side_by_side_are_no_break(tmp_path):
    builder = TraceBuilder()
    _steps(builder, 4)
    _kernels(builder)
    _regions(builder, nested=False)  # a compiled model, then a compiled loss
    findings, report = _by_id(builder, tmp_path, "graph_break")
    assert findings == []
    assert not [f for f in report.findings if f.id == "not_judged" and "graph_break" in f.title]
