"""A job of many ranks: time and peak memory of `skalpel analyze`, rank by rank in workers vs whole.

    .venv/bin/python benchmarks/many_ranks.py                  # N=64 ranks, ~6 MB each (~370 MB of JSON)
    .venv/bin/python benchmarks/many_ranks.py --ranks 16 --copies 2 --no-ray

The job is built from the 8-rank DLRM step of the corpus (param et_replay): rank r is a copy
of DLRM rank r % 8 with its header saying rank r of N, and its events repeated --copies times
(shifted in time, ids and step numbers by the same amounts on every rank, so collectives
still match across ranks). Written to a temporary folder, deleted after.

Each configuration runs in a fresh process: "whole" is the single-process path of before
(every rank loaded into one trace, then analysed); "workers K" reduces the ranks in K worker
processes (1: one after another in the driver) and joins the summaries; "ray" does the same
as Ray tasks on a local instance it starts (its start-up included). Peak memory is the
largest sum of the resident memory of the process and all its descendants (workers, Ray's
processes), as proportional set size (pages shared by workers split among them), sampled
every 20 ms from /proc. Medians over --repeats runs, interleaved; the
reports of every configuration are checked equal to the whole one's.
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
if mode == "whole":
    from skalpel.job.build import build_report
    from skalpel.trace.loader import load
    report = build_report(load([paths]))
else:
    from skalpel.api import analyze
    report = analyze([paths], workers=None if mode in ("all", "ray") else int(mode), ray=(mode == "ray"))
open(sys.argv[3], "wb").write(report.to_json())
"""


def _tree_memory(root: int) -> int:
    """Proportional set size (shared pages split among their sharers) of ``root`` and its descendants, bytes.

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
    return sum(_pss(pid) for pid in members)


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
        peak = 0
        while child.poll() is None:
            peak = max(peak, _tree_memory(child.pid))
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        err.seek(0)
        message = err.read().decode(errors="replace").strip().splitlines()
    if child.returncode != 0:
        return {"error": (message or [f"exit {child.returncode}"])[-1]}
    out = report.read_bytes()
    report.unlink()
    return {"seconds": seconds, "peak_mib": peak / 2**20, "report": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64, help="ranks in the job (64)")
    parser.add_argument("--copies", type=int, default=6, help="times each rank's events are repeated (6: ~6 MB a rank)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (3)")
    parser.add_argument("--no-ray", action="store_true", help="leave out the local Ray instance")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    modes = ["whole", "1", "2", "all"] + ([] if args.no_ray else ["ray"])
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
        whole = runs["whole"][0].get("report")
        base = statistics.median(r["seconds"] for r in runs["whole"] if "seconds" in r)
        base_mem = statistics.median(r["peak_mib"] for r in runs["whole"] if "peak_mib" in r)
        print(f"{'configuration':<14}{'seconds':>9}{'/whole':>8}{'peak PSS MiB':>14}{'/whole':>8}{'MiB/rank':>10}  report")
        for mode in modes:
            done = [r for r in runs[mode] if "error" not in r]
            if not done:
                print(f"{_label(mode, cores):<14}  {runs[mode][0]['error']}")
                continue
            seconds = statistics.median(r["seconds"] for r in done)
            peak = statistics.median(r["peak_mib"] for r in done)
            same = "same" if all(r["report"] == whole for r in done) else "DIFFERENT"
            print(f"{_label(mode, cores):<14}{seconds:9.2f}{seconds / base:8.2f}{peak:14,.0f}{peak / base_mem:8.2f}"
                  f"{peak / args.ranks:10.1f}  {same}")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _label(mode: str, cores: int) -> str:
    return {"whole": "whole (before)", "1": "workers 1", "2": "workers 2", "all": f"workers {cores} (all)", "ray": "ray (local)"}[mode]


if __name__ == "__main__":
    main()
