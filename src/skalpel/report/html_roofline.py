"""The HTML page's roofline: an inline SVG (log-log, FLOPs per byte against achieved FLOP/s), the roofs, one dot
per judged op group, labelled; and the tables of the op groups and the modules under the roofs.

It reads ``RankReport.roofline`` (analysis/roofline.py). Each distinct pair of roofs (a dtype's peak and the
memory bandwidth) is one line: the slope of the bandwidth up to the ridge, flat at the peak after it. A dot's
label is its op name; its ``<title>`` (hover) gives shapes, dtype, label and the share of its roof. No script,
no font or image from elsewhere: the SVG is text in the page, every name escaped.
"""

from __future__ import annotations

import math

from ..result.report import Report
from ..result.sections import RooflineOp, RooflineSummary
from .html_parts import DETAIL_RANKS, escape, name_cell, num, section, table

WIDTH, HEIGHT = 900, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 30, 20, 70
LABEL_COLORS = {"compute-bound": "#4e79a7", "memory-bound": "#f28e2b", "overhead-bound": "#e15759"}
ROOF_COLORS = ("#59a14f", "#9c755f", "#af7aa1", "#499894")
LABEL_CHARS = 28  # an op's name beside its dot, cut; the whole on hover


def roofline_section(report: Report) -> str:
    ranks = [(rank.rank, rank.roofline) for rank in report.ranks[:DETAIL_RANKS] if rank.roofline is not None]
    if not ranks:
        return ""
    body = []
    for rank, roof in ranks:
        head = f"<h3>rank {rank}</h3>" if len(report.ranks) > 1 else ""
        body.append(head + f'<p class="note">roofs: {escape(roof.roofs)}</p>' + roofline_svg(roof)
                    + _ops_table(roof) + _modules_table(roof))  # fmt: skip
    return section("roofline", "Roofline", "".join(body))


def judged(roof: RooflineSummary) -> list[RooflineOp]:
    """The op groups a dot can stand for: judged, with every figure the chart needs positive."""
    return [op for op in roof.ops if op.label != "not judged" and _positive(op.intensity, op.achieved_gflops,
                                                                           op.peak_gflops, op.peak_gbps)]  # fmt: skip


def _positive(*values) -> bool:
    return all(value is not None and math.isfinite(value) and value > 0 for value in values)


def roofline_svg(roof: RooflineSummary) -> str:
    """The chart, or a note saying why there is none."""
    ops = judged(roof)
    if not ops:
        why = next((op.why for op in roof.ops if op.label == "not judged"), "no op group is judged")
        return f'<p class="na">roofline not drawn: not judged ({escape(why)})</p>'
    roofs = sorted({(op.peak_gflops, op.peak_gbps) for op in ops})
    xs = [op.intensity for op in ops] + [peak / bandwidth for peak, bandwidth in roofs]
    ys = [op.achieved_gflops for op in ops] + [peak for peak, _ in roofs]
    x_lo, x_hi = _decades(min(xs) / 2, max(xs) * 2)
    y_lo, y_hi = _decades(min(ys) / 2, max(ys) * 2)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(value: float) -> float:
        return LEFT + plot_w * (math.log10(value) - x_lo) / (x_hi - x_lo)

    def y_of(value: float) -> float:
        return TOP + plot_h * (1 - (math.log10(value) - y_lo) / (y_hi - y_lo))

    out = [f'<svg class="chart roofline" role="img" aria-label="roofline: FLOPs per byte against achieved GFLOP/s" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" preserveAspectRatio="xMinYMin meet" '
           'xmlns="http://www.w3.org/2000/svg">']  # fmt: skip
    out += _axes(x_lo, x_hi, y_lo, y_hi, x_of, y_of, plot_w, plot_h)
    for index, (peak, bandwidth) in enumerate(roofs):
        start = max(10.0**x_lo, 10.0**y_lo / bandwidth)  # the slope enters the plot at its left or bottom edge
        out.append(_roof_line(peak, bandwidth, start, 10.0**x_hi, x_of, y_of, ROOF_COLORS[index % len(ROOF_COLORS)],
                              index))  # fmt: skip
    placed: list[tuple[float, float, float]] = []  # labels drawn: x, y, width
    for op in sorted(ops, key=lambda op: -op.ms):  # the heaviest first: their labels win a crowded spot
        x, y = x_of(op.intensity), y_of(op.achieved_gflops)
        tip = (f"{op.op} {op.shapes or ''} {op.dtype or ''}: {op.intensity:.3g} FLOP/B, {op.achieved_gflops:.4g} "
               f"GFLOP/s, {op.label}, {op.roof_pct:.0f}% of its roof, {op.ms:.3g} ms per unit")  # fmt: skip
        color = LABEL_COLORS.get(op.label, "#bab0ac")
        name = op.op if len(op.op) <= LABEL_CHARS else op.op[:LABEL_CHARS - 1] + "…"
        at = _free_spot(x + 7, y, 6.2 * len(name), placed)
        text = f'<text x="{x + 7:.1f}" y="{at:.1f}" font-size="11">{escape(name)}</text>' if at is not None else ""
        out.append(f'<g class="op"><circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}"><title>{escape(tip)}</title>'
                   f"</circle>{text}</g>")  # fmt: skip
    legend_y = HEIGHT - 8
    for index, (label, color) in enumerate(LABEL_COLORS.items()):
        x = LEFT + index * 150
        out.append(f'<circle cx="{x}" cy="{legend_y - 4}" r="5" fill="{color}"/>'
                   f'<text x="{x + 9}" y="{legend_y}" font-size="11">{escape(label)}</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _free_spot(x: float, y: float, width: float, placed: list[tuple[float, float, float]]) -> float | None:
    """A baseline near the dot where a label of ``width`` overlaps no label drawn (noted in ``placed``), else None:
    the dot keeps its name on hover."""
    for offset in (-6, 14, -18, 26, -30, 38):
        baseline = y + offset
        if all(abs(baseline - other_y) >= 12 or x + width <= other_x or other_x + other_width <= x
               for other_x, other_y, other_width in placed):  # fmt: skip
            placed.append((x, baseline, width))
            return baseline
    return None


def _rate(gflops: float) -> str:
    return f"{gflops / 1e3:.4g} TFLOP/s" if gflops >= 1e3 else f"{gflops:.4g} GFLOP/s"


def _bandwidth(gbps: float) -> str:
    return f"{gbps / 1e3:.4g} TB/s" if gbps >= 1e3 else f"{gbps:.4g} GB/s"


def _decades(low: float, high: float) -> tuple[float, float]:
    """log10 bounds on whole decades around [low, high], at least one decade apart."""
    lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return float(lo), float(hi if hi > lo else lo + 1)


def _axes(x_lo, x_hi, y_lo, y_hi, x_of, y_of, plot_w, plot_h) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>']
    for power in range(int(x_lo), int(x_hi) + 1):
        x = x_of(10.0**power)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" font-size="11">'
                   f"{_power(power)}</text>")  # fmt: skip
    for power in range(int(y_lo), int(y_hi) + 1):
        y = y_of(10.0**power)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{_power(power)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h + 32}" text-anchor="middle" font-size="12">'
               "arithmetic intensity (FLOP per byte)</text>")  # fmt: skip
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2})">achieved GFLOP/s</text>')  # fmt: skip
    return out


def _power(power: int) -> str:
    return f"{10.0**power:g}" if -3 <= power <= 4 else f"1e{power}"


def _roof_line(peak: float, bandwidth: float, x_min: float, x_max: float, x_of, y_of, color: str, index: int) -> str:
    """The memory slope (GFLOP/s = GB/s x intensity) up to the ridge, then flat at the peak."""
    ridge = peak / bandwidth
    points = [(x_min, min(peak, bandwidth * x_min))]
    if x_min < ridge < x_max:
        points.append((ridge, peak))
    points.append((x_max, min(peak, bandwidth * x_max)))
    drawn = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in points)
    label = f"{_rate(peak)}, {_bandwidth(bandwidth)} (ridge {ridge:.3g} FLOP/B)"
    label_y = y_of(peak) - 6 - 13 * index  # roofs sharing a bandwidth: their labels stacked
    return (f'<g class="roof"><polyline points="{drawn}" fill="none" stroke="{color}" stroke-width="2">'
            f'<title>{escape(label)}</title></polyline><text x="{x_of(x_max) - 4:.1f}" y="{label_y:.1f}" '
            f'text-anchor="end" font-size="11" fill="{color}">{escape(label)}</text></g>')  # fmt: skip


def _ops_table(roof: RooflineSummary) -> str:
    rows = [f"<tr>{name_cell(op.op)}{name_cell(op.shapes or '')}{name_cell(op.dtype or '')}{num(op.ms)}"
            f"{num(op.intensity)}{num(op.achieved_gflops)}{name_cell(op.label)}{num(op.roof_pct)}"
            f"{name_cell(op.why)}</tr>" for op in roof.ops]  # fmt: skip
    headers = [("op", False), ("shapes", False), ("dtype", False), ("ms", True), ("FLOP/B", True), ("GFLOP/s", True),
               ("label", False), ("% of roof", True), ("why", False)]  # fmt: skip
    return "<h3>op groups</h3>" + table(headers, rows)


def _modules_table(roof: RooflineSummary) -> str:
    if not roof.modules:
        return f'<p class="note">modules: {escape(roof.modules_why or "none judged")}</p>'
    rows = [f"<tr>{name_cell(' > '.join(item.path))}{num(item.ms)}{num(item.calls)}{num(item.intensity)}"
            f"{num(item.achieved_gflops)}{name_cell(item.label)}{num(item.roof_pct)}</tr>" for item in roof.modules]
    headers = [("module", False), ("ms", True), ("op calls", True), ("FLOP/B", True), ("GFLOP/s", True),
               ("label", False), ("% of roof", True)]  # fmt: skip
    return ("<h3>modules (their judged ops together: forward and the backward they made)</h3>"
            + table(headers, rows))  # fmt: skip
