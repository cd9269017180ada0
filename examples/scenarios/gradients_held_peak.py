"""Planted problem: zero_grad(set_to_none=False) keeps every gradient allocated through the next step's forward,
where the memory peaks beside the activations (gradients_held_at_peak).

    skalpel run examples/scenarios/gradients_held_peak.py
    skalpel run examples/scenarios/gradients_held_peak.py --set-to-none   # the fix: gradients freed at zero_grad
    skalpel run examples/scenarios/gradients_held_peak.py --late-zero     # zero_grad() after the forward: the same
    skalpel run examples/scenarios/gradients_held_peak.py --accumulate    # the look-alike: 4 micro-batches

The look-alike accumulates the gradients of four micro-batches before each optimizer step: from the second
micro-batch on, the forward runs beside gradients it still needs, and zero_grad(set_to_none=True) frees them
after the step; the peak cannot drop by freeing them sooner.
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def main(steps: int = 12, mode: str = "held") -> None:
    model = nn.Sequential(*(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(6)), nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)  # no state: the gradients are the question
    micro = 4 if mode == "accumulate" else 1
    x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))
    for _ in range(steps):
        if mode == "held":
            optimizer.zero_grad(set_to_none=False)  # PLANTED: the gradients stay allocated, zeroed, until backward
        elif mode in ("fixed", "accumulate"):
            optimizer.zero_grad(set_to_none=True)
        for _ in range(micro):
            loss = nn.functional.cross_entropy(model(x), y) / micro
            if mode == "late":
                optimizer.zero_grad(set_to_none=True)  # PLANTED: after the forward, which ran beside the old ones
            loss.backward()
        optimizer.step()


if __name__ == "__main__":
    flags = sys.argv[1:]
    main(mode="fixed" if "--set-to-none" in flags else "late" if "--late-zero" in flags
         else "accumulate" if "--accumulate" in flags else "held")
