"""The anomalies ``skalpel watch`` judges online, documented for ``skalpel explain <kind>``.

They are no findings of a trace: ``watching/detect.py`` judges them step by step over a whole
run, so they are not in ``registry.RULES`` (``skalpel analyze`` never runs them). Declared as
``Rule`` values all the same, so that ``skalpel explain`` prints them the way it prints a finding.
"""

from __future__ import annotations

from . import thresholds
from .rule import Docs, NotJudged, Rule

FAMILY = "watch"
_COMMON_EVIDENCE = (
    "The step it was found at, what was judged and its baseline, in watch.sqlite's anomalies table and on "
    "stderr; `skalpel watch --show RUN` marks it on the run's timeline. The capture of the steps after it "
    "(capture-<step>-<kind>/ beside the store) holds the trace and its report."
)


def _not_from_a_trace(ctx: object, rule: Rule) -> NotJudged:
    return NotJudged("judged online by skalpel watch, not from a trace", applies=False)


def _kind(id: str, title: str, threshold: thresholds.Threshold, fix: str, severity: str = "warning",
          **docs: str) -> Rule:  # fmt: skip
    return Rule(id=id, family=FAMILY, severity=severity, title=title, thresholds=threshold, check=_not_from_a_trace,
                fix=fix, docs=Docs(evidence=_COMMON_EVIDENCE, fix=fix[0].upper() + fix[1:] + ".", **docs))  # fmt: skip


STEP_SPIKE = _kind(
    "step_spike", "Step {step} took far longer than the median step", thresholds.STEP_SPIKE,
    "read the capture: a one-off (a checkpoint, GC, a log write) needs no fix; a recurring one is a periodic job",
    what="One step whose time (less its DataLoader wait and its wait for a core) is far above the median of the "
    "last window of steps: the share, the floor and mad_k robust standard deviations (MAD) above it.",
    why="A pause in a loop of steady steps is time lost every time it recurs: a checkpoint, garbage collection, "
    "a synchronising log call, a recompilation.",
    false_positives="A step that does more on purpose (evaluation, checkpointing every N steps); the first "
    "steps after a resume or a new epoch.",
)
LEVEL_SHIFT = _kind(
    "level_shift", "Steps got slower from step {step} and stayed so", thresholds.LEVEL_SHIFT,
    "compare the capture with a run before the change (skalpel diff): the category that grew is the cause",
    what="The median of the last recent_steps steps (less DataLoader and core waits) is above the median of "
    "the window before them by the share, the floor and mad_k MADs. The new level is the baseline from then on.",
    why="A loop that is suddenly slower stays slower: a learning-rate schedule that unfreezes layers, a shape "
    "change, a fallback to a slower kernel, thermal throttling, a neighbour on the same device.",
    false_positives="A planned phase change (unfreezing, a longer sequence length from a curriculum).",
)
SLOW_DRIFT = _kind(
    "slow_drift", "The median step crept up over the run", thresholds.SLOW_DRIFT,
    "look for what grows with the run: a list that is appended to, a cache, fragmentation (see memory_creep)",
    what="The median of the whole window (less DataLoader and core waits) is above a reference window's (the "
    "first full window, or the level after a shift) by the share and the floor; each firing moves the reference.",
    why="A step that gets a little slower every minute is invisible in any single capture and costs hours over "
    "a long run; it often goes with memory that grows.",
    false_positives="Work that grows by design (a growing context, a replay buffer that fills).",
)
MEMORY_CREEP = _kind(
    "memory_creep", "Memory grows through the window", thresholds.MEMORY_CREEP,
    "stop keeping tensors alive across steps (store loss.item(), clear lists of outputs); see memory_growth",
    what="CUDA allocated memory (when the script uses CUDA), else the process's RSS, rises through the window: "
    "each quarter's median above the previous by min_rise_pct of the floor, and the last above the first by "
    "the floor. The message gives the rate and the time left to the limit (the device's total memory, or "
    "MemTotal). A one-time jump is no creep.",
    why="A leak ends in an out-of-memory error hours into a run; the rate tells how many hours.",
    false_positives="Caches that fill slowly and then level off (an allocator pool, a dataset cached in memory).",
)
DATALOADER_STALL = _kind(
    "dataloader_stall", "The loop waits for its batches from step {step}", thresholds.DATALOADER_STALL,
    "more DataLoader workers, pin_memory, persistent_workers=True; check the storage the dataset reads from",
    what="The time spent in the DataLoader's __next__ in one step is above the share of the window's median "
    "step and the floor, for min_steps steps in a row.",
    why="The device waits for data while the loader stalls: a slow filesystem, a worker that died and restarts, "
    "a shard that decodes slowly.",
    false_positives="The first batches of each epoch when workers are not persistent (they start again).",
)

SLOW_RANK = _kind(
    "slow_rank", "A rank of the job falls behind the others", thresholds.SLOW_RANK,
    "read the job's capture (JOB/capture-<step>-slow_rank/: every rank's same steps, one report, its "
    "straggler_rank finding): more work than the others (an uneven shard), a slower core",
    what="Under torchrun each rank records its own steps; with --out JOB, each rank's writer reads the other "
    "ranks' stores every every_s seconds and compares the ranks' median CPU time per step over the last window "
    "(min_steps at least on each): the rank above the others' median by the share and the floor records the "
    "anomaly in its own store. `skalpel watch --show JOB` names it over the whole run. Step times cannot tell: "
    "the others wait for the slow rank in every collective, so their steps last as long as its own.",
    why="Every rank runs at the pace of the slowest: one slow rank costs the whole job its extra time.",
    false_positives="Rank 0 doing extra work on purpose (logging, checkpoints, evaluation); slowness on the "
    "device (a GPU kernel) shows in no CPU time.",
)

ASKED = _kind(
    "asked", "A profile of N steps asked for from another terminal", thresholds.ASKED,
    "read the capture's report (capture-<step>-asked/): it is the run as it is now, not a problem found",
    severity="info",
    what="Not judged: someone asked the running watch for a profile with `skalpel watch --ask RUN profile N` "
    "(N steps, 1 to max_steps). Rank 0 (or the one process) records it as an anomaly of this kind, so that the "
    "capture goes the way of every anomaly's: under torchrun with --out every rank profiles the same N steps "
    "from a step far enough ahead and one report covers the job; `skalpel watch --show RUN` marks it and links "
    "the capture. No cooldown applies to it.",
    why="A run that has been slow for an hour is looked at as it runs, without a restart and without slowing "
    "the steps in between (the request is read by each rank's writer thread, never the training thread).",
    false_positives="None: it is a request, not a judgement. Its capture's findings are the trace's own.",
)

KINDS: tuple[Rule, ...] = (STEP_SPIKE, LEVEL_SHIFT, SLOW_DRIFT, MEMORY_CREEP, DATALOADER_STALL, SLOW_RANK, ASKED)
BY_ID = {rule.id: rule for rule in KINDS}
