"""What the framework integrations' tests share: run a script two ways and read the run folders."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "integrations"
# Findings that follow this machine's load or what only `skalpel run` can time (the whole script), not the script's code
# findings that follow the machine's load, not the code: fast_precision_unused reads a bf16/fp32 matmul timing
MACHINE_FINDINGS = {"cpu_contention", "profiler_overhead", "noisy_measurement", "not_judged", "fast_precision_unused"}


def run_script(script: str, *args: str, skalpel_run: Path | None = None, timeout: int = 300,
               cwd: Path = REPO) -> str:  # fmt: skip
    """Run an example: directly (its own callback, when ``args`` ask for it) or, with ``skalpel_run``, under
    ``skalpel run --out skalpel_run``. Its stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    head = [sys.executable, "-m", "skalpel", "run", "--out", str(skalpel_run)] if skalpel_run else [sys.executable]
    done = subprocess.run([*head, str(EXAMPLES / script), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def code_findings(folder: Path) -> set[str]:
    return {finding["id"] for finding in report(folder)["findings"]} - MACHINE_FINDINGS


def trace_events(folder: Path) -> list[dict]:
    with gzip.open(folder / "trace-rank0.json.gz", "rt") as handle:
        return [event for event in json.load(handle)["traceEvents"] if event.get("ph") == "X"]


def per_step(events: list[dict], wanted) -> list[int]:
    """For each ProfilerStep#N of the trace, in order, how many events ``wanted(name)`` accepts begin inside it."""
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    return [sum(1 for e in events if wanted(e["name"]) and s["ts"] <= e["ts"] < s["ts"] + s["dur"]) for s in steps]
