"""The tune result's renderers, in the shape of ``report/base.py``: JSON (``skalpel.tune/1``), text, HTML.

``for_path(path, TUNE_RENDERERS)`` and ``named(name, TUNE_RENDERERS)`` find one. The table lives
here, not in report/, because tune sits above report/ (which must not import a tune result).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..report.base import Renderer, checked_width
from ..report.json import JsonRenderer

if TYPE_CHECKING:
    from .result import TuneResult


class TuneTextRenderer:
    """The table and the recommendation as the terminal shows them, without colour."""

    name = "text"
    extension = ".txt"
    binary = False

    def __init__(self, *, width: int = 100) -> None:
        self.width = checked_width(width)

    def render(self, result: TuneResult) -> str:
        from .render import render_text

        return render_text(result, width=self.width)


class TuneHtmlRenderer:
    """The result as a self-contained HTML page, in the report's shell."""

    name = "html"
    extension = ".html"
    binary = False

    def render(self, result: TuneResult) -> str:
        from .html import render

        return render(result)


TUNE_RENDERERS: tuple[type[Renderer], ...] = (JsonRenderer, TuneHtmlRenderer, TuneTextRenderer)
