"""Planted problem: a profile taken with no warm-up and one step (no_warmup, too_few_steps).

    skalpel run --warmup 0 --active 1 examples/scenarios/no_warmup.py

The loop itself is the clean baseline; the problem is the measurement: recording starts at
the first step (one-time costs included) and covers a single step, so neither the step time
nor its spread can be trusted. The script does the same on its own with skalpel.profile():

    python examples/scenarios/no_warmup.py --self-profile
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main(steps: int = 12, self_profile: bool = False) -> None:
    batches = [(torch.randn(128, 512), torch.randint(0, 10, (128,))) for _ in range(steps)]  # data already batched
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if self_profile:
        import skalpel

        with skalpel.profile(wait=0, warmup=0, active=1) as run:  # PLANTED: no warm-up, a single recorded step
            for x, y in batches:
                train_step(model, optimizer, x, y)
                run.step()
        print(run.report().findings)
        return
    for x, y in batches:
        train_step(model, optimizer, x, y)


if __name__ == "__main__":
    import sys

    main(self_profile="--self-profile" in sys.argv)
