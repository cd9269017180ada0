"""Silencing warnings around skalpel's own work without touching what the user's script prints.

``warnings.catch_warnings``, ``filterwarnings`` and ``simplefilter`` all call
``warnings._filters_mutated()``, which makes every module's ``__warningregistry__`` stale: a
warning the script already showed once (the "default" action, once per location) is shown
again after each of them. skalpel works at every window's edge, so a warning shown once in a
plain run came out five times under ``skalpel run``. ``ignored`` puts its filters at the front
of the list the warnings machinery reads and takes them out again, both in place: the filters'
version does not move, so the script's "already shown" record stands.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ignored(*messages: str, category: type[Warning] = Warning) -> Iterator[None]:
    """Warnings whose message matches one of ``messages`` (regexes from the start, as ``filterwarnings``; none:
    every warning) of ``category`` are ignored inside the block; the script's registry of shown warnings stays."""
    entries = [("ignore", re.compile(message, re.I), category, None, 0) for message in (messages or ("",))]
    filters = warnings.filters  # the list the C warnings module reads on each warning
    filters[:0] = entries  # in place, no _filters_mutated(): the registries stay valid
    try:
        yield
    finally:
        for entry in entries:  # by identity: the script may hold an equal filter of its own
            for i, present in enumerate(filters):
                if present is entry:
                    del filters[i]
                    break


def off_the_python_tracer() -> None:
    """Take the calling thread, one of skalpel's own, out of torch.profiler's Python tracer.

    torch installs its tracer on every thread alive when a window starts, so a thread of skalpel's started before
    then is traced from there on, however it left the tracer at its start: the line sampler's reads of the frames
    (every 5 ms) made 3,200 of a window's 38,800 events on a quiet machine and 13,000 under load, in the user's
    trace and flame graph, and past the memory split's event limit. Each thread calls this at every wake-up.
    """
    sys.setprofile(None)
