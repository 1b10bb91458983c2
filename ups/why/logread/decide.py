"""The verdict on a log: the root-cause event, read the way an engineer reads it.

1. Each event gets the classes its signs show (:mod:`ups.why.logread.classes`); a class that
   refines another on the same event wins, then the event's strongest tier.
2. The root cause is the *first* event, in time, that says what went wrong (``CAUSE``): the
   innermost exception of a chain is printed first, and the first rank to fail is the one the
   others follow (ranks' own timestamps order them when every candidate has one).
3. Else a process killed by a signal it did not send itself (SIGKILL, SIGSEGV): its peers'
   errors (a connection closed, a collective timed out) follow from it.
4. Else a symptom (a peer gone, a collective timed out) and an exception no class knows
   compete, first in time: a rank whose own code raised, before its peers saw it go, is the
   cause.
5. Then how a process ended otherwise (SIGABRT, SIGTERM), when nothing else says more.
6. Otherwise the failure is unknown, and said to be: "no known class: the last error was
   `<line>`" (an unknown is better than a wrong class). No error at all: nothing to say.

An exception no class knows is "your code raised X at file:line" when the program's own code
raised it, or when it is the kind of error programs raise about their own inputs (a
ValueError, a shape mismatch, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import NamedTuple

from ups.why.loaderwords import EXITED, worker_deaths
from ups.why.logread.classes import (
    BY_NAME,
    CAUSE,
    EXIT,
    KILLED,
    NONFINITE_LOSS,
    NONFINITE_LOSS_CLASS,
    SIGNS,
    STEP_OF,
    SYMPTOM,
    LogClass,
    may_show_a_class,
)
from ups.why.logread.events import Event, is_errorish, parse
from ups.why.logread.frames import frame_class
from ups.why.logread.lines import Line, read_lines
from ups.why.logread.ras import ras_summary, read_ras

# Exceptions a program raises about its own inputs and code (never an infrastructure class).
USER_TYPES = frozenset((
    "ValueError", "KeyError", "TypeError", "AttributeError", "IndexError", "AssertionError", "NameError",
    "UnboundLocalError", "ZeroDivisionError", "NotImplementedError", "RecursionError", "StopIteration",
    "JSONDecodeError", "UnicodeDecodeError", "UnicodeEncodeError", "SyntaxError", "IndentationError",
))
USER_MESSAGES = re.compile(
    r"shapes cannot be multiplied|size mismatch|Error\(s\) in loading state_dict|(?:Missing|Unexpected) key\(s\) in state_dict|Expected all tensors to be on the same "
    r"device|does not require grad|Expected object of scalar type|expected scalar type|The size of tensor a|"
    r"shape '\[[^\]]*\]' is invalid for input of size|Given groups=|Sizes of tensors must match|modified by an inplace "
    r"operation|backward through the graph a second time|Input type .* and weight type .* should be the same|"
    r"Expected \d+D|must match the size of tensor|Expected input batch_size|expected input\[|"
    r"Found dtype \w+ but expected \w+|stack expects each tensor to be equal size|"
    # DistributedDataParallel's checks of the program's use of it (unused parameters, reentrant backward)
    r"Expected to have finished reduction in the prior iteration|Expected to mark a variable ready only once", re.I)
# A shell tool's complaint in a job script ("rm: cannot remove 'x': No such file or directory"):
# scripts go on after them, so they explain a failure only when nothing else does.
SHELL_TOOL = re.compile(r"^(?:/(?:usr/)?bin/)?(?:rm|ls|cp|mv|mkdir|rmdir|cat|ln|chmod|chown|find|du|df|tar|touch|tee|"
                        r"module|source|wget|curl|git|fatal|bash|sh|zsh|sed|grep|awk|head|tail|cd)(?:\[\d+\])?:\s")
# What a RAS report says more precisely than (a collective that timed out, a peer gone, NCCL's generic errors).
RAS_REFINES = frozenset(("collective_timeout", "peer_lost", "nccl_system_error", "nccl_heartbeat"))
# Classes whose failure a Python program raises (an exception ends it): said on a line of its own
# ("No module named 'apex'", "[Errno 2] No such file or directory: 'x.yaml'") with an exception
# after it, the program caught it and went on.
PROGRAM_ERRORS = frozenset(("import_error", "file_missing"))
# NCCL's return codes in its INFO trace (``file.cc:N -> 2``): 2 system error, 4 invalid argument (an
# argument check failed: read as invalid usage, like ncclInvalidArgument), 5 invalid usage, 6 remote error.
NCCL_CODES = {2: "nccl_system_error", 4: "nccl_invalid_usage", 5: "nccl_invalid_usage", 6: "peer_lost"}
# NCCL's own WARN line of a system call that failed ("misc/shmutils.cc:93 NCCL WARN Call to open
# failed: No such file or directory"): the file is NCCL's own (a shared memory segment, a
# socket's), not one the job needs; NCCL's system error, not a missing file.
NCCL_SYSCALL_CLASSES = frozenset(("file_missing",))
_RANK_WORDS = re.compile(r"\[Rank (\d+)\]|\bon rank:? (\d+)|\brank(\d+)\b|\blocal_rank:? (\d+)|\bRank (\d+) is running|"
                         r"\brank (\d+)\b", re.I)


@dataclass(frozen=True)
class Reading:
    """What a log says went wrong: a known class, the program's own error, an unknown error, or
    nothing."""

    kind: str  # class | user_code | unknown | none
    cls: LogClass | None = None
    line: str = ""  # the deciding line, as printed
    rank: int | None = None
    site: str | None = None  # file:line (the program's own frame where there is one)
    exception: str | None = None  # the exception's type when the line is one
    n: int | None = None  # the line's index in the log
    detail: str | None = None  # what the deciding line names: the refused path, the first non-finite step

    @property
    def name(self) -> str | None:
        return self.cls.name if self.cls else None

    @property
    def failed(self) -> bool:
        return self.kind != "none"

    @property
    def summary(self) -> str:
        """The verdict in one sentence."""
        at = f" at {self.site}" if self.site else ""
        if self.kind == "class" and self.cls:
            return f"{self.cls.what} ({self.detail})" if self.detail else self.cls.what
        if self.kind == "user_code":
            return f"your code raised {self.exception}{at}"
        if self.kind == "unknown":
            return f"no known class: the last error was `{self.line}`" + (f", at {self.site}" if self.site else "")
        return "no failure in this log"

    @property
    def fix(self) -> str:
        if self.cls:
            return self.cls.fix
        if self.kind == "user_code":
            return f"fix the program{at_site(self.site)}: the exception's message says what was wrong with its input"
        if self.kind == "unknown":
            return "read the lines around it (and the first rank to fail); this is no failure class ups knows"
        return ""


def at_site(site: str | None) -> str:
    return f" at {site}" if site else ""


def read_log(text: str) -> Reading:
    """The verdict on a log's text (a run's log, a process's error, a pasted excerpt)."""
    lines = read_lines(text or "")
    events = parse(lines)
    reading = decide(events, lines)
    ras = read_ras(text or "")
    if ras is not None and (not reading.failed or reading.kind == "unknown"
                            or (reading.cls is not None and reading.cls.name in RAS_REFINES)):
        # NCCL's RAS report names who is behind or gone: more than a timeout, or nothing, says
        name, rank, line, n = ras_summary(ras)
        reading = Reading("class", BY_NAME[name], line, rank, None, None, n)
    if reading.cls is not None and reading.cls.name == "job_terminated" and reading.detail is None:
        reading = replace(reading, detail=slurm_cancel(text or ""))
    if reading.failed and reading.rank is None:
        # Output without per-rank prefixes: torchrun's report names the rank that failed first.
        root = next((ev.rank for ev in events if ev.kind == "child" and ev.etype == "ChildFailedError"
                     and ev.rank is not None), None)
        if root is not None:
            reading = replace(reading, rank=root)
    return reading


# slurmstepd's own line in a job's output: "*** JOB 12 ON node3 CANCELLED AT 2026-12-01T20:36:08 DUE TO
# TIME LIMIT ***" (or STEP 12.0); without "DUE TO", someone cancelled it (scancel).
_SLURM_CANCEL = re.compile(r"\*\*\* (JOB|STEP) (\d+)(?:\.\S+)? ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z][A-Z _-]*?))? \*\*\*")


def slurm_cancel(text: str) -> str | None:
    """Which SLURM job was cancelled, where, when and why, from slurmstepd's line (the job's
    own line before a step's); None where no such line is in ``text``."""
    found = sorted(_SLURM_CANCEL.finditer(text), key=lambda m: (m.group(1) != "JOB", m.start()))
    if not found:
        return None
    m = found[0]
    why = f"due to {m.group(5).strip().lower()}" if m.group(5) else "by scancel or an operator"
    return f"SLURM job {m.group(2)} on {m.group(3)} cancelled at {m.group(4)} {why}"


def classes_of(event: Event) -> list[tuple[int, int, LogClass, int]]:
    """(tier, position, class, line index within the event) of every class the event shows,
    refined: a class another one on the same event refines is dropped."""
    found: dict[str, tuple[int, int, LogClass, int]] = {}
    frames = "\n".join(f[0] for f in event.frames)
    innermost = "\n".join(f[0] for f in event.frames[-2:])
    for k, line in enumerate(event.lines):
        lowered = line.body.lower()
        if not may_show_a_class(lowered):
            continue
        warning = line.role == "warning" and k == 0
        for sign in SIGNS:
            if (warning and not sign.on_warning) or not sign.may_match(lowered):
                continue
            if sign.unless_frames is not None and sign.unless_frames.search(frames):
                continue
            if sign.in_frames is not None and not sign.in_frames.search(innermost):
                continue
            m = sign.pattern.search(line.body)
            if m is None:
                continue
            hit = (sign.tier, k * 10_000 + m.start(), BY_NAME[sign.cls], k)
            if sign.cls not in found or hit[:2] < found[sign.cls][:2]:
                found[sign.cls] = hit
    refined = {r for _, _, c, _ in found.values() for r in c.refines}
    return sorted((h for name, h in found.items() if name not in refined), key=lambda h: h[:2])


class Candidate(NamedTuple):
    """An event that may be the root cause, with the class it shows (None: no class)."""

    tier: int
    event: Event
    cls: LogClass | None
    k: int = 0  # the line of the event the class was read on


def decide(events: list[Event], lines: list[Line] | None = None) -> Reading:
    classed: list[Candidate] = []
    nonfinite = _first_nonfinite_loss(lines or [])
    if nonfinite is not None:
        # A loss printed as NaN or inf, on whatever line printed it (a logger's INFO line, a
        # progress bar): a symptom, first in time against the others and the program's own error.
        classed.append(Candidate(SYMPTOM, Event("line", [nonfinite]), BY_NAME[NONFINITE_LOSS_CLASS]))
    unclassed: list[Event] = []
    nccl_seen: set[str] = set()  # processes whose first NCCL WARN with a class is read
    for ev in events:
        if ev.superseded:
            continue
        if ev.kind == "code":
            cls = ev.shows or NCCL_CODES.get(ev.code or 0)
            if cls:
                classed.append(Candidate(EXIT, ev, BY_NAME[cls]))
            continue
        found = classes_of(ev)
        if not found and ev.kind == "cut":
            where = frame_class(ev.frames)
            if where is not None:
                classed.append(Candidate(where.tier, ev, BY_NAME[where.cls]))
                continue
        if not found:
            if ev.kind != "line" or is_errorish(ev):
                unclassed.append(ev)
            continue
        if ev.head.nccl == "WARN":
            # NCCL unwinds a failure through more WARN lines (a proxy that cannot connect, a
            # socket closed): the process's first one is the root, the rest follow from it.
            who = _nccl_process(ev)
            if who in nccl_seen:
                continue
            nccl_seen.add(who)
        tier, _, cls, k = found[0]
        if ev.head.nccl == "WARN" and cls.name in NCCL_SYSCALL_CLASSES:
            tier, cls = max(tier, SYMPTOM), BY_NAME["nccl_system_error"]
        if SHELL_TOOL.match(ev.head.body):
            tier = max(tier, SYMPTOM)  # a script's `rm` or `cp` that failed and went on
        elif cls.name in PROGRAM_ERRORS and ev.kind == "line" and _raised_later(events, ev):
            tier = max(tier, SYMPTOM)  # a program's note of an error it went on after
        classed.append(Candidate(tier, ev, cls, k))

    for tier in (CAUSE, KILLED):
        hits = [c for c in classed if c.tier == tier]
        if hits:
            return _class_reading(_first(hits))
    symptoms = [c for c in classed if c.tier == SYMPTOM]
    own = [ev for ev in unclassed if ev.kind == "exception" and not ev.wrapper]
    # torch's DataLoader found its worker dead: that explains the error it caught while fetching (a
    # refused connection to the dead worker's tensors, printed first as the chain's cause)
    own = [ev for ev in own if any(how == EXITED for _, how in worker_deaths(ev.text))] or own
    if any(c.cls is not None and c.cls.name == "gpu_xid" for c in symptoms):
        # A CUDA error no class knows, and the driver's Xid beside it: the Xid says what the GPU saw.
        own = [ev for ev in own if "CUDA error" not in ev.text]
    if symptoms or own:
        pool = symptoms + [Candidate(SYMPTOM, ev, None) for ev in own]
        # "this rank failed because another went away" is never the cause where the log holds
        # another failure: whichever printed first (a peer's error is often written after the
        # survivor's, as the peer unwinds its traceback), the other one is read.
        pool = [c for c in pool if c.cls is None or c.cls.name != "peer_lost"] or pool
        pick = _first(pool)
        return _class_reading(pick) if pick.cls is not None else _exception_reading(pick.event)
    exits = [c for c in classed if c.tier == EXIT]
    if exits:
        return _class_reading(_first(exits))
    if unclassed:
        ev = unclassed[-1]
        # torchrun's report: its exit code line says more than "ChildFailedError:"
        said = next((ln for ln in ev.lines if ev.kind == "child" and "exitcode" in ln.raw), ev.head)
        line = _shown(said.raw)
        return Reading("unknown", None, line, _rank(ev, line), ev.site(own=False), ev.etype, said.n)
    return Reading("none")


def _first_nonfinite_loss(lines: list[Line]) -> Line | None:
    """The first line that prints a NaN or inf loss: read as printed (a progress bar's body is
    blanked, its postfix holds the loss); never an exception's line ("ValueError: loss is nan" is
    the program's own error, decided as one)."""
    for ln in lines:
        low = ln.raw.lower()
        if "loss" not in low or ("nan" not in low and "inf" not in low):  # most lines: no regex
            continue
        if ln.role not in ("frame", "source", "header", "chain") and not _RAISED.match(ln.body) and NONFINITE_LOSS.search(ln.raw):
            return ln
    return None


_RAISED = re.compile(r"\s*[\w.]*(?:Error|Exception)\b")


def _raised_later(events: list[Event], ev: Event) -> bool:
    """An exception of ``ev``'s stream comes after it: the program went on past ``ev``'s line."""
    return any(e.kind == "exception" and e.n > ev.n and e.head.stream == ev.head.stream for e in events)


def _nccl_process(ev: Event) -> str:
    m = re.match(r"\s*(\S+?:\d+):\d+ \[\d+\]", ev.head.body)
    return m.group(1) if m else f"stream:{ev.head.stream}"


def _first(candidates: list[Candidate]) -> Candidate:
    """The candidate that happened first: by the ranks' own timestamps when every one has one
    (interleaved output is not in time order), else by position in the log."""
    stamps = [c.event.ts for c in candidates]
    if all(stamps) and len({len(s.split(" ")[0]) for s in stamps}) == 1:
        return min(candidates, key=lambda c: (c.event.ts, c.event.n))
    return min(candidates, key=lambda c: c.event.n)


def _class_reading(hit: Candidate) -> Reading:
    ev, line_read = hit.event, hit.event.lines[hit.k]
    line = _shown(line_read.raw)
    return Reading("class", hit.cls, line, _rank(ev, line), ev.site(), ev.etype, line_read.n,
                   _detail(hit.cls, ev, line_read.body or line_read.raw))


# The path an OS error names: Python's "[Errno 13] Permission denied: '/x'", a tool's "cannot create
# directory '/x'", a shell's "/x: Permission denied".
_QUOTED_PATH = re.compile(r"""['"‘]((?:/|\.{1,2}/|~/|[A-Za-z]:\\)[^'"’]*)['"’]""")
_BARE_PATH = re.compile(r"(?<![\w.])((?:/|~/)[^\s:'\"]+)")


def _detail(cls: LogClass | None, ev: Event, body: str) -> str | None:
    """What the deciding line names that the class's words cannot: the path a write was refused
    on, the step whose loss was first non-finite."""
    if cls is None:
        return None
    if cls.name == "permission_denied":
        # the message's lines, never a traceback's frames (their paths are the program's files)
        said = [ln.body for ln in ev.lines if ln.role not in ("frame", "source")]
        for text in (body, *said):
            m = _QUOTED_PATH.search(text) or _BARE_PATH.search(text)
            if m:
                return f"on {m.group(1)}"
    if cls.name == NONFINITE_LOSS_CLASS:
        m = STEP_OF.search(body)
        return f"first at step {m.group(1)}" if m else None
    return None


def _exception_reading(ev: Event) -> Reading:
    line = _shown(ev.head.raw)
    if ev.raised_in_own_code or ev.etype in USER_TYPES or USER_MESSAGES.search(ev.text):
        return Reading("user_code", None, line, _rank(ev, line), ev.site(), ev.etype, ev.n)
    return Reading("unknown", None, line, _rank(ev, line), ev.site(own=False), ev.etype, ev.n)


def _rank(ev: Event, line: str) -> int | None:
    if ev.rank is not None:
        return ev.rank
    for text in (line, ev.text):
        m = _RANK_WORDS.search(text)
        if m:
            return next(int(g) for g in m.groups() if g is not None)
    return None


def _shown(raw: str, limit: int = 300) -> str:
    line = raw.strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"
