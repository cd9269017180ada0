"""All analysis results for one trace, computed once and handed to the findings and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..trace.model import Trace
from .steps import StepSegmentation, segment_steps


@dataclass
class Analyses:
    """The results of every analysis; a field stays None when its analysis does not apply.

    Each analysis module adds its result as one field here and computes it in ``run_analyses``.
    Rules and renderers read these results, never the raw JSON.
    """

    trace: Trace  # kept for user-code locations (Python stacks) only
    steps: StepSegmentation
    results: dict[str, Any] = field(default_factory=dict)  # name -> typed result, for analyses added later


def run_analyses(trace: Trace) -> Analyses:
    steps = segment_steps(trace)
    analyses = Analyses(trace=trace, steps=steps)
    return analyses
