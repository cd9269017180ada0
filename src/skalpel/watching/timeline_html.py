"""``skalpel watch --show RUN --html FILE``: a watched run as one self-contained HTML page.

The step-time and memory timelines as inline SVG, one ``<path>`` each (the median of each pixel
column, over a band from its minimum to its maximum: 100,000 steps draw as about 800 columns, so
the page stays small whatever the run's length); each column's steps and values on hover; the
anomalies marked at their step (kind and message on hover), each linked to its capture's
report; the run's summary; and for a torchrun job (``rank*/`` stores) one row and one pair of
timelines per rank. The page shell, CSS, tooltip script and CSP are the HTML report's
(``report/html.py``); every string from the store is escaped. No torch here.
"""

from __future__ import annotations

import math
import os
import sqlite3
import statistics
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Sequence
from urllib.parse import quote

from ..files import write_file
from ..report import html_parts as parts
from ..report import html_svg as svg
from ..report.html import page
from .show import MIB, PERCENTILES, _ms, _percentile, slowest_rank
from .store import STORE, open_run, read_meta

LEFT, RIGHT, TOP, PLOT_H = 80, 20, 12, 170
HEIGHT = TOP + PLOT_H + 44  # room for the step axis and its label
COLUMNS = svg.WIDTH - LEFT - RIGHT  # one pixel column of the 900-wide viewBox each
HOVER_TARGETS = 3200  # hover rectangles on the whole page; a job's many timelines get coarser ones
MIN_SPAN = 0.01  # a linear memory axis spans at least 1% of its top: a flat line with noise of a few KiB stays flat
LOG_RATIO = 4  # a range wider than this (a stall among steady steps) is drawn on a log scale, as --show does
MARK = "#d62728"
SERIES = {"step time": "#4e79a7", "device time": "#f28e2b", "memory": "#59a14f"}


@dataclass
class Run:
    """One store read back: a run, or one rank of a job."""

    name: str
    folder: Path
    meta: dict[str, str]
    steps: list[int] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)  # seconds
    loader: list[float] = field(default_factory=list)
    profiled: list[bool] = field(default_factory=list)
    memory_label: str = ""
    memory: list[tuple[int, float]] = field(default_factory=list)  # (step, bytes), steps that have it
    device: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds on the device), steps read back
    anomalies: list[dict[str, object]] = field(default_factory=list)


def write_run_html(path: str | Path, out: Path) -> Path:
    """Render the run (or job) at ``path`` into ``out``; the captures' links are relative to ``out``'s folder."""
    return write_file(out, render_run(path, page_dir=out.resolve().parent))


def render_run(path: str | Path, *, page_dir: Path) -> str:
    path = Path(path)
    stores = sorted(path.glob(f"rank*/{STORE}"), key=_rank_order) if path.is_dir() and not (path / STORE).exists() else []
    runs = [_read(store.parent, store.parent.name) for store in stores] if stores else [_read(path, "")]
    folder = path if path.is_dir() else path.parent
    script = runs[0].meta.get("script", "?")
    title = f"skalpel watch: {script}"
    facts = [f"status: {runs[0].meta.get('status', '?')}", f"started: {runs[0].meta.get('started', '?')}",
             f"steps: {sum(len(run.steps) for run in runs)}"]  # fmt: skip
    if len(runs) > 1:
        facts.append(f"ranks: {len(runs)}")
    exit_status = runs[0].meta.get("exit_status")
    if exit_status not in (None, "None"):
        facts.append(f"exit status: {exit_status}")
    pills = "".join(f'<span class="pill">{escape(fact)}</span>' for fact in facts)
    head = f'<header><h1>{escape(title)}</h1><div>{pills}</div><p class="meta mono">{escape(str(folder))}</p></header>'
    for run in runs:  # the anomalies' table and their marks on the timelines link the same place
        for anomaly in run.anomalies:
            anomaly["href"] = _capture_href(run.folder, anomaly.get("capture"), page_dir)
    body = [head, _summary(runs, [store.parent for store in stores]), _timelines(runs), _anomalies(runs)]
    return page(title, "".join(body))


def _rank_order(store: Path) -> tuple[int, str]:
    digits = store.parent.name.removeprefix("rank")
    return (int(digits), "") if digits.isdigit() else (1 << 30, digits)


def _read(path: Path, name: str) -> Run:
    db = open_run(path)
    try:
        meta = read_meta(db)
        have = _columns(db, "steps")
        wanted = [column for column in ("step", "wall_s", "loader_s", "rss", "cuda_allocated", "profiled", "device_s")
                  if column in have]  # fmt: skip
        rows = db.execute(f"SELECT {', '.join(wanted)} FROM steps ORDER BY step").fetchall()
        have_anomaly = _columns(db, "anomalies")
        asked = [column for column in ("step", "kind", "message", "capture", "summary") if column in have_anomaly]
        anomalies = [dict(row) for row in db.execute(f"SELECT {', '.join(asked)} FROM anomalies ORDER BY step")]
    finally:
        db.close()
    run = Run(name, path if path.is_dir() else path.parent, meta, anomalies=anomalies)
    run.steps = [int(row["step"]) for row in rows]
    run.walls = [float(row["wall_s"] or 0.0) for row in rows]
    run.loader = [float(row["loader_s"] or 0.0) for row in rows] if "loader_s" in wanted else [0.0] * len(rows)
    run.profiled = [bool(row["profiled"]) for row in rows] if "profiled" in wanted else [False] * len(rows)
    # CUDA allocated once the script uses CUDA (what memory_creep judges then), else RSS; as --show chooses
    key = "cuda_allocated" if "cuda_allocated" in wanted and rows and rows[-1]["cuda_allocated"] is not None else "rss"
    if key in wanted:
        run.memory_label = "CUDA allocated" if key == "cuda_allocated" else "RSS"
        run.memory = [(int(row["step"]), float(row[key])) for row in rows if row[key] is not None]
    if "device_s" in wanted:  # CUDA events read back late: none without CUDA, or for steps still on the device
        run.device = [(int(row["step"]), float(row["device_s"])) for row in rows if row["device_s"] is not None]
    return run


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    """The table's columns as this store has them (an older or newer schema: read only what exists)."""
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


# -- the summary -------------------------------------------------------------------------------
def _summary(runs: list[Run], rank_folders: list[Path]) -> str:
    headers = [("rank" if len(runs) > 1 else "run", False), ("steps", True)]
    headers += [(f"p{p}", True) for p in PERCENTILES] + [("DataLoader wait", True), ("memory peak", True),
                                                         ("anomalies", True)]  # fmt: skip
    rows = []
    for run in runs:
        judged = [wall for wall, profiled in zip(run.walls, run.profiled) if not profiled] or run.walls
        cells = [f"<td>{escape(run.name or run.folder.name)}</td>", parts.num(len(run.steps))]
        cells += [parts.num(_percentile(judged, p) * 1e3, _ms(_percentile(judged, p))) if judged else parts.num(None)
                  for p in PERCENTILES]  # fmt: skip
        share = sum(run.loader) / max(sum(run.walls), 1e-12) * 100 if run.walls else None
        cells.append(parts.num(share, f"{share:.1f}% of the time") if share is not None else parts.num(None))
        peak = max((value for _, value in run.memory), default=None)
        cells.append(parts.num(peak, f"{parts.fmt_bytes(peak)} ({run.memory_label})") if peak is not None else parts.num(None))
        cells.append(parts.num(len(run.anomalies)))
        rows.append(f"<tr>{''.join(cells)}</tr>")
    body = (parts.table(headers, rows) + '<p class="note">Step-time percentiles over the steps outside captures; '
            "the DataLoader wait as a share of all the steps' time.</p>")  # fmt: skip
    behind = slowest_rank(rank_folders) if len(rank_folders) > 1 else ""
    if behind:
        body += f"<p>{escape(behind.strip())}</p>"
    return parts.section("summary", "Summary", body)


# -- the timelines -----------------------------------------------------------------------------
def _timelines(runs: list[Run]) -> str:
    with_steps = [run for run in runs if run.steps]
    if not with_steps:
        return parts.section("timelines", "Timelines", parts.na("no step recorded yet"))
    first = min(run.steps[0] for run in with_steps)  # one step axis for every rank, so that they line up
    last = max(run.steps[-1] for run in with_steps)
    charts = sum(1 + bool(run.device) + bool(run.memory) for run in with_steps)
    hover = max(COLUMNS // max(math.ceil(charts * COLUMNS / HOVER_TARGETS), 1), 50)
    body = ['<p class="note">The median of the steps in each pixel column, over a band from their minimum to their '
            "maximum; hover for a column's steps and values. A red mark is an anomaly at its step: hover for its "
            "message, click for its capture. Grey: a capture's steps (profiled). On a CUDA machine, the device time: "
            "each step's time on the GPU between CUDA events recorded at its boundaries.</p>"]  # fmt: skip
    for run in with_steps:
        if len(runs) > 1:
            body.append(f"<h3>{escape(run.name)}</h3>")
        ms = [wall * 1e3 for wall in run.walls]
        body.append(timeline_svg(run.steps, ms, first=first, last=last, unit="ms", label=f"{run.name} step time".strip(),
                                 colour=SERIES["step time"], anomalies=run.anomalies, profiled=run.profiled,
                                 hover_columns=hover, step_time=True))  # fmt: skip
        if run.device:
            body.append(timeline_svg([step for step, _ in run.device], [seconds * 1e3 for _, seconds in run.device],
                                     first=first, last=last, unit="ms", label=f"{run.name} device time".strip(),
                                     colour=SERIES["device time"], anomalies=run.anomalies, hover_columns=hover))  # fmt: skip
        if run.memory:
            body.append(timeline_svg([step for step, _ in run.memory], [value / MIB for _, value in run.memory],
                                     first=first, last=last, unit="MiB", label=f"{run.name} {run.memory_label}".strip(),
                                     colour=SERIES["memory"], anomalies=run.anomalies, hover_columns=hover))  # fmt: skip
        else:
            body.append(parts.na(f"{run.name or 'the run'}: no memory recorded"))
    return parts.section("timelines", "Timelines", "".join(body))


def timeline_svg(steps: list[int], values: list[float], *, first: int, last: int, unit: str, label: str, colour: str,
                 anomalies: Sequence[dict[str, object]] = (), profiled: list[bool] | None = None,
                 hover_columns: int = COLUMNS, step_time: bool = False) -> str:  # fmt: skip
    """One value per step over steps ``first..last``: one ``<path>`` (each pixel column's median) over its min-max band.

    ``step_time``: drawn from 0, or on a log scale when its range passes ``LOG_RATIO``.
    """
    span = max(last - first + 1, 1)

    def column(step: int) -> int:
        return min(max(int((step - first) / span * COLUMNS), 0), COLUMNS - 1)

    groups: dict[int, list[tuple[int, float]]] = {}
    for step, value in zip(steps, values):
        groups.setdefault(column(step), []).append((step, value))
    stats = {col: (min(v for _, v in group), statistics.median(v for _, v in group), max(v for _, v in group))
             for col, group in groups.items()}  # fmt: skip
    low = min(low for low, _, _ in stats.values())
    high = max(high for _, _, high in stats.values())
    logarithmic = step_time and low > 0 and high / low > LOG_RATIO
    y, ticks = _scale(low, high, logarithmic, from_zero=step_time)
    out = [svg._open(HEIGHT, label)]
    out.append(f'<text x="{LEFT}" y="{TOP - 2}" class="axis">{escape(label)} ({escape(unit)}'
               f'{", log scale" if logarithmic else ""})</text>')  # fmt: skip
    out += [f'<line class="grid" x1="{LEFT}" x2="{LEFT + COLUMNS}" y1="{y(tick):.1f}" y2="{y(tick):.1f}"/>'
            f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g} {escape(unit)}</text>' for tick in ticks]
    out += _profiled_spans(steps, profiled, column)
    ordered = sorted(stats)
    upper = " ".join(f"{LEFT + col + 0.5:.1f},{y(stats[col][2]):.1f}" for col in ordered)
    lower = " ".join(f"{LEFT + col + 0.5:.1f},{y(stats[col][0]):.1f}" for col in reversed(ordered))
    out.append(f'<polygon class="band" points="{upper} {lower}" fill="{colour}" fill-opacity="0.25" '
               f'stroke="{colour}" stroke-opacity="0.25" stroke-width="1"/>')  # fmt: skip
    median = " ".join(f"{LEFT + col + 0.5:.1f},{y(stats[col][1]):.1f}" for col in ordered)
    out.append(f'<path class="series" d="M{median}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    out += _hover(groups, unit, max(1, math.ceil(COLUMNS / max(hover_columns, 1))))
    out += _marks(anomalies, column)
    out += _step_axis(first, last, column)
    out.append("</svg>")
    return "".join(out)


def _scale(low: float, high: float, logarithmic: bool, from_zero: bool):
    """The value-to-y function of the plot, and its ticks (1-2-5 a decade on a log scale).

    A linear step time starts at 0, so that steady steps look steady; memory starts near its lowest
    value (a creep of 16 MiB on 10 GiB still shows), over at least ``MIN_SPAN`` of its highest.
    """
    if logarithmic:  # a little room above and below, so that the extremes do not lie on the frame
        low, high = low / 1.1, high * 1.1
    elif from_zero and low >= 0:
        low, high = 0.0, (high * 1.05) or 1.0
    else:
        pad = max((high - low) * 0.05, (abs(high) * MIN_SPAN - (high - low)) / 2, 0.0) or 1.0
        low, high = (max(low - pad, 0.0) if low >= 0 else low - pad), high + pad
    if logarithmic:
        ticks = [m * 10**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                 for m in (1, 2, 5) if low <= m * 10**e <= high] or [low, high]  # fmt: skip
    else:
        spacing = svg.nice_ticks(high - low)
        step = spacing[1] - spacing[0] if len(spacing) > 1 else high - low
        ticks = [round(k * step, 10) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
    transform = (lambda value: math.log(max(value, low))) if logarithmic else (lambda value: value)
    bottom, top = transform(low), transform(high)

    def y(value: float) -> float:
        return TOP + PLOT_H - (transform(value) - bottom) / (top - bottom) * PLOT_H

    return y, ticks


def _profiled_spans(steps: list[int], profiled: list[bool] | None, column) -> list[str]:
    out = []
    spans: list[list[int]] = []
    for step, flag in zip(steps, profiled or ()):
        if flag and spans and spans[-1][1] == step - 1:
            spans[-1][1] = step
        elif flag:
            spans.append([step, step])
    for begin, end in spans:
        x0, x1 = column(begin), column(end) + 1
        tip = f"steps {begin}-{end}: a capture's steps (profiled, left out of the percentiles)"
        out.append(f'<rect x="{LEFT + x0}" y="{TOP}" width="{x1 - x0}" height="{PLOT_H}" fill="#bab0ac" '
                   f'fill-opacity="0.35"{svg._tip(tip)}><title>{escape(tip)}</title></rect>')  # fmt: skip
    return out


def _hover(groups: dict[int, list[tuple[int, float]]], unit: str, width: int) -> list[str]:
    """Invisible rectangles over the plot, each ``width`` columns: its steps and their values."""
    out = []
    for start in range(0, COLUMNS, width):
        inside = [pair for col in range(start, start + width) for pair in groups.get(col, ())]
        if not inside:
            continue
        values = [value for _, value in inside]
        if len(inside) == 1:
            tip = f"step {inside[0][0]}: {values[0]:.2f} {unit}"
        else:
            tip = (f"steps {inside[0][0]}-{inside[-1][0]} ({len(inside)}): median {statistics.median(values):.2f}, "
                   f"min {min(values):.2f}, max {max(values):.2f} {unit}")  # fmt: skip
        out.append(f'<rect x="{LEFT + start}" y="{TOP}" width="{width}" height="{PLOT_H}" fill="transparent"'
                   f'{svg._tip(tip)}><title>{escape(tip)}</title></rect>')  # fmt: skip
    return out


def _marks(anomalies: Sequence[dict[str, object]], column) -> list[str]:
    """An anomaly: a red line at its step, a triangle on top; hover for its message, the triangle links its capture."""
    out = []
    for anomaly in anomalies:
        step = anomaly.get("step")
        if step is None:
            continue
        x = LEFT + column(int(step)) + 0.5
        tip = f"step {step} · {anomaly.get('kind', '?')}: {anomaly.get('message', '')}"
        if anomaly.get("capture"):
            tip += f" (click: its capture {anomaly['capture']})"
        mark = (f'<g class="mark" data-step="{int(step)}" data-kind="{escape(str(anomaly.get("kind", "")))}"{svg._tip(tip)}>'
                f"<title>{escape(tip)}</title>"
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + PLOT_H}" stroke="{MARK}" stroke-width="1.5" stroke-opacity="0.7" '
                f'stroke-dasharray="4 3"/><polygon points="{x - 6:.1f},{TOP - 0:.1f} {x + 6:.1f},{TOP - 0:.1f} '
                f'{x:.1f},{TOP + 9:.1f}" fill="{MARK}"/></g>')  # fmt: skip
        href = anomaly.get("href")
        out.append(f'<a href="{escape(str(href))}">{mark}</a>' if href else mark)
    return out


def _step_axis(first: int, last: int, column) -> list[str]:
    ticks = svg.nice_ticks(max(last - first, 1), 8)
    spacing = max(int(ticks[1] - ticks[0]) if len(ticks) > 1 else 1, 1)
    out = []
    tick = math.ceil(first / spacing) * spacing
    while tick <= last:
        out.append(f'<text x="{LEFT + column(tick) + 0.5:.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">{tick}</text>')
        tick += spacing
    out.append(f'<text x="{LEFT + COLUMNS / 2}" y="{TOP + PLOT_H + 34}" text-anchor="middle" class="axis">step</text>')
    return out


# -- the anomalies -----------------------------------------------------------------------------
def _anomalies(runs: list[Run]) -> str:
    job = len(runs) > 1
    rows = []
    count = 0
    for run in runs:
        for anomaly in run.anomalies:
            count += 1
            href = anomaly.get("href")
            capture = (f'<a href="{escape(href)}">{escape(str(anomaly["capture"]))}</a>' if href else "–")
            if href and anomaly.get("summary"):
                capture += f'<br><span class="note">{escape(str(anomaly["summary"]))}</span>'
            cells = [f"<td>{escape(run.name)}</td>"] if job else []
            cells += [parts.num(anomaly.get("step")), f'<td class="mono">{escape(str(anomaly.get("kind", "?")))}</td>',
                      f"<td>{escape(str(anomaly.get('message', '')))}</td>", f"<td>{capture}</td>"]  # fmt: skip
            rows.append(f"<tr>{''.join(cells)}</tr>")
    if not count:
        return parts.section("anomalies", "Anomalies", '<p class="verdict-ok">No anomaly.</p>')
    headers = ([("rank", False)] if job else []) + [("step", True), ("kind", False), ("message", False), ("capture", False)]
    return parts.section("anomalies", f"Anomalies ({count})", parts.table(headers, rows))


def _capture_href(folder: Path, capture: object, page_dir: Path) -> str | None:
    """A link from the page's folder to the capture's report.html (or its folder, before the report is written)."""
    if not capture:
        return None
    target = folder.resolve() / str(capture)
    report = target / "report.html"
    relative = os.path.relpath(report if report.is_file() else target, page_dir)
    return quote(relative.replace(os.sep, "/")) + ("" if report.is_file() else "/")
