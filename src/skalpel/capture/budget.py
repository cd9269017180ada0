"""A memory budget for the recording: a step of millions of ops must not take the machine down.

torch.profiler keeps every event of the window in memory until it stops. An LSTM stepped
by LBFGS (20 forward and backward passes over 1,000 time steps in one optimizer step)
records millions of ops per step; with stacks on, its profiler grew to 24 GB in three
steps and the kernel killed the process, losing everything. A thread of ours watches the
memory the process holds (malloc's bytes in use, ``in_use_bytes``: not what glibc keeps after
a free) while the profiler runs; when it has grown by more than the budget over the warm-up's
high-water mark (the steps' own tensors at their peak, which a step allocating 1 GB reaches
without the profiler holding anything), it asks the step detector to end the recording at its next
hook on the script's thread (an optimizer's zero_grad, a backward, a DataLoader fetch: the
places where skalpel may drive the profiler), which writes what was recorded and lets the
script run on.

The budget is on what recording takes, but stopping costs far more: the profiler then
turns its buffers into results, 12-17x the growth while recording with stacks (7.6x
without; torch 2.13, an unrolled LSTM: 247 MiB recorded, 2,952 MiB after a bare ``stop()``;
313 MiB recorded, 5,452 MiB at the peak of ``skalpel run``'s stop and export).
So recording may take ``1/STOP_FACTOR`` of half the memory available when it began
(``$SKALPEL_RECORD_BUDGET_MB`` to choose), and once the trace is written the results are
released (``release_results``) before the analysis loads it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import threading
from dataclasses import dataclass
from typing import Callable

from .. import env
from ..trace.source import available_memory
from .bounded import PartialStep
from .quiet import off_the_python_tracer
from .settings import CaptureSettings

ENV_BUDGET = env.RECORD_BUDGET_MB.name
AVAILABLE_SHARE = 0.5  # of the memory available when recording began: for the profiler's stop, at its peak
STOP_FACTOR = 20  # the peak of stop() and the export, against the growth while recording (12-17x measured)
MIN_BUDGET_BYTES = 64 * 2**20
POLL_S = 0.25
RECENT_POLLS = 3  # the growth charged is the least of the last polls (0.75 s): a step's transient peak passes
MANY_OPS_PER_STEP = 20_000  # fewer host ops than this per step cannot make the profiler's events weigh much
# A step the budget trips inside may run on to its end, to be kept whole, while the growth stays under this many
# budgets: stopping then peaks at up to 1.5 x 17/40 of the memory available at the start (64%: the worst factor seen).
FINISH_CEILING = 1.5
# What a window whose first recorded step cannot be recorded whole drops, all at once (one window left out, not one per
# setting): which of them weighs most depends on the step (an LSTM stepped by LBFGS, torch 2.13, per step: 85 MiB with
# all three, 82 without memory, 81 without stacks, 35 without any; Python-heavy steps: stacks are most of it).
LIGHTER = (("profile_memory", "memory profiling"), ("with_stack", "Python stacks"), ("record_shapes", "input shapes"))
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class OverBudget:
    """The recording grew the process by ``grown`` bytes against a budget of ``budget`` bytes."""

    grown: int
    budget: int
    source: str  # how the budget was chosen, in words

    def dropped_note(self, dropped: list[str], step: int) -> str:
        """The window's first recorded step (the script's step ``step``) passed ``FINISH_CEILING`` budgets before
        its end: the window starts again after it without ``dropped``."""
        what = words(dropped)
        return (
            f"{what} dropped from step {step + 1} on: the profiler's records grew the memory in use by "
            f"{self.grown / 2**20:,.0f} MiB inside the window's first recorded step, step {step}, before it ended "
            f"(budget {self.budget / 2**20:,.0f} MiB, {self.source}; a step may run to its end up to "
            f"{FINISH_CEILING:g}x the budget): one step with them does not fit. torch.profiler fixes what it records "
            f"when a window starts, so the window was left out and recorded again after that step without {what}"
        )

    def kept_note(self, recorded_steps: int, active: int, *, stacks: bool = True) -> str:
        """The recording ended at a step's end (the budget was passed there, or the next step would pass
        ``FINISH_CEILING`` budgets), with ``recorded_steps`` whole steps of the ``active`` asked for; ``stacks``: they
        were recorded (else leaving them out is no advice)."""
        no_stack = "leave out Python stacks (--no-stack), " if stacks else ""
        advice = (f"raise the budget (${ENV_BUDGET}=MiB) if the machine has the memory, {no_stack}or mark a smaller "
                  "unit of work as the step (skalpel.step())")  # fmt: skip
        if recorded_steps <= 1:
            return (
                f"recording stopped early, after one step: the window's first recorded step grew the profiler's "
                f"records by {self.grown / 2**20:,.0f} MiB (budget {self.budget / 2**20:,.0f} MiB, {self.source}; up "
                f"to {FINISH_CEILING:g}x it while a step runs to its end), so the budget cannot hold the {active} "
                f"steps asked for. That step ran to its end: it is kept whole and analysed. For more steps: {advice}"
            )
        return (
            f"recording stopped early, at the end of a step: the profiler's records grew the memory in use by "
            f"{self.grown / 2**20:,.0f} MiB (budget {self.budget / 2**20:,.0f} MiB, {self.source}); the trace holds "
            f"{recorded_steps} whole recorded steps of the {active} asked for. For more: {advice}"
        )

    def gave_up_note(self, script: str, dropped: list[str]) -> str:
        """Even the lightest window's first recorded step passed ``FINISH_CEILING`` budgets: no whole step fits."""
        without = f" even without {words(dropped)}" if dropped else ""
        return (
            f"no step was recorded: one step of {script} is too large for the memory budget. The profiler's records "
            f"grew the memory in use by {self.grown / 2**20:,.0f} MiB inside one step{without}, past "
            f"{FINISH_CEILING:g}x the budget ({self.budget / 2**20:,.0f} MiB, {self.source}), before the step ended. "
            f"Raise the budget (${ENV_BUDGET}=MiB) if the machine has the memory, or mark a smaller unit of work as "
            "the step (skalpel.step())"
        )

    def note(self, recorded_steps: int, *, cut: bool = True, partial: PartialStep | None = None,
             stacks: bool = True) -> str:  # fmt: skip
        """``cut``: stopped inside a step (``skalpel run``'s hooks), not at a step's end (``run.step()``);
        ``partial``: that step, left out of the trace, with the ops recorded (None: not known); ``stacks``: they were
        recorded (else leaving them out is no advice)."""
        no_stack = "leave out Python stacks (--no-stack), " if stacks else ""
        held = f"the trace holds {recorded_steps} whole recorded step(s)"
        if cut:
            held += ("; the step cut where the recording stopped is left out of it (a partial step is no step)"
                     if partial is not None else " and the one cut where the recording stopped")  # fmt: skip
        ops_per_step = partial.ops / max(partial.steps, 1) if partial is not None else None
        if ops_per_step is not None and ops_per_step < MANY_OPS_PER_STEP:
            return (
                f"recording stopped early: the profiler's records grew the memory in use by "
                f"{self.grown / 2**20:,.0f} MiB (budget {self.budget / 2**20:,.0f} MiB, {self.source}; the steps' own "
                f"tensors at their warm-up peak are not counted); {held}. The steps run few ops ({ops_per_step:,.0f} "
                "recorded per step), so what grew is what the profiler keeps of each (its memory events and Python "
                f"stacks): raise the budget (${ENV_BUDGET}=MiB) if the machine has the memory, {no_stack}"
                "or mark a smaller unit of work as the step (skalpel.step())"
            )
        many = f" ({ops_per_step:,.0f} recorded per step)" if ops_per_step is not None else ""
        return (
            f"recording stopped early: the profiler's events grew the memory in use by {self.grown / 2**20:,.0f} MiB "
            f"(budget {self.budget / 2**20:,.0f} MiB, {self.source}); {held}. Each step runs a very large number of "
            f"ops{many}: "
            + ("record fewer steps (--active), " if recorded_steps else "")
            + no_stack + "or mark a smaller unit of work as the step (skalpel.step())"
        )


def lightest(settings: CaptureSettings) -> tuple[CaptureSettings, list[str]] | None:
    """``settings`` without any of ``LIGHTER``, and the names of those it had; None when it had none."""
    dropped = [(field, name) for field, name in LIGHTER if getattr(settings, field)]
    if not dropped:
        return None
    return dataclasses.replace(settings, **{field: False for field, _ in dropped}), [name for _, name in dropped]


def words(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def resident_bytes() -> int | None:
    """This process's resident memory (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        function = ctypes.CDLL("libc.so.6").mallinfo2  # glibc 2.33+
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (glibc's ``mallinfo2``: heap in use plus mmapped blocks),
    else the resident memory; None where neither can be read.

    Memory the process freed but glibc keeps for reuse (its heap below a raised mmap threshold)
    is resident yet held by nothing: after a step that frees a large tensor, the resident size
    stays up while this falls back.
    """
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        return int(info.uordblks) + int(info.hblkhd)
    return resident_bytes()


def budget_bytes() -> tuple[int, str] | None:
    """The growth allowed while recording, and how it was chosen; None when it cannot be known."""
    chosen = env.number(env.RECORD_BUDGET_MB)
    if chosen is not None and not math.isnan(chosen):  # "nan" reads as a number, but is no budget
        return max(int(chosen * 2**20), 1), f"${ENV_BUDGET}"
    available = available_memory()
    if available is None:
        return None
    allowed = max(int(available * AVAILABLE_SHARE / STOP_FACTOR), MIN_BUDGET_BYTES)
    return allowed, f"1/{int(STOP_FACTOR / AVAILABLE_SHARE)} of the memory available: stopping the profiler takes up to 17x what it recorded"


def release_results(prof: object) -> None:
    """Drop a stopped profiler's results once its trace is written, and give the memory back to the system.

    They are the largest thing in the process after a big recording; the analysis that follows
    reads the trace file, never them. glibc keeps freed memory unless asked (``malloc_trim``).
    """
    inner = getattr(prof, "profiler", None)
    if inner is None or getattr(inner, "kineto_results", None) is None:
        return
    inner.kineto_results = None
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the memory is reused by the process, not returned


class RecordingBudget:
    """Polls resident memory from the profiler's start (``profiling()``) and calls ``over(OverBudget)`` once,
    from its own thread, when the growth passes the budget while the window records (``recording()``):
    never during the warm-up, which would leave nothing recorded. With ``past_ceiling``, it watches on and calls that
    once when the growth passes ``FINISH_CEILING`` budgets (the step under way may not run on to its end)."""

    def __init__(self, profiling: Callable[[], bool], recording: Callable[[], bool],
                 over: Callable[[OverBudget], None],
                 past_ceiling: Callable[[OverBudget], None] | None = None) -> None:  # fmt: skip
        self.profiling = profiling
        self.recording = recording
        self.over = over
        self.past_ceiling = past_ceiling
        self.tripped: OverBudget | None = None
        self.hard: OverBudget | None = None  # past the ceiling
        self._base: int | None = None  # the memory in use the growth is charged from (the warm-up's high-water mark)
        self._limit: tuple[int, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="skalpel-record-budget", daemon=True)

    def start(self) -> None:
        if resident_bytes() is not None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def next_step_past_ceiling(self, whole_steps: int) -> OverBudget | None:
        """At the end of the recording's ``whole_steps``-th step: what grew, when one more step like these would pass
        ``FINISH_CEILING`` budgets (the recording ends here, its steps whole, rather than inside the next); else None.
        """
        base, limit, now = self._base, self._limit, in_use_bytes()
        if base is None or limit is None or now is None or whole_steps < 1:
            return None
        grown = now - base
        if grown + grown / whole_steps <= limit[0] * FINISH_CEILING:
            return None
        return OverBudget(grown, limit[0], limit[1])

    def _watch(self) -> None:
        start: int | None = None
        budget: tuple[int, str] | None = None
        recent: list[int] = []
        while not self._stop.wait(POLL_S):
            off_the_python_tracer()
            if not self.profiling():
                if start is not None:
                    return  # one profiler per run: it stopped within the budget
                continue
            now = in_use_bytes()
            if now is None:
                return
            if start is None:
                start, budget = now, budget_bytes()
                if budget is None:
                    return
                self._base, self._limit = start, budget
                continue
            if not self.recording():
                # the warm-up runs the steps as the window will, but keeps no event: its high-water mark is what
                # the steps themselves hold at their peak (their tensors), which the recording is not charged for.
                # Kept on self at once: a recorded step shorter than a poll ends before the next poll, and its end
                # (``next_step_past_ceiling``) must still weigh it against the warm-up's mark
                start = max(start, now)
                self._base = start
                continue
            recent = (recent + [now])[-RECENT_POLLS:]
            held = min(recent)  # what the profiler holds only grows: a step's passing peak is not it
            if budget is None or len(recent) < RECENT_POLLS:
                continue
            grown = held - start
            if self.past_ceiling is not None and grown > budget[0] * FINISH_CEILING:
                # the stop request goes first: a boundary in between must not read ``tripped`` alone and keep the step
                self.hard = OverBudget(grown, budget[0], budget[1])
                self.past_ceiling(self.hard)
                if self.tripped is None:
                    self.tripped = self.hard
                    self.over(self.tripped)
                return
            if self.tripped is None and grown > budget[0]:
                self.tripped = OverBudget(grown, budget[0], budget[1])
                self.over(self.tripped)
                if self.past_ceiling is None:
                    return
