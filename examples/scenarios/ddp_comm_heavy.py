"""Planted communication bottleneck: a wide model (about 4.2M parameters) with a batch of 2 samples.

Each step computes almost nothing and all-reduces 16.8 MB of gradients.
Expected finding: communication_bound (all_reduce).
"""

import argparse

import torch

from _ddp_common import batch, mlp, setup, teardown, train_step, wrap

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

rank, device = setup()
model = wrap(mlp(width=1024, depth=4, inputs=1024), device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = batch(2, 1024, device)
for _ in range(args.steps):
    train_step(model, optimizer, data, target)
teardown()
