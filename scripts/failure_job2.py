"""Round 2 of the reproduced failures (scripts/make_failure_logs.py --round 2): other programs,
written the way frameworks' tutorials write them, failing for real in other ways than round 1's
(scripts/failure_job.py).

    python failure_job2.py SCENARIO WORK

Three kinds of program, each a small training job (``STYLE`` picks one per scenario):

* ``trainer``: a Hugging Face-style ``Trainer`` loop (``TrainingArguments``, ``{'loss': ...}``
  log lines, ``checkpoint-N`` folders with ``model.safetensors``, ``optimizer.pt`` and
  ``trainer_state.json``), one process under python, DDP when torchrun gives it ranks;
* ``ddp``: PyTorch's DDP tutorial (``setup(rank, world_size)``, ``demo_basic``, ``cleanup``):
  ``mp.spawn`` of 2 ranks under plain python, the ranks torchrun starts otherwise;
* ``loader``: the DataLoader tutorial (a map-style ``Dataset`` over files on disk, a
  ``collate_fn``, worker processes, a tqdm loop).

At step ``FAIL_STEP`` the failing rank makes its scenario's fault happen: the operating system,
torch, numpy, h5py, safetensors or the launcher prints the error, never this file (no error
text is written here, only the calls that fail). What needs a surrounding (a full or read-only
file system, a small /dev/shm, a limit, another user, a signal from outside) comes from
make_failure_logs.py; ``WORK`` is the folder whose ``mnt/`` it mounted and whose ``inputs/`` it
prepared. ``ok_*`` and ``own_*`` are the negatives: healthy runs, and runs whose own code raised.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import signal
import socket
import sys
import time
import warnings

SCENARIO, WORK = sys.argv[1], sys.argv[2]
NOISE = set(filter(None, os.environ.get("JOB_NOISE", "").split(",")))
STEPS = 6
FAIL_STEP = 3
MNT = os.path.join(WORK, "mnt")
INPUTS = os.path.join(WORK, "inputs")
log = logging.getLogger("trainer")

STYLE = {
    "st_full": "trainer", "fobj_full": "ddp",
    "ro_makedirs": "trainer", "ro_worker_cache": "loader",
    "perm_csv": "trainer", "perm_tmpfile": "trainer",
    "shm_queue": "queue", "shm_spawn_args": "ddp",
    "fd_memmap": "loader", "fd_h5py": "trainer",
    "mem_cat": "trainer", "mem_worker": "loader",
    "kill_rank0": "ddp", "kill_all": "trainer",
    "segv_faulthandler": "trainer", "segv_recursion": "ddp",
    "term_handler": "trainer", "term_top": "ddp",
    "missing_config": "trainer", "missing_sample": "loader",
    "import_six": "ddp", "import_name": "loader",
    "ckpt_mixed": "trainer", "ckpt_appended": "ddp",
    "wo_model": "ddp", "wo_dataclass": "trainer",
    "cuda_device_obj": "trainer", "cuda_map_dict": "ddp",
    "addr_tutorial": "ddp", "addr_metrics_port": "trainer",
    "rdzv_env_world": "trainer", "rdzv_file": "ddp",
    "coll_barrier": "trainer", "coll_bcast_obj": "ddp",
    "coll_gather_into": "ddp", "coll_p2p_shape": "ddp",
    "peer_sysexit": "trainer", "peer_early_stop": "ddp",
    "nan_fp16": "trainer", "nan_log0": "loader",
    "ok_trainer": "trainer", "ok_ddp": "ddp", "ok_loader_tutorial": "loader",
    "own_assert": "trainer", "own_collate_type": "loader", "own_loss_shape": "ddp",
}


def noise_start(rank: int) -> None:
    if "logging" in NOISE:
        logging.basicConfig(format=f"%(asctime)s - %(levelname)s - [rank{rank}] %(name)s - %(message)s", level=logging.INFO)
    if "warnings" in NOISE:
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` "
                      "instead.", FutureWarning, stacklevel=1)
        warnings.warn("Was asked to gather along dimension 0, but all input tensors were scalars; will instead unsqueeze "
                      "and return a vector.", UserWarning, stacklevel=1)


def say(rank: int, msg: str) -> None:
    if "logging" in NOISE:
        log.info(msg)
    else:
        print(msg, flush=True)


def ready() -> None:
    """Tell make_failure_logs.py that this process is where its signal goes, and wait for it."""
    open(os.path.join(WORK, f"ready.{os.getpid()}"), "w").close()
    time.sleep(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a Hugging Face-style Trainer ---------------------------------------------------------------------
class TrainingArguments:
    def __init__(self, output_dir: str, max_steps: int = STEPS, logging_steps: int = 1, save_steps: int = FAIL_STEP,
                 learning_rate: float = 5e-2, per_device_train_batch_size: int = 4, ddp_timeout: int = 60):
        self.output_dir, self.max_steps, self.logging_steps, self.save_steps = output_dir, max_steps, logging_steps, save_steps
        self.learning_rate, self.per_device_train_batch_size, self.ddp_timeout = (
            learning_rate, per_device_train_batch_size, ddp_timeout)


class Trainer:
    def __init__(self, model, args: TrainingArguments, train_dataset, data_collator=None):
        import torch
        import torch.distributed as dist

        self.args, self.train_dataset, self.data_collator = args, train_dataset, data_collator
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if self.world > 1 or SCENARIO == "rdzv_env_world":
            from datetime import timedelta

            dist.init_process_group("gloo", rank=self.rank, world_size=self.world, timeout=timedelta(seconds=args.ddp_timeout))
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        self.state = {"global_step": 0, "log_history": []}
        self.failing = self.rank == self.world - 1

    def get_train_dataloader(self):
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(self.train_dataset, self.world, self.rank, shuffle=False) if self.world > 1 else None
        return DataLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size, sampler=sampler,
                          collate_fn=self.data_collator)

    def log(self, logs: dict) -> None:
        logs["epoch"] = round(self.state["global_step"] / STEPS, 2)
        self.state["log_history"].append(logs)
        if self.rank == 0 or SCENARIO == "nan_fp16":
            print(logs, flush=True)

    def train(self, resume_from_checkpoint: str | None = None):
        import torch

        if resume_from_checkpoint:
            self._load_from_checkpoint(resume_from_checkpoint)
        if self.rank == 0:
            print("***** Running training *****\n"
                  f"  Num examples = {len(self.train_dataset):,}\n  Num Epochs = 1\n"
                  f"  Instantaneous batch size per device = {self.args.per_device_train_batch_size}\n"
                  f"  Total optimization steps = {self.args.max_steps}", flush=True)
        bar = None
        if "tqdm" in NOISE and self.rank == 0:
            from tqdm import tqdm

            bar = tqdm(total=self.args.max_steps, file=sys.stderr, mininterval=0, ascii=True, ncols=80)
        for batch in self.get_train_dataloader():
            step = self.state["global_step"] = self.state["global_step"] + 1
            if step == FAIL_STEP and self.failing:
                trainer_fault(self, torch)
            loss = self.compute_loss(batch, step)
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.log({"loss": round(loss.item(), 4), "grad_norm": round(grad_norm.item(), 4),
                      "learning_rate": self.args.learning_rate})
            if bar is not None:
                bar.update(1)
            if step == FAIL_STEP and SCENARIO in ("coll_barrier", "peer_sysexit") and self.world > 1:
                self.evaluate()
            if step % self.args.save_steps == 0 and self.rank == 0 and SCENARIO.startswith("ok_"):
                self._save_checkpoint(step)
            if step >= self.args.max_steps:
                break
        if bar is not None:
            bar.close()
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
        print("\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n", flush=True)
        return self.state

    def compute_loss(self, batch, step: int):
        import torch

        x, y = batch["input"], batch["labels"]
        if SCENARIO == "nan_fp16" and step >= FAIL_STEP and self.failing:
            with torch.autocast("cpu", dtype=torch.float16):
                out = self.model(x * 3e4)  # activations past float16's range
            return torch.nn.functional.mse_loss(out.float(), y) * 1.0
        return torch.nn.functional.mse_loss(self.model(x), y)

    def evaluate(self):
        import torch.distributed as dist

        say(self.rank, "***** Running Evaluation *****")
        if self.rank == 0 and SCENARIO == "coll_barrier":
            time.sleep(60)  # a slow evaluation on rank 0 only; the others wait at the barrier
        if SCENARIO == "peer_sysexit" and self.failing:
            sys.exit(1)  # this rank leaves in the middle of the run
        dist.barrier()

    def _save_checkpoint(self, step: int):
        from safetensors.torch import save_file

        out = os.path.join(self.args.output_dir, f"checkpoint-{step}")
        os.makedirs(out, exist_ok=True)
        model = getattr(self.model, "module", self.model)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"),
                  metadata={"format": "pt"})
        import torch

        torch.save(self.optimizer.state_dict(), os.path.join(out, "optimizer.pt"))
        with open(os.path.join(out, "trainer_state.json"), "w") as f:
            json.dump(self.state, f)
        say(self.rank, f"Saving model checkpoint to {out}")

    def _load_from_checkpoint(self, path: str):
        import torch

        say(self.rank, f"Loading model from {path}.")
        self.optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu"))


class Features:
    """A map-style dataset of 16 features and a target: dicts, as tokenized datasets give them."""

    def __init__(self, n: int = 64 * STEPS):
        import torch

        self.n, self.torch = n, torch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = self.torch.Generator().manual_seed(i)
        x = self.torch.randn(16, generator=g)
        if SCENARIO == "fd_h5py" and i >= 4 * FAIL_STEP:
            import h5py

            # one handle per shard, opened on first use and kept, as lazy h5 datasets do
            self.handles = getattr(self, "handles", [])
            for k in range(len(self.handles), 320):
                self.handles.append(h5py.File(os.path.join(INPUTS, "shards", f"shard-{k:03d}.h5"), "r"))
        return {"input": x, "labels": x.sum(0, keepdim=True)}


def build_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))


def trainer_main() -> None:
    import torch

    rank = int(os.environ.get("RANK", "0"))
    noise_start(rank)
    if SCENARIO == "segv_faulthandler":
        import faulthandler

        faulthandler.enable()
    if SCENARIO == "term_handler":
        def on_term(signum, frame):
            print(f"[rank{rank}] Received {signal.Signals(signum).name}: saving a checkpoint and exiting", flush=True)
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)
    config = {"learning_rate": 5e-2, "max_steps": STEPS}
    if SCENARIO == "missing_config":
        with open(os.path.join(WORK, "configs", "train_config.json")) as f:
            config.update(json.load(f))
    if SCENARIO == "ok_trainer":
        last = os.path.join(WORK, "out", "checkpoint-last")
        if not os.path.isdir(last):
            log.warning("No checkpoint found in %s: training from scratch", last)
    if SCENARIO == "rdzv_env_world" and "RANK" not in os.environ:
        # the batch script's job size: 2 tasks, of which one was started
        os.environ.update({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port()))})
    args = TrainingArguments(output_dir=os.path.join(MNT if SCENARIO.startswith(("st_", "ro_", "perm_")) else WORK, "out"),
                             learning_rate=config["learning_rate"], max_steps=config["max_steps"],
                             ddp_timeout=5 if SCENARIO in ("coll_barrier", "rdzv_env_world") else 60)
    if SCENARIO == "addr_metrics_port" and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        import threading
        from http.server import BaseHTTPRequestHandler, HTTPServer

        # a metrics endpoint for the cluster's scraper, on the port the team's config names
        server = HTTPServer(("127.0.0.1", int(os.environ["JOB_BUSY_PORT"])), BaseHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    collator = None
    if SCENARIO == "own_assert":
        def collator(features):
            batch = {k: torch.stack([f[k] for f in features]) for k in features[0]}
            assert batch["input"].shape[-1] == 32, "inputs must be padded to max_length=32"
            return batch
    trainer = Trainer(build_model(), args, Features(), data_collator=collator)
    resume = os.path.join(INPUTS, "checkpoint-2") if SCENARIO == "ckpt_mixed" else None
    trainer.train(resume_from_checkpoint=resume)


def trainer_fault(trainer: Trainer, torch) -> None:
    s = SCENARIO
    if s in ("st_full", "ro_makedirs"):
        # the model's embedding table: 2 MiB
        getattr(trainer.model, "module", trainer.model).add_module("embed", torch.nn.Embedding(8192, 64))
        trainer._save_checkpoint(trainer.state["global_step"])
    elif s == "perm_csv":
        # a CSV logger callback appends the step's metrics to the team's shared file
        with open(os.path.join(MNT, "metrics.csv"), "a", newline="") as f:
            csv.writer(f).writerow([trainer.state["global_step"], trainer.state["log_history"][-1]["loss"]])
    elif s == "perm_tmpfile":
        import tempfile

        # an atomic save: write a temporary file beside the checkpoint, then rename it over
        ckpt = os.path.join(MNT, "ckpt")
        fd, tmp = tempfile.mkstemp(dir=ckpt, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(trainer.model.state_dict(), f)
        os.replace(tmp, os.path.join(ckpt, "last.pt"))
    elif s == "mem_cat":
        preds = []
        for _ in range(64):  # evaluation keeps every batch's logits (batch 8 x 2048 tokens x 32000 vocab)
            preds.append(torch.empty(8 * 512, 32000, dtype=torch.float32).fill_(0.5))
        torch.cat(preds)
    elif s in ("kill_all", "term_handler"):
        ready()
    elif s == "segv_faulthandler":
        import ctypes

        ctypes.memset(ctypes.c_void_p(16), 0, 64)  # a native call writes near address 0
    elif s == "ckpt_mixed":
        pass  # the resume above read it
    elif s == "wo_dataclass":
        state = torch.load(os.path.join(INPUTS, "checkpoint-2", "training_args.bin"))
        print(state)
    elif s == "cuda_device_obj":
        with open(os.path.join(INPUTS, "gpu_trained.pt"), "rb") as f:
            trainer.model.load_state_dict(torch.load(f, map_location=torch.device("cuda")))
    elif s == "fd_h5py":
        pass  # the dataset opens its shards


# -- PyTorch's DDP tutorial -------------------------------------------------------------------------
def setup(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "localhost")
    if SCENARIO == "rdzv_file":
        from datetime import timedelta

        # a shared file as the rendezvous; the job's size is taken from the cluster's, not from this launch
        dist.init_process_group("gloo", init_method=f"file://{WORK}/rdzv_init", rank=rank, world_size=world_size + 2,
                                timeout=timedelta(seconds=6))
        return
    from datetime import timedelta

    timeout = 5 if SCENARIO in ("coll_bcast_obj",) else 30 if SCENARIO.startswith("coll_") else 60
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))


def cleanup() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()


class ToyModel:
    @staticmethod
    def make():
        import torch

        class Toy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net1 = torch.nn.Linear(10, 10)
                self.relu = torch.nn.ReLU()
                self.net2 = torch.nn.Linear(10, 5)

            def forward(self, x):
                return self.net2(self.relu(self.net1(x)))

        return Toy()


def demo_basic(rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    noise_start(rank)
    if SCENARIO == "import_six":
        from torch._six import inf  # noqa: F401
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size)
    failing = rank == (0 if SCENARIO in ("kill_rank0", "fobj_full", "shm_spawn_args") else world_size - 1)
    torch.manual_seed(0)
    model = ToyModel.make()
    ddp_model = DDP(model)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(1, STEPS + 1):
        if step == FAIL_STEP:
            ddp_fault(rank, world_size, failing, ddp_model, torch, dist)
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        if SCENARIO == "own_loss_shape" and step == FAIL_STEP and failing:
            labels = torch.randint(0, 5, (40,))
            loss = torch.nn.functional.cross_entropy(outputs, labels)
        else:
            loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        say(rank, f"rank {rank} step {step} loss {loss.item():.4f}")
        if SCENARIO == "peer_early_stop" and step == FAIL_STEP and failing:
            say(rank, f"rank {rank}: early stopping, no improvement for 2 evaluations")
            cleanup()
            return
    if rank == 0 and SCENARIO == "ok_ddp":
        torch.save(ddp_model.state_dict(), os.path.join(WORK, "model.checkpoint"))
    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.", flush=True)


def ddp_fault(rank: int, world_size: int, failing: bool, ddp_model, torch, dist) -> None:
    s = SCENARIO
    if s == "fobj_full" and failing:
        ddp_model.module.add_module("embed", torch.nn.Embedding(8192, 64))
        with open(os.path.join(MNT, "ckpt", "model.checkpoint"), "wb") as f:
            torch.save(ddp_model.state_dict(), f)
    elif s == "kill_rank0" and failing:
        ready()
    elif s == "term_top" and failing:
        ready()
    elif s == "segv_recursion" and failing:
        sys.setrecursionlimit(10**8)

        def depth(node):  # a config tree walked recursively; this one loops back on itself
            return 1 + max((depth(c) for c in node["children"]), default=0)

        node = {"children": []}
        node["children"].append(node)
        depth(node)
    elif s == "ckpt_appended":
        ddp_model.load_state_dict(torch.load(os.path.join(INPUTS, "snapshot.pt"), map_location={"cuda:0": "cpu"}))
    elif s == "wo_model":
        model = torch.load(os.path.join(INPUTS, "whole_model.pt"))
        model.eval()
    elif s == "cuda_map_dict":
        # the DDP tutorial's checkpoint load: what rank 0 saved from cuda:0, onto this rank's GPU
        map_location = {"cuda:%d" % 0: "cuda:%d" % rank}  # noqa: UP031 (the tutorial's words)
        ddp_model.load_state_dict(torch.load(os.path.join(INPUTS, "gpu_ddp.checkpoint"), map_location=map_location,
                                             weights_only=True))
    elif s == "coll_bcast_obj":
        objs = [{"epoch": 1, "best": 0.5}] if rank == 0 else [None]
        if rank == 0:
            time.sleep(60)  # rank 0 is still writing the evaluation's results
        dist.broadcast_object_list(objs, src=0)
    elif s == "coll_gather_into":
        # gathering the evaluation's predictions: the last batch is shorter on the last rank
        preds = torch.ones(8 - 3 * failing)
        out = torch.empty(world_size * preds.numel())
        dist.all_gather_into_tensor(out, preds)
    elif s == "coll_p2p_shape":
        # two pipeline stages: stage 0 sends its activations (hidden 32), stage 1 expects hidden 16
        if rank == 0:
            dist.send(torch.randn(4, 32), dst=1)
        else:
            activations = torch.empty(4, 16)
            dist.recv(activations, src=0)
    elif s == "shm_spawn_args" and failing:
        import torch.multiprocessing as mp

        # a feature store handed to an evaluation process: its storage goes through /dev/shm
        features = torch.randn(4 * 1024 * 1024)
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=torch.sum, args=(features,))
        p.start()
        p.join()


def ddp_entry() -> None:
    if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        demo_basic(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        return
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ["JOB_BUSY_PORT"] if SCENARIO == "addr_tutorial" else str(free_port())
    world_size = 2
    mp.spawn(demo_basic, args=(world_size,), nprocs=world_size, join=True)


# -- the DataLoader tutorial ------------------------------------------------------------------------
class ShardDataset:
    """Samples stored one file each, as the DataLoader tutorial's image folder."""

    def __init__(self, root: str, transform=None):
        import numpy as np

        self.root, self.transform = root, transform
        self.files = sorted(os.listdir(root))
        if SCENARIO == "fd_memmap":
            # every shard memory-mapped once, kept open for the whole run
            self.maps = [np.load(os.path.join(root, f), mmap_mode="r") for f in self.files for _ in range(8)]

    def __len__(self):
        return len(self.files) * 8

    def __getitem__(self, idx):
        import numpy as np
        import torch

        path = os.path.join(self.root, self.files[idx % len(self.files)])
        in_worker = torch.utils.data.get_worker_info() is not None
        late = idx >= 4 * FAIL_STEP
        if SCENARIO == "missing_sample" and late and in_worker:
            path = os.path.join(self.root, "sample_00031_augmented.npy")  # listed in the index, deleted since
        x = torch.from_numpy(np.load(path)).float()
        if SCENARIO == "ro_worker_cache" and late and in_worker:
            import pickle

            with open(os.path.join(MNT, "cache", f"{idx:06d}.pkl"), "wb") as f:
                pickle.dump(x, f)
        if SCENARIO == "mem_worker" and late and in_worker:
            x = torch.zeros(1024, 1024, 1024, 8, dtype=torch.uint8) + x[0]  # a decoded video clip
        sample = {"features": x, "label": x.sum().unsqueeze(0)}
        if self.transform:
            sample = self.transform(sample)
        return sample


def collate(batch):
    import torch

    if SCENARIO == "own_collate_type":
        return {"features": torch.stack([b["features"] for b in batch]),
                "label": torch.tensor([b["label"] for b in batch] + ["<pad>"])}
    return torch.utils.data.default_collate(batch)


def loader_main() -> None:
    import torch
    from torch.utils.data import DataLoader

    noise_start(0)
    if SCENARIO == "import_name":
        from torch.utils.data import DataLoader2  # noqa: F401
    dataset = ShardDataset(os.path.join(INPUTS, "samples"))
    workers = 0 if SCENARIO in ("fd_memmap", "nan_log0") else 2
    loader = DataLoader(dataset, batch_size=4, shuffle=False, num_workers=workers, collate_fn=collate,
                        persistent_workers=workers > 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Softmax(dim=-1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = enumerate(loader, start=1)
    bar = None
    if "tqdm" in NOISE:
        from tqdm import tqdm

        it = bar = tqdm(it, total=STEPS, file=sys.stderr, mininterval=0, ascii=True, ncols=80)
    for step, batch in it:
        probs = model(batch["features"])
        target = torch.zeros_like(probs)
        target[:, 0] = 1
        if SCENARIO == "nan_log0" and step >= FAIL_STEP:
            probs = probs * torch.tensor([0.0] + [1.0] * 7)  # a class masked out of the softmax
        loss = -(target * torch.log(probs)).sum(-1).mean() if SCENARIO == "nan_log0" else (
            torch.nn.functional.mse_loss(probs.sum(-1, keepdim=True), batch["label"] / 100))
        opt.zero_grad()
        loss.backward()
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.4f}")
        else:
            print(f"step {step}: loss={loss.item():.4f}", flush=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=SCENARIO == "nan_log0")
        opt.step()
        if step >= STEPS:
            break
    if bar is not None:
        bar.close()
    print("Finished Training", flush=True)


# -- a producer process feeding the trainer through a torch.multiprocessing queue ---------------------
def produce(q, n: int) -> None:
    import torch

    for i in range(n):
        q.put(torch.randn(4, 1024 * 1024) if i >= FAIL_STEP - 1 else torch.randn(4, 16))


def queue_main() -> None:
    import torch
    import torch.multiprocessing as mp

    noise_start(0)
    ctx = mp.get_context("spawn")
    q = ctx.Queue(maxsize=4)
    p = ctx.Process(target=produce, args=(q, STEPS), daemon=True)
    p.start()
    model = torch.nn.Linear(16, 1)
    for step in range(1, STEPS + 1):
        x = q.get(timeout=20)[:, :16]
        loss = model(x).pow(2).mean()
        loss.backward()
        say(0, f"step {step} loss {loss.item():.4f}")
    p.join()


def trainer_spawned(rank: int, world: int, port: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": port})
    trainer_main()


def trainer_entry() -> None:
    """One process, or 2 ranks spawned as ``accelerate``'s notebook_launcher spawns them when the
    run needs more than one and no launcher gave it ranks."""
    if "RANK" in os.environ or SCENARIO not in ("coll_barrier", "peer_sysexit"):
        trainer_main()
        return
    import torch.multiprocessing as mp

    print("Launching training on 2 CPUs.", flush=True)
    mp.start_processes(trainer_spawned, args=(2, str(free_port())), nprocs=2, start_method="fork")


if __name__ == "__main__":
    style = STYLE[SCENARIO]
    if style == "trainer":
        trainer_entry()
    elif style == "ddp":
        ddp_entry()
    elif style == "loader":
        loader_main()
    else:
        queue_main()
