"""The terminal's roofline: each heavy op group's label, intensity and share of its roof, in one table.

It reads ``RankReport.roofline`` (analysis/roofline.py), which a report read back from JSON has as well.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..display import cut_name
from ..result.sections import RooflineSummary

MAX_ROWS = 8


def roofline_table(roof: RooflineSummary) -> Table | None:
    if not roof.ops:
        return None
    table = Table(title=f"ops under the roofs ({roof.roofs}; ms per step)", title_justify="left", expand=False)
    table.add_column("op (shapes, dtype)", overflow="fold", min_width=20, max_width=48)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("FLOP/B", justify="right", no_wrap=True)
    table.add_column("label", no_wrap=True)
    table.add_column("of roof", justify="right", no_wrap=True)
    for row in roof.ops[:MAX_ROWS]:
        label = Text(cut_name(row.op))
        shapes = (row.shapes or "")[:40]
        label.append(f"\n{shapes} {row.dtype or ''}".rstrip(), style="dim")
        verdict = row.label if row.label != "not judged" else f"not judged: {row.why}"
        table.add_row(label, f"{row.ms:.2f}", f"{row.intensity:.3g}" if row.intensity is not None else "-",
                      Text(verdict), f"{row.roof_pct:.0f}%" if row.roof_pct is not None else "-")  # fmt: skip
    return table
