"""Step segmentation: where each training step starts and ends, per rank.

Steps follow the PyTorch Profiler TensorBoard plugin (``StepParser`` in its
``event_parser.py``), so that step times and the step-time breakdown can be checked
against it:

- a step is a ``ProfilerStep#N`` range on the host, extended to the end of the device
  work launched by the runtime calls that lie wholly inside that range: a step is not
  over until its kernels are;
- a step starts no earlier than the (extended) end of the step before it, so steps
  tile the timeline without overlapping; the first step starts no earlier than the end
  of earlier device work that finishes before the step's own first kernel;
- trailing steps that launched no device work, or clearly less than the step before
  them (< 80% of its device events), are dropped: the profiler stopped before their
  kernels were recorded (``StepSegmentation.dropped_tail`` counts them).

A marked step with no host op in it, or far shorter than the others (under a tenth of
the rank's median step, with under half its ops), is a measurement defect (a boundary marked twice in one
iteration), not a step: it is left out of every analysis and counted in
``StepSegmentation.defective`` so that the report says so.

A step far longer than the others that also holds far more ops (three times the median
step, half as many ops again) is not an iteration like them: an epoch boundary (a test
pass, a DataLoader started again), an evaluation or a checkpoint inside the loop. It is
left out of the steps and every per-step figure (median, spread, breakdown), kept in
``StepSegmentation.unequal`` with what it holds, so that the report names it and says
its cost once. The first step of a rank is one only with three times the median's ops: a slow first step
running the same ops (and some lazy initialisation) is warm-up, for ``no_warmup`` to judge, while one with far
more work is not (an RL rollout recorded before its update). Extra work with no more backward ops than a step
(forward only: a rollout, an evaluation) is named so. Nor is a step that compiles (torch.compile's own ranges inside):
``recompilation`` and ``compile_overhead`` judge it. A step as long but with the same ops
(a preempted one) stays. A partial batch (a DataLoader's smaller last batch) is unequal too: a
step with a quarter or more of its ops on input shapes no other step ran (``record_shapes``),
unless a third of the steps or more are such (inputs of varying length are how that loop is).

Without step markers (the legacy autograd profiler, an inference trace, a hand-made
capture) the whole trace of a rank is one step, from the first to the last host op,
extended to the device work launched inside it; ``StepSegmentation.marked`` is False
so that reports can say so.

We differ from the plugin on purpose in two places: ``cuda_driver`` calls
(``cuLaunchKernel``, used by Triton kernels in modern traces) launch device work just
like ``cuda_runtime`` calls, which the plugin predates; and a rank without markers in a
trace whose other ranks have them still gets its pseudo-step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..trace import opnames
from ..trace.kinds import HOST_OP_KINDS, LAUNCH_KINDS, Kind, kind_array, step_number
from ..trace.model import Trace, isin_few
from ..trace.roles import CLOSING_RANGE, COMPILE_TOP, Role
from . import numeric
from .timeline import device_mask

_DEFECT_RATIO = 0.1  # a step under a tenth of the median step is a marking defect, not a step
_UNEQUAL_RATIO = 3.0  # a step three times the median step ...
_UNEQUAL_OPS = 1.5  # ... with half as many ops again holds other work than an iteration
_FIRST_UNEQUAL_OPS = 3.0  # the first step: warm-up adds some ops (optimizer state, lazy modules), not 3x
_UNEQUAL_MIN_STEPS = 4  # with fewer steps there is no "the others" to compare with
_PARTIAL_SHAPES = 0.25  # a step with this share of its ops on shapes no other step ran is a partial batch
_TAIL_RATIO = 0.8  # the plugin drops a last step with fewer than 80% of the previous step's device events
_LAUNCH = kind_array(LAUNCH_KINDS)
_OPS = kind_array(HOST_OP_KINDS | LAUNCH_KINDS)  # what a real step holds
_HOST_SPAN = kind_array(HOST_OP_KINDS | {Kind.STEP})


@dataclass(frozen=True)
class Step:
    """One step of one rank: its number and where it starts and ends."""

    rank: int
    number: int  # N of ProfilerStep#N; 0 for the whole-trace pseudo-step
    start_us: float  # host start, moved to the end of the previous step when its device work ran later
    host_end_us: float  # end of the ProfilerStep range on the host
    end_us: float  # extended to the end of the device work launched within the step
    host_start_us: float | None = None  # start of the ProfilerStep range on the host (None: same as start_us)
    ops: int = -1  # host ops and launch calls inside the host range (-1: not counted)

    @property
    def host_begin_us(self) -> float:
        """Where the ProfilerStep range starts on the host (``start_us`` may have moved on to the device's end)."""
        return self.start_us if self.host_start_us is None else self.host_start_us

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def duration_ms(self) -> float:
        return self.duration_us / 1000.0


@dataclass(frozen=True)
class UnequalStep:
    """A step that holds other work than one iteration (more of it, or a partial batch), left out of the steps:
    what it holds against the others."""

    step: Step
    median_ms: float  # the rank's median (kept) step
    ops: int  # host ops inside
    median_ops: float
    fetches: int  # DataLoader batches fetched inside
    median_fetches: float
    novel_shapes: float = 0.0  # the share of its ops on input shapes no other step ran (a partial batch)
    backward_ops: int = 0  # backward nodes run inside (autograd::engine::evaluate_function)
    median_backward_ops: float = 0.0

    @property
    def extra_ms(self) -> float:
        return self.step.duration_ms - self.median_ms

    def describe(self) -> str:
        step = self.step
        held = f"{self.ops / max(self.median_ops, 1):.1f}x its ops"
        if self.novel_shapes > 0:
            held = f"{self.novel_shapes:.0%} of its ops on input shapes no other step ran"
            what = "a partial batch (a DataLoader's smaller last batch, or an input of another size)"
        elif self.fetches > self.median_fetches + 1:
            held += f", {self.fetches} DataLoader batches against {self.median_fetches:g}"
            what = "an epoch boundary or an evaluation pass over another DataLoader"
        elif 0 < self.median_backward_ops and self.backward_ops <= self.median_backward_ops:
            held += f" and no more backward work ({self.backward_ops} backward ops against {self.median_backward_ops:g})"
            what = ("forward work with no backward of its own: an RL rollout (the policy acting before its update, "
                    "under no_grad), or an evaluation pass")  # fmt: skip
        else:
            what = "work the other iterations do not do (an evaluation, a checkpoint, logging every N steps)"
        return (
            f"step #{step.number} (rank {step.rank}) took {step.duration_ms:.1f} ms, "
            f"{step.duration_ms / max(self.median_ms, 1e-9):.1f}x the median step ({self.median_ms:.1f} ms), with "
            f"{held}: {what}"
        )


@dataclass(frozen=True)
class StepSegmentation:
    """The steps of every rank and what was done to the markers."""

    steps: tuple[Step, ...]
    marked: bool  # False: no ProfilerStep markers, each rank's whole trace is one step
    dropped_tail: int = 0  # trailing steps dropped because their device work was not (fully) recorded
    notes: tuple[str, ...] = ()  # what was done to step markers that do not tile (overlaps, duplicates)
    defective: int = 0  # steps left out as measurement defects: no host op, or far shorter than the others
    unequal: tuple[UnequalStep, ...] = ()  # steps left out as holding other work (an epoch boundary, an evaluation)

    def for_rank(self, rank: int) -> list[Step]:
        return list(self._by_rank.get(rank, ()))

    @cached_property
    def _by_rank(self) -> dict[int, list[Step]]:  # a job's ranks each look up their own: not a scan per rank
        found: dict[int, list[Step]] = {}
        for step in self.steps:
            found.setdefault(step.rank, []).append(step)
        return found

    @property
    def durations_ms(self) -> np.ndarray:
        return np.array([step.duration_ms for step in self.steps], dtype=np.float64)


@dataclass(frozen=True)
class _DeviceWork:
    """Device events of one rank with their launching call, sorted by launch start."""

    launch_start: np.ndarray
    launch_end: np.ndarray
    start: np.ndarray
    end: np.ndarray
    unlaunched_end: np.ndarray  # ends of device events without a known launcher


def segment_steps(trace: Trace) -> StepSegmentation:
    """Split every rank's timeline into steps."""
    step_events = np.flatnonzero(trace.kind == Kind.STEP)
    marked = len(step_events) > 0
    steps: list[Step] = []
    unequal: list[UnequalStep] = []
    dropped = defective = 0
    cut, overlapped, unnumbered = 0, 0, 0
    for rank in trace.rank_ids:
        on_rank = step_events[trace.rank[step_events] == rank]
        work = _device_work(trace, rank)
        if len(on_rank) == 0:
            start, end = _host_span(trace, rank)
            numbers, starts, host_ends = np.zeros(1, np.int64), np.array([start]), np.array([end])
            host_starts = starts
        else:
            # Longest first at equal starts, so that a range inside another is the one dropped.
            on_rank = on_rank[np.lexsort((-trace.dur[on_rank], trace.ts[on_rank]))]
            host_starts, host_ends = trace.ts[on_rank], trace.ts[on_rank] + trace.dur[on_rank]
            kept, starts = _tiling(host_starts, host_ends)
            cut += int((starts[kept] > host_starts[kept]).sum())
            overlapped += len(on_rank) - len(kept)
            on_rank, host_starts, host_ends, starts = on_rank[kept], host_starts[kept], host_ends[kept], starts[kept]
            host_ends = _before_closing(trace, rank, starts, host_ends)
            found = [step_number(trace.name_of(i)) for i in on_rank]
            unnumbered += found.count(None)
            numbers = np.array([number or 0 for number in found], dtype=np.int64)
        new_starts, ends, matched = _extend_to_device_work(starts, host_ends, work)
        keep = _kept_steps(matched) if len(on_rank) else 1
        dropped += len(starts) - keep
        durations = ends[:keep] - new_starts[:keep]
        inside = _ops_inside(trace, rank, starts[:keep], host_ends[:keep], _OPS)
        sound = _sound_steps(inside, durations) if len(on_rank) else [True]
        defective += keep - sum(sound)
        rank_steps = [
            Step(rank, int(numbers[i]), float(new_starts[i]), float(host_ends[i]), float(ends[i]), float(host_starts[i]),
                 int(inside[i]))
            for i in range(keep)
        ]
        apart = _unequal_steps(trace, rank, rank_steps, inside, sound) if len(on_rank) else {}
        unequal.extend(apart.values())
        steps.extend(step for i, step in enumerate(rank_steps) if sound[i] and i not in apart)
    notes = _marker_notes(cut, overlapped, unnumbered)
    return StepSegmentation(tuple(steps), marked=marked, dropped_tail=dropped, notes=notes, defective=defective,
                            unequal=tuple(unequal))  # fmt: skip


def _before_closing(trace: Trace, rank: int, starts: np.ndarray, host_ends: np.ndarray) -> np.ndarray:
    """Step ends moved back to where skalpel's own closing work began (``CLOSING_RANGE``): it runs in the last
    recorded step, before the profiler stops (reading /proc, the line samples into the header), and under load
    took 10 ms of a 0.5 ms step."""
    closing_id = opnames.id_of(trace, CLOSING_RANGE)
    if closing_id < 0:
        return host_ends
    closing = np.flatnonzero((trace.name == closing_id) & (trace.rank == rank) & (trace.kind == Kind.USER_ANNOTATION))
    if len(closing) == 0:
        return host_ends
    at = np.sort(trace.ts[closing])
    first = np.searchsorted(at, starts, side="left")  # the first closing range that begins in each step
    inside = first < len(at)
    inside[inside] &= at[first[inside]] < host_ends[inside]
    ends = host_ends.copy()
    ends[inside] = at[first[inside]]
    return ends


def first_step_holds_other_work(steps: list[Step] | tuple[Step, ...]) -> bool:
    """The first of these steps (in time order) holds far more ops than the others: other work than warm-up, which
    runs the step's own ops, slower (an RL rollout recorded before its update)."""
    ops = np.array([step.ops for step in steps], dtype=np.float64)
    return len(ops) >= 2 and ops.min() >= 0 and ops[0] >= _FIRST_UNEQUAL_OPS * numeric.median(ops[1:])


def _ops_inside(trace: Trace, rank: int, starts: np.ndarray, host_ends: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """How many events of ``kinds`` on ``rank`` start inside each step's host range."""
    ops = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, kinds))
    op_starts = np.sort(trace.ts[ops], kind="stable")  # nearly in time order already: the stable sort finds the runs
    return np.searchsorted(op_starts, host_ends, side="left") - np.searchsorted(op_starts, starts, side="left")


def _sound_steps(inside: np.ndarray, durations: np.ndarray) -> list[bool]:
    """Which steps are real: some host op inside, and not far shorter than the median step."""
    sound = inside > 0
    if len(durations) >= 3 and sound.sum() >= 2:
        # far shorter and with far fewer ops: a boundary marked inside an iteration (on a busy machine a
        # preempted step is ten times longer than its neighbours, with the same ops, and both are real)
        short = durations < _DEFECT_RATIO * numeric.median(durations[sound])
        sound &= ~(short & (inside < 0.5 * numeric.median(inside[sound])))
    return [bool(value) for value in sound]


def _unequal_steps(trace: Trace, rank: int, steps: list[Step], inside: np.ndarray,
                   sound: list[bool]) -> dict[int, UnequalStep]:  # fmt: skip
    """Steps (by index) far longer than the median, with far more ops: other work than one iteration."""
    kept = [i for i, ok in enumerate(sound) if ok]
    if len(kept) < _UNEQUAL_MIN_STEPS:
        return {}
    durations = np.array([steps[i].duration_ms for i in kept])
    ops = inside[kept].astype(np.float64)
    median_ms, median_ops = numeric.median(durations), numeric.median(ops)
    long = [
        kept[j] for j in range(len(kept))  # a first step with about the same ops is warm-up's to judge (no_warmup)
        if durations[j] >= _UNEQUAL_RATIO * median_ms
        and ops[j] >= (_UNEQUAL_OPS if j else _FIRST_UNEQUAL_OPS) * median_ops
    ]  # fmt: skip
    starts = np.array([step.host_begin_us for step in steps])
    ends = np.array([step.host_end_us for step in steps])
    novel = _novel_shapes(trace, rank, starts, ends, kept)
    partial = [i for i in kept[1:] if i not in long and novel[i] >= _PARTIAL_SHAPES]
    long = [] if 3 * len(long) >= len(kept) else long  # a third of the steps or more: that is how the loop's steps are
    partial = [] if 3 * len(partial) >= len(kept) else partial  # every batch of its own size (variable lengths)
    if not long and not partial:
        return {}
    compiling = _compiles_inside(trace, rank, starts, ends)  # a recompile (for a new shape too) is its rules' to judge
    apart = sorted(i for i in long + partial if not compiling[i])
    if not apart:
        return {}
    fetches = _ops_inside(trace, rank, starts, ends, np.array([int(Kind.DATALOADER)], dtype=np.int8))
    others = [i for i in kept if i not in apart]
    median_ms = numeric.median(np.array([steps[i].duration_ms for i in others]))
    median_ops = numeric.median(inside[others].astype(np.float64))
    median_fetches = numeric.median(fetches[others].astype(np.float64))
    backward = _role_inside(trace, rank, starts, ends, Role.BACKWARD_NODE)
    median_backward = numeric.median(backward[others].astype(np.float64))
    return {
        int(i): UnequalStep(steps[i], float(median_ms), int(inside[i]), float(median_ops), int(fetches[i]),
                            float(median_fetches), float(novel[i]) if i in partial else 0.0,
                            int(backward[i]), float(median_backward))  # fmt: skip
        for i in apart
    }


def _role_inside(trace: Trace, rank: int, starts: np.ndarray, ends: np.ndarray, role: Role) -> np.ndarray:
    """How many host ops of ``role`` start inside each step's host range."""
    ops = np.flatnonzero((trace.rank == rank) & (trace.kind == Kind.CPU_OP) & (trace.role == role))
    at = np.sort(trace.ts[ops])
    return np.searchsorted(at, ends, side="left") - np.searchsorted(at, starts, side="left")


def _novel_shapes(trace: Trace, rank: int, starts: np.ndarray, ends: np.ndarray, kept: list[int]) -> np.ndarray:
    """For each step, the share of its ops (with recorded shapes) whose input shapes no other kept step ran."""
    ops = np.flatnonzero((trace.rank == rank) & isin_few(trace.kind, _OPS))
    ops = ops[np.argsort(trace.ts[ops], kind="stable")]
    ops = ops[trace.shapes[ops] >= 0]
    at = trace.ts[ops]
    per_step = {i: trace.shapes[ops[np.searchsorted(at, starts[i]):np.searchsorted(at, ends[i])]] for i in kept}
    steps_running = np.bincount(np.concatenate([numeric.unique(shapes) for shapes in per_step.values()]
                                               + [np.zeros(0, dtype=np.int64)]).astype(np.int64))  # fmt: skip
    once = steps_running == 1  # by shape id: shapes only one step ran
    shares = np.zeros(len(starts))
    for i, shapes in per_step.items():
        if len(shapes):
            shares[i] = float(once[shapes].mean())
    return shares


def _compiles_inside(trace: Trace, rank: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which steps hold a torch.compile compilation (its ``dynamo`` / ``entire_frame_compile`` range)."""
    names = [i for i in (opnames.id_of(trace, name) for name in COMPILE_TOP) if i >= 0]
    found = np.flatnonzero((trace.rank == rank) & isin_few(trace.name, names)) if names else []
    if len(found) == 0:
        return np.zeros(len(starts), dtype=bool)
    at = np.sort(trace.ts[found])
    return (np.searchsorted(at, ends, side="left") - np.searchsorted(at, starts, side="left")) > 0


def _tiling(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which step ranges (sorted by start) to keep, and their starts, so that kept ranges never overlap.

    A range starting before the previous kept one ends starts at that end instead; one that
    ends there or before (a duplicate, a range with the same start, one inside another) is dropped.
    """
    previous_end = np.maximum.accumulate(ends)
    bound = np.concatenate([[-np.inf], previous_end[:-1]])  # the furthest end of any range before
    new_starts = np.maximum(starts, bound)
    kept = np.flatnonzero((ends > new_starts) | ((ends == starts) & (starts >= bound)))
    return kept, new_starts


def _marker_notes(cut: int, dropped: int, unnumbered: int) -> tuple[str, ...]:
    notes = []
    if unnumbered:
        notes.append(f"{unnumbered} ProfilerStep marker(s) without a readable step number (numbered 0)")
    if dropped:
        notes.append(
            f"{dropped} ProfilerStep range(s) left out: they repeat or lie inside the step before them "
            "(a duplicate marker or a damaged trace)"
        )
    if cut:
        notes.append(f"{cut} ProfilerStep range(s) began before the step before them ended: cut to start at its end")
    return tuple(notes)


def _host_span(trace: Trace, rank: int) -> tuple[float, float]:
    """First start and last end of the host ops of a rank (of any event when it has none)."""
    on_rank = (trace.rank == rank) & isin_few(trace.kind, _HOST_SPAN)
    if not on_rank.any():
        on_rank = (trace.rank == rank) & (trace.kind != Kind.PYTHON)
    if not on_rank.any():
        on_rank = trace.rank == rank
    if not on_rank.any():
        return 0.0, 0.0
    return float(trace.ts[on_rank].min()), float((trace.ts[on_rank] + trace.dur[on_rank]).max())


def _device_work(trace: Trace, rank: int) -> _DeviceWork:
    device = np.flatnonzero(device_mask(trace) & (trace.rank == rank))
    launcher = trace.launcher[device]
    launched = launcher >= 0
    # A device event linked to something other than a launch call (a cuda_sync) has no launcher.
    launched[launched] = isin_few(trace.kind[launcher[launched]], _LAUNCH)
    events, calls = device[launched], launcher[launched]
    order = np.argsort(trace.ts[calls], kind="stable")
    events, calls = events[order], calls[order]
    return _DeviceWork(
        launch_start=trace.ts[calls],
        launch_end=trace.ts[calls] + trace.dur[calls],
        start=trace.ts[events],
        end=trace.ts[events] + trace.dur[events],
        unlaunched_end=trace.ts[device[~launched]] + trace.dur[device[~launched]],
    )


def _extend_to_device_work(
    starts: np.ndarray, host_ends: np.ndarray, work: _DeviceWork
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, number of device events matched) of each step, as the TensorBoard plugin computes them.

    A launch call belongs to the first step whose host range ends after the call starts,
    when the call lies wholly inside that range (the plugin's two-way merge).
    """
    count = len(starts)
    step = np.searchsorted(host_ends, work.launch_start, side="right")
    inside = step < count
    inside[inside] = (work.launch_start[inside] >= starts[step[inside]]) & (
        work.launch_end[inside] <= host_ends[step[inside]]
    )
    step = step[inside]
    matched = np.bincount(step, minlength=count)
    device_min = np.full(count, np.inf)
    device_max = np.full(count, -np.inf)
    np.minimum.at(device_min, step, work.start[inside])
    np.maximum.at(device_max, step, work.end[inside])
    if matched.sum() == 0:  # no step launched device work: host ranges as they are
        return starts.copy(), host_ends.copy(), matched
    previous_end = float(starts[0])
    if matched[0] > 0:
        # Device work not launched in any step that ends before step 0's first kernel delays step 0.
        other_ends = np.concatenate([work.end[~inside], work.unlaunched_end])
        earlier = other_ends[other_ends < device_min[0]]
        if len(earlier):
            previous_end = max(previous_end, float(earlier.max()))
    new_starts, ends = np.empty(count), np.empty(count)
    for i in range(count):  # one pass over the steps (not the events): each start depends on the previous end
        new_starts[i] = max(previous_end, starts[i])
        ends[i] = max(host_ends[i], device_max[i] if matched[i] else new_starts[i])
        ends[i] = max(ends[i], new_starts[i])
        previous_end = ends[i]
    return new_starts, ends, matched


def _kept_steps(matched: np.ndarray) -> int:
    """How many steps to keep: drop trailing steps whose device work the profiler did not record in full."""
    if len(matched) <= 1 or matched.sum() == 0:
        return len(matched)
    last = int(np.flatnonzero(matched > 0)[-1])
    keep = last + 1
    if last > 0 and matched[last - 1] * _TAIL_RATIO > matched[last]:
        keep = last
    return keep


def inferred_iterations(trace: Trace, rank: int, *, minimum: int = 3) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Loop iterations of an unmarked rank: (starts, ends, what they were inferred from), or None.

    An iteration starts at each DataLoader fetch (``enumerate(DataLoader)#...__next__``), or
    else right after each optimizer step (``Optimizer.step#...``); the last one ends with the
    rank's last event. Fewer than ``minimum`` fetches or steps: no loop to infer.
    """
    host = (trace.rank == rank) & isin_few(trace.kind, _HOST_SPAN)
    if not host.any():
        return None
    last = float(trace.end[(trace.rank == rank) & (trace.kind != Kind.PYTHON)].max())  # runtime calls and kernels too
    fetches = np.flatnonzero((trace.kind == Kind.DATALOADER) & (trace.rank == rank))
    if len(fetches) >= minimum:
        starts, source = np.sort(trace.ts[fetches]), "DataLoader fetches"
    else:
        annotations = np.flatnonzero(host & isin_few(trace.kind, [Kind.USER_ANNOTATION, Kind.CPU_OP]))
        steps = annotations[trace.role[annotations] == Role.OPTIMIZER_STEP]
        if len(steps) < minimum:
            return None
        starts, source = np.sort(trace.end[steps])[:-1], "optimizer steps"
        starts = np.concatenate([[float(trace.ts[host].min())], starts])
    ends = np.append(starts[1:], last)
    return starts, ends, source


def judged_units(trace: Trace, steps: StepSegmentation, rank: int) -> tuple[list[Step], str]:
    """The units a rank is judged over, by start, and what they are: its marked steps ("step"); without markers the
    loop's iterations ("iteration"), else the whole window ("window"). Every per-unit figure (the blame, the ledger,
    the rules) is taken over these."""
    rank_steps = sorted(steps.for_rank(rank), key=lambda step: step.start_us)
    if rank_steps and not steps.marked:
        return _iterations(trace, rank, rank_steps[0])
    return rank_steps, "step"


def _iterations(trace: Trace, rank: int, window: Step) -> tuple[list[Step], str]:
    """Without step markers: the loop's iterations inferred from DataLoader fetches or optimizer steps, inside the
    window (number 0: the time before the first iteration); the window itself when no loop is found."""
    loop = inferred_iterations(trace, rank)
    if loop is None:
        return [window], "window"
    starts, ends, _ = loop
    starts = np.clip(starts, window.start_us, window.end_us)
    ends = np.clip(np.append(starts[1:], window.end_us), window.start_us, window.end_us)  # they tile the window
    result = [Step(rank, 0, window.start_us, float(starts[0]), float(starts[0]))] if starts[0] > window.start_us else []
    result += [Step(rank, i + 1, float(start), float(end), float(end)) for i, (start, end) in enumerate(zip(starts, ends))
               if end > start]  # fmt: skip
    return result, "iteration"


def main_thread(trace: Trace, rank: int) -> int | None:
    """The thread that marks the steps, else the one with the most op time (the training loop's); in a capture of
    device activity only (no ops), the one with the most runtime-call time."""
    on_rank = trace.rank == rank
    marks = np.flatnonzero(on_rank & (trace.kind == Kind.STEP))
    if len(marks):
        return int(numeric.unique(trace.tid[marks])[0]) if len(numeric.unique(trace.tid[marks])) == 1 else int(
            trace.tid[marks[np.argmax(trace.dur[marks])]])  # fmt: skip
    ops = np.flatnonzero(on_rank & (trace.kind == Kind.CPU_OP))
    if len(ops) == 0:
        ops = np.flatnonzero(on_rank & isin_few(trace.kind, _LAUNCH))
    if len(ops) == 0:
        return None
    tids = numeric.unique(trace.tid[ops])
    time = [float(trace.dur[ops[trace.tid[ops] == tid]].sum()) for tid in tids]
    return int(tids[int(np.argmax(time))])
