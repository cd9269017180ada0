"""Interleaved A/B of the trace loader in one process: another tree's loader against this tree's.

    .venv/bin/python benchmarks/load_ab.py OTHER_SRC TRACE [ROUNDS] [--links]

OTHER_SRC is the ``src`` folder of another checkout (e.g. ``git archive main src | tar -x -C /tmp/base``).
Its ``skalpel`` package is copied under the name ``skalpel_other`` (the loader's imports are relative), so
both loaders run in this process, one after the other in each round (machine noise hits both alike), each
``load(TRACE, workers=1)`` timed by process time. Prints min, first quartile and median of each and the
ratios (this tree / the other). On a shared machine the minimum is the figure least moved by others' load.
``--links``: the timed load also derives the links every analysis reads (``Trace.launcher``, ``Trace.op_of_event``).
"""

from __future__ import annotations

import gc
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    links = "--links" in sys.argv
    arguments = [argument for argument in sys.argv[1:] if argument != "--links"]
    other_src, trace = Path(arguments[0]), arguments[1]
    rounds = int(arguments[2]) if len(arguments) > 2 else 12
    with tempfile.TemporaryDirectory() as folder:
        shutil.copytree(other_src / "skalpel", Path(folder) / "skalpel_other")
        sys.path[:0] = [folder, str(REPO / "src")]
        this = importlib.import_module("skalpel.trace.loader")
        other = importlib.import_module("skalpel_other.trace.loader")

        times: dict[str, list[float]] = {"other": [], "this": []}
        for _ in range(rounds):
            for name, module in (("other", other), ("this", this)):
                gc.collect()
                started = time.process_time()
                loaded = module.load(trace, workers=1)
                if links:
                    loaded.op_of_event  # noqa: B018 - derived (and cached) on first read: the link is timed
                times[name].append(time.process_time() - started)
                del loaded
    for name, values in times.items():
        values.sort()
        quartile, median = values[len(values) // 4], values[len(values) // 2]
        print(f"{name:6} min {values[0]:.4f} s  q1 {quartile:.4f} s  median {median:.4f} s")
    this_t, other_t = times["this"], times["other"]
    middle = len(this_t) // 2
    print(f"this/other: min {this_t[0] / other_t[0]:.3f}, median {this_t[middle] / other_t[middle]:.3f}")


if __name__ == "__main__":
    main()
