"""Field-level mutations of real trace documents, for the fuzz test (test_field_fuzz.py).

Each mutation takes a parsed trace document (a dict with ``traceEvents``) and a
``random.Random`` and changes it in place the way a damaged, hand-edited or hostile
trace would: fields of the wrong type, numbers out of range, keys missing, step
markers overlapping or repeated, nesting hundreds deep, names that are huge or hold
terminal escapes and rich markup. Bytes are mutated separately (``flip_bytes``).
Every mutation returns a short description, so that a failing case can be replayed.

``one_field`` and ``one_header_field`` change a single field that the trace really has (an
event's own key or one of its args; a header key or one of a device's properties): removed, of
the wrong type, NaN or infinite (``serialize`` writes them as the NaN and Infinity tokens that
Python's json and many parsers accept), huge, negative or zero.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
from typing import Any, Callable

FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args")
WRONG_VALUES: tuple[Any, ...] = (
    None, True, "", "x", "12", "1e999", [], [1, 2], {}, {"a": 1}, -1, 0, 2**63, 2**70, -(2**70), 1e308, -1e308, 0.5,
    math.nan, math.inf, -math.inf,
)  # fmt: skip
FAR_TIMES = (0, -1, -(2**70), 10**18, 2**63, 2**64 + 1, 1e300, math.inf, math.nan)
HOSTILE_NAMES = (
    "aten::mm[/]", "[memory]", "[bold red]x[/]", "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "\x1b]8;;http://x\x1b\\l\x1b]8;;\x1b\\",
    "\x9b31m", "a\x00b", "x" * 200_000, "ProfilerStep#" + "9" * 40, "ProfilerStep#-1", "ProfilerStep#", "\u202egnp.exe",
    "<script>alert(1)</script>",
)  # fmt: skip
DEEP = "\u0000deep:{depth}:{brackets}"  # a placeholder: json.dumps itself stops at about 1000 levels
_DEEP_TEXT = re.compile(r'"\\u0000deep:(\d+):(\{\}|\[\])"')
NON_FINITE = (math.nan, math.inf, -math.inf)
HUGE = (1e300, -1e300, 1.7976931348623157e308, -1.7976931348623157e308, 2**63, 2**63 - 1, 2**64, -(2**63), 2**53 + 1)
ODD_VALUES: dict[str, tuple[Any, ...]] = {  # what one field becomes; "missing" removes it
    "missing": (None,), "str": ("", "x", "12", "1.5"), "list": ([], [1]), "dict": ({}, {"a": 1}), "None": (None,),
    "bool": (True, False), "nan": (math.nan,), "inf": (math.inf, -math.inf), "huge": HUGE, "negative": (), "zero": (0, 0.0),
}  # fmt: skip
ARG_KEYS = ("correlation", "External id", "device", "stream", "Call stack", "Input Dims", "bytes", "Total Allocated")


def _events(document: dict) -> list:
    return document["traceEvents"]


def _some_event(document: dict, rng: random.Random) -> dict | None:
    candidates = [event for event in _events(document) if isinstance(event, dict)]
    return rng.choice(candidates) if candidates else None


def _some_kind_of_event(document: dict, rng: random.Random) -> dict | None:
    """An event, half the time of a kind (phase, category, step marker or not) drawn first: the rare kinds get their turn."""
    if rng.random() < 0.5:
        return _some_event(document, rng)
    kinds: dict[tuple, list[dict]] = {}
    for event in _events(document):
        if isinstance(event, dict):
            name = event.get("name")
            marker = name[:8] if isinstance(name, str) and (name.startswith("ProfilerStep#") or name == "[memory]") else ""
            kinds.setdefault((str(event.get("ph")), str(event.get("cat")), marker), []).append(event)
    return rng.choice(kinds[rng.choice(sorted(kinds))]) if kinds else None


def _steps(document: dict) -> list[dict]:
    return [e for e in _events(document) if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")]


def wrong_type(document: dict, rng: random.Random) -> str:
    event = _some_event(document, rng)
    if event is None:
        return "no event"
    key, value = rng.choice(FIELDS), rng.choice(WRONG_VALUES)
    event[key] = copy.deepcopy(value)
    return f"{key}={value!r:.40}"


def far_time(document: dict, rng: random.Random) -> str:
    event = _some_event(document, rng)
    if event is None:
        return "no event"
    key, value = rng.choice(("ts", "ts", "dur")), rng.choice(FAR_TIMES)
    event[key] = value
    return f"{key}={value!r}"


def all_times_zero(document: dict, rng: random.Random) -> str:
    for event in _events(document):
        if isinstance(event, dict) and "ts" in event:
            event["ts"] = 0
    return "every ts 0"


def missing_key(document: dict, rng: random.Random) -> str:
    key = rng.choice(("ph", "ts", "name", "dur", "cat", "args", "pid"))
    for _ in range(rng.randint(1, 50)):
        event = _some_event(document, rng)
        if event is not None:
            event.pop(key, None)
    return f"some events without {key!r}"


def step_overlap(document: dict, rng: random.Random) -> str:
    steps = _steps(document)
    if len(steps) < 2:
        return "fewer than 2 steps"
    index = rng.randrange(1, len(steps))
    before, step = steps[index - 1], steps[index]
    how = rng.choice(("overlap", "same start", "duplicate", "inside", "reversed"))
    if how == "duplicate":
        _events(document).append(copy.deepcopy(before))
    elif isinstance(before.get("ts"), (int, float)) and isinstance(before.get("dur"), (int, float)):
        if how == "overlap":
            step["ts"] = before["ts"] + before["dur"] / 2
        elif how == "same start":
            step["ts"] = before["ts"]
        elif how == "inside":
            step["ts"], step["dur"] = before["ts"] + 1, max(before["dur"] - 2, 0)
        else:
            step["ts"], before["ts"] = before["ts"], step.get("ts", 0)
    return f"steps: {how}"


def deep_nesting(document: dict, rng: random.Random) -> str:
    event = _some_event(document, rng)
    if event is None:
        return "no event"
    depth = rng.choice((100, 300, 1000, 5000))
    nested = DEEP.format(depth=depth, brackets=rng.choice(("{}", "[]")))  # written out by serialize()
    field = rng.choice(("args", "name", "ts", "cat"))
    event[field] = {rng.choice(ARG_KEYS): nested} if field == "args" else nested
    return f"{field} nested {depth} deep"


def hostile_name(document: dict, rng: random.Random) -> str:
    event = _some_event(document, rng)
    if event is None:
        return "no event"
    name = rng.choice(HOSTILE_NAMES)
    event["name"] = name
    return f"name={name!r:.40}"


def wrong_arg(document: dict, rng: random.Random) -> str:
    event = _some_event(document, rng)
    if event is None:
        return "no event"
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    key, value = rng.choice(ARG_KEYS), rng.choice(WRONG_VALUES + FAR_TIMES)
    args[key] = copy.deepcopy(value)
    event["args"] = args
    return f"args[{key!r}]={value!r:.40}"


def header(document: dict, rng: random.Random) -> str:
    key = rng.choice(("deviceProperties", "distributedInfo", "schemaVersion", "traceName", "baseTimeNanoseconds"))
    value = rng.choice(WRONG_VALUES + ([{"name": 5}], "{'rank': 'x'}", {"rank": 2**70, "world_size": -1},
                                       {"rank": 2**40, "world_size": 2**62}, "{'rank': 2**40}"))  # fmt: skip
    document[key] = copy.deepcopy(value)
    return f"header {key}={value!r:.40}"


def stray_values(document: dict, rng: random.Random) -> str:
    value = rng.choice(WRONG_VALUES)
    _events(document).insert(rng.randrange(len(_events(document)) + 1), copy.deepcopy(value))
    return f"stray {value!r:.30} in the events"


def _odd_value(current: Any, rng: random.Random) -> tuple[str, Any]:
    """A kind of damage and the value it leaves (``negative`` flips the current number, or -1)."""
    how = rng.choice(tuple(ODD_VALUES))
    if how == "negative":
        number = current if isinstance(current, (int, float)) and not isinstance(current, bool) else 1
        return how, -abs(number) or -1
    return how, copy.deepcopy(rng.choice(ODD_VALUES[how]))


def _set_or_drop(holder: dict | list, key: str | int, how: str, value: Any) -> str:
    if how == "missing":
        holder.pop(key)
        return f"{key!r} missing"
    holder[key] = value  # type: ignore[index]
    return f"{key!r}={value!r:.40}"


def one_field(document: dict, rng: random.Random) -> str:
    """One field of one event (its own key, one of its args, or a number inside an arg's list) removed or made odd."""
    event = _some_kind_of_event(document, rng)
    if event is None:
        return "no event"
    holders: list[tuple[dict | list, str]] = [(event, "")] + _holders(event.get("args"), "args", rng)
    if len(holders) == 1 and not event or rng.random() < 0.1:  # a key the event lacks: not to be assumed away either
        event.setdefault(rng.choice(FIELDS), 0)
    holder, where = rng.choice(holders)
    key = rng.choice(list(holder) if isinstance(holder, dict) else range(len(holder)))
    how, value = _odd_value(holder[key], rng)
    return f"{event.get('ph')!s:.3}/{event.get('cat')!s:.20} {where} {_set_or_drop(holder, key, how, value)} ({how})"


def _holders(value: Any, where: str, rng: random.Random, depth: int = 0) -> list[tuple[dict | list, str]]:
    """The dicts and lists inside a header value, with where they are (a few items of each list)."""
    if depth > 5 or not isinstance(value, (dict, list)) or not value:
        return []
    found: list[tuple[dict | list, str]] = [(value, where)]
    if isinstance(value, dict):
        items = list(value.items())
    else:
        picks = sorted({0, len(value) - 1, rng.randrange(len(value))})
        items = [(index, value[index]) for index in picks]
    for key, item in items:
        found += _holders(item, f"{where}[{key!r:.30}]", rng, depth + 1)
    return found


def one_header_field(document: dict, rng: random.Random) -> str:
    """One header field, at any depth (deviceProperties, distributedInfo, skalpel's line samples), removed or made odd."""
    header = {key: value for key, value in document.items() if key != "traceEvents"}
    holders = [(document, "header")] + [pair for key, value in header.items() for pair in _holders(value, key, rng)]
    holder, where = rng.choice(holders)
    keys = [key for key in holder if key != "traceEvents"] if isinstance(holder, dict) else list(range(len(holder)))
    if not keys:
        return "no header field"
    key = rng.choice(keys)
    how, value = _odd_value(holder[key], rng)
    return f"{where}: {_set_or_drop(holder, key, how, value)} ({how})"


def one_report_field(document: dict, rng: random.Random) -> str:
    """One field of a skalpel.report/1 document (read back by ``skalpel analyze report.json``), at any depth, made odd."""
    capture = document.get("capture")
    if isinstance(capture, dict) and capture and rng.random() < 0.8:  # what a re-analysis of a run folder reads back
        holders = _holders(capture, "capture", rng)
    else:
        holders = _holders(document, "report", rng, depth=-4)
    holder, where = rng.choice(holders)
    key = rng.choice(list(holder) if isinstance(holder, dict) else range(len(holder)))
    how, value = _odd_value(holder[key], rng)
    if how in ("nan", "inf"):  # not JSON: a report with them is not read at all; the huge finite ones are
        how, value = "huge", rng.choice(HUGE)
    return f"{where}: {_set_or_drop(holder, key, how, value)} ({how})"


def duplicate_event(document: dict, rng: random.Random) -> str:
    """One event written twice (beside itself or at the end)."""
    event = _some_kind_of_event(document, rng)
    if event is None:
        return "no event"
    events = _events(document)
    where = events.index(event) + 1 if rng.random() < 0.5 else len(events)
    events.insert(where, copy.deepcopy(event))
    return f"{event.get('ph')!s:.3}/{event.get('cat')!s:.20} {event.get('name')!s:.30} twice"


FIELD_MUTATIONS: tuple[Callable[[dict, random.Random], str], ...] = (
    wrong_type, far_time, all_times_zero, missing_key, step_overlap, deep_nesting, hostile_name, wrong_arg, header,
    stray_values, one_field, one_field, one_header_field, duplicate_event,
)  # fmt: skip
RARE = (all_times_zero,)  # rewrites the whole trace: one case in several


def mutate(document: dict, rng: random.Random, count: int) -> list[str]:
    """Apply ``count`` field mutations to ``document`` in place; their descriptions."""
    if str(document.get("schema", "")).startswith("skalpel.report/"):
        return [f"one_report_field: {one_report_field(document, rng)}" for _ in range(count)]
    done = []
    for _ in range(count):
        mutation = rng.choice(FIELD_MUTATIONS)
        if mutation in RARE and rng.random() < 0.7:
            mutation = wrong_type
        done.append(f"{mutation.__name__}: {mutation(document, rng)}")
    return done


def flip_bytes(data: bytes, rng: random.Random, count: int) -> bytes:
    """``count`` bytes of ``data`` replaced by random ones."""
    buffer = bytearray(data)
    for _ in range(count):
        buffer[rng.randrange(len(buffer))] = rng.randrange(256)
    return bytes(buffer)


def serialize(document: dict) -> bytes:
    """The document as JSON bytes, with each deep-nesting placeholder written out as nested brackets."""
    text = json.dumps(document)

    def nested(match: re.Match) -> str:
        depth, (open_, close) = int(match[1]), match[2]
        inner = '"a":1' if open_ == "{" else "1"
        return (open_ + '"a":') * (depth - 1) + open_ + inner + close * depth if open_ == "{" else open_ * depth + inner + close * depth

    return _DEEP_TEXT.sub(nested, text).encode()
