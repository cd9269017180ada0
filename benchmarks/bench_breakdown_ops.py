"""Time the step breakdown, op table and kernel table on a large synthetic trace.

The trace is a real one (a ResNet50 step trace from the corpus) replicated N times
along the time axis, with correlation and External ids shifted so links stay right.
It is built in memory from the loaded columns, never written. Prints seconds per
analysis (median of repeats) and, as a baseline measured in the same run, the time of
``skalpel.trace.load`` of the source file, scaled by the number of copies (an estimate
of what loading the big trace would cost).

    .venv/bin/python benchmarks/bench_breakdown_ops.py [--copies 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np

from skalpel.analysis.breakdown import step_breakdown
from skalpel.analysis.kernels import kernel_table
from skalpel.analysis.ops import op_table
from skalpel.analysis.steps import segment_steps
from skalpel.trace import load

SOURCE = Path(__file__).resolve().parents[2] / "shared/traces/kineto/tb_plugin/samples/resnet50_num_workers_0"
SOURCE_FILE = "worker0.1623143089861.pt.trace.json.gz"


def replicate(trace, copies: int):
    span = float((trace.ts + trace.dur).max()) + 1000.0
    id_span = int(max(trace.correlation.max(), trace.external_id.max())) + 1
    columns = {}
    for column in ("ts", "dur", "kind", "name", "rank", "pid", "tid", "device", "stream", "correlation",
                   "external_id", "stack", "shapes", "nbytes"):
        values = getattr(trace, column)
        if column == "ts":
            columns[column] = np.concatenate([values + i * span for i in range(copies)])
        elif column in ("correlation", "external_id"):
            columns[column] = np.concatenate([np.where(values != 0, values + i * id_span, 0) for i in range(copies)])
        else:
            columns[column] = np.tile(values, copies)
    return dataclasses.replace(trace, **columns, extra={}, _derived={})


def timed(function, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_seconds = timed(lambda: load(SOURCE / SOURCE_FILE), args.repeats)
    baseline = load_seconds * args.copies
    trace = replicate(load(SOURCE / SOURCE_FILE), args.copies)
    print(f"events: {len(trace):,} ({args.copies} copies)")
    print(f"baseline: load of the source file {load_seconds:.2f} s x {args.copies} copies = {baseline:.1f} s")
    links = timed(lambda: (trace._derived.clear(), trace.op_of_event), 1)
    print(f"links (launcher + op_of_event, lead's, cached after): {links:.2f} s")
    steps = segment_steps(trace)
    for label, function in (
        ("segment_steps", lambda: segment_steps(trace)),
        ("step_breakdown", lambda: step_breakdown(trace, steps)),
        ("op_table", lambda: op_table(trace)),
        ("kernel_table", lambda: kernel_table(trace)),
    ):
        seconds = timed(function, args.repeats)
        print(f"{label:15s} {seconds:6.2f} s  ({100 * seconds / baseline:5.1f}% of the load)")


if __name__ == "__main__":
    main()
