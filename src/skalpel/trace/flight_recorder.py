"""Reading PyTorch's flight-recorder dumps, JSON or pickled, without torch.

A job's ranks dump their recorder (``TORCH_FR_BUFFER_SIZE`` set) as a pickle by default:
``TORCH_FR_DUMP_TEMP_FILE`` + the rank (``nccl_trace_rank_3``) at a timeout, or the bytes of
``torch._C._distributed_c10d._dump_fr_trace()``; as JSON from ``_dump_fr_trace_json()``. Both hold
one dict: ``version`` ("2.10" in torch 2.13), ``pg_config``, ``pg_status`` and ``entries`` (each with
``collective_seq_id``, ``profiling_name``, ``input_sizes``, ``state``, ``retired``, ``frames``); the
pickle names no rank, its file name does (torch's own reader, ``flight_recorder/components/loader.py``,
goes by it too). The pickle is read with the unpickler that reads memory snapshots (plain values
only, ``snapshot.load_plain_pickle``): one that names a class or function, or is cut short, is one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from ..errors import TraceError
from .snapshot import PICKLE_MARKS, load_plain_pickle

EXPECTED = "a PyTorch flight-recorder dump (the dict _dump_fr_trace() returns)"
# keys that open a dump (pg_config comes second, before the entries): a memory snapshot has none of them
_KEYS = (b"pg_config", b"comm_lib_version", b"collective_seq_id")
_HEAD = 4096


def looks_like_flight_recorder(path: Path) -> bool:
    """A JSON or pickled dump, told by the keys near its start (a dump of many process groups opens with them too)."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD)
    except OSError:
        return False
    json_or_pickle = head.lstrip().startswith(b"{") or head[:2] in PICKLE_MARKS
    return json_or_pickle and any(key in head for key in _KEYS)


def load_flight_recorder(path: Path) -> dict[str, Any]:
    """The dump's dict, its ``rank`` from its body or else from the digits its file name ends with; a TraceError in
    one line when it cannot be read (cut short, a foreign pickle, no entries)."""
    data = _read(path)
    if not isinstance(data, dict):
        raise TraceError(f"{path}: a dump of a {type(data).__name__}, not {EXPECTED}")
    if not isinstance(data.get("entries", []), list):
        raise TraceError(f"{path}: its entries are a {type(data['entries']).__name__}, not a list: not {EXPECTED}")
    if "entries" not in data and "pg_config" not in data:
        keys = ", ".join(str(key)[:40] for key in list(data)[:5])
        raise TraceError(f"{path}: a dict without 'entries' or 'pg_config' (keys: {keys or 'none'}), not {EXPECTED}")
    if not isinstance(data.get("rank"), int):
        match = re.search(r"(\d+)$", path.stem if path.suffix in (".json", ".pickle", ".pkl") else path.name)
        data = {**data, "rank": int(match.group(1)) if match else None}
    return data


def _read(path: Path) -> Any:
    try:
        with open(path, "rb") as file:
            head = file.read(2)
    except OSError as error:
        raise TraceError(f"{path}: cannot read it: {error.strerror or error}") from None
    if head in PICKLE_MARKS:
        return load_plain_pickle(path, EXPECTED)
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as error:
        raise TraceError(f"{path}: not whole JSON ({error}); expected {EXPECTED}") from None
    except OSError as error:
        raise TraceError(f"{path}: cannot read it: {error.strerror or error}") from None
