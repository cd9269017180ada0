"""Load torch.profiler (Kineto) traces into the columnar ``Trace`` model.

Accepts ``.json`` and ``.json.gz`` files and folders of them (what
``tensorboard_trace_handler`` writes, one file per rank). Every Kineto format from
torch 1.8 to today loads: old and new category names, string or integer pids and
tids, nanosecond-era fractional timestamps, flows named ``ac2g`` or ``async``,
CUDA, ROCm, MTIA and CPU-only traces.
"""

from __future__ import annotations

import ast
import gzip
import re
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import orjson

from ..errors import TraceError
from .jsonscan import NotATraceError, iter_event_batches, split_document
from .kinds import DEVICE_KINDS, Kind, classify
from .model import MemoryEvents, RankInfo, Trace

ProgressCallback = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while loading."""

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
_SKALPEL_OUTPUTS = ("report.json", "flamegraph.speedscope.json", "summary.json")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_KEPT_ARG_KINDS = frozenset({Kind.COMM_OP, Kind.COMM_KERNEL, Kind.DEVICE_SYNC, Kind.MEMCPY})


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders into the trace files inside them, skipping skalpel's own outputs."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and _looks_like_trace_file(p))
            if not inside:
                raise TraceError(f"{path}: no trace files (*.json or *.json.gz) in this folder")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise TraceError(f"{path}: no such file or folder")
    return found


def _looks_like_trace_file(path: Path) -> bool:
    name = path.name
    if name in _SKALPEL_OUTPUTS or name.startswith("report"):
        return False
    return name.endswith(".json") or name.endswith(".json.gz")


def load(paths: str | Path | Iterable[str | Path], *, on_progress: ProgressCallback | None = None) -> Trace:
    """Load one or more trace files (or folders of them) into one ``Trace``."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = find_trace_files(paths)
    parsed = [_parse_file(path, on_progress) for path in files]
    parsed = _drop_duplicate_ranks(parsed)
    return _assemble(parsed)


def read_bytes(path: Path) -> tuple[bytes, bool]:
    """The file's bytes, gunzipped when needed; the flag is True when a gzip stream was cut short."""
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw, False
    try:
        return gzip.decompress(raw), False
    except (EOFError, gzip.BadGzipFile, zlib.error):
        # A truncated stream: keep whatever decompresses.
        decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            data = decompressor.decompress(raw)
        except zlib.error as error:
            raise TraceError(f"{path}: corrupt gzip data ({error})") from None
        return data, True


@dataclass
class _FileColumns:
    path: Path
    info: RankInfo
    names: list[str]
    columns: dict[str, array]
    memory: dict[str, array]
    extra: dict[int, dict]
    warnings: list[str]


def _parse_file(path: Path, on_progress: ProgressCallback | None) -> _FileColumns:
    data, gzip_truncated = read_bytes(path)
    try:
        document = split_document(data)
    except NotATraceError as error:
        raise TraceError(f"{path}: {error}") from None
    header = document.header
    builder = _ColumnBuilder()
    for batch in iter_event_batches(data, document.event_spans):
        builder.add_events(batch)
        if on_progress is not None:
            on_progress(len(batch), len(document.event_spans))
    builder.resolve_flow_correlations()
    warnings = list(builder.warnings)
    truncated = document.truncated or gzip_truncated
    if truncated:
        kept = len(document.event_spans)
        share = 100.0 * document.recovered_bytes / max(document.total_bytes, 1)
        warnings.append(
            f"{path.name}: the file is cut off (a killed process?); recovered {kept:,} events "
            f"from the first {share:.0f}% of it"
        )
    if builder.count == 0 and not truncated:
        raise TraceError(f"{path}: the trace holds no events")
    if builder.count == 0:
        raise TraceError(f"{path}: the file is cut off before its first complete event")
    del data
    info = _rank_info(path, header, truncated, builder.count)
    return _FileColumns(path, info, builder.names, builder.columns, builder.memory, builder.extra, warnings)


class _ColumnBuilder:
    """Accumulates one file's events into typed arrays, interning names as it goes."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.columns = {
            "ts": array("d"), "dur": array("d"), "kind": array("b"), "name": array("i"),
            "pid": array("q"), "tid": array("q"), "device": array("i"), "stream": array("q"),
            "correlation": array("q"), "external_id": array("q"), "stack": array("i"),
            "shapes": array("i"), "nbytes": array("q"),
        }  # fmt: skip
        self.memory = {
            "ts": array("d"), "nbytes": array("q"), "total_allocated": array("q"),
            "total_reserved": array("q"), "device_type": array("b"), "device_id": array("h"),
            "tid": array("q"),
        }  # fmt: skip
        self.extra: dict[int, dict] = {}
        self.warnings: list[str] = []
        self._flow_ends: dict[tuple[int, int, float], int] = {}
        self._uncorrelated_device: list[int] = []
        self._skipped = 0

    @property
    def count(self) -> int:
        return len(self.columns["ts"])

    def intern(self, text: str) -> int:
        index = self._ids.get(text)
        if index is None:
            index = self._ids[text] = len(self.names)
            self.names.append(text)
        return index

    def add_events(self, events: list) -> None:
        for event in events:
            if not isinstance(event, dict):
                self._skipped += 1
                continue
            phase = event.get("ph")
            if phase == "X":
                self._add_range(event)
            elif phase in ("i", "I"):
                self._add_instant(event)
            elif phase == "f" and event.get("cat") in ("ac2g", "async"):
                self._add_flow_end(event)
            # metadata (M), flow starts, counters and other phases carry nothing we analyse

    def _add_range(self, event: dict) -> None:
        columns = self.columns
        name = event.get("name")
        ts, dur = event.get("ts"), event.get("dur", 0)
        if not isinstance(name, str) or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            self._skipped += 1
            return
        if dur < 0:
            self._skipped += 1
            return
        category = event.get("cat")
        if category == "Trace":
            return  # the profiler's own span markers
        kind = classify(category, name, "X")
        args = event.get("args")
        if not isinstance(args, dict):
            args = {}
        index = self.count
        columns["ts"].append(ts)
        columns["dur"].append(dur)
        columns["kind"].append(kind)
        columns["name"].append(self.intern(name))
        pid, tid = _as_int(event.get("pid"), self), _as_int(event.get("tid"), self)
        columns["pid"].append(pid)
        columns["tid"].append(tid)
        correlation = _int_arg(args, "correlation")
        external = _int_arg(args, "External id") or _int_arg(args, "external id")
        if kind in DEVICE_KINDS or kind is Kind.DEVICE_SYNC or kind is Kind.GPU_ANNOTATION:
            columns["device"].append(_int_arg(args, "device", pid))
            columns["stream"].append(_int_arg(args, "stream", tid))
            if correlation == 0 and kind in DEVICE_KINDS:
                self._uncorrelated_device.append(index)
        else:
            columns["device"].append(-1)
            columns["stream"].append(-1)
        columns["correlation"].append(correlation)
        columns["external_id"].append(external)
        stack = args.get("Call stack")
        columns["stack"].append(self.intern(stack) if isinstance(stack, str) and stack else -1)
        dims = args.get("Input Dims")
        columns["shapes"].append(self.intern(orjson.dumps(dims).decode()) if dims else -1)
        moved = args.get("bytes", 0) if kind in (Kind.MEMCPY, Kind.MEMSET) else 0
        columns["nbytes"].append(moved if isinstance(moved, int) else 0)
        if kind in _KEPT_ARG_KINDS:
            self.extra[index] = {key: value for key, value in args.items() if key != "Call stack"}

    def _add_instant(self, event: dict) -> None:
        if event.get("name") != "[memory]":
            return
        args = event.get("args")
        ts = event.get("ts")
        if not isinstance(args, dict) or not isinstance(ts, (int, float)):
            self._skipped += 1
            return
        memory = self.memory
        memory["ts"].append(ts)
        memory["nbytes"].append(_int_arg(args, "Bytes"))
        memory["total_allocated"].append(_int_arg(args, "Total Allocated", -1))
        memory["total_reserved"].append(_int_arg(args, "Total Reserved", -1))
        memory["device_type"].append(max(-128, min(127, _int_arg(args, "Device Type"))))
        memory["device_id"].append(max(-32768, min(32767, _int_arg(args, "Device Id", -1))))
        memory["tid"].append(_as_int(event.get("tid"), self))

    def _add_flow_end(self, event: dict) -> None:
        flow_id, ts = event.get("id"), event.get("ts")
        if isinstance(flow_id, int) and isinstance(ts, (int, float)):
            key = (_as_int(event.get("pid"), self), _as_int(event.get("tid"), self), float(ts))
            self._flow_ends[key] = flow_id

    def resolve_flow_correlations(self) -> None:
        """Give device events without a 'correlation' arg the id of the flow that ends on them."""
        columns = self.columns
        for index in self._uncorrelated_device:
            key = (columns["pid"][index], columns["tid"][index], columns["ts"][index])
            flow_id = self._flow_ends.get(key)
            if flow_id is not None:
                columns["correlation"][index] = flow_id
        if self._skipped:
            self.warnings.append(f"skipped {self._skipped:,} malformed events (missing fields or negative durations)")


def _int_arg(args: dict, key: str, default: int = 0) -> int:
    value = args.get(key, default)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value:
        return int(value)
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return default
    return default


def _as_int(value: object, builder: _ColumnBuilder) -> int:
    """Pids and tids are integers, numeric strings, or labels such as 'stream 7' or 'Spans'."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        tail = value.rsplit(" ", 1)[-1]
        if tail.isdigit():
            return int(tail)
        return -1 - builder.intern(value)
    return 0


def _rank_info(path: Path, header: dict, truncated: bool, count: int) -> RankInfo:
    distributed = header.get("distributedInfo")
    if isinstance(distributed, str):
        try:
            distributed = ast.literal_eval(distributed)
        except (ValueError, SyntaxError):
            distributed = None
    if not isinstance(distributed, dict):
        distributed = {}
    rank = distributed.get("rank")
    if not isinstance(rank, int):
        match = _RANK_IN_NAME.search(path.name)
        rank = int(match.group(1)) if match else 0
    devices = tuple(d for d in header.get("deviceProperties") or header.get("computeProperties") or () if isinstance(d, dict))
    versions = {
        key: header[key]
        for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version", "schemaVersion")
        if key in header
    }
    torch_version = _torch_version(header)
    if torch_version:
        versions["torch"] = torch_version
    world = distributed.get("world_size")
    return RankInfo(
        rank=rank,
        path=str(path),
        world_size=world if isinstance(world, int) else None,
        backend=distributed.get("backend") if isinstance(distributed.get("backend"), str) else None,
        device_names=tuple(str(d.get("name", "")) for d in devices),
        device_properties=devices,
        versions=versions,
        job=str(header.get("trace_id") or header.get("skalpel_run") or "") or None,
        truncated=truncated,
        event_count=count,
    )


def _torch_version(header: dict) -> str | None:
    metadata = header.get("metadata")
    if isinstance(metadata, dict):
        system = metadata.get("system")
        if isinstance(system, dict):
            env = system.get("torch_env_info")
            if isinstance(env, dict) and isinstance(env.get("torch_version"), str):
                return env["torch_version"]
    version = header.get("torch_version") or header.get("skalpel_torch_version")
    return version if isinstance(version, str) else None


def _drop_duplicate_ranks(parsed: list[_FileColumns]) -> list[_FileColumns]:
    """Two files claiming one rank are two captures, not two ranks: keep the first, say so."""
    kept: dict[int, _FileColumns] = {}
    dropped: list[str] = []
    for item in parsed:
        if item.info.rank in kept:
            dropped.append(f"{item.path.name} (rank {item.info.rank}, same as {kept[item.info.rank].path.name})")
        else:
            kept[item.info.rank] = item
    result = sorted(kept.values(), key=lambda item: item.info.rank)
    if dropped:
        result[0].warnings.append(
            "skipped files that repeat a rank already loaded: " + "; ".join(dropped)
            + ". Analyse each capture on its own to compare them."
        )
    return result


def _intern(text: str, names: list[str], ids: dict[str, int]) -> int:
    index = ids.get(text)
    if index is None:
        index = ids[text] = len(names)
        names.append(text)
    return index


def _assemble(parsed: list[_FileColumns]) -> Trace:
    """Concatenate per-file columns, remapping each file's name ids into one shared table."""
    names: list[str] = []
    ids: dict[str, int] = {}
    pieces: dict[str, list[np.ndarray]] = {key: [] for key in parsed[0].columns}
    memory_pieces: dict[str, list[np.ndarray]] = {key: [] for key in parsed[0].memory}
    memory_ranks: list[np.ndarray] = []
    ranks: list[np.ndarray] = []
    extra: dict[int, dict] = {}
    warnings: list[str] = []
    offset = 0
    for item in parsed:
        remap = np.array([_intern(text, names, ids) for text in item.names], dtype=np.int32)
        for key, values in item.columns.items():
            column = np.frombuffer(values, dtype=values.typecode) if len(values) else np.zeros(0, values.typecode)
            if key in ("name", "stack", "shapes"):
                column = np.where(column >= 0, remap[np.maximum(column, 0)] if len(remap) else column, -1)
            pieces[key].append(column)
        for key, values in item.memory.items():
            memory_pieces[key].append(np.frombuffer(values, dtype=values.typecode) if len(values) else np.zeros(0, values.typecode))
        memory_ranks.append(np.full(len(item.memory["ts"]), item.info.rank, dtype=np.int32))
        ranks.append(np.full(len(item.columns["ts"]), item.info.rank, dtype=np.int32))
        extra.update({index + offset: args for index, args in item.extra.items()})
        warnings.extend(item.warnings)
        offset += len(item.columns["ts"])
    columns = {key: np.concatenate(values) for key, values in pieces.items()}
    memory_columns = {key: np.concatenate(values) for key, values in memory_pieces.items()}
    origin = float(columns["ts"].min()) if len(columns["ts"]) else 0.0
    columns["ts"] = columns["ts"] - origin
    memory_columns["ts"] = memory_columns["ts"] - origin
    memory = MemoryEvents(rank=np.concatenate(memory_ranks), **memory_columns)
    return Trace(
        names=names,
        ts=columns["ts"],
        dur=columns["dur"].astype(np.float64),
        kind=columns["kind"].astype(np.int8),
        name=columns["name"].astype(np.int32),
        rank=np.concatenate(ranks),
        pid=columns["pid"],
        tid=columns["tid"],
        device=columns["device"].astype(np.int32),
        stream=columns["stream"],
        correlation=columns["correlation"],
        external_id=columns["external_id"],
        stack=columns["stack"].astype(np.int32),
        shapes=columns["shapes"].astype(np.int32),
        nbytes=columns["nbytes"],
        memory=memory,
        ranks=tuple(item.info for item in parsed),
        origin_us=origin,
        extra=extra,
        warnings=warnings,
    )
