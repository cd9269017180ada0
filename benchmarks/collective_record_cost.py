"""What skalpel's record of collectives (capture/collectives.py) adds to each torch.distributed call.

A one-rank gloo group in this process; all_reduce of 64 floats, 3,000 calls a round, the thread's CPU
time per call, bare and recorded in turn (7 rounds, interleaved); prints the medians and the median of
the rounds' differences. A real collective waits for its peers: what the ring adds is this CPU time.

    .venv/bin/python benchmarks/collective_record_cost.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from skalpel.capture.collectives import Recorder


def per_call(tensor: torch.Tensor, calls: int = 3000) -> float:
    began = time.thread_time()
    for _ in range(calls):
        dist.all_reduce(tensor)
    return (time.thread_time() - began) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="skalpel-ring-"))
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
    tensor = torch.ones(64)
    bare, recorded = [], []
    for _ in range(7):
        bare.append(per_call(tensor))
        recorder = Recorder(folder)
        recorder.install()
        recorded.append(per_call(tensor))
        recorder.uninstall()
    added = statistics.median(after - before for after, before in zip(recorded, bare))
    print(f"all_reduce CPU time a call: bare {statistics.median(bare):.1f} us, recorded "
          f"{statistics.median(recorded):.1f} us; the ring adds {added:.1f} us (median of 7 interleaved rounds of "
          "3,000 calls)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
