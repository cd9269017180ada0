"""A compiled model (torch.compile, Inductor) whose forward branches on a tensor's value: Dynamo cannot trace
`if h.mean() > 0`, so it splits the graph there every call (a graph break, and a sync to read the value). Fix:
the branch as tensor code (torch.where), one graph. Compiled before the profiled steps (step 0 compiles)."""

import os

import torch
from _common import DEVICE, arguments, size, timed
from torch import nn

args = arguments()
width, batch = size(4096, 256), size(2048, 64)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.up(x))
        if args.fix:
            h = torch.where(h.mean() > 0, h, -h)
        elif h.mean() > 0:  # PLANTED: data-dependent control flow: a graph break every call
            h = h * 1.0
        else:
            h = -h
        return self.down(h)


model = nn.Sequential(Block(), Block()).to(DEVICE)
compiled = torch.compile(model, backend=os.environ.get("SKALPEL_SCENARIO_BACKEND", "inductor"))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(batch, width, device=DEVICE)


def step(i):
    optimizer.zero_grad(set_to_none=True)
    compiled(x).square().mean().backward()
    optimizer.step()


timed(step, args.steps)
