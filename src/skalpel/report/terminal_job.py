"""The terminal's job summary: a job of many ranks in a screen, and which ranks get a panel.

It reads ``Report.job`` (``job/summary.py`` computes it), so a report read back from JSON
renders the same. Each figure of the ranks: percentiles, a one-line histogram from its least
to its largest value, and its outlier ranks; then the groups of ranks alike, each by its
representative. Jobs of more ranks than ``SUMMARY_RANKS`` show it, and their per-rank panels
only for the outliers and the representatives (and the ranks asked for), two lines each cut to
the width; outliers of one group after its first are one line. The whole report of a job of
hundreds of ranks fits about 100 lines of an 80-column terminal (tests/test_job_summary.py).
"""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis import numeric
from ..display import cut_name
from ..result.report import JobSummary, MetricSpread, RankReport, Report, rank_ranges
from ..trace.kinds import Kind, classify

SUMMARY_RANKS = 8  # more ranks than this: the job summary, and panels for a few ranks only
BLOCKS = " ▁▂▃▄▅▆▇█"
RANGES_CHARS = 60  # ranks written as ranges, cut to this on a line (the JSON has them all)
GROUP_LINES = 8  # as many as the groups shown by a panel (job/summary.py SHOWN_GROUPS)
OUTLIER_LINES = 8
BRIEF_SHARES = 0.5  # a brief panel's step shares from this many percent
BRIEF_OPS = 3


def summarised(report: Report) -> bool:
    """Whether the report is long enough to lead with the job summary."""
    return report.job is not None and len(report.ranks) > SUMMARY_RANKS


def detailed_ranks(report: Report, asked: tuple[int, ...] = (), all_ranks: bool = False) -> list[int]:
    """The ranks that get a panel: every one in a small job (or asked), else the shown ones and those asked for,
    less the outliers alike an outlier before them (``alike_outliers``)."""
    every = [rank.rank for rank in report.ranks]
    if all_ranks or not summarised(report):
        return every
    assert report.job is not None
    wanted = set(report.job.shown) | set(asked)
    folded = {rank for ranks in alike_outliers(report, asked).values() for rank in ranks}
    return [rank for rank in every if rank in wanted and rank not in folded]


def alike_outliers(report: Report, asked: tuple[int, ...] = ()) -> dict[int, list[int]]:
    """Shown outliers of one group after its first: {the first: [the others]}, their panels one line (the outlier
    ranks' lines say how each differs). Ranks asked for keep their panels."""
    job = report.job
    if job is None or not summarised(report):
        return {}
    group_of = {rank: index for index, group in enumerate(job.groups) if group.alike for rank in group.members}
    first: dict[int, int] = {}
    folded: dict[int, list[int]] = {}
    for rank in sorted(set(job.shown) & set(job.outliers) - set(asked)):
        group = group_of.get(rank)
        if group is None:
            continue
        if group in first:
            folded.setdefault(first[group], []).append(rank)
        else:
            first[group] = rank
    return folded


def alike_line(report: Report, asked: tuple[int, ...] = ()) -> Text | None:
    """'ranks 29, 53, 77: alike rank 5; ...' for the outliers without a panel of their own."""
    folded = alike_outliers(report, asked)
    if not folded:
        return None
    said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {cut(rank_ranges(ranks))}: alike rank {first}"
                     for first, ranks in sorted(folded.items()))  # fmt: skip
    return Text(f"outliers alike an outlier above (one group), without a panel: {said} (--rank R shows one)",
                style="dim")  # fmt: skip


def sparkline(counts: tuple[int, ...]) -> str:
    """One character per bin, its height the bin's share of the fullest bin; empty bins a space."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    return "".join(BLOCKS[0] if not count else BLOCKS[max(1, round(count / top * (len(BLOCKS) - 1)))] for count in counts)


def cut(text: str, limit: int = RANGES_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1].rsplit(",", 1)[0] + ", …"


def job_panel(report: Report, asked: tuple[int, ...] = ()) -> Panel:
    job = report.job
    assert job is not None
    parts: list = [_figures(job)]
    if job.collectives:
        parts.append(_collectives(job))
    parts.append(_outliers(job))
    parts.append(_groups(job))
    shown = rank_ranges(detailed_ranks(report, asked))
    absent = sorted(set(asked) - {rank.rank for rank in report.ranks})
    if absent:
        parts.append(Text(f"--rank {', '.join(map(str, absent))}: not a rank of this job", style="yellow"))
    # Which ranks have a panel below, in the bottom border: a line saved
    below = f"panels below: ranks {cut(shown, 30)}; --rank R or --all-ranks for more" if shown else \
        "--rank R or --all-ranks for ranks' panels"  # fmt: skip
    return Panel(Group(*parts), title=f"job: {job.ranks} ranks", title_align="left", subtitle=below,
                 subtitle_align="left")  # fmt: skip


def _value(metric: MetricSpread, value: float) -> str:
    return f"{value:.1f}" if metric.unit == "%" else f"{value:.2f}"


def _figures(job: JobSummary) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    table.add_column("per rank", no_wrap=True)
    for name in ("median", "min", "p10", "p90", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("min…max", no_wrap=True)
    table.add_column("outl.", justify="right", no_wrap=True)
    for metric in job.metrics:
        cells = [_value(metric, value) for value in (metric.p50, metric.min, metric.p10, metric.p90, metric.max)]
        table.add_row(_heading(metric), *cells, sparkline(metric.histogram), str(len(metric.outliers)))
    return table


def _heading(metric: MetricSpread) -> str:
    return {"step_ms": "step ms", "comm_ms": "comm ms/step", "wait_ms": "wait ms/step"}.get(
        metric.name, f"{metric.label} {metric.unit}")


def _outliers(job: JobSummary) -> Text:
    """One line an outlier rank: 'rank 17: step 22.15 ms (median 16.15), comm 12.99 ms (median 6.99, z +9.1)'."""
    if not job.outliers:
        return Text(f"outlier ranks: none beyond a robust z-score of {job.outlier_z:g} (on the median and MAD)")
    text = Text(f"outlier ranks ({len(job.outliers)}), farthest first; z: robust z-score (none: the rest alike)")
    for rank in job.outliers[:OUTLIER_LINES]:
        ways = []
        for metric in job.metrics:
            for number, value, z in metric.outliers:
                if number == rank:
                    z_text = f", z {z:+.1f}" if abs(z) < 999 else ""
                    ways.append(f"{_SHORT_LABEL.get(metric.name, metric.label)} {_value(metric, value)}{_unit(metric)} "
                                f"(median {_value(metric, metric.p50)}{z_text})")  # fmt: skip
        text.append(f"\n  rank {rank}: " + ", ".join(ways))
    if len(job.outliers) > OUTLIER_LINES:
        text.append(f"\n  … {len(job.outliers) - OUTLIER_LINES} more (report.json: job.outliers)")
    return text


def _unit(metric: MetricSpread) -> str:
    return "%" if metric.unit == "%" else " ms"


COLLECTIVE_LINES = 4
_SHORT = {"step_ms": "step ms", "compute_pct": "comp%", "comm_ms": "comm", "wait_ms": "wait", "idle_pct": "idle%"}
_SHORT_LABEL = {"step_ms": "step", "compute_pct": "compute", "comm_ms": "comm", "wait_ms": "wait", "idle_pct": "idle"}


def _collectives(job: JobSummary) -> Table:
    """A row a type of collective: calls and ms per step, bus bandwidth p10/p50/p90 after the last rank arrived
    (the link's, without the waits; the whole call's, marked '(whole)', where the clocks could not say), slowest."""
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    table.add_column("collective", no_wrap=True, overflow="ellipsis", max_width=22)
    for header in ("/step", "ms/step", "p90"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("busbw GB/s p10/p50/p90", no_wrap=True)
    table.add_column("slowest", no_wrap=True, overflow="ellipsis")
    for row in job.collectives[:COLLECTIVE_LINES]:
        transfer = row.transfer_busbw_gbps_p50 is not None
        prefix, whole = ("transfer_busbw_gbps", "") if transfer else ("busbw_gbps", " (whole)")
        low, mid, high = (getattr(row, f"{prefix}_{p}") for p in ("p10", "p50", "p90"))
        bandwidth = f"{low:.3g}/{mid:.3g}/{high:.3g}{whole}" if mid is not None else "-"
        name = row.type if row.ranks == job.ranks else f"{row.type} ({row.ranks} ranks)"
        slowest = ", ".join(str(rank) for rank in row.slowest) or "-"
        table.add_row(f"  {name}", f"{row.calls_per_step:g}", f"{row.ms_per_step_p50:.2f}",
                      f"{row.ms_per_step_p90:.2f}", bandwidth, slowest)  # fmt: skip
    return table


def _groups(job: JobSummary) -> Group:
    """One line per group of ranks alike: its ranks, size, representative and the representative's figures."""
    alike = [group for group in job.groups if group.alike]
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    groups = f"{len(alike)} group{'s' if len(alike) != 1 else ''} of ranks alike"
    table.add_column(groups, no_wrap=True, overflow="ellipsis", max_width=26)
    for header in ["n", "like"] + [_SHORT.get(metric.name, metric.label) for metric in job.metrics]:
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    for group in alike[:GROUP_LINES]:
        table.add_row(f"  {cut(group.ranks, 24)}", str(len(group.members)), str(group.representative),
                      *(_value(metric, group.profile[metric.name]) if metric.name in group.profile else "-"
                        for metric in job.metrics))  # fmt: skip
    lines: list = [table]
    rest = alike[GROUP_LINES:]
    if rest:
        lines.append(Text(f"  … {len(rest)} more groups of {sum(len(group.members) for group in rest)} ranks "
                          "(report.json: job.groups)"))  # fmt: skip
    for group in job.groups:
        if not group.alike:
            lines.append(Text(f"  {len(group.members)} more ranks ({cut(group.ranks)}) like none of the "
                              f"{len(alike)} groups: no group for them (too many kinds of ranks)"))  # fmt: skip
    return Group(*lines)


def brief_panel(report: Report, rank: RankReport) -> Panel:
    """A shown rank of a large job in two lines, each cut to the width rather than wrapped: where its step goes;
    its collectives (else its GPU idle share) and its top ops besides the collectives. Its idle share and the
    rest are in the job summary's group table (``--all-ranks`` gives the whole panels). The title says why it
    is shown: an outlier, or the rank a group of ranks alike is shown by."""
    parts: list[Text] = []
    if rank.step_breakdown_pct:
        shares = sorted(rank.step_breakdown_pct.items(), key=lambda item: -item[1])
        step = f"step {numeric.median(rank.step_ms):.2f} ms: " if rank.step_ms else "step: "
        parts.append(_line(step + ", ".join(f"{name} {value:.0f}%" for name, value in shares if value >= BRIEF_SHARES)))
    what = []
    comm = rank.comm
    if comm is not None and comm.by_type:
        what.append(", ".join(f"{row.type} {row.ms_per_step:.2f}" for row in comm.by_type[:3]) + " ms/step")
    elif rank.gpu is not None:
        what.append(f"GPU idle {rank.gpu.idle_pct:.1f}%, compute {rank.gpu.compute_pct:.1f}%")
    ops = [row for row in rank.top_ops if classify("cpu_op", row.name, "X") is not Kind.COMM_OP][:BRIEF_OPS]
    if ops:
        device = report.has_device
        what.append(f"ops ({'device' if device else 'CPU'} ms): " + ", ".join(
            f"{cut_name(row.name, 28)} {row.device_ms if device else row.self_ms:.2f}" for row in ops))  # fmt: skip
    if what:
        parts.append(_line("; ".join(what)))
    if not parts:
        parts.append(Text("no per-rank analyses available"))
    return Panel(Group(*parts), title=f"rank {rank.rank}{_why_shown(report.job, rank.rank)}", title_align="left")


def _line(text: str) -> Text:
    return Text(text, no_wrap=True, overflow="ellipsis")


def _why_shown(job: JobSummary | None, number: int) -> str:
    """' (outlier)', ' (shows 32 ranks: 0-248 every 8)', both, or nothing (a rank asked for)."""
    if job is None:
        return ""
    group = next((group for group in job.groups if group.alike and group.representative == number), None)
    why = ["outlier"] if number in job.outliers else []
    if group is not None and len(group.members) > 1:
        why.append(f"shows {len(group.members)} ranks: {cut(group.ranks, 30)}")
    return f" ({'; '.join(why)})" if why else ""
