"""A small nanoGPT-shaped model, compiled with torch.compile, trained on random tokens (benchmarks/compile_capture.py).

    python benchmarks/compiled/tiny_gpt.py [--steps 20] [--recompile]

``--recompile`` changes the sequence length inside the steps skalpel records (the model is
compiled with dynamic=False), so dynamo recompiles there. One thread, CPU, Inductor; the
cache folder is TORCHINDUCTOR_CACHE_DIR.
"""

import argparse

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 512, 64, 128, 4, 4, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        batch, time, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(WIDTH, dim=2)
        q, k, v = (t.view(batch, time, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, time, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        return self.head(self.norm(self.blocks(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--recompile", action="store_true")
    args = parser.parse_args()
    model = torch.compile(TinyGPT(), dynamic=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        length = CONTEXT // 2 if args.recompile and step == 5 else CONTEXT  # step 5 is inside skalpel's window
        idx = torch.randint(0, VOCAB, (BATCH, length))
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
