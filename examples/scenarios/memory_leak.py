"""Planted problem: memory that grows every step (memory_growth).

    skalpel run examples/scenarios/memory_leak.py

Each step appends its 8 MiB hidden activation (with the autograd graph behind it) to a list
that lives across steps, so allocated memory rises by about 8 MiB per step.
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

history = []


def train_step(body, head, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    hidden = body(x)
    loss = nn.functional.cross_entropy(head(hidden), y)
    loss.backward()
    optimizer.step()
    history.append(hidden)  # PLANTED: keeps every step's activation (and its graph) alive


def main(steps: int = 12) -> None:
    body = nn.Sequential(nn.Linear(256, 2048), nn.ReLU())
    head = nn.Linear(2048, 10)
    optimizer = torch.optim.SGD(list(body.parameters()) + list(head.parameters()), lr=0.01)
    x, y = torch.randn(1024, 256), torch.randint(0, 10, (1024,))
    for _ in range(steps):
        train_step(body, head, optimizer, x, y)


if __name__ == "__main__":
    main()
