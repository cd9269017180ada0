"""A job that stopped: which rank, which collective, which line (the dumps ``skalpel watch`` leaves in a run folder).

No trace is read here: ``watching/hangs.py`` reads each rank's records (its collectives ring, its
hang dumps, its fatal stacks, its store's end) into ``RankRecord`` values, and ``judge`` gives the
verdict over the ranks:

- ``collective_mismatch``: ranks disagree on collective #N of a group (its op, its sizes, or the
  line that called it: a rank that skipped or added one calls the next one as #N);
- ``rank_died``: a rank whose record was never closed and whose process is gone (killed, aborted
  by a fatal signal), with its last step, its last collective and its stack where it left one;
- ``collective_hang``: no step ended within the bound; the ranks waiting in collective #N (issued,
  never completed) and the ranks that never arrived, with where their stacks are;
- ``step_hang``: the same stop without a collective to wait in (one process, or no collective issued).

The rules are in the registry for ``skalpel explain`` and the docs; on a trace they never apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..result.report import Finding
from . import thresholds
from .rule import Docs, NotJudged, Rule

FAMILY = "hang"
_EVIDENCE = (
    "Read from the run folder by `skalpel analyze RUN` (under torchrun: JOB/rank<N>/): each rank's "
    "collectives.ring (skalpel's record of its torch.distributed calls: sequence number, op, group, sizes, state, "
    "line), its hang-<k>.json (every thread's stack when no step had ended within the bound) and fr-trace-<k>.json "
    "(PyTorch's flight recorder), fatal-stacks.txt (a fatal signal), and its store's end (exit status, error)."
)


def _from_dumps(ctx: object, rule: Rule) -> NotJudged:
    return NotJudged("judged from the dumps skalpel watch leaves in a run folder, not from a trace", applies=False)


def _rule(id: str, severity: str, title: str, threshold: thresholds.Threshold, fix: str, **docs: str) -> Rule:
    docs = Docs(evidence=_EVIDENCE, fix=fix[0].upper() + fix[1:] + ".", **docs)
    return Rule(id=id, family=FAMILY, severity=severity, title=title, thresholds=threshold, check=_from_dumps,
                fix=fix, scope="job", docs=docs)  # fmt: skip


COLLECTIVE_HANG = _rule(
    "collective_hang", "critical", "The job stopped in collective #{seq} ({op}): {stopped}",
    thresholds.COLLECTIVE_HANG,
    "look at the line where the missing rank is (its stack): a rank that reads data, evaluates or checkpoints "
    "while the others already wait; give it a timeout, or make every rank take the same path",
    what="No step ended on any rank for longer than the bound (the share of the median step, at least the floor; "
    "`skalpel watch --hang-after S` sets the floor): some ranks have issued collective #N of a group and wait in "
    "it, the others never called it. Names the waiting ranks with the line of their call, and where each missing "
    "rank is: its main thread's stack when it was dumped.",
    why="A collective completes only when every rank of the group calls it: one rank stuck elsewhere (a data "
    "loader that blocks, an evaluation on rank 0 only, a deadlock) stops the whole job until the collective's "
    "timeout (30 minutes by default) kills it, with an error that names none of this.",
    false_positives="A step that is long on purpose (an evaluation, a checkpoint every N steps) and longer than "
    "the bound: the dump is marked resolved when a step ends after all, and no finding is made of it.",
)
STEP_HANG = _rule(
    "step_hang", "critical", "No step ended for {stalled_s:.0f} s after step {step}: the run is stuck",
    thresholds.COLLECTIVE_HANG,
    "read the main thread's stack: a lock, a queue that nobody fills, a worker that died, a read that blocks",
    what="No step ended for longer than the bound, and no rank waits in a collective: the stack of each thread "
    "when the bound passed shows where the run is.",
    why="A run that stops without an error costs its hours until someone looks; the stack is where to look.",
    false_positives="A step that is long on purpose and longer than the bound (the dump is then marked resolved "
    "and not reported).",
)
COLLECTIVE_MISMATCH = _rule(
    "collective_mismatch", "critical", "Ranks disagree on collective #{seq} ({group}): {difference}",
    thresholds.COLLECTIVE_MISMATCH,
    "make every rank call the same collectives in the same order with the same sizes: a collective inside a "
    "branch taken on some ranks only (a skipped batch, an `if rank == 0`), or sizes that depend on the rank's data",
    what="Each rank numbers the collectives of a group in the order it calls them. Collective #N must be the same "
    "call on every rank; here its op, its tensors' sizes, or the line that called it differ. A rank that skipped "
    "(or added) one calls the next one as #N: the line differs from the others' from there on.",
    why="Mismatched collectives hang (each rank waits for a partner that calls something else), abort (gloo: "
    "'Received data size doesn't match expected size'), or, worst, silently pair the wrong tensors.",
    false_positives="A code path that calls the same collective from two different lines on purpose (the line "
    "differs, the op and sizes agree): read the sizes before the line.",
)
RANK_DIED = _rule(
    "rank_died", "critical", "Rank {rank} died in step {step}: {how}", thresholds.RANK_DIED,
    "read the rank's last lines and its stack: out of memory (dmesg shows the OOM killer), a fatal signal in "
    "native code, a collective that aborted (see collective_mismatch)",
    what="A rank whose record was never closed (its store still says running) and whose process is gone, that "
    "left the stacks of a fatal signal (an abort, a segfault), or that ended on an error of its own (not a peer's "
    "reset connection, the job's SIGTERM or a collective's timeout: those are the others' consequences). Its last "
    "step, its last collective, its stack or the line that raised; the ranks that ended after it are named.",
    why="When one rank dies, the others fail or hang in their next collective and their errors name a lost "
    "connection, not the rank that died nor why.",
    false_positives="A job analysed on another host than the one it ran on cannot tell a dead process from a "
    "live one: the rank is then only said not closed.",
)

RULES: tuple[Rule, ...] = (COLLECTIVE_HANG, STEP_HANG, COLLECTIVE_MISMATCH, RANK_DIED)


@dataclass
class RankRecord:
    """What one rank left in the run folder (``watching/hangs.py`` reads it)."""

    rank: int
    status: str = "absent"  # running (never closed), ended, absent (no store)
    alive: bool | None = None  # its process still there (None: unknown, another host or no pid)
    exit_status: int | None = None
    error: str | None = None  # the script's error, when it ended on one
    error_line: str | None = None  # where in the script's code it was raised
    steps: int | None = None
    collectives: list[dict[str, Any]] = field(default_factory=list)  # the ring (or a dump's copy), oldest first
    stack: list[list[Any]] = field(default_factory=list)  # the main thread's frames, outermost first
    stack_from: str | None = None  # the file the stack was read from
    fatal: str | None = None  # "Aborted", "Segmentation fault": from fatal-stacks.txt
    hang: dict[str, Any] | None = None  # the last unresolved hang dump: step, stalled_s, bound_s
    recorder: list[dict[str, Any]] = field(default_factory=list)  # the flight recorder's entries at the hang
    notes: list[str] = field(default_factory=list)  # what could not be read, one line each


def ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``."""
    parts, ordered = [], sorted(ranks)
    start = previous = ordered[0] if ordered else 0
    for rank in ordered[1:] + [None]:  # type: ignore[list-item]
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(f"{start}" if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    word = "rank" if len(ordered) == 1 else "ranks"
    return f"{word} {', '.join(parts)}"


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


_OWN = "/skalpel/"  # skalpel's own frames (its hooks, its record of collectives): passed over
_DECORATORS = ("wrapper", "inner", "_fn", "decorate_context", "recorded")  # a library's wrappers: the call is below


def is_library(path: str) -> bool:
    return any(part in path for part in ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", _OWN))


def where(stack: list[list[Any]]) -> str | None:
    """The main thread's path through the user's code: each user frame and the library call it made from there
    (``train.py:61 <module> → distributed_c10d.py:3252 all_reduce``)."""
    shown: list[str] = []
    previous_user = False
    for path, line, function in stack:
        if _OWN in path or (not previous_user and is_library(path)):
            continue
        if is_library(path) and function in _DECORATORS:
            continue  # still looking for the library's own function
        shown.append(f"{_short(path)}:{line} {function}")
        previous_user = not is_library(path)
    return " → ".join(shown[-4:]) if shown else None


def _user_location(stack: list[list[Any]]) -> str | None:
    for path, line, function in reversed(stack):
        if not is_library(path):
            return f"{path}:{line} in {function}"
    return None


def _signature(entry: dict[str, Any]) -> tuple:
    return entry.get("op"), str(entry.get("sizes")), entry.get("line")


def _mismatch(records: list[RankRecord]) -> Finding | None:
    """The first collective (by group and sequence number) that the ranks holding it do not agree on."""
    calls: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for record in records:
        for entry in record.collectives:
            calls.setdefault((str(entry.get("group")), int(entry.get("seq", 0))), {})[record.rank] = entry
    for (group, seq), by_rank in sorted(calls.items(), key=lambda item: (item[0][1], item[0][0])):
        variants: dict[tuple, list[int]] = {}
        for rank, entry in by_rank.items():
            variants.setdefault(_signature(entry), []).append(rank)
        if len(variants) < 2:
            continue
        ordered = sorted(variants.items(), key=lambda item: (-len(item[1]), item[1]))
        described = [{"ranks": sorted(ranks), "op": sig[0], "sizes": by_rank[ranks[0]].get("sizes"),
                      "line": sig[2]} for sig, ranks in ordered]  # fmt: skip
        most, other = described[0], described[1]
        same_call = (other["op"], str(other["sizes"])) == (most["op"], str(most["sizes"]))
        if other["line"] != most["line"] and not same_call:
            difference = (f"{ranks_text(other['ranks'])} {_call(other)} {other['op']} {other['sizes']}"
                          f"{_at(other['line'])} where {ranks_text(most['ranks'])} {_call(most)} {most['op']} "
                          f"{most['sizes']}{_at(most['line'])}: a collective skipped or added before it")  # fmt: skip
        elif other["op"] != most["op"]:
            difference = (f"{ranks_text(other['ranks'])} {_call(other)} {other['op']}, {ranks_text(most['ranks'])} "
                          f"{_call(most)} {most['op']}")  # fmt: skip
        elif str(other["sizes"]) != str(most["sizes"]):
            difference = (f"{most['op']} of {other['sizes']} on {ranks_text(other['ranks'])}, of {most['sizes']} on "
                          f"{ranks_text(most['ranks'])}{_at(most['line'])}")  # fmt: skip
        else:
            difference = (f"{most['op']} called at {other['line']} on {ranks_text(other['ranks'])}, at "
                          f"{most['line']} on {ranks_text(most['ranks'])}")  # fmt: skip
        locations = [variant["line"] for variant in described if variant["line"]]
        evidence = {"seq": seq, "group": group, "difference": difference, "variants": described}
        return COLLECTIVE_MISMATCH.finding(evidence, locations=locations[:3])
    return None


def _call(variant: dict[str, Any]) -> str:
    return "calls" if len(variant["ranks"]) == 1 else "call"


# The errors a rank ends on when a peer went first: its connection reset, the job's SIGTERM, a collective's timeout.
_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Terminated", "SIGTERM", "Broken pipe",
                 "Timed out", "timed out", "communicator was aborted", "DistBackendError")  # fmt: skip


def _caused_by_a_peer(error: str | None) -> bool:
    return error is not None and any(words in error for words in _CONSEQUENCES)


def _died(records: list[RankRecord]) -> list[Finding]:
    dead = [record for record in records if record.fatal or (record.status == "running" and record.alive is False)]
    failed = [record for record in records if record.status == "ended" and record.exit_status not in (None, 0)]
    raised = [record for record in failed if record.error and not _caused_by_a_peer(record.error)]
    found = []
    for record in dead + raised:
        if record.fatal:
            how = f"a fatal signal ({record.fatal}; its stacks in {record.stack_from})"
        elif record in raised:
            how = f"ended on an error (exit status {record.exit_status}): {record.error}"
        else:
            how = ("killed without a word (SIGKILL, or the OOM killer: no error, no fatal signal, its record never "
                   "closed)")  # fmt: skip
        last = record.collectives[-1] if record.collectives else None
        evidence: dict[str, Any] = {"rank": record.rank, "step": record.steps if record.steps is not None else "?",
                                    "how": how, "where": where(record.stack),
                                    "last_collective": _describe(last) if last else None,
                                    "then_failed": [{"rank": other.rank, "exit_status": other.exit_status,
                                                     "error": other.error} for other in failed
                                                    if other not in raised]}  # fmt: skip
        location = record.error_line or _user_location(record.stack) or (last.get("line") if last else None)
        found.append(RANK_DIED.finding(evidence, locations=[location] if location else [], rank=record.rank))
    return found


def _describe(entry: dict[str, Any]) -> str:
    return (f"#{entry.get('seq')} {entry.get('op')} {entry.get('sizes')} ({entry.get('group')})"
            f"{_at(entry.get('line'))}: {entry.get('state')}")  # fmt: skip


def _at(line: str | None) -> str:
    """`` at train.py:61`` where the record has the line; nothing where it has none (the flight recorder's entries
    for collectives torch.distributed's functions never saw, DDP's gradient buckets)."""
    return f" at {line}" if line else ""


def _in_flight(records: list[RankRecord], source: str) -> dict[tuple[str, int], list[RankRecord]]:
    """The ranks whose last collective (in ``source``: the ring, or the flight recorder) never completed."""
    waiting: dict[tuple[str, int], list[RankRecord]] = {}
    for record in records:
        entries = getattr(record, source)
        last = entries[-1] if entries else None
        if last is not None and last.get("state") in ("issued", "failed"):  # failed: the job was ended in it
            waiting.setdefault((str(last.get("group")), int(last.get("seq") or 0)), []).append(record)
    return waiting


def _hang(records: list[RankRecord], disagree: bool = False) -> Finding | None:
    stuck = [record for record in records if record.hang is not None]
    if not stuck:
        return None
    # skalpel's ring first (it has the lines); the flight recorder where the ring shows nothing in flight: a
    # collective torch.distributed's functions never saw (DDP's gradient buckets go to the process group from C++)
    source = "collectives"
    waiting = _in_flight(records, source)
    if not waiting:
        source = "recorder"
        waiting = _in_flight(records, source)
    first = stuck[0].hang or {}
    if not waiting and all(record.status == "flight recorder" for record in records):
        return None  # a job's own dumps with nothing in flight: no stop to name (they keep no steps, no stacks)
    if not waiting:
        evidence = {"step": first.get("step"), "stalled_s": first.get("stalled_s", 0.0),
                    "bound_s": first.get("bound_s"),
                    "ranks": [{"rank": record.rank, "where": where(record.stack)} for record in stuck]}  # fmt: skip
        locations = [loc for loc in (_user_location(record.stack) for record in stuck) if loc]
        return STEP_HANG.finding(evidence, locations=sorted(set(locations))[:3])
    (group, seq), holders = max(waiting.items(), key=lambda item: (len(item[1]), item[0][1]))
    entry = getattr(holders[0], source)[-1]
    missing = []
    for record in records:
        if record in holders:
            continue
        reached = [item for item in getattr(record, source) if str(item.get("group")) == group]
        last = reached[-1] if reached else None
        missing.append({"rank": record.rank, "where": where(record.stack), "stack_from": record.stack_from,
                        "last_collective": _describe(last) if last else None,
                        "status": record.status if record.alive is not False else "gone"})  # fmt: skip
    lines = sorted({str(getattr(record, source)[-1].get("line") or _user_location(record.stack))
                    for record in holders} - {"None"})  # fmt: skip  (a recorder's JSON dump keeps no frames)
    waiters = ranks_text([record.rank for record in holders])
    stopped = f"{waiters} {'waits' if len(holders) == 1 else 'wait'}, " + (
        f"{ranks_text([item['rank'] for item in missing])} never came" if missing else
        "every rank came (they disagree on it: see collective_mismatch)" if disagree else
        "no record of a rank that did not")  # fmt: skip
    evidence = {"seq": seq, "group": group, "op": entry.get("op"), "sizes": entry.get("sizes"), "stopped": stopped,
                "waiting": waiters, "waiting_lines": lines,
                "missing": ranks_text([item["rank"] for item in missing]) if missing else "none",
                "missing_ranks": missing, "step": first.get("step"), "stalled_s": first.get("stalled_s"),
                "bound_s": first.get("bound_s"),
                "record": _record_name(records, source)}  # fmt: skip
    locations = [item for item in (_user_location(r.stack) for r in records if r not in holders) if item] + lines
    return COLLECTIVE_HANG.finding(evidence, locations=locations[:3])


def _record_name(records: list[RankRecord], source: str) -> str:
    """Whose numbering the verdict went by: skalpel's ring, the recorder dumped with a hang, or a job's own dumps."""
    if all(record.status == "flight recorder" for record in records):
        return "the flight recorder's dumps"  # a job run without skalpel: its dumps are all there is
    return "skalpel's" if source == "collectives" else "the flight recorder's"


def judge(records: list[RankRecord]) -> list[Finding]:
    """The verdict over every rank's records: the cause first (a mismatch, a dead rank), then the hang it made."""
    found: list[Finding] = []
    mismatch = _mismatch(records)
    if mismatch is not None:
        found.append(mismatch)
    found.extend(_died(records))
    hang = _hang(records, disagree=mismatch is not None)
    if hang is not None:
        found.append(hang)
    return found


def story(finding: Finding) -> list[str]:
    """The verdict in a few lines for the terminal: the title, then who is where."""
    lines = [f"{finding.id}: {finding.title}"]
    evidence = finding.evidence
    if finding.id == "collective_hang":
        at = ", ".join(evidence["waiting_lines"]) or "a line the dump did not keep"
        verb = "waits" if evidence["waiting"].startswith("rank ") else "wait"
        lines.append(f"  {evidence['waiting']} {verb} in {evidence['op']} #{evidence['seq']} ({evidence['group']}) at "
                     f"{at}")  # fmt: skip
        if evidence.get("record") == "the flight recorder's":
            lines.append("  (numbered by the flight recorder: a collective torch.distributed's functions never saw, "
                         "such as DDP's gradient buckets)")  # fmt: skip
        for item in evidence["missing_ranks"]:
            last = f"; its last collective {item['last_collective']}" if item["last_collective"] else ""
            lines.append(f"  rank {item['rank']} never came: it is in {item['where'] or 'no stack dumped'}{last}")
    elif finding.id == "step_hang":
        lines.extend(f"  rank {item['rank']}: {item['where']}" for item in evidence["ranks"])
    elif finding.id == "collective_mismatch":
        for variant in evidence["variants"]:
            lines.append(f"  {ranks_text(variant['ranks'])}: {variant['op']} {variant['sizes']}{_at(variant['line'])}")
    elif finding.id == "rank_died":
        if evidence.get("where"):
            lines.append(f"  its stack: {evidence['where']}")
        if evidence.get("last_collective"):
            lines.append(f"  its last collective: {evidence['last_collective']}")
        for other in evidence.get("then_failed", []):
            error = str(other["error"] or "").split(". ", 1)[0][:160]
            lines.append(f"  then rank {other['rank']} ended with exit status {other['exit_status']}: {error}")
    return lines
