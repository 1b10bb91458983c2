"""A small training job that fails in one named way, for real (scripts/make_failure_logs.py runs
it under torchrun, plain python and a batch script, and keeps what it prints).

    python failure_job.py SCENARIO WORK

It trains a tiny model (DDP over gloo when torchrun or its own spawn gives it ranks) and prints
what jobs print: logging lines, a tqdm bar, torch's warnings (``JOB_NOISE`` picks them). At step
``JOB_FAIL_STEP`` the rank ``JOB_FAIL_RANK`` makes its scenario's fault happen: the operating
system, torch or the launcher prints the error, never this file (no error text is written here,
only the calls that fail). The faults that need a surrounding (a full or read-only file system, a
small /dev/shm, a limit, another user, a signal from outside) get it from make_failure_logs.py;
``WORK`` is the folder whose ``mnt/`` it mounted. Scenarios named ``ok_*`` and ``own_*`` are the
negatives: a healthy run, and a run whose own code raised.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
import warnings

SCENARIO, WORK = sys.argv[1], sys.argv[2]
NOISE = set(filter(None, os.environ.get("JOB_NOISE", "").split(",")))
STEPS = int(os.environ.get("JOB_STEPS", "6"))
FAIL_STEP = int(os.environ.get("JOB_FAIL_STEP", "3"))
log = logging.getLogger("train")


def distributed_scenario() -> bool:
    return SCENARIO.startswith(("coll_", "peer_", "rdzv_", "addr_"))


def main(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    if "logging" in NOISE:
        logging.basicConfig(format=f"%(asctime)s %(levelname)s [rank{rank}] %(name)s: %(message)s", level=logging.INFO)
    fail_rank = int(os.environ.get("JOB_FAIL_RANK", str(world - 1)))
    failing = rank == fail_rank
    if SCENARIO.startswith("rdzv_") or SCENARIO.startswith("addr_"):
        rendezvous_fault(rank, world)
        return
    if world > 1:
        from datetime import timedelta

        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=float(os.environ.get("JOB_PG_TIMEOUT", "60"))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("JOB_LR", "0.05")))
    if "warnings" in NOISE:
        torch.tensor(torch.ones(2))  # torch's UserWarning: copy construct from a tensor
        warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.", UserWarning, stacklevel=1)
    loader = make_loader(torch, failing)
    bar = None
    if "tqdm" in NOISE and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=STEPS, desc="train", file=sys.stderr, mininterval=0, ascii=True, dynamic_ncols=False, ncols=80)
    step = 0
    for x, y in loader:
        step += 1
        if isinstance(x, list):  # fd_loader's sample: many small tensors
            x = torch.cat(x)[:16]
        if step == FAIL_STEP and failing:
            fault(torch, model, rank, world)
        if step == FAIL_STEP and SCENARIO.startswith("coll_"):
            collective_fault(torch, dist, rank, failing)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if SCENARIO.startswith("nan_") and step >= FAIL_STEP and failing:
            loss = loss * float("inf") if SCENARIO == "nan_inf" else loss * float("nan")
        if SCENARIO == "own_value" and step == FAIL_STEP and failing:
            check_batch(x)
        opt.zero_grad()
        if SCENARIO == "nan_anomaly" and step == FAIL_STEP and failing:
            with torch.autograd.detect_anomaly():
                torch.log(model(x) * 0 - 1).sum().backward()
        loss.backward()
        opt.step()
        if "logging" in NOISE:
            log.info("epoch 0 step %d/%d loss %.4f lr 0.05", step, STEPS, loss.item())
        else:
            print(f"[rank {rank}] step {step} loss {loss.item():.4f}", flush=True)
        if bar is not None:
            bar.update(1)
        if step >= STEPS:
            break
    if bar is not None:
        bar.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print(f"[rank {rank}] done: {step} steps", flush=True)


def make_loader(torch, failing: bool):
    from torch.utils.data import DataLoader, Dataset

    workers = int(os.environ.get("JOB_WORKERS", "0"))
    scenario = SCENARIO

    class Samples(Dataset):
        def __len__(self):
            return 64 * STEPS

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(16, generator=g)
            if scenario == "own_key" and i >= 4 * FAIL_STEP:
                labels = {"cat": 0, "dog": 1}
                return x, torch.tensor([float(labels[f"class_{i % 7}"])])
            in_worker = torch.utils.data.get_worker_info() is not None
            if in_worker and i >= 4 * FAIL_STEP and failing:
                if scenario == "segv_loader":
                    ctypes.string_at(0)
                if scenario == "kill_loader":
                    open(os.path.join(WORK, f"ready.{os.getpid()}"), "w").close()
                    time.sleep(120)  # the OOM killer's SIGKILL comes from outside
            if scenario == "shm_loader" and in_worker:
                # a view of a 16 MiB sample: its whole storage goes through /dev/shm
                return torch.randn(4 * 1024 * 1024)[:16], x.sum(0, keepdim=True)
            if scenario == "fd_loader":
                return [torch.randn(2) for _ in range(64)], x.sum(0, keepdim=True)
            return x, x.sum(0, keepdim=True)

    def collate(batch):
        if scenario == "fd_loader":
            return torch.randn(4, 16), torch.randn(4, 1)
        return torch.utils.data.default_collate(batch)

    if scenario in ("fd_loader", "shm_loader"):
        # each sample's tensors are sent to the main process as they are (fd_loader: 64 of
        # them, each a file descriptor; shm_loader: a 16 MiB storage)
        return DataLoader(Samples(), batch_size=None, num_workers=workers, collate_fn=None)
    return DataLoader(Samples(), batch_size=4, num_workers=workers, collate_fn=collate if workers else None)


def check_batch(x) -> None:
    if x.shape[-1] != 32:
        raise ValueError(f"expected features of width 32, got a batch of shape {tuple(x.shape)}")


def fault(torch, model, rank: int, world: int) -> None:
    s = SCENARIO
    mnt = os.path.join(WORK, "mnt")
    if s in ("disk_save", "ro_save", "perm_save", "quota_save"):
        state = {"model": model.state_dict(), "opt": torch.randn(1024 * 1024)}
        torch.save(state, os.path.join(mnt, "ckpt", f"step_{FAIL_STEP:06d}.pt"))
    elif s in ("disk_write", "ro_write", "perm_write", "quota_write"):
        import numpy as np

        os.makedirs(os.path.join(mnt, "cache", f"rank{rank}"), exist_ok=True)
        np.save(os.path.join(mnt, "cache", f"rank{rank}", "features.npy"), np.zeros((1024, 1024), dtype=np.float32))
    elif s == "shm_share":
        torch.zeros(8 * 1024 * 1024).share_memory_()
    elif s == "fd_open":
        handles = [open(os.path.join(WORK, "shards", f"part-{i:05d}.bin"), "wb") for i in range(4096)]
        print(len(handles))
    elif s == "mem_tensor":
        torch.empty(64 * 1024**3, dtype=torch.uint8).fill_(1)
    elif s == "mem_numpy":
        import numpy as np

        np.ones((400_000, 200_000), dtype=np.float32)
    elif s in ("kill_main", "term_group", "term_loader", "kill_loader"):
        open(os.path.join(WORK, f"ready.{os.getpid()}"), "w").close()
        time.sleep(120)  # the signal comes from outside
    elif s == "segv_main":
        ctypes.string_at(0)
    elif s == "segv_faulthandler":
        import faulthandler

        faulthandler.enable()
        ctypes.string_at(0)
    elif s == "missing_data":
        import numpy as np

        np.load(os.path.join(WORK, "data", "train", "shard-00003.npy"))
    elif s == "missing_ckpt":
        torch.load(os.path.join(WORK, "checkpoints", "last.pt"), map_location="cpu")
    elif s == "import_module":
        import apex.optimizers  # noqa: F401
    elif s == "import_so":
        sys.path.insert(0, os.path.join(WORK, "ext"))
        import fused_adam_cuda  # noqa: F401
    elif s == "ckpt_truncated":
        torch.load(os.path.join(WORK, "ckpt_in", "truncated.pt"), map_location="cpu")
    elif s == "ckpt_html":
        model.load_state_dict(torch.load(os.path.join(WORK, "ckpt_in", "pytorch_model.bin"), map_location="cpu"))
    elif s == "ckpt_args":
        model.load_state_dict(torch.load(os.path.join(WORK, "ckpt_in", "with_args.pt"), map_location="cpu")["model"])
    elif s == "ckpt_numpy":
        model.load_state_dict(torch.load(os.path.join(WORK, "ckpt_in", "with_numpy.pt"), map_location="cpu")["model"])
    elif s == "ckpt_cuda":
        torch.load(os.path.join(WORK, "ckpt_in", "gpu_trained.pt"))
    elif s == "ckpt_cuda_map":
        torch.load(os.path.join(WORK, "ckpt_in", "gpu_trained.pt"), map_location=f"cuda:{rank}")
    elif s == "peer_exit":
        os._exit(1)  # a rank that leaves without a word (a native library's exit)
    elif s == "peer_killed_seg":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif s == "own_shape":
        torch.nn.Linear(32, 1)(torch.randn(4, 16))
    elif s == "own_assert":
        assert model is None, "the model must be built by build_model()"


def collective_fault(torch, dist, rank: int, failing: bool) -> None:
    t = torch.ones(4)
    if SCENARIO == "coll_timeout":
        if failing:
            time.sleep(60)  # this rank never joins; the others' gloo times out
        else:
            dist.all_reduce(t)
    elif SCENARIO == "coll_monitored":
        if failing:
            time.sleep(60)
        else:
            from datetime import timedelta

            dist.monitored_barrier(timeout=timedelta(seconds=3))
    elif SCENARIO == "coll_mismatch_op":
        if failing:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
    elif SCENARIO in ("coll_mismatch_shape", "coll_size"):
        dist.all_reduce(torch.ones(4 if failing else 8))
    elif SCENARIO == "coll_dtype":
        dist.all_reduce(torch.ones(4, dtype=torch.float32 if failing else torch.float64))
    elif SCENARIO.startswith("peer_"):
        pass


def rendezvous_fault(rank: int, world: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    if SCENARIO in ("rdzv_alone", "addr_taken"):
        dist.init_process_group("gloo", rank=rank, world_size=max(world, 2) if SCENARIO == "rdzv_alone" else world,
                                timeout=timedelta(seconds=5))
    elif SCENARIO == "rdzv_client":
        # a rank that is not the master connects to a master that never came up
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['JOB_DEAD_PORT']}", rank=1,
                                world_size=2, timeout=timedelta(seconds=5))
    elif SCENARIO == "addr_store":
        from torch.distributed import TCPStore

        TCPStore("127.0.0.1", int(os.environ["JOB_BUSY_PORT"]), 2, True, timeout=timedelta(seconds=5))


def spawned(rank: int, world: int) -> None:
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    main(rank, world)


if __name__ == "__main__":
    if "RANK" in os.environ:
        main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    elif distributed_scenario() and SCENARIO not in ("rdzv_alone", "rdzv_client", "addr_store", "addr_taken"):
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        mp.spawn(spawned, args=(2,), nprocs=2)
    else:
        if SCENARIO in ("rdzv_alone", "addr_taken"):
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:  # rdzv_alone: a free port, where the other rank never comes
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        main(0, 1)
