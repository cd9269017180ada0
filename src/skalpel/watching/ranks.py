"""``slow_rank`` judged online under torchrun: each rank's writer thread reads the other ranks' stores.

With ``--out JOB`` every rank records into ``JOB/rank<N>/watch.sqlite``; those files are in WAL
mode, readable while they are written. Every ``every_s`` seconds (and once at the end) a rank's
writer thread reads the recent CPU time per step of each rank of the same job (``meta.job``, the
torchrun run id) and compares them: step times cannot tell (the others wait for the slow rank in
every collective, so their steps last as long as its own), CPU time does. The rank that falls
behind records the anomaly in its own store, naming itself; the others record nothing (one
anomaly per event, beside the steps it is about). Threshold: ``thresholds.SLOW_RANK``;
``skalpel explain slow_rank`` documents it. No torch here.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from pathlib import Path

from ..diagnose import thresholds as limits
from .detect import Anomaly

RANK_PREFIX = "rank"


def judge(medians: dict[str, float]) -> tuple[str, float, float] | None:
    """(the slowest rank, its median CPU time a step, the other ranks' median) when it falls behind; else None."""
    if len(medians) < 2:
        return None
    slowest = max(medians, key=medians.__getitem__)
    others = statistics.median(value for name, value in medians.items() if name != slowest)
    share, floor = limits.SLOW_RANK.share_pct / 100, limits.SLOW_RANK.floor / 1e3
    if medians[slowest] < others * (1 + share) or medians[slowest] - others < floor:
        return None
    return slowest, medians[slowest], others


def message(rank: str, value: float, others: float) -> str:
    return (f"{rank} falls behind: {value * 1e3:.2f} ms of CPU time a step against {others * 1e3:.2f} ms on the "
            f"others ({value / others:.2f}x); the others wait for it in every collective")  # fmt: skip


class Peers:
    """The other ranks' stores of one job, read by this rank's writer thread."""

    def __init__(self, folder: Path, rank: int, job: str | None, *, window: int = limits.WATCH_WINDOW_STEPS,
                 warmup: int = limits.WATCH_WARMUP_STEPS) -> None:  # fmt: skip
        self.parent = folder.parent
        self.name = f"{RANK_PREFIX}{rank}"
        self.job = job
        self.window = window
        self.warmup = warmup
        self.every_s = limits.SLOW_RANK.param("every_s")
        self.min_steps = int(limits.SLOW_RANK.param("min_steps"))
        self.checked = time.monotonic()
        self.armed = True  # said once; again only after a check that found this rank keeping up
        self._open: dict[Path, sqlite3.Connection] = {}

    def due(self) -> bool:
        return time.monotonic() - self.checked >= self.every_s

    def check(self, own: list[float], step: int) -> Anomaly | None:
        """``own``: this rank's recent CPU time per step (judged steps). An anomaly when this rank falls behind."""
        self.checked = time.monotonic()
        if len(own) < self.min_steps:
            return None
        medians = {self.name: statistics.median(own)}
        for name, values in self._others().items():
            if len(values) >= self.min_steps:
                medians[name] = statistics.median(values)
        verdict = judge(medians)
        if verdict is None or verdict[0] != self.name:
            self.armed = self.armed or len(medians) > 1
            return None
        if not self.armed:
            return None
        self.armed = False
        _, value, others = verdict
        return Anomaly(step, "slow_rank", message(self.name, value, others), value, others)

    def _others(self) -> dict[str, list[float]]:
        found = {}
        for store in sorted(self.parent.glob(f"{RANK_PREFIX}*/watch.sqlite")):
            name = store.parent.name
            if name == self.name:
                continue
            try:
                db = self._open.get(store) or self._connect(store)
                if db is None:
                    continue
                rows = db.execute("SELECT cpu_s FROM steps WHERE profiled = 0 AND step > ? AND cpu_s IS NOT NULL "
                                  "ORDER BY step DESC LIMIT ?", (self.warmup, self.window)).fetchall()  # fmt: skip
            except sqlite3.Error:  # not created yet, or replaced by a new run: opened again next time
                self._forget(store)
                continue
            found[name] = [row[0] for row in rows]
        return found

    def _connect(self, store: Path) -> sqlite3.Connection | None:
        """A read-only connection to another rank's store of this job (a store left by an earlier job: None)."""
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, check_same_thread=False)
        job = db.execute("SELECT value FROM meta WHERE key = 'job'").fetchone()
        if self.job is not None and (job is None or job[0] != self.job):
            db.close()
            return None
        self._open[store] = db
        return db

    def _forget(self, store: Path) -> None:
        db = self._open.pop(store, None)
        if db is not None:
            db.close()

    def close(self) -> None:
        for store in list(self._open):
            self._forget(store)
