"""The HTML page's job section: a job of many ranks at a glance, its size bounded whatever the ranks.

``Report.job`` (job/summary.py) gives each figure's spread and outlier ranks and the groups
of ranks alike; the rank x step heatmaps (step time, idle, wait in collectives) are PNG
images made here, one pixel per rank and step (scaled up, unsmoothed, by the browser), with
outlier ranks marked red in a column at the left: a thousand ranks of ten steps are a few
kilobytes, where SVG rectangles would be megabytes. Per-rank detail stays in the per-rank
table and the ``<details>`` of the ranks the report shows.
"""

from __future__ import annotations

import base64
import struct
import zlib

from ..result.report import JobSummary, Report
from .html_parts import escape, num, section, table

HEATMAP_STEPS = 200  # steps drawn per rank; later ones are left out (the image would be too wide to read)
_LOW, _HIGH = (240, 244, 250), (8, 48, 107)  # light to dark blue
_MARK, _CLEAR = (215, 48, 39), (255, 255, 255)


def job_section(report: Report) -> str:
    job = report.job
    if job is None:
        return ""
    body = _figures(job) + _outliers(job) + _groups(job) + _collectives(job) + heatmaps(report)
    return section("job", f"Job: {job.ranks} ranks", body)


def _figures(job: JobSummary) -> str:
    headers = [("per rank", False), ("median", True), ("min", True), ("p10", True), ("p90", True), ("max", True),
               ("histogram (min to max)", False), ("outliers", True)]  # fmt: skip
    rows = []
    for metric in job.metrics:
        bars = "".join("▁▂▃▄▅▆▇█"[min(7, int(count / max(metric.histogram) * 7.999))] if count else "·"
                       for count in metric.histogram)  # fmt: skip
        cells = [f"<td>{escape(metric.label)} ({escape(metric.unit)})</td>"]
        cells += [num(value) for value in (metric.p50, metric.min, metric.p10, metric.p90, metric.max)]
        cells += [f'<td class="mono">{bars}</td>', num(len(metric.outliers))]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return table(headers, rows)


def _outliers(job: JobSummary) -> str:
    if not job.outliers:
        return '<p class="note">No outlier rank (robust z-score on the median and MAD).</p>'
    items = []
    for rank in job.outliers[:50]:
        ways = [f"{metric.label} {value:g} {metric.unit} (median {metric.p50:g})"
                for metric in job.metrics for number, value, _ in metric.outliers if number == rank]  # fmt: skip
        items.append(f"<li>rank {rank}: {escape(', '.join(ways))}</li>")
    more = f"<li>… {len(job.outliers) - 50} more in report.json</li>" if len(job.outliers) > 50 else ""
    return f"<p>Outlier ranks ({len(job.outliers)}), farthest first:</p><ul>{''.join(items)}{more}</ul>"


def _groups(job: JobSummary) -> str:
    names = [metric.name for metric in job.metrics]
    labels = {metric.name: f"{metric.label} ({metric.unit})" for metric in job.metrics}
    headers = [("ranks", False), ("count", True), ("like rank", True)] + [(labels[name], True) for name in names]
    rows = []
    for group in job.groups[:100]:
        cells = [f'<td class="mono">{escape(group.ranks if len(group.ranks) <= 200 else group.ranks[:199] + "…")}</td>',
                 num(len(group.members)), num(group.representative) if group.alike else "<td>none: like no group</td>"]  # fmt: skip
        cells += [num(group.profile.get(name)) for name in names]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<p>Ranks by behaviour: {len(job.groups)} group(s) of ranks alike.</p>" + table(headers, rows)


def _collectives(job: JobSummary) -> str:
    if not job.collectives:
        return ""
    headers = [("collective", False), ("ranks", True), ("calls/step", True), ("ms/step p50", True), ("p90", True),
               ("max", True), ("busbw GB/s p10", True), ("p50", True), ("p90", True), ("after last arrival p10", True),
               ("p50", True), ("p90", True), ("slowest ranks", False)]  # fmt: skip
    rows = []
    for row in job.collectives:
        cells = [f'<td class="mono">{escape(row.type)}</td>', num(row.ranks), num(row.calls_per_step), num(row.ms_per_step_p50),
                 num(row.ms_per_step_p90), num(row.ms_per_step_max), num(row.busbw_gbps_p10), num(row.busbw_gbps_p50),
                 num(row.busbw_gbps_p90), num(row.transfer_busbw_gbps_p10), num(row.transfer_busbw_gbps_p50),
                 num(row.transfer_busbw_gbps_p90), f"<td>{escape(', '.join(map(str, row.slowest)))}</td>"]  # fmt: skip
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "<h3>Collectives by type, across ranks</h3>" + table(headers, rows)


def heatmaps(report: Report) -> str:
    """Rank x step images of step time, idle and collective wait; outlier ranks marked red at the left."""
    job = report.job
    assert job is not None
    marked = set(job.outliers)
    maps = []
    for title, values in (("step time (ms)", _step_times(report)), ("idle (ms)", _blamed(report, None)),
                          ("collective wait (ms)", _blamed(report, "collective_wait"))):  # fmt: skip
        if any(values):
            maps.append(_heatmap(title, [rank.rank for rank in report.ranks], values, marked))
    if not maps:
        return ""
    return ('<h3>Rank × step</h3><p class="note">One row per rank (rank 0 at the top), one column per step; darker is '
            'more. A red mark at the left: an outlier rank.</p>'
            '<div class="heatmaps" style="display:flex;flex-wrap:wrap;gap:24px">' + "".join(maps) + "</div>")


def _step_times(report: Report) -> list[list[float]]:
    return [list(rank.step_ms[:HEATMAP_STEPS]) for rank in report.ranks]


def _blamed(report: Report, cause: str | None) -> list[list[float]]:
    rows = []
    for rank in report.ranks:
        steps = rank.blame.steps[:HEATMAP_STEPS] if rank.blame is not None else ()
        rows.append([float(step.idle_ms) if cause is None else float(step.ms.get(cause, 0.0)) for step in steps])
    return rows


def _heatmap(title: str, ranks: list[int], values: list[list[float]], marked: set[int]) -> str:
    flat = [value for row in values for value in row]
    low, high = min(flat), max(flat)
    width = max(len(row) for row in values)
    pixels = []
    for rank, row in zip(ranks, values):
        line = [_MARK if rank in marked else _CLEAR, _CLEAR]
        line += [_colour(value, low, high) for value in row] + [_CLEAR] * (width - len(row))
        pixels.append(line)
    image = base64.b64encode(png(pixels)).decode("ascii")
    height = min(600, max(120, 2 * len(ranks)))
    return (f'<figure class="heatmap" style="margin:0;flex:1 1 240px;max-width:360px">'
            f'<figcaption>{escape(title)}: {low:.3g} (light) to {high:.3g} (dark)</figcaption>'
            f'<img alt="{escape(title)} per rank and step" src="data:image/png;base64,{image}" '
            f'style="display:block;width:100%;height:{height}px;image-rendering:pixelated;border:1px solid #ccc"></figure>')


def _colour(value: float, low: float, high: float) -> tuple[int, int, int]:
    share = 0.0 if high <= low else (value - low) / (high - low)
    return tuple(round(a + (b - a) * share) for a, b in zip(_LOW, _HIGH))  # type: ignore[return-value]


def png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """A truecolour PNG of rows of (r, g, b) pixels, all rows as long."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\0" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
