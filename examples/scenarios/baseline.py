"""Clean baseline: a small MLP trained on in-memory data. skalpel should find no bottleneck.

    skalpel run examples/scenarios/baseline.py

The step is dominated by matrix multiplies, the batches are already in memory, nothing is kept
alive across steps and there is no compilation: no finding at warning level or above.
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


def main(steps: int = 12) -> None:
    batches = [(torch.randn(128, 512), torch.randint(0, 10, (128,))) for _ in range(steps)]  # data already batched
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches:
        train_step(model, optimizer, x, y)


if __name__ == "__main__":
    main()
