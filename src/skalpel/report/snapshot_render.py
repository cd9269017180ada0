"""Terminal renderers for a memory snapshot's summary and for two snapshots' difference (their JSON: ``to_json``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..display import cut_name, for_terminal
from ..result.snapshot import DeviceMemory, SnapshotDiff, SnapshotSummary
from .html_parts import fmt_bytes
from .terminal import text_console


def print_snapshot(summary: SnapshotSummary, *, console: Console | None = None) -> None:
    console = console or Console()
    summary = for_terminal(summary)
    console.print(f"[bold]memory snapshot[/bold] {cut_name(summary.path, 120)}")
    for device in summary.devices:
        console.print(_device_line(device))
    if summary.largest_blocks:
        table = Table(title="largest allocated blocks", title_justify="left")
        table.add_column("bytes", justify="right")
        table.add_column("device", justify="right")
        table.add_column("allocated at")
        table.add_column("stack (innermost first)")
        for block in summary.largest_blocks:
            table.add_row(fmt_bytes(block.size_bytes), str(block.device), block.location or "-",
                          " < ".join(block.stack[:3]) or "-")  # fmt: skip
        console.print(table)
    if summary.by_site:
        table = Table(title="allocated bytes by user line", title_justify="left")
        table.add_column("bytes", justify="right")
        table.add_column("blocks", justify="right")
        table.add_column("line")
        for site in summary.by_site:
            table.add_row(fmt_bytes(site.bytes), str(site.blocks), site.location)
        console.print(table)
    for note in summary.notes:
        console.print(f"note: {note}")


def _device_line(device: DeviceMemory) -> str:
    free_pct = 100.0 * device.free_in_segments_bytes / device.reserved_bytes if device.reserved_bytes else 0.0
    lines = [f"device {device.device}: allocated {fmt_bytes(device.allocated_bytes)} (requested "
             f"{fmt_bytes(device.requested_bytes)}), reserved {fmt_bytes(device.reserved_bytes)} in "
             f"{device.segments} segments",
             f"  free in segments {fmt_bytes(device.free_in_segments_bytes)} ({free_pct:.0f}% of reserved), "
             f"largest free block {fmt_bytes(device.largest_free_block_bytes)}",
             f"  peak allocated {fmt_bytes(device.peak_allocated_bytes)}, peak reserved "
             f"{fmt_bytes(device.peak_reserved_bytes)} over {device.trace_actions} traced actions"
             if device.trace_actions else "  no trace: the peaks are unknown"]  # fmt: skip
    if device.out_of_memory_events:
        lines.append(f"  [bold red]{device.out_of_memory_events} out-of-memory failures in the trace[/bold red]")
    return "\n".join(lines)


def print_snapshot_diff(diff: SnapshotDiff, *, console: Console | None = None) -> None:
    console = console or Console()
    diff = for_terminal(diff)
    console.print(f"[bold]memory snapshots[/bold] {cut_name(diff.before, 80)} -> {cut_name(diff.after, 80)}")
    console.print(f"allocated {fmt_bytes(diff.before_allocated_bytes)} -> {fmt_bytes(diff.after_allocated_bytes)} "
                  f"({_signed(diff.allocated_delta_bytes)}), reserved {fmt_bytes(diff.before_reserved_bytes)} -> "
                  f"{fmt_bytes(diff.after_reserved_bytes)} ({_signed(diff.reserved_delta_bytes)})")  # fmt: skip
    for title, changes in (("grew", diff.grew), ("shrank", diff.shrank)):
        if not changes:
            console.print(f"nothing {title}")
            continue
        table = Table(title=f"{title}, by the user line that allocated it", title_justify="left")
        for column in ("change", "before", "after"):
            table.add_column(column, justify="right")
        table.add_column("line")
        for change in changes:
            table.add_row(_signed(change.delta_bytes), fmt_bytes(change.before_bytes), fmt_bytes(change.after_bytes),
                          change.location)  # fmt: skip
        console.print(table)


def _signed(value: int) -> str:
    return ("+" if value >= 0 else "-") + fmt_bytes(abs(value))


def render_text(summary: SnapshotSummary | SnapshotDiff, *, width: int = 120) -> str:
    console = text_console(width)
    if isinstance(summary, SnapshotDiff):
        print_snapshot_diff(summary, console=console)
    else:
        print_snapshot(summary, console=console)
    return console.export_text()
