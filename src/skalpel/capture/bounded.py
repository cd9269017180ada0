"""Long captures stay usable: past a size, Python stacks are kept for the first recorded steps only.

With ``with_stack`` every Python call becomes a ``python_function`` event and every op
carries its ``Call stack``: on a small model, 60 recorded steps make a 2.8 GB trace that
takes minutes to write and to read. When the profiler's JSON is larger than
``STACKS_BUDGET_BYTES`` (``$SKALPEL_STACKS_BUDGET_MB`` to choose), skalpel keeps the stacks of the first ``STACK_STEPS`` recorded
steps (enough for locations and the flame graph) and drops them after: every op, its
shapes and timing stay for every step. It works on Kineto's own layout (one event per
``  {`` ... ``  },`` block), in one pass over the file next to the gzip stream, so the
cost is a scan, not a parse; a file of another layout is left whole.

The same pass leaves out a step the recording was cut inside (the memory budget stopped
it mid-step): every event from that step's start on, so that no analysis counts a partial
step (``PartialStep``).
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass
from typing import BinaryIO

from .. import env

STACKS_BUDGET_BYTES = int(env.STACKS_BUDGET_MB.default * 2**20)
ENV_BUDGET = env.STACKS_BUDGET_MB.name
STACK_STEPS = 10
_CHUNK = 8 << 20
_BLOCK_START = b"\n  {\n"
_STEP = re.compile(rb'"name": "ProfilerStep#\d+",\s*"pid": [^,]+,\s*"tid": [^,]+,\s*"ts": ([0-9.]+),\s*"dur": ([0-9.]+)')
_TS = re.compile(rb'\n    "ts": ([0-9.]+)')
_CALL_STACK = re.compile(rb'"Call stack": "[^"]*", ')
_PYTHON = b'"cat": "python_function"'


@dataclass(frozen=True)
class Kept:
    """What a bounded trace holds: Python stacks for ``stack_steps`` of ``steps`` recorded steps."""

    steps: int
    stack_steps: int
    bytes_in: int
    bytes_out: int

    def note(self) -> str:
        return (
            f"long capture: Python stacks kept for the first {self.stack_steps} of {self.steps} recorded steps "
            f"(trace {self.bytes_in / 2**20:.0f} MiB before, {self.bytes_out / 2**20:.0f} MiB after); every op, "
            "its shapes and timing are kept for every step; locations and the flame graph's Python frames come from those steps"
        )


@dataclass(frozen=True)
class PartialStep:
    """The step the recording was cut inside, left out of the trace from ``start`` (its ProfilerStep's start) on."""

    start: float
    ops: int  # host ops of the whole recording, the cut step's included: what the profiler held when it stopped
    steps: int  # ProfilerStep ranges recorded, the cut one included


def partial_step(path: str) -> PartialStep | None:
    """The last recorded step, to leave out because the recording stopped inside it; None without step markers."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        starts = [float(match[1]) for match in _STEP.finditer(data)]
        ops = data[:].count(b'"cat": "cpu_op"')
    return PartialStep(max(starts), ops, len(starts)) if starts else None


def stack_cut(path: str, size: int) -> tuple[float, int] | None:
    """The time after which stacks are dropped, and the number of recorded steps; None to keep everything."""
    if size <= _budget():
        return None
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        steps = sorted((float(match[1]), float(match[2])) for match in _STEP.finditer(data))
    if len(steps) <= STACK_STEPS:
        return None
    start, duration = steps[STACK_STEPS - 1]
    return start + duration, len(steps)


def _budget() -> float:
    return env.number(env.STACKS_BUDGET_MB) * 2**20


def copy_bounded(source: BinaryIO, target: BinaryIO, cut: float, *, drop_from: float | None = None) -> int:
    """Copy Kineto JSON from ``source`` to ``target`` without stacks that start at ``cut`` or later, and without any
    event that starts at ``drop_from`` or later (a partial step); bytes written."""
    written = 0
    pending = b""
    while True:
        chunk = source.read(_CHUNK)
        data = pending + chunk
        if not chunk:
            written += _write(target, data)
            return written
        last = data.rfind(_BLOCK_START)
        if last <= 0:
            pending = data
            continue
        blocks = data[:last].split(_BLOCK_START)
        pending = data[last:]
        kept = [blocks[0]] + [_bounded(block, cut, drop_from) for block in blocks[1:]]
        written += _write(target, _BLOCK_START.join(block for block in kept if block is not None))


def _bounded(block: bytes, cut: float, drop_from: float | None = None) -> bytes | None:
    if drop_from is not None and block.rstrip().endswith(b"},"):  # the last event has no comma: it stays
        when = _TS.search(block)
        if when is not None and float(when[1]) >= drop_from:
            return None
    python = _PYTHON in block
    if not python and b'"Call stack"' not in block:
        return block
    when = _TS.search(block)
    if when is None or float(when[1]) < cut:
        return block
    if python:
        return None if block.rstrip().endswith(b"},") else block  # the last event has no comma: keep it
    return _CALL_STACK.sub(b"", block)


def _write(target: BinaryIO, data: bytes) -> int:
    target.write(data)
    return len(data)
