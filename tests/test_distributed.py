"""Distributed analysis on real stored multi-rank traces: collectives, clock alignment, waits, bad input.

The 2-rank NCCL pair (HTA trace_filter, TorchRec training, world 128, event-sampled) and
the 8-rank DLRM set (param et_replay, every rank of one step) are the real multi-rank
traces we have; the rank-file tests rewrite copies of them (shifted clocks, a missing
rank, a dropped step, another run's file) and check what the analysis says.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from skalpel.analysis.bundle import run_analyses
from skalpel.analysis.collectives import busbw_factor, collective_type, dtype_bytes, message_bytes
from skalpel.analysis.ranks import compare_ranks
from skalpel.cli import main
from skalpel.diagnose import distributed
from skalpel.diagnose.rule import JobContext
from skalpel.errors import SkalpelError
from skalpel.job.report_of import report_of
from skalpel.result.commbench import BenchRow, CommBench, compare
from skalpel.trace.loader import load

from .conftest import corpus
from .rankjob import joined_analyses

PAIR = "hta/trace_filter"
DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nccl:all_reduce", "all_reduce"),
        ("gloo:all_gather", "all_gather"),
        ("c10d::_allgather_base_", "all_gather"),
        ("nccl:_all_gather_base", "all_gather"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
        ("gloo:broadcast", "broadcast"),
        ("c10d::barrier", "barrier"),
        ("allreduce", "all_reduce"),
        ("multimem_all_reduce_kernel", "all_reduce"),
        ("ncclDevKernel_Generic", "other"),
    ],
)
def test_collective_type_from_any_name(name: str, kind: str) -> None:
    assert collective_type(name) == kind


def test_busbw_factors_follow_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert busbw_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert busbw_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 8) == 1.0


def test_message_bytes_from_both_arg_forms() -> None:
    assert dtype_bytes("BFloat16") == 2 and dtype_bytes("long int") == 8 and dtype_bytes("nonsense") is None
    # torch >= 2.3 record_param_comms args (nccl_parser_config): S = max(in, out) elements x dtype
    assert message_bytes("all_reduce", {"In msg nelems": 2049000, "Out msg nelems": 2049000, "dtype": "Float"}, 2) == 8196000
    assert message_bytes("all_gather", {"In msg nelems": 10, "Out msg nelems": 80, "dtype": "Half"}, 8) == 160
    # Input Dims of a backend op: all_gather records its local input, S is the gathered output
    assert message_bytes("all_gather", {"Input Dims": [[100]], "Input type": ["float"]}, 2) == 800
    assert message_bytes("all_reduce", {"Input Dims": [[394241]], "Input type": ["float"]}, 8) == 1576964
    assert message_bytes("barrier", {}, 2) == 0
    # fewer types than shapes (a mutation run found no test of it): the shape without a type counts no bytes
    assert message_bytes("all_reduce", {"Input Dims": [[4], [8]], "Input type": ["float"]}, 2) == 16


def test_nccl_pair_analyses_as_one_job() -> None:
    report = report_of(corpus(PAIR)).report
    assert [rank.rank for rank in report.ranks] == [0, 1]
    for rank in report.ranks:
        comm = rank.extra["comm"]
        assert comm["timed_on"] == "device"
        types = {row["type"]: row for row in comm["by_type"]}
        assert {"all_reduce", "all_to_all", "all_gather"} <= set(types)
        assert types["all_reduce"]["group_size"] == 128
        assert types["all_reduce"]["busbw_gbps"] > types["all_reduce"]["algbw_gbps"] > 0
        assert 0 < comm["share_pct"] < 100 and 0 <= comm["overlap_pct"] <= 100
        assert rank.extra["distributed"]["matched_collectives"] >= 3
    assert any("128 ranks but 2 rank files" in warning and "missing: 2-127" in warning for warning in report.warnings)


def test_nccl_pair_kernels_take_type_and_size_from_their_host_op() -> None:
    # The sampled trace names every NCCL kernel SendRecv; the nccl:all_reduce op around the launch says what it is.
    analyses = joined_analyses(corpus(PAIR))
    rank0 = analyses.comm.for_rank(0)
    all_reduce = [c for c in rank0.collectives if c.type == "all_reduce"]
    assert all_reduce and all(c.on_device for c in all_reduce)
    assert sorted(c.nbytes for c in all_reduce)[0] == 5716654 * 4


def test_dlrm_eight_ranks_align_and_match() -> None:
    analyses = joined_analyses(corpus(DLRM))
    comparison = analyses.rank_comparison
    assert [t.rank for t in comparison.ranks] == list(range(8))
    assert comparison.aligned and comparison.warnings == ()
    assert all(t.matched_collectives == 8 for t in comparison.ranks)
    assert all(abs(t.clock_offset_us) < 50 for t in comparison.ranks)  # one host's clock: offsets near zero
    types = {row.type for rank in analyses.comm.ranks for row in rank.by_type}
    assert types == {"all_to_all", "all_reduce"}
    waits = [t.wait_ms_per_step for t in comparison.ranks]
    straggler = comparison.straggler
    assert straggler.rank == int(np.argmin(waits)) == 7
    assert straggler.last_arrival_pct >= 50
    assert straggler.imposed_wait_ms_per_step == pytest.approx(float(np.median(np.delete(waits, 7))) - waits[7])
    for timing in comparison.ranks:  # the transfer (after the last rank arrived) is never slower than the whole call
        raw = {row.type: row.busbw_gbps for row in analyses.comm.for_rank(timing.rank).by_type}
        assert set(timing.transfer_busbw_gbps) == {"all_to_all", "all_reduce"}
        assert all(timing.transfer_busbw_gbps[kind] >= raw[kind] * 0.999 for kind in raw)


def _rewrite(source: Path, target: Path, change) -> Path:
    document = json.loads(gzip.decompress(source.read_bytes()))
    change(document)
    target.write_bytes(gzip.compress(json.dumps(document).encode()))
    return target


def _dlrm_files() -> list[Path]:
    return sorted(corpus(DLRM).glob("worker*.json.gz"))


def test_shifted_clock_is_estimated_and_removed(tmp_path: Path) -> None:
    files = _dlrm_files()
    for path in files:
        shutil.copy(path, tmp_path / path.name)

    def shift(document: dict) -> None:
        for event in document["traceEvents"]:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += 5000.0

    _rewrite(files[3], tmp_path / files[3].name, shift)
    before = joined_analyses(corpus(DLRM)).rank_comparison
    after = joined_analyses(tmp_path).rank_comparison
    offset = {t.rank: t.clock_offset_us for t in after.ranks}
    assert offset[3] == pytest.approx(5000.0 + {t.rank: t.clock_offset_us for t in before.ranks}[3], abs=1.0)
    for old, new in zip(before.ranks, after.ranks):
        assert new.wait_ms_per_step == pytest.approx(old.wait_ms_per_step, abs=0.01)
    assert after.straggler.rank == before.straggler.rank


def test_clock_offsets_are_per_host(tmp_path: Path) -> None:
    # Ranks 0-3 on host "a", 4-7 on host "b" whose clock runs 3 ms ahead: one offset for all of "b".
    def host(name: str, shift_us: float):
        def change(document: dict) -> None:
            document["host_name"] = name
            for event in document["traceEvents"]:
                if isinstance(event.get("ts"), (int, float)):
                    event["ts"] += shift_us

        return change

    for index, path in enumerate(_dlrm_files()):
        _rewrite(path, tmp_path / path.name, host("a", 0.0) if index < 4 else host("b", 3000.0))
    comparison = joined_analyses(tmp_path).rank_comparison
    clocks = {t.rank: (t.clock, t.clock_offset_us) for t in comparison.ranks}
    assert clocks[0] == ("reference", 0.0)
    assert all(clocks[rank] == ("same host", 0.0) for rank in (1, 2, 3))
    offsets = {clocks[rank][1] for rank in (4, 5, 6, 7)}
    assert len(offsets) == 1 and offsets.pop() == pytest.approx(3000.0, abs=50.0)
    assert {clocks[rank][0] for rank in (4, 5, 6, 7)} == {"aligned"}


def test_missing_rank_is_said_and_the_rest_analysed(tmp_path: Path) -> None:
    for path in _dlrm_files():
        if not path.name.startswith("worker5"):
            shutil.copy(path, tmp_path / path.name)
    report = report_of(tmp_path).report
    assert [rank.rank for rank in report.ranks] == [0, 1, 2, 3, 4, 6, 7]
    assert any("8 ranks but 7 rank files" in w and "missing: 5)" in w for w in report.warnings)
    assert all(rank.extra["distributed"]["matched_collectives"] == 8 for rank in report.ranks)


def test_files_of_different_jobs_are_said(tmp_path: Path) -> None:
    shutil.copy(_dlrm_files()[0], tmp_path / "rank0.json.gz")
    shutil.copy(corpus(PAIR) / "sampled_rank-1.json.gz", tmp_path / "rank1.json.gz")
    report = report_of(tmp_path).report
    assert len(report.ranks) == 2
    text = " ".join(report.warnings)
    assert "disagree on the world size (rank 0: 8, rank 1: 128)" in text
    assert "few collectives match across ranks" in text


def test_run_ids_of_different_captures_are_said(tmp_path: Path) -> None:
    files = _dlrm_files()[:2]

    def tag(run: str):
        return lambda document: document.update(skalpel_run=run)

    _rewrite(files[0], tmp_path / files[0].name, tag("2026-12-02T10-00-00-train"))
    _rewrite(files[1], tmp_path / files[1].name, tag("2026-12-02T11-00-00-train"))
    report = report_of(tmp_path).report
    assert any("come from different runs" in w and "11-00-00" in w for w in report.warnings)
    _rewrite(files[1], tmp_path / files[1].name, tag("2026-12-02T10-00-00-train"))
    assert not any("different runs" in w for w in report_of(tmp_path).report.warnings)


def test_different_step_counts_are_said(tmp_path: Path) -> None:
    pair = corpus(PAIR)
    shutil.copy(pair / "sampled_rank-0.json.gz", tmp_path / "sampled_rank-0.json.gz")

    def drop_last_step(document: dict) -> None:
        document["traceEvents"] = [e for e in document["traceEvents"] if e.get("name") != "ProfilerStep#552"]

    _rewrite(pair / "sampled_rank-1.json.gz", tmp_path / "sampled_rank-1.json.gz", drop_last_step)
    analyses = joined_analyses(tmp_path)
    counts = {rank: len(analyses.steps.for_rank(rank)) for rank in (0, 1)}
    assert counts[0] != counts[1]
    assert any("different numbers of steps" in w for w in analyses.rank_comparison.warnings)
    assert analyses.rank_comparison.matched_groups >= 1  # the analysis goes on with what matches


def test_rules_on_stored_traces() -> None:
    control = JobContext(joined_analyses(corpus("hta/trace_diff/control/control.json.gz")))
    bound = distributed.COMMUNICATION_BOUND.check(control, distributed.COMMUNICATION_BOUND)
    assert len(bound) == 1 and bound[0].evidence["share_pct"] >= 30 and "all_to_all" in bound[0].evidence["collectives"]
    straggler = distributed.STRAGGLER_RANK.check(control, distributed.STRAGGLER_RANK)
    assert "one rank" in straggler.reason  # NotJudged: a single rank cannot show a straggler
    dlrm = JobContext(joined_analyses(corpus(DLRM)))
    # rank 7 arrives last, but the others wait 4.5 ms/step for it: under the 5 ms/step floor
    assert distributed.STRAGGLER_RANK.check(dlrm, distributed.STRAGGLER_RANK) == []


def test_commbench_file_round_trip_and_comparison() -> None:
    bench = CommBench(
        "nccl", 2, "NVIDIA A100", "2.4.0",
        (BenchRow("all_reduce", 1 << 20, 50.0, 20.97, 20.97), BenchRow("all_reduce", 1 << 26, 800.0, 83.9, 83.9)),
    )  # fmt: skip
    again = CommBench.from_json(bench.to_json())
    assert again == bench
    assert again.busbw_at("all_reduce", 30_000_000).nbytes == 1 << 26
    report = compare(report_of(corpus("hta/nccl_parser_config/nccl_data.json.gz")).report, bench)
    row = next(r for r in report.ranks[0].extra["comm"]["by_type"] if r["type"] == "all_reduce")
    assert row["commbench_busbw_gbps"] == 83.9
    assert row["vs_commbench_pct"] == pytest.approx(100 * row["busbw_gbps"] / 83.9, abs=0.1)
    assert "transfer_vs_commbench_pct" not in row  # one rank: no wait to take out
    with pytest.raises(SkalpelError, match="not a skalpel commbench result"):
        CommBench.from_json(b'{"schema": "other"}')


@pytest.mark.parametrize("change", [
    {"rows": [{"type": "all_reduce", "nbytes": "1M", "time_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]},
    {"rows": [{"type": "all_reduce", "nbytes": 1024, "time_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": "fast"}]},
    {"rows": [{"type": "all_reduce", "nbytes": 1024, "time_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": -2.0}]},
    {"rows": [{"type": 7, "nbytes": 1024, "time_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]},
    {"rows": [{"type": "all_reduce", "nbytes": True, "time_us": 1.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]},
    {"rows": ["all_reduce"]}, {"rows": {}}, {"ranks": "two"}, {"skipped": "all_to_all"}, {"device": None},
])  # fmt: skip
def test_commbench_file_with_a_field_of_the_wrong_type_is_a_clear_error(tmp_path: Path, change: dict, capsys) -> None:
    """A hand-edited result must fail on reading, not later in the comparison's arithmetic or the table."""
    bench = CommBench("gloo", 2, "cpu", "2.13.0", (BenchRow("all_reduce", 1024, 10.0, 0.1, 0.1),))
    data = {**json.loads(bench.to_json()), **change}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    assert main(["analyze", str(corpus("hta/nccl_parser_config/nccl_data.json.gz")), "--commbench", str(path)]) == 2
    assert "not a skalpel commbench result" in capsys.readouterr().err


def test_compare_ranks_single_rank_has_no_straggler() -> None:
    trace = load(corpus("hta/nccl_parser_config/nccl_data.json.gz"))
    analyses = run_analyses(trace)
    assert analyses.rank_comparison is None
    assert compare_ranks(trace.ranks, analyses.steps, analyses.comm, profiles={}).straggler is None


def test_rank0_waits_for_late_ranks_then_says_which_never_came(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skalpel.capture import distributed as capture

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    monkeypatch.setenv(capture.ENV_WAIT, "0.6")
    monkeypatch.delenv(capture.ENV_TRACE_ONLY, raising=False)
    monkeypatch.delenv(capture.ENV_RUN_ID, raising=False)
    current = capture.job()
    assert current == capture.Job(rank=0, world_size=3, run_id="job-42", trace_only=False)
    assert capture.run_id(tmp_path) == "job-42" and capture.writes_report()
    own = tmp_path / "trace-rank0.json.gz"
    for rank in (0, 2):
        (tmp_path / f"trace-rank{rank}.json.gz").write_bytes(b"")
    paths, warning = capture.rank_traces(tmp_path, [own])
    assert [path.name for path in paths] == ["trace-rank0.json.gz", "trace-rank2.json.gz"]
    assert warning is not None and "rank(s) 1 after 1 s" in warning
    monkeypatch.setenv("RANK", "1")
    assert not capture.writes_report()  # only rank 0 writes the merged report
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(capture.ENV_TRACE_ONLY, "1")
    assert not capture.writes_report()  # under --nproc the launcher does
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert capture.job() is None and capture.writes_report()
    assert capture.rank_traces(tmp_path, [own]) == ([own], None)


def test_uneven_all_to_all_still_matches_in_order(tmp_path: Path) -> None:
    # TorchRec-style all_to_all: every rank sends its own byte count. Give rank 1 other sizes.
    files = _dlrm_files()[:2]
    shutil.copy(files[0], tmp_path / files[0].name)

    def uneven(document: dict) -> None:
        for event in document["traceEvents"]:
            if event.get("name") == "nccl:all_to_all":
                event["args"]["Input Dims"] = [[dim[0] * 3 + 1] for dim in event["args"]["Input Dims"]]

    _rewrite(files[1], tmp_path / files[1].name, uneven)
    analyses = joined_analyses(tmp_path)
    sizes = {rank: sorted(c.nbytes for c in analyses.comm.for_rank(rank).collectives if c.type == "all_to_all") for rank in (0, 1)}
    assert sizes[0] != sizes[1]
    assert [t.matched_collectives for t in analyses.rank_comparison.ranks] == [8, 8]
    assert analyses.rank_comparison.warnings == ("the job has 8 ranks but 2 rank files were loaded (missing: 2-7); "
                                                 "cross-rank figures cover the ranks present",)


def test_communication_findings_quote_the_step_their_share_is_of(tmp_path):
    """Two gloo ranks, steps of 30, 30 and 60 ms (mean 40, median 30), each with 20 ms of all_reduce (200 MB: more than
    one small bucket) after 5 ms of compute on the main thread: communication_bound and low_comm_overlap quote the
    40 ms mean step, their share's own denominator; a mean ms per step beside the median step can exceed it (issue
    33: "collectives take 220.6 ms per step inside a 219.5 ms step")."""
    from skalpel.api import analyze
    from tests.tracebuilder import TraceBuilder

    folder = tmp_path / "job"
    folder.mkdir()
    for rank in (0, 1):
        builder = TraceBuilder()
        builder.device_properties = []
        builder.header = {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"}, "host_name": "node0"}
        start = 0.0
        for number, length in enumerate((30_000.0, 30_000.0, 60_000.0)):
            builder.step(number + 1, start, length - 1)
            builder.host("aten::mm", start + 10, 5000)
            builder.host("gloo:all_reduce", start + 5010, 20_000, tid=200,
                         **{"In msg nelems": 50_000_000, "Out msg nelems": 50_000_000, "dtype": "Float", "Group size": 2})  # fmt: skip
            start += length
        builder.write(folder / f"trace-rank{rank}.json")
    report = analyze(folder, workers=1)
    found = {finding.id: finding for finding in report.findings}
    for rule_id in ("communication_bound", "low_comm_overlap"):
        assert found[rule_id].evidence["step_ms"] == pytest.approx(40.0, abs=0.01), rule_id
        assert "40.0 ms mean step" in found[rule_id].title or "mean step 40.0 ms" in found[rule_id].title
        assert found[rule_id].evidence["comm_ms_per_step"] <= found[rule_id].evidence["step_ms"]


@pytest.mark.parametrize("launch_us, described", [(120.0, True), (150.0, True), (151.0, False)])
def test_a_comm_kernel_takes_its_size_from_the_op_open_at_its_launch(tmp_path: Path, launch_us: float, described: bool):
    """An nccl:all_reduce op of 100-150 us with 1,000 floats launches its kernel: at 120 us, or at 150 us exactly (an
    op is open at its last microsecond), the kernel's size is the op's 4,000 bytes; launched at 151 us, no op is
    open and the size is unknown (0)."""
    from skalpel.analysis.collectives import find_collectives
    from tests.tracebuilder import TraceBuilder

    builder = TraceBuilder()
    builder.step(1, 0, 1000)
    builder.host("nccl:all_reduce", 100, 50, **{"In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
                                                 "Group size": 2})  # fmt: skip
    builder.launch(launch_us, 4, work_ts=200, work_dur=40, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    trace = load(builder.write(tmp_path / "rank.json"))
    (collective,) = find_collectives(trace, trace.rank_ids[0])
    assert collective.type == "all_reduce" and collective.on_device
    assert collective.nbytes == (4000 if described else 0)
    assert collective.group_size == (2 if described else 1)


def test_job_wide_communication_findings_say_their_ranks_spread_and_worst():
    """communication_bound and low_comm_overlap are judged at the job's median rank; like a finding merged across
    ranks they also say on which ranks they hold (by the same thresholds), how their number spreads there and the
    worst ranks. On the 8-rank DLRM step collectives take 14-61% of the ranks' steps."""
    from skalpel.api import analyze
    from skalpel.diagnose import thresholds
    from skalpel.report.terminal import render_text
    from skalpel.result.report import rank_ranges

    report = analyze(corpus(DLRM))
    found = {finding.id: finding for finding in report.findings}
    bound = found["communication_bound"]
    shares = {int(rank): share for rank, share in bound.evidence["share_pct_by_rank"].items()}
    holds = sorted(rank for rank, share in shares.items() if share >= thresholds.COMMUNICATION_BOUND.share_pct)
    across = bound.across
    assert 1 < len(holds) < 8 and across.count == len(holds) and across.of == 8 and across.key == "share_pct"
    assert across.ranks == rank_ranges(holds)
    assert across.max == pytest.approx(max(shares.values()), abs=1e-3) and across.worst[0] == max(shares, key=shares.get)
    assert across.min == pytest.approx(min(shares[rank] for rank in holds), abs=1e-3)
    assert across.title_rank == bound.evidence["rank"] and bound.rank is None
    overlap = found["low_comm_overlap"].across
    assert overlap.key == "exposed_pct" and overlap.title_rank == found["low_comm_overlap"].evidence["rank"]
    assert overlap.min <= found["low_comm_overlap"].evidence["exposed_pct"] <= overlap.max
    text = render_text(report)
    assert f"ranks: on {len(holds)} of 8 ranks ({rank_ranges(holds)}): share_pct min" in " ".join(text.split())
    assert f"(the title is rank {bound.evidence['rank']}'s, the job's median rank)" in " ".join(text.split())
