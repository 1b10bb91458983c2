"""One line of a log, as an engineer reads it: who printed it (a rank's prefix, a timestamp, a
logger's level) and what role it plays. Roles:

* ``context``: never decides anything. INFO and DEBUG lines (NCCL's ``NCCL INFO`` dumps,
  which print "cannot open shared object file" in healthy runs), the lines a Python warning
  carries after its message, boilerplate footers (CUDA's "Compile with `TORCH_USE_CUDA_DSA`",
  "CUDA_LAUNCH_BLOCKING=1"), banners, progress bars, C++ frame dumps;
* ``warning``: a WARNING line, a Python warning's message (on its ``UserWarning:`` line or the
  line after an empty one), an error the program says it caught: read only by the signs a
  warning may show;
* ``frame`` and ``source``: a Python traceback's ``File "...", line N`` and the code under it;
* ``header`` (``Traceback (most recent call last):``) and ``chain`` (``During handling of the
  above exception`` / ``The above exception was the direct cause``);
* ``content``: everything else, the lines that may say what went wrong.

Footers printed inside a line (a one-line CUDA error with its footer) are cut off the line's
``body``; the ``raw`` text is kept for display. A line a terminal or a paste hard-wrapped at a
fixed width (several lines of one length, cut inside words, none starting a line of its own)
is read as the one line it was printed as.
"""

from __future__ import annotations

import html
import itertools
import re
from dataclasses import dataclass, replace

from ups.status.lineprefix import PATTERN as TORCHRUN_PREFIX
from ups.status.lineprefix import read_prefixes
from ups.why.tracebacks import CHAIN, FRAME, HEADER

# -- prefixes: who printed the line ---------------------------------------------------------------
# Each is tried at the start of the line, again and again, until none matches.
# torchrun's ("[default1]:[rank3]: ") are read by ups.status.lineprefix; these are other launchers'.
_RANK_PREFIXES = (
    re.compile(r"\[\d+,(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?"),  # mpirun --tag-output
    re.compile(r"\[\d+,mpirank:(?P<rank>\d+),[^\]\s]*\]<(?:stdout|stderr)>:\s?"),  # ... as SageMaker's mpirun tags it
    re.compile(r"\[RANK (?P<rank>\d+)\]\s?"),
    re.compile(r"(?P<rank>\d{1,5}): (?=\s*\S)"),  # srun --label (its indented lines too: a traceback's frames)
    re.compile(r"\((?:\w+ )?rank=(?P<rank>\d+) pid=\d+[^)]*\)\s?"),  # vLLM's workers: "(VllmWorker rank=1 pid=12231)"
)
_OTHER_PREFIXES = (
    re.compile(r"\((?:\w+ )?pid=[^)]*\)\s?"),  # Ray workers
    # pdsh / DeepSpeed's multi-node launcher / mpirun with a host label ("worker-1: "): taken as
    # a prefix only before another prefix a log line starts with (NCCL's host:pid:tid, a rank's,
    # a timestamp, a traceback), never before words ("Error: ...").
    re.compile(r"[A-Za-z][\w.-]*: (?=\S+:\d+:\d+ \[\d+\] |" + TORCHRUN_PREFIX + r"|\[\d{4}-\d\d-\d\d|"
               r"\d{4}-\d\d-\d\d[ T]|Traceback \(|\s*File \")"),
    re.compile(r"\[(?:stderr|stdout)\]\s?|(?:stderr|stdout|STDERR|STDOUT):\s?"),
    re.compile(r"(?:stdout|stderr) [FP] "),  # a container runtime's log file (CRI): "<time> stderr F <line>"
    # docker compose's service label ("trainer-1  | ", v1's "trainer_1  | "), kubectl --prefix's
    re.compile(r"[\w.-]+[-_]\d+\s+\|\s?|\[pod/[^\]\s]+\]\s?"),
    re.compile(r">{1,3}\s"),  # a quote in a pasted report, an interpreter's prompt
    re.compile(r"E {2,}(?=\S)"),  # pytest's failure lines
    re.compile(r"\[\d{1,7}\]\s"),  # a line or process number
    # Timestamps: ISO (also in brackets, kubectl --timestamps, Determined's "|| "), syslog,
    # dmesg (seconds since boot, or -T), yy-mm-dd and mm/dd forms.
    re.compile(r"\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?:\s*\w{6,8} \|\|)?:?\s"),
    re.compile(r"[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?: [\w.-]+ (?=kernel:|\w+\[\d+\]:))?\s*"),
    re.compile(r"kernel:\s"),
    re.compile(r"\[\s*\d+\.\d+\]\s?"),
    re.compile(r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4}\]\s?"),
    re.compile(r"\d\d-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s*:?\s"),
    re.compile(r"\d\d/\d\d(?:/\d{4})? \d\d:\d\d:\d\d(?:[.,]\d+)?\s"),
    re.compile(r"\d\d:\d\d:\d\d(?:[.,]\d+)?\s"),
)
TIMESTAMP = re.compile(r"(?:(?P<date>\d{4}-\d\d-\d\d)[ T]|[IWEF](?P<md>\d{3,4}) )(?P<time>\d\d:\d\d:\d\d(?:[.,]\d+)?)")

# -- levels --------------------------------------------------------------------------------------
# glog (``E0325 20:57:27.620 2606 api.py:869]``) and c10d (``[W socket.cpp:426]``,
# ``[E626 06:24:44.903 ProcessGroupNCCL.cpp:616]``): the level is the first letter.
_GLOG = re.compile(r"\[?(?P<lvl>[IWEF])(?:\d{4})?(?: ?\d\d:\d\d:\d\d\.\d+)?(?:\s+\d+)?\s+(?P<site>[\w./-]+\.\w+:\d+)\]\s?")
# NCCL's prefix: host:pid:tid (or the host alone: "gpu-server320 [5] misc/socket.cc:46 NCCL WARN"),
# the device, and the file:line (older releases: "include/socket.h 398")
_NCCL = re.compile(r"(?:\S+(?::\d+:\d+)? )?(?:\[\d+\] )?(?:[\w./-]+\.\w+[: ]\d+ )?NCCL (?P<lvl>INFO|WARN|TRACE|ERROR)\b")
# A logger's level word near the start: "INFO:", "[INFO]", "- INFO -", "| INFO |", "[INFO|x.py:3]".
_LEVEL = re.compile(r"^.{0,60}?(?:^|[\s\[|(:*-])(?P<lvl>INFO|DEBUG|TRACE|WARNING|WARN|ERROR|CRITICAL|FATAL)(?=[\s\]\[|:)*-]|$)")
# glog's layout with the level's word (vLLM's loggers): "ERROR 03-25 21:13:53 [core.py:500] ", older
# "ERROR 03-25 21:13:53 multiproc_executor.py:374] "
_WORD_GLOG = re.compile(r"(?P<lvl>INFO|DEBUG|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
                        r"\[?(?P<site>[\w./-]+\.\w+:\d+)\]\s?")
_TF_LEVEL = re.compile(r"(?P<lvl>[IWEF]) (?:tensorflow|external|torch)/")

QUIET_LEVELS = frozenset(("INFO", "DEBUG", "TRACE", "I"))
WARNING_LEVELS = frozenset(("WARNING", "WARN", "W"))
ERROR_LEVELS = frozenset(("ERROR", "CRITICAL", "FATAL", "E", "F"))

# -- boilerplate ---------------------------------------------------------------------------------
FOOTERS = re.compile(
    r"CUDA kernel errors might be asynchronously reported at some other API call,?\s*so the stacktrace below might be incorrect\.?"
    r"|For debugging,? consider passing CUDA_LAUNCH_BLOCKING=1\.?"
    r"|Compile with .?TORCH_USE_CUDA_DSA.? to enable device-side assertions?\.?"
    r"|Device-side assertion tracking was not enabled by user\.?"
    r"|\(?run with NCCL_DEBUG=(?:INFO|WARN) for details\)?"
    r"|Details are lost due to multiprocessing\.\s*Rerunning with num_workers=0 may give better error trace\.?"
    r"|To enable traceback see: \S+"
    r"|See inner exception for details\.?"
    # A list of what *might* have happened ("There are some potential root causes. (1) ... OOM
    # killer (2) ... SIGSEGV") is a hint, not a report: its words say nothing happened.
    r"|\b(?:There (?:are|is) (?:some |several |a few )?)?(?:potential|possible|probable) (?:root )?(?:causes?|reasons?)\b.*"
    # ... and so is a guess between causes ("This could be caused by a segmentation fault ... or by an
    # excessive memory usage": joblib's words for a worker that died)
    r"|\b(?:could|might|may) (?:be|have been) caused by\b[^\n]*?\bor (?:by|due to|because)\b.*",
    re.I,
)
# Whole lines that are boilerplate whatever their level.
_BOILERPLATE = re.compile(
    r"^\**$|^[-=_~*#]{3,}\s*$"
    r"|Setting OMP_NUM_THREADS environment variable"
    r"|master_addr is only used for static rdzv_backend"
    r"|Some NCCL operations have failed or timed out"
    r"|To avoid data inconsistency, we are taking the entire process down"
    r"|^Exception raised from .* \(most recent call first\):?"
    r"|^frame #\d+:|^< omitting python frames >|^C\+\+ CapturedTraceback:|^#\d+ \S+ from "
    r"|^\[?\s*\w+\s*\]?\s*\.{3,}\s*\[?(?:OKAY|NO|YES)\]?"  # ds_report tables
    r"|preparing to dump debug info"
    r"|/proc/\d+/\S* failed: No such file"  # SLURM asking about a process that already ended
    # NCCL falls back when a plugin or an optional library is missing: not a failure.
    r"|NCCL WARN[^\n]*(?:plugin|libnccl-net|libibverbs|dlerror|dlopen|Could not find real path|No device found|"
    r"Unable to open device|NET/IB : No device)"
    r"|^Exception \(either an error or timeout\) detected by watchdog",
    re.I,
)
# A Python warning's category and message ("x.py:146: UserWarning: <message>"); the message may
# be on the next line (torch's warnings start with a newline).
_PY_WARNING = re.compile(r"(?:^|[\s:(\]])[A-Z]\w*Warning:\s*(?P<msg>.*)$|^Warning:\s*(?P<bare>.*)$")
# A whole line in a paste's Markdown emphasis ("**Killed**", "`Segmentation fault`").
_EMPHASIS = re.compile(r"^(\*\*|__|`)(?P<said>[^*_`].*?)\1$")
_WARNING_LINE = re.compile(r"(?:^|[\s:(\]])(?:[A-Z]\w*)?Warning:|\bwarning:|^\s*warnings?\.warn\(|^\s*_?warn(?:ings\.warn)?\(")
_EXCEPTION_LIKE = re.compile(r"^[\w.]*(?:Error|Exception)\b:?")
# An error right under a warning is not the warning's message.
_ERROR_WORDS = re.compile(r"\b(?:[Ee]rror|ERROR|FAILED|Killed|Segmentation fault|out of memory|Traceback)\b")
# A program saying it caught an error and goes on ("Error caught was: No module named 'triton'",
# "Ignoring exception: ..."): what it caught is a notice, like a warning. Python's own
# "Exception ignored in: <obj>" is not this: the exception it prints follows on lines of its own.
_HANDLED = re.compile(r"^(?:[\w-]+ ){0,3}?(?:errors?|exceptions?) (?:was |were )?(?:caught|ignored|suppressed|handled)"
                      r"(?: (?:was|is|were))?:|^(?:caught|ignor(?:ed|ing)|suppress(?:ed|ing)) (?:an? |the )?"
                      r"(?:errors?|exceptions?):", re.I)
_PROGRESS = re.compile(r"^.*?\d+/\d+\s*\[[\d:<?]+[^\]]*\]")  # tqdm: "42%|████ | 21/50 [00:03<00:04, 7.1it/s]"
_CARETS = re.compile(r"^[\s^~]+$")
# A command typed at a shell's prompt and pasted with its output ("# dmesg | grep -i xid",
# "$ nvidia-smi", "user@node:~$ python train.py"): the user's words (a grep's pattern, a
# script's name), not a line the job printed.
_PROMPT = re.compile(r"^(?:[\w.-]+@[\w.-]+(?::\S*)?\s?)?[$#] (?:sudo )?[a-z][\w.-]*(?: |$)")

# -- tracebacks ----------------------------------------------------------------------------------
_IPYTHON_CODE = re.compile(r"^\s*(?:-*>\s*)?\d+\s")


@dataclass(frozen=True)
class Line:
    n: int  # index in the log
    raw: str  # as printed (for display)
    body: str  # prefixes and inline footers removed
    role: str  # content | warning | context | frame | source | header | chain | blank
    level: str | None = None  # the logger's level word, if the line has one
    rank: int | None = None  # from a per-rank prefix
    stream: str = ""  # lines of one stream follow each other (a rank's, or the main output)
    ts: str | None = None  # a timestamp printed on the line
    site: str | None = None  # file:line the line's prefix names (glog, c10d, NCCL)
    nccl: str | None = None  # NCCL's level (INFO, WARN) when NCCL printed the line


_RANK_PREFIX = re.compile("|".join(f"(?:{p.pattern.replace('?P<rank>', f'?P<rank{k}>')})"
                                   for k, p in enumerate(_RANK_PREFIXES)))
_OTHER_PREFIX = re.compile("|".join(f"(?:{p.pattern})" for p in _OTHER_PREFIXES))


def _strip_prefixes(text: str) -> tuple[str, int | None, str | None]:
    text, rank, local, ts = _read_prefixes(text)
    return text, rank if rank is not None else local, ts


def _read_prefixes(text: str) -> tuple[str, int | None, int | None, str | None]:
    """The line's text without its prefixes, the global rank they name (torchrun's
    ``[rankN]:`` first: under ``srun --label`` the label is the node's task, not the rank;
    else another launcher's), torchrun's local rank (``[defaultN]:``), the timestamp."""
    rank = other = local = ts = None
    t = TIMESTAMP.search(text, 0, 60)
    if t:
        ts = (t.group("date") or t.group("md") or "") + " " + t.group("time").replace(",", ".")
    while text:
        torchrun = read_prefixes(text)
        if torchrun is not None:
            rank = torchrun.rank if rank is None else rank
            local = torchrun.local_rank if local is None else local
            text = text[torchrun.end:]
            continue
        m = _RANK_PREFIX.match(text)
        if m:
            if other is None:
                other = int(next(g for g in m.groups() if g is not None))
        else:
            m = _OTHER_PREFIX.match(text)
        if not m or m.end() == 0:
            break
        text = text[m.end():]
    return text, rank if rank is not None else other, None if other is not None and rank is None else local, ts


def _level(body: str) -> tuple[str | None, str | None, str | None, str]:
    """(level, nccl level, site, body without a glog/c10d prefix)."""
    m = _NCCL.match(body) if "NCCL " in body else None
    if m:
        site = re.search(r"([\w./-]+\.\w+)[: ](\d+) NCCL", body)
        return m.group("lvl"), m.group("lvl"), f"{site.group(1)}:{site.group(2)}" if site else None, body
    m = _GLOG.match(body) or _WORD_GLOG.match(body)
    if m:
        return m.group("lvl"), None, m.group("site"), body[m.end():]
    m = _TF_LEVEL.match(body)
    if m:
        return m.group("lvl"), None, None, body
    m = _LEVEL.match(body)
    if m:
        return m.group("lvl"), None, None, body
    return None, None, None, body


# A terminal's escape sequences (colours, titles): a log written by a coloured logger has them.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|apos|#39|#x27|#34);")
_NCCL_PREFIX = re.compile(r"\S+(?::\d+:\d+)? \[\d+\] (?=[\w./-]+\.\w+[: ]\d+ NCCL |NCCL )")
WRAP_WIDTH = 60  # narrower lines of one length are too common to be read as a wrap


def _starts_a_line(text: str) -> bool:
    """A physical line that is a line of its own, not the rest of the one before it: indented,
    or with a prefix (a rank, a timestamp, NCCL's host:pid:tid), a level, a traceback's line or
    an exception."""
    if not text or text[0].isspace():
        return True
    if _strip_prefixes(text)[0] != text or _NCCL_PREFIX.match(text) or _GLOG.match(text):
        return True
    level = _LEVEL.match(text)
    return bool(HEADER.match(text) or FRAME.match(text) or _EXCEPTION_LIKE.match(text) or _STATEMENT.match(text)
                or (level and level.start("lvl") < 3))


def _log_width(physical: list[str]) -> int | None:
    """The width a whole paste was wrapped at: its longest lines, when at least three share that
    length (at least WRAP_WIDTH; one line repeated, wrapped each time, counts), most are followed
    by the rest of a line (a line that does not start one of its own), and a third of those
    wraps cut inside a word or before the punctuation that goes on a line (",", ")")."""
    width = max((len(x) for x in physical), default=0)
    if width < WRAP_WIDTH:
        return None
    at = [k for k, x in enumerate(physical) if len(x) == width]
    if len(at) < 3:
        return None
    follows = [k for k in at if k + 1 < len(physical) and physical[k + 1] and not _starts_a_line(physical[k + 1])]
    cut = [k for k in follows if _cut_inside(physical[k], physical[k + 1])]
    return width if len(follows) * 2 > len(at) and len(cut) * 3 >= len(follows) else None


def _cut_inside(a: str, b: str) -> bool:
    """``a`` and ``b`` are one line cut in two: inside a word, before punctuation that never
    starts a line of its own, right after a comma, a bracket or a slash, or after a dot or a
    space (a printed line seldom ends on one) before a lowercase word."""
    end, start = a[-1:], b[:1]
    word = (end.isalnum() or end == "_") and (start.isalnum() or start == "_")
    return (word or (end.isalnum() and start in ",;)]}") or (end in ",([{/=" and start.isalnum())
            or (end in ". " and start.islower()))


_FRAME_OPEN = re.compile(r'^\s*File "[^"]+$')  # a frame line whose path a paste wrapped
_FRAME_REST = re.compile(r'^\s*[^"\s]*", line \d+')


def _join_cut_frames(printed: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A traceback's ``File "..."`` line that a paste wrapped inside its path (``File
    "/opt/.../site-packages/torch`` / ``/serialization.py", line 114, in default_restore_location``)
    is the one frame line it was printed as."""
    out: list[tuple[int, str]] = []
    k = 0
    while k < len(printed):
        n, raw = printed[k]
        if "File \"" in raw and _FRAME_OPEN.match(_strip_prefixes(raw.strip())[0]):
            # the rest is on the next line (the next but one in a paste that double-spaces its lines),
            # under the same prefix or none
            j = k + 2 if k + 2 < len(printed) and not printed[k + 1][1].strip() else k + 1
            rest = _strip_prefixes(printed[j][1].strip())[0] if j < len(printed) else ""
            if _FRAME_REST.match(rest):
                out.append((n, raw.rstrip() + rest.lstrip()))
                k = j + 1
                continue
        out.append((n, raw))
        k += 1
    return out


_QUOTED = re.compile(r"^(?:> ?|\s+)")


def _dedent(physical: list[str]) -> list[str]:
    """A paste indented or quoted as a whole (a Markdown code block, a quoted reply: every line
    starts with the same spaces or "> ") without it: its lines' own indentation is what tells
    a line that starts from the rest of a wrapped one."""
    lines = [x for x in physical if x.strip() not in ("", ">")]  # a quoted reply's empty lines are ">"
    if not lines:
        return physical
    m = _QUOTED.match(lines[0])
    lead = m.group(0) if m else ""
    if lead.strip() == ">":
        lead = lead if all(x.startswith(lead) for x in lines) else ""
    else:
        lead = min((re.match(r"\s*", x).group(0) for x in lines), key=len)
        lead = lead if all(x.startswith(lead) for x in lines) else ""
    if not lead:
        return physical
    return [x[len(lead):] if x.startswith(lead) else x.lstrip(" >") for x in physical]


def unwrap(physical: list[str]) -> list[tuple[int, str]]:
    """(index of its first physical line, text) of each printed line. A run of two or more
    distinct lines of one width (at least WRAP_WIDTH) and the shorter line after them are one
    line a terminal wrapped when none of them but the first starts a line of its own and the
    wrap cuts a word somewhere (``...stuck for 600 second`` / ``s without making progress``)."""
    out: list[tuple[int, str]] = []
    wrapped_at = _log_width(physical)
    if wrapped_at:
        k = 0
        while k < len(physical):
            j = k
            while (len(physical[j]) == wrapped_at and j + 1 < len(physical) and physical[j + 1]
                   and not _starts_a_line(physical[j + 1])):
                j += 1
            out.append((k, "".join(physical[k: j + 1])))
            k = j + 1
        return out
    k = 0
    while k < len(physical):
        width = len(physical[k])
        j = k
        while j + 1 < len(physical) and len(physical[j + 1]) == width:
            j += 1
        if width >= WRAP_WIDTH and j > k and j + 1 < len(physical):
            group = physical[k: j + 2]
            if (len(set(group[:-1])) == len(group) - 1 and 0 < len(group[-1]) <= width
                    and not any(_starts_a_line(g) for g in group[1:])
                    and any(_cut_inside(a, b) for a, b in itertools.pairwise(group))):
                out.append((k, "".join(group)))
                k = j + 2
                continue
        out.extend((m, physical[m]) for m in range(k, j + 1))
        k = j + 1
    return out


def read_lines(text: str) -> list[Line]:
    """The log's lines with their roles. Carriage returns (progress bars redrawn in place)
    end lines too; a hard-wrapped line is one line (:func:`unwrap`), numbered by its first."""
    roles = _Roles()
    out: list[Line] = []
    local_only: set[int] = set()  # lines whose only rank is torchrun's local one ("[default1]:")
    several_nodes = False
    text = _ANSI.sub("", text) if "\x1b" in text else text
    if _ENTITY.search(text):  # a paste taken from a web page's HTML: "&lt;/torch_1234&gt;", "&#39;"
        text = html.unescape(text)
    if 'File \\"' in text:  # a paste from a string's repr or JSON: File \"/x.py\", line 3
        text = text.replace('\\"', '"')
    for n, raw in _join_rich_frames(_join_cut_frames(unwrap(_dedent(re.split(r"\r\n|\r|\n", text))))):
        raw = raw.rstrip()
        body, rank, local, ts = _read_prefixes(raw.strip())
        if rank is None and local is not None:
            rank = local  # the global rank on one node; read_lines takes it back on several
            local_only.add(len(out))
        elif local is not None and local != rank:
            several_nodes = True  # "[default0]:[rank2]:": local ranks are not global ranks here
        stream = f"rank{rank}" if rank is not None else ""
        emphasis = _EMPHASIS.match(body)
        if emphasis:
            body = emphasis.group("said").strip()
        bar = _PROGRESS.match(body)
        if bar and not HEADER.search(body[: bar.end()]):
            body = body[bar.end():].lstrip(" |")  # an error printed right after a progress bar
        level = nccl = site = None
        if not _EXCEPTION_LIKE.match(body):
            level, nccl, site, body = _level(body)
        role, body = roles.of(body.strip(), level, nccl)
        if role in ("content", "warning") and out and _rest_of_quiet_line(out[-1], raw):
            role, stream, rank = "context", out[-1].stream, out[-1].rank
        out.append(Line(n, raw, body, role, level, rank, stream, ts, site, nccl))
    if several_nodes:  # a local rank names a process of each node: no rank, a stream of its own
        for i in local_only:
            if out[i].rank is not None and out[i].stream == f"rank{out[i].rank}":
                out[i] = replace(out[i], rank=None, stream=f"local{out[i].rank}")
    return out


# A row of Rich's boxed traceback ("│ <text> │") and what a frame's row says ("path.py:182 in fn").
_BOX_ROW = re.compile(r"^\s*│\s?(?P<said>.*?)\s*│?\s*$")
_BOX_PATH = re.compile(r"^[^\s│]*[/\\][^\s│]*$")
_RICH_FRAME_SAYS = re.compile(r"^[^\s│]+\.py:\d+ in [^\s│]+$")


def _join_rich_frames(printed: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Rich's boxed traceback puts a frame's ``path.py:182 in fn`` on one row, and a path
    longer than the box on a row of its own, its line and function on the next (or the path
    folded over two rows): those rows are the one frame line."""
    out: list[tuple[int, str]] = []
    k = 0
    while k < len(printed):
        n, raw = printed[k]
        row = _box_row(raw)
        joined = None
        if row is not None and _BOX_PATH.match(row):
            said = row
            for j in range(k + 1, min(k + 6, len(printed))):
                if not printed[j][1].strip() and j + 1 < len(printed) and printed[j - 1][1].strip():
                    continue  # a paste that double-spaces its lines
                nxt = _box_row(printed[j][1])
                if not nxt:
                    break
                said += nxt
                if _RICH_FRAME_SAYS.match(said):
                    joined = j
                    break
                if " " in nxt:
                    break
        if joined is None:
            out.append((n, raw))
            k += 1
            continue
        out.append((n, raw[: raw.index("│")] + f"│ {said} │"))
        k = joined + 1
    return out


def _box_row(raw: str) -> str | None:
    """What a row of Rich's box says (after the line's prefixes), or None for another line."""
    if "│" not in raw:
        return None
    row = _BOX_ROW.match(_strip_prefixes(raw.strip())[0])
    return row.group("said") if row else None


def _rest_of_quiet_line(prev: Line, raw: str) -> bool:
    """``raw`` is the rest of an INFO line a terminal wrapped (too few lines of one width to
    tell the paste's width): the INFO line is long and stops on a character, and ``raw`` goes
    on lowercase or with punctuation, with nothing that starts a line of its own: not a level
    word of its own ("submitit WARNING (...) - ..."), nor the first word the INFO line starts
    with (a logger's name: its next line)."""
    quiet = prev.nccl in ("INFO", "TRACE") or (prev.nccl is None and prev.level in QUIET_LEVELS)
    return (quiet and prev.role == "context" and len(prev.raw) >= WRAP_WIDTH and prev.raw[-1:].strip() != ""
            and raw[:1].strip() != "" and not raw[:1].isupper() and not raw[:1].isdigit()
            and not _OWN_WORDS.match(raw) and not _starts_a_line(raw) and _LEVEL.match(raw) is None
            and raw.split(None, 1)[0] != prev.raw.split(None, 1)[0])


# Lines that start lowercase and still stand alone: NCCL's error names, a C++ exception's what().
_OWN_WORDS = re.compile(r"(?:nccl[A-Z]\w*|what\(\)|[\w.]+\(\)):")


class _Roles:
    """A line's role, from the line and the few before it (a frame's source line, a warning's
    message lines, an IPython traceback's code)."""

    def __init__(self) -> None:
        self.in_warning = False  # the lines a Python warning carries (its message, `warnings.warn(`)
        self.after_frame = False  # the next line is the frame's source code
        self.ipython = False
        self.message_next = False  # a Python warning's header had no message: the next line is it
        self.rich = False  # inside Rich's boxed traceback ("╭── Traceback ... ──╮" to "╰──╯")

    def of(self, body: str, level: str | None, nccl: str | None) -> tuple[str, str]:
        if not body:
            self.in_warning = self.after_frame = self.message_next = False
            return "blank", ""
        message_next, self.message_next = self.message_next, False
        if _PROMPT.match(body):
            self.in_warning = self.after_frame = False
            return "context", body
        if HEADER.search(body):
            self.in_warning = self.after_frame = False
            self.ipython = bool(re.match(r"\S+\s{3,}Traceback", body))
            self.rich = body.startswith("╭")
            return "header", body
        if CHAIN.search(body):
            self.in_warning = self.after_frame = False
            return "chain", body
        if FRAME.match(body):
            self.after_frame = True
            # a Rich frame row is inside its box even when the paste cut the box's top
            self.rich = self.rich or body.startswith("│")
            return "frame", body
        if self.rich:  # the box's other lines are its frames' code and locals
            self.rich = not body.startswith("╰")
            if body[:1] in "│╰":
                self.after_frame = False
                return "source" if body[:1] == "│" else "context", body
            self.rich = False
        if self.after_frame and not _looks_like_statement(body):
            self.after_frame = False
            return "source", body
        self.after_frame = False
        if self.ipython and _IPYTHON_CODE.match(body):
            return "source", body
        if _CARETS.match(body) or nccl in ("INFO", "TRACE") or (nccl is None and level in QUIET_LEVELS):
            if level is not None:  # a logger's line is a statement of its own: a warning's carried lines end
                self.in_warning = False
            return "context", body
        if "arn" in body and _WARNING_LINE.search(body) and not _EXCEPTION_LIKE.match(body):
            self.in_warning = True
            # A Python warning's message is a notice: read, like a WARNING line, only by the
            # signs that a warning may show (:class:`ups.why.logread.classes.Sign`'s on_warning).
            m = _PY_WARNING.search(body)
            if m is None:
                return "context", body
            said = FOOTERS.sub("", m.group("msg") if m.group("msg") is not None else m.group("bare")).strip()
            self.message_next = not said
            return ("warning", said) if said else ("context", body)
        if self.in_warning and not _looks_like_statement(body) and not _ERROR_WORDS.search(body):
            if message_next:
                return "warning", FOOTERS.sub("", body).strip()
            return "context", body
        self.in_warning = False
        said = FOOTERS.sub("", body).strip()
        if _BOILERPLATE.search(body) or not said.strip(" .'\""):
            return "context", body
        if (nccl is None and level in WARNING_LEVELS) or _HANDLED.match(said):
            return "warning", said
        return "content", said


_STATEMENT = re.compile(r"^(?:[\w.]*(?:Error|Exception)\b|terminate called|Traceback|\*\*\*|slurmstepd|srun:|Killed\b|Terminated\b|"
                        r"Segmentation fault|Bus error|Aborted|NVRM:)")


def _looks_like_statement(body: str) -> bool:
    """A line that starts something new (an exception, a death notice), not a line carried
    by the one before it."""
    return bool(_STATEMENT.match(body)) or _LEVEL.match(body) is not None


def return_code(line: Line) -> int | None:
    """NCCL's ``NCCL INFO file.cc:N -> K``: the error code K a failing call returned (2: system
    error, 5: invalid usage, 6: remote error). INFO lines never decide; this is a code, not
    a message, and is read only when nothing else in the log says more."""
    if line.nccl != "INFO":
        return None
    m = re.search(r"\.\w+:\d+ -> (\d+)\b", line.raw)
    return int(m.group(1)) if m and m.group(1) != "0" else None
