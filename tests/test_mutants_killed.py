"""Inputs that kill the mutants benchmarks/mutation_score.py found alive, for modules without a test file of their own.

Each test names the line it guards and asserts the value that line produces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skalpel.analysis.step_device import RankStepDevice, device_in_steps
from skalpel.analysis.steps import segment_steps
from skalpel.trace.loader import load
from tests.tracebuilder import TraceBuilder


def test_step_device_shares_of_two_unequal_steps(tmp_path: Path) -> None:
    """Two 10 ms steps, the device busy 2 ms in the first and 9 ms in the second: idle 80% and 10% of each,
    45% of both together (step_device.py idle_ms, idle_pct_by_step, idle_pct, steps_idle_at_least)."""
    builder = TraceBuilder()
    builder.step(1, 0, 10_000)
    builder.launch(100, 5, work_ts=1000, work_dur=2000)
    builder.step(2, 10_000, 10_000)
    builder.launch(10_100, 5, work_ts=10_500, work_dur=9000)
    trace = load(builder.write(tmp_path / "rank.json"))
    rank = device_in_steps(trace, segment_steps(trace)).for_rank(trace.rank_ids[0])
    assert rank.step_ms == pytest.approx((10.0, 10.0)) and rank.busy_ms == pytest.approx((2.0, 9.0))
    assert rank.mean_step_ms == pytest.approx(10.0)
    assert rank.idle_ms == pytest.approx((8.0, 1.0))
    assert rank.idle_pct_by_step == pytest.approx((80.0, 10.0))
    assert rank.idle_pct == pytest.approx(45.0) and rank.busy_pct == pytest.approx(55.0)
    assert rank.idle_ms_per_step == pytest.approx(4.5)
    assert rank.steps_idle_at_least(50.0) == pytest.approx(50.0)
    assert rank.steps_idle_at_least(80.0) == pytest.approx(50.0)  # a share reaching the bar counts
    assert rank.steps_idle_at_least(5.0) == pytest.approx(100.0)


def test_step_device_shares_of_zero_length_steps_are_zero() -> None:
    """A step of 0 ms has no idle share (not a division by zero); neither have no steps at all."""
    rank = RankStepDevice(rank=0, step_ms=(0.0, 10.0), busy_ms=(0.0, 5.0))
    assert rank.idle_pct_by_step == pytest.approx((0.0, 50.0))
    assert rank.idle_pct == pytest.approx(50.0)
    empty = RankStepDevice(rank=0, step_ms=(0.0,), busy_ms=(0.0,))
    assert (empty.idle_pct, empty.busy_pct, empty.idle_pct_by_step) == (0.0, 0.0, (0.0,))
    none = RankStepDevice(rank=0, step_ms=(), busy_ms=())
    assert (none.idle_pct, none.busy_pct, none.idle_ms_per_step, none.steps_idle_at_least(1.0)) == (0.0, 0.0, 0.0, 0.0)


def test_the_analyses_bundle_carries_the_memory_curve(tmp_path: Path) -> None:
    """run_analyses fills in the memory analysis (bundle.py): a 1 MiB then a 2 MiB allocation, then a free, peak at 3 MiB."""
    from skalpel.analysis.bundle import run_analyses

    builder = TraceBuilder()
    builder.step(1, 0, 1000)
    builder.launch(100, 5, work_ts=200, work_dur=300)
    builder.memory(150, 2**20, 2**20)
    builder.memory(250, 2 * 2**20, 3 * 2**20)
    builder.memory(600, -(2**20), 2 * 2**20)
    trace = load(builder.write(tmp_path / "rank.json"))
    analyses = run_analyses(trace)
    main = analyses.memory.main_device(trace.rank_ids[0])
    assert main.peak_bytes == 3 * 2**20


def test_a_rank_without_device_work_has_no_step_device_share(tmp_path: Path) -> None:
    """Two ranks with steps, only rank 0 with device work: rank 1's share is None, not a step 100% idle (step_device.py
    `no device events or no steps`)."""
    for rank in (0, 1):
        builder = TraceBuilder()
        builder.header = {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"}, "host_name": "node0"}
        builder.step(1, 0, 1000)
        builder.host("aten::add", 10, 100)
        if rank == 0:
            builder.launch(20, 5, work_ts=40, work_dur=500)
        builder.write(tmp_path / f"trace-rank{rank}.json")
    trace = load(tmp_path)
    result = device_in_steps(trace, segment_steps(trace))
    assert sorted(result.ranks) == [0, 1]
    assert result.for_rank(0).busy_ms == pytest.approx((0.5,))
    assert result.for_rank(1) is None


@pytest.mark.parametrize("second_marker, noted", [((2000, 0), False), ((500, 200), True)])
def test_a_zero_length_step_marker_is_not_an_overlap(tmp_path: Path, second_marker, noted: bool) -> None:
    """A zero-length ProfilerStep marker between two steps overlaps nothing (steps.py `_tiling` keeps it, so no marker note);
    a marker inside another step is one the notes count."""
    builder = TraceBuilder()
    builder.step(1, 0, 1000)
    builder.step(2, *second_marker)
    builder.step(3, 3000, 1000)
    trace = load(builder.write(tmp_path / "rank.json"))
    notes = segment_steps(trace).notes
    assert bool(notes) == noted, notes


def test_line_samples_take_the_innermost_frame_of_the_function_asked_for() -> None:
    """line_samples.py:46: a sample counts the innermost frame with the function's name, in a file of the path's
    base name, defined at or before the line asked for (the profiler may name the function by its def line);
    a same-named function of another file, or one defined after that line (a nested one), is passed over; in a
    recursion only the innermost call counts."""
    from skalpel.trace.line_samples import LineSamples

    inner_later = ("/src/train.py", 40, "step", 44)  # a nested `step` defined after line 30: not the one asked for
    other_file = ("/lib/other.py", 10, "step", 12)  # the same name in another file
    asked = ("/work/train.py", 30, "step", 33)  # same base name, defined exactly at the line asked for
    outer = ("/work/train.py", 5, "main", 60)
    samples = LineSamples(
        anchor_step=1,
        times_us=np.array([100.0, 200.0, 300.0, 400.0]),
        stacks=(
            (inner_later, other_file, asked, outer),
            (("/work/train.py", 30, "step", 31), asked, outer),  # recursion: the innermost call's line
            (other_file, outer),  # no frame of the function asked for
            (asked,),  # after the window
        ),
        interval_us=100.0,
    )
    assert samples.lines_of("train.py", 30, "step", 50.0, 350.0) == [33, 31]
    assert samples.lines_of("train.py", 29, "step", 50.0, 350.0) == []  # defined after the line asked for
    assert samples.lines_of("train.py", 60, "main", 50.0, 350.0) == [60, 60, 60]
