"""The HTML page's module tree: one ``<details>`` per module, nested as the modules are, the heaviest open.

It reads ``RankReport.modules`` (analysis/modules.py): the rows come in preorder with their paths, so
the nesting is rebuilt from the paths. Each summary line gives the module's time (device time on
device runs, host time on CPU-only runs), its self time, calls, FLOPs and its line.
"""

from __future__ import annotations

from ..result.report import Report
from ..result.sections import ModuleRow, ModulesSummary
from .html_parts import DETAIL_RANKS, escape, fmt_bytes, section

OPEN_DEPTH = 2  # levels shown unfolded


def modules_section(report: Report) -> str:
    trees = [(rank.rank, rank.modules) for rank in report.ranks[:DETAIL_RANKS] if rank.modules is not None]
    if not trees:
        return ""
    body = []
    for rank, modules in trees:
        head = f"<h3>rank {rank}</h3>" if len(report.ranks) > 1 else ""
        body.append(head + _intro(modules) + _tree(modules))
    return section("modules", "Time by module", "".join(body))


def _intro(modules: ModulesSummary) -> str:
    device = modules.ranked_by == "device"
    lane = "device" if device else "host"
    total = modules.device_ms if device else modules.unit_ms
    outside = modules.device_unattributed_ms if device else modules.host_unattributed_ms
    share = 100.0 * outside / total if total > 0 else 0.0
    linked = modules.backward_host_ms > 0 or modules.backward_device_ms > 0
    backward = (f"{modules.backward_device_ms if device else modules.backward_host_ms:.2f} ms of backward is "
                "charged to the module whose forward made it; " if linked else "")  # fmt: skip
    what = "the optimizer, the loss, the loop" if linked else "backward, the optimizer, the loop"
    return (f'<p class="note">ms per {escape(modules.unit)}, by {lane} time over {modules.units} '
            f'{escape(modules.unit)}(s): {backward}{outside:.2f} ms of the {lane}\'s {total:.2f} ms ({share:.0f}%) ran '
            f"outside any module ({what}). {_sizes_note(modules)}Click a module to fold or unfold it.</p>")  # fmt: skip


def _sizes_note(modules: ModulesSummary) -> str:
    if modules.sizes == "recorded":
        return "Parameters count the module's and its children's; output is what its forward returned. "
    return "Parameters and output sizes: not recorded (a stored trace; skalpel run records them). "


def _tree(modules: ModulesSummary) -> str:
    device = modules.ranked_by == "device"
    out: list[str] = []
    depth = -1
    for node in modules.nodes:
        level = len(node.path) - 1
        while depth >= level:  # close the nodes this one is not inside
            out.append("</details>")
            depth -= 1
        out.append(_node(node, device, level))
        depth = level
    out.extend("</details>" for _ in range(depth + 1))
    return '<div class="modules mono">' + "".join(out) + "</div>"


def _node(node: ModuleRow, device: bool, level: int) -> str:
    time_ms, self_ms = (node.device_ms, node.device_self_ms) if device else (node.host_ms, node.host_self_ms)
    flops = f", {node.flops / 1e9:.2f} GFLOP" if node.flops else ""
    back_ms = node.backward_device_ms if device else node.backward_host_ms
    backward = f", backward {back_ms:.3f} ms" if back_ms > 0 else ""
    sizes = ""
    if node.params is not None:
        sizes += f", {node.params:,} params"
    if node.output_bytes is not None:
        sizes += f", output {fmt_bytes(node.output_bytes)}"
    line = node.location or node.defined_at
    where = f" — {escape(line)}" if line else ""
    opened = " open" if level < OPEN_DEPTH else ""
    indent = ' style="margin-left:1.2em"' if level else ""  # nested in its parent's: the indents add up
    return (f"<details{opened}{indent}><summary>{escape(node.path[-1])}: {time_ms:.3f} ms (self {self_ms:.3f}), "
            f"{node.calls:g} call{'s' if node.calls != 1 else ''}{backward}{flops}{sizes}{where}"
            "</summary>")  # fmt: skip
