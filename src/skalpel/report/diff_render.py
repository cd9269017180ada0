"""Renderers for a DiffResult: terminal (rich) and a self-contained HTML page (its JSON: ``report/json.py``)."""

from __future__ import annotations

from html import escape
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..display import cut_name, for_terminal
from ..result.diff import DiffResult, FindingChange, OpDelta, StepChange
from . import html_parts as parts
from .terminal import text_console

_VERDICT_WORDS = {"slower": "slower", "faster": "faster", "within_noise": "no change beyond the noise"}


def headline(step: StepChange) -> str:
    """One line: the change, its interval and the verdict."""
    line = (f"median step {step.before_median_ms:.2f} ms -> {step.after_median_ms:.2f} ms "
            f"({step.change_pct:+.1f}%): {_VERDICT_WORDS[step.verdict]}")  # fmt: skip
    return line + " " + noise_text(step)


def noise_text(step: StepChange) -> str:
    pieces = []
    if step.ci_low_pct is not None and step.ci_high_pct is not None:
        pieces.append(f"95% interval {step.ci_low_pct:+.1f}% .. {step.ci_high_pct:+.1f}% "
                      f"from {step.before_steps} vs {step.after_steps} steps")  # fmt: skip
    if step.capture_noise_pct is not None:
        pieces.append(f"capture noise ±{step.capture_noise_pct:.1f}%")
    if not step.noise_known:
        pieces.append(f"noise unknown: too few steps ({step.before_steps} vs {step.after_steps}) and no repeated "
                      f"capture windows; changes under ±{step.noise_band_pct:.1f}% are called noise")  # fmt: skip
    return "(" + "; ".join(pieces) + ")"


def render(result: DiffResult) -> list:
    """Rich renderables, the verdict first."""
    result = for_terminal(result)  # names from the traces: control characters escaped, lengths bounded
    out: list = []
    if result.mismatches:
        out.append(Panel(Text("\n".join(result.mismatches)), title="these runs may not be comparable",
                         title_align="left", border_style="red"))  # fmt: skip
    style = {"slower": "bold red", "faster": "bold green"}.get(result.step.verdict, "bold")
    body = [Text(headline(result.step), style=style)]
    if result.categories:
        body.append(Text(mover_line(result)))
    body += [_finding_line("appeared", "red", change.after) for change in result.appeared]
    body += [_finding_line("disappeared", "green", change.before) for change in result.disappeared]
    body += [_finding_line("still there", "yellow", change.after, change.before) for change in _serious(result.persisting)]
    out.append(Panel(Group(*body), title=Text(f"{result.before_label} -> {result.after_label}"), title_align="left"))
    if result.categories:
        table = Table(title="step time by category (biggest movers first)", title_justify="left")
        for name in ("category", "before %", "after %", "Δ points", "before ms/step", "after ms/step", "Δ ms/step"):
            table.add_column(name, justify="left" if name == "category" else "right", no_wrap=name == "category")
        for row in result.categories:
            table.add_row(Text(row.category), f"{row.before_pct:.1f}", f"{row.after_pct:.1f}", f"{row.delta_pct:+.1f}",
                          f"{row.before_ms_per_step:.2f}", f"{row.after_ms_per_step:.2f}", f"{row.delta_ms_per_step:+.2f}")  # fmt: skip
        out.append(table)
    movers = ((f"ops ({result.op_metric} per step)", result.ops), ("kernels (ms per step)", result.kernels),
              ("torch.compile regions (host ms per step)", result.regions))  # fmt: skip
    for title, rows in movers:
        if rows:
            out.append(_movers_table(title, rows))
    for note in result.notes:
        out.append(Text(f"note: {note}", style="dim"))
    return out


def mover_line(result: DiffResult) -> str:
    top = result.categories[0]
    return (f"biggest change: {top.category} {top.before_pct:.1f}% -> {top.after_pct:.1f}% of the step "
            f"({top.delta_ms_per_step:+.2f} ms/step)")  # fmt: skip


def _serious(changes: tuple[FindingChange, ...]) -> list[FindingChange]:
    """Findings still present, without the informational ones (the JSON keeps them all)."""
    return [c for c in changes if c.after is not None and c.after.severity != "info"]


def _finding_line(word: str, style: str, finding: Any, before: Any = None) -> Text:
    text = Text(f"{word:12}", style=style)
    text.append(f"{finding.severity} {finding.id}: {finding.title}{ranks_moved(finding, before)}")
    return text


def ranks_moved(finding: Any, before: Any = None) -> str:
    """' (ranks 0-255)', or ' (ranks 0-255 -> 3)' when a job's finding holds on other ranks than before."""
    now = finding.across.ranks if finding.across is not None else None
    then = before.across.ranks if before is not None and before.across is not None else None
    if now is None:
        return ""
    return f" (ranks {then} -> {now})" if then is not None and then != now else f" (ranks {now})"


def _movers_table(title: str, rows: tuple[OpDelta, ...]) -> Table:
    table = Table(title=f"{title}, biggest movers first", title_justify="left")
    table.add_column("name", overflow="ellipsis", no_wrap=True, max_width=70)
    for name in ("before", "after", "Δ"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(Text(cut_name(row.name)), _ms(row.before_ms_per_step), _ms(row.after_ms_per_step), f"{row.delta_ms_per_step:+.3f}")
    return table


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def print_diff(result: DiffResult, *, console: Console | None = None) -> None:
    console = console or Console()
    for renderable in render(result):
        console.print(renderable)


def render_text(result: DiffResult, *, width: int = 100) -> str:
    """The comparison as plain text, as ``print_diff`` shows it without colour."""
    console = text_console(width)
    print_diff(result, console=console)
    return console.export_text()


def render_html(result: DiffResult) -> str:
    from .html import page

    step = result.step
    klass = {"slower": "worse", "faster": "better"}.get(step.verdict, "")
    body = [f"<header><h1>skalpel diff</h1><p class=\"meta mono\">{escape(result.before_label)} → "
            f"{escape(result.after_label)}</p></header>"]  # fmt: skip
    if result.mismatches:
        body.append("".join(f'<div class="mismatch">{escape(m)}</div>' for m in result.mismatches))
    verdict = f'<p class="{klass}"><strong>{escape(headline(step))}</strong></p>'
    if result.categories:
        verdict += f"<p>{escape(mover_line(result))}</p>"
    changes = [("appeared", c.after) for c in result.appeared] + [("disappeared", c.before) for c in result.disappeared]
    changes += [("still there", c.after) for c in _serious(result.persisting)]
    items = "".join(f"<li><strong>{escape(word)}</strong>: {escape(f.severity)} <code>{escape(f.id)}</code> "
                    f"{escape(f.title + ranks_moved(f))}</li>" for word, f in changes if f is not None)  # fmt: skip
    body.append(parts.section("verdict", "Verdict", verdict + (f"<ul>{items}</ul>" if items else "<p>No finding appeared or disappeared.</p>")))
    if result.categories:
        from . import html_svg as svg

        rows = [("before", {c.category: c.before_ms_per_step for c in result.categories}),
                ("after", {c.category: c.after_ms_per_step for c in result.categories})]
        chart = svg.stacked_bars(rows, unit=" ms", label="step time by category, before and after")
        headers = [("category", False), ("before %", True), ("after %", True), ("Δ points", True), ("Δ ms/step", True)]
        table_rows = ["<tr>" + parts.name_cell(c.category) + parts.num(c.before_pct, f"{c.before_pct:.1f}")
                      + parts.num(c.after_pct, f"{c.after_pct:.1f}") + parts.num(c.delta_pct, f"{c.delta_pct:+.1f}")
                      + parts.num(c.delta_ms_per_step, f"{c.delta_ms_per_step:+.2f}") + "</tr>" for c in result.categories]  # fmt: skip
        body.append(parts.section("categories", "Step time by category", chart + parts.table(headers, table_rows)))
    else:
        body.append(parts.section("categories", "Step time by category", parts.na("a side has no step-time breakdown")))
    movers = (("ops", f"Ops ({result.op_metric} per step)", result.ops), ("kernels", "Kernels (ms per step)", result.kernels),
              ("regions", "torch.compile regions (host ms per step)", result.regions))  # fmt: skip
    for anchor, title, rows in movers:
        if anchor == "regions" and not rows:
            continue
        headers = [("name", False), ("before", True), ("after", True), ("Δ", True)]
        table_rows = ["<tr>" + parts.name_cell(r.name) + _num3(r.before_ms_per_step) + _num3(r.after_ms_per_step)
                      + parts.num(r.delta_ms_per_step, f"{r.delta_ms_per_step:+.3f}") + "</tr>" for r in rows]  # fmt: skip
        body.append(parts.section(anchor, title, parts.table(headers, table_rows) if rows else parts.na("no rows on either side")))
    if result.notes:
        body.append(parts.section("notes", "Notes", "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>"))
    return page("skalpel diff", "".join(body))


def _num3(value: float | None) -> str:
    return parts.num(value, None if value is None else f"{value:.3f}")
