"""The least a DataLoader worker takes to hand a batch over: batches of a free ``__getitem__`` (cores.WORKER_HANDOFF_MS).

Each (workers, repeat) runs in a fresh interpreter, interleaved, 1 intra-op thread; prints the median ms a batch
for 0, 1 and 2 workers (16 samples of 256 int64 a batch, like a tokenized text batch). A fetch per batch below the
workers' figure gains nothing from workers on this machine; the machine's load moves every figure.

    .venv/bin/python benchmarks/loader_handoff.py [--repeats 5] [--batches 400]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

_ONE_RUN = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
class Free(Dataset):
    def __len__(self):
        return 10**7
    def __getitem__(self, index):
        return {"input_ids": torch.zeros(256, dtype=torch.long), "labels": torch.tensor(1)}
workers, batches = int(sys.argv[1]), int(sys.argv[2])
batch_iter = iter(DataLoader(Free(), batch_size=16, num_workers=workers, persistent_workers=workers > 0))
for _ in range(50):
    next(batch_iter)
start = time.perf_counter()
for _ in range(batches):
    next(batch_iter)
print(1000 * (time.perf_counter() - start) / batches)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    times: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for _ in range(args.repeats):
        for workers in times:
            done = subprocess.run([sys.executable, "-c", _ONE_RUN, str(workers), str(args.batches)],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            times[workers].append(float(done.stdout.strip()))
    for workers, values in times.items():
        print(f"{workers} worker(s): {statistics.median(values):.3f} ms a batch (median of {len(values)})")


if __name__ == "__main__":
    main()
