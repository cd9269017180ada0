"""Look-alike that must stay quiet: inference whose memory peak is its weights (not activations_dominate_peak).

    skalpel run examples/scenarios/inference_weights.py

Batches from a DataLoader through four wide layers under ``torch.inference_mode()``: 64 MiB of weights, and
each layer's output freed as soon as the next one has read it. Nothing is kept for a backward pass.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)


def main(batches: int = 12) -> None:
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2048, 2048), nn.GELU()) for _ in range(4))).eval()
    data = TensorDataset(torch.randn(batches * 16, 2048))
    with torch.inference_mode():
        for (x,) in DataLoader(data, batch_size=16):
            model(x).argmax(dim=1)


if __name__ == "__main__":
    main()
