"""A small transformer trained on in-memory data: the module tree's look-alike of real code.

    skalpel run examples/scenarios/module_transformer.py

Four encoder blocks (attention, then a feed-forward twice as costly), an embedding and a head. The
module tree names the blocks, their attention and feed-forward; no finding at warning level.
"""

import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
DTYPE = os.environ.get("MODULE_DTYPE", "fp32")  # "bf16": the forward under CPU bf16 autocast


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 256, heads: int = 4, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def main(steps: int = 12) -> None:
    model = TinyTransformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randint(0, 512, (8, 128)) for _ in range(steps)]
    for tokens in batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=DTYPE == "bf16"):
            logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main(int(os.environ.get("MODULE_STEPS", "12")))
