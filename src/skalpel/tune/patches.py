"""Inside the script's process: apply one tune fix without editing the script, and record what it builds.

The launcher (``launch.py``) installs a ``Patcher`` before the script runs. It wraps the
constructors the fixes act on, so that the script's own calls get the fix's arguments:

* ``DataLoader(...)``: ``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``
  (the last two only where the loader ends up with workers: they are errors without);
* the ``torch.optim`` optimizers that take them: ``foreach=True`` or ``fused=True``;
* the model, found as the first top-level ``nn.Module`` with parameters that the script calls:
  ``torch.compile(model.forward, mode=...)`` and a bf16 ``torch.autocast`` around its forward, from its second
  call on (the first is already running when it is found);
* ``torch.set_num_threads(N)`` before the script starts, the script's own calls then ignored;
  ``torch.backends.cudnn.benchmark = True``.

Every run (the baseline too) records the facts the candidates and their advice need: each
DataLoader and optimizer with its settings and the line of the user's code that built it, the
model's class, build line and call line, the script's ``set_num_threads`` call, the device,
and the last scalar that ``backward()`` was called on (the loss) with the step it belongs to.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import sys
from typing import Any, Callable

import torch
from torch.nn.modules import module as module_hooks
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from ..trace.stacks import format_location, is_user_file
from .edits import statement_at

LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
NEEDS_WORKERS = ("persistent_workers", "prefetch_factor")  # DataLoader raises for these without workers


def user_site(owner: object = None) -> dict[str, Any] | None:
    """The innermost frame of the user's code calling us; ``__init__`` frames of ``owner`` itself are skipped
    (a subclass's ``super().__init__()``), so a model's site is where it is built, not its class body."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        own_init = owner is not None and code.co_name == "__init__" and frame.f_locals.get("self") is owner
        if is_user_file(code.co_filename) and not own_init:
            path, line = code.co_filename, frame.f_lineno
            site = {"location": format_location(path, line, code.co_name), "path": path, "line": line,
                    "end_line": line, "simple": True, "code": linecache.getline(path, line).strip()}  # fmt: skip
            statement = statement_at(path, line)  # the whole statement: an edit after its first line would not parse
            if statement is not None:
                site.update(line=statement["line"], end_line=statement["end_line"], code=statement["code"],
                            simple=statement["simple"])  # fmt: skip
            return site
        frame = frame.f_back
    return None


class Patcher:
    """Applies ``fix`` (see ``candidates.Fix``) and records facts; ``uninstall`` puts torch back."""

    def __init__(self, fix: dict[str, Any], *, current_step: Callable[[], int]) -> None:
        self.fix = fix
        self.current_step = current_step
        self.loaders: list[dict[str, Any]] = []
        self.optimizers: list[dict[str, Any]] = []
        self.model: dict[str, Any] | None = None
        self.threads_call: dict[str, Any] | None = None
        self.loss: Any = None
        self.loss_step: int | None = None
        self._module_sites: dict[int, dict[str, Any] | None] = {}
        self._depth = 0
        self._pending_model: tuple[Any, dict[str, Any] | None] | None = None
        self._restore: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []
        self.applied: set[str] = set()  # the fix's parts that found something to act on

    def install(self) -> None:
        threads = self.fix.get("threads")
        if threads:
            torch.set_num_threads(int(threads))
            self.applied.add("threads")
        if self.fix.get("cudnn_benchmark"):
            torch.backends.cudnn.benchmark = True
            self.applied.add("cudnn_benchmark")
        self._wrap(DataLoader, "__init__", self._loader_init)
        self._wrap(Optimizer, "__init__", self._optimizer_init)
        for key, value in (self.fix.get("optimizer") or {}).items():
            for cls in _optimizers_taking(key):
                self._wrap(cls, "__init__", _with_argument(key, value, on_apply=lambda: self.applied.add("optimizer")))
        self._wrap(torch.nn.Module, "__init__", self._module_init)
        self._wrap(torch, "set_num_threads", self._set_num_threads)
        self._wrap(torch.autograd, "backward", self._backward)
        self._hooks = [module_hooks.register_module_forward_pre_hook(self._before_forward),
                       module_hooks.register_module_forward_hook(self._after_forward)]  # fmt: skip

    def uninstall(self) -> None:
        self._remove_hooks()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def facts(self) -> dict[str, Any]:
        return {
            "device": self.model["device"] if self.model else ("cuda" if torch.cuda.is_available() else "cpu"),
            "cuda_available": torch.cuda.is_available(),
            "bf16_supported": native_cuda_bf16(),
            "threads": torch.get_num_threads(),
            "threads_call": self.threads_call,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "loaders": self.loaders,
            "optimizers": [_with_fused_probe(optimizer) for optimizer in self.optimizers],
            "model": self.model,
            "applied": sorted(self.applied),
        }

    def loss_value(self) -> float | None:
        return None if self.loss is None else float(self.loss.float())

    def _wrap(self, owner: Any, name: str, make: Callable[..., Any]) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:  # a function, so that it binds as a method would
            return make(original, *args, **kwargs)

        functools.update_wrapper(wrapper, original)
        self._restore.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _loader_init(self, original: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        overrides = self.fix.get("dataloader") or {}
        if overrides:
            bound = inspect.signature(original).bind(loader, *args, **kwargs)
            workers = overrides.get("num_workers", bound.arguments.get("num_workers", 0))
            for key, value in overrides.items():
                if key not in NEEDS_WORKERS or workers:
                    bound.arguments[key] = value
            if not workers:  # no workers (the no_workers fix): the settings that need them would be errors
                bound.arguments.pop("prefetch_factor", None)
                if bound.arguments.get("persistent_workers"):
                    bound.arguments["persistent_workers"] = False
            args, kwargs = bound.args[1:], bound.kwargs
            self.applied.add("dataloader")
        original(loader, *args, **kwargs)
        settings = {key: getattr(loader, key, None) for key in LOADER_KEYS}
        self.loaders.append({"site": user_site(owner=loader), "batch_size": loader.batch_size, **settings})

    def _optimizer_init(self, original: Any, optimizer: Any, params: Any, defaults: Any, *args: Any, **kwargs: Any) -> None:
        original(optimizer, params, defaults, *args, **kwargs)
        accepts = inspect.signature(type(optimizer).__init__).parameters
        device = next((p.device.type for group in optimizer.param_groups for p in group["params"]), "cpu")
        self.optimizers.append({
            "class": type(optimizer).__name__, "site": user_site(owner=optimizer),
            "foreach": defaults.get("foreach"), "fused": defaults.get("fused"),
            "accepts": [key for key in ("foreach", "fused") if key in accepts], "device": device,
            "lr": defaults.get("lr"), "_type": type(optimizer),
        })  # fmt: skip

    def _module_init(self, original: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        original(module, *args, **kwargs)
        self._module_sites[id(module)] = user_site(owner=module)

    def _set_num_threads(self, original: Any, count: int) -> None:
        self.threads_call = {"site": user_site(), "threads": int(count)}
        if not self.fix.get("threads"):  # under the threads fix, the script's own setting is what it replaces
            original(count)

    def _backward(self, original: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            self.loss, self.loss_step = tensors.detach(), self.current_step()
        return original(tensors, *args, **kwargs)

    def _before_forward(self, module: Any, inputs: Any) -> None:
        if self._depth == 0 and self._pending_model is None and self.model is None:
            if any(True for _ in module.parameters()):
                self._pending_model = (module, user_site())
        self._depth += 1

    def _after_forward(self, module: Any, inputs: Any, output: Any) -> None:
        self._depth -= 1
        if self._depth > 0 or self._pending_model is None or self._pending_model[0] is not module:
            return
        _, call_site = self._pending_model
        self._pending_model = None
        self._remove_hooks()  # global hooks slow every module call, and compiled code must not see them
        device = next(module.parameters()).device.type
        self.model = {"class": type(module).__name__, "site": self._module_sites.get(id(module)),
                      "call_site": call_site, "device": device}  # fmt: skip
        if self.fix.get("autocast"):
            module.forward = _autocast_forward(module.forward, device)
            self.applied.add("autocast")
        if self.fix.get("compile"):  # the forward, not module.compile(): that one leaves _call_impl eager in torch 2.13
            mode = self.fix["compile"]
            module.forward = torch.compile(module.forward, mode=None if mode == "default" else mode)
            self.applied.add("compile")

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _with_argument(key: str, value: Any, *, on_apply: Callable[[], None]) -> Callable[..., None]:
    """An optimizer constructor called with ``key=value`` whatever the script passed (``fused`` replaces ``foreach``)."""
    other = {"fused": "foreach", "foreach": "fused"}[key]

    def init(original: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(original).bind(optimizer, *args, **kwargs)
        bound.arguments[key] = value
        if other in bound.arguments:
            bound.arguments[other] = None
        on_apply()
        original(*bound.args, **bound.kwargs)

    return init


def _with_fused_probe(optimizer: dict[str, Any]) -> dict[str, Any]:
    """The optimizer's facts, with whether this torch runs ``fused=True`` for its class on its parameters' device
    (``fused_supported``): probed, not assumed by device type (torch 2.13 runs fused AdamW on the CPU)."""
    facts = {key: value for key, value in optimizer.items() if not key.startswith("_")}
    cls = optimizer.get("_type")
    lr = facts.get("lr") if isinstance(facts.get("lr"), float) else None  # a tensor lr is not a cache key
    facts["lr"] = lr
    facts["fused_supported"] = bool(cls is not None and "fused" in facts["accepts"]
                                    and fused_runs(cls, facts["device"], lr))  # fmt: skip
    return facts


@functools.lru_cache(maxsize=None)
def fused_runs(cls: type, device: str, lr: Any = None) -> bool:
    """One ``fused=True`` step of ``cls`` on a tiny parameter on ``device`` runs (constructors and steps raise where
    the installed torch has no fused kernel for that device)."""
    try:
        param = torch.zeros(4, device=device, requires_grad=True)
        param.grad = torch.ones_like(param)
        extra = {"lr": lr} if isinstance(lr, float) else {}
        cls([param], fused=True, **extra).step()
    except Exception:  # noqa: BLE001 - any refusal (RuntimeError, ValueError, a missing kernel) means: not here
        return False
    return True


def _optimizers_taking(key: str) -> list[type]:
    """torch.optim's optimizer classes whose own constructor has ``key``."""
    found, stack = [], [Optimizer]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        init = cls.__dict__.get("__init__")
        if cls.__module__.startswith("torch.optim") and init and key in inspect.signature(init).parameters:
            found.append(cls)
    return found


def native_cuda_bf16() -> bool:
    """A GPU that runs bf16 natively (compute capability 8.0+, or ROCm). ``torch.cuda.is_bf16_supported()`` also says
    yes on older GPUs that only emulate bf16, slower than fp32: tune must not offer autocast there."""
    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch before the argument (2.3): no emulation was counted then
        return bool(torch.cuda.is_bf16_supported())


def _autocast_forward(forward: Callable[..., Any], device: str) -> Callable[..., Any]:
    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    return autocast_forward
