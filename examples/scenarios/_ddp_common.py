"""Shared set-up of the DDP scenarios: one process per rank, launched by torchrun (or `skalpel run --nproc N`).

gloo on CPU (one thread per rank, so that ranks on one machine do not fight over cores),
NCCL with one GPU per rank when CUDA is available.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def setup() -> tuple[int, torch.device]:
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    return dist.get_rank(), device


def mlp(width: int, depth: int, inputs: int, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def wrap(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    model = model.to(device)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def batch(size: int, inputs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, inputs, device=device), torch.randint(0, 10, (size,), device=device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def teardown() -> None:
    dist.barrier()
    dist.destroy_process_group()
