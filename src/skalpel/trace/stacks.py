"""User-code locations: the innermost frame in the user's own files around an event.

Two sources, whichever the trace has:

* ``python_function`` events (``with_stack=True`` with the Python tracer, torch >= 1.12):
  a frame encloses an event when it runs on the same (rank, pid, tid) and its time range
  contains the event's. The innermost enclosing user frame is the one that starts last.
* the ``Call stack`` argument of ops (torch 1.8-1.11 ``with_stack``): frames joined by
  ``;``, innermost first.

A frame is the user's when its file is not torch or another installed library
(``site-packages``, ``dist-packages``, or a path the tracer already shortened to
``torch/...``, ``transformers/...``), not the Python standard library, not a
``<frozen ...>`` or ``<built-in ...>`` pseudo-frame and not skalpel itself.
Locations read ``train.py:42 in train_step``, with the path relative to the working
directory when it lies under it.

A ``python_function`` event names its function by the ``def`` line. Where a skalpel
capture stored line samples (``line_samples.py``), a function found that way is named
at the statement it was running in the samples of the same time range instead (the
most sampled one): the costly line, not the ``def``.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np

from .kinds import LAUNCHED_KINDS, Kind, step_number
from .line_samples import LineSamples
from .model import Trace

NO_STACKS = "no Python stacks in this trace: profile with with_stack=True (skalpel run and skalpel.profile() record them)"

_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
_LIBRARY_DIRS = ("site-packages/", "dist-packages/", "/lib/python", "/lib64/python", "/usr/lib/", "/torch/")
_KNOWN_LIBRARIES = frozenset(
    "torch torchvision torchaudio torchtext torchrec fbgemm_gpu functorch triton transformers accelerate "
    "datasets huggingface_hub safetensors tokenizers timm lightning pytorch_lightning deepspeed apex fairscale "
    "xformers flash_attn einops numpy scipy pandas tqdm vllm sglang diffusers peft trl jax tensorflow "
    "IPython ipykernel traitlets tornado zmq runpy".split()
)


_USERS_OWN = frozenset({"demo"})  # skalpel modules that stand for a user's script


def _own_files_pattern() -> re.Pattern[str]:
    """skalpel's own files, by the package's folders and modules as installed here (a list written by hand went
    stale when a package was added): ``skalpel/watching/...``, ``skalpel/cli.py``; a user's folder that happens
    to be called skalpel (``/home/me/skalpel/train.py``) is not one of them. The demo's training job
    (``skalpel/demo.py``) stands for a user's script: its findings point into it. The console script that
    starts skalpel (``bin/skalpel``) is ours."""
    package = Path(__file__).resolve().parents[1]
    folders = sorted(entry.name for entry in package.iterdir() if (entry / "__init__.py").is_file())
    modules = sorted(entry.stem for entry in package.glob("*.py") if entry.stem not in _USERS_OWN)
    folder, module = "|".join(map(re.escape, folders)), "|".join(map(re.escape, modules))
    return re.compile(rf"(^|/)skalpel/({folder})/|(^|/)skalpel/({module})\.py$|(^|/)bin/skalpel$")



_SKALPEL_OWN = _own_files_pattern()


def parse_frame(text: str) -> tuple[str, int, str] | None:
    """``"train.py(42): step"`` -> ``("train.py", 42, "step")``; None for pseudo-frames like ``<built-in ...>``."""
    match = _FRAME.match(text.strip())
    if match is None:
        return None
    return match.group("path"), int(match.group("line")), match.group("func")


def forward_frame(name: str) -> tuple[str, int, str] | None:
    """``"model.py(52): forward"`` -> ``("model.py", 52, "forward")``: a module's forward call among the Python
    frames under its ``nn.Module`` frame; None for any other frame."""
    frame = parse_frame(name)
    return frame if frame is not None and frame[2] == "forward" else None


@lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """True for a file of the user's own code (not a library, the standard library, or skalpel)."""
    if not path or path.startswith("<") or path.endswith(">"):
        return False
    normal = path.replace("\\", "/")
    if any(part in normal for part in _LIBRARY_DIRS) or _SKALPEL_OWN.search(normal):
        return False
    if normal.startswith("/"):
        return True  # an absolute path outside the library folders: the user's
    top = normal.split("/", 1)[0]
    module = top[:-3] if top.endswith(".py") else top
    if module in _KNOWN_LIBRARIES or module in sys.stdlib_module_names:
        return False
    return not _installed_library(module)


@lru_cache(maxsize=1024)
def _installed_library(module: str) -> bool:
    """A shortened relative path whose top folder is a package installed in site-packages here."""
    if not module.isidentifier():
        return False
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = (spec.origin or "") if spec else ""
    return "site-packages" in origin or "dist-packages" in origin


def format_location(path: str, line: int, func: str, *, cwd: str | None = None) -> str:
    """``train.py:42 in train_step``, the path relative to ``cwd`` when it lies under it."""
    cwd = cwd or os.getcwd()
    shown = path
    if os.path.isabs(path):
        try:
            relative = Path(path).resolve().relative_to(Path(cwd).resolve())
            shown = relative.as_posix()
        except (ValueError, OSError):
            shown = path
    return f"{shown}:{line} in {func}" if func else f"{shown}:{line}"


class Locator:
    """Finds user-code locations for events of one trace (built once per report)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        python = np.flatnonzero(trace.kind == Kind.PYTHON)
        seen = np.flatnonzero(np.bincount(trace.name[python]))  # the distinct ids: np.unique imports numpy.ma (~8 ms)
        user_names = {name_id: _user_frame(trace.names[name_id]) for name_id in seen.tolist()}
        keep = np.array([user_names[name_id] is not None for name_id in trace.name[python]], dtype=bool)
        self._frames = python[keep] if len(python) else python
        self._frame_text = {name_id: frame for name_id, frame in user_names.items() if frame is not None}
        self._by_thread: dict[tuple[int, int, int], np.ndarray] = {}
        for index in self._frames:
            self._by_thread.setdefault(self._thread(index), []).append(index)  # type: ignore[arg-type]
        self._by_thread = {key: np.array(value, dtype=np.int64) for key, value in self._by_thread.items()}
        self.has_stacks = trace.has_stacks
        self._stacked: dict | None = None  # per thread: events that carry a 'Call stack' (old traces)
        self._samples = _samples_on_trace_clock(trace)  # rank -> line samples, where the capture stored them
        self._top_ops: dict | None = None  # per thread: (starts, ends) of the ops no other op holds

    def _thread(self, index: int) -> tuple[int, int, int]:
        return int(self.trace.rank[index]), int(self.trace.pid[index]), int(self.trace.tid[index])

    def location_of(self, index: int) -> str | None:
        """The innermost user frame around one event (device work maps to the call that launched it)."""
        found = self._frame_of(int(index))
        return None if found is None else self._statement(found[0], found[1], found[2])

    def _frame_of(self, index: int) -> tuple[int, str, list[tuple[float, float]]] | None:
        """(rank, innermost user frame as the trace names it, the spans to look for its statement in)."""
        index = self._host_event(index)
        if index < 0:
            return None
        trace = self.trace
        if int(trace.name[index]) in self._frame_text and trace.kind[index] == Kind.PYTHON:
            return int(trace.rank[index]), trace.names[int(trace.name[index])], self._around(index)  # a user frame
        stack_id = int(trace.stack[index])
        if stack_id < 0:  # a runtime call or a child op: take the 'Call stack' of the op around it
            stack_id = self._enclosing_stack(index)
        frame = _innermost_in_call_stack(trace.names[stack_id]) if stack_id >= 0 else None
        if frame is None:
            frames = self._by_thread.get(self._thread(index))
            start, end = trace.ts[index], trace.ts[index] + trace.dur[index]
            enclosing = None if frames is None else self._enclosing_frame(frames, start, end)
            if enclosing is None:
                return None
            frame = trace.names[int(trace.name[enclosing])]
        return int(trace.rank[index]), frame, self._around(index)

    def _enclosing_stack(self, index: int) -> int:
        """The 'Call stack' of the innermost event with one that encloses this event on its thread; -1 if none."""
        if self._stacked is None:
            self._stacked = {}
            for event in np.flatnonzero(self.trace.stack >= 0):
                self._stacked.setdefault(self._thread(int(event)), []).append(int(event))
            self._stacked = {key: np.array(value, dtype=np.int64) for key, value in self._stacked.items()}
        events = self._stacked.get(self._thread(index))
        if events is None:
            return -1
        trace = self.trace
        start, end = trace.ts[index], trace.ts[index] + trace.dur[index]
        inside = events[(trace.ts[events] <= start) & (trace.ts[events] + trace.dur[events] >= end)]
        return int(trace.stack[inside[np.argmax(trace.ts[inside])]]) if len(inside) else -1

    def _enclosing_frame(self, frames: np.ndarray, start: float, end: float) -> int | None:
        """The innermost user frame (event index) whose range holds [start, end]."""
        trace = self.trace
        inside = (trace.ts[frames] <= start) & (trace.ts[frames] + trace.dur[frames] >= end)
        if not inside.any():
            return None
        candidates = frames[inside]
        return int(candidates[np.argmax(trace.ts[candidates])])

    def _host_event(self, index: int) -> int:
        trace = self.trace
        if int(trace.kind[index]) in LAUNCHED_KINDS:
            launcher = int(trace.launcher[index])
            if launcher < 0:
                return -1
            op = int(trace.op_of_event[launcher])
            return op if op >= 0 and trace.stack[op] >= 0 else launcher
        return index

    def locations(self, events: Iterable[int] | np.ndarray, *, limit: int = 3, sample: int = 400) -> tuple[str, ...]:
        """The most frequent user locations of these events; a hint when the trace has no stacks."""
        if not self.has_stacks:
            return (NO_STACKS,)
        events = np.asarray(list(events) if not isinstance(events, np.ndarray) else events, dtype=np.int64)
        if len(events) > sample:  # enough to rank the locations; keeps big event sets cheap
            events = events[np.linspace(0, len(events) - 1, sample).astype(np.int64)]
        counts: Counter[tuple[int, str]] = Counter()
        spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for found in map(self._frame_of, events.tolist()):
            if found is not None:  # one statement per function: its most sampled line over all these events
                counts[found[:2]] += 1
                spans.setdefault(found[:2], []).extend(found[2])
        located: Counter[str] = Counter()
        for (rank, frame), count in counts.items():
            located[self._statement(rank, frame, spans[(rank, frame)])] += count
        return tuple(location for location, _ in located.most_common(limit))

    def location_in(self, index: int, spans: Iterable[tuple[float, float]]) -> str | None:
        """The innermost user frame around one event, at the statement sampled inside these spans only (the host
        work after a sync, not the sync inside the same function); its other location where none was sampled."""
        found = self._frame_of(int(index))
        if found is None:
            return None
        return self._statement(found[0], found[1], list(spans) or found[2])

    def inner_locations(self, events: Iterable[int] | np.ndarray, *, limit: int = 2) -> tuple[str, ...]:
        """User frames that run inside these host events (e.g. a Dataset's __getitem__ inside the
        DataLoader's __next__), by the time spent in them; () when the trace has no stacks."""
        trace = self.trace
        totals: Counter[tuple[int, int]] = Counter()  # (rank, frame name) -> time
        spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for index in np.asarray(list(events) if not isinstance(events, np.ndarray) else events, dtype=np.int64):
            frames = self._by_thread.get(self._thread(int(index)))
            if frames is None:
                continue
            start, end = trace.ts[index], trace.ts[index] + trace.dur[index]
            inside = frames[(trace.ts[frames] >= start) & (trace.ts[frames] + trace.dur[frames] <= end)]
            for frame in inside:
                key = (int(trace.rank[frame]), int(trace.name[frame]))
                totals[key] += float(trace.dur[frame])
                spans.setdefault(key, []).append((float(trace.ts[frame]), float(trace.ts[frame] + trace.dur[frame])))
        located: Counter[str] = Counter()
        for (rank, name_id), total in totals.items():
            located[self._at_statement(rank, name_id, spans[(rank, name_id)])] += total
        return tuple(location for location, _ in located.most_common(limit))

    def _at_statement(self, rank: int, name_id: int, spans: list[tuple[float, float]]) -> str:
        """A python_function frame's location at its most sampled line in these time spans (else its def line)."""
        return self._statement(rank, self.trace.names[name_id], spans)

    def _statement(self, rank: int, frame: str, spans: list[tuple[float, float]]) -> str:
        """``frame`` ("train.py(12): step", a user frame) at its most sampled line in these spans, else as named."""
        parsed = parse_frame(frame)
        assert parsed is not None
        samples = self._samples.get(rank)
        lines = [line for start, end in spans for line in samples.lines_of(*parsed, start, end)] if samples else []
        line = Counter(lines).most_common(1)[0][0] if lines else parsed[1]
        return format_location(parsed[0], line, parsed[2])

    def _around(self, index: int) -> list[tuple[float, float]]:
        """The time range in which to look for an event's statement in the samples."""
        start = float(self.trace.ts[index])
        return self._span(self._thread(index), start, start + float(self.trace.dur[index]))

    def _span(self, thread: tuple[int, int, int], start: float, end: float) -> list[tuple[float, float]]:
        """The top-level op holding [start, end] on its thread (a tiny op or an allocation runs inside the
        statement's ops), widened by one sampling interval each way so that a short one meets a sample."""
        samples = self._samples.get(thread[0])
        if samples is None:
            return []
        if self._top_ops is None:
            self._top_ops = _top_level_ops(self.trace)
        tops = self._top_ops.get(thread)
        if tops is not None:
            at = int(np.searchsorted(tops[0], start, side="right")) - 1
            if at >= 0 and tops[1][at] >= end:
                start, end = float(tops[0][at]), float(tops[1][at])
        return [(start - samples.interval_us, end + samples.interval_us)]

    def locations_at(self, rank: int, tid: int | None, ts_us: Iterable[float], *, limit: int = 3) -> tuple[str, ...]:
        """User frames open at given instants on a rank (and thread, when known): for memory events."""
        if not self.has_stacks:
            return (NO_STACKS,)
        threads = [key for key in self._by_thread if key[0] == rank and (tid is None or key[2] == tid)]
        counts: Counter[str] = Counter()
        for instant in ts_us:
            for key in threads:
                frame = self._enclosing_frame(self._by_thread[key], float(instant), float(instant))
                if frame is not None:  # the statement sampled while the op holding the instant ran
                    span = self._span(key, float(instant), float(instant))
                    counts[self._at_statement(rank, int(self.trace.name[frame]), span)] += 1
                    break
        return tuple(location for location, _ in counts.most_common(limit))


def _user_frame(text: str) -> str | None:
    parsed = parse_frame(text)
    if parsed is None or not is_user_file(parsed[0]):
        return None
    return format_location(*parsed)


def _innermost_in_call_stack(stack: str) -> str | None:
    """The innermost user frame of a 'Call stack', as written there ("train.py(12): step")."""
    for frame in stack.split(";"):
        parsed = parse_frame(frame)
        if parsed is not None and is_user_file(parsed[0]):
            return frame.strip()
    return None


def _samples_on_trace_clock(trace: Trace) -> dict[int, LineSamples]:
    """Each rank's line samples moved onto the trace's clock by their anchor step (ranks without: absent)."""
    result = {}
    steps = np.flatnonzero(trace.kind == Kind.STEP)
    for info in trace.ranks:
        samples = info.line_samples
        if not isinstance(samples, LineSamples):
            continue
        on_rank = steps[trace.rank[steps] == info.rank]
        anchor = [int(i) for i in on_rank if step_number(trace.name_of(int(i))) == samples.anchor_step]
        if anchor:
            result[info.rank] = samples.shifted(float(trace.ts[anchor[0]]))
    return result


def _top_level_ops(trace: Trace) -> dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]]:
    """Per (rank, pid, tid): start and end of the host ops that no other op holds, by start."""
    ops = np.flatnonzero(trace.kind == Kind.CPU_OP)
    result = {}
    keys = np.stack([trace.rank[ops], trace.pid[ops], trace.tid[ops]], axis=1) if len(ops) else np.empty((0, 3))
    for key in np.unique(keys, axis=0):
        mine = ops[(keys == key).all(axis=1)]
        mine = mine[np.argsort(trace.ts[mine], kind="stable")]
        starts, ends = trace.ts[mine], trace.ts[mine] + trace.dur[mine]
        reached = np.maximum.accumulate(np.concatenate([[-np.inf], ends[:-1]]))
        top = starts >= reached
        result[(int(key[0]), int(key[1]), int(key[2]))] = (starts[top], ends[top])
    return result
