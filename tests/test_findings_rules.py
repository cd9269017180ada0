"""Finding rules on small hand-built Kineto traces: each threshold, both sides of it.

Each test writes a tiny Kineto JSON document (the format torch.profiler writes: complete
``X`` events with ``cpu_op`` / ``cuda_runtime`` / ``kernel`` / ``gpu_memcpy`` categories,
linked by correlation and External id) and runs the real loader, analyses and rules on it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from skalpel.api import analyze
from skalpel.diagnose import thresholds
from tests.tracebuilder import TraceBuilder


def _findings(builder: TraceBuilder, tmp_path: Path, finding_id: str):
    report = analyze(builder.write(tmp_path / "trace.json"))
    return [finding for finding in report.findings if finding.id == finding_id], report


STEP_US = 10_000.0


def _steps(builder: TraceBuilder, count: int = 3) -> None:
    for number in range(count):
        builder.step(number + 1, number * STEP_US, STEP_US - 1)


# --- gpu_idle -------------------------------------------------------------------------------


@pytest.mark.parametrize(("busy_us", "fires"), [(2000.0, True), (9500.0, False)])
def test_gpu_idle_both_sides(tmp_path, busy_us, fires):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        # one kernel per step launched at the step's start; the device is busy busy_us of each 10 ms step
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=busy_us)
    found, _ = _findings(builder, tmp_path, "gpu_idle")
    if fires:
        assert len(found) == 1
        assert found[0].evidence["idle_pct"] >= thresholds.GPU_IDLE.share_pct
        assert found[0].severity == "critical"  # ~80% idle, above the critical share
    else:
        assert found == []


def _small_steps(builder: TraceBuilder, busy_us: list[float]) -> None:
    """1 ms steps, one kernel each, busy ``busy_us[i]`` of step i."""
    for number, busy in enumerate(busy_us):
        start = number * 1000.0
        builder.step(number + 1, start, 999)
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=busy)


def test_gpu_idle_small_steps_idle_every_step_fire(tmp_path):
    """80% idle of 1 ms steps is 0.8 ms/step, below the floor, but it holds in every step: the pattern fires."""
    builder = TraceBuilder()
    _small_steps(builder, [200.0] * 5)
    found, _ = _findings(builder, tmp_path, "gpu_idle")
    (finding,) = found
    assert finding.evidence["idle_pct"] == pytest.approx(80, abs=0.5)
    assert finding.evidence["idle_ms_per_step"] == pytest.approx(0.8, abs=0.01)
    assert finding.evidence["steps_idle_pct"] == 100
    assert finding.evidence["judged_over"] == "marked steps"
    assert "reduce-overhead" in finding.fix and "larger batches" in finding.fix


@pytest.mark.parametrize("busy_us", [[900.0] * 5, [200.0, 900.0, 900.0, 900.0, 900.0], [200.0, 200.0]],
                         ids=["busy", "one-idle-step", "two-steps"])  # fmt: skip
def test_gpu_idle_small_steps_look_alikes_stay_quiet(tmp_path, busy_us):
    """Small steps with a busy device, one idle step among busy ones, or too few steps to call it a pattern."""
    builder = TraceBuilder()
    _small_steps(builder, busy_us)
    found, report = _findings(builder, tmp_path, "gpu_idle")
    assert found == []
    if busy_us == [900.0] * 5:  # the verdict's numbers give the steps' idle share, then HTA's span
        from skalpel.report import html

        assert "GPU idle 9.9% of the steps (HTA, first to last device event: 8.2%)" in html.render(report)


def test_gpu_idle_is_judged_over_the_steps_not_htas_device_span(tmp_path):
    """A 33.7 ms step in which the device works 11 us (two back-to-back kernels): HTA's span runs from the first
    to the last kernel and reads ~100% compute; the step is 99.97% idle, and the report says both."""
    builder = TraceBuilder()
    builder.step(1, 0.0, 33_700)
    builder.launch(100, 5, work_ts=200, work_dur=5.5)
    builder.launch(110, 5, work_ts=205.5, work_dur=5.5)
    found, report = _findings(builder, tmp_path, "gpu_idle")
    (finding,) = found
    assert finding.evidence["idle_pct"] == pytest.approx(100 * (1 - 11 / 33_700), abs=0.01)
    assert finding.evidence["hta_compute_pct"] == pytest.approx(100)
    assert finding.severity == "critical"
    assert report.ranks[0].gpu.compute_pct == pytest.approx(100)  # HTA's numbers stay HTA's
    assert report.ranks[0].extra["step_device"]["busy_pct"] == pytest.approx(100 * 11 / 33_700, abs=0.001)
    from skalpel.report import terminal

    out = " ".join(terminal.render_text(report, width=200).split())
    assert "GPU in marked steps: busy 0.0%, idle 100.0% (33.69 ms/step)" in out
    assert "GPU (HTA, first to last device event): idle 0.0%" in out


# --- launch_bound ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel_us", "fires"), [(2.0, True), (20.0, False)])
def test_launch_bound_both_sides(tmp_path, kernel_us, fires):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        for index in range(600):  # 600 launches of 8 us each, back to back on the host
            ts = start + 50 + index * 8.0
            builder.launch(ts, 7, work_ts=ts + 6, work_dur=kernel_us)
    found, _ = _findings(builder, tmp_path, "launch_bound")
    if fires:
        assert len(found) == 1
        evidence = found[0].evidence
        assert evidence["kernels_per_step"] == pytest.approx(600)
        assert evidence["tiny_kernel_pct"] == pytest.approx(100)
    else:
        assert found == []


# --- host_device_sync -----------------------------------------------------------------------


@pytest.mark.parametrize(("relaunch_after_us", "severity"), [(3000.0, "critical"), (20.0, "info")])
def test_host_device_sync_judged_by_the_idle_it_causes(tmp_path, relaunch_after_us, severity):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=5000)  # the device works 5 ms
        builder.runtime("cudaDeviceSynchronize", start + 30, 4990)  # the host waits for it
        resume = start + 5020 + relaunch_after_us
        builder.launch(resume, 5, work_ts=resume + 10, work_dur=500)
    found, _ = _findings(builder, tmp_path, "host_device_sync")
    assert len(found) == 1
    finding = found[0]
    assert finding.severity == severity
    assert finding.evidence["sync_call_count"] == 3
    assert finding.evidence["syncs_per_step"] == pytest.approx(1.0)
    if severity == "critical":
        assert finding.evidence["idle_after_ms_per_step"] == pytest.approx(3.0, abs=0.05)
        assert finding.evidence["share_pct"] >= thresholds.HOST_DEVICE_SYNC.critical_share_pct


# --- pageable_memcpy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nbytes", "severity"),
    [
        ("Memcpy HtoD (Pageable -> Device)", 8 * 2**20, "warning"),  # 1 ms of a 10 ms step
        ("Memcpy HtoD (Pinned -> Device)", 8 * 2**20, None),  # pinned: fine
        ("Memcpy HtoD (Pageable -> Device)", 1024, None),  # a few bytes: below the floors
    ],
)
def test_pageable_memcpy_both_sides(tmp_path, name, nbytes, severity):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        duration = 1000.0 if nbytes > 2**20 else 2.0
        builder.launch(start + 10, duration + 20, work_ts=start + 20, work_dur=duration, name="cudaMemcpyAsync",
                       kernel=name, cat="gpu_memcpy", nbytes=nbytes)  # fmt: skip
        builder.launch(start + 1100, 5, work_ts=start + 1200, work_dur=8000)
    found, _ = _findings(builder, tmp_path, "pageable_memcpy")
    if severity is None:
        assert found == []
    else:
        assert [finding.severity for finding in found] == [severity]
        assert found[0].evidence["mib_per_step"] == pytest.approx(8.0)
        assert found[0].evidence["ms_per_step"] == pytest.approx(1.0)


# --- attention_hotspot ----------------------------------------------------------------------


def _attention_step(builder: TraceBuilder, start: float, *, fused: bool) -> None:
    if fused:
        external = builder.host("aten::_scaled_dot_product_flash_attention", start + 10, 100)
        builder.launch(start + 20, 5, work_ts=start + 30, work_dur=1500, external=external,
                       kernel="pytorch_flash::flash_fwd_kernel")  # fmt: skip
    else:
        for offset, op, kernel in ((10, "aten::bmm", "gemm_qk"), (200, "aten::_softmax", "softmax_warp_forward"),
                                   (400, "aten::bmm", "gemm_pv")):  # fmt: skip
            external = builder.host(op, start + offset, 100)
            builder.launch(start + offset + 10, 5, work_ts=start + 600 + offset * 5, work_dur=800, external=external,
                           kernel=kernel)  # fmt: skip
    external = builder.host("aten::addmm", start + 500, 50)
    builder.launch(start + 510, 5, work_ts=start + 5000, work_dur=1000, external=external, kernel="sm90_gemm")


@pytest.mark.parametrize("fused", [False, True])
def test_attention_hotspot_eager_fires_fused_does_not(tmp_path, fused):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        _attention_step(builder, number * STEP_US, fused=fused)
    found, _ = _findings(builder, tmp_path, "attention_hotspot")
    if fused:
        assert found == []
    else:
        assert len(found) == 1
        evidence = found[0].evidence
        assert evidence["share_pct"] == pytest.approx(100 * 2400 / 3400, abs=0.1)  # 3 x 800 us of 3400 us device time
        assert evidence["softmax_calls"] == 3 and evidence["bmm_calls"] == 6
        assert evidence["fused_attention_seen"] is False


# --- bad input ------------------------------------------------------------------------------


def test_no_steps_says_what_cannot_be_judged(tmp_path):
    builder = TraceBuilder()
    for index in range(5):
        builder.host("aten::mm", index * 1000.0, 900)
    report = analyze(builder.write(tmp_path / "trace.json"))
    notes = [finding for finding in report.findings if finding.id == "not_judged"]
    no_steps = [note for note in notes if "no steps marked" in note.evidence["reason"]]
    assert no_steps and "memory_growth" in no_steps[0].evidence["rules"]
    no_device = [note for note in notes if "no device activity" in note.evidence["reason"]]
    assert no_device and "host_device_sync" in no_device[0].evidence["rules"]
    assert not [finding for finding in report.findings if finding.severity in ("critical", "warning")]
    assert not [note for note in notes if "rule error" in note.evidence["reason"]]


def test_one_event_trace_gives_a_verdict_not_a_crash(tmp_path):
    builder = TraceBuilder()
    builder.host("aten::add", 0.0, 5.0)
    report = analyze(builder.write(tmp_path / "trace.json"))
    ids = [finding.id for finding in report.findings]
    assert "no_bottleneck" in ids
    assert not [f for f in report.findings if f.id == "not_judged" and "rule error" in f.evidence["reason"]]


def test_findings_without_stacks_say_how_to_get_them(tmp_path):
    builder = TraceBuilder()
    _steps(builder)
    for number in range(3):
        start = number * STEP_US
        builder.launch(start + 10, 5, work_ts=start + 20, work_dur=5000)
        builder.runtime("cudaDeviceSynchronize", start + 30, 4990)
        builder.launch(start + 8000, 5, work_ts=start + 8010, work_dur=500)
    found, _ = _findings(builder, tmp_path, "host_device_sync")
    assert "with_stack=True" in found[0].locations[0]


# --- measurement (from the capture settings) -------------------------------------------------


def _with_capture(tmp_path: Path, **capture_fields):
    from skalpel.job.report_of import report_of
    from skalpel.result.report import CaptureInfo

    builder = TraceBuilder()
    for number in range(5):
        builder.step(number + 1, number * STEP_US, STEP_US - 1)
        builder.host("aten::mm", number * STEP_US + 10, 9000)
    capture = CaptureInfo(**{"warmup_steps": 2, "active_steps": 5, **capture_fields})
    return report_of(builder.write(tmp_path / "trace.json"), capture=capture).report


@pytest.mark.parametrize(("noise_pct", "medians", "severity"), [(35.0, (10.0, 13.5), "info"), (60.0, (10.0, 16.0), "warning"),
                                                                 (5.0, (10.0, 10.5), None)])  # fmt: skip
def test_noisy_measurement_from_capture_windows(tmp_path, noise_pct, medians, severity):
    report = _with_capture(tmp_path, noise_pct=noise_pct, repeats=2, window_medians_ms=medians)
    found = [finding for finding in report.findings if finding.id == "noisy_measurement"]
    assert [finding.severity for finding in found] == ([severity] if severity else [])


# The floor is 0.1 ms/step: a 1 ms step slowed by 40% is as inflated as a 100 ms one (the noise band judges the rest).
@pytest.mark.parametrize(("overhead_pct", "profiled", "severity"), [(150.0, 25.0, "warning"), (30.0, 13.0, "info"),
                                                                    (5.0, 10.5, None), (40.0, 1.3, "info"),
                                                                    (128.0, 0.7, "warning"), (40.0, 0.12, None)])  # fmt: skip
def test_profiler_overhead_share_and_floor(tmp_path, overhead_pct, profiled, severity):
    unprofiled = profiled / (1 + overhead_pct / 100)
    report = _with_capture(tmp_path, overhead_pct=overhead_pct, profiled_step_ms=profiled, unprofiled_step_ms=unprofiled)
    found = [finding for finding in report.findings if finding.id == "profiler_overhead"]
    assert [finding.severity for finding in found] == ([severity] if severity else [])


def test_no_warmup_from_capture_settings(tmp_path):
    report = _with_capture(tmp_path, warmup_steps=0)
    found = [finding for finding in report.findings if finding.id == "no_warmup"]
    assert len(found) == 1 and found[0].evidence["warmup_steps"] == 0
    assert not [f for f in _with_capture(tmp_path).findings if f.id == "no_warmup"]


def _first_step_slow(tmp_path: Path, capture) -> list:
    """Five 10 ms steps whose first is 70% slower (the H200 host_prep --fix run: 5.8 vs 3.5 ms after 2 warm-up)."""
    from skalpel.job.report_of import report_of

    builder, start = TraceBuilder(), 0.0
    for number in range(5):
        length = STEP_US * (1.7 if number == 0 else 1.0)
        builder.step(number + 1, start, length - 1)
        builder.host("aten::mm", start + 10, length - 1000)
        start += length
    report = report_of(builder.write(tmp_path / "trace.json"), capture=capture).report
    return [finding for finding in report.findings if finding.id == "no_warmup"]


def test_a_slow_first_step_after_warm_up_is_a_note_with_a_longer_warm_up(tmp_path):
    from skalpel.result.report import CaptureInfo

    after_warmup = _first_step_slow(tmp_path, CaptureInfo(warmup_steps=2, active_steps=5))
    assert [f.severity for f in after_warmup] == ["info"]
    assert "after 2 warm-up steps" in after_warmup[0].title and "--warmup 8" in after_warmup[0].fix
    by_hand = _first_step_slow(tmp_path, None)  # a trace taken by hand: its warm-up is unknown
    assert [f.severity for f in by_hand] == ["warning"] and "warm-up was recorded" in by_hand[0].title


def test_profiler_overhead_inside_its_noise_is_no_finding(tmp_path):
    report = _with_capture(tmp_path, overhead_pct=40.0, overhead_noise_pct=55.0, profiled_step_ms=14.0,
                           unprofiled_step_ms=10.0)  # fmt: skip
    assert not [finding for finding in report.findings if finding.id == "profiler_overhead"]
    assert report.capture.overhead_words() == "profiler overhead within the noise (+-55%)"


def test_overhead_against_one_unprofiled_step_is_not_measurable():
    from skalpel.result.report import CaptureInfo

    words = CaptureInfo(warmup_steps=1, active_steps=5, overhead_pct=12.0, overhead_noise_pct=200.0,
                        baseline_steps=1).overhead_words()  # fmt: skip
    assert words.startswith("profiler overhead not measurable: 1 un-profiled step(s)") and "200" not in words
    steady = CaptureInfo(warmup_steps=1, active_steps=5, overhead_pct=12.0, overhead_noise_pct=20.0, baseline_steps=8)
    assert steady.overhead_words() == "profiler overhead within the noise (+-20%)"


def test_negative_overhead_is_never_printed_as_a_figure():
    from skalpel.result.report import CaptureInfo

    words = CaptureInfo(warmup_steps=1, active_steps=5, overhead_pct=-87.7, overhead_noise_pct=10.0).overhead_words()
    assert "not measurable" in words and "-87" not in words


def _cpu(**fields):
    facts = {"intra_op_threads": 1, "inter_op_threads": 1, "loader_workers": 0, "processes": 1, "cores_available": 2,
             "cpu_quota_cores": None, "cpu_s": 0.95, "wall_s": 1.0, "steps": 5, "load_avg_1m": 0.5,
             "run_queue_wait_s": 0.01}  # fmt: skip
    return {**facts, **fields}


def test_cpu_contention_from_run_queue_wait(tmp_path):
    starved = _cpu(intra_op_threads=4, cpu_s=1.2, run_queue_wait_s=2.4, load_avg_1m=6.3)
    report = _with_capture(tmp_path, cpu=starved)
    found = [finding for finding in report.findings if finding.id == "cpu_contention"]
    assert len(found) == 1
    evidence = found[0].evidence
    assert evidence["waiting_pct"] == pytest.approx(66.67, abs=0.01)  # 2.4 s waiting of 3.6 s wanted
    assert evidence["wait_ms_per_step"] == pytest.approx(480.0)
    assert evidence["threads_asked"] == 4 and evidence["cores_available"] == 2
    assert "torch.set_num_threads(2)" in found[0].fix and "system load 6.3" in found[0].fix


def test_cpu_contention_fix_fits_the_machine(tmp_path):
    """8 workers and 2 threads on 2 cores: one thread and the one worker the free core holds (cores.workers_that_fit,
    the plan loader_oversubscribed names), never "or less": 0 workers put the making of every batch into the step."""
    starved = _cpu(intra_op_threads=2, loader_workers=8, cpu_s=0.5, run_queue_wait_s=1.5, load_avg_1m=9.0)
    fix = next(f for f in _with_capture(tmp_path, cpu=starved).findings if f.id == "cpu_contention").fix
    assert "torch.set_num_threads(1)" in fix and "num_workers=1 (not 0 unless a batch takes less than ~1.5 ms" in fix
    assert "or less" not in fix


def test_cpu_contention_cuts_workers_to_the_shared_plan():
    """makemore (4 workers, 1 thread, 2 cores; 4 -> 0 measured 1.10-1.28x slower) and dcgan (2 -> 1: 1.35x faster)
    both get the one worker the free core holds; workers that fit are not cut."""
    from skalpel.cores import workers_that_fit
    from skalpel.diagnose.cpu import _fix

    for workers in (4, 2):
        fix = _fix(1, 1, workers, 2.0, 3.0, [])
        assert workers_that_fit(workers, 1, 2) == (1, None) and "num_workers=1 (not 0" in fix, fix
    assert "num_workers" not in _fix(1, 1, 1, 2.0, 3.0, [])  # 1 worker + 1 thread fit 2 cores


def test_cpu_contention_from_other_processes_blames_none_of_the_script(tmp_path):
    """2 threads on 2 cores, load average low but the run queue full in bursts: nothing in the script to change."""
    bursts = _cpu(intra_op_threads=2, cpu_s=1.1, run_queue_wait_s=0.9, load_avg_1m=0.6)
    fix = next(f for f in _with_capture(tmp_path, cpu=bursts).findings if f.id == "cpu_contention").fix
    assert "nothing in the script" in fix and "other processes" in fix and "set_num_threads" not in fix


def test_quiet_process_has_no_cpu_contention(tmp_path):
    assert not [f for f in _with_capture(tmp_path, cpu=_cpu()).findings if f.id == "cpu_contention"]
    assert not [f for f in _with_capture(tmp_path).findings if f.id == "cpu_contention"]  # no facts: not judged


def test_dataloader_fix_never_asks_for_more_workers_than_cores(tmp_path):
    from skalpel.diagnose.input import worker_advice

    assert "num_workers=2" in worker_advice({"cores_available": 2})
    assert "num_workers=4" in worker_advice({"cores_available": 16})
    assert "num_workers" not in worker_advice({"cores_available": 1}).split(":")[0]
    assert "up to the cores" in worker_advice(None)


def test_dataloader_fix_counts_the_intra_op_threads_and_sizes_its_gain():
    """2 intra-op threads on 2 cores: a worker needs a core they hold, so never num_workers=1 alone."""
    from skalpel.diagnose.input import loader_plan

    busy = loader_plan({"cores_available": 2, "intra_op_threads": 2}, wait_ms=94.0, step_ms=341.0, single=True,
                       device=False, min_speedup=1.1)  # fmt: skip
    assert busy.fix.startswith("make __getitem__ cheap") and "up to 1.4x" in busy.fix
    assert "or DataLoader(num_workers=2, persistent_workers=True, prefetch_factor=2) with torch.set_num_threads(1)" \
        in busy.fix and "0.69-1.38x" in busy.fix
    # the compute fills the step: one worker on one thread cannot gain
    full = loader_plan({"cores_available": 2, "intra_op_threads": 2}, wait_ms=10.0, step_ms=340.0, single=True,
                       device=False, min_speedup=1.1)  # fmt: skip
    assert "not more workers" in full.fix and full.evidence["workers_speedup_up_to"] < 1.1
    # the demo: 1 thread, the fetch 30 of a 36.5 ms step: 2 workers halve the fetch (2.4x), a cheap fetch gains more
    demo = loader_plan({"cores_available": 2, "intra_op_threads": 1}, wait_ms=30.3, step_ms=36.5, single=True,
                       device=False, min_speedup=1.1)  # fmt: skip
    assert demo.fix.startswith("make __getitem__ cheap") and "or DataLoader(num_workers=2," in demo.fix
    assert "set_num_threads" not in demo.fix and round(demo.evidence["workers_speedup_up_to"], 2) == 2.41
    # compute-heavy steps on a big machine: the workers hide the whole fetch, so they lead
    big = loader_plan({"cores_available": 16, "intra_op_threads": 8}, wait_ms=10.0, step_ms=40.0, single=True,
                      device=True, min_speedup=1.1)  # fmt: skip
    assert big.fix.startswith("DataLoader(num_workers=4, pin_memory=True,")


# CPU facts and step figures as `skalpel run` recorded them (report.json) on this 2-core machine, with what the
# advised fix measured after (ms a step, medians of 5 interleaved runs, 1 intra-op thread):
# an HF-style loop (tokenizing-like __getitem__, 4 micro-batches a step) at load 15: 0 workers 105, 2 workers 112;
_HF_LOADED = {"intra_op_threads": 1, "inter_op_threads": 2, "loader_workers": 0, "processes": 1, "cores_available": 2,
              "cpu_quota_cores": None, "cpu_s": 0.1541, "wall_s": 1.4519, "steps": 5, "load_avg_1m": 15.15,
              "runnable_now": 7, "run_queue_wait_s": 1.3811}  # fmt: skip
# the same loop idle (load 1.4): 0 workers 10.4 / 15.3, 2 workers 18.7 / 20.8; the profiler made its steps 2.65x longer
_HF_IDLE = {**_HF_LOADED, "cpu_s": 0.1195, "wall_s": 0.1402, "load_avg_1m": 1.39, "runnable_now": 2,
            "run_queue_wait_s": 0.024}  # fmt: skip
# the starving loop (16 x 2 ms of sleep a batch) at load 21: 0 workers 327.6, 2 workers 338.0 (each sleep's wake-up
# waits for a core too)
_STARVED_LOADED = {**_HF_LOADED, "cpu_s": 0.0274, "wall_s": 0.4045, "load_avg_1m": 20.86, "runnable_now": 25,
                   "run_queue_wait_s": 0.1929}  # fmt: skip


def test_dataloader_fix_gives_no_workers_where_they_cannot_pay():
    """Workers lose where a batch costs less to make (on a core, without the profiler) than a worker's hand-over;
    other load is no veto. The figures are real captures' (above), and the fix says why with its numbers."""
    from skalpel.cores import WORKER_HANDOFF_MS
    from skalpel.diagnose.input import loader_plan

    plan = functools.partial(loader_plan, single=True, device=False, min_speedup=1.1)
    # at load 15 the fetch's 38.6 ms a batch is mostly waits for a core: the process ran 10% of the time it wanted
    # one, so a batch costs 3.9 ms on a core profiled, 1.5 ms without the profiler: less than a hand-over
    ratio = 10.1654 / 26.9769
    loaded = plan(_HF_LOADED, wait_ms=154.5, step_ms=282.1, batches_per_step=4.0, unprofiled_ratio=ratio)
    assert round(loaded.evidence["ran_share_of_wanted"], 3) == 0.100 and loaded.evidence["cores_held_by_others"] == 2
    assert loaded.evidence["fetch_ms_per_batch"] < WORKER_HANDOFF_MS and loaded.evidence["workers_speedup_up_to"] == 1
    assert "not more workers: a batch takes about 1.5 ms to make without the profiler (4 a step; on a core: the " \
        "process ran 10% of the time it wanted one)" in loaded.fix and loaded.fix.startswith("make __getitem__ cheap")
    # idle, the profiled fetch (3.6 ms a batch) would pay; scaled to the un-profiled step and its time on a core
    # (83%) it is 1.1 ms: it would not
    idle = plan(_HF_IDLE, wait_ms=14.25, step_ms=27.74, batches_per_step=4.0, unprofiled_ratio=ratio)
    assert round(idle.evidence["fetch_ms_per_batch"], 2) == 1.12 < WORKER_HANDOFF_MS
    assert "not more workers: a batch takes about 1.1 ms to make without the profiler (4 a step" in idle.fix
    assert "cores_held_by_others" not in idle.evidence  # no contention measured
    unscaled = plan(_HF_IDLE, wait_ms=14.25, step_ms=27.74, batches_per_step=4.0)
    assert unscaled.fix.startswith("DataLoader(num_workers=2,")  # without the baseline: today's advice
    # load is no veto: a fetch that sleeps (or makes costly batches) while the main thread waits gets workers, which
    # run on the main thread's idle core and take a share of the cores of their own (mnist_rnn, loaded: 0 -> 1 2.8x)
    starved = plan(_STARVED_LOADED, wait_ms=66.4, step_ms=74.8)
    assert "or DataLoader(num_workers=2," in starved.fix and "not more workers" not in starved.fix
    assert "where a core is free: at the capture the process ran 12% of the time it wanted a core (load 20.9 on 2)" \
        in starved.fix and "time it" in starved.fix
    assert starved.evidence["workers_speedup_up_to"] > 2 and starved.evidence["fetch_ms_per_batch"] > 8
    # a sleeping fetch that got its core: the workers lead as before (the starving loop's 1.7x)
    idle_sleep = plan({**_STARVED_LOADED, "load_avg_1m": 0.8, "run_queue_wait_s": 0.002}, wait_ms=32.0, step_ms=36.5)
    assert idle_sleep.fix.startswith("make __getitem__ cheap") and "or DataLoader(num_workers=2," in idle_sleep.fix
    assert "not more workers" not in idle_sleep.fix


def test_dataloader_evidence_names_the_workers_gain_once(tmp_path):
    """The demo's case (1 thread, 2 cores, the fetch most of the step): one key for the workers' gain, read once."""
    from skalpel.job.report_of import report_of
    from skalpel.report.evidence import evidence_text
    from skalpel.result.report import CaptureInfo

    builder = TraceBuilder()
    step, wait = 36_500.0, 30_300.0
    for number in range(5):
        start = number * step
        builder.step(number + 1, start, step - 1)
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 1, wait)
        builder.host("aten::mm", start + wait + 10, step - wait - 100)
    capture = CaptureInfo(warmup_steps=2, active_steps=5, cpu=_cpu(intra_op_threads=1))
    report = report_of(builder.write(tmp_path / "trace.json"), capture=capture).report
    (finding,) = [finding for finding in report.findings if finding.id == "dataloader_bound"]
    assert [key for key in finding.evidence if "workers_speedup" in key] == ["workers_speedup_up_to"]
    text = evidence_text(finding.evidence)
    assert text.count("workers speedup") == 1 and "workers speedup up to 2.41" in text
    assert "DataLoader(num_workers=2," in finding.fix


def _fetch_in_a_starved_step(tmp_path, run_queue_wait_s: float, load: float):
    """Four 631 ms steps whose in-process fetch holds 37 ms of the wall time and 19% of the process's CPU (the
    cheap_tokens look-alike beside busy loops at load 12: the scheduler stretched the compute more than the fetch)."""
    from skalpel.job.report_of import report_of
    from skalpel.result.report import CaptureInfo

    builder = TraceBuilder()
    step, wait = 631_000.0, 37_000.0
    for number in range(4):
        start = number * step
        builder.step(number + 1, start, step - 1)
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 1, wait)
        builder.host("aten::mm", start + wait + 10, step - wait - 100)
    cpu = _cpu(cpu_s=0.2893, wall_s=2.5781, steps=4, load_avg_1m=load, run_queue_wait_s=run_queue_wait_s,
               loader_batches=32, loader_fetch_cpu_s=0.054301, unprofiled_loader_batches=8,
               unprofiled_loader_fetch_cpu_s=0.009494)  # fmt: skip
    report = report_of(builder.write(tmp_path / "trace.json"), capture=CaptureInfo(warmup_steps=1, active_steps=4,
                                                                                  cpu=cpu)).report  # fmt: skip
    return [finding for finding in report.findings if finding.id == "dataloader_bound"]


def test_under_contention_the_fetch_is_judged_on_cpu_time(tmp_path):
    """A wall-time share under contention says where the scheduler preempted: the fetch that made 19% of the work held
    6% of the wall time, under dataloader_bound's 10%. Under measured contention it is judged on CPU time too; on a
    quiet machine (no contention) the wall share stands alone."""
    (starved,) = _fetch_in_a_starved_step(tmp_path, run_queue_wait_s=2.3149, load=12.39)
    assert starved.evidence["share_pct"] == pytest.approx(18.77, abs=0.05)
    assert starved.evidence["wall_share_pct"] == pytest.approx(5.9, abs=0.2)
    assert starved.evidence["share_of"] == "CPU time (under contention)"
    assert starved.title.startswith("Making the batches takes 19% of the process's CPU time (37.0 ms of the")
    # the fix weighs the fetch by the same share: a cheap __getitem__ saves up to 1 / (1 - 19%), and workers are not
    # advised for batches of ~1.2 ms (thread CPU, un-profiled), under a hand-over
    assert starved.evidence["cheap_items_speedup_up_to"] == pytest.approx(1 / (1 - 0.1877), abs=0.01)
    assert starved.evidence["workers_speedup_up_to"] == 1.0 and "not more workers: a batch takes about 1.2 ms" in starved.fix
    assert "the fetch is 19% of the process's CPU time, ~118.4 ms of the 631.0 ms mean step" in starved.fix
    # the same facts without the contention: the CPU share is not read, and 6% of the wall is no finding
    assert _fetch_in_a_starved_step(tmp_path, run_queue_wait_s=0.001, load=0.5) == []


def test_loader_oversubscribed_named_only_past_the_cores(tmp_path):
    crowded = _with_capture(tmp_path, cpu=_cpu(intra_op_threads=2, loader_workers=4)).findings
    found = [finding for finding in crowded if finding.id == "loader_oversubscribed"]
    assert len(found) == 1 and found[0].evidence["threads_asked"] == 6
    assert "num_workers=0" in found[0].fix and "set_num_threads(1)" in found[0].fix
    # the advice follows its own condition (issue 35): workers hide a batch cheaper to make than the compute; no
    # workers only where a batch is cheaper to make than a worker's hand-over
    assert "num_workers=0 only where a batch takes less to make than a worker takes to hand one over" in found[0].fix
    assert "hide the making of a batch behind the" in found[0].fix
    assert "num_workers=0 where a batch takes less to make than the" not in found[0].fix
    # the numbers are the plan skalpel tune's fewer_workers times (cores.workers_that_fit)
    from skalpel.cores import workers_that_fit

    assert workers_that_fit(4, 2, 2) == (1, 1) and found[0].fix.startswith("num_workers=1 with torch.set_num_threads(1)")
    fitting = _with_capture(tmp_path, cpu=_cpu(intra_op_threads=1, loader_workers=1)).findings
    assert not [finding for finding in fitting if finding.id == "loader_oversubscribed"]
    assert not [f for f in _with_capture(tmp_path).findings if f.id == "loader_oversubscribed"]  # no facts


def test_empty_or_tiny_steps_are_defects_left_out_and_said(tmp_path):
    from skalpel.job.report_of import report_of

    builder = TraceBuilder()
    ts = 0
    for number in range(6):
        length = 200 if number in (1, 3) else STEP_US  # a GAN's second optimizer marked twice per iteration
        builder.step(number + 1, ts, length - 1)
        if number != 3:  # step 4 has no op at all
            for op in range(1 if number == 1 else 4):  # step 2 has one op where the others have four
                builder.host("aten::mm", ts + 10 + op * length / 4, length / 4 - 50)
        ts += length
    report = report_of(builder.write(tmp_path / "trace.json")).report
    assert report.steps.count == 4
    assert min(report.ranks[0].step_ms) >= STEP_US / 1000 * 0.9
    assert any("2 step(s) left out as measurement defects" in warning for warning in report.warnings)


# ---- advice that fits the machine: a CPU-only trace gets no GPU fixes ------------------------------


def test_dataloader_fix_pins_memory_only_with_a_device():
    from skalpel.diagnose.input import worker_advice

    assert "pin_memory=True" in worker_advice({"cores_available": 8})
    assert "pin_memory" not in worker_advice({"cores_available": 8}, device=False)
    assert "pin_memory" not in worker_advice(None, device=False)


def test_cpu_framework_overhead_fix_has_no_cuda_graphs(tmp_path):
    builder = TraceBuilder()
    builder.device_properties = []
    for number in range(5):
        start = number * STEP_US
        builder.step(number + 1, start, STEP_US - 1)
        for i in range(1000):  # a thousand 3 us ops per step, and nothing substantial
            builder.host("aten::add", start + 5 + i * 9, 3)
    finding = next(f for f in analyze(builder.write(tmp_path / "trace.json")).findings if f.id == "launch_bound")
    assert "Framework overhead" in finding.title
    assert "torch.compile" in finding.fix and "CUDA graph" not in finding.fix and "reduce-overhead" not in finding.fix


def test_too_few_steps_with_enough_asked_for_says_where_they_went(tmp_path):
    from skalpel.job.report_of import report_of
    from skalpel.result.report import CaptureInfo

    builder = TraceBuilder()
    for number in range(2):  # 5 asked for, 2 in the trace (the recording stopped early)
        builder.step(number + 1, number * STEP_US, STEP_US - 1)
        builder.host("aten::mm", number * STEP_US + 10, 9000)
    report = report_of(builder.write(tmp_path / "trace.json"), capture=CaptureInfo(warmup_steps=2, active_steps=5)).report
    finding = next(f for f in report.findings if f.id == "too_few_steps")
    assert "--active 5" not in finding.fix and "--active 10" in finding.fix
    assert "5 active steps were asked for and 2 analysed" in finding.fix
    asked_too_few = report_of(tmp_path / "trace.json", capture=CaptureInfo(warmup_steps=2, active_steps=2)).report
    assert "--active 5" in next(f for f in asked_too_few.findings if f.id == "too_few_steps").fix


# ---- verdicts near a threshold say so (issue 21 class 5) ------------------------------------------


@pytest.mark.parametrize(("wait_us", "borderline"), [(5_100.0, True), (8_000.0, False)])
def test_a_share_just_past_its_threshold_is_borderline(tmp_path, wait_us, borderline):
    """dataloader_bound fires at 10% of the step: 10.2% says borderline, 16% does not."""
    builder = TraceBuilder()
    step = 50_000.0
    for number in range(5):
        start = number * step
        builder.step(number + 1, start, step - 1)
        builder.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 1, wait_us)
        builder.host("aten::mm", start + wait_us + 10, step - wait_us - 100)
    (finding,), _ = _findings(builder, tmp_path, "dataloader_bound")
    assert ("borderline" in finding.evidence) is borderline
    assert ("(borderline: 10.2% against 10%)" in finding.title) is borderline


def test_launch_bound_names_the_fix_of_every_large_source_of_tiny_ops():
    """A CPU loop of 1,732 ops a step: the model 44%, the optimizer 32%, the loader 24% of the tiny ops. The
    optimizer's fused=True saved 16% of the step and whole batches 8% (both 23%, 8.34 -> 6.42 ms), while the fix
    named only the model's; a source under ``also_named_pct`` stays out."""
    import numpy as np

    from skalpel.analysis.op_sources import DATA, MODEL, OPTIMIZER, OpSource
    from skalpel.diagnose.overhead import CPU_FIX, source_fix
    from skalpel.diagnose.thresholds import LAUNCH_BOUND

    also = LAUNCH_BOUND.param("also_named_pct")
    ops = np.arange(3)
    sources = (OpSource(MODEL, 43.6, ops[:1]), OpSource(OPTIMIZER, 32.2, ops[1:2]), OpSource(DATA, 24.2, ops[2:]))
    fix, events = source_fix(sources, CPU_FIX, also)
    assert fix.startswith(f"44% of the tiny ops come from the {MODEL}: {CPU_FIX}") and events.tolist() == [0]
    assert "32% of the tiny ops come from the optimizer step" in fix and "fused=True" in fix
    assert "24% of the tiny ops come from the data loading" in fix and "whole batches" in fix
    alone, _ = source_fix((OpSource(MODEL, 100 - also + 1, ops), OpSource(OPTIMIZER, also - 1, ops)), CPU_FIX, also)
    assert alone == CPU_FIX
    led, _ = source_fix((OpSource(DATA, 65.0, ops), OpSource(MODEL, 35.0, ops)), CPU_FIX, also)
    assert led.startswith("65% of the tiny ops come from the data loading") and led.endswith(CPU_FIX)


def test_worker_advice_reasons_from_the_wait_the_batch_and_the_cores():
    """The decision over the measured numbers: the main thread waits for data with a core idle -> workers, loaded
    machine or not; it computes the whole step -> no workers, said with the gain; cheap batches -> no workers."""
    from skalpel.diagnose.input import loader_plan

    plan = functools.partial(loader_plan, single=True, device=False, min_speedup=1.1, batches_per_step=1.0)
    # a costly __getitem__ (20 ms a batch) at load 3 on 2 cores: the process waited for a core 30% of the time
    loaded = {**_cpu(cpu_s=0.14, wall_s=0.2, load_avg_1m=3.0, run_queue_wait_s=0.06)}
    costly = plan(loaded, wait_ms=28.0, step_ms=40.0)
    assert "DataLoader(num_workers=2," in costly.fix and "not more workers" not in costly.fix
    assert costly.evidence["workers_speedup_up_to"] == pytest.approx(40.0 / 14.0)
    assert costly.evidence["fetch_ms_per_batch"] == pytest.approx(28.0 * 0.7)
    # the same loader with the step all compute: workers cannot hide more than the 2 ms the step waits
    busy = plan(loaded, wait_ms=2.0, step_ms=40.0)
    assert "not more workers: DataLoader(num_workers=2," in busy.fix and "about 1.05x" in busy.fix
    # one core: the main thread's core is the only one, and it makes the batch itself
    one = plan({**loaded, "cores_available": 1}, wait_ms=28.0, step_ms=40.0)
    assert "with 1 usable core" in one.fix and one.evidence["workers_speedup_up_to"] == 1.0
    # cheap batches (0.4 ms each, 4 a step): a hand-over costs more than the making
    cheap = plan(_cpu(), wait_ms=1.6, step_ms=3.0, batches_per_step=4.0)
    assert "not more workers: a batch takes about 0.4 ms to make (4 a step)" in cheap.fix
    # workers already many more than the cores: the advice cuts them (no more workers)
    many = loader_plan(_cpu(loader_workers=8), wait_ms=1.0, step_ms=3.0, single=False, device=False, min_speedup=1.1)
    assert "its 8 worker(s) and 1 intra-op thread(s) already ask for more than the 2 usable cores" in many.fix
    assert "more workers" not in many.fix


def test_no_workers_only_where_the_wait_outweighs_making_the_batch_in_process():
    """cpu.cheap_batches: num_workers=0 where the step waits longer for a batch than a worker's CPU a batch less its
    side of the hand-over (cores.WORKER_SIDE_HANDOFF_MS). Figures measured on the look-alikes and makemore."""
    from skalpel.cores import WORKER_SIDE_HANDOFF_MS
    from skalpel.diagnose.cpu import cheap_batches

    cheap = cheap_batches((1.31, 16), 8.17)  # TensorDataset batches, 4 workers on 2 cores: 4 -> 0 4.3x
    assert cheap is not None and cheap.startswith("num_workers=0: the step waits 8.17 ms") and "16 batches" in cheap
    assert cheap_batches((2.0, 5), 1.71) is not None  # makemore: ~1.25 ms to make in process < 1.71 (4 -> 0 1.08x)
    assert cheap_batches((10.5, 60), 3.0) is None  # a costly __getitem__: the workers hide it
    assert cheap_batches((1.71 + WORKER_SIDE_HANDOFF_MS + 0.01, 5), 1.71) is None  # just past the line
    assert cheap_batches(None, 8.0) is None  # not measured: no advice from it


def test_no_workers_weighs_the_batch_in_wall_time_at_the_contention_measured():
    """A worker's cost is CPU time, the step's wait wall time: under contention the process would wait for a core
    while making the batch too. Chain 7's figures (4 workers for ~10 ms batches, load 7.3): 16.83 ms of a worker's
    CPU a batch against a 19.74 ms wait, the process waiting for a core 82% of the time. Compared CPU with wall, it
    advised num_workers=0; made in the process, a batch would take ~89 ms of wall time."""
    from skalpel.cores import WORKER_HANDOFF_MS, WORKER_SIDE_HANDOFF_MS
    from skalpel.diagnose.cpu import cheap_batches, in_process_ms_per_batch

    chain7 = (16.83, 120)
    assert cheap_batches(chain7, 19.74) is not None  # the CPU cost alone: 16.08 x 1.2 < 19.74
    assert cheap_batches(chain7, 19.74, waiting_pct=82.0) is None
    assert 85 < in_process_ms_per_batch(chain7, 82.0) < 95
    # the same batch on a quiet machine, where the wait does pass its cost: still advised
    quiet = cheap_batches(chain7, 25.0, waiting_pct=5.0)
    assert quiet is not None and "~16.93 ms of wall time at the contention measured" in quiet and "5% of the time" in quiet
    # batches about a hand-over's cost are not stretched: the workers spend as much CPU handing them over as making
    # them (TensorDataset batches read 1.3 ms of a worker's CPU quiet, up to 2.8 ms beside busy loops: 4 -> 0 4.3x)
    for tensor_dataset in ((1.31, 16), (2.8, 16)):
        made = tensor_dataset[0] - WORKER_SIDE_HANDOFF_MS
        assert in_process_ms_per_batch(tensor_dataset, 90.0) == pytest.approx(made) and made <= 2 * WORKER_HANDOFF_MS
        cheap = cheap_batches(tensor_dataset, 8.17, waiting_pct=90.0)
        assert cheap is not None and "wall time at the contention" not in cheap
    # past two hand-overs the batch is real work, made on a core the process waits for
    assert in_process_ms_per_batch((2 * WORKER_HANDOFF_MS + WORKER_SIDE_HANDOFF_MS + 1.0, 16), 50.0) == pytest.approx(
        2 * (2 * WORKER_HANDOFF_MS + 1.0))
