"""Planted problem: torch.compile recompiles every step (recompilation).

    skalpel run examples/scenarios/recompile.py

The model is compiled with ``dynamic=False`` and every batch has a different size, so each
step fails the shape guard and compiles again. The backend is Dynamo's "eager" by default
(the recompilation is Dynamo's, whatever the backend); with SKALPEL_SCENARIO_BACKEND=inductor
Inductor's cache goes to ./.inductor-cache (ignored by git) unless TORCHINDUCTOR_CACHE_DIR is set.
"""

import os
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".inductor-cache"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
# "eager" keeps each compilation short (Dynamo still traces, guards and recompiles exactly as with Inductor);
# SKALPEL_SCENARIO_BACKEND=inductor gives the full compiler (slow under a profiler recording Python stacks).
BACKEND = os.environ.get("SKALPEL_SCENARIO_BACKEND", "eager")
for name in ("recompile_limit", "cache_size_limit"):  # allow a recompilation per step (the name changed in torch 2.6)
    if hasattr(torch._dynamo.config, name):
        setattr(torch._dynamo.config, name, 64)


def predict(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def train_step(compiled, weights, optimizer, batch_size):
    x, y = torch.randn(batch_size, 32), torch.randint(0, 4, (batch_size,))
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(compiled(x, *weights), y)  # PLANTED: a new batch size every step, dynamic=False
    loss.backward()
    optimizer.step()


def main(steps: int = 12) -> None:
    weights = [nn.Parameter(torch.randn(32, 32) * 0.1), nn.Parameter(torch.randn(32, 4) * 0.1)]
    compiled = torch.compile(predict, dynamic=False, backend=BACKEND)
    optimizer = torch.optim.SGD(weights, lr=0.01)
    for step in range(steps):
        train_step(compiled, weights, optimizer, batch_size=8 + step)


if __name__ == "__main__":
    main()
