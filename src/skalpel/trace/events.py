"""Typed decoding of trace events: only the fields skalpel reads, straight from JSON bytes.

msgspec decodes a batch of events into small structs and skips every other field
without building it, which is several times faster than making a dict per event.
Each phase skalpel reads has a struct of its own with only the fields it reads there
(chosen by the 'ph' tag as the object is read); the events of every other phase
(flow starts, metadata) are read as empty structs, their fields skipped.
``args`` stays as raw JSON bytes until the column builder decodes the few keys it
needs (all events' args in one call) or, for the rare kinds whose args are kept
whole, the full object.

Types in the structs are loose (numbers, strings or null where traces disagree);
a batch that still does not fit (or has an event of a phase the format does not
define, or none) goes through orjson dicts and ``event_from_dict``: ``Event``s, with
every field of every phase.
"""

from __future__ import annotations

import math
from typing import ClassVar, Union

import msgspec
import orjson
from msgspec import Raw, Struct, field

EMPTY = Raw(b"")
MISSING = -(2**63)
"""Integer sentinel for an absent ``device`` or ``stream`` arg."""

Number = int | float | str | None


PHASES = frozenset("BEXiICbnestfPONDMRcSTpF()")
"""Every phase of the Trace Event Format (and its legacy async ones); skalpel reads X, i/I and f."""


class Event(Struct, gc=False):
    """An event of any phase (or none), with every field skalpel reads of any phase."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = 0.0
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: Raw = EMPTY


class _Phase(Struct, gc=False, tag_field="ph"):
    """An event of a phase skalpel does not read: its fields are skipped."""

    ph: ClassVar[str]


# Fields in the order Kineto writes them: msgspec looks a key up from the field after the last one found.
class _Range(_Phase, tag="X"):
    ph = "X"
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = 0.0
    args: Raw = EMPTY


class _FlowEnd(_Phase, tag="f"):
    ph = "f"
    id: int | str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    cat: str | None = None


class _Instant(_Phase, tag="i"):
    ph = "i"
    name: str | None = None
    tid: int | str | None = None
    ts: float | None = None
    args: Raw = EMPTY


class _OldInstant(_Instant, tag="I"):
    ph = "I"


_READ = {"X": _Range, "f": _FlowEnd, "i": _Instant, "I": _OldInstant}
_PHASE_TYPES = tuple(_READ.get(phase) or msgspec.defstruct(f"_Phase_{ord(phase)}", [], bases=(_Phase,), tag=phase,
                                                           namespace={"ph": phase}) for phase in sorted(PHASES))  # fmt: skip


class Args(Struct, gc=False):
    external: Number = field(default=0, name="External id")
    device: Number = MISSING
    stream: Number = MISSING
    correlation: Number = 0
    external_lower: Number = field(default=0, name="external id")
    stack: str | None = field(default=None, name="Call stack")
    dims: Raw = field(default=EMPTY, name="Input Dims")
    types: Raw = field(default=EMPTY, name="Input type")  # kept for the matmul and convolution ops (their dtype)
    nbytes: Number = field(default=0, name="bytes")
    flops: Number = 0  # with_flops: the op's floating-point operations
    # autograd's link of a backward node to the forward op that made it (torch writes both on cpu ops)
    sequence: Number = field(default=-1, name="Sequence number")
    fwd_thread: Number = field(default=0, name="Fwd thread id")  # 0 on forward ops; the forward's thread on backward


class MemoryArgs(Struct, gc=False):
    device_type: Number = field(default=0, name="Device Type")
    device_id: Number = field(default=-1, name="Device Id")
    addr: Number = field(default=-1, name="Addr")
    nbytes: Number = field(default=0, name="Bytes")
    total_allocated: Number = field(default=-1, name="Total Allocated")
    total_reserved: Number = field(default=-1, name="Total Reserved")


_EVENTS = msgspec.json.Decoder(list[Union[_PHASE_TYPES]])  # noqa: UP007 (a tuple of types: no | for it)
_ARGS = msgspec.json.Decoder(list[Args])
_ONE_ARGS = msgspec.json.Decoder(Args)
_MEMORY_ARGS = msgspec.json.Decoder(list[MemoryArgs])
_ONE_MEMORY_ARGS = msgspec.json.Decoder(MemoryArgs)


class BatchSyntaxError(ValueError):
    """The bytes are not a valid JSON array of values."""


def decode_events(buffer: bytes) -> tuple[list, int]:
    """Decode a JSON array of events; returns the events and how many elements were not events.

    The events are of the phases' own structs or, where the batch did not fit them, ``Event``s: both have the
    fields that the column builder reads of each phase.

    Raises BatchSyntaxError when the bytes are not valid JSON.
    """
    try:
        return _EVENTS.decode(buffer), 0
    except msgspec.ValidationError:
        pass  # valid JSON, unexpected types somewhere: go the slow way
    except msgspec.DecodeError as error:
        raise BatchSyntaxError(str(error)) from None
    except RecursionError:  # args nested hundreds deep: the loader decodes event by event and skips that one
        raise BatchSyntaxError("nested too deeply") from None
    try:
        items = orjson.loads(buffer)
    except orjson.JSONDecodeError as error:
        raise BatchSyntaxError(str(error)) from None
    events = [event_from_dict(item) for item in items] if isinstance(items, list) else []
    kept = [event for event in events if event is not None]
    return kept, len(events) - len(kept)


def event_from_dict(item: object) -> Event | None:
    """An ``Event`` from a dict of any field types; fields of the wrong type become invalid values."""
    if not isinstance(item, dict):
        return None
    args = item.get("args")
    raw_args = _raw(args) if isinstance(args, dict) else EMPTY
    if raw_args is None:
        return None  # args nested deeper than JSON can be written back: a damaged event
    return Event(
        ph=_text(item.get("ph")),
        cat=_text(item.get("cat")),
        name=_text(item.get("name")),
        ts=_number(item.get("ts"), None),
        dur=_number(item.get("dur", 0.0), math.nan),
        pid=_label(item.get("pid")),
        tid=_label(item.get("tid")),
        id=_label(item.get("id")),
        args=raw_args,
    )


def decode_args(raws: list[Raw]) -> list[Args]:
    """The keys skalpel reads from each event's args (defaults where absent or not an object)."""
    return _decode_all(raws, _ARGS, _ONE_ARGS, Args, _args_from_dict)


def decode_memory_args(raws: list[Raw]) -> list[MemoryArgs]:
    return _decode_all(raws, _MEMORY_ARGS, _ONE_MEMORY_ARGS, MemoryArgs, _memory_args_from_dict)


def _decode_all(raws, batch_decoder, one_decoder, struct, from_dict) -> list:
    if not raws:
        return []
    try:
        return batch_decoder.decode(_json_array(raws if all(raws) else [raw if raw else b"{}" for raw in raws]))
    except msgspec.MsgspecError:
        pass
    decoded = []
    for raw in raws:
        try:
            decoded.append(one_decoder.decode(raw) if raw else struct())
        except msgspec.MsgspecError:
            decoded.append(from_dict(_loads_or_none(raw)))
    return decoded


def _json_array(values: list) -> bytes:
    """The JSON array of some JSON values (not none), copied once: the brackets go onto the first and the last."""
    values = list(values)
    values[0] = b"[" + values[0]
    values[-1] = b"".join((values[-1], b"]"))
    return b",".join(values)


def full_args(raws: list[Raw]) -> list[dict]:
    """The whole args object of each event (without the bulky 'Call stack'), parsed in one call."""
    try:
        values = orjson.loads(_json_array([raw if raw else b"{}" for raw in raws]))
    except orjson.JSONDecodeError:
        values = [_loads_or_none(raw) for raw in raws]
    kept = []
    for value in values:
        if isinstance(value, dict):
            value.pop("Call stack", None)
            kept.append(value)
        else:
            kept.append({})
    return kept


def _raw(value: object) -> Raw | None:
    """``value`` as raw JSON, or None when it nests too deeply to be written (orjson stops at 255 levels)."""
    try:
        return Raw(orjson.dumps(value))
    except orjson.JSONEncodeError:
        return None


def _loads_or_none(raw: Raw) -> object:
    try:
        return orjson.loads(bytes(raw)) if raw else None
    except orjson.JSONDecodeError:
        return None


def _args_from_dict(value: object) -> Args:
    if not isinstance(value, dict):
        return Args()
    dims, types = value.get("Input Dims"), value.get("Input type")
    return Args(
        correlation=_number_like(value.get("correlation"), 0),
        external=_number_like(value.get("External id"), 0),
        external_lower=_number_like(value.get("external id"), 0),
        device=_number_like(value.get("device"), MISSING),
        stream=_number_like(value.get("stream"), MISSING),
        stack=_text(value.get("Call stack")),
        dims=(_raw(dims) or EMPTY) if dims else EMPTY,
        types=(_raw(types) or EMPTY) if types else EMPTY,
        nbytes=_number_like(value.get("bytes"), 0),
    )


def _memory_args_from_dict(value: object) -> MemoryArgs:
    if not isinstance(value, dict):
        return MemoryArgs()
    return MemoryArgs(
        nbytes=_number_like(value.get("Bytes"), 0),
        total_allocated=_number_like(value.get("Total Allocated"), -1),
        total_reserved=_number_like(value.get("Total Reserved"), -1),
        device_type=_number_like(value.get("Device Type"), 0),
        device_id=_number_like(value.get("Device Id"), -1),
        addr=_number_like(value.get("Addr"), -1),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object, invalid: float | None) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return invalid
    return invalid


def _number_like(value: object, default: int) -> int | float | str:
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, (int, float, str)) else default


def _label(value: object) -> int | str | None:
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, (int, str)) else None
