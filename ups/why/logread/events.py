"""A log's lines become events: what happened, in order, with who (the rank) and where (the
frame). The events an engineer looks for:

* a Python exception: its final line with the message lines it carries ("Last error: ..."),
  its traceback's frames, and whether it was the cause of the next one ("During handling of
  the above exception", "The above exception was the direct cause");
* a C++ exception that ended the process (``terminate called after throwing ... what():``);
* torchrun's report of a failed child (``ChildFailedError``: its root cause's rank, exit code
  and traceback line) and the agent's ``failed (exitcode: N) local_rank: R`` line;
* any other line that may say what went wrong (NCCL WARN lines, CUDA errors, the kernel's
  Xid and OOM-killer lines, SLURM's, DataLoader workers' deaths, a shell's "Killed");
* a traceback cut off before its exception (a paste that ends early);
* weak notices on context lines, read only when nothing else says more: NCCL's return codes
  and connection retries (INFO), and the function a C++ stack says raised.

Wrappers (``ChildFailedError``, ``CalledProcessError``, a DataLoader worker's "Caught X in
DataLoader worker process N") report another process's failure: they are events, but the
failure they wrap, when the log has it, is the one that counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ups.status.vocabulary import is_library_file
from ups.why.logread.classes import (
    NCCL_NET_ERRNO,
    NCCL_RETRY,
    NCCL_RETRY_CLASS,
    STORE_BARRIER_WAIT,
    STORE_BARRIER_WAIT_CLASS,
)
from ups.why.logread.frames import cpp_frame_class
from ups.why.logread.lines import Line, read_lines, return_code
from ups.why.tracebacks import frame_site

EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.)*_?[A-Z]\w*?(?:Error|Exception|Exit|Interrupt|Failure|Fault|WouldBlock)(?:_\w+)?)"
    r"(?::\s?(?P<msg>.*)|\s*[`'\"]?\s*$)"
)
TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)")
WRAPPERS = re.compile(r"(?:ChildFailedError|CalledProcessError|SystemExit|ProcessRaisedException|ProcessExitedException|"
                      r"SubprocessError)$")
WORKER_WRAPPER = re.compile(r"Caught (?P<type>\w+) in DataLoader worker process (?P<worker>\d+)")
ELASTIC_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+)")
ERRORISH = re.compile(r"^(?:[\w./-]+: )?(?:error|fatal|ERROR|FATAL|CRITICAL)\b|\bError:|\bERROR\b|^Error\b|\bFAILED\b|"
                      r"Traceback|\berror:|\bfailed\b|\bException\b")
MAX_CONTINUATION = 12


@dataclass
class Event:
    kind: str  # exception | cpp | child | line | code | cut
    lines: list[Line]  # its lines: the first is the one that starts it
    etype: str | None = None  # the exception's type (its last dotted part)
    frames: list[tuple[str, int, str | None]] = field(default_factory=list)  # its traceback, outermost first
    rank: int | None = None
    wrapper: bool = False  # reports another process's failure
    cause_of_next: bool = False  # an exception chained into the next one
    superseded: bool = False  # a wrapper whose wrapped failure the log also has
    code: int | None = None  # an NCCL return code (kind "code")
    shows: str | None = None  # the class a weak notice shows (kind "code": a C++ frame, NCCL's retries)

    @property
    def n(self) -> int:
        return self.lines[0].n

    @property
    def ts(self) -> str | None:
        return self.lines[0].ts

    @property
    def text(self) -> str:
        """What the event says: its lines' bodies (the deciding words may be on any)."""
        return "\n".join(ln.body for ln in self.lines)

    @property
    def head(self) -> Line:
        return self.lines[0]

    def site(self, own: bool = True) -> str | None:
        """``file:line`` where it was raised: the program's own innermost frame (``own``), else
        the innermost; else a file:line its text or prefix names."""
        frames = self.frames
        if own:
            mine = [f for f in frames if not is_library_file(f[0])]
            if mine:
                return _short(mine[-1])
        if frames:
            return _short(frames[-1])
        for ln in self.lines:
            m = re.search(r"([\w.-]+\.(?:py|cc|cpp|cu|cuh|c|h|hpp)):(\d+)", ln.body)
            if m:
                return f"{m.group(1)}:{m.group(2)}"
            if ln.site:
                return ln.site.rsplit("/", 1)[-1]
        return None

    @property
    def raised_in_own_code(self) -> bool:
        return bool(self.frames) and not is_library_file(self.frames[-1][0])


def _short(frame: tuple[str, int, str | None]) -> str:
    path = frame[0].replace("\\", "/").rsplit("/", 1)[-1]
    return f"{path}:{frame[1]}"


def read_events(text: str) -> list[Event]:
    """The events of a log, in the order they were printed."""
    return parse(read_lines(text))


def parse(lines: list[Line]) -> list[Event]:
    events: list[Event] = []
    frames: dict[str, list[tuple[str, int, str | None]]] = {}  # each stream's open traceback
    opened: dict[str, Line] = {}  # each stream's open traceback's last frame line
    source: dict[str, Line] = {}  # the code under each stream's last frame
    last_exception: dict[str, Event] = {}
    cpp: dict[str, bool] = {}  # each stream's C++ stack: whether the frame that raised was read
    retries: list[Event] = []
    waits: list[Event] = []  # the store-based barrier's notices that it still waits
    consumed: set[int] = set()
    for i, line in enumerate(lines):
        if line.n in consumed:
            continue
        stream = line.stream
        if line.role in ("context", "content", "warning") and STORE_BARRIER_WAIT.search(line.body):
            waits.append(Event("code", [line], rank=line.rank, shows=STORE_BARRIER_WAIT_CLASS))
            events.append(waits[-1])
            continue
        if line.role == "header":
            _close(events, frames, opened, source, stream)
            frames[stream] = []
            opened[stream] = line
        elif line.role == "frame":
            site = frame_site(line.body)
            if site:
                frames.setdefault(stream, []).append(site)
                opened[stream] = line
                source.pop(stream, None)
        elif line.role == "source":
            if stream in opened and stream not in source:
                source[stream] = line
        elif line.role == "chain":
            if stream in last_exception:
                last_exception[stream].cause_of_next = True
        elif line.role == "context":
            code = return_code(line)
            if code is not None:
                net = NCCL_RETRY_CLASS if NCCL_NET_ERRNO.search(line.raw) else None
                events.append(Event("code", [line], rank=line.rank, code=code, shows=net))
            elif line.nccl == "INFO" and NCCL_RETRY.search(line.body):
                retries.append(Event("code", [line], rank=line.rank, shows=NCCL_RETRY_CLASS))
                events.append(retries[-1])
            cpp_frame = _CPP_FRAME.match(line.body)
            if cpp_frame:
                if cpp_frame.group("k") == "0":
                    cpp[stream] = False
                if not cpp.get(stream, True) and not _CPP_RAISING.match(cpp_frame.group("sym")):
                    cpp[stream] = True
                    shows = cpp_frame_class(cpp_frame.group("sym"))
                    if shows:
                        events.append(Event("code", [line], rank=line.rank, shows=shows))
        elif line.role in ("content", "warning"):
            event = _statement(lines, i, consumed)
            if event is None:
                continue
            if event.kind == "line" and stream not in last_exception:
                event = _headless(event) or event
            if event.kind == "exception" or event.etype == "ChildFailedError":  # its traceback ends here
                event.frames = frames.pop(stream, [])
                opened.pop(stream, None)
                source.pop(stream, None)
                last_exception[stream] = event
            events.append(event)
    for stream in list(opened):
        _close(events, frames, opened, source, stream)
    _link_wrappers(events)
    _drop_passed_retries(lines, retries)
    _drop_passed_waits(lines, waits)
    return events


# The lines an exception's message goes on with, whose exception is known by them when a paste
# cut its first line: load_state_dict's RuntimeError ("Error(s) in loading state_dict for X:").
HEADLESS = (
    ("RuntimeError", re.compile(r"^(?:size mismatch for [\w.]+: copying a param with shape|"
                                r"(?:Missing|Unexpected) key\(s\) in state_dict: )")),
)


def _headless(event: Event) -> Event | None:
    """The exception whose message ``event``'s line goes on with, when the paste cut its first
    line (no exception came before it in its stream)."""
    etype = next((t for t, pattern in HEADLESS if pattern.match(event.head.body)), None)
    return Event("exception", event.lines, etype=etype, rank=event.rank) if etype else None


_CPP_FRAME = re.compile(r"^frame #(?P<k>\d+): (?P<sym>.+?)(?: \+ 0x[0-9a-f]+)?(?: \(|$)")
# c10's error constructors, the innermost frames of every C++ exception's stack
_CPP_RAISING = re.compile(r"c10::Error::|c10::\w*Error::|c10::detail::|torchCheckFail|torchInternalAssertFail|"
                          r"<unknown function>|c10::get_backtrace|c10::SourceLocation")
_NCCL_PROCESS = re.compile(r"^\s*(\S+?:\d+):\d+ \[\d+\]")


def _drop_passed_retries(lines: list[Line], retries: list[Event]) -> None:
    """NCCL retries a connection quietly while a peer starts: its retry notices show the network
    only when the process never got past them (no other NCCL line of it follows them)."""
    if not retries:
        return
    last: dict[str, int] = {}  # each NCCL process's last line that is not a retry
    for line in lines:
        if line.nccl is not None and not NCCL_RETRY.search(line.body):
            last[_who(line)] = line.n
    for ev in retries:
        if last.get(_who(ev.head), -1) > ev.n:
            ev.superseded = True


_SAYS = re.compile(r"[^\W_]")  # a line with a word on it (not a Markdown fence or a rule)


def _drop_passed_waits(lines: list[Line], waits: list[Event]) -> None:
    """The store-based barrier's notices that it waits show that the ranks never met only when
    the log never got past them: nothing follows the last one but tracebacks and the exceptions
    they ended with (a later line of any rank, the barrier's "Completed store-based barrier" or
    a step's, says the job went on: a rank that waited a while and joined is no failure)."""
    if not waits:
        return
    went_on = -1  # the last line that is neither a notice nor how a process ended
    in_traceback: set[str] = set()  # the streams inside a traceback (its lines up to its exception)
    for line in lines:
        if line.role in ("header", "chain"):
            in_traceback.add(line.stream)
        elif EXCEPTION.match(line.body):
            in_traceback.discard(line.stream)
        elif (line.stream not in in_traceback and line.role not in ("blank", "frame", "source")
              and not STORE_BARRIER_WAIT.search(line.body) and _SAYS.search(line.body)):
            went_on = line.n
    for ev in waits:
        if went_on > ev.n:
            ev.superseded = True


def _who(line: Line) -> str:
    m = _NCCL_PROCESS.match(line.body)
    return m.group(1) if m else f"stream:{line.stream}"


# A statement that raises: ``raise RuntimeError('Attempting to deserialize object on a CUDA '``.
RAISE = re.compile(r"^raise (?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)\s*\(\s*(?P<msg>.*)")
_LITERAL = re.compile(r"""[rbfu]?(?P<q>['"])(?P<s>(?:\\.|(?!(?P=q)).)*)(?P=q)?""")


def _close(events: list[Event], frames: dict, opened: dict, source: dict, stream: str) -> None:
    """A traceback that ends without its exception (a paste cut short): an event of its own,
    shown by its last frame. When the code of its innermost frame is a ``raise X("...")``, that
    statement is the exception it was cut before: its type, and the message its literal starts."""
    fr = frames.pop(stream, [])
    head = opened.pop(stream, None)
    code = source.pop(stream, None)
    if not fr or head is None:
        return
    m = RAISE.match(code.body) if code is not None else None
    if m:
        said = " ".join(lit.group("s") for lit in _LITERAL.finditer(m.group("msg")))
        line = Line(code.n, code.raw, f"{m.group('type')}: {said}".rstrip(), "content", rank=code.rank,
                    stream=code.stream, ts=code.ts)
        events.append(Event("exception", [line], etype=m.group("type").rsplit(".", 1)[-1], frames=fr, rank=head.rank))
        return
    events.append(Event("cut", [head], frames=fr, rank=head.rank))


def _statement(lines: list[Line], i: int, consumed: set[int]) -> Event | None:
    line = lines[i]
    body = line.body
    m = TERMINATE.search(body)
    if m:
        carried = _carried(lines, i, consumed, what=True)
        return Event("cpp", [line, *carried], etype=m.group("type").rsplit("::", 1)[-1], rank=line.rank)
    m = EXCEPTION.match(body) if line.role == "content" else None
    if m:
        etype = m.group("type").rsplit(".", 1)[-1]
        if etype.endswith("ChildFailedError"):
            return _child_failed(lines, i, consumed)
        carried = _carried(lines, i, consumed)
        event = Event("exception", [line, *carried], etype=etype, rank=line.rank)
        event.wrapper = bool(WRAPPERS.search(etype) or WORKER_WRAPPER.search(m.group("msg") or ""))
        return event
    m = ELASTIC_FAILED.search(body)
    if m:
        return Event("child", [line], rank=int(m.group("rank")), wrapper=True)
    return Event("line", [line, *_nccl_detail(lines, i, consumed)], rank=line.rank)


_DETAIL = re.compile(r"^(?:nccl[A-Z]\w*:|Last error:)")


def _nccl_detail(lines: list[Line], i: int, consumed: set[int]) -> list[Line]:
    """NCCL's error explained under the line that reports it ("ncclInvalidUsage: ...",
    "Last error:" and the line after it): the reason belongs to the error, even when the
    error's own line is garbled (two ranks' output interleaved). A logger prefixes the first
    line of a record only ("[rank1]:[E ...] ... NCCL error" and its unprefixed explanation):
    lines with no prefix may carry a rank's, and the explanation of a line with no prefix may
    carry a rank's (a paste that cut the first line's label)."""
    stream = lines[i].stream
    out: list[Line] = []
    last_error = False
    for line in lines[i + 1: i + 1 + MAX_CONTINUATION]:
        if line.role == "blank" or (line.stream != stream and line.stream and stream):  # a paste may double-space NCCL's lines
            continue
        if line.role == "content" and (_DETAIL.match(line.body) or last_error):
            out.append(line)
            consumed.add(line.n)
            last_error = line.body.startswith("Last error:") and not line.body[len("Last error:"):].strip()
            continue
        break
    return out


def _carried(lines: list[Line], i: int, consumed: set[int], *, what: bool = False) -> list[Line]:
    """The lines that carry on an exception's message (NCCL's "Last error:" and what follows,
    a driver message over several lines), in the same stream. NCCL's explanation under an
    exception line with no rank prefix is that exception's even when its lines carry a rank's
    (srun --label's "3: ncclInvalidUsage: ...", "3: Last error:" under a line a paste cut the
    label from)."""
    stream = lines[i].stream
    out: list[Line] = []
    own: set[str] = set()  # the other streams that printed a line of their own
    for k, line in enumerate(lines[i + 1:], i + 1):
        if len(out) >= MAX_CONTINUATION:
            break
        if line.stream != stream:
            # a rank's explanation is the unprefixed error's until that rank says something of its own
            if stream or line.stream in own or not _nccl_explains(line, out):
                own.add(line.stream)
                continue
        if line.role == "blank" and _detail_follows(lines, k, out[-1] if out else lines[i]):
            continue
        if what and not out:
            if WHAT.match(line.body):
                out.append(line)
                consumed.add(line.n)
                continue
            break
        if line.role != "content" or EXCEPTION.match(line.body) or TERMINATE.search(line.body):
            break
        if line.level is not None or _starts_statement(line.body):
            break
        out.append(line)
        consumed.add(line.n)
    return out


def _nccl_explains(line: Line, carried: list[Line]) -> bool:
    """``line`` is NCCL's explanation of the error above: its error's name ("ncclInvalidUsage:
    ..."), "Last error:", or the line after an empty "Last error:"."""
    return line.role == "content" and bool(_DETAIL.match(line.body) or (carried and carried[-1].body.strip() == "Last error:"))


def _detail_follows(lines: list[Line], k: int, last: Line) -> bool:
    """Blank lines at ``k`` inside NCCL's explanation of an error (a paste that double-spaces
    lines): the line before is an empty "Last error:", or the next one is NCCL's detail."""
    if last.body.strip() == "Last error:":
        return True
    after = next((ln for ln in lines[k + 1: k + 4] if ln.role != "blank" and (ln.stream == last.stream or not last.stream)),
                 None)
    return after is not None and after.role == "content" and bool(_DETAIL.match(after.body))


_STARTS = re.compile(r"^(?:slurmstepd|srun:|Killed\b|Terminated\b|Segmentation fault|Bus error|Aborted|NVRM:|\*\*\*|"
                     r"ERROR:|terminate called|Fatal Python error|.*\bfailed \(exitcode:)")


def _starts_statement(body: str) -> bool:
    return bool(_STARTS.match(body))


def _child_failed(lines: list[Line], i: int, consumed: set[int]) -> Event:
    """torchrun's ChildFailedError block: its root cause's rank, exit code and traceback line.
    The block's other failures came after the root cause (torchrun's SIGTERM to the rest)."""
    ahead = lines[i + 1: i + 60]
    root = next((k for k, line in enumerate(ahead) if "Root Cause" in line.raw), None)
    if root is None or any(line.role == "header" or EXCEPTION.match(line.body) for line in ahead[:root]):
        return Event("child", [lines[i]], etype="ChildFailedError", wrapper=True)  # no report of its own here
    block: list[Line] = []
    for line in ahead[root + 1:]:
        if line.role == "header" or EXCEPTION.match(line.body) or (re.match(r"\s*={5,}", line.raw) and block):
            break
        block.append(line)
    consumed.update(line.n for line in ahead[: root + 1 + len(block)])
    said = " ".join(ln.raw.strip() for ln in block)
    rank = re.search(r"\brank\s*:?\s*(\d+)|\brank(\d+) \(local", said)
    r = next((int(g) for g in rank.groups() if g is not None), None) if rank else None
    return Event("child", [lines[i], *block], etype="ChildFailedError", rank=r, wrapper=True)


def _link_wrappers(events: list[Event]) -> None:
    """A DataLoader worker's "Caught X in DataLoader worker process N" is followed by the
    worker's own traceback and exception: that one is the failure, the wrapper only says
    where it came from. When the worker's traceback is cut before its exception (a paste that
    ends early), the wrapper stands for it: the worker raised X, at the traceback's frames."""
    for k, ev in enumerate(events):
        if ev.kind != "exception" or not ev.wrapper:
            continue
        m = WORKER_WRAPPER.search(ev.text)
        if not m:
            continue
        later = [e for e in events[k + 1:] if e.head.stream == ev.head.stream]
        inner = next((e for e in later if e.kind == "exception" and e.etype == ev.etype and not e.wrapper), None)
        if inner is not None:
            ev.superseded = True
            continue
        cut = next((e for e in later if e.kind in ("exception", "cut")), None)
        if cut is not None and cut.kind == "cut":
            ev.frames, ev.wrapper, cut.superseded = cut.frames, False, True


def is_errorish(event: Event) -> bool:
    """An unclassed line that still reads as an error (a failure the classes do not know)."""
    if event.kind != "line":
        return True
    line = event.head
    if line.role == "warning":
        return False
    return line.level in ("ERROR", "CRITICAL", "FATAL", "E", "F") or bool(ERRORISH.search(line.body))
