"""Finding step boundaries in a script that does not mark them.

First choice: ``optimizer.step()`` (a global optimizer post-hook), the natural end of a
training iteration. The post-hook runs inside the ``Optimizer.step#...`` range, and a
boundary there would leave the profiler's own work inside that op, so the boundary
is taken at the next DataLoader fetch or ``optimizer.zero_grad()``, before their own
ranges open (where ``prof.step()`` would be in a hand-written loop); a loop with
neither takes it at the next optimizer step. Fallback, for loops without an
optimizer (inference, evaluation): the start of every DataLoader ``__next__`` after
the first, which is where the next iteration begins. Once an optimizer step is seen,
DataLoader fetches no longer mark steps of their own (a validation loader inside a
training loop must not split its steps).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.optim.optimizer as optimizer_module
from torch.utils.data import dataloader


class StepDetector:
    def __init__(self, on_boundary: Callable[[], None]) -> None:
        self.on_boundary = on_boundary
        self.boundaries = 0
        self.saw_optimizer = False
        self.saw_loader = False
        self._loader_pending = False
        self._optimizer_pending = False
        self._hook: Any = None
        self._original_next: Any = None
        self._original_zero_grad: Any = None

    def install(self) -> None:
        if self._hook is not None:
            return
        self._hook = optimizer_module.register_optimizer_step_post_hook(self._after_optimizer_step)
        original = dataloader._BaseDataLoaderIter.__next__
        detector = self

        def __next__(iterator: Any) -> Any:
            detector._before_next()
            return original(iterator)

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        self._original_next = original
        dataloader._BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        zero_grad = optimizer_module.Optimizer.zero_grad

        def wrapped_zero_grad(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            detector._take_pending()
            return zero_grad(optimizer, *args, **kwargs)

        wrapped_zero_grad.__wrapped__ = zero_grad  # type: ignore[attr-defined]
        self._original_zero_grad = zero_grad
        optimizer_module.Optimizer.zero_grad = wrapped_zero_grad  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        dataloader._BaseDataLoaderIter.__next__ = self._original_next  # type: ignore[method-assign]
        optimizer_module.Optimizer.zero_grad = self._original_zero_grad  # type: ignore[method-assign]

    def _boundary(self) -> None:
        self.boundaries += 1
        self.on_boundary()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.saw_optimizer = True
        if self._optimizer_pending:  # no DataLoader fetch since the last step: mark it here
            self._boundary()
        self._optimizer_pending = True

    def _take_pending(self) -> None:
        if self._optimizer_pending:
            self._optimizer_pending = False
            self._boundary()

    def _before_next(self) -> None:
        self.saw_loader = True
        if self.saw_optimizer:
            self._take_pending()
            return
        if self._loader_pending:
            self._boundary()
        self._loader_pending = True
