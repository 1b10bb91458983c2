"""The DataLoader: the rank's batches, the epoch, and the workers' own records.

- ``next(it)`` on a DataLoader iterator is the phase ``data``; after the first batch the
  base phase is ``train``; the batch within the current pass is the record's ``item`` and
  counts as progress until an optimizer steps; one batch in eight has its size read
  (``BATCH_SIZE_EVERY``). ``DistributedSampler.set_epoch`` is the epoch.
- Workers (fork and spawn): each gets its own record (heartbeat, samples fetched, the
  dataset index in flight) from :class:`WorkerInit`, a wrapper around the loader's
  ``worker_init_fn`` that starts before the user's own; the rank writes the end of a worker
  that could not write its own.
- ``UPS_FORCE_NUM_WORKERS=0`` (``ups relaunch --num-workers 0``) makes every DataLoader
  load in the main process.
"""

from __future__ import annotations

import os
import sys

from ups.instrument import metrics, patching, process
from ups.instrument.torch.phases import AUTO_PHASES
from ups.instrument.torch.state import get_ident, note_cuda_device, rank_reporter, track

ENV_FORCE_NUM_WORKERS = "UPS_FORCE_NUM_WORKERS"


def patch_data(torch) -> None:
    dl = torch.utils.data.dataloader
    patching.patch(dl._BaseDataLoaderIter, "__next__", _make_next)
    patching.patch(dl._MultiProcessingDataLoaderIter, "__init__", _make_mp_iter_init)
    patching.patch(dl._MultiProcessingDataLoaderIter, "_shutdown_workers", _make_shutdown_workers)
    patching.patch(dl.DataLoader, "__init__", _make_loader_init)
    patching.patch(torch.utils.data.DistributedSampler, "set_epoch", _make_set_epoch)


def _patch_fetchers() -> None:
    """In a DataLoader worker only (the main process never pays for it): count samples and
    name the index in flight."""
    from torch.utils.data._utils import fetch

    from ups.instrument import io_hooks
    from ups.instrument.torch import rehearse

    track.rehearse = rehearse.wanted()
    patching.patch(fetch._MapDatasetFetcher, "fetch", _make_fetch)
    patching.patch(fetch._IterableDatasetFetcher, "fetch", _make_fetch)
    patching.patch(fetch._MapDatasetFetcher, "__init__", _make_map_fetcher_init)
    io_hooks.patch_open()


class _SampleNoting:
    """Stands between a worker's fetcher and a map-style dataset: the record names the one
    index in flight (not only its batch), forgets the file the previous sample opened, and
    keeps the index whose ``__getitem__`` raised: the worker goes on to prefetch the next
    batch, which would otherwise overwrite it before the rank re-raises the error."""

    def __init__(self, dataset) -> None:
        self._ups_dataset = dataset

    def __getattr__(self, name: str):  # everything else is the dataset's own
        return getattr(self._ups_dataset, name)

    def __len__(self) -> int:
        return len(self._ups_dataset)

    def __getitem__(self, idx):
        rep = process.state.rep
        if rep is None:
            return self._ups_dataset[idx]
        from ups.instrument import io_hooks

        rep.item(f"index {idx}")
        io_hooks.forget_file(rep)
        if track.rehearse:
            from ups.instrument.torch import rehearse

            rehearse.on_sample(rep.rank)
        try:
            return self._ups_dataset[idx]
        except Exception as exc:
            rep.metrics(raised_item=f"index {idx}", raised=type(exc).__name__)
            rep.flush()
            raise


def _make_map_fetcher_init(original):
    def __init__(self, dataset, *args, **kwargs):
        original(self, dataset, *args, **kwargs)
        if process.state.rep is not None and not isinstance(self.dataset, _SampleNoting):
            self.dataset = _SampleNoting(self.dataset)

    return __init__


class _BatchItem:
    """The record's ``item`` for a DataLoader iterator: ``batch 12/250 (loader 1)``, formatted by
    the heartbeat thread; the training thread only stores the count."""

    __slots__ = ("i", "loader", "n")

    def __init__(self, n, loader: int) -> None:  # int or "?"
        self.i = 0
        self.n = n
        self.loader = loader

    def __str__(self) -> str:
        return f"batch {self.i}/{self.n}" + (f" (loader {self.loader})" if self.loader else "")


def _batch_item(it) -> _BatchItem:
    try:
        n = len(it)
    except TypeError:
        n = "?"
    item = it.__dict__["_ups_item"] = _BatchItem(n, it.__dict__.get("_ups_loader", 0))
    return item


BATCH_SIZE_EVERY = 8  # batches: the size of one in eight is read, weighted by eight


def _make_next(original):
    def __next__(self):
        # On every batch of the program: the minimum here (a phase, a count, a monotonic time);
        # the item's text and the batch's size are left to the heartbeat thread or sampled.
        rep = process.state.rep
        t = track
        if rep is None or rep.role != "rank" or get_ident() != t.main:
            return original(self)
        outer = not t.depth
        if outer:
            prev = rep.enter("data")
        t.depth += 1
        try:
            batch = original(self)
        except StopIteration:
            t.depth -= 1
            if outer:
                rep.phase(t.base if prev in AUTO_PHASES else prev, flush=False)
            raise
        except BaseException:
            t.depth -= 1  # the record keeps the phase it died in
            raise
        t.depth -= 1
        if t.base == "start":
            t.base = "train"
        add = 0 if t.opt_steps else 1
        if outer:
            rep.leave(t.base if prev in AUTO_PHASES else prev, add)
        else:
            rep.auto_progress(add=add)
        n = t.batches = t.batches + 1
        item = self.__dict__.get("_ups_item") or _batch_item(self)
        item.i = self._num_yielded
        rep.current_item = item  # Reporter.item(), without the call
        if n % BATCH_SIZE_EVERY == 1:
            metrics.capture.note_batch(batch, BATCH_SIZE_EVERY if n > 1 else 1)
            if n % 64 == 1:
                note_cuda_device()
        return batch

    return __next__


def _loader_id(loader) -> int:
    lid = loader.__dict__.get("_ups_loader")
    if lid is None:
        lid = track.loaders
        track.loaders += 1
        loader.__dict__["_ups_loader"] = lid
    return lid


def _make_loader_init(original):
    import inspect

    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        forced = os.environ.get(ENV_FORCE_NUM_WORKERS)
        if forced is not None and process.state.rep is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None
            if bound is not None:
                asked = bound.arguments.get("num_workers", 0)
                if asked != int(forced):
                    bound.arguments["num_workers"] = int(forced)
                    if int(forced) == 0:
                        # Options that only exist with worker processes would make DataLoader refuse.
                        for key, value in (("persistent_workers", False), ("prefetch_factor", None), ("timeout", 0),
                                           ("multiprocessing_context", None)):
                            if key in bound.arguments:
                                bound.arguments[key] = value
                    if not track.forced_warned:
                        track.forced_warned = True
                        print(f"ups: DataLoader num_workers={asked} forced to {forced} (relaunched with "
                              f"--num-workers {forced})", file=sys.stderr, flush=True)
                    process.state.rep.metrics(forced_num_workers=int(forced))
                original(*bound.args, **bound.kwargs)
                _loader_id(self)
                return
        original(self, *args, **kwargs)
        _loader_id(self)

    return __init__


class WorkerInit:
    """Wraps a DataLoader's ``worker_init_fn``: starts the worker's record first. Picklable, so
    spawn-context workers get it too (it is unpickled in the child from this module).

    A worker's record file is its slot's (``rank-0-worker-1``): the next epoch's worker of
    the slot takes it over. The new record carries the final state of the one before
    (``metrics.previous``), so the launcher, reading that end late on a loaded box, still
    reads a normal end as one (ups.launch.exits)."""

    def __init__(self, loader: int, rank: int, fn, owner: str | None = None) -> None:
        self.loader = loader
        self.rank = rank
        self.fn = fn
        self.owner = owner  # the record name of a process that is not a rank (its workers are its own)

    def record_name(self, worker_id: int) -> str:
        if self.owner:
            return f"{self.owner}-worker-{worker_id}" if not self.loader else \
                f"{self.owner}-loader-{self.loader}-worker-{worker_id}"
        from ups.status.schema import process_name

        return process_name("worker", self.rank, worker_id, loader=self.loader)

    def __call__(self, worker_id: int) -> None:
        if process.state.rep is None:
            try:
                name = self.record_name(worker_id)
                before = _slot_record(name)
                previous = None
                if before is not None and before.get("pid") != os.getpid():
                    previous = {k: before.get(k) for k in ("pid", "pid_start", "state", "phase", "step", "error",
                                                           "exit_code")}
                process.start_reporter("worker", worker=worker_id, loader=self.loader, rank=self.rank,
                                       name=name if self.owner else None,
                                       metrics={"previous": previous} if previous else None)
                _patch_fetchers()
            except Exception as exc:  # noqa: BLE001
                process.warn(f"no status record for DataLoader worker {worker_id} ({type(exc).__name__}: {exc})")
        if self.fn is not None:
            self.fn(worker_id)

    def ended(self, workers) -> None:  # the iterator's multiprocessing.Process list
        """In the rank, once the DataLoader has joined its workers: a worker whose record still
        says running never wrote its end (it left through ``os._exit``, or a signal killed it);
        the rank writes it, with the exit code or the signal it saw."""
        for worker_id, w in enumerate(workers):
            code = w.exitcode
            if code is not None:
                _write_worker_end(self.record_name(worker_id), w.pid, code)


def _slot_path(name: str) -> str | None:
    run_dir = os.environ.get("UPS_RUN_DIR")
    return os.path.join(run_dir, "status", f"{name}.json") if run_dir else None


def _slot_record(name: str) -> dict | None:
    """The record now in a worker slot's file, as a plain dict (None: none, or unreadable)."""
    path = _slot_path(name)
    if path is None:
        return None
    from ups.status.safeio import BadFile, read_json  # the runs folder is outside input

    try:
        data = read_json(path)
    except (BadFile, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_worker_end(name: str, pid: int, code: int) -> None:
    data = _slot_record(name)
    path = _slot_path(name)
    if data is None or path is None or data.get("pid") != pid or data.get("state") != "running":
        return  # it wrote its own end, or the file is another process's now
    import json

    from ups.status.confined import make_dirs, write_atomic_at

    if code == 0:
        data.update(state="done", phase="done", exit_code=0)
    else:
        import signal

        try:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        except ValueError:
            how = f"killed by signal {-code}"
        data.update(state="failed", exit_code=code, error=f"DataLoader worker {how}",
                    error_site="as its rank's DataLoader saw it")
    try:
        # status/ opened O_NOFOLLOW under the run folder and the record renamed into it: never
        # through a link (docs/safety.md), like the Reporter's own writes.
        folder = make_dirs(os.environ["UPS_RUN_DIR"], "status")
        try:
            write_atomic_at(folder, os.path.basename(path), json.dumps(data).encode())
        finally:
            os.close(folder)
    except OSError:
        pass


def _make_shutdown_workers(original):
    def _shutdown_workers(self):
        first = not getattr(self, "_shutdown", True)
        try:
            return original(self)
        finally:
            init = getattr(self, "_ups_worker_init", None)
            if first and init is not None:
                try:
                    init.ended(getattr(self, "_workers", ()))
                except Exception:  # noqa: BLE001 - noting the ends must never cost the program
                    pass

    return _shutdown_workers


def _make_mp_iter_init(original):
    def __init__(self, loader, *args, **kwargs):
        rep = process.state.rep
        if rep is None:
            return original(self, loader, *args, **kwargs)
        lid = _loader_id(loader)
        self._ups_loader = lid
        user_fn = loader.worker_init_fn
        init = WorkerInit(lid, rep.rank or 0, user_fn, None if rep.role == "rank" else rep.name)
        self._ups_worker_init = init
        loader.worker_init_fn = init
        try:
            original(self, loader, *args, **kwargs)
        finally:
            loader.worker_init_fn = user_fn

    return __init__


def _describe_index(index) -> str:
    if isinstance(index, list | tuple):
        if not index:
            return "index []"
        first, last = index[0], index[-1]
        if first is None:
            return f"batch of {len(index)}"
        if len(index) == 1:
            return f"index {first}"
        if isinstance(first, int) and isinstance(last, int) and last - first == len(index) - 1:
            return f"index {first}-{last}"
        return f"index {first} (+{len(index) - 1} more)"
    return "next item" if index is None else f"index {index}"


def _make_fetch(original):
    def fetch(self, possibly_batched_index):
        rep = process.state.rep
        if rep is None:
            return original(self, possibly_batched_index)
        rep.item(_describe_index(possibly_batched_index))
        # Written before the dataset is touched: a read that blocks holding the GIL (h5py on a
        # hung mount) stops the heartbeat thread too, and the record must already say what
        # (waiting out a heartbeat write in progress, which could not write it again after).
        rep.phase("fetch", flush=False)
        rep.flush(wait=0.25)
        data = original(self, possibly_batched_index)
        rep.auto_progress(add=len(possibly_batched_index) if isinstance(possibly_batched_index, list | tuple) else 1)
        rep.phase("idle", flush=False)
        return data

    return fetch


def _make_set_epoch(original):
    def set_epoch(self, epoch):
        original(self, epoch)
        rep = rank_reporter()
        if rep is not None:
            rep.metrics(epoch=epoch)

    return set_epoch
