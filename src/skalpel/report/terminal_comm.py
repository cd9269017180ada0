"""Terminal pieces for distributed runs: the ranks side by side, and each rank's communication line.

They read ``RankReport.distributed`` (analysis/ranks.py) and ``RankReport.comm`` (analysis/comm.py), which a
report read back from JSON has as well, so it renders the same.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..result.report import RankReport, Report

MAX_RANK_ROWS = 16


def ranks_table(report: Report) -> Table | None:
    """Step, communication, wait and clock offset of every rank; None for fewer than two ranks."""
    rows = [(rank.rank, figures) for rank in report.ranks
            if (figures := rank.distributed) is not None and figures.measured]  # fmt: skip
    if len(rows) < 2:
        return None
    hidden = 0
    if len(rows) > MAX_RANK_ROWS:  # the ranks that wait least and most tell the story; the rest is in report.json
        ordered = sorted(rows, key=lambda row: row[1].wait_ms_per_step)
        kept = ordered[: MAX_RANK_ROWS // 2] + ordered[-(MAX_RANK_ROWS // 2):]
        hidden = len(rows) - len(kept)
        rows = sorted(kept, key=lambda row: row[0])
    table = Table(title="ranks side by side (ms per step; other hosts' clocks aligned on collective ends)",
                  title_justify="left")  # fmt: skip
    for header in ("rank", "step ms", "comm", "wait", "busy", "clock offset us", "last to arrive"):
        table.add_column(header, justify="right")
    for number, figures in rows:
        mark = " <- others wait" if figures.straggler_candidate and figures.last_arrivals else ""
        table.add_row(
            str(number), f"{figures.step_ms:.2f}", f"{figures.comm_ms_per_step:.2f}",
            f"{figures.wait_ms_per_step:.2f}", f"{figures.busy_ms_per_step:.2f}",
            f"{figures.clock_offset_us:+.1f}" + (" (est.)" if figures.clock == "aligned" else ""),
            f"{figures.last_arrivals}/{figures.matched_collectives}{mark}",
        )  # fmt: skip
    if hidden:
        table.caption = f"{hidden} ranks between the least and the most waiting are left out (see report.json)"
    return table


def comm_line(rank: RankReport) -> Text | None:
    """'communication: 26% of the step (20.4 ms/step), 62% exposed; all_reduce ...'; None without collectives."""
    comm = rank.comm
    if comm is None:
        return None
    exposed = comm.overlap_pct
    text = Text(
        f"communication ({comm.timed_on}): {comm.share_pct:.1f}% of the step ({comm.comm_ms_per_step:.2f} ms/step)"
        + (f", {100.0 - exposed:.0f}% not overlapped with compute" if exposed is not None else "")
    )
    transfers = (rank.distributed.transfer_busbw_gbps if rank.distributed is not None else None) or {}
    for row in comm.by_type[:4]:
        text.append(f"\n  {row.type}: {row.calls_per_step:.1f}/step, {row.ms_per_step:.2f} ms/step")
        if row.median_bytes:
            text.append(f", {_bytes(row.median_bytes)} median")
        if row.busbw_gbps is not None:
            text.append(f", busbw {row.busbw_gbps:.3f} GB/s")
        transfer = transfers.get(row.type)
        if transfer is not None:
            text.append(f" ({transfer:.3f} after the last rank arrived)")
        if row.vs_commbench_pct is not None:
            text.append(f"; {row.vs_commbench_pct:.0f}% of commbench's {row.commbench_busbw_gbps:.3f}")
    return text


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"
