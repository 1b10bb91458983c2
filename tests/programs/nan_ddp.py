"""A DDP training loop as the PyTorch tutorial writes it. It knows nothing of ups.

    torchrun --nproc-per-node 2 nan_ddp.py --steps 120 --nan-rank 1 --nan-step 40

From --nan-step on, --nan-rank's loss is NaN (as with a bad batch or an overflow): the loop
goes on, as most loops do, and the NaN reaches the other ranks' weights through the gradient
all-reduce. Rank 0 logs to W&B (disabled mode: nothing leaves the machine) like a real script;
with --tensorboard DIR every rank also writes its loss with TensorBoard's SummaryWriter, as the
PyTorch TensorBoard tutorial does.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--nan-rank", type=int, default=-1)
    p.add_argument("--nan-step", type=int, default=40)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--wandb", action="store_true")
    p.add_argument("--tensorboard", metavar="DIR")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    run = None
    if args.wandb and rank == 0:
        import wandb

        run = wandb.init(project="nan-demo", mode="disabled")
    writer = None
    if args.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(f"{args.tensorboard}/rank{rank}")

    step, batches = 0, iter(loader)
    started = time.perf_counter()
    while step < args.steps:
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == args.nan_rank and step >= args.nan_step:
            if step == args.nan_step:
                print(f"rank {rank}: loss is nan from step {step} at {time.time():.3f}", flush=True)
            loss = loss * float("nan")
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if run is not None and step % 10 == 0:
            run.log({"train/epoch_frac": step / args.steps})
        if writer is not None and step % 10 == 0:
            writer.add_scalar("Loss/train", loss.item(), step)
        step += 1
        time.sleep(args.step_time)
    if writer is not None:
        writer.close()
    print(f"rank {rank}: {step / (time.perf_counter() - started):.0f} steps/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
