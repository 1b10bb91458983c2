"""Cache files written by a few forked processes, for the precompute's parallel mode.

Why: ``torch.save`` of one small sample costs about 0.5 ms of pure-Python pickling under the
GIL, so a main process that encodes *and* writes tops out near 1.5k samples/s however many
DataLoader workers read for it (measured on an H100 box: reads alone 2.7k/s with 4 workers,
encoding 30k/s, the whole job 1.1k/s). Threads do not help (GIL); processes do.

How it stays safe:

* Writers fork from the main process after its encoder is built and only ever touch CPU
  tensors rebuilt from numpy arrays: no CUDA in a child.
* Each writer dies with the main process (``PR_SET_PDEATHSIG``), ignores SIGINT and takes
  SIGTERM's default action, so stopping the job stops them; temp files they leave are the
  job's usual cleanup.
* The main process keeps at most ``2 * n`` batches in flight and waits on the oldest one;
  a batch that takes longer than ``timeout`` fails the job with the files it was writing
  (slow or hung storage) instead of hanging it silently.
* A failed write (disk full ...) comes back as the same ``OSError`` the in-process path
  raises: one line naming the file, nothing partial left behind.
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ups.data import cache as cache_mod

PR_SET_PDEATHSIG = 1


def _writer_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's own broken-pipe check remains
        pass


def write_batch(folder: str | Path, hash_: str, indices: list[int], latents: Any, params: Any, bc: Any, sources: list[str],
                fail_at: int | None = None, hang_at: int | None = None,
                written: Callable[[int, str], None] | None = None) -> list[int]:
    """Write one batch's samples, each atomically (in a writer process, or in the job's own).

    ``fail_at`` / ``hang_at``: the position in the batch where an injected disk-full or a hang
    in the write happens (faults ``write_enospc`` and ``write_hang``).
    """
    import torch

    for j, index in enumerate(indices):
        if j == hang_at:
            while True:  # a write that never returns, as on a dead network mount
                time.sleep(3600)
        write = _half_then_enospc if j == fail_at else os.write
        latent = latents[j]
        try:
            cache_mod.write_sample(Path(folder), index, torch.from_numpy(latent) if isinstance(latent, np.ndarray) else latent,
                                   params[j], bc[j], hash_=hash_, source=sources[j], write=write)
        except OSError as exc:
            target = Path(folder) / cache_mod.sample_name(index)
            raise OSError(exc.errno, f"cannot write {target}: {exc.strerror}; nothing partial was left") from None
        if written is not None:
            written(index, sources[j])
    return list(indices)


def _half_then_enospc(fd: int, data: Any) -> int:
    """Injected disk-full: the first write lands halfway, then ENOSPC (as a full disk does)."""
    view = memoryview(data)
    if len(view) > 1:
        os.write(fd, view[: len(view) // 2])
    raise OSError(errno.ENOSPC, "No space left on device (injected fault write_enospc)")


class CacheWriters:
    """``n`` writer processes and the batches in flight to them, oldest first."""

    def __init__(self, n: int, timeout: float) -> None:
        import multiprocessing as mp

        self.n = n
        self.timeout = timeout
        self.window = 2 * n
        self.pool = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("fork"), initializer=_writer_init)
        self.pool.submit(os.getpid).result()  # a fork pool starts all its processes at the first submit
        self.pids = sorted(self.pool._processes)
        self.pending: deque[tuple[cf.Future, list[int], float, str]] = deque()
        self.submitted = 0

    def submit(self, folder: Path, hash_: str, indices: list[int], latents: Any, params: Any, bc: Any, sources: list[str],
               fail_at: int | None = None, hang_at: int | None = None) -> None:
        fut = self.pool.submit(write_batch, str(folder), hash_, list(indices), _np(latents), _np(params), _np(bc), list(sources),
                               fail_at, hang_at)
        first = str(folder / cache_mod.sample_name(indices[0]))
        self.pending.append((fut, list(indices), time.monotonic(), first))
        self.submitted += len(indices)

    def collect(self, keep: int, tick: Callable[[], None] = lambda: None) -> Iterator[list[int]]:
        """Yield the indices of finished batches until at most ``keep`` are in flight.

        Waits on the oldest batch in slices of 0.5 s (``tick`` runs between them); raises its
        OSError, or ETIMEDOUT naming its files once it has taken longer than ``timeout``.
        """
        while self.pending:
            fut, indices, started, first = self.pending[0]
            if not fut.done():
                if len(self.pending) <= keep:
                    return
                try:
                    fut.result(timeout=0.5)
                except cf.TimeoutError:
                    tick()
                    if time.monotonic() - started > self.timeout:
                        raise OSError(errno.ETIMEDOUT, f"writing {len(indices)} cache file(s) from {first} took over "
                                      f"{self.timeout:g} s (write_timeout): the file system is not answering") from None
                    continue
                except Exception:  # noqa: BLE001 - re-raised below with the pool's own text
                    pass
            self.pending.popleft()
            try:
                yield fut.result()
            except cf.process.BrokenProcessPool:
                raise OSError(errno.EIO, f"a cache writer process died while writing {first}") from None

    def close(self, *, kill: bool = False) -> None:
        """Stop the writers: ``kill`` ends them at once (the job is failing or stopping)."""
        if kill:
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.pool.shutdown(wait=True, cancel_futures=kill)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
