"""The fixed costs of a `skalpel` process: interpreter start, imports, parser, terminal report, exit.

    .venv/bin/python benchmarks/startup.py               # 15 runs of each, interleaved
    .venv/bin/python benchmarks/startup.py --repeats 31

Every command runs as a user runs it (``python -m skalpel ...``, from cached bytecode), timed
by this process from start to exit, with its CPU time (user + system, threads included) from
wait4. ``analyze`` reads a 15 KB trace of the corpus, so its time is almost all fixed cost;
the baseline is a bare interpreter that imports numpy, which every analysis needs. Issue 13
asks for imports and fixed costs of about 80 ms in all. Medians, interleaved so that machine
noise hits every command alike.
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


def _commands(out: str) -> dict[str, list[str]]:
    skalpel = [sys.executable, "-m", "skalpel"]
    return {
        "python": [sys.executable, "-c", "pass"],
        "python + numpy": [sys.executable, "-c", "import numpy"],
        "skalpel --version": [*skalpel, "--version"],
        "skalpel explain ID": [*skalpel, "explain", "gpu_idle"],
        "analyze --json -": [*skalpel, "analyze", str(TINY), "--json", "-"],
        "analyze --json OUT": [*skalpel, "analyze", str(TINY), "--json", out],
    }


def _run(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; raises when it fails."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
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
    options = parser.parse_args()
    if not TINY.exists():
        raise SystemExit(f"the corpus trace {TINY} is missing (../shared/traces)")
    with tempfile.TemporaryDirectory(prefix="skalpel_startup_") as folder:
        commands = _commands(str(Path(folder) / "report.json"))
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for command in commands.values():  # one unmeasured run each: the bytecode and file caches warm
            _run(command)
        for _ in range(options.repeats):
            for name, command in commands.items():
                times[name].append(_run(command))
    floor = statistics.median(wall for wall, _ in times["python + numpy"])
    print(f"{'command':22s} {'wall ms':>8s} {'CPU ms':>7s} {'over numpy':>11s}   (medians of {options.repeats})")
    for name, runs in times.items():
        wall = statistics.median(wall for wall, _ in runs)
        cpu = statistics.median(cpu for _, cpu in runs)
        print(f"{name:22s} {wall * 1000:8.0f} {cpu * 1000:7.0f} {(wall - floor) * 1000:+10.0f}")


if __name__ == "__main__":
    main()
