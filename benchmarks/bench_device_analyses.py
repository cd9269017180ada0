"""Time the device analyses (gpu_time, launches, syncs, memory, compile) on a large synthetic trace.

The trace is the ResNet50 corpus trace replicated N times along the time axis (see
bench_breakdown_ops.py, whose ``replicate`` is reused), with its ``[memory]`` events
replicated too. Prints seconds per analysis (median of repeats) and, as a baseline
measured in the same run, the load time of the source file scaled by the number of copies.

    .venv/bin/python benchmarks/bench_device_analyses.py [--copies 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_breakdown_ops import SOURCE, SOURCE_FILE, replicate, timed  # noqa: E402

from skalpel.analysis.compile import compile_events  # noqa: E402
from skalpel.analysis.gpu_time import GpuTimeOptions, gpu_time  # noqa: E402
from skalpel.analysis.launches import launches  # noqa: E402
from skalpel.analysis.memory import memory  # noqa: E402
from skalpel.analysis.steps import segment_steps  # noqa: E402
from skalpel.analysis.syncs import syncs  # noqa: E402
from skalpel.trace import load  # noqa: E402


def replicate_memory(trace, copies: int, span: float):
    events = trace.memory
    columns = {}
    for field in dataclasses.fields(events):
        values = getattr(events, field.name)
        columns[field.name] = (
            np.concatenate([values + i * span for i in range(copies)]) if field.name == "ts" else np.tile(values, copies)
        )
    return dataclasses.replace(events, **columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_seconds = timed(lambda: load(SOURCE / SOURCE_FILE), args.repeats)
    baseline = load_seconds * args.copies
    source = load(SOURCE / SOURCE_FILE)
    span = float((source.ts + source.dur).max()) + 1000.0
    trace = replicate(source, args.copies)
    trace = dataclasses.replace(trace, memory=replicate_memory(source, args.copies, span))
    print(f"events: {len(trace):,} ({args.copies} copies), memory events: {len(trace.memory):,}")
    print(f"baseline: load of the source file {load_seconds:.2f} s x {args.copies} copies = {baseline:.1f} s")
    links = timed(lambda: (trace._derived.clear(), trace.op_of_event), 1)
    print(f"links (launcher + op_of_event, cached after): {links:.2f} s")
    steps = segment_steps(trace)
    for label, function in (
        ("gpu_time", lambda: gpu_time(trace)),
        ("gpu_time (HTA)", lambda: gpu_time(trace, options=GpuTimeOptions(exclude_last_step=True))),
        ("launches", lambda: launches(trace, steps)),
        ("syncs", lambda: syncs(trace, steps)),
        ("memory", lambda: memory(trace, steps)),
        ("compile_events", lambda: compile_events(trace, steps)),
    ):
        seconds = timed(function, args.repeats)
        print(f"{label:15s} {seconds:6.2f} s  ({100 * seconds / baseline:5.1f}% of the load)")


if __name__ == "__main__":
    main()
