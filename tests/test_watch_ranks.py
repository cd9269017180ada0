"""slow_rank judged by one rank's writer over the other ranks' stores of the same job (watching/ranks.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from skalpel.watching import ranks
from skalpel.watching.ranks import Peers
from skalpel.watching.store import _INSERT, _SCHEMA, STORE


def _rank_store(job: Path, rank: int, cpu_ms: float, *, run_id: str = "job-1", steps: int = 300) -> list[float]:
    """A rank's store as its writer leaves it: ``steps`` steps of ``cpu_ms`` of CPU time (a little noise)."""
    folder = job / f"rank{rank}"
    folder.mkdir(parents=True)
    cpu = [(cpu_ms + (step % 5) * 0.01) / 1e3 for step in range(1, steps + 1)]
    with sqlite3.connect(folder / STORE) as db:
        db.executescript(_SCHEMA)
        db.execute("INSERT INTO meta VALUES ('job', ?)", (run_id,))
        db.executemany(_INSERT, [(step, step * 0.01, 0.01, 0.0, value, 0.0, 2**28, None, None, 0, None, None, None)
                                 for step, value in enumerate(cpu, start=1)])  # fmt: skip
    return cpu[50:]  # the judged steps, past the warm-up


def test_the_rank_that_falls_behind_names_itself_and_the_others_say_nothing(tmp_path: Path) -> None:
    own = {rank: _rank_store(tmp_path, rank, 6.0 if rank == 2 else 2.0) for rank in range(4)}
    slow = Peers(tmp_path / "rank2", 2, "job-1").check(own[2], 300)
    assert slow is not None and slow.kind == "slow_rank" and slow.step == 300
    assert slow.message.startswith("rank2 falls behind: 6.02 ms of CPU time a step against 2.02 ms")
    assert all(Peers(tmp_path / f"rank{rank}", rank, "job-1").check(own[rank], 300) is None for rank in (0, 1, 3))


def test_said_once_while_it_holds_and_again_after_it_kept_up(tmp_path: Path) -> None:
    _rank_store(tmp_path, 0, 2.0)
    own = _rank_store(tmp_path, 1, 6.0)
    peers = Peers(tmp_path / "rank1", 1, "job-1")
    assert peers.check(own, 300) is not None
    assert peers.check(own, 310) is None  # still behind: the same anomaly
    assert peers.check([0.002] * 200, 320) is None  # kept up
    assert peers.check(own, 330) is not None


def test_a_balanced_job_a_store_of_an_earlier_job_and_too_few_steps_name_no_rank(tmp_path: Path) -> None:
    own = _rank_store(tmp_path, 0, 2.0)
    _rank_store(tmp_path, 1, 2.1)
    assert Peers(tmp_path / "rank0", 0, "job-1").check(own, 300) is None  # 5% apart: no rank behind
    other = tmp_path / "other"
    slow = _rank_store(other, 1, 6.0)
    _rank_store(other, 0, 2.0, run_id="an-earlier-job")  # left in the folder: not compared
    assert Peers(other / "rank1", 1, "job-1").check(slow, 300) is None
    few = tmp_path / "few"
    _rank_store(few, 0, 2.0, steps=80)  # 30 judged steps: not enough to say
    assert Peers(few / "rank1", 1, "job-1").check([0.006] * 200, 300) is None


def test_judge_is_the_one_verdict_show_and_the_writer_share() -> None:
    assert ranks.judge({"rank0": 0.002, "rank1": 0.002}) is None
    assert ranks.judge({"rank0": 0.002, "rank1": 0.006}) == ("rank1", 0.006, 0.002)
    assert ranks.judge({"rank0": 0.0002, "rank1": 0.0006}) is None  # 3x, but 0.4 ms: under the floor
