"""A DDP training loop at a steady rhythm (CPU, gloo), for the speed of naming a hang and the
healthy pauses that must not be called one. It knows nothing of any monitoring tool.

    torchrun --standalone --nproc-per-node 2 rhythm_loop.py

RHYTHM_RATE=STEPS_PER_S (default 10)   the loop's pace (each step sleeps what is left of 1/rate)
RHYTHM_STEPS=N (default 200)           steps in all
RHYTHM_HANG=STEP                       rank 1 sleeps in its own code at STEP, for ever
RHYTHM_PAUSE=KIND:SECS                 at step RHYTHM_PAUSE_STEP (default 60), a healthy pause:
    first_step   a long first step on every rank (CPU-bound, as a compile), at step 0
    compile      torch.compile of the model before the first step (its first step compiles)
    eval_all     every rank evaluates (forward passes under no_grad) for SECS
    rewarm       an epoch boundary: the DataLoader's workers start again, each worker's
                 init working for SECS (the rank waits for its first batch)
    gc           a garbage collection of a large graph of cycles, SECS long
    listing      a listing of a large folder tree, again and again for SECS
    dcp_async    torch.distributed.checkpoint.async_save of the model (on a gloo group of its
                 own), then SECS of steps while it writes, then the wait for it
"""

import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(1, generator=g)


def pause_spec():
    kind, _, secs = os.environ.get("RHYTHM_PAUSE", "").partition(":")
    return (kind or None), float(secs or 0), int(os.environ.get("RHYTHM_PAUSE_STEP", "60"))


def slow_init(secs):
    def init(_worker_id):  # a worker that starts slowly: imports, opening its files, building an index
        a = torch.randn(128, 128)
        busy_for(secs, lambda: a @ a)
    return init


def busy_for(secs, fn):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        fn()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rate = float(os.environ.get("RHYTHM_RATE", "10"))
    steps = int(os.environ.get("RHYTHM_STEPS", "200"))
    hang = int(os.environ.get("RHYTHM_HANG", "-1"))
    kind, secs, at = pause_spec()
    ckpt_group = dist.new_group(backend="gloo") if kind == "dcp_async" else None
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if kind == "compile":
        net = torch.compile(net)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    workers = 1
    loader = DataLoader(Data(), batch_size=8, num_workers=workers, persistent_workers=True)
    pending = None
    step = 0
    while step < steps:
        for x, y in loader:  # an epoch: 8 batches; the next epoch starts the workers again
            t0 = time.monotonic()
            if step == hang and rank == 1:
                print(f"rank 1 hanging at step {step}", flush=True)
                while True:
                    time.sleep(0.5)  # stuck in its own code
            if kind == "first_step" and step == 0:
                a = torch.randn(256, 256)
                busy_for(secs, lambda a=a: a @ a)
            if step == at and kind == "eval_all":
                with torch.no_grad():
                    busy_for(secs, lambda: model(torch.randn(256, 16)))
            if step == at and kind == "gc":
                end = time.monotonic() + secs
                while time.monotonic() < end:
                    junk = []
                    for _ in range(200_000):
                        a, b = [], []
                        a.append(b)
                        b.append(a)
                        junk.append(a)
                    del junk
                    gc.collect()
            if step == at and kind == "listing":
                root = os.environ.get("RHYTHM_LISTING") or os.getcwd()
                end = time.monotonic() + secs
                while time.monotonic() < end:
                    for _ in os.walk(root):
                        pass
            if step == at and kind == "dcp_async":
                import torch.distributed.checkpoint as dcp

                # its own gloo group: the save's collectives run in a thread beside the training's
                pending = (dcp.async_save({"model": model.state_dict()}, process_group=ckpt_group,
                                          checkpoint_id=os.path.join(os.environ.get("RHYTHM_WORKDIR", "."), f"ckpt-{step}")),
                           time.monotonic() + secs)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if pending is not None and time.monotonic() > pending[1]:
                pending[0].result()
                pending = None
            step += 1
            if step % 20 == 0 and rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= steps:
                break
            time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t0)))
        if kind in ("rewarm", "rewarmed") and step >= at:
            # one slow re-warm, at the first epoch boundary past the pause step; then as before
            slow = kind == "rewarm"
            kind = "rewarmed" if slow else None
            loader = DataLoader(Data(), batch_size=8, num_workers=workers, persistent_workers=not slow,
                                worker_init_fn=slow_init(secs) if slow else None)
    if pending is not None:
        pending[0].result()
    dist.destroy_process_group()
    print("done", flush=True)


if __name__ == "__main__":
    main()
