"""The GPU path checked on a real CUDA device: verdicts on planted scenarios, their fixes timed, watch's device time.

    python benchmarks/gpu_check.py --out DIR          # on a machine with a CUDA GPU (about 5 minutes)

For each scenario in ``benchmarks/gpu/`` (each marks its planted line ``# PLANTED``):

- ``skalpel run --stop-after-capture`` on it, and on its ``--fix`` variant: the findings at warning
  level or above, with their locations (the planted finding must be there, on the planted line, and
  gone after the fix; ``clean.py`` must raise nothing);
- the script timed by itself, as is and with ``--fix`` (``STEP_MS``: the mean step after warm-up,
  the device synchronised only around the timed block), so the verdict is checked as a user would:
  apply the fix, time it; and the device memory each variant keeps a step (``GROWTH_MIB_PER_STEP``),
  so that a fix which leaks, or a memory_growth finding, is checked against the allocator too.

Then ``skalpel watch`` on ``clean.py`` (300 steps, no capture): the store's ``device_s`` (CUDA events
read back late) against the script's own CUDA events a step, and the watched step time against the
bare one; and ``skalpel watch`` on ``watch_leak.py`` (memory kept from step 150 on): the anomaly,
its step and its capture's findings. Everything lands in DIR (``summary.json``, ``log.txt``, the run
folders); on a machine without CUDA the scripts run small on the CPU, as a smoke test of the check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "gpu"
# (scenario, the finding planted in it or None, whether its --fix removes the finding): each --fix is timed
SCENARIOS = [
    ("sync_item", "host_device_sync", True),
    ("pageable", "pageable_memcpy", True),
    ("loader_starved", "dataloader_bound", True),
    ("launch_bound", "launch_bound", False),  # fewer, not no tiny kernels: the layers' own stay
    ("clean", None, True),
    ("host_prep", "gpu_idle", True),  # host work with no sync: the finding must name the host work, not a sync
]
# run after the watch checks: each of its four processes compiles with Inductor (step 0, before the profiled steps)
LAST = [("graph_break", "graph_break", True)]


def planted_line(script: Path) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if "# PLANTED" in line)


def run(command: list[str], log, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as expired:
        done = subprocess.CompletedProcess(command, -9, expired.stdout or "", f"timed out after {timeout} s")
    log.write(f"$ {' '.join(command)}  # {time.perf_counter() - started:.1f} s, exit {done.returncode}\n")
    log.write(str(done.stdout)[-4000:] + "\n" + str(done.stderr)[-3000:] + "\n")
    log.flush()
    return done


def printed(done: subprocess.CompletedProcess, name: str) -> float | None:
    """The last ``NAME value`` line the script printed (``_common.timed``)."""
    found = re.findall(rf"{name} (-?[\d.]+)", done.stdout or "")
    return float(found[-1]) if found else None


def step_ms(done: subprocess.CompletedProcess) -> float | None:
    return printed(done, "STEP_MS")


def findings(folder: Path) -> list[dict]:
    path = folder / "report.json"
    if not path.exists():
        return [{"id": "NO REPORT"}]
    report = json.loads(path.read_text())
    return [{"id": f["id"], "severity": f["severity"], "locations": f.get("locations", [])[:3],
             "title": f.get("title", "")} for f in report["findings"] if f["severity"] in ("warning", "critical")]


def scenario(name: str, planted: str | None, fix_removes: bool, out: Path, log) -> dict:
    script = HERE / f"{name}.py"
    result: dict = {"planted": planted, "planted_line": f"{name}.py:{planted_line(script)}" if planted else None}
    for variant, extra in (("as_is", []), ("fixed", ["--fix"])):
        if variant == "fixed" and planted is None:
            continue
        folder = out / "runs" / f"{name}-{variant}"
        run([sys.executable, "-m", "skalpel", "run", "--out", str(folder), "--stop-after-capture", str(script),
             "--steps", "40", *extra], log, timeout=240)
        result[f"findings_{variant}"] = findings(folder)
        timing = run([sys.executable, str(script), "--steps", "60", *extra], log, 180)
        result[f"step_ms_{variant}"] = step_ms(timing)
        result[f"kept_mib_per_step_{variant}"] = printed(timing, "GROWTH_MIB_PER_STEP")  # a leak of the script's
    if planted:
        hit = [f for f in result["findings_as_is"] if f["id"] == planted]
        result["found"] = bool(hit)
        result["on_planted_line"] = bool(hit) and any(result["planted_line"] in loc for loc in hit[0]["locations"])
        gone = not any(f["id"] == planted for f in result.get("findings_fixed", []))
        result["gone_after_fix" if fix_removes else "gone_after_fix_not_expected"] = gone
    else:
        result["quiet"] = not result["findings_as_is"]
    return result


def watch_device_time(out: Path, log, steps: int) -> dict:
    folder, own = out / "watch-clean", out / "own-events.json"
    watched = run([sys.executable, "-m", "skalpel", "watch", "--out", str(folder), "--no-capture",
                   str(HERE / "clean.py"), "--steps", str(steps)], log, 300, env={"OWN_EVENTS": str(own)})
    bare = run([sys.executable, str(HERE / "clean.py"), "--steps", str(steps)], log, 300)
    result = {"step_ms_watched": step_ms(watched), "step_ms_bare": step_ms(bare)}
    store = folder / "watch.sqlite"
    if not store.exists():
        return {**result, "error": "no watch.sqlite"}
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT step, wall_s, device_s FROM steps WHERE profiled = 0 ORDER BY step").fetchall()
        result["cuda_allocated_max"] = db.execute("SELECT max(cuda_allocated) FROM steps").fetchone()[0]
    device = [d for _, _, d in rows if d is not None]
    result.update(rows=len(rows), rows_with_device_s=len(device))
    if device:
        result["device_ms_p50"] = statistics.median(device) * 1e3
        result["wall_ms_p50"] = statistics.median(w for _, w, _ in rows) * 1e3
    if own.exists():
        gaps = json.loads(own.read_text())
        result["own_event_ms_p50"] = statistics.median(gaps) if gaps else None
    show = run([sys.executable, "-m", "skalpel", "watch", "--show", str(folder)], log, 60)
    result["show_mentions_device"] = "device" in (show.stdout or "").lower()
    return result


def watch_leak(out: Path, log) -> dict:
    folder = out / "watch-leak"
    run([sys.executable, "-m", "skalpel", "watch", "--out", str(folder), str(HERE / "watch_leak.py"), "--steps", "600"],
        log, 400)
    store = folder / "watch.sqlite"
    if not store.exists():
        return {"error": "no watch.sqlite"}
    with sqlite3.connect(store) as db:
        anomalies = [dict(zip([c[0] for c in db.execute("SELECT * FROM anomalies").description], row))
                     for row in db.execute("SELECT * FROM anomalies").fetchall()]
        allocated = db.execute("SELECT step, cuda_allocated FROM steps WHERE step IN (100, 140, 300, 500)").fetchall()
    reports = sorted(folder.rglob("report.json"))
    captures = {str(path.parent.relative_to(folder)): findings(path.parent) for path in reports}
    return {"anomalies": anomalies, "cuda_allocated_at": allocated, "captures": captures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="scenario names, or watch (default: all, then the watch checks)")
    parser.add_argument("--watch-steps", type=int, default=300, help="steps of the watched clean.py (300)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"python": sys.version.split()[0]}

    def done(name: str, result: dict) -> None:  # written as it goes: a check cut short keeps what it measured
        summary[name] = result
        print(json.dumps(result, indent=1, default=str), flush=True)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))

    with open(args.out / "log.txt", "w") as log:
        for name, planted, fix_removes in SCENARIOS:
            if not args.only or name in args.only:
                print(f"scenario {name} ...", flush=True)
                done(name, scenario(name, planted, fix_removes, args.out, log))
        if not args.only or "watch" in args.only:
            print("watch: device time ...", flush=True)
            done("watch_device_time", watch_device_time(args.out, log, args.watch_steps))
            print("watch: memory kept on the device ...", flush=True)
            done("watch_leak", watch_leak(args.out, log))
        for name, planted, fix_removes in LAST:
            if not args.only or name in args.only:
                print(f"scenario {name} ...", flush=True)
                done(name, scenario(name, planted, fix_removes, args.out, log))


if __name__ == "__main__":
    main()
