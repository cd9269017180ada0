"""The watch file: one SQLite database per run (``watch.sqlite`` in the run folder), one row per step.

The training thread only puts a tuple on a queue at each step; a writer thread takes them
every ``POLL_S``, judges them and inserts them in batches and commits every ``FLUSH_S`` seconds (or ``BATCH`` rows), in WAL mode, so
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
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import SkalpelError
from .detect import Anomaly, Detector, Sample

STORE = "watch.sqlite"
LOCK = ".watch.lock"
FLUSH_S = 0.5
POLL_S = 0.05  # how often the writer takes the queued rows and judges them
BATCH = 512
STEP_COLUMNS = ("step", "end_s", "wall_s", "loader_s", "cpu_s", "runq_s", "rss", "cuda_allocated", "cuda_reserved",
                "profiled")  # fmt: skip
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, {", ".join(f"{name} REAL" for name in STEP_COLUMNS[1:])});
CREATE TABLE IF NOT EXISTS anomalies (id INTEGER PRIMARY KEY, step INTEGER, kind TEXT, message TEXT, value REAL,
    baseline REAL, at_s REAL, capture TEXT, summary TEXT);
"""
_INSERT = f"INSERT OR REPLACE INTO steps VALUES ({', '.join('?' * len(STEP_COLUMNS))})"


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
        self.queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.failed: str | None = None  # why the store stopped being written
        self.on_flush: Callable[[], None] | None = None  # after each flush, on the writer thread (the live line)
        self.last_row: tuple[Any, ...] | None = None
        self.steps_written = 0
        self._pending: list[tuple[Any, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="skalpel-watch-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- from the training thread -------------------------------------------------------------
    def step(self, row: tuple[Any, ...]) -> None:
        self.queue.put(("step", row))

    def device_memory(self, limit: int | None) -> None:
        """From the first step with CUDA memory on: judge that rather than RSS."""
        self.queue.put(("device", limit))

    def meta(self, **values: Any) -> None:
        self.queue.put(("meta", values))

    def capture(self, anomaly_id: int, path: str, summary: str) -> None:
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
        try:
            os.close(self._lock)
        except OSError:
            pass

    # -- the writer thread --------------------------------------------------------------------
    def _write(self) -> None:
        sys.setprofile(None)  # out of a capture's Python tracer
        flushed = time.monotonic()
        stopping = False
        while not stopping:
            # Polled, not woken per row: a put that wakes a waiting thread hands it the GIL, and on a busy
            # machine the training thread then waits for the writer at every step.
            self._stop.wait(POLL_S)
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "stop":
                    stopping = True
                    break
                self._handle(item)
            if stopping or len(self._pending) >= BATCH or time.monotonic() - flushed >= FLUSH_S:
                self._flush()
                flushed = time.monotonic()
                if self.on_flush is not None and not stopping:
                    self.on_flush()

    def _handle(self, item: tuple[Any, ...]) -> None:
        if item[0] == "step":
            row = item[1]
            self._pending.append(row)
            self.last_row = row
            sample = Sample(step=row[0], end_s=row[1], wall_s=row[2], loader_s=row[3],
                            memory=row[7] if row[7] is not None else row[6], runq_s=row[5], judged=not row[9])  # fmt: skip
            for anomaly in self.detector.feed(sample):
                self.on_anomaly(anomaly, self._anomaly(anomaly, row[1]))
        elif item[0] == "device":
            self.detector.use_device_memory(item[1])
        elif item[0] == "meta":
            self._execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                          [(key, None if value is None else str(value)) for key, value in item[1].items()])  # fmt: skip
        elif item[0] == "capture":
            _, anomaly_id, path, summary = item
            self._execute("UPDATE anomalies SET capture = ?, summary = ? WHERE id = ?", [(path, summary, anomaly_id)])

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


def read_meta(db: sqlite3.Connection) -> dict[str, str]:
    return {row[0]: row[1] for row in db.execute("SELECT key, value FROM meta")}
