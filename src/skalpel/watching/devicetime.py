"""Each step's device time on a CUDA machine: one CUDA event a boundary, read back late, never synchronised.

Once the script has initialised CUDA (the writer thread sees it; nothing here initialises it),
the training thread records one timing event on its current stream at each step boundary (an
event from a pool: no allocation per step); a step's device time is the time on the device
between its start's event and its end's (the previous boundary's and its own). The writer thread
hands every step's pair here and, at each poll, reads back the oldest pairs whose end event
``query()`` says is done: the device runs behind the host, so a step's device time comes a few
polls after its row, and is written into the row then (``device_s``). Nothing ever waits for
the device: a pair still running at the end stays unread (the row's ``device_s`` empty).
No torch import here: ``cuda`` is ``torch.cuda``, given by the watcher.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class DeviceTimes:
    """``record()`` on the training thread; ``add()`` and ``ready()`` on the writer thread."""

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda
        self._free: deque[Any] = deque()  # events read back, for the training thread to record again
        self._start: Any = None  # the last boundary's event: the next step's start
        self._pending: deque[tuple[int, Any, Any]] = deque()  # (step, start event, end event), oldest first
        self.created = 0

    # -- the training thread -------------------------------------------------------------------
    def record(self) -> Any:
        """An event recorded on the current stream now (a boundary)."""
        try:
            event = self._free.pop()
        except IndexError:
            event = self._cuda.Event(enable_timing=True)
            self.created += 1
        event.record()
        return event

    # -- the writer thread ---------------------------------------------------------------------
    def add(self, step: int, end: Any) -> None:
        """Step ``step`` ended at the event ``end`` (None: no event, the chain starts again at the next one)."""
        if end is not None and self._start is not None:
            self._pending.append((step, self._start, end))
        self._start = end

    def ready(self) -> list[tuple[float | None, int]]:
        """(device seconds, step) of the oldest steps whose end the device has passed; never waits for it."""
        done = []
        pending = self._pending
        while pending:
            step, start, end = pending[0]
            try:
                if not end.query():
                    break
                seconds: float | None = start.elapsed_time(end) / 1e3
            except Exception:  # noqa: BLE001 - an event of another device, a context torn down: that step unread
                seconds = None
            pending.popleft()
            self._free.append(start)  # done with: it ended the step before and started this one
            done.append((seconds, step))
        return done

    def forget(self) -> None:
        """The steps added so far are dropped (a takeover: their rows are gone); the next step starts at the last
        event added."""
        self._pending.clear()

    @property
    def unread(self) -> int:
        return len(self._pending)
