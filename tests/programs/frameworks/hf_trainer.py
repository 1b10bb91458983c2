"""Hugging Face ``Trainer`` as its docs show it, on a tiny GPT-2 built from a ``GPT2Config``
(nothing downloaded) and synthetic tokens, on CPU. It knows nothing of ups.

    torchrun --nproc-per-node 2 hf_trainer.py [--fail raise|exit|hang --fail-rank 1 --fail-step 5]

The fault comes from a ``TrainerCallback`` (``on_step_end``), the way a user's callback
would misbehave.
"""

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Misbehave(TrainerCallback):
    def __init__(self, args) -> None:
        self.args = args

    def on_step_end(self, args, state, control, **kwargs):
        a, rank = self.args, int(os.environ.get("RANK", 0))
        time.sleep(a.step_time)
        if a.fail and rank == a.fail_rank and state.global_step == a.fail_step:
            if a.fail == "raise":
                raise RuntimeError(f"loss is NaN on rank {rank} at step {state.global_step}")
            if a.fail == "exit":
                os._exit(0)
            if a.fail == "hang":
                time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fail", choices=["raise", "exit", "hang"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=5)
    p.add_argument("--bar", action="store_true", help="the Trainer's tqdm bar on (its default)")
    args = p.parse_args()
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir="test_trainer", max_steps=args.steps, per_device_train_batch_size=4,
        dataloader_num_workers=args.workers, use_cpu=True, report_to=[], save_strategy="no", logging_steps=2,
        disable_tqdm=not args.bar,
    )
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(256, 16, config.vocab_size),
                      callbacks=[Misbehave(args)])
    trainer.train()


if __name__ == "__main__":
    main()
