"""Each batch prepared on the training thread right before its step (a numpy augmentation, ~6 ms of CPU), with no
DataLoader and no sync: the device idles while the host works, and nothing waits on the device. The cause is the
host work itself, which the finding must name (not a sync, not "host wait"). Fix: a DataLoader whose workers
prepare the batches ahead (the same function), pinned memory."""

import numpy as np
import torch
from _common import DEVICE, ON_GPU, arguments, size, timed
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

args = arguments()
width, batch = size(4096, 256), size(256, 32)


def prepare(seed):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch, width)).astype(np.float32)
    for _ in range(6):  # the augmentation: smoothing passes
        images = (images + np.roll(images, 1, axis=1)) / 2
    return torch.from_numpy(images)


class Prepared(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        seed = info.id if info else 0
        while True:
            yield prepare(seed)
            seed += info.num_workers if info else 1


model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(3)]).to(DEVICE)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
batches = iter(DataLoader(Prepared(), batch_size=None, num_workers=size(6, 2), pin_memory=ON_GPU, prefetch_factor=4,
                          persistent_workers=True)) if args.fix else None


def step(i):
    if args.fix:
        images = next(batches)
    else:
        images = prepare(i)  # PLANTED: the batch prepared on the training thread every step
    images = images.to(DEVICE, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    model(images).square().mean().backward()
    optimizer.step()


timed(step, args.steps)
