"""The terminal summary: rich Tables and Panels built from a Report.

The answer comes first (findings, most severe first), then the numbers behind it.
The renderer is handed a Console; tests give it a fixed-width, colourless one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..display import cut_name, for_terminal, plain
from ..result.report import Finding, RankReport, Report, sorted_findings
from ..result.sections import BlameSummary, CompiledRegion
from ..trace.model import CUT_FILE
from .evidence import evidence_text, mfu_text
from .terminal_comm import comm_line, ranks_table
from .terminal_job import alike_line, brief_panel, detailed_ranks, job_panel, summarised
from .terminal_modules import modules_table
from .terminal_roofline import roofline_table

NOT_JUDGED = "not_judged"
SEVERITY_STYLES = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
TOP_OPS = 10
SIDE_BY_SIDE = 8  # outlier ranks of a large job in the ranks-side-by-side table
BRIEF_EVIDENCE = 120  # characters of a finding's evidence in a job of many ranks (about two lines)


def print_report(report: Report, *, console: Console | None = None, ranks: tuple[int, ...] = (),
                 all_ranks: bool = False) -> None:  # fmt: skip
    """Print the report; in a job of many ranks ``ranks`` get a whole panel besides the outliers' and
    representatives' brief ones, and ``all_ranks`` gives every rank a whole one."""
    console = console or Console()
    for renderable in render(report, ranks=ranks, all_ranks=all_ranks):
        console.print(renderable)


def print_written(paths: Iterable[Path], *, console: Console | None = None) -> None:
    console = console or Console()
    for path in paths:
        console.print(Text(f"wrote {plain(str(path))}", style="dim"))


def render_text(report: Report, *, width: int = 100) -> str:
    """The summary as plain text (for summary.txt and tests)."""
    console = text_console(width)
    print_report(report, console=console)
    return console.export_text()


def text_console(width: int) -> Console:
    """A colourless Console of ``width`` columns that prints nowhere; ``export_text()`` returns what it printed."""
    return Console(width=width, record=True, color_system=None, file=_Discard())


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def render(report: Report, *, ranks: tuple[int, ...] = (), all_ranks: bool = False) -> list:
    report = for_terminal(report)  # names from the trace: control characters escaped, lengths bounded
    many = summarised(report)
    cut = [warning for warning in report.warnings if CUT_FILE in warning]  # said before the verdict it qualifies
    parts: list = [Text("\n".join(f"note: {warning}" for warning in cut), style="bold")] if cut else []
    parts += [_verdict(report, brief=many), _steps(report, many=many)]
    if many:
        parts.append(job_panel(report, ranks))
    detailed = set(detailed_ranks(report, ranks, all_ranks))
    # Side by side: every rank of a small job; of a large one, the outliers and the ranks asked for.
    side = set(report.job.outliers[:SIDE_BY_SIDE]) | set(ranks) if many and not all_ranks and report.job else detailed
    table = ranks_table(dataclasses.replace(report, ranks=tuple(r for r in report.ranks if r.rank in side)))
    if table is not None:
        parts.append(table)
    for rank in report.ranks:
        if rank.rank in detailed:
            parts.append(_rank_panel(report, rank, brief=many and not all_ranks and rank.rank not in ranks))
    alike = alike_line(report, ranks) if many and not all_ranks else None
    if alike is not None:
        parts.append(alike)
    if report.capture is not None:
        parts.append(_capture(report))
    if rest := [warning for warning in report.warnings if warning not in cut]:
        parts.append(Text("\n".join(f"note: {warning}" for warning in rest), style="dim"))
    return parts


def _verdict(report: Report, *, brief: bool = False) -> Panel:
    findings = sorted_findings(report.findings)
    serious = [finding for finding in findings if finding.severity != "info"]
    # Rules that could not judge this trace are one dim line each, after the answer.
    judged = [finding for finding in findings if finding.id != NOT_JUDGED]
    notes = [finding for finding in findings if finding.id == NOT_JUDGED]
    # A job of many ranks: where several findings point to the same place (or to no stack at all), it is said once.
    shared = _shared_locations(judged) if brief else set()
    parts: list = [_finding_text(finding, brief=brief, said=shared) for finding in judged]
    if not judged:
        parts.append(Text("No findings were produced for this trace."))
    for locations in shared:
        ids = [finding.id for finding in judged if tuple(finding.locations[:3]) == locations]
        which = "all findings" if len(ids) == sum(1 for finding in judged if finding.locations) else ", ".join(ids)
        parts.append(Text(f"where ({which}): {', '.join(locations)}"))
    parts.extend(Text(finding.title, style="dim") for finding in notes)  # the title says "Not judged (why): ids"
    title = "verdict" if serious else "verdict: no bottleneck found"
    return Panel(Group(*parts), title=title, title_align="left")


def _shared_locations(findings: list[Finding]) -> set[tuple[str, ...]]:
    seen: dict[tuple[str, ...], int] = {}
    for finding in findings:
        if finding.locations:
            seen[tuple(finding.locations[:3])] = seen.get(tuple(finding.locations[:3]), 0) + 1
    return {locations for locations, count in seen.items() if count > 1}


def _finding_text(finding: Finding, *, brief: bool = False, said: set[tuple[str, ...]] = frozenset()) -> Text:
    """A finding; ``brief`` (a job of many ranks): one on several ranks says where and how it spreads, without
    its worst rank's whole evidence (report.json keeps every rank's), and evidence by rank is left to the job
    summary, and an info finding's fix to ``skalpel explain``; locations in ``said`` are said once after the
    findings."""
    text = Text()
    text.append(f"{finding.severity.upper():8}", style=SEVERITY_STYLES.get(finding.severity, ""))
    text.append(f" {finding.title}", style="bold")
    text.append(f"  [{finding.id}]\n", style="dim")
    across = finding.across
    if across is not None:
        if across.title_rank is not None:
            worst = f" (the title is rank {across.title_rank}'s, the job's median rank)"
        else:
            worst = f" (the title is rank {across.worst[0]}'s)" if across.count > 1 and across.worst else ""
        text.append(f"         ranks: {across.describe()}{worst}\n")
    evidence = finding.evidence
    if brief:
        evidence = {key: value for key, value in evidence.items() if not key.endswith("_by_rank")}
    if evidence and not (brief and across is not None and across.count > 1):
        text.append(f"         evidence: {_evidence(evidence, BRIEF_EVIDENCE if brief else None)}\n")
    if finding.locations and tuple(finding.locations[:3]) not in said:
        text.append(f"         where: {', '.join(finding.locations[:3])}\n")
    if finding.fix and brief and finding.severity == "info":  # a job's screen: a minor finding's fix is a command away
        text.append(f"         fix: skalpel explain {finding.id}\n")
    elif finding.fix:
        text.append(f"         fix: {finding.fix}\n")
    return text


def _evidence(evidence: dict, limit: int | None) -> str:
    """The few numbers that prove the finding: its first ``EVIDENCE_SHOWN`` items in words (a rule puts them
    first), then how many more report.json and the HTML page hold; past ``limit`` characters (a job's screen), the
    items that fit and '…'."""
    if limit is None:
        shown = dict(list(evidence.items())[:EVIDENCE_SHOWN])
        more = len(evidence) - len(shown)
        return evidence_text(shown) + (f", … {more} more (--json, --html)" if more else "")
    whole = evidence_text(evidence)
    if len(whole) <= limit:
        return whole
    items: list[str] = []
    first = {"rank": evidence["rank"]} if "rank" in evidence else {}  # whose figures they are, never cut
    for key, value in {**first, **evidence}.items():
        item = evidence_text({key: value})
        if items and sum(len(kept) + 2 for kept in items) + len(item) > limit:
            break
        items.append(item)
    return ", ".join(items) + ", … (report.json)"


def _steps(report: Report, *, many: bool = False) -> Text:
    steps = report.steps
    what = "steps" if steps.marked else f"pseudo-step{'s' if steps.count != 1 else ''} (no ProfilerStep markers)"
    iterations = report.loop_iterations()
    if iterations is not None:  # the ledger's units: what gpu_idle and launch_bound judge, not the pseudo-step
        what = what[:-1] + f"; {iterations} iterations found from the loop)"
    source = report.source
    ranks = len(report.ranks)
    counted = f"{steps.count} {what}"
    if ranks > 1:  # the count pools every rank's steps: say so, or 256 ranks of one step read as 256 steps
        each, unequal = divmod(steps.count, ranks)
        counted = f"{counted} over {ranks} ranks" if unequal else f"{counted} ({each} on each of {ranks} ranks)"
    line = (
        f"{counted}: median {steps.median_ms:.2f} ms, p90 {steps.p90_ms:.2f} ms, "
        f"cv {steps.cv:.2f}  |  device: {source.device}"
    )
    if not many and ranks == 1:
        line += "  |  ranks: 1"
    if source.torch_version:
        line += f"  |  torch {source.torch_version}"
    return Text(line)


def _rank_panel(report: Report, rank: RankReport, *, brief: bool = False) -> Panel:
    """A rank's figures and tables; ``brief`` (a job of many ranks): its figures, and its top ops on one line."""
    if brief:
        return brief_panel(report, rank)
    parts: list = _ledger_lines(rank)
    if rank.step_breakdown_pct:
        parts.append(_breakdown_line(rank))
    if rank.gpu is not None:
        gpu = rank.gpu
        idle = ", ".join(f"{key} {value:.1f}%" for key, value in gpu.idle_breakdown_pct.items())
        overlap = f", comm overlap {gpu.comm_overlap_pct:.1f}%" if gpu.comm_overlap_pct is not None else ""
        in_steps = rank.step_device
        marked = in_steps is not None and in_steps.marked
        if in_steps is not None and marked:  # the steps the user waits for; HTA's span follows
            parts.append(Text(f"GPU in marked steps: busy {in_steps.busy_pct:.1f}%, idle {in_steps.idle_pct:.1f}% "
                              f"({in_steps.idle_ms_per_step:.2f} ms/step)"))  # fmt: skip
        blamed = rank.blame
        causes = sorted(blamed.share_pct.items() if blamed is not None else (), key=lambda item: -item[1])
        causes = [(key, value) for key, value in causes if value >= 0.5][:4]
        if blamed is not None and causes:  # the marked steps' idle time (the line above), or the window's, by cause
            where = "idle" if marked else "GPU idle in the window (no markers)"
            parts.append(Text(f"  {where} by cause: " + ", ".join(_cause(blamed, key, value) for key, value in causes)
                              + " (skalpel explain blame)"))  # fmt: skip
        parts.append(
            Text(f"GPU (HTA, first to last device event): idle {gpu.idle_pct:.1f}% ({idle}), compute {gpu.compute_pct:.1f}%, "
                 f"non-compute {gpu.non_compute_pct:.1f}%{overlap}")
        )  # fmt: skip
    elif rank.blame is not None and rank.blame.waits_on == "main thread":  # CPU-only: the main thread's waits
        blamed = rank.blame
        shares = sorted(blamed.share_pct.items(), key=lambda item: -item[1])
        shares = [(key, value) for key, value in shares if value >= 0.5][:4]
        if shares:
            parts.append(Text(f"main thread outside its ops {blamed.idle_ms_per_step:.2f} ms/step, by cause: "
                              + ", ".join(_cause(blamed, key, value) for key, value in shares)
                              + " (skalpel explain blame)"))  # fmt: skip
    communication = comm_line(rank)
    if communication is not None:
        parts.append(communication)
    if rank.memory is not None:
        memory = rank.memory
        growth = f", growth {memory.growth_bytes_per_step / 2**20:+.1f} MiB/step" if memory.growth_bytes_per_step is not None else ""
        parts.append(Text(f"memory ({memory.device}): peak {memory.peak_bytes / 2**20:.1f} MiB{growth}"))
    if rank.mfu is not None:
        parts.append(Text(mfu_text(rank.mfu)))
    if rank.top_ops:
        parts.append(_ops_table(rank, device=report.has_device))
    tree = modules_table(rank.modules) if rank.modules is not None else None
    if tree is not None:
        parts.append(tree)
    roofs = roofline_table(rank.roofline) if rank.roofline is not None else None
    if roofs is not None:
        parts.append(roofs)
    regions = rank.compiled.regions if rank.compiled is not None else ()
    if regions:
        parts.append(_regions_table(regions, device=report.has_device))
    if not parts:
        parts.append(Text("no per-rank analyses available"))
    return Panel(Group(*parts), title=f"rank {rank.rank}", title_align="left")


LEDGER_CAUSES_SHOWN = 6
EVIDENCE_SHOWN = 5  # the evidence a finding shows in the terminal; the rest is in the JSON and the HTML


def _ledger_lines(rank: RankReport) -> list[Text]:
    """The ledger first: what the rank was judged over, and each lane's largest causes (ms per unit and share)."""
    ledger = rank.ledger
    if ledger is None or not ledger.lanes:
        return []
    unit = {"step": "step", "iteration": "iteration"}.get(ledger.unit, "window")
    lines = [Text(f"ledger over {ledger.judged_over} (ms per {unit}, skalpel explain ledger):")]
    for lane in ledger.lanes:
        causes = sorted(lane.share_pct.items(), key=lambda item: -item[1])
        shown = [f"{cause.replace('_', ' ')} {lane.ms_per_unit.get(cause, 0.0):.2f} ({share:.0f}%)"
                 for cause, share in causes if share >= 0.5][:LEDGER_CAUSES_SHOWN]  # fmt: skip
        name = "device" if lane.lane == "device" else "host (main thread)"
        lines.append(Text(f"  {name}: " + ", ".join(shown)))
    return lines


def _cause(blamed: BlameSummary, key: str, share: float) -> str:
    """One cause of the blame line; a collective wait says whom it mostly waited for (several ranks compared)."""
    text = f"{key} {share:.0f}%"
    peers = blamed.collective_wait_by_peer
    mostly = peers.mostly if peers is not None and key == "collective_wait" else None
    if mostly is not None and mostly.startswith("rank "):
        return f"{text} (mostly for {mostly})"
    return f"{text} (mostly transfer)" if mostly == "transfer" else text


def _breakdown_line(rank: RankReport) -> Text:
    shares = sorted(rank.step_breakdown_pct.items(), key=lambda item: -item[1])
    text = Text("step time: ")
    text.append(", ".join(f"{name} {value:.1f}%" for name, value in shares if value >= 0.05))
    if rank.data_wait_ms_per_step is not None:
        text.append(f"  (waiting for data {rank.data_wait_ms_per_step:.2f} ms/step)")
    return text


def _ops_table(rank: RankReport, *, device: bool, rows: int = TOP_OPS) -> Table:
    sort_key = "self device time" if device else "self CPU time"
    table = Table(title=f"top ops by {sort_key} (ms over the profiled steps)", title_justify="left", expand=False)
    # The op name gets the room (its input shapes below it, dimmed); numbers never wrap.
    table.add_column("op (input shapes)", overflow="fold", min_width=24, max_width=72)
    table.add_column("calls", justify="right", no_wrap=True)
    table.add_column("self CPU", justify="right", no_wrap=True)
    table.add_column("total CPU", justify="right", no_wrap=True)
    if device:
        table.add_column("self device", justify="right", no_wrap=True)
    for row in rank.top_ops[:rows]:
        label = Text(cut_name(row.name))
        if row.input_shapes:
            shapes = row.input_shapes if len(row.input_shapes) <= 60 else row.input_shapes[:59] + "…"
            label.append(f"\n{shapes}{row.other_shapes}", style="dim")
        cells = [label, str(row.calls), f"{row.self_ms:.2f}", f"{row.total_ms:.2f}"]
        if device:
            cells.append(f"{row.device_ms:.2f}")
        table.add_row(*cells)
    return table


def _regions_table(regions: tuple[CompiledRegion, ...], *, device: bool) -> Table:
    table = Table(title="torch.compile regions (ms over the profiled steps)", title_justify="left", expand=False)
    table.add_column("region", no_wrap=True)
    table.add_column("compiled function", overflow="fold", min_width=20, max_width=60)
    table.add_column("calls", justify="right", no_wrap=True)
    table.add_column("host", justify="right", no_wrap=True)
    if device:
        table.add_column("device", justify="right", no_wrap=True)
        table.add_column("kernels (Triton)", justify="right", no_wrap=True)
    for row in regions[:TOP_OPS]:
        # Names from the trace header go to rich as Text, never as markup.
        cells = [Text(str(row.region)), Text(str(row.location or "unknown (no compile log)")), str(row.calls),
                 f"{row.host_ms:.2f}"]  # fmt: skip
        if device:
            cells += [f"{row.device_ms:.2f}", f"{row.kernels} ({row.triton_kernels})"]
        table.add_row(*cells)
    return table


def _capture(report: Report) -> Text:
    capture = report.capture
    assert capture is not None
    parts = [f"capture: {capture.describe_steps()}"]
    if capture.step_signal:
        parts.append(f"steps marked by {capture.step_signal}")
    overhead = capture.overhead_words()
    if overhead is not None:
        parts.append(overhead)
    if capture.noise_pct is not None:
        parts.append(f"noise {capture.noise_pct:.1f}%")
    lines = [", ".join(parts)]
    if capture.run is not None:
        lines.extend(capture.run.lines())
    if capture.memory_split is not None:
        lines.extend(capture.memory_split.lines())
    return Text("\n".join(lines))
