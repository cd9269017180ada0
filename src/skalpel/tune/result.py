"""What ``skalpel tune`` found: the baseline, each candidate's measurement and verdict, the recommendation.

Plain dataclasses; ``to_dict`` gives the ``skalpel.tune/1`` JSON (schema: ``tune.schema.json``
beside this file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import SkalpelError

TUNE_SCHEMA = "skalpel.tune/1"
VERDICTS = ("faster", "no_gain", "slower", "error")


class TuneFailed(SkalpelError):
    """The script failed unchanged (or tune could not start it): nothing can be compared."""

    exit_code = 1

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output  # the script's traceback, shown before the one-line error


@dataclass
class LossCheck:
    step: int  # the step after which both losses were taken
    baseline: float
    candidate: float
    change_pct: float
    tolerance_pct: float
    within_tolerance: bool


@dataclass
class Baseline:
    median_ms: float | None = None
    noise_pct: float | None = None
    run_ms: list[float] = field(default_factory=list)
    runs: int = 0
    steps: int = 0
    loss: float | None = None
    loss_step: int | None = None
    one_time_s: float | None = None  # the median run's one-time cost: start-up, set-up, warm-up's excess
    whole_run_s: float | None = None  # one-time cost + the run's steps x the step time (TuneResult.run_steps)


@dataclass
class CandidateResult:
    name: str
    what: str
    reason: str  # why it ran: a finding, the device, --try, or the winners combined
    fix: dict[str, Any]
    change: list[dict[str, Any]]  # the edit at each line of the user's code: location, before, after, edit
    members: list[str] = field(default_factory=list)  # for the combination: the candidates in it
    verdict: str | None = None  # faster | no_gain | slower | error; None before any run finished
    median_ms: float | None = None
    noise_pct: float | None = None
    speedup: float | None = None
    change_pct: float | None = None
    band_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    speedup_low: float | None = None  # the speed-up at the interval's slower end
    speedup_high: float | None = None  # ... and at its faster end
    undecided: bool = False  # the interval straddles the line: more runs could settle it
    extra_runs: int = 0  # runs added because it was undecided
    run_ms: list[float] = field(default_factory=list)
    runs: int = 0
    steps: int = 0
    stopped_early: str | None = None  # why its runs ended before the planned number
    error: str | None = None
    loss: LossCheck | None = None
    ratios: list[float] = field(default_factory=list)  # each run's step time over its paired baseline run's
    one_time_s: float | None = None  # as the baseline's: a compile's cost is here
    whole_run_s: float | None = None
    whole_run_speedup: float | None = None  # the baseline's whole run over this one's
    whole_run_verdict: str | None = None  # faster | no_gain | slower over the whole run (the minimum effect its line)
    break_even_steps: float | None = None  # the steps after which a higher one-time cost is paid back


@dataclass
class TuneResult:
    script: str
    args: list[str]
    warmup_steps: int
    window_steps: int
    repeats: int
    cores: int
    device: str | None
    findings: list[str]  # finding ids the candidates were chosen from
    findings_source: str  # where they came from: a profile run, --from PATH, or nowhere
    baseline: Baseline
    candidates: list[CandidateResult]
    not_run: list[dict[str, str]]  # {name, why}: relevant or asked for, but not run
    recommended: list[str]
    budget_s: float
    elapsed_s: float = 0.0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    not_applicable: list[dict[str, str]] = field(default_factory=list)  # {name, why}: not for this device (GPU-only)
    min_effect_pct: float = 0.0  # the smallest change called faster or slower, whatever the drift
    script_path: str | None = None  # the script, absolute: skalpel run finds this result by it
    run_folder: str | None = None  # the run folder the findings came from; tune.json is written there too
    run_steps: int | None = None  # the steps of the whole run the verdicts weigh one-time costs over
    run_steps_from: str | None = None  # --run-steps | the script's end | followed (at least that many)
    schema: str = TUNE_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {"schema": data.pop("schema"), **data}  # the schema first, as in skalpel's other JSON

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2)

    def measured(self) -> list[CandidateResult]:
        return [c for c in self.candidates if c.verdict is not None]
