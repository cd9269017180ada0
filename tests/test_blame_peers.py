"""Collective wait blamed on the peer that arrived last: a planted late rank takes its peers' wait with its ms,
ranks that arrive together blame no peer (the wait is the transfer), one rank alone keeps today's blame."""

from __future__ import annotations

from pathlib import Path

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
    analyses = run_analyses(load(path))
    for blamed in analyses.blame.ranks.values():  # the blame still sums to the idle it explains
        assert sum(blamed.by_category_ms.values()) == pytest.approx(blamed.idle_ms, abs=1e-9)
        if blamed.peers is not None:  # and each step's peer split to that step's collective wait
            for step, split in zip(blamed.steps, blamed.peers.by_step_ms):
                assert sum(split.values()) == pytest.approx(step.by_category_ms["collective_wait"], abs=1e-9)
    return analyses.blame


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
    from skalpel.job.build import build_report
    from skalpel.report import terminal

    report = build_report(load(_gloo_job(tmp_path, late_rank=1)))
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "rank 1"
    out = " ".join(terminal.render_text(report, width=200).split())
    assert "by cause: collective_wait 100% (mostly for rank 1)" in out  # ranks 0 and 2 waited 12 of 15 ms for it
    assert "(mostly transfer)" in out  # rank 1 itself waited for nobody


def test_explain_blame_says_how_the_wait_is_split_by_peer(capsys):
    from skalpel.cli import main

    assert main(["explain", "blame"]) == 0
    assert "transfer" in capsys.readouterr().out


def test_on_the_real_8_rank_dlrm_set_no_peer_is_invented():
    """NCCL on V100s: the device's collective wait there is idle before a queued collective kernel starts, inside
    no matched collective: no peer rank is blamed, and each step's split adds up to its collective wait."""
    result = _blame(corpus("extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"))
    assert len(result.ranks) == 8
    for blamed in result.ranks.values():
        assert blamed.by_category_ms["collective_wait"] > 0
        assert set(blamed.peers.total_ms) == {"unmatched"}
        assert [(item.collective, item.location) for item in blamed.peers.top] == [(None, None)]


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
    from skalpel.job.build import build_report

    folder = _gpu_gloo_job(tmp_path, late_rank=2)
    report = analyze(folder, workers=1) if by_rank else build_report(load(folder))
    (finding,) = _gpu_idle(report)  # ranks 0 and 1 alike; rank 2 idles for its own host work, under the threshold
    assert "90% of it waiting in collectives for rank 2 (gloo:all_reduce)" in finding.title
    culprit = finding.evidence["culprits"][0]
    assert (culprit["category"], culprit["waiting_for"]) == ("collective_wait", "rank 2")
    assert finding.fix.startswith("the device waits in collectives (gloo:all_reduce) for rank 2, which arrives last")
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "rank 2"


def test_gpu_idle_blames_no_peer_when_the_ranks_arrive_together(tmp_path):
    """The look-alike: the same 15 ms a step in the all_reduce, but no late rank: the wait is the transfer, and
    gpu_idle leads with the collectives without naming a rank."""
    from skalpel.job.build import build_report

    report = build_report(load(_gpu_gloo_job(tmp_path, late_rank=None, transfer_us=15_000.0)))
    (finding,) = _gpu_idle(report)
    assert "waiting on collectives (gloo:all_reduce)" in finding.title and "for rank" not in finding.title
    assert "for rank" not in finding.fix and "look for a straggler rank" in finding.fix
    assert finding.evidence["culprits"][0]["category"] == "collective_wait"
    assert not any("waiting_for" in culprit for culprit in finding.evidence["culprits"])
    assert report.ranks[0].extra["blame"]["collective_wait_by_peer"]["mostly"] == "transfer"
