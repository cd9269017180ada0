"""Planted problem: a wide model trained with Adam on small batches: the optimizer's state holds the memory peak
(optimizer_state_dominates_peak).

    skalpel run examples/scenarios/optimizer_state_peak.py
    skalpel run examples/scenarios/optimizer_state_peak.py --momentum   # a one-value state: SGD with momentum
    skalpel run examples/scenarios/optimizer_state_peak.py --sgd        # the look-alike: no state at all

Adam keeps two values per parameter (its moving averages of the gradient and of its square): twice the
weights, while a batch of 8 rows leaves the activations small.
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def main(steps: int = 12, optimizer_name: str = "adam") -> None:
    model = nn.Sequential(*(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(6)), nn.Linear(1024, 10))
    if optimizer_name == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9 if optimizer_name == "momentum" else 0)
    x, y = torch.randn(8, 1024), torch.randint(0, 10, (8,))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


if __name__ == "__main__":
    chosen = "momentum" if "--momentum" in sys.argv[1:] else "sgd" if "--sgd" in sys.argv[1:] else "adam"
    main(optimizer_name=chosen)
