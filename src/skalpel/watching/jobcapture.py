"""A capture of a torchrun job: every rank profiles the same steps, and one report covers them all.

With ``--out JOB`` every rank records into ``JOB/rank<N>/``; ``JOB`` is where the ranks meet.
When an anomaly fires on a rank (its writer thread), that rank writes a request into ``JOB``:
``.watch-capture-<n>.json``, numbered in turn and created whole (written aside, then linked to
its name, which fails if another rank took the number), naming the first step to capture, far
enough ahead (``LEAD_S`` of steps) for every rank to have read it by then. Every rank's writer
thread reads the new requests at each flush and hands them to the training thread, which starts
the capture at that step's boundary: the same steps on every rank, since the ranks of a job step
together. Requests follow each other: a request's steps start after the previous one's, so every
rank takes them in the same order. Each rank writes its own trace into ``JOB/capture-<step>-<kind>/``
and a marker (``.watch-rank<R>.json``: its trace and its step timing, or why it has none); the rank
that asked starts ``collect.py`` in a process of its own, which waits for every rank's marker
(``$SKALPEL_RANK_WAIT_S``) and writes the job's report once. No rank waits for another's trace.
No torch here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from .. import env

LEAD_S = 3.0  # how far ahead a capture starts: every rank's writer reads the request within a poll (0.2 to 1 s),
# with 2 s to spare for a rank that load stalls (a clean-clone CI run under load missed one at 2 s)
MIN_LEAD_STEPS = 3
_PREFIX = ".watch-capture-"
SUMMARY = ".watch-summary.txt"  # the collector's one line: the report's findings, or why there is none


def marker_name(rank: int) -> str:
    return f".watch-rank{rank}.json"


@dataclasses.dataclass(frozen=True)
class Request:
    """A capture every rank of the job takes: from ``first_step`` to ``last_step`` (its wait, warm-up, recorded
    and baseline steps)."""

    number: int
    first_step: int
    last_step: int
    kind: str
    anomaly_step: int
    rank: int  # the rank whose anomaly asked for it: it starts the collector and links the report
    asked_at: float  # time.time()
    active: int | None = None  # steps recorded, when not the watch's --active (skalpel watch --ask JOB profile N)

    @property
    def folder_name(self) -> str:
        return f"capture-{self.anomaly_step}-{self.kind}"


class Requests:
    """This rank's view of the job's capture requests (``JOB/.watch-capture-<n>.json``), read on its writer thread."""

    def __init__(self, job_folder: Path, rank: int, world_size: int, *, span: int) -> None:
        self.folder = job_folder
        self.rank = rank
        self.world_size = world_size
        self.span = span  # the steps a capture occupies, with a few to spare
        self.seen = 0  # the highest request number handed on
        self.requests: dict[int, Request] = {}
        self._lock = threading.RLock()  # the writer thread takes the new requests; close() the last ones

    def lead_steps(self, median_step_s: float | None) -> int:
        return max(MIN_LEAD_STEPS, math.ceil(LEAD_S / median_step_s) if median_step_s else MIN_LEAD_STEPS)

    def ask(self, *, kind: str, anomaly_step: int, current_step: int, median_step_s: float | None,
            cooldown_s: float, active: int | None = None, span: int | None = None) -> Request | None:  # fmt: skip
        """Write a request for a capture of the job; None when one of this kind was asked within the cooldown (by
        any rank) or the folder cannot be written."""
        taken = 0  # the last number found taken (by another rank's request, or a file that is none)
        for _ in range(100):  # another rank may take each number first: then after its request
            self.read()
            now = time.time()
            if any(request.kind == kind and now - request.asked_at < cooldown_s for request in self.requests.values()):
                return None
            last = self.requests[max(self.requests)] if self.requests else None
            first = current_step + self.lead_steps(median_step_s)
            if last is not None:
                first = max(first, last.last_step + 1)
            number = max([taken, *self.requests]) + 1
            last_step = first + (span or self.span) - 1
            request = Request(number, first, last_step, kind, anomaly_step, self.rank, now, active)
            aside = self.folder / f".{_PREFIX}{number}-rank{self.rank}.tmp"
            try:
                aside.write_bytes(orjson.dumps(dataclasses.asdict(request)))
                os.link(aside, self.folder / f"{_PREFIX}{number}.json")  # fails when another rank took the number
                return request
            except FileExistsError:
                taken = number
                continue
            except OSError:
                return None
            finally:
                aside.unlink(missing_ok=True)
        return None

    def read(self) -> list[Request]:
        """Every request this rank has not handed on yet, in order."""
        with self._lock:
            return self._read()

    def _read(self) -> list[Request]:
        try:
            names = [path.name for path in self.folder.iterdir() if path.name.startswith(_PREFIX)]
        except OSError:
            return []
        for name in names:
            try:
                number = int(name[len(_PREFIX):-len(".json")])
            except ValueError:
                continue  # another rank's request being written
            if number in self.requests:
                continue
            try:
                self.requests[number] = Request(**orjson.loads((self.folder / name).read_bytes()))
            except (OSError, orjson.JSONDecodeError, TypeError):
                continue
        new = sorted(number for number in self.requests if number > self.seen)
        return [self.requests[number] for number in new]

    def take(self) -> list[Request]:
        """The new requests, marked as handed on."""
        with self._lock:
            new = self.read()
            if new:
                self.seen = new[-1].number
            return new


def write_marker(folder: Path, rank: int, *, trace: str | None, capture: Any = None, note: str | None = None) -> None:
    """This rank's part of a job's capture is over: its trace (a name in ``folder``) and step timing, or why not."""
    body = {"rank": rank, "trace": trace, "capture": dataclasses.asdict(capture) if capture is not None else None,
            "note": note}  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f"{marker_name(rank)}.tmp"
    aside.write_bytes(orjson.dumps(body))
    os.replace(aside, folder / marker_name(rank))  # whole, or not there


def read_markers(folder: Path, world_size: int) -> dict[int, dict[str, Any]]:
    found = {}
    for rank in range(world_size):
        try:
            found[rank] = orjson.loads((folder / marker_name(rank)).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
    return found


def start_collector(folder: Path, world_size: int) -> subprocess.Popen | None:
    """``collect.py`` on ``folder`` in a process of its own (it waits for the other ranks; this rank trains on)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}  # fmt: skip
    command = [sys.executable, "-m", "skalpel.watching.collect", str(folder), str(world_size),
               str(env.number(env.RANK_WAIT_S))]  # fmt: skip
    try:
        with open(folder / ".watch-collect.log", "wb") as log:  # its own errors, if any (the child keeps its copy)
            return subprocess.Popen(command, env=environment, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    except OSError:
        return None


def summary(folder: Path) -> str | None:
    try:
        return (folder / SUMMARY).read_text().strip() or None
    except OSError:
        return None
