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

from .kinds import DEVICE_KINDS, Kind
from .model import Trace

NO_STACKS = "no Python stacks in this trace: profile with with_stack=True (skalpel run and skalpel.profile() record them)"

_FRAME = re.compile(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
_LIBRARY_DIRS = ("site-packages/", "dist-packages/", "/lib/python", "/lib64/python", "/usr/lib/", "/torch/")
_SKALPEL_OWN = re.compile(r"(^|/)skalpel/(capture|trace|analysis|diagnose|report|tune)/|(^|/)skalpel/(cli|api|pipeline|__main__|__init__)\.py$")
_KNOWN_LIBRARIES = frozenset(
    "torch torchvision torchaudio torchtext torchrec fbgemm_gpu functorch triton transformers accelerate "
    "datasets huggingface_hub safetensors tokenizers timm lightning pytorch_lightning deepspeed apex fairscale "
    "xformers flash_attn einops numpy scipy pandas tqdm vllm sglang diffusers peft trl jax tensorflow "
    "IPython ipykernel traitlets tornado zmq runpy".split()
)
_DEVICE = np.array(sorted(int(k) for k in DEVICE_KINDS | {Kind.DEVICE_SYNC}), dtype=np.int8)


def parse_frame(text: str) -> tuple[str, int, str] | None:
    """``"train.py(42): step"`` -> ``("train.py", 42, "step")``; None for pseudo-frames like ``<built-in ...>``."""
    match = _FRAME.match(text.strip())
    if match is None:
        return None
    return match.group("path"), int(match.group("line")), match.group("func")


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
        user_names = {name_id: _user_frame(trace.names[name_id]) for name_id in np.unique(trace.name[python])}
        keep = np.array([user_names[name_id] is not None for name_id in trace.name[python]], dtype=bool)
        self._frames = python[keep] if len(python) else python
        self._frame_text = {name_id: frame for name_id, frame in user_names.items() if frame is not None}
        self._by_thread: dict[tuple[int, int, int], np.ndarray] = {}
        for index in self._frames:
            self._by_thread.setdefault(self._thread(index), []).append(index)  # type: ignore[arg-type]
        self._by_thread = {key: np.array(value, dtype=np.int64) for key, value in self._by_thread.items()}
        self.has_stacks = trace.has_stacks
        self._stacked: dict | None = None  # per thread: events that carry a 'Call stack' (old traces)

    def _thread(self, index: int) -> tuple[int, int, int]:
        return int(self.trace.rank[index]), int(self.trace.pid[index]), int(self.trace.tid[index])

    def location_of(self, index: int) -> str | None:
        """The innermost user frame around one event (device work maps to the call that launched it)."""
        index = self._host_event(int(index))
        if index < 0:
            return None
        trace = self.trace
        stack_id = int(trace.stack[index])
        if stack_id < 0:  # a runtime call or a child op: take the 'Call stack' of the op around it
            stack_id = self._enclosing_stack(index)
        if stack_id >= 0:
            found = _innermost_in_call_stack(trace.names[stack_id])
            if found:
                return found
        frames = self._by_thread.get(self._thread(index))
        if frames is None:
            return None
        return self._enclosing(frames, trace.ts[index], trace.ts[index] + trace.dur[index])

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

    def _enclosing(self, frames: np.ndarray, start: float, end: float) -> str | None:
        trace = self.trace
        inside = (trace.ts[frames] <= start) & (trace.ts[frames] + trace.dur[frames] >= end)
        if not inside.any():
            return None
        candidates = frames[inside]
        innermost = candidates[np.argmax(trace.ts[candidates])]
        return self._frame_text[int(trace.name[innermost])]

    def _host_event(self, index: int) -> int:
        trace = self.trace
        if int(trace.kind[index]) in _DEVICE:
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
        counts = Counter(location for location in map(self.location_of, events) if location)
        return tuple(location for location, _ in counts.most_common(limit))

    def inner_locations(self, events: Iterable[int] | np.ndarray, *, limit: int = 2) -> tuple[str, ...]:
        """User frames that run inside these host events (e.g. a Dataset's __getitem__ inside the
        DataLoader's __next__), by the time spent in them; () when the trace has no stacks."""
        trace = self.trace
        totals: Counter[str] = Counter()
        for index in np.asarray(list(events) if not isinstance(events, np.ndarray) else events, dtype=np.int64):
            frames = self._by_thread.get(self._thread(int(index)))
            if frames is None:
                continue
            start, end = trace.ts[index], trace.ts[index] + trace.dur[index]
            inside = frames[(trace.ts[frames] >= start) & (trace.ts[frames] + trace.dur[frames] <= end)]
            for frame in inside:
                totals[self._frame_text[int(trace.name[frame])]] += float(trace.dur[frame])
        return tuple(location for location, _ in totals.most_common(limit))

    def locations_at(self, rank: int, tid: int | None, ts_us: Iterable[float], *, limit: int = 3) -> tuple[str, ...]:
        """User frames open at given instants on a rank (and thread, when known): for memory events."""
        if not self.has_stacks:
            return (NO_STACKS,)
        threads = [key for key in self._by_thread if key[0] == rank and (tid is None or key[2] == tid)]
        counts: Counter[str] = Counter()
        for instant in ts_us:
            for key in threads:
                found = self._enclosing(self._by_thread[key], float(instant), float(instant))
                if found:
                    counts[found] += 1
                    break
        return tuple(location for location, _ in counts.most_common(limit))


def _user_frame(text: str) -> str | None:
    parsed = parse_frame(text)
    if parsed is None or not is_user_file(parsed[0]):
        return None
    return format_location(*parsed)


def _innermost_in_call_stack(stack: str) -> str | None:
    for frame in stack.split(";"):
        found = _user_frame(frame)
        if found:
            return found
    return None
