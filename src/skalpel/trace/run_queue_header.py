"""The main thread's wait for a core over the recorded window, which skalpel's capture writes into the header
(``skalpel_run_queue``).

Linux counts each thread's run-queue delay (``/proc/self/task/<tid>/schedstat``): the time it was
ready to run and waited for a core. ``capture/session.py`` writes the training (main) thread's
delay over the window, from its start to the closing step, with the window's wall time::

    {"main_thread_wait_s": 0.412, "wall_s": 1.95}

Two ranks doing the same work on one loaded machine take turns on the cores: the one that waited
longer arrives last at the collectives, and its extra time shows as host time outside any op, as
a sleep in it would. ``straggler_rank`` reads this to tell the two apart.
"""

from __future__ import annotations

HEADER_KEY = "skalpel_run_queue"


def parse(value: object) -> dict | None:
    """The header's value when both figures are non-negative numbers and the window has a length, else None."""
    if not isinstance(value, dict):
        return None
    figures = [value.get(key) for key in ("main_thread_wait_s", "wall_s")]
    if not all(isinstance(figure, (int, float)) and not isinstance(figure, bool) and figure >= 0 for figure in figures):
        return None
    return value if figures[1] > 0 else None


def wait_share(value: dict | None) -> float | None:
    """The share (0-1) of the window's wall time the main thread waited for a core; None where not recorded."""
    return min(value["main_thread_wait_s"] / value["wall_s"], 1.0) if value is not None else None
