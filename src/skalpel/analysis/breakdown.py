"""Step-time breakdown in the categories of the PyTorch Profiler TensorBoard plugin.

Every microsecond of a step goes to exactly one category, claimed in priority order
(the plugin's ``OverallParser``): time when any kernel runs is Kernel; of the rest,
time when a memcpy runs is Memcpy, then Memset, then Communication (collective kernels
and the host side of collectives), then Runtime (launch calls the device is not busy
behind), then DataLoader (``enumerate(DataLoader)#...__next__`` ranges: the wait for
the next batch), then CPU Exec (host ops), and what is left of the step is Other. So
the categories add up to the step. Steps come from :mod:`.steps`, which follows the
plugin's step boundaries; each category is averaged over the steps of a rank and
its share is of the average step time, as the plugin reports it.

We differ from the plugin on purpose for event types it predates (set
``BreakdownOptions(plugin_quirks=True)`` to reproduce it):

- ``gpu_user_annotation`` ranges are record_function ranges projected onto a GPU
  stream; the plugin files them with host annotations and so counts GPU time as
  CPU Exec. We leave them out: the kernels under them already claim that time.
- ``cuda_driver`` calls (``cuLaunchKernel`` for Triton kernels) are launch overhead
  exactly like ``cuda_runtime`` calls; the plugin ignores them, we count them as Runtime.
- Communication: collective kernels are found by name (NCCL, RCCL, ...) and host-side
  collectives by every ``nccl:``/``gloo:``/``c10d::`` name, where the plugin matches
  only five ``nccl:``/``gloo:`` op names and the kernels launched under them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import opnames
from ..trace.kinds import Kind
from ..trace.model import Trace, isin_few
from ..trace.roles import Role
from . import numeric
from .intervals import union
from .steps import Step, StepSegmentation

CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
"""In the plugin's priority order; ``other`` is what no event claims."""

_DEVICE_CATEGORIES = ("kernel", "memcpy", "memset", "runtime")  # the plugin shows these only with GPU activity


@dataclass(frozen=True)
class BreakdownOptions:
    """How to split step time: as our definitions say, or with the TensorBoard plugin's quirks."""

    plugin_quirks: bool = False  # reproduce the plugin on modern traces too (see the module docstring)


@dataclass(frozen=True)
class RankBreakdown:
    """One rank's steps split into categories. Dicts list only the categories shown for this rank."""

    rank: int
    step_numbers: tuple[int, ...]
    step_ms: tuple[float, ...]  # duration of each step
    per_step_ms: dict[str, tuple[float, ...]]  # category -> ms in each step
    ms_per_step: dict[str, float]  # category -> mean ms per step
    pct: dict[str, float]  # category -> share of the mean step time, adds up to 100
    has_device: bool  # kernels, copies or launch calls seen: the device categories are shown

    @property
    def avg_step_ms(self) -> float:
        return float(np.mean(self.step_ms)) if self.step_ms else 0.0

    @property
    def median_step_ms(self) -> float:
        """The step time findings quote: the same statistic as the report's footer and HTML."""
        return numeric.median(self.step_ms) if self.step_ms else 0.0

    @property
    def data_wait_ms_per_step(self) -> float:
        """Time per step spent waiting for the next batch and not hidden behind device work."""
        return self.ms_per_step["dataloader"]

    @property
    def data_wait_pct(self) -> float:
        return self.pct["dataloader"]


@dataclass(frozen=True)
class StepBreakdown:
    """The step-time breakdown of every rank that has steps."""

    ranks: tuple[RankBreakdown, ...]

    def for_rank(self, rank: int) -> RankBreakdown | None:
        return next((item for item in self.ranks if item.rank == rank), None)


def step_breakdown(trace: Trace, steps: StepSegmentation, options: BreakdownOptions | None = None) -> StepBreakdown:
    """Split each rank's steps into the plugin's categories."""
    options = options or BreakdownOptions()
    roles = _role_of_events(trace, options)
    ranks = [_rank_breakdown(trace, roles, rank, steps.for_rank(rank)) for rank in trace.rank_ids]
    return StepBreakdown(tuple(item for item in ranks if item is not None))


def _role_of_events(trace: Trace, options: BreakdownOptions) -> np.ndarray:
    """The category index (into CATEGORIES) each event claims, or -1 for events that claim nothing."""
    kind_role = np.full(256, -1, dtype=np.int8)
    table = {
        Kind.KERNEL: "kernel",
        Kind.MEMCPY: "memcpy",
        Kind.MEMSET: "memset",
        Kind.COMM_KERNEL: "communication",
        Kind.COMM_OP: "communication",
        Kind.RUNTIME: "runtime",
        Kind.DRIVER: "runtime",
        Kind.DATALOADER: "dataloader",
        Kind.CPU_OP: "cpu_exec",
        Kind.USER_ANNOTATION: "cpu_exec",
    }
    if options.plugin_quirks:
        table.update({Kind.DRIVER: None, Kind.GPU_ANNOTATION: "cpu_exec"})
    for kind, category in table.items():
        kind_role[int(kind)] = CATEGORIES.index(category) if category else -1
    roles = kind_role[trace.kind.astype(np.intp)]
    _refine_by_name(trace, roles, options)
    return roles


def _refine_by_name(trace: Trace, roles: np.ndarray, options: BreakdownOptions) -> None:
    """Apply the plugin's name rules to host ranges: which count as DataLoader, which as Communication."""
    host = np.flatnonzero(isin_few(trace.kind, [Kind.DATALOADER, Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.COMM_OP]))
    loader = trace.role[host] == Role.DATA_WAIT  # the plugin's: an iterator's __next__, or a DataPipe iteration
    new_role = roles[host].copy()
    new_role[loader] = CATEGORIES.index("dataloader")
    new_role[(~loader) & (trace.kind[host] == Kind.DATALOADER)] = CATEGORIES.index("cpu_exec")
    if options.plugin_quirks:
        comm = numeric.isin(trace.name[host], opnames.ids_of(trace, opnames.PLUGIN_COMM_OPS))
        new_role[trace.kind[host] == Kind.COMM_OP] = CATEGORIES.index("cpu_exec")
        new_role[comm] = CATEGORIES.index("communication")
    roles[host] = new_role


def _rank_breakdown(trace: Trace, roles: np.ndarray, rank: int, steps: list[Step]) -> RankBreakdown | None:
    if not steps:
        return None
    selected = np.flatnonzero((trace.rank == rank) & (roles >= 0) & (trace.dur > 0))
    starts = trace.ts[selected]
    ends = starts + trace.dur[selected]
    event_roles = roles[selected]
    present = np.bincount(event_roles, minlength=len(CATEGORIES)) > 0
    step_start = np.array([step.start_us for step in steps])
    step_end = np.array([step.end_us for step in steps])
    per_step_us = _claim(starts, ends, event_roles, step_start, step_end)
    shown = _shown_categories(present)
    step_us = step_end - step_start
    mean_total = float(step_us.mean())
    mean_us = per_step_us.mean(axis=0)
    return RankBreakdown(
        rank=rank,
        step_numbers=tuple(step.number for step in steps),
        step_ms=tuple(float(v) / 1000.0 for v in step_us),
        per_step_ms={CATEGORIES[c]: tuple(float(v) / 1000.0 for v in per_step_us[:, c]) for c in shown},
        ms_per_step={CATEGORIES[c]: float(mean_us[c]) / 1000.0 for c in shown},
        pct={CATEGORIES[c]: (100.0 * float(mean_us[c]) / mean_total if mean_total > 0 else 0.0) for c in shown},
        has_device=bool(present[[CATEGORIES.index(c) for c in _DEVICE_CATEGORIES]].any()),
    )


def _shown_categories(present: np.ndarray) -> list[int]:
    """The plugin shows device categories only when the trace has device activity, Communication only when used."""
    has_device = present[[CATEGORIES.index(c) for c in _DEVICE_CATEGORIES]].any()
    shown = []
    for index, category in enumerate(CATEGORIES):
        if category in _DEVICE_CATEGORIES and not has_device:
            continue
        if category == "communication" and not present[index]:
            continue
        shown.append(index)
    return shown


def _claim(
    starts: np.ndarray, ends: np.ndarray, roles: np.ndarray, step_start: np.ndarray, step_end: np.ndarray
) -> np.ndarray:
    """Microseconds each category claims in each step, shape (steps, categories).

    The timeline is cut at every boundary of every category's merged ranges and of the
    steps; each elementary segment goes to the first category that covers it (``other``
    when none does) and to the step that contains it. Steps must not overlap. Coverage
    is a running sum of +1 at each range start and -1 at its end: no search per segment.
    """
    other = CATEGORIES.index("other")
    merged = [union(starts[roles == c], ends[roles == c]) for c in range(other)]
    pieces = [step_start, step_end] + [part for pair in merged for part in pair]
    points, position = _unique_inverse(np.concatenate(pieces))
    bounds = np.cumsum([0] + [len(piece) for piece in pieces])
    slices = [position[bounds[i] : bounds[i + 1]] for i in range(len(pieces))]
    seg_len = np.diff(points)
    category = np.full(len(seg_len), other, dtype=np.int64)
    for index in range(other - 1, -1, -1):  # lowest priority first, so higher priorities overwrite
        category[_running_sum(slices[2 + 2 * index], slices[3 + 2 * index], len(points)) > 0] = index
    # Label each segment with its step number + 1 (0 outside every step); touching steps add up right.
    labels = np.arange(1, len(step_start) + 1, dtype=np.float64)
    step = np.rint(_running_sum(slices[0], slices[1], len(points), labels)).astype(np.int64) - 1
    inside = step >= 0
    cells = step[inside] * len(CATEGORIES) + category[inside]
    sums = np.bincount(cells, weights=seg_len[inside], minlength=len(step_start) * len(CATEGORIES))
    return sums.reshape(len(step_start), len(CATEGORIES))


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for values without NaN, by a stable sort: the values are
    a few sorted runs (the merged ranges), which it merges instead of sorting them anew."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.empty(len(values), dtype=bool)
    first[:1] = True
    first[1:] = ordered[1:] != ordered[:-1]
    inverse = np.empty(len(values), dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _running_sum(
    opens: np.ndarray, closes: np.ndarray, points: int, values: np.ndarray | None = None
) -> np.ndarray:
    """Per elementary segment (between consecutive points), the sum of the values of the ranges covering it."""
    delta = np.bincount(opens, weights=values, minlength=points) - np.bincount(closes, weights=values, minlength=points)
    return np.cumsum(delta)[:-1]
