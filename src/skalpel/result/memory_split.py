"""The memory peak of a recorded window, split by what held it (``capture/memory_split.py`` measures it).

A ledger of bytes, as the run's ledger is one of seconds: at the instant the tracked bytes peaked, every
live tensor's bytes go to one of torch.profiler's memory categories (``torch.profiler._memory_profiler``:
parameter, optimizer state, input, temporary, activation, gradient, autograd detail) or to ``unknown``
(an allocation the categoriser could not tie to a tensor), so the categories add up to ``peak_bytes``.
Activations are split further by the module whose forward produced them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sections import _Section

CATEGORIES = ("parameter", "optimizer_state", "gradient", "activation", "temporary", "input", "autograd_detail",
              "unknown")  # fmt: skip
PHASES = ("forward", "backward", "optimizer", "zero_grad", "other")


@dataclass(frozen=True)
class CategoryBytes(_Section):
    category: str  # one of CATEGORIES
    bytes: int


@dataclass(frozen=True)
class ModuleActivations(_Section):
    """The activations one kind of module holds at the peak: its calls in the window, summed."""

    module: str  # the module's class, as the profiler names its calls (``Block``)
    location: str | None  # its forward, ``model.py:28 in forward``; None outside any module
    bytes: int
    calls: int  # module calls (instances x steps) whose activations are live at the peak
    largest_call_bytes: int  # the activations of its largest single call
    output_bytes: int  # of ``bytes``, each call's last activation (its output, kept by checkpointing too)


@dataclass(frozen=True)
class MemorySplit(_Section):
    device: str  # "cpu" or "cuda:0": the device whose peak this is
    peak_bytes: int  # bytes of the tensors the profiler tracked, at their highest in the window
    held_before_bytes: int  # of them, allocated before the recording and held at the peak (parameters, optimizer state)
    phase: str  # where the peak fell: one of PHASES
    categories: tuple[CategoryBytes, ...]  # add up to peak_bytes, largest first
    activation_modules: tuple[ModuleActivations, ...]  # the top modules by activation bytes
    step_span: int  # recorded steps the window held (the peak is the highest of them)
    # the live bytes by category over the window, downsampled: rows of (ms from the window's first allocation,
    # MiB of each of curve_categories); the row of the peak is among them
    curve_categories: tuple[str, ...] = ()
    curve: tuple[tuple[float, ...], ...] = ()
    # gradients live for nothing (an optimizer step read them, or zero_grad(set_to_none=False) zeroed them, and no
    # backward wrote them since): their bytes at the peak, the peak with them freed (capture/stale_gradients.py),
    # and the user line of the zero_grad that cleared them; None where not measured (a report of an older skalpel)
    spent_gradient_bytes: int | None = None
    peak_without_spent_gradients_bytes: int | None = None
    zero_grad_location: str | None = None

    def bytes_of(self, category: str) -> int:
        return sum(part.bytes for part in self.categories if part.category == category)

    def share(self, category: str) -> float:
        """The category's fraction of the peak (0 for an empty peak)."""
        return self.bytes_of(category) / self.peak_bytes if self.peak_bytes else 0.0

    def lines(self) -> list[str]:
        """The split in words (terminal and HTML say the same): the categories, then the modules' activations."""
        whole = max(self.peak_bytes, 1)
        parts = [f"{part.category.replace('_', ' ')} {_mib(part.bytes)} ({100 * part.bytes / whole:.0f}%)"
                 for part in self.categories]  # fmt: skip
        lines = [f"memory peak on {self.device} {_mib(self.peak_bytes)}, in {self.phase}: " + ", ".join(parts)]
        if self.activation_modules:
            modules = [f"{m.module} ({m.calls} calls{', ' + m.location if m.location else ''}) {_mib(m.bytes)}"
                       for m in self.activation_modules[:4]]  # fmt: skip
            lines.append("activations by module: " + ", ".join(modules))
        return lines


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**17 else f"{count / 2**10:.0f} KiB"
