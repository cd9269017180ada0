"""``SkalpelTrainerCallback``: profile a Hugging Face ``Trainer.train`` with skalpel's defaults.

::

    from skalpel.integrations.hf import SkalpelTrainerCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[SkalpelTrainerCallback()])

A step is an optimizer step (``on_step_end``: ``gradient_accumulation_steps`` micro-batches make one). Evaluation
and checkpoint saving, which the Trainer runs right after the step that asked for them, are never profiled as
training (``training.py``). At the end of training one line gives the verdict and the report's path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .training import TrainingCapture
from .versions import check_version

LOW, HIGH = "5.0", "6"  # the Transformers releases tested
VERSION = check_version("Transformers", ("transformers",), LOW, HIGH, "hf")

from transformers import TrainerCallback  # noqa: E402  (after the version check: its message, not an ImportError)


class SkalpelTrainerCallback(TrainerCallback):
    """Profiles the optimizer steps skalpel chooses (``skalpel.profile()``'s defaults, or its arguments here) and
    writes the usual run folder (``out``; default ``./skalpel-runs/<time>-<name>``)."""

    def __init__(self, *, out: str | Path | None = None, name: str | None = None, **settings: Any) -> None:
        self.capture = TrainingCapture("optimizer steps (Trainer callback)", out=out, name=name, **settings)

    @property
    def report(self):  # the Report once training ended (None before, or on a rank that leaves it to rank 0)
        return self.capture.report

    @property
    def folder(self) -> Path | None:
        return self.capture.folder

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.capture.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.capture.optimizer_step()
        # the Trainer's own flow callback ran first: it says whether an evaluation or a save follows this step
        if control.should_evaluate or control.should_save:
            self.capture.evaluation_begins()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.capture.evaluation_ends()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.capture.evaluation_ends()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.capture.finish()
