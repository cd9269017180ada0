"""Hand-written inline SVG charts for the HTML report: stacked bars, step bars, a line curve.

Each function returns one ``<svg class="chart">`` string with every label escaped. Hover
details live in ``data-tip`` attributes (shown by the page's small script) and in
``<title>`` children, so the charts still explain themselves with scripts off.
"""

from __future__ import annotations

import math
import statistics
import sys
from html import escape
from typing import Callable, Mapping, Sequence

PALETTE = {
    "kernel": "#4e79a7", "memcpy": "#f28e2b", "memset": "#edc948", "communication": "#b07aa1",
    "runtime": "#ff9da7", "dataloader": "#e15759", "cpu_exec": "#76b7b2", "other": "#bab0ac",
    "host_wait": "#e15759", "kernel_wait": "#f28e2b", "idle": "#e15759", "compute": "#4e79a7",
    "non_compute": "#f28e2b",
}  # fmt: skip
_EXTRA = ("#59a14f", "#9c755f", "#af7aa1", "#86bcb6", "#d37295", "#8cd17d", "#499894", "#79706e")
WIDTH = 900


def color(name: str, index: int = 0) -> str:
    return PALETTE.get(name, _EXTRA[index % len(_EXTRA)])


def _tip(text: str) -> str:
    return f' data-tip="{escape(text)}"'


def stacked_bars(rows: Sequence[tuple[str, Mapping[str, float]]], *, unit: str = "%",
                 scale_max: float | None = None, label: str = "") -> str:  # fmt: skip
    """One horizontal stacked bar per row (e.g. per rank), segments in the mapping's order."""
    names: list[str] = []
    for _, parts in rows:
        names += [name for name in parts if name not in names]
    total = scale_max or max((sum(max(v, 0) for v in parts.values()) for _, parts in rows), default=1) or 1
    left, bar_h, gap = 90, 26, 10
    plot_w = WIDTH - left - 20
    legend_h = 24 * math.ceil(len(names) / 6)
    height = legend_h + len(rows) * (bar_h + gap) + 10
    out = [_open(height, label)]
    out += _legend(names, 0)
    for i, (row_label, parts) in enumerate(rows):
        y = legend_h + i * (bar_h + gap)
        out.append(f'<text x="{left - 8}" y="{y + bar_h * 0.68:.1f}" text-anchor="end">{escape(row_label)}</text>')
        x = float(left)
        for name, value in parts.items():
            w = max(value, 0) / total * plot_w
            if w <= 0:
                continue
            tip = f"{row_label} · {name}: {value:.1f}{unit}"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{color(name, names.index(name))}"'
                       f'{_tip(tip)}><title>{escape(tip)}</title></rect>')  # fmt: skip
            if w > 38:
                out.append(f'<text class="in" x="{x + w / 2:.1f}" y="{y + bar_h * 0.68:.1f}" text-anchor="middle">'
                           f"{value:.0f}{escape(unit)}</text>")  # fmt: skip
            x += w
    out.append("</svg>")
    return "".join(out)


# the blame analysis's causes (analysis/blame.py CATEGORIES), always in this order and these colours
BLAME_COLORS = {
    "data_loading": "#e15759", "host_compute": "#76b7b2", "compile": "#59a14f", "sync": "#f28e2b",
    "launch_overhead": "#ff9da7", "collective_wait": "#b07aa1", "one_time_init": "#edc948",
    "other_stream": "#4e79a7", "unexplained": "#bab0ac",
}  # fmt: skip
BLAME_LEFT, BLAME_RIGHT = 90, 80  # room for the step's name and its total idle time


# the ledger's causes (analysis/ledger.py), in its order of precedence and these colours
LEDGER_COLORS = {
    "one_time": "#edc948", "profiler": "#9c755f", "compile": "#59a14f", "data_wait": "#e15759",
    "collective_wait": "#b07aa1", "sync_wait": "#f28e2b", "allocator": "#d37295", "launch": "#ff9da7",
    "launch_overhead": "#ff9da7", "optimizer": "#8cd17d", "backward": "#499894", "compute": "#4e79a7",
    "collective": "#d4a6c8", "transfer": "#86bcb6", "host_work": "#76b7b2", "other_stream": "#a0cbe8",
    "python": "#f1ce63", "other_thread": "#79706e", "unrecorded": "#bab0ac",
}  # fmt: skip


def blame_bars(rows: Sequence[tuple[str, Mapping[str, float]]], *, label: str = "",
               colors: Mapping[str, str] = BLAME_COLORS, of: str = "its idle time") -> str:  # fmt: skip
    """One horizontal bar per step, its length the step's idle ms (``of``), split by cause (fixed order and colours).

    Causes the table above does not know (an older or newer report) follow the known ones, in their order.
    """
    seen = {name for _, parts in rows for name, value in parts.items() if value > 0}
    names = [name for name in colors if name in seen]
    names += sorted(seen - set(names))
    colours = {name: colors.get(name) or _EXTRA[i % len(_EXTRA)] for i, name in enumerate(names)}
    top = max((sum(max(v, 0) for v in parts.values()) for _, parts in rows), default=0.0) or 1.0
    bar_h, gap = 20, 6
    plot_w = WIDTH - BLAME_LEFT - BLAME_RIGHT
    legend_h = 24 * math.ceil(len(names) / 6)
    out = [_open(legend_h + len(rows) * (bar_h + gap) + 10, label)]
    for i, name in enumerate(names):
        x, y = BLAME_LEFT + (i % 6) * 130, 24 * (i // 6)
        out.append(f'<rect x="{x}" y="{y + 4}" width="12" height="12" fill="{colours[name]}"/>'
                   f'<text x="{x + 17}" y="{y + 15}">{escape(name)}</text>')  # fmt: skip
    for i, (row_label, parts) in enumerate(rows):
        y = legend_h + i * (bar_h + gap)
        total = sum(max(v, 0) for v in parts.values())
        out.append(f'<text x="{BLAME_LEFT - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(row_label)}</text>')
        x = float(BLAME_LEFT)
        for name in names:
            value = parts.get(name, 0.0)
            if value <= 0:
                continue
            w = value / top * plot_w
            tip = f"{row_label} · {name}: {value:.2f} ms ({100.0 * value / total:.1f}% of {of})"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colours[name]}"'
                       f'{_tip(tip)}><title>{escape(tip)}</title></rect>')  # fmt: skip
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{total:.2f} ms</text>')
    out.append("</svg>")
    return "".join(out)


def _legend(names: Sequence[str], y: int) -> list[str]:
    out = []
    for i, name in enumerate(names):
        x, row = 90 + (i % 6) * 130, y + 24 * (i // 6)
        out.append(f'<rect x="{x}" y="{row + 4}" width="12" height="12" fill="{color(name, i)}"/>'
                   f'<text x="{x + 17}" y="{row + 15}">{escape(name)}</text>')  # fmt: skip
    return out


def _open(height: float, label: str) -> str:
    return (f'<svg class="chart" role="img" aria-label="{escape(label)}" viewBox="0 0 {WIDTH} {height:.0f}" '
            f'width="100%" preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">')  # fmt: skip


def nice_ticks(top: float, count: int = 5) -> list[float]:
    if not math.isfinite(top) or top <= 0:  # nothing to scale (a value that cannot be measured never reaches here)
        return [0.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(top / step) + 2) if i * step <= top * 1.0001 or i == 1]


def step_bars(series: Sequence[tuple[str, Sequence[float]]], *, label: str = "step time") -> str:
    """Step time per step (ms), one bar per step and rank, with the median as a dashed line."""
    # a step time that is not a finite number is not drawn (the report's reader refuses one; a caller may not)
    series = [(name, [value for value in values if math.isfinite(value)]) for name, values in series]
    series = [(name, values) for name, values in series if values]
    n = max((len(values) for _, values in series), default=0)
    top = max((max(values) for _, values in series), default=1.0)
    top = (top * 1.1 if top < sys.float_info.max / 1.1 else top) or 1.0
    left, bottom, height = 70, 34, 260
    plot_w, plot_h = WIDTH - left - 20, height - bottom - 24
    slot = plot_w / max(n, 1)
    bar_w = max(slot * 0.8 / max(len(series), 1), 0.5)
    out = [_open(height + (24 if len(series) > 1 else 0), label)]
    out += _y_axis(top, left, plot_w, plot_h, 10, lambda v: f"{v:g} ms")
    for k, (name, values) in enumerate(series):
        fill = _EXTRA[k % len(_EXTRA)] if len(series) > 1 else PALETTE["kernel"]
        for i, value in enumerate(values):
            h = value / top * plot_h
            x = left + i * slot + slot * 0.1 + k * bar_w
            tip = f"{name} step {i}: {value:.2f} ms"
            out.append(f'<rect x="{x:.1f}" y="{10 + plot_h - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                       f'fill="{fill}"{_tip(tip)}><title>{escape(tip)}</title></rect>')  # fmt: skip
    median = statistics.median(v for _, values in series for v in values) if n else 0.0
    y = 10 + plot_h - median / top * plot_h
    out.append(f'<line class="median" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
               f'<text x="{left + plot_w}" y="{y - 4:.1f}" text-anchor="end">median {median:.2f} ms</text>')  # fmt: skip
    step_every = max(1, math.ceil(n / 20))
    for i in range(0, n, step_every):
        out.append(f'<text x="{left + (i + 0.5) * slot:.1f}" y="{plot_h + 28}" text-anchor="middle">{i}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{plot_h + 46}" text-anchor="middle" class="axis">step</text>')
    if len(series) > 1:
        out += [f'<rect x="{90 + k * 120}" y="{height + 4}" width="12" height="12" fill="{_EXTRA[k % len(_EXTRA)]}"/>'
                f'<text x="{107 + k * 120}" y="{height + 15}">{escape(name)}</text>' for k, (name, _) in enumerate(series)]  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _y_axis(top: float, left: float, plot_w: float, plot_h: float, y0: float, fmt: Callable[[float], str]) -> list[str]:
    out = []
    for tick in nice_ticks(top):
        y = y0 + plot_h - tick / top * plot_h
        out.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(tick))}</text>')  # fmt: skip
    return out


def line_curve(points: Sequence[tuple[float, float]], *, peak: tuple[float, float] | None,
               y_fmt: Callable[[float], str], x_label: str, label: str = "curve") -> str:  # fmt: skip
    """A filled line over time (x ascending) with the peak marked."""
    xs = [p[0] for p in points]
    x0, x1 = min(xs), max(xs)
    top = max(p[1] for p in points) * 1.1 or 1.0
    left, height = 90, 280
    plot_w, plot_h = WIDTH - left - 20, height - 60

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def py(y: float) -> float:
        return 10 + plot_h - y / top * plot_h

    out = [_open(height, label)]
    out += _y_axis(top, left, plot_w, plot_h, 10, y_fmt)
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    area = f"{px(x0):.1f},{py(0):.1f} {line} {px(x1):.1f},{py(0):.1f}"
    out.append(f'<polygon class="area" points="{area}"/><polyline class="line" points="{line}"/>')
    if peak is not None:
        cx, cy = px(min(max(peak[0], x0), x1)), py(peak[1])
        tip = f"peak {y_fmt(peak[1])} at {peak[0]:.1f} ms"
        out.append(f'<circle class="peak" cx="{cx:.1f}" cy="{cy:.1f}" r="5"{_tip(tip)}><title>{escape(tip)}</title></circle>'
                   f'<text x="{min(cx + 8, left + plot_w - 150):.1f}" y="{max(cy - 8, 12):.1f}" class="peaklabel">'
                   f"{escape(tip)}</text>")  # fmt: skip
    ticks = nice_ticks(x1 - x0 or 1, 8)
    spacing = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    tick = math.ceil(x0 / spacing) * spacing
    while tick <= x1:
        out.append(f'<text x="{px(tick):.1f}" y="{plot_h + 28}" text-anchor="middle">{tick:g}</text>')
        tick += spacing
    out.append(f'<text x="{left + plot_w / 2}" y="{plot_h + 46}" text-anchor="middle" class="axis">{escape(x_label)}</text>')
    out.append("</svg>")
    return "".join(out)


def stacked_area(rows: Sequence[Sequence[float]], names: Sequence[str], *, y_fmt: Callable[[float], str],
                 x_label: str, label: str = "stacked area") -> str:  # fmt: skip
    """Layers stacked over time: each row is (x, value of each name), x ascending."""
    if not rows:
        return ""
    x0, x1 = rows[0][0], rows[-1][0]
    top = max(sum(max(v, 0) for v in row[1:]) for row in rows) * 1.1 or 1.0
    left, legend_h = 90, 24 * math.ceil(len(names) / 6)
    height = legend_h + 280
    plot_w, plot_h = WIDTH - left - 20, 220
    y0 = legend_h + 10

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def py(y: float) -> float:
        return y0 + plot_h - y / top * plot_h

    out = [_open(height, label), *_legend(names, 0), *_y_axis(top, left, plot_w, plot_h, y0, y_fmt)]
    below = [0.0] * len(rows)
    for layer, name in enumerate(names):
        above = [base + max(row[1 + layer], 0) for base, row in zip(below, rows)]
        if any(a > b for a, b in zip(above, below)):
            edge = " ".join(f"{px(row[0]):.1f},{py(a):.1f}" for row, a in zip(rows, above))
            back = " ".join(f"{px(row[0]):.1f},{py(b):.1f}" for row, b in reversed(list(zip(rows, below))))
            tip = f"{name}: up to {y_fmt(max(row[1 + layer] for row in rows))}"
            out.append(f'<polygon points="{edge} {back}" fill="{color(name, layer)}"{_tip(tip)}>'
                       f"<title>{escape(tip)}</title></polygon>")  # fmt: skip
        below = above
    for tick in nice_ticks(x1 - x0 or 1, 8):
        if tick <= x1 - x0:
            out.append(f'<text x="{px(x0 + tick):.1f}" y="{y0 + plot_h + 18}" text-anchor="middle">{tick:g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{y0 + plot_h + 36}" text-anchor="middle" class="axis">'
               f"{escape(x_label)}</text></svg>")  # fmt: skip
    return "".join(out)
