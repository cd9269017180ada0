"""Unequal steps: a step far longer than the others that holds far more ops (an epoch boundary, an evaluation
pass) is named and left out of the step statistics; a step as long with the same ops (a preempted one) stays.

The traces are written with the test builder and read by the real loader, segmentation and report.
"""

from __future__ import annotations

import pytest

from skalpel.analysis.steps import segment_steps
from skalpel.job.build import build_report
from skalpel.trace import load

from .tracebuilder import TraceBuilder

FETCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _trace(tmp_path, steps: list[tuple[float, int, int]], compiling: int | None = None):
    """One CPU rank whose steps are (ms, ops, DataLoader fetches), back to back; step ``compiling`` compiles."""
    builder = TraceBuilder()
    builder.device_properties = []
    ts = 1000.0
    for number, (ms, ops, fetches) in enumerate(steps):
        builder.step(number, ts, ms * 1000)
        if number == compiling:
            builder.host("entire_frame_compile", ts + 1, ms * 1000 / 2, cat="user_annotation")
        slot = ms * 1000 / (ops + fetches + 1)
        for i in range(fetches):
            builder.host(FETCH, ts + (i + 0.5) * slot, slot / 2, cat="user_annotation")
        for i in range(ops):
            builder.host("aten::addmm", ts + (fetches + i + 0.5) * slot, slot / 2)
        ts += ms * 1000 + 1
    return load(builder.write(tmp_path / "trace.json"))


def test_an_epoch_boundary_is_named_and_kept_out_of_the_step_statistics(tmp_path):
    # step 4 holds a test pass over another loader: 40 more fetches, 7x the time
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 60, 41)] + [(10, 10, 1)] * 3)
    segmentation = segment_steps(trace)
    assert [unequal.step.number for unequal in segmentation.unequal] == [4]
    assert [step.number for step in segmentation.steps] == [0, 1, 2, 3, 5, 6, 7]
    report = build_report(trace)
    assert report.steps.count == 7 and report.steps.median_ms == pytest.approx(10.0, rel=0.01)
    assert report.steps.cv < 0.01  # without the boundary the steps are equal
    (note,) = [warning for warning in report.warnings if "step #4" in warning]
    assert "41 DataLoader batches against 1" in note and "epoch boundary" in note
    assert "7.0x the median step" in note and "costs 60.0 ms more than a step" in note
    assert "43% of the recorded time" in note  # 60 ms more, of 140 ms


def test_a_preempted_step_with_the_same_ops_stays(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 10, 1)] + [(10, 10, 1)] * 3)
    segmentation = segment_steps(trace)
    assert segmentation.unequal == () and len(segmentation.steps) == 8


def test_a_step_that_compiles_is_the_compile_rules_to_judge(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(70, 60, 1)] + [(10, 10, 1)] * 3, compiling=4)
    assert segment_steps(trace).unequal == ()


def test_the_first_step_is_warm_ups_to_judge(tmp_path):
    trace = _trace(tmp_path, [(70, 60, 1)] + [(10, 10, 1)] * 7)
    assert segment_steps(trace).unequal == ()


def test_steps_that_are_all_unequal_are_how_the_loop_is(tmp_path):
    # every other step is long: a loop of two kinds of iteration, not boundaries
    trace = _trace(tmp_path, [(10, 10, 1), (70, 60, 1)] * 4)
    assert segment_steps(trace).unequal == ()


def test_work_without_more_batches_is_named_as_such(tmp_path):
    trace = _trace(tmp_path, [(10, 10, 1)] * 4 + [(50, 40, 1)] + [(10, 10, 1)] * 3)
    (unequal,) = segment_steps(trace).unequal
    assert "DataLoader batches" not in unequal.describe()
    assert "an evaluation, a checkpoint" in unequal.describe()
