"""The look-alike that must stay quiet: a device-bound bf16 MLP on batches already on the device, no sync,
no copy. skalpel should find nothing at warning level (the device is busy; the host runs ahead)."""

import torch
from _common import DEVICE, arguments, size, timed
from torch import nn

args = arguments()
width, batch = size(8192, 256), size(8192, 64)
dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(4)]).to(DEVICE, dtype)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(batch, width, device=DEVICE, dtype=dtype)
own = []  # this script's own CUDA events, one a step (no sync): the check compares them with skalpel watch's


def step(i):
    optimizer.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()
    optimizer.step()
    if DEVICE.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        own.append(event)


timed(step, args.steps)
if own:
    import json
    import os

    torch.cuda.synchronize()
    if os.environ.get("OWN_EVENTS"):
        gaps = [a.elapsed_time(b) for a, b in zip(own, own[1:])]
        with open(os.environ["OWN_EVENTS"], "w") as handle:
            json.dump(gaps, handle)
