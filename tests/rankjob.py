"""A job of many ranks built in memory, for the cross-rank analyses (no trace files, no loading).

Each rank runs ``steps`` steps of 100 ms: compute, then two all_reduces that end together on
every rank (the last arrival decides when), then a send/recv with its neighbour (ranks 2i and
2i+1 are pairs). Ranks sit ``per_host`` to a host, and each host's clock is off by its own
planted offset. What can be planted: a straggler (reaches every all_reduce ``late_ms`` later,
spending the time in compute) and a slow pair (their send/recv takes ``slow_factor`` times
as long). Small per-rank jitter keeps ties apart, the same on every build.

``build_job`` returns what ``analysis.ranks.compare_ranks`` reads when the ranks were
reduced one by one: the JobFacts of the ranks, the steps, the communication and the profiles.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from skalpel.analysis.bundle import JobFacts
from skalpel.analysis.collectives import Collective
from skalpel.analysis.comm import CommAnalysis, RankComm
from skalpel.analysis.rankprofile import Profile
from skalpel.analysis.steps import Step, StepSegmentation
from skalpel.trace.model import RankInfo

STEP_US = 100_000.0
ALL_REDUCE_BYTES = 64 << 20
SEND_BYTES = 16 << 20


@dataclass
class Plan:
    ranks: int
    steps: int = 4
    per_host: int = 8
    straggler: int | None = None
    late_ms: float = 6.0
    slow_pair: tuple[int, int] | None = None
    slow_factor: float = 10.0


@dataclass
class Job:
    trace: JobFacts
    steps: StepSegmentation
    comm: CommAnalysis
    profiles: dict[int, Profile]
    host_offsets_us: dict[int, float]  # planted: rank -> its host's clock offset against rank 0's


def build_job(plan: Plan) -> Job:
    jitter = random.Random(25)
    infos, steps, comms, profiles, offsets = [], [], [], {}, {}
    for rank in range(plan.ranks):
        host = rank // plan.per_host
        offset = 0.0 if host == 0 else 1000.0 * host + 137.0  # us; the reference host's clock is the job's
        offsets[rank] = offset
        infos.append(RankInfo(rank=rank, path=f"rank{rank}.json", world_size=plan.ranks, backend="nccl",
                              host=f"node{host}"))  # fmt: skip
        late = plan.late_ms * 1000.0 if rank == plan.straggler else 0.0
        send_us = 2000.0 * (plan.slow_factor if plan.slow_pair and rank in plan.slow_pair else 1.0)
        calls = []
        for number in range(plan.steps):
            base = number * STEP_US
            steps.append(Step(rank, number + 1, base + offset, base + 90_000.0 + offset, base + STEP_US + offset))
            arrive = base + 40_000.0 + jitter.uniform(0, 200)  # true time; the straggler's compute runs late
            ends = base + 40_000.0 + plan.late_ms * 1000.0 * (plan.straggler is not None) + 10_000.0
            for position in range(2):
                start = arrive + late + position * 12_000.0
                end = ends + position * 12_000.0 + jitter.uniform(0, 20)
                calls.append(_call(rank, "all_reduce", start + offset, end + offset, ALL_REDUCE_BYTES, plan.ranks))
            start = base + 70_000.0 + jitter.uniform(0, 100)
            calls.append(_call(rank, "send_recv", start + offset, start + send_us + offset, SEND_BYTES, 2))
        comms.append(_rank_comm(rank, plan.steps, calls))
        profiles[rank] = Profile({"compute kernels": 40.0 + late / 1000.0, "aten::to": 5.0}, {}, 7)
    job = JobFacts(ranks=tuple(infos), has_device=True)
    return Job(job, StepSegmentation(tuple(steps), marked=True), CommAnalysis(tuple(comms)), profiles, offsets)


def _call(rank: int, kind: str, start: float, end: float, nbytes: int, group: int) -> Collective:
    return Collective(rank=rank, type=kind, event=0, start_us=start, end_us=end, nbytes=nbytes, group_size=group,
                      on_device=True, tid=7)  # fmt: skip


def _rank_comm(rank: int, steps: int, calls: list[Collective]) -> RankComm:
    comm_ms = sum(call.dur_us for call in calls) / 1000.0 / steps
    return RankComm(rank=rank, timed_on="device", steps=steps, step_ms=STEP_US / 1000.0, comm_ms_per_step=comm_ms,
                    share_pct=100.0 * comm_ms / (STEP_US / 1000.0), overlapped_ms_per_step=0.0,
                    exposed_ms_per_step=comm_ms, overlap_pct=0.0, by_type=(), collectives=tuple(calls))  # fmt: skip


def joined_analyses(paths):
    """The analyses a job's report is made of, as the join makes them from its ranks' summaries (one worker)."""
    from skalpel.job.join import Joining
    from skalpel.job.pool import summarize_all
    from skalpel.job.rank import SummaryRequest
    from skalpel.trace.loader import find_trace_files

    files = find_trace_files(paths if isinstance(paths, list) else [paths])
    joining = Joining()
    for index, result in enumerate(summarize_all([SummaryRequest(path, len(files)) for path in files], workers=1)):
        joining.add(index, result)
    joining.finish()
    return joining.analyses
