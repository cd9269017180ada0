"""What changed between two runs: step time against the noise, per category, per op, findings.

``diff_reports(before, after)`` is pure: two Reports in, one frozen ``DiffResult`` out.
``skalpel.api.load_report(path)`` turns a run folder, trace file/folder or report.json
into the Report for each side.

The step-time change is the change of the median step. Whether it is real is judged
two ways: a bootstrap interval over each side's step times (step-to-step variance) and
the capture's own noise (``CaptureInfo.noise_pct``: the spread between repeated windows),
when the runs carry it. A change inside either is reported as noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SkalpelError
from .report import Finding, Report

DIFF_SCHEMA = "skalpel.diff/1"


@dataclass(frozen=True)
class DiffOptions:
    bootstrap_samples: int = 2000
    confidence: float = 0.95
    min_band_pct: float = 1.0  # a change smaller than this is never called real
    min_steps_for_interval: int = 3
    top_movers: int = 15
    disjoint_overlap: float = 0.3  # op-name overlap below this: probably different models
    seed: int = 0


@dataclass(frozen=True)
class StepChange:
    before_median_ms: float
    after_median_ms: float
    change_pct: float  # (after - before) / before
    before_steps: int
    after_steps: int
    ci_low_pct: float | None  # bootstrap interval of change_pct; None with too few steps
    ci_high_pct: float | None
    capture_noise_pct: float | None  # both sides' CaptureInfo.noise_pct combined
    noise_band_pct: float  # the change must exceed this (and the interval exclude 0) to count
    verdict: str  # slower | faster | within_noise
    noise_known: bool  # False: neither steps nor repeats enough to measure the noise


@dataclass(frozen=True)
class CategoryDelta:
    category: str
    before_pct: float
    after_pct: float
    delta_pct: float  # percentage points
    before_ms_per_step: float
    after_ms_per_step: float
    delta_ms_per_step: float


@dataclass(frozen=True)
class OpDelta:
    name: str
    before_ms_per_step: float | None  # None: not among that side's top ops
    after_ms_per_step: float | None
    delta_ms_per_step: float


@dataclass(frozen=True)
class FindingChange:
    id: str
    rank: int | None
    before: Finding | None
    after: Finding | None


@dataclass(frozen=True)
class DiffResult:
    before_label: str
    after_label: str
    before_device: str | None
    after_device: str | None
    mismatches: tuple[str, ...]  # reasons the two runs may not be comparable, shown first
    notes: tuple[str, ...]
    step: StepChange
    categories: tuple[CategoryDelta, ...]  # biggest movers first
    op_metric: str  # device_ms | self_ms
    ops: tuple[OpDelta, ...]
    kernels: tuple[OpDelta, ...]
    appeared: tuple[FindingChange, ...]
    disappeared: tuple[FindingChange, ...]
    persisting: tuple[FindingChange, ...]
    regions: tuple[OpDelta, ...] = ()  # torch.compile regions by the function they compile (host ms per step)
    schema: str = field(default=DIFF_SCHEMA)

    def slower_than(self, pct: float) -> bool:
        """For a CI gate: slower by more than ``pct`` percent, and outside the noise."""
        return self.step.verdict == "slower" and self.step.change_pct > pct


def diff_reports(before: Report, after: Report, options: DiffOptions | None = None, *,
                 labels: tuple[str, str] = ("before", "after")) -> DiffResult:  # fmt: skip
    options = options or DiffOptions()
    step = _step_change(before, after, options)
    metric = "device_ms" if before.has_device and after.has_device else "self_ms"
    mismatches, notes = _comparability(before, after, options)
    appeared, disappeared, persisting = _finding_changes(before, after)
    return DiffResult(
        before_label=labels[0],
        after_label=labels[1],
        before_device=before.source.device,
        after_device=after.source.device,
        mismatches=mismatches,
        notes=notes,
        step=step,
        categories=_category_deltas(before, after, step),
        op_metric=metric,
        ops=_row_deltas(_op_times(before, metric), _op_times(after, metric), options.top_movers),
        kernels=_row_deltas(_kernel_times(before), _kernel_times(after), options.top_movers),
        appeared=appeared,
        disappeared=disappeared,
        persisting=persisting,
        regions=_row_deltas(_region_times(before), _region_times(after), options.top_movers),
    )


def step_times_ms(report: Report) -> np.ndarray:
    """One time per step: the slowest rank's when every rank has the same steps, else all pooled."""
    per_rank = [np.asarray(rank.step_ms, dtype=float) for rank in report.ranks if rank.step_ms]
    if not per_rank:
        return np.asarray([report.steps.median_ms] if report.steps.count else [], dtype=float)
    if len({len(times) for times in per_rank}) == 1:
        return np.max(np.vstack(per_rank), axis=0)
    return np.concatenate(per_rank)


def _step_change(before: Report, after: Report, options: DiffOptions) -> StepChange:
    b, a = step_times_ms(before), step_times_ms(after)
    if not len(b) or not len(a) or float(np.median(b)) <= 0:
        raise SkalpelError("cannot compare: one side has no step time (empty trace?)")
    b_med, a_med = float(np.median(b)), float(np.median(a))
    change = (a_med - b_med) / b_med * 100
    low = high = None
    if min(len(b), len(a)) >= options.min_steps_for_interval:
        low, high = bootstrap_change_interval(b, a, options)
    noise = _combined_noise(before, after)
    band = max(options.min_band_pct, noise or 0.0)
    inside = abs(change) <= band or (low is not None and high is not None and low <= 0 <= high)
    verdict = "within_noise" if inside else ("slower" if change > 0 else "faster")
    return StepChange(
        before_median_ms=round(b_med, 4),
        after_median_ms=round(a_med, 4),
        change_pct=round(change, 3),
        before_steps=len(b),
        after_steps=len(a),
        ci_low_pct=None if low is None else round(low, 3),
        ci_high_pct=None if high is None else round(high, 3),
        capture_noise_pct=None if noise is None else round(noise, 3),
        noise_band_pct=round(band, 3),
        verdict=verdict,
        noise_known=low is not None or noise is not None,
    )


def bootstrap_change_interval(b: np.ndarray, a: np.ndarray, options: DiffOptions, *,
                              statistic=np.median) -> tuple[float, float]:  # fmt: skip
    """The ``options.confidence`` interval of the change (percent) of ``statistic`` from ``b`` to ``a``."""
    rng = np.random.default_rng(options.seed)
    n = options.bootstrap_samples
    b_stats = statistic(rng.choice(b, size=(n, len(b)), replace=True), axis=1)
    a_stats = statistic(rng.choice(a, size=(n, len(a)), replace=True), axis=1)
    changes = (a_stats - b_stats) / b_stats * 100
    tail = (1 - options.confidence) / 2 * 100
    return float(np.percentile(changes, tail)), float(np.percentile(changes, 100 - tail))


def _combined_noise(before: Report, after: Report) -> float | None:
    values = [r.capture.noise_pct for r in (before, after) if r.capture and r.capture.noise_pct is not None]
    return math.sqrt(sum(v * v for v in values)) if values else None


def _mean_breakdown(report: Report) -> dict[str, float]:
    ranks = [rank.step_breakdown_pct for rank in report.ranks if rank.step_breakdown_pct]
    names = {name for shares in ranks for name in shares}
    return {name: sum(shares.get(name, 0.0) for shares in ranks) / len(ranks) for name in names}


def _category_deltas(before: Report, after: Report, step: StepChange) -> tuple[CategoryDelta, ...]:
    b, a = _mean_breakdown(before), _mean_breakdown(after)
    if not b or not a:
        return ()
    rows = []
    for name in sorted(set(b) | set(a)):
        b_pct, a_pct = b.get(name, 0.0), a.get(name, 0.0)
        b_ms, a_ms = b_pct / 100 * step.before_median_ms, a_pct / 100 * step.after_median_ms
        rows.append(CategoryDelta(name, round(b_pct, 3), round(a_pct, 3), round(a_pct - b_pct, 3),
                                  round(b_ms, 4), round(a_ms, 4), round(a_ms - b_ms, 4)))  # fmt: skip
    return tuple(sorted(rows, key=lambda row: -abs(row.delta_ms_per_step)))


def _steps_counted(report: Report) -> int:
    return max(1, sum(len(rank.step_ms) for rank in report.ranks) or report.steps.count)


def _op_times(report: Report, metric: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for rank in report.ranks:
        for row in rank.top_ops:
            totals[row.name] = totals.get(row.name, 0.0) + getattr(row, metric)
    steps = _steps_counted(report)
    return {name: value / steps for name, value in totals.items()}


def _kernel_times(report: Report) -> dict[str, float]:
    totals: dict[str, float] = {}
    for rank in report.ranks:
        for row in rank.top_kernels:
            totals[row.name] = totals.get(row.name, 0.0) + row.total_ms
    steps = _steps_counted(report)
    return {name: value / steps for name, value in totals.items()}


def _region_times(report: Report) -> dict[str, float]:
    """Host ms per step in each compiled region, keyed by the function it compiles (region ids differ between runs)."""
    totals: dict[str, float] = {}
    for rank in report.ranks:
        for row in rank.compiled.regions if rank.compiled is not None else ():
            name = f"compiled: {row.location or row.region}"
            totals[name] = totals.get(name, 0.0) + float(row.host_ms or 0.0)
    steps = _steps_counted(report)
    return {name: value / steps for name, value in totals.items()}


def _row_deltas(before: dict[str, float], after: dict[str, float], limit: int) -> tuple[OpDelta, ...]:
    rows = []
    for name in set(before) | set(after):
        b, a = before.get(name), after.get(name)
        rows.append(OpDelta(name, _r(b), _r(a), round((a or 0.0) - (b or 0.0), 4)))
    rows.sort(key=lambda row: (-abs(row.delta_ms_per_step), row.name))
    return tuple(rows[:limit])


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _op_names(report: Report) -> set[str]:
    return {row.name for rank in report.ranks for row in rank.top_ops}


def _comparability(before: Report, after: Report, options: DiffOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    mismatches: list[str] = []
    notes: list[str] = []
    bs, as_ = before.source, after.source
    if bs.device and as_.device and bs.device != as_.device:
        mismatches.append(f"different devices: {bs.device} vs {as_.device}")
    if bs.world_size and as_.world_size and bs.world_size != as_.world_size:
        mismatches.append(f"different world sizes: {bs.world_size} vs {as_.world_size} ranks")
    b_ops, a_ops = _op_names(before), _op_names(after)
    if len(b_ops) >= 5 and len(a_ops) >= 5:
        overlap = len(b_ops & a_ops) / len(b_ops | a_ops)
        if overlap < options.disjoint_overlap:
            mismatches.append(
                f"the top ops barely overlap ({overlap:.0%} in common): these look like different models or workloads"
            )
    if bs.torch_version and as_.torch_version and bs.torch_version != as_.torch_version:
        notes.append(f"torch versions differ: {bs.torch_version} vs {as_.torch_version}")
    compiled = (bool(_region_times(before)), bool(_region_times(after)))
    if compiled[0] != compiled[1]:
        eager, compiled_side = ("after", "before") if compiled[0] else ("before", "after")
        notes.append(
            f"{compiled_side} runs torch.compile regions and {eager} runs eagerly: the regions (named by the function "
            f"they compile) replace {eager}'s aten ops; compare a region with the ops of that function"
        )
    if before.steps.marked != after.steps.marked:
        notes.append("one side has ProfilerStep markers and the other does not: step times are not like for like")
    if not (_mean_breakdown(before) and _mean_breakdown(after)):
        notes.append("per-category deltas not available: a side has no step-time breakdown")
    return tuple(mismatches), tuple(notes)


def _finding_changes(before: Report, after: Report):
    # A finding of a job's ranks (``across``: on one rank or several) is the same finding whichever ranks it
    # holds on in each run: it persists from ranks 0-255 to rank 3, rather than disappearing and appearing.
    b = {(f.id, None if f.across is not None else f.rank): f for f in before.findings}
    a = {(f.id, None if f.across is not None else f.rank): f for f in after.findings}

    def change(key: tuple[str, int | None]) -> FindingChange:
        return FindingChange(key[0], key[1], b.get(key), a.get(key))

    appeared = tuple(change(key) for key in a if key not in b)
    disappeared = tuple(change(key) for key in b if key not in a)
    persisting = tuple(change(key) for key in b if key in a)
    return appeared, disappeared, persisting
