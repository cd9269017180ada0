"""Reduce the ranks of a job in parallel: local worker processes, or Ray tasks on a cluster.

Each rank file goes to ``ranksummary.summarize_rank`` in its own task, so memory is about
one rank per worker plus the summaries, whatever the number of ranks. A rank file that
cannot be read comes back as a ``RankFailure`` and the others go on. A worker that dies
(killed for memory, a crash in a native library) is retried once, alone in a fresh
process so that it cannot take other ranks down with it; a second death is reported as
that rank's failure.

Progress goes to ``on_progress(file index, fraction of that file done)``, from inside
the workers (through a queue) as they load; each result, as it arrives, to ``on_result(file
index, result)``, so that the driver joins it (``join.Joining``) while the workers go on.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import socket
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from ..analysis.blame import PeerSplit
from ..cores import affinity_cores
from ..errors import SkalpelError
from ..trace.loader import collector_paused
from .peers import SplitRequest, split_here, split_one
from .rank import RankFailure, RankSummary, SummaryRequest, summarize_rank

RankProgressCallback = Callable[[int, float], None]
"""Called with (index of the rank file, fraction of it done, 0..1) while ranks are reduced."""

Task = Callable[[SummaryRequest, Callable[[float], None] | None], "RankSummary | RankFailure"]
Result = RankSummary | RankFailure
ResultCallback = Callable[[int, Result], None]
"""Called in this process with (index of the rank file, its final result) as each arrives, in any order."""

_REPORT_EVERY = 0.02  # of a file: progress messages from a worker are at least this far apart
_POLL_S = 0.1
SPLIT_IN_WORKERS_PIECES = 2_000_000
"""Collective-wait pieces of a job (``job.peers``) from which the join splits them in workers: fewer take the driver
under about 1.5 s, less than starting the workers again and sending them the waits."""


def summarize_all(
    requests: list[SummaryRequest],
    *,
    workers: int | None = None,
    on_progress: RankProgressCallback | None = None,
    task: Task = summarize_rank,
    on_result: ResultCallback | None = None,
) -> list[Result]:
    """One result per request, in order; ``workers`` processes (1: in this process, one rank after another)."""
    workers = workers or affinity_cores()  # the affinity, not lowered to a cgroup quota
    if workers <= 1 or len(requests) <= 1:
        return [_in_process(task, request, index, on_progress, on_result) for index, request in enumerate(requests)]
    return _Pool(requests, min(workers, len(requests)), on_progress, task, on_result).run()


def _in_process(task: Task, request: SummaryRequest, index: int, on_progress: RankProgressCallback | None,
                on_result: ResultCallback | None) -> Result:  # fmt: skip
    report = (lambda fraction: on_progress(index, fraction)) if on_progress else None
    result = _guarded(task, request, report)
    if on_result:
        on_result(index, result)
    if on_progress:
        on_progress(index, 1.0)
    return result


def _guarded(task: Task, request: SummaryRequest, report: Callable[[float], None] | None) -> Result:
    """The task's result; a bug in the analysis becomes that rank's failure, not the job's."""
    try:
        return task(request, report)
    except Exception as error:  # noqa: BLE001 - one rank's failure must not take the job down
        return RankFailure(request.path, f"{request.path}: analysis failed ({type(error).__name__}: {error})")


# --- local processes ---------------------------------------------------------------------------

_progress_queue = None  # set in each worker process by _init_worker


def _init_worker(progress_queue) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _run_in_worker(task: Task, request: SummaryRequest, index: int) -> Result:
    last = [-1.0]

    def report(fraction: float) -> None:
        if _progress_queue is not None and (fraction - last[0] >= _REPORT_EVERY or fraction >= 1.0):
            last[0] = fraction
            _progress_queue.put((index, fraction))

    return _guarded(task, request, report)


class _Pool:
    """One round over every rank in a shared pool, then each rank whose worker died alone in a fresh one."""

    def __init__(self, requests: list[SummaryRequest], workers: int, on_progress, task: Task,
                 on_result: ResultCallback | None = None) -> None:  # fmt: skip
        self.requests, self.workers, self.on_progress, self.task, self.on_result = requests, workers, on_progress, task, on_result
        self.context = _context()
        self.queue = self.context.Queue() if on_progress else None

    def run(self) -> list[Result]:
        with collector_paused():  # receiving the summaries: see trace.loader.collector_paused
            return self._run()

    def _run(self) -> list[Result]:
        results: dict[int, Result] = {}
        died = self._round(list(range(len(self.requests))), self.workers, results)
        for index in died:  # alone, so that a rank that kills its worker cannot take another one with it
            if self._round([index], 1, results):
                request = self.requests[index]
                results[index] = RankFailure(
                    request.path, f"{request.path}: the worker analysing it died twice (out of memory?)", attempts=2
                )
                if self.on_result:
                    self.on_result(index, results[index])
        return [results[index] for index in range(len(self.requests))]

    def _round(self, indices: list[int], workers: int, results: dict[int, Result]) -> list[int]:
        """Run ``indices``; returns those whose worker died."""
        died: list[int] = []
        pool = ProcessPoolExecutor(workers, mp_context=self.context, initializer=_init_worker, initargs=(self.queue,))
        futures: dict[Future, int] = {pool.submit(_run_in_worker, self.task, self.requests[i], i): i for i in indices}
        try:
            self._collect(futures, results, died)
        except BaseException:  # Ctrl-C: start no further rank and do not wait for those running
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        self._drain()
        return sorted(died)

    def _collect(self, futures: dict[Future, int], results: dict[int, Result], died: list[int]) -> None:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            self._drain()
            for future in done:
                index = futures[future]
                try:
                    results[index] = future.result()
                except BrokenProcessPool:
                    died.append(index)
                    continue
                if self.on_result:
                    self.on_result(index, results[index])
                if self.on_progress:
                    self.on_progress(index, 1.0)

    def _drain(self) -> None:
        if self.queue is None:
            return
        while True:
            try:
                index, fraction = self.queue.get_nowait()
            except queue_module.Empty:
                return
            self.on_progress(index, min(fraction, 0.999))  # 1.0 once the result is back


def split_all(requests: list[SplitRequest], *, workers: int | None = None,
              least_pieces: int = SPLIT_IN_WORKERS_PIECES) -> list[PeerSplit]:  # fmt: skip
    """The join's per-rank splits (``job.peers``) in ``workers`` local processes, when the job has
    ``least_pieces`` wait pieces or more; else in this process. A worker that dies leaves them to this process."""
    workers = min(workers or affinity_cores(), len(requests))
    if workers <= 1 or sum(request.waits.pieces for request in requests) < least_pieces:
        return split_here(requests)
    try:
        with ProcessPoolExecutor(workers, mp_context=_context()) as pool:
            return list(pool.map(split_one, requests))
    except BrokenProcessPool:
        return split_here(requests)


def _context():
    """forkserver where there is one: workers fork from a clean server that has skalpel imported
    (fast to start, and safe while this process runs threads such as the progress display)."""
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:  # Windows
        return multiprocessing.get_context("spawn")
    context.set_forkserver_preload(["skalpel.job.rank"])
    return context


# --- Ray ---------------------------------------------------------------------------------------


def summarize_on_ray(
    requests: list[SummaryRequest],
    address: str | None,
    *,
    on_progress: RankProgressCallback | None = None,
    task: Task = summarize_rank,
    on_result: ResultCallback | None = None,
) -> list[Result]:
    """The same per-rank work as Ray tasks (the files must be readable where the tasks run: a shared
    filesystem). ``address``: a cluster's ``host:port`` or ``ray://`` address, ``auto``, or None to
    use RAY_ADDRESS or start a local instance."""
    if address and address != "auto":
        _probe(address)  # Ray itself retries an unreachable cluster for minutes
    ray = _import_ray()
    _connect(ray, address)
    remote = ray.remote(max_retries=1, retry_exceptions=False)(_ray_task)
    refs = {remote.remote(task, request): index for index, request in enumerate(requests)}
    results: dict[int, Result] = {}
    pending = list(refs)
    with collector_paused():  # receiving the summaries: see trace.loader.collector_paused
        _receive(ray, refs, pending, requests, results, on_progress, on_result)
    return [results[index] for index in range(len(requests))]


def _receive(ray, refs: dict, pending: list, requests: list[SummaryRequest], results: dict[int, Result],
             on_progress: RankProgressCallback | None, on_result: ResultCallback | None) -> None:  # fmt: skip
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=None)
        for ref in done:
            index = refs[ref]
            request = requests[index]
            try:
                results[index] = ray.get(ref)
            except ray.exceptions.RayError as error:  # the task's worker died twice (max_retries=1)
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                results[index] = RankFailure(request.path, f"{request.path}: the Ray task died twice ({reason})", attempts=2)
            if on_result:
                on_result(index, results[index])
            if on_progress:
                on_progress(index, 1.0)


def split_on_ray(requests: list[SplitRequest], *, least_pieces: int = SPLIT_IN_WORKERS_PIECES) -> list[PeerSplit]:
    """``split_all`` as Ray tasks, on the instance ``summarize_on_ray`` connected to; a task that dies twice is
    split in this process."""
    if len(requests) <= 1 or sum(request.waits.pieces for request in requests) < least_pieces:
        return split_here(requests)
    ray = _import_ray()
    remote = ray.remote(max_retries=1, retry_exceptions=False)(split_one)
    refs = [remote.remote(request) for request in requests]
    splits = []
    for ref, request in zip(refs, requests):
        try:
            splits.append(ray.get(ref))
        except ray.exceptions.RayError:
            splits.append(split_one(request))
    return splits


def _ray_task(task: Task, request: SummaryRequest) -> Result:
    return _guarded(task, request, None)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise SkalpelError("--ray needs Ray: pip install 'skalpel[ray]'") from None
    return ray


def _connect(ray, address: str | None) -> None:
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SkalpelError(f"cannot reach the Ray cluster at {address or 'RAY_ADDRESS / a local instance'}: {first}") from None


_PROBE_TIMEOUT_S = 5.0


def _probe(address: str) -> None:
    """One-line error when nothing listens at ``host:port`` (or ``ray://host:port``)."""
    target = address.removeprefix("ray://").rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise SkalpelError(f"--ray {address}: give the cluster's address as host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as error:
        raise SkalpelError(f"cannot reach the Ray cluster at {address}: {error.strerror or error}") from None
