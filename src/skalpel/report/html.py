"""The self-contained HTML report: one file, no network at view time, opens offline.

``render(report, *, flame=None) -> str``. The verdict comes first, then the numbers behind
it. Charts are inline SVG drawn here (html_svg.py); a small inline script (assets/report.js)
adds hover details, table sorting and the zoomable flame graph. Every string that came from
a trace is escaped (``html.escape`` in markup; JSON with ``<``, ``>``, ``&`` escaped inside
``<script>``), and a Content-Security-Policy allows only this page's own script (by hash),
so an op named ``<img onerror=...>`` shows as text and can run nothing.

Size is bounded whatever the trace: tables are capped, curves downsampled and the flame
tree pruned, so the page stays well under 5 MB.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape
from importlib import resources
from typing import Any, Mapping

from ..analysis.call_tree import MIN_FLAME_FRACTION
from ..result.report import Report
from . import html_parts as parts
from .html_job import job_section
from .html_modules import modules_section
from .html_roofline import roofline_section

MAX_FLAME_NODES = 4000
MAX_NAME_CHARS = 400


def render(report: Report, *, flame: Mapping[str, Any] | None = None, title: str | None = None) -> str:
    """The whole page as one string."""
    body = [
        parts.header(report, title),
        parts.cut_files(report),  # before the verdict it qualifies
        parts.verdict(report),
        job_section(report) if len(report.ranks) > parts.DETAIL_RANKS else "",
        parts.steps(report),
        parts.breakdown(report),
        parts.ledger(report),
        parts.gpu(report),
        parts.blame(report),
        parts.tables(report),
        modules_section(report),
        roofline_section(report),
        parts.memory(report),
        flame_section(flame),
        parts.ranks(report),
        parts.extras(report),
        parts.capture(report),
        parts.warnings(report),
    ]
    return page(title or "skalpel report", "".join(body))


def page(title: str, body: str) -> str:
    """Wrap body markup in the page shell: inline CSS, inline script, strict CSP."""
    css = _asset("report.css")
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{css}</style></head>"
        f'<body><main>{body}</main><div id="tip" role="tooltip"></div><script>{script}</script></body></html>\n'
    )


def _asset(name: str) -> str:
    return resources.files("skalpel.report").joinpath("assets", name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """JSON safe to place inside a <script> element: no '</script>', '<!--' or '&' can appear."""
    import orjson

    text = orjson.dumps(value).decode("utf-8")
    return (
        text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )  # fmt: skip


def flame_section(flame: Mapping[str, Any] | None) -> str:
    head = '<section id="flame-graph"><h2>Flame graph</h2>'
    tree = prune_flame(flame) if flame else None
    if not tree or not tree.get("value"):
        why = ("the trace has no Python call stacks (capture with with_stack=True)" if flame is None
               else "the stack tree is empty")  # fmt: skip
        return head + parts.na(why) + "</section>"
    unit = str((flame or {}).get("unit", "ms"))
    data = script_json({"tree": tree, "unit": unit})
    return (
        head + '<p class="note">Time in the profiled steps by call stack. Hover for details; click a frame to zoom, '
        'click it again (or reset) to zoom out.</p><button id="flame-reset" type="button">reset zoom</button>'
        '<svg id="flame" class="chart flame" width="100%" viewBox="0 0 1060 18" preserveAspectRatio="xMinYMin meet" '
        f'xmlns="http://www.w3.org/2000/svg"></svg><script type="application/json" id="flame-data">{data}</script></section>'
    )


def prune_flame(tree: Mapping[str, Any], *, max_nodes: int = MAX_FLAME_NODES,
                min_fraction: float = MIN_FLAME_FRACTION) -> dict[str, Any]:  # fmt: skip
    """A copy of a {name, value, children} tree without frames too small to see, at most max_nodes."""
    total = float(tree.get("value") or 0.0)
    floor = total * min_fraction
    budget = [max_nodes]

    def copy(node: Mapping[str, Any]) -> dict[str, Any]:
        budget[0] -= 1
        kids = sorted((c for c in node.get("children") or () if float(c.get("value") or 0) >= floor),
                      key=lambda c: -float(c.get("value") or 0))  # fmt: skip
        children = []
        for child in kids:
            if budget[0] <= 0:
                break
            children.append(copy(child))
        name = str(node.get("name", ""))[:MAX_NAME_CHARS]
        return {"name": name, "value": round(float(node.get("value") or 0.0), 4), "children": children}

    return copy(tree)
