"""Flame graph of the recorded steps: an SVG to look at, and speedscope JSON to explore.

Both are built from the trace alone (``report/stacks.py``: Python frames with the ops
nested inside them), so ``skalpel analyze`` can draw them again without re-running.
Pure functions: a Trace and a rank in, a string out.

The SVG is an icicle graph: the root on top, callees below their callers, each frame
as wide as its time, siblings widest first. Every frame wide enough carries its label;
hovering any frame shows its full name, time and share.
"""

from __future__ import annotations

import re
import zlib
from html import escape

import orjson

from ..analysis.call_tree import Node, ThreadStacks, merged_tree, thread_stacks
from ..trace.kinds import Kind
from ..trace.model import Trace
from ..trace.stacks import is_user_file, parse_frame

WIDTH = 1200
ROW = 18
PAD = 10
TOP = 58  # title, subtitle and legend
CHAR_PX = 6.6  # mean glyph width of 11px sans-serif
MIN_PX = 0.4  # frames narrower than this are not drawn (nor their callees)
SPEEDSCOPE_EVENTS = 2_000_000  # about 80 MB of speedscope JSON; a longer capture keeps its first events
_PYTHON_NAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_BUILTIN = re.compile(r"^<built-in (?:method|function) ([^\s>]+)")
_LEGEND = (
    ("your code", (22, 36)), ("library Python", (45, 55)), ("op (aten, ...)", (200, 215)),
    ("DataLoader", (0, 6)), ("record_function", (270, 285)), ("runtime call", (120, 135)),
)  # fmt: skip


def render_svg(trace: Trace, *, rank: int = 0, threads: list[ThreadStacks] | None = None) -> str:
    """The flame graph of ``rank``'s recorded steps as a self-contained SVG document (``threads``: its stacks, if known)."""
    threads = thread_stacks(trace, rank) if threads is None else threads
    root = merged_tree(trace, threads)
    rows: list[str] = []
    depth = _draw(trace, root, 0.0, 0, WIDTH - 2 * PAD, root.total_us, rows) if root.total_us > 0 else 0
    height = TOP + max(depth, 1) * ROW + PAD + (24 if root.total_us <= 0 else 0)
    stacks_note = "Python stacks and ops" if (trace.kind == Kind.PYTHON).any() else "ops only (the trace has no Python stacks)"
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="Verdana, DejaVu Sans, sans-serif" font-size="11">',
        "<style>rect{stroke:#fff;stroke-width:0.5}text{pointer-events:none}g:hover rect{stroke:#000}</style>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fafafa" style="stroke:none"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="15">'
        f"skalpel flame graph: rank {rank}, {root.total_us / 1000:.1f} ms of recorded steps</text>",
        f'<text x="{WIDTH / 2}" y="34" text-anchor="middle" fill="#555">width = time ({stacks_note}); '
        "callers above callees; hover a frame for its time</text>",
        _legend(),
    ]
    if root.total_us <= 0:
        rows.append(f'<text x="{PAD}" y="{TOP + 16}">no host events in the recorded steps of rank {rank}</text>')
    return "\n".join(head + rows + ["</svg>", ""])


def _draw(trace: Trace, node: Node, x: float, depth: int, width: float, total: float, rows: list[str]) -> int:
    """Draw ``node`` and its callees; returns the depth reached."""
    label = _label(trace, node)
    share = node.total_us / total * 100.0
    tip = f"{node.name}\n{node.total_us / 1000:.3f} ms ({share:.1f}%), self {node.self_us / 1000:.3f} ms"
    y = TOP + depth * ROW
    fits = int((width - 6) / CHAR_PX)
    text = ""
    if fits >= 3:
        shown = label if len(label) <= fits else label[: fits - 2] + ".."
        text = f'<text x="{PAD + x + 3:.1f}" y="{y + ROW - 5}">{escape(shown)}</text>'
    rows.append(
        f'<g><title>{escape(tip)}</title><rect x="{PAD + x:.2f}" y="{y}" width="{width:.2f}" '
        f'height="{ROW - 1}" rx="2" fill="{_colour(trace, node)}"/>{text}</g>'
    )
    deepest = depth + 1
    cursor = x
    for child in sorted(node.children.values(), key=lambda child: -child.total_us):
        child_width = width * child.total_us / node.total_us if node.total_us > 0 else 0.0
        if child_width < MIN_PX:
            break
        deepest = max(deepest, _draw(trace, child, cursor, depth + 1, child_width, total, rows))
        cursor += child_width
    return deepest


def _label(trace: Trace, node: Node) -> str:
    """``train_step (train.py:42)`` for Python frames, the name itself otherwise."""
    name = node.name
    match = _PYTHON_NAME.match(name) if node.kind == Kind.PYTHON else None
    if not match:
        builtin = _BUILTIN.match(name)
        return f"{builtin[1]} (built-in)" if builtin else name
    return f"{match['func']} ({match['file'].rsplit('/', 1)[-1]}:{match['line']})"


def _category(trace: Trace, node: Node) -> int:
    """Index into _LEGEND."""
    kind = node.kind
    if kind == Kind.PYTHON:
        frame = parse_frame(node.name)
        return 0 if frame is not None and is_user_file(frame[0]) else 1
    if kind == Kind.DATALOADER:
        return 3
    if kind == Kind.USER_ANNOTATION:
        return 4
    if kind in (Kind.RUNTIME, Kind.DRIVER):
        return 5
    return 2 if kind >= 0 else 1


def _colour(trace: Trace, node: Node) -> str:
    if node.kind < 0:
        return "hsl(0,0%,82%)"
    low, high = _LEGEND[_category(trace, node)][1]
    jitter = zlib.crc32(node.name.encode()) % 1000 / 1000.0
    return f"hsl({low + (high - low) * jitter:.0f},{70 + 15 * jitter:.0f}%,{62 + 8 * jitter:.0f}%)"


def _legend() -> str:
    parts = []
    x = PAD
    for label, (low, high) in _LEGEND:
        parts.append(f'<rect x="{x}" y="41" width="12" height="10" fill="hsl({(low + high) / 2:.0f},78%,66%)"/>')
        parts.append(f'<text x="{x + 16}" y="50">{escape(label)}</text>')
        x += 30 + int(len(label) * CHAR_PX)
    return "".join(parts)


def render_speedscope(trace: Trace, *, rank: int = 0, threads: list[ThreadStacks] | None = None) -> str:
    """The same stacks as a speedscope file (https://www.speedscope.app): one evented profile per thread."""
    threads = thread_stacks(trace, rank) if threads is None else threads
    frames: list[dict] = []
    frame_of: dict[int, int] = {}
    budget = SPEEDSCOPE_EVENTS // max(1, len(threads))  # open and close events per thread
    profiles = [_profile(trace, stacks, frames, frame_of, budget) for stacks in threads]
    capped = any(profile.pop("capped") for profile in profiles)
    document = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "name": f"skalpel: rank {rank}, recorded steps" + (" (capped: the first events of each thread)" if capped else ""),
        "exporter": "skalpel",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
    }
    return orjson.dumps(document).decode()


def _profile(trace: Trace, stacks: ThreadStacks, frames: list[dict], frame_of: dict[int, int], budget: int) -> dict:
    names = trace.name[stacks.events].tolist()
    for name in names:
        if name not in frame_of:
            frame_of[name] = len(frames)
            frames.append(_frame(trace.names[name]))
    events: list[dict] = []
    open_: list[int] = []
    ends = stacks.end.tolist()
    last = float(stacks.start[0]) if len(stacks.start) else 0.0

    def close_until(moment: float | None) -> None:
        nonlocal last
        while open_ and (moment is None or ends[open_[-1]] <= moment):
            done = open_.pop()
            last = max(last, ends[done])
            events.append({"type": "C", "frame": frame_of[names[done]], "at": last})

    capped = False
    for i, begin in enumerate(stacks.start.tolist()):
        if len(events) + len(open_) >= budget:  # room left to close what is open
            capped = True
            break
        close_until(begin)
        last = max(last, begin)
        events.append({"type": "O", "frame": frame_of[names[i]], "at": last})
        open_.append(i)
    close_until(None)
    return {
        "type": "evented",
        "name": f"thread {stacks.tid}",
        "unit": "microseconds",
        "startValue": float(stacks.start.min()) if len(stacks.start) else 0.0,
        "endValue": last,
        "events": events,
        "capped": capped,
    }


def _frame(name: str) -> dict:
    match = _PYTHON_NAME.match(name)
    if not match:
        return {"name": name}
    return {"name": match["func"], "file": match["file"], "line": int(match["line"])}
