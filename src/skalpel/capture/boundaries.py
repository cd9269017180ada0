"""Where one training iteration ends, decided from plain events: the step boundary policy (no torch here).

``capture/hooks.py`` turns what the script does into events (the method names of ``BoundaryPolicy``,
or tuples ``(name, *args)`` for ``on``); the policy answers each with a ``Boundary``, a ``Takeover``
or None. One step = one training iteration. Four signals, in order of priority (``--step-on`` picks
one; by default the first the script shows, so a loop with an optimizer is never split by its
backward calls):

- ``optimizer``: ``optimizer.step()``. A boundary at the step itself would leave the profiler's
  own work inside the ``Optimizer.step#...`` range, so it is taken at the next DataLoader fetch
  or ``optimizer.zero_grad()`` of the optimizer that steps first, before their own ranges open
  (where ``prof.step()`` would be in a hand-written loop), and only once every optimizer the loop
  uses has stepped: a GAN stepping D then G is one iteration, not two. A loop with neither takes it
  when an optimizer that already stepped in this iteration steps again, before that step's range
  opens (``step_begins``): a closure's ``zero_grad()`` (LBFGS, Lightning) runs inside the step, and
  so does not take it. An optimizer stepping again before the others have (WGAN's critic, 5 steps
  per generator step) is inside the iteration; one that has not stepped for
  ``LAGGING_OPTIMIZER_STEPS`` of the others' steps has stopped, and the iteration no longer waits
  for it. A ``GradScaler.step`` that skips the optimizer's step (inf/nan gradients) counts as that
  optimizer's step: the iteration still ends there.
- ``dataloader``: the start of a fetch when the same loader (its dataset) was already fetched from
  in this iteration (inference, evaluation). Once an optimizer step is seen, fetches only take the
  optimizer's pending boundary, so a validation loader inside a training loop does not split its
  steps.
- ``backward``: ``loss.backward()``, for hand-written updates (``p.data.add_``) with neither
  optimizer nor DataLoader; the boundary is taken at the next top-level module call (the next
  forward), or at the next backward.
- ``forward``: a top-level module call (no other module running) of a module already called in
  this iteration: inference loops.

The fallbacks mark a boundary only on a repeat, a full iteration after their first event, by when
a signal of higher priority in the same loop has shown itself. Module calls slow the script most,
so ``module_calls_matter`` turns False as soon as an optimizer or DataLoader takes over (the hooks
then remove theirs). ``skalpel.step()`` in the script (``user_step``) marks steps itself and
silences the rest.

Once the script has made an optimizer (and still holds it), the fallbacks wait for it: model calls
and batches before its first step are evaluation (``estimate_loss()`` under ``no_grad`` before
training) or the parts of one iteration (an RL episode calls its policy once per environment step
and the optimizer once per episode). A fallback that did mark steps gives way when a stronger
signal appears later (an optimizer made after an evaluation pass, ``skalpel.step()``): the
``Takeover`` says what was replaced, and ``restart`` tells the driver to record again on the new
signal (it clears it). In a forked child (``owner()`` False) a boundary is a ``Boundary`` with
``child`` set: the parent alone is profiled; it counts what its children did.

Events come from the script's thread only: another thread cannot drive the profiler, so the hooks
send its optimizer steps and ``skalpel.step()`` calls as ``elsewhere`` (counted in
``other_threads``, never a boundary) and drop the rest.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from typing import Any

SIGNALS = ("optimizer", "dataloader", "backward", "forward")  # what may mark a step, by priority (--step-on)
FALLBACKS = ("dataloader", "backward", "forward")  # the signals that mark only on a repeat
USER = "user"
LABELS = {
    "optimizer": "optimizer.step()",
    "dataloader": "DataLoader batches",
    "backward": "backward()",
    "forward": "top-level module calls",
    USER: "skalpel.step()",
}
HOW_TO_MARK = (
    "call skalpel.step() once per iteration in the script (import skalpel; or run.step() inside "
    "`with skalpel.profile() as run:`, watched.step() inside `with skalpel.watch() as watched:`), or choose the "
    "signal with --step-on optimizer|dataloader|backward|forward"
)
ALL_SIGNALS = "optimizer.step() calls, DataLoader batches, backward() calls and repeated model calls"

# Steps of optimizers that already stepped in this iteration, waiting for one that has not (a WGAN critic steps 5 times
# per generator step, 100 at the start of the original WGAN's training): past this, that one has stopped stepping.
LAGGING_OPTIMIZER_STEPS = 128
# Work held for evaluation before the first optimizer step, this many times a step or more, is said with the report:
# an RL rollout before each update (PPO: 200 policy calls, then 16 minibatch steps) is not in any recorded step.
HELD_WORK_STEPS = 5


@dataclasses.dataclass(frozen=True)
class Takeover:
    """A stronger signal replaced the one that had marked ``steps`` steps: the recording started again."""

    replaced: str
    by: str
    steps: int

    def note(self) -> str:
        return (
            f"the first {self.steps} step(s) were marked by {LABELS[self.replaced]}, until {LABELS[self.by]} showed "
            f"the training iteration: skalpel dropped what it had recorded and recorded again on {LABELS[self.by]}"
        )


@dataclasses.dataclass(frozen=True)
class Boundary:
    """An iteration ended, marked by ``signal``; ``child``: in a forked child (counted for the parent, never
    recorded); ``takeover``: the same event made ``signal`` replace a weaker one."""

    signal: str
    child: bool = False
    takeover: Takeover | None = None


Result = Boundary | Takeover | None


class BoundaryPolicy:
    """The step boundaries of one script, from its events (see the module docstring).

    ``owner`` says whether this is the profiled process (False in a forked child); ``clock`` times
    the boundaries (``last_boundary``, the held work before the first optimizer step).
    """

    def __init__(self, only: str | None = None, *, owner: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if only is not None and only not in SIGNALS:
            raise ValueError(f"unknown step signal {only!r}")
        self.only = only
        self.owner = owner or (lambda: True)
        self.clock = clock
        self.boundaries = 0
        self.seen: set[str] = set()
        self.signal: str | None = None  # the signal that marked the last boundary
        self.marking: str | None = only  # the signal that marks steps now (the hooks test it on every call)
        self.module_calls_matter = only in (None, "backward", "forward")  # False: the hooks drop their module hooks
        self.last_boundary = clock()
        self.pending = False  # an optimizer step ended an iteration: take the boundary at the next start
        self._optimizers: dict[int, None] = {}  # every optimizer seen stepping, in the order of their first step
        self._stepped: set[int] = set()  # optimizers stepped since the last boundary
        self._resteps = 0  # steps since the last boundary of optimizers that had stepped, while another had not
        self._fetched: set[int] = set()  # loaders fetched from since the last boundary
        self._called: set[int] = set()  # top-level modules called since the last boundary
        self._backward_pending = False  # a backward ended: the next top-level call or backward is a new iteration
        self.scaler_steps = 0  # GradScaler.step calls, and those that skipped the optimizer's step
        self.skipped_steps = 0
        self.held = 0  # fallback boundaries not marked because an optimizer exists that has not stepped yet
        self._held_since: float | None = None  # when the first was held
        self._held_signal = ""  # the fallback that held them
        self.held_s: float | None = None  # from the first held boundary to the first optimizer step
        self._intervals: list[float] = []  # seconds between the first optimizer-marked boundaries
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers the script made and still holds
        self._marked = 0  # boundaries marked by the current signal
        self.takeovers: list[Takeover] = []
        self.restart = False  # a stronger signal took over: the driver records again (it clears this)
        self.other_threads: dict[str, int] = {}  # thread name -> optimizer steps there (not marked)

    def on(self, event: tuple[Any, ...]) -> Result:
        """One event, ``(name, *args)``: ``("fetch", loader_id)``, ``("optimizer_step", optimizer_id)``, ..."""
        return getattr(self, event[0])(*event[1:])

    # -- events -------------------------------------------------------------------------------------
    def optimizer_made(self, optimizer: Any) -> Result:
        """The script made ``optimizer`` (held weakly: one the script dropped no longer holds the fallbacks)."""
        self._made.add(optimizer)
        return None

    def step_begins(self, optimizer: int) -> Result:
        """An optimizer's ``step`` is called, its range not yet open: if it already stepped in this iteration,
        the iteration ended, once every optimizer has stepped (WGAN's critic steps 5 times before its generator)."""
        if self.marking != "optimizer" or optimizer not in self._stepped:
            return None
        if not self._stepped >= self._optimizers.keys():
            self._resteps += 1
            if self._resteps <= LAGGING_OPTIMIZER_STEPS:
                return None
            for stopped in self._optimizers.keys() - self._stepped:
                del self._optimizers[stopped]
        return self._take_pending()

    def optimizer_begins(self) -> Result:
        """An optimizer step starts (inside its range): the first one decides, before any backward of an LBFGS
        closure run inside it."""
        if "optimizer" in self.seen:
            return None
        if self._held_since is not None:
            self.held_s = self.clock() - self._held_since
        return self._seen("optimizer")

    def optimizer_step(self, optimizer: int) -> Result:
        """An optimizer stepped: the iteration ends at the next start (``zero_grad``, fetch, ``step_begins``)."""
        if self.marking != "optimizer":
            return None
        result = None
        self._optimizers.setdefault(optimizer)
        if optimizer in self._stepped and self._stepped >= self._optimizers.keys():
            # stepped again with no boundary before the step: its class's step is not wrapped; mark here
            result = self._boundary("optimizer")
            self._stepped = set()
            self._resteps = 0
        self._stepped.add(optimizer)
        self.pending = True
        return result

    def scaler_step(self, optimizer: int, skipped: bool) -> Result:
        """A ``GradScaler.step`` (enabled); ``skipped``: inf/nan gradients, the optimizer did not step. The
        iteration ends as if it had stepped, or two iterations would be one step."""
        self.scaler_steps += 1
        if not skipped:
            return None
        self.skipped_steps += 1
        results = (self.step_begins(optimizer), self.optimizer_begins(), self.optimizer_step(optimizer))
        return next((result for result in results if result is not None), None)

    def zero_grad(self, optimizer: int) -> Result:
        """``optimizer.zero_grad()``: only the first optimizer's opens an iteration."""
        if self.pending and self._optimizers and optimizer == next(iter(self._optimizers)):
            return self._take_pending()
        return None

    def fetch(self, loader: int) -> Result:
        """A DataLoader ``__next__`` starts on ``loader`` (its dataset: one loader's iterators share it)."""
        took = self._seen("dataloader") if "dataloader" not in self.seen else None
        if "optimizer" in self.seen and self.only in (None, "optimizer"):
            return self._take_pending() or took
        if self.marking != "dataloader":
            return took
        result: Result = took
        if loader in self._fetched:
            self._fetched = set()
            if not self._waits_for_optimizer():
                result = self._boundary("dataloader", took)
        self._fetched.add(loader)
        return result

    def backward(self) -> Result:
        """A backward starts."""
        took = self._seen("backward") if "backward" not in self.seen else None
        if self._backward_pending and self.marking == "backward":  # no module call since the last backward
            self._backward_pending = False
            if not self._waits_for_optimizer():
                return self._boundary("backward", took)
        return took

    def backward_done(self) -> Result:
        """A backward ended (after its own module calls: activation checkpointing runs forwards inside it)."""
        self._backward_pending = True
        return None

    def forward(self, module: int) -> Result:
        """A top-level module call starts (no other module running)."""
        if self._backward_pending and self.marking == "backward":
            self._backward_pending = False
            self._called = set()
            return None if self._waits_for_optimizer() else self._boundary("backward")
        took = self._seen("forward") if "forward" not in self.seen else None
        if self.marking != "forward":
            return took
        result: Result = took
        if module in self._called:
            self._called = set()
            if not self._waits_for_optimizer():  # evaluation, or one part of an iteration the optimizer ends
                result = self._boundary("forward", took)
        self._called.add(module)
        return result

    def user_step(self) -> Result:
        """``skalpel.step()`` (``run.step()``, ``watched.step()``): the script marks its steps, whatever the signal."""
        took = None
        if USER not in self.seen:
            self.seen.add(USER)
            took = self._take_over(USER)
            self.module_calls_matter = False
        return self._boundary(USER, took)

    def elsewhere(self, thread: str) -> Result:
        """An optimizer step or ``skalpel.step()`` on another thread: counted, never a boundary (two threads
        cannot drive a profiler)."""
        self.other_threads[thread] = self.other_threads.get(thread, 0) + 1
        return None

    # -- the decisions --------------------------------------------------------------------------------
    def _boundary(self, signal: str, took: Takeover | None = None) -> Boundary:
        if not self.owner():  # a forked child: counted for the parent, never recorded here
            return Boundary(signal, child=True, takeover=took)
        self.boundaries += 1
        self._marked += 1
        self.signal = signal
        now = self.clock()
        if signal == "optimizer" and len(self._intervals) < 9:
            self._intervals.append(now - self.last_boundary)  # the first runs from the start: left out of the median
        self.last_boundary = now
        return Boundary(signal, takeover=took)

    @property
    def steps_ran(self) -> int:
        """Iterations the script ran, by the boundaries: an optimizer's or a fallback's boundary is taken where the next
        iteration starts, so the last iteration has none (``skalpel.step()`` ends its own)."""
        if self.boundaries == 0:
            return 1 if self.pending else 0
        return self.boundaries + (1 if self.pending or self.marking in FALLBACKS else 0)

    def _take_pending(self) -> Boundary | None:
        if self.pending and self._stepped >= self._optimizers.keys() and self.marking == "optimizer":
            self.pending = False
            self._stepped = set()
            self._resteps = 0
            return self._boundary("optimizer")
        return None

    def _waits_for_optimizer(self) -> bool:
        """A fallback holds its boundary: the script holds an optimizer that has not stepped yet (default signal)."""
        if self.only is None and "optimizer" not in self.seen and len(self._made) > 0:
            self.held += 1
            if self._held_since is None:
                self._held_since, self._held_signal = self.clock(), self.marking or ""
            return True
        return False

    def _seen(self, signal: str) -> Takeover | None:
        """``signal`` shows itself for the first time."""
        self.seen.add(signal)
        took = None
        if self.marking != USER and self.only is None:  # the first by priority seen so far marks the steps
            took = self._take_over(next(s for s in SIGNALS if s in self.seen))
        if self.only is None and signal in ("optimizer", "dataloader"):
            self.module_calls_matter = False  # the fallbacks no longer decide: spare every module call the hooks
        return took

    def _take_over(self, signal: str) -> Takeover | None:
        """``signal`` marks the steps from now on; the steps a weaker one marked are not iterations of it."""
        if signal == self.marking:
            return None
        took = None
        if self.restart and self.takeovers:  # a stronger one still, before the first step of the last
            took = self.takeovers[-1] = dataclasses.replace(self.takeovers[-1], by=signal)
        elif self.marking is not None and self._marked > 0 and self.owner():
            took = Takeover(self.marking, signal, self._marked)
            self.takeovers.append(took)
            self.restart = True
        self.marking = signal
        self._marked = 0
        return took

    # -- what the report says -----------------------------------------------------------------------
    def held_note(self, measured: str | None = None) -> str | None:
        """What ran before the first optimizer step, taken for evaluation, when it was far longer than a step: if it
        comes before every update (an RL rollout), the recorded steps are not the whole iteration. ``measured``: what
        the run's clock measured between the steps (``skalpel run``), said instead of the supposition."""
        if self.held_s is None or self.marking != "optimizer" or len(self._intervals) < 3:
            return None
        import statistics  # here: `skalpel --help` imports this module for the signals' names

        step_s = statistics.median(self._intervals[1:])
        if self.held_s < HELD_WORK_STEPS * step_s:
            return None
        return (
            f"before its first optimizer.step(), the script ran {self.held_s:.2f} s ({self.held_s / step_s:.0f}x a "
            f"step) of repeated {LABELS[self._held_signal]} ({self.held + 1} rounds) with no optimizer step: skalpel "
            "took them for evaluation, and they are in no recorded step. "
            + (measured or "If that work comes before every update (an RL rollout, then the update's minibatches), "
               "each recorded step is one optimizer step, not the iteration, and each later rollout lies inside the "
               "step of an update's last minibatch")
            + f": {HOW_TO_MARK}"
        )

    def skipped_note(self) -> str | None:
        """GradScaler skipped optimizer steps: said, since those steps hold no optimizer step (and each one lowered the
        loss scale: many mean the training is not moving)."""
        if not self.skipped_steps or self.marking != "optimizer":
            return None
        return (
            f"{self.skipped_steps} of {self.scaler_steps} optimizer steps were skipped by GradScaler (inf/nan "
            "gradients) while skalpel watched the steps: each such iteration is still one step, with no optimizer "
            "step in it"
        )


def why_no_boundary(policy: BoundaryPolicy, script: str, *, batches: int, failed: bool = False,
                    children: str | None = None) -> str | None:  # fmt: skip
    """Why ``script`` showed no step boundary (``skalpel run`` and ``skalpel watch`` say this); None when it did.

    ``batches``: the batches its DataLoaders yielded; ``failed``: it ended with an error; ``children``: what its
    child processes trained, if anything.
    """
    if policy.boundaries:
        return None
    if policy.other_threads:
        names = ", ".join(repr(name) for name in policy.other_threads)
        return (
            f"{script} takes its steps in thread {names}, not in the main thread: skalpel marks steps in "
            "the main thread only (a profiler driven from two threads crashes); mark them in that thread "
            "with `with skalpel.profile() as run:` and `run.step()` (`skalpel.watch()` and `watched.step()` to "
            "watch them)"
        )
    if children is not None:
        return f"no step in the main process of {script}: {children}"
    seen = policy.seen
    if policy.held and "optimizer" not in seen:
        shown = [signal for signal in SIGNALS if signal in seen]
        return (
            f"{script} made an optimizer that never stepped: skalpel took its "
            f"{', '.join(LABELS[signal] for signal in shown)} for evaluation and waited for optimizer.step(); "
            f"to profile them, run again with --step-on {shown[0]} (or call skalpel.step() once per iteration)"
        )
    if not seen and failed:
        return "it ended before its first iteration: there was nothing to profile yet"
    if not seen:
        looked = LABELS[policy.only] if policy.only else ALL_SIGNALS
        return f"no step boundary found in {script}: skalpel looks for {looked}; {HOW_TO_MARK}"
    if seen == {"dataloader"} and batches == 0:
        return f"zero steps ran in {script}: its DataLoader yielded no batch and no optimizer step was taken"
    if policy.only == "optimizer" and "optimizer" not in seen:
        return f"no optimizer.step() call in {script} (--step-on optimizer); {HOW_TO_MARK}"
    return (
        f"no step boundary found in {script}: it showed {', '.join(LABELS[signal] for signal in sorted(seen))} "
        f"but no second iteration; run more iterations, or {HOW_TO_MARK}"
    )
