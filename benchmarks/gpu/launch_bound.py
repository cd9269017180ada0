"""A deep stack of tiny layers trained with a per-parameter Adam (foreach=False): thousands of kernels of a few
microseconds each step, most of them the optimizer's (about ten a parameter), so the host's launches, not the
device, set the pace (launch_bound). Fix: the multi-tensor Adam (foreach=True), a few kernels for all parameters;
the tiny layers' own kernels stay (launch-bound still, less so: CUDA graphs or torch.compile would be next)."""

import torch
from _common import DEVICE, arguments, timed
from torch import nn

args = arguments()
model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU()) for _ in range(150)]).to(DEVICE)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=args.fix)
x = torch.randn(32, 64, device=DEVICE)


def step(i):
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()  # PLANTED: a kernel per parameter and operation: 600 parameters, ~6,000 tiny kernels


timed(step, args.steps)
