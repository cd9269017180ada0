"""Planted problem: a small transformer whose training peak is its activations (activations_dominate_peak).

    skalpel run examples/scenarios/activations_peak.py
    skalpel run examples/scenarios/activations_peak.py --checkpoint   # the fix, applied by hand
    skalpel run examples/scenarios/activations_peak.py --late-zero    # zero_grad() between forward and backward
    skalpel run examples/scenarios/activations_peak.py --evaluate     # a no_grad pass of 8x the batch each step

A long sequence through four blocks: each block keeps its attention scores and its MLP's wide hidden
layer for the backward pass, many times the weights. ``--checkpoint`` wraps each block in
``torch.utils.checkpoint``: only the blocks' inputs are kept, the rest recomputed in backward.
``--late-zero`` calls zero_grad() after the forward (as many tutorials do): the same peak, with the
recording's window opening while a forward's activations are held. ``--evaluate`` runs a no_grad forward
of eight times the batch before each step: the window's peak is in it, and nothing of it is kept for a backward.
"""

import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, depth: int = 4, vocab: int = 128, checkpointed=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.head = nn.Linear(width, vocab)
        self.checkpointed = checkpointed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


def main(steps: int = 12, checkpointed: bool = False, late_zero: bool = False, evaluate: bool = False) -> None:
    model = TinyTransformer(checkpointed=checkpointed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 128, (8, 256))
    for _ in range(steps):
        if evaluate:
            with torch.no_grad():
                model(tokens.repeat(8, 1)).argmax(-1)
        if not late_zero:
            optimizer.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        if late_zero:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main(checkpointed="--checkpoint" in sys.argv[1:], late_zero="--late-zero" in sys.argv[1:],
         evaluate="--evaluate" in sys.argv[1:])
