"""Planted problem: switching a compiled model between eval() under no_grad and train() (recompilation).

    skalpel run examples/scenarios/compile_train_eval.py

Every few steps the loop evaluates the model as nanoGPT's ``estimate_loss`` does:
``model.eval()`` under ``torch.no_grad()``, then ``model.train()``. Dynamo's guards check
the grad mode and the module's ``training`` flag, so the first evaluation recompiles the
forward (``GLOBAL_STATE changed: grad_mode``) inside the measured steps. The fix is to keep
the switch outside the compiled region (compile the evaluation separately, or run it eagerly).
Inductor by default; its cache goes to ./.inductor-cache unless TORCHINDUCTOR_CACHE_DIR is set.
"""

import os
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".inductor-cache"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(1)
BACKEND = os.environ.get("SKALPEL_SCENARIO_BACKEND", "inductor")
EVAL_AT = int(os.environ.get("SKALPEL_SCENARIO_EVAL_AT", "5"))  # the first evaluation, inside the recorded steps


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    loss = nn.functional.cross_entropy(model(x), y)  # PLANTED: eval() and no_grad around the compiled model
    model.train()
    return loss


def main(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, 10))
    compiled = torch.compile(model, backend=BACKEND)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(steps)]
    for step, (x, y) in enumerate(batches):
        train_step(compiled, optimizer, x, y)
        if step >= EVAL_AT and (step - EVAL_AT) % 4 == 0:
            evaluate(compiled, x, y)


if __name__ == "__main__":
    main()
