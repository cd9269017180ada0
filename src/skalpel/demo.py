"""The demo training job behind ``skalpel demo``: a small CNN whose DataLoader is the bottleneck.

Synthetic images, no download. Each sample is made by a Python loop (a pseudo-random
texture and a per-pixel jitter, as a hand-written augmentation would be) in the main
process (``num_workers=0``), so the training step spends most of its time waiting for
the next batch. ``skalpel demo`` runs this file through ``skalpel run`` like any user
script (it lives outside ``skalpel/capture`` so that findings point into it as the
user's code); run it alone with ``python -m skalpel.demo``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SIDE = 32
CHANNELS = 3


class SlowTextures(Dataset):
    """Images computed pixel by pixel in Python: real CPU work on every ``__getitem__``."""

    def __init__(self, count: int, passes: int = 2) -> None:
        self.count = count
        self.passes = passes

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        size = CHANNELS * SIDE * SIDE
        pixels = [0.0] * size
        seed = (index * 2654435761 + 1) & 0x7FFFFFFF
        for _ in range(self.passes):  # the costly "augmentation": every pixel jittered in Python
            for i in range(size):
                seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
                pixels[i] = 0.5 * pixels[i] + ((seed >> 8) & 0xFFFF) / 65536.0 - 0.25
        image = torch.tensor(pixels, dtype=torch.float32).view(CHANNELS, SIDE, SIDE)
        return image, index % 10


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(CHANNELS, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (SIDE // 4) ** 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def train(steps: int, batch_size: int) -> float:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(SlowTextures(steps * batch_size), batch_size=batch_size, shuffle=True, num_workers=0)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loss = torch.zeros(())
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="skalpel's demo: a small CNN with a slow DataLoader")
    # 24: the two recorded windows take 16, and skalpel times the steps after them un-profiled (the overhead's baseline)
    parser.add_argument("--steps", type=int, default=24, help="training steps (default 24)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    loss = train(args.steps, args.batch_size)
    print(f"demo: trained {args.steps} steps, last loss {loss:.3f}")


if __name__ == "__main__":
    main()
