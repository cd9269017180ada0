"""CPU time of the analyses and the findings against stdlib ``json.loads`` of the same file (issue 13).

Each repeat runs in a fresh interpreter, as ``skalpel analyze`` does, so first-use costs count
(lazy imports, numpy's own, the trace's cached links): it loads the trace, then times
``run_analyses`` (each analysis apart) and ``diagnose`` with ``time.process_time``. The
baseline, measured in the same run, is ``json.loads`` of the uncompressed file. Prints the
median of the repeats and the ratio to the baseline; the machine's load moves every figure.

    .venv/bin/python benchmarks/analyses_speed.py [TRACE] [--repeats 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "shared/traces/hta/df_index_resolver/df_index_resolver.json.gz"

_ONE_RUN = """
import json, sys, time
clock = time.process_time
from skalpel.analysis import bundle
from skalpel.diagnose import diagnose
from skalpel.trace import load
trace = load([sys.argv[1]])
times, steps = {}, None
def timed(name, run):
    start = clock()
    result = run()
    times[name] = clock() - start
    return result
steps = timed("segment_steps", lambda: bundle.segment_steps(trace))
analyses = bundle.Analyses(trace=trace, steps=steps)
for field, run in (
    ("has_device", lambda: trace.has_device), ("one_time", lambda: bundle.one_time_work(trace)),
    ("breakdown", lambda: bundle.step_breakdown(trace, steps)), ("ops", lambda: bundle.op_table(trace)),
    ("kernels", lambda: bundle.kernel_table(trace)), ("gpu_time", lambda: bundle.gpu_time(trace)),
    ("step_device", lambda: bundle.device_in_steps(trace, steps)), ("recording", lambda: bundle.device_recording(trace)),
    ("launches", lambda: bundle.launches(trace, steps)), ("syncs", lambda: bundle.syncs(trace, steps)),
    ("blame", lambda: bundle.blame(trace, steps, one_time=analyses.one_time)),
    ("allocator", lambda: bundle.allocator_calls(trace, steps, one_time=analyses.one_time)),
    ("memory", lambda: bundle.memory(trace, steps)), ("largest_allocs", lambda: bundle.largest_allocs(trace, analyses.memory)),
    ("kept_memory", lambda: bundle.KeptMemory(trace, steps) if analyses.memory is not None else None),
    ("compile", lambda: bundle.compile_events(trace, steps)), ("compile_log", lambda: bundle.compile_log(trace, steps)),
    ("compile_in_steps", lambda: bundle.compile_in_steps(trace, steps)
     if analyses.compile.used or analyses.compile_log is not None else None),
    ("graph_breaks", lambda: bundle.graph_breaks(trace, steps, analyses.compile, analyses.compile_log)),
    ("mfu", lambda: bundle.mfu(trace, steps)), ("comm", lambda: bundle.analyze_comm(trace, steps)),
    ("c10d_issuers", lambda: bundle.c10d_issuers(trace, analyses.comm)),
):
    setattr(analyses, field, timed(field, run))
timed("diagnose", lambda: diagnose(analyses, None))
print(json.dumps(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not args.trace.is_file():
        sys.exit(f"error: no trace file at {args.trace}")
    data = args.trace.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}  # cached bytecode
    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / "trace.json"
        plain.write_bytes(data)
        runs, baseline = [], []
        for _ in range(args.repeats):
            start = time.process_time()
            json.loads(plain.read_bytes())
            baseline.append(time.process_time() - start)
            done = subprocess.run([sys.executable, "-c", _ONE_RUN, str(plain)], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"error: the analysis run failed: {done.stderr.strip().splitlines()[-1:]}")
            runs.append(json.loads(done.stdout))
    loads_s = statistics.median(baseline)
    median = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    analyses_s = statistics.median(sum(s for name, s in run.items() if name != "diagnose") for run in runs)
    print(f"{args.trace.name}: {len(data) / 2**20:.0f} MiB, median of {args.repeats}, CPU ms")
    for name, seconds in median.items():
        print(f"  {name:16} {1000 * seconds:7.1f}")
    print(f"json.loads            {1000 * loads_s:7.1f}")
    print(f"run_analyses          {1000 * analyses_s:7.1f}  ({analyses_s / loads_s:.2f}x json.loads)")
    both = analyses_s + median["diagnose"]
    print(f"analyses + diagnose   {1000 * both:7.1f}  ({both / loads_s:.2f}x json.loads)")


if __name__ == "__main__":
    main()
