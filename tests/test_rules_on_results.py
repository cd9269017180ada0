"""Rules judged on analysis results built by hand, no trace: each rule reads only ``ctx.analyses``, so a firing case
and a quiet look-alike are a few typed results each (issue 33)."""

from __future__ import annotations

import numpy as np
import pytest

from skalpel.analysis.attention import Attention, EagerAttention, RankAttention, SdpaBackend
from skalpel.analysis.blame import UNTRACED, BlameResult, Contributor, RankBlame, StepBlame
from skalpel.analysis.breakdown import RankBreakdown, StepBreakdown
from skalpel.analysis.bundle import Analyses
from skalpel.analysis.cpu_ops import CpuOps
from skalpel.analysis.gpu_time import GpuTimeOptions, GpuTimeResult, RankGpuTime
from skalpel.analysis.idle_gaps import IdleGaps, RankIdleGaps
from skalpel.analysis.kernel_launchers import KernelLaunchers, RankKernelLaunchers
from skalpel.analysis.launches import LaunchOptions, LaunchResult, RankLaunches
from skalpel.analysis.ledger import Ledger
from skalpel.analysis.loader_ranges import LoaderRanges, RankLoaderRanges
from skalpel.analysis.op_sources import MODEL, OpSource
from skalpel.analysis.step_device import RankStepDevice, StepDeviceResult
from skalpel.analysis.steps import Step, StepSegmentation
from skalpel.analysis.sync_causes import RankSyncCauses, SyncCauses
from skalpel.diagnose.device import ATTENTION_HOTSPOT, DATALOADER_FIX, GPU_IDLE, LAUNCH_BOUND
from skalpel.diagnose.host import HOST_BOUND
from skalpel.diagnose.input import DATALOADER_BOUND
from skalpel.diagnose.rule import Context, NotJudged
from skalpel.diagnose.sync import HOST_DEVICE_SYNC
from tests.ledger_fixtures import rank_ledger


class _Lines:
    """User-code lines without a trace: event N is at train.py:N."""

    def locations(self, events, *, limit: int = 3) -> tuple[str, ...]:
        return tuple(f"train.py:{int(event)}" for event in list(events)[:limit])

    def inner_locations(self, events, *, limit: int = 2) -> tuple[str, ...]:
        return ()


def _context(step_ms: float = 10.0, steps: int = 4, **results) -> Context:
    """A Context over ``steps`` marked steps of ``step_ms`` on rank 0, holding only the given results."""
    marked = tuple(Step(0, n, n * step_ms * 1000, (n + 1) * step_ms * 1000, (n + 1) * step_ms * 1000) for n in range(steps))
    analyses = Analyses(trace=None, steps=StepSegmentation(marked, marked=True), **results)  # type: ignore[arg-type]
    return Context(analyses, None, _locator=_Lines())


def _run(rule, ctx):
    outcome = rule.check(ctx, rule)
    assert not isinstance(outcome, NotJudged), outcome
    return outcome


def _loader(iterator: str = "_SingleProcessDataLoaderIter") -> LoaderRanges:
    return LoaderRanges({0: RankLoaderRanges(0, np.array([11, 12, 13, 14]), (iterator,))})


# --- dataloader_bound ---


def _breakdown(wait_ms: float, step_ms: float) -> StepBreakdown:
    return StepBreakdown((RankBreakdown(0, (0, 1, 2, 3), (step_ms,) * 4, {"dataloader": (wait_ms,) * 4},
                                        {"dataloader": wait_ms}, {"dataloader": 100.0 * wait_ms / step_ms}, True),))  # fmt: skip


def _waiting(wait_ms: float, step_ms: float) -> Ledger:
    """The host waits ``wait_ms`` of each step for its batch; the device idles all of it."""
    rest = step_ms - wait_ms
    return Ledger({0: rank_ledger(host={"data_wait": wait_ms, "compute": rest},
                                  device={"data_wait": wait_ms, "compute": rest})})  # fmt: skip


def test_dataloader_bound_fires_on_a_single_process_loader():
    ctx = _context(ledger=_waiting(6.0, 10.0), loader_ranges=_loader(), has_device=True)
    [finding] = _run(DATALOADER_BOUND, ctx)
    assert finding.evidence["share_pct"] == 60.0 and finding.evidence["iterator"] == "_SingleProcessDataLoaderIter"
    assert finding.fix.startswith("num_workers=0 loads every batch in the training process")
    assert finding.locations == ("train.py:11", "train.py:12", "train.py:13")


def test_dataloader_bound_quiet_on_a_large_share_of_a_short_step():
    """Half of a 2 ms step is under the 5 ms floor: not worth a user's hour."""
    ctx = _context(step_ms=2.0, ledger=_waiting(1.0, 2.0), loader_ranges=_loader(), has_device=True)
    assert _run(DATALOADER_BOUND, ctx) == []


# --- host_bound ---


def _host_blame(by_category_ms: dict[str, float], top: str, label: str = "augment() in train.py:12") -> BlameResult:
    steps = tuple(StepBlame(n, n * 10000.0, (n + 1) * 10000.0, 6.0, {}) for n in range(4))
    contributors = (Contributor(top, label, max(by_category_ms.values()), (5,)),)
    blamed = RankBlame(0, steps, sum(by_category_ms.values()), by_category_ms, contributors, (), waits_on="main thread")
    return BlameResult({0: blamed})


def test_host_bound_fires_on_python_between_the_ops():
    blame = _host_blame({"host_compute": 20.0, "unexplained": 4.0}, "host_compute")
    ledger = Ledger({0: rank_ledger(host={"python": 6.0, "compute": 4.0})})  # the ledger's host work: its Python
    ctx = _context(blame=blame, ledger=ledger, cpu_ops=CpuOps({}), has_device=False, has_stacks=True)
    [finding] = _run(HOST_BOUND, ctx)
    assert finding.evidence["host_work_pct"] == 60.0 and finding.evidence["culprits"][0]["share_pct"] == 50.0
    assert finding.severity == "critical"  # 60% of the step: at the critical share
    assert finding.fix.startswith("augment() in train.py:12 at train.py:5 holds the step's ops back")
    assert "DataLoader workers" in finding.fix and "torch.compile" not in finding.fix


@pytest.mark.parametrize("label", ["model_forward", "nn.Module: Router_0"])
def test_host_bound_in_the_models_forward_says_vectorise_not_workers(label):
    """Python inside the forward (an MoE router's per-token loop under record_function("model_forward")) cannot go
    to DataLoader workers or run every N steps: the fix is whole-tensor ops or compile (a public trace got the
    data-pipeline advice)."""
    blame = _host_blame({"host_compute": 20.0, "unexplained": 4.0}, "host_compute", label=label)
    ledger = Ledger({0: rank_ledger(host={"python": 6.0, "compute": 4.0})})
    ctx = _context(blame=blame, ledger=ledger, cpu_ops=CpuOps({}), has_device=False, has_stacks=True)
    [finding] = _run(HOST_BOUND, ctx)
    assert "whole-tensor ops" in finding.fix and "torch.compile" in finding.fix
    assert "DataLoader workers" not in finding.fix


def test_host_bound_title_reads_when_no_op_covers_the_time():
    blame = _host_blame({"host_compute": 20.0, "unexplained": 4.0}, "host_compute", label=UNTRACED)
    ledger = Ledger({0: rank_ledger(host={"python": 6.0, "compute": 4.0})})
    ctx = _context(blame=blame, ledger=ledger, cpu_ops=CpuOps({}), has_device=False, has_stacks=False)
    [finding] = _run(HOST_BOUND, ctx)
    assert finding.title.endswith("50% of the step is covered by no op or function of the user's")
    assert finding.severity == "info"


def test_host_bound_quiet_when_the_time_outside_the_ops_is_a_fetch():
    """The same time outside the ops, spent in a DataLoader fetch: dataloader_bound's, not host work."""
    blame = _host_blame({"data_loading": 20.0, "host_compute": 4.0}, "data_loading")
    ledger = Ledger({0: rank_ledger(host={"data_wait": 5.0, "python": 1.0, "compute": 4.0})})
    ctx = _context(blame=blame, ledger=ledger, cpu_ops=CpuOps({}), has_device=False, has_stacks=True)
    assert _run(HOST_BOUND, ctx) == []


def test_host_bound_quiet_when_the_main_thread_waits_in_another_threads_collective():
    """gloo's all_reduce on its own thread while the main thread runs no op (DDP's backward waits for it): the
    ledger's collective wait, not host work, even inside a record_function range the blame names (issue 33)."""
    blame = _host_blame({"host_compute": 20.0}, "host_compute")
    ledger = Ledger({0: rank_ledger(host={"collective_wait": 8.0, "backward": 1.0, "compute": 1.0})})
    ctx = _context(blame=blame, ledger=ledger, cpu_ops=CpuOps({}), has_device=False, has_stacks=True)
    assert _run(HOST_BOUND, ctx) == []


def test_host_bound_leaves_a_device_run_to_gpu_idle():
    assert HOST_BOUND.check(_context(has_device=True), HOST_BOUND).applies is False


# --- gpu_idle ---


def _device_idle(step_ms: float, busy_ms: float, steps: int = 4) -> dict:
    idle_us = (step_ms - busy_ms) * 1000 * steps
    gpu = RankGpuTime(0, 100, 0.0, step_ms * 1000 * steps, idle_us, busy_ms * 1000 * steps, 0.0, 0.0, 0.0,
                      {"host_wait": idle_us, "kernel_wait": 0.0, "other": 0.0}, ())  # fmt: skip
    return {
        "step_device": StepDeviceResult({0: RankStepDevice(0, (step_ms,) * steps, (busy_ms,) * steps)}, marked=True),
        "gpu_time": GpuTimeResult({0: gpu}, GpuTimeOptions()),
    }


def test_gpu_idle_fires_and_names_the_loader_it_waits_in():
    gaps = IdleGaps({0: RankIdleGaps(0, np.array([7, 9]), idle_in_loader_us=20000.0)})  # 20 of the 24 ms idle
    ctx = _context(**_device_idle(10.0, 4.0), idle_gaps=gaps, loader_ranges=_loader())
    [finding] = _run(GPU_IDLE, ctx)
    assert finding.evidence["idle_pct"] == 60.0 and round(finding.evidence["idle_in_dataloader_pct"]) == 83
    assert "inside DataLoader.__next__" in finding.title and finding.fix.endswith(DATALOADER_FIX)
    assert finding.locations == ("train.py:11", "train.py:12", "train.py:13")


def test_gpu_idle_without_the_loader_locates_the_longest_gaps():
    gaps = IdleGaps({0: RankIdleGaps(0, np.array([7, 9]), idle_in_loader_us=0.0)})
    [finding] = _run(GPU_IDLE, _context(**_device_idle(10.0, 4.0), idle_gaps=gaps, loader_ranges=_loader()))
    assert "DataLoader" not in finding.title and finding.locations == ("train.py:7", "train.py:9")


def test_gpu_idle_quiet_on_a_few_short_idle_steps():
    """60% idle of 1 ms steps, 2 of them: under the per-step floor, and too few steps to call it a pattern."""
    gaps = IdleGaps({0: RankIdleGaps(0, np.array([7]), idle_in_loader_us=0.0)})
    ctx = _context(step_ms=1.0, steps=2, **_device_idle(1.0, 0.4, steps=2), idle_gaps=gaps, loader_ranges=_loader())
    assert _run(GPU_IDLE, ctx) == []


# --- launch_bound ---


def _launch_bound(graph_launched_pct: float) -> Context:
    stats = RankLaunches(0, 4000, 5.0, 9.0, 12.0, 20.0, 0, 4000, 3.0, 6.0, 3600, 4, 1000.0, 800.0)
    launchers = RankKernelLaunchers(0, np.arange(10), graph_launched_pct, (OpSource(MODEL, 100.0, np.array([1, 2])),))
    return _context(**_device_idle(10.0, 4.0), launches=LaunchResult({0: stats}, LaunchOptions()),
                    kernel_launchers=KernelLaunchers({0: launchers}), has_device=True)  # fmt: skip


def test_launch_bound_fires_on_thousands_of_tiny_kernels():
    [finding] = _run(LAUNCH_BOUND, _launch_bound(graph_launched_pct=0.0))
    assert finding.evidence["tiny_kernel_pct"] == 90.0 and finding.evidence["kernels_per_step"] == 1000.0
    assert finding.evidence["tiny_ops_by_source_pct"] == {MODEL: 100.0} and finding.fix == LAUNCH_BOUND.fix
    assert finding.locations == ("train.py:0", "train.py:1", "train.py:2")  # the kernels' launch sites


def test_launch_bound_quiet_on_kernels_replayed_from_a_cuda_graph():
    assert _run(LAUNCH_BOUND, _launch_bound(graph_launched_pct=90.0)) == []


# --- host_device_sync ---


def _sync_context(sync_ms: float) -> Context:
    steps = tuple(StepBlame(n, n * 10000.0, (n + 1) * 10000.0, sync_ms / 4, {"sync": sync_ms / 4}) for n in range(4))
    blame = BlameResult({0: RankBlame(0, steps, sync_ms, {"sync": sync_ms}, (), ())})
    causes = RankSyncCauses(0, np.array([3, 4, 5, 6]), {"sync_call": 0, "item": 4, "blocking_dtoh": 0}, "item", 2000.0,
                            np.array([5, 3]), ("cudaStreamSynchronize",), 0)  # fmt: skip
    return _context(blame=blame, sync_causes=SyncCauses({0: causes}))


def test_host_device_sync_fires_on_item_calls_the_device_idles_after():
    [finding] = _run(HOST_DEVICE_SYNC, _sync_context(sync_ms=8.0))
    assert finding.severity == "warning" and finding.evidence["share_pct"] == 20.0
    assert finding.evidence["syncs_per_step"] == 1.0 and finding.evidence["item_count"] == 4
    assert finding.evidence["main_cause"].startswith(".item()") and finding.evidence["events"] == [3, 5]


def test_host_device_sync_is_an_info_note_when_the_device_hardly_idles_after():
    [finding] = _run(HOST_DEVICE_SYNC, _sync_context(sync_ms=0.4))
    assert finding.severity == "info" and finding.locations == ("train.py:5", "train.py:3")


# --- attention_hotspot ---


def _attention(sdpa=None, eager=None) -> Attention:
    return Attention((RankAttention(0, 40.0, sdpa, eager),))


def test_attention_hotspot_fires_on_eager_bmm_and_softmax():
    eager = EagerAttention(48, 24, 12.0, 6.0, False, np.array([1, 2]))
    [finding] = _run(ATTENTION_HOTSPOT, _context(attention=_attention(eager=eager)))
    assert finding.evidence["share_pct"] == 45.0 and finding.evidence["bmm_calls"] == 48
    assert finding.locations == ("train.py:1", "train.py:2")


def test_attention_hotspot_names_why_sdpa_fell_back_to_math():
    math = SdpaBackend("math (eager fallback)", (1, 2, 3), 20.0, 72, True)
    [finding] = _run(ATTENTION_HOTSPOT, _context(attention=_attention(sdpa=(math,))))
    assert finding.severity == "warning" and finding.evidence["backend"] == "math (eager fallback)"
    assert finding.evidence["reasons"][0].startswith("an explicit attn_mask rules out flash")


def test_attention_hotspot_quiet_when_sdpa_runs_flash():
    flash = SdpaBackend("flash", (1, 2, 3), None, 64, False)
    assert _run(ATTENTION_HOTSPOT, _context(attention=_attention(sdpa=(flash,)))) == []


def test_these_rules_read_no_trace_column():
    """The rules above read analysis results only: no ``ctx.trace`` (its columns, names, masks) and no
    ``ctx.result(name, compute)`` computing an analysis of their own."""
    from pathlib import Path

    import skalpel.diagnose

    folder = Path(skalpel.diagnose.__file__).parent
    for module in ("device", "sync", "sdpa", "overhead", "host", "input"):
        text = (folder / f"{module}.py").read_text()
        assert "ctx.trace" not in text and "ctx.result(" not in text, module
