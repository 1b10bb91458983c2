"""A Python traceback's lines and a stack dump's frames, read in one place.

CPython's tracebacks (``File "x.py", line 3, in f``), faulthandler's dumps (the same, without the
comma), and the frame lines of the tracebacks others print (IPython, Jupyter cells, cleo's
``at x.py:3 in f``, Rich's boxed traceback) are one grammar here. Every reader asks it: a log's
lines (:mod:`ups.why.logread.lines`), a stack file's sections (:mod:`ups.why.stacks`), the
frames named in a process's output (:mod:`ups.why.rules.exits`).
"""

from __future__ import annotations

import re

HEADER = re.compile(r"Traceback \(most recent call last\):?")
CHAIN = re.compile(r"During handling of the above exception, another exception occurred|"
                   r"The above exception was the direct cause of the following exception")
FRAME = re.compile(
    r'^\s*File "(?P<path>[^"]*)", line (?P<line>\d+)(?:,? in (?P<fn>\S+))?'  # CPython (faulthandler: no comma)
    r"|^\s*File (?P<jpath>[^,\s]+\.py):(?P<jline>\d+)(?:, in (?P<jfn>\S+?)\(\))?"  # IPython
    r"|^\s*(?P<cpath>\S+\.py):(?P<cline>\d+) \((?P<cfn>\w+)\)\s*$"
    r"|^\s*at (?P<apath>\S+\.py):(?P<aline>\d+) in (?P<afn>\w+)\s*$"  # cleo / pretty tracebacks
    r"|^\s*(?P<kpath>Cell In\[\d+\]), line (?P<kline>\d+)"  # Jupyter's cell (the program's own code)
    r"|^\s*(?P<ipath><ipython-input-[^>]+>|Cell In\[\d+\]) in <?\w+>?"
    r"|^\s*│\s*(?P<rpath>[^\s│]+\.py):(?P<rline>\d+) in (?P<rfn>[^\s│]+)"  # Rich's boxed traceback
)
FRAME_IN_TEXT = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<fn>\S+)')
"""A CPython frame anywhere in a line (behind a rank's prefix, in a message that quotes one)."""


def frame_site(body: str) -> tuple[str, int, str | None] | None:
    """(path, line, function) of a traceback frame line."""
    m = FRAME.match(body)
    if not m:
        return None
    for p, n, f in (("path", "line", "fn"), ("jpath", "jline", "jfn"), ("cpath", "cline", "cfn"), ("apath", "aline", "afn"),
                    ("kpath", "kline", None), ("rpath", "rline", "rfn")):
        if m.group(n) is not None:
            return m.group(p), int(m.group(n)), m.group(f) if f else None
    return None


def frames_in(text: str) -> list[tuple[str, int, str]]:
    """Every CPython frame named in ``text``, in order: (path, line, function)."""
    return [(m["path"], int(m["line"]), m["fn"]) for m in FRAME_IN_TEXT.finditer(text)]
