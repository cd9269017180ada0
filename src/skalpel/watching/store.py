"""The watch file: one SQLite database per run (``watch.sqlite`` in the run folder), one row per step.

The training thread only appends (step, start, end, DataLoader wait, profiled, its core-wait clock
at the start and end) to a deque at each step; a writer thread takes them at each poll, reads
the process's counters once for all of them (``probe.py``: CPU time and memory, interpolated over
the steps), judges them and
inserts them in batches and commits every ``FLUSH_S`` seconds (or ``BATCH`` rows), in WAL mode, so
the file is readable while the run goes on and a SIGKILL loses at most the batch not yet
committed. The writer thread also feeds the anomaly detector (``detect.py``): its work stays
off the training loop. A lock file keeps a second watcher out of a folder in use. A store that
cannot be written (a full disk) says so once and the script runs on, unrecorded.
"""

from __future__ import annotations

import fcntl
import os
import queue
import sqlite3
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from ..errors import SkalpelError
from .detect import Anomaly, Detector, Sample
from .devicetime import DeviceTimes
from .probe import Counters, RunQueueClock, Timeline, cuda_in_use, device_memory_limit
from .ranks import Peers

STORE = "watch.sqlite"
LOCK = ".watch.lock"
FLUSH_S = 0.5
# The writer polls about every POLL_ROWS steps at the recent step rate, but no more often than POLL_S and no less
# than POLL_MAX_S: a wake-up costs 150-200 us of CPU whatever it finds (cold caches), and a poll's readings are
# what a step's CPU time and memory are interpolated between (memory_creep dates a leak to within a poll).
POLL_S = 0.2
POLL_MAX_S = 1.0
POLL_ROWS = 64
BATCH = 512
# forward_s, backward_s, optimizer_s and device_s came later (a store written before has none: readers ask
# has_columns)
STEP_COLUMNS = ("step", "end_s", "wall_s", "loader_s", "cpu_s", "runq_s", "rss", "cuda_allocated", "cuda_reserved",
                "profiled", "forward_s", "backward_s", "optimizer_s", "device_s")  # fmt: skip
PHASE_COLUMNS = ("forward_s", "backward_s", "optimizer_s")
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, {", ".join(f"{name} REAL" for name in STEP_COLUMNS[1:])});
CREATE TABLE IF NOT EXISTS anomalies (id INTEGER PRIMARY KEY, step INTEGER, kind TEXT, message TEXT, value REAL,
    baseline REAL, at_s REAL, capture TEXT, summary TEXT);
"""
# every column but device_s, which comes later (an UPDATE): sqlite3 binds a None through an adapter lookup that
# fails (0.5 us a value), and device_s is always None when its row is written
_INSERT = (f"INSERT OR REPLACE INTO steps ({', '.join(STEP_COLUMNS[:-1])}) "
           f"VALUES ({', '.join('?' * (len(STEP_COLUMNS) - 1))})")  # fmt: skip
RESTART = -1  # in the steps deque, in a step's place: (RESTART, note), a takeover (Store.restart)
_DEVICE_TIME = "UPDATE steps SET device_s = ? WHERE step = ?"  # read back after the row (devicetime.py)


class Store:
    """Opened on the training thread (so a folder in use or read-only is said before the script starts)."""

    def __init__(self, folder: Path, detector: Detector, on_anomaly: Callable[[Anomaly, int], None]) -> None:
        self.folder = folder
        self.path = folder / STORE
        self._lock = _take_lock(folder)
        try:
            for suffix in ("", "-wal", "-shm"):  # a folder reused with --out: a new run replaces the old file
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # a commit survives the process being killed
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as error:
            os.close(self._lock)
            raise SkalpelError(f"cannot create the watch file {self.path}: {error}") from None
        self.detector = detector
        self.on_anomaly = on_anomaly
        self.queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()  # all but the steps
        # (step, start, end, loader_s, profiled, runq at start, runq at end, backward_s, optimizer_s, CUDA event or
        # None) per step: all the training thread does
        self.steps: deque[tuple[Any, ...]] = deque()
        self.want_device = False  # the script initialised CUDA: the training thread is asked for its device
        self.failed: str | None = None  # why the store stopped being written
        self.on_flush: Callable[[], None] | None = None  # after each flush, on the writer thread (the live line)
        self.on_restart: Callable[[], None] | None = None  # on the writer thread, once the steps before a takeover went
        self.last_row: tuple[Any, ...] | None = None
        self.steps_written = 0
        self._pending: list[tuple[Any, ...]] = []
        self.origin = time.perf_counter()  # what end_s counts from (the watcher sets its own start)
        self.counters: Counters | None = None
        self.timeline = Timeline()
        self._last_end: tuple[float, tuple[Any, ...]] | None = None  # the last step's end, and the counters there
        self._runq: tuple[bytes | None, float | None] = (None, None)  # the last step's end: run-queue reading, parsed
        self.peers: Peers | None = None  # the other ranks of a torchrun job (ranks.py), judged with this one
        self._cpu: deque[float] = deque(maxlen=detector.window)  # CPU time of the last judged steps, for peers
        self._wall: deque[float] = deque(maxlen=64)  # the last steps' wall time, judged or not (recent_step_s)
        self.device_times: DeviceTimes | None = None  # set by the watcher once the script uses CUDA
        self._device_updates: list[tuple[float | None, int]] = []  # (device_s, step) read back, to write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="skalpel-watch-writer", daemon=True)

    def start(self, *, origin: float | None = None) -> None:
        """Start the writer thread."""
        if origin is not None:
            self.origin = origin
        self.counters = Counters()
        self.timeline.add(self.counters.read())  # before the first step starts: every step lies between readings
        self._thread.start()

    # -- from the training thread -------------------------------------------------------------
    def step(self, step: int, start: float, end: float, loader_s: float, profiled: int = 0,
             runq: tuple[bytes | None, bytes | None] = (None, None), backward_s: float | None = None,
             optimizer_s: float | None = None, device_event: Any = None) -> None:  # fmt: skip
        """One step: its start and end on ``time.perf_counter()``, ``RunQueueClock.read()`` at both, its backward
        and optimizer time, the CUDA event at its end (the watcher appends to ``steps`` itself)."""
        self.steps.append((step, start, end, loader_s, profiled, *runq, backward_s, optimizer_s, device_event))

    def restart(self, note: str) -> None:
        """A stronger signal took over (``note`` says which): the steps so far were not training iterations. Once
        the writer has taken every step appended before, their rows and anomalies are dropped, and the steps from
        here, numbered from 1 again, are judged afresh."""
        self.steps.append((RESTART, note))

    def cuda_device(self, device: int) -> None:
        """The training thread's CUDA device (asked for with ``want_device``): memory is judged there from now on."""
        self.want_device = False
        self.queue.put(("device", device))

    def meta(self, **values: Any) -> None:
        self.queue.put(("meta", values))

    def capture(self, anomaly_id: int, path: str | None, summary: str) -> None:
        self.queue.put(("capture", anomaly_id, path, summary))

    def close(self) -> None:
        """Write everything queued, and end the writer thread."""
        if self._thread.is_alive():
            self.queue.put(("stop",))
            self._stop.set()
            self._thread.join()
        try:
            self._db.close()
        except sqlite3.Error:
            pass
        if self.counters is not None:
            self.counters.close()
        if self.peers is not None:
            self.peers.close()
        try:
            os.close(self._lock)
        except OSError:
            pass

    # -- the writer thread --------------------------------------------------------------------
    def _write(self) -> None:
        from ..capture.quiet import off_the_python_tracer  # here: analyze and diff import no capture module

        flushed = polled = time.monotonic()
        stopping = False
        wait = POLL_S
        while not stopping:
            # Polled, not woken per row: a put that wakes a waiting thread hands it the GIL, and on a busy
            # machine the training thread then waits for the writer at every step.
            self._stop.wait(wait)
            off_the_python_tracer()
            now = time.monotonic()
            wait = poll_interval(len(self.steps), now - polled)
            polled = now
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "stop":
                    stopping = True
                    break
                self._handle(item)
            self._take_steps()  # after the stop item: every step appended before it
            if self.peers is not None and (stopping or self.peers.due()):
                self._judge_ranks()
            if stopping or len(self._pending) >= BATCH or time.monotonic() - flushed >= FLUSH_S:
                self._flush()
                flushed = time.monotonic()
                if self.on_flush is not None and not stopping:
                    self.on_flush()

    def _take_steps(self) -> None:
        """The steps appended since the last poll, with the counters read once for all of them."""
        steps = self.steps
        taken = [steps.popleft() for _ in range(len(steps))]  # popleft: safe against the training thread's append
        assert self.counters is not None
        self.timeline.add(self.counters.read())  # after the steps were taken: each ended before this reading
        last_end = None
        for step in taken:
            if step[0] == RESTART:
                self._restart(step[1])
                continue
            self._step(*step)
            last_end = step[2]
        if last_end is not None:
            self.timeline.forget_before(last_end)
        if self.device_times is not None:
            self._device_updates += self.device_times.ready()
        if self.counters.cuda_device is None and not self.want_device and cuda_in_use():
            self.want_device = True

    def _step(self, step: int, start: float, end: float, loader_s: float, profiled: int, runq_start: bytes | None,
              runq_end: bytes | None, backward_s: float | None, optimizer_s: float | None,
              device_event: Any = None) -> None:  # fmt: skip
        if self.device_times is not None:
            self.device_times.add(step, device_event)
        if self._last_end is not None and self._last_end[0] == start:
            before = self._last_end[1]
        else:
            before = self.timeline.at(start)
        after = self.timeline.at(end)
        self._last_end = (end, after)
        # a step starts where the last one ended: its start's reading was parsed as that one's end
        since = self._runq[1] if runq_start is self._runq[0] else RunQueueClock.seconds(runq_start)
        waited = RunQueueClock.seconds(runq_end)
        self._runq = (runq_end, waited)
        runq = None if waited is None or since is None else max(waited - since, 0.0)
        # forward: the rest of the step (the forward pass, and whatever else the loop does)
        forward = None if backward_s is None or optimizer_s is None else max(end - start - loader_s - backward_s -
                                                                            optimizer_s, 0.0)  # fmt: skip
        row = (step, end - self.origin, end - start, loader_s, max(after[0] - before[0], 0.0), runq, after[1],
               after[2], after[3], profiled, forward, backward_s, optimizer_s)  # fmt: skip
        self._pending.append(row)
        self.last_row = row
        self._wall.append(row[2])
        if not profiled and step > self.detector.warmup:
            self._cpu.append(row[4])
        sample = Sample(step=step, end_s=row[1], wall_s=row[2], loader_s=loader_s,
                        memory=row[7] if row[7] is not None else row[6], runq_s=runq, judged=not profiled)  # fmt: skip
        for anomaly in self.detector.feed(sample):
            self.on_anomaly(anomaly, self._anomaly(anomaly, row[1]))

    def _restart(self, note: str) -> None:
        self._pending, self._device_updates = [], []
        if self.device_times is not None:
            self.device_times.forget()
        self._execute("DELETE FROM steps", [()])
        self._execute("DELETE FROM anomalies", [()])
        self._handle(("meta", {"takeover": note}))
        self.steps_written, self.last_row = 0, None
        self._wall.clear()
        self._cpu.clear()
        self.detector.restart()
        if self.on_restart is not None:
            self.on_restart()

    def recent_step_s(self) -> float | None:
        """The median wall time of the last steps taken (on the writer thread; before the detector's window fills)."""
        return statistics.median(self._wall) if self._wall else None

    def _judge_ranks(self) -> None:
        assert self.peers is not None
        try:
            anomaly = self.peers.check(list(self._cpu), self.last_row[0] if self.last_row else 0)
        except (sqlite3.Error, OSError):  # another rank's file mid-replacement: judged at the next check
            return
        if anomaly is not None:
            self.on_anomaly(anomaly, self._anomaly(anomaly, self.last_row[1] if self.last_row else 0.0))

    def _handle(self, item: tuple[Any, ...]) -> None:
        if item[0] == "device":
            assert self.counters is not None
            self.counters.cuda_device = item[1]
            limit = device_memory_limit(item[1])
            self.detector.use_device_memory(limit)
            self._handle(("meta", {"memory_source": "CUDA allocated", "memory_limit": limit}))
        elif item[0] == "meta":
            self._execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                          [(key, None if value is None else str(value)) for key, value in item[1].items()])  # fmt: skip
        elif item[0] == "capture":
            _, anomaly_id, path, summary = item
            self._execute("UPDATE anomalies SET capture = ?, summary = ? WHERE id = ?", [(path, summary, anomaly_id)])

    def record_anomaly(self, anomaly: Anomaly) -> int:
        """On the writer thread: an anomaly that no step judged (a capture asked for from another terminal); its id."""
        return self._anomaly(anomaly, self.last_row[1] if self.last_row else 0.0)

    def _anomaly(self, anomaly: Anomaly, at_s: float) -> int:
        if self.failed is not None:
            return -1
        try:
            cursor = self._db.execute(
                "INSERT INTO anomalies (step, kind, message, value, baseline, at_s) VALUES (?, ?, ?, ?, ?, ?)",
                (anomaly.step, anomaly.kind, anomaly.message, anomaly.value, anomaly.baseline, at_s),
            )
            return int(cursor.lastrowid or -1)
        except (sqlite3.Error, OSError) as error:
            self._fail(error)
            return -1

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        if rows:
            self._execute(_INSERT, rows)
            if self.failed is None:
                self.steps_written += len(rows)
        updates, self._device_updates = self._device_updates, []
        if updates:  # after the rows they are about
            self._execute(_DEVICE_TIME, updates)

    def _execute(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if self.failed is not None:
            return
        try:
            self._db.execute("BEGIN")
            self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as error:
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        self.failed = f"cannot write the watch file {self.path} ({error}): steps from here on are not recorded"
        print(f"skalpel: {self.failed}; the script runs on", file=sys.stderr, flush=True)


def poll_interval(steps: int, seconds: float) -> float:
    """The writer's next sleep: about ``POLL_ROWS`` steps at the rate of the last poll (``steps`` in ``seconds``)."""
    if steps <= 0:
        return POLL_MAX_S
    return min(max(POLL_ROWS * seconds / steps, POLL_S), POLL_MAX_S)


def _take_lock(folder: Path) -> int:
    """The folder's lock, held while the run is recorded; a second watcher in the same folder gets one line."""
    path = folder / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise SkalpelError(f"cannot write to {folder}: {error.strerror or error}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SkalpelError(f"another skalpel watch (pid {holder}) records into {folder}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


# -- reading -----------------------------------------------------------------------------------
def open_run(path: str | Path) -> sqlite3.Connection:
    """A read-only connection to a run's watch file (the run folder or the file itself); readable mid-run."""
    path = Path(path)
    store = path / STORE if path.is_dir() else path
    if not store.is_file():
        raise SkalpelError(f"no watched run at {path}: {STORE} not found (skalpel watch writes one per run)")
    try:
        db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
        db.execute("SELECT count(*) FROM steps").fetchone()
    except sqlite3.Error as error:
        raise SkalpelError(f"cannot read {store}: {error}") from None
    db.row_factory = sqlite3.Row
    return db


def has_columns(db: sqlite3.Connection, *names: str) -> bool:
    """Whether the run's steps table has these columns (a store written by an older skalpel may not)."""
    present = {row[1] for row in db.execute("PRAGMA table_info(steps)")}
    return all(name in present for name in names)


def read_meta(db: sqlite3.Connection) -> dict[str, str]:
    return {row[0]: row[1] for row in db.execute("SELECT key, value FROM meta")}
