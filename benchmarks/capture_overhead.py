"""skalpel's capture overhead against bare torch.profiler with the same settings, on the same loop.

Both capture the same training loop (a small MLP, synthetic batches, one thread) with the
same profiler arguments and schedule, and export the trace as .json.gz; skalpel adds its
step clock, header keys and window bookkeeping. Each repeat runs both, in alternating
order, in this one process; the figure is the median over repeats of each capture's
median recorded-step time, and of its whole capture time (start to trace on disk). Time
is this thread's CPU time (``time.thread_time``): on a shared, loaded machine wall time
mostly measures the other processes; ``--clock wall`` measures wall time instead. The
analysis (report, flame graph) is not part of capture and is not timed here.

    .venv/bin/python benchmarks/capture_overhead.py [--repeats 7] [--active 40] [--batch 32] [--loop large]

Target: skalpel / bare within 5% (ratio <= 1.05).

A third capture runs the loop as ``skalpel run`` does (steps found by the detector's hooks,
not by ``run.step()``), and its reported overhead (recorded steps against the un-profiled
steps skalpel times after the window, wall clock) is checked against an independent
measurement: the same loop timed alone, with no profiler and no skalpel, in its own
process. Both are printed with their noise. Then the loop runs as a script under the real
`skalpel run`: its reported overhead, and its un-profiled baseline against the loop timed
alone. ``--loop large`` gives the loop 8 MiB activations, where glibc's mmap threshold
decides whether every step page-faults them; a baseline faster than the loop alone would be
the allocator's doing (``capture/malloc.py`` holds the threshold for the whole run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from skalpel.capture.runner import _Capture
from skalpel.capture.session import ProfileRun
from skalpel.capture.settings import CaptureSettings, profiler_kwargs, torch_schedule


def make_loop(seed: int = 0):
    torch.manual_seed(seed)
    if LOOP == "large":  # activations of 8 MiB (1024 x 2048 floats): above glibc's first mmap threshold
        model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))) for _ in range(8)]

    def step(index: int) -> None:
        x, y = batches[index % len(batches)]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


CLOCK = time.thread_time
LOOP = "mlp"  # --loop: "large" gives the loop activations of several MiB, which glibc's mmap threshold decides on
BATCH = 64  # --batch: larger batches give longer steps, where the wall clock is steadier


def run_bare(settings: CaptureSettings, folder: Path) -> tuple[list[float], float]:
    step = make_loop()
    path = folder / "bare.json.gz"
    times: list[float] = []
    began = CLOCK()
    prof = torch.profiler.profile(
        schedule=torch_schedule(settings), on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        **profiler_kwargs(settings),
    )  # fmt: skip
    prof.start()
    for index in range(settings.total_steps):
        start = CLOCK()
        step(index)
        prof.step()
        times.append(CLOCK() - start)
    prof.stop()
    total = CLOCK() - began
    return _recorded(times, settings), total


def run_skalpel(settings: CaptureSettings, folder: Path) -> tuple[list[float], float]:
    step = make_loop()
    times: list[float] = []
    began = CLOCK()
    run = ProfileRun(settings, out=folder / "skalpel", name="bench", write=False)
    with run:
        for index in range(settings.total_steps):
            start = CLOCK()
            step(index)
            run.step()
            times.append(CLOCK() - start)
    total = CLOCK() - began
    assert run.trace_paths, "skalpel wrote no trace"
    return _recorded(times, settings), total


def run_detected(settings: CaptureSettings, folder: Path) -> tuple[list[float], float, float | None, float | None]:
    """The loop as `skalpel run` drives it: the detector's hooks mark the steps (optimizer.zero_grad here).

    Returns the recorded steps' times (CLOCK), its profiled step (wall) and the overhead it reports with its noise.
    """
    step = make_loop()
    run = ProfileRun(settings, out=folder / "detected", name="bench", write=False, auto=True)
    capture = _Capture(run, stop_after_capture=False, step_timeout_s=0)
    stamps: list[float] = []
    with capture.installed():
        for index in range(settings.total_steps + run.baseline_steps + 3):
            stamps.append(CLOCK())
            step(index)
    run.stop()
    assert run.trace_paths, "skalpel wrote no trace"
    info = run.capture_info()
    # the boundary of iteration i is taken in its zero_grad: iteration i+1 is profiler step i
    times = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    recorded = [t for number, t in enumerate(times) if settings.phase(number) and settings.phase(number)[1] == "active"]
    return recorded[:-1], info.profiled_step_ms or 0.0, info.overhead_pct, info.overhead_noise_pct


def time_alone(steps: int) -> list[float]:
    """The same loop in a fresh process, no profiler, no skalpel: wall ms of its steady steps."""
    command = [sys.executable, __file__, "--alone", str(steps), "--batch", str(BATCH), "--loop", LOOP]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def _alone(steps: int) -> None:
    torch.set_num_threads(1)
    step = make_loop()
    times = []
    for index in range(steps):
        start = time.perf_counter()
        step(index)
        times.append((time.perf_counter() - start) * 1000.0)
    print(json.dumps(times[steps // 3 :]))  # steady state: past the first iterations


RUN_SCRIPT = """
import sys
sys.path.insert(0, {folder!r})
import capture_overhead as bench
bench.LOOP, bench.BATCH = {loop!r}, {batch}
import torch
torch.set_num_threads(1)
step = bench.make_loop()
for index in range({steps}):
    step(index)
"""


def through_skalpel_run(folder: Path, steps: int = 40) -> dict:
    """The loop as a script under the real `skalpel run` (a process of its own): the capture facts it reports."""
    script = folder / "loop.py"
    script.write_text(RUN_SCRIPT.format(folder=str(Path(__file__).resolve().parent), loop=LOOP, batch=BATCH, steps=steps))
    out = folder / "run"
    command = [sys.executable, "-m", "skalpel", "run", "--warmup", "2", "--active", "10", "--out", str(out), str(script)]
    subprocess.run(command, capture_output=True, text=True, check=True)
    capture = json.loads((out / "report.json").read_text())["capture"]
    return {key: capture.get(key) for key in ("overhead_pct", "overhead_noise_pct", "profiled_step_ms",
                                              "unprofiled_step_ms")}  # fmt: skip


def _spread(values: list[float]) -> float:
    """Half the range between the quartiles: the noise of a median over repeats."""
    if len(values) < 2:
        return float("nan")
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2.0


def step_call_cost_us(settings: CaptureSettings, folder: Path, steps: int = 150) -> tuple[float, float]:
    """Median cost of one ``prof.step()`` and of one ``run.step()`` inside a recording window."""
    long_window = CaptureSettings(wait=0, warmup=1, active=steps + 10)
    x = torch.randn(64, 64)
    prof = torch.profiler.profile(schedule=torch_schedule(long_window), on_trace_ready=lambda p: None,
                                  **profiler_kwargs(settings))  # fmt: skip
    run = ProfileRun(long_window, out=folder / "calls", name="calls", write=False)
    costs: dict[str, list[float]] = {"bare": [], "skalpel": []}
    for name, marker in (("bare", prof), ("skalpel", run)):
        prof.start() if marker is prof else run.start()
        for _ in range(steps):
            torch.mm(x, x)
            start = CLOCK()
            marker.step()
            costs[name].append(CLOCK() - start)
        prof.stop() if marker is prof else run._prof.stop()
    return tuple(statistics.median(costs[name][5:]) * 1e6 for name in ("bare", "skalpel"))  # type: ignore[return-value]


def _recorded(times: list[float], settings: CaptureSettings) -> list[float]:
    """The step times of the recorded steps, excluding the last one (it carries the export)."""
    recorded = [seconds for index, seconds in enumerate(times) if settings.phase(index) and settings.phase(index)[1] == "active"]
    return recorded[:-1]


def main(argv: list[str] | None = None) -> int:
    global CLOCK, BATCH, LOOP
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--active", type=int, default=40, help="recorded steps per capture (default 40: shorter windows are mostly noise)")
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per step (default 64: a step of a few ms)")
    parser.add_argument("--loop", choices=("mlp", "large"), default="mlp",
                        help="the loop: a small MLP (default) or one with 8 MiB activations (glibc's mmap threshold)")
    parser.add_argument("--alone", type=int, default=0, help=argparse.SUPPRESS)  # internal: time the loop alone
    args = parser.parse_args(argv)
    BATCH, LOOP = args.batch, args.loop
    if args.alone:
        _alone(args.alone)
        return 0
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(1)
    settings = CaptureSettings(active=args.active)
    step_ms: dict[str, list[float]] = {"bare": [], "skalpel": []}
    total_s: dict[str, list[float]] = {"bare": [], "skalpel": []}
    runners = {"bare": run_bare, "skalpel": run_skalpel}
    detected_ms: list[float] = []
    reported: list[tuple[float, float]] = []
    independent: list[float] = []
    run_facts: list[tuple[dict, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        bare_call, ours_call = step_call_cost_us(settings, Path(tmp))
        run_bare(settings, Path(tmp))  # warm both paths once (lazy init, first export)
        run_skalpel(settings, Path(tmp))
        for repeat in range(args.repeats):
            order = ("bare", "skalpel") if repeat % 2 == 0 else ("skalpel", "bare")
            for name in order:
                recorded, total = runners[name](settings, Path(tmp))
                step_ms[name].append(statistics.median(recorded) * 1000.0)
                total_s[name].append(total)
            recorded, profiled_ms, overhead, noise = run_detected(settings, Path(tmp))
            step_ms.setdefault("skalpel run", []).append(statistics.median(recorded) * 1000.0)
            alone_ms = statistics.median(time_alone(60))
            detected_ms.append(profiled_ms)
            if overhead is not None:
                reported.append((overhead, noise if noise is not None else float("nan")))
            independent.append((profiled_ms / alone_ms - 1.0) * 100.0)
            run_facts.append((through_skalpel_run(Path(tmp)), statistics.median(time_alone(60))))
    bare_step, ours_step = statistics.median(step_ms["bare"]), statistics.median(step_ms["skalpel"])
    bare_total, ours_total = statistics.median(total_s["bare"]), statistics.median(total_s["skalpel"])
    print(f"settings: wait {settings.wait}, warm-up {settings.warmup}, active {settings.active}; "
          f"{args.repeats} repeats, batch {BATCH}, torch {torch.__version__}, 1 thread, {args.clock} clock")  # fmt: skip
    print(f"recorded step, median ms:  bare torch.profiler {bare_step:.3f}   skalpel {ours_step:.3f}   "
          f"ratio {ours_step / bare_step:.3f}")  # fmt: skip
    print(f"whole capture, median s:   bare torch.profiler {bare_total:.3f}   skalpel {ours_total:.3f}   "
          f"ratio {ours_total / bare_total:.3f}")  # fmt: skip
    print(f"one step() call while recording, median us:  prof.step() {bare_call:.1f}   run.step() {ours_call:.1f}")
    run_step = statistics.median(step_ms["skalpel run"])
    print(f"recorded step, median ms:  skalpel run path (step hooks, line sampler) {run_step:.3f}   "
          f"ratio to bare {run_step / bare_step:.3f}")  # fmt: skip
    if reported:
        overheads = [value for value, _ in reported]
        print(f"profiler overhead as skalpel run reports it (wall clock): median {statistics.median(overheads):+.1f}% "
              f"(its own noise band, median over repeats: +-{statistics.median(n for _, n in reported):.1f}%; "
              f"spread over repeats +-{_spread(overheads):.1f}%)")  # fmt: skip
    print(f"independent: profiled step {statistics.median(detected_ms):.3f} ms against the same loop alone in its own "
          f"process: median {statistics.median(independent):+.1f}% (spread over repeats +-{_spread(independent):.1f}%)")
    # The real `skalpel run`: its reported overhead, and its un-profiled baseline against the loop timed alone (a
    # baseline faster than the loop alone is the allocator's doing: glibc's mmap threshold raised by the profiler)
    reported_run = [facts["overhead_pct"] for facts, _ in run_facts if facts["overhead_pct"] is not None]
    baseline_vs_alone = [(facts["unprofiled_step_ms"] / alone - 1.0) * 100.0 for facts, alone in run_facts
                         if facts["unprofiled_step_ms"]]  # fmt: skip
    profiled_vs_alone = [(facts["profiled_step_ms"] / alone - 1.0) * 100.0 for facts, alone in run_facts
                         if facts["profiled_step_ms"]]  # fmt: skip
    if reported_run and baseline_vs_alone:
        print(f"skalpel run ({LOOP} loop): reported overhead median {statistics.median(reported_run):+.1f}%; "
              f"its un-profiled baseline against the loop alone {statistics.median(baseline_vs_alone):+.1f}%; "
              f"its profiled step against the loop alone {statistics.median(profiled_vs_alone):+.1f}% "
              f"(spread over repeats +-{_spread(profiled_vs_alone):.1f}%)")  # fmt: skip
    # Each repeat runs bare and skalpel back to back: the ratio within a repeat cancels the machine's drift.
    paired = [ours / bare for ours, bare in zip(step_ms["skalpel"], step_ms["bare"])]
    paired_run = [ours / bare for ours, bare in zip(step_ms["skalpel run"], step_ms["bare"])]
    print(f"paired ratio to bare, median over repeats:  skalpel {statistics.median(paired):.3f} (+-{_spread(paired):.3f})   "
          f"skalpel run path {statistics.median(paired_run):.3f} (+-{_spread(paired_run):.3f})")  # fmt: skip
    own_us = ours_call - bare_call
    print(f"skalpel's own work per step (run.step() - prof.step()): {own_us:+.1f} us = "
          f"{own_us / (bare_step * 1000.0) * 100:+.2f}% of a {bare_step:.2f} ms step")  # fmt: skip
    ratio = statistics.median(paired)
    verdict = "within" if ratio <= 1.05 else "OVER"
    print(f"skalpel capture overhead on recorded steps: {(ratio - 1) * 100:+.1f}% ({verdict} the 5% target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
