"""skalpel's own record of a rank's ``torch.distributed`` collectives, kept on disk as they happen.

Gloo's flight recorder (torch 2.13 records gloo too) lives in the process: a rank that is killed
or aborted (gloo aborts a rank whose peer sent the wrong size) takes it along. So each collective
called through ``torch.distributed``'s functions is also written into a memory-mapped ring file
(``collectives.ring``): ``SLOTS`` slots of ``SLOT`` bytes, one JSON object each, padded with
spaces. A slot is written when the call is issued and again when it returns; the page cache
keeps what was written when the process dies, SIGKILL included. Each entry: the record number
``n``, the group's sequence number ``seq`` (every rank of a group counts its collectives alike),
the op, the group, the tensors' sizes and dtype, the step under way, the state (``issued``, ``completed``, ``failed``,
``async``: an ``async_op`` call, whose end is the caller's ``wait()``), the user's line, the times.

DDP's gradient all-reduces go to the process group from C++ and are not seen here (the flight
recorder's dump, taken at a hang, has them). Writing a slot costs a few microseconds a collective.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from ..trace.collective_ring import RING, SLOT, SLOTS  # the file's format (read back there)

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter")  # fmt: skip
_OWN = (os.sep + "torch" + os.sep, os.sep + "skalpel" + os.sep, "<frozen ", os.sep + "threading.py")


class Ring:
    """The ring file of one rank, written by the threads that call collectives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "w+b") as file:
            file.truncate(SLOT * SLOTS)
            self._map = mmap.mmap(file.fileno(), SLOT * SLOTS)
        self._lock = threading.Lock()
        self.count = 0
        self._seq: dict[str, int] = {}

    def issue(self, op: str, group: str, sizes: list, dtype: str | None, line: str | None,
              step: int | None = None) -> dict[str, Any]:  # fmt: skip
        with self._lock:
            self.count += 1
            seq = self._seq[group] = self._seq.get(group, 0) + 1
            entry = {"n": self.count, "seq": seq, "op": op, "group": group, "sizes": sizes, "dtype": dtype,
                     "state": "issued", "line": line, "step": step, "t": time.time(), "done": None}  # fmt: skip
            self._write(entry)
        return entry

    def end(self, entry: dict[str, Any], state: str) -> None:
        entry["state"], entry["done"] = state, time.time()
        with self._lock:
            self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        data = orjson.dumps(entry)
        if len(data) > SLOT - 1:  # many tensors: their sizes are cut, the rest is kept
            entry = {**entry, "sizes": entry["sizes"][:2] + ["..."]}
            data = orjson.dumps(entry)[: SLOT - 1]
        offset = ((entry["n"] - 1) % SLOTS) * SLOT
        self._map[offset:offset + SLOT] = data.ljust(SLOT - 1) + b"\n"

    def close(self) -> None:
        with self._lock:
            self._map.flush()
            self._map.close()


def _user_line() -> str | None:
    """The innermost frame outside torch, skalpel and the standard library's threading: the user's call."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _OWN):
            return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _shapes(args: tuple, kwargs: dict) -> tuple[list, str | None]:
    """The sizes of the tensors a collective was given (its first argument: a tensor or a list of them)."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    tensors = first if isinstance(first, (list, tuple)) else [first]
    sizes, dtype = [], None
    for tensor in tensors:
        shape = getattr(tensor, "shape", None)
        if shape is not None:
            sizes.append(list(shape))
            dtype = dtype or str(tensor.dtype).replace("torch.", "")
    return sizes, dtype


def _group_name(group: Any) -> str:
    if group is None:
        return "default"
    return str(getattr(group, "group_name", None) or f"group-{id(group):x}")


class Recorder:
    """The patches on ``torch.distributed``'s collective functions, and the ring they write."""

    def __init__(self, folder: Path, step: Callable[[], int] | None = None) -> None:
        self.ring = Ring(folder / RING)
        self.step = step  # the step under way, written with each entry
        self._saved: dict[str, Callable] = {}

    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        for op in OPS:
            original = getattr(dist, op, None)
            if original is not None and op not in self._saved:
                self._saved[op] = original
                setattr(dist, op, self._wrap(op, original))

    def _wrap(self, op: str, original: Callable) -> Callable:
        ring, step = self.ring, self.step

        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            sizes, dtype = _shapes(args, kwargs) if op != "barrier" else ([], None)
            entry = ring.issue(op, _group_name(kwargs.get("group")), sizes, dtype, _user_line(),
                               step() if step is not None else None)  # fmt: skip
            try:
                result = original(*args, **kwargs)
            except BaseException:
                ring.end(entry, "failed")
                raise
            ring.end(entry, "async" if kwargs.get("async_op") else "completed")
            return result

        return recorded

    def uninstall(self) -> None:
        dist = sys.modules.get("torch.distributed")
        for op, original in self._saved.items():
            setattr(dist, op, original)
        self._saved.clear()
        self.ring.close()


def flight_recorder_json() -> bytes | None:
    """PyTorch's flight recorder, dumped as JSON (None when it records nothing: $TORCH_FR_BUFFER_SIZE unset)."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    try:
        text = dump(True, True)
    except Exception:  # noqa: BLE001 - no recorder in this build or process group: skalpel's record stands alone
        return None
    data = text.encode() if isinstance(text, str) else bytes(text)
    try:
        if not orjson.loads(data).get("entries"):
            return None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return data
