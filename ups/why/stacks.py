"""Reading a process's stack file: faulthandler dumps, crash tracebacks, uncaught exceptions.

A stack file (``<run>/stacks/<name>.txt``) accumulates, in order: dumps requested with the
stack signal (each under a ``=== stack dump of ...`` header), faulthandler's report of a
fatal signal (``Fatal Python error: Segmentation fault``), and the traceback of an uncaught
exception (``=== uncaught exception in ...``, written by ups.instrument). The latest section
is what a verdict rests on; in it, the main thread's innermost frame of the program's own
code is "where".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ups.runs.pyspy import function_name
from ups.status.vocabulary import is_library_file
from ups.why.tracebacks import frame_site

_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-f]+) \(most recent call first\):$")
_REQUEST = re.compile(r"^=== stack dump of (?P<who>.+?) pid (?P<pid>\d+) requested by (?P<actor>\S+) at (?P<at>.+?) ===$")
_EXCEPTION = re.compile(r"^=== uncaught exception in (?P<who>\S+) \(pid (?P<pid>\d+)\) ===$")
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+)$")
# Our own background threads' frames (the Reporter's heartbeat, the exit watcher).
_OURS = (os.sep + "ups" + os.sep + "status" + os.sep, os.sep + "ups" + os.sep + "launch" + os.sep)


@dataclass(frozen=True)
class Frame:
    """One frame. ``function`` is its own name, the one rules compare (``_run_epoch``);
    ``qualname`` the name as its dump printed it, where that says more (py-spy >= 0.4.3 prints
    ``Trainer._run_epoch``: :func:`ups.runs.pyspy.function_name`). Two frames are the same
    frame whichever way they were printed."""

    file: str
    line: int
    function: str
    qualname: str = field(default="", compare=False)

    @classmethod
    def printed(cls, file: str, line: int, name: str) -> Frame:
        """A frame as a dump or a traceback printed it."""
        own = function_name(name)
        return cls(file, line, own, name if name != own else "")

    @property
    def shown(self) -> str:
        """The name to show a user: the qualified one where it is known."""
        return self.qualname or self.function

    @property
    def site(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def own(self) -> bool:
        """The program's own code (not torch's, not the standard library's, not ours, and no C
        frame of a shared library: py-spy's ``--native`` dumps carry libc's and libpython's):
        :func:`ups.status.vocabulary.is_library_file`, the one definition."""
        return not is_library_file(self.file)

    def __str__(self) -> str:
        short = self.file.split("site-packages" + os.sep)[-1] if "site-packages" in self.file else os.path.basename(self.file)
        return f"{short}:{self.line} in {self.shown}"


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool
    frames: tuple[Frame, ...]  # innermost first

    @property
    def ours(self) -> bool:
        """One of our background threads (the Reporter's heartbeat, the exit watcher)."""
        return any(m in f.file for f in self.frames for m in _OURS)


@dataclass(frozen=True)
class Section:
    """One entry of a stack file: a requested dump, a fatal signal's report, or a traceback."""

    kind: str  # "dump" | "fatal" | "exception"
    title: str  # "Segmentation fault", the exception line, or who asked for the dump
    threads: tuple[Thread, ...] = ()
    frames: tuple[Frame, ...] = ()  # an exception's traceback, innermost first
    at: str | None = None
    text: str = ""

    @property
    def main(self) -> Thread | None:
        """The thread that matters: the program's main thread (the one whose outermost frame
        is a module), else the current thread, never one of ours."""
        threads = [t for t in self.threads if not t.ours and t.frames]
        if not threads:
            return None
        for t in threads:
            if t.frames[-1].function == "<module>":
                return t
        return next((t for t in threads if t.current), threads[-1])

    @property
    def stack(self) -> tuple[Frame, ...]:
        """The frames that matter, innermost first."""
        if self.kind == "exception":
            return self.frames
        main = self.main
        return main.frames if main is not None else ()

    @property
    def own_frame(self) -> Frame | None:
        return next((f for f in self.stack if f.own), None)

    @property
    def top(self) -> Frame | None:
        """The innermost frame: where the thread is (``make_fid`` in h5py, ``all_reduce``); the
        instrumentation's own wrappers (``Work.wait``'s, ``wait_tensor``'s) are not where it is."""
        stack = self.stack
        if not stack:
            return None
        return next((f for f in stack if "ups/instrument/" not in f.file.replace("\\", "/")), stack[0])

    def signature(self, depth: int = 1) -> str:
        """What the thread is doing, for grouping: the library call it is in (if any) and the
        program's own frame that made it, e.g. ``all_reduce at train.py:120``."""
        own = self.own_frame
        top = self.top
        if top is None:
            return "no Python frame"
        if own is None:
            return str(top)
        if top is own:
            return f"{own.shown} at {own.site}"
        return f"{top.shown} at {own.site}"


@dataclass
class _Builder:
    kind: str
    title: str
    at: str | None = None
    lines: list[str] = field(default_factory=list)


def parse(text: str) -> list[Section]:
    """Every section of a stack file, oldest first."""
    sections: list[_Builder] = []
    for line in text.splitlines():
        m = _REQUEST.match(line)
        if m:
            sections.append(_Builder("dump", f"requested by {m['actor']}", m["at"]))
            continue
        m = _EXCEPTION.match(line)
        if m:
            sections.append(_Builder("exception", "uncaught exception"))
            continue
        m = _FATAL.match(line)
        if m:
            sections.append(_Builder("fatal", m["what"].strip()))
            continue
        if not sections:
            if _THREAD.match(line):  # a dump with no header (written by hand with faulthandler)
                sections.append(_Builder("dump", "dump"))
            else:
                continue
        sections[-1].lines.append(line)
    return [_finish(b) for b in sections]


def parse_traceback(text: str) -> Section:
    """A Python traceback given as text (e.g. the worker's "Original Traceback" that a
    DataLoader re-raises in the main process), as an exception section."""
    return _finish(_Builder("exception", "uncaught exception", lines=text.splitlines()))


def _finish(b: _Builder) -> Section:
    text = "\n".join(b.lines).strip("\n")
    if b.kind == "exception":
        frames = [Frame.printed(*site) for site in map(_frame, b.lines) if site]
        last = next((ln.strip() for ln in reversed(b.lines) if ln.strip() and not ln.startswith((" ", "\t"))), "")
        return Section("exception", last, frames=tuple(reversed(frames)), text=text)
    threads: list[Thread] = []
    current: tuple[str, bool] | None = None
    frames: list[Frame] = []
    for line in b.lines:
        m = _THREAD.match(line)
        if m:
            if current is not None:
                threads.append(Thread(current[0], current[1], tuple(frames)))
            current, frames = (m["id"], m["current"] == "Current thread"), []
            continue
        site = _frame(line)
        if site and current is not None:
            frames.append(Frame.printed(*site))
    if current is not None:
        threads.append(Thread(current[0], current[1], tuple(frames)))
    return Section(b.kind, b.title, threads=tuple(threads), at=b.at, text=text)


def _frame(line: str) -> tuple[str, int, str] | None:
    """A frame line of a dump or a traceback (:mod:`ups.why.tracebacks`), with its function."""
    site = frame_site(line)
    return site if site is not None and site[2] else None


def latest(text: str | None, kind: str | None = None) -> Section | None:
    """The most recent section (of ``kind``, if given) that has frames."""
    for section in reversed(parse(text or "")):
        if (kind is None or section.kind == kind) and section.stack:
            return section
    return None


def group(signatures: dict[str, str]) -> list[tuple[str, list[str]]]:
    """Processes with the same signature folded together, largest group first:
    ``[("all_reduce at train.py:120", ["rank 0", "rank 2"]), ...]``."""
    groups: dict[str, list[str]] = {}
    for label, sig in signatures.items():
        groups.setdefault(sig, []).append(label)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def fold_labels(labels: list[str]) -> str:
    """``rank 0, rank 2, rank 3, rank 4`` -> ``ranks 0, 2-4``; other labels listed as they are."""
    ranks = sorted(int(x.split()[1]) for x in labels if re.fullmatch(r"rank \d+", x))
    others = [x for x in labels if not re.fullmatch(r"rank \d+", x)]
    parts: list[str] = []
    if ranks:
        runs: list[list[int]] = []
        for r in ranks:
            if runs and r == runs[-1][-1] + 1:
                runs[-1].append(r)
            else:
                runs.append([r])
        spans = ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 2 else ", ".join(map(str, g)) for g in runs)
        parts.append(("ranks " if len(ranks) > 1 else "rank ") + spans)
    return ", ".join(parts + others)
