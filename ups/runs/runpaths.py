"""A run's folder: where each of its files is, and how ups writes into it.

Every write goes relative to the run folder's descriptor, no link followed
(:mod:`ups.status.confined`; docs/safety.md, "Writing into a shared runs folder").
:class:`~ups.runs.rundir.RunDir` is built on :class:`RunPaths`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from ups.status import confined
from ups.status.confined import Unsafe, open_append, open_own_dir, write_atomic_at
from ups.status.host import hostname
from ups.status.printable import printable

SUBDIRS = ("status", "stacks", "logs", "control")
NODES_DIR = "nodes"
TORCHRUN_LOGS = "torchrun"  # logs/torchrun: the --log-dir ups hands to torchrun (ups.launch.programs)
DIR_MODE = 0o755  # a run's folders: only their owner writes there, whatever the umask


class RunPaths:
    """One run's folder and the paths in it. Cheap to construct; touches the disk only when asked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    # -- paths ---------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The folder's name, safe to show (a folder planted by someone else may have any
        name; ups's own ids are letters, digits, '.', '_' and '-')."""
        return printable(self.path.name)

    @property
    def manifest_path(self) -> Path:
        return self.path / "run.json"

    @property
    def status_dir(self) -> Path:
        return self.path / "status"

    @property
    def stacks_dir(self) -> Path:
        return self.path / "stacks"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def control_dir(self) -> Path:
        return self.path / "control"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def nodes_dir(self) -> Path:
        return self.path / NODES_DIR

    @property
    def is_multinode(self) -> bool:
        """A run of several nodes (it has ``nodes/``): each node writes its own manifest."""
        return self.nodes_dir.is_dir()

    def node_manifest_path(self, host: str | None = None) -> Path:
        return self.nodes_dir / f"{host or hostname()}.json"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- the folder, as ups writes into it (ups.status.confined) --------------------------
    @contextlib.contextmanager
    def folder(self, sub: str | None = None, *, make: bool = False) -> Iterator[int]:
        """The run folder (or its sub-folder ``sub``) as a descriptor to write relative to: a
        real folder, never a link, of the acting user's that no one else may write; Unsafe (an
        OSError, one line) otherwise; so is a path to it through a link another user planted in a
        shared folder (:func:`~ups.status.confined.check_links`). ``make``: the sub-folder is made
        when missing."""
        confined.check_links(self.path.parent)
        fd = open_own_dir(self.path, f"run folder {self.path}")
        try:
            if sub is not None:
                where = f"{self.path}/{sub}"
                sub_fd = confined.make_dir(sub, where, dir_fd=fd, exist_ok=True) if make else open_own_dir(sub, where, dir_fd=fd)
                os.close(fd)
                fd = sub_fd
            yield fd
        finally:
            os.close(fd)

    def open_log(self, name: str) -> int:
        """``logs/<name>.log`` (:meth:`log_path`) opened for appending, relative to the run
        folder: never through a link, never into another user's folder."""
        with self.folder("logs", make=True) as logs:
            return open_append(self.log_path(name).name, dir_fd=logs)

    def open_append(self, name: str, run_fd: int | None = None) -> int:
        """The run folder's file ``name`` opened for appending (made when missing), never
        through a link nor into a FIFO: Unsafe as it is, another OSError as one line naming
        the file and why. ``run_fd``: the run folder as the caller opened it."""
        try:
            if run_fd is None:
                with self.folder() as own:
                    return open_append(name, dir_fd=own)
            return open_append(name, dir_fd=run_fd)
        except Unsafe:
            raise
        except OSError as exc:
            raise OSError(f"{self.path / name}: {_reason(exc)}") from None

    def write_file(self, name: str, data: bytes) -> None:
        """A file of the run (``config.json``, ``metrics/rank-0.json``) written atomically, its
        folders made and opened relative to the run folder, no link followed."""
        head, _, tail = name.rpartition("/")
        with self.folder() as fd:
            sub = confined.make_dirs(".", head, dir_fd=fd)
            try:
                write_atomic_at(sub, tail, data)
            finally:
                os.close(sub)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunPaths) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # -- logs ----------------------------------------------------------------------------
    def log_path(self, name: str) -> Path:
        """``logs/<name>.log``; in a multi-node run the launcher's and the job's log are
        this node's: ``logs/job@<host>.log``."""
        if name in ("launcher", "job") and self.is_multinode:
            name = f"{name}@{hostname()}"
        return self.logs_dir / f"{name}.log"



def _reason(exc: OSError) -> str:
    """Why a run file could not be opened for writing, as the trust boundary says it."""
    if exc.errno == errno.ELOOP:
        return "a symlink (not followed)"
    if exc.errno == errno.ENXIO:
        return "a FIFO"
    return str(exc.strerror or exc)
