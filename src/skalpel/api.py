"""The Python API: what ``import skalpel`` offers besides ``skalpel.profile``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import orjson

from .trace.loader import ProgressCallback, find_trace_files, load, load_one
from .trace.parallel import process_count

if TYPE_CHECKING:  # the report model is imported where it is used: while forked processes decode a large file
    from .report.model import CaptureInfo, Report
    from .workers import RankProgressCallback

RUN_REPORT = "report.json"


def analyze(
    paths: str | Path | Iterable[str | Path],
    *,
    on_progress: ProgressCallback | None = None,
    workers: int | None = None,
    ray: bool | str = False,
) -> Report:
    """Load traces (files or folders, any torch.profiler output) and diagnose them.

    The rank files of a job are reduced in ``workers`` processes (default: the cores this
    process may use), or as Ray tasks with ``ray`` (True, or a cluster address); one large
    uncompressed file is decoded by that many processes (``trace.parallel``).
    ``on_progress`` gets (bytes done, bytes total) over all files.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = find_trace_files(paths)
    return analyze_job(paths, workers=workers, ray=ray, on_rank_progress=_in_bytes(files, on_progress)).report


@dataclass(frozen=True)
class JobAnalysis:
    report: Report
    files: tuple[Path, ...]
    flame: dict[str, Any] | None = None  # the HTML report's flame graph (lowest rank), when asked for


def analyze_job(
    paths: list[str | Path],
    *,
    workers: int | None = None,
    ray: bool | str = False,
    flame: bool = False,
    on_rank_progress: RankProgressCallback | None = None,
    while_loading: Callable[[], object] | None = None,
) -> JobAnalysis:
    """``analyze`` with the flame graph and progress per rank file (what the CLI needs).

    One file is loaded whole here; the files of a job (or any file with ``ray``) are
    reduced rank by rank (``skalpel.ranksummary``) and joined (``skalpel.jobreport``).
    ``while_loading`` is called once: while forked processes decode one large file when they do
    (the caller's imports then cost no time), else after its load, or before a job's ranks.
    """
    files = find_trace_files(paths)
    capture = stored_capture(paths)
    if len(files) == 1 and not ray:
        report_progress = (lambda done, total: on_rank_progress(0, done / max(total, 1))) if on_rank_progress else None

        def imports() -> None:  # while forked processes decode a large file: then they cost no time
            from . import diagnose, pipeline  # noqa: F401

            if while_loading is not None:
                while_loading()

        meanwhile = imports if "skalpel.pipeline" not in sys.modules else while_loading  # none: a full share here
        trace = load(files, on_progress=report_progress, workers=workers, while_decoding=meanwhile)
        from .pipeline import build_report

        report = build_report(trace, capture=capture, processes=process_count(workers))
        return JobAnalysis(report, tuple(files), _flame(trace) if flame else None)
    from .jobreport import join_summaries
    from .ranksummary import SummaryRequest
    from .workers import summarize_all, summarize_on_ray

    if while_loading is not None:
        while_loading()
    requests = [SummaryRequest(path, len(files), flame=flame and index == 0) for index, path in enumerate(files)]
    if ray:
        results = summarize_on_ray(requests, None if ray is True else ray, on_progress=on_rank_progress)
    else:
        results = summarize_all(requests, workers=workers, on_progress=on_rank_progress)
    report, summaries = join_summaries(results, capture=capture)
    graph = None
    if flame:  # from the lowest rank, as for a whole trace; loaded again only when it was not the first file
        graph = summaries[0].flame if summaries[0].flame is not None else _flame(load_one(summaries[0].path))
    return JobAnalysis(report, tuple(files), graph)


def _flame(trace) -> dict[str, Any] | None:
    from .report import html

    return html.flame_from_trace(trace, rank=trace.rank_ids[0] if trace.ranks else 0)


def _in_bytes(files: list[Path], on_progress: ProgressCallback | None) -> RankProgressCallback | None:
    """Per-file fractions as (bytes done, bytes total) over all files."""
    if on_progress is None:
        return None
    sizes = [path.stat().st_size for path in files]
    total = max(sum(sizes), 1)
    done = [0.0] * len(files)

    def on_rank(index: int, fraction: float) -> None:
        done[index] = max(done[index], fraction)
        on_progress(int(sum(size * part for size, part in zip(sizes, done))), total)

    return on_rank


def stored_capture(paths: str | Path | Iterable[str | Path]) -> CaptureInfo | None:
    """The capture facts of a skalpel run folder (kept in its report.json), so a re-analysis keeps them.

    Only for a single run folder: traces gathered from several places have no one capture.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) != 1 or not (Path(paths[0]) / RUN_REPORT).is_file():
        return None
    from .report.model import Report

    try:
        return Report.from_json((Path(paths[0]) / RUN_REPORT).read_bytes()).capture
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None  # an old or damaged report: analyse the traces without capture facts
