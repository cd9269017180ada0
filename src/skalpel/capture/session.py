"""One capture: a torch.profiler session with the expert defaults, and skalpel's step clock.

``ProfileRun`` is stepped by the user's loop (``skalpel.profile()``, ``profile.py``) or by the step
boundaries (``driver.py``: ``skalpel run``, ``skalpel watch``); it records and writes the trace,
and hands over its trace files and ``capture_info()``: ``outputs.py`` turns them into the Report
and the run folder.

skalpel times every step itself (``perf_counter`` at the step boundaries): the steps before the
first window (wait and warm-up, the profiler not recording) are the baseline for the profiler's
overhead, a few un-profiled steps after the last window its check (``timing.py``), and
with ``repeat >= 2`` the spread between the recorded windows' medians is the measurement noise.
The first window's trace is written to the run folder; later windows serve the noise estimate
only. Stopping early still yields the trace of what was recorded.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerAction

from ..analysis.steps import CLOSING_RANGE
from ..errors import SkalpelError
from ..result.memory_split import MemorySplit
from ..result.report import CaptureInfo
from ..result.sections import RunLedger
from ..trace.line_samples import HEADER_KEY as LINE_SAMPLES
from ..trace.precision_header import HEADER_KEY as PRECISION
from ..trace.run_queue_header import HEADER_KEY as RUN_QUEUE
from . import compile_log, cpu, distributed, precision, runclock, runfolder, signals
from .aside import OWN
from .bounded import PartialStep
from .budget import release_results
from .export import ExportError, export_trace
from .memory_split import NotSplit, split_at_peak
from .module_sizes import HEADER_KEY as MODULE_SIZES
from .module_sizes import ModuleSizes
from .quiet import ignored
from .sampler import LineSampler
from .settings import ACTIVE, WAIT, CaptureSettings, profiler_kwargs, torch_schedule
from .timing import step_timing

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


def _say(message: str) -> None:
    """A progress line on stderr, as ``skalpel run`` says what it does."""
    print(f"skalpel: {message}", file=sys.stderr, flush=True)


class ProfileRun:
    """One capture: the torch.profiler session and skalpel's step clock; its trace files and ``capture_info()``."""

    def __init__(self, settings: CaptureSettings, *, out: Path | None = None, name: str | None = None) -> None:
        self.settings = settings
        self.name = name or _default_name()
        self.folder: Path | None = out
        self.trace_paths: list[Path] = []
        self.windows_done = 0
        self.exit_status: int | None = None
        self.script: str | None = None
        self._intervals: list[tuple[int, float]] = []  # (profiler step, seconds)
        self._after: list[float] = []  # seconds of un-profiled steps after the last window: the baseline's check
        self._after_started = False
        self._prof: Any = None
        self._last = 0.0
        self._stopped = False
        self._tagged_window = -1
        self._phases = [settings.phase(number) for number in range(settings.total_steps + 1)]
        self._discarded = False
        self._owns_compile_log = False
        self.export_error: ExportError | None = None  # the trace could not be written (a full disk)
        self.notes: list[str] = []  # how the capture went (the script stopped it, ...), added to the report
        self.said: set[str] = set()  # of the notes, those printed as they happened: not printed again at the end
        self.cut_inside_step = False  # set before stop(): the recording ends inside a step, left out of the trace
        self.partial: list[PartialStep] = []  # that step, once the trace is written
        self.step_signal: str | None = None  # what marked the steps, for the summary
        self.loader_workers = 0  # the most DataLoader workers seen (skalpel run tells)
        self._cpu_window: list[cpu.Snapshot] = []  # CPU snapshots at the start and end of the first window
        # DataLoader batches fetched so far and the script thread's CPU seconds in those fetches (skalpel run's hooks)
        self.batches_seen: Callable[[], tuple[int, float]] | None = None
        self._cpu_batches: list[tuple[int, float]] = []  # those at the window's snapshots
        self._unprofiled_batches: list[tuple[int, float]] = []  # and at the end of each un-profiled (wait) step
        self.check_steps = max(settings.active, 5)  # un-profiled steps timed after the last window
        self.run_ledger: RunLedger | None = None  # the whole run by skalpel run's clock (conclude.py sets it)
        self.memory_split: MemorySplit | None = None  # what held the first window's memory peak
        self._sampler: LineSampler | None = None  # statement lines of the first window (with_stack only)
        self._precision: dict | None = None  # this CPU's matmul speed in bf16 and fp32, for the trace header
        self._module_sizes: ModuleSizes | None = None  # each module's parameters and output bytes (first window)
        # the export's stretches, left out of the CPU window
        self._cpu_excluded: list[tuple[cpu.Snapshot, cpu.Snapshot]] = []

    # -- the session -------------------------------------------------------------------------
    def start(self) -> ProfileRun:
        if self._prof is not None:
            raise SkalpelError("this skalpel.profile() session was already started")
        self.folder = distributed.run_folder(self.folder, self.name)  # one folder for every rank of a job
        with runclock.own_work():  # before the profiler starts: its matmuls are not in the trace
            self._precision = None if torch.cuda.is_available() else precision.header_value()
        self._prof = torch.profiler.profile(schedule=torch_schedule(self.settings), on_trace_ready=self._on_trace_ready,
                                            **profiler_kwargs(self.settings))  # fmt: skip
        self._owns_compile_log = compile_log.install()  # `skalpel run` installs it before the script starts
        compile_log.before_step(self._prof, starting=True)
        OWN.add(self._prof)
        with _quiet(), runclock.own_work():
            self._prof.start()
        if self._phases[0] == (0, ACTIVE):  # no wait or warm-up: the window opened with the profiler
            self._window_opens()
            self._anchor(0)
        self._last = time.perf_counter()
        return self

    def step(self, *, last: bool = False) -> None:
        """Mark the end of one iteration; ``last``: the recording ends here (the profiler stops instead of stepping:
        a memory budget passed)."""
        now = time.perf_counter()
        if self._prof is None:
            raise SkalpelError("run.step() called outside the `with skalpel.profile() as run:` block")
        if self._stopped:
            self._time_after_capture(now)
            return
        prof = self._prof
        number = prof.step_num
        self._intervals.append((number, now - self._last))
        if self.batches_seen is not None and self._phases[min(number, len(self._phases) - 1)] == (0, WAIT):
            self._unprofiled_batches.append(self.batches_seen())  # a batch's cost without the profiler
        if last:
            self._stop_profiler()
            self._last = time.perf_counter()
            return
        phases = self._phases
        if number + 1 < len(phases) and phases[number] == phases[number + 1]:
            prof.step()  # no change of phase: the cheap path, nothing of ours in the recorded step
        else:
            opens = number + 1 < len(phases) and phases[number + 1] == (0, ACTIVE)
            closes = phases[number] == (0, ACTIVE)
            if opens:
                self._window_opens()  # in the warm-up step, before recording starts
            # Closing, our own work runs in the last recorded step (the profiler still records: header keys are
            # written now); a range of its own marks it, and the analysis ends that step where it begins.
            with torch.profiler.record_function(CLOSING_RANGE) if closes else _nothing():
                if closes:
                    self._samples_into_trace()
                compile_log.before_step(prof)
                excluded = _excluded_from_cpu_window(self) if closes else _nothing()
                excluded.__enter__()  # the CPU snapshot (reading /proc) is ours too
            with _quiet(), runclock.own_work():
                prof.step()  # closing: the export, which the CPU window leaves out
            excluded.__exit__(None, None, None)
            if opens:
                self._anchor(number + 1)
            if closes:
                self._cpu_snapshot()
            self._tag_trace()
            if self.windows_done >= self.settings.repeat:
                self._stop_profiler()
        self._last = time.perf_counter()

    def _cpu_snapshot(self) -> None:
        self._cpu_window.append(cpu.snapshot())
        if self.batches_seen is not None:
            self._cpu_batches.append(self.batches_seen())

    # The first window's own bookkeeping stays out of its recorded steps (reading /proc and starting a
    # thread cost far more than a 1 ms step): it runs before recording starts, and after the export.
    def _window_opens(self) -> None:
        """CPU snapshot and line sampler on, before the first recorded step begins."""
        self._cpu_snapshot()
        if self.settings.with_stack and not self._discarded:
            self._sampler = LineSampler()
            self._sampler.start()
            if self.windows_done == 0 and self._module_sizes is None:  # module frames need the stacks
                sizes = ModuleSizes()
                if sizes.start():
                    self._module_sizes = sizes

    def _anchor(self, step_number: int) -> None:
        if self._sampler is not None:
            self._sampler.anchor_at(step_number)  # ProfilerStep#step_number began just now

    def _samples_into_trace(self) -> None:
        """The sampler stops (it does not wait for its thread) and its samples go into the trace header."""
        sizes, self._module_sizes = self._module_sizes, None
        if sizes is not None:
            sizes.stop()
            if sizes.by_class:
                self._prof.add_metadata_json(MODULE_SIZES, json.dumps(sizes.header_value()))
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop(wait=False)
            if sampler.samples and sampler.anchor is not None:
                self._prof.add_metadata_json(LINE_SAMPLES, json.dumps(sampler.header_value()))
        self._run_queue_into_trace()

    def _run_queue_into_trace(self) -> None:
        """The script thread's wait for a core since the window opened, into the header (``run_queue_header``): a
        rank slowed by the machine's load is then told from one slowed by its own work (straggler_rank). Called on
        the script's thread, which steps the profiler."""
        if not self._cpu_window:
            return
        start, now = self._cpu_window[0], cpu.snapshot()
        waited = cpu.thread_wait_s(start, now, threading.get_native_id())
        if waited is not None:
            value = {"main_thread_wait_s": round(waited, 4), "wall_s": round(max(now.wall_s - start.wall_s, 0.0), 4)}
            self._prof.add_metadata_json(RUN_QUEUE, json.dumps(value))

    def not_a_step(self) -> None:
        """The time since the last boundary was no training step (a framework's evaluation ran): the next step's
        time starts now, so the overhead's baseline and its check leave it out."""
        self._last = time.perf_counter()

    def _time_after_capture(self, now: float) -> None:
        """Un-profiled steps after the last window: the check of the overhead's baseline (taken before the window)."""
        if self._after_started and len(self._after) < self.check_steps:
            self._after.append(now - self._last)
        self._after_started = True  # the first step after the stop may carry the profiler's teardown: left out
        self._last = time.perf_counter()

    @property
    def started(self) -> bool:
        """The profiler was started (it may have stopped since)."""
        return self._prof is not None

    @property
    def profiling(self) -> bool:
        """The profiler is started and not yet stopped (it may be waiting, warming up or recording)."""
        return self._prof is not None and not self._stopped

    @property
    def recording(self) -> bool:
        """The profiler records the window now (not waiting, not warming up)."""
        return self.profiling and self._prof.current_action in _RECORDING

    @property
    def capture_complete(self) -> bool:
        return self.windows_done >= self.settings.repeat

    @property
    def baseline_complete(self) -> bool:
        """Every window recorded and enough un-profiled steps timed after them (the baseline's check)."""
        return self.capture_complete and len(self._after) >= self.check_steps

    @property
    def steps_done(self) -> int:
        return len(self._intervals)

    @property
    def recorded_steps(self) -> int:
        """Steps of the first window recorded so far: the ones its trace holds."""
        last = len(self._phases) - 1
        return sum(1 for number, _ in self._intervals if self._phases[min(number, last)] == (0, ACTIVE))

    def stop(self) -> None:
        """Stop the profiler; what was recorded so far is saved (idempotent)."""
        if self._prof is not None:
            self._stop_profiler()

    def discard(self) -> None:
        """Stop without keeping anything (a script's own session replaces this one)."""
        self._discarded = True
        self.stop()
        for path in self.trace_paths:
            path.unlink(missing_ok=True)
        self.trace_paths = []

    def _stop_profiler(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        closes = self.windows_done == 0 and self._prof.current_action in _RECORDING
        if closes:
            self._samples_into_trace()  # stopped inside the first window: keep what it sampled
        compile_log.before_stop(self._prof)
        with _quiet(), _excluded_from_cpu_window(self) if closes else _nothing(), runclock.own_work():
            self._prof.stop()
        if closes and len(self._cpu_window) == 1:
            self._cpu_snapshot()
        if self._owns_compile_log:
            compile_log.uninstall()

    def _tag_trace(self) -> None:
        # Header keys must be added while the profiler records; once per window.
        phase = self.settings.phase(self._prof.step_num)
        if self._prof.current_action in _RECORDING and phase is not None and phase[0] != self._tagged_window:
            self._tagged_window = phase[0]
            self._prof.add_metadata("skalpel_torch_version", torch.__version__)
            self._prof.add_metadata("skalpel_run", distributed.run_id(self.folder) if self.folder else self.name)
            if self._precision is not None:  # this CPU's bf16 and fp32 matmul speeds (capture/precision.py)
                self._prof.add_metadata_json(PRECISION, json.dumps(self._precision))

    def _on_trace_ready(self, prof: Any) -> None:
        try:
            self._write_window(prof)
        finally:
            release_results(prof)  # the trace is on disk (or never will be): the analysis reads the file

    def _write_window(self, prof: Any) -> None:
        window = self.windows_done
        self.windows_done += 1
        if window > 0 or self._discarded:
            return  # later windows give the noise estimate; the report and files come from the first
        assert self.folder is not None
        path = self.folder / runfolder.trace_file_name(rank())
        with signals.deferred() as held:  # a Ctrl-C now would cut the file: it waits until the file is whole
            try:
                kept = export_trace(prof, path, partial=self.partial if self.cut_inside_step else None)
                self.trace_paths.append(path)
                if kept is not None:
                    self.notes.append(kept.note())
            except ExportError as error:
                self.export_error = error  # said when the run ends; raising here would blame the script
                if error.kept is not None:
                    self.trace_paths.append(error.kept)
        held.reraise()
        self._split_memory(prof)  # after the file is whole: a Ctrl-C in the categoriser's seconds costs only the split

    def _split_memory(self, prof: Any) -> None:
        """The window's memory peak by category and module, while the profiler still holds its results."""
        if not self.settings.profile_memory:
            return
        try:
            # rank 0 says it for the job: every rank splits its own window at the same time
            self.memory_split = split_at_peak(prof, steps=self.recorded_steps, say=_say if rank() == 0 else None)
        except NotSplit as why:
            self.notes.append(str(why))

    # -- what it hands over --------------------------------------------------------------------
    def capture_info(self) -> CaptureInfo:
        timing = step_timing(self._intervals, self.settings, after=self._after)
        cpu_facts = None
        if len(self._cpu_window) >= 2:
            start, end = self._cpu_window[0], self._cpu_window[1]
            end = cpu.left_out(end, self._cpu_excluded)
            cpu_facts = cpu.facts(start, end, steps=self.settings.active, loader_workers=self.loader_workers,
                                  fetched=_between(self._cpu_batches[:2]),  # the first window's
                                  fetched_unprofiled=_between(self._unprofiled_batches))  # fmt: skip
        return CaptureInfo(
            warmup_steps=self.settings.wait + self.settings.warmup,
            wait_steps=self.settings.wait,
            active_steps=self.settings.active,
            repeats=self.settings.repeat,
            script=self.script,
            exit_status=self.exit_status,
            step_signal=self.step_signal,
            cpu=cpu_facts,
            run=self.run_ledger,
            memory_split=self.memory_split,
            **timing,
        )


def _default_name() -> str:
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else ""
    if script == "ipykernel_launcher":  # a Jupyter kernel: the script is the kernel's, not the user's
        return "notebook"
    return script or "profile"


def _between(counts: list[tuple[int, float]]) -> tuple[int, float] | None:
    """The batches fetched and the CPU seconds spent fetching them from the first of the hooks' counts to the last
    (of the un-profiled steps, the first step's are left out: it makes the iterator and starts its workers)."""
    if len(counts) < 2:
        return None
    (batches_then, cpu_then), (batches_now, cpu_now) = counts[0], counts[-1]
    return batches_now - batches_then, cpu_now - cpu_then


def rank() -> int:
    """This process's rank in its job (0 alone)."""
    group = torch.distributed
    if group.is_available() and group.is_initialized():
        return int(group.get_rank())
    current = distributed.job()
    return current.rank if current is not None else 0


class _excluded_from_cpu_window:
    """Snapshots around the block (the trace export) so that the CPU facts of the window leave it out: its wall and
    CPU time, and the time its threads waited for a core."""

    def __init__(self, run: ProfileRun) -> None:
        self.run = run

    def __enter__(self) -> None:
        self.began = cpu.snapshot()

    def __exit__(self, *exc: object) -> None:
        self.run._cpu_excluded.append((self.began, cpu.snapshot()))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _quiet() -> Any:
    """Silence torch.profiler's warnings about its own cycles and unknown-size blocks (the script's own warnings
    are left as they are: ``quiet.py``)."""
    return ignored(".*Profiler clears events.*", ".*won't be using warmup.*")
