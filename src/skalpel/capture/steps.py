"""Finding step boundaries in a script that does not mark them: one step = one training iteration.

Four signals, in order of priority (``--step-on`` picks one; by default the first the
script shows, so a loop with an optimizer is never split by its backward calls):

- ``optimizer``: ``optimizer.step()`` (global pre/post hooks). The post-hook runs inside
  the ``Optimizer.step#...`` range, and a boundary there would leave the profiler's own
  work inside that op, so the boundary is taken at the next DataLoader fetch or
  ``optimizer.zero_grad()`` of the optimizer that steps first, before their own ranges
  open (where ``prof.step()`` would be in a hand-written loop), and only once every
  optimizer the loop uses has stepped: a GAN stepping D then G is one iteration, not two. A loop with neither takes it when an
  optimizer that already stepped in this iteration steps again, before that step's range opens (the
  optimizer classes' ``step`` is wrapped): a closure's ``zero_grad()`` (LBFGS, Lightning) runs inside the step,
  and so does not take it. An optimizer stepping again before the others have (WGAN's critic, 5 steps per
  generator step) is inside the iteration; one that has not stepped for ``LAGGING_OPTIMIZER_STEPS`` of the
  others' steps has stopped, and the iteration no longer waits for it. A ``GradScaler.step`` that skips
  the optimizer's step (inf/nan gradients) counts as that optimizer's step: the iteration still ends there.
- ``dataloader``: the start of a DataLoader ``__next__`` when the same loader (its
  dataset) was already fetched from in this iteration (inference, evaluation). Once an
  optimizer step is seen, fetches only take the optimizer's pending boundary, so a
  validation loader inside a training loop does not split its steps.
- ``backward``: ``torch.autograd.backward`` (``loss.backward()``), for hand-written
  updates (``p.data.add_``) with neither optimizer nor DataLoader; the boundary is taken
  at the next top-level module call (the next forward), or at the next backward.
- ``forward``: a top-level module call (no other module running) of a module already
  called in this iteration: inference loops.

The fallbacks mark a boundary only on a repeat, a full iteration after their first
event, by when a signal of higher priority in the same loop has shown itself. Module
hooks slow every module call, so they are removed as soon as an optimizer or DataLoader
takes over. ``skalpel.step()`` in the script marks steps itself and silences the rest.

Once the script has made an optimizer (and still holds it), the fallbacks wait for it:
model calls and batches before its first step are evaluation (``estimate_loss()`` under
``no_grad`` before training) or the parts of one iteration (an RL episode calls its
policy once per environment step and the optimizer once per episode). A fallback that
did mark steps gives way when a stronger signal appears later (an optimizer made after
an evaluation pass, ``skalpel.step()``): ``restart`` tells the runner to record again on
the new signal, and ``takeovers`` says what was replaced. Boundaries in a forked child go
to ``on_child_boundary`` (the parent alone is profiled; it counts what its children did).

The same wrappers time the script thread's DataLoader waits, backward calls and optimizer
steps (``loader_s``, ``backward_s``, ``optimizer_s``: skalpel watch's step split, a clock read
at each end; one layer of hooks for both jobs, since each Python call a step costs the loop).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
import threading
import time
import weakref
from typing import Any, Callable

import torch
import torch.optim.optimizer as optimizer_module
from torch.nn.modules import module as module_hooks
from torch.utils.data import dataloader

from . import signals
from .settings import STEP_SIGNALS as SIGNALS

USER = "user"
LABELS = {
    "optimizer": "optimizer.step()",
    "dataloader": "DataLoader batches",
    "backward": "backward()",
    "forward": "top-level module calls",
    USER: "skalpel.step()",
}
HOW_TO_MARK = (
    "call skalpel.step() once per iteration in the script (import skalpel; or wrap the loop in "
    "`with skalpel.profile() as run:` and call run.step()), or choose the signal with "
    "--step-on optimizer|dataloader|backward|forward"
)

ALL_SIGNALS = "optimizer.step() calls, DataLoader batches, backward() calls and repeated model calls"

# True while torch.compile traces the caller (it folds the call), False in eager: one call where is_compiling is two
tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)

_active: StepDetector | None = None  # the detector of the running `skalpel run`, for skalpel.step()

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


def mark_step() -> None:
    """``skalpel.step()``: the end of one iteration, under ``skalpel run`` (elsewhere it does nothing)."""
    if _active is not None:
        _active.user_step()


class StepDetector:
    def __init__(self, on_boundary: Callable[[], None], *, only: str | None = None) -> None:
        if only is not None and only not in SIGNALS:
            raise ValueError(f"unknown step signal {only!r}")
        self.on_boundary = on_boundary
        self.only = only
        self.boundaries = 0
        self.seen: set[str] = set()
        self.signal: str | None = None  # the signal that marked the last boundary
        self.marking: str | None = only  # the signal that marks steps now (the hooks test it on every call)
        self.last_boundary = time.monotonic()
        self._pending = False  # an optimizer step ended an iteration: take the boundary at the next start
        self.optimizer_steps = 0  # optimizer steps on the script's thread (a GradScaler.step without one skipped it)
        self.scaler_steps = 0  # GradScaler.step calls on the script's thread, and those that skipped the step
        self.skipped_steps = 0
        self._optimizers: dict[int, None] = {}  # every optimizer seen stepping, in the order of their first step
        self._stepped: set[int] = set()  # optimizers stepped since the last boundary
        self._resteps = 0  # steps since the last boundary of optimizers that had stepped, while another had not
        self._fetched: set[int] = set()  # loaders fetched from since the last boundary
        self._called: set[int] = set()  # top-level modules called since the last boundary
        self._backward_pending = False
        self._depth = 0  # module calls running (0: the next call is top-level)
        self.loader_workers = 0  # the most DataLoader workers seen, for cpu_contention
        self.batches = 0  # batches the script's DataLoaders yielded
        self.loader_s = 0.0  # time in the script's DataLoader fetches (skalpel watch resets it at each boundary)
        # time in the script thread's backward calls and optimizer steps, likewise (skalpel watch's phase columns);
        # a backward inside optimizer.step() (an LBFGS closure) is the optimizer's; a call torch.compile traces is
        # not timed (a clock read would break its graph)
        self.backward_s = 0.0
        self.optimizer_s = 0.0
        self._optimizer_began: float | None = None
        self.held = 0  # fallback boundaries not marked because an optimizer exists that has not stepped yet
        self._held_since: float | None = None  # when the first was held
        self._held_signal = ""  # the fallback that held them
        self.held_s: float | None = None  # from the first held boundary to the first optimizer step
        self._intervals: list[float] = []  # seconds between the first optimizer-marked boundaries
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers the script made and still holds
        self._marked = 0  # boundaries marked by the current signal
        self.takeovers: list[Takeover] = []
        self.restart = False  # a stronger signal took over: the runner records again (it clears this)
        self.on_child_boundary: Callable[[str], None] | None = None  # a boundary in a forked child
        self.thread = threading.get_ident()  # the thread that runs the script (set again at install)
        self.other_threads: dict[str, int] = {}  # thread name -> optimizer steps there (not marked)
        self._settled = False  # the capture is done; hooks that could show a stronger signal stay
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._restore: list[tuple[Any, str, Any]] = []
        # Set from another thread (the recording's memory budget): the next hook on the script's thread acts on it.
        self.stop_requested = False
        self.on_stop_request: Callable[[], None] | None = None

    # -- installing the hooks -------------------------------------------------------------------
    def install(self) -> None:
        global _active
        if self._handles:
            return
        _active = self
        self.thread = threading.get_ident()
        self._handles = [
            optimizer_module.register_optimizer_step_pre_hook(self._before_optimizer_step),
            optimizer_module.register_optimizer_step_post_hook(self._after_optimizer_step),
        ]
        detector = self
        original_next = dataloader._BaseDataLoaderIter.__next__

        def __next__(iterator: Any) -> Any:
            # a prefetching thread: the script's thread marks the steps (the test of _elsewhere, inline: a call less)
            if not tracing() and threading.get_ident() != detector.thread:
                return original_next(iterator)
            if detector.stop_requested:
                detector._stop_request()
            detector._before_next(iterator)  # a boundary taken here comes first: the wait is the new step's
            began = time.perf_counter()
            try:
                batch = original_next(iterator)
            finally:
                detector.loader_s += time.perf_counter() - began
            detector.batches += 1
            return batch

        original_init = optimizer_module.Optimizer.__init__

        def optimizer_init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original_init(optimizer, *args, **kwargs)
            detector._wrap_step(type(optimizer))
            if not detector._elsewhere():
                detector._made.add(optimizer)

        zero_grad = optimizer_module.Optimizer.zero_grad

        def wrapped_zero_grad(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # the flags first: most calls have nothing to do, and the thread test costs three calls
            if not (detector.stop_requested or detector._pending) or (
                    not tracing() and threading.get_ident() != detector.thread):  # fmt: skip
                return zero_grad(optimizer, *args, **kwargs)
            if detector.stop_requested:
                detector._stop_request()
            if detector._pending and id(optimizer) == next(iter(detector._optimizers)):
                detector._take_pending()  # only the first optimizer's zero_grad opens an iteration
            return zero_grad(optimizer, *args, **kwargs)

        scaler_step = torch.amp.GradScaler.step

        def wrapped_scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = detector.optimizer_steps
            result = scaler_step(scaler, optimizer, *args, **kwargs)
            if scaler.is_enabled() and not detector._elsewhere():
                detector.scaler_steps += 1
                if detector.optimizer_steps == before:  # inf/nan gradients: the optimizer did not step
                    detector._skipped_by_scaler(optimizer)
            return result

        backward = torch.autograd.backward

        def wrapped_backward(*args: Any, **kwargs: Any) -> Any:
            compiling = tracing()
            if not compiling and threading.get_ident() != detector.thread:  # another thread: marks nothing
                return backward(*args, **kwargs)
            # settled (seen, and a signal that outranks it marks the steps for good: the seen signals only grow,
            # --step-on forward never lets it mark): only timed
            settled = (not detector.stop_requested and "backward" in detector.seen
                       and detector.marking not in (None, "backward", "forward"))  # fmt: skip
            if not settled:
                if detector.stop_requested:
                    detector._stop_request()
                detector._before_backward()  # a boundary here comes first: the backward is the new step's
            began = None if compiling or detector._optimizer_began is not None else time.perf_counter()
            try:
                return backward(*args, **kwargs)
            finally:
                if began is not None:
                    detector.backward_s += time.perf_counter() - began
                if not settled:
                    detector._backward_pending = True

        self._patch(dataloader._BaseDataLoaderIter, "__next__", __next__, original_next)
        self._patch(optimizer_module.Optimizer, "__init__", optimizer_init, original_init)
        self._patch(optimizer_module.Optimizer, "zero_grad", wrapped_zero_grad, zero_grad)
        self._patch(torch.amp.GradScaler, "step", wrapped_scaler_step, scaler_step)  # torch.cuda.amp's inherits it
        self._patch(torch.autograd, "backward", wrapped_backward, backward)  # Tensor.backward calls it
        if self.only in (None, "backward", "forward"):
            self._module_handles = [
                module_hooks.register_module_forward_pre_hook(self._before_module),
                module_hooks.register_module_forward_hook(self._after_module, always_call=True),
            ]

    def _patch(self, owner: Any, name: str, replacement: Any, original: Any) -> None:
        replacement.__wrapped__ = original
        setattr(owner, name, replacement)
        self._restore.append((owner, name, original))

    def _wrap_step(self, cls: type) -> None:
        """Wrap ``cls.step`` (torch's profiling wrapper, whose range the hooks run in) so that an optimizer stepping
        again takes the boundary before the range opens."""
        inner = cls.step
        if getattr(inner, "skalpel_steps", False) or not self._handles:
            return
        detector = self

        @functools.wraps(inner)
        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # tracing first: torch.compile would guard on the detector's attributes
            if not tracing() and detector.marking == "optimizer" and not detector._elsewhere():
                detector._before_step_range(optimizer)
            return inner(optimizer, *args, **kwargs)

        step.skalpel_steps = True  # type: ignore[attr-defined]  # a subclass made later inherits it: wrapped once
        self._restore.append((cls, "step", cls.__dict__.get("step")))  # None: inherited, deleted at uninstall
        cls.step = step

    def uninstall(self, *, final: bool = True) -> None:
        """Remove every hook; ``final=False`` (capture done, script still running) keeps module hooks that
        torch.compile has already traced, so that removing them does not make it recompile."""
        global _active
        if _active is self:
            _active = None
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._remove_module_hooks(final=final)
        for owner, name, original in reversed(self._restore):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._restore = []

    def settle(self) -> None:
        """The capture is done: remove every hook, except, when a fallback marked the steps, those that would
        show a stronger signal later (the optimizer's, the DataLoader's, backward's: cheap), so that it can
        take over and the recording start again on it; ``skalpel.step()`` takes over from any signal (it costs
        nothing until the script calls it: the first comes after a whole PPO update of minibatch steps)."""
        if self._settled:
            return
        global _active
        self._settled = True
        if self.only is None and self.marking in ("dataloader", "backward", "forward"):
            self._remove_module_hooks()
        else:
            self.uninstall(final=False)
            if USER not in self.seen:  # a skalpel.step() the script makes later (after a PPO update) still takes over
                _active = self

    def _remove_module_hooks(self, *, final: bool = False) -> None:
        if not final and _compiled_anything():
            return  # torch.compile guards on the global module hooks: removing them now would recompile
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []

    # -- boundaries -----------------------------------------------------------------------------
    def _boundary(self, signal: str) -> None:
        if not signals.is_owner():  # a forked child: counted for the parent, never recorded here
            if self.on_child_boundary is not None:
                self.on_child_boundary(signal)
            return
        self.boundaries += 1
        self._marked += 1
        self.signal = signal
        now = time.monotonic()
        if signal == "optimizer" and len(self._intervals) < 9:
            self._intervals.append(now - self.last_boundary)  # the first runs from the start: left out of the median
        self.last_boundary = now
        self.on_boundary()

    def _waits_for_optimizer(self) -> bool:
        """A fallback holds its boundary: the script holds an optimizer that has not stepped yet (default signal)."""
        if self.only is None and "optimizer" not in self.seen and len(self._made) > 0:
            self.held += 1
            if self._held_since is None:
                self._held_since, self._held_signal = time.monotonic(), self.marking or ""
            return True
        return False

    def _elsewhere(self) -> bool:
        """Called from a thread other than the script's: it marks no step (two threads cannot drive a profiler)."""
        if tracing():
            return False  # a compiled train step traces the wrappers: a thread id there would break its graph
        return threading.get_ident() != self.thread

    def _count_elsewhere(self) -> None:
        name = threading.current_thread().name
        self.other_threads[name] = self.other_threads.get(name, 0) + 1

    def user_step(self) -> None:
        if self._elsewhere():
            self._count_elsewhere()
            return
        if USER not in self.seen:
            self.seen.add(USER)
            self._take_over(USER)
            self._remove_module_hooks()
        self._boundary(USER)

    def _seen(self, signal: str) -> None:
        if signal in self.seen:
            return
        self.seen.add(signal)
        if self.marking != USER and self.only is None:  # the first by priority seen so far marks the steps
            self._take_over(next(s for s in SIGNALS if s in self.seen))
        if self.only is None and signal in ("optimizer", "dataloader") and self._module_handles:
            self._remove_module_hooks()  # the fallbacks no longer decide: spare every module call the hooks

    def _take_over(self, signal: str) -> None:
        """``signal`` marks the steps from now on; the steps a weaker one marked are not iterations of it."""
        if signal == self.marking:
            return
        if self.restart and self.takeovers:  # a stronger one still, before the first step of the last
            self.takeovers[-1] = dataclasses.replace(self.takeovers[-1], by=signal)
        elif self.marking is not None and self._marked > 0 and signals.is_owner():
            self.takeovers.append(Takeover(self.marking, signal, self._marked))
            self.restart = True
            self._settled = False  # a new capture: the hooks stay until it is done
        self.marking = signal
        self._marked = 0

    def held_note(self) -> str | None:
        """What ran before the first optimizer step, taken for evaluation, when it was far longer than a step: if it
        comes before every update (an RL rollout), the recorded steps are not the whole iteration."""
        if self.held_s is None or self.marking != "optimizer" or len(self._intervals) < 3:
            return None
        step_s = statistics.median(self._intervals[1:])
        if self.held_s < HELD_WORK_STEPS * step_s:
            return None
        return (
            f"before its first optimizer.step(), the script ran {self.held_s:.2f} s ({self.held_s / step_s:.0f}x a "
            f"step) of repeated {LABELS[self._held_signal]} ({self.held + 1} rounds) with no optimizer step: skalpel "
            "took them for evaluation, and they are in no recorded step. If that work comes before every update "
            "(an RL rollout, then the update's minibatches), each recorded step is one optimizer step, not the "
            "iteration, and each later rollout lies inside the step of an update's last minibatch: "
            f"{HOW_TO_MARK}"
        )

    # -- optimizer ------------------------------------------------------------------------------
    def _stop_request(self) -> None:
        self.stop_requested = False
        if self.on_stop_request is not None:
            self.on_stop_request()

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        compiling = tracing()
        if not compiling and threading.get_ident() != self.thread:
            return
        if self.stop_requested:
            self._stop_request()
        if "optimizer" not in self.seen:
            if self._held_since is not None:
                self.held_s = time.monotonic() - self._held_since
            self._seen("optimizer")  # before any backward an LBFGS closure runs inside the step
            self._wrap_step(type(optimizer))  # made before install (skalpel.profile() in the script)
        if not compiling:
            self._optimizer_began = time.perf_counter()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not tracing() and threading.get_ident() != self.thread:  # _elsewhere, inline (each step: a call less)
            self._count_elsewhere()
            return
        self.optimizer_steps += 1
        if self._optimizer_began is not None:  # before a boundary marked here: the step is the ending one's
            self.optimizer_s += time.perf_counter() - self._optimizer_began
            self._optimizer_began = None
        if self.marking != "optimizer":
            return
        key = id(optimizer)
        self._optimizers.setdefault(key)
        if key in self._stepped and self._stepped >= self._optimizers.keys():
            # stepped again with no boundary before the step: its class's step is not wrapped; mark here
            self._boundary("optimizer")
            self._stepped = set()
            self._resteps = 0
        self._stepped.add(key)
        self._pending = True

    def _skipped_by_scaler(self, optimizer: Any) -> None:
        """GradScaler skipped ``optimizer``'s step (inf/nan gradients): the iteration ends as if it had stepped,
        or two iterations would be one step."""
        self.skipped_steps += 1
        if self.marking == "optimizer":
            self._before_step_range(optimizer)
        self._before_optimizer_step(optimizer, (), {})
        self._after_optimizer_step(optimizer, (), {})

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

    def _before_step_range(self, optimizer: Any) -> None:
        """An optimizer steps (its range not yet open): if it already stepped in this iteration, the iteration
        ended, once every optimizer has stepped (WGAN's critic steps 5 times before its generator)."""
        if id(optimizer) not in self._stepped:
            return
        if not self._stepped >= self._optimizers.keys():
            self._resteps += 1
            if self._resteps <= LAGGING_OPTIMIZER_STEPS:
                return
            for stopped in self._optimizers.keys() - self._stepped:
                del self._optimizers[stopped]
        self._take_pending()

    def _take_pending(self) -> None:
        if self._pending and self._stepped >= self._optimizers.keys() and self.marking == "optimizer":
            self._pending = False
            self._stepped = set()
            self._resteps = 0
            self._boundary("optimizer")

    # -- DataLoader -----------------------------------------------------------------------------
    def _before_next(self, iterator: Any) -> None:
        if "dataloader" not in self.seen:
            self._seen("dataloader")
        workers = getattr(iterator, "_num_workers", 0)
        if workers > self.loader_workers:
            self.loader_workers = workers
        if "optimizer" in self.seen and self.only in (None, "optimizer"):
            self._take_pending()
            return
        if self.marking != "dataloader":
            return
        key = id(getattr(iterator, "_dataset", iterator))  # one loader's iterators share it, epoch after epoch
        if key in self._fetched:
            self._fetched = set()
            if not self._waits_for_optimizer():
                self._boundary("dataloader")
        self._fetched.add(key)

    # -- backward and forward -------------------------------------------------------------------
    def _before_backward(self) -> None:
        self._seen("backward")
        if self._backward_pending and self.marking == "backward":  # no module call since the last backward
            self._backward_pending = False
            if not self._waits_for_optimizer():
                self._boundary("backward")

    # The module hooks test no thread: torch.compile traces them into the script's graphs, where any
    # call it cannot trace (a thread id) would cut the graph; another thread's module calls are rare.
    def _before_module(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        if self._backward_pending and self.marking == "backward":
            self._backward_pending = False
            self._called = set()
            if not self._waits_for_optimizer():
                self._boundary("backward")
            return
        self._seen("forward")
        if self.marking != "forward":
            return
        key = id(module)
        if key in self._called:
            self._called = set()
            if not self._waits_for_optimizer():  # evaluation, or one part of an iteration the optimizer ends
                self._boundary("forward")
        self._called.add(key)

    def _after_module(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)


def _compiled_anything() -> bool:
    """Whether torch.compile has produced a graph in this process (its guards then cover our module hooks)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo is not None and bool(dynamo.counters["stats"]["unique_graphs"])


class Watchdog:
    """Says on stderr, while the script runs, when no step boundary came for ``timeout_s`` seconds."""

    def __init__(self, detector: StepDetector, timeout_s: float, say: Callable[[str], None],
                 done: Callable[[], bool]) -> None:  # fmt: skip
        self.detector = detector
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
        sys.setprofile(None)  # out of the profiler's Python tracer (and the flame graph)
        warned_at = -1  # the boundary count at the last warning: one warning per silent stretch
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if self.done():
                return
            count = self.detector.boundaries
            silent = time.monotonic() - self.detector.last_boundary
            if silent < self.timeout_s or count == warned_at:
                continue
            warned_at = count
            self.say(self.message(count, silent))

    def message(self, count: int, silent_s: float) -> str:
        if count == 0 and self.detector.held:
            return (
                f"no optimizer.step() in the first {silent_s:.0f} s: the script made an optimizer, so skalpel waits "
                "for its first step (model calls and batches before it are taken as evaluation); still waiting. "
                f"If they are the work to profile, {HOW_TO_MARK}"
            )
        if count == 0:
            looked = LABELS[self.detector.only] if self.detector.only else ALL_SIGNALS
            return (
                f"no step boundary in the first {silent_s:.0f} s (skalpel looks for {looked}); "
                f"still waiting. If the script has no training loop there is nothing to record; otherwise {HOW_TO_MARK}"
            )
        return (
            f"step {count} has run for {silent_s:.0f} s without a boundary (last marked by "
            f"{LABELS.get(self.detector.signal or '', '?')}); a step this long is slow to record: lower --active, "
            f"or, if this is not one iteration, {HOW_TO_MARK}"
        )
