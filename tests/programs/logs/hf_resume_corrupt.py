"""Hugging Face ``Trainer`` as its docs show it (a tiny GPT-2 built from a ``GPT2Config``,
synthetic tokens, CPU), resumed with ``trainer.train(resume_from_checkpoint=...)`` from a
checkpoint whose weights file is not weights: a download that saved the hub's HTML page under
the weights' name, as happens with a wrong URL or an expired link. It knows nothing of ups.

    python hf_resume_corrupt.py CHECKPOINT_DIR
"""

import argparse
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

HTML = "<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in to download this file.</body></html>\n"


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    args = p.parse_args()
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config)
    checkpoint = Path(args.checkpoint)
    config.save_pretrained(checkpoint)
    (checkpoint / "model.safetensors").write_text(HTML)  # what the "download" saved
    training = TrainingArguments(
        output_dir="test_trainer", max_steps=4, per_device_train_batch_size=4, use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(64, 16, config.vocab_size))
    trainer.train(resume_from_checkpoint=str(checkpoint))


if __name__ == "__main__":
    main()
