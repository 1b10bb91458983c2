"""Raw samples read in the precompute's DataLoader workers.

Workers only read: each opens its own HDF5 handles after it starts (``SampleReader`` keys
them by pid, so nothing opened before the fork is used) and reports through its own
Reporter (heartbeat, samples read, ``file#index``), which the job's watchdog reads. The
main process encodes and writes (ups.jobs.precompute, ups.jobs.writers).
"""

from __future__ import annotations

from typing import Any

import torch

from ups.data.shards import SampleReader
from ups.faults import Faults
from ups.jobs.rehearsal import before_read
from ups.status.reporter import NullReporter, Reporter

# This worker's Reporter, set by init_worker; a NullReporter in the main process.
_worker_reporter: Reporter | NullReporter = NullReporter()


def init_worker(worker_id: int, *, run_dir: str | None, rank: int, id_offset: int, interval: float) -> None:
    """Runs in each DataLoader worker after it starts: its own Reporter and stack file."""
    global _worker_reporter
    torch.set_num_threads(1)
    if run_dir:
        _worker_reporter = Reporter(
            run_dir, role="worker", rank=rank, worker=id_offset + worker_id, unit="samples",
            phase="idle", interval=interval,
        ).start()
        # multiprocessing children end with os._exit (no atexit): a Finalize runs there.
        from multiprocessing import util

        util.Finalize(None, _finish_worker_record, exitpriority=100)


def _finish_worker_record() -> None:
    _worker_reporter.done()
    _worker_reporter.close()


class SplitDataset(torch.utils.data.Dataset):
    """Raw samples of one split, by position in a list of global indices."""

    def __init__(self, reader: SampleReader, indices: list[int], faults: Faults, run_dir: str | None) -> None:
        self.reader = reader
        self.indices = indices
        self.faults = faults
        self.run_dir = run_dir

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, Any]:
        index = self.indices[k]
        rep = _worker_reporter
        shard, local = self.reader.index.locate(index)
        rep.item(f"{shard.name}#{local}")
        # Written before the read: a read or an open that hangs holding the GIL stops the
        # heartbeat thread too, and the watchdog blames the sample and file this record names.
        rep.phase("read" if self.reader.is_open(shard.path) else "data.open")
        info = torch.utils.data.get_worker_info()
        worker = None if info is None else info.id
        before_read(self.faults, self.run_dir, worker, index, rep.step)
        sample = self.reader.read(index)
        rep.advance()
        # Not written now: the heartbeat thread writes it within an interval. A status record
        # replaced twice per sample cost this worker more than its reads (ext4 frees the old
        # record's blocks and flushes the new one's on every rename over it).
        rep.phase("idle", flush=False)
        return {
            "index": index,
            "source": sample.source,
            "fields": torch.from_numpy(sample.fields),
            "params": torch.from_numpy(sample.params),
            "bc": torch.from_numpy(sample.bc),
        }


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    # Three tensors per batch, not three per sample: each tensor a worker hands over costs a
    # file-descriptor round trip with the main process.
    return {
        "index": [b["index"] for b in batch],
        "source": [b["source"] for b in batch],
        "fields": torch.stack([b["fields"] for b in batch]),
        "params": torch.stack([b["params"] for b in batch]),
        "bc": torch.stack([b["bc"] for b in batch]),
    }


def disable_torch_sigchld_handler() -> None:
    """torch raises from a SIGCHLD handler in the main thread when a worker dies: at any
    bytecode, mid-write included. We detect dead workers ourselves (watchdog + the loader's
    own liveness check on each get), so keep that handler out."""
    from torch.utils.data._utils import signal_handling

    signal_handling._SIGCHLD_handler_set = True
