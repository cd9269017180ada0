"""Every step copies a 128 MB batch from pageable host memory: each copy is staged and blocks the host.
Fix: pin the host batch once and copy with non_blocking=True."""

import torch
from _common import DEVICE, arguments, size, timed
from torch import nn

args = arguments()
width, batch = 4096, size(8192, 256)
host_batch = torch.randn(batch, width)
if args.fix:
    host_batch = host_batch.pin_memory()
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)


def step(i):
    x = host_batch.to(DEVICE, non_blocking=args.fix)  # PLANTED: a pageable host-to-device copy
    optimizer.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()


timed(step, args.steps)
