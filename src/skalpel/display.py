"""Text from a trace, made safe and short for display: no control characters, no megabyte names.

A trace is input like any other: an op name may hold terminal escape sequences (clear
the screen, set the window title, a hidden link) or be megabytes long. Every name
shown on a terminal or written to summary.txt goes through ``plain`` (control
characters replaced by visible escapes) and is cut by ``cut_name``.
"""

from __future__ import annotations

import re

NAME_CHARS = 200
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
    """At most ``limit`` characters of a name, with its length said when cut; control characters escaped."""
    if len(text) > limit:
        text = f"{text[: limit - 1]}… ({len(text):,} chars)"
    return plain(text)
