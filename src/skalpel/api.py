"""The Python API: what ``import skalpel`` offers besides ``skalpel.profile``."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import orjson

from .display import cut_name
from .errors import SkalpelError, TraceError
from .trace.loader import ProgressCallback, find_trace_files, path_mode
from .trace.source import without_bom

if TYPE_CHECKING:  # the report model is imported where it is used: while forked processes decode a large file
    from .job.pool import RankProgressCallback
    from .job.report_of import JobAnalysis
    from .result.report import CaptureInfo, Report
    from .result.snapshot import SnapshotDiff, SnapshotSummary

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
    report = analyze_job(paths, workers=workers, ray=ray, on_rank_progress=_in_bytes(files, on_progress)).report
    _shown_inline()
    return report


def _shown_inline() -> None:
    """A Report shows as the HTML report in a notebook (``Report._repr_html_``)."""
    from .report.inline import report_inline
    from .result.report import show_inline_with

    show_inline_with(report_inline)


def analyze_job(
    paths: list[str | Path],
    *,
    workers: int | None = None,
    ray: bool | str = False,
    flame: bool = False,
    on_rank_progress: RankProgressCallback | None = None,
    while_loading: Callable[[], object] | None = None,
) -> JobAnalysis:
    """``analyze`` with the flame graph and progress per rank file (what the CLI needs): ``job.report_of`` with the
    capture facts of a run folder, when ``paths`` is one."""
    from .job.report_of import report_of

    capture, damaged = _stored_capture(paths)
    return report_of(paths, capture=capture, notes=[damaged] if damaged else (), workers=workers, ray=ray,
                     flame=flame, on_rank_progress=on_rank_progress, while_loading=while_loading)  # fmt: skip


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



def analyze_snapshot(path: str | Path) -> SnapshotSummary:
    """What a PyTorch memory snapshot (the pickle of ``torch.cuda.memory._snapshot()``) holds; torch is not needed."""
    from .analysis.snapshot import summarize_snapshot
    from .trace.snapshot import load_snapshot

    return summarize_snapshot(load_snapshot(path))


def diff_snapshots(before: str | Path, after: str | Path) -> SnapshotDiff:
    """What grew between two memory snapshots, by the user line that allocated it."""
    from .analysis.snapshot import diff_snapshots as diff
    from .trace.snapshot import load_snapshot

    return diff(load_snapshot(before), load_snapshot(after))


def is_snapshot_path(path: str | Path) -> bool:
    """A memory snapshot file (a pickle), as opposed to a trace, a run folder, a report or a flight-recorder dump."""
    from .trace.flight_recorder import looks_like_flight_recorder
    from .trace.snapshot import looks_like_snapshot_file

    path = Path(path)
    try:
        return path.is_file() and looks_like_snapshot_file(path) and not looks_like_flight_recorder(path)
    except OSError:  # a path too long, a loop of links: the trace loader names the problem
        return False
