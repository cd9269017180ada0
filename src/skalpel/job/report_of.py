"""From any input to a Report, by one road: rank file -> rank summary -> join.

``skalpel analyze``, the Python API, ``skalpel run`` (one process, or ``--nproc`` and torchrun jobs),
and ``skalpel watch``'s job captures all come through ``report_of``. Every rank file is reduced to a
``RankSummary`` (``job.rank``): in worker processes or Ray tasks for a job of several files, in this
process for a single file (whose decoding and analyses still fork when it is large), and the summaries
are joined (``job.join``). A single file is a job of one rank: nothing about it takes another road.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from ..result.report import CaptureInfo, Report
from ..trace.loader import find_trace_files, load, load_one
from ..trace.parallel import process_count

if TYPE_CHECKING:
    from ..trace.model import Trace
    from .pool import RankProgressCallback
    from .rank import FlameGraphs, RankSummary

# The analyses and rules are imported once the files are found (``_analysis_imports``): while forked processes
# decode a large file when they do, so that their import costs no time.


@dataclass(frozen=True)
class JobAnalysis:
    report: Report
    files: tuple[Path, ...]
    flame: FlameGraphs | None = None  # the lowest rank's, when asked for

    @property
    def flame_tree(self) -> dict | None:
        """The HTML report's flame graph."""
        return self.flame.tree if self.flame is not None else None


def report_of(
    paths: str | Path | Iterable[str | Path],
    *,
    capture: CaptureInfo | None = None,
    notes: Sequence[str] = (),
    workers: int | None = None,
    ray: bool | str = False,
    flame: bool = False,
    flame_files: bool = False,
    on_rank_progress: RankProgressCallback | None = None,
    while_loading: Callable[[], object] | None = None,
) -> JobAnalysis:
    """The Report of trace files or folders (any torch.profiler output, one rank or many).

    ``capture``: the facts of the run that recorded them (rules read them); ``notes``: the capture's own
    warnings (a rank that wrote no trace), after the ranks'. ``workers``: processes that reduce the rank files
    (default: the cores this process may use), or that decode a single large file; ``ray``: reduce them as Ray
    tasks (True, or a cluster address). ``flame``: the lowest rank's flame graph for the HTML report;
    ``flame_files``: with the run folder's SVG and speedscope renderings too. ``on_rank_progress`` gets
    (file index, fraction done); ``while_loading`` is called once, while forked processes decode one large file
    (the caller's imports then cost no time), else before the ranks are reduced.
    Raises TraceError when no file loads.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    files = find_trace_files(paths)
    in_process = len(files) == 1 and not ray  # a single file is summarised here, its decoding forked when large
    if in_process:
        single = _summarize_here(files[0], capture, flame, flame_files, workers, on_rank_progress, while_loading)
    elif while_loading is not None:
        while_loading()
    from .join import Joining
    from .peers import split_here
    from .pool import split_all, split_on_ray, summarize_all, summarize_on_ray
    from .rank import SummaryRequest, flame_graphs

    joining = Joining()  # each rank's own part of the join as its summary arrives, beside the workers
    split = split_here
    if in_process:
        joining.add(0, single)
    else:
        requests = [SummaryRequest(path, len(files), flame=(flame or flame_files) and index == 0,
                                   flame_files=flame_files and index == 0, capture=capture)
                    for index, path in enumerate(files)]  # fmt: skip
        if ray:
            address = None if ray is True else ray
            summarize_on_ray(requests, address, on_progress=on_rank_progress, on_result=joining.add)
            split = split_on_ray
        else:
            summarize_all(requests, workers=workers, on_progress=on_rank_progress, on_result=joining.add)
            split = partial(split_all, workers=workers)
    report, summaries = joining.finish(capture=capture, split=split, notes=notes)
    graphs = None
    if flame or flame_files:  # the lowest rank's: loaded again only when it was not the first file
        graphs = summaries[0].flame
        if graphs is None:
            trace = load_one(summaries[0].path, job_ranks=len(files))
            graphs = flame_graphs(trace, trace.rank_ids[0], files=flame_files)
    return JobAnalysis(report, tuple(files), graphs)


def report_of_trace(trace: Trace, *, capture: CaptureInfo | None = None, processes: int = 1) -> Report:
    """The Report of one rank's trace already in hand (a test's, a benchmark's), by the same road: summarised in
    this process and joined. With ``processes`` > 1 some analyses of a large trace run in a forked process."""
    if len(trace.ranks) != 1:
        raise ValueError(f"a trace of {len(trace.ranks)} ranks: report_of(paths) reduces a job's files rank by rank")
    from .join import join_summaries
    from .rank import SummaryRequest, summarize_loaded

    request = SummaryRequest(Path(trace.ranks[0].path), 1, capture=capture)
    summary = summarize_loaded(trace, request, processes=processes)
    return join_summaries([summary], capture=capture)[0]


def _summarize_here(path: Path, capture: CaptureInfo | None, flame: bool, flame_files: bool, workers: int | None,
                    on_rank_progress: RankProgressCallback | None,
                    while_loading: Callable[[], object] | None) -> RankSummary:  # fmt: skip
    """A single file, in this process: decoded by forked processes when large, its analyses too."""
    progress = (lambda done, total: on_rank_progress(0, done / max(total, 1))) if on_rank_progress else None

    def imports() -> None:  # while forked processes decode a large file: then they cost no time
        _analysis_imports()
        if while_loading is not None:
            while_loading()

    trace = load(path, on_progress=progress, workers=workers, while_decoding=imports)
    trace.job_ranks = 1
    from .rank import SummaryRequest, summarize_loaded

    request = SummaryRequest(path, 1, flame=flame or flame_files, flame_files=flame_files, capture=capture)
    return summarize_loaded(trace, request, processes=process_count(workers))


def _analysis_imports() -> None:
    from .. import diagnose  # noqa: F401
    from . import join, rank  # noqa: F401
