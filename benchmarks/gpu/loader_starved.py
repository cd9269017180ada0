"""Batches built on the training process (num_workers=0) by a dataset that does ~0.5 ms of CPU work an item:
the device waits for every batch. Fix: DataLoader workers, pinned memory."""

import numpy as np
import torch
from _common import DEVICE, ON_GPU, arguments, size, timed
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        rng = np.random.default_rng(index)
        image = rng.standard_normal((3, 64, 64)).astype(np.float32)
        for _ in range(4):  # the augmentation: blur-like passes over the image
            image = (image + np.roll(image, 1, axis=1) + np.roll(image, 1, axis=2)) / 3
        return torch.from_numpy(image), index % 10


def main():
    args = arguments()
    workers = size(8, 2) if args.fix else 0
    loader = DataLoader(Augmented(), batch_size=64, num_workers=workers, pin_memory=args.fix and ON_GPU,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = iter(loader)

    def step(i):
        images, labels = next(batches)  # PLANTED: every batch built in this process
        images, labels = images.to(DEVICE, non_blocking=True), labels.to(DEVICE, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    timed(step, args.steps)


if __name__ == "__main__":
    main()
