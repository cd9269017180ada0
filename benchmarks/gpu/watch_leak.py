"""For skalpel watch: a steady device-bound loop that from step 150 on keeps 32 MB of device memory a step
alive (a list of activations never cleared). Watch should see memory creep and capture it."""

import torch
from _common import DEVICE, arguments, size
from torch import nn

args = arguments()
width = size(4096, 512)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(size(2048, 64), width, device=DEVICE)
kept = []
for i in range(args.steps):
    optimizer.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    optimizer.step()
    if i >= 150:
        kept.append(out.detach().clone())  # PLANTED: 32 MB of activations kept every step
