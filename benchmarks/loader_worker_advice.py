"""Re-time the worker advice of tests/test_capture_loader_advice.py's look-alikes: each setting in a fresh interpreter.

(a) a costly Python ``__getitem__`` with ``num_workers=0`` (``dataloader_bound`` advises 2 workers, one per core);
(b) its twin, 4 workers for cheap ``TensorDataset`` batches beside 2 intra-op threads (``loader_oversubscribed`` /
``cpu_contention`` advise none: 0 workers);
(c) 4 workers for the costly batches beside 2 threads: the advice is the ``cores.workers_that_fit`` plan (1 worker on
1 thread), never none; beside busy loops it said ``num_workers=0`` until the wait was weighed in wall time
(``cpu.in_process_ms_per_batch``), and the old advice is timed beside it.
Settings (workers, intra-op threads) run interleaved, round by round, each in a fresh interpreter; prints each
setting's median ms a step and its ratio to the script as written. Run it beside busy loops to time the advice
under contention (``--busy 2``).

    .venv/bin/python benchmarks/loader_worker_advice.py [--repeats 5] [--steps 120] [--busy 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_COSTLY = """
class Data(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, index):
        pixels, seed = [0.0] * 3072, index + 1
        for _ in range(2):
            for i in range(3072):
                seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
                pixels[i] = 0.5 * pixels[i] + ((seed >> 8) & 0xFFFF) / 65536.0
        return torch.tensor(pixels).view(3, 32, 32), index % 10
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 32 * 32, 10))
data, batch_size = Data(), 8
"""

_CHEAP = """
data = TensorDataset(torch.randn(64 * 32 * 40, 64), torch.randint(0, 10, (64 * 32 * 40,)))
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
batch_size = 32
"""

_LOOP = """
import sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
torch.set_num_threads(int(sys.argv[3]))
torch.manual_seed(0)
{setup}
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
workers, steps = int(sys.argv[1]), int(sys.argv[2])
loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                    prefetch_factor=2 if workers else None)
batches = iter(loader)
def step():
    x, y = next(batches)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
for _ in range(5):  # warm-up: workers started, first batches queued
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print(1000 * (time.perf_counter() - start) / steps)
"""

# name: (setup, the script as written (workers, threads), the settings timed beside it)
CASES = {
    "a_costly_items": (_COSTLY, (0, 1), ((2, 1), (1, 1))),
    "b_cheap_batches": (_CHEAP, (4, 2), ((0, 2), (1, 1))),
    "c_costly_workers": (_COSTLY, (4, 2), ((1, 1), (0, 2))),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=120)  # 40 steps hid the workers (1.00x at load 5-8)
    parser.add_argument("--busy", type=int, default=0, help="busy loops to run beside the settings (contention)")
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    times: dict[tuple[str, tuple[int, int]], list[float]] = {}
    try:
        for _ in range(args.repeats):
            for name, (setup, written, timed) in CASES.items():
                for workers, threads in (written, *timed):
                    run = subprocess.run(
                        [sys.executable, "-c", _LOOP.format(setup=setup), str(workers), str(args.steps), str(threads)],
                        capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    times.setdefault((name, (workers, threads)), []).append(float(run.stdout.strip()))
        load = os.getloadavg()[0]
    finally:
        for loop in loops:
            loop.kill()
    for name, (_, written, timed) in CASES.items():
        base = times[(name, written)]
        for setting in (written, *timed):
            mine = times[(name, setting)]
            ms = statistics.median(mine)
            rounds = sum(other < ours for other, ours in zip(mine, base))
            print(f"{name}: num_workers={setting[0]}, {setting[1]} thread(s): {ms:.1f} ms a step (median of "
                  f"{args.repeats}), {statistics.median(base) / ms:.2f}x the script as written, faster in "
                  f"{rounds}/{args.repeats} rounds")  # fmt: skip
    print(f"load average: {load:.1f}, usable cores: {len(os.sched_getaffinity(0))}, busy loops beside: {args.busy}")


if __name__ == "__main__":
    main()
