"""Checking every shard of a data root from a process that can be killed.

``h5py.File()`` on a FIFO, or any open on a hung network mount, blocks in the kernel: on a
hung mount no signal gets it back (SIGALRM included), and a FIFO open holds the GIL, so no
thread of the stuck process runs either. A check that must never hang the CLI therefore
runs here, in a child process (``python -m ups.data.probe``) in its own session:

* the child lists the shards of each task/split (``candidate_files``: manifest or glob), then
  opens every file at once, one thread each, with plain ``os.open`` + ``os.pread`` (they
  release the GIL): a file that has not answered within ``timeout`` is named as hung, and
  a whole mount of hung files costs one ``timeout``, not one per file;
* it then reads the HDF5 header of each file that answered (``read_header``, under
  SIGALRM) and reports one JSON line per file;
* the parent (:func:`probe_shards`) reads those lines with a deadline. A child that goes
  silent (stopped, or stuck where no signal reaches) is killed with its process group and
  never waited for; the file it was on is named, and a new child checks the rest.

Nothing here imports h5py in the parent: this module is on the CLI's path.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_S = 20.0  # a cold start of the child (Python, numpy, h5py) on a busy box
SILENCE_MARGIN_S = 2.0  # a child silent for timeout + max(this, timeout) is stuck where no signal reaches
THREADS_PER_WAVE = 256


@dataclass
class ShardSurvey:
    """What one probe found under a data root."""

    root: str
    splits: dict[str, list[str]] = field(default_factory=dict)  # "task/split" -> shard paths
    samples: dict[str, int] = field(default_factory=dict)  # "task/split" -> samples in good shards
    bad: dict[str, str] = field(default_factory=dict)  # shard path -> one line naming it and why
    problems: list[str] = field(default_factory=list)  # not about one shard: root, listing, shapes

    @property
    def files(self) -> list[str]:
        return sorted({p for paths in self.splits.values() for p in paths})


# ---------------------------------------------------------------------------- parent side
def probe_shards(
    root: str | os.PathLike[str],
    pairs: list[tuple[str, str]],
    *,
    timeout: float = 5.0,
    require: bool = True,
    read_sample: bool = False,
    deadline: float | None = None,
    progress: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> ShardSurvey:
    """Check every shard of each (task, split) in ``pairs`` under ``root``; never hangs.

    ``timeout``: seconds one open (or one header read) may take before its file is called
    bad. ``require``: a task/split without shards is a problem (else it is left out).
    ``read_sample``: also read the first sample of each shard. ``deadline``: seconds for
    the whole check; files not reached by then are named as not checked. ``progress``
    gets a line every few seconds while the check is slow. ``env``: added to the child's
    environment (``UPS_FAULTS=shard_probe_hang:file=NAME`` stops it at that file).
    """
    from ups.data.shards import no_shards_message, split_range

    survey = ShardSurvey(str(root))
    results: dict[str, dict] = {}  # path -> the child's "file" line
    layouts: dict[str, str] = {}
    started = time.monotonic()
    end = started + deadline if deadline is not None else None
    last_note = started
    root_failed = False
    unlisted: set[str] = set()  # task/splits whose listing failed (already a problem)
    while True:
        request = {"root": str(root), "pairs": pairs, "timeout": timeout, "read_sample": read_sample, "done": sorted(results)}
        child = _Child(request, env)
        stage, current, finished, crashed = "start", str(root), False, False
        silence = STARTUP_S
        while not finished:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                line = child.lines.get(timeout=min(x for x in (silence, left, 2.0) if x is not None))
            except queue.Empty:
                now = time.monotonic()
                if now - child.last_line_at >= silence:
                    break
                if progress and now - last_note >= 2.0:
                    last_note = now
                    total = len({p for paths in survey.splits.values() for p in paths}) or "?"
                    progress(f"checking shards under {root}: {len(results)}/{total} done, waiting on {current}")
                continue
            if line is None:  # EOF without "done": the child died
                crashed = True
                break
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # not ours (a library printing to stdout)
            silence = timeout + max(SILENCE_MARGIN_S, timeout)
            if "split" in ev:
                survey.splits[ev["split"]] = [p for p, _ in ev["files"]]
                layouts.update({p: lay for p, lay in ev["files"]})
            elif "problem" in ev:
                survey.problems.append(ev["problem"])
                root_failed = root_failed or bool(ev.get("root"))
                unlisted.add(ev.get("about", ""))
            elif "stage" in ev:
                stage, current = ev["stage"], ev.get("file", current)
            elif "file" in ev:
                results[ev["file"]] = ev
            elif ev.get("done"):
                finished = True
        child.stop()
        if finished:
            break
        waited = time.monotonic() - started
        out_of_time = end is not None and time.monotonic() >= end
        if stage == "header" and current not in results and not out_of_time:
            why = f"the check died while opening it ({child.stderr_tail() or 'no message'})" if crashed else (
                f"opening it did not return within {silence:g} s and the check was killed "
                "(hung network mount?)")
            results[current] = {"file": current, "ok": False, "reason": f"{current}: {why}"}
            continue  # a new child checks the rest
        if out_of_time:
            root_failed = True
            survey.problems.append(f"checking the shards under {root} ran out of time after {waited:.0f} s")
        elif stage in ("start", "listing"):
            root_failed = True
            how = f"died: {child.stderr_tail()}" if crashed else f"did not return within {silence:g} s (hung network mount?)"
            survey.problems.append(f"listing the shards under {root} {how}")
        else:
            how = f"died: {child.stderr_tail()}" if crashed else "stopped answering"
            survey.problems.append(f"checking the shards under {root} {how}")
        break

    for key, paths in survey.splits.items():
        split = key.split("/", 1)[1]
        shapes: dict[tuple[int, ...], str] = {}
        for p in paths:
            r = results.get(p)
            if r is None:
                survey.bad[p] = f"{p}: not checked (the check ended early)"
            elif not r["ok"]:
                survey.bad[p] = r["reason"]
            else:
                survey.samples[key] = survey.samples.get(key, 0) + split_range(layouts[p], r["n"], split)[1]
                shapes.setdefault(tuple(r["shape"]), p)
        if len(shapes) > 1:
            survey.problems.append(f"{root}: shards of {key} disagree on sample shape: "
                                   + ", ".join(f"{Path(p).name} {list(s)}" for s, p in shapes.items()))
    if require and not root_failed:
        for task, split in pairs:
            if not survey.splits.get(f"{task}/{split}") and f"{task}/{split}" not in unlisted:
                survey.problems.append(no_shards_message(Path(root), task, split))
    return survey


class _Child:
    """One probe child: its JSON lines on a queue (a reader thread), stderr in a temp file."""

    def __init__(self, request: dict, env: dict[str, str] | None) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.last_line_at = time.monotonic()
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ups.data.probe"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, start_new_session=True, env={**os.environ, **(env or {})},
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request))
        self.proc.stdin.close()
        threading.Thread(target=self._read, name="ups-shard-probe-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last_line_at = time.monotonic()
            self.lines.put(line)
        self.lines.put(None)

    def stop(self) -> None:
        """Kill the child's process group; wait briefly, never for a child stuck in the kernel."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass  # in uninterruptible sleep: it goes when the mount answers; we do not wait

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""


# ----------------------------------------------------------------------------- child side
def _emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "" if stat.S_ISREG(mode) else "not a regular file"


def _touch(path: str, kinds: dict[str, str], errors: dict[str, str]) -> None:
    """Open ``path`` and read its first bytes, as h5py would; blocks where h5py would."""
    kinds[path] = _kind(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.pread(fd, 8, 0)
        finally:
            os.close(fd)
    except FileNotFoundError:
        errors[path] = f"{path}: file not found"
    except OSError as exc:
        errors[path] = f"{path}: cannot read ({kinds[path] or exc.strerror or exc})"
    else:
        if kinds[path]:
            errors[path] = f"{path}: {kinds[path]}, not an HDF5 file"
    errors.setdefault(path, "")


def _reachable(paths: list[str], timeout: float) -> dict[str, str]:
    """Path -> "" when it opened and read, else one line why; all opened at once."""
    kinds: dict[str, str] = {}
    errors: dict[str, str] = {}
    for i in range(0, len(paths), THREADS_PER_WAVE):
        wave = paths[i:i + THREADS_PER_WAVE]
        threads = [threading.Thread(target=_touch, args=(p, kinds, errors), daemon=True) for p in wave]
        for t in threads:
            t.start()
        stop_at = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, stop_at - time.monotonic()))
        for p in wave:
            if p not in errors:  # still blocked in stat or open
                what = f"{kinds[p]} that nothing writes to" if kinds.get(p) == "a FIFO" else "hung network mount?"
                errors[p] = f"opening {p} did not return within {timeout:g} s ({what})"
    return errors


def _read_first_sample(path: str, layout: str, timeout: float) -> None:
    import h5py

    from ups.data.shards import alarm

    with alarm(timeout, f"reading {path}"), h5py.File(path, "r") as f:
        f["data" if layout == "ups" else "tensor"][0]


def child_main() -> int:
    # h5py (and numpy) first, inside the start-up allowance: imported at the first header
    # instead, a cold import on a busy box counted against that file's few seconds of
    # silence, and a good shard could be named hung.
    import h5py  # noqa: F401

    from ups.data.shards import DataError, candidate_files, read_header
    from ups.data.tasks import get_task
    from ups.errors import UpsError
    from ups.faults import Faults

    req = json.loads(sys.stdin.read())
    root, timeout, done = Path(req["root"]), float(req["timeout"]), set(req["done"])
    stop_at = Faults.from_env().get("shard_probe_hang")  # rehearses an open no signal can end
    _emit(stage="listing", file=str(root))
    if not root.is_dir():
        _emit(problem=f"{root}: data root not found", root=True)
        _emit(done=True)
        return 0
    todo: dict[str, tuple[str, str]] = {}  # path -> (task, layout), listing order
    for task, split in req["pairs"]:
        try:
            files = candidate_files(root, task, split)
        except UpsError as exc:  # an unreadable manifest
            _emit(problem=str(exc), about=f"{task}/{split}")
            continue
        if files:
            _emit(split=f"{task}/{split}", files=files)
        for path, layout in files:
            if path not in done:
                todo.setdefault(path, (task, layout))
    _emit(stage="open", file=f"{len(todo)} shard(s)")
    unreachable = _reachable(list(todo), timeout)
    for path, (task, layout) in todo.items():
        if unreachable[path]:
            _emit(file=path, ok=False, reason=unreachable[path])
            continue
        _emit(stage="header", file=path)
        if stop_at is not None and Path(path).name == stop_at.get("file"):
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            n, shape = read_header(path, get_task(task), layout, timeout=timeout)
            if req["read_sample"]:
                _read_first_sample(path, layout, timeout)
        except DataError as exc:
            _emit(file=path, ok=False, reason=str(exc))
        except (OSError, TimeoutError, KeyError, ValueError) as exc:
            _emit(file=path, ok=False, reason=f"{path}: reading its first sample failed ({exc})")
        else:
            _emit(file=path, ok=True, n=n, shape=list(shape))
    _emit(done=True)
    return 0


if __name__ == "__main__":
    code = child_main()
    sys.stdout.flush()
    os._exit(code)  # threads still blocked in open() must not hold the exit
