"""What a memory snapshot says, and what changed between two: the results of ``skalpel analyze/diff FILE.pickle``.

Plain frozen dataclasses with ``to_json`` (schema ``skalpel.snapshot/1`` and ``skalpel.snapshot-diff/1``);
``analysis/snapshot.py`` builds them, ``report/snapshot_render.py`` prints them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import orjson

SNAPSHOT_SCHEMA = "skalpel.snapshot/1"
SNAPSHOT_DIFF_SCHEMA = "skalpel.snapshot-diff/1"


@dataclass(frozen=True)
class DeviceMemory:
    """One device's allocator state when the snapshot was taken, and its peaks over the recorded trace."""

    device: int
    allocated_bytes: int  # blocks held by tensors (or awaiting a free on another stream)
    requested_bytes: int  # what the callers asked for: allocated minus the allocator's rounding
    reserved_bytes: int  # all segments: what the allocator took from the device
    free_in_segments_bytes: int  # reserved minus allocated: cached for reuse, or fragments
    largest_free_block_bytes: int  # the largest allocation the cache could serve without a new segment
    segments: int
    peak_allocated_bytes: int  # over the trace (the ring buffer of _record_memory_history); now when none
    peak_reserved_bytes: int
    trace_actions: int  # entries in the device trace the peaks were replayed from (0: the peaks are now)
    out_of_memory_events: int  # 'oom' actions in the trace: the allocator failed this many times


@dataclass(frozen=True)
class HeldBlock:
    device: int
    size_bytes: int
    location: str | None  # the innermost frame in the user's code; None: no stack recorded or no user frame
    stack: tuple[str, ...]  # a few Python frames, innermost first


@dataclass(frozen=True)
class SiteUsage:
    location: str  # a user frame, or "(no user frame)" / "(no stack recorded)"
    bytes: int
    blocks: int


@dataclass(frozen=True)
class SnapshotSummary:
    path: str
    devices: tuple[DeviceMemory, ...]
    largest_blocks: tuple[HeldBlock, ...]  # the allocated blocks, largest first
    by_site: tuple[SiteUsage, ...]  # allocated bytes per innermost user frame, largest first
    notes: tuple[str, ...]  # what the snapshot cannot tell (no stacks, no trace, an old format)
    schema: str = SNAPSHOT_SCHEMA

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2)


@dataclass(frozen=True)
class SiteChange:
    location: str
    before_bytes: int
    after_bytes: int
    delta_bytes: int


@dataclass(frozen=True)
class SnapshotDiff:
    before: str
    after: str
    allocated_delta_bytes: int
    reserved_delta_bytes: int
    before_allocated_bytes: int
    after_allocated_bytes: int
    before_reserved_bytes: int
    after_reserved_bytes: int
    grew: tuple[SiteChange, ...]  # sites holding more bytes after, largest growth first
    shrank: tuple[SiteChange, ...]
    schema: str = SNAPSHOT_DIFF_SCHEMA

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2)
