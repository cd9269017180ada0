"""A loss read with .item() every step (for logging) beside 3 ms of host work: the host waits for the device
each step, so host and device time add up. Fix: keep the loss on the device and read it once at the end."""

import time

import torch
from _common import DEVICE, arguments, size, timed
from torch import nn

args = arguments()
width, batch = size(4096, 256), size(4096, 64)
model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4)]).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(batch, width, device=DEVICE), torch.randn(batch, width, device=DEVICE)
losses, total = [], torch.zeros((), device=DEVICE)


def step(i):
    global total
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if args.fix:
        # a running sum: a list of loss.detach() kept 64 MiB a step on the H200 (mse_loss's result keeps its
        # elementwise buffer, pytorch/pytorch#185647; memory_growth named it: tests/traces/h200)
        total = total + loss.detach()
    else:
        losses.append(loss.item())  # PLANTED: a host-device sync every step
    time.sleep(0.003)  # the step's host work (metrics, logging): 3 ms


timed(step, args.steps)
