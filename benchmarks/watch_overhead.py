"""skalpel watch's cost per step: the same training loop bare and watched, on 1 ms, 10 ms and 100 ms steps.

The loop is a real one (a DataLoader, a small model, backward, SGD), padded to the step
length with matmuls on this thread's CPU clock, with one thread (``torch.set_num_threads(1)``).
Blocks of bare and watched steps alternate in this one process (``--rounds`` of each, per
step length); a watched block runs inside ``skalpel.watch(capture=False)`` (step detection,
the per-step probe, the store's writer thread and the anomaly judge: everything but a
capture, which a quiet loop never takes). Each block's figure is its median step; each round
compares its watched block with its own bare one (the order of the two turning every round),
and the overhead is the median of those ratios, with their quartiles. The clock is the process's CPU time
(every thread: the writer's work counts), since on a shared, loaded machine wall time mostly
measures the other processes; ``--clock wall`` measures wall time instead. ``--clock thread``
is the training thread's CPU time alone (the steps' cost, not the writer's). ``writer`` is the CPU
time of the process's other threads (the store's writer) during a watched block, per step. The
writer polls about every 64 steps (no more often than every 200 ms, at least once a second) and a
poll costs 150-200 us of CPU however few steps it takes, so on long steps, and on a loaded
machine where each step lasts longer, more of that falls on each step. A poll's work lands on one
or two steps, which the median mostly leaves out: the process clock's median is close to the
training thread's cost, and the writer column is its average share on top.

    .venv/bin/python benchmarks/watch_overhead.py [--rounds 5] [--clock process]

Target: within 1% on 10 ms steps, 3% on 1 ms steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import skalpel

STEPS = {1.0: 400, 10.0: 100, 100.0: 20}  # steps per block, per step length (ms)


def loop(step_ms: float, steps: int, clock) -> list[float]:
    """``steps`` iterations of a tiny training loop padded to ``step_ms`` of CPU; each one's time on ``clock``."""
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps + 1, 16))
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    pad = torch.randn(32, 32)
    times = []
    last = clock()
    for (x,) in loader:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        began = time.thread_time()
        while time.thread_time() - began < step_ms / 1e3:
            torch.mm(pad, pad)
        now = clock()
        times.append(now - last)
        last = now
    return times[1:]  # the first holds the loader's start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="bare and watched blocks per step length (5)")
    parser.add_argument("--clock", choices=("process", "thread", "wall"), default="process",
                        help="process CPU time, the training thread's CPU time, or wall time")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = {"process": time.process_time, "thread": time.thread_time, "wall": time.perf_counter}[args.clock]
    print(f"{'step':>8} {'bare':>10} {'watched':>10} {'overhead':>9} {'quartiles':>15} {'per step':>9} {'writer':>9}  (median of "
          f"{args.rounds} rounds, {args.clock} clock; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for step_ms, steps in STEPS.items():
            bare, watched, writer = [], [], []
            for number in range(args.rounds):
                # the order turns each round: whichever block runs second in a round ran measurably slower or
                # faster (a warmer or a more fragmented heap), which the fixed order took for the watch's cost
                for kind in ("bare", "watched") if number % 2 == 0 else ("watched", "bare"):
                    if kind == "bare":
                        bare.append(statistics.median(loop(step_ms, steps, clock)))
                        continue
                    with skalpel.watch(out=Path(folder) / f"{step_ms:g}-{number}", capture=False):
                        others = time.process_time() - time.thread_time()  # every thread but this one: the writer
                        watched.append(statistics.median(loop(step_ms, steps, clock)))
                        writer.append((time.process_time() - time.thread_time() - others) / steps)
            # each round's watched block against its own bare one: the machine's drift between rounds cancels
            ratios = sorted(two / one - 1 for one, two in zip(bare, watched))
            one, two = statistics.median(bare), statistics.median(watched)
            low, high = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
            print(f"{step_ms:>6g}ms {one * 1e3:>8.3f}ms {two * 1e3:>8.3f}ms {statistics.median(ratios) * 100:>+8.2f}% "
                  f"{low * 100:>+6.2f}..{high * 100:+.2f}% {(two - one) * 1e6:>+6.0f} us "
                  f"{statistics.median(writer) * 1e6:>6.0f} us")  # fmt: skip

if __name__ == "__main__":
    main()
