"""Step boundaries in a script that does not mark them: the torch hooks and the boundary policy, put together.

``capture/boundaries.py`` decides where one training iteration ends (its docstring says how),
from the events ``capture/hooks.py`` sends from torch; ``StepDetector`` joins them for
``skalpel run``, ``skalpel watch`` and ``skalpel tune``: it calls ``on_boundary`` at each boundary
(``on_child_boundary`` in a forked child), and ``settle`` leaves only the hooks that could still
show a stronger signal once the capture is done. ``skalpel.step()`` reaches the detector installed
last (``mark_step``); the ``Watchdog`` says on stderr when no boundary comes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from . import runclock, signals
from .boundaries import ALL_SIGNALS, FALLBACKS, HOW_TO_MARK, LABELS, USER, Boundary, BoundaryPolicy, Takeover
from .hooks import TorchHooks
from .quiet import off_the_python_tracer

_active: StepDetector | None = None  # the detector of the running `skalpel run`, for skalpel.step()


def mark_step() -> None:
    """``skalpel.step()``: the end of one iteration, under ``skalpel run`` (elsewhere it does nothing)."""
    if _active is not None:
        _active.hooks.user_step()
    else:
        clock = runclock.active()  # the capture is done: the run's clock still counts the steps
        if clock is not None:
            clock.mark_user()


class StepDetector:
    """The hooks of one run and its boundary policy; ``policy`` holds what was decided, ``hooks`` what was timed."""

    def __init__(self, on_boundary: Callable[[], None], *, only: str | None = None) -> None:
        self.on_boundary = on_boundary
        self.on_child_boundary: Callable[[str], None] | None = None  # a boundary in a forked child
        self.policy = BoundaryPolicy(only, owner=signals.is_owner)
        self.hooks = TorchHooks(self.policy, self._deliver)
        self._settled = False  # the capture is done; hooks that could show a stronger signal stay

    def install(self) -> None:
        global _active
        if self.hooks.installed:
            return
        _active = self
        self.hooks.install()

    def uninstall(self, *, final: bool = True) -> None:
        """Remove every hook; ``final=False`` (capture done, script still running) keeps module hooks that
        torch.compile has already traced, so that removing them does not make it recompile."""
        global _active
        if _active is self:
            _active = None
        self.hooks.uninstall(final=final)

    def settle(self) -> None:
        """The capture is done: remove every hook, except, when a fallback marked the steps, those that would
        show a stronger signal later (the optimizer's, the DataLoader's, backward's: cheap), so that it can
        take over and the recording start again on it; ``skalpel.step()`` takes over from any signal (it costs
        nothing until the script calls it: the first comes after a whole PPO update of minibatch steps)."""
        if self._settled:
            return
        global _active
        self._settled = True
        if self.policy.only is None and self.policy.marking in FALLBACKS:
            self.hooks.remove_module_hooks()
        else:
            self.uninstall(final=False)
            if USER not in self.policy.seen:  # a skalpel.step() the script makes later (after a PPO update) takes over
                _active = self

    def _deliver(self, result: Boundary | Takeover) -> None:
        took = result if isinstance(result, Takeover) else result.takeover
        if took is not None:
            self._settled = False  # a new capture: the hooks stay until it is done
        if not isinstance(result, Boundary):
            return
        if result.child:
            if self.on_child_boundary is not None:
                self.on_child_boundary(result.signal)
            return
        self.on_boundary()


class Watchdog:
    """Says on stderr, while the script runs, when no step boundary came for ``timeout_s`` seconds."""

    def __init__(self, policy: BoundaryPolicy, timeout_s: float, say: Callable[[str], None],
                 done: Callable[[], bool]) -> None:  # fmt: skip
        self.policy = policy
        self.timeout_s = timeout_s
        self.say = say
        self.done = done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="skalpel-step-watchdog", daemon=True)

    def start(self) -> None:
        if self.timeout_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        warned_at = -1  # the boundary count at the last warning: one warning per silent stretch
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            off_the_python_tracer()
            if self.done():
                return
            count = self.policy.boundaries
            silent = self.policy.clock() - self.policy.last_boundary
            if silent < self.timeout_s or count == warned_at:
                continue
            warned_at = count
            self.say(self.message(count, silent))

    def message(self, count: int, silent_s: float) -> str:
        if count == 0 and self.policy.held:
            return (
                f"no optimizer.step() in the first {silent_s:.0f} s: the script made an optimizer, so skalpel waits "
                "for its first step (model calls and batches before it are taken as evaluation); still waiting. "
                f"If they are the work to profile, {HOW_TO_MARK}"
            )
        if count == 0:
            looked = LABELS[self.policy.only] if self.policy.only else ALL_SIGNALS
            return (
                f"no step boundary in the first {silent_s:.0f} s (skalpel looks for {looked}); "
                f"still waiting. If the script has no training loop there is nothing to record; otherwise {HOW_TO_MARK}"
            )
        return (
            f"step {count} has run for {silent_s:.0f} s without a boundary (last marked by "
            f"{LABELS.get(self.policy.signal or '', '?')}); a step this long is slow to record: lower --active, "
            f"or, if this is not one iteration, {HOW_TO_MARK}"
        )
