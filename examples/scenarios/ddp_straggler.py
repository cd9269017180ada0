"""Planted straggler: rank 1 spends 60 ms per step preparing its batch, the other ranks wait for it.

The model and batch are ddp_small's; only rank 1's slow input differs.
Expected finding: straggler_rank naming rank 1, its extra time outside any op, at load_batch.
"""

import argparse
import time

import torch

from _ddp_common import batch, mlp, setup, teardown, train_step, wrap

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--delay-ms", type=float, default=60.0)
args = parser.parse_args()

rank, device = setup()
model = wrap(mlp(width=256, depth=2, inputs=256), device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = batch(512, 256, device)


def load_batch():
    if rank == 1:
        time.sleep(args.delay_ms / 1000.0)  # the planted problem: a slow input pipeline on one rank
    return data, target


for _ in range(args.steps):
    train_step(model, optimizer, *load_batch())
teardown()
