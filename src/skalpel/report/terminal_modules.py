"""The terminal's module tree: the heaviest modules of a rank, indented as they nest, with their lines.

It reads ``RankReport.modules`` (analysis/modules.py), which a report read back from JSON has as well.
Modules are ranked by device time on device runs, by host time on CPU-only runs; a module is shown
when it holds ``SHOWN_FROM_PCT`` of the outermost modules' time, at most ``MAX_ROWS`` of them.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..result.sections import ModuleRow, ModulesSummary
from .html_parts import fmt_bytes

SHOWN_FROM_PCT = 5.0
MAX_ROWS = 14


def modules_table(modules: ModulesSummary) -> Table | None:
    """The tree's heaviest rows; None when no module holds any time."""
    device = modules.ranked_by == "device"
    time_of = (lambda node: node.device_ms) if device else (lambda node: node.host_ms)
    whole = modules.device_in_modules_ms if device else modules.host_ms
    if whole <= 0 or not modules.nodes:
        return None
    unit = modules.unit if modules.unit in ("step", "iteration") else "window"
    outside = modules.device_unattributed_ms if device else modules.host_unattributed_ms
    total = modules.device_ms if device else modules.unit_ms
    share = 100.0 * outside / total if total > 0 else 0.0
    lane = "device" if device else "host"
    linked = modules.backward_host_ms > 0 or modules.backward_device_ms > 0
    outside_what = "optimizer, loss, loop" if linked else "backward, optimizer, loop"
    sized = modules.sizes == "recorded"
    caption = None if sized else "parameters and output sizes: not recorded (a stored trace; skalpel run records them)"
    table = Table(title=f"modules by {lane} time (ms per {unit}; {outside:.2f} ms, {share:.0f}% of the {lane}'s "
                        f"{total:.2f} ms, outside any module: {outside_what})",
                  title_justify="left", caption=caption, caption_justify="left", expand=False)  # fmt: skip
    table.add_column("module", overflow="fold", min_width=18, max_width=48)
    table.add_column("calls", justify="right", no_wrap=True)
    table.add_column(lane, justify="right", no_wrap=True)
    table.add_column("self", justify="right", no_wrap=True)
    if linked:  # the backward ops of the nodes each module's forward made (autograd's sequence numbers)
        table.add_column("backward", justify="right", no_wrap=True)
    table.add_column("GFLOP", justify="right", no_wrap=True)
    if sized:  # the capture's record of each module: parameters, and the bytes its forward returned
        table.add_column("params", justify="right", no_wrap=True)
        table.add_column("output", justify="right", no_wrap=True)
    table.add_column("line (its forward's, where not the user's)", overflow="fold", max_width=48)
    for node in shown_nodes(modules.nodes, time_of, whole):
        self_ms = node.device_self_ms if device else node.host_self_ms
        label = Text("  " * (len(node.path) - 1) + node.path[-1])
        backward = [f"{node.backward_device_ms if device else node.backward_host_ms:.2f}"] if linked else []
        output = fmt_bytes(node.output_bytes) if node.output_bytes is not None else "-"
        size = [_count(node.params), output] if sized else []
        table.add_row(label, f"{node.calls:g}", f"{time_of(node):.2f}", f"{self_ms:.2f}", *backward,
                      f"{node.flops / 1e9:.2f}" if node.flops else "-", *size,
                      Text(_short(node.location or node.defined_at)))  # fmt: skip
    return table


def shown_nodes(nodes: tuple[ModuleRow, ...], time_of, whole: float) -> list[ModuleRow]:
    """Rows holding SHOWN_FROM_PCT of ``whole`` or more, in tree order, at most MAX_ROWS."""
    return [node for node in nodes if 100.0 * time_of(node) / whole >= SHOWN_FROM_PCT][:MAX_ROWS]


def _count(params: int | None) -> str:
    """4,160 -> 4.2K; 124,000,000 -> 124M."""
    if params is None:
        return "-"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= size:
            return f"{params / size:.1f}{unit}"
    return str(params)


def _short(location: str | None) -> str:
    """``examples/model.py:52 in forward`` -> ``model.py:52 in forward``: the file's name is enough beside the tree."""
    return location.rsplit("/", 1)[-1] if location else "-"
