"""Cost of the distributed analyses (collectives, rank comparison) against loading the same trace.

    .venv/bin/python benchmarks/distributed_analysis.py

Prints, per stored multi-rank or NCCL trace, the median over repeats of: load time, the
collectives analysis (analysis/comm.py), the rank comparison (analysis/ranks.py), and
their ratio to the load time measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from skalpel.analysis.comm import analyze_comm
from skalpel.analysis.rankprofile import time_profile
from skalpel.analysis.ranks import compare_ranks
from skalpel.analysis.steps import segment_steps
from skalpel.trace.loader import load

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
CASES = (
    "extra/facebookresearch__param/et_replay/tests/inputs/dlrm_kineto_extracted",
    "hta/trace_filter",
    "hta/trace_diff/control/control.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
)
REPEATS = 3


def _median_s(work) -> tuple[float, object]:
    times, result = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    print(f"{'trace':<48} {'events':>9} {'load s':>8} {'comm s':>8} {'ranks s':>8} {'(comm+ranks)/load':>18}")
    for case in CASES:
        path = TRACES / case
        if not path.exists():
            print(f"{case:<48} missing")
            continue
        load_s, trace = _median_s(lambda: load(path))
        steps = segment_steps(trace)
        comm_s, comm = _median_s(lambda: analyze_comm(trace, steps))
        profiles = {rank: time_profile(trace, steps, comm, rank) for rank in trace.rank_ids}
        ranks_s, _ = _median_s(lambda: compare_ranks(trace.ranks, steps, comm, profiles=profiles))
        print(f"{case[-48:]:<48} {len(trace):>9,} {load_s:>8.3f} {comm_s:>8.3f} {ranks_s:>8.3f} {(comm_s + ranks_s) / load_s:>18.2f}")


if __name__ == "__main__":
    main()
