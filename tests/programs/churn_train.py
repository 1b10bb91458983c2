"""Distributed training whose DataLoader workers are made anew every epoch (torch's default,
``persistent_workers=False``), with short epochs: the churn of a long run, fast. It knows
nothing of ups (pytorch/examples' multigpu_torchrun.py does the same).

    torchrun --nproc-per-node 2 churn_ddp.py --epochs 20 [--minutes M] [--kill-worker-at E]

``--kill-worker-at E``: in epoch E, rank 0 kills one of its DataLoader workers with SIGKILL
mid-epoch (what the OOM killer does); the loop catches the loader's error and goes on with
the next epoch, as a resilient training loop would. Each rank trains its own copy (no
DDP): a rank whose epoch was cut short must not leave its peer waiting in a gradient
all-reduce; the ranks meet at a barrier at every epoch's end.
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, n: int, sample_time: float) -> None:
        self.n = n
        self.sample_time = sample_time

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sample_time:
            time.sleep(self.sample_time)
        return torch.full((8,), 0.1 * (i % 4))  # small: the loss stays finite over any number of epochs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--minutes", type=float, default=0.0, help="run this long instead (epochs: a floor)")
    p.add_argument("--batches", type=int, default=4, help="per epoch")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sample-time", type=float, default=0.0)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--kill-worker-at", type=int, default=-1)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(4 * args.batches, args.sample_time), batch_size=4, num_workers=args.workers,
                        persistent_workers=False)
    end = time.monotonic() + args.minutes * 60
    epoch = 0
    while epoch < args.epochs or time.monotonic() < end:
        it = iter(loader)
        try:
            for i, batch in enumerate(it):
                if epoch == args.kill_worker_at and rank == 0 and i == 1:
                    victim = it._workers[0].pid
                    print(f"killing worker pid {victim} in epoch {epoch}", flush=True)
                    os.kill(victim, signal.SIGKILL)  # torch's SIGCHLD handler raises here or at the next batch
                    while os.path.exists(f"/proc/{victim}") and open(f"/proc/{victim}/stat").read().split()[2] != "Z":
                        time.sleep(0.01)
                loss = model(batch).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if args.step_time:
                    time.sleep(args.step_time)
        except Exception as exc:  # noqa: BLE001 - the loader's "worker ... killed by signal" (or a lost fd): next epoch
            print(f"epoch {epoch}: {exc}", flush=True)
        del it
        dist.barrier()
        epoch += 1
        if rank == 0:
            print(f"epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
