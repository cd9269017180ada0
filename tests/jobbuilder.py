"""A synthetic job of many small ranks with planted behaviours, for the tests of a job's report.

Each rank records ``steps`` steps: host work (an op, with its compute kernel launched), then an
NCCL all_reduce whose kernel starts when the rank is ready and ends when the last rank of the
job is (plus the transfer): the collective waits of a synchronous job. Ranks are described by a
``RankKind`` (compute and host work per step, in us); ``kinds`` maps a rank to its kind, so a
test plants groups (two kinds of ranks), a straggler (one rank with more compute: the others
wait for it) or a slow link (one rank whose transfer takes longer: every rank says it runs on one
host, so the clocks are not aligned on the collectives' ends). Steps start on a common
schedule, so a rank's lateness in one step does not move the next.

The same idea as ``benchmarks/many_ranks.py`` (ranks that are copies with their header's rank
and world size rewritten), built from ``tracebuilder`` rather than the corpus: small, fast, known.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .tracebuilder import TraceBuilder

ORIGIN_US = 1_700_000_000_000_000.0  # an epoch timestamp, as torch.profiler writes them
PERIOD_US = 60_000.0  # one step every 60 ms on every rank


@dataclass(frozen=True)
class RankKind:
    compute_us: float = 8_000.0  # the step's compute kernel
    host_us: float = 1_000.0  # host work before the launch (the device idles)
    transfer_us: float = 1_000.0  # the all_reduce after the last rank arrived
    extra_transfer_us: float = 0.0  # a slow link: this rank's transfer takes this much longer


def build_job(folder: Path, ranks: int, kind_of: Callable[[int], RankKind], *, steps: int = 4, job: str = "job-a",
              name: str = "rank{rank}.json") -> list[Path]:  # fmt: skip
    """Write ``ranks`` rank files into ``folder``; rank r behaves as ``kind_of(r)``."""
    folder.mkdir(parents=True, exist_ok=True)
    kinds = [kind_of(rank) for rank in range(ranks)]
    ready = [kind.host_us + 50.0 + kind.compute_us for kind in kinds]  # from the step's start
    last = max(ready)
    paths = []
    for rank, kind in enumerate(kinds):
        builder = TraceBuilder()
        builder.header = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks}, "skalpel_run": job,
                          "host_name": "node0"}  # one host, one clock: collective ends are taken as recorded
        for step in range(steps):
            start = ORIGIN_US + step * PERIOD_US
            end = start + last + kind.transfer_us + kind.extra_transfer_us + 100.0
            builder.step(step, start, end - start)
            launch_at = start + kind.host_us
            op = builder.host("aten::mm", start + 10.0, kind.host_us + 20.0)
            builder.launch(launch_at, 20.0, work_ts=launch_at + 50.0, work_dur=kind.compute_us, external=op)
            arrive = start + ready[rank] + 10.0
            comm = builder.host("nccl:all_reduce", arrive - 5.0, 30.0, **{
                "Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "Float",
                "Group size": ranks})  # fmt: skip
            builder.launch(arrive - 5.0, 10.0, work_ts=arrive, work_dur=end - 100.0 - arrive, external=comm,
                           kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL")  # fmt: skip
        paths.append(builder.write(folder / name.format(rank=rank)))
    return paths


TWO_KINDS = (RankKind(), RankKind(compute_us=4_000.0, host_us=5_000.0))  # compute-heavy, host-heavy


def planted(ranks: int = 24, *, straggler: int = 5, slow_link: int = 17) -> Callable[[int], RankKind]:
    """Two kinds of ranks (the first half compute-heavy, the second host-heavy), a straggler and a slow link."""

    def kind_of(rank: int) -> RankKind:
        kind = TWO_KINDS[0] if rank < ranks // 2 else TWO_KINDS[1]
        if rank == straggler:
            return RankKind(compute_us=kind.compute_us + 6_000.0, host_us=kind.host_us)
        if rank == slow_link:
            return RankKind(compute_us=kind.compute_us, host_us=kind.host_us, extra_transfer_us=6_000.0)
        return kind

    return kind_of
