"""What a memory snapshot holds: per device, the largest blocks, usage by user line; and two snapshots' difference.

Peaks come from replaying the device trace backwards from the state the snapshot holds: each
``alloc`` raised the allocated bytes by its size and each ``free_completed`` lowered them, so the level
before every action is known exactly, back to the oldest action the ring buffer kept
(``segment_alloc``/``segment_map`` and ``segment_free``/``segment_unmap`` likewise for reserved bytes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..result.snapshot import DeviceMemory, HeldBlock, SiteChange, SiteUsage, SnapshotDiff, SnapshotSummary
from ..trace.snapshot import Action, Segment, Snapshot

NO_STACK = "(no stack recorded)"
NO_USER_FRAME = "(no user frame)"
_ALLOCATED_BY = {"alloc": 1, "free_completed": -1}
_RESERVED_BY = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass(frozen=True)
class SnapshotOptions:
    largest_blocks: int = 10
    sites: int = 15
    changes: int = 15
    min_change_bytes: int = 1  # a site whose bytes moved less than this is not listed in a diff


def summarize_snapshot(snapshot: Snapshot, *, options: SnapshotOptions = SnapshotOptions()) -> SnapshotSummary:
    by_device: dict[int, list[Segment]] = defaultdict(list)
    for segment in snapshot.segments:
        by_device[segment.device].append(segment)
    actions: dict[int, list[Action]] = defaultdict(list)
    for action in snapshot.actions:
        actions[action.device].append(action)
    devices = tuple(_device(device, by_device[device], actions[device]) for device in sorted(by_device))
    held = [(segment.device, block) for segment in snapshot.segments for block in segment.blocks if block.allocated]
    held.sort(key=lambda pair: -pair[1].size)
    largest = tuple(HeldBlock(device=device, size_bytes=block.size, location=block.location, stack=block.stack)
                    for device, block in held[: options.largest_blocks])  # fmt: skip
    return SnapshotSummary(
        path=snapshot.path, devices=devices, largest_blocks=largest,
        by_site=_by_site(snapshot)[: options.sites], notes=_notes(snapshot, devices),
    )  # fmt: skip


def diff_snapshots(before: Snapshot, after: Snapshot, *, options: SnapshotOptions = SnapshotOptions()) -> SnapshotDiff:
    """What grew from ``before`` to ``after``, by the user line that allocated it."""
    old = {site.location: site.bytes for site in _by_site(before)}
    new = {site.location: site.bytes for site in _by_site(after)}
    changes = [SiteChange(location=where, before_bytes=old.get(where, 0), after_bytes=new.get(where, 0),
                          delta_bytes=new.get(where, 0) - old.get(where, 0))
               for where in old.keys() | new.keys()]  # fmt: skip
    changes = [change for change in changes if abs(change.delta_bytes) >= options.min_change_bytes]
    grew = sorted((c for c in changes if c.delta_bytes > 0), key=lambda c: (-c.delta_bytes, c.location))
    shrank = sorted((c for c in changes if c.delta_bytes < 0), key=lambda c: (c.delta_bytes, c.location))
    allocated = [sum(b.size for s in side.segments for b in s.blocks if b.allocated) for side in (before, after)]
    reserved = [sum(s.total_size for s in side.segments) for side in (before, after)]
    return SnapshotDiff(
        before=before.path, after=after.path,
        allocated_delta_bytes=allocated[1] - allocated[0], reserved_delta_bytes=reserved[1] - reserved[0],
        before_allocated_bytes=allocated[0], after_allocated_bytes=allocated[1],
        before_reserved_bytes=reserved[0], after_reserved_bytes=reserved[1],
        grew=tuple(grew[: options.changes]), shrank=tuple(shrank[: options.changes]),
    )  # fmt: skip


def _device(device: int, segments: list[Segment], actions: list[Action]) -> DeviceMemory:
    blocks = [block for segment in segments for block in segment.blocks]
    allocated = sum(block.size for block in blocks if block.allocated)
    reserved = sum(segment.total_size for segment in segments)
    return DeviceMemory(
        device=device, allocated_bytes=allocated,
        requested_bytes=sum(block.requested_size for block in blocks if block.allocated),
        reserved_bytes=reserved, free_in_segments_bytes=max(reserved - allocated, 0),
        largest_free_block_bytes=max((block.size for block in blocks if not block.allocated), default=0),
        segments=len(segments),
        peak_allocated_bytes=_peak_before(allocated, actions, _ALLOCATED_BY),
        peak_reserved_bytes=_peak_before(reserved, actions, _RESERVED_BY),
        trace_actions=len(actions), out_of_memory_events=sum(action.action == "oom" for action in actions),
    )  # fmt: skip


def _peak_before(now: int, actions: list[Action], sign: dict[str, int]) -> int:
    """The highest level over the trace, replaying it backwards from ``now``."""
    level = peak = now
    for action in reversed(actions):
        level -= sign.get(action.action, 0) * action.size
        peak = max(peak, level)
    return peak


def _by_site(snapshot: Snapshot) -> list[SiteUsage]:
    bytes_at: dict[str, int] = defaultdict(int)
    blocks_at: dict[str, int] = defaultdict(int)
    for segment in snapshot.segments:
        for block in segment.blocks:
            if block.allocated:
                where = block.location or (NO_USER_FRAME if block.stack else NO_STACK)
                bytes_at[where] += block.size
                blocks_at[where] += 1
    sites = [SiteUsage(location=where, bytes=size, blocks=blocks_at[where]) for where, size in bytes_at.items()]
    return sorted(sites, key=lambda site: (-site.bytes, site.location))


def _notes(snapshot: Snapshot, devices: tuple[DeviceMemory, ...]) -> tuple[str, ...]:
    notes = []
    held = [block for segment in snapshot.segments for block in segment.blocks if block.allocated]
    if held and not any(block.stack for block in held):
        notes.append("no Python stacks in this snapshot: record it with "
                     "torch.cuda.memory._record_memory_history(stacks='python') before the allocations")  # fmt: skip
    if not snapshot.actions:
        notes.append("no device trace: the peaks shown are the state at the snapshot, not the peak of the run "
                     "(_record_memory_history keeps the allocator's actions)")  # fmt: skip
    if snapshot.legacy:
        notes.append("a snapshot of torch before 2.1: stacks and requested sizes read from each block's history")
    if not devices:
        notes.append("no segments: the allocator held no memory when the snapshot was taken")
    return tuple(notes)
