"""Planted problem: one op allocates most of the peak (memory_spike).

    skalpel run examples/scenarios/memory_spike.py

A per-feature scale of 4096 values is broadcast with ``expand`` (free: a view) and then
materialised with ``.contiguous()``: a 64 MiB tensor where 16 KiB would do.
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def train_step(model, optimizer, scale, x, y):
    optimizer.zero_grad(set_to_none=True)
    weights = scale.expand(4096, 4096).contiguous()  # PLANTED: materialises a 64 MiB broadcast
    out = model(x) * weights[: x.shape[0], :10]
    nn.functional.cross_entropy(out, y).backward()
    optimizer.step()


def main(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scale = torch.rand(1, 4096)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    for _ in range(steps):
        train_step(model, optimizer, scale, x, y)


if __name__ == "__main__":
    main()
