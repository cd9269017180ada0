"""Each module's parameter count and forward output bytes, recorded once per module in the profiled window.

torch.profiler names a module call ``nn.Module: Name_N``: ``N`` numbers the instances of class ``Name``
in the order of their first call among the recorded events. A global forward hook, on while the first
window records, sees the same calls in the same order: the ``N``-th instance of a class it sees first
is the profiler's ``Name_N``. For each it notes, at that first call, the parameters of the module and
its children (``numel``, shared ones counted in each module that holds them) and the bytes of the
tensors its forward returned (nested in tuples, lists and dicts). The result goes into the trace
header (``trace/module_sizes_header.py``), where the module tree reads it.

The hook does nothing while torch.compile traces (it would enter the graph), is not installed once the
script has compiled anything and removes itself when a module first called in the window was compiled
(global hooks on modules change compiled graphs' guards): such a run says "not recorded", or records the
modules first called before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as module_hooks

from ..trace.module_sizes_header import HEADER_KEY
from .hooks import _compiled_anything, tracing

_NESTING = 4  # levels of containers searched for tensors in an output


class ModuleSizes:
    """The hook of one window: ``start`` before its first recorded step, ``stop`` before its trace is written."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self._kept: list[Any] = []  # the modules seen, so that no id is reused while the window records
        self.by_class: dict[str, list[list[int]]] = {}  # class -> [params, output bytes] by first call
        self._handle: Any = None

    def start(self) -> bool:
        """Hook the module calls; False where the script compiled anything (not recorded)."""
        if _compiled_anything():
            return False
        self._handle = module_hooks.register_module_forward_hook(self._after_forward)
        return True

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._kept = []

    def header_value(self) -> dict:
        return {"version": 1, "by_class": self.by_class}

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if id(module) in self._seen or tracing():
            return
        self._seen.add(id(module))
        if _compiled_anything():  # the script compiled in the window: its graphs must not guard on this hook
            self.stop()
            return
        self._kept.append(module)
        try:
            params = sum(parameter.numel() for parameter in module.parameters())
            size = output_bytes(output)
        except Exception:  # noqa: BLE001 (a module whose parameters() misbehaves: its sizes are unknown, the run goes on)
            params, size = -1, -1
        self.by_class.setdefault(type(module).__name__, []).append([int(params), int(size)])


def output_bytes(value: Any, depth: int = 0) -> int:
    """Bytes of the tensors in a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if depth >= _NESTING:
        return 0
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (tuple, list)):
        return 0
    return sum(output_bytes(item, depth + 1) for item in value)


__all__ = ["HEADER_KEY", "ModuleSizes", "output_bytes"]
