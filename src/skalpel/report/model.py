"""The Report: one object that every renderer (terminal, HTML, JSON) draws from.

Plain frozen dataclasses with units in field names, serialised as schema
``skalpel.report/1`` (see ``report.schema.json`` beside this file). A report can be
written to JSON and read back without the trace, so any renderer can run again later.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

SCHEMA = "skalpel.report/1"
SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # critical | warning | info
    title: str  # one line, with the key number
    evidence: dict[str, Any]
    locations: tuple[str, ...]  # "train.py:42 in train_step": innermost frames in the user's code
    fix: str
    rank: int | None = None


@dataclass(frozen=True)
class Source:
    paths: tuple[str, ...]
    torch_version: str | None = None
    device: str | None = None  # e.g. "NVIDIA H100 80GB HBM3", "cpu"
    world_size: int | None = None


@dataclass(frozen=True)
class CaptureInfo:
    """How skalpel captured the trace; absent for traces loaded from disk."""

    warmup_steps: int
    active_steps: int
    overhead_pct: float | None = None  # median profiled step vs median un-profiled warm-up step
    noise_pct: float | None = None  # spread between repeated capture windows
    repeats: int = 1
    script: str | None = None
    exit_status: int | None = None
    unprofiled_step_ms: float | None = None
    profiled_step_ms: float | None = None
    window_medians_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class StepStats:
    count: int
    median_ms: float
    p90_ms: float
    cv: float  # coefficient of variation of step time across steps
    marked: bool = True  # False: no ProfilerStep markers, each rank's trace is one pseudo-step


@dataclass(frozen=True)
class OpRow:
    name: str
    calls: int
    self_ms: float  # host time excluding child ops
    total_ms: float  # host time including child ops
    device_ms: float  # device time of the work this op launched
    input_shapes: str | None = None  # most frequent 'Input Dims'


@dataclass(frozen=True)
class KernelRow:
    name: str
    type: str  # COMP | COMM | MEMORY
    calls: int
    total_ms: float
    mean_us: float
    share_pct: float  # of all device time on this rank


@dataclass(frozen=True)
class GpuSummary:
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_overlap_pct: float | None
    idle_breakdown_pct: dict[str, float]  # host_wait, kernel_wait, other


@dataclass(frozen=True)
class MemorySummary:
    peak_bytes: int
    growth_bytes_per_step: float | None
    device: str  # "cuda:0", "cpu"
    peak_ts_ms: float | None = None
    curve: tuple[tuple[float, int], ...] = ()  # (ms from trace start, allocated bytes), downsampled


@dataclass(frozen=True)
class RankReport:
    rank: int
    step_ms: tuple[float, ...]
    step_breakdown_pct: dict[str, float]
    gpu: GpuSummary | None = None
    memory: MemorySummary | None = None
    top_ops: tuple[OpRow, ...] = ()
    top_kernels: tuple[KernelRow, ...] = ()
    data_wait_ms_per_step: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # further analyses: launch delays, syncs, comm


@dataclass(frozen=True)
class Report:
    source: Source
    steps: StepStats
    ranks: tuple[RankReport, ...]
    findings: tuple[Finding, ...] = ()
    capture: CaptureInfo | None = None
    warnings: tuple[str, ...] = ()
    schema: str = SCHEMA

    @property
    def has_device(self) -> bool:
        return any(rank.gpu is not None for rank in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data; the answer (findings, most severe first) leads, after the schema id."""
        data = dataclasses.asdict(self)
        return {"schema": data.pop("schema"), "findings": data.pop("findings"), **data}

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema: {data.get('schema')!r})")
        ranks = tuple(_rank_from_dict(rank) for rank in data.get("ranks", ()))
        return cls(
            source=_build(Source, data["source"]),
            steps=_build(StepStats, data["steps"]),
            ranks=ranks,
            findings=tuple(_build(Finding, finding) for finding in data.get("findings", ())),
            capture=_build(CaptureInfo, data["capture"]) if data.get("capture") else None,
            warnings=tuple(data.get("warnings", ())),
        )

    @classmethod
    def from_json(cls, text: bytes | str) -> Report:
        return cls.from_dict(orjson.loads(text))


def _rank_from_dict(data: dict[str, Any]) -> RankReport:
    values = dict(data)
    values["gpu"] = _build(GpuSummary, data["gpu"]) if data.get("gpu") else None
    values["memory"] = _build(MemorySummary, data["memory"]) if data.get("memory") else None
    values["top_ops"] = tuple(_build(OpRow, row) for row in data.get("top_ops", ()))
    values["top_kernels"] = tuple(_build(KernelRow, row) for row in data.get("top_kernels", ()))
    return _build(RankReport, values)


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Construct a dataclass from a dict, ignoring unknown keys and turning lists into tuples."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key not in names:
            continue
        if isinstance(value, list) and "tuple" in str(names[key].type):
            value = tuple(tuple(item) if isinstance(item, list) else item for item in value)
        values[key] = value
    return cls(**values)
