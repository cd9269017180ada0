"""The torch patches that tell the step boundary policy what the script does, and time it for ``skalpel watch``.

``TorchHooks.install`` wraps DataLoader ``__next__``, ``Optimizer.__init__``/``zero_grad``/``step``,
``GradScaler.step`` and ``torch.autograd.backward``, and adds torch's global optimizer step hooks and
(while module calls can still mark steps) its global module hooks. Each turns what happened into an
event of ``capture/boundaries.BoundaryPolicy`` (a method call: no tuple built on the script's path)
and hands what it answers, a boundary or a takeover, to ``deliver``, before the call it wraps runs
(where ``prof.step()`` would be in a hand-written loop).

torch.compile sees global module hooks: it traces ``Module.__call__`` with them instead of the
forward (other graphs and guards) and warns at each call of a compiled module ("Using
`torch.compile(module)` when there are global hooks on modules"). So ``torch.compile`` is wrapped:
before it compiles anything, the global module hooks are removed for good, and the calls of compiled
modules (``OptimizedModule.__call__``, which runs before Dynamo) mark top-level module calls instead.

Only the script's thread sends events: another thread's optimizer steps and ``skalpel.step()`` calls
go as ``elsewhere`` (counted), the rest of its calls pass through untouched. The same wrappers time
the script thread's DataLoader waits, backward calls and optimizer steps (``loader_s``,
``backward_s``, ``optimizer_s``: skalpel watch's step split, a clock read at each end; one layer of
hooks for both jobs, since each Python call a step costs the loop), and relay the memory budget's
stop request (set from its thread, acted on at the next hook on the script's thread).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as optimizer_module
from torch.nn.modules import module as module_hooks
from torch.utils.data import dataloader

from .boundaries import Boundary, BoundaryPolicy, Takeover

# True while torch.compile traces the caller (it folds the call), False in eager: one call where is_compiling is two
tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


class TorchHooks:
    """The patches of one run; ``deliver`` gets each boundary or takeover ``policy`` answers."""

    def __init__(self, policy: BoundaryPolicy, deliver: Callable[[Boundary | Takeover], None]) -> None:
        self.policy = policy
        self.deliver = deliver
        self.thread = threading.get_ident()  # the thread that runs the script (set again at install)
        self.optimizer_steps = 0  # optimizer steps on the script's thread (a GradScaler.step without one skipped it)
        self.loader_workers = 0  # the most DataLoader workers seen, for cpu_contention
        self.batches = 0  # batches the script's DataLoaders yielded
        self.loader_s = 0.0  # time in the script's DataLoader fetches (skalpel watch resets it at each boundary)
        # the script thread's CPU time in those fetches: a batch's cost on a core, which other load does not stretch
        self.loader_cpu_s = 0.0
        # time in the script thread's backward calls and optimizer steps, likewise (skalpel watch's phase columns);
        # a backward inside optimizer.step() (an LBFGS closure) is the optimizer's; a call torch.compile traces is
        # not timed (a clock read would break its graph)
        self.backward_s = 0.0
        self.optimizer_s = 0.0
        self._optimizer_began: float | None = None
        self._depth = 0  # module calls running (0: the next call is top-level)
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self.compile_called = False  # the script compiles: no global module hook from then on
        self._compile_start_hooked = False
        self._forget: list[Callable[[], Any]] = []  # callbacks of ours to remove at uninstall
        self._restore: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, replacement)
        # Set from another thread (the recording's memory budget): the next hook on the script's thread acts on it.
        self.stop_requested = False
        self.on_stop_request: Callable[[], None] | None = None

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    # -- installing -----------------------------------------------------------------------------------
    def install(self) -> None:
        if self._handles:
            return
        self.thread = threading.get_ident()
        self._handles = [
            optimizer_module.register_optimizer_step_pre_hook(self._before_optimizer_step),
            optimizer_module.register_optimizer_step_post_hook(self._after_optimizer_step),
        ]
        hooks, policy, deliver = self, self.policy, self.deliver
        original_next = dataloader._BaseDataLoaderIter.__next__

        def __next__(iterator: Any) -> Any:
            # a prefetching thread: the script's thread marks the steps (the test of _elsewhere, inline: a call less)
            if not tracing() and threading.get_ident() != hooks.thread:
                return original_next(iterator)
            if hooks.stop_requested:
                hooks._stop_request()
            workers = getattr(iterator, "_num_workers", 0)
            if workers > hooks.loader_workers:
                hooks.loader_workers = workers
            # a boundary taken here comes first: the wait is the new step's
            result = policy.fetch(id(getattr(iterator, "_dataset", iterator)))  # one loader's iterators share it
            if hooks._module_handles and not policy.module_calls_matter:
                hooks.remove_module_hooks()  # the fallbacks no longer decide: spare every module call the hooks
            if result is not None:
                deliver(result)
            began, began_cpu = time.perf_counter(), time.thread_time()
            try:
                batch = original_next(iterator)
            finally:
                hooks.loader_s += time.perf_counter() - began
                hooks.loader_cpu_s += time.thread_time() - began_cpu
            hooks.batches += 1
            return batch

        original_init = optimizer_module.Optimizer.__init__

        def optimizer_init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original_init(optimizer, *args, **kwargs)
            hooks._wrap_step(type(optimizer))
            if not hooks._elsewhere():
                policy.optimizer_made(optimizer)

        zero_grad = optimizer_module.Optimizer.zero_grad

        def wrapped_zero_grad(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # the flags first: most calls have nothing to do, and the thread test costs three calls
            if not (hooks.stop_requested or policy.pending) or (
                    not tracing() and threading.get_ident() != hooks.thread):  # fmt: skip
                return zero_grad(optimizer, *args, **kwargs)
            if hooks.stop_requested:
                hooks._stop_request()
            result = policy.zero_grad(id(optimizer))
            if result is not None:
                deliver(result)
            return zero_grad(optimizer, *args, **kwargs)

        scaler_step = torch.amp.GradScaler.step

        def wrapped_scaler_step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = hooks.optimizer_steps
            result = scaler_step(scaler, optimizer, *args, **kwargs)
            if scaler.is_enabled() and not hooks._elsewhere():
                skipped = hooks.optimizer_steps == before  # inf/nan gradients: the optimizer did not step
                if skipped:  # it counts as the optimizer's step (the policy takes it as one)
                    hooks.optimizer_steps += 1
                    hooks._wrap_step(type(optimizer))
                hooks._send(policy.scaler_step(id(optimizer), skipped))
                if skipped:
                    if hooks.stop_requested:
                        hooks._stop_request()
                    if hooks._module_handles and not policy.module_calls_matter:
                        hooks.remove_module_hooks()
            return result

        backward = torch.autograd.backward

        def wrapped_backward(*args: Any, **kwargs: Any) -> Any:
            compiling = tracing()
            if not compiling and threading.get_ident() != hooks.thread:  # another thread: marks nothing
                return backward(*args, **kwargs)
            # settled (seen, and a signal that outranks it marks the steps for good: the seen signals only grow,
            # --step-on forward never lets it mark): only timed
            settled = (not hooks.stop_requested and "backward" in policy.seen
                       and policy.marking not in (None, "backward", "forward"))  # fmt: skip
            if not settled:
                if hooks.stop_requested:
                    hooks._stop_request()
                result = policy.backward()  # a boundary here comes first: the backward is the new step's
                if result is not None:
                    deliver(result)
            began = None if compiling or hooks._optimizer_began is not None else time.perf_counter()
            try:
                return backward(*args, **kwargs)
            finally:
                if began is not None:
                    hooks.backward_s += time.perf_counter() - began
                if not settled:
                    policy.backward_done()

        original_compile = torch.compile

        def wrapped_compile(*args: Any, **kwargs: Any) -> Any:
            target = args[0] if args else kwargs.get("model")
            if isinstance(target, torch.nn.Module) or getattr(target, "__self__", None) is not None:
                hooks._compiling()  # a module (or a module's method: module.compile()): its calls would warn at once
            compiled = original_compile(*args, **kwargs)  # imports Dynamo
            hooks._on_compile_start()  # a function compiles at its first call, if ever (a library's decorator)
            return compiled

        self._patch(torch, "compile", wrapped_compile, original_compile)
        self._patch(dataloader._BaseDataLoaderIter, "__next__", __next__, original_next)
        self._patch(optimizer_module.Optimizer, "__init__", optimizer_init, original_init)
        self._patch(optimizer_module.Optimizer, "zero_grad", wrapped_zero_grad, zero_grad)
        self._patch(torch.amp.GradScaler, "step", wrapped_scaler_step, scaler_step)  # torch.cuda.amp's inherits it
        self._patch(torch.autograd, "backward", wrapped_backward, backward)  # Tensor.backward calls it
        if policy.only in (None, "backward", "forward") and not self.compile_called:
            self._module_handles = [
                module_hooks.register_module_forward_pre_hook(self._before_module),
                module_hooks.register_module_forward_hook(self._after_module, always_call=True),
            ]

    def _compiling(self, *_: Any) -> None:
        """The script compiles: skalpel's global module hooks go, for good, before Dynamo traces anything."""
        if self.compile_called:
            return
        self.compile_called = True
        self.remove_module_hooks(final=True)
        self._depth = 0  # a module call under way when they went never reports its end
        self._mark_compiled_calls()  # here: importing torch._dynamo costs every run a second

    def _on_compile_start(self) -> None:
        """Have Dynamo call ``_compiling`` when it starts compiling a frame, before tracing it (once)."""
        if self._compile_start_hooked:
            return
        self._compile_start_hooked = True
        handler = getattr(sys.modules.get("torch._dynamo.callback"), "callback_handler", None)
        if handler is not None and hasattr(handler, "register_start_callback"):
            handler.register_start_callback(self._compiling)
            self._forget.append(lambda: handler.remove_start_callback(self._compiling))

    def _mark_compiled_calls(self) -> None:
        """Calls of compiled modules mark top-level module calls (the global module hooks are gone)."""
        from torch._dynamo.eval_frame import OptimizedModule

        hooks, policy, optimized_call = self, self.policy, OptimizedModule.__call__

        def wrapped_optimized_call(module: Any, *args: Any, **kwargs: Any) -> Any:
            # a compiled module's call, in eager before Dynamo runs: a top-level module call once the global hooks are
            # gone (a compiled module inside a compiled region is Dynamo's, and marks nothing)
            if (not hooks.compile_called or not policy.module_calls_matter or hooks._depth or tracing()
                    or threading.get_ident() != hooks.thread):  # fmt: skip
                return optimized_call(module, *args, **kwargs)
            hooks._depth += 1
            try:
                hooks._send(policy.forward(id(module._orig_mod)))
                return optimized_call(module, *args, **kwargs)
            finally:
                hooks._depth -= 1

        self._patch(OptimizedModule, "__call__", wrapped_optimized_call, optimized_call)

    def _patch(self, owner: Any, name: str, replacement: Any, original: Any) -> None:
        replacement.__wrapped__ = original
        setattr(owner, name, replacement)
        self._restore.append((owner, name, original, replacement))

    def _wrap_step(self, cls: type) -> None:
        """Wrap ``cls.step`` (torch's profiling wrapper, whose range the hooks run in) so that an optimizer stepping
        again takes the boundary before the range opens."""
        inner = cls.step
        if getattr(inner, "skalpel_steps", False) or not self._handles:
            return
        hooks, policy = self, self.policy

        @functools.wraps(inner)
        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # tracing first: torch.compile would guard on the policy's attributes
            if not tracing() and policy.marking == "optimizer" and not hooks._elsewhere():
                hooks._send(policy.step_begins(id(optimizer)))
            return inner(optimizer, *args, **kwargs)

        step.skalpel_steps = True  # type: ignore[attr-defined]  # a subclass made later inherits it: wrapped once
        self._restore.append((cls, "step", cls.__dict__.get("step"), step))  # None: inherited, deleted at uninstall
        cls.step = step

    def uninstall(self, *, final: bool = True) -> None:
        """Remove every hook; ``final=False`` (capture done, script still running) keeps module hooks that
        torch.compile has already traced, so that removing them does not make it recompile."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.remove_module_hooks(final=final)
        for owner, name, original, replacement in reversed(self._restore):
            if getattr(owner, name, None) is not replacement:
                continue  # replaced since (compile_log puts torch.compile back once Dynamo is hooked): not ours now
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._restore = []
        for forget in self._forget:
            try:
                forget()
            except ValueError:
                pass  # already removed
        self._forget = []
        self._compile_start_hooked = False

    def remove_module_hooks(self, *, final: bool = False) -> None:
        if not final and _compiled_anything():
            return  # torch.compile guards on the global module hooks: removing them now would recompile
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []

    # -- events -----------------------------------------------------------------------------------------
    def _send(self, result: Boundary | Takeover | None) -> None:
        if result is not None:
            self.deliver(result)

    def _elsewhere(self) -> bool:
        """Called from a thread other than the script's: it marks no step (two threads cannot drive a profiler)."""
        if tracing():
            return False  # a compiled train step traces the wrappers: a thread id there would break its graph
        return threading.get_ident() != self.thread

    def user_step(self) -> None:
        """``skalpel.step()``: the end of one iteration, as the script says."""
        if self._elsewhere():
            self.policy.elsewhere(threading.current_thread().name)
            return
        result = self.policy.user_step()
        if self._module_handles and not self.policy.module_calls_matter:
            self.remove_module_hooks()
        self.deliver(result)

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
        policy = self.policy
        if "optimizer" not in policy.seen:
            result = policy.optimizer_begins()  # before any backward an LBFGS closure runs inside the step
            if self._module_handles and not policy.module_calls_matter:
                self.remove_module_hooks()
            self._send(result)
            self._wrap_step(type(optimizer))  # made before install (skalpel.profile() in the script)
        if not compiling:
            self._optimizer_began = time.perf_counter()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not tracing() and threading.get_ident() != self.thread:  # _elsewhere, inline (each step: a call less)
            self.policy.elsewhere(threading.current_thread().name)
            return
        self.optimizer_steps += 1
        if self._optimizer_began is not None:  # before a boundary marked here: the step is the ending one's
            self.optimizer_s += time.perf_counter() - self._optimizer_began
            self._optimizer_began = None
        if self.policy.marking == "optimizer":
            self._send(self.policy.optimizer_step(id(optimizer)))

    # The module hooks test no thread: torch.compile traces them into the script's graphs, where any
    # call it cannot trace (a thread id) would cut the graph; another thread's module calls are rare.
    def _before_module(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth == 1:
            self._send(self.policy.forward(id(module)))

    def _after_module(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)


def _compiled_anything() -> bool:
    """Whether torch.compile has produced a graph in this process (its guards then cover our module hooks)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return dynamo is not None and bool(dynamo.counters["stats"]["unique_graphs"])
