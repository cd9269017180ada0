"""Field-level mutations of real trace documents, for the fuzz test (test_field_fuzz.py).

Each mutation takes a parsed trace document (a dict with ``traceEvents``) and a
``random.Random`` and changes it in place the way a damaged, hand-edited or hostile
trace would: fields of the wrong type, numbers out of range, keys missing, step
markers overlapping or repeated, nesting hundreds deep, names that are huge or hold
terminal escapes and rich markup. Bytes are mutated separately (``flip_bytes``).
Every mutation returns a short description, so that a failing case can be replayed.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any, Callable

FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args")
WRONG_VALUES: tuple[Any, ...] = (
    None, True, "", "x", "12", "1e999", [], [1, 2], {}, {"a": 1}, -1, 0, 2**63, 2**70, -(2**70), 1e308, -1e308, 0.5,
)  # fmt: skip
FAR_TIMES = (0, -1, -(2**70), 10**18, 2**63, 2**64 + 1, 1e300)
HOSTILE_NAMES = (
    "aten::mm[/]", "[memory]", "[bold red]x[/]", "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "\x1b]8;;http://x\x1b\\l\x1b]8;;\x1b\\",
    "\x9b31m", "a\x00b", "x" * 200_000, "ProfilerStep#" + "9" * 40, "ProfilerStep#-1", "ProfilerStep#", "\u202egnp.exe",
    "<script>alert(1)</script>",
)  # fmt: skip
DEEP = "\u0000deep:{depth}:{brackets}"  # a placeholder: json.dumps itself stops at about 1000 levels
_DEEP_TEXT = re.compile(r'"\\u0000deep:(\d+):(\{\}|\[\])"')
ARG_KEYS = ("correlation", "External id", "device", "stream", "Call stack", "Input Dims", "bytes", "Total Allocated")


def _events(document: dict) -> list:
    return document["traceEvents"]


def _some_event(document: dict, rng: random.Random) -> dict | None:
    candidates = [event for event in _events(document) if isinstance(event, dict)]
    return rng.choice(candidates) if candidates else None


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


FIELD_MUTATIONS: tuple[Callable[[dict, random.Random], str], ...] = (
    wrong_type, far_time, all_times_zero, missing_key, step_overlap, deep_nesting, hostile_name, wrong_arg, header,
    stray_values,
)  # fmt: skip
RARE = (all_times_zero,)  # rewrites the whole trace: one case in several


def mutate(document: dict, rng: random.Random, count: int) -> list[str]:
    """Apply ``count`` field mutations to ``document`` in place; their descriptions."""
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
