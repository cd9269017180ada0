"""Planted problem: a full sort where only the top k scores are used (hot_op).

    skalpel run examples/scenarios/sort_for_topk.py           # planted: scores.sort() then a slice
    skalpel run examples/scenarios/sort_for_topk.py --topk    # its look-alike: torch.topk, the same result

A retrieval head scores each query against 4,096 candidates and trains on its 8 best scores (a
top-k margin loss). Sorting every row of 4,096 scores to keep 8 of them makes aten::sort most of
the step; torch.topk finds the same 8 values without the full sort. No DataLoader, no Python loop:
the step breakdown is all CPU ops, and the only way to see it is the op.
"""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
K = 8


class RetrievalHead(nn.Module):
    def __init__(self, dim: int = 256, candidates: int = 4096) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.candidates = nn.Linear(dim, candidates, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.candidates(torch.relu(self.query(x)))


def best_scores(scores: torch.Tensor, use_topk: bool) -> torch.Tensor:
    if use_topk:
        return scores.topk(K, dim=1).values
    return scores.sort(dim=1, descending=True).values[:, :K]  # PLANTED: sorts 4,096 scores per row to keep 8


def train_step(model, optimizer, x, use_topk: bool) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    top = best_scores(model(x), use_topk)
    loss = torch.relu(1.0 - top[:, 0:1] + top[:, 1:]).mean()  # the best score beats the next ones by a margin
    loss.backward()
    optimizer.step()
    return loss.detach()


def main(steps: int = 12, use_topk: bool = False) -> None:
    batches = [torch.randn(256, 256) for _ in range(steps)]
    model = RetrievalHead()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in batches:
        train_step(model, optimizer, x, use_topk)


if __name__ == "__main__":
    main(use_topk="--topk" in sys.argv[1:])
