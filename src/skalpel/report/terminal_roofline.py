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
    rows = roof.ops[:MAX_ROWS]
    reasons = {row.why for row in rows if row.label == "not judged"}
    shared = next(iter(reasons)) if len(reasons) == 1 else None  # said once, under the table: a long reason in
    # every row squeezed the op column out of an 80-column terminal (a stored CPU trace: no roof for any op)
    table = Table(title=f"ops under the roofs ({roof.roofs}; ms per step)", title_justify="left", expand=False,
                  caption=f"not judged: {shared}" if shared else None, caption_justify="left")  # fmt: skip
    table.add_column("op (shapes, dtype)", overflow="fold", min_width=20, max_width=48)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("FLOP/B", justify="right", no_wrap=True)
    table.add_column("label", overflow="fold", max_width=40)
    table.add_column("of roof", justify="right", no_wrap=True)
    for row in rows:
        label = Text(cut_name(row.op))
        shapes = (row.shapes or "")[:40]
        label.append(f"\n{shapes} {row.dtype or ''}".rstrip(), style="dim")
        verdict = row.label if row.label != "not judged" or shared else f"not judged: {row.why}"
        table.add_row(label, f"{row.ms:.2f}", f"{row.intensity:.3g}" if row.intensity is not None else "-",
                      Text(verdict), f"{row.roof_pct:.0f}%" if row.roof_pct is not None else "-")  # fmt: skip
    return table
