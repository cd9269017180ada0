"""Gradients held while nothing will read them: what the window's peak would be had they been freed.

A gradient is read by the optimizer's step and by the backward that accumulates into it. Between the optimizer
step that used it and the ``zero_grad`` that clears it, its values are spent; after a
``zero_grad(set_to_none=False)`` it holds zeros until the next backward writes it (a backward creates a
gradient that is None, so the zeros buy nothing). Either way the bytes are live for nothing: a forward that runs
there (``zero_grad`` called after it, or ``set_to_none=False``) runs beside them.

The replay walks the categoriser's timeline (``memory_split.py``) with every gradient tensor counted as freed
over those stretches, and keeps the highest level: the peak that ``zero_grad(set_to_none=True)`` before the
forward would leave. Gradients being accumulated over micro-batches are read by the next backward, never spent
before it: they are not counted, and the peak of such a loop stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..trace.roles import OPTIMIZER_PREFIX, ZERO_GRAD_PREFIX

_OPTIM_FRAME = "torch/optim/"


@dataclass(frozen=True)
class StaleGradients:
    peak_without_bytes: int  # the window's peak with the spent gradients freed
    at_peak_bytes: int  # gradient bytes that were spent at the instant of the real peak
    zero_grad_event: Any  # the profiler event of a zero_grad that cleared spent gradients (for its user line)


def is_zero_grad(name: str) -> bool:
    """Optimizer.zero_grad's record_function, or a Python frame of torch's zero_grad (nn.Module's has no other)."""
    return name.startswith(ZERO_GRAD_PREFIX) or ("torch/" in name and name.endswith(": zero_grad"))


def is_optimizer_step(name: str) -> bool:
    return name.startswith(OPTIMIZER_PREFIX) and not name.startswith(ZERO_GRAD_PREFIX)


def intervals(nodes: Any, test: Any) -> list[tuple[int, int, Any]]:
    """(start ns, end ns, event) of the outermost events whose name passes ``test``, in time order."""
    found: list[tuple[int, int, Any]] = []
    for event in nodes:
        if test(event.name):
            start, end = event.start_time_ns, getattr(event, "end_time_ns", event.start_time_ns)
            if found and start < found[-1][1]:  # nested in the last one (a frame inside the record_function)
                continue
            found.append((start, end, event))
    return found


def _zeroed_first(entries: list, is_gradient: Any, step_ends: list[int], zeros: list, action: Any) -> set:
    """The gradients held before the window whose first event in it is a zero_grad (before any backward wrote
    them or a step read them): spent since before the window started."""
    first_end = step_ends[0] if step_ends else None
    held = {key for _, act, (key, version), _ in entries
            if act == action.PREEXISTING and (is_gradient(key, version) or is_gradient(key, version + 1))}
    zeroed: set = set()
    seen: set = set()
    for time, act, (key, _), _ in entries:
        if key not in held or key in seen or act == action.PREEXISTING:
            continue
        seen.add(key)
        before_step = first_end is None or time < first_end
        if before_step and act in (action.INCREMENT_VERSION, action.DESTROY) and _inside(time, zeros) is not None:
            zeroed.add(key)
    return zeroed


def _inside(time: int, spans: list[tuple[int, int, Any]]) -> Any:
    for start, end, event in spans:
        if start <= time <= end:
            return event
        if start > time:
            break
    return None


def replay(entries: list, is_gradient: Any, steps: list[tuple[int, int, Any]], zeros: list[tuple[int, int, Any]],
           action: Any, peak_index: int) -> StaleGradients:  # fmt: skip
    """``entries``: one device's timeline (time, action, (key, version), size), in time order; ``is_gradient(key,
    version)``; ``steps`` and ``zeros``: the optimizer steps' and zero_grads' spans; ``peak_index``: the real peak's
    entry."""
    live: dict[Any, int] = {}  # gradient key -> bytes
    spent: dict[Any, int] = {}  # of them, the spent ones -> bytes
    level = highest = spent_bytes = at_peak = 0
    zero_event = None
    step_ends = sorted(end for _, end, _ in steps)
    next_end = 0
    from_start = _zeroed_first(entries, is_gradient, step_ends, zeros, action)
    for index, (time, act, (key, version), size) in enumerate(entries):
        while next_end < len(step_ends) and step_ends[next_end] <= time:  # a step read every live gradient
            next_end += 1
            for gradient, held in live.items():
                if gradient not in spent:
                    spent[gradient] = held
                    spent_bytes += held
        known = key in live
        if act in (action.PREEXISTING, action.CREATE):
            level += size
            if is_gradient(key, version) or is_gradient(key, version + 1):
                live[key] = size  # a backward created it: its values are needed
                if key in from_start:
                    spent[key] = size
                    spent_bytes += size
        elif act == action.DESTROY:
            level -= size
            if known:
                live.pop(key)
                if key in spent:
                    spent_bytes -= spent.pop(key)
                    zero_event = zero_event or _inside(time, zeros)
        elif act == action.INCREMENT_VERSION and known:
            zeroing = _inside(time, zeros)
            if zeroing is not None:  # zero_grad(set_to_none=False): zeros, kept until the next backward writes them
                if key not in spent:
                    spent[key] = live[key]
                    spent_bytes += live[key]
                zero_event = zero_event or zeroing
            elif key in spent:  # a backward (or the user) wrote it: its values are needed again
                spent_bytes -= spent.pop(key)
        highest = max(highest, level - spent_bytes)
        if index == peak_index:
            at_peak = spent_bytes
    return StaleGradients(peak_without_bytes=highest, at_peak_bytes=at_peak, zero_grad_event=zero_event)
