"""Latent-operator training: one process, or every rank under torchrun (DDP).

Run by ``ups launch train`` as ``python -m torch.distributed.run ... -m ups.jobs.train
--config RUN/config.json``; also runs by hand without torchrun.

What makes it safe to operate (docs/design.md, "The jobs"):

* Every rank reports phases (``dist.init``, ``data.load``, ``model.build``, ``ddp.wrap``,
  ``train``, ``eval``, ``checkpoint``, ``done``), steps, steps/s, loss, lr and CUDA memory,
  and faulthandler writes a fatal signal's traceback into the rank's stack file.
* Every collective is entered by every rank. An OOM on one rank becomes a flag in the one
  all-reduce every rank makes every step; when any rank failed, all ranks drop the step.
* Rank 0 alone logs, checkpoints (atomically) and talks to W&B, which is always finished
  with the real exit code. The process group is destroyed in ``finally``.
"""

from __future__ import annotations

import io
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ups.data import cache as cache_mod
from ups.data.tasks import get_task
from ups.errors import UpsError
from ups.faults import TRAIN_FAULTS, Faults
from ups.jobs.startup import EXIT_BAD_INPUT, resolve_device, run_from_env
from ups.launch.config import TrainConfig, parse_job_args
from ups.models.operator import LatentOperator
from ups.status.files import write_atomic
from ups.status.reporter import NullReporter, Reporter

KNOWN_FAULTS = TRAIN_FAULTS
RAM_MARGIN = 1.2


class TrainError(UpsError):
    exit_code = 1


# ----------------------------------------------------------------------------- data
def cache_folders(cfg: TrainConfig) -> dict[str, list[Path]]:
    """Each task's cache folders, one per split."""
    return {t: [cache_mod.split_dir(cfg.cache_dir, t, s) for s in cfg.splits] for t in cfg.tasks}


def check_cache(cfg: TrainConfig) -> dict[str, list[Path]]:
    """Refuse a cache that ``ups cache verify`` would fail, or that cannot be trained on as
    cached (a steady task cached without its coefficient frame, shapes that disagree); each
    task's folders to train on."""
    by_task = cache_folders(cfg)
    shapes: dict[str, tuple[int, ...]] = {}
    for task, folders in by_task.items():
        for folder in folders:
            if not folder.is_dir():
                raise UpsError(f"{folder}: no latent cache (run `ups launch precompute` for it first)")
            problems, _ = cache_mod.verify_cache(folder)
            if problems:
                raise UpsError(f"{folder}: cache fails verification ({len(problems)} problem(s), first: {problems[0]}); see `ups cache verify`")
            meta = cache_mod.read_metadata(folder) or {}
            shape = tuple(meta.get("latent_shape") or ())
            if get_task(task).steady and meta.get("frames") != "coefficient,solution":
                raise UpsError(f"{folder}: {task} is a steady task, trained as coefficient -> solution, but this cache "
                               f"holds {shape[0] if shape else '?'} latent frame(s) without the coefficient alone; "
                               f"rerun `ups launch precompute --tasks {task} --overwrite`")
            if shapes.setdefault(task, shape) != shape:
                raise UpsError(f"caches of {task} disagree on latent shape: {shapes[task]} vs {shape} in {folder}")
    token_shapes = {t: s[1:] for t, s in shapes.items()}
    if len(set(token_shapes.values())) > 1:
        raise UpsError(f"caches disagree on latent tokens x dim ({token_shapes}): one operator trains on all tasks, "
                       "so precompute them with the same --latent-tokens and --latent-dim")
    return by_task


class TaskPairs(torch.utils.data.Dataset):
    """(input, target) latent pairs of one task, from RAM or read from disk per item.

    Consecutive frames: (z_t, z_t+1) for a time-dependent task; for a steady task, whose
    cache holds (coefficient, solution) frames, the one pair coefficient -> solution.
    """

    def __init__(self, task: str, files: list[Path], in_ram: bool) -> None:
        self.task = task
        self.files = files
        first = cache_mod.read_sample(files[0])["latent"]
        self.steps = first.shape[0] - 1
        if self.steps < 1:
            raise UpsError(f"{files[0].parent}: latents have {first.shape[0]} time step(s); need 2 or more to train")
        self.token_shape = tuple(first.shape[1:])
        self.latents = torch.stack([cache_mod.read_sample(f)["latent"] for f in files]) if in_ram else None

    def __len__(self) -> int:
        return len(self.files) * self.steps

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        i, t = divmod(k, self.steps)
        z = self.latents[i] if self.latents is not None else cache_mod.read_sample(self.files[i])["latent"]
        return z[t].float(), z[t + 1].float()


class MultiTaskPairs(torch.utils.data.Dataset):
    """Pairs of every task, addressed as (task id, index in that task)."""

    def __init__(self, tasks: list[TaskPairs]) -> None:
        self.tasks = tasks
        self.names = [t.task for t in tasks]
        self.token_shape = tasks[0].token_shape

    def __len__(self) -> int:
        return sum(len(t) for t in self.tasks)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        task, k = key
        x, y = self.tasks[task][k]
        return x, y, task


class TaskBatchSampler(torch.utils.data.Sampler):
    """Batches of one task at a time, on the same schedule on every rank.

    Each epoch, each task's pairs are shuffled with (seed, epoch, task) and dealt out to the
    ranks as DistributedSampler does (the tail that does not divide evenly is dropped), then
    cut into full batches. The order of tasks over the epoch is shuffled with (seed, epoch)
    alone. Every input is the same on every rank, so step k trains the same task everywhere
    (the step's all-reduce checks it) while each rank reads its own share of that task.
    """

    def __init__(self, sizes: list[int], batch_size: int, *, rank: int = 0, world: int = 1, seed: int = 0) -> None:
        self.sizes, self.batch_size, self.rank, self.world, self.seed = sizes, batch_size, rank, world, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def batches_per_task(self) -> list[int]:
        return [n // self.world // self.batch_size for n in self.sizes]

    def schedule(self) -> list[int]:
        """The task of each step of this epoch (a function of seed, epoch and sizes only)."""
        order = [t for t, n in enumerate(self.batches_per_task) for _ in range(n)]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return [order[i] for i in torch.randperm(len(order), generator=g).tolist()]

    def __iter__(self):
        mine = []
        for t, n in enumerate(self.sizes):
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 101 + t + 1)
            perm = torch.randperm(n, generator=g)
            share = perm[: n - n % self.world][self.rank :: self.world].tolist()
            mine.append(iter([share[b : b + self.batch_size] for b in range(0, len(share) - self.batch_size + 1, self.batch_size)]))
        for t in self.schedule():
            yield [(t, k) for k in next(mine[t])]

    def __len__(self) -> int:
        return sum(self.batches_per_task)


def load_pairs(cfg: TrainConfig, by_task: dict[str, list[Path]]) -> MultiTaskPairs:
    import psutil

    files = {t: sorted(f for folder in folders for f in folder.glob("sample_*.pt")) for t, folders in by_task.items()}
    for task, found in files.items():
        if not found:
            raise UpsError(f"{cfg.cache_dir}: no cached samples for {task}/{cfg.splits}")
    size = sum(f.stat().st_size for found in files.values() for f in found)
    in_ram = cfg.preload == "ram" or (cfg.preload == "auto" and size * RAM_MARGIN < psutil.virtual_memory().available)
    return MultiTaskPairs([TaskPairs(t, found, in_ram) for t, found in files.items()])


# ----------------------------------------------------------------------- distributed
class Dist:
    """Rank facts, and the one place collectives happen."""

    def __init__(self) -> None:
        self.enabled = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) >= 1 and "MASTER_ADDR" in os.environ
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.enabled:
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t)
        return t

    def destroy(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def check_same_task(reduced: torch.Tensor, task: int, d: Dist, step: int, names: list[str]) -> None:
    """After the step's all-reduce of [.., task, task^2]: every rank trained the same task
    exactly when world * sum(t^2) == sum(t)^2 (zero variance). Every rank sees the same sums,
    so every rank raises together: none is left waiting in the next collective."""
    total, squares = reduced[2].item(), reduced[3].item()
    if d.world * squares != total * total:
        raise TrainError(f"step {step}: ranks trained different tasks (rank {d.rank}: {names[task]}; mean task id "
                         f"{total / d.world:g}): do all ranks see the same cache?")


# ---------------------------------------------------------------------------- faults
def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class FaultPlan:
    def __init__(self, faults: Faults, rank: int) -> None:
        self.faults, self.rank = faults, rank

    def on_phase(self, phase: str) -> None:
        f = self.faults.get("segv", rank=self.rank, phase=phase)
        if f is not None:
            print(f"ups: injected fault {f} on rank {self.rank}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)

    def in_step(self, step: int) -> None:
        if self.faults.get("oom", rank=self.rank, step=step) is not None:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected fault oom on rank {self.rank} at step {step})")
        if self.faults.get("hang", rank=self.rank, step=step) is not None:
            print(f"ups: injected hang on rank {self.rank} at step {step}", file=sys.stderr, flush=True)
            hang_in_python(step)

    def skips_collective(self, step: int) -> bool:
        return self.faults.get("skip_collective", rank=self.rank, step=step) is not None


def hang_in_python(step: int) -> None:
    """An injected hang: the interpreter runs (heartbeats go on), the training loop does not."""
    while True:
        time.sleep(0.5)


# ------------------------------------------------------------------------------ job
class Trainer:
    def __init__(self, cfg: TrainConfig, rep: Reporter | NullReporter, faults: Faults) -> None:
        self.cfg = cfg
        self.rep = rep
        self.d = Dist()
        self.faults = FaultPlan(faults, self.d.rank)
        self.run = run_from_env()
        want = resolve_device(cfg.device)
        if want == "cuda" and self.d.local_rank >= torch.cuda.device_count():
            raise UpsError(f"device: rank {self.d.rank} has LOCAL_RANK {self.d.local_rank} but this machine has "
                           f"{torch.cuda.device_count()} CUDA device(s): use --nproc {torch.cuda.device_count()} or device: cpu")
        self.device = torch.device(f"cuda:{self.d.local_rank}") if want == "cuda" else torch.device("cpu")
        ckpt = cfg.checkpoint_dir or (str(self.run.path / "checkpoints") if self.run else "checkpoints")
        self.ckpt_dir = Path(ckpt)
        self.wandb: Any = None
        self.skipped_total = 0
        self.checkpoints = 0

    def phase(self, name: str) -> None:
        self.rep.phase(name)
        self.faults.on_phase(name)

    def log(self, msg: str) -> None:
        if self.d.is_main:
            print(f"train: {msg}", flush=True)

    # -- W&B (rank 0 only) ---------------------------------------------------------------
    def start_wandb(self) -> None:
        if not self.d.is_main or self.cfg.wandb_mode == "disabled":
            return
        import wandb

        wdir = self.run.path if self.run else Path.cwd()
        self.wandb = wandb.init(project=self.cfg.wandb_project, mode=self.cfg.wandb_mode, dir=str(wdir),
                                config=asdict(self.cfg), name=self.run.run_id if self.run else None,
                                settings=wandb.Settings(silent=True, console="off"))
        if self.run:
            self.run.update_manifest(wandb={"id": self.wandb.id, "mode": self.cfg.wandb_mode, "dir": str(Path(self.wandb.dir).parent)})

    def finish_wandb(self, exit_code: int) -> None:
        if self.wandb is not None:
            self.wandb.finish(exit_code=exit_code)
            self.wandb = None

    # -- checkpoints (rank 0 only) -------------------------------------------------------
    def save_checkpoint(self, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        if not self.d.is_main:
            return
        self.phase("checkpoint")
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "config": asdict(self.cfg)}, buf)
        write_atomic(self.ckpt_dir / "last.pt", buf.getvalue())
        self.checkpoints += 1
        self.rep.metrics(checkpoints=self.checkpoints)
        self.phase("train")

    def load_checkpoint(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
        path = self.ckpt_dir / "last.pt"
        if not (self.cfg.resume and path.exists()):
            return 0
        state = torch.load(path, map_location=self.device, weights_only=True)
        trained_on = (state.get("config") or {}).get("tasks")
        if trained_on is not None and list(trained_on) != list(self.cfg.tasks):
            raise UpsError(f"{path}: checkpoint trained on tasks {trained_on}, this run has {self.cfg.tasks} "
                           "(same tasks in the same order to resume, or another checkpoint_dir)")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        self.log(f"resumed from {path} at step {state['step']}")
        return int(state["step"])

    # -- the loop ------------------------------------------------------------------------
    def execute(self) -> int:
        cfg, d, rep = self.cfg, self.d, self.rep
        # dist.init and ddp.wrap (and every collective) are recorded by ups.instrument, which
        # every process of a launched job runs: only the fault hooks remain here.
        self.faults.on_phase("dist.init")
        d.init(self.device)
        self.phase("data.load")
        pairs = load_pairs(cfg, check_cache(cfg))
        tokens, dim = pairs.token_shape
        self.phase("model.build")
        torch.manual_seed(cfg.seed)
        model = LatentOperator(tokens, dim, hidden=cfg.hidden, depth=cfg.depth, tasks=len(pairs.names)).to(self.device)
        self.faults.on_phase("ddp.wrap")
        ddp = torch.nn.parallel.DistributedDataParallel(model) if d.enabled else model
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        start = self.load_checkpoint(model, opt)
        sampler = TaskBatchSampler([len(t) for t in pairs.tasks], cfg.batch_size, rank=d.rank, world=d.world, seed=cfg.seed)
        for name, n, batches in zip(pairs.names, (len(t) for t in pairs.tasks), sampler.batches_per_task, strict=True):
            if batches == 0:
                raise UpsError(f"{name}: {n} pairs over {d.world} rank(s) is less than one batch of {cfg.batch_size} "
                               "per rank (lower batch_size, or cache more samples)")
        loader = torch.utils.data.DataLoader(pairs, batch_sampler=sampler)
        self.start_wandb()
        rep.set_total(cfg.steps, "steps")
        rep.set_step(start)
        self.phase("train")
        self.log(f"{len(pairs)} pairs ({', '.join(f'{t.task} {len(t)}' for t in pairs.tasks)}), {d.world} rank(s), "
                 f"device {self.device}, steps {start}->{cfg.steps}")
        task_steps = dict.fromkeys(pairs.names, 0)
        step, epoch, skips, t0 = start, 0, 0, time.perf_counter()
        while step < cfg.steps:
            sampler.set_epoch(epoch)
            for x, y, task in loader:
                if step >= cfg.steps:
                    break
                lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
                for g in opt.param_groups:
                    g["lr"] = lr
                t = int(task[0])
                loss, failed = self.forward_backward(ddp, x.to(self.device), y.to(self.device), task.to(self.device), step)
                # The one collective of every step, entered by every rank: [failed, loss, task, task^2].
                # An OOM on any rank turns into a skip on all ranks, never a one-sided call; the
                # task sums say whether every rank trained the same task (they always should).
                flag = torch.tensor([float(failed), 0.0 if failed else loss, float(t), float(t * t)], device=self.device)
                if not self.faults.skips_collective(step):
                    d.all_reduce_(flag)
                    check_same_task(flag, t, d, step, pairs.names)
                if flag[0].item() > 0:
                    opt.zero_grad(set_to_none=True)
                    skips += 1
                    self.free_memory()
                    self.skipped_total += 1
                    rep.metrics(skipped_steps=self.skipped_total)
                    self.log(f"step {step}: OOM on {int(flag[0].item())} rank(s), step skipped on every rank ({skips}/{cfg.max_oom_skips})")
                    if skips >= cfg.max_oom_skips:
                        raise TrainError(f"{skips} consecutive steps hit OOM on some rank; every rank stops (max_oom_skips={cfg.max_oom_skips})")
                    step += 1
                    rep.advance()
                    continue
                skips = 0
                self.sync_gradients(model)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                rep.advance()
                name, mean_loss = pairs.names[t], flag[1].item() / d.world
                task_steps[name] += 1
                # loss and lr come from the instrumentation's capture (backward(), the optimizer's
                # param groups), as for any program; what only this job knows is added here.
                rep.metrics(task=name, **{f"loss_{name}": round(mean_loss, 6), f"steps_{name}": task_steps[name]})
                if step % cfg.log_every == 0:
                    self.log(f"step {step}/{cfg.steps} {name} loss {mean_loss:.5f} lr {lr:.2e} "
                             f"{(step - start) / (time.perf_counter() - t0):.1f} steps/s")
                    if self.wandb is not None:
                        self.wandb.log({"loss": mean_loss, f"loss/{name}": mean_loss, "lr": lr}, step=step)
                if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    self.save_checkpoint(model, opt, step)
            epoch += 1
        self.phase("eval")
        per_task = self.evaluate(model, pairs)
        val = sum(per_task.values()) / len(per_task)
        rep.metrics(eval_loss=round(val, 6), **{f"eval_loss_{n}": round(v, 6) for n, v in per_task.items()})
        self.log(f"eval loss {val:.5f}" + (f" ({', '.join(f'{n} {v:.5f}' for n, v in per_task.items())})" if len(per_task) > 1 else ""))
        self.save_checkpoint(model, opt, step)
        if self.wandb is not None:
            self.wandb.log({"eval_loss": val, **{f"eval_loss/{n}": v for n, v in per_task.items()}}, step=step)
        return 0

    def forward_backward(self, ddp: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: torch.Tensor, step: int) -> tuple[float, bool]:
        """Local forward + backward with no gradient communication.

        DDP would all-reduce gradients inside backward; if one rank hit OOM in forward or
        backward, the others would wait in that all-reduce forever. So backward runs under
        ``no_sync()`` and gradients are averaged by :meth:`sync_gradients` only after the
        step's flag all-reduce says every rank succeeded.
        """
        try:
            ctx = ddp.no_sync() if isinstance(ddp, torch.nn.parallel.DistributedDataParallel) else _null()
            with ctx:
                self.faults.in_step(step)
                loss = torch.nn.functional.mse_loss(ddp(x, task), y)
                loss.backward()
            return float(loss.detach()), False
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not is_oom(exc):
                raise
            print(f"train: rank {self.d.rank} step {step}: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            return 0.0, True

    def sync_gradients(self, model: torch.nn.Module) -> None:
        if not self.d.enabled:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch._utils._flatten_dense_tensors(grads)
        self.d.all_reduce_(flat).div_(self.d.world)
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(synced)

    def free_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def evaluate(self, model: torch.nn.Module, pairs: MultiTaskPairs) -> dict[str, float]:
        """Mean loss per task over ``eval_batches`` random batches of it on each rank."""
        g = torch.Generator().manual_seed(1234 + self.d.rank)
        losses = []
        with torch.no_grad():
            for t, task in enumerate(pairs.tasks):
                idx = torch.randint(len(task), (self.cfg.eval_batches * self.cfg.batch_size,), generator=g)
                xs, ys = zip(*(task[int(i)] for i in idx), strict=True)
                task_ids = torch.full((len(xs),), t, dtype=torch.long, device=self.device)
                pred = model(torch.stack(xs).to(self.device), task_ids)
                losses.append(torch.nn.functional.mse_loss(pred, torch.stack(ys).to(self.device)))
        total = self.d.all_reduce_(torch.stack(losses).detach().clone())  # every rank evaluates and joins
        return {name: float(v) / self.d.world for name, v in zip(pairs.names, total.tolist(), strict=True)}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def parse_args(argv: list[str] | None) -> TrainConfig:
    return parse_job_args(TrainConfig, "python -m ups.jobs.train", argv)


@record  # torchrun: the exception goes to this rank's TORCHELASTIC_ERROR_FILE (root-cause rank)
def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
    except UpsError as exc:
        print(f"train: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rep = Reporter.from_env(unit="steps", interval=cfg.heartbeat_interval)
    trainer: Trainer | None = None
    code = 1
    with rep:
        try:
            trainer = Trainer(cfg, rep, Faults.from_env())
            if isinstance(rep, Reporter) and not rep.samples_gpu and trainer.device.type == "cuda":
                # Instrumented, the rank's record samples its CUDA device already; this is for
                # a job run with UPS_INSTRUMENT=0.
                from ups.gpu.torch_memory import cuda_memory_sampler

                rep.set_gpu_sampler(cuda_memory_sampler(trainer.device))
            code = trainer.execute()
            trainer.log("done")
        except UpsError as exc:
            print(f"train: rank {trainer.d.rank if trainer else '?'}: {exc}", file=sys.stderr, flush=True)
            rep.fail(str(exc), exit_code=exc.exit_code)
            code = exc.exit_code
        finally:
            if trainer is not None:
                trainer.finish_wandb(code)
                trainer.d.destroy()
    return code


if __name__ == "__main__":
    sys.exit(main())
