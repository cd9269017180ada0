"""Device time per step from CUDA events read back late (watching/devicetime.py), through the real store.

This machine has no GPU: the events are ``FakeEvent``, a small object with torch.cuda.Event's
interface (``record``, ``query``, ``elapsed_time``) whose device finishes when the test says, and
which fails as CUDA does when read before it is done, or when anyone waits for it (the recorder
must never synchronise). The store, its writer thread and the watcher's boundary are the real ones;
on a CUDA machine the same code records torch.cuda.Event (checked on an H200: benchmarks/gpu_check.py).
"""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import torch

from skalpel.watching.detect import Detector
from skalpel.watching.devicetime import DeviceTimes
from skalpel.watching.show import show_run
from skalpel.watching.store import STORE, Store
from skalpel.watching.timeline_html import render_run


class FakeDevice:
    """A device clock that runs behind the host: events recorded in order, done once ``finish(n)`` says so."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []
        self.finished = 0  # how many of the recorded events the device has passed

    def finish(self, count: int) -> None:
        self.finished = max(self.finished, count)

    def Event(self, *, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - torch.cuda.Event's name
        assert enable_timing
        return FakeEvent(self)

    def synchronize(self) -> None:
        raise AssertionError("the recorder waited for the device")


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.index: int | None = None
        self.broken = False

    def record(self) -> None:
        self.index = len(self.device.recorded)
        self.device.recorded.append(self)

    def query(self) -> bool:
        return self.index is not None and self.index < self.device.finished

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()) or self.broken:
            raise RuntimeError("CUDA error: device not ready")  # what CUDA says for an event not yet done
        return (end.index - self.index) * 4.0  # ms: each step takes 4 ms on this device

    def synchronize(self) -> None:
        raise AssertionError("the recorder waited for an event")


def test_a_step_is_read_only_once_the_device_passed_its_end_and_its_events_are_used_again() -> None:
    device = FakeDevice()
    times = DeviceTimes(device)
    events = [times.record() for _ in range(5)]  # the boundaries ending steps 1-5
    for step, event in enumerate(events, start=1):
        times.add(step, event)
    assert times.ready() == [] and times.unread == 4  # the device is behind: nothing yet; step 1 has no start
    device.finish(3)
    assert times.ready() == [(0.004, 2), (0.004, 3)]  # its end passed; step 4's not yet
    assert times.ready() == []
    again = [times.record() for _ in range(3)]
    assert again[0] is events[1] and again[1] is events[0] and times.created == 6  # two used again, one new
    device.finish(5)
    assert times.ready() == [(0.004, 4), (0.004, 5)]


def test_a_step_without_an_event_starts_the_chain_again_and_a_failing_read_loses_that_step_only() -> None:
    device = FakeDevice()
    times = DeviceTimes(device)
    first, second = times.record(), times.record()
    times.add(1, first)
    times.add(2, second)
    times.add(3, None)  # no event at step 3's end: step 3 and step 4 have no pair
    third, fourth = times.record(), times.record()
    times.add(4, third)
    times.add(5, fourth)
    third.broken = True
    device.finish(4)
    assert times.ready() == [(0.004, 2), (None, 5)]


def _rows(path: Path) -> dict[int, float | None]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return dict(db.execute("SELECT step, device_s FROM steps ORDER BY step").fetchall())


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition()


def test_the_store_writes_each_steps_device_time_into_its_row_later(tmp_path: Path) -> None:
    device = FakeDevice()
    store = Store(tmp_path, Detector(), lambda anomaly, anomaly_id: None)
    store.device_times = DeviceTimes(device)
    store.start()
    try:
        began = time.perf_counter()
        for step in range(1, 41):
            store.step(step, began + step * 0.01, began + (step + 1) * 0.01, 0.0,
                       device_event=store.device_times.record())  # fmt: skip
        _wait_for(lambda: len(_rows(tmp_path / STORE)) == 40)
        assert set(_rows(tmp_path / STORE).values()) == {None}  # the rows first: the device has passed nothing
        device.finish(20)
        _wait_for(lambda: _rows(tmp_path / STORE)[20] is not None)  # step 20 ends at the 20th event
        rows = _rows(tmp_path / STORE)
        assert [step for step, value in rows.items() if value is not None] == list(range(2, 21))
        assert all(abs(rows[step] - 0.004) < 1e-9 for step in range(2, 21))
    finally:
        store.close()  # what the device has not passed stays unread: nobody waits for it
    rows = _rows(tmp_path / STORE)
    assert rows[1] is None and rows[21] is None and rows[20] is not None
    shown = show_run(tmp_path)
    assert "device time p10 4.00 ms, p50 4.00 ms, p90 4.00 ms, p99 4.00 ms (CUDA events, 19 steps)" in shown, shown
    page = render_run(tmp_path, page_dir=tmp_path)  # the HTML timeline: a device-time chart of the 19 steps read back
    charts = re.findall(r'<svg class="chart".*?</svg>', page, flags=re.S)
    assert ["step time" in charts[0], "device time (ms" in charts[1], "RSS" in charts[2]] == [True] * 3, charts
    assert "4.00 ms" in charts[1] and "step 20" in charts[1] and "step 21" not in charts[1]


def test_on_a_machine_without_cuda_the_boundary_says_one_line_and_records_on(tmp_path: Path, capsys) -> None:
    from skalpel.watching.recorder import Watcher

    watcher = Watcher(tmp_path, script="train.py")
    watcher.store.start()
    try:
        watcher.start_clock()
        watcher.device_times = DeviceTimes(torch.cuda)  # the real torch.cuda here: its Event cannot be made
        for _ in range(3):
            watcher._boundary()
        assert watcher.device_times is None and watcher.steps == 3
    finally:
        watcher.store.close()
        watcher.runq.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "device time" in line]
    assert len(said) == 1 and said[0].startswith("skalpel watch: device time per step stops here (RuntimeError")
    assert set(_rows(tmp_path / STORE).values()) == {None} and len(_rows(tmp_path / STORE)) == 3


def test_the_watchers_boundary_records_one_event_a_step_and_the_rows_get_their_device_time(tmp_path: Path) -> None:
    from skalpel.watching.recorder import Watcher

    device = FakeDevice()
    watcher = Watcher(tmp_path, script="train.py")
    watcher.store.start()
    try:
        watcher.start_clock()
        times = DeviceTimes(device)  # what _use_device sets up once the script uses CUDA, with this fake device
        watcher.store.device_times = watcher.device_times = times
        for _ in range(30):
            watcher._boundary()
        assert len(device.recorded) == 30 and times.created <= 30  # one event a boundary, nothing else on the device
        device.finish(30)
        _wait_for(lambda: _rows(tmp_path / STORE).get(30) is not None)
    finally:
        watcher.store.close()
        watcher.runq.close()
    rows = _rows(tmp_path / STORE)
    # step 1 ends at the first event, which no earlier one starts: steps 2-30 are timed, 4 ms each on this device
    assert rows[1] is None and all(abs(rows[step] - 0.004) < 1e-9 for step in range(2, 31))
