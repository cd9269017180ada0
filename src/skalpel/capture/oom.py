"""A script that died of an out-of-memory error: say so, with what held the memory and what would make room.

`skalpel run` keeps the trace of a script that raised, whatever the error, and exits with the script's
status (``conclude.py``). For an out-of-memory error (Python's ``MemoryError``, ``torch.OutOfMemoryError``
on a device, or the CPU allocator's ``RuntimeError: ... can't allocate memory``) the report also says so:
the process's memory and its address-space limit when the script stopped, the recorded window's peak
split by category and module (``memory_split.py``), and the fix for the largest category.
"""

from __future__ import annotations

import resource

from ..display import cut_name
from ..result.memory_split import MemorySplit
from .session import ProfileRun

_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")
_ROOM_BY_CATEGORY = {
    "activation": "activation checkpointing on the modules named (activations_dominate_peak) or a smaller batch",
    "optimizer_state": "a lighter optimizer state (foreach=False, 8-bit or factored optimizers) or sharding it",
    "parameter": "lower-precision weights or sharding them",
    "gradient": "freeing gradients sooner (zero_grad(set_to_none=True), gradients_held_at_peak) or sharding them",
    "temporary": "chunking the op whose temporary sets the peak (memory_spike)",
}
_MIB = 2**20


def is_out_of_memory(error: BaseException | None) -> bool:
    """A MemoryError, torch's OutOfMemoryError, or an allocator's RuntimeError that says it found no memory."""
    if error is None:
        return False
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and any(words in str(error).lower() for words in _OOM_WORDS)


def out_of_memory_note(error: BaseException, run: ProfileRun, *, held: str | None) -> str:
    """One note for the report: the error, the process's memory when the script stopped (``held``, from
    ``process_memory``), what held the recorded peak, what makes room."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    said = f"{type(error).__name__}: {cut_name(_after_enforce(first), 160)}" if first else type(error).__name__
    steps = run.run_ledger.steps if run.run_ledger is not None else run.steps_done  # the clock saw them all
    parts = [f"the script ran out of memory after {steps} step(s) ({said}); the trace of the "
             f"{run.recorded_steps} step(s) recorded is kept and analysed"]  # fmt: skip
    if held:
        parts.append(held)
    split = run.memory_split
    if split is not None:
        parts.append("what held memory at the recorded window's peak: " + "; ".join(split.lines()))
        room = _room(split)
        if room:
            parts.append(f"to make room: {room}")
    return "; ".join(parts)


def _after_enforce(text: str) -> str:
    """torch's CPU allocator error without its ``[enforce fail at alloc_cpu.cpp:127] err == 0.`` prefix."""
    marker = "DefaultCPUAllocator:"
    return text[text.index(marker) :] if marker in text else text


def _room(split: MemorySplit) -> str | None:
    largest = max(split.categories, key=lambda part: part.bytes, default=None)
    if largest is None or largest.category not in _ROOM_BY_CATEGORY:
        return None
    return f"{largest.category.replace('_', ' ')} is the largest part ({100 * split.share(largest.category):.0f}%): " \
        f"{_ROOM_BY_CATEGORY[largest.category]}"  # fmt: skip


def process_memory() -> str | None:
    """The process's resident and virtual memory now, and its address-space limit (RLIMIT_AS) if it has one."""
    status = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmSize"):
                    status[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if not status:
        return None
    resident, virtual = status.get("VmRSS", 0) / _MIB, status.get("VmSize", 0) / _MIB
    text = f"when the script stopped the process held {resident:.0f} MiB resident, {virtual:.0f} MiB of address space"
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        text += f" (its limit, RLIMIT_AS: {soft / _MIB:.0f} MiB)"
    return text
