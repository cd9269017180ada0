"""A small Lightning fit with a starving DataLoader (dataloader_bound), profiled two ways:

    skalpel run examples/integrations/lightning_train.py          # skalpel finds the optimizer steps itself
    python examples/integrations/lightning_train.py --skalpel OUT  # the callback, run folder OUT

Each sample costs 2 ms in ``__getitem__`` with no DataLoader workers; validation runs every 10 batches (never
profiled as training). ``--accumulate N`` makes an optimizer step of N batches.
"""

import argparse
import time

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
torch.set_num_threads(1)


class SlowDataset(Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(0.002)  # PLANTED: expensive per-sample work, run in the training process (num_workers=0)
        return torch.randn(256), index % 10


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        with torch.profiler.record_function("validation_step"):  # a marker: validation must not be in the trace
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skalpel", metavar="OUT", help="profile with skalpel's callback into this run folder "
                        "(-: the default, ./skalpel-runs/<time>-<script>)")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (2 or more: the ddp strategy)")
    parser.add_argument("--csv", metavar="DIR", help="log to a CSVLogger in DIR (the callback logs its findings)")
    parser.add_argument("--val-every", type=int, default=10, help="validate every this many batches (0: never)")
    args = parser.parse_args()
    callbacks = []
    if args.skalpel:
        from skalpel.integrations.lightning import SkalpelCallback

        callbacks.append(SkalpelCallback(out=None if args.skalpel == "-" else args.skalpel))
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", callbacks=callbacks,
                        accumulate_grad_batches=args.accumulate, val_check_interval=args.val_every or None,
                        limit_val_batches=4 if args.val_every else 0, num_sanity_val_steps=1,
                        logger=L.loggers.CSVLogger(args.csv, name="fit") if args.csv else False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(SlowDataset(16 * args.steps * args.accumulate), batch_size=16, num_workers=0)
    val = DataLoader(SlowDataset(64), batch_size=16, num_workers=0)
    trainer.fit(Model(), loader, val)


if __name__ == "__main__":
    main()
