"""The sections of the HTML report, one function each, all returning escaped markup.

A section with nothing to show says so ("not available: why") rather than vanishing, so
a reader knows whether an analysis found nothing or never ran.
"""

from __future__ import annotations

import html
import statistics
from typing import Any, Iterable, Sequence

from ..display import plain
from ..result.report import Finding, RankReport, Report, sorted_findings
from ..result.sections import BlameSummary, DistributedSummary
from ..trace.model import CUT_FILE
from . import html_svg as svg
from .evidence import evidence_text, mfu_text

TABLE_ROWS = 50
DETAIL_RANKS = 8
CURVE_POINTS = 1200
EXTRA_ROWS = 20
NAME_CHARS = 160
LONG_TEXT = 300
CHART_RANKS = 32  # per-rank bars drawn; the per-rank table lists every rank
STEP_BARS = 300
BLAME_STEPS = 60  # one bar per step, each a line high


def escape(text: str, quote: bool = True) -> str:
    """Text escaped for markup; a trace's control characters shown as escapes (``\\x1b``), as on a terminal."""
    return html.escape(plain(text, keep_newlines=True), quote)


def na(why: str) -> str:
    return f'<p class="na">not available: {escape(why)}</p>'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


def fmt_bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(short(v) for v in list(value)[:6]) + (", …]" if len(value) > 6 else "]")
    text = str(value)
    return text if len(text) <= LONG_TEXT else text[: LONG_TEXT - 1] + "…"


def num(value: float | int | None, text: str | None = None) -> str:
    if value is None:
        return '<td class="num" data-v="">–</td>'
    return f'<td class="num" data-v="{value}">{escape(text if text is not None else short(value))}</td>'


def name_cell(value: object) -> str:
    """A name in a table; a long one (templated kernels) is cut, its full text on hover."""
    text = str(value)
    if len(text) <= NAME_CHARS:
        return f'<td class="name mono">{escape(text)}</td>'
    return f'<td class="name mono" data-v="{escape(text)}" data-tip="{escape(text)}">{escape(text[:NAME_CHARS - 1])}…</td>'


def table(headers: Sequence[tuple[str, bool]], rows: Iterable[str], *, sortable: bool = True) -> str:
    head = "".join(f'<th class="{"num" if numeric else ""}" scope="col">{escape(h)}</th>' for h, numeric in headers)
    klass = ' class="sortable"' if sortable else ""
    markup = f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return f'<div class="scroll">{markup}</div>'


def header(report: Report, title: str | None) -> str:
    source = report.source
    facts = [f"device: {source.device or 'unknown'}", f"ranks: {len(report.ranks)}",
             f"torch: {source.torch_version or 'not recorded'}"]  # fmt: skip
    paths = ", ".join(source.paths[:4]) + (f" and {len(source.paths) - 4} more" if len(source.paths) > 4 else "")
    pills = "".join(f'<span class="pill">{escape(fact)}</span>' for fact in facts)
    return (f"<header><h1>{escape(title or 'skalpel report')}</h1><div>{pills}</div>"
            f'<p class="meta mono">{escape(paths)}</p></header>')  # fmt: skip


def verdict(report: Report) -> str:
    findings = sorted_findings(report.findings)
    serious = [f for f in findings if f.severity != "info"]
    infos = [f for f in findings if f.severity == "info"]
    body = "".join(_finding(f) for f in serious)
    if infos:
        body += (f"<details><summary>{len(infos)} more finding{'s' if len(infos) > 1 else ''} for information</summary>"
                 + "".join(_finding(f) for f in infos) + "</details>")  # fmt: skip
    if not serious:
        body = f'<div class="verdict-ok"><strong>No bottleneck found.</strong> {escape(_numbers(report))}</div>' + body
    return section("verdict", "Verdict", body)


def _numbers(report: Report) -> str:
    steps = report.steps
    text = f"{steps.count} steps, median {steps.median_ms:.2f} ms (p90 {steps.p90_ms:.2f} ms, cv {steps.cv:.2f})"
    rank = report.ranks[0] if report.ranks else None
    if rank and rank.step_breakdown_pct:
        top = sorted(rank.step_breakdown_pct.items(), key=lambda item: -item[1])[:3]
        text += "; step time: " + ", ".join(f"{name} {value:.1f}%" for name, value in top)
    in_steps = rank.step_device if rank else None
    if rank and rank.gpu and in_steps is not None and in_steps.marked:  # the steps the user waits for, then HTA's span
        text += f"; GPU idle {in_steps.idle_pct:.1f}% of the steps (HTA, first to last device event: {rank.gpu.idle_pct:.1f}%)"
    elif rank and rank.gpu:
        text += f"; GPU idle {rank.gpu.idle_pct:.1f}%"
    return text + "."


def _finding(finding: Finding) -> str:
    severity = finding.severity if finding.severity in ("critical", "warning", "info") else "info"
    rows = []
    if finding.evidence:
        rows.append(("evidence", f'<span class="mono">{escape(evidence_text(finding.evidence))}</span>'))
    if finding.locations:
        rows.append(("where", "<br>".join(f"<code>{escape(loc)}</code>" for loc in finding.locations[:5])))
    if finding.fix:
        rows.append(("fix", escape(finding.fix)))
    if finding.rank is not None:
        rows.append(("rank", str(int(finding.rank))))
    if finding.across is not None:
        rows.insert(0, ("ranks", escape(finding.across.describe())))
    details = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)
    return (f'<div class="finding {severity}"><span class="sev">{severity}</span><span class="title">'
            f'{escape(finding.title)}</span><span class="fid">[{escape(finding.id)}]</span><dl>{details}</dl></div>')  # fmt: skip


def steps(report: Report) -> str:
    series = [(f"rank {r.rank}", r.step_ms) for r in report.ranks[:DETAIL_RANKS] if r.step_ms]
    if not series:
        return section("steps", "Step time per step", na("no steps were found in the trace"))
    note = "" if report.steps.marked else '<p class="note">No ProfilerStep markers: each rank is one pseudo-step.</p>'
    if report.loop_iterations() is not None:
        note = note.replace(".</p>", f"; the ledger, gpu_idle and launch_bound judge the {report.loop_iterations()} "
                                     "iterations found from the loop.</p>")  # fmt: skip
    longest = max(len(values) for _, values in series)
    if longest > STEP_BARS:
        every = -(-longest // STEP_BARS)
        series = [(name, values[::every]) for name, values in series]
        note += f'<p class="note">{longest} steps: every {every}th step shown.</p>'
    if len(report.ranks) > DETAIL_RANKS:
        note += f'<p class="note">The first {DETAIL_RANKS} of {len(report.ranks)} ranks; all are in the per-rank comparison.</p>'
    return section("steps", "Step time per step", note + svg.step_bars(series, label="step time per step") + _mfu(report))


def _mfu(report: Report) -> str:
    lines = [f"rank {r.rank}: {mfu_text(r.mfu)}" for r in report.ranks[:DETAIL_RANKS] if r.mfu is not None]
    return f'<p class="note">Model FLOP utilisation: {escape("; ".join(lines))}</p>' if lines else ""


def breakdown(report: Report) -> str:
    rows = [(f"rank {r.rank}", r.step_breakdown_pct) for r in report.ranks[:CHART_RANKS] if r.step_breakdown_pct]
    if not rows:
        return section("breakdown", "Step time breakdown", na("the step-time breakdown was not computed for this trace"))
    waits = [f"rank {r.rank}: {r.data_wait_ms_per_step:.2f} ms/step" for r in report.ranks if r.data_wait_ms_per_step]
    note = f'<p class="note">Waiting for data: {escape("; ".join(waits))}</p>' if waits else ""
    chart = svg.stacked_bars(rows, unit="%", scale_max=max(100.0, max(sum(p.values()) for _, p in rows)),
                             label="step time breakdown per rank")  # fmt: skip
    return section("breakdown", "Step time breakdown", chart + note)


def gpu(report: Report) -> str:
    ranks = [r for r in report.ranks[:CHART_RANKS] if r.gpu is not None]
    if not ranks:
        why = "CPU-only trace: no device activity" if (report.source.device or "cpu").startswith("cpu") else (
            "the GPU time breakdown was not computed for this trace")  # fmt: skip
        return section("gpu", "GPU time and idle breakdown", na(why))
    usage = [(f"rank {r.rank}", {"compute": r.gpu.compute_pct, "non_compute": r.gpu.non_compute_pct,
                                 "idle": r.gpu.idle_pct}) for r in ranks if r.gpu]  # fmt: skip
    idle = [(f"rank {r.rank}", r.gpu.idle_breakdown_pct) for r in ranks if r.gpu and r.gpu.idle_breakdown_pct]
    # HTA's figures, over the device's span: the marked steps' idle share (summary, blame) can differ, so say whose
    body = "<h3>Device time (HTA: first to last device event)</h3>" + svg.stacked_bars(usage, scale_max=100.0, label="GPU time per rank")
    body += ("<h3>Why the GPU is idle (HTA's split, share of idle time)</h3>" + svg.stacked_bars(idle, scale_max=100.0, label="GPU idle breakdown")
             if idle else na("no idle-time breakdown"))  # fmt: skip
    overlaps = [f"rank {r.rank}: {r.gpu.comm_overlap_pct:.1f}%" for r in ranks if r.gpu and r.gpu.comm_overlap_pct is not None]
    if overlaps:
        body += f'<p class="note">Communication overlapped with compute: {escape("; ".join(overlaps))}</p>'
    return section("gpu", "GPU time and idle breakdown", body)


def ledger(report: Report) -> str:
    """Every unit's time by cause, one stacked bar per unit and lane (the ledger the findings read)."""
    ranks = [rank for rank in report.ranks[:DETAIL_RANKS] if rank.ledger is not None and rank.ledger.lanes]
    if not ranks:
        return ""
    body = ['<p class="note">Every millisecond of every unit, charged to exactly one cause, on the device and on the '
            "host's main thread: one bar per unit, its length the unit's time; hover a segment for its ms and share "
            "(<code>skalpel explain ledger</code> says what each cause means).</p>"]  # fmt: skip
    for rank in ranks:
        found = rank.ledger
        if len(report.ranks) > 1:
            body.append(f"<h3>rank {rank.rank}</h3>")
        body.append(f'<p class="note">Judged over {escape(found.judged_over)}.</p>')
        unit = {"step": "step", "iteration": "iteration"}.get(found.unit, "window")
        for lane in found.lanes:
            units = list(lane.units)
            every = -(-len(units) // BLAME_STEPS) if len(units) > BLAME_STEPS else 1
            rows = [(f"{unit} {row.number}" if unit != "window" else "window", dict(row.ms)) for row in units[::every]
                    if sum(row.ms.values()) > 0]  # fmt: skip
            if not rows:  # units of no length (a one-event trace): nothing to draw
                continue
            what = "device" if lane.lane == "device" else "main thread"
            body.append(svg.blame_bars(rows, label=f"{what} time by cause per {unit}", colors=svg.LEDGER_COLORS,
                                       of=f"the {unit}"))  # fmt: skip
        body += [f'<p class="note">{escape(note)}</p>' for note in found.notes[:5]]
    return section("ledger", "Where every millisecond went", "".join(body))


def blame(report: Report) -> str:
    """Each step's device idle time split by cause (the blame analysis), and the largest causes with their lines.

    No section where no rank carries a blame (reports written before it existed). On a CPU-only trace the
    idle time is the main thread's, outside its ops (``waits_on``).
    """
    blamed = [(rank, rank.blame) for rank in report.ranks[:DETAIL_RANKS] if rank.blame is not None and rank.blame.steps]
    if not blamed:
        return ""
    body = ['<p class="note">Every idle interval of a step is charged to what held the device back: one bar per '
            "step, its length the step's idle time; hover a segment for its ms and share "
            "(<code>skalpel explain blame</code> says what each cause means).</p>"]  # fmt: skip
    for rank, found in blamed:
        if len(report.ranks) > 1:
            body.append(f"<h3>rank {rank.rank}</h3>")
        body.append(_blame_rank(report, rank, found))
    if len(report.ranks) > DETAIL_RANKS:
        body.append(f'<p class="note">The first {DETAIL_RANKS} of {len(report.ranks)} ranks.</p>')
    cpu = all(found.waits_on == "main thread" for _, found in blamed)
    return section("blame", "Why the main thread's compute was idle" if cpu else "Why the device was idle", "".join(body))


def _blame_rank(report: Report, rank: RankReport, found: BlameSummary) -> str:
    unit = {"step": "step", "iteration": "iteration"}.get(str(found.unit), "window")
    steps = list(found.steps)
    note = ""
    if len(steps) > BLAME_STEPS:
        every = -(-len(steps) // BLAME_STEPS)
        note = f'<p class="note">{len(steps)} {unit}s: every {every}th shown.</p>'
        steps = steps[::every]
    rows = [(f"{unit} {step.number}" if unit != "window" else "window",
             {str(key): float(value) for key, value in step.ms.items()}) for step in steps]  # fmt: skip
    head = f'<p class="note">Idle {float(found.idle_ms_per_step):.2f} ms per {unit}.</p>'
    what = "main thread" if found.waits_on == "main thread" else "device"
    chart = svg.blame_bars(rows, label=f"{what} idle time by cause per {unit}")
    return head + note + chart + _blame_top(report, rank, found) + "".join(
        f'<p class="note">{escape(str(text))}</p>' for text in found.notes[:5])  # fmt: skip


def _blame_top(report: Report, rank: RankReport, found: BlameSummary) -> str:
    """The largest causes; their lines come from gpu_idle's culprits, the rule that locates them in the trace."""
    top = found.top
    if not top:
        return ""
    lines: dict[tuple[str, str], str] = {}
    for finding in report.findings:
        if finding.id == "gpu_idle" and finding.rank in (None, rank.rank):
            for culprit in finding.evidence.get("culprits") or ():
                if isinstance(culprit, dict) and culprit.get("location"):
                    lines.setdefault((str(culprit.get("category")), str(culprit.get("label"))), str(culprit["location"]))
    idle = found.idle_ms_per_step
    rows = []
    for item in top:
        ms = item.ms_per_step
        share = 100.0 * ms / idle if idle else None
        key = (str(item.category), str(item.label))
        rows.append(f'<tr><td class="mono">{escape(key[0])}</td>' + name_cell(key[1]) + num(ms, f"{ms:.3f}")
                    + num(share, f"{share:.1f}" if share is not None else None)
                    + name_cell(lines.get(key, "–")) + "</tr>")  # fmt: skip
    headers = [("cause", False), ("what", False), ("ms per step", True), ("share of idle %", True), ("where", False)]
    return "<h3>The largest causes</h3>" + table(headers, rows, sortable=False)


def tables(report: Report) -> str:
    if not report.ranks:
        return section("ops", "Top ops and kernels", na("no ranks in the trace"))
    body = []
    # A job of many ranks: the tables of the ranks its summary shows (the outliers, one rank of each group).
    shown = set(report.job.shown) if report.job is not None and len(report.ranks) > DETAIL_RANKS else set()
    detailed = [rank for rank in report.ranks if rank.rank in shown][:DETAIL_RANKS] or report.ranks[:DETAIL_RANKS]
    for i, rank in enumerate(detailed):
        device = report.has_device or any(row.device_ms > 0 for row in rank.top_ops)
        inner = _ops_table(rank, device) + _kernels_table(rank) + _regions_table(rank, device)
        if len(report.ranks) == 1:
            body.append(inner)
        else:
            body.append(f"<details{' open' if i == 0 else ''}><summary>rank {rank.rank}</summary>{inner}</details>")
    if len(report.ranks) > DETAIL_RANKS:
        which = "the outliers and one rank of each group" if shown else f"the first {DETAIL_RANKS}"
        body.append(f'<p class="note">Tables shown for {which} of {len(report.ranks)} ranks.</p>')
    return section("ops", "Top ops and kernels", "".join(body))


def _ops_table(rank: RankReport, device: bool) -> str:
    if not rank.top_ops:
        return "<h3>Top ops</h3>" + na("the op table was not computed for this trace")
    headers = [("op", False), ("calls", True), ("self CPU ms", True), ("total CPU ms", True)]
    headers += [("device ms", True)] if device else []
    headers += [("input shapes", False)]
    rows = []
    for row in rank.top_ops[:TABLE_ROWS]:
        cells = [name_cell(row.name), num(row.calls), num(row.self_ms, f"{row.self_ms:.3f}"),
                 num(row.total_ms, f"{row.total_ms:.3f}")]  # fmt: skip
        cells += [num(row.device_ms, f"{row.device_ms:.3f}")] if device else []
        cells.append(name_cell((row.input_shapes or "") + (row.other_shapes if row.input_shapes else "")))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="note">{len(rank.top_ops) - TABLE_ROWS} more not shown.</p>' if len(rank.top_ops) > TABLE_ROWS else ""
    return "<h3>Top ops (click a header to sort)</h3>" + table(headers, rows) + more


def _kernels_table(rank: RankReport) -> str:
    if not rank.top_kernels:
        return "<h3>Top kernels</h3>" + na("no device kernels on this rank, or the kernel table was not computed")
    headers = [("kernel", False), ("type", False), ("calls", True), ("total ms", True), ("mean µs", True), ("share %", True)]
    rows = [
        "<tr>" + name_cell(row.name) + f"<td>{escape(row.type)}</td>" + num(row.calls)
        + num(row.total_ms, f"{row.total_ms:.3f}") + num(row.mean_us, f"{row.mean_us:.1f}")
        + num(row.share_pct, f"{row.share_pct:.1f}") + "</tr>"
        for row in rank.top_kernels[:TABLE_ROWS]
    ]  # fmt: skip
    return "<h3>Top kernels</h3>" + table(headers, rows)


def _regions_table(rank: RankReport, device: bool) -> str:
    regions = rank.compiled.regions if rank.compiled is not None else ()
    if not regions:
        return ""
    headers = [("region", False), ("compiled function", False), ("calls", True), ("host ms", True)]
    headers += [("device ms", True), ("kernels", True), ("Triton kernels", True)] if device else []
    headers += [("generated graphs", False)]
    rows = []
    for row in regions[:TABLE_ROWS]:
        cells = [name_cell(row.region), name_cell(row.location or "unknown (no compile log)"), num(row.calls),
                 num(row.host_ms, f"{row.host_ms:.3f}")]  # fmt: skip
        if device:
            cells += [num(row.device_ms, f"{row.device_ms:.3f}"), num(row.kernels), num(row.triton_kernels)]
        cells.append(name_cell(", ".join(row.graphs)))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "<h3>torch.compile regions and the functions they compile</h3>" + table(headers, rows)


def downsample_max(points: Sequence[Sequence[float]], limit: int = CURVE_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, keeping each bucket's highest point so the peak survives."""
    if len(points) <= limit:
        return [(float(p[0]), float(p[1])) for p in points]
    size = len(points) / limit
    out = []
    for i in range(limit):
        bucket = points[int(i * size): int((i + 1) * size)] or [points[-1]]
        best = max(bucket, key=lambda p: p[1])
        out.append((float(best[0]), float(best[1])))
    return out


def _byte_unit(top: float) -> tuple[str, int]:
    return next(((unit, size) for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= size), ("B", 1))


def memory(report: Report) -> str:
    ranks = [r for r in report.ranks if r.memory is not None]
    if not ranks:
        return section("memory", "Memory", na("the trace has no memory events (profile_memory=True records them)"))
    body = []
    for rank in ranks[:4]:
        mem = rank.memory
        assert mem is not None
        growth = ("not measured" if mem.growth_bytes_per_step is None
                  else f"{fmt_bytes(mem.growth_bytes_per_step)} per step")  # fmt: skip
        body.append(f"<h3>rank {rank.rank} ({escape(mem.device)}): peak {fmt_bytes(mem.peak_bytes)}, growth {escape(growth)}</h3>")
        if len(mem.curve) >= 2:
            unit, size = _byte_unit(max(mem.peak_bytes, max(p[1] for p in mem.curve)))
            points = [(x, y / size) for x, y in downsample_max(mem.curve)]
            peak = (mem.peak_ts_ms, mem.peak_bytes / size) if mem.peak_ts_ms is not None else None
            body.append(svg.line_curve(points, peak=peak, y_fmt=lambda v, unit=unit: f"{v:.4g} {unit}",
                                       x_label="time from trace start (ms)", label="allocated memory over time"))  # fmt: skip
        else:
            body.append(na("no memory curve recorded"))
    return section("memory", "Memory", "".join(body))


def ranks(report: Report) -> str:
    if len(report.ranks) < 2:
        return ""
    categories = sorted({c for r in report.ranks for c in r.step_breakdown_pct})
    headers = [("rank", True), ("median step ms", True), ("GPU idle %", True), ("peak memory", True)]
    headers += [(f"{c} %", True) for c in categories]
    distributed = any(r.distributed is not None and r.distributed.measured for r in report.ranks)
    if distributed:
        headers += [("comm ms/step", True), ("wait ms/step", True), ("clock offset us", True), ("last to arrive", True)]
    rows = []
    for r in report.ranks:
        median = statistics.median(r.step_ms) if r.step_ms else None
        peak = r.memory.peak_bytes if r.memory else None
        cells = [num(r.rank), num(median, f"{median:.2f}" if median is not None else None),
                 num(r.gpu.idle_pct if r.gpu else None), num(peak, fmt_bytes(peak) if peak is not None else None)]  # fmt: skip
        cells += [num(r.step_breakdown_pct.get(c), f"{r.step_breakdown_pct.get(c, 0):.1f}") for c in categories]
        if distributed:
            figures = r.distributed or DistributedSummary()
            cells += [num(figures.comm_ms_per_step), num(figures.wait_ms_per_step), num(figures.clock_offset_us),
                      num(figures.last_arrivals)]  # fmt: skip
        rows.append("<tr>" + "".join(cells) + "</tr>")
    medians = [(f"rank {r.rank}", {"median step ms": statistics.median(r.step_ms)})
               for r in report.ranks[:CHART_RANKS] if r.step_ms]  # fmt: skip
    chart = svg.stacked_bars(medians, unit=" ms", label="median step time per rank") if medians else ""
    return section("ranks", "Per-rank comparison", chart + table(headers, rows))


def extras(report: Report) -> str:
    blocks = []
    for rank in report.ranks[:DETAIL_RANKS]:
        for name, value in rank.extra.items():
            if value and name not in ("modules", "roofline"):  # sections of their own: html_modules, html_roofline
                blocks.append(f"<details><summary>{escape(name)} (rank {rank.rank})</summary>{kv_table(value)}</details>")
    return section("more", "More analyses", "".join(blocks)) if blocks else ""


def kv_table(value: Any, depth: int = 0) -> str:
    """A generic view of an analysis result: dicts as key/value rows, lists of dicts as tables."""
    if isinstance(value, dict):
        rows = [f"<tr><td>{escape(str(k))}</td><td>{kv_table(v, depth + 1) if depth < 2 else escape(short(v))}</td></tr>"
                for k, v in list(value.items())[:EXTRA_ROWS * 2]]  # fmt: skip
        return f'<table class="kv">{"".join(rows)}</table>'
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        keys = list(dict.fromkeys(k for item in value[:EXTRA_ROWS] for k in item))
        rows = ["<tr>" + "".join(
            num(v) if isinstance(v := item.get(k), (int, float)) and not isinstance(v, bool) else name_cell(short(v) if v is not None else "")
            for k in keys) + "</tr>" for item in value[:EXTRA_ROWS]]  # fmt: skip
        more = f'<p class="note">{len(value) - EXTRA_ROWS} more rows not shown.</p>' if len(value) > EXTRA_ROWS else ""
        return table([(k, False) for k in keys], rows) + more
    return f'<span class="mono">{escape(short(value))}</span>'


def capture(report: Report) -> str:
    c = report.capture
    source = report.source
    facts: list[tuple[str, str]] = [("torch version", source.torch_version or "not recorded in the trace"),
                                    ("device", source.device or "unknown"), ("world size", str(source.world_size or 1))]  # fmt: skip
    facts.append(("steps analysed", f"{report.steps.count}" + ("" if report.steps.marked else " (pseudo-steps)")))
    if c is None:
        body = na("the trace was loaded from disk, not captured by skalpel: no warm-up, overhead or noise measurements")
    else:
        facts.append(("steps captured", c.describe_steps()))
        if c.step_signal:
            facts.append(("steps marked by", c.step_signal))
        facts.append(("profiler overhead", c.overhead_words() or "not measured"))
        facts.append(("noise between windows", "not measured" if c.noise_pct is None else f"{c.noise_pct:.1f}%"))
        if c.unprofiled_step_ms is not None and c.profiled_step_ms is not None:
            facts.append(("step unprofiled / profiled", f"{c.unprofiled_step_ms:.2f} / {c.profiled_step_ms:.2f} ms"))
        if c.window_medians_ms:
            facts.append(("window medians", ", ".join(f"{v:.2f} ms" for v in c.window_medians_ms)))
        if c.run is not None:
            facts.extend(("whole run" if i == 0 else "", line) for i, line in enumerate(c.run.lines()))
        if c.memory_split is not None:
            facts.extend(("memory peak" if i == 0 else "", line) for i, line in enumerate(c.memory_split.lines()))
        if c.script:
            facts.append(("script", c.script))
        if c.exit_status is not None:
            facts.append(("exit status", str(c.exit_status)))
        body = _memory_split_bar(c.memory_split) if c.memory_split is not None else ""
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in facts)
    return section("capture", "Capture facts", f'<table class="kv">{rows}</table>{body}')


def _memory_split_bar(split) -> str:
    """The peak as one bar, a segment per category (they add up to it), then the categories over the window."""
    parts = {part.category.replace("_", " "): part.bytes / 2**20 for part in split.categories}
    bar = svg.stacked_bars([("peak", parts)], unit=" MiB", label=f"memory peak on {split.device} by category")
    names = [name.replace("_", " ") for name in split.curve_categories]
    window = f"ms in the recorded window ({split.step_span} steps)"
    area = svg.stacked_area(split.curve, names, y_fmt=lambda mib: f"{mib:.0f} MiB", x_label=window,
                            label=f"memory on {split.device} by category")  # fmt: skip
    return bar + area


def cut_files(report: Report) -> str:
    """The notes on files cut off mid-way: shown before the verdict, whose device verdicts they qualify."""
    cut = [w for w in report.warnings if CUT_FILE in w]
    if not cut:
        return ""
    return section("cut", "A trace file is cut off", "".join(f'<p class="note">{escape(w)}</p>' for w in cut))


def warnings(report: Report) -> str:
    if not report.warnings:
        return ""
    items = "".join(f"<li>{escape(w)}</li>" for w in report.warnings[:50])
    return section("warnings", "Notes on the trace", f"<ul>{items}</ul>")
