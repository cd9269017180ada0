"""What a finding rule is: one declaration with its id, severity, title, thresholds, docs and check.

A family module (``input.py``, ``sync.py``, ...) declares each of its findings once as a
``Rule`` and lists them in a module-level ``RULES`` tuple; ``registry.py`` collects every
family into one table. A check reads analysis results through ``Context`` (never the raw
JSON) and returns either a list of ``Finding`` values (empty: nothing to report) or a
``NotJudged`` saying why the question cannot be answered from this trace. A rule whose check
needs the whole job (every rank's steps, the capture's facts, figures across ranks) says so
with ``scope="job"``; ``registry.JOB_RULES`` is derived from it.

Writing a rule::

    DATALOADER_BOUND = Rule(
        id="dataloader_bound", family="input", severity="warning",
        title="Waiting for data takes {share_pct:.0f}% of each step ({ms_per_step:.1f} ms/step)",
        thresholds=thresholds.DATALOADER_BOUND, docs=Docs(...), check=_check_dataloader,
        needs_steps=True,
    )

    def _check_dataloader(ctx: Context, rule: Rule) -> list[Finding] | NotJudged:
        ...
        return [rule.finding(evidence={...}, locations=ctx.locations(events), fix="...", rank=0)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Union

import numpy as np

from ..result.report import CaptureInfo, Finding
from .thresholds import Threshold

if TYPE_CHECKING:
    from ..analysis.bundle import Analyses
    from ..analysis.steps import StepSegmentation
    from ..trace.model import RankInfo, Trace

DOC_HEADINGS = ("What it detects", "Why it matters", "Evidence", "How to fix", "Known false positives")


@dataclass(frozen=True)
class Docs:
    """The explanation of a finding, under fixed headings (``skalpel explain`` prints these)."""

    what: str
    why: str
    evidence: str
    fix: str
    false_positives: str

    def sections(self) -> dict[str, str]:
        return dict(zip(DOC_HEADINGS, (self.what, self.why, self.evidence, self.fix, self.false_positives)))


@dataclass(frozen=True)
class NotJudged:
    """A rule that cannot answer on this trace, and why (e.g. "no steps marked").

    ``applies=False`` says the question does not arise at all (a single-process job has no
    straggler): the dispatcher then writes no note, so notes stay about what the trace lacks.
    """

    reason: str
    applies: bool = True


Outcome = Union[list[Finding], NotJudged]


@dataclass(frozen=True)
class Rule:
    """A finding's rule: its id, family, severity, title, threshold, check and docs."""

    id: str  # stable and public: never reused; renamed ids go to registry.REDIRECTS
    family: str
    severity: str  # default severity; a check may raise it to critical past thresholds.critical_share_pct
    title: str  # format template over the evidence keys, with the key number
    thresholds: Threshold
    docs: Docs
    check: Callable[["Context | JobContext", "Rule"], Outcome]  # a rule of job scope gets a JobContext
    fix: str  # one line, the default fix shown with the finding
    needs_device: bool = False  # judged only where the trace has device activity
    needs_steps: bool = False  # judged per step: needs ProfilerStep markers
    # "job": its check needs the whole job (every rank's steps, the capture, results across ranks), so a job of
    # many rank files judges it once, on the driver, from the rank summaries; "rank": each rank's worker judges it
    # on that rank's events, and the driver merges the outcomes
    scope: Literal["rank", "job"] = "rank"

    def __post_init__(self) -> None:
        if self.scope not in ("rank", "job"):
            raise ValueError(f"rule {self.id}: scope must be 'rank' or 'job', not {self.scope!r}")

    def finding(
        self,
        evidence: dict[str, Any],
        *,
        locations: Iterable[str] = (),
        severity: str | None = None,
        fix: str | None = None,
        rank: int | None = None,
        title: str | None = None,
    ) -> Finding:
        """A Finding of this rule; the title is the template filled from the evidence unless given."""
        clean = {key: _plain(value) for key, value in evidence.items()}
        return Finding(
            id=self.id,
            severity=severity or self.severity,
            title=title if title is not None else self.title.format(**clean),
            evidence=clean,
            locations=tuple(locations),
            fix=fix or self.fix,
            rank=rank,
        )

    def severity_for(self, share_pct: float) -> str:
        """The default severity, raised to critical at or above the critical share."""
        critical = self.thresholds.critical_share_pct
        return "critical" if critical is not None and share_pct >= critical else self.severity


@dataclass
class JobContext:
    """What a rule of job scope may read: the analyses the join made of the ranks' summaries (steps, collectives,
    the rank comparison, each rank's per-rank results and its known locations), the capture settings. No events:
    the join holds no trace, so it has no locator either (``tests/test_rule_scope.py`` keeps job rules off them)."""

    analyses: Analyses
    capture: CaptureInfo | None = None

    @property
    def steps(self) -> StepSegmentation:
        return self.analyses.steps

    @property
    def ranks(self) -> tuple[RankInfo, ...]:
        """What each rank's file says of it."""
        job = self.analyses.job
        assert job is not None, "a job rule reads a join's analyses"
        return job.ranks

    @property
    def rank_ids(self) -> list[int]:
        return [info.rank for info in self.ranks]


@dataclass
class Context(JobContext):
    """What a rule of rank scope may read, where its rank's trace is: a job rule's context, and user-code
    locations from the trace's events."""

    _locator: Any = field(default=None, repr=False)

    @property
    def ranks(self) -> tuple[RankInfo, ...]:
        """What the rank's file says of it."""
        return self.trace.ranks

    @property
    def trace(self) -> Trace:
        """The rank's events (a rank rule's analyses always hold them)."""
        trace = self.analyses.trace
        assert trace is not None, "a rank rule reads one rank's analyses"
        return trace

    def locations(self, events: Iterable[int] | np.ndarray, *, limit: int = 3) -> tuple[str, ...]:
        """The innermost user-code frames around these events, most frequent first."""
        return self._get_locator().locations(events, limit=limit)

    def user_lines(self, events: Iterable[int] | np.ndarray, *, limit: int = 3) -> tuple[str, ...]:
        """``locations`` that are lines of the user's code: none where the trace has no Python stacks (``locations``
        then says how to record them, a hint for a finding's "where", not a line to quote in a title)."""
        from ..trace.stacks import NO_STACKS

        return tuple(where for where in self.locations(events, limit=limit) if where != NO_STACKS)

    def location_in(self, event: int, spans) -> str | None:
        """The user's line of one event, at the statement sampled inside these (start, end) spans."""
        return self._get_locator().location_in(event, spans) if self.trace.has_stacks else None

    def inner_locations(self, events: Iterable[int] | np.ndarray, *, limit: int = 2) -> tuple[str, ...]:
        """User frames that run inside these events, by time spent (what a slow range is busy with)."""
        return self._get_locator().inner_locations(events, limit=limit)

    def _get_locator(self) -> Any:
        if self._locator is None:
            from ..trace.stacks import Locator

            self._locator = Locator(self.trace)  # the events, for user-code locations only
        return self._locator

    def locations_at(self, rank: int, tid: int | None, ts_us: Iterable[float], *, limit: int = 3) -> tuple[str, ...]:
        """The innermost user-code frames open at these instants on a host thread (memory events)."""
        return self._get_locator().locations_at(rank, tid, ts_us, limit=limit)


def _plain(value: Any) -> Any:
    """Evidence values as plain JSON types, floats rounded for reading."""
    if isinstance(value, (np.floating, float)):
        return round(float(value), 4)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return [_plain(item) for item in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value
