"""Reading a PyTorch memory snapshot: the pickle of ``torch.cuda.memory._snapshot()``, without torch.

The format (documented in ``torch.cuda.memory._snapshot`` and read by ``torch.cuda._memory_viz`` and
the viewer at pytorch.org/memory_viz) is a dict of builtin values:

* ``segments``: what the caching allocator reserved (one ``cudaMalloc`` each): ``device``, ``address``,
  ``total_size``, ``stream``, ``segment_type``, and ``blocks`` that tile it, each with ``size``, ``state``
  (``active_allocated``, ``active_awaiting_free`` or ``inactive``), ``requested_size`` and ``frames``
  (the allocation's stack, innermost first: ``filename``, ``line``, ``name``).
  Snapshots of torch before 2.1 keep the stack and requested size in ``history[0]`` instead.
* ``device_traces``: one list per device of the allocator's recent actions (``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
  ``segment_unmap``, ``oom``, ``snapshot``), each with ``addr``, ``size`` and ``frames``.

The pickle is read by an unpickler that builds builtin containers and scalars only: a pickle that
names any class or function (``os.system``, a torch type) is refused before anything runs
(``load_plain_pickle``; flight-recorder dumps are read with it too, ``watching/hangs.py``).
Each block keeps its innermost user frame and a few Python frames, not the whole stack.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from ..display import cut_name
from ..errors import TraceError
from .stacks import format_location, is_user_file, parse_frame

KNOWN_STATES = frozenset({"active_allocated", "active_awaiting_free", "active_pending_free", "inactive"})
STACK_FRAMES_KEPT = 6  # Python frames kept per block, innermost first: what a reader needs to place it
_ALLOWED_GLOBALS = frozenset({("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"),
                              ("__builtin__", "set"), ("__builtin__", "frozenset")})  # fmt: skip
PICKLE_MARKS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")  # a pickle's protocol mark, its first bytes
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                  AttributeError, OverflowError, RecursionError, UnicodeDecodeError, ImportError)  # fmt: skip


@dataclass(frozen=True)
class Block:
    size: int  # bytes the allocator handed out (rounded up)
    requested_size: int  # bytes the caller asked for
    state: str
    location: str | None  # the innermost frame in the user's own code, ``train.py:42 in step``
    stack: tuple[str, ...]  # up to STACK_FRAMES_KEPT Python frames, innermost first

    @property
    def allocated(self) -> bool:
        """Held by a tensor (or waiting for another stream before it is freed): counted as allocated."""
        return self.state != "inactive"


@dataclass(frozen=True)
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Action:
    """One entry of a device trace: what the allocator did, how many bytes, from which line."""

    device: int
    action: str
    size: int
    location: str | None


@dataclass(frozen=True)
class Snapshot:
    path: str
    segments: tuple[Segment, ...]
    actions: tuple[Action, ...]  # every device's trace, each device's in the order it happened
    legacy: bool  # torch before 2.1: stacks in each block's history


class _BuiltinsOnly(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; names no class and calls no function."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("a persistent id (an object stored outside the pickle, as torch.save writes)")


class _Refused(Exception):
    pass


def looks_like_snapshot_file(path: Path) -> bool:
    """A ``.pickle``/``.pkl`` file, or one that opens with a pickle's protocol mark (as ``_dump_snapshot`` writes)."""
    if path.suffix.lower() in (".pickle", ".pkl"):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(2) in PICKLE_MARKS
    except OSError:
        return False


def load_snapshot(path: str | Path) -> Snapshot:
    """The snapshot in ``path``, or a TraceError that says in one line why it cannot be read."""
    path = Path(path)
    data = load_plain_pickle(path, "a PyTorch memory snapshot")
    if not isinstance(data, dict):
        raise TraceError(f"{path}: a pickle of a {type(data).__name__}, not a PyTorch memory snapshot "
                         "(the dict torch.cuda.memory._snapshot() returns)")  # fmt: skip
    if "segments" not in data:
        keys = ", ".join(cut_name(str(key), 40) for key in list(data)[:5])
        raise TraceError(f"{path}: a pickled dict without 'segments' (keys: {keys or 'none'}), not a PyTorch memory "
                         "snapshot (the dict torch.cuda.memory._snapshot() returns)")  # fmt: skip
    segments = _list(data["segments"], path, "segments")
    legacy = any(isinstance(s, dict) and any(isinstance(b, dict) and "history" in b and "frames" not in b
                                             for b in s.get("blocks") or ()) for s in segments)  # fmt: skip
    return Snapshot(
        path=str(path),
        segments=tuple(_segment(raw, index, path) for index, raw in enumerate(segments)),
        actions=_actions(data.get("device_traces"), path),
        legacy=legacy,
    )


def load_plain_pickle(path: Path, expected: str):
    """The plain values a pickle holds (memory snapshots, flight-recorder dumps), or a TraceError in one line that
    names ``expected``: a pickle that names a class or function, one cut short, a file that is no pickle."""
    try:
        with open(path, "rb") as handle:
            return _BuiltinsOnly(handle).load()
    except OSError as error:
        raise TraceError(f"{path}: cannot read it: {error.strerror or error}") from None
    except _Refused as refused:
        raise TraceError(f"{path}: the pickle asks for {cut_name(str(refused), 80)}; skalpel reads only pickles of "
                         f"plain values and runs nothing from a pickle (expected {expected})") from None  # fmt: skip
    except _PICKLE_ERRORS as error:
        why = "it ends early (truncated)" if isinstance(error, EOFError) or "truncated" in str(error) else \
            f"{type(error).__name__}: {cut_name(str(error), 80)}"  # fmt: skip
        raise TraceError(f"{path}: not a readable pickle ({why}); expected {expected}") from None


def _list(value, path: Path, where: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise _unknown(path, f"{where} is a {type(value).__name__}, not a list")
    return list(value)


def _unknown(path: Path, what: str) -> TraceError:
    return TraceError(f"{path}: a memory snapshot in a format skalpel does not know ({what}); "
                      "skalpel reads those of torch 1.13 to 2.14")  # fmt: skip


def _int(raw: dict, key: str, path: Path, where: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _unknown(path, f"{where}: {key} is {cut_name(repr(value), 40)}, not a byte count")
    return value


def _segment(raw, index: int, path: Path) -> Segment:
    where = f"segment {index}"
    if not isinstance(raw, dict) or "blocks" not in raw or "total_size" not in raw:
        raise _unknown(path, f"{where} has no 'blocks' and 'total_size'")
    blocks = tuple(_block(b, f"{where} block {i}", path) for i, b in enumerate(_list(raw["blocks"], path, where)))
    device = raw.get("device", 0)
    return Segment(
        device=device if isinstance(device, int) else 0,
        address=_int(raw, "address", path, where, default=0),
        total_size=_int(raw, "total_size", path, where),
        stream=raw.get("stream", 0) if isinstance(raw.get("stream", 0), int) else 0,
        segment_type=str(raw.get("segment_type", "")),
        blocks=blocks,
    )


def _block(raw, where: str, path: Path) -> Block:
    if not isinstance(raw, dict) or "size" not in raw or "state" not in raw:
        raise _unknown(path, f"{where} has no 'size' and 'state'")
    state = raw["state"]
    if state not in KNOWN_STATES:
        raise _unknown(path, f"{where}: state {cut_name(repr(state), 40)}")
    size = _int(raw, "size", path, where)
    frames, requested = raw.get("frames"), raw.get("requested_size")
    history = raw.get("history")
    if frames is None and isinstance(history, list) and history and isinstance(history[0], dict):
        frames, requested = history[0].get("frames"), history[0].get("real_size")  # torch < 2.1
    if not isinstance(requested, int) or isinstance(requested, bool) or not 0 <= requested <= size:
        requested = size
    location, stack = _place(frames)
    return Block(size=size, requested_size=requested, state=state, location=location, stack=stack)


def _place(frames) -> tuple[str | None, tuple[str, ...]]:
    """(the innermost user frame, the first Python frames) of a stack given innermost first."""
    if not isinstance(frames, (list, tuple)):
        return None, ()
    location, stack = None, []
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename, line, name = str(frame.get("filename", "")), frame.get("line", 0), str(frame.get("name", ""))
        if filename == "none" and (parsed := parse_frame(name)):  # torch's snapshot of a CPU profile: "f.py(3): g"
            filename, line, name = parsed
        if not filename.endswith(".py"):
            continue  # C++ frames (context='all') and the profiler's synthetic 'none'
        line = line if isinstance(line, int) else 0
        shown = format_location(filename, line, name)
        if len(stack) < STACK_FRAMES_KEPT:
            stack.append(shown)
        if location is None and is_user_file(filename):
            location = shown
        if location is not None and len(stack) >= STACK_FRAMES_KEPT:
            break
    return location, tuple(stack)


def _actions(traces, path: Path) -> tuple[Action, ...]:
    if traces is None:
        return ()
    actions = []
    for device, entries in enumerate(_list(traces, path, "device_traces")):
        for index, raw in enumerate(_list(entries, path, f"device_traces[{device}]")):
            if not isinstance(raw, dict) or not isinstance(raw.get("action"), str):
                raise _unknown(path, f"device_traces[{device}][{index}] has no 'action'")
            size = raw.get("size", 0)
            location, _ = _place(raw.get("frames"))
            actions.append(Action(device=device, action=raw["action"], location=location,
                                  size=size if isinstance(size, int) and size >= 0 else 0))  # fmt: skip
    return tuple(actions)
