"""A rank's further analyses, one typed section each: launch delays, device time in the steps, idle time by
cause, syncs, torch.compile, compiled regions, communication and the ranks compared.

The JSON keeps them under the rank's ``extra`` object, by name (``SECTIONS``, in that order), each section as
its ``to_dict()``: the keys in field order, tuples as lists, rows as objects. A field that a later version
added, or that only some ranks have, is left out while it holds its ``LEFT_OUT`` value, so a report written
before it reads back and writes again to the same bytes. ``from_dict`` reads a section back, each field checked
(``checked.build``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .checked import build

_S = TypeVar("_S", bound="_Section")


class _Section:
    """``to_dict``/``from_dict`` of a section or a row of one."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {}  # field -> the value at which the field is not written

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, spec.name)
            if spec.name in self.LEFT_OUT and value == self.LEFT_OUT[spec.name]:
                continue
            out[spec.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls: type[_S], data: dict[str, Any], where: str = "", *, check: bool = True) -> _S:
        """The section from its JSON object; ``check=False`` for figures an analysis just gave (no file)."""
        return build(cls, data, where or cls.__name__, check=check)


def _plain(value: Any) -> Any:
    if isinstance(value, _Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


@dataclass(frozen=True)
class LaunchSummary(_Section):
    """Launch delays, tiny kernels, kernels and ops per step (analysis/launches.py ``RankLaunches``)."""

    launched: int  # device events with a known launch call
    delay_median_us: float
    delay_p90_us: float
    delay_p99_us: float
    delay_max_us: float
    negative_delays: int  # device start before the launch call started (clock skew)
    kernels: int
    kernel_median_us: float
    launch_call_median_us: float  # host time of the launch calls of kernels
    tiny_kernels: int
    steps: int  # steps the per-step counts are averaged over
    kernels_per_step: float
    ops_per_step: float
    tiny_kernel_pct: float


@dataclass(frozen=True)
class StepDeviceSummary(_Section):
    """The device's busy share inside the steps (analysis/step_device.py)."""

    steps: int
    busy_pct: float
    idle_pct: float
    idle_ms_per_step: float
    marked: bool = False  # False: each rank's one pseudo-step is its whole window


@dataclass(frozen=True)
class BlameStep(_Section):
    """One step's idle time, and its split by cause."""

    number: int
    idle_ms: float
    ms: dict[str, float]


@dataclass(frozen=True)
class BlameCause(_Section):
    """One of the largest causes of idle time: its category, what it was and its time per step."""

    category: str
    label: str
    ms_per_step: float


@dataclass(frozen=True)
class PeerStep(_Section):
    number: int
    ms: dict[str, float]  # "rank N" / "transfer" / "arriving" / "unmatched" -> ms


@dataclass(frozen=True)
class PeerCause(_Section):
    waiting_for: str  # "rank N", "transfer", "arriving" or "unmatched"
    collective: str | None
    location: str | None
    ms_per_step: float


@dataclass(frozen=True)
class PeerWaits(_Section):
    """A rank's collective wait split by the peer it waited for (analysis/blame.py ``PeerSplit``)."""

    mostly: str | None  # the part holding most of the wait
    ms_per_step: dict[str, float]
    steps: tuple[PeerStep, ...] = ()
    top: tuple[PeerCause, ...] = ()


@dataclass(frozen=True, kw_only=True)
class BlameSummary(_Section):
    """The steps' idle time by cause (analysis/blame.py); on a CPU-only trace the main thread's (``waits_on``)."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {"waits_on": "device", "unit": None, "collective_wait_by_peer": None}

    waits_on: str = "device"  # or "main thread"
    unit: str | None = None  # "step", "iteration" or "window"; None in reports before it
    idle_ms_per_step: float
    ms_per_step: dict[str, float]
    share_pct: dict[str, float]
    steps: tuple[BlameStep, ...]
    top: tuple[BlameCause, ...]
    notes: tuple[str, ...]
    collective_wait_by_peer: PeerWaits | None = None  # the ranks compared (a job): whom the collective waits were for


@dataclass(frozen=True)
class SyncSummary(_Section):
    """Host-device synchronisations and pageable copies (analysis/syncs.py ``RankSyncs``): count and ms per
    step of each category."""

    blocked_ms_per_step: float
    device_sync_count: int
    device_sync_ms_per_step: float
    sync_call_count: int
    sync_call_ms_per_step: float
    item_count: int
    item_ms_per_step: float
    blocking_dtoh_count: int
    blocking_dtoh_ms_per_step: float
    pageable_htod_count: int
    pageable_htod_bytes: int
    pageable_htod_ms: float


@dataclass(frozen=True)
class CompileSummary(_Section):
    """torch.compile as the trace shows it, over the whole trace (analysis/compile.py ``CompileResult``)."""

    regions: int
    region_ms: float
    frames: int
    recompiles: int
    cache_lookups: int
    cache_lookup_ms: float
    compiled_functions: int
    compiled_function_ms: float
    compilations: int
    compile_ms: float
    compilations_after_first_step: int
    triton_kernels: int
    triton_kernel_names: int
    triton_device_ms: float
    triton_share_pct: float


@dataclass(frozen=True)
class CompiledRegion(_Section):
    """One compiled region that ran on the rank (analysis/compiled_regions.py ``RegionRow``)."""

    region: str  # "N/M": frame N, compile id M
    function: str | None  # the compiled function, from the compile log
    location: str | None  # "model.py:30 in forward" (None without a compile log)
    calls: int
    host_ms: float
    device_ms: float
    kernels: int
    triton_kernels: int
    graphs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compilation(_Section):
    """One compilation from the compile log: what, where, when, how long, and why (the guard that failed)."""

    compile_id: str  # "N/M": frame N, attempt M
    function: str  # "file:line in frame" where it starts
    call_site: str | None  # the user's line that called the compiled code
    duration_ms: float
    step: int | None
    in_profiled_steps: bool  # during a recorded step
    guard: str | None  # the guard that failed, in torch's words
    failed: str | None  # why the compilation failed


@dataclass(frozen=True)
class CompiledSummary(_Section):
    """Compiled regions in the user's terms, and what the compile log says (its fields None without a log)."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {
        "compilations": None, "recompilations": None, "compile_ms": None, "graph_breaks": None,
        "limits_reached": None, "stacks_off": None, "sources": None, "events": None,
    }  # fmt: skip

    regions: tuple[CompiledRegion, ...] = ()
    compilations: int | None = None
    recompilations: int | None = None
    compile_ms: float | None = None
    graph_breaks: int | None = None
    limits_reached: int | None = None
    stacks_off: bool | None = None
    sources: tuple[str, ...] | None = None
    events: tuple[Compilation, ...] | None = None


@dataclass(frozen=True)
class CollectiveRow(_Section):
    """The collectives of one type on the rank (analysis/comm.py ``CollectiveStats``), and against commbench's
    bandwidth at the same size once compared (result/commbench.py)."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {
        "commbench_busbw_gbps": None, "vs_commbench_pct": None, "transfer_vs_commbench_pct": None,
    }  # fmt: skip

    type: str
    calls: int
    calls_per_step: float
    total_ms: float
    ms_per_step: float
    share_pct: float
    bytes_per_step: float
    median_bytes: int
    group_size: int
    algbw_gbps: float | None
    busbw_gbps: float | None
    commbench_busbw_gbps: float | None = None
    vs_commbench_pct: float | None = None
    transfer_vs_commbench_pct: float | None = None  # the busbw after the last rank arrived, against commbench's


@dataclass(frozen=True)
class CommSummary(_Section):
    """A rank's communication over its steps: share of the step, overlap, by type (analysis/comm.py)."""

    timed_on: str  # "device", "host" or "none"
    comm_ms_per_step: float
    share_pct: float
    exposed_ms_per_step: float
    overlap_pct: float | None
    by_type: tuple[CollectiveRow, ...] = ()


@dataclass(frozen=True)
class DistributedSummary(_Section):
    """One rank among the ranks compared (analysis/ranks.py ``summary_of``): its times, clock and arrivals.

    A rank the comparison has no timing of has every field None, and is written as ``{}`` (``measured``).
    """

    LEFT_OUT: ClassVar[dict[str, Any]] = {
        "step_ms": None, "comm_ms_per_step": None, "wait_ms_per_step": None, "busy_ms_per_step": None,
        "clock_offset_us": None, "clock": None, "matched_collectives": None, "last_arrivals": None,
        "straggler_candidate": None, "transfer_busbw_gbps": None,
    }  # fmt: skip

    step_ms: float | None = None
    comm_ms_per_step: float | None = None
    wait_ms_per_step: float | None = None
    busy_ms_per_step: float | None = None
    clock_offset_us: float | None = None
    clock: str | None = None  # "reference", "same host", "aligned" (estimated) or "raw"
    matched_collectives: int | None = None
    last_arrivals: int | None = None  # matched collectives this rank reached last
    straggler_candidate: bool | None = None
    transfer_busbw_gbps: dict[str, float] | None = None  # by type, without the wait; None in reports before it

    @property
    def measured(self) -> bool:
        return self.step_ms is not None


@dataclass(frozen=True)
class ModuleRow(_Section):
    """One module of the tree (analysis/modules.py ``ModuleNode``), figures per unit; ``path`` names it from the
    outermost module, so the rows (in preorder) rebuild the tree."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {"location": None, "defined_at": None, "params": None, "output_bytes": None}

    path: tuple[str, ...]
    calls: float
    host_ms: float
    host_self_ms: float
    device_ms: float
    device_self_ms: float
    flops: float
    flops_self: float
    location: str | None = None  # the innermost user-code line: its forward's, else the nearest caller module's
    defined_at: str | None = None  # its forward's definition, in any file
    # the backward ops of the autograd nodes the subtree's forward made (self: its own forward ops'), per unit
    backward_host_ms: float = 0.0
    backward_host_self_ms: float = 0.0
    backward_device_ms: float = 0.0
    backward_device_self_ms: float = 0.0
    backward_flops: float = 0.0
    params: int | None = None  # the module's and its children's parameters (skalpel run records them; None: not)
    output_bytes: int | None = None  # bytes of the tensors its forward returned, at its first call


@dataclass(frozen=True)
class ModulesSummary(_Section):
    """Time and FLOPs by nn.Module, per unit, forward and backward, and what runs outside every module and is no
    module's backward (the optimizer, the loss, the loop): the outermost modules, their backward and the
    unattributed time add up to the unit."""

    unit: str  # "step", "iteration" or "window"
    units: int
    unit_ms: float
    host_ms: float  # in the outermost module frames
    host_unattributed_ms: float
    device_ms: float
    device_in_modules_ms: float
    device_unattributed_ms: float
    ranked_by: str  # "device" or "host": what the tree's siblings are ordered by
    nodes: tuple[ModuleRow, ...] = ()
    backward_host_ms: float = 0.0  # the backward ops charged to a module
    backward_device_ms: float = 0.0
    sizes: str = "not recorded"  # "recorded": the capture wrote each module's parameters and output bytes


@dataclass(frozen=True)
class RooflineOp(_Section):
    """One op group (name, input shapes, dtype) under the roofs (analysis/roofline.py ``RooflineRow``), per unit; its
    figures None where it is not judged (``why`` says why)."""

    op: str
    shapes: str | None
    dtype: str | None
    calls: float
    ms: float
    flops: float | None
    bytes: float | None
    intensity: float | None
    achieved_gflops: float | None
    achieved_gbps: float | None
    peak_gflops: float | None
    peak_gbps: float | None
    label: str  # compute-bound, memory-bound, overhead-bound, not judged
    roof_pct: float | None
    why: str


@dataclass(frozen=True)
class ModuleRoof(_Section):
    """A module's judged op calls together under the roofs (analysis/roofline.py ``ModuleRoof``), per unit:
    its forward's and the backward its forward made, its subtree's included."""

    path: tuple[str, ...]
    calls: float
    ms: float
    flops: float
    bytes: float
    intensity: float
    achieved_gflops: float
    achieved_gbps: float
    peak_gflops: float
    peak_gbps: float
    label: str  # compute-bound, memory-bound, overhead-bound
    roof_pct: float
    why: str


@dataclass(frozen=True)
class RooflineSummary(_Section):
    """The heavy ops of the rank under the roofs: where the peaks come from, and each op group's label; the
    modules' judged ops together."""

    LEFT_OUT: ClassVar[dict[str, Any]] = {"modules": (), "modules_why": None}

    roofs: str
    ops: tuple[RooflineOp, ...] = ()
    modules: tuple[ModuleRoof, ...] = ()
    modules_why: str | None = None  # why no module is judged


SECTIONS: dict[str, type[_Section]] = {
    "launch": LaunchSummary, "step_device": StepDeviceSummary, "blame": BlameSummary, "syncs": SyncSummary,
    "compile": CompileSummary, "compiled": CompiledSummary, "comm": CommSummary, "distributed": DistributedSummary,
    "modules": ModulesSummary, "roofline": RooflineSummary,
}  # fmt: skip


@dataclass(frozen=True)
class RunLedger(_Section):
    """The script's whole run by skalpel's step clock (capture/runledger.py): where its wall time went, and its
    one-time costs. Seconds; the five parts (start-up, first-steps extra, in steps, between steps, after the last
    step) add up to ``run_s``; the shares are of ``run_s``.

    ``between_steps_s`` is the time of the steps far longer than the typical one (``long_step_ratio`` times or more),
    beyond a typical step: work the loop does between its steps (a rollout, an evaluation, a checkpoint). Of it, what
    the clock could name (``between_*``, outermost blocks that ran in those steps); ``first_steps_extra_s``: the same
    excess in the first steps, a one-time cost rather than work between steps.
    """

    run_s: float  # the script's wall time, its start to its end, less skalpel's own work
    steps: int  # step boundaries the clock saw
    step_s: float  # the typical step: the median time between boundaries
    startup_s: float  # before the first step (imports, building the model and data), less one typical step
    in_steps_s: float
    between_steps_s: float
    after_last_step_s: float  # after the last step boundary the clock saw, to the script's end
    first_steps_extra_s: float  # the first steps' time beyond a typical step (one-time work in them)
    compile_s: float  # torch.compile's compilations over the whole run (its compile log)
    compile_startup_s: float  # of them, before the first step
    between_no_grad_s: float  # under no_grad / inference_mode, not in eval mode: a rollout, inference
    between_eval_s: float  # under no_grad / inference_mode with a module in eval mode: evaluation
    between_save_s: float  # in torch.save: checkpoints
    between_compile_s: float  # compiling
    skalpel_s: float  # skalpel's own work at the step boundaries (the trace written...): left out of every figure
    long_steps: int  # steps counted as holding work between steps
    steps_to_end: bool  # the clock saw the steps to the script's end (else: after_last_step_s holds more steps)
    long_step_ratio: float

    @property
    def one_time_s(self) -> float:
        """Start-up before the first step and the first steps' extra time (compile inside either included)."""
        return self.startup_s + self.first_steps_extra_s

    def pct(self, seconds: float) -> float:
        return 100.0 * seconds / self.run_s if self.run_s > 0 else 0.0

    def lines(self) -> list[str]:
        """The ledger in words, one line each: where the run's time went, what the time between steps was, and the
        one-time costs (terminal and HTML say the same)."""
        pct = self.pct
        where = [f"start-up before the first step {self.startup_s:.1f} s ({pct(self.startup_s):.0f}%)",
                 f"in {self.steps} steps {self.in_steps_s:.1f} s ({pct(self.in_steps_s):.0f}%)",
                 f"between steps {self.between_steps_s:.1f} s ({pct(self.between_steps_s):.0f}%)"]  # fmt: skip
        if self.first_steps_extra_s > 0:
            extra = self.first_steps_extra_s
            where.insert(1, f"first steps' extra {extra:.1f} s ({pct(extra):.0f}%)")
        tail = "after the last step" if self.steps_to_end else "after the last step skalpel timed (steps went on)"
        where.append(f"{tail} {self.after_last_step_s:.1f} s ({pct(self.after_last_step_s):.0f}%)")
        own = f" (skalpel's own {self.skalpel_s:.1f} s left out)" if self.skalpel_s >= 0.05 else ""
        lines = [f"whole run {self.run_s:.1f} s{own}: " + ", ".join(where)]
        if self.pct(self.between_steps_s) >= 1.0:  # a share worth a line
            named = {"rollout/inference under no_grad": self.between_no_grad_s, "evaluation": self.between_eval_s,
                     "checkpoints (torch.save)": self.between_save_s, "torch.compile": self.between_compile_s}
            known = sum(named.values())
            parts = [f"{name} {seconds:.1f} s ({pct(seconds):.0f}%)" for name, seconds in named.items() if seconds > 0]
            parts.append(f"not named {max(self.between_steps_s - known, 0.0):.1f} s")
            lines.append(f"between steps ({self.long_steps} step(s) of {self.long_step_ratio:g}x the typical "
                         f"{self.step_s * 1000:.1f} ms or more, beyond it): " + ", ".join(parts))  # fmt: skip
        one_time = [f"start-up {self.startup_s:.1f} s"]
        if self.compile_startup_s > 0:
            one_time[0] += f" (torch.compile {self.compile_startup_s:.1f} s)"
        if self.first_steps_extra_s > 0:
            one_time.append(f"first steps +{self.first_steps_extra_s:.1f} s")
        compiled = ""
        if self.compile_s:
            compiled = f"; torch.compile {self.compile_s:.1f} s over the run ({pct(self.compile_s):.0f}%)"
        lines.append(f"one-time costs {self.one_time_s:.1f} s, {pct(self.one_time_s):.0f}% of the run: "
                     + ", ".join(one_time) + compiled)  # fmt: skip
        return lines
