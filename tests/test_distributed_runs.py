"""Real multi-process runs: 2 gloo ranks on CPU, one thread each, profiled by skalpel.

The clean DDP baseline under the user's own torchrun (`torchrun -m skalpel run`), the
planted straggler under `skalpel run --nproc 2` and the real `skalpel commbench` run at
once (module fixture) to keep the wall time down; the communication-heavy model then
runs alone under `skalpel run --nproc 2`.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skalpel.analysis.ranks import OUTSIDE_OPS
from skalpel.cli import main
from skalpel.result.report import Report

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # real multi-rank jobs judged on the load they see: conftest

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"
CAPTURE = ["--wait", "0", "--warmup", "1", "--active", "3"]
TIMEOUT_S = 400


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", SKALPEL_RANK_WAIT_S="120")


def _launch(folder: Path, command: list[str]) -> subprocess.Popen:
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = open(folder.parent / f"{folder.name}.log", "wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=folder.parent)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ddp")
    skalpel = [sys.executable, "-m", "skalpel", "run"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "skalpel", "run"]
    jobs = {
        "small": torchrun + CAPTURE + ["--name", "small", str(SCENARIOS / "ddp_small.py"), "--steps", "6"],
        "straggler": skalpel + ["--nproc", "2", *CAPTURE, "--out", str(base / "straggler"),
                                str(SCENARIOS / "ddp_straggler.py"), "--steps", "6"],
        "comm_heavy": skalpel + ["--nproc", "2", *CAPTURE, "--out", str(base / "comm_heavy"),
                                 str(SCENARIOS / "ddp_comm_heavy.py"), "--steps", "6"],
        "bench": [sys.executable, "-m", "skalpel", "commbench", "--min-bytes", "64K", "--max-bytes", "1M",
                  "--ops", "all_reduce,broadcast", "--iters", "3", "--json", str(base / "bench.json")],
    }  # fmt: skip
    # The communication-heavy job runs on its own: beside the others, on 2 cores, its ranks
    # mostly wait for each other, and waiting is (rightly) not counted as communication.
    for wave in (("small", "straggler", "bench"), ("comm_heavy",)):
        processes = {name: _launch(base / name, jobs[name]) for name in wave}
        for name, process in processes.items():
            status = process.wait(timeout=TIMEOUT_S)
            log = (base / f"{name}.log").read_text(errors="replace")
            assert status == 0, f"{name} exited {status}:\n{log[-3000:]}"
    folders = {name: base / name for name in ("straggler", "comm_heavy")}
    folders["bench"] = base / "bench.json"
    folders["bench_log"] = base / "bench.log"
    (small,) = list((base / "skalpel-runs").iterdir())  # the ranks agreed on one folder
    folders["small"] = small
    return folders


def _report(folder: Path) -> Report:
    return Report.from_json((folder / "report.json").read_bytes())


def _header(path: Path) -> dict:
    document = json.loads(gzip.decompress(path.read_bytes()))
    return {key: value for key, value in document.items() if key != "traceEvents"}


def test_torchrun_ranks_write_one_folder_and_rank0_the_merged_report(runs: dict[str, Path]) -> None:
    folder = runs["small"]
    traces = sorted(path.name for path in folder.glob("trace-rank*.json.gz"))
    assert traces == ["trace-rank0.json.gz", "trace-rank1.json.gz"]
    headers = [_header(folder / name) for name in traces]
    assert [h["distributedInfo"]["rank"] for h in headers] == [0, 1]
    assert {h["distributedInfo"]["world_size"] for h in headers} == {2}
    assert headers[0]["skalpel_run"] == headers[1]["skalpel_run"]  # one run id for the job
    for header in headers:  # each rank's script thread's wait for a core, which straggler_rank weighs
        waited = header["skalpel_run_queue"]
        assert waited["wall_s"] > 0 and 0 <= waited["main_thread_wait_s"] <= waited["wall_s"], waited
    report = _report(folder)
    assert [rank.rank for rank in report.ranks] == [0, 1] and report.source.world_size == 2
    for rank in report.ranks:
        comm = rank.extra["comm"]
        assert comm["timed_on"] == "host"
        all_reduce = next(row for row in comm["by_type"] if row["type"] == "all_reduce")
        assert all_reduce["calls_per_step"] >= 1 and all_reduce["median_bytes"] > 100_000
        assert all_reduce["busbw_gbps"] > 0
        assert rank.extra["distributed"]["matched_collectives"] >= 3
    assert not any("different runs" in warning for warning in report.warnings)


def test_clean_ddp_baseline_is_quiet(runs: dict[str, Path]) -> None:
    """Two ranks with identical work on one loaded machine: no straggler, no network bottleneck, no overlap
    problem (one small DDP bucket per step); when the ranks waited for each other, an info note says why."""
    report = _report(runs["small"])
    # Two ranks, one thread each, cannot be pinned to one core the way the single-process controls are, and share
    # 2 cores with the other jobs of their wave: the machine may say so (cpu_contention) and the step times may
    # spread (noisy_measurement). A first step slowed by the others starting up reads as no_warmup (92% slower,
    # 181 vs 94 ms, beside the wave; absent when the job ran alone): allowed only where the report measured the
    # contention that explains it. Nothing else may warn, measurement findings included (profiler_overhead...).
    ids = {f.id for f in report.findings if f.severity != "info"}
    machine = {"cpu_contention", "noisy_measurement"} | ({"no_warmup"} if "cpu_contention" in ids else set())
    serious = [(f.id, f.severity, f.title) for f in report.findings if f.severity != "info" and f.id not in machine]
    assert not serious
    for contention in [f for f in report.findings if f.id == "cpu_contention"]:
        assert "set_num_threads" not in contention.fix, contention.fix  # each rank asks for one thread already
    for note in [f for f in report.findings if f.id == "straggler_rank"]:
        assert note.title.startswith("No straggler") and "identical work" in note.title
        assert set(note.evidence["comm_share_with_waits_pct_by_rank"]) == {"0", "1"}


def test_planted_straggler_names_rank_1(runs: dict[str, Path]) -> None:
    report = _report(runs["straggler"])
    assert [rank.rank for rank in report.ranks] == [0, 1]
    (finding,) = [f for f in report.findings if f.id == "straggler_rank"]
    assert finding.rank == 1 and finding.evidence["rank"] == 1
    assert finding.evidence["others_wait_ms_per_step"] >= 30  # rank 1 sleeps 60 ms per step
    assert finding.evidence["own_wait_ms_per_step"] < finding.evidence["others_wait_ms_per_step"] / 3
    assert finding.evidence["extra_time_in"] == OUTSIDE_OPS
    assert any("ddp_straggler.py" in where and "load_batch" in where for where in finding.locations)
    assert report.capture is not None and report.capture.exit_status == 0
    assert report.capture.active_steps == 3 and report.capture.profiled_step_ms is not None  # from rank 0's capture


def test_communication_heavy_run_is_communication_bound(runs: dict[str, Path]) -> None:
    report = _report(runs["comm_heavy"])
    found = [f for f in report.findings if f.id == "communication_bound"]
    if found:
        (finding,) = found
        assert finding.evidence["share_pct"] >= 30
        assert "all_reduce" in finding.evidence["collectives"]
    else:
        # On a loaded machine the ranks mostly wait for each other and for a core, and waiting is not
        # transfer: the transfer alone falls under the line, and the waits' share follows the load (one
        # rank's collectives with waits were 22% of its step at load 8). The report must then name the
        # load as the cause: cpu_contention where the process's own run-queue wait is over its line, else
        # straggler_rank's note that the ranks wait for each other as the load falls (CI under xdist: 54%
        # waits, run-queue wait under cpu_contention's line), with each rank's collective share, waits
        # included; and always each rank's figures.
        notes = [f for f in report.findings if f.id == "straggler_rank" and f.severity == "info"]
        for note in notes:
            assert "follows the machine's load" in note.title, note.title
            shares = note.evidence["comm_share_with_waits_pct_by_rank"]
            assert len(shares) == 2 and all(0 < share <= 100 for share in shares.values()), note.title
        named = any(f.id == "cpu_contention" for f in report.findings) or notes
        assert named, [(f.id, f.title) for f in report.findings]
        assert all(0 < rank.extra["comm"]["share_pct"] <= 100 for rank in report.ranks), report.ranks
    rank0 = report.ranks[0].extra["comm"]
    all_reduce = next(row for row in rank0["by_type"] if row["type"] == "all_reduce")
    assert all_reduce["bytes_per_step"] == pytest.approx(4 * 4_208_650, rel=0.01)  # every gradient, once per step


def test_commbench_and_the_comparison_with_a_run(runs: dict[str, Path], tmp_path: Path) -> None:
    table = runs["bench_log"].read_text(errors="replace")
    assert "all_reduce" in table and "busbw (GB/s)" in table
    bench = json.loads(runs["bench"].read_text())
    assert bench["backend"] == "gloo" and bench["ranks"] == 2
    assert {(row["type"], row["nbytes"]) for row in bench["rows"]} == {
        (kind, size) for kind in ("all_reduce", "broadcast") for size in (65536, 262144, 1048576)
    }
    assert all(row["busbw_gbps"] > 0 for row in bench["rows"])
    out = tmp_path / "report.json"
    assert main(["analyze", str(runs["comm_heavy"]), "--commbench", str(runs["bench"]), "--json", str(out)]) == 0
    report = Report.from_json(out.read_bytes())
    row = next(r for r in report.ranks[0].extra["comm"]["by_type"] if r["type"] == "all_reduce")
    assert row["commbench_busbw_gbps"] > 0 and row["vs_commbench_pct"] > 0
    assert row["transfer_vs_commbench_pct"] >= row["vs_commbench_pct"] * 0.999  # the wait taken out
    assert any("compared with commbench (gloo, 2 ranks, cpu)" in w for w in report.warnings)


def test_ranks_reduced_in_workers_give_the_report_of_this_process(runs: dict[str, Path]) -> None:
    # Real gloo ranks with Python stacks and capture facts: the straggler's and the collectives'
    # locations come from the summaries, whichever process made them.
    from skalpel.api import analyze, stored_capture
    from skalpel.job.report_of import report_of

    for name in ("straggler", "comm_heavy", "small"):
        here = report_of(runs[name], capture=stored_capture(runs[name]), workers=1).report
        assert analyze(runs[name], workers=2).to_json() == here.to_json(), name
