"""One road, whatever reduces the ranks: in this process, in worker processes as summaries arrive in any order,
or as Ray tasks, a job's report is the same, byte for byte.

Every multi-rank set of the corpus (the NCCL pair, the 8-rank DLRM step) and the rank-file
rewrites of test_distributed (a shifted clock, two hosts, a missing rank, files of other
jobs, different step counts) are analysed each way; a single file in this process gives what a
worker gives. Bad rank files are reported and the other ranks still analysed; a worker
that dies is retried once, alone, then reported. (Before the whole-trace road was deleted, these
tests compared the two roads on the same inputs, byte for byte: its acceptance test.)
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from skalpel.analysis.call_tree import flame_tree
from skalpel.api import analyze_job
from skalpel.job.join import Joining, join_summaries
from skalpel.job.peers import SplitRequest, split_here
from skalpel.job.pool import split_all, split_on_ray, summarize_all, summarize_on_ray
from skalpel.job.rank import RankFailure, SummaryRequest, summarize_rank
from skalpel.job.report_of import report_of
from skalpel.trace.loader import find_trace_files, load, load_one

from .conftest import corpus, importorskip
from .test_distributed import _dlrm_files, _rewrite
from .tracebuilder import TraceBuilder

PAIR = "hta/trace_filter"
DLRM = "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted"


def _report_of(paths) -> bytes:  # the default: workers on a job, this process for one file
    return report_of(paths).report.to_json()


def _by_ranks(paths, workers: int, split=split_here) -> bytes:
    files = find_trace_files(paths if isinstance(paths, list) else [paths])
    results = summarize_all([SummaryRequest(path, len(files)) for path in files], workers=workers)
    return join_summaries(results, split=split)[0].to_json()


class _Splits:
    """A splitter that keeps what it was asked and answered (the real one runs: workers, or Ray tasks)."""

    def __init__(self, split) -> None:
        self.split, self.requests, self.answers = split, [], []

    def __call__(self, requests: list[SplitRequest]):
        self.requests, self.answers = requests, self.split(requests)
        return self.answers


def _shift(us: float, host: str | None = None):
    def change(document: dict) -> None:
        if host is not None:
            document["host_name"] = host
        for event in document["traceEvents"]:
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += us

    return change


@pytest.mark.parametrize("name", [PAIR, DLRM])
def test_corpus_jobs_give_one_report(name: str) -> None:
    whole = _report_of(corpus(name))
    assert _by_ranks(corpus(name), workers=2) == whole
    assert analyze_job([corpus(name)], workers=1).report.to_json() == whole  # in this process, rank after rank
    assert analyze_job([corpus(name)], workers=2).report.to_json() == whole  # joined as the workers' results arrive


SINGLE_FILES = [
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",  # a GPU step
    "hta/execution_trace/benchmark_simple_add_trace.json.gz",  # nearly all one-time work: the job rules wait too
    "hta/cpu_only",  # a CPU-only gloo rank
    "hta/trace_filter/sampled_rank-1.json.gz",  # one rank of an NCCL pair
]


@pytest.mark.parametrize("name", SINGLE_FILES)
def test_a_single_file_in_this_process_gives_the_report_a_worker_gives(name: str) -> None:
    """One file is a job of one rank: summarised in this process (decoding and analyses forked when large) it gives
    the report the same file reduced in a worker process gives, and the lowest rank's flame graph."""
    analysis = report_of([corpus(name)], flame=True)
    assert analysis.report.to_json() == _by_ranks(corpus(name), workers=2)
    trace = load(corpus(name))
    assert analysis.flame is not None and analysis.flame.tree == flame_tree(trace, rank=trace.rank_ids[0])


@pytest.mark.parametrize("order", [[7, 6, 5, 4, 3, 2, 1, 0], [3, 5, 0, 7, 1, 6, 2, 4]])
def test_summaries_joined_as_they_arrive_in_any_order_give_the_same_report(order: list[int]) -> None:
    """Each rank's own part is done as it arrives; ranks paired with a reference that a lower rank then
    replaces are paired again at the end."""
    files = find_trace_files([corpus(DLRM)])
    results = summarize_all([SummaryRequest(path, len(files)) for path in files], workers=1)
    joining = Joining()
    for index in order:
        joining.add(index, results[index])
    assert joining.indexed.reference == 0 and sorted(joining.works) == list(range(8))
    assert sorted(joining.indexed.pairs) == [0] + sorted(order[order.index(0) + 1 :])  # paired with rank 0 on arrival
    assert joining.finish()[0].to_json() == _report_of(corpus(DLRM))


@pytest.mark.parametrize("name", [PAIR, DLRM])
def test_collective_waits_split_in_workers_give_the_same_report(name: str) -> None:
    """The join's per-rank part (each rank's wait split by late peer) in a second round of worker processes."""
    splits = _Splits(lambda requests: split_all(requests, workers=2, least_pieces=0))
    assert _by_ranks(corpus(name), workers=2, split=splits) == _report_of(corpus(name))
    assert len(splits.requests) >= 2 and sum(request.waits.pieces for request in splits.requests) > 0
    assert splits.answers == split_here(splits.requests)


def _shifted_clock(tmp_path: Path) -> None:
    for path in _dlrm_files():
        shutil.copy(path, tmp_path / path.name)
    _rewrite(_dlrm_files()[3], tmp_path / _dlrm_files()[3].name, _shift(5000.0))


def _two_hosts(tmp_path: Path) -> None:
    for index, path in enumerate(_dlrm_files()):
        _rewrite(path, tmp_path / path.name, _shift(0.0, "a") if index < 4 else _shift(3000.0, "b"))


def _missing_rank(tmp_path: Path) -> None:
    for path in _dlrm_files():
        if not path.name.startswith("worker5"):
            shutil.copy(path, tmp_path / path.name)


def _other_job(tmp_path: Path) -> None:
    shutil.copy(_dlrm_files()[0], tmp_path / "rank0.json.gz")
    shutil.copy(corpus(PAIR) / "sampled_rank-1.json.gz", tmp_path / "rank1.json.gz")


def _step_counts(tmp_path: Path) -> None:
    pair = corpus(PAIR)
    shutil.copy(pair / "sampled_rank-0.json.gz", tmp_path / "sampled_rank-0.json.gz")

    def drop_last_step(document: dict) -> None:
        document["traceEvents"] = [e for e in document["traceEvents"] if e.get("name") != "ProfilerStep#552"]

    _rewrite(pair / "sampled_rank-1.json.gz", tmp_path / "sampled_rank-1.json.gz", drop_last_step)


@pytest.mark.parametrize("make", [_shifted_clock, _two_hosts, _missing_rank, _other_job, _step_counts])
def test_rewritten_jobs_give_one_report(make, tmp_path: Path) -> None:
    make(tmp_path)
    assert _by_ranks(tmp_path, workers=1) == _report_of(tmp_path)


@pytest.mark.parametrize(
    "name",
    [
        "hta/df_index_resolver",  # GPU, one rank, sync and memory findings
        "hta/nccl_parser_config",  # collectives of one rank of a bigger job
        "kineto/tb_plugin/samples/resnet50_num_workers_0",  # two captures of rank 0: the second is left out
        "hta/negative_queue_length_values_check",
        "kineto/docs/traces",
    ],
)
def test_one_rank_by_summary_equals_the_jobs_report(name: str) -> None:
    assert _by_ranks(corpus(name), workers=1) == _report_of(corpus(name))


def test_a_summary_is_small_beside_its_trace() -> None:
    import pickle

    path = corpus("hta/df_index_resolver") / "df_index_resolver.json.gz"
    summary = summarize_rank(SummaryRequest(path, 1))
    size = len(pickle.dumps(summary))
    assert size < 0.2 * len(gzip.decompress(path.read_bytes()))  # 54 MB of JSON, a few hundred kB of summary


def test_bad_rank_files_are_reported_and_the_rest_analysed(tmp_path: Path) -> None:
    files = _dlrm_files()
    for path in files[:5]:
        shutil.copy(path, tmp_path / path.name)
    whole = gzip.decompress(files[5].read_bytes())  # cut off in its last third (a killed process): analysed, said
    (tmp_path / files[5].name.removesuffix(".gz")).write_bytes(whole[: len(whole) * 2 // 3])
    (tmp_path / files[6].name).write_bytes(b"\x1f\x8b\x08\x00garbage that is not gzip")
    (tmp_path / files[7].name).write_bytes(b'{"nodes": [], "schema": "1.0.1"}')  # an execution trace, not Kineto
    report = analyze_job([tmp_path], workers=2).report
    assert [rank.rank for rank in report.ranks] == list(range(6))
    left_out = [w for w in report.warnings if w.startswith("skipped a file that does not load")]
    assert len(left_out) == 2
    assert any(files[6].name in w and "gzip" in w for w in left_out)
    assert any(files[7].name in w and "execution trace" in w for w in left_out)
    assert any("missing: 6-7" in w for w in report.warnings)
    assert any(files[5].name.removesuffix(".gz") in w and "cut off" in w for w in report.warnings)
    assert report.to_json() == _report_of(tmp_path)  # skipped alike however the ranks are reduced


def test_no_readable_rank_is_one_error(tmp_path: Path) -> None:
    from skalpel.errors import TraceError

    for index in range(2):
        (tmp_path / f"rank{index}.json").write_text("not json")
    with pytest.raises(TraceError, match="none of the 2 files loads"):
        analyze_job([tmp_path], workers=1)


# A real worker death: the task ends its process with os._exit for the planted file.
def dies_on_rank3(request: SummaryRequest, on_fraction=None):
    if request.path.name.startswith("worker3"):
        os._exit(17)
    return summarize_rank(request, on_fraction)


def dies_once(request: SummaryRequest, on_fraction=None):
    marker = request.path.with_suffix(".died")
    if request.path.name.startswith("worker3") and not marker.exists():
        marker.write_text("once")
        os._exit(17)
    return summarize_rank(request, on_fraction)


def _copies(tmp_path: Path) -> list[Path]:
    for path in _dlrm_files()[:4]:
        shutil.copy(path, tmp_path / path.name)
    return find_trace_files([tmp_path])


def test_worker_that_dies_twice_is_reported(tmp_path: Path) -> None:
    files = _copies(tmp_path)
    results = summarize_all([SummaryRequest(p, len(files)) for p in files], workers=2, task=dies_on_rank3)
    failed = [r for r in results if isinstance(r, RankFailure)]
    assert [f.path.name[:7] for f in failed] == ["worker3"] and failed[0].attempts == 2
    assert "died twice" in failed[0].reason
    report, _ = join_summaries(results)
    assert [rank.rank for rank in report.ranks] == [0, 1, 2]
    assert any("skipped a file that does not load" in w and "worker3" in w and "died twice" in w for w in report.warnings)


def test_worker_that_dies_once_is_retried(tmp_path: Path) -> None:
    files = _copies(tmp_path)
    results = summarize_all([SummaryRequest(p, len(files)) for p in files], workers=2, task=dies_once)
    assert (tmp_path / "worker3_step_12.1694128201557.pt.trace.json.died").exists()
    assert not [r for r in results if isinstance(r, RankFailure)]
    assert join_summaries(results)[0].to_json() == _report_of(tmp_path)


def test_progress_reaches_every_rank(tmp_path: Path) -> None:
    files = _copies(tmp_path)
    seen: dict[int, list[float]] = {}
    summarize_all(
        [SummaryRequest(p, len(files)) for p in files], workers=2,
        on_progress=lambda index, fraction: seen.setdefault(index, []).append(fraction),
    )  # fmt: skip
    assert sorted(seen) == [0, 1, 2, 3]
    assert all(values[-1] == 1.0 for values in seen.values())
    assert any(0.0 < value < 1.0 for values in seen.values() for value in values)  # from inside the workers


def test_unreachable_ray_address_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "skalpel", "analyze", str(corpus(PAIR)), "--ray", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "skalpel: error: cannot reach the Ray cluster at 127.0.0.1:1: Connection refused"


@pytest.mark.slow
def test_ray_tasks_give_the_local_report() -> None:
    ray = importorskip("ray")  # in the test extra: CI has it, and fails without it
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        job = analyze_job([corpus(DLRM)], ray=True)
        files = find_trace_files([corpus(DLRM)])
        results = summarize_on_ray([SummaryRequest(path, len(files)) for path in files], None)
        splits = _Splits(lambda requests: split_on_ray(requests, least_pieces=0))  # as Ray tasks, however few
        split_report = join_summaries(results, split=splits)[0].to_json()
    finally:
        ray.shutdown()
    assert job.report.to_json() == _report_of(corpus(DLRM))
    assert split_report == job.report.to_json() and len(splits.requests) == 8
    assert splits.answers == split_here(splits.requests)


def test_flame_graph_is_the_lowest_ranks_as_from_the_whole_trace() -> None:

    whole = flame_tree(load(corpus(DLRM)), rank=0)
    assert whole is not None
    assert analyze_job([corpus(DLRM)], workers=2, flame=True).flame_tree == whole


def test_workers_must_be_a_positive_number(capsys) -> None:
    from skalpel.cli import main

    with pytest.raises(SystemExit) as exit:
        main(["analyze", str(corpus(PAIR)), "--workers", "0"])
    assert exit.value.code == 2 and "must be 1 or more, got 0" in capsys.readouterr().err


def test_a_rank_loaded_alone_has_the_whole_traces_times(tmp_path: Path) -> None:
    """The summaries count from their rank's first event, the whole trace from the job's: an event's end moved
    to the job's origin must be the whole trace's double. Off a common grid ``ts + dur`` rounds by the size of
    ``ts``: these times (a real capture's clock) gave ends 1 ulp apart, and in 5 of 19 shifted copies of a real
    2-rank capture a 4-decimal figure of the two reports differed."""
    paths = []
    for rank, events in enumerate([[(5534974623066.396, 10.0)],
                                   [(5534974626878.034, 5.0), (5534974628984.088, 44.539)]]):  # fmt: skip
        builder = TraceBuilder()
        builder.header = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}}
        for ts, dur in events:
            builder.host("aten::mm", ts, dur)
        paths.append(builder.write(tmp_path / f"rank{rank}.json"))
    whole, alone = load(paths), load_one(paths[1])
    shift = alone.origin_us - whole.origin_us
    assert ((alone.ts + alone.dur) + shift).tolist() == (whole.ts + whole.dur)[whole.rank == 1].tolist()
    assert (alone.ts + shift).tolist() == whole.ts[whole.rank == 1].tolist()


def test_rank_rules_in_workers_read_the_runs_capture_facts(tmp_path: Path) -> None:
    """A rank rule that reads the capture (host_bound's saving without the profiler) says the same in a worker as in
    one process: the run's measured overhead travels with each rank's request."""
    from skalpel.result.report import CaptureInfo

    from .ledger_lookalikes import _ddp_cpu_step, write
    from .tracebuilder import cpu_rank

    ranks = [cpu_rank(rank) for rank in (0, 1)]
    for builder in ranks:
        for number in range(5):
            _ddp_cpu_step(builder, number, wait_us=0, python_us=36_000)
    folder = write(ranks, tmp_path, "python_busy_job")
    capture = CaptureInfo(warmup_steps=2, active_steps=5, overhead_pct=118.0, overhead_noise_pct=10.0,
                          baseline_steps=5, unprofiled_step_ms=23.0, profiled_step_ms=50.0)  # fmt: skip
    whole = report_of(folder, capture=capture).report
    (host,) = [f for f in whole.findings if f.id == "host_bound"]
    assert host.evidence["unprofiled_ratio"] == pytest.approx(0.46)
    files = find_trace_files([folder])
    results = summarize_all([SummaryRequest(path, len(files), capture=capture) for path in files], workers=2)
    assert join_summaries(results, capture=capture)[0].to_json() == whole.to_json()
