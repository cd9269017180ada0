"""A step that never ends: each rank's own thread notices, and dumps its stacks and its collectives.

Every rank watches itself (no rank waits for another to tell it): a thread wakes a few times a
second and compares the time since the last step ended with the bound, ``max(floor, share x
the median of the recent steps)`` (``thresholds.COLLECTIVE_HANG``; ``--hang-after S`` sets the
floor). Past it, once per stall, it writes ``hang-<k>.json`` beside the store: every thread's
Python stack (``sys._current_frames``: a thread blocked in gloo, in ``time.sleep`` or in a
DataLoader has let go of the GIL), the last entries of the rank's collectives ring
(``capture/collectives.py``), and PyTorch's flight recorder when it records
(``fr-trace-<k>.json``). The run goes on being watched: a step that ends after all marks the
dump ``resolved`` (slow, not stuck). A fatal signal (gloo's abort, a segfault) writes the Python
stacks into ``fatal-stacks.txt`` (``faulthandler``); SIGKILL writes nothing but the ring is on
disk already. ``hangs.py`` reads these back; ``diagnose/hang.py`` gives the verdict.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable

import orjson

from ..capture.collectives import flight_recorder_json
from ..diagnose import thresholds as limits
from ..trace.collective_ring import RING, read_ring
from .hangs import FATAL, verdict_text

KEPT_COLLECTIVES = 32  # the ring's last entries copied into a dump


def hang_bound(median_s: float | None, floor_s: float) -> float:
    """How long without a step end counts as a hang."""
    share = (limits.COLLECTIVE_HANG.share_pct or 0.0) / 100
    return max(floor_s, share * median_s) if median_s else floor_s


def stacks(skip: int | None = None) -> list[dict]:
    """Every thread's Python stack, outermost frame first (``skip``: a thread ident left out)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames = []
        while frame is not None:
            frames.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
            frame = frame.f_back
        found.append({"thread": names.get(ident, f"thread-{ident:x}"), "main": ident == threading.main_thread().ident,
                      "frames": frames[::-1]})  # fmt: skip
    return found


def write_whole(path: Path, data: bytes) -> None:
    """Written aside, then renamed: whole, or not there (a rank that dies mid-write leaves a .tmp)."""
    aside = path.with_name(path.name + ".tmp")
    aside.write_bytes(data)
    os.replace(aside, path)


def write_dump(path: Path, rank: int | None, step: int, fields: dict, *, recorder_name: str | None) -> dict:
    """A dump of this process now: every thread's stack but the caller's, its last collectives (the ring beside
    ``path``), PyTorch's flight recorder into ``recorder_name`` when it records; ``fields`` added. Its body."""
    ring = path.parent / RING
    collectives, torn = read_ring(ring) if ring.exists() else ([], 0)
    body = {"rank": rank, "pid": os.getpid(), "step": step, "time": time.time(),
            "stacks": stacks(skip=threading.get_ident()), "collectives": collectives[-KEPT_COLLECTIVES:],
            "torn_slots": torn, **fields}  # fmt: skip
    recorder = flight_recorder_json() if recorder_name is not None else None
    if recorder is not None and recorder_name is not None:
        write_whole(path.parent / recorder_name, recorder)
        body["flight_recorder"] = recorder_name
    write_whole(path, orjson.dumps(body))
    return body


class HangWatch:
    """The thread that notices a step that does not end, in one rank."""

    def __init__(self, folder: Path, *, rank: int | None, last_end: Callable[[], float | None],
                 steps: Callable[[], int], median_s: Callable[[], float | None], floor_s: float,
                 say: Callable[[str], None], job_folder: Path | None = None,
                 world_size: int = 1) -> None:  # fmt: skip
        self.folder = folder
        self.rank = rank
        self.last_end, self.steps, self.median_s = last_end, steps, median_s
        self.floor_s = floor_s
        self.say = say
        self.job_folder = job_folder  # under torchrun with --out: rank 0 says the job's verdict once ranks dumped
        self.world_size = world_size
        self.dumps: list[Path] = []
        self._stalled_at: int | None = None  # the step count when the dump under way was written
        self._since = 0.0  # the last step end before it
        self._body: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skalpel-watch-hang", daemon=True)
        self._fatal: IO[str] | None = None

    @property
    def bound_s(self) -> float:
        return hang_bound(self.median_s(), self.floor_s)

    def start(self) -> None:
        if not faulthandler.is_enabled():  # the script's own (python -X faulthandler) is left alone
            try:
                self._fatal = open(self.folder / FATAL, "w")  # noqa: SIM115 - open for the process's life
                faulthandler.enable(self._fatal, all_threads=True)
            except OSError:
                self._fatal = None
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._fatal is not None:
            faulthandler.disable()
            self._fatal.close()
            path = self.folder / FATAL
            if path.exists() and path.stat().st_size == 0:
                path.unlink()
            self._fatal = None

    def _run(self) -> None:
        from ..capture.quiet import off_the_python_tracer  # here: analyze and diff import no capture module

        while not self._stop.wait(max(0.05, min(0.25, self.floor_s / 8))):
            off_the_python_tracer()
            try:
                self.check()
            except Exception as error:  # noqa: BLE001 - the watch of hangs stops; the run goes on
                self.say(f"hang detection stops here ({type(error).__name__}: {error})")
                return

    def check(self) -> None:
        last = self.last_end()
        if last is None:  # not started, or a capture's own work under way at a boundary
            return
        steps = self.steps()
        if self._stalled_at is not None:
            if steps != self._stalled_at:  # a step ended after all: slow, not stuck
                self._resolved(last - self._since)
            return
        stalled, bound = time.perf_counter() - last, self.bound_s
        if stalled > bound:
            self._stalled_at, self._since = steps, last
            self.dump(steps, stalled, bound)

    def dump(self, step: int, stalled_s: float, bound_s: float) -> Path:
        number = len(self.dumps) + 1
        path = self.folder / f"hang-{number}.json"
        body = {"stalled_s": round(stalled_s, 3), "bound_s": round(bound_s, 3), "resolved_after_s": None}
        self._body = write_dump(path, self.rank, step, body, recorder_name=f"fr-trace-{number}.json")
        self.dumps.append(path)
        who = f"rank {self.rank}: " if self.rank is not None else ""
        self.say(f"{who}no step has ended for {stalled_s:.1f} s (bound {bound_s:.1f} s) after step {step}: stacks "
                 f"and collectives in {path}; still watching")  # fmt: skip
        if self.rank is None or (self.rank == 0 and self.job_folder is not None):  # one voice for the job
            self._say_verdict(bound_s)
        return path

    def _say_verdict(self, bound_s: float) -> None:
        """The verdict on stderr, once every rank dumped too (at most half a bound more: a rank that died dumps
        nothing), from the folder as ``skalpel analyze`` reads it."""
        folder = self.job_folder or self.folder
        deadline = time.monotonic() + max(bound_s / 2, 1.0)
        while self.job_folder is not None and time.monotonic() < deadline and not self._stop.is_set():
            if len({path.parent for path in folder.glob("rank*/hang-*.json")}) >= self.world_size:
                break
            time.sleep(0.1)
        text = verdict_text(folder, say_clean=False)
        if text:
            self.say("the verdict so far (skalpel analyze " + str(folder) + "):\n" + text.rstrip())

    def _resolved(self, after_s: float) -> None:
        self._stalled_at = None
        body = self._body
        body["resolved_after_s"] = round(after_s, 3)
        try:
            write_whole(self.dumps[-1], orjson.dumps(body))
        except OSError:
            pass
        self.say(f"step {body['step'] + 1} ended after {after_s:.1f} s: slow, not stuck ({self.dumps[-1].name} "
                 "marked resolved)")  # fmt: skip
