"""Load torch.profiler (Kineto) traces into the columnar ``Trace`` model.

Accepts ``.json`` and ``.json.gz`` files and folders of them (what
``tensorboard_trace_handler`` writes, one file per rank). Every Kineto format from
torch 1.8 to today loads: old and new category names, string or integer pids and
tids, nanosecond-era fractional timestamps, flows named ``ac2g`` or ``async``,
CUDA, ROCm, MTIA and CPU-only traces.

A complete document is cut into batches by ``fastsplit`` (checked by parsing) and
each batch is decoded by ``events`` and turned into columns by ``columns``; a cut-off
or damaged document goes through the exact scanner of ``jsonscan`` instead, which
recovers every whole event. A batch that strict JSON refuses is read again as Python's
``json.loads(strict=False)`` would (``rawcontrols``: torch writes control characters into
strings raw) and with invalid UTF-8 replaced; only an event that still does not parse is
skipped, and the note says why. Only one batch of decoded events is alive at a time. A
large .json.gz is never inflated whole: ``gzstream`` feeds its text to the same paths a
window at a time.
"""

from __future__ import annotations

import ast
import errno
import gc
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import orjson

from ..display import cut_name
from ..errors import TraceError
from . import gzstream, line_samples, module_sizes_header, precision_header, run_queue_header
from .assemble import FileColumns, assemble
from .columns import ColumnBuilder
from .events import BatchSyntaxError, decode_events
from .fastsplit import Layout, guess_layout, next_cut
from .jsonscan import NotATraceError, iter_batch_ranges, split_document
from .model import CUT_FILE, RankInfo, Trace
from .outliers import set_aside_far_events
from .parallel import ONE_PROCESS, Meanwhile, Split, decode_in_parallel, process_count
from .rawcontrols import escape_raw_controls
from .source import GzipText, available_memory, describe_foreign, is_gzip, read_source, release

ProgressCallback = Callable[[int, int], None]
"""Called with (work done, total work) while loading, in bytes of the files on disk, over all files."""

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
_SKALPEL_OUTPUTS = ("report.json", "flamegraph.speedscope.json", "summary.json")
# skalpel watch's dumps of a stopped or asked run (hang-<k>.json, fr-trace-<k>.json, asked-<id>.json): watching/hangs
_WATCH_DUMP = re.compile(r"(?:hang-\d+|fr-trace-\d+|asked-[\w-]+)\.json")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_GUNZIP_SHARE = 0.3  # of a .gz file's progress read whole: decompressing; the rest is parsing
WHOLE_GZIP_BYTES = 16 << 20  # a .json.gz whose text is shorter is read whole, like a plain file; longer, as a stream
_CUT_RETRIES = 4


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders into the trace files inside them, skipping skalpel's own outputs."""
    found: list[Path] = []
    for raw in paths:
        if str(raw) == "":
            raise TraceError("an empty path ('') was given: name a trace file or folder")
        path = Path(raw)
        mode = path_mode(path)
        if stat.S_ISDIR(mode):
            inside = sorted(p for p in path.rglob("*") if p.is_file() and _looks_like_trace_file(p))
            if not inside:
                raise TraceError(f"{path}: no trace files (*.json or *.json.gz) in this folder")
            found.extend(inside)
        elif stat.S_ISREG(mode):
            found.append(path)
        else:
            raise TraceError(f"{path}: {_special_file(mode)}, not a trace file")
    return found


def path_mode(path: Path) -> int:
    """The file type bits of ``path`` (following links), or a TraceError that names the problem."""
    try:
        return path.stat().st_mode
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise TraceError(f"{path}: no such file or folder") from None
        if error.errno == errno.ELOOP:
            raise TraceError(f"{path}: a loop of symbolic links (it never reaches a file)") from None
        if error.errno == errno.ENAMETOOLONG:
            raise TraceError(f"{cut_name(str(path), 80)}: the path is too long for the file system") from None
        raise TraceError(f"{path}: cannot read it ({error.strerror or error})") from None


def _special_file(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _looks_like_trace_file(path: Path) -> bool:
    name = path.name
    if name in _SKALPEL_OUTPUTS or name.startswith("report") or _WATCH_DUMP.fullmatch(name):
        return False
    return name.endswith(".json") or name.endswith(".json.gz")


def load(
    paths: str | Path | Iterable[str | Path],
    *,
    on_progress: ProgressCallback | None = None,
    workers: int | None = None,
    while_decoding: Callable[[], object] | None = None,
) -> Trace:
    """Load one or more trace files (or folders of them) into one ``Trace``.

    A large uncompressed file is decoded by ``workers`` processes (``trace.parallel``; default:
    $SKALPEL_LOAD_PROCESSES, else the cores this process may use that are idle; 1: in this
    process alone). ``while_decoding`` is called once, while forked processes decode (this
    one decodes less to make room for it), or else after the load: the caller's imports.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = find_trace_files(paths)
    meanwhile = Meanwhile(while_decoding)
    split = Split(process_count(workers), meanwhile)
    progress = _Progress(files, on_progress)
    parsed: list[FileColumns] = []
    failed: list[str] = []
    for index, path in enumerate(files):
        try:
            parsed.append(_parse_file(path, progress.of_file(index), split))
        except TraceError as error:
            if len(files) == 1:
                raise
            failed.append(str(error))
    meanwhile()
    if not parsed:
        raise TraceError(f"none of the {len(files)} files loads; the first: {failed[0]}")
    parsed = drop_duplicate_ranks(parsed)
    if failed:  # one damaged rank file should not hide the others
        parsed[0].warnings.extend(skipped_notes(failed))
    return assemble(parsed)


SKIPPED_LISTED = 5  # files that do not load named one note each; more are one note for all


def skipped_notes(reasons: list[str]) -> list[str]:
    """The job's notes on files that do not load: one each for a few, one for them all when many (10,000 tiny files)."""
    if len(reasons) <= SKIPPED_LISTED:
        return [f"skipped a file that does not load: {reason}" for reason in reasons]
    shown = "; ".join(reasons[:3])
    return [f"skipped {len(reasons):,} files that do not load, among them: {shown}; and {len(reasons) - 3:,} more "
            "(analyse one on its own to see why it does not load)"]


def load_one(path: Path, *, on_fraction: Callable[[float], None] | None = None, job_ranks: int | None = None) -> Trace:
    """One trace file on its own: one rank of a job that is reduced rank by rank (``skalpel.job.rank``).

    ``job_ranks`` is the number of rank files of the whole job, for what depends on it (the
    group size of collectives whose trace does not say).
    """
    trace = assemble([_parse_file(Path(path), on_fraction or (lambda fraction: None))])
    trace.job_ranks = job_ranks
    return trace


class _Progress:
    """Maps each file's progress (a fraction) onto bytes on disk over all files."""

    def __init__(self, files: list[Path], callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.sizes = [_size_on_disk(path) for path in files]
        self.total = max(sum(self.sizes), 1)

    def of_file(self, index: int) -> Callable[[float], None]:
        base, size, callback, total = sum(self.sizes[:index]), self.sizes[index], self.callback, self.total
        if callback is None:
            return lambda fraction: None
        return lambda fraction: callback(base + int(size * min(max(fraction, 0.0), 1.0)), total)


def _size_on_disk(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class _Outcome:
    header: dict
    truncated: bool = False
    recovered_bytes: int = 0
    repaired: int = 0  # batches or events whose invalid UTF-8 bytes were replaced
    unreadable: int = 0  # events that are not valid JSON, skipped
    first_unreadable: str = ""  # what is wrong with the first of them


def _parse_file(path: Path, report: Callable[[float], None], split: Split = ONE_PROCESS) -> FileColumns:
    builder = ColumnBuilder()
    with collector_paused():
        outcome, size, gzip_truncated = _read_text(path, builder, report, split)
    report(1.0)
    truncated = outcome.truncated or gzip_truncated
    warnings = _warnings(path, builder, outcome, truncated, size)
    if builder.count == 0 and builder.seen and not builder.phased:
        raise TraceError(
            f"{path}: JSON of another shape: {builder.seen:,} object(s) with no 'ph' field, so not trace events"
        )
    if builder.count == 0 and not truncated:
        raise TraceError(f"{path}: the trace holds no events")
    if builder.count == 0:
        raise TraceError(f"{path}: the file is cut off before its first complete event")
    columns, memory = builder.finish()
    far = set_aside_far_events(columns, memory, builder.extra, builder.names)
    if far is not None:
        warnings.append(f"{path.name}: {far}")
    info = _rank_info(path, outcome.header, truncated, len(columns["ts"]))
    return FileColumns(path, info, builder.names, columns, memory, builder.extra, warnings)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Decoding makes and drops millions of lists and structs but no reference cycles: the cyclic garbage
    collector, run every few hundred of them, would only walk the heap (some 15% of the builder's time).
    Also the driver of a job, which receives and joins millions of objects of every rank's summary."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_text(
    path: Path, builder: ColumnBuilder, report: Callable[[float], None], split: Split = ONE_PROCESS
) -> tuple[_Outcome, int, bool]:
    """Decode the file's events into ``builder``: the outcome, the length of its text, whether a gzip stream was cut.

    The text is gone when this returns, so the columns are finished without it beside them.
    """
    try:
        if not is_gzip(path):
            data, _ = read_source(path)
            return _read_whole(data, builder, path, report, split), len(data), False
        share = [_GUNZIP_SHARE]
        text = GzipText(path, lambda fraction: report(share[0] * fraction))
        head, whole = text.read_head(WHOLE_GZIP_BYTES)
        if whole:
            parse = lambda fraction: report(_GUNZIP_SHARE + (1 - _GUNZIP_SHARE) * fraction)  # noqa: E731
            return _read_whole(head, builder, path, parse), len(head), text.cut
        share[0] = 1.0  # streamed: inflating and decoding go together, so the file read is the progress
        decoder = _StreamDecoder(builder, path)
        outcome, size = gzstream.read_events(iter(text), head, decoder, path, text.declared_size(), available_memory())
        return outcome, size, text.cut
    except MemoryError:
        raise TraceError(f"{path}: not enough memory to load it") from None


def _read_whole(data, builder: ColumnBuilder, path: Path, report: Callable[[float], None], split: Split = ONE_PROCESS) -> _Outcome:
    """The events of a whole document (or of the end of a streamed one): named if it is not a trace."""
    foreign = describe_foreign(data)
    if foreign is not None:
        raise TraceError(f"{path}: {foreign}")
    return _read_events(data, builder, path, report, split)


class _StreamDecoder:
    """The loader's paths as ``gzstream`` uses them, all into one file's builder."""

    def __init__(self, builder: ColumnBuilder, path: Path) -> None:
        self.builder, self.path = builder, path
        self.outcome = _Outcome({})  # counts repairs in the windows; the header comes with the end

    def batches(self, text: bytearray, stop: int) -> int | None:
        return _read_guessed(text, Layout({}, 0, stop), self.builder, self.outcome, _quiet)

    def spans(self, text: bytearray, spans: np.ndarray) -> None:
        _decode_spans(text, spans, self.builder, self.outcome, _quiet)

    def document(self, text: bytes | bytearray) -> _Outcome:
        outcome = _read_whole(text, self.builder, self.path, _quiet)
        outcome.repaired += self.outcome.repaired
        if self.outcome.unreadable:  # the windows came first
            outcome.first_unreadable = self.outcome.first_unreadable
        outcome.unreadable += self.outcome.unreadable
        return outcome

    def column_bytes(self) -> int:
        return self.builder.nbytes()


def _quiet(fraction: float) -> None:
    """Progress within a window: the file read already says how far the load is."""


def _warnings(path: Path, builder: ColumnBuilder, outcome: _Outcome, truncated: bool, size: int) -> list[str]:
    warnings = []
    if outcome.unreadable:
        warnings.append(f"{path.name}: skipped {outcome.unreadable:,} malformed events that do not parse as JSON "
                        f"(the first: {outcome.first_unreadable})")
    if builder.skipped:
        warnings.append(
            f"{path.name}: skipped {builder.skipped:,} malformed events (missing or invalid fields, negative "
            "durations, nesting too deep)"
        )
    if builder.unphased:
        warnings.append(f"{path.name}: ignored {builder.unphased:,} events without a valid 'ph' (phase) field")
    if builder.unknown_phases:
        phases = ", ".join(repr(cut_name(phase, 12)) for phase in sorted(builder.unknown_phases)[:5])
        warnings.append(
            f"{path.name}: ignored {sum(builder.unknown_phases.values()):,} events of phases the trace format "
            f"does not define ({phases})"
        )
    if outcome.repaired:
        warnings.append(f"{path.name}: some strings held bytes that are not UTF-8; they were replaced with U+FFFD")
    if truncated:
        warnings.append(cut_file_note(path.name, size, builder.count))
    return warnings


def cut_file_note(name: str, size: int, events: int) -> str:
    """What a user needs to know of a file cut off: where, what was kept, and what is lost first."""
    return (f"{name}: {CUT_FILE} mid-way (it ends at {size / 1e6:,.1f} MB: a killed process, or a copy cut short); "
            f"the {events:,} events before the cut were read, the rest is missing. Kineto writes a trace's host ops "
            "before its launches and device events, so the device's record is the first to go: device idle is not "
            "judged where it stops before the host's")


def _read_events(
    data: bytes | bytearray, builder: ColumnBuilder, path: Path, report: Callable[[float], None], split: Split = ONE_PROCESS
) -> _Outcome:
    """Fast path for complete documents; the exact scanner for the rest (or from where a batch failed)."""
    layout = guess_layout(data)
    resume_at = 0
    if layout is not None:
        outcome = _Outcome(layout.header, recovered_bytes=len(data))
        resume_at = _read_guessed(data, layout, builder, outcome, report, split)
        if resume_at is None:
            return outcome
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)  # a mapped file: the exact scanner reads it whole anyway
    try:
        document = split_document(data)
    except NotATraceError as error:
        raise TraceError(f"{path}: {error}") from None
    outcome = _Outcome(document.header, document.truncated, document.recovered_bytes)
    spans = document.event_spans
    if resume_at:
        spans = spans[spans[:, 0] >= resume_at]
    _decode_spans(data, spans, builder, outcome, report)
    return outcome


def _decode_spans(data, spans: np.ndarray, builder: ColumnBuilder, outcome: _Outcome, report) -> None:
    """Decode the events at exact byte ranges, a batch at a time, one by one where a batch fails."""
    for first, last in iter_batch_ranges(spans):
        start, end = int(spans[first, 0]), int(spans[last - 1, 1])
        if not _decode_into(builder, data, start, end, outcome):
            for one_start, one_end in spans[first:last].tolist():
                if not _decode_into(builder, data, one_start, one_end, outcome):
                    if not outcome.unreadable:
                        outcome.first_unreadable = _syntax_error(bytes(data[one_start:one_end]))
                    outcome.unreadable += 1
        report(end / max(len(data), 1))


def _read_guessed(data, layout: Layout, builder: ColumnBuilder, outcome: _Outcome, report, split: Split = ONE_PROCESS) -> int | None:
    """Decode the batches ``fastsplit`` guesses; the offset to go on from exactly when one fails, else None."""
    start = decode_in_parallel(data, layout, builder, outcome, _decode_into, report, split)  # layout.start: not worth it
    while start < layout.stop:
        end, next_start = next_cut(data, start, layout.stop)
        for _ in range(_CUT_RETRIES):
            if _decode_into(builder, data, start, end, outcome):
                break
            if end >= layout.stop:
                return start
            end, next_start = next_cut(data, end, layout.stop, at_least=1)  # a cut inside an event: go further
        else:
            return start
        report(end / max(len(data), 1))
        release(data, next_start)
        start = next_start
    return None


def _decode_into(builder: ColumnBuilder, data, start: int, end: int, outcome: _Outcome) -> bool:
    """Decode data[start:end] (a run of events) into the builder; False when it is not valid JSON."""
    buffer = b"".join((b"[", memoryview(data)[start:end], b"]"))  # one copy (a bytearray grown twice: two)
    try:
        events, not_events = decode_events(buffer)
    except BatchSyntaxError:
        decoded = _decode_repaired(buffer, outcome)
        if decoded is None:
            return False
        events, not_events = decoded
    builder.skipped += not_events
    builder.add(events)
    return True


def _decode_repaired(buffer: bytes, outcome: _Outcome) -> tuple[list, int] | None:
    """A batch that is not strict JSON, decoded after the repairs real traces need (None: it still is not JSON).

    Raw control characters inside strings (torch writes them unescaped) are read as those characters;
    invalid UTF-8 is replaced with U+FFFD. Only batches that fail to decode pay for these checks.
    """
    escaped = escape_raw_controls(buffer)
    if escaped is not None:
        try:
            return decode_events(escaped)
        except BatchSyntaxError:
            buffer = escaped  # maybe invalid UTF-8 as well
    repaired = _repair_utf8(buffer)
    if repaired is None:
        return None
    try:
        decoded = decode_events(repaired)
    except BatchSyntaxError:
        return None
    outcome.repaired += 1
    return decoded


def _syntax_error(event: bytes) -> str:
    """What is wrong with one event that is not valid JSON, and how it begins, for the load's note."""
    try:
        orjson.loads(escape_raw_controls(event) or event)
        problem = "nesting too deep"  # JSON, but deeper than the event decoder goes
    except orjson.JSONDecodeError as error:
        problem = "nesting too deep" if "recursion" in str(error).lower() else str(error)
    except RecursionError:
        problem = "nesting too deep"
    at = re.search(r"\(char (\d+)\)", problem)
    if at is not None:  # the text just before the fault (not the fault itself: a NaN quoted would read as a value)
        before = " ".join(event[:int(at.group(1))].decode("utf-8", "replace").split())  # pretty-printed: one line
        return f"{problem}, after ...{before[-60:]}" if len(before) > 60 else f"{problem}, after {before}"
    start = " ".join(event[:200].decode("utf-8", "replace").split())
    return f"{problem}, in {cut_name(start, 60)}"


def _repair_utf8(buffer: bytes) -> bytes | None:
    """The buffer with invalid UTF-8 replaced by U+FFFD, or None when it was valid UTF-8."""
    try:
        buffer.decode("utf-8")
    except UnicodeDecodeError:
        return buffer.decode("utf-8", "replace").encode("utf-8")
    return None


def _rank_info(path: Path, header: dict, truncated: bool, count: int) -> RankInfo:
    distributed = header.get("distributedInfo")
    if isinstance(distributed, str):
        try:
            distributed = ast.literal_eval(distributed[:4096])  # a small dict as text; more is not one
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            distributed = None
    if not isinstance(distributed, dict):
        distributed = {}
    rank = distributed.get("rank")
    if not _is_count(rank):
        match = _RANK_IN_NAME.search(path.name)
        rank = int(match.group(1)) if match and _is_count(int(match.group(1))) else 0
    listed = header.get("deviceProperties") or header.get("computeProperties")
    devices = tuple(d for d in listed if isinstance(d, dict)) if isinstance(listed, list) else ()
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
        world_size=world if _is_count(world) and world > 0 else None,
        backend=distributed.get("backend") if isinstance(distributed.get("backend"), str) else None,
        device_names=tuple(str(d.get("name", "")) for d in devices),
        device_properties=devices,
        versions=versions,
        # Kineto's trace_id is drawn per process (every rank of one job has its own), so it
        # cannot tell runs apart; skalpel's capture writes one run id shared by all ranks.
        job=str(header.get("skalpel_run") or "") or None,
        host=header["host_name"] if isinstance(header.get("host_name"), str) and header["host_name"] else None,
        truncated=truncated,
        event_count=count,
        compile_log=header["skalpel_compile"] if isinstance(header.get("skalpel_compile"), dict) else None,
        line_samples=line_samples.parse(header.get(line_samples.HEADER_KEY)),
        precision=precision_header.parse(header.get(precision_header.HEADER_KEY)),
        module_sizes=module_sizes_header.parse(header.get(module_sizes_header.HEADER_KEY)),
        run_queue=run_queue_header.parse(header.get(run_queue_header.HEADER_KEY)),
    )


def _is_count(value: object) -> bool:
    """A rank or world size as a trace may state it: a whole number that fits the int32 rank column."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


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


def drop_duplicate_ranks(parsed: list) -> list:
    """Two files claiming one rank are two captures, not two ranks: keep the first, say so.

    Items are loaded files (``FileColumns``) or rank summaries: anything with ``info``, ``path`` and ``warnings``.
    """
    kept: dict[int, FileColumns] = {}
    dropped: list[str] = []
    for item in parsed:
        if item.info.rank in kept:
            dropped.append(f"{item.path.name} (rank {item.info.rank}, same as {kept[item.info.rank].path.name})")
        else:
            kept[item.info.rank] = item
    result = sorted(kept.values(), key=lambda item: item.info.rank)
    if dropped:
        listed = "; ".join(dropped[:SKIPPED_LISTED]) + (f"; and {len(dropped) - SKIPPED_LISTED:,} more" if len(dropped) > SKIPPED_LISTED else "")
        result[0].warnings.append(
            f"skipped {'files that repeat' if len(dropped) > 1 else 'a file that repeats'} a rank already loaded: " + listed
            + ". Analyse each capture on its own to compare them."
        )
    return result
