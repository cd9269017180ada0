"""cold_start: one-time work (CUDA context, cuDNN autotuning, lazy kernel loading) dominates the recording."""

from __future__ import annotations

from . import thresholds
from .rule import Context, Docs, NotJudged, Outcome, Rule


def _check_cold_start(ctx: Context, rule: Rule) -> Outcome:
    limits = rule.thresholds
    result = ctx.analyses.one_time
    findings = []
    for rank, work in result.ranks.items():
        if work.share_pct < limits.share_pct or work.total_ms < limits.floor:
            continue
        top = work.costs[0]
        evidence = {
            "share_pct": work.share_pct,
            "one_time_ms": work.total_ms,
            "window_ms": work.window_ms,
            "largest": top.name,
            "largest_ms": top.ms,
            "largest_is": top.what,
            "costs": [
                {"name": cost.name, "ms": cost.ms, "what": cost.what, "later_median_us": cost.later_median_us}
                for cost in work.costs[:5]
            ],
        }
        locations = ctx.locations([cost.event for cost in work.costs[:5]])
        findings.append(rule.finding(evidence, locations=locations, severity=rule.severity_for(work.share_pct), rank=rank))
    return findings


COLD_START = Rule(
    id="cold_start",
    family="measurement",
    severity="warning",
    title="One-time work takes {share_pct:.0f}% of the recording ({one_time_ms:.0f} ms of {window_ms:.0f} ms); "
    "the largest: {largest} {largest_ms:.0f} ms ({largest_is})",
    thresholds=thresholds.COLD_START,
    check=_check_cold_start,
    fix="start measuring after the first iterations: torch.profiler.schedule(wait=1, warmup=2, active=5) or "
    "skalpel run (warm-up by default); initialise CUDA (torch.cuda.init(), a first small kernel) and run one "
    "warm-up step with cudnn.benchmark before recording",
    docs=Docs(
        what="Work a process pays once, found on its own or in a trace without steps: the first call of an op or "
        "runtime call that is `first_call_ratio` times slower than the median of its later calls and at least "
        "`min_event_ms` long (the first cuDNN convolution: algorithm search, autotuning and lazy loading of its "
        "kernels; the first kernel launch: lazy loading of the kernel's module), and device set-up calls that run "
        "long the one time they are called (CUDA context creation in `cudaFree`, `cuInit`, `cudaSetDevice`, ...). "
        "Nested first calls are counted once, as wall time.",
        why="The guide's first pitfall: a profile that includes start-up measures the start-up. Every share, the "
        "step time and the idle time are then about work the steady state never does again, and any fix chosen "
        "from them is aimed at the wrong thing.",
        evidence="The one-time wall time and its share of the rank's recorded window (first to last event), the "
        "largest one-time cost with what it is, and up to five costs with their later calls' median. The "
        "locations are the user code that made those first calls.",
        fix="Record after warm-up (`schedule(wait=1, warmup=2, active=5)`, `skalpel run`); create the CUDA context "
        "and run one full step before the profiler starts; with `torch.backends.cudnn.benchmark=True` the first "
        "step of every new input shape searches again, so keep shapes fixed while measuring.",
        false_positives="A first call that is slow because its input is bigger (a first batch of a different "
        "size) looks the same; so does a checkpoint load or an evaluation run once inside the window, which is "
        "one-time work too but the user's own.",
    ),
)

def _check_one_time_costs(ctx: Context, rule: Rule) -> Outcome:
    capture = ctx.capture
    ledger = capture.run if capture is not None else None
    if ledger is None:
        return NotJudged("no whole-run ledger: only `skalpel run` times the script from its start to its end",
                         applies=capture is not None)  # fmt: skip
    limits = rule.thresholds
    # what the user can act on: compilation and the first steps' extra time (imports and building are every run's)
    paid = ledger.compile_s + ledger.first_steps_extra_s
    share = ledger.pct(paid)
    if share < limits.share_pct or paid < limits.floor:
        return []
    evidence = {
        "share_pct": share,
        "one_time_s": paid,
        "run_s": ledger.run_s,
        "compile_s": ledger.compile_s,
        "first_steps_extra_s": ledger.first_steps_extra_s,
        "startup_s": ledger.startup_s,
        "in_steps_s": ledger.in_steps_s,
        "steps": ledger.steps,
    }
    severity = "warning" if share >= limits.param("warning_pct") else "info"
    return [rule.finding(evidence, severity=severity)]


ONE_TIME_COSTS = Rule(
    id="one_time_costs",
    family="measurement",
    severity="info",
    title="One-time costs are {share_pct:.0f}% of the whole run: torch.compile {compile_s:.1f} s and the first "
    "steps' extra {first_steps_extra_s:.1f} s, of a {run_s:.1f} s run ({in_steps_s:.1f} s in its {steps} steps)",
    thresholds=thresholds.ONE_TIME_COSTS,
    check=_check_one_time_costs,
    scope="job",
    fix="weigh them against the run's length: a run this short pays more to compile than it gains; for longer "
    "runs keep the compile cache warm (TORCHINDUCTOR_FX_GRAPH_CACHE, torch.compile(mode='default') before "
    "'max-autotune'), avoid recompiles (fixed shapes, dynamic=True), or train without torch.compile",
    docs=Docs(
        what="The run's one-time costs, by `skalpel run`'s clock over the whole script: torch.compile's "
        "compilations (its compile log, wherever they ran) and the first steps' time beyond a typical step, as a "
        "share of the script's whole run (its start to its end, less skalpel's own work).",
        why="The steady-state step says nothing of them: a short run or a benchmark can spend as long compiling "
        "as training, and a speed-up per step is then no speed-up of the run.",
        evidence="The one-time seconds and their share, torch.compile's seconds, the first steps' extra seconds, "
        "the start-up before the first step, the run's length and its time in steps.",
        fix="For a short run, compile less (or not at all); for a long one the share falls by itself. Keep "
        "Inductor's caches warm across runs and avoid recompiles.",
        false_positives="A capture run shorter than the real training (a few steps to profile) inflates the share: "
        "judge it against the length of the real run. Start-up (imports, building the model) is left out: every "
        "run pays it.",
    ),
)

RULES = (COLD_START, ONE_TIME_COSTS)
