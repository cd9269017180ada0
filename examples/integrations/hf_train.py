"""A Hugging Face ``Trainer.train`` of a tiny GPT-2 built from a config (no download), with a slow dataset
(dataloader_bound), gradient accumulation 4 and an evaluation every ``--eval-every`` optimizer steps:

    skalpel run examples/integrations/hf_train.py           # skalpel finds the optimizer steps itself
    python examples/integrations/hf_train.py --skalpel OUT  # the TrainerCallback, run folder OUT
"""

import argparse
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
torch.set_num_threads(1)


class Tokens(Dataset):
    def __init__(self, size: int, *, slow: bool) -> None:
        self.size, self.slow = size, slow
        self.data = torch.randint(0, 256, (size, 64))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        if self.slow:
            time.sleep(0.010)  # PLANTED: expensive per-sample work, run in the training process (no workers)
        ids = self.data[index]
        return {"input_ids": ids, "labels": ids}


class MarkedGPT2(GPT2LMHeadModel):
    def forward(self, *args, **kwargs):
        # a marker per forward: training's are counted per step, evaluation's must not be in the trace
        with torch.profiler.record_function("train_forward" if self.training else "eval_forward"):
            return super().forward(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skalpel", metavar="OUT", help="profile with skalpel's TrainerCallback into this run folder")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args()
    callbacks = []
    if args.skalpel:
        from skalpel.integrations.hf import SkalpelTrainerCallback

        callbacks.append(SkalpelTrainerCallback(out=args.skalpel))
    model = MarkedGPT2(GPT2Config(vocab_size=256, n_positions=64, n_embd=256, n_layer=2, n_head=4))
    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(
            output_dir=scratch, max_steps=args.steps, per_device_train_batch_size=4, gradient_accumulation_steps=4,
            per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=args.eval_every, save_strategy="no",
            logging_steps=1000, report_to="none", remove_unused_columns=False, use_cpu=True, dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(16 * args.steps, slow=True),
                          eval_dataset=Tokens(32, slow=False), callbacks=callbacks)  # fmt: skip
        trainer.train()


if __name__ == "__main__":
    main()
