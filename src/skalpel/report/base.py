"""What a renderer is, and the tables every writer finds one in.

A renderer turns one result into the content of one file. It has a ``name`` (what ``--json``
and ``--html`` ask for), an ``extension`` (what ``--out FILE`` is matched on), ``binary``
(``render`` returns bytes, written as they are; else text, written as UTF-8) and one method,
``render(result) -> str | bytes``. Its options are arguments of its constructor, checked
there: ``HtmlRenderer(flame=tree)``, ``TextRenderer(width=100)``.

There is one table per kind of result: ``RENDERERS`` for a Report, ``DIFF_RENDERERS`` for a
DiffResult, and tune's ``TUNE_RENDERERS`` in ``tune/renderers.py`` (tune sits above report/,
which must not import it). Tables per kind, not renderers that take any result, because an
extension names a format, not what goes in it: the command knows what it made, so it picks
the table, and ``for_path(path, table)`` or ``named(name, table)`` is then the one lookup
behind the run folder, ``--json``, ``--html`` and ``--out`` alike. A renderer taking every
kind would need a switch on the result's type in each format, and report/ would have to
import tune's result to switch on it.

``requested`` turns a command's ``--json``/``--html``/``--out`` into (path, renderer) pairs and
``write`` renders and writes them. The classes here are thin: each imports the module that
draws when it renders, so a lookup costs nothing (``analyze --json -`` never imports rich).
Trace exporters (``flamegraph.svg``, the speedscope profile) are not renderers: they draw a
Trace, not a result, and only the run folder writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from ..errors import SkalpelError
from ..files import write_file
from ..result.report import Report
from .json import DiffJsonRenderer, JsonRenderer

if TYPE_CHECKING:
    from ..result.diff import DiffResult

MIN_WIDTH = 40  # narrower, rich folds every table cell to a letter or two


class Renderer(Protocol):
    """One output format of one kind of result (a Protocol: report/json.py and tune/ need not import this)."""

    name: str
    extension: str
    binary: bool

    def render(self, result: Any) -> str | bytes: ...


class TextRenderer:
    """The terminal summary as plain text, without colour: ``summary.txt``, ``--out FILE.txt``."""

    name = "text"
    extension = ".txt"
    binary = False

    def __init__(self, *, width: int = 100) -> None:
        self.width = checked_width(width)

    def render(self, report: Report) -> str:
        from .terminal import render_text

        return render_text(report, width=self.width)


class HtmlRenderer:
    """The self-contained HTML page; ``flame`` is the {name, value, children} call tree its flame graph draws."""

    name = "html"
    extension = ".html"
    binary = False

    def __init__(self, *, flame: Mapping[str, Any] | None = None) -> None:
        if flame is not None and not isinstance(flame, Mapping):
            raise TypeError(f"HtmlRenderer(flame=...) takes a {{name, value, children}} mapping or None, "
                            f"not {type(flame).__name__}")  # fmt: skip
        self.flame = flame

    def render(self, report: Report) -> str:
        from .html import render

        return render(report, flame=self.flame)


class DiffTextRenderer:
    """The comparison as plain text, as the terminal shows it without colour."""

    name = "text"
    extension = ".txt"
    binary = False

    def __init__(self, *, width: int = 100) -> None:
        self.width = checked_width(width)

    def render(self, result: DiffResult) -> str:
        from .diff_render import render_text

        return render_text(result, width=self.width)


class DiffHtmlRenderer:
    """The comparison as a self-contained HTML page, in the report's shell."""

    name = "html"
    extension = ".html"
    binary = False

    def render(self, result: DiffResult) -> str:
        from .diff_render import render_html

        return render_html(result)


# In the order the run folder writes them; their names are the options' keys.
RENDERERS: tuple[type[Renderer], ...] = (JsonRenderer, HtmlRenderer, TextRenderer)
DIFF_RENDERERS: tuple[type[Renderer], ...] = (DiffJsonRenderer, DiffHtmlRenderer, DiffTextRenderer)


def for_path(path: str | Path, renderers: Sequence[type[Renderer]] = RENDERERS) -> type[Renderer]:
    """The renderer whose extension ``path`` has (case ignored); a SkalpelError naming the known ones if none."""
    suffix = Path(path).suffix.lower()
    for renderer in renderers:
        if renderer.extension == suffix:
            return renderer
    known = ", ".join(renderer.extension for renderer in renderers)
    raise SkalpelError(f"cannot tell what to write to {path} from its extension ({suffix or 'none'}): "
                       f"skalpel writes {known}")


def named(name: str, renderers: Sequence[type[Renderer]] = RENDERERS) -> type[Renderer]:
    """The renderer called ``name`` (``json``, ``html``, ``text``)."""
    for renderer in renderers:
        if renderer.name == name:
            return renderer
    raise SkalpelError(f"no renderer named {name!r}; there are {', '.join(r.name for r in renderers)}")


def requested(renderers: Sequence[type[Renderer]], *, json: str | None = None, html: str | None = None,
              out: str | None = None) -> list[tuple[Path, type[Renderer]]]:  # fmt: skip
    """The files a command was asked for: ``--json FILE``, ``--html FILE``, then ``--out FILE`` by its extension.

    ``--json -`` is stdout, not a file. Call it before the work: an unknown extension fails at once.
    """
    asked = (("json", json), ("html", html))
    files = [(Path(path), named(name, renderers)) for name, path in asked if path and path != "-"]
    if out:
        files.append((Path(out), for_path(out, renderers)))
    return files


def write(result: Any, files: Iterable[tuple[Path, type[Renderer]]],
          options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:  # fmt: skip
    """Render ``result`` into each file, each renderer built with its own ``options[renderer.name]``."""
    options = options or {}
    return [write_file(path, renderer(**options.get(renderer.name, {})).render(result)) for path, renderer in files]


def checked_width(width: int) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < MIN_WIDTH:
        raise ValueError(f"a text width is a whole number of at least {MIN_WIDTH} columns, not {width!r}")
    return width
