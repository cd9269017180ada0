"""Clean DDP baseline: a small MLP, a batch big enough that compute outweighs the gradient all_reduce.

The batch (4096) keeps the 1 MB all_reduce near a tenth of the step even when gloo's threads compete
with other jobs for two cores (at 512 a loaded machine pushed it past 30%).

    skalpel run --nproc 2 examples/scenarios/ddp_small.py
    torchrun --nproc-per-node 2 -m skalpel run examples/scenarios/ddp_small.py
"""

import argparse

import torch

from _ddp_common import batch, mlp, setup, teardown, train_step, wrap

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

rank, device = setup()
model = wrap(mlp(width=256, depth=2, inputs=256), device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = batch(4096, 256, device)
for _ in range(args.steps):
    train_step(model, optimizer, data, target)
teardown()
