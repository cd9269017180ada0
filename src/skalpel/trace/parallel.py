"""Decode one large uncompressed trace in several processes, by byte ranges of its event array.

The loader cuts a complete document into batches of a few megabytes (``fastsplit``); here
the same batches, computed the same way, are dealt out in contiguous groups, one group per
core. This process decodes the first group straight into its own ``ColumnBuilder``; each
other group is decoded by a forked child into a builder of its own, whose state comes back
through a pipe and is joined in order: its name ids (names, stacks, shapes, and pid/tid
labels) remapped onto this builder's table, its event indices shifted. Because the batches
are the serial loader's own, names are interned in the same order, and every column, name
and warning equals the serial load's.

A batch that does not decode (a cut inside an event, bytes that are not JSON) ends the
parallel part there: the groups before it are joined and the loader goes on serially from
that batch, with its retries and its exact scanner, as it would have anyway.

Fork, not spawn or forkserver: the children need only numpy and msgspec, already imported,
and the file's map, inherited for free; a spawned child would spend some 0.1 s importing
them again and reopen the file, as much as it saves on a 50 MB trace (``skalpel.forking``).
"""

from __future__ import annotations

import mmap
import os
from typing import Callable, NamedTuple

import numpy as np

from .. import env
from ..cores import idle_cores
from ..forking import Child
from .columns import ColumnBuilder
from .fastsplit import Layout, next_cut
from .source import release

# Below this one process decodes alone. Measured on 2 cores with the other core idle: two processes loaded 40 MiB
# in 0.64x the time (24 MiB: 0.78x; 8-16 MiB: 0.93x). With it busy they took 1.25x, so only idle cores count
# (``process_count``). Once the parent stopped keeping the pages that finding the cuts maps (``_batches``), the
# peak RSS of a split load is below the serial load's (df_index_resolver, 51 MiB: 53 vs 59 MiB at the end of load).
PARALLEL_FROM_BYTES = 16 << 20
# What this process decodes in the time its ``Split.meanwhile`` takes (for `skalpel analyze`, importing the analyses,
# findings and terminal report: 65-85 ms here, at about 180 MB/s): it takes that much less of the file than a child.
MEANWHILE_BYTES = 12 << 20
PROCESSES_ENV = env.LOAD_PROCESSES.name  # "1" turns the parallel load off; a number caps the processes

Decode = Callable[[ColumnBuilder, object, int, int, object], bool]
"""``loader._decode_into``: (builder, data, start, end, outcome) -> whether the bytes decoded."""


class Batch(NamedTuple):
    start: int
    end: int  # this batch's bytes are data[start:end]
    next_start: int


class Meanwhile:
    """A callable run at most once: the caller's work that can overlap the children's decoding."""

    def __init__(self, work: Callable[[], object] | None) -> None:
        self.work = work

    def __call__(self) -> None:
        work, self.work = self.work, None
        if work is not None:
            work()

    @property
    def pending(self) -> bool:
        return self.work is not None


class Split(NamedTuple):
    processes: int = 1
    meanwhile: Meanwhile = Meanwhile(None)


ONE_PROCESS = Split()


def process_count(requested: int | None = None) -> int:
    """Processes for one file: ``requested`` (``--workers``), else $SKALPEL_LOAD_PROCESSES, else the usable cores
    that are idle now (a process on a busy core only adds the cost of joining its share)."""
    if requested is None:
        requested = env.count(env.LOAD_PROCESSES)
    return max(1, requested if requested is not None else idle_cores())


def decode_in_parallel(data, layout: Layout, builder: ColumnBuilder, outcome, decode: Decode,
                       report: Callable[[float], None], split: Split) -> int:  # fmt: skip
    """Decode the event array's batches into ``builder``; the offset from which the loader must go on.

    Returns ``layout.start`` (nothing done) when the file is not worth it: not a mapped file,
    smaller than ``PARALLEL_FROM_BYTES``, or one process only. Returns ``layout.stop`` when
    every batch was decoded. A child that dies (killed for memory) leaves its group and the
    rest to the serial loader.
    """
    if split.processes <= 1 or not hasattr(os, "fork") or not isinstance(data, mmap.mmap):
        return layout.start  # one process asked for, no fork (Windows), or not a mapped file (gzip, small)
    if layout.stop - layout.start < PARALLEL_FROM_BYTES:
        return layout.start
    lighter = MEANWHILE_BYTES if split.meanwhile.pending else 0
    groups = _groups(_batches(data, layout), split.processes, lighter)
    if len(groups) <= 1:
        return layout.start
    children = [_fork(data, group, outcome, decode) for group in groups[1:]]
    try:
        split.meanwhile()
        failed_at = _decode_group(builder, data, groups[0], outcome, decode)
        if failed_at is not None:
            return failed_at
        report(groups[0][-1].end / len(data))
        for child, group in zip(children, groups[1:]):
            state = child.result()
            if state is None or state["mixed_ids"]:
                return group[0].start  # the child died, or its pid/tid ids cannot be told apart: serially from here
            _join(builder, state)
            outcome.repaired += state["repaired"]
            if state["failed_at"] is not None:
                return state["failed_at"]
            report(group[-1].end / len(data))
        return layout.stop
    finally:
        for child in children:
            child.end()


def _batches(data, layout: Layout) -> list[Batch]:
    """The serial loader's batches (``loader._read_guessed`` before any retry)."""
    batches = []
    start = layout.start
    while start < layout.stop:
        end, next_start = next_cut(data, start, layout.stop)
        batches.append(Batch(start, end, next_start))
        release(data, end)  # the kernel maps a megabyte or two around each cut looked at: not kept
        start = next_start
    return batches


def _groups(batches: list[Batch], processes: int, lighter: int = 0) -> list[list[Batch]]:
    """Contiguous runs of batches, at most ``processes`` of them, that take about equally long: the first
    (this process's) ``lighter`` bytes smaller than the others, which are of about equal bytes."""
    if not batches:
        return []
    first = batches[0].start
    total = batches[-1].end - first
    share = max((total + lighter) / processes, 1)  # each child's bytes
    cuts = [max(share - lighter, 0) + share * n for n in range(processes - 1)]  # where groups 2, 3... begin
    groups: list[list[Batch]] = [[]]
    for batch in batches:
        if len(groups) <= len(cuts) and batch.start - first >= cuts[len(groups) - 1] and groups[-1]:
            groups.append([])
        groups[-1].append(batch)
    return groups


def _decode_group(builder: ColumnBuilder, data, group: list[Batch], outcome, decode: Decode) -> int | None:
    """Decode each batch of the group; the start of the first batch that fails, else None."""
    for batch in group:
        if not decode(builder, data, batch.start, batch.end, outcome):
            return batch.start
        release(data, batch.next_start)  # as the serial loader does: parsed pages leave this process's memory
    return None


class _RangeBuilder(ColumnBuilder):
    """A child's builder, which also notes what its pid and tid columns hold.

    A label such as 'stream 7' becomes the negative id -1 - (its name id), which must be
    remapped on joining; a negative integer pid stays as it is. When one child's columns
    hold both, they cannot be told apart, and its range is decoded serially instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self.labels = 0
        self.negative_ints = False

    def _id(self, value: object) -> int:
        result = super()._id(value)
        if result < 0:
            if isinstance(value, str):
                self.labels += 1
            else:
                self.negative_ints = True
        return result

    def _ids(self, values: list) -> np.ndarray:
        labels = self.labels
        ids = super()._ids(values)
        if self.labels == labels and len(ids) and ids.min() < 0:  # integers only, taken at C speed
            self.negative_ints = True
        return ids


def _state(builder: _RangeBuilder, failed_at: int | None, repaired: int) -> dict:
    """What the parent needs of a child's builder to join it (ColumnBuilder's accumulating fields)."""
    return {
        "names": builder.interner.names,
        "columns": {key: column.finish() for key, column in builder._columns.items()},
        "memory_columns": {key: column.finish() for key, column in builder._memory_columns.items()},
        "flow_parts": builder._flow_parts, "uncorrelated": builder._uncorrelated, "extra": builder.extra,
        "count": builder.count, "skipped": builder.skipped, "seen": builder.seen, "phased": builder.phased,
        "unphased": builder.unphased, "unknown_phases": builder.unknown_phases,
        "labels": builder.labels > 0, "mixed_ids": builder.labels > 0 and builder.negative_ints,
        "failed_at": failed_at, "repaired": repaired,
    }  # fmt: skip


def _join(builder: ColumnBuilder, state: dict) -> None:
    """Append a child's batches to ``builder`` as if it had decoded them itself."""
    remap = np.fromiter((builder.interner[name] for name in state["names"]), np.int32, len(state["names"]))
    labels = state["labels"]
    offset = builder.count
    for key, values in state["columns"].items():
        if key == "name":
            values = remap[values]
        elif key in ("stack", "shapes"):
            values = _remapped_ids(values, remap)
        elif key in ("pid", "tid") and labels:
            values = _remapped_labels(values, remap)
        builder._columns[key].append(values)
    for key, values in state["memory_columns"].items():
        if key == "tid" and labels:
            values = _remapped_labels(values, remap)
        builder._memory_columns[key].append(values)
    for pid, tid, ts, ids in state["flow_parts"]:
        if labels:
            pid, tid = _remapped_labels(pid, remap), _remapped_labels(tid, remap)
        builder._flow_parts.append((pid, tid, ts, ids))
    builder._uncorrelated.extend(indices + offset for indices in state["uncorrelated"])
    builder.extra.update((index + offset, args) for index, args in state["extra"].items())
    builder.count += state["count"]
    builder.skipped += state["skipped"]
    builder.seen += state["seen"]
    builder.phased = builder.phased or state["phased"]
    builder.unphased += state["unphased"]
    for phase, count in state["unknown_phases"].items():
        builder.unknown_phases[phase] = builder.unknown_phases.get(phase, 0) + count


def _remapped_ids(ids: np.ndarray, remap: np.ndarray) -> np.ndarray:
    """Name ids (-1: none) of a child's table as ids of the parent's."""
    return np.where(ids >= 0, remap[np.maximum(ids, 0)], ids)


def _remapped_labels(ids: np.ndarray, remap: np.ndarray) -> np.ndarray:
    """Pids or tids whose negative values are labels (-1 - name id) of a child's table."""
    return np.where(ids < 0, -1 - remap[np.maximum(-1 - ids, 0)].astype(np.int64), ids)


def _fork(data, group: list[Batch], outcome, decode: Decode) -> Child:
    """A forked child decoding ``group`` into a builder of its own: its result is that builder's state."""

    def decode_group() -> dict:
        builder = _RangeBuilder()
        repaired_before = outcome.repaired
        failed_at = _decode_group(builder, data, group, outcome, decode)
        return _state(builder, failed_at, outcome.repaired - repaired_before)

    return Child(decode_group)
