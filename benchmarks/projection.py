"""The 1 TB case: what one 1 GB rank costs one core, what Ray adds per task, and the projection from them.

    .venv/bin/python benchmarks/projection.py                       # a 1 GB rank, 1,000 ranks on 64 cores
    .venv/bin/python benchmarks/projection.py --size-mb 256 --join-s 1.7 --no-analyze

Measured here, each in a fresh process pinned to one core (``sched_setaffinity``):

- one rank as a worker reduces it (``job.rank.summarize_rank``: load, analyses, the rank's
  rules): seconds (wall and CPU), peak RSS, MB/s, and the size of the summary it sends back
  (pickled). On a shared machine the wall time includes waiting for the core; the projection
  is printed from both (a cluster's worker has its core to itself: the CPU figure);
- the whole ``skalpel analyze FILE --json OUT`` process of that file (interpreter start to exit),
  unless --no-analyze;
- Ray: the start of a local instance, and a task's round trip (submit, run, fetch a result of the
  summary's size) one after another, the median over --ray-tasks tasks.

The rank is the synthetic trace of ``load_speed.py`` (HTA's df_index_resolver replicated to
--size-mb, in a temporary folder, deleted after). The projection for --ranks ranks of that size
on --cores cores: Ray's start + ceil(ranks / cores) waves x (rank seconds + Ray's round trip) +
the driver's join of the summaries (--join-s; by default its rank comparison, which grows as ranks x
collectives a rank: timed on 64 in-memory ranks with as many collectives as the measured rank has,
and scaled). Per-worker memory is the rank's peak RSS; the driver holds every summary (ranks x
summary size). Targets (issue 25): under 5
minutes and under 2 GB per worker.
"""

from __future__ import annotations

import argparse
import json
import math
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
from load_speed import DF_INDEX, _run_child, _with_bytecode  # noqa: E402

TARGET_S, TARGET_WORKER_MIB = 300.0, 2048.0

_RANK_CHILD = """
import json, pickle, resource, sys, time
started = time.perf_counter()
from pathlib import Path
from skalpel.job.rank import SummaryRequest, summarize_rank
imported, cpu = time.perf_counter(), time.process_time()
summary = summarize_rank(SummaryRequest(Path(sys.argv[1]), int(sys.argv[2])))
done = time.perf_counter()
print("RANK " + json.dumps({"seconds": done - imported, "import_s": imported - started, "cpu_s": time.process_time() - cpu,
      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "failed": type(summary).__name__ != "RankSummary",
      "summary_bytes": len(pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)),
      "collectives": len(summary.comm.for_rank(summary.info.rank).collectives) if summary.comm else 0}), flush=True)
"""

_RAY_CHILD = """
import json, statistics, sys, time
tasks, payload = int(sys.argv[1]), int(sys.argv[2])
import ray
started = time.perf_counter()
ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=1)
init_s = time.perf_counter() - started

@ray.remote(max_retries=1, retry_exceptions=False)
def echo(size):
    return b"x" * size

ray.get(echo.remote(payload))  # the first task starts a worker process: not a per-task cost
trips = []
for _ in range(tasks):
    started = time.perf_counter()
    ray.get(echo.remote(payload))
    trips.append(time.perf_counter() - started)
print("RAY " + json.dumps({"init_s": init_s, "task_s": statistics.median(trips), "task_p90_s": sorted(trips)[int(0.9 * len(trips))]}), flush=True)
ray.shutdown()
"""


def _one_core() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _run(command: list[str], tag: str, env: dict | None = None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env={**_with_bytecode(), **(env or {})}, preexec_fn=_one_core)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(tag + " ")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(line.split(" ", 1)[1])


def _analyze(path: Path) -> dict:
    """The whole `skalpel analyze` process on one core: wall time and peak RSS (wait4: its own and its children's)."""
    command = [sys.executable, "-m", "skalpel", "analyze", str(path), "--json", os.devnull]
    env = {**_with_bytecode(), "SKALPEL_LOAD_PROCESSES": "1", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=_one_core)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    errors = child.stderr.read().decode(errors="replace").strip().splitlines()
    if child.returncode != 0:
        return {"error": (errors or [f"exit {child.returncode}"])[-1]}
    return {"seconds": seconds, "rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the measured rank (1024)")
    parser.add_argument("--ranks", type=int, default=1000, help="ranks of the projected job (1000)")
    parser.add_argument("--cores", type=int, default=64, help="cores of the projected cluster (64)")
    parser.add_argument("--join-s", type=float, default=None, help="the driver's join of --ranks summaries, seconds; "
                        "default: its rank comparison, estimated from the rank's collectives")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="runs of the rank (1; the median is used)")
    parser.add_argument("--ray-tasks", type=int, default=50, help="Ray round trips timed (50)")
    parser.add_argument("--no-analyze", action="store_true", help="do not time the whole `skalpel analyze` process")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray out (its cost then counts as zero)")
    parser.add_argument("--trace", type=Path, help="measure this rank file instead of building one")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="skalpel_projection_"))
    try:
        path = args.trace
        if path is None:
            path = folder / "rank0.json"
            made = _run_child("generate", DF_INDEX, {"LOAD_SPEED_TARGET": str(path), "LOAD_SPEED_BYTES": str(args.size_mb << 20)})
            if "error" in made:
                sys.exit(f"could not build the rank: {made['error']}")
        size = path.stat().st_size
        print(f"rank: {path.name}, {size / 2**20:,.0f} MiB; one core per process; {os.cpu_count()} cores here", flush=True)
        runs = [_run([sys.executable, "-c", _RANK_CHILD, str(path), str(args.ranks)], "RANK") for _ in range(args.repeats)]
        if any("error" in run for run in runs):
            sys.exit(f"the rank failed: {next(run['error'] for run in runs if 'error' in run)}")
        rank = {key: statistics.median(run[key] for run in runs) for key in ("seconds", "cpu_s", "import_s", "rss_mib", "summary_bytes", "collectives")}
        print(f"  worker (summarize_rank): {rank['seconds']:.2f} s ({rank['cpu_s']:.2f} s CPU) + {rank['import_s']:.2f} s "
              f"imports, {size / 1e6 / rank['seconds']:.1f} MB/s ({size / 1e6 / rank['cpu_s']:.1f} MB/s of CPU), peak RSS {rank['rss_mib']:,.0f} MiB "
              f"({rank['rss_mib'] * 2**20 / size:.2f}x the file), summary {rank['summary_bytes'] / 1024:,.0f} KiB", flush=True)  # fmt: skip
        if not args.no_analyze:
            whole = _analyze(path)
            if "error" in whole:
                print(f"  skalpel analyze: {whole['error']}")
            else:
                print(f"  whole `skalpel analyze` process: {whole['seconds']:.2f} s, {size / 1e6 / whole['seconds']:.1f} MB/s, "
                      f"peak RSS {whole['rss_mib']:,.0f} MiB ({whole['rss_mib'] * 2**20 / size:.2f}x)", flush=True)  # fmt: skip
        ray = {"init_s": 0.0, "task_s": 0.0}
        if not args.no_ray:
            measured = _run([sys.executable, "-c", _RAY_CHILD, str(args.ray_tasks), str(int(rank["summary_bytes"]))], "RAY")
            if "error" in measured:
                print(f"  Ray: {measured['error']} (left out)")
            else:
                ray = measured
                print(f"  Ray: local start {ray['init_s']:.2f} s; a task's round trip with a {rank['summary_bytes'] / 1024:,.0f} KiB "
                      f"result {1000 * ray['task_s']:.1f} ms (p90 {1000 * ray['task_p90_s']:.1f} ms)", flush=True)  # fmt: skip
        if args.join_s is None:
            args.join_s = _comparison_s(args.ranks, int(rank["collectives"]))
        _project(args, size, rank, ray)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _comparison_s(ranks: int, collectives: int) -> float:
    """The driver's rank comparison of ``ranks`` ranks of ``collectives`` each, from its cost per collective on a
    job of 64 such ranks built in memory (``tests/rankjob.py``): the part of the join that grows with the ranks' size."""
    sys.path.insert(0, str(HERE.parent))
    from skalpel.analysis.ranks import compare_ranks
    from tests.rankjob import Plan, build_job

    job = build_job(Plan(64, steps=max(1, math.ceil(collectives / 3))))
    started = time.process_time()
    compare_ranks(job.trace, job.steps, job.comm, profiles=job.profiles)
    per_call = (time.process_time() - started) / sum(len(rank.collectives) for rank in job.comm.ranks)
    print(f"  the driver's rank comparison: {1e6 * per_call:.1f} us a collective (64 in-memory ranks of {collectives:,}); "
          f"{ranks:,} ranks x {collectives:,} collectives: {per_call * ranks * collectives:.0f} s", flush=True)  # fmt: skip
    return per_call * ranks * collectives


def _project(args, size: int, rank: dict, ray: dict) -> None:
    for label, key in (("wall time here", "seconds"), ("CPU time (a core to itself)", "cpu_s")):
        _project_from(args, size, rank, ray, label, rank[key])


def _project_from(args, size: int, rank: dict, ray: dict, label: str, rank_s: float) -> None:
    waves = math.ceil(args.ranks / args.cores)
    per_wave = rank_s + rank["import_s"] / waves + ray["task_s"]  # a Ray worker imports once, not per task
    join = args.join_s or 0.0
    wall = ray["init_s"] + waves * per_wave + join
    total_tb = args.ranks * size / 1e12
    print(f"\nprojection from the rank's {label}: {args.ranks:,} ranks x {size / 2**20:,.0f} MiB ({total_tb:.2f} TB) on {args.cores} cores: "
          f"{waves} waves of {per_wave:.1f} s")  # fmt: skip
    print(f"  wall time {wall:.0f} s ({wall / 60:.1f} min; target under {TARGET_S / 60:.0f} min): "
          f"Ray start {ray['init_s']:.1f} s + {waves} x {per_wave:.1f} s + join {join:.1f} s"
          + " (the rank comparison, estimated; --join-s to give a measured join)")  # fmt: skip
    print(f"  per worker: peak RSS {rank['rss_mib']:,.0f} MiB (target under {TARGET_WORKER_MIB:,.0f} MiB); "
          f"driver: {args.ranks:,} summaries of {rank['summary_bytes'] / 1024:,.0f} KiB = "
          f"{args.ranks * rank['summary_bytes'] / 2**20:,.0f} MiB pickled")  # fmt: skip
    verdict = "meets" if wall < TARGET_S and rank["rss_mib"] < TARGET_WORKER_MIB else "misses"
    left = (TARGET_S - ray["init_s"] - join) / waves - ray["task_s"]  # seconds a rank may take
    needed = f"MB/s per core needed for {TARGET_S / 60:.0f} min: {size / 1e6 / left:.0f}" if left > 0 else (
        f"Ray's start and the join alone take {ray['init_s'] + join:.0f} s of the {TARGET_S:.0f}")
    print(f"  {verdict} the targets; {needed}")


if __name__ == "__main__":
    main()
