"""Clean compiled baseline: a compiled MLP on fixed shapes. skalpel should find no bottleneck.

    skalpel run examples/scenarios/compiled_clean.py

Compiled once in the first step, before recording starts; the same shapes every step, no
graph break, no train/eval switch: no compile finding at warning level or above. Inductor
by default; its cache goes to ./.inductor-cache unless TORCHINDUCTOR_CACHE_DIR is set.
SKALPEL_SCENARIO_COMPILE=0 runs the same loop eagerly (``skalpel diff`` eager against compiled).
"""

import os
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".inductor-cache"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
BACKEND = os.environ.get("SKALPEL_SCENARIO_BACKEND", "inductor")
COMPILE = os.environ.get("SKALPEL_SCENARIO_COMPILE", "1") != "0"  # 0: the same loop eagerly, to diff against


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


def main(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    compiled = torch.compile(model, backend=BACKEND) if COMPILE else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(steps)]
    for x, y in batches:
        train_step(compiled, optimizer, x, y)


if __name__ == "__main__":
    main()
