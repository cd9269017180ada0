"""Collective wait blamed on the peer that arrived last: a planted late rank takes its peers' wait with its ms,
ranks that arrive together blame no peer (the wait is the transfer), one rank alone keeps today's blame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skalpel.analysis.bundle import run_analyses
from skalpel.trace.loader import load
from tests.tracebuilder import HOST, TraceBuilder

from .conftest import corpus

STEP = 40_000.0
GLOO = 200
TRANSFER_US = 3000.0


def _gloo_job(tmp_path: Path, *, late_rank: int | None, late_ms: float = 12.0, ranks: int = 3, stacks: bool = False) -> Path:
    """CPU-only gloo ranks on one host, 4 steps of 40 ms: 8 ms of aten::mm, then an all_reduce on gloo's thread
    that ends 3 ms after the last rank arrives; ``late_rank`` computes ``late_ms`` longer, so it arrives last.
    With ``stacks`` the all_reduce is called on the main thread from a recorded Python frame."""
    folder = tmp_path / "job"
    folder.mkdir()
    late_us = late_ms * 1000.0 if late_rank is not None else 0.0
    for rank in range(ranks):
        builder = TraceBuilder()
        builder.device_properties = []
        builder.header = {"distributedInfo": {"rank": rank, "world_size": ranks, "backend": "gloo"}, "host_name": "node0"}
        for number in range(4):
            start = number * STEP
            builder.step(number + 1, start, STEP - 1)
            mm_us = 8000.0 + (late_us if rank == late_rank else 0.0)
            builder.host("aten::mm", start + 10, mm_us)
            arrive = start + 10 + mm_us
            end = start + 10 + 8000.0 + late_us + TRANSFER_US
            if stacks:
                builder.frame("train.py(42): sync_gradients", arrive - 5, end - arrive + 10)
            builder.host("gloo:all_reduce", arrive, end - arrive, tid=HOST if stacks else GLOO,
                         **{"In msg nelems": 1_000_000, "Out msg nelems": 1_000_000, "dtype": "Float", "Group size": ranks})  # fmt: skip
            builder.host("aten::add", end, start + STEP - 20 - end)
        builder.write(folder / f"trace-rank{rank}.json")
    return folder


def _blame(path: Path):
    """Each rank's blame as its summary made it, with its collective wait split by late peer as the join split it."""
    import dataclasses

    from skalpel.trace.loader import find_trace_files, load_one

    from .rankjob import joined_analyses

    peers = joined_analyses(path).late_peers
    ranks = {}
    for file in find_trace_files([path]):
        for rank, blamed in run_analyses(load_one(file)).blame.ranks.items():
            ranks[rank] = dataclasses.replace(blamed, peers=peers[rank][0] if rank in peers else None)
    result = dataclasses.replace(run_analyses(load_one(find_trace_files([path])[0])).blame, ranks=ranks)
    for blamed in result.ranks.values():  # the blame still sums to the idle it explains
        assert sum(blamed.by_category_ms.values()) == pytest.approx(blamed.idle_ms, abs=1e-9)
        if blamed.peers is not None:  # and each step's peer split to that step's collective wait
            for step, split in zip(blamed.steps, blamed.peers.by_step_ms):
                assert sum(split.values()) == pytest.approx(step.by_category_ms["collective_wait"], abs=1e-9)
    return result


def test_a_late_rank_takes_its_peers_collective_wait(tmp_path):
    result = _blame(_gloo_job(tmp_path, late_rank=2))
    for rank in (0, 1):
        blamed = result.ranks[rank]
        assert blamed.by_category_ms["collective_wait"] == pytest.approx(4 * 15.0)
        assert blamed.peers.total_ms == pytest.approx({"rank 2": 4 * 12.0, "transfer": 4 * 3.0})
        assert blamed.peers.mostly == "rank 2"
        top = blamed.peers.top[0]
        assert (top.part, top.peer, top.collective, top.ms) == ("rank 2", 2, "gloo:all_reduce", pytest.approx(48.0))
        summary = blamed.to_dict()["collective_wait_by_peer"]
        assert summary["ms_per_step"] == {"rank 2": 12.0, "transfer": 3.0}
        assert [step["ms"] for step in summary["steps"]] == [{"rank 2": 12.0, "transfer": 3.0}] * 4
        assert summary["top"][0]["waiting_for"] == "rank 2" and summary["top"][0]["collective"] == "gloo:all_reduce"
    late = result.ranks[2].peers  # the late rank waited for nobody: its wait is the transfer
    assert late.total_ms == pytest.approx({"transfer": 4 * 3.0}) and late.mostly == "transfer"


def test_ranks_that_arrive_together_blame_no_peer(tmp_path):
    result = _blame(_gloo_job(tmp_path, late_rank=None))
    for blamed in result.ranks.values():
        assert blamed.by_category_ms["collective_wait"] == pytest.approx(4 * 3.0)
        assert blamed.peers.total_ms == pytest.approx({"transfer": 4 * 3.0})
        assert not any(item.peer is not None for item in blamed.peers.top)


def test_one_rank_alone_keeps_its_blame_without_peers(tmp_path):
    folder = _gloo_job(tmp_path, late_rank=None, ranks=1)
    result = _blame(folder)
    blamed = result.ranks[0]
    assert blamed.by_category_ms["collective_wait"] == pytest.approx(4 * 3.0)
    assert blamed.peers is None and "collective_wait_by_peer" not in blamed.to_dict()


def test_the_terminal_says_whom_the_collective_wait_was_for(tmp_path):
    from skalpel.job.report_of import report_of
    from skalpel.report import terminal

    report = report_of(_gloo_job(tmp_path, late_rank=1)).report
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "rank 1"
    out = " ".join(terminal.render_text(report, width=200).split())
    assert "by cause: collective_wait 100% (mostly for rank 1)" in out  # ranks 0 and 2 waited 12 of 15 ms for it
    assert "(mostly transfer)" in out  # rank 1 itself waited for nobody


def test_explain_blame_says_how_the_wait_is_split_by_peer(capsys):
    from skalpel.cli import main

    assert main(["explain", "blame"]) == 0
    assert "transfer" in capsys.readouterr().out


def test_on_the_real_8_rank_dlrm_set_the_host_side_wait_names_the_last_rank():
    """NCCL on V100s: the device's collective wait there is idle while the host is inside the collective's op
    (record_param_comms), outside the kernel that times the collective. Placed in the collective whose op holds it,
    ranks 0-6 wait mostly for rank 7 (the last at every all_to_all); rank 7 itself waited for no peer (arriving)."""
    result = _blame(corpus("extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"))
    assert len(result.ranks) == 8
    for rank, blamed in result.ranks.items():
        total = blamed.by_category_ms["collective_wait"]
        assert total > 0
        assert blamed.peers.total_ms.get("unmatched", 0.0) < 0.1 * total  # all of it unmatched before
        assert blamed.peers.mostly == ("arriving" if rank == 7 else "rank 7")
        assert "rank 7" not in blamed.peers.total_ms if rank == 7 else True  # never waiting for itself
        top = blamed.peers.top[0]
        assert top.collective.startswith("ncclKernel_") and top.part == blamed.peers.mostly


def test_a_job_reduced_rank_by_rank_splits_the_wait_by_peer_on_the_join(tmp_path):
    """`skalpel analyze folder/` reduces each rank file on its own and joins them: the same split as one trace."""
    from skalpel.api import analyze
    from skalpel.report import terminal

    report = analyze(_gloo_job(tmp_path, late_rank=2), workers=1)
    for rank in (0, 1):
        split = report.ranks[rank].extra["blame"]["collective_wait_by_peer"]
        assert split["ms_per_step"] == {"rank 2": 12.0, "transfer": 3.0} and split["mostly"] == "rank 2"
        assert [step["number"] for step in split["steps"]] == [1, 2, 3, 4]
        assert split["top"][0]["collective"] == "gloo:all_reduce"
    assert report.ranks[2].extra["blame"]["collective_wait_by_peer"]["mostly"] == "transfer"
    assert "collective_wait 100% (mostly for rank 2)" in " ".join(terminal.render_text(report, width=200).split())


def test_the_late_peers_collective_is_named_with_its_line(tmp_path):
    result = _blame(_gloo_job(tmp_path, late_rank=0, stacks=True))
    top = result.ranks[1].peers.top[0]
    assert (top.part, top.collective, top.ms) == ("rank 0", "gloo:all_reduce", pytest.approx(48.0))
    assert top.location is not None and "train.py" in top.location and "42" in top.location


def _gpu_gloo_job(tmp_path: Path, *, late_rank: int | None, late_ms: float = 12.0, ranks: int = 3,
                  transfer_us: float = TRANSFER_US) -> Path:  # fmt: skip
    """GPU ranks whose host blocks in a gloo all_reduce on the main thread between two kernels: the device idles
    for the collective. 4 steps of 40 ms: 2 ms of host work (``late_rank`` ``late_ms`` more) with a short kernel,
    the all_reduce ending ``transfer_us`` after the last arrival, then a kernel to the step's end."""
    folder = tmp_path / "gpu_job"
    folder.mkdir()
    late_us = late_ms * 1000.0 if late_rank is not None else 0.0
    for rank in range(ranks):
        builder = TraceBuilder()
        builder.header = {"distributedInfo": {"rank": rank, "world_size": ranks, "backend": "gloo"}, "host_name": "node0"}
        for number in range(4):
            start = number * STEP
            builder.step(number + 1, start, STEP - 1)
            host_us = 2000.0 + (late_us if rank == late_rank else 0.0)
            op = builder.host("aten::mm", start + 10, host_us)
            builder.launch(start + 20, 10, work_ts=start + 40, work_dur=500, external=op)
            arrive, end = start + 10 + host_us, start + 10 + 2000.0 + late_us + transfer_us
            builder.host("gloo:all_reduce", arrive, end - arrive,
                         **{"In msg nelems": 1_000_000, "Out msg nelems": 1_000_000, "dtype": "Float", "Group size": ranks})  # fmt: skip
            add = builder.host("aten::add", end, 100)
            builder.launch(end + 10, 10, work_ts=end + 40, work_dur=start + STEP - 140 - end, external=add)
        builder.write(folder / f"trace-rank{rank}.json")
    return folder


def _gpu_idle(report) -> list:
    return [finding for finding in report.findings if finding.id == "gpu_idle"]


@pytest.mark.parametrize("by_rank", [False, True], ids=["whole_trace", "rank_by_rank"])
def test_gpu_idle_names_the_late_peer_its_collective_wait_is_for(tmp_path, by_rank):
    """Ranks 0 and 1 idle 15 ms a step in the all_reduce, 12 of them before rank 2 arrives: gpu_idle says so, in
    its title, culprits and fix, whether the job is one trace or reduced rank by rank and joined."""
    from skalpel.api import analyze
    from skalpel.job.report_of import report_of

    folder = _gpu_gloo_job(tmp_path, late_rank=2)
    report = analyze(folder, workers=1) if by_rank else report_of(folder).report
    (finding,) = _gpu_idle(report)  # ranks 0 and 1 alike; rank 2 idles for its own host work, under the threshold
    assert "90% of it waiting in collectives for rank 2 (gloo:all_reduce)" in finding.title
    culprit = finding.evidence["culprits"][0]
    assert (culprit["category"], culprit["waiting_for"]) == ("collective_wait", "rank 2")
    assert finding.fix.startswith("the device waits in collectives (gloo:all_reduce) for rank 2, which arrives last")
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "rank 2"


def test_gpu_idle_blames_no_peer_when_the_ranks_arrive_together(tmp_path):
    """The look-alike: the same 15 ms a step in the all_reduce, but no late rank: the wait is the transfer, and
    gpu_idle leads with the collectives without naming a rank."""
    from skalpel.job.report_of import report_of

    report = report_of(_gpu_gloo_job(tmp_path, late_rank=None, transfer_us=15_000.0)).report
    (finding,) = _gpu_idle(report)
    assert "waiting on collectives (gloo:all_reduce)" in finding.title and "for rank" not in finding.title
    assert "for rank" not in finding.fix and "look for a straggler rank" in finding.fix
    assert finding.evidence["culprits"][0]["category"] == "collective_wait"
    assert not any("waiting_for" in culprit for culprit in finding.evidence["culprits"])
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "transfer"


def _nccl_job(tmp_path: Path, *, late_rank: int, late_ms: float = 6.0, ranks: int = 3) -> Path:
    """NCCL ranks, 4 steps of 40 ms: host work (``late_rank`` ``late_ms`` more) with a short kernel, then the
    all_reduce's op (record_param_comms) holds the host 200 us before it launches the NCCL kernel, which starts on
    arrival and ends 3 ms after the last rank's: the device idles inside the op, outside the kernel."""
    folder = tmp_path / "nccl_job"
    folder.mkdir()
    late_us = late_ms * 1000.0
    for rank in range(ranks):
        builder = TraceBuilder()
        builder.header = {"distributedInfo": {"rank": rank, "world_size": ranks, "backend": "nccl"}, "host_name": "node0"}
        for number in range(4):
            start = number * STEP
            builder.step(number + 1, start, STEP - 1)
            host_us = 2000.0 + (late_us if rank == late_rank else 0.0) + 7.0 * rank  # ties kept apart
            mm = builder.host("aten::mm", start + 10, host_us)
            builder.launch(start + 20, 10, work_ts=start + 40, work_dur=500, external=mm)
            op_at = start + 10 + host_us
            comm = builder.host("record_param_comms", op_at, 230,
                                **{"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
                                   "dtype": "Float", "Group size": ranks})  # fmt: skip
            end = start + 10 + 2000.0 + late_us + 14.0 * ranks + 240 + TRANSFER_US
            builder.launch(op_at + 200, 10, work_ts=op_at + 240, work_dur=end - op_at - 240, external=comm,
                           kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")  # fmt: skip
            add = builder.host("aten::add", end + 10, 100)
            builder.launch(end + 20, 10, work_ts=end + 40, work_dur=500, external=add)
        builder.write(folder / f"trace-rank{rank}.json")
    return folder


def test_nccl_host_side_wait_is_placed_in_its_collective_and_names_the_late_rank(tmp_path):
    """Before, the 200 us a step inside record_param_comms were 'unmatched': in no kernel-timed collective."""
    result = _blame(_nccl_job(tmp_path, late_rank=2))
    for rank in (0, 1):
        blamed = result.ranks[rank]
        peers = blamed.peers  # the device idles from the op's start to the kernel's (230 us), all before rank 2 came
        assert blamed.by_category_ms["collective_wait"] == pytest.approx(4 * 0.23, abs=0.01)
        assert peers.total_ms == pytest.approx({"rank 2": blamed.by_category_ms["collective_wait"]})
        assert peers.top[0].collective == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    late = result.ranks[2].peers  # its own op before its own arrival: no peer to wait for
    assert late.mostly == "arriving" and not any(part.startswith("rank") for part in late.total_ms)



def test_nccl_host_side_wait_is_placed_alike_on_a_job_reduced_rank_by_rank(tmp_path):
    from skalpel.api import analyze

    report = analyze(_nccl_job(tmp_path, late_rank=2), workers=1)
    for rank in (0, 1):
        split = report.ranks[rank].extra["blame"]["collective_wait_by_peer"]
        assert split["mostly"] == "rank 2" and set(split["ms_per_step"]) == {"rank 2"}
        assert split["top"][0]["collective"] == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert report.ranks[2].extra["blame"]["collective_wait_by_peer"]["mostly"] == "arriving"


def test_a_sync_after_the_collective_is_its_host_side():
    """cudaStreamSynchronize after nccl:all_reduce, while its kernel still runs: an instant in it belongs to that
    collective; one in a sync once the kernel ended, or before the launch, to none."""
    import tempfile

    from skalpel.analysis.blame_peers import _host_side_owners
    from skalpel.analysis.comm import analyze_comm
    from skalpel.analysis.steps import segment_steps

    builder = TraceBuilder()
    builder.header = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}}
    builder.step(1, 0, 20_000)
    comm = builder.host("nccl:all_reduce", 100, 50, **{"In msg nelems": 1 << 20, "dtype": "Float", "Group size": 2})
    builder.launch(110, 10, work_ts=3000, work_dur=5000, external=comm, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    builder.runtime("cudaStreamSynchronize", 200, 7900)  # waits for the all_reduce (ends at 8000)
    builder.runtime("cudaStreamSynchronize", 9000, 500)  # after it ended: waits for something else
    with tempfile.TemporaryDirectory() as folder:
        trace = load(builder.write(Path(folder) / "trace.json"))
    calls = analyze_comm(trace, segment_steps(trace)).for_rank(0).collectives
    kernel = next(call.event for call in calls if call.on_device)
    owners = _host_side_owners(trace, 0, calls, np.array([120.0, 1000.0, 7000.0, 9200.0, 50.0]))
    assert owners.tolist() == [kernel, kernel, kernel, -1, -1]

def test_collective_waits_move_onto_the_jobs_clock_and_event_numbers() -> None:
    """A rank reduced on its own keeps its waits for the join, which shifts their times and renumbers their events."""
    from skalpel.analysis.blame import WaitSpans
    from skalpel.analysis.blame_peers import CollectiveWaits

    waits = CollectiveWaits(WaitSpans.of([(0, 10.0, 20.0)]), (1,), {5: ("nccl:all_reduce", "train.py:3")})
    moved = _shifted(waits, 100.0, 1000)
    assert moved.spans == ((0, 110.0, 120.0),) and moved.step_numbers == (1,)
    assert moved.described == {1005: ("nccl:all_reduce", "train.py:3")}


def _shifted(waits, shift_us: float, event_offset: int):
    """The waits on the job's clock and event numbering, made one by one: the reference for ``split_waits``'s
    ``shift_us`` and ``event_offset``."""
    from skalpel.analysis.blame import WaitSpans
    from skalpel.analysis.blame_peers import CollectiveWaits

    spans = WaitSpans.of((step, low + shift_us, high + shift_us) for step, low, high in waits.spans)
    described = {event + event_offset: text for event, text in waits.described.items()}
    host_side = np.array([event + event_offset if event >= 0 else -1 for event in waits.host_side.tolist()], np.int64)
    return CollectiveWaits(spans, waits.step_numbers, described, host_side)


def _host_side_owners_one_by_one(trace, rank, calls, instants):
    """The rule as first written, a scan of the rank's ops and syncs for each collective: the reference."""
    from skalpel.trace.kinds import Kind
    from skalpel.trace.roles import Role

    ranges = []
    ops = np.flatnonzero((trace.rank == rank) & (trace.kind == Kind.COMM_OP))
    syncs = np.flatnonzero((trace.rank == rank) & np.isin(trace.role, [Role.USER_SYNC, Role.INTERNAL_SYNC]))
    ends = trace.ts + trace.dur
    for call in calls:
        launch = int(trace.launcher[call.event]) if call.on_device else -1
        if launch < 0:
            continue
        at, tid = trace.ts[launch], trace.tid[launch]
        around = ops[(trace.tid[ops] == tid) & (trace.ts[ops] <= at) & (ends[ops] >= ends[launch])]
        if len(around):
            outer = around[np.argmin(trace.ts[around])]
            ranges.append((trace.ts[outer], ends[outer], call.event))
        for sync in syncs[(trace.tid[syncs] == tid) & (trace.ts[syncs] >= at) & (trace.ts[syncs] < call.end_us)]:
            ranges.append((trace.ts[sync], ends[sync], call.event))
    ranges.sort(key=lambda item: item[0])  # stable: equal starts stay in the order found
    found = []
    for instant in instants:
        starts = [low for low, _, _ in ranges]
        last = int(np.searchsorted(starts, instant, side="right")) - 1
        held = [owner for low, high, owner in ranges[max(last - 7, 0): last + 1][::-1] if high > instant]
        found.append(held[0] if held else -1)
    return found


def test_host_side_owners_of_hundreds_of_collectives_on_two_threads_match_a_scan_of_each(tmp_path):
    """Nested and overlapping collective ops, syncs on the launching thread and on another one, starts that tie:
    every instant gets the owner the one-by-one scan gives (the rule at scale: thread by thread, all at once)."""
    from skalpel.analysis.blame_peers import _host_side_owners
    from skalpel.analysis.comm import analyze_comm
    from skalpel.analysis.steps import segment_steps

    random = np.random.default_rng(7)
    builder = TraceBuilder()
    builder.header = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}}
    builder.step(1, 0, 400_000)
    at = 100.0
    for number in range(300):
        first = len(builder.events)
        outer = builder.host("record_param_comms", at, 300, **{"Collective name": "allreduce", "Group size": 2,
                                                                "In msg nelems": 1024, "dtype": "Float"})  # fmt: skip
        launch_at = at + float(random.choice([0, 40, 320]))  # at the op's start, inside it, after it (no op around)
        if number % 3:
            builder.host("nccl:all_reduce", float(random.choice([at, launch_at])), 250, **{"Group size": 2})
        kernel_at, kernel_us = launch_at + float(random.integers(20, 400)), float(random.integers(50, 900))
        builder.launch(launch_at, 10, work_ts=kernel_at, work_dur=kernel_us, external=outer,
                       kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")  # fmt: skip
        for _ in range(int(random.integers(0, 4))):  # from the launch, inside the op, at the kernel's end, later
            start = float(random.choice([launch_at, at + 60, at + 200, kernel_at + kernel_us, at + 700]))
            builder.runtime("cudaStreamSynchronize", start, float(random.choice([20, 100, 300])))
        if number % 5 == 0:  # this collective's host side on another thread
            for event in builder.events[first:]:
                if event["pid"] == HOST:
                    event["tid"] = HOST + 1
        at += float(random.integers(200, 1200))
    trace = load(builder.write(tmp_path / "trace.json"))
    calls = sorted(analyze_comm(trace, segment_steps(trace)).for_rank(0).collectives, key=lambda call: call.start_us)
    instants = np.sort(np.concatenate([random.uniform(0, at + 1000, 3000), trace.ts + 1, trace.ts + trace.dur - 1]))
    expected = _host_side_owners_one_by_one(trace, 0, calls, instants)
    assert sum(owner >= 0 for owner in expected) > 500  # most instants hit an op or a sync
    assert _host_side_owners(trace, 0, calls, instants).tolist() == expected


def _split_one_by_one(waits, arrivals):
    """split_waits as first written, a loop over the pieces: the reference for the sums and their order."""
    from collections import defaultdict

    from skalpel.analysis.blame_peers import _holding

    arrivals = sorted(arrivals, key=lambda item: item[0].start_us)
    calls = [call for call, _, _ in arrivals]
    holding = _holding(calls, np.array([(low + high) / 2 for _, low, high in waits.spans], np.float64)).tolist()
    by_step = [defaultdict(float) for _ in waits.step_numbers]
    by_cause = defaultdict(float)
    by_event = {call.event: index for index, call in enumerate(calls)}
    for position, ((step, low, high), index) in enumerate(zip(waits.spans, holding)):
        if index < 0 and len(waits.host_side):
            index = by_event.get(waits.host_side[position], -1)
        if index < 0:
            parts = [("unmatched", None, -1, high - low)]
        else:
            call, latest, last = arrivals[index]
            waiting = min(max(latest - low, 0.0), high - low)
            before = ("arriving", None) if last == call.rank else (f"rank {last}", last)
            parts = [(*before, call.event, waiting), ("transfer", None, call.event, high - low - waiting)]
        for part, peer, event, amount in parts:
            if amount > 0:
                by_step[step][part] += amount / 1000.0
                by_cause[(part, peer, event)] += amount / 1000.0
    return [dict(split) for split in by_step], dict(by_cause)


def test_split_waits_of_thousands_of_pieces_sums_as_a_loop_over_them_would():
    """Pieces in collectives, in their host sides, in none; peers late, the rank itself last: every step's parts and
    the largest causes equal, to the last bit and in the same order, what the loop over the pieces gave."""
    from skalpel.analysis.blame import WaitSpans
    from skalpel.analysis.blame_peers import CollectiveWaits, _top, split_waits
    from skalpel.analysis.collectives import Collective
    from skalpel.analysis.ranks import Arrivals

    random = np.random.default_rng(3)
    calls, arrivals, at = [], [], 0.0
    for number in range(400):
        call = Collective(rank=2, type="all_reduce", event=10 * number, start_us=at, end_us=at + 300.0, nbytes=1024,
                          group_size=4, on_device=True, tid=7)  # fmt: skip
        calls.append(call)
        arrivals.append((call, at + float(random.uniform(-50, 350)), int(random.choice([0, 1, 2, 3]))))
        at += float(random.choice([310.0, 500.0]))
    spans, host_side = [], []
    for _ in range(5000):
        low = float(random.uniform(-100, at + 100))
        spans.append((int(random.integers(0, 6)), low, low + float(random.choice([0.0, 3.5, 40.25, 700.0]))))
        host_side.append(int(random.choice([-1, 10 * int(random.integers(0, 400)), 7])))  # 7: no collective's event
    waits = CollectiveWaits(WaitSpans.of(spans), (1, 2, 3, 4, 5, 6), {call.event: ("nccl:all_reduce", None) for call in calls},
                            np.array(host_side, np.int64))  # fmt: skip
    by_step, by_cause = _split_one_by_one(waits, arrivals)
    split = split_waits(waits, Arrivals.of(arrivals))
    assert [list(step.items()) for step in split.by_step_ms] == [list(step.items()) for step in by_step]
    assert {"unmatched", "transfer", "arriving", "rank 0"} <= set(split.total_ms)
    assert split.top == _top(waits.described, by_cause)
    import dataclasses

    shift, offset = 12345.678, 10**6  # the join's: split as it moves them, equal to splitting the moved pieces
    moved = [(dataclasses.replace(call, event=call.event + offset, start_us=call.start_us + shift, end_us=call.end_us + shift),
              latest + shift, last) for call, latest, last in arrivals]  # fmt: skip
    expected = split_waits(_shifted(waits, shift, offset), Arrivals.of(moved))
    assert split_waits(waits, Arrivals.of(moved), shift_us=shift, event_offset=offset) == expected
    assert expected.top[0].collective == "nccl:all_reduce" and expected != split
