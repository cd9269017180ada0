"""The tune result in the terminal: the table (candidate -> step time ± noise -> speed-up -> verdict), then the
recommended changes at the lines of the user's code."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..report.terminal import text_console
from .candidates import CATALOGUE
from .result import CandidateResult, TuneResult

VERDICT_STYLE = {"faster": "bold green", "slower": "red", "error": "bold red", "no_gain": ""}


def ms_text(median_ms: float | None, noise_pct: float | None) -> str:
    if median_ms is None:
        return "–"
    noise = f" ± {noise_pct:.1f}%" if noise_pct is not None else ""
    return f"{median_ms:.2f} ms{noise}"


def note(entry: CandidateResult) -> str:
    """What a reader must know beside the verdict: the error, an early stop, a changed loss."""
    pieces = []
    if entry.error:
        pieces.append(entry.error.strip().splitlines()[-1])
    if entry.stopped_early:
        pieces.append(f"stopped early: {entry.stopped_early}")
    if entry.loss is not None and not entry.loss.within_tolerance:
        pieces.append(f"loss after step {entry.loss.step} changed {entry.loss.change_pct:+.2f}% "
                      f"(tolerance {entry.loss.tolerance_pct:g}%){_loss_why(entry)}")  # fmt: skip
    return "; ".join(pieces)


def _loss_why(entry: CandidateResult) -> str:
    if (entry.fix.get("dataloader") or {}).get("num_workers"):
        return ": DataLoader workers draw random numbers from their own seeds"
    return ""


def table(result: TuneResult) -> Table:
    grid = Table(title=f"skalpel tune: {result.script}", title_justify="left")
    for name, right in (("candidate", False), ("why", False), ("step time", True), ("speed-up", True),
                        ("whole run", True), ("verdict", False)):  # fmt: skip
        grid.add_column(name, justify="right" if right else "left", overflow="fold", no_wrap=name != "why")
    base = result.baseline
    grid.add_row("baseline", f"unchanged, {base.runs} run{'s' if base.runs != 1 else ''}", ms_text(base.median_ms, base.noise_pct), "1.00x",
                 whole_text(base.whole_run_s, 1.0), "")  # fmt: skip
    for entry in result.candidates:
        verdict = entry.verdict or "not measured"
        speedup = speedup_text(entry)
        grid.add_row(entry.name, entry.reason, ms_text(entry.median_ms, entry.noise_pct), speedup,
                     whole_text(entry.whole_run_s, entry.whole_run_speedup),
                     Text(verdict, style=VERDICT_STYLE.get(verdict, "dim")))  # fmt: skip
    return grid


def whole_text(seconds: float | None, speedup: float | None) -> str:
    """The whole run (one-time cost + its steps): ``12.3 s 0.61x``."""
    if seconds is None:
        return "–"
    return f"{seconds:.1f} s" + (f" {speedup:.2f}x" if speedup is not None else "")


def one_time_note(entry: CandidateResult, result: TuneResult) -> str:
    """Faster per step, slower over the whole run: its one-time cost, and after how many steps it pays back."""
    if entry.verdict != "faster" or entry.whole_run_verdict != "slower":
        return ""
    extra = (entry.one_time_s or 0.0) - (result.baseline.one_time_s or 0.0)
    back = f"; it pays back after ~{entry.break_even_steps:.0f} steps" if entry.break_even_steps else ""
    return (f"{entry.speedup:.2f}x per step, but its one-time cost (+{extra:.1f} s) makes the whole run "
            f"({result.run_steps} steps, {_steps_from(result)}) {entry.whole_run_speedup:.2f}x{back}: not recommended "
            "unless the real run is longer (--run-steps N)")  # fmt: skip


def _steps_from(result: TuneResult) -> str:
    return {"followed": "as far as tune followed the script", "--run-steps": "--run-steps"}.get(
        result.run_steps_from or "", "to the script's end")


def speedup_text(entry: CandidateResult) -> str:
    """The interval's centre, with the speed-ups at its ends: ``1.41x (1.30-1.54)``."""
    if entry.speedup is None:
        return "–"
    if entry.speedup_low is None or entry.speedup_high is None:
        return f"{entry.speedup:.2f}x"
    return f"{entry.speedup:.2f}x ({entry.speedup_low:.2f}–{entry.speedup_high:.2f})"


def not_applicable_groups(result: TuneResult) -> dict[str, list[str]]:
    """The candidates that do not apply on this device, by why: one line each (``needs a GPU``: five names)."""
    groups: dict[str, list[str]] = {}
    for item in result.not_applicable:
        groups.setdefault(item["why"], []).append(item["name"])
    return groups


def print_result(result: TuneResult, *, console: Console | None = None) -> None:
    console = console or Console()
    console.print(table(result))
    for entry in result.candidates:
        if note(entry):
            console.print(Text(f"{entry.name}: {note(entry)}", style=VERDICT_STYLE.get(entry.verdict or "", "")))
        if one_time_note(entry, result):
            console.print(Text(f"{entry.name}: {one_time_note(entry, result)}", style="yellow"))
    line = f"{result.min_effect_pct:g}%"
    if result.baseline.noise_pct is not None:
        line += f" (the baseline's noise between its runs, {result.baseline.noise_pct:.1f}%, widens the interval)"
    console.print(Text(f"step time: the median over runs of each run's mean step ({result.window_steps} steps after "
                       f"{result.warmup_steps} warm-up), ± the robust spread between runs; speed-up: the median of "
                       "each run over its round's baseline run, its interval in brackets; whole run: the one-time "
                       f"cost + {result.run_steps or '?'} steps ({_steps_from(result)}); "
                       f"faster only when the whole interval is beyond {line}; "
                       f"{result.cores} usable cores; "
                       f"findings from {result.findings_source or 'nowhere'}: {', '.join(result.findings) or 'none'}",
                       style="dim"))  # fmt: skip
    for item in result.not_run:
        console.print(Text(f"not run: {item['name']}: {item['why']}", style="dim"))
    for why, names in not_applicable_groups(result).items():
        console.print(Text(f"not tried on this device ({why}): {', '.join(names)}", style="dim"))
    for line in result.notes:
        console.print(Text(f"note: {line}", style="dim"))
    if result.interrupted:
        console.print(Text("interrupted: the results above are those measured so far", style="yellow"))
    console.print(recommendation(result))


def render_text(result: TuneResult, *, width: int = 100) -> str:
    """What ``print_result`` shows, as plain text."""
    console = text_console(width)
    print_result(result, console=console)
    return console.export_text()


def recommendation(result: TuneResult) -> Text:
    if not result.recommended:
        return Text("Recommended: nothing; no candidate was measured faster than the baseline.", style="bold")
    by_name = {entry.name: entry for entry in result.candidates}
    text = Text("Recommended (measured faster):\n", style="bold green")
    for name in result.recommended:
        entry = by_name[name]
        whole = f"; whole run {entry.whole_run_speedup:.2f}x" if entry.whole_run_speedup is not None else ""
        text.append(f"  {name}: {speedup_text(entry)} per step{whole}, {entry.what}\n", style="bold")
        for change in entry.change:
            text.append(change_text(change, indent="    ") + "\n")
        if entry.loss is not None and not entry.loss.within_tolerance:
            text.append(f"    caution: the loss after step {entry.loss.step} changed {entry.loss.change_pct:+.2f}%"
                        f"{_loss_why(entry)}; check that the results are still what you want\n", style="yellow")  # fmt: skip
    return text


def change_text(change: dict, *, indent: str) -> str:
    where = change.get("location") or "the script"
    lines = [f"{indent}{where}: {change.get('edit')}"]
    if change.get("before") and change.get("after"):
        lines.append(f"{indent}  - {change['before']}")
        lines += [f"{indent}  + {line}" for line in str(change["after"]).splitlines()]
    elif change.get("after"):
        lines.append(f"{indent}  + {change['after']}")
    return "\n".join(lines)


def catalogue_table() -> Table:
    """``skalpel tune --list``."""
    grid = Table(title="skalpel tune candidates", title_justify="left")
    for name in ("name", "what it changes", "tried when"):
        grid.add_column(name, overflow="fold")
    for candidate in CATALOGUE:
        findings = ", ".join(candidate.findings)
        parts = (f"finding {findings}" if findings else "", candidate.device_note)
        when = " or ".join(part for part in parts if part) or "only with --try"
        grid.add_row(candidate.name, candidate.what, when)
    return grid
