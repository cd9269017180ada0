"""The watch file on its own: rows written in batches off the caller's thread, readable meanwhile, failures said once."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import torch

from skalpel.errors import SkalpelError
from skalpel.watching.detect import Detector
from skalpel.watching.probe import RunQueueClock
from skalpel.watching.store import POLL_MAX_S, POLL_ROWS, POLL_S, STORE, Store, open_run, poll_interval


def _row(step: int) -> tuple:
    """What the training thread appends: (step, start, end, loader_s, profiled), on the perf_counter clock."""
    return (step, time.perf_counter() + step * 0.01, time.perf_counter() + (step + 1) * 0.01, 0.0, 0)


def _store(folder: Path) -> Store:
    return Store(folder, Detector(), lambda anomaly, anomaly_id: None)


def test_rows_are_readable_while_the_store_is_open_and_all_there_after_close(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.start()
    for step in range(1, 1001):
        store.step(*_row(step))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a reader meanwhile (WAL): the committed batches
        count = open_run(tmp_path).execute("SELECT count(*) FROM steps").fetchone()[0]
        if count == 1000:
            break
        time.sleep(0.05)
    assert count == 1000
    store.meta(script="train.py", status="ended")
    store.close()
    db = open_run(tmp_path)
    assert [row[0] for row in db.execute("SELECT step FROM steps ORDER BY step")] == list(range(1, 1001))
    assert dict(db.execute("SELECT key, value FROM meta").fetchall())["status"] == "ended"


def test_the_writer_polls_about_every_poll_rows_steps_between_its_shortest_and_longest_sleep() -> None:
    assert poll_interval(0, 0.2) == POLL_MAX_S  # no step since the last poll (a long step, evaluation): once a second
    assert poll_interval(400, 0.2) == POLL_S  # 0.5 ms steps: never more often than POLL_S
    assert poll_interval(20, 0.2) == pytest.approx(POLL_ROWS * 0.01)  # 10 ms steps: POLL_ROWS of them
    assert POLL_S < POLL_ROWS * 0.01 < POLL_MAX_S
    assert poll_interval(2, 0.2) == POLL_MAX_S  # 100 ms steps: at least once a second


def test_a_second_store_in_the_same_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    first = _store(tmp_path)
    with pytest.raises(SkalpelError, match=r"another skalpel watch \(pid \d+\) records into"):
        _store(tmp_path)
    first.close()
    _store(tmp_path).close()  # once the first is closed, the folder is free again


def test_a_store_that_fails_mid_run_says_it_once_and_takes_rows_on(tmp_path: Path, capsys) -> None:
    store = _store(tmp_path)
    store.start()
    store.step(*_row(1))
    deadline = time.monotonic() + 30
    while store.steps_written == 0 and time.monotonic() < deadline:  # flushed
        time.sleep(0.05)
    store._db.close()  # what a full disk or a removed file looks like to the writer: every write fails
    for step in range(2, 200):
        store.step(*_row(step))
    store.close()
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("skalpel")]
    assert len(said) == 1 and "cannot write the watch file" in said[0] and "the script runs on" in said[0]
    assert store.failed is not None
    rows = sqlite3.connect(tmp_path / STORE).execute("SELECT count(*) FROM steps").fetchone()[0]
    assert rows == 1


def test_show_of_a_folder_without_a_store_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SkalpelError, match="no watched run at"):
        open_run(tmp_path)


def test_the_writer_fills_each_steps_cpu_time_core_wait_and_memory_from_its_own_readings(tmp_path: Path) -> None:
    """The training thread appends clock times only; the counters come from the writer's readings around them."""
    store = _store(tmp_path)
    store.start()
    work, clock = torch.randn(64, 64), RunQueueClock()
    burnt, last, waited = 0.0, time.perf_counter(), clock.read()
    for step in range(1, 21):
        began = time.thread_time()
        while time.thread_time() - began < 0.005:  # 5 ms of this thread's CPU a step
            torch.mm(work, work)
        burnt += time.thread_time() - began
        now = time.perf_counter()
        ended = clock.read()
        store.step(step, last, now, 0.0, runq=(waited, ended))
        last, waited = now, ended
    store.close()
    rows = open_run(tmp_path).execute("SELECT cpu_s, runq_s, rss, cuda_allocated FROM steps ORDER BY step").fetchall()
    assert len(rows) == 20
    assert all(cpu >= 0 and runq is not None and runq >= 0 and rss > 2**20 and cuda is None for cpu, runq, rss, cuda in rows)
    # the process's CPU time, spread over the steps between readings: at least what this thread burnt in them
    assert sum(row[0] for row in rows) >= 0.5 * burnt


def test_skalpel_watch_is_the_context_manager_and_the_package_is_watching() -> None:
    import importlib

    import skalpel
    from skalpel.watching import recorder

    importlib.import_module("skalpel.watching.store")  # importing the package sets skalpel.watching, never .watch
    assert skalpel.watch is recorder.watch and callable(skalpel.watch)
    assert not hasattr(importlib.import_module("skalpel.watching"), "__call__")
