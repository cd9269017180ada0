"""Collective time per step is the time any collective runs inside the steps: never more than the step.

gloo runs each call on its own worker thread, so calls overlap; summing their durations once said
343 ms of all_reduce per 210 ms step (hta/cpu_only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skalpel.analysis import intervals
from skalpel.api import analyze
from skalpel.report.terminal_comm import comm_line
from tests.conftest import corpus
from tests.tracebuilder import TraceBuilder


def test_intersection_of_two_interval_sets() -> None:
    a = (np.array([0.0, 3.0, 20.0, 8.0]), np.array([5.0, 9.0, 30.0, 12.0]))  # merges to [0, 12), [20, 30)
    b = (np.array([2.0, 12.0, 25.0]), np.array([4.0, 20.0, 40.0]))  # [12, 20) touches both pieces of a: no overlap
    starts, ends = intervals.intersection(a, b)
    assert starts.tolist() == [2.0, 25.0] and ends.tolist() == [4.0, 30.0]
    empty = intervals.intersection(a, (np.array([]), np.array([])))
    assert len(empty[0]) == 0 and len(empty[1]) == 0


def _two_threads(path: Path) -> Path:
    """Two 10 ms steps; in each, all_reduce on gloo thread 200 for 8 ms and on thread 201 for 7.5 ms, overlapping:
    15.5 ms of calls, 8.5 ms in which one runs. The last call runs 3 ms past the last step."""
    builder = TraceBuilder()
    builder.device_properties = []
    for number, start in ((1, 0.0), (2, 10_000.0)):
        builder.step(number, start, 10_000)
        builder.host("aten::mm", start + 100, 9_800)
        builder.host("gloo:all_reduce", start + 1_000, 8_000, tid=200)
        builder.host("gloo:all_reduce", start + 2_000, 7_500 if number == 1 else 11_000, tid=201)
    return builder.write(path)


def test_overlapping_collectives_on_two_threads_count_once(tmp_path: Path) -> None:
    report = analyze(str(_two_threads(tmp_path / "gloo.json")))
    comm = report.ranks[0].extra["comm"]
    step_ms = report.steps.median_ms
    assert step_ms == pytest.approx(10.0)
    # step 1: [1, 9.5) ms; step 2: [11, 20) ms, the call clipped at the step's end
    assert comm["comm_ms_per_step"] == pytest.approx((8.5 + 9.0) / 2)
    assert comm["share_pct"] == pytest.approx(87.5)
    (row,) = comm["by_type"]
    assert row["type"] == "all_reduce" and row["calls"] == 4 and row["calls_per_step"] == 2
    assert row["ms_per_step"] == pytest.approx(8.75) and row["share_pct"] == pytest.approx(87.5)
    assert "all_reduce: 2.0/step, 8.75 ms/step" in comm_line(report.ranks[0]).plain


def test_the_stored_gloo_job_says_no_more_collective_time_than_its_step() -> None:
    report = analyze(str(corpus("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")))
    comm = report.ranks[0].extra["comm"]
    step_ms = comm["comm_ms_per_step"] * 100.0 / comm["share_pct"]
    assert comm["by_type"][0]["ms_per_step"] <= comm["comm_ms_per_step"] <= step_ms  # summed, all_reduce was 343 ms of 210
    assert comm["by_type"][0]["calls_per_step"] > 1
