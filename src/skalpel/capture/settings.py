"""Capture settings: the expert defaults, the torch.profiler arguments they become, and step phases.

The defaults avoid the classic mistakes: steps before recording (the first iterations
allocate, compile and warm caches), several recorded steps, memory and shapes on, Python
stacks on with the verbose experimental config (without it ``export_stacks`` writes
nothing), and CUDA activity whenever CUDA is available.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SkalpelError

WAIT, WARMUP, ACTIVE = "wait", "warmup", "active"

HISTORY_ENTRIES = 100_000  # --memory-history: allocator actions kept (torch's ring buffer), some 100 bytes each plus stacks


@dataclass(frozen=True)
class CaptureSettings:
    wait: int = 1  # steps run without the profiler before each window
    warmup: int = 2  # steps with the profiler started but not recording
    active: int = 5  # steps recorded per window
    repeat: int = 1  # windows; with 2 or more the spread of their medians is the noise
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    with_flops: bool | None = None  # None: on with CUDA (flop counts for MFU), off on CPUs (no peak to compare with)
    with_modules: bool = False
    cuda: bool | None = None  # None: record CUDA activity when CUDA is available

    def __post_init__(self) -> None:
        for name in ("wait", "warmup"):
            if getattr(self, name) < 0:
                raise SkalpelError(f"{name} must be 0 or more steps (got {getattr(self, name)})")
        for name in ("active", "repeat"):
            if getattr(self, name) < 1:
                raise SkalpelError(f"{name} must be at least 1 (got {getattr(self, name)})")

    def describe(self) -> str:
        """``1 wait + 2 warm-up + 5 active steps``: how the header and the summary count them."""
        from ..result.report import describe_steps  # here: the report model (and orjson) would slow `skalpel --help`

        return describe_steps(self.wait, self.warmup, self.active, self.repeat)

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int:
        """Steps the script must run for every window to be recorded in full."""
        return self.cycle * self.repeat

    def phase(self, step: int) -> tuple[int, str] | None:
        """(window, phase) of the profiler's step ``step`` (0-based), None once every window is done."""
        window, offset = divmod(step, self.cycle)
        if window >= self.repeat:
            return None
        if offset < self.wait:
            return window, WAIT
        return window, WARMUP if offset < self.wait + self.warmup else ACTIVE


def profiler_kwargs(settings: CaptureSettings) -> dict[str, Any]:
    """The ``torch.profiler.profile`` arguments for ``settings`` (schedule and handler excluded)."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    cuda = torch.cuda.is_available() if settings.cuda is None else settings.cuda
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    kwargs: dict[str, Any] = {
        "activities": activities,
        "record_shapes": settings.record_shapes,
        "profile_memory": settings.profile_memory,
        "with_stack": settings.with_stack,
        "with_flops": cuda if settings.with_flops is None else settings.with_flops,
        "with_modules": settings.with_modules,
    }
    if settings.with_stack:
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
    return kwargs


def torch_schedule(settings: CaptureSettings) -> Any:
    from torch.profiler import schedule

    return schedule(wait=settings.wait, warmup=settings.warmup, active=settings.active, repeat=settings.repeat)
