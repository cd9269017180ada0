"""A job of many ranks: time and peak memory of `skalpel analyze`, rank by rank in workers or on Ray.

    .venv/bin/python benchmarks/many_ranks.py                  # N=64 ranks, ~6 MB each (~370 MB of JSON)
    .venv/bin/python benchmarks/many_ranks.py --ranks 16 --copies 2 --no-ray
    .venv/bin/python benchmarks/many_ranks.py --ranks 1000 --copies 1 --modes all,ray --repeats 1   # 1,000 small ranks
    .venv/bin/python benchmarks/many_ranks.py --cross-rank     # the rank comparison alone, 125 to 1,000 ranks in memory

The job is built from the 8-rank DLRM step of the corpus (param et_replay): rank r is a copy
of DLRM rank r % 8 with its header saying rank r of N, and its events repeated --copies times
(shifted in time, ids and step numbers by the same amounts on every rank, so collectives
still match across ranks). Written to a temporary folder, deleted after.

Each configuration runs in a fresh process: "workers K" reduces the ranks in K worker
processes (1: one after another in the driver) and joins the summaries; "ray" does the same
as Ray tasks on a local instance it starts (its start-up included). (A "whole" mode, every rank
loaded into one trace, timed the road that was deleted with issue 34.) Peak memory is the
largest sum of the resident memory of the process and all its descendants (workers, Ray's
processes), as proportional set size (pages shared by workers split among them), sampled
every 20 ms from /proc (every 200 ms past 100 processes); beside it, the peak of the driver
alone, of the largest worker (a pool's process or a Ray worker) and of Ray's own processes
(raylet, GCS). "own s" is the driver's join of each rank's own part as its summary arrives
(``job.join.Joining.add``, beside the workers), "join s" the rest after the last (``Joining.finish``).
Medians over --repeats runs, interleaved; the reports of every configuration are checked
equal to the first configuration's.

``--cross-rank`` times ``analysis.ranks.compare_ranks`` alone on jobs built in memory
(``tests/rankjob.py``: 8 ranks a host, 4 steps, 3 collectives a step), from 125 to --ranks
ranks, then 8 ranks of 300 to 4,800 collectives: it must grow as ranks x collectives, not as the
square of either.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from load_speed import _max_id, _shift, _step, _with_bytecode  # noqa: E402 - the same replication as the synthetic trace

REPO = HERE.parent
DLRM = REPO.parent / "shared" / "traces" / "extra" / "facebookresearch__param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto_extracted"


def build_job(folder: Path, ranks: int, copies: int) -> int:
    """Write ``ranks`` rank files into ``folder``; returns their total size in bytes."""
    sources = sorted(DLRM.glob("worker*.json.gz"))
    if not sources:
        sys.exit(f"the DLRM corpus traces are not in {DLRM}")
    documents = [json.loads(gzip.decompress(path.read_bytes())) for path in sources]
    spans, ids, steps = [], [], []
    for document in documents:
        events = [e for e in document["traceEvents"] if isinstance(e, dict)]
        times = [(e["ts"], e.get("dur", 0) or 0) for e in events if isinstance(e.get("ts"), (int, float))]
        spans.append(max(ts + dur for ts, dur in times) - min(ts for ts, _ in times))
        ids.append(1 + max([_max_id(e) for e in events] + [0]))
        steps.append(1 + max([_step(e.get("name")) for e in events] + [0]))
    time_step, id_step, step_step = max(spans) * 1.01 + 1000, max(ids), max(steps)  # one schedule for every rank
    total = 0
    for rank in range(ranks):
        document = dict(documents[rank % len(documents)])
        events = [e for e in document["traceEvents"] if isinstance(e, dict)]
        document["traceEvents"] = [_shift(e, copy, time_step, id_step, step_step) for copy in range(copies) for e in events]
        document["distributedInfo"] = {**document.get("distributedInfo", {}), "rank": rank, "world_size": ranks}
        path = folder / f"rank{rank}.json"
        path.write_text(json.dumps(document))
        total += path.stat().st_size
    return total


_CHILD = """
import json, sys, time
paths, mode = sys.argv[1:3]
joined, own = [], []
from skalpel.api import analyze
from skalpel.job.join import Joining
def timed(method, into):
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - started)
    return run
Joining.add, Joining.finish = timed(Joining.add, own), timed(Joining.finish, joined)
report = analyze([paths], workers=None if mode in ("all", "ray") else int(mode), ray=(mode == "ray"))
open(sys.argv[3], "wb").write(report.to_json())
print("JOIN_S " + json.dumps([sum(own), sum(joined)]), file=sys.stderr, flush=True)
"""


def _tree_memory(root: int) -> dict[int, int]:
    """Proportional set size (shared pages split among their sharers) of ``root`` and each descendant, bytes by pid.

    PSS rather than RSS: forked workers share the pages of the imported modules, which RSS
    would count once per worker."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    members, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return {pid: _pss(pid) for pid in members}


_RAY_SERVICES = (b"raylet", b"gcs_server", b"dashboard", b"log_monitor", b"monitor.py", b"runtime_env", b"ray_client")


def _role(pid: int, root: int) -> str:
    """'driver', 'worker' (a pool's process or a Ray task's worker) or 'ray' (Ray's own services)."""
    if pid == root:
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except OSError:
        return "worker"
    if b"default_worker" in command or b"ray::" in command:
        return "worker"
    return "ray" if any(name in command for name in _RAY_SERVICES) else "worker"


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(folder: Path, mode: str) -> dict:
    env = {**_with_bytecode(), "OMP_NUM_THREADS": "1"}
    report = folder.parent / f"{folder.name}-report.json"
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder), mode, str(report)], stderr=err, env=env)
        peak, by_pid, roles = 0, {}, {}
        while child.poll() is None:
            sample = _tree_memory(child.pid)
            peak = max(peak, sum(sample.values()))
            for pid, size in sample.items():
                by_pid[pid] = max(by_pid.get(pid, 0), size)
                if pid not in roles:
                    roles[pid] = _role(pid, child.pid)
            time.sleep(0.02 if len(sample) < 100 else 0.2)
        seconds = time.perf_counter() - started
        err.seek(0)
        message = err.read().decode(errors="replace").strip().splitlines()
    if child.returncode != 0:
        return {"error": (message or [f"exit {child.returncode}"])[-1]}
    out = report.read_bytes()
    report.unlink()
    joined = next((json.loads(line.split(" ", 1)[1]) for line in message if line.startswith("JOIN_S ")), [None, None])
    of = lambda role: [size for pid, size in by_pid.items() if roles[pid] == role]  # noqa: E731
    return {
        "seconds": seconds, "peak_mib": peak / 2**20, "driver_mib": max(of("driver"), default=0) / 2**20,
        "worker_mib": max(of("worker"), default=0) / 2**20, "workers": len(of("worker")),
        "ray_mib": sum(of("ray")) / 2**20, "own_s": joined[0], "join_s": joined[1], "report": out,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64, help="ranks in the job (64)")
    parser.add_argument("--copies", type=int, default=6, help="times each rank's events are repeated (6: ~6 MB a rank)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (3)")
    parser.add_argument("--no-ray", action="store_true", help="leave out the local Ray instance")
    parser.add_argument("--modes", default="1,2,all,ray", help="configurations, in order (1,2,all,ray)")
    parser.add_argument("--cross-rank", action="store_true", help="time the rank comparison alone, 125 to --ranks ranks")
    args = parser.parse_args()
    if args.cross_rank:
        _cross_rank(args.ranks if args.ranks != 64 else 1000)
        return
    cores = len(os.sched_getaffinity(0))
    modes = [mode for mode in args.modes.split(",") if not (args.no_ray and mode == "ray")]
    folder = Path(tempfile.mkdtemp(prefix="skalpel_many_ranks_"))
    try:
        size = build_job(folder, args.ranks, args.copies)
        print(f"{args.ranks} ranks, {size / 2**20:,.0f} MiB of JSON ({size / args.ranks / 2**20:.1f} MiB a rank); "
              f"{cores} cores; medians of {args.repeats} runs", flush=True)  # fmt: skip
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode in modes:
                runs[mode].append(run(folder, mode))
                print(f"  {mode}: " + json.dumps({k: round(v, 2) for k, v in runs[mode][-1].items() if k != "report"}),
                      file=sys.stderr, flush=True)  # fmt: skip
        first = runs[modes[0]]
        reference = first[0].get("report")
        base = statistics.median([r["seconds"] for r in first if "seconds" in r] or [float("nan")])
        base_mem = statistics.median([r["peak_mib"] for r in first if "peak_mib" in r] or [float("nan")])
        print(f"{'configuration':<14}{'seconds':>9}{'/first':>8}{'peak PSS MiB':>14}{'/first':>8}{'MiB/rank':>10}"
              f"{'driver':>8}{'worker':>8}{'workers':>8}{'Ray svc':>8}{'own s':>8}{'join s':>8}  report")  # fmt: skip
        for mode in modes:
            done = [r for r in runs[mode] if "error" not in r]
            if not done:
                print(f"{_label(mode, cores):<14}  {runs[mode][0]['error']}")
                continue
            med = lambda key: statistics.median(r[key] for r in done)  # noqa: E731
            seconds, peak = med("seconds"), med("peak_mib")
            same = "same" if all(r["report"] == reference for r in done) else "DIFFERENT"
            join_s = (f"{med('own_s'):8.2f}{med('join_s'):8.2f}" if all(r["join_s"] is not None for r in done)
                      else f"{'':16}")  # fmt: skip
            print(f"{_label(mode, cores):<14}{seconds:9.2f}{seconds / base:8.2f}{peak:14,.0f}{peak / base_mem:8.2f}"
                  f"{peak / args.ranks:10.1f}{med('driver_mib'):8,.0f}{med('worker_mib'):8,.0f}{med('workers'):8.0f}"
                  f"{med('ray_mib'):8,.0f}{join_s}  {same}")  # fmt: skip
        print("(MiB of PSS: driver = the analysing process alone; worker = the largest worker; Ray svc = Ray's services)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _cross_rank(largest: int) -> None:
    """compare_ranks alone on in-memory jobs of growing size, with a planted straggler and slow pair."""
    sys.path.insert(0, str(REPO))
    from skalpel.analysis.ranks import compare_ranks
    from tests.rankjob import Plan, build_job

    print(f"{'ranks':>6}{'collectives':>13}{'seconds':>9}{'us/(rank x coll.)':>19}  straggler, slow pair found")
    ranks = 125
    while ranks <= largest:
        job = build_job(Plan(ranks, straggler=ranks // 3, slow_pair=(ranks // 2, ranks // 2 + 1)))
        collectives = len(job.comm.ranks[0].collectives)
        times = []
        for _ in range(3):
            started = time.process_time()
            comparison = compare_ranks(job.trace.ranks, job.steps, job.comm, profiles=job.profiles)
            [comparison.summary_of(rank) for rank in range(ranks)]  # the join asks each rank's figures
            times.append(time.process_time() - started)
        seconds = statistics.median(times)
        send = {t.rank: t.transfer_busbw_gbps["send_recv"] for t in comparison.ranks}
        typical = statistics.median(send.values())
        slow = sorted(rank for rank, value in send.items() if value < typical / 2)
        found = comparison.straggler.rank == ranks // 3 and slow == [ranks // 2, ranks // 2 + 1]
        print(f"{ranks:6d}{collectives:13d}{seconds:9.3f}{1e6 * seconds / ranks / collectives:19.1f}  {'yes' if found else 'NO'}")
        ranks *= 2
    for steps in (100, 400, 1600):  # long runs of collectives of one size: matching must stay linear in them too
        job = build_job(Plan(8, steps=steps, straggler=3))
        started = time.process_time()
        comparison = compare_ranks(job.trace.ranks, job.steps, job.comm, profiles=job.profiles)
        seconds = time.process_time() - started
        collectives = len(job.comm.ranks[0].collectives)
        print(f"{8:6d}{collectives:13d}{seconds:9.3f}{1e6 * seconds / 8 / collectives:19.1f}  "
              f"{'yes' if comparison.straggler.rank == 3 else 'NO'} (straggler only)")


def _label(mode: str, cores: int) -> str:
    return {"1": "workers 1", "2": "workers 2", "all": f"workers {cores} (all)", "ray": "ray (local)"}[mode]


if __name__ == "__main__":
    main()
