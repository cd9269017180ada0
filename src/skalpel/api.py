"""The Python API: what ``import skalpel`` offers besides ``skalpel.profile``."""

from __future__ import annotations

import dataclasses
import stat
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import orjson

from .display import cut_name
from .errors import SkalpelError, TraceError
from .trace.loader import ProgressCallback, find_trace_files, load, load_one, path_mode
from .trace.parallel import process_count
from .trace.source import without_bom

if TYPE_CHECKING:  # the report model is imported where it is used: while forked processes decode a large file
    from .job.pool import RankProgressCallback
    from .result.report import CaptureInfo, Report

RUN_REPORT = "report.json"
_SKALPEL_JSON_MAX_BYTES = 64 * 2**20


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
    reduced rank by rank (``skalpel.job.rank``) and joined (``skalpel.job.join``).
    ``while_loading`` is called once: while forked processes decode one large file when they do
    (the caller's imports then cost no time), else after its load, or before a job's ranks.
    """
    files = find_trace_files(paths)
    capture, damaged = _stored_capture(paths)
    if len(files) == 1 and not ray:
        report_progress = (lambda done, total: on_rank_progress(0, done / max(total, 1))) if on_rank_progress else None

        def imports() -> None:  # while forked processes decode a large file: then they cost no time
            from . import diagnose  # noqa: F401
            from .job import build  # noqa: F401

            if while_loading is not None:
                while_loading()

        meanwhile = imports if "skalpel.job.build" not in sys.modules else while_loading  # none: a full share here
        trace = load(files, on_progress=report_progress, workers=workers, while_decoding=meanwhile)
        from .job.build import build_report

        report = _noting(build_report(trace, capture=capture, processes=process_count(workers)), damaged)
        return JobAnalysis(report, tuple(files), _flame(trace) if flame else None)
    from .job.join import Joining
    from .job.pool import split_all, split_on_ray, summarize_all, summarize_on_ray
    from .job.rank import SummaryRequest

    if while_loading is not None:
        while_loading()
    requests = [SummaryRequest(path, len(files), flame=flame and index == 0, capture=capture)
                for index, path in enumerate(files)]
    joining = Joining()  # each rank's own part of the join as its summary arrives, beside the workers
    if ray:
        summarize_on_ray(requests, None if ray is True else ray, on_progress=on_rank_progress, on_result=joining.add)
        split = split_on_ray
    else:
        summarize_all(requests, workers=workers, on_progress=on_rank_progress, on_result=joining.add)
        split = partial(split_all, workers=workers)
    report, summaries = joining.finish(capture=capture, split=split)
    report = _noting(report, damaged)
    graph = None
    if flame:  # from the lowest rank, as for a whole trace; loaded again only when it was not the first file
        graph = summaries[0].flame if summaries[0].flame is not None else _flame(load_one(summaries[0].path))
    return JobAnalysis(report, tuple(files), graph)


def _flame(trace) -> dict[str, Any] | None:
    from .analysis.call_tree import flame_tree

    return flame_tree(trace, rank=trace.rank_ids[0] if trace.ranks else 0)


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
    return _stored_capture(paths)[0]


def _stored_capture(paths: str | Path | Iterable[str | Path]) -> tuple[CaptureInfo | None, str | None]:
    """``stored_capture``, and the warning when the folder's report.json could not give them (damaged, or old)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) != 1 or not (Path(paths[0]) / RUN_REPORT).is_file():
        return None, None
    from .result.report import Report

    try:
        return Report.from_json((Path(paths[0]) / RUN_REPORT).read_bytes()).capture, None
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as error:
        return None, (f"{RUN_REPORT}: the capture facts it keeps (profiler overhead, CPU time) are not readable "
                      f"({cut_name(str(error), 160)}): the traces are analysed without them")  # fmt: skip


def _noting(report: Report, warning: str | None) -> Report:
    return report if warning is None else dataclasses.replace(report, warnings=(*report.warnings, warning))


def load_report(path: str | Path, *, which: str) -> Report:
    """The Report of one path: a report.json, a run folder (its report.json), or trace files/folders.

    ``which`` names the path in errors (``BEFORE``, ``--from``).
    """
    if str(path) == "":
        raise SkalpelError(f"{which}: an empty path ('') was given: name a run folder, trace or report.json")
    path = Path(path)
    try:
        is_dir = stat.S_ISDIR(path_mode(path))
    except TraceError as error:
        raise SkalpelError(f"{which}: {error}") from None
    report_json = path / "report.json" if is_dir else path
    if report_json.is_file() and report_json.suffix == ".json":
        report = _read_skalpel_json(report_json, which=which)
        if report is not None:
            return report
    try:
        return analyze(path)
    except TraceError as error:
        raise TraceError(f"{which}: {error}") from None


def _read_skalpel_json(path: Path, *, which: str) -> Report | None:
    """The Report in ``path`` when it is a skalpel JSON document; None for anything else (a trace)."""
    if path.stat().st_size > _SKALPEL_JSON_MAX_BYTES or not _looks_like_skalpel(path):
        return None
    from .result.report import Report

    try:
        data = orjson.loads(without_bom(path.read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("skalpel."):
        return None
    try:
        return Report.from_dict(data)
    except (ValueError, KeyError, TypeError) as error:
        raise SkalpelError(f"{which}: {path} is not a readable skalpel report: {error}") from None


def _looks_like_skalpel(path: Path) -> bool:
    """Our JSON names its schema near one end (first or last key); a trace does not, and is not parsed twice."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
            handle.seek(max(0, path.stat().st_size - 4096))
            tail = handle.read()
    except OSError:
        return False
    return b'"skalpel.' in head or b'"skalpel.' in tail

