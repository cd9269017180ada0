"""The tune result as a self-contained HTML page, in the report's shell (``report.html.page``).

Every name, error and line of code is escaped: they come from the user's script and its output.
"""

from __future__ import annotations

from html import escape

from ..report import html_parts as parts
from ..report.html import page
from .render import ms_text, not_applicable_groups, note, one_time_note, speedup_text, whole_text
from .result import TuneResult

_VERDICT_CLASS = {"faster": "better", "slower": "worse", "error": "worse"}


def render(result: TuneResult) -> str:
    body = [
        f"<header><h1>skalpel tune</h1><p class=\"meta mono\">{escape(' '.join([result.script, *result.args]))}</p></header>",
        parts.section("recommended", "Recommended", _recommended(result)),
        parts.section("candidates", "Candidates", _table(result)),
        parts.section("method", "How it was measured", _method(result)),
    ]
    return page("skalpel tune", "".join(body))


def _recommended(result: TuneResult) -> str:
    if not result.recommended:
        return "<p><strong>Nothing: no candidate was measured faster than the baseline.</strong></p>"
    by_name = {entry.name: entry for entry in result.candidates}
    items = []
    for name in result.recommended:
        entry = by_name[name]
        changes = "".join(_change(change) for change in entry.change)
        items.append(f'<li class="better"><strong>{escape(name)}</strong> ({escape(speedup_text(entry))}): '
                     f"{escape(entry.what)}<ul>{changes}</ul></li>")  # fmt: skip
    return f"<ul>{''.join(items)}</ul>"


def _change(change: dict) -> str:
    where = escape(str(change.get("location") or "the script"))
    diff = ""
    if change.get("before") and change.get("after"):
        diff = f"<pre class=\"mono\">- {escape(str(change['before']))}\n" + "\n".join(
            f"+ {escape(line)}" for line in str(change["after"]).splitlines()) + "</pre>"  # fmt: skip
    elif change.get("after"):
        diff = f"<pre class=\"mono\">+ {escape(str(change['after']))}</pre>"
    return f"<li><code>{where}</code>: {escape(str(change.get('edit') or ''))}{diff}</li>"


def _table(result: TuneResult) -> str:
    headers = [("candidate", False), ("why", False), ("step time", True), ("speed-up", True), ("whole run", True),
               ("verdict", False), ("note", False)]  # fmt: skip
    base = result.baseline
    rows = ["<tr>" + parts.name_cell("baseline") + "<td>the script unchanged</td>"
            + parts.num(base.median_ms, ms_text(base.median_ms, base.noise_pct)) + parts.num(1.0, "1.00x")
            + parts.num(base.whole_run_s, whole_text(base.whole_run_s, 1.0))
            + f"<td></td><td>{base.runs} runs</td></tr>"]  # fmt: skip
    for entry in result.candidates:
        verdict = entry.verdict or "not measured"
        klass = _VERDICT_CLASS.get(verdict, "")
        speedup = None if entry.speedup is None else speedup_text(entry)
        rows.append("<tr>" + parts.name_cell(entry.name) + f"<td>{escape(entry.reason)}</td>"
                    + parts.num(entry.median_ms, ms_text(entry.median_ms, entry.noise_pct))
                    + parts.num(entry.speedup, speedup)
                    + parts.num(entry.whole_run_speedup, whole_text(entry.whole_run_s, entry.whole_run_speedup))
                    + f'<td class="{klass}">{escape(verdict)}</td>'
                    + f"<td>{escape('; '.join(filter(None, (note(entry), one_time_note(entry, result)))))}</td></tr>")  # fmt: skip
    return parts.table(headers, rows)


def _method(result: TuneResult) -> str:
    facts = [
        f"each run: {result.warmup_steps} warm-up steps, then {result.window_steps} timed steps, without the profiler",
        f"{result.repeats} runs per candidate, interleaved with baseline runs; step time is the median over runs "
        "of each run's mean step, ± the robust spread between runs; the speed-up is the median of each run over "
        "its round's baseline run",
        f"whole run: each run's one-time cost + {result.run_steps or '?'} steps ({result.run_steps_from or 'unknown'})",
        f"{result.cores} usable cores; device {result.device or 'unknown'}",
        f"findings from {result.findings_source or 'nowhere'}: {', '.join(result.findings) or 'none'}",
        f"{result.elapsed_s:.0f} s of a {result.budget_s:.0f} s budget" + (" (interrupted)" if result.interrupted else ""),
    ]
    facts += [f"not run: {item['name']}: {item['why']}" for item in result.not_run]
    facts += [f"not tried on this device ({why}): {', '.join(names)}" for why, names in not_applicable_groups(result).items()]
    facts += [f"note: {line}" for line in result.notes]
    return "<ul>" + "".join(f"<li>{escape(fact)}</li>" for fact in facts) + "</ul>"
