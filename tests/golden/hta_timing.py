"""Time Holistic Trace Analysis (HTA) on one trace folder, for a benchmark to compare against.

Run with a throwaway venv that has PyPI's ``traceinsight`` (HTA); HTA is not a skalpel
dependency (see tests/golden/make_hta_golden.py for the venv recipe):

    /tmp/hta-venv/bin/python tests/golden/hta_timing.py PATH_TO_TRACE_DIR [--runs 3] [--exact]

Each run is a fresh subprocess (``--child``) that imports HTA, loads the folder with
``TraceAnalysis(trace_dir=...)`` and runs ``get_temporal_breakdown``,
``get_idle_time_breakdown`` (all ranks), ``get_comm_comp_overlap`` and
``get_gpu_kernel_breakdown``, all with ``visualize=False``.

Prints ONE JSON line on stdout:
  seconds          median over runs of load + four analyses (measured inside the child,
                   HTA import excluded)
  load_seconds     median of the TraceAnalysis(...) load alone
  analyses_seconds median of the four analyses alone
  process_seconds  median wall clock of the whole child process (interpreter start,
                   ``import hta``, load, analyses)
  peak_rss_mib     largest peak RSS of any process in any run (the child reports its own
                   ru_maxrss; the parent's RUSAGE_CHILDREN also covers HTA's
                   multiprocessing workers; the larger is reported)
  runs             per-run numbers
HTA's log output goes to stderr. ``--exact`` sets HTA_DISABLE_NS_ROUNDING=1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def child(trace_dir: str) -> None:
    t_imp = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    import_s = time.perf_counter() - t_imp
    t0 = time.perf_counter()
    a = TraceAnalysis(trace_dir=trace_dir)
    t1 = time.perf_counter()
    ranks = sorted(a.t.traces.keys())
    a.get_temporal_breakdown(visualize=False)
    a.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True)
    a.get_comm_comp_overlap(visualize=False)
    a.get_gpu_kernel_breakdown(visualize=False)
    t2 = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        "HTA_TIMING_CHILD "
        + json.dumps(
            {
                "import_seconds": import_s,
                "load_seconds": t1 - t0,
                "analyses_seconds": t2 - t1,
                "seconds": t2 - t0,
                "self_peak_rss_kib": rss_kib,
                "ranks": [int(r) for r in ranks],
            }
        ),
        flush=True,
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Time HTA load + four analyses.")
    ap.add_argument("trace_dir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--exact", action="store_true", help="set HTA_DISABLE_NS_ROUNDING=1")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.trace_dir)
        return 0

    env = dict(os.environ)
    if args.exact:
        env["HTA_DISABLE_NS_ROUNDING"] = "1"
    runs = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", args.trace_dir],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.perf_counter() - t0
        line = next(
            (ln for ln in p.stdout.splitlines() if ln.startswith("HTA_TIMING_CHILD ")), None
        )
        if p.returncode != 0 or line is None:
            sys.stderr.write(p.stderr[-4000:])
            print(json.dumps({"error": f"child exit {p.returncode}", "trace_dir": args.trace_dir}))
            return 1
        r = json.loads(line.split(" ", 1)[1])
        r["process_seconds"] = wall
        runs.append(r)
    children_rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_kib = max([children_rss_kib] + [r["self_peak_rss_kib"] for r in runs])
    from importlib.metadata import version

    med = lambda k: round(statistics.median(r[k] for r in runs), 3)  # noqa: E731
    print(
        json.dumps(
            {
                "tool": "hta",
                "hta_version": version("traceinsight"),
                "trace_dir": os.path.abspath(args.trace_dir),
                "exact": bool(args.exact),
                "runs_n": len(runs),
                "seconds": med("seconds"),
                "load_seconds": med("load_seconds"),
                "analyses_seconds": med("analyses_seconds"),
                "process_seconds": med("process_seconds"),
                "peak_rss_mib": round(peak_kib / 1024, 1),
                "runs": [
                    {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
                    for r in runs
                ],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
