"""The whole run's clock for ``skalpel run``: when the script started and ended, when each step ended, and what the
script did that skalpel can name (no_grad / inference_mode work, evaluation, ``torch.save``).

``runledger.py`` turns these facts into the run's ledger (start-up, steps, between steps, after the last step) and
its one-time costs. The clock reads ``perf_counter`` only: at the script's start and end, at every step boundary
(``mark``), and around the outermost ``torch.no_grad()`` / ``torch.inference_mode()`` block and ``torch.save`` call of
the script's thread (two clock reads each: a PPO rollout calls its policy under no_grad hundreds of times per update,
an evaluation once per epoch). ``nn.Module.train(False)`` (``.eval()``) on the script's thread marks the no_grad work
that follows as evaluation until ``.train()``.

Once the capture is done the step detector removes its hooks; where the steps are optimizer steps (or
``skalpel.step()``) the clock keeps marking them itself with torch's global optimizer step pre-hook (one clock read
per step), so that the ledger covers the run to its end; otherwise the ledger says where its steps stopped.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.optim.optimizer as optimizer_module


@dataclass
class Counters:
    """Seconds spent so far in what the clock names (outermost blocks only)."""

    no_grad_s: float = 0.0  # no_grad / inference_mode outside evaluation: a rollout, inference
    eval_s: float = 0.0  # no_grad / inference_mode while a module is in eval mode
    save_s: float = 0.0  # torch.save: checkpoints
    skalpel_s: float = 0.0  # skalpel's own work at step boundaries: the profiler starting, the trace written

    def copy(self) -> Counters:
        return Counters(self.no_grad_s, self.eval_s, self.save_s, self.skalpel_s)


@dataclass
class RunClock:
    """The facts of one run; ``start()`` before the script, ``end()`` after it."""

    started: float = 0.0
    ended: float | None = None
    epoch_started: float = 0.0  # time.time() at ``started``: compile events are stamped in epoch microseconds
    marks: list[float] = field(default_factory=list)  # perf_counter at each step boundary
    at_marks: list[Counters] = field(default_factory=list)  # the counters at each boundary
    counters: Counters = field(default_factory=Counters)
    continued: bool = False  # the clock marked the steps itself after the capture
    stopped_marking: float | None = None  # where the steps stopped being marked (no continuation), else None
    _thread: int = 0
    _depth: int = 0
    _entered: float = 0.0
    _evaluating: bool = False
    _restore: list[tuple[Any, str, Any]] = field(default_factory=list)
    _handle: Any = None

    # -- the run ------------------------------------------------------------------------------------------
    def start(self) -> RunClock:
        self._thread = threading.get_ident()
        self._patch()
        self.epoch_started = time.time()
        self.started = time.perf_counter()
        return self

    def end(self) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
        self._unpatch()

    def mark(self) -> None:
        """A step boundary on the script's thread."""
        self.marks.append(time.perf_counter())
        self.at_marks.append(self.counters.copy())

    def continue_marking(self, signal: str | None) -> None:
        """The capture is done and the detector's hooks are gone: mark the steps from here on, where the clock can
        (optimizer steps, ``skalpel.step()``); else note where the marks stop."""
        if self.continued or self.ended is not None:
            return
        if signal == "optimizer":
            self._handle = optimizer_module.register_optimizer_step_pre_hook(self._optimizer_step)
            self.continued = True
        elif signal == "user":
            self.continued = True  # steps.mark_step() reaches mark_user() once the detector is gone
        else:
            self.stopped_marking = time.perf_counter()

    def mark_user(self) -> None:
        if self.continued and self._handle is None and self.ended is None and self._on_thread():
            self.mark()

    def _optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._on_thread():
            self.mark()

    def _on_thread(self) -> bool:
        return threading.get_ident() == self._thread

    # -- the script's blocks --------------------------------------------------------------------------------
    def _enter(self) -> None:
        if threading.get_ident() != self._thread:
            return
        if self._depth == 0:
            self._entered = time.perf_counter()
        self._depth += 1

    def _exit(self, saving: bool) -> None:
        if threading.get_ident() != self._thread or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            spent = time.perf_counter() - self._entered
            if saving:
                self.counters.save_s += spent
            elif self._evaluating:
                self.counters.eval_s += spent
            else:
                self.counters.no_grad_s += spent

    def _patch(self) -> None:
        clock = self
        for cls in (torch.no_grad, torch.inference_mode):
            enter, exit_ = cls.__enter__, cls.__exit__

            def wrapped_enter(context: Any, _enter: Any = enter) -> Any:
                clock._enter()
                return _enter(context)

            def wrapped_exit(context: Any, *exc: Any, _exit: Any = exit_) -> Any:
                try:
                    return _exit(context, *exc)
                finally:
                    clock._exit(False)

            self._set(cls, "__enter__", wrapped_enter)
            self._set(cls, "__exit__", wrapped_exit)
        save = torch.save

        @functools.wraps(save)
        def wrapped_save(*args: Any, **kwargs: Any) -> Any:
            if clock._depth:  # inside a no_grad block: counted there
                return save(*args, **kwargs)
            clock._enter()
            try:
                return save(*args, **kwargs)
            finally:
                clock._exit(True)

        self._set(torch, "save", wrapped_save)
        train = torch.nn.Module.train

        @functools.wraps(train)
        def wrapped_train(module: Any, mode: bool = True) -> Any:
            if threading.get_ident() == clock._thread:
                clock._evaluating = not mode
            return train(module, mode)

        self._set(torch.nn.Module, "train", wrapped_train)

    def _set(self, owner: Any, name: str, replacement: Any) -> None:
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _unpatch(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore = []
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


_active: RunClock | None = None
_last: RunClock | None = None  # the clock of the run that ended, for its ledger


def install() -> RunClock:
    """The run's clock, started now (before the script)."""
    global _active
    _active = RunClock().start()
    return _active


def uninstall() -> None:
    global _active, _last
    if _active is not None:
        _active.end()
        _last = _active
    _active = None


def active() -> RunClock | None:
    return _active


class own_work:
    """Times skalpel's own work at a step boundary (the profiler's start, the trace's export) into the run's clock."""

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if _active is not None:
            _active.counters.skalpel_s += time.perf_counter() - self.began


def last() -> RunClock | None:
    """The clock of the run that ended last (taken once: a later run in this process has its own)."""
    global _last
    clock, _last = _last, None
    return clock
