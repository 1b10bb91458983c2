"""The latent-cache precompute job: HDF5 fields -> encoder -> one cache file per sample.

Run by ``ups launch precompute`` (through the supervisor) as
``python -m ups.jobs.precompute --config RUN/config.json``; also runs by hand.

Shape of the work (docs/design.md, "The jobs"):

* DataLoader workers only read raw fields (ups.jobs.readers). Each opens its own HDF5
  handles after it starts and reports through its own Reporter (heartbeat, samples read,
  ``file#index``).
* The main process batches, encodes on the device, and writes each sample atomically; on
  a box with CPUs to spare, a few forked writer processes do the writing (ups.jobs.writers:
  torch.save is GIL-bound and would otherwise cap the job below what the readers deliver).
* A watchdog thread beside the main loop reads the workers' status records
  (ups.jobs.watchdog). A worker that is stalled or unresponsive past ``worker_timeout`` gets
  its stacks dumped, then is killed; the main loop rebuilds the loader over the samples not
  yet written. A sample (or a file open) in flight on ``quarantine_after`` hung or dead
  workers is quarantined; after ``fallback_after`` worker failures the job goes on with
  ``num_workers=0``. The watchdog also serves control requests (``ups fallback``) within
  about a second.
* Faults injected with ``--inject`` (``UPS_FAULTS``) are rehearsed by ups.jobs.rehearsal.

This module holds the job loop (``PrecomputeJob``) and its entry point (``main``); what the job
does when a worker fails is ups.jobs.workerfaults.

Exit codes: 0 every sample cached; 3 finished with quarantined samples; 1 failed; 2 bad
input; 143 stopped by SIGTERM/Ctrl-C (workers ended, no temp files left).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ups.data import cache as cache_mod
from ups.data.shards import DataError, SampleReader, ShardIndex
from ups.data.tasks import TaskSpec, get_task
from ups.errors import UpsError
from ups.faults import PRECOMPUTE_FAULTS, Faults
from ups.jobs.readers import SplitDataset, collate, disable_torch_sigchld_handler, init_worker
from ups.jobs.rehearsal import write_fault_at
from ups.jobs.startup import EXIT_BAD_INPUT, resolve_device, run_from_env
from ups.jobs.watchdog import JobState, LoaderBroken, LoaderTimeout, Watchdog
from ups.jobs.workerfaults import WorkerFaults
from ups.jobs.writers import CacheWriters, write_batch
from ups.launch.config import PrecomputeConfig, parse_job_args
from ups.models.encoder import SteadyMapEncoder, build_encoder, weights_hash
from ups.status.reporter import NullReporter, Reporter

KNOWN_FAULTS = PRECOMPUTE_FAULTS
EXIT_OK, EXIT_FAILED, EXIT_PARTIAL, EXIT_STOPPED = 0, 1, 3, 143
# The DataLoader's own timeout is used as a poll: every POLL_S without a batch, the main
# loop gets control back to check for fallback, dead workers and our real timeout.
POLL_S = 0.5


class Stopped(BaseException):
    """SIGTERM or SIGINT: stop cleanly (BaseException, so no `except Exception` eats it)."""


class PrecomputeJob(WorkerFaults):
    """The whole job: plan the splits, run each through a loader, encode, write, summarize.

    What it does when a worker fails (the watchdog's actions, blame, fallback, quarantine) is
    :class:`~ups.jobs.workerfaults.WorkerFaults`."""

    def __init__(self, cfg: PrecomputeConfig, reporter: Reporter | NullReporter, faults: Faults) -> None:
        self.cfg = cfg
        self.rep = reporter
        self.faults = faults
        self.run = run_from_env()
        # `ups launch --observe-only`: the watchdog logs what it would do to a hung worker
        # (dump its stacks, kill it) and does nothing, so a false positive never becomes a kill loop.
        self.observe_only = self.run is not None and self.run.read_manifest().get("automatic") == "observe"
        self.rank = 0
        self.state = JobState(fallback=cfg.num_workers == 0)
        self.device = torch.device(resolve_device(cfg.device))
        self.dtype = torch.float16 if cfg.cache_dtype == "float16" else torch.float32
        self.done_count = 0
        self.total = 0
        self.write_workers = cfg.write_workers if cfg.write_workers >= 0 else _auto_write_workers()
        self.writers: CacheWriters | None = None  # started at the first parallel-mode write
        self.current_sources = {}
        self.blame_reasons = {}

    # -- main loop -----------------------------------------------------------------------
    def make_loader(self, dataset: SplitDataset, workers: int) -> torch.utils.data.DataLoader:
        kwargs: dict[str, Any] = {}
        if workers > 0:
            kwargs.update(
                timeout=POLL_S,
                prefetch_factor=self.cfg.prefetch_factor,
                worker_init_fn=functools.partial(
                    init_worker,
                    run_dir=str(self.run.path) if self.run else None,
                    rank=self.rank,
                    id_offset=self.state.generation * max(1, self.cfg.num_workers),
                    interval=self.cfg.heartbeat_interval,
                ),
                multiprocessing_context="fork",
                persistent_workers=False,
            )
        return torch.utils.data.DataLoader(
            dataset, batch_size=self.cfg.batch_size, shuffle=False, num_workers=workers, collate_fn=collate, **kwargs
        )

    def run_split(self, key: str, reader: SampleReader, folder: Path, todo: list[int], hash_: str, encoder: torch.nn.Module) -> None:
        st = self.state
        st.split_key = key
        done: set[int] = set()
        quarantined = {q.index for q in st.quarantined if q.task_split == key}
        self.current_sources = {reader.index.source(i): (key, i) for i in todo}
        while True:
            remaining = [i for i in todo if i not in done and i not in quarantined]
            if not remaining:
                return
            workers = 0 if st.fallback else self.cfg.num_workers
            dataset = SplitDataset(reader, remaining, self.faults, str(self.run.path) if self.run else None)
            loader = self.make_loader(dataset, workers)
            it = iter(loader)
            if workers:
                id_offset = st.generation * max(1, self.cfg.num_workers)
                st.loader_pids = {id_offset + k: w.pid for k, w in enumerate(it._workers)}
                self.event("loader.start", split=key, workers=workers, pids=list(st.loader_pids.values()), remaining=len(remaining))
            try:
                while True:
                    batch = self.next_batch(it, workers)
                    if batch is None:
                        break
                    self.encode_and_write(batch, folder, hash_, encoder, done)
                    if st.fallback and workers:
                        break  # rebuild in-process at once
            except LoaderBroken as exc:
                self.loader_failed(exc)
            finally:
                st.loader_pids = {}
                del it
                st.generation += 1
            self.collect_writes(done, keep=0)  # everything in flight is on disk before the rest is planned
            if st.fallback:
                self.close_writers()  # num_workers=0 means no extra processes at all
            quarantined |= self.apply_quarantine(key, reader)

    def next_batch(self, it: Any, workers: int) -> dict[str, Any] | None:
        """The next batch; None at the end or when a fallback asks to rebuild without workers."""
        if not workers:
            self.rep.phase("read")
            return next(it, None)
        # The per-batch phases (data.wait, encode, write) are not written on the spot: the
        # heartbeat thread writes them within an interval (none of these waits holds the GIL),
        # as the Reporter asks of phases that change several times a second.
        self.rep.phase("data.wait", flush=False)
        started = time.monotonic()
        while True:
            try:
                return next(it)
            except StopIteration:
                return None
            except UpsError:
                raise  # bad data re-raised from a worker: a clear error, not a hang
            except Exception as exc:  # see below
                # A dead worker surfaces as RuntimeError (torch names its pid), or, when it
                # died while handing over a tensor by file descriptor, as EOFError or
                # ConnectionError from multiprocessing's resource sharer.
                if not (isinstance(exc, RuntimeError) and "timed out" in str(exc)):
                    raise LoaderBroken(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'worker connection lost'}") from exc
            if self.state.fallback:
                return None
            if time.monotonic() - started > self.cfg.dataloader_timeout:
                raise LoaderTimeout(f"no batch for {self.cfg.dataloader_timeout:g} s (dataloader_timeout)")

    def encode_and_write(self, batch: dict[str, Any], folder: Path, hash_: str, encoder: torch.nn.Module, done: set[int]) -> None:
        self.rep.phase("encode", flush=False)
        with torch.inference_mode():
            fields = batch["fields"].to(self.device, non_blocking=True)
            latents = encoder(fields).to(self.dtype).cpu()
        self.rep.phase("write", flush=False)
        writers = self.writer_pool()
        n = len(batch["index"])
        base = writers.submitted if writers is not None else self.done_count
        run_dir = str(self.run.path) if self.run else None
        fail_at = write_fault_at(self.faults, run_dir, "write_enospc", base, n)
        hang_at = write_fault_at(self.faults, run_dir, "write_hang", base, n)
        self.rep.item(batch["source"][0])
        if writers is not None:
            writers.submit(folder, hash_, batch["index"], latents, batch["params"], batch["bc"], batch["source"], fail_at, hang_at)
            self.collect_writes(done, keep=writers.window)
            return

        def written(index: int, source: str) -> None:
            done.add(index)
            self.done_count += 1
            self.rep.advance()
            self.rep.item(source)

        write_batch(folder, hash_, batch["index"], latents, batch["params"], batch["bc"], batch["source"], fail_at, hang_at, written)

    # -- writer processes (parallel mode) ----------------------------------------------------
    def writer_pool(self) -> CacheWriters | None:
        """The writers, started on first use; None in legacy mode or after a fallback."""
        if self.state.fallback or self.write_workers == 0:
            return None
        if self.writers is None:
            self.writers = CacheWriters(self.write_workers, self.cfg.write_timeout)
            self.event("writers.start", count=self.writers.n, pids=self.writers.pids)
            self.say(f"{self.writers.n} cache writer processes (pids {', '.join(map(str, self.writers.pids))})")
        return self.writers

    def collect_writes(self, done: set[int], keep: int) -> None:
        if self.writers is None:
            return
        for indices in self.writers.collect(keep):
            done.update(indices)
            self.done_count += len(indices)
            self.rep.advance(len(indices))

    def close_writers(self, *, kill: bool = False) -> None:
        if self.writers is not None:
            self.writers.close(kill=kill)
            self.writers = None

    # -- whole job ---------------------------------------------------------------------------
    def execute(self) -> int:
        cfg, rep = self.cfg, self.rep
        rep.phase("data.open")
        plans = []
        for task in cfg.tasks:
            for split in cfg.splits:
                index = ShardIndex.discover(cfg.root, task, split, skip=cfg.skip_shards)
                plans.append((task, split, index))
                for name in index.skipped:
                    self.skip_shard(f"{task}_{split}", name, cfg.skip_shards[name])
        rep.phase("model.build")
        encoders: dict[str, tuple[torch.nn.Module, str]] = {}
        prepared = []
        already = 0
        for task, split, index in plans:
            spec = get_task(task)
            channels = index.sample_shape[-1]
            frames = steady_frames(spec, index)
            if task not in encoders:
                enc = build_encoder(channels, spec.spatial_dims, latent_tokens=cfg.latent_tokens, latent_dim=cfg.latent_dim,
                                    seed=cfg.seed, checkpoint=cfg.encoder_checkpoint).to(self.device)
                whash = weights_hash(enc)
                encoders[task] = (SteadyMapEncoder(enc, spec.input_channels) if frames else enc, whash)
            enc, whash = encoders[task]
            # Without the skipped shards, later samples sit at other indices; a steady cache holds
            # other frames than an older one of the same data: either way another hash, never mixed.
            skipped = {"skipped_shards": list(index.skipped)} if index.skipped else {}
            hash_ = cache_mod.config_hash({**cfg.latent_hash_parts(), "task": task, "encoder": whash,
                                           "sample_shape": list(index.sample_shape), **({"frames": frames} if frames else {}),
                                           **skipped})
            folder = cache_mod.split_dir(cfg.cache_dir, task, split)
            meta = {"task": task, "split": split, "hash": hash_, "count": len(index), "encoder_hash": whash,
                    "dtype": cfg.cache_dtype, "sample_shape": list(index.sample_shape),
                    "latent_shape": [2 if frames else index.sample_shape[0], cfg.latent_tokens, cfg.latent_dim],
                    "frames": frames or "time",
                    "config": cfg.latent_hash_parts(), "source_root": str(Path(cfg.root).resolve()), **skipped}
            valid = cache_mod.prepare_split(folder, meta, overwrite=cfg.overwrite)
            todo = [i for i in range(len(index)) if i not in valid]
            already += len(valid)
            prepared.append((f"{task}_{split}", SampleReader(index), folder, todo, hash_, enc))
        self.total = already + sum(len(p[3]) for p in prepared)
        rep.set_total(self.total, "samples")
        rep.set_step(already)
        self.event("plan", total=self.total, cached=already, todo=self.total - already,
                   mode="legacy" if self.state.fallback else f"parallel ({cfg.num_workers} workers)")
        self.say(f"{self.total} samples, {already} already cached, "
                 f"{'num_workers=0' if self.state.fallback else f'{cfg.num_workers} workers'}, device {self.device}")
        rep.metrics(mode="legacy" if self.state.fallback else "parallel", workers=0 if self.state.fallback else cfg.num_workers)
        watchdog = Watchdog(self)
        if self.run is not None:
            watchdog.start()
        try:
            for key, reader, folder, todo, hash_, enc in prepared:
                self.run_split(key, reader, folder, todo, hash_, enc)
                rep.metrics(mode="legacy" if self.state.fallback else "parallel")
                self._record_quarantine(folder, key)
        except BaseException:
            self.close_writers(kill=True)
            raise
        finally:
            watchdog.stop.set()
        self.close_writers()
        return self.summarize()

    def _record_quarantine(self, folder: Path, key: str) -> None:
        q = [x.index for x in self.state.quarantined if x.task_split == key and x.index is not None]
        if q:
            meta = cache_mod.read_metadata(folder) or {}
            meta["quarantined"] = sorted(q)
            from ups.status.files import write_atomic

            write_atomic(folder / cache_mod.METADATA_NAME, (json.dumps(meta, indent=1) + "\n").encode())

    def summarize(self) -> int:
        st = self.state
        summary = {
            "total": self.total,
            "cached": self.total - sum(q.index is not None for q in st.quarantined),
            "quarantined": [asdict(q) for q in st.quarantined],
            "worker_failures": st.worker_failures,
            "fallback": st.fallback_reason if st.fallback and self.cfg.num_workers else None,
        }
        if self.run is not None:
            self.run.update_manifest(precompute=summary)
        self.event("summary", **summary)
        if st.quarantined:
            names = ", ".join(f"{q.task_split}:{q.source}" for q in st.quarantined[:10])
            self.say(f"finished with {len(st.quarantined)} quarantined sample(s) or skipped shard(s): {names}")
            self.rep.done(exit_code=EXIT_PARTIAL)
            return EXIT_PARTIAL
        self.say(f"done: {self.total} samples cached")
        return EXIT_OK


def steady_frames(spec: TaskSpec, index: ShardIndex) -> str | None:
    """What a steady task's two latent frames hold; None for a time-dependent task (its
    frames are time steps). A steady task's files must hold one frame per sample."""
    if not spec.steady:
        return None
    if index.sample_shape[0] != 1:
        raise DataError(f"{index.shards[0].path}: {spec.name} is a steady task (one frame per sample), "
                        f"but its samples have {index.sample_shape[0]} frames")
    return "coefficient,solution"


def _auto_write_workers() -> int:
    """Writers only where CPUs are to spare beside the readers and the encoder."""
    return min(4, len(os.sched_getaffinity(0)) // 4) if hasattr(os, "sched_getaffinity") else 0


def _on_signal(signum: int, _frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _cleanup_temp_files(cfg: PrecomputeConfig) -> None:
    root = Path(cfg.cache_dir)
    if root.is_dir():
        for p in root.glob("*/.*.tmp"):
            try:
                p.unlink()
            except OSError:
                pass


def parse_args(argv: list[str] | None) -> tuple[PrecomputeConfig, Faults]:
    return parse_job_args(PrecomputeConfig, "python -m ups.jobs.precompute", argv), Faults.from_env()


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for the next batch instead of returning it to the kernel.

    The encoder's activations on the CPU are tens of MB per batch (16 x 32 x 256 samples:
    ~16k page faults a batch). With glibc's default heuristics that memory went back to the
    kernel after each batch and was faulted in again for the next: 3.3M minor faults a run,
    the encoder at 90 ms of CPU a batch instead of 37 ms. Blocks up to 32 MB come from the
    heap, and up to 256 MB of free heap stays mapped (the job's peak RSS, not more). Linux
    with glibc only; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 256 << 20))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, faults = parse_args(argv)
    except UpsError as exc:
        print(f"precompute: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    keep_freed_memory()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    disable_torch_sigchld_handler()
    rep = Reporter.from_env(unit="samples", interval=cfg.heartbeat_interval)
    code = EXIT_FAILED
    with rep:
        try:
            job = PrecomputeJob(cfg, rep, faults)
            if isinstance(rep, Reporter) and job.device.type == "cuda":
                from ups.gpu.torch_memory import cuda_memory_sampler

                rep.set_gpu_sampler(cuda_memory_sampler(job.device))
            code = job.execute()
        except Stopped as stop:
            _cleanup_temp_files(cfg)
            print(f"precompute: stopped by {stop}; workers ended, no temp files left", file=sys.stderr)
            rep.fail(f"stopped by {stop}", exit_code=EXIT_STOPPED)
            code = EXIT_STOPPED
        except (DataError, UpsError) as exc:
            print(f"precompute: {exc}", file=sys.stderr)
            rep.fail(str(exc), exit_code=EXIT_BAD_INPUT)
            code = EXIT_BAD_INPUT
        except OSError as exc:
            _cleanup_temp_files(cfg)  # a writer killed mid-file leaves its temp file
            print(f"precompute: {exc.strerror or exc}", file=sys.stderr)
            rep.fail(exc, exit_code=EXIT_FAILED)
            code = EXIT_FAILED
        except Exception as exc:
            rep.fail(exc, exit_code=EXIT_FAILED)
            raise
    return code


if __name__ == "__main__":
    exit_code = main()
    # Every file, record and event is written and every child process has ended by now:
    # leave without the interpreter's teardown of torch's module graph (~0.5 s measured on a
    # 2-CPU box, on the critical path of every launch: the run ends when this process does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
