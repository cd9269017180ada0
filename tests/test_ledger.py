"""The ledger: every millisecond of every unit charged to exactly one cause, on the device and the main thread.

On every trace of the corpus each lane's causes add up to each unit within 0.1%; on small traces in today's
Kineto schema (``tests/tracebuilder.py``) the planted cause gets the time, and its look-alike does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skalpel.analysis.bundle import run_analyses
from skalpel.analysis.ledger import DEVICE_CAUSES, HOST_CAUSES
from skalpel.api import analyze
from skalpel.errors import SkalpelError
from skalpel.trace.kinds import Kind, classify
from skalpel.trace.loader import load
from tests.conftest import TRACES as CORPUS
from tests.conftest import corpus
from tests.ledger_fixtures import assert_no_number_exceeds_its_unit
from tests.tracebuilder import TraceBuilder, cpu_rank

TRACES = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*")
                if p.is_file() and p.name.endswith((".json", ".json.gz")) and "README" not in p.name)  # fmt: skip
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


@pytest.mark.parametrize("name", TRACES)
def test_every_lane_adds_up_to_its_units_on_the_corpus(name: str) -> None:
    """And no finding quotes a share above 100% or a per-step time above the step it is a part of."""
    try:
        trace = load(corpus(name))
    except SkalpelError as error:  # a foreign file of the corpus (an execution trace, a capture's details)
        assert Path(name).name in str(error)
        return
    ledger = run_analyses(trace).ledger
    assert ledger.ranks, "every trace with host ops has a ledger"
    for rank in ledger.ranks.values():
        assert rank.lanes and rank.units > 0
        for lane in rank.lanes:
            assert set(lane.units[0].ms) <= set(DEVICE_CAUSES if lane.name == "device" else HOST_CAUSES)
            for unit in lane.units:
                assert all(ms >= -1e-9 for ms in unit.ms.values()), (lane.name, unit)
                assert sum(unit.ms.values()) == pytest.approx(unit.length_ms, rel=1e-3, abs=1e-6), (lane.name, unit.number)
    assert_no_number_exceeds_its_unit(analyze(corpus(name)))


def _ledger(builder: TraceBuilder, tmp_path: Path):
    path = builder.write(tmp_path / "trace.json")
    return run_analyses(load(path)).ledger, path


def _inference_in_a_range(old_schema: bool) -> TraceBuilder:
    """CPU inference inside ``record_function("model_inference")`` (100 ms, 39 of them outside any op), with an
    autograd node, a bare ``detach`` and an optimizer step in it; ``old_schema``: every host event under torch
    1.8-1.11's category "Operator", else today's cpu_op and user_annotation."""
    builder = cpu_rank(0, world_size=1)

    def host(name: str, ts: float, dur: float, today: str = "cpu_op") -> None:
        builder.host(name, ts, dur, cat="Operator" if old_schema else today)

    host("model_inference", 0, 100_000, "user_annotation")
    host("aten::linear", 5_000, 30_000)
    host("aten::addmm", 6_000, 28_000)
    host("AddmmBackward", 40_000, 10_000)
    host("aten::mm", 41_000, 8_000)
    host("detach", 52_000, 1_000)
    host("Optimizer.step#SGD.step", 60_000, 20_000, "user_annotation")
    host("aten::add_", 61_000, 18_000)
    return builder


def test_an_old_traces_record_function_range_is_the_users_code_not_compute(tmp_path: Path) -> None:
    """torch 1.8-1.11 filed record_function ranges under "Operator" with the ops: the range's own time is the user's
    Python as in today's traces (its look-alike: the same run in today's schema, the same ledger)."""
    (tmp_path / "old").mkdir(), (tmp_path / "today").mkdir()
    old, _ = _ledger(_inference_in_a_range(old_schema=True), tmp_path / "old")
    today, _ = _ledger(_inference_in_a_range(old_schema=False), tmp_path / "today")
    old_host, today_host = old.for_rank(0).lane("host"), today.for_rank(0).lane("host")
    assert old_host.share_pct("python") == pytest.approx(39.0, abs=0.5)  # the range's own 39 ms
    assert old_host.units[0].ms == pytest.approx(today_host.units[0].ms)


@pytest.mark.parametrize(("name", "today"), [
    ("model_inference", "user_annotation"), ("Optimizer.step#SGD.step", "user_annotation"),
    ("Optimizer.zero_grad#SGD.zero_grad", "user_annotation"), ("## forward ##", "user_annotation"),
    ("ProfilerStep#3", "user_annotation"), (LOADER, "user_annotation"), ("aten::mm", "cpu_op"),
    ("autograd::engine::evaluate_function: AddmmBackward", "cpu_op"), ("AddmmBackward", "cpu_op"),
    ("AddBackward0", "cpu_op"), ("CopyBackwards", "cpu_op"), ("CopySlices", "cpu_op"), ("detach", "cpu_op"),
    ("detach_", "cpu_op"), ("nccl:all_reduce", "user_annotation"), ("record_param_comms", "cpu_op"),
])  # fmt: skip
def test_an_old_operator_event_has_the_kind_todays_category_gives_it(name: str, today: str) -> None:
    assert classify("Operator", name, "X") is classify(today, name, "X")


def test_a_runtime_call_filed_as_an_old_operator_is_no_users_range() -> None:
    assert classify("Operator", "cudaLaunchKernel", "X") is Kind.CPU_OP


def test_a_main_thread_blocked_in_another_threads_collective_is_waiting_for_it(tmp_path: Path) -> None:
    """gloo's all_reduce runs on its own thread; the main thread runs no op meanwhile (DDP's backward waits for it)
    inside a record_function range of the user's: collective wait, not the user's host work."""
    builder = cpu_rank(0, world_size=1)
    for step in range(4):
        t0 = step * 10_000.0
        builder.step(step + 1, t0, 10_000)
        builder.host("aten::mm", t0 + 100, 1_500)
        builder.host("## backward ##", t0 + 1_700, 8_000, cat="user_annotation")
        builder.host("autograd::engine::evaluate_function: MmBackward0", t0 + 1_800, 700)
        builder.gloo_all_reduce(t0 + 2_600, 7_000)
    ledger, _ = _ledger(builder, tmp_path)
    host = ledger.for_rank(0).lane("host")
    assert ledger.for_rank(0).lane("device") is None
    assert host.share_pct("collective_wait") == pytest.approx(70.0, abs=1.5)
    assert host.share_pct("backward") == pytest.approx(7.0, abs=0.5)
    assert host.share_pct("python") < 5.0


def test_the_loaders_whole_wait_counts_while_the_device_still_runs_queued_work(tmp_path: Path) -> None:
    """A fetch holds 30% of each step on the host; the device runs the previous step's work for part of it. The
    host's data wait is 30%; the device's idle share while it fetched is less: two lanes, two true numbers."""
    builder = TraceBuilder()
    for step in range(5):
        t0 = step * 10_000.0
        builder.step(step + 1, t0, 10_000)
        builder.host(LOADER, t0, 3_000, cat="user_annotation")
        external = builder.host("aten::mm", t0 + 3_050, 100)
        builder.launch(t0 + 3_060, 10, work_ts=t0 + 3_100, work_dur=7_900, external=external)
    ledger, path = _ledger(builder, tmp_path)
    rank = ledger.for_rank(0)
    assert rank.unit == "step" and rank.units == 5
    assert rank.lane("host").share_pct("data_wait") == pytest.approx(30.0, abs=1.0)
    assert rank.lane("device").share_pct("data_wait") < rank.lane("host").share_pct("data_wait")
    assert rank.lane("device").share_pct("compute") == pytest.approx(79.0, abs=2.0)
    report = analyze(path)
    assert report.ranks[0].ledger.lane("host").share_pct["data_wait"] == pytest.approx(30.0, abs=1.0)


def test_one_time_work_is_its_own_cause_and_a_window_of_it_is_judged_for_nothing_else(tmp_path: Path) -> None:
    """A window that is a slow first launch (lazy module loading) and little else: the ledger takes it out as
    one-time work, and the steady-state rules (gpu_idle, host_bound) say they have nothing to judge."""
    builder = TraceBuilder()
    for i in range(6):
        t0 = 100.0 + i * 200.0 + (5_500_000.0 if i else 0.0)
        external = builder.host("aten::add", t0, (5_500_050.0 if i == 0 else 60.0))
        builder.launch(t0 + 10, 5_500_000.0 if i == 0 else 20.0, work_ts=t0 + (5_500_020.0 if i == 0 else 40.0),
                       work_dur=15.0, external=external)  # fmt: skip
    ledger, path = _ledger(builder, tmp_path)
    rank = ledger.for_rank(0)
    assert rank.unit == "window" and rank.all_one_time
    assert rank.lane("host").share_pct("one_time") > 99.0
    report = analyze(path)
    ids = {finding.id for finding in report.findings if finding.severity != "info"}
    assert "cold_start" in ids and not ids & {"gpu_idle", "host_bound", "launch_bound"}
    assert any("one-time work" in finding.title and "gpu_idle" in finding.title for finding in report.findings
               if finding.id == "not_judged")  # fmt: skip


def test_the_same_loop_without_one_time_work_is_judged(tmp_path: Path) -> None:
    """The look-alike: the same launches, all fast: no one-time work, and the rules judge the window."""
    builder = TraceBuilder()
    for i in range(6):
        t0 = 100.0 + i * 200.0
        external = builder.host("aten::add", t0, 60.0)
        builder.launch(t0 + 10, 20.0, work_ts=t0 + 40.0, work_dur=15.0, external=external)
    ledger, path = _ledger(builder, tmp_path)
    assert not ledger.for_rank(0).all_one_time and ledger.for_rank(0).one_time_ms == 0.0
    assert not any(finding.id == "not_judged" and "one-time" in finding.title for finding in analyze(path).findings)


def test_the_profilers_own_frames_are_the_profilers(tmp_path: Path) -> None:
    """torch.profiler's stop drains the device inside its own Python frames: the profiler's time, not a sync the
    user wrote."""
    builder = TraceBuilder()
    builder.step(1, 0, 5_000)
    external = builder.host("aten::mm", 100, 200)
    builder.launch(110, 10, work_ts=150, work_dur=4_000, external=external)
    builder.frame("torch/profiler/profiler.py(811): step", 400, 4_500)
    builder.runtime("cudaDeviceSynchronize", 420, 4_000)
    ledger, _ = _ledger(builder, tmp_path)
    host = ledger.for_rank(0).lane("host")
    assert host.share_pct("profiler") == pytest.approx(90.0, abs=1.0)
    assert host.share_pct("sync_wait") == 0.0


def test_device_work_with_no_host_side_goes_to_unrecorded_with_why(tmp_path: Path) -> None:
    """A capture of kernels alone (no runtime call, no op): the device lane says what it cannot link; no host lane
    and no invented cause."""
    builder = TraceBuilder()
    for i in range(5):
        builder.launch(i * 1000.0, 10, work_ts=i * 1000.0 + 20, work_dur=500)
    builder.events = [event for event in builder.events if event["cat"] != "cuda_runtime"]
    ledger, _ = _ledger(builder, tmp_path)
    rank = ledger.for_rank(0)
    assert [lane.name for lane in rank.lanes] == ["device"] and rank.unit == "window"
    device = rank.lane("device")
    assert device.share_pct("compute") + device.share_pct("unrecorded") == pytest.approx(100.0)
    assert device.share_pct("unrecorded") == pytest.approx(100.0 * 2.0 / 4.5, abs=0.1)
    assert any("no launch call linked" in note for note in rank.notes)


def test_broken_links_leave_the_idle_time_unrecorded_with_a_note(tmp_path: Path) -> None:
    """Kernels whose correlation ids match no launch call: their idle time before them is unrecorded, and said."""
    builder = TraceBuilder()
    for i in range(5):
        builder.step(i + 1, i * 1000.0, 1000)
        external = builder.host("aten::mm", i * 1000.0 + 5, 50)
        builder.launch(i * 1000.0 + 10, 10, work_ts=i * 1000.0 + 300, work_dur=500, external=external)
    for event in builder.events:
        if event["cat"] == "kernel":
            event["args"]["correlation"] = 999_999
    ledger, _ = _ledger(builder, tmp_path)
    device = ledger.for_rank(0).lane("device")
    assert device.share_pct("compute") == pytest.approx(50.0, abs=1.0)
    assert device.share_pct("unrecorded") == pytest.approx(50.0, abs=1.0)
    assert any("missing or unmatched correlation" in note for note in ledger.for_rank(0).notes)


def test_the_fix_follows_the_cause_not_the_symptom(tmp_path: Path) -> None:
    """The device idles while the host is inside an op of the forward (its dispatch): the fix is about the ops, never
    "do it in DataLoader workers"; the same idle time inside a cudaFree gets the allocator's fix."""
    fixes = {}
    for what in ("aten::layer_norm", "cudaFree"):
        builder = TraceBuilder()
        for step in range(5):
            t0 = step * 3_000.0
            builder.step(step + 1, t0, 3_000)
            if what == "cudaFree":
                builder.runtime("cudaFree", t0 + 10, 2_000)
                external = builder.host("aten::mm", t0 + 2_020, 30)
            else:
                external = builder.host(what, t0 + 10, 2_040)
            builder.launch(t0 + 2_030, 10, work_ts=t0 + 2_050, work_dur=900, external=external)
        folder = tmp_path / what.replace(":", "_")
        folder.mkdir()
        report = analyze(builder.write(folder / "trace.json"))
        (idle,) = [f for f in report.findings if f.id == "gpu_idle"]
        fixes[what] = idle.fix
    assert "DataLoader" not in fixes["aten::layer_norm"] and "torch.compile" in fixes["aten::layer_norm"]
    assert "expandable_segments" in fixes["cudaFree"] and "DataLoader" not in fixes["cudaFree"]
