"""Finding, validating and lazily reading PDEBench-layout HDF5 shards.

Nothing here keeps a file open across a fork: :class:`ShardIndex` opens each shard only to
read its header and closes it, and :class:`SampleReader` opens handles on first use in the
current process (checked by pid), so a DataLoader worker always reads through its own
handles. h5py is imported inside functions: this module is on the CLI's path.

The index can come from a manifest written next to the data (``{task}_{split}.index.json``,
written by ``ups data synth``): then no shard is opened up front at all, which matters on
network storage, where a single hung open would stop the job before it starts.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import stat
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ups.data.tasks import RAW_SPLIT_FRACTIONS, TaskSpec, check_split, get_task
from ups.errors import UpsError

HEADER_OPEN_TIMEOUT_S = 10.0


class DataError(UpsError):
    """A data file is missing, unreadable or of the wrong shape (names the file)."""


@dataclass(frozen=True)
class ShardInfo:
    path: str
    count: int  # samples taken from this file
    offset: int = 0  # first sample index inside the file (raw PDEBench splits)
    layout: str = "ups"  # "ups" (dataset `data`) or "pdebench" (dataset `tensor`)
    sample_shape: tuple[int, ...] = ()  # (T, X[, Y], C)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class Sample:
    index: int  # global index in the split
    source: str  # "file.h5#local"
    fields: np.ndarray  # float32 (T, X[, Y], C)
    params: np.ndarray  # float32 (P,)
    bc: np.ndarray  # float32 (B,)


def manifest_path(root: str | os.PathLike[str], task: str, split: str) -> Path:
    return Path(root) / f"{task}_{split}.index.json"


@contextmanager
def alarm(seconds: float, what: str) -> Iterator[None]:
    """Interrupt a blocking open after ``seconds`` (SIGALRM fires even inside h5py's open).

    Only in the main thread; elsewhere the body runs unbounded.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(_sig: int, _frame: Any) -> None:
        raise TimeoutError(f"{what} did not return within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _check_regular_file(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot stat ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise DataError(f"{path}: {kind}; opening it would block")


def read_header(path: str, spec: TaskSpec, layout: str, timeout: float = HEADER_OPEN_TIMEOUT_S) -> tuple[int, tuple[int, ...]]:
    """(sample count, per-sample shape) of one shard, with the checks that name the file.

    The open is bounded by SIGALRM, which interrupts a FIFO but not a wait in the kernel
    (a hung network mount): callers that must never hang run this in a process they can
    kill (ups.data.probe)."""
    import h5py

    _check_regular_file(path)
    key = "data" if layout == "ups" else "tensor"
    try:
        with alarm(timeout, f"opening {path}"), h5py.File(path, "r") as f:
            if key not in f:
                raise DataError(f"{path}: no dataset {key!r} (has: {', '.join(sorted(f.keys())) or 'nothing'})")
            shape = tuple(int(s) for s in f[key].shape)
            if layout == "pdebench" and spec.raw_extra_channel and spec.raw_extra_channel not in f:
                raise DataError(f"{path}: no dataset {spec.raw_extra_channel!r} for task {spec.name}")
    except DataError:
        raise
    except TimeoutError as exc:
        raise DataError(f"{path}: {exc} (FIFO or hung network mount?)") from None
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({_h5_reason(exc)})") from None
    expected = spec.data_rank if layout == "ups" else spec.data_rank - 1
    if len(shape) != expected:
        raise DataError(
            f"{path}: dataset {key!r} has shape {shape}, expected rank {expected} for task {spec.name}"
        )
    if layout == "ups":
        return shape[0], shape[1:]
    channels = 1 + (1 if spec.raw_extra_channel else 0)
    return shape[0], (*shape[1:], channels)


def _h5_reason(exc: OSError) -> str:
    text = str(exc)
    for hint in ("truncated file", "file signature not found", "bad object header", "Unable to open"):
        if hint in text:
            return hint
    return text.splitlines()[0][:120] if text else type(exc).__name__


def candidate_files(root: str | os.PathLike[str], task: str, split: str, *, use_manifest: bool = True) -> list[tuple[str, str]]:
    """(path, layout) of every shard of ``task``/``split`` under ``root``, none opened.

    From the manifest when there is one; else ``{task}_{split}.h5`` and
    ``{task}_{split}_*.h5`` (layout "ups"), or, when there are none, the task's raw PDEBench
    files (layout "pdebench", every split a range of each file)."""
    spec = get_task(task)
    root = Path(root)
    man = manifest_path(root, task, split)
    if use_manifest and man.is_file():
        return [(s.path, s.layout) for s in _read_manifest(root, man)]
    files = sorted(glob.glob(str(root / f"{task}_{split}.h5"))) + sorted(glob.glob(str(root / f"{task}_{split}_*.h5")))
    if files:
        return [(path, "ups") for path in files]
    return [(path, "pdebench") for path in sorted(glob.glob(str(root / spec.raw_glob)))]


def no_shards_message(root: Path, task: str, split: str, *, skipped: int = 0) -> str:
    left_out = f" ({skipped} skipped)" if skipped else ""
    return (f"{root}: no shards for {task}/{split}{left_out} (looked for {task}_{split}.h5, "
            f"{task}_{split}_*.h5 and {get_task(task).raw_glob}); make some with `ups data synth`")


def split_range(layout: str, n: int, split: str) -> tuple[int, int]:
    """(offset, count) of ``split``'s samples in a shard of ``n`` samples."""
    if layout != "pdebench":
        return 0, n
    lo, hi = RAW_SPLIT_FRACTIONS[split]
    start, stop = int(lo * n), int(hi * n)
    return start, max(0, stop - start)


def _read_manifest(root: Path, man: Path) -> list[ShardInfo]:
    try:
        data = json.loads(man.read_text())
        return [
            ShardInfo(str(root / s["file"]), int(s["count"]), int(s.get("offset", 0)), s.get("layout", "ups"), tuple(s["sample_shape"]))
            for s in data["shards"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{man}: unreadable shard manifest ({exc})") from None


class ShardIndex:
    """Global sample index -> (shard, local index) for one task and split.

    ``skipped``: names of shards left out on purpose (``skip`` in :meth:`discover`); the
    samples after them take lower global indices than they would with every shard."""

    def __init__(self, task: str, split: str, shards: list[ShardInfo], skipped: tuple[str, ...] = ()) -> None:
        self.task = task
        self.split = split
        self.shards = shards
        self.skipped = skipped
        self._starts = np.cumsum([0] + [s.count for s in shards])

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.shards[0].sample_shape if self.shards else ()

    def locate(self, index: int) -> tuple[ShardInfo, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range 0..{len(self) - 1}")
        k = int(np.searchsorted(self._starts, index, side="right") - 1)
        shard = self.shards[k]
        return shard, shard.offset + index - int(self._starts[k])

    def source(self, index: int) -> str:
        shard, local = self.locate(index)
        return f"{shard.name}#{local}"

    def to_manifest(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "split": self.split,
            "shards": [
                {"file": s.name, "count": s.count, "offset": s.offset, "layout": s.layout, "sample_shape": list(s.sample_shape)}
                for s in self.shards
            ],
        }

    # -- building ----------------------------------------------------------------------
    @classmethod
    def discover(
        cls, root: str | os.PathLike[str], task: str, split: str, *, use_manifest: bool = True, skip: Collection[str] = (),
    ) -> ShardIndex:
        """Find the shards of ``task``/``split`` under ``root`` and check them up front.

        With a manifest next to the data, shard headers are taken from it (no open); each
        listed file must still exist. Otherwise each shard is opened once, under a timeout.
        Shards named in ``skip`` (file names) are left out before anything is opened.
        """
        spec = get_task(task)
        check_split(split)
        root = Path(root)
        if not root.is_dir():
            raise DataError(f"{root}: data root not found")
        man = manifest_path(root, task, split)
        from_manifest = use_manifest and man.is_file()
        listed = _read_manifest(root, man) if from_manifest else [
            ShardInfo(path, 0, 0, layout) for path, layout in candidate_files(root, task, split, use_manifest=False)
        ]
        skipped = tuple(s.name for s in listed if s.name in skip)
        shards: list[ShardInfo] = []
        for s in listed:
            if s.name in skip:
                continue
            if from_manifest:
                if not os.path.lexists(s.path):
                    raise DataError(f"{s.path}: file not found (listed in {man.name})")
                shards.append(s)
                continue
            n, shape = read_header(s.path, spec, s.layout)
            offset, count = split_range(s.layout, n, split)
            if count:
                shards.append(ShardInfo(s.path, count, offset, s.layout, shape))
        if not shards:
            raise DataError(no_shards_message(root, task, split, skipped=len(skipped)))
        shapes = {s.sample_shape for s in shards}
        if len(shapes) > 1:
            raise DataError(f"{root}: shards of {task}/{split} disagree on sample shape: {sorted(shapes)}")
        return cls(task, split, shards, skipped)


class SampleReader:
    """Reads one sample at a time; HDF5 handles are opened lazily, per process.

    A handle opened in another process (before a fork) is never used: the cache is keyed
    by pid and dropped when the pid changes.
    """

    def __init__(self, index: ShardIndex) -> None:
        self.index = index
        self.spec = get_task(index.task)
        self._pid: int | None = None
        self._handles: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:  # picklable for spawn-started workers
        return {"index": self.index, "spec": self.spec, "_pid": None, "_handles": {}}

    @property
    def open_files(self) -> int:
        return len(self._handles) if self._pid == os.getpid() else 0

    def is_open(self, path: str) -> bool:
        """Whether this process holds ``path`` open already (its next read opens nothing)."""
        return self._pid == os.getpid() and path in self._handles

    def _file(self, path: str) -> Any:
        import h5py

        if self._pid != os.getpid():
            self._handles = {}  # inherited across fork: never touch them
            self._pid = os.getpid()
        handle = self._handles.get(path)
        if handle is None:
            try:
                handle = h5py.File(path, "r")
            except OSError as exc:
                raise DataError(f"{path}: cannot open ({_h5_reason(exc)})") from None
            self._handles[path] = handle
        return handle

    def read(self, index: int) -> Sample:
        shard, local = self.index.locate(index)
        f = self._file(shard.path)
        if shard.layout == "ups":
            fields = np.asarray(f["data"][local], dtype=np.float32)
            params = np.asarray(f["params"][local], dtype=np.float32) if "params" in f else np.zeros(0, np.float32)
            bc = np.asarray(f["bc"][local], dtype=np.float32) if "bc" in f else np.zeros(0, np.float32)
        else:
            raw = np.asarray(f["tensor"][local], dtype=np.float32)[..., None]
            if self.spec.raw_extra_channel:
                extra = np.asarray(f[self.spec.raw_extra_channel][local], dtype=np.float32)
                extra = np.broadcast_to(extra[None, ..., None], raw.shape)
                raw = np.concatenate([extra, raw], axis=-1)
            fields, params, bc = raw, np.zeros(0, np.float32), np.zeros(0, np.float32)
        return Sample(index, f"{shard.name}#{local}", fields, params, bc)

    def close(self) -> None:
        if self._pid == os.getpid():
            for h in self._handles.values():
                try:
                    h.close()
                except Exception:  # noqa: BLE001
                    pass
        self._handles = {}
