"""The Report: one object that every renderer (terminal, HTML, JSON) draws from.

Plain frozen dataclasses with units in field names, serialised as schema
``skalpel.report/1`` (see ``report.schema.json`` beside this file). A report can be
written to JSON and read back without the trace, so any renderer can run again later.
"""

from __future__ import annotations

import dataclasses
import statistics
import typing
from dataclasses import dataclass
from typing import Any

import orjson

from .checked import ReportFormatError, build, checked, items, kind, required
from .memory_split import MemorySplit
from .sections import (
    SECTIONS,
    BlameSummary,
    CommSummary,
    CompiledSummary,
    CompileSummary,
    DistributedSummary,
    LaunchSummary,
    ModulesSummary,
    RooflineSummary,
    RunLedger,
    StepDeviceSummary,
    SyncSummary,
)

SCHEMA = "skalpel.report/1"
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: its stable id, severity, the numbers that prove it, the user's code lines and the fix."""

    id: str
    severity: str  # critical | warning | info
    title: str  # one line, with the key number
    evidence: dict[str, Any]
    locations: tuple[str, ...]  # "train.py:42 in train_step": innermost frames in the user's code
    fix: str
    rank: int | None = None  # the one rank it holds on; None: job-wide, or several ranks (``ranks``)
    ranks: tuple[int, ...] = ()  # a finding that holds on several ranks of a job: which (``across`` says how)
    across: AcrossRanks | None = None


@dataclass(frozen=True)
class AcrossRanks:
    """A finding that holds on several ranks, as one: where, how its key number spreads, the worst ranks.

    ``per_rank`` keeps each rank's own finding (rank, severity, title, evidence, locations), as
    the rank alone would have given it; the finding's own title and evidence are its worst rank's.
    """

    ranks: str  # the ranks as ranges: "0-127, 200"
    count: int
    of: int  # ranks in the job
    key: str | None = None  # the evidence number compared across the ranks
    min: float | None = None
    median: float | None = None
    max: float | None = None
    worst: tuple[int, ...] = ()  # largest key number first
    differs: str | None = None  # a finding on a few ranks: how those ranks differ from the rest
    per_rank: tuple[dict[str, Any], ...] = ()
    # the rank whose figures the title and evidence are when not the worst: a job-wide finding judged at the job's
    # median rank (communication_bound, low_comm_overlap); its per-rank figures are in its evidence
    title_rank: int | None = None

    @classmethod
    def spread_of(cls, values: dict[int, float], *, ranks: typing.Iterable[int], of: int, key: str | None,
                  worst: int, **rest: Any) -> AcrossRanks:  # fmt: skip
        """Over ``ranks``: their ranges and count; of ``values`` (by rank, maybe none) the min, median and max,
        rounded to 4 places, and up to ``worst`` ranks with the largest value (none when all are equal)."""
        ranks = sorted(ranks)
        spread = sorted(((values[rank], rank) for rank in ranks if rank in values), key=lambda item: (-item[0], item[1]))
        numbers = [value for value, _ in spread]
        if not numbers:
            return cls(ranks=rank_ranges(ranks), count=len(ranks), of=of, key=key, **rest)
        return cls(
            ranks=rank_ranges(ranks), count=len(ranks), of=of, key=key, min=round(numbers[-1], 4),
            median=round(statistics.median(numbers), 4), max=round(numbers[0], 4),
            worst=tuple(rank for _, rank in spread[:worst]) if numbers[0] > numbers[-1] else (), **rest,
        )  # fmt: skip

    def describe(self) -> str:
        """'on 256 of 256 ranks (0-255): idle_pct min 43.2, median 78.7, max 79; worst 3, 11'."""
        text = f"on {self.count} of {self.of} ranks ({self.ranks})"
        if self.key is not None and self.median is not None:
            text += f": {self.key} min {_short(self.min)}, median {_short(self.median)}, max {_short(self.max)}"
            if self.worst:
                text += "; worst " + ", ".join(str(rank) for rank in self.worst)
        severities: dict[str, list[int]] = {}
        for item in self.per_rank:
            severities.setdefault(str(item.get("severity")), []).append(int(item.get("rank", -1)))
        if len(severities) > 1:  # the finding is as severe as its worst rank: say where it is less so
            text += "; " + ", ".join(f"{severity} on {_ranks_briefly(ranks)}" for severity, ranks in
                                     sorted(severities.items(), key=lambda item: _SEVERITY_ORDER.get(item[0], 9)))  # fmt: skip
        if self.differs:
            text += f"; {self.differs}"
        return text


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
_RANKS_WIDTH = 40  # a longer rank list (every 4th rank of 256 is 90 ranges) is cut: per_rank has every rank


def _ranks_briefly(ranks: list[int]) -> str:
    """'2, 6-7, 10' or, past ``_RANKS_WIDTH`` characters, '96 ranks (2, 6-7, 10, 14-15, …)'."""
    text = rank_ranges(ranks)
    if len(text) <= _RANKS_WIDTH:
        return text
    return f"{len(ranks)} ranks ({text[:_RANKS_WIDTH].rsplit(', ', 1)[0]}, …)"


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass(frozen=True)
class MetricSpread:
    """One figure of every rank (step time, compute, ...): its percentiles, a histogram and the outlier ranks."""

    name: str  # step_ms, compute_pct, comm_ms, wait_ms, idle_pct
    label: str  # what a reader calls it
    unit: str  # "ms", "%"
    ranks: int  # ranks that have the figure
    min: float
    p10: float
    p50: float
    p90: float
    max: float
    histogram: tuple[int, ...]  # ranks per equal bin from min to max
    outliers: tuple[tuple[int, float, float], ...] = ()  # (rank, value, robust z-score), farthest first


@dataclass(frozen=True)
class RankGroup:
    """Ranks whose profiles match: one group, shown by its representative."""

    ranks: str  # as ranges
    members: tuple[int, ...]
    representative: int
    profile: dict[str, float]  # the representative's figures, by MetricSpread.name
    alike: bool = True  # False: the ranks left when the groups ran out (job/summary.py MAX_GROUPS), alike or not


@dataclass(frozen=True)
class CollectiveSpread:
    """One type of collective across the ranks: time per step and bus bandwidth percentiles, the slowest ranks."""

    type: str  # all_reduce, all_to_all, ...
    ranks: int  # ranks that ran it
    calls_per_step: float  # median over the ranks
    ms_per_step_p50: float
    ms_per_step_p90: float
    ms_per_step_max: float
    busbw_gbps_p10: float | None = None  # bus bandwidth of the whole call, waits included
    busbw_gbps_p50: float | None = None
    busbw_gbps_p90: float | None = None
    transfer_busbw_gbps_p10: float | None = None  # after the last rank arrived: the link, without the waits
    transfer_busbw_gbps_p50: float | None = None
    transfer_busbw_gbps_p90: float | None = None
    slowest: tuple[int, ...] = ()  # ranks of the lowest transfer bandwidth (else whole-call), slowest first


@dataclass(frozen=True)
class JobSummary:
    """A job of many ranks in a few lines: the spread of each figure, its outlier ranks, the groups of ranks alike."""

    ranks: int
    metrics: tuple[MetricSpread, ...]
    groups: tuple[RankGroup, ...]
    outliers: tuple[int, ...]  # every rank an outlier by some figure
    shown: tuple[int, ...]  # the ranks a report details: the outliers and each group's representative
    outlier_z: float = 3.5  # the robust z-score beyond which a rank is an outlier (diagnose/thresholds.py)
    collectives: tuple[CollectiveSpread, ...] = ()


def rank_ranges(ranks: typing.Iterable[int]) -> str:
    """``0-127, 130, 200-255``: sorted ranks, runs written as ranges; ``2-254 every 4`` for four or more
    ranks a fixed stride apart (one rank in four, as a job of several kinds of ranks has them)."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        stride = ordered[i + 1] - ordered[i] if i + 1 < len(ordered) else 1
        while j + 1 < len(ordered) and ordered[j + 1] - ordered[j] == stride:
            j += 1
        if stride == 1 and j > i:
            spans.append(f"{ordered[i]}-{ordered[j]}")
        elif j - i >= _STRIDED_RUN - 1:
            spans.append(f"{ordered[i]}-{ordered[j]} every {stride}")
        else:
            spans.append(str(ordered[i]))
            j = i
        i = j + 1
    return ", ".join(spans)


_STRIDED_RUN = 4


def sorted_findings(findings: typing.Iterable[Finding]) -> list[Finding]:
    """Most severe first (critical, warning, info); the order of equals is kept."""
    return sorted(findings, key=lambda finding: SEVERITIES.index(finding.severity))


@dataclass(frozen=True)
class Source:
    """What was analysed: the trace files, and the torch version, device and world size they record."""

    paths: tuple[str, ...]
    torch_version: str | None = None
    device: str | None = None  # e.g. "NVIDIA H100 80GB HBM3", "cpu"
    world_size: int | None = None


@dataclass(frozen=True)
class CaptureInfo:
    """How skalpel captured the trace; absent for traces loaded from disk."""

    warmup_steps: int  # every step before the recorded ones: wait (un-profiled) and profiler warm-up
    active_steps: int
    overhead_pct: float | None = None  # median profiled step vs median steady un-profiled step
    noise_pct: float | None = None  # spread between repeated capture windows
    repeats: int = 1
    script: str | None = None
    exit_status: int | None = None
    unprofiled_step_ms: float | None = None
    profiled_step_ms: float | None = None
    window_medians_ms: tuple[float, ...] = ()
    wait_steps: int | None = None  # of the warmup_steps, those run without the profiler (None: not said)
    overhead_noise_pct: float | None = None  # an overhead within +- this is not measured
    baseline_steps: int | None = None  # un-profiled steps the overhead's baseline is the median of
    step_signal: str | None = None  # what marked the steps: "optimizer.step()", "backward()", "run.step()", ...
    cpu: dict[str, Any] | None = None  # threads asked, cores available, CPU time over the recorded steps (capture/cpu.py)
    run: RunLedger | None = None  # the script's whole run by the step clock: start-up, steps, between, one-time costs
    after_step_ms: float | None = None  # median un-profiled step after the recording: the baseline's check
    after_change_pct: float | None = None  # after_step_ms against the baseline, where it stands out of the noise
    memory_split: MemorySplit | None = None  # what held the recorded window's memory peak (capture/memory_split.py)

    def overhead_words(self) -> str | None:
        """The overhead as a reader may take it: a figure only when it stands out of its noise."""
        overhead, noise = self.overhead_pct, self.overhead_noise_pct
        if overhead is None:
            return None
        if noise is None:
            return f"profiler overhead {overhead:+.1f}%" if overhead >= 0 else "profiler overhead not measurable"
        if self.baseline_steps is not None and self.baseline_steps < _FEWEST_BASELINE_STEPS:
            return (f"profiler overhead not measurable: {self.baseline_steps} un-profiled step(s) before the "
                    f"recording to compare with (at least {_FEWEST_BASELINE_STEPS}: raise --wait)")  # fmt: skip
        if abs(overhead) <= noise:
            return f"profiler overhead within the noise (+-{noise:.0f}%)"
        if overhead < 0:
            return (f"profiler overhead not measurable (profiled steps {-overhead:.0f}% faster than the "
                    f"{self.baseline_steps or 0} un-profiled step(s) before the recording)")  # fmt: skip
        return f"profiler overhead {overhead:+.1f}% (+-{noise:.0f}%)"

    def unprofiled_ratio(self) -> float | None:
        """Un-profiled over profiled median step (below 1) where the overhead is measured (out of its noise, on
        enough baseline steps); None otherwise. What a host-side time seen under the profiler shrinks to without it
        (the Python tracer inflates Python most, so this is the whole step's ratio, the least it shrinks)."""
        overhead, noise = self.overhead_pct, self.overhead_noise_pct
        if overhead is None or overhead <= 0 or not self.unprofiled_step_ms or not self.profiled_step_ms:
            return None
        if noise is not None and overhead <= noise:
            return None
        if self.baseline_steps is not None and self.baseline_steps < _FEWEST_BASELINE_STEPS:
            return None
        return self.unprofiled_step_ms / self.profiled_step_ms

    def describe_steps(self) -> str:
        if self.wait_steps is None:
            return describe_steps(None, self.warmup_steps, self.active_steps, self.repeats)
        return describe_steps(self.wait_steps, self.warmup_steps - self.wait_steps, self.active_steps, self.repeats)


_FEWEST_BASELINE_STEPS = 3  # with fewer un-profiled steps the overhead's noise band is about the step itself (+-200%)


def describe_steps(wait: int | None, warmup: int, active: int, repeat: int = 1) -> str:
    """``1 wait + 2 warm-up + 5 active steps``: one wording for the run's header and its summary."""
    counts = f"{warmup} warm-up + {active} active steps"
    if wait is not None:
        counts = f"{wait} wait + {counts}"
    return counts + (f", {repeat} windows" if repeat > 1 else "")


@dataclass(frozen=True)
class StepStats:
    """The analysed steps: how many, their median and p90 time, and their spread."""

    count: int
    median_ms: float
    p90_ms: float
    cv: float  # coefficient of variation of step time across steps
    marked: bool = True  # False: no ProfilerStep markers, each rank's trace is one pseudo-step


@dataclass(frozen=True)
class OpRow:
    """One op name of a rank's op table: calls, host time and the device time of the work it launched. The analysis
    (``analysis.ops``) makes these rows, unrounded; the report keeps its first rows, rounded."""

    name: str
    calls: int
    self_ms: float  # host time excluding direct child ops
    total_ms: float  # host time including child ops
    device_ms: float  # self device time: kernels, copies and memsets this op launched itself
    input_shapes: str | None = None  # most frequent 'Input Dims' (JSON), None when not recorded
    shape_variants: int = 0  # distinct 'Input Dims' the row aggregates (0: not recorded or not said)

    @property
    def other_shapes(self) -> str:
        """`` (+2 other shapes)`` when the row aggregates several shapes (its ``input_shapes`` is the most frequent)."""
        others = self.shape_variants - 1
        return f" (+{others} other shape{'s' if others > 1 else ''})" if others > 0 else ""


@dataclass(frozen=True)
class KernelRow:
    """One kernel name of a rank's kernel table (``analysis.kernels`` makes these rows, unrounded; the report keeps its
    first rows, rounded)."""

    name: str
    type: str  # COMP | COMM | MEMORY
    calls: int
    total_ms: float
    mean_us: float
    share_pct: float  # of all device time on this rank


@dataclass(frozen=True)
class GpuSummary:
    """A rank's device time by HTA's temporal and idle-time breakdowns."""

    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_overlap_pct: float | None
    idle_breakdown_pct: dict[str, float]  # host_wait, kernel_wait, other


@dataclass(frozen=True)
class MemorySummary:
    """A rank's device memory: peak, growth per step and a downsampled curve."""

    peak_bytes: int
    growth_bytes_per_step: float | None
    device: str  # "cuda:0", "cpu"
    peak_ts_ms: float | None = None
    curve: tuple[tuple[float, int], ...] = ()  # (ms from trace start, allocated bytes), downsampled


@dataclass(frozen=True)
class MfuSummary:
    """Model FLOP utilisation from the profiler's flop counts (with_flops)."""

    achieved_tflops: float  # flops per step / median step time
    flops_per_step: float
    dtype: str  # the dtype whose peak is used (bf16 unless told)
    peak_tflops: float | None = None  # dense datasheet peak of the device; None for CPUs and unknown devices
    mfu_pct: float | None = None
    device: str | None = None
    note: str | None = None  # why there is no MFU


@dataclass(frozen=True)
class LedgerUnitRow:
    """One unit of a ledger lane: its length and its time by cause (ms), which add up to the length."""

    number: int
    length_ms: float
    ms: dict[str, float]


@dataclass(frozen=True)
class LedgerLane:
    """The device, or the host's main thread: the time of every unit by cause."""

    lane: str  # "device" or "host"
    what: str
    ms_per_unit: dict[str, float]
    share_pct: dict[str, float]
    units: tuple[LedgerUnitRow, ...] = ()


@dataclass(frozen=True)
class LedgerSummary:
    """A rank's ledger (analysis/ledger.py): what it was judged over, and every millisecond of it by cause."""

    unit: str  # "step", "iteration" or "window"
    units: int
    judged_over: str  # "6 steps", "one 850.0 ms window, no steps marked; one-time work taken out first"
    length_ms: float
    one_time_ms: float
    lanes: tuple[LedgerLane, ...] = ()
    notes: tuple[str, ...] = ()

    def lane(self, name: str) -> LedgerLane | None:
        return next((lane for lane in self.lanes if lane.lane == name), None)


@dataclass(frozen=True)
class RankReport:
    """Everything measured on one rank."""

    rank: int
    step_ms: tuple[float, ...]
    step_breakdown_pct: dict[str, float]
    gpu: GpuSummary | None = None
    memory: MemorySummary | None = None
    top_ops: tuple[OpRow, ...] = ()
    top_kernels: tuple[KernelRow, ...] = ()
    data_wait_ms_per_step: float | None = None
    mfu: MfuSummary | None = None
    # further analyses (result/sections.py), written under "extra" by name: absent where the rank has none
    launch: LaunchSummary | None = None
    step_device: StepDeviceSummary | None = None
    blame: BlameSummary | None = None
    syncs: SyncSummary | None = None
    compile: CompileSummary | None = None
    compiled: CompiledSummary | None = None
    comm: CommSummary | None = None
    distributed: DistributedSummary | None = None
    modules: ModulesSummary | None = None  # time and FLOPs by nn.Module; None without module frames
    roofline: RooflineSummary | None = None  # the heavy ops under the roofs; None without matmuls or elementwise ops
    ledger: LedgerSummary | None = None  # every millisecond of every unit by cause; None in reports before it

    @property
    def extra(self) -> dict[str, dict[str, Any]]:
        """The sections as the JSON's ``extra`` holds them: by name, in ``SECTIONS`` order, each as plain data."""
        return {name: section.to_dict() for name in SECTIONS if (section := getattr(self, name)) is not None}

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return self._laid_out({name: data[name] for name in _RANK_FIELDS})

    def _laid_out(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The rank as JSON lays it out: its own fields, and ``extra`` (the sections) before ``ledger``."""
        ledger = fields.pop("ledger")
        return {**fields, "extra": self.extra, "ledger": ledger}

    def json_fields(self) -> dict[str, Any]:
        """``to_dict`` one level down: the fields' values as they are, for orjson to walk."""
        return self._laid_out({name: getattr(self, name) for name in _RANK_FIELDS})


_RANK_FIELDS = tuple(spec.name for spec in dataclasses.fields(RankReport) if spec.name not in SECTIONS)


@dataclass(frozen=True)
class Report:
    """The whole result, schema ``skalpel.report/1``: findings, source, steps, ranks, capture and warnings."""

    source: Source
    steps: StepStats
    ranks: tuple[RankReport, ...]
    findings: tuple[Finding, ...] = ()
    capture: CaptureInfo | None = None
    warnings: tuple[str, ...] = ()
    schema: str = SCHEMA
    job: JobSummary | None = None  # jobs of several ranks: the spread across ranks, outliers and groups

    @property
    def has_device(self) -> bool:
        return any(rank.gpu is not None for rank in self.ranks)

    def loop_iterations(self) -> int | None:
        """Without step markers: the iterations the ledger found from the loop (the units gpu_idle, launch_bound and
        the ledger judge), summed over the ranks, when every rank has them; else None (the pseudo-step is the unit)."""
        if self.steps.marked or not self.ranks:
            return None
        found = [rank.ledger.units for rank in self.ranks
                 if rank.ledger is not None and rank.ledger.unit == "iteration"]  # fmt: skip
        return sum(found) if len(found) == len(self.ranks) else None

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data; the answer (findings, most severe first) leads, after the schema id."""
        data = dataclasses.asdict(self)
        data["ranks"] = tuple(rank.to_dict() for rank in self.ranks)
        return {"schema": data.pop("schema"), "findings": data.pop("findings"), **data}

    def to_json(self) -> bytes:
        """``to_dict`` as JSON; orjson walks the dataclasses itself, some fifty times faster than ``asdict``."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["ranks"] = [rank.json_fields() for rank in self.ranks]
        data = {"schema": fields.pop("schema"), "findings": fields.pop("findings"), **fields}
        return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """Read a report back; a field of the wrong type (a hand-edited file) raises ReportFormatError naming it."""
        if not isinstance(data, dict):
            raise ReportFormatError("the document is not a JSON object")
        if data.get("schema") != SCHEMA:
            raise ReportFormatError(f"not a {SCHEMA} document (schema: {data.get('schema')!r})")
        ranks = tuple(_rank_from_dict(rank, f"ranks[{i}]") for i, rank in enumerate(items(data, "ranks", "")))
        return cls(
            source=build(Source, required(data, "source", ""), "source"),
            steps=build(StepStats, required(data, "steps", ""), "steps"),
            ranks=ranks,
            findings=tuple(_finding_from_dict(item, f"findings[{i}]") for i, item in enumerate(items(data, "findings", ""))),
            capture=_capture_from_dict(data["capture"], "capture") if data.get("capture") else None,
            warnings=checked(tuple(items(data, "warnings", "")), tuple[str, ...], "warnings"),
            job=_job_from_dict(data["job"], "job") if data.get("job") else None,
        )

    @classmethod
    def from_json(cls, text: bytes | str) -> Report:
        return cls.from_dict(orjson.loads(text))

    def _repr_html_(self) -> str | None:
        """The HTML report inline in a notebook (Jupyter calls this), once the renderer is known: the contract
        imports no renderer, ``skalpel.analyze()`` and ``skalpel.profile()`` tell it (``show_inline_with``)."""
        return _inline_renderer(self) if _inline_renderer is not None else None


_inline_renderer: typing.Callable[[Report], str] | None = None


def show_inline_with(renderer: typing.Callable[[Report], str]) -> None:
    """The renderer ``Report._repr_html_`` uses (``report/inline.py``)."""
    global _inline_renderer
    _inline_renderer = renderer


def _finding_from_dict(data: Any, where: str) -> Finding:
    if isinstance(data, dict) and data.get("across"):
        data = {**data, "across": build(AcrossRanks, data["across"], f"{where}.across")}
    finding = build(Finding, data, where)
    if finding.severity not in SEVERITIES:
        raise ReportFormatError(f"{where}.severity: expected one of {', '.join(SEVERITIES)}, got {finding.severity!r}")
    return finding


def _job_from_dict(data: Any, where: str) -> JobSummary:
    if not isinstance(data, dict):
        raise ReportFormatError(f"{where}: expected an object, got {kind(data)}")
    values = dict(data)
    values["metrics"] = tuple(build(MetricSpread, item, f"{where}.metrics[{i}]")
                              for i, item in enumerate(items(data, "metrics", where)))  # fmt: skip
    values["groups"] = tuple(build(RankGroup, item, f"{where}.groups[{i}]") for i, item in enumerate(items(data, "groups", where)))
    values["collectives"] = tuple(build(CollectiveSpread, item, f"{where}.collectives[{i}]")
                                  for i, item in enumerate(items(data, "collectives", where)))  # fmt: skip
    return build(JobSummary, values, where)


def _rank_from_dict(data: Any, where: str) -> RankReport:
    if not isinstance(data, dict):
        raise ReportFormatError(f"{where}: expected an object, got {kind(data)}")
    values = dict(data)
    values["gpu"] = build(GpuSummary, data["gpu"], f"{where}.gpu") if data.get("gpu") else None
    values["memory"] = build(MemorySummary, data["memory"], f"{where}.memory") if data.get("memory") else None
    values["mfu"] = build(MfuSummary, data["mfu"], f"{where}.mfu") if data.get("mfu") else None
    values["ledger"] = _ledger_from_dict(data["ledger"], f"{where}.ledger") if data.get("ledger") else None
    values["top_ops"] = tuple(build(OpRow, row, f"{where}.top_ops[{i}]") for i, row in enumerate(items(data, "top_ops", where)))
    values["top_kernels"] = tuple(
        build(KernelRow, row, f"{where}.top_kernels[{i}]") for i, row in enumerate(items(data, "top_kernels", where))
    )
    extra = data.get("extra") or {}
    if not isinstance(extra, dict):
        raise ReportFormatError(f"{where}.extra: expected an object, got {kind(extra)}")
    for name, section in SECTIONS.items():
        if extra.get(name) is not None:
            values[name] = section.from_dict(extra[name], f"{where}.extra.{name}")
    return build(RankReport, values, where)


def _ledger_from_dict(data: Any, where: str) -> LedgerSummary:
    if not isinstance(data, dict):
        raise ReportFormatError(f"{where}: expected an object, got {kind(data)}")
    lanes = []
    for i, lane in enumerate(items(data, "lanes", where)):
        at = f"{where}.lanes[{i}]"
        if not isinstance(lane, dict):
            raise ReportFormatError(f"{at}: expected an object, got {kind(lane)}")
        units = tuple(build(LedgerUnitRow, unit, f"{at}.units[{j}]") for j, unit in enumerate(items(lane, "units", at)))
        lanes.append(build(LedgerLane, {**lane, "units": units}, at))
    return build(LedgerSummary, {**data, "lanes": tuple(lanes)}, where)


CPU_FACTS: dict[str, type] = {
    "intra_op_threads": int, "inter_op_threads": int, "loader_workers": int, "processes": int, "cores_available": int,
    "cpu_quota_cores": float, "cpu_s": float, "wall_s": float, "steps": int, "load_avg_1m": float, "runnable_now": int,
    "run_queue_wait_s": float, "loader_worker_cpu_s": float, "loader_batches": int, "loader_fetch_cpu_s": float,
    "unprofiled_loader_batches": int, "unprofiled_loader_fetch_cpu_s": float,
}  # fmt: skip
"""``CaptureInfo.cpu`` as capture/cpu.py writes it: each fact a number of 0 or more, or null (the rules divide by them)."""
_CPU_NEEDED = ("cpu_s", "wall_s", "steps")
_MOST = {int: 2**31, float: 1e9}  # a count that fits an int32; seconds, cores or load under a billion
_MOST_MS = 1e12  # 31 years: no step or window takes longer
_MOST_PCT = 1e6


def capture_from_dict(data: Any, where: str = "capture") -> CaptureInfo:
    """A CaptureInfo from its JSON object (a report's, or one a rank saved with ``dataclasses.asdict``): nested facts
    as their types (the run's ledger), every field checked. Raises ReportFormatError."""
    return _capture_from_dict(data, where)


def _capture_from_dict(data: Any, where: str) -> CaptureInfo:
    """CaptureInfo with its measured facts checked: a damaged report.json cannot put a fact no capture produces
    (a negative time, a CPU time of 1e308 s, a string) into the arithmetic of the rules that read them."""
    capture = build(CaptureInfo, data, where)
    for name in ("unprofiled_step_ms", "profiled_step_ms"):
        _bounded(getattr(capture, name), 0.0, _MOST_MS, f"{where}.{name}")
    for i, ms in enumerate(capture.window_medians_ms):
        _bounded(ms, 0.0, _MOST_MS, f"{where}.window_medians_ms[{i}]")
    for name in ("overhead_pct", "noise_pct", "overhead_noise_pct"):
        _bounded(getattr(capture, name), -_MOST_PCT, _MOST_PCT, f"{where}.{name}")
    _bounded(capture.after_step_ms, 0.0, _MOST_MS, f"{where}.after_step_ms")
    _bounded(capture.after_change_pct, -_MOST_PCT, _MOST_PCT, f"{where}.after_change_pct")
    if capture.run is not None:  # seconds and counts of the run: none negative, none beyond a billion
        for spec in dataclasses.fields(capture.run):
            value = getattr(capture.run, spec.name)
            if not isinstance(value, bool):
                _bounded(value, 0, _MOST[float], f"{where}.run.{spec.name}")
    if capture.cpu is not None:
        for name in _CPU_NEEDED:
            if name not in capture.cpu:
                raise ReportFormatError(f"{where}.cpu.{name}: the field is missing")
        for name, expected in CPU_FACTS.items():
            value = capture.cpu.get(name)
            if value is not None:
                checked(value, expected, f"{where}.cpu.{name}")
                _bounded(value, 0, _MOST[expected], f"{where}.cpu.{name}")
    return capture


def _bounded(value: float | None, low: float, high: float, where: str) -> None:
    if value is not None and not low <= value <= high:
        raise ReportFormatError(f"{where}: {value!r:.30} is outside [{low:g}, {high:g}]")
