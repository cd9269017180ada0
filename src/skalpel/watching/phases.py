"""Where a step's time went, from hooks that cost a clock read each: backward, the optimizer, and the rest.

``torch.autograd.backward`` (what ``loss.backward()`` calls) is wrapped and timed inside; the
global optimizer step pre/post hooks time ``optimizer.step()``. The store makes the forward
time of a step the rest: its time less the DataLoader wait, backward and the optimizer (the
forward pass and whatever else the loop does: ``zero_grad``, logging). Only the training
thread's calls count; a call traced by ``torch.compile`` is not timed (a clock read there would
break its graph). ``torch.autograd.grad`` and a backward run inside ``optimizer.step()`` (an
LBFGS closure) count as the optimizer's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.optim.optimizer as optimizer_module

from ..capture.steps import tracing


class Phases:
    def __init__(self) -> None:
        self.backward_s = 0.0  # of the step under way (the watcher resets them at each boundary)
        self.optimizer_s = 0.0
        self.thread = threading.get_ident()
        self._optimizer_began: float | None = None
        self._handles: list[Any] = []
        self._original: Any = None

    def install(self) -> None:
        """Beneath the step detector's own wrappers (installed before it): a boundary it marks at a backward
        comes first, and the backward is the new step's."""
        self.thread = threading.get_ident()
        phases = self
        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if tracing() or threading.get_ident() != phases.thread:
                return original(*args, **kwargs)
            if phases._optimizer_began is not None:  # a closure's backward: the optimizer's time already
                return original(*args, **kwargs)
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phases.backward_s += time.perf_counter() - began

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        self._original = original
        self._handles = [optimizer_module.register_optimizer_step_pre_hook(self._before_optimizer),
                         optimizer_module.register_optimizer_step_post_hook(self._after_optimizer)]  # fmt: skip

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._original is not None:
            torch.autograd.backward = self._original
            self._original = None

    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not tracing() and threading.get_ident() == self.thread:
            self._optimizer_began = time.perf_counter()

    def _after_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._optimizer_began is not None and threading.get_ident() == self.thread:
            self.optimizer_s += time.perf_counter() - self._optimizer_began
            self._optimizer_began = None
