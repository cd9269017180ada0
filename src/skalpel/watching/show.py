"""Reading watched runs back: ``skalpel watch --show RUN`` and ``skalpel history``.

A run's step time and memory as compact text timelines (one column per stretch of steps,
its median drawn as a block), the anomalies with their step and capture, and for
``history`` the runs of a folder and the step-time distribution of two side by side.
Readable while the run goes on (the store is in WAL mode). No torch here.
"""

from __future__ import annotations

import math
import os
import sqlite3
import statistics
from pathlib import Path

from ..capture.runfolder import DEFAULT_PARENT
from ..errors import SkalpelError
from . import ranks
from .store import PHASE_COLUMNS, STORE, has_columns, open_run, read_meta

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 60
MIB = 2**20
PERCENTILES = (10, 50, 90, 99)


def show_run(path: str | Path, *, width: int = WIDTH) -> str:
    ranks = sorted(Path(path).glob(f"rank*/{STORE}")) if Path(path).is_dir() and not (Path(path) / STORE).exists() else []
    if ranks:  # a torchrun job: one folder per rank
        return "".join(show_run(store.parent, width=width) for store in ranks) + slowest_rank([s.parent for s in ranks])
    db = open_run(path)
    try:
        meta = read_meta(db)
        phases = ", " + ", ".join(PHASE_COLUMNS) if has_columns(db, *PHASE_COLUMNS) else ""  # an older store: none
        device = ", device_s" if has_columns(db, "device_s") else ""
        rows = db.execute(f"SELECT step, wall_s, loader_s, rss, cuda_allocated, profiled{phases}{device} FROM steps "
                          "ORDER BY step").fetchall()  # fmt: skip
        anomalies = db.execute("SELECT step, kind, message, capture, summary FROM anomalies ORDER BY step").fetchall()
    finally:
        db.close()
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    lines = [f"{folder}: {meta.get('script', '?')} ({meta.get('status', '?')}"
             + (f", exit status {meta['exit_status']}" if meta.get("exit_status") not in (None, "None") else "")
             + f"), started {meta.get('started', '?')}"]  # fmt: skip
    if not rows:
        lines.append("no step recorded yet")
        return "\n".join(lines) + "\n"
    walls = [row["wall_s"] for row in rows if not row["profiled"]] or [row["wall_s"] for row in rows]
    loader = sum(row["loader_s"] for row in rows) / max(sum(row["wall_s"] for row in rows), 1e-12)
    lines.append(f"{len(rows)} steps (steps {rows[0]['step']}-{rows[-1]['step']}); step time "
                 + ", ".join(f"p{p} {_ms(_percentile(walls, p))}" for p in PERCENTILES)
                 + f"; DataLoader wait {loader * 100:.1f}% of the time")  # fmt: skip
    on_device = [row["device_s"] for row in rows if not row["profiled"] and row["device_s"] is not None] if device else []
    if on_device:  # CUDA events, read back late: the steps the device had finished
        lines.append("device time " + ", ".join(f"p{p} {_ms(_percentile(on_device, p))}" for p in PERCENTILES)
                     + f" (CUDA events, {len(on_device)} steps)")  # fmt: skip
    if phases:
        lines += _split([row for row in rows if not row["profiled"]])
    steps = [row["step"] for row in rows]
    lines += _timeline("step time", steps, [row["wall_s"] * 1e3 for row in rows], "ms", width)
    memory_key = "cuda_allocated" if rows[-1]["cuda_allocated"] is not None else "rss"
    memory = [row[memory_key] for row in rows]
    if all(value is not None for value in memory):
        label = "CUDA allocated" if memory_key == "cuda_allocated" else "RSS"
        lines += _timeline(label, steps, [value / MIB for value in memory], "MiB", width)
    marks = [" "] * width
    for anomaly in anomalies:
        marks[_column(anomaly["step"], steps, width)] = "^"
    if anomalies:
        lines.append(f"{'anomalies':>15} |{''.join(marks)}|")
    lines.append(f"{len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'}")
    for anomaly in anomalies:
        lines.append(f"  step {anomaly['step']}: {anomaly['kind']}: {anomaly['message']}")
        if anomaly["capture"]:
            where = os.path.normpath(folder / anomaly["capture"])  # a job's capture: rankN/../capture-... is JOB's
            lines.append(f"    capture: {where} ({anomaly['summary']})")
    return "\n".join(lines) + "\n"


def _split(rows: list[sqlite3.Row]) -> list[str]:
    """Where the step time went: forward (the rest), backward, the optimizer, the DataLoader; un-profiled steps."""
    timed = [row for row in rows if row["forward_s"] is not None]
    total = sum(row["wall_s"] for row in timed)
    if not timed or total <= 0:
        return []
    parts = [(name, sum(row[column] for row in timed) / total) for name, column in
             (("forward", "forward_s"), ("backward", "backward_s"), ("optimizer", "optimizer_s"),
              ("DataLoader", "loader_s"))]  # fmt: skip
    return ["time split: " + " · ".join(f"{name} {share * 100:.1f}%" for name, share in parts)
            + " (forward: the rest of the step, the forward pass and whatever else the loop does)"]  # fmt: skip


def _timeline(label: str, steps: list[int], values: list[float], unit: str, width: int) -> list[str]:
    columns: list[list[float]] = [[] for _ in range(width)]
    for step, value in zip(steps, values):
        columns[_column(step, steps, width)].append(value)
    medians = [statistics.median(column) if column else None for column in columns]
    present = [value for value in medians if value is not None]
    low, high = min(present), max(present)
    # a wide range (one stall among steady steps) on a log scale, so that a 2x change still shows
    scale = math.log if low > 0 and high / low > 4 else (lambda value: value)
    span = scale(high) - scale(low)
    cells = "".join(" " if value is None else BLOCKS[round((scale(value) - scale(low)) / span * (len(BLOCKS) - 1))
                                                     if span else 0] for value in medians)  # fmt: skip
    note = ", log scale" if scale is math.log else ""
    return [f"{label:>15} |{cells}| {low:.1f}-{high:.1f} {unit} (median per {max(len(steps) // width, 1)} steps{note})"]


def _column(step: int, steps: list[int], width: int) -> int:
    first, last = steps[0], steps[-1]
    return min(int((step - first) / max(last - first + 1, 1) * width), width - 1) if step >= first else 0


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(pct / 100 * (len(ordered) - 1))), len(ordered) - 1)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def slowest_rank(folders: list[Path]) -> str:
    """The rank that falls behind: in a job the others wait for it in every collective, so their step times
    match its own; what it does more of is CPU work in each step (its median ``cpu_s``)."""
    medians = {}
    for folder in folders:
        db = open_run(folder)
        try:
            cpu = [row[0] for row in db.execute("SELECT cpu_s FROM steps WHERE profiled = 0")]
        finally:
            db.close()
        if cpu:
            medians[folder.name] = statistics.median(cpu)
    if len(medians) < 2:
        return ""
    verdict = ranks.judge(medians)
    if verdict is None:
        return f"ranks: no rank falls behind (CPU time a step: {', '.join(f'{n} {_ms(v)}' for n, v in medians.items())})\n"
    return f"ranks: {ranks.message(*verdict)}\n"


# -- skalpel history ---------------------------------------------------------------------------
def list_runs(parent: str | Path = DEFAULT_PARENT) -> str:
    parent = Path(parent)
    if not parent.is_dir():
        raise SkalpelError(f"no folder {parent}: skalpel watch writes its runs under ./{DEFAULT_PARENT} (or --out)")
    runs = sorted(store.parent for store in parent.glob(f"*/{STORE}"))
    if not runs:
        return f"no watched run under {parent}\n"
    lines = [f"{'run':<44} {'steps':>7} {'median':>10} {'p99':>10} {'anomalies':>9}  status"]
    for folder in runs:
        try:
            facts = _facts(folder)
        except SkalpelError as error:
            lines.append(f"{folder.name:<44} {error}")
            continue
        lines.append(f"{folder.name:<44} {facts['steps']:>7} {facts['p50']:>10} {facts['p99']:>10} "
                     f"{facts['anomalies']:>9}  {facts['status']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _facts(folder: Path) -> dict[str, object]:
    db = open_run(folder)
    try:
        walls = _walls(db)
        anomalies = db.execute("SELECT count(*) FROM anomalies").fetchone()[0]
        status = read_meta(db).get("status", "?")
    finally:
        db.close()
    return {"steps": len(walls), "anomalies": anomalies, "status": status,
            "p50": _ms(_percentile(walls, 50)) if walls else "-", "p99": _ms(_percentile(walls, 99)) if walls else "-"}  # fmt: skip


def _walls(db: sqlite3.Connection) -> list[float]:
    return [row[0] for row in db.execute("SELECT wall_s FROM steps WHERE profiled = 0 ORDER BY step")]


def compare_runs(before: str | Path, after: str | Path) -> str:
    """The step-time distribution of two watched runs side by side (un-profiled steps)."""
    sides = []
    for path in (before, after):
        db = open_run(path)
        try:
            walls = _walls(db)
        finally:
            db.close()
        if not walls:
            raise SkalpelError(f"{path}: no step recorded")
        sides.append(walls)
    lines = [f"{'':>8} {Path(before).name[:30]:>30} {Path(after).name[:30]:>30} {'change':>8}",
             f"{'steps':>8} {len(sides[0]):>30} {len(sides[1]):>30}"]  # fmt: skip
    for pct in PERCENTILES:
        one, two = (_percentile(walls, pct) for walls in sides)
        lines.append(f"{'p' + str(pct):>8} {_ms(one):>30} {_ms(two):>30} {(two / one - 1) * 100:>+7.1f}%")
    return "\n".join(lines) + "\n"
