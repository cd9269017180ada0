"""Every threshold of every finding, in one place.

A bottleneck rule fires only when BOTH its share (of the step, of device time, of the
peak, ...) and its absolute floor are reached: 60% of a 1 ms step is not worth a user's
hour, and 5 ms of a 2 s step is noise. Above ``critical_share_pct`` a warning becomes
critical. Further knobs a rule needs (what counts as a tiny kernel, ...) are named in
``params``. ``skalpel explain`` prints these values, so change them here and only here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import options


@dataclass(frozen=True)
class Threshold:
    """When a rule fires: a share and an absolute floor."""

    share_pct: float | None  # fires at or above this share (None: the rule has no meaningful share)
    share_of: str  # what the share is a share of
    floor: float  # ... and at or above this absolute amount
    floor_unit: str
    critical_share_pct: float | None = None
    params: tuple[tuple[str, float], ...] = ()
    fires_below: bool = False  # the floor is a minimum the measurement must reach (too_few_steps)

    def param(self, name: str) -> float:
        return dict(self.params)[name]

    def describe(self) -> str:
        parts = []
        if self.share_pct is not None:
            parts.append(f">= {self.share_pct:g}% {self.share_of}")
        parts.append(f"{'<' if self.fires_below else '>='} {_number(self.floor)} {self.floor_unit}")
        text = " and ".join(parts)
        if self.critical_share_pct is not None:
            text += f"; critical at >= {self.critical_share_pct:g}%"
        if self.params:
            text += "; " + ", ".join(f"{name}={_number(value)}" for name, value in self.params)
        return text

    def to_dict(self) -> dict:
        return {
            "share_pct": self.share_pct,
            "share_of": self.share_of,
            "floor": self.floor,
            "floor_unit": self.floor_unit,
            "critical_share_pct": self.critical_share_pct,
            "fires_below": self.fires_below,
            "params": dict(self.params),
        }


def _number(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() else f"{value:g}"


MIB = 2**20

# A finding whose share passed its threshold by less than this (relative) is marked borderline: a run of the same
# code may fall on the other side (launch_bound at 50.07% against 50% fired on 2 of 5 identical runs).
BORDERLINE_MARGIN_PCT = 5.0

# --- input ---------------------------------------------------------------------------------
# TensorBoard's plugin recommends more workers at a 5% DataLoader share; 10% is where an
# engineer would act first, and 5 ms/step is the time a second worker usually wins back.
DATALOADER_BOUND = Threshold(
    10.0, "of the step", 5.0, "ms/step", critical_share_pct=30.0,
    params=(("min_speedup", 1.1),),  # workers are advised only where they are estimated to gain this much
)  # fmt: skip
LOADER_OVERSUBSCRIBED = Threshold(
    200.0, "of the usable cores asked for by DataLoader workers and intra-op threads", 2.0,
    "threads asked beyond the usable cores",
)  # fmt: skip
PAGEABLE_MEMCPY = Threshold(
    1.0,
    "of the step in pageable host-to-device copies",
    0.5,
    "ms/step",
    params=(("min_bytes_per_step", 1 * MIB), ("warning_pct", 5.0)),
)

# --- cpu (cpu.py) ---------------------------------------------------------------------------
# Waiting for a core 40% of the time a thread wants one is a machine shared two and a half ways;
# 1 ms/step of waiting (summed over threads) keeps tiny steps out.
CPU_CONTENTION = Threshold(
    40.0, "of the time the process's threads wanted a core spent waiting for one", 1.0, "ms/step waiting",
    critical_share_pct=70.0,
)  # fmt: skip

# --- sync ----------------------------------------------------------------------------------
# host work run while the device idled after the syncs is named from host_work_after_pct of that idle time on
HOST_DEVICE_SYNC = Threshold(
    5.0, "of the step with the device idle after a sync returns", 0.2, "ms/step", critical_share_pct=30.0,
    params=(("host_work_after_pct", 10.0),),
)  # fmt: skip

# --- device --------------------------------------------------------------------------------
# Short steps (1 ms, repeated a million times) are where host overhead matters most: below the
# per-step floor the rule still fires when the idle share holds in most of 3 or more steps.
GPU_IDLE = Threshold(
    30.0,
    "of the marked steps with the device idle",
    2.0,
    "ms/step (or the share reached in consistent_steps_pct of min_steps or more steps)",
    critical_share_pct=60.0,
    params=(("min_steps", 3), ("consistent_steps_pct", 75.0), ("small_step_ms", 5.0), ("loader_idle_pct", 50.0),
            ("cause_pct", 50.0)),  # one cause holding half the idle time or more leads the finding
)
LAUNCH_BOUND = Threshold(
    50.0,
    "of kernels (or host ops) shorter than tiny_us",
    500.0,
    "kernels or ops per step",
    params=(("tiny_us", 10.0), ("min_idle_pct", 30.0), ("cpu_overhead_pct", 50.0),
            # a rank whose kernels are mostly replayed from a CUDA graph does not pay a launch each
            ("graph_launched_pct", 50.0),
            # a source of tiny ops below the largest whose own fix the finding names too: on a CPU loop of 1,732 ops
            # a step (model 44%, optimizer 32%, data loading 24%) the optimizer's fused=True saved 16% of the step,
            # whole batches 8%, both 23% (8.34 -> 6.42 ms), where the fix named only the model's
            ("also_named_pct", 20.0)),
)
# CPU-only runs: the main thread in host work outside its ops, the ledger's python and unrecorded time (a DataLoader
# fetch or a collective there is dataloader_bound's or communication_bound's, the gaps between ops launch_bound's)
HOST_BOUND = Threshold(
    30.0,
    "of the step on the main thread in host work outside its ops (CPU-only runs)",
    2.0,
    "ms/step",
    critical_share_pct=60.0,
)
# SDPA's flash kernel takes head dims up to flash_max_head_dim, in multiples of flash_head_dim_multiple
ATTENTION_HOTSPOT = Threshold(
    20.0, "of device time in unfused attention (bmm + softmax)", 1.0, "ms/step",
    params=(("flash_max_head_dim", 256), ("flash_head_dim_multiple", 8)),
)  # fmt: skip

# One op holding the step (hot_op.py). On a CPU-only step the breakdown is all cpu_exec: an op with half of the step by
# its self time is what the step is (a sort where topk would do took 75% of one, 5.7x the step of the topk version);
# 2 ms/step keeps tiny loops out. A fallback (reference) kernel counts from a fifth of the step, on any device: the
# library path it missed is several times faster (float64 conv on torch 2.13's CPU against float32 oneDNN).
HOT_OP = Threshold(
    50.0, "of the step in one op's self time (CPU-only runs)", 2.0, "ms/step", critical_share_pct=75.0,
    params=(("fallback_share_pct", 20.0), ("fallback_floor_ms", 1.0)),
)  # fmt: skip

# A user module's own ops (its chain, forward and backward, child modules left out) on a CPU-only run: share_pct
# of the step less one-time work and floor ms a step, over min_ops op names placed in its class path (one op: hot_op).
HOT_MODULE = Threshold(
    15.0, "of the step in one user module's own ops, forward and backward (CPU-only runs)", 2.0, "ms/step",
    critical_share_pct=40.0, params=(("min_ops", 2),),
)  # fmt: skip

# --- memory --------------------------------------------------------------------------------
# A leak is a rise in min_rising_pct of min_steps or more steps, of 1 MiB/step or more. How much it matters: where the
# device's memory is known, by how soon it fills the headroom above the peak (a warning within horizon_steps, info
# beyond); elsewhere (the host) by the share of the peak it gains per step. A 32 MiB/step leak on a 5 GiB footprint
# is 0.6% of the peak per step, yet fills a 141 GB H200 in ~4,300 steps.
MEMORY_GROWTH = Threshold(
    5.0, "of the peak gained per step (the host, or a device of unknown memory)", 1.0, "MiB/step",
    params=(("min_steps", 3), ("min_rising_pct", 75.0), ("horizon_steps", 20000.0)),
)  # fmt: skip
MEMORY_SPIKE = Threshold(
    25.0,
    "of the peak allocated by one op",
    32.0,
    "MiB",
    # a materialised broadcast: any size from 1 MiB. Any other transient must be held at the peak, be freed again,
    # and matter: a warning where the peak fills
    # tight_capacity_pct of the device's memory, info from large_mib where it does not or the capacity is unknown
    # (the host). A 32 MiB cuBLAS workspace on a 141 GB GPU is none of these.
    params=(("min_broadcast_ratio", 8.0), ("broadcast_floor_mib", 1.0), ("tight_capacity_pct", 50.0),
            ("large_mib", 1024.0)),  # fmt: skip
)
# activations_dominate_peak: activations hold share_pct of the window's memory peak and floor MiB or more, and
# checkpointing the module holding most of them would take min_saving_pct of the peak off it
ACTIVATIONS_DOMINATE_PEAK = Threshold(
    50.0, "of the memory peak held by activations", 16.0, "MiB of activations",
    params=(("min_saving_pct", 10.0), ("min_calls", 2.0)),
)  # fmt: skip
# optimizer_state_dominates_peak: the optimizer's state holds share_pct of the window's memory peak and floor MiB or
# more; from two_value_ratio state bytes per parameter byte on (Adam's two moments), a one-value state is claimed
OPTIMIZER_STATE_DOMINATES_PEAK = Threshold(
    40.0, "of the memory peak held by optimizer state", 16.0, "MiB of optimizer state",
    params=(("two_value_ratio", 1.5),),
)  # fmt: skip
# gradients_held_at_peak: freeing the gradients no step reads any more (spent by an optimizer step, or zeros kept by
# zero_grad(set_to_none=False)) lowers the replayed window's peak by share_pct of it and floor MiB or more
GRADIENTS_HELD_AT_PEAK = Threshold(5.0, "of the memory peak freed with the spent gradients", 4.0, "MiB")
# reserved_far_above_allocated: the allocator's reserved peak exceeds the allocated peak by share_pct of it and floor
# MiB or more; a warning where the reserved peak fills tight_capacity_pct of the device, info otherwise
RESERVED_FAR_ABOVE_ALLOCATED = Threshold(
    40.0, "of the reserved peak never allocated at once", 2048.0, "MiB", params=(("tight_capacity_pct", 80.0),),
)  # fmt: skip
# LBFGS keeps history_size pairs of flat parameter-sized vectors (a step and a gradient change), made inside its
# step: a growth whose kept bytes are LBFGS_SHARE or more allocated inside its steps is that history, bounded at
# LBFGS_HISTORY pairs (torch.optim.LBFGS's default history_size), not a leak
LBFGS_HISTORY = 100
LBFGS_SHARE = 0.8

# --- compile -------------------------------------------------------------------------------
RECOMPILATION = Threshold(10.0, "of the profiled steps recompiling", 1.0, "recompiles in the profiled steps")
# A graph break matters where the split function is a real part of the step; one break is enough to act on.
GRAPH_BREAK = Threshold(
    10.0, "of the step: the device idle inside the functions split by graph breaks (on a GPU), else their compiled "
    "regions' time", 1.0, "graph break(s) that ran in the profiled steps"
)
# Compiling costs seconds; 50 ms of it inside the measured steps already distorts them.
COMPILE_OVERHEAD = Threshold(10.0, "of the profiled steps' time spent compiling", 50.0, "ms compiling in the profiled steps")

# --- measurement ---------------------------------------------------------------------------
NO_WARMUP = Threshold(50.0, "slower first step than the median of the others", 2.0, "ms")
NO_WARMUP_MIN_STEPS = 3  # a first step and at least two others to take the median of
TOO_FEW_STEPS = Threshold(None, "", 3.0, "profiled steps", fires_below=True)
NOISY_MEASUREMENT = Threshold(
    20.0, "spread between capture windows (or step-time cv)", 0.5, "ms", params=(("warning_pct", 50.0), ("min_steps", 5))
)
PROFILER_OVERHEAD = Threshold(10.0, "slower profiled steps than un-profiled ones", 0.1, "ms/step", params=(("warning_pct", 100.0),))

# --- distributed (rules in distributed.py) --------------------------------------------------
COMMUNICATION_BOUND = Threshold(30.0, "of the step in collectives", 5.0, "ms/step", critical_share_pct=50.0)
LOW_COMM_OVERLAP = Threshold(
    50.0, "of communication not overlapped with compute", 2.0, "ms/step exposed", params=(("min_comm_share_pct", 10.0), ("single_bucket_mib", 25.0))
)
STRAGGLER_RANK = Threshold(
    10.0,
    "of the step the other ranks wait for the slowest rank in collectives",
    5.0,
    "ms/step",
    critical_share_pct=30.0,
    # ... and it arrived last at 3 of 4 matched collectives or more. A rank that does more work than the others
    # (min_call_ratio times the calls a step of some op, or its calls on other inputs) whose extra calls cost at
    # least min_extra_work_pct of the wait it imposes is the straggler whatever the machine's load, when it
    # arrived last at half the collectives or more (min_last_arrival_pct_extra_work): a loaded CPU delays the
    # other ranks now and then too, but cannot make a rank call an op more often.
    params=(("min_last_arrival_pct", 75.0), ("min_call_ratio", options.MIN_CALL_RATIO), ("min_extra_work_pct", 25.0),
            ("min_last_arrival_pct_extra_work", 50.0)),  # fmt: skip
)

# --- one-time work and the allocator (rules in coldstart.py and allocator.py) ---------------
# A CUDA context takes 0.2-30 s, a first cuDNN convolution 0.5-1.5 s: work a steady state never
# pays again. It matters when it is a large part of what was recorded.
ONE_TIME_COSTS = Threshold(25.0, "of the whole run in torch.compile and the first steps' extra time", 2.0, "s",
                           params=(("warning_pct", 50.0),))
COLD_START = Threshold(
    20.0,
    "of the recorded window in one-time work",
    50.0,
    "ms",
    critical_share_pct=50.0,
    params=(("first_call_ratio", options.FIRST_CALL_RATIO), ("min_event_ms", options.FIRST_CALL_MIN_MS),
            ("first_launch_min_ms", options.FIRST_LAUNCH_MIN_MS), ("no_steady_state_pct", options.ALL_ONE_TIME_PCT)),
)
# The caching allocator calls cudaMalloc/cudaFree only while the pool grows; in steady state
# each call (0.1-10 ms, and a device sync for a free) means the cache is off or emptied.
ALLOCATOR_CHURN = Threshold(
    2.0,
    "of the steady-state window in cudaMalloc/cudaFree (hipMalloc/hipFree) calls",
    10.0,
    "calls in steady state",
    params=(("min_ms", 1.0), ("min_spread_pct", 50.0)),  # ... recurring in half the steps (or window slices) or more
)
# A GPU run: launch calls on the host but (almost) none of their device work recorded.
DEVICE_ACTIVITY_MISSING = Threshold(90.0, "of the launch calls with no device work recorded", 10.0, "launch calls")

# --- the dispatcher's own notes (verdict.py) --------------------------------------------------
NOT_JUDGED = Threshold(None, "", 1.0, "rule that cannot answer")
NO_BOTTLENECK = Threshold(None, "", 1.0, "finding at warning or above", fires_below=True)

# --- a job of many ranks (job/summary.py, job/across.py) ------------------------------------------
# A rank is an outlier by a figure (step time, compute, communication, collective wait, idle) when its
# robust z-score, 0.6745 (x - median) / MAD, is beyond RANK_OUTLIER_Z (3.5: Iglewicz and Hoaglin's
# cut) and it differs from the median by RANK_OUTLIER_MIN_DIFF of the median or more: ranks that are
# all alike (MAD 0) have no outliers for a difference of a rounding.
RANK_OUTLIER_Z = 3.5
RANK_OUTLIER_MIN_DIFF = 0.05
# Two ranks are alike (one group) when each share of their step time differs by at most
# RANK_GROUP_SHARE_PP percentage points and their step times by at most RANK_GROUP_STEP of the larger.
RANK_GROUP_SHARE_PP = 5.0
RANK_GROUP_STEP = 0.10
RANK_OUTLIER_MIN_MS = 0.05  # ... and by this much at least, for figures in ms
RANK_OUTLIER_MIN_PP = 1.0  # ... or in percentage points, for shares
RANK_OUTLIER_MAX_SHARE = 0.10  # more ranks than this beyond the cut are a group of their own, not outliers
WORST_RANKS = 3  # a finding merged across ranks (or judged at the job's median rank) names this many worst ranks
RANK_SLOW_BANDWIDTH = 0.5  # a rank whose collective's bus bandwidth is under this share of the ranks' median: a slow link

# --- skalpel tune's verdict (tune/stats.py) --------------------------------------------------
# A candidate is `faster` only when its whole interval lies beyond this change AND beyond the
# baseline's own run-to-run drift in the same session: a 3% gain on a machine drifting 5%
# between identical runs is not a gain anyone can count on.
TUNE_MIN_EFFECT_PCT = 3.0
# Steps of a short script (fewer than the window) slower than this times the median of its later
# half are warm-up; steady state needs this many steps after them, the halves within the next share.
TUNE_WARMUP_RATIO = 1.5
TUNE_STEADY_MIN_STEPS = 3
TUNE_STEADY_TREND_PCT = 20.0

# === skalpel watch: anomalies judged online over a whole run (watching/detect.py) =================
# Not findings of a trace: per step, over a rolling window of un-profiled steps, with robust
# statistics (median, and the MAD scaled by 1.4826 to a standard deviation). Step-time kinds judge
# the step less its DataLoader wait (a stall is dataloader_stall's, not a slower step). No judgement
# before warmup_steps, nor on the steps of a capture; a capture per kind at most once per --cooldown.
# Step-time kinds also leave out the training thread's wait for a core (a busy machine, not the script).
WATCH_WINDOW_STEPS = 200  # the rolling window every kind is judged against
WATCH_WARMUP_STEPS = 50  # first iterations allocate, compile and warm caches: not judged
# One step far above the median: 4x and 8 MADs and 50 ms; smaller one-offs (GC, a log write) are noise.
STEP_SPIKE = Threshold(
    300.0, "slower than the window's median step", 50.0, "ms above the median", params=(("mad_k", 8.0),)
)
# The median of the last recent_steps above the window's: the loop got slower and stays so.
LEVEL_SHIFT = Threshold(
    30.0, "slower median of the last recent_steps than the window's median", 0.5, "ms/step",
    params=(("recent_steps", 50), ("mad_k", 4.0)),
)  # fmt: skip
# The window's median above the reference (the first full window, or the level after a shift).
SLOW_DRIFT = Threshold(20.0, "slower window median than the reference window's", 0.5, "ms/step")
# Memory (CUDA allocated, else RSS) rising through the window: each quarter's median above the last
# by min_rise_pct of the floor, and the whole window by the floor. A one-time jump is no creep.
MEMORY_CREEP = Threshold(
    None, "", 16.0, "MiB gained over the window", params=(("min_rise_pct", 12.5),)
)
# Waiting for a batch: 3x the median step and 50 ms, min_steps steps in a row (an epoch's first
# batch, while the workers start, is one step).
DATALOADER_STALL = Threshold(
    300.0, "of the median step spent waiting for one batch", 50.0, "ms", params=(("min_steps", 3),)
)
# A rank of a torchrun job whose CPU time per step is above the other ranks' median: the others wait for
# it in every collective. Judged online by each rank's writer every every_s seconds over the last window of
# steps (at least min_steps on each rank), and by `skalpel watch --show` over the ranks' stores.
SLOW_RANK = Threshold(
    25.0, "more CPU time per step than the other ranks' median", 0.5, "ms/step",
    params=(("min_steps", 50), ("every_s", 2.0)),
)  # fmt: skip

# === A job that stops: hangs, desynchronised collectives, dead ranks (watching/hangwatch.py, diagnose/hang.py) ==
# No step ends for longer than max(floor, share x the median of the recent steps): every rank dumps its stacks
# and collectives (`skalpel watch --hang-after S` sets the floor). 20x the median: a checkpoint or an evaluation
# every N steps is rarely 20 steps long; the floor keeps a 50 ms loop from dumping at its first long step.
COLLECTIVE_HANG = Threshold(2000.0, "of the median step without a step ending", 60.0, "s")
# Ranks that disagree on collective #N of a group: its op, its sizes, or the line that called it.
COLLECTIVE_MISMATCH = Threshold(None, "", 1.0, "collective whose op, sizes or calling line differ across ranks")
# A rank whose record was never closed and whose process is gone (killed, aborted), or that ended on an error.
RANK_DIED = Threshold(None, "", 1.0, "rank that ended before the job")
# `skalpel watch --ask RUN profile N`: an `asked` anomaly for each request, N steps profiled (1 to max_steps).
ASKED = Threshold(None, "", 1.0, "request (skalpel watch --ask RUN profile N)", params=(("max_steps", 50),))

# --- precision -----------------------------------------------------------------------------
# bf16/fp16 matmuls on a CPU where this machine measured bf16 slower than fp32 (capture/precision.py): they hold
# share_pct of the step's host time, floor ms a step, and a bf16 matmul took slower_ratio times an fp32 one or more.
SLOW_LOW_PRECISION = Threshold(
    20.0, "of the step's host time in bf16 matmuls", 1.0, "ms/step", critical_share_pct=50.0,
    params=(("slower_ratio", 1.25),),
)  # fmt: skip
# fp32 matmuls where the hardware has a faster path: on a GPU, fp32 GEMM kernels on the CUDA cores (no TF32) on a
# device with TF32 tensor cores; on a CPU, fp32 matmuls where this machine measured bf16 faster_ratio times faster
# (AMX, AVX-512 BF16): an info note there (bf16 changes the numbers; a user chooses).
FAST_PRECISION_UNUSED = Threshold(
    10.0, "of the step's device time (host time on a CPU) in fp32 matmuls", 0.5, "ms/step",
    params=(("faster_ratio", 1.5), ("cpu_share_pct", 30.0), ("tf32_from_compute_major", 8.0)),
)  # fmt: skip
