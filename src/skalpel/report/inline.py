"""The HTML report inline in a notebook: the self-contained page (``html.py``) in an iframe of its own.

The page is whole (its own CSS, its script allowed by hash in its Content-Security-Policy): inside ``srcdoc`` its
styles do not reach the notebook's and the notebook's do not reach it, and nothing is fetched.
"""

from __future__ import annotations

from html import escape

from ..result.report import Report
from .html import render

HEIGHT_PX = 900


def framed(page: str, *, height: int = HEIGHT_PX) -> str:
    """``page`` (a whole HTML document) as a notebook output: an iframe holding it."""
    return (f'<iframe class="skalpel-report" srcdoc="{escape(page, quote=True)}" '
            f'style="width:100%;height:{height}px;border:1px solid #ddd"></iframe>')  # fmt: skip


def report_inline(report: Report) -> str:
    """The report of ``skalpel.analyze()``: its page rendered now (no flame graph: the report holds no stacks)."""
    return framed(render(report))
