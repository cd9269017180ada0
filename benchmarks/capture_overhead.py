"""skalpel's capture overhead against bare torch.profiler with the same settings, on the same loop.

Both capture the same training loop (a small MLP, synthetic batches, one thread) with the
same profiler arguments and schedule, and export the trace as .json.gz; skalpel adds its
step clock, header keys and window bookkeeping. Each repeat runs both, in alternating
order, in this one process; the figure is the median over repeats of each capture's
median recorded-step time, and of its whole capture time (start to trace on disk). Time
is this thread's CPU time (``time.thread_time``): on a shared, loaded machine wall time
mostly measures the other processes; ``--clock wall`` measures wall time instead. The
analysis (report, flame graph) is not part of capture and is not timed here.

    .venv/bin/python benchmarks/capture_overhead.py [--repeats 7] [--active 10]

Target: skalpel / bare within 5% (ratio <= 1.05).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from skalpel.capture.session import ProfileRun
from skalpel.capture.settings import CaptureSettings, profiler_kwargs, torch_schedule


def make_loop(seed: int = 0):
    torch.manual_seed(seed)
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
    global CLOCK, BATCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--active", type=int, default=10)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per step (default 64: a step of a few ms)")
    args = parser.parse_args(argv)
    BATCH = args.batch
    CLOCK = time.thread_time if args.clock == "thread" else time.perf_counter
    torch.set_num_threads(1)
    settings = CaptureSettings(active=args.active)
    step_ms: dict[str, list[float]] = {"bare": [], "skalpel": []}
    total_s: dict[str, list[float]] = {"bare": [], "skalpel": []}
    runners = {"bare": run_bare, "skalpel": run_skalpel}
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
    bare_step, ours_step = statistics.median(step_ms["bare"]), statistics.median(step_ms["skalpel"])
    bare_total, ours_total = statistics.median(total_s["bare"]), statistics.median(total_s["skalpel"])
    print(f"settings: wait {settings.wait}, warm-up {settings.warmup}, active {settings.active}; "
          f"{args.repeats} repeats, batch {BATCH}, torch {torch.__version__}, 1 thread, {args.clock} clock")  # fmt: skip
    print(f"recorded step, median ms:  bare torch.profiler {bare_step:.3f}   skalpel {ours_step:.3f}   "
          f"ratio {ours_step / bare_step:.3f}")  # fmt: skip
    print(f"whole capture, median s:   bare torch.profiler {bare_total:.3f}   skalpel {ours_total:.3f}   "
          f"ratio {ours_total / bare_total:.3f}")  # fmt: skip
    print(f"one step() call while recording, median us:  prof.step() {bare_call:.1f}   run.step() {ours_call:.1f}")
    verdict = "within" if ours_step / bare_step <= 1.05 else "OVER"
    print(f"skalpel capture overhead on recorded steps: {(ours_step / bare_step - 1) * 100:+.1f}% ({verdict} the 5% target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
