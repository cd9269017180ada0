"""Planted problem: a graph break inside a compiled forward, on every call (graph_break).

    skalpel run examples/scenarios/graph_break.py

``.item()`` (here to keep a statistic for logging) turns a tensor into a Python number,
which torch.compile cannot trace: the forward is cut into two graphs with eager Python
between them, and the host waits for the value each step. The backend is Inductor (on a CPU too); its cache goes to ./.inductor-cache
(ignored by git) unless TORCHINDUCTOR_CACHE_DIR is set. SKALPEL_SCENARIO_BACKEND=eager
keeps compilation short (Dynamo breaks the graph the same way whatever the backend).
"""

import os
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".inductor-cache"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
BACKEND = os.environ.get("SKALPEL_SCENARIO_BACKEND", "inductor")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, x):
        hidden = torch.relu(self.first(x))
        self.last_peak = hidden.abs().max().item()  # PLANTED: a Python number inside the compiled forward
        return self.second(hidden)


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


def main(steps: int = 12) -> None:
    model = Net()
    compiled = torch.compile(model, backend=BACKEND)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(steps)]
    for x, y in batches:
        train_step(compiled, optimizer, x, y)


if __name__ == "__main__":
    main()
