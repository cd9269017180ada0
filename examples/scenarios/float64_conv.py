"""Planted problem: a float64 convolutional model on the CPU, on torch's reference conv kernel (hot_op).

    skalpel run examples/scenarios/float64_conv.py            # planted: the model and data in float64
    skalpel run examples/scenarios/float64_conv.py --float32  # its look-alike: the same model in float32

A small CNN surrogate for a 2-D field (the kind of scientific model that sets float64 as the default
dtype for accuracy). oneDNN has no float64 convolution, so torch runs aten::_slow_conv2d_forward and
_backward, its reference im2col + GEMM kernels, for every layer; in float32 the same convolutions run
on oneDNN (aten::mkldnn_convolution) and the step has no op that stands alone.
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(4, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 4, 3, padding=1),
    )


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main(steps: int = 12, dtype: torch.dtype = torch.float64) -> None:
    model = make_model().to(dtype)  # PLANTED: float64 weights, so every conv takes the reference kernel
    batches = [(torch.randn(16, 4, 32, 32, dtype=dtype), torch.randn(16, 4, 32, 32, dtype=dtype)) for _ in range(steps)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches:
        train_step(model, optimizer, x, y)


if __name__ == "__main__":
    main(dtype=torch.float32 if "--float32" in sys.argv[1:] else torch.float64)
