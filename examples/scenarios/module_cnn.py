"""A small CNN trained on in-memory images: the module tree's look-alike of a vision model.

    skalpel run examples/scenarios/module_cnn.py

Three conv stages, the last the widest, then a pooled classifier. The module tree names the stages and
their convolutions; no finding at warning level.
"""

import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = stage(3, 16)
        self.middle = stage(16, 32)
        self.wide = stage(32, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, images):
        x = self.wide(self.middle(self.stem(images)))
        return self.head(x.mean(dim=(2, 3)))


def main(steps: int = 12) -> None:
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))) for _ in range(steps)]
    for images, labels in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main(int(os.environ.get("MODULE_STEPS", "12")))
