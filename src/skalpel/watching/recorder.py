"""The flight recorder: every step of a run timed and measured without the profiler, and a capture when it goes wrong.

Steps are found as ``skalpel run`` finds them (``capture/steps.StepDetector``: the optimizer,
DataLoader, backward and module hooks, or ``skalpel.step()``). At each boundary the training
thread reads the clock and its core-wait clock and appends them to the store's deque (on CUDA,
with an event recorded: ``devicetime.py``); nothing else happens there unless a capture is asked
for. The store's writer thread reads the counters (``probe.py``) and judges each step
(``detect.py``); when an anomaly fires (and its kind has not been captured
within the cooldown), the next boundary starts a ``ProfileRun`` with ``skalpel run``'s
settings in ``capture-<step>-<kind>/`` beside the store, drives it for its steps, analyses it
on the training thread (a pause of a few seconds, left out of the step rows) and links the
report to the anomaly. The capture's steps are stored flagged ``profiled`` and never judged.
The capture is driven as ``skalpel run`` drives its own (``capture/driver.py``: the memory
budget, a script that starts torch.profiler itself). When a stronger signal takes over from a
fallback (a model called in an evaluation pass, then an optimizer), the steps so far were not
iterations: their rows and anomalies are dropped, steps are numbered and judged afresh, and a
capture under way is dropped.
Under torchrun with ``--out JOB`` every rank captures the same steps and the job's report is
written once, off every rank's training thread (``jobcapture.py``, ``collect.py``).

``skalpel.watch()`` wraps a loop in a script; ``skalpel watch SCRIPT`` (``runner.py``) runs one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from .. import env
from ..capture import distributed, runfolder, signals
from ..capture.boundaries import Takeover, why_no_boundary
from ..capture.children import Children
from ..capture.collectives import Recorder as CollectiveRecorder
from ..capture.driver import Driver
from ..capture.outputs import own_report, write_run
from ..capture.session import ProfileRun
from ..capture.settings import CaptureSettings
from ..capture.steps import StepDetector
from ..diagnose import thresholds as limits
from ..errors import SkalpelError
from .asks import Asks, answer_name
from .collect import capture_summary
from .detect import Anomaly, Detector
from .devicetime import DeviceTimes
from .hangwatch import HangWatch, write_dump
from .jobcapture import Request, Requests, start_collector, write_marker
from .jobcapture import summary as job_summary
from .live import LiveLine, line
from .probe import RunQueueClock, host_memory_limit
from .ranks import Peers
from .store import STORE, Store

DEFAULT_COOLDOWN_S = 600.0


class Watcher:
    """One watched run: the hooks, the store, and the captures on anomaly."""

    def __init__(self, folder: Path, *, script: str, step_on: str | None = None,
                 cooldown_s: float = DEFAULT_COOLDOWN_S, capture: bool = True,
                 settings: CaptureSettings | None = None, hang_after_s: float | None = None) -> None:  # fmt: skip
        self.folder = folder
        self.script = script
        self.cooldown_s = cooldown_s
        self.capture_on = capture
        self.settings = settings or CaptureSettings()
        self.detector = StepDetector(self._boundary, only=step_on)
        self.policy = self.detector.policy
        self.children = Children()  # processes the script starts: training there is said, as skalpel run says it
        self.detector.on_child_boundary = self.children.boundary
        self.driver = Driver(self.detector, _say, on_takeover=self._taken_over, on_aside=self._stood_aside,
                             steps=lambda: self.steps)  # fmt: skip
        self.thread = threading.get_ident()
        # RSS until the script puts memory on a CUDA device (never initialised here: no context of ours)
        self.anomaly_detector = Detector(memory_limit=host_memory_limit(), memory_source="RSS")
        self.store = Store(folder, self.anomaly_detector, self._on_anomaly)
        self._append = self.store.steps.append
        self.steps = 0
        self.anomalies: list[tuple[Anomaly, int]] = []
        self.captures: list[Path] = []
        self._started = time.perf_counter()
        self._last: float | None = None
        self.runq = RunQueueClock()
        self._last_runq: bytes | None = None
        self._profiled = 0  # 1: the step under way is part of a capture
        self.device_times: DeviceTimes | None = None  # CUDA events at the boundaries, once the script uses CUDA
        # captures asked for by the writer thread, one per kind, taken in turn at the boundaries (one at a time);
        # under torchrun each names the first step (jobcapture.Request), and the anomaly is the asking rank's only
        self._requested: list[tuple[Anomaly | None, int | None, Request | None]] = []
        self._captured_at: dict[str, float] = {}  # kind -> when its last capture was asked for
        # what asked for the capture under way (the driver's run)
        self._capture: tuple[Anomaly | None, int | None, Request | None] | None = None
        self.requests: Requests | None = None  # under torchrun with --out: the job's capture requests
        self.rank = 0
        self._asked: dict[int, tuple[Anomaly, int]] = {}  # request number -> this rank's anomaly that asked for it
        self._collecting: list[tuple[Any, Request, int]] = []  # (collector process, request, anomaly id)
        self._collecting_lock = threading.Lock()  # the writer links what ended, close() waits for the rest
        self._closing = False
        self.live = LiveLine()
        self.store.on_flush = self._after_flush
        self.hang_after_s = limits.COLLECTIVE_HANG.floor if hang_after_s is None else hang_after_s
        self.hangs: HangWatch | None = None  # installed with the hooks: a step that never ends
        self.collectives: CollectiveRecorder | None = None  # torch.distributed's calls, on disk as they happen
        self.busy = False  # the training thread is in a capture's own work at a boundary (hangwatch waits)
        self.meeting = folder  # where requests from another terminal are read (the job's folder under torchrun)
        self.asks: Asks | None = None

    # -- installing ---------------------------------------------------------------------------
    def install(self) -> None:
        self.thread = self.driver.thread = threading.get_ident()
        self.store.start(origin=self._started)
        self.store.meta(script=self.script, started=time.strftime("%Y-%m-%dT%H:%M:%S"), status="running",
                        memory_source=self.anomaly_detector.memory_source,
                        memory_limit=self.anomaly_detector.memory_limit, cooldown_s=self.cooldown_s)  # fmt: skip
        self.detector.install()  # it times the DataLoader wait, backward and the optimizer step too
        self.children.install()
        self.driver.install()
        self.store.on_restart = self.anomalies.clear  # a takeover: the anomalies judged on the steps before are gone
        # a rank whose record stays "running" with its process gone died (told on this host only)
        self.store.meta(pid=os.getpid(), host=socket.gethostname(), capture=self.capture_on)
        self.asks = Asks(self.meeting, time.time())
        self._install_hang_watch()
        self.live.start()

    def _install_hang_watch(self) -> None:
        """The collectives' ring and the thread that notices a step that never ends (``hangwatch.py``)."""
        try:
            self.collectives = CollectiveRecorder(self.folder, step=lambda: self.steps + 1)
            self.collectives.install()
        except (OSError, ImportError, ValueError) as error:
            self.collectives = None
            _say(f"collectives are not recorded ({type(error).__name__}: {error})")
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # PyTorch's own record too, read at a hang
        job = distributed.job()
        self.hangs = HangWatch(self.folder, rank=job.rank if job is not None else None,
                               last_end=lambda: None if self.busy else self._last,
                               steps=lambda: self.steps, median_s=self.store.recent_step_s,
                               floor_s=self.hang_after_s, say=_say,
                               job_folder=self.meeting if self.meeting != self.folder else None,
                               world_size=job.world_size if job is not None else 1)  # fmt: skip
        self.hangs.start()

    def _after_flush(self) -> None:
        """On the writer thread, after each flush: the job's new capture requests, the reports written, the live
        line."""
        if self.requests is not None and not self._closing:  # closing: close() takes the last requests itself
            self._requested.extend((*self._asked.get(request.number, (None, None)), request)
                                   for request in self.requests.take())  # fmt: skip
            with self._collecting_lock:  # close() takes the rest
                done = [entry for entry in self._collecting if entry[0].poll() is not None]
                for entry in done:
                    self._collecting.remove(entry)
            for _, request, anomaly_id in done:
                self._link_job_capture(request, anomaly_id)
        if self.asks is not None and not self._closing:
            for asked in self.asks.take():
                self._answer(asked)
        self._show_live()

    def _answer(self, asked: dict) -> None:
        """On the writer thread: a request from another terminal (``asks.py``): the stacks now, or a capture."""
        ask_id = str(asked.get("id"))
        if asked["what"] == "stacks":
            path = self.folder / answer_name(ask_id)
            try:
                rank = self.rank if distributed.job() is not None else None
                write_dump(path, rank, self.steps, {"asked": ask_id}, recorder_name=None)
            except OSError as error:
                _say(f"cannot write the stacks asked for into {path}: {error}")
                return
            _say(f"stacks asked for (pid {asked.get('pid')}): {path}")
            return
        if self.requests is not None and self.rank != 0:
            return  # rank 0 asks the job's capture for every rank
        steps = int(asked.get("steps") or self.settings.active)
        if not self.capture_on:
            _say(f"a profile asked for (pid {asked.get('pid')}): this run takes no captures")
            return
        anomaly = Anomaly(self.steps, "asked", f"a profile of {steps} steps asked for from another terminal (pid "
                          f"{asked.get('pid')}, request {ask_id})", float(steps), 0.0)  # fmt: skip
        self._on_anomaly(anomaly, self.store.record_anomaly(anomaly))

    def _show_live(self) -> None:
        """The live line (a terminal only)."""
        row = self.store.last_row
        if row is None:
            return
        memory = row[7] if row[7] is not None else row[6]
        self.live.update(line(row[0], self.anomaly_detector.median_step, memory, self.anomaly_detector.memory_source,
                              len(self.anomalies), self._capture is not None,
                              self.hangs.bound_s if self.hangs is not None else None))  # fmt: skip

    def uninstall(self) -> None:
        self.live.stop()
        if self.hangs is not None:
            self.hangs.stop()
        if self.collectives is not None:
            self.collectives.uninstall()
        self.driver.uninstall()
        self.detector.uninstall()
        self.children.uninstall()

    # -- each step ----------------------------------------------------------------------------
    def _boundary(self) -> None:
        """Each step's whole cost on the training thread: two clock reads and an append, and on CUDA an event
        recorded (the detector called this from the script's own process: it tests that)."""
        now = time.perf_counter()
        if threading.get_ident() != self.thread:
            return
        runq, device, timed = self.runq.read(), self.device_times, self.detector.hooks
        event = None
        if device is not None:
            try:
                event = device.record()
            except Exception as error:  # noqa: BLE001 - no device time from here on; the run goes on
                self.device_times = None
                _say(f"device time per step stops here ({type(error).__name__}: {error})")
        if self._last is not None:
            self.steps += 1
            if self.store.failed is None:
                self._append((self.steps, self._last, now, timed.loader_s, self._profiled, self._last_runq, runq,
                              timed.backward_s, timed.optimizer_s, event))  # fmt: skip
        if self.store.want_device:  # once: the writer saw CUDA initialised, and reads memory on this device
            self._use_device()
        if self._capture is not None or self._requested or self.policy.restart:
            self.busy = True  # a capture's start or analysis: seconds without a step end that are no hang
            try:
                self._drive_capture()
            finally:
                now, runq = time.perf_counter(), self.runq.read()  # the capture's own work stays out of the next step
                self._last = now  # before the hang watch looks again
                self.busy = False
        self._last, self._last_runq = now, runq  # the detector times the DataLoader, backward and the optimizer
        timed.loader_s = timed.backward_s = timed.optimizer_s = 0.0

    def _use_device(self) -> None:
        """The script initialised CUDA (the writer saw it): memory is read on this thread's device, and each step's
        device time is timed with CUDA events from the next boundary on."""
        cuda = sys.modules["torch"].cuda
        self.store.cuda_device(cuda.current_device())
        times = DeviceTimes(cuda)
        self.store.device_times = times  # before the first event reaches the writer
        self.device_times = times

    def start_clock(self) -> None:
        """Time the first iteration from now (``skalpel.watch()``: the block starts the loop; a script run by
        ``skalpel watch`` is timed from its first boundary, after its imports and set-up)."""
        self._last, self._last_runq = time.perf_counter(), self.runq.read()
        timed = self.detector.hooks
        timed.loader_s = timed.backward_s = timed.optimizer_s = 0.0

    def step(self) -> None:
        """Mark the end of one iteration (a script that marks its own steps)."""
        self.detector.hooks.user_step()

    # -- anomalies and captures ---------------------------------------------------------------
    def _on_anomaly(self, anomaly: Anomaly, anomaly_id: int) -> None:
        """On the writer thread: say it, and ask the training thread for a capture unless one is due later."""
        self.anomalies.append((anomaly, anomaly_id))
        _say(f"step {anomaly.step}: {anomaly.kind}: {anomaly.message}")
        if not self.capture_on:
            return
        asked = anomaly.kind == "asked"  # from another terminal: no cooldown, its own number of steps
        if self.requests is not None:  # every rank captures, from a step far enough ahead for all to know it
            settings = self._settings_for(int(anomaly.value) if asked else None)
            request = self.requests.ask(kind=anomaly.kind, anomaly_step=anomaly.step, current_step=self.steps,
                                        median_step_s=self.store.recent_step_s(),
                                        cooldown_s=0.0 if asked else self.cooldown_s,
                                        active=settings.active if asked else None,
                                        span=settings.total_steps + max(settings.active, 5) + 3)  # fmt: skip
            if request is not None:
                self._asked[request.number] = (anomaly, anomaly_id)
                _say(f"rank {self.rank}: every rank captures steps {request.first_step}-{request.last_step} "
                     f"({anomaly.kind})")  # fmt: skip
            return
        last = self._captured_at.get(anomaly.kind)
        if not asked and last is not None and time.monotonic() - last < self.cooldown_s:
            return
        self._captured_at[anomaly.kind] = time.monotonic()
        self._requested.append((anomaly, anomaly_id, None))  # after the capture under way, if any

    def _drive_capture(self) -> None:
        """At a boundary: a takeover first (``driver.py``), then the capture asked for starts, or the one under way
        steps, and is finished once recorded."""
        request = None
        try:
            if self._capture is None and self._requested:
                self._next_capture()
            if self._capture is not None:
                request = self._capture[2]
            if self.driver.boundary() and self._capture is not None:
                if request is not None:
                    self._finish_job_capture()
                else:
                    self._finish_capture()
        except Exception as error:  # noqa: BLE001 - a capture that fails must not stop the training
            self.driver.take()
            self._capture, self._profiled = None, 0
            _say(f"the capture failed ({type(error).__name__}: {error}); the run goes on")
            if request is not None:  # the other ranks' report says why this rank's trace is missing
                self._job_part_done(request, None, f"the capture failed ({type(error).__name__}: {error})")

    def _next_capture(self) -> None:
        """The first capture asked for, given to the driver (it starts at this boundary), unless not due yet."""
        anomaly, anomaly_id, request = self._requested[0]
        if request is not None and self.steps + 1 < request.first_step:
            return  # a capture of the job starts at its step, on every rank
        self._requested.pop(0)
        if request is not None and self.steps + 1 > request.first_step:
            self._job_part_done(request, None, f"read the request after step {request.first_step} had begun")
            return
        if self.driver.stood_aside:
            note = f"the script runs torch.profiler itself ({self.driver.aside.where}): two profilers at once crash"
            if request is not None:
                self._job_part_done(request, None, note)
            elif anomaly_id is not None:
                self.store.capture(anomaly_id, None, f"no capture: {note}")
            return
        folder = self._capture_folder(anomaly, request)
        kind = request.kind if request is not None else anomaly.kind  # type: ignore[union-attr]
        if request is not None:
            active = request.active
        else:
            active = int(anomaly.value) if anomaly is not None and anomaly.kind == "asked" else None
        run = ProfileRun(self._settings_for(active), out=folder, name=f"{Path(self.script).stem}-{kind}")
        run.script = self.script
        self.driver.run = run
        self._capture = (anomaly, anomaly_id, request)
        self._profiled = 1

    def _settings_for(self, active: int | None) -> CaptureSettings:
        """The capture's settings: the watch's, with ``active`` steps recorded when a request names them."""
        return self.settings if active is None else dataclasses.replace(self.settings, active=active)

    def _taken_over(self, takeover: Takeover) -> None:
        """A stronger signal showed the training iteration: the steps so far were not iterations. Their rows and
        anomalies are dropped and steps are numbered and judged afresh (the store), the captures asked for on them
        are dropped, and so is the capture under way (the driver discarded what it recorded)."""
        note = takeover.note()
        if self._capture is not None:
            request = self._capture[2]
            run = self.driver.take()
            self._capture, self._profiled = None, 0
            if run is not None and run.folder is not None:
                runfolder.remove_if_empty(run.folder)
            if request is not None:
                self._job_part_done(request, None, note)
        self._requested = [entry for entry in self._requested if entry[2] is not None]  # a job's: by step number
        self.steps = 0
        self.store.restart(note)

    def _stood_aside(self) -> None:
        """The script starts torch.profiler itself: the driver stopped the capture under way, keeping what it
        recorded; none starts after it."""
        _say(f"the script starts torch.profiler itself ({self.driver.aside.where}): captures stop there (two "
             "profilers at once crash); every step is still timed")  # fmt: skip

    def _capture_folder(self, anomaly: Anomaly | None, request: Request | None) -> Path:
        if request is not None:
            assert self.requests is not None
            return self.requests.folder / request.folder_name
        assert anomaly is not None
        return self.folder / f"capture-{anomaly.step}-{anomaly.kind}"

    def _finish_job_capture(self) -> None:
        """This rank's part of a job's capture is over: its trace is written; the report is not this rank's to wait
        for (the asking rank's collector writes it)."""
        assert self._capture is not None
        request, run = self._capture[2], self.driver.take()
        assert request is not None and run is not None
        self._capture, self._profiled = None, 0
        run.stop()
        self._job_part_done(request, run, None)

    def _job_part_done(self, request: Request, run: ProfileRun | None, note: str | None) -> None:
        """The marker of this rank's part (its trace, or why it has none); the asking rank starts the collector."""
        assert self.requests is not None
        folder = self.requests.folder / request.folder_name
        trace = capture = None
        if run is not None:
            if run.export_error is not None:
                note = note or str(run.export_error)
            elif run.trace_paths:
                trace, capture = run.trace_paths[0].name, run.capture_info()
            else:
                note = note or f"no step was recorded ({run.steps_done} step(s) of the capture ran)"
        try:
            write_marker(folder, self.rank, trace=trace, capture=capture, note=note)
        except OSError as error:
            _say(f"rank {self.rank}: cannot write its part of the capture in {folder}: {error}")
        if trace is not None:
            self.captures.append(folder)
        if request.rank != self.rank:
            return
        collector = start_collector(folder, self.requests.world_size)
        if collector is None:
            _say(f"rank {self.rank}: cannot start the job capture's report in {folder}")
            return
        anomaly_id = self._asked.get(request.number, (None, -1))[1]
        with self._collecting_lock:
            self._collecting.append((collector, request, anomaly_id))
        _say(f"rank {self.rank}: captured steps {request.first_step}-{request.last_step} ({request.kind}); the job's "
             f"report is written in {folder} once every rank's trace is there")  # fmt: skip

    def _link_job_capture(self, request: Request, anomaly_id: int) -> None:
        """The collector ended: its report (or why there is none) is linked to the anomaly that asked for it."""
        assert self.requests is not None
        folder = self.requests.folder / request.folder_name
        line = job_summary(folder) or "no report: the report's process ended without a word"
        self.store.capture(anomaly_id, f"../{folder.name}", line)
        _say(f"rank {self.rank}: the job's capture after step {request.anomaly_step} ({request.kind}): {line} "
             f"-> {folder}")  # fmt: skip

    def _finish_capture(self) -> None:
        assert self._capture is not None
        (anomaly, anomaly_id, _), run = self._capture, self.driver.take()
        assert anomaly is not None and anomaly_id is not None and run is not None
        self._capture, self._profiled = None, 0
        try:
            summary = capture_summary(write_run(run).report or own_report(run))
        except SkalpelError as error:
            summary = f"no report: {error}"
        assert run.folder is not None
        self.captures.append(run.folder)
        self.store.capture(anomaly_id, run.folder.name, summary)
        # the steps this capture recorded: a profile asked for from another terminal names its own number
        _say(f"captured {run.recorded_steps} steps after step {anomaly.step} ({anomaly.kind}): {summary} "
             f"-> {run.folder}")  # fmt: skip

    # -- the end ------------------------------------------------------------------------------
    def close(self, *, exit_status: int | None = None, error: str | None = None, error_line: str | None = None) -> None:
        """Stop watching: a capture under way is analysed with what it holds; everything queued is written."""
        self.uninstall()
        if self._capture is not None and self.driver.run is not None:
            run, request = self.driver.run, self._capture[2]
            try:
                run.stop()
                if request is not None:
                    self._finish_job_capture()
                elif run.trace_paths:
                    self._finish_capture()
            except Exception as error:  # noqa: BLE001
                _say(f"the capture under way at the end failed ({type(error).__name__}: {error})")
            self._capture = None
            self.driver.take()
        self._close_job_captures()
        self.store.meta(status="ended", ended=time.strftime("%Y-%m-%dT%H:%M:%S"), steps=self.steps,
                        exit_status=exit_status, error=error[:500] if error else None,
                        error_line=error_line)  # fmt: skip
        self.store.close()
        self.runq.close()

    def _close_job_captures(self) -> None:
        """At the end: a request whose steps never came is said so (no rank reached them); the job's reports being
        written are waited for and linked (the collector waits at most $SKALPEL_RANK_WAIT_S for the ranks)."""
        if self.requests is None:
            return
        self._closing = True
        pending = [entry for entry in self._requested if entry[2] is not None]
        self._requested = []
        pending += [(*self._asked.get(request.number, (None, None)), request) for request in self.requests.take()]
        for _, anomaly_id, request in pending:
            assert request is not None
            note = f"the run ended at step {self.steps}, before the capture's first step {request.first_step}"
            if request.rank == self.rank and anomaly_id is not None:
                self.store.capture(anomaly_id, None, f"no capture: {note}")
            else:
                try:
                    write_marker(self.requests.folder / request.folder_name, self.rank, trace=None, note=note)
                except OSError:
                    pass
        with self._collecting_lock:
            collecting, self._collecting = self._collecting, []
        for collector, request, anomaly_id in collecting:
            try:
                collector.wait(timeout=env.number(env.RANK_WAIT_S) + 300)
            except subprocess.TimeoutExpired:
                _say(f"rank {self.rank}: the job's report is still being written (pid {collector.pid}) in "
                     f"{self.requests.folder / request.folder_name}")  # fmt: skip
                continue
            self._link_job_capture(request, anomaly_id)

    def why_no_step(self) -> str | None:
        """One line when the script never stepped; None when it did."""
        if self.steps > 0:
            return None
        if self.detector.policy.boundaries == 1:
            return f"{self.script} ran one iteration only: a watched step is the time between two boundaries"
        return why_no_boundary(self.detector.policy, self.script, batches=self.detector.hooks.batches,
                               children=self.children.note(None))  # fmt: skip

    def summary(self) -> str:
        kinds = ", ".join(f"{anomaly.kind} at step {anomaly.step}" for anomaly, _ in self.anomalies)
        found = f"{len(self.anomalies)} anomal{'y' if len(self.anomalies) == 1 else 'ies'}" + (f" ({kinds})" if kinds else "")
        lost = "" if self.store.failed is None else (
            f" (only the first {self.store.steps_written} recorded: the watch file could not be written after them)")
        return f"watched {self.steps} steps{lost}: {found}, {len(self.captures)} capture(s); {self.folder / STORE}"


def _say(message: str) -> None:
    print(f"skalpel watch: {message}", file=sys.stderr, flush=True)


def open_watcher(out: str | Path | None, name: str, *, script: str, **options: Any) -> Watcher | None:
    """A Watcher on a new run folder (or ``out``); None, said in one line, when it cannot record there."""
    job = distributed.job()
    if job is not None:  # each rank records and judges its own steps, in a folder of its own
        out, name = (Path(out) / f"rank{job.rank}" if out is not None else None), f"{name}-rank{job.rank}"
        if options.get("capture", True) and out is None:
            # A capture of a job is every rank's same steps: the ranks meet in the job's folder (--out).
            options["capture"] = False
            _say(f"rank {job.rank}: under torchrun without --out each rank records its steps, without captures "
                 f"(--out JOB: the ranks capture together)")  # fmt: skip
    try:
        folder = runfolder.prepare(Path(out)) if out is not None else runfolder.prepare_new(runfolder.default_folder(name))
        watcher = Watcher(folder, script=script, **options)
    except SkalpelError as error:
        _say(f"{error}; the script runs unwatched")
        return None
    if job is not None:
        watcher.store.meta(job=job.run_id, rank=job.rank, world_size=job.world_size)
        watcher.rank = job.rank
        if out is not None:  # JOB/rankN: the other ranks' stores are its siblings, judged with this one's
            watcher.store.peers = Peers(folder, job.rank, job.run_id)
            watcher.meeting = folder.parent
            if watcher.capture_on:
                settings = watcher.settings
                span = settings.total_steps + max(settings.active, 5) + 3  # its steps, the baseline, a few spare
                watcher.requests = Requests(folder.parent, job.rank, job.world_size, span=span)
    return watcher


class WatchHandle:
    """What ``with skalpel.watch() as w`` gives: ``w.step()``, ``w.folder`` (None when nothing is recorded)."""

    def __init__(self, watcher: Watcher | None) -> None:
        self.watcher = watcher
        self.folder = watcher.folder if watcher is not None else None

    def step(self) -> None:
        if self.watcher is not None:
            self.watcher.step()


@contextlib.contextmanager
def watch(*, out: str | Path | None = None, name: str | None = None, step_on: str | None = None,
          cooldown_s: float = DEFAULT_COOLDOWN_S, capture: bool = True,
          hang_after_s: float | None = None) -> Iterator[WatchHandle]:  # fmt: skip
    """Watch every step of the loop inside the block: ``with skalpel.watch(): train()``.

    Steps are found as ``skalpel run`` finds them (or marked with ``w.step()``); a run folder
    holds ``watch.sqlite`` and a capture per anomaly; a step that has not ended after ``hang_after_s`` (at least;
    ``hangwatch.py``) dumps the stacks and collectives there. Nothing here stops the script: a folder
    that cannot be written is said in one line and the loop runs unwatched.
    """
    script = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    signals.set_owner()
    watcher = open_watcher(out, name or Path(script).stem or "watch", script=script, step_on=step_on,
                           cooldown_s=cooldown_s, capture=capture, hang_after_s=hang_after_s)  # fmt: skip
    if watcher is not None:
        watcher.install()
        watcher.start_clock()  # the block is the loop: its first iteration starts here
    failed = True
    try:
        yield WatchHandle(watcher)
        failed = False
    finally:
        if watcher is not None:
            watcher.close(exit_status=1 if failed else 0)
            _say(watcher.why_no_step() or watcher.summary())
