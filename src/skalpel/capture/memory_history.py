"""``skalpel run --memory-history``: the CUDA caching allocator's history from the script's start, dumped as a
memory snapshot into the run folder at its end (or at its out-of-memory error), and read into the report.

torch records each allocation and free with its stack while ``torch.cuda.memory._record_memory_history`` is on
(a ring buffer of ``max_entries`` actions); ``_dump_snapshot`` writes the segments, blocks and that buffer as the
pickle PyTorch's viewer reads. skalpel reads it with its own snapshot reader (``analysis/snapshot.py``, no torch),
as ``skalpel analyze FILE.pickle`` does. On a run without CUDA there is no caching allocator to record: one line
says so and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import SkalpelError

_MIB = 2**20


def snapshot_name(rank: int | None) -> str:
    return "memory-snapshot.pickle" if rank is None else f"memory-snapshot-rank{rank}.pickle"


def no_gpu_line(available: bool) -> str | None:
    """The one line a run without CUDA gets for ``--memory-history``; None when CUDA is there."""
    if available:
        return None
    return ("--memory-history needs a CUDA GPU (torch.cuda.is_available() is False here): the CUDA caching "
            "allocator it records does not run; the run goes on without a memory snapshot")  # fmt: skip


@dataclass
class MemoryHistory:
    """The recording of one process; ``dump`` once, at the script's end or at its out-of-memory error."""

    max_entries: int
    recording: bool = False
    written: Path | None = None
    failed: str | None = None  # why the snapshot could not be written

    def start(self) -> str | None:
        """Record from now on; the line to say when it cannot (no CUDA)."""
        import torch

        line = no_gpu_line(torch.cuda.is_available())
        if line is not None:
            return line
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        self.recording = True
        return None

    def dump(self, folder: Path, rank: int | None) -> Path | None:
        """Write the snapshot into ``folder`` (first call only) and stop recording; its path, None when not."""
        if not self.recording:
            return self.written
        import torch

        path = Path(folder) / snapshot_name(rank)
        self.recording = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
            self.written = path
        except (OSError, RuntimeError) as error:  # a full disk, a device already lost
            self.failed = f"the memory snapshot could not be written to {path} ({type(error).__name__}: {error})"
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return self.written


def snapshot_note(path: Path, *, at_error: bool = False) -> str:
    """What the snapshot holds, in one note for the report: read by skalpel's own reader, as `skalpel analyze` does."""
    from ..analysis.snapshot import summarize_snapshot
    from ..trace.snapshot import load_snapshot

    when = "at the out-of-memory error" if at_error else "at the script's end"
    try:
        summary = summarize_snapshot(load_snapshot(path))
    except SkalpelError as error:
        return f"memory snapshot {when} written to {path}, but it could not be read: {error}"
    parts = []
    for device in summary.devices:
        text = (f"cuda:{device.device} allocated {device.allocated_bytes / _MIB:.1f} MiB, reserved "
                f"{device.reserved_bytes / _MIB:.1f} MiB (largest free block "
                f"{device.largest_free_block_bytes / _MIB:.1f} MiB)")  # fmt: skip
        if device.trace_actions:
            text += (f", peaks over the {device.trace_actions} recorded actions: allocated "
                     f"{device.peak_allocated_bytes / _MIB:.1f} MiB, reserved "
                     f"{device.peak_reserved_bytes / _MIB:.1f} MiB")  # fmt: skip
        if device.out_of_memory_events:
            text += f", {device.out_of_memory_events} allocator out-of-memory failure(s)"
        parts.append(text)
    sites = [f"{site.location} {site.bytes / _MIB:.1f} MiB" for site in summary.by_site[:3]]
    said = "; ".join(parts) or "no device memory"
    if sites:
        said += "; held by line: " + ", ".join(sites)
    return f"memory snapshot {when}: {path} ({said}); `skalpel analyze {path}` lists the blocks and their stacks"
