"""The fixed costs of a `skalpel` process: interpreter start, imports, parser, terminal report, exit.

    .venv/bin/python benchmarks/startup.py                          # 15 runs of each, interleaved
    .venv/bin/python benchmarks/startup.py --before /tmp/old/src    # the same for another source tree, interleaved
    .venv/bin/python benchmarks/startup.py --trace big.json         # analyze that trace instead

Every command runs as a user runs it (``python -m skalpel ...``, from cached bytecode), timed
by this process from start to exit, with its CPU time (user + system, threads included) from
wait4. ``analyze`` reads a 15 KB trace of the corpus, so its time is almost all fixed cost;
the baseline is a bare interpreter that imports numpy (with one BLAS thread, as skalpel's
read-only commands do), which every analysis needs. Issue 13 asks for imports and fixed costs
of about 80 ms in all. Medians, interleaved so that machine noise hits every command (and both
trees) alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
TINY = TRACES / "kineto" / "docs" / "traces" / "after_fix_trace.json"


def _commands(trace: Path, out: str) -> dict[str, list[str]]:
    skalpel = [sys.executable, "-m", "skalpel"]
    return {
        "python": [sys.executable, "-c", "pass"],
        # numpy as skalpel's read-only commands import it: one BLAS thread (cli.entry), none spinning beside
        "python + numpy": [sys.executable, "-c", "import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'; import numpy"],
        "skalpel --help": [*skalpel, "--help"],
        "skalpel explain ID": [*skalpel, "explain", "gpu_idle"],
        "analyze --json -": [*skalpel, "analyze", str(trace), "--json", "-"],
        "analyze --json OUT": [*skalpel, "analyze", str(trace), "--json", out],
    }


def _run(command: list[str], tree: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; raises when it fails."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    if tree:
        env["PYTHONPATH"] = tree
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed: {child.stderr.read().decode(errors='replace').strip()}")
    return seconds, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="runs of each command (15)")
    parser.add_argument("--before", metavar="SRC", help="another source tree (its src folder) to measure too")
    parser.add_argument("--trace", type=Path, default=TINY, help="the trace analyze reads (a 15 KB corpus trace)")
    options = parser.parse_args()
    if not options.trace.exists():
        raise SystemExit(f"the trace {options.trace} is missing (the default is in ../shared/traces)")
    trees = {"this": None, **({"before": options.before} if options.before else {})}
    with tempfile.TemporaryDirectory(prefix="skalpel_startup_") as folder:
        commands = _commands(options.trace, str(Path(folder) / "report.json"))
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for tree in trees.values():  # one unmeasured run each: the bytecode and file caches warm
            for command in commands.values():
                _run(command, tree)
        for _ in range(options.repeats):
            for name, command in commands.items():
                for label, tree in trees.items():
                    times.setdefault((name, label), []).append(_run(command, tree))
    header = f"{'command':22s} {'tree':6s} {'wall ms':>8s} {'CPU ms':>7s} {'over numpy':>11s}"
    print(f"{header}  (medians of {options.repeats})")
    for (name, label), runs in times.items():
        floor = statistics.median(wall for wall, _ in times[("python + numpy", label)])
        wall = statistics.median(wall for wall, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs)
        over = (wall - floor) * 1000
        print(f"{name:22s} {label:6s} {wall * 1000:8.0f} {cpu * 1000:7.0f} {over:+10.0f}")


if __name__ == "__main__":
    main()
