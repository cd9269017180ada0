"""Planted problem: a starving DataLoader (dataloader_bound).

    skalpel run examples/scenarios/dataloader_starved.py

Each sample costs 2 ms of work in ``__getitem__`` and the DataLoader has no workers, so the
training process builds every batch itself while the model waits.
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        time.sleep(0.002)  # PLANTED: expensive per-sample work, run in the training process (num_workers=0)
        return torch.randn(256), index % 10


def train(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=16, num_workers=0)
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step + 1 == steps:
            break


if __name__ == "__main__":
    train()
