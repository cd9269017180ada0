"""Text from a trace, made safe and short for display: no control characters, no megabyte names.

A trace is input like any other: an op name may hold terminal escape sequences (clear
the screen, set the window title, a hidden link) or be megabytes long. Every name
shown on a terminal or written to summary.txt goes through ``plain`` (control
characters replaced by visible escapes) and is cut by ``cut_name``; ``for_terminal``
does both to every string of a report before the terminal renderers see it. Those
renderers pass such strings to rich as ``Text``, never as markup, so ``aten::mm[/]``
or ``[memory]`` show as written.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

T = TypeVar("T")

NAME_CHARS = 200
_CUT = re.compile(r"… \(([\d,]+) chars\)$")
# C0 controls (but tab and newline, handled below), DEL, C1 controls; and the Unicode
# line/paragraph separators and bidirectional overrides that can reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``), so none reaches a terminal."""
    text = _CONTROL.sub(_visible, text)
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    return text.replace("\t", " ")


def cut_name(text: str, limit: int = NAME_CHARS) -> str:
    """At most ``limit`` characters of a name, with its length said when cut; control characters escaped.

    Cutting a name that was cut before keeps the length it first had.
    """
    if len(text) > limit:
        earlier = _CUT.search(text)
        length = earlier[1] if earlier else f"{len(text):,}"
        text = f"{text[: limit - 1]}… ({length} chars)"
    return plain(text)


TEXT_CHARS = 1000  # any one string of a report on a terminal: prose fits, a megabyte name does not
_UNCHANGED = frozenset((int, float, bool, type(None)))


def for_terminal(value: T) -> T:
    """A copy of a report (dataclasses, dicts, tuples and lists of them) with every string made safe to print.

    Control characters are escaped and each string is cut to ``TEXT_CHARS``: a terminal
    shows what the trace says, and nothing in the trace can drive the terminal or stall it.
    """
    if type(value) in _UNCHANGED:  # most of a report (the memory curve, the tables' figures): as is, at once
        return value
    if isinstance(value, str):
        return cut_name(value, TEXT_CHARS)  # type: ignore[return-value]
    if isinstance(value, (tuple, list)):  # checked before dataclasses, which cost more (none is a tuple)
        items = [item if type(item) in _UNCHANGED else for_terminal(item) for item in value]
        return type(value)(items)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {for_terminal(key): for_terminal(item) for key, item in value.items()}  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: for_terminal(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


def rough_duration(seconds: float) -> str:
    """A time ahead said the way a person would: '41 s', '12 min', '3.5 h'."""
    if seconds <= 0:
        return "no time (it is there)"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
