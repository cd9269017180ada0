"""The 1 TB case: what one 1 GB rank costs one core, what Ray adds per task, and the projection from them.

    .venv/bin/python benchmarks/projection.py                       # a 1 GB rank, 1,000 ranks on 64 cores
    .venv/bin/python benchmarks/projection.py --size-mb 256 --join-s 1.7 --no-analyze

Measured here, each in a fresh process pinned to one core (``sched_setaffinity``):

- one rank as a worker reduces it (``job.rank.summarize_rank``: load, analyses, the rank's
  rules): seconds (wall and CPU), peak RSS, MB/s, and the size of the summary it sends back
  (pickled), the CPU time of unpickling it (as the driver does) and of pickling its collective
  waits again (as the driver sends them on to be split). On a shared machine the wall
  time includes waiting for the core; the projection
  is printed from both (a cluster's worker has its core to itself: the CPU figure);
- the whole ``skalpel analyze FILE --json OUT`` process of that file (interpreter start to exit),
  unless --no-analyze;
- the driver's join (``job.join.Joining``) of a small job, unless --join-s, in its three parts timed apart:
  each rank's own part as its summary arrives (``Joining.add``: its collectives indexed and paired with the
  reference rank's, its ops a step), what is left after the last summary (``Joining.finish``), and in it each
  rank's collective wait split by late peer (``job.peers``), unless --split-s;
- Ray: the start of a local instance, and a task's round trip (submit, run, fetch a result of the
  summary's size) one after another, the median over --ray-tasks tasks.

The rank is the synthetic trace of ``load_speed.py`` (HTA's df_index_resolver replicated to
--size-mb, in a temporary folder, deleted after). The projection for --ranks ranks of that size
on --cores cores: Ray's start + the longer of ceil(ranks / cores) waves x (rank seconds + Ray's round
trip) and the driver's unpickling of every summary as it arrives (ranks x the measured rank's
summary's unpickle, and its own part of the join, --join-rank-s, which the driver does as it arrives: by default
that join's ``Joining.add`` per collective x the measured rank's collectives) + the last summary's own part +
the rest of the join after the last summary less the split of the waits (--join-s; by default ``Joining.finish``
timed on a job of --join-ranks synthetic ranks of --join-mb, per collective, and scaled to ranks x the measured
rank's collectives: an upper bound, as it scales per-rank constant costs too) + the split of the waits in the
workers, a second
round of tasks (``job.pool.split_on_ray``): the longer of ceil(ranks / cores) waves x (a rank's split,
--split-s, by default that join's split per piece x the measured rank's pieces, + Ray's round trip, measured
with the summary's size, larger than the waits a split task carries) and
the driver's sending of every rank's waits (ranks x the measured rank's waits pickled). Until issue 25
item 5's second round, the split was part of the driver's join and projected with it, on one core; until
``Joining``, every rank's part of the join waited for the last summary too.
Per-worker memory is the rank's peak RSS; the driver
holds every summary (ranks x summary size). Targets (issue 25): under 5
minutes and under 2 GB per worker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
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
done, cpu_s = time.perf_counter(), time.process_time() - cpu
blob = pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)
from skalpel.trace.loader import collector_paused
unpickle = time.process_time()
with collector_paused():  # as the driver receives each rank's summary (job.pool)
    arrived = pickle.loads(blob)
unpickle = time.process_time() - unpickle
send = time.process_time()  # as the driver sends its waits on to a worker to split (job.pool.split_all)
waits = pickle.dumps(arrived.collective_waits, protocol=pickle.HIGHEST_PROTOCOL)
send = time.process_time() - send
print("RANK " + json.dumps({"seconds": done - imported, "import_s": imported - started, "cpu_s": cpu_s,
      "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "failed": type(summary).__name__ != "RankSummary",
      "summary_bytes": len(blob), "unpickle_s": unpickle, "send_s": send, "waits_bytes": len(waits),
      "pieces": arrived.collective_waits.pieces if arrived.collective_waits is not None else 0,
      "collectives": len(summary.comm.for_rank(summary.info.rank).collectives) if summary.comm else 0}), flush=True)
"""

_JOIN_CHILD = """
import json, pickle, sys, time
from pathlib import Path
from skalpel.job.join import Joining
from skalpel.job.peers import split_here
from skalpel.job.rank import SummaryRequest, summarize_rank
paths = [Path(path) for path in sys.argv[1:]]
split_s = []
def timed_split(requests):  # the per-rank part, which the workers run on a large job: timed apart
    started = time.process_time()
    try:
        return split_here(requests)
    finally:
        split_s.append(time.process_time() - started)
blobs = [pickle.dumps(summarize_rank(SummaryRequest(path, len(paths))), protocol=pickle.HIGHEST_PROTOCOL) for path in paths]
from skalpel.trace.loader import collector_paused
joining, summaries, unpickle_s, add_s = Joining(), [], 0.0, 0.0
with collector_paused():  # as the driver receives them (job.pool), each rank's own part of the join as it arrives
    for index, blob in enumerate(blobs):
        started = time.process_time()
        summaries.append(pickle.loads(blob))
        received = time.process_time()
        joining.add(index, summaries[-1])
        unpickle_s, add_s = unpickle_s + received - started, add_s + time.process_time() - received
collectives = sum(len(s.comm.for_rank(s.info.rank).collectives) for s in summaries if s.comm)
pieces = sum(s.collective_waits.pieces for s in summaries if s.collective_waits is not None)
started = time.process_time()
report, kept = joining.finish(split=timed_split)
print("JOIN " + json.dumps({"ranks": len(kept), "collectives": collectives, "unpickle_s": unpickle_s, "add_s": add_s,
      "join_s": time.process_time() - started - sum(split_s), "split_s": sum(split_s), "pieces": pieces}), flush=True)
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
    parser.add_argument("--join-s", type=float, default=None, help="the driver's join of --ranks summaries after the last "
                        "arrived, seconds, less the waits' split; default: measured on --join-ranks ranks of --join-mb and "
                        "scaled by collectives")  # fmt: skip
    parser.add_argument("--join-rank-s", type=float, default=None, help="the driver's own part of the join of one measured "
                        "rank, done as its summary arrives, seconds; default: measured in that join, per collective")  # fmt: skip
    parser.add_argument("--split-s", type=float, default=None, help="a worker's split of the measured rank's waits, "
                        "seconds; default: measured in that join, per piece, and scaled to the rank's pieces")  # fmt: skip
    parser.add_argument("--join-ranks", type=int, default=8, help="ranks of the job whose join is timed (8)")
    parser.add_argument("--join-mb", type=int, default=64, help="size of each of those ranks (64)")
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
        rank = {key: statistics.median(run[key] for run in runs)
                for key in ("seconds", "cpu_s", "import_s", "rss_mib", "summary_bytes", "unpickle_s", "collectives", "pieces",
                            "send_s", "waits_bytes")}  # fmt: skip
        print(f"  worker (summarize_rank): {rank['seconds']:.2f} s ({rank['cpu_s']:.2f} s CPU) + {rank['import_s']:.2f} s "
              f"imports, {size / 1e6 / rank['seconds']:.1f} MB/s ({size / 1e6 / rank['cpu_s']:.1f} MB/s of CPU), peak RSS {rank['rss_mib']:,.0f} MiB "
              f"({rank['rss_mib'] * 2**20 / size:.2f}x the file), summary {rank['summary_bytes'] / 1024:,.0f} KiB "
              f"({rank['collectives']:,} collectives; the driver unpickles it in {1000 * rank['unpickle_s']:.0f} ms), "
              f"{rank['pieces']:,} wait pieces (the driver sends them on, {rank['waits_bytes'] / 1024:,.0f} KiB, "
              f"in {1000 * rank['send_s']:.0f} ms)", flush=True)  # fmt: skip
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
        if args.join_s is None or args.split_s is None or args.join_rank_s is None:
            join_s, join_rank_s, split_s = _join_s(args, folder, int(rank["collectives"]), int(rank["pieces"]))
            args.join_s = join_s if args.join_s is None else args.join_s
            args.join_rank_s = join_rank_s if args.join_rank_s is None else args.join_rank_s
            args.split_s = split_s if args.split_s is None else args.split_s
        _project(args, size, rank, ray)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _join_s(args, folder: Path, collectives: int, pieces: int) -> tuple[float, float, float]:
    """The driver's join of ``args.ranks`` ranks of ``collectives`` each after the last summary arrived
    (``job.join.Joining.finish``: the clock alignment, rank comparison, findings), less the split of each rank's
    waits by late peer, from its CPU time per collective; the driver's own part of one such rank, done as its
    summary arrives (``Joining.add``), from its CPU time per collective; and a worker's split of one rank of
    ``pieces`` wait pieces (``job.peers.split_one``, which the workers run on a large job), from the split's CPU
    time per piece. All measured on a job of --join-ranks
    ranks of --join-mb (copies of one synthetic rank, each with its own rank in the header), reduced and joined
    in one process pinned to one core, the split in it timed apart."""
    source = folder / "join.json"
    made = _run_child("generate", DF_INDEX, {"LOAD_SPEED_TARGET": str(source), "LOAD_SPEED_BYTES": str(args.join_mb << 20)})
    if "error" in made:
        sys.exit(f"could not build the job to join: {made['error']}")
    paths = _rank_copies(source, args.join_ranks)
    joined = _run([sys.executable, "-c", _JOIN_CHILD, *map(str, paths)], "JOIN")
    for path in paths:
        path.unlink()
    if "error" in joined:
        sys.exit(f"the join failed: {joined['error']}")
    per_call = joined["join_s"] / max(joined["collectives"], 1)
    per_call_arriving = joined["add_s"] / max(joined["collectives"], 1)
    per_piece = joined["split_s"] / max(joined["pieces"], 1)
    print(f"  the driver's join: {joined['add_s']:.3f} s CPU as the summaries of {joined['ranks']} ranks of "
          f"{joined['collectives'] // joined['ranks']:,} collectives arrive ({1e6 * per_call_arriving:.2f} us a collective, "
          f"after {1000 * joined['unpickle_s'] / joined['ranks']:.0f} ms a rank unpickling; a rank of {collectives:,}: "
          f"{per_call_arriving * collectives:.3f} s), then {joined['join_s']:.3f} s after the last ({1e6 * per_call:.2f} us a "
          f"collective); {args.ranks:,} ranks x {collectives:,} collectives: {per_call * args.ranks * collectives:.1f} s after the last",
          flush=True)  # fmt: skip
    print(f"  the waits' split by late peer: {joined['split_s']:.2f} s CPU for {joined['pieces']:,} pieces "
          f"({1e6 * per_piece:.2f} us a piece); a rank of {pieces:,}: {per_piece * pieces:.2f} s", flush=True)  # fmt: skip
    return per_call * args.ranks * collectives, per_call_arriving * collectives, per_piece * pieces


def _rank_copies(source: Path, count: int) -> list[Path]:
    """``count`` copies of the rank file ``source``, ranks 0 to count - 1 (in the header, and in the file names)."""
    data = source.read_bytes()
    head = data[: data.index(b'"traceEvents"')]
    paths = []
    for rank in range(count):
        stated = b'"distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}' % (rank, count)
        header = re.sub(rb'"distributedInfo":\s*\{[^}]*\}', stated, head)
        paths.append(source.with_name(f"rank{rank}.json"))
        paths[-1].write_bytes(header + data[len(head):])
    return paths


def _project(args, size: int, rank: dict, ray: dict) -> None:
    for label, key in (("wall time here", "seconds"), ("CPU time (a core to itself)", "cpu_s")):
        _project_from(args, size, rank, ray, label, rank[key])


def _project_from(args, size: int, rank: dict, ray: dict, label: str, rank_s: float) -> None:
    waves = math.ceil(args.ranks / args.cores)
    per_wave = rank_s + rank["import_s"] / waves + ray["task_s"]  # a Ray worker imports once, not per task
    arriving = args.join_rank_s or 0.0  # the driver's own part of each rank's join, as its summary arrives
    join = (args.join_s or 0.0) + arriving  # the last summary's own part waits for it; the rest waits for all
    receive = args.ranks * (rank["unpickle_s"] + arriving)  # the driver unpickles and joins each summary beside the workers
    # The second round: each rank's waits split in a worker, as the driver sends them on (one after another).
    split = max(waves * ((args.split_s or 0.0) + ray["task_s"]), args.ranks * rank["send_s"])
    wall = ray["init_s"] + max(waves * per_wave, receive) + join + split
    total_tb = args.ranks * size / 1e12
    print(f"\nprojection from the rank's {label}: {args.ranks:,} ranks x {size / 2**20:,.0f} MiB ({total_tb:.2f} TB) on {args.cores} cores: "
          f"{waves} waves of {per_wave:.1f} s")  # fmt: skip
    print(f"  wall time {wall:.0f} s ({wall / 60:.1f} min; target under {TARGET_S / 60:.0f} min): Ray start {ray['init_s']:.1f} s "
          f"+ the longer of the workers' {waves} x {per_wave:.1f} s and the driver's receiving and joining {args.ranks:,} x "
          f"({rank['unpickle_s']:.3f} + {arriving:.3f}) s = {receive:.0f} s, + join after the last {join:.1f} s + the split in the workers {split:.1f} s "
          f"(the longer of {waves} x ({args.split_s or 0.0:.2f} s + a Ray round trip) and the driver's sending "
          f"{args.ranks:,} x {rank['send_s']:.3f} s)")  # fmt: skip
    print(f"  per worker: peak RSS {rank['rss_mib']:,.0f} MiB (target under {TARGET_WORKER_MIB:,.0f} MiB); "
          f"driver: {args.ranks:,} summaries of {rank['summary_bytes'] / 1024:,.0f} KiB = "
          f"{args.ranks * rank['summary_bytes'] / 2**20:,.0f} MiB pickled")  # fmt: skip
    verdict = "meets" if wall < TARGET_S and rank["rss_mib"] < TARGET_WORKER_MIB else "misses"
    left = (TARGET_S - ray["init_s"] - join - split) / waves - ray["task_s"]  # seconds a rank may take
    needed = f"MB/s per core needed for {TARGET_S / 60:.0f} min: {size / 1e6 / left:.0f}" if left > 0 else (
        f"Ray's start and the join alone take {ray['init_s'] + join + split:.0f} s of the {TARGET_S:.0f}")
    print(f"  {verdict} the targets; {needed}")


if __name__ == "__main__":
    main()
