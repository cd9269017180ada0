"""Planted problem: batches augmented and tokenized in Python on the training thread (host_bound).

    skalpel run examples/scenarios/host_preprocessing.py

No DataLoader: each step flips, blurs and normalises its images one by one in numpy and
tokenizes its texts word by word in Python before the model sees them. The model's ops take a
small part of the step; the rest is host work that DataLoader workers (or vectorised numpy, or
tokenizing once) would take off the training thread.
"""

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
rng = np.random.default_rng(0)
VOCAB = {f"w{i}": i for i in range(1000)}
TEXTS = [" ".join(f"w{(i * 7 + j) % 1200}" for j in range(300)) for i in range(64)]


def augment(images):
    out = []
    for image in images:  # PLANTED: per-image numpy work on the training thread
        image = image[:, ::-1] if rng.random() < 0.5 else image
        image = (image + np.roll(image, 1, axis=0) + np.roll(image, 1, axis=1)) / 3
        out.append((image - image.mean()) / (image.std() + 1e-6))
    return np.stack(out).astype(np.float32)


def tokenize(texts):
    return [[VOCAB.get(word, 0) for word in text.split()] for text in texts]


def main(steps: int = 12) -> None:
    model = nn.Sequential(nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        x = torch.from_numpy(augment(rng.random((64, 32, 32)))).reshape(64, 1024)
        y = torch.tensor([len(tokens) % 10 for tokens in tokenize(TEXTS)])
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
