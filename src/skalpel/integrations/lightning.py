"""``SkalpelCallback``: profile a Lightning ``Trainer.fit`` with skalpel's defaults.

::

    from skalpel.integrations.lightning import SkalpelCallback
    trainer = L.Trainer(callbacks=[SkalpelCallback()])

A step is an optimizer step (``trainer.global_step`` moved: ``accumulate_grad_batches`` batches make one);
validation is never profiled as training (``training.py``). Each rank of a strategy's job profiles itself into the
one run folder, which rank 0 analyses. At the end of ``fit`` one line gives the verdict and the report's path, and a
configured logger gets the step time, the finding ids and the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .training import TrainingCapture
from .versions import check_version

LOW, HIGH = "2.2", "2.7"  # the Lightning releases tested
VERSION = check_version("Lightning", ("lightning", "pytorch-lightning"), LOW, HIGH, "lightning")

try:  # the unified package first; the standalone pytorch_lightning is the same code under another name
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - only pytorch-lightning installed
    from pytorch_lightning import Callback


class SkalpelCallback(Callback):
    """Profiles the optimizer steps skalpel chooses (``skalpel.profile()``'s defaults, or its arguments here) and
    writes the usual run folder (``out``; default ``./skalpel-runs/<time>-<name>``)."""

    def __init__(self, *, out: str | Path | None = None, name: str | None = None, **settings: Any) -> None:
        super().__init__()
        self.capture = TrainingCapture("optimizer steps (Lightning callback)", out=out, name=name, **settings)
        self._global_step = 0

    @property
    def report(self):  # the Report once fit ended (None before, or on a rank that leaves it to rank 0)
        return self.capture.report

    @property
    def folder(self) -> Path | None:
        return self.capture.folder

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = trainer.global_step
        self.capture.begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self._global_step:  # an optimizer step ran in this batch
            self._global_step = trainer.global_step
            self.capture.optimizer_step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.capture.evaluation_begins()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.capture.evaluation_ends()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        report = self.capture.finish()
        if report is not None and trainer.logger is not None:
            _log(trainer.logger, report, self.capture.folder, trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.capture.run is not None:
            self.capture.run.stop()  # the trace of what was recorded stays; no analysis of a failed fit


def _log(logger: Any, report: Any, folder: Path | None, step: int) -> None:
    """The step time and the findings into the user's logger (metrics and hyperparameters every logger takes)."""
    ids = [finding.id for finding in report.findings]
    logger.log_metrics({"skalpel_step_median_ms": report.steps.median_ms, "skalpel_finding_count": len(ids)}, step=step)
    logger.log_hyperparams({"skalpel_findings": ",".join(ids) or "none",
                            "skalpel_report": str(folder / "report.html") if folder else ""})  # fmt: skip
    logger.save()
