"""Events whose times lie far outside the rest of their file: set aside, counted, said.

One kernel with ``ts`` 0 in a trace whose clock reads 1.6e15 us (the Unix epoch)
would stretch its stream over 50 years, and one op at ts -2^70 would take every
other event's precision with it. A real capture spans seconds to hours, so an event
a day or more away from the bulk of its file is a damaged or hand-edited one.

"Far" is measured from the middle half of the file's start times (robust to any
number of stray events short of a quarter of them): further than a day, and further
than 1000 times the middle half's own span, before its start or after its end.
Each file is judged on its own: ranks on other hosts may have other clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..display import cut_name

_DAY_US = 86_400e6
_SPAN_FACTOR = 1000.0
_MIN_EVENTS = 4  # with fewer events, no bulk to judge against


@dataclass(frozen=True)
class TimeWindow:
    """The times (us, as in the file) outside which an event is set aside."""

    low: float
    high: float

    def far(self, ts: np.ndarray, end: np.ndarray | None = None) -> np.ndarray:
        """A boolean per event: it starts (or, given ``end``, ends) outside the window."""
        outside = (ts < self.low) | (ts > self.high)
        if end is not None:
            outside |= end > self.high
        return outside


def time_window(ts: np.ndarray) -> TimeWindow | None:
    """The window of plausible times of a file's events, or None when there are too few to judge."""
    count = len(ts)
    if count < _MIN_EVENTS:
        return None
    first, third = count // 4, (3 * count) // 4
    quartiles = np.partition(ts, [first, third])  # O(n): no sort
    low, high = float(quartiles[first]), float(quartiles[third])
    margin = max(_DAY_US, _SPAN_FACTOR * (high - low))
    return TimeWindow(low - margin, high + margin)


def set_aside_far_events(columns: dict[str, np.ndarray], memory: dict[str, np.ndarray], extra: dict[int, dict],
                         names: list[str]) -> str | None:  # fmt: skip
    """Remove far events from one file's columns (and memory rows, and ``extra``) in place; the note, or None."""
    window = time_window(columns["ts"])
    if window is None:
        return None
    far = window.far(columns["ts"], columns["ts"] + columns["dur"])
    far_memory = window.far(memory["ts"])
    count = int(far.sum()) + int(far_memory.sum())
    if not count:
        return None
    if far.any():
        first = int(np.flatnonzero(far)[0])
        example = f"{cut_name(names[int(columns['name'][first])])!r} at ts {columns['ts'][first]:.6g} us"
    else:
        example = f"a [memory] event at ts {memory['ts'][np.flatnonzero(far_memory)[0]]:.6g} us"
    if far.any():
        kept = ~far
        position = np.cumsum(kept) - 1
        remapped = {int(position[index]): args for index, args in extra.items() if kept[index]}
        extra.clear()
        extra.update(remapped)
        for key in columns:
            columns[key] = columns[key][kept]
    if far_memory.any():
        for key in memory:
            memory[key] = memory[key][~far_memory]
    middle = (window.low + window.high) / 2
    return (
        f"set aside {count:,} event(s) whose times lie far outside the rest of the trace (a day or more away; "
        f"first: {example}, the others near {middle:.6g} us): the analyses leave them out"
    )
