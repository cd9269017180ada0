"""Planted problem: thousands of tiny ops per step (launch_bound, framework overhead on a CPU).

    skalpel run examples/scenarios/tiny_ops.py

A regulariser is computed element by element in a Python loop: about a thousand tiny
tensor ops per step (plus their backward), each microseconds long, so dispatch and Python
overhead, not arithmetic, make up the step.
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def penalty(weight):
    total = torch.zeros(())
    for value in weight.view(-1)[:400]:  # PLANTED: one tiny op chain per element instead of one vector op
        total = total + value * value
    return total


def main(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y) + 1e-4 * penalty(model[0].weight)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
