"""A torchrun job's capture on its own: the requests every rank reads in one order, and the report written once.

The real two-rank run is in test_watch.py (a planted slow rank, captured on both ranks); here the
pieces it is made of, on real files: ``jobcapture.Requests`` (two ranks' views of one job folder),
the watcher's training-thread side of a request (started at its step, or said missed), and
``collect.py`` on a real trace (tests/tracebuilder.py) with a rank that never wrote one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from skalpel.result.report import CaptureInfo
from skalpel.watching import collect, jobcapture
from skalpel.watching.jobcapture import MIN_LEAD_STEPS, Requests, read_markers, write_marker
from tests.tracebuilder import TraceBuilder


def _ranks(folder: Path, world: int = 2, span: int = 16) -> list[Requests]:
    return [Requests(folder, rank, world, span=span) for rank in range(world)]


def test_requests_follow_each_other_and_every_rank_takes_them_in_one_order(tmp_path: Path) -> None:
    rank0, rank1 = _ranks(tmp_path)
    first = rank1.ask(kind="slow_rank", anomaly_step=180, current_step=200, median_step_s=0.01, cooldown_s=600)
    assert first is not None and first.rank == 1 and first.number == 1
    assert (first.first_step, first.last_step) == (500, 515)  # 3 s ahead at 10 ms a step, then the capture's span
    # rank 0, not having read it yet, asks a moment later: its capture starts after rank 1's ends
    second = rank0.ask(kind="level_shift", anomaly_step=205, current_step=205, median_step_s=0.01, cooldown_s=600)
    assert second is not None and second.number == 2 and second.first_step == 516
    taken = [rank.take() for rank in (rank0, rank1)]
    assert taken[0] == taken[1] == [first, second]
    assert rank0.take() == [] and rank1.take() == []
    # a kind asked for by any rank within the cooldown is not asked again
    assert rank0.ask(kind="slow_rank", anomaly_step=300, current_step=300, median_step_s=0.01, cooldown_s=600) is None
    late = rank0.ask(kind="slow_rank", anomaly_step=300, current_step=300, median_step_s=0.01, cooldown_s=0)
    assert late is not None and late.number == 3
    assert rank1.take() == [late]
    assert rank0.lead_steps(30.0) == MIN_LEAD_STEPS and rank0.lead_steps(None) == MIN_LEAD_STEPS
    assert not list(tmp_path.glob("*.tmp"))  # each request was written aside and linked whole


def test_a_request_file_that_is_no_request_is_passed_over(tmp_path: Path) -> None:
    (rank0,) = _ranks(tmp_path, world=1)
    (tmp_path / ".watch-capture-1.json").write_text("{not json")
    (tmp_path / ".watch-capture-x.json").write_text("{}")
    assert rank0.take() == []
    asked = rank0.ask(kind="step_spike", anomaly_step=60, current_step=60, median_step_s=0.1, cooldown_s=600)
    assert asked is not None and asked.number == 1 + 1  # number 1 is taken (by the broken file): the next one


def _trace(path: Path, rank: int, world: int) -> Path:
    builder = TraceBuilder()
    builder.header = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}, "skalpel_run": "job-1"}
    for step in range(5):
        began = 1_000.0 + step * 10_000.0
        builder.step(step + 3, began, 9_000.0)
        builder.host("aten::mm", began + 100.0, 8_000.0)
    return builder.write(path)


def test_the_report_covers_the_ranks_that_came_and_names_the_one_that_never_did(tmp_path: Path) -> None:
    _trace(tmp_path / "trace-rank0.json", 0, 2)
    timing = CaptureInfo(warmup_steps=3, active_steps=5, wait_steps=1, window_medians_ms=(9.0,), profiled_step_ms=9.0)
    write_marker(tmp_path, 0, trace="trace-rank0.json", capture=timing)
    assert collect.main([str(tmp_path), "2", "0.3"]) == 0  # rank 1 never leaves its marker: 0.3 s, then without it
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert [rank["rank"] for rank in report["ranks"]] == [0]
    assert any("no trace from rank(s) 1 after 0 s" in warning for warning in report["warnings"]), report["warnings"]
    assert report["capture"]["active_steps"] == 5 and report["capture"]["window_medians_ms"] == [9.0]
    assert (tmp_path / "report.html").is_file() and (tmp_path / "summary.txt").is_file()
    line = jobcapture.summary(tmp_path)
    assert line is not None and not line.startswith("no report")


def test_no_trace_from_any_rank_is_one_line_with_each_ranks_reason(tmp_path: Path) -> None:
    write_marker(tmp_path, 0, trace=None, note="read the request after step 127 had begun")
    write_marker(tmp_path, 1, trace=None, note="the run ended at step 120, before the capture's first step 127")
    assert collect.main([str(tmp_path), "2", "30"]) == 0  # every marker there: no waiting
    assert jobcapture.summary(tmp_path) == ("no report: no rank recorded the steps (rank 0: read the request after "
                                            "step 127 had begun; rank 1: the run ended at step 120, before the "
                                            "capture's first step 127)")  # fmt: skip
    assert not (tmp_path / "report.json").exists()


def test_the_training_thread_starts_a_request_at_its_step_and_says_a_missed_or_never_reached_one(tmp_path: Path) -> None:
    from skalpel.watching.recorder import Watcher

    job = tmp_path / "job"
    (job / "rank0").mkdir(parents=True)
    watcher = Watcher(job / "rank0", script="train.py")
    ours, asking = _ranks(job)  # rank 1 asks (its collector, not ours, would write the report)
    watcher.requests = ours
    try:
        missed = asking.ask(kind="step_spike", anomaly_step=60, current_step=60, median_step_s=1.0, cooldown_s=0)
        ahead = asking.ask(kind="step_spike", anomaly_step=70, current_step=70, median_step_s=1.0, cooldown_s=0)
        assert missed is not None and ahead is not None and ahead.first_step > missed.last_step
        watcher._requested.extend((None, None, request) for request in ours.take())
        watcher.steps = missed.first_step  # this rank read the request once its first step had begun
        watcher._drive_capture()
        markers = read_markers(job / missed.folder_name, 2)
        assert list(markers) == [0] and markers[0]["trace"] is None
        assert markers[0]["note"] == f"read the request after step {missed.first_step} had begun"
        watcher.steps = ahead.first_step - 2  # the next one is ahead: nothing starts yet
        watcher._drive_capture()
        assert watcher._capture is None and [entry[2] for entry in watcher._requested] == [ahead]
        assert not watcher._collecting  # not this rank's request: no report of ours
    finally:
        watcher.close(exit_status=0)
    # the run ended before the next one's steps: the asking rank's collector is told so, rather than left waiting
    (marker,) = read_markers(job / ahead.folder_name, 2).values()
    assert marker["note"] == f"the run ended at step {ahead.first_step - 2}, before the capture's first step " \
                             f"{ahead.first_step}" and marker["trace"] is None


def test_a_marker_holds_the_ranks_timing_and_leaves_nothing_aside(tmp_path: Path) -> None:
    write_marker(tmp_path / "capture-1-x", 3, trace="trace-rank3.json.gz", capture=CaptureInfo(3, 5))
    (marker,) = read_markers(tmp_path / "capture-1-x", 4).values()
    assert marker["capture"] == orjson.loads(orjson.dumps(dataclasses.asdict(CaptureInfo(3, 5))))
    assert marker["rank"] == 3 and marker["trace"] == "trace-rank3.json.gz" and marker["note"] is None
    assert [path.name for path in (tmp_path / "capture-1-x").iterdir()] == [".watch-rank3.json"]
