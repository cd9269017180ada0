"""Collective bandwidth results (``skalpel commbench``): the table, its JSON, and the comparison with a run.

The measurement itself needs torch and lives in ``capture/commbench.py``; this module
does not import torch, so ``skalpel analyze --commbench FILE`` stays fast. Bandwidths
follow nccl-tests: algbw = S / time, busbw = algbw x the collective's factor
(``analysis/collectives.busbw_factor``), in GB/s of 1e9 bytes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import orjson

from ..errors import SkalpelError
from .report import RankReport, Report

SCHEMA = "skalpel.result.commbench/1"


@dataclass(frozen=True)
class BenchRow:
    type: str  # all_reduce, all_gather, reduce_scatter, broadcast, all_to_all
    nbytes: int  # nccl-tests size S
    time_us: float  # median over repeats of the slowest rank's mean time per call
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class CommBench:
    backend: str
    ranks: int
    device: str
    torch_version: str
    rows: tuple[BenchRow, ...]
    skipped: tuple[str, ...] = ()  # collectives the backend does not support, with why
    schema: str = SCHEMA

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, text: bytes | str, *, source: str = "commbench file") -> CommBench:
        try:
            data = orjson.loads(text)
            if data.get("schema") != SCHEMA:
                raise ValueError(f"schema is {data.get('schema')!r}, not {SCHEMA}")
            if not isinstance(data["rows"], list):
                raise ValueError("rows must be a list")
            rows = tuple(_checked_row(number, row) for number, row in enumerate(data["rows"], 1))
            fields = {key: data[key] for key in ("backend", "ranks", "device", "torch_version")}
            skipped = data.get("skipped", [])
            if not all(isinstance(value, str) for value in (fields["backend"], fields["device"], fields["torch_version"])):
                raise ValueError("backend, device and torch_version must be strings")
            if not _is_count(fields["ranks"]) or not isinstance(skipped, list) or not all(isinstance(s, str) for s in skipped):
                raise ValueError("ranks must be a count and skipped a list of strings")
            return cls(rows=rows, skipped=tuple(skipped), **fields)
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SkalpelError(f"{source}: not a skalpel commbench result ({error})") from None

    def busbw_at(self, kind: str, nbytes: int) -> BenchRow | None:
        """The measured row of ``kind`` whose size is nearest ``nbytes`` (on a log scale)."""
        rows = [row for row in self.rows if row.type == kind]
        if not rows or nbytes <= 0:
            return None
        return min(rows, key=lambda row: abs(_log2(row.nbytes) - _log2(nbytes)))


def _checked_row(number: int, row: object) -> BenchRow:
    """One measured row, every field of the type the comparison computes with (a file may be hand-edited)."""
    parsed = BenchRow(**row)  # a TypeError for missing or unknown keys, or a row that is not an object
    if not isinstance(parsed.type, str) or not _is_count(parsed.nbytes):
        raise ValueError(f"row {number}: type must be a string and nbytes a count of bytes")
    for value in (parsed.time_us, parsed.algbw_gbps, parsed.busbw_gbps):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"row {number}: times and bandwidths must be finite numbers >= 0")
    return parsed


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def render_table(bench: CommBench) -> str:
    """The nccl-tests-like table: one line per collective and size."""
    lines = [
        f"# skalpel commbench: {bench.backend}, {bench.ranks} ranks, {bench.device}, torch {bench.torch_version}",
        f"# {'collective':<15} {'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for row in bench.rows:
        lines.append(
            f"  {row.type:<15} {row.nbytes:>12,} {row.time_us:>12.1f} {row.algbw_gbps:>13.3f} {row.busbw_gbps:>13.3f}"
        )
    lines.extend(f"# skipped: {text}" for text in bench.skipped)
    peak = {}
    for row in bench.rows:
        peak[row.type] = max(peak.get(row.type, 0.0), row.busbw_gbps)
    if peak:
        lines.append("# peak busbw: " + ", ".join(f"{kind} {value:.3f} GB/s" for kind, value in peak.items()))
    return "\n".join(lines) + "\n"


def compare(report: Report, bench: CommBench) -> Report:
    """The report with each collective type's achieved busbw set against commbench's at the same size.

    Adds ``commbench_busbw_gbps`` and ``vs_commbench_pct`` to the rows of
    ``RankReport.comm.by_type`` (and ``transfer_vs_commbench_pct``, the busbw
    after the last rank arrived, for multi-rank reports), and a note saying what was compared.
    """
    ranks = tuple(_compare_rank(rank, bench) for rank in report.ranks)
    warnings = report.warnings
    backends = {info for info in (report.source.device,) if info}
    note = f"achieved bandwidth compared with commbench ({bench.backend}, {bench.ranks} ranks, {bench.device})"
    if backends and any(name.startswith("cpu") for name in backends) != (bench.device == "cpu"):  # "cpu (GPU unused)"
        note += ": the benchmark ran on another kind of device, so the comparison is rough"
    return dataclasses.replace(report, ranks=ranks, warnings=warnings + (note,))


def _compare_rank(rank: RankReport, bench: CommBench) -> RankReport:
    comm = rank.comm
    if comm is None:
        return rank
    transfer = (rank.distributed.transfer_busbw_gbps if rank.distributed is not None else None) or {}
    rows = []
    for row in comm.by_type:
        measured = bench.busbw_at(row.type, int(row.median_bytes or 0))
        if measured is not None and measured.busbw_gbps > 0 and row.busbw_gbps:
            moved = row.transfer_vs_commbench_pct
            if row.type in transfer:  # without the wait for later ranks: the transfer itself
                moved = round(100.0 * transfer[row.type] / measured.busbw_gbps, 1)
            row = dataclasses.replace(row, commbench_busbw_gbps=round(measured.busbw_gbps, 4),
                                      vs_commbench_pct=round(100.0 * row.busbw_gbps / measured.busbw_gbps, 1),
                                      transfer_vs_commbench_pct=moved)  # fmt: skip
        rows.append(row)
    return dataclasses.replace(rank, comm=dataclasses.replace(comm, by_type=tuple(rows)))


def _log2(value: int) -> float:
    import math

    return math.log2(max(value, 1))
