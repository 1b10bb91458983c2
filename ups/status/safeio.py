"""The trust boundary: bytes from a runs folder become typed values here, and nowhere else.

Everything under a runs folder is outside input (docs/design.md, "Trust boundary"): another user,
a crashed writer, a full disk or a hostile neighbour may have put anything there, under any
name. So every file ``ups`` reads from a run is

* opened without blocking and without following a symlink (``O_NONBLOCK | O_NOFOLLOW``):
  a FIFO named like a record never holds up a reader, a launcher or a watchdog;
* read only when ``fstat`` says it is a regular file, and never past a size cap: a record
  that is ``/dev/zero`` (or 4 GiB of garbage) costs one ``fstat``;
* decoded as UTF-8, parsed as JSON with finite numbers only (``NaN``, ``Infinity``, ``1e999``
  and 5,000-digit integers are refused), then checked field by field against a small spec
  (:func:`check_object`): integers are integers (not bools) within a range, times are finite
  and plausible, strings are strings of bounded length with every control character made
  visible (:func:`ups.status.printable.printable`: no ESC, C1 or carriage return reaches a
  terminal), free-form values are made safe to display (:func:`safe_value`).

Whatever fails raises :class:`BadFile` with a short reason; callers turn it into their own
"unreadable: <file>: <reason>" line and go on with everything else.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from ups.status.printable import plain_text, printable, sgr_only

READ_CHUNK = 1 << 16
MAX_JSON_BYTES = 1 << 20  # records and manifests are ~1-10 KB: anything past 1 MiB is not ours
INT_MAX = 1 << 63  # counters, sizes: what a C int64 holds
PID_MAX = 1 << 31
TIME_MAX = 1e11  # UNIX seconds: the year 5138. A record from further out is not a clock reading
TEXT_MAX = 16_384  # free text (errors, items, commands) is cut here for display
NAME_MAX = 512  # identities (run ids, names, hosts, phases) longer than this are refused
OPEN_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class BadFile(ValueError):
    """A file (or a value in it) that is not what ``ups`` reads; the message is the reason."""


# -- opening -------------------------------------------------------------------------------------
def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], flags: int = OPEN_READ, mode: int = 0o644) -> int:
    """A file descriptor on ``path`` if it is a regular file (never a FIFO, device, directory
    or symlink), opened without blocking; BadFile with the reason otherwise."""
    try:
        fd = os.open(path, flags, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise BadFile("a symlink (not followed)") from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise BadFile("a FIFO") from None
        raise BadFile(f"unreadable ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(_kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike[str], cap: int = MAX_JSON_BYTES) -> bytes:
    """The whole file, at most ``cap`` bytes (BadFile past that). FileNotFoundError passes."""
    fd = open_regular(path)
    try:
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def read_fd(fd: int, cap: int = MAX_JSON_BYTES) -> bytes:
    """Everything from an open regular file, at most ``cap`` bytes (BadFile past that)."""
    try:
        # Records are ~1 KB: read in 64 KiB chunks (os.read(fd, 1 MiB) allocates 1 MiB each time).
        # A regular file's short read is its end: a record takes one read(), not two.
        first = min(READ_CHUNK, cap + 1)
        data = os.read(fd, first)
        if len(data) < first:
            return data
        while len(data) <= cap and (more := os.read(fd, READ_CHUNK)):
            data += more
    except OSError as exc:
        raise BadFile(f"unreadable ({exc.strerror or exc})") from None
    if len(data) > cap:
        raise BadFile(f"file too large (over {_size(cap)})")
    return data


def read_tail(path: str | os.PathLike[str], max_bytes: int, start: int | None = None, *, colours: bool = False) -> str:
    """The last ``max_bytes`` of a log or stack file (from ``start`` when given), as text with
    undecodable bytes replaced and every control character made visible (``colours``: the
    program's SGR colours kept, every other control removed): for display only.
    FileNotFoundError passes."""
    text = _read_end(open_regular(path), max_bytes, start).decode("utf-8", errors="replace")
    return sgr_only(text) if colours else printable(text, lines=True)


def _read_end(fd: int, max_bytes: int, start: int | None = None) -> bytes:
    """The last ``max_bytes`` of an open file (from ``start`` when given); closes ``fd``."""
    try:
        size = os.fstat(fd).st_size
        offset = max(0, size - max_bytes) if start is None else max(start, size - max_bytes)
        os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0 and (chunk := os.read(fd, min(READ_CHUNK, left))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise BadFile(f"unreadable ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


MAX_LOG_BYTES = 8 << 20  # a log read as a whole (``ups why --log``): its last 8 MiB
OPEN_LOG = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a file the user names: a symlink to it is fine


def read_log_file(path: str | os.PathLike[str], max_bytes: int = MAX_LOG_BYTES) -> str:
    """A text log someone names (a SLURM .out, a torchrun capture): its last ``max_bytes`` as
    text with every escape sequence and control character removed (colours too; tabs and
    newlines stay, a carriage return ends a line). Never blocks: a FIFO, a device or a folder
    is refused with the reason (BadFile), and so is binary data. FileNotFoundError passes."""
    return decode_log(_read_end(open_regular(path, OPEN_LOG), max_bytes))


def read_log_stream(stream: Any, max_bytes: int = MAX_LOG_BYTES) -> str:
    """:func:`read_log_file` for a stream read to its end (standard input): its last ``max_bytes``."""
    tail = bytearray()
    try:
        while chunk := stream.read(READ_CHUNK):
            tail += chunk
            if len(tail) > 2 * max_bytes:
                del tail[: len(tail) - max_bytes]
    except OSError as exc:
        raise BadFile(f"unreadable ({exc.strerror or exc})") from None
    return decode_log(bytes(tail[-max_bytes:]))


def decode_log(data: bytes) -> str:
    """Bytes of a text log as safe text; BadFile when they are not text (a NUL byte, or mostly
    bytes that are not UTF-8: an archive, a core dump, a checkpoint)."""
    head = data[:65536]
    if b"\x00" in head:
        raise BadFile("binary data (a NUL byte), not a text log")
    text = data.decode("utf-8", errors="replace")
    sample = text[:65536]
    if sample and sample.count("\ufffd") > len(sample) // 10:
        raise BadFile("binary data (not UTF-8 text), not a text log")
    return plain_text(text)


def try_tail(path: str | os.PathLike[str], max_bytes: int, start: int | None = None) -> str | None:
    """:func:`read_tail`, or None when the file is missing or not a readable regular file."""
    try:
        return read_tail(path, max_bytes, start)
    except (OSError, BadFile):
        return None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


# -- decoding ------------------------------------------------------------------------------------
def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadFile(f"number {text[:20]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise BadFile(f"{name} is not a number ups reads")


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)  # one, not one a call


def decode_json(data: bytes | str) -> Any:
    """UTF-8 JSON with finite numbers only; BadFile with the reason otherwise."""
    if isinstance(data, bytes):
        if not data or data.isspace():
            raise BadFile("empty file")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadFile("not UTF-8 text") from None
    if not data or data.isspace():
        raise BadFile("empty file")
    if data.startswith("\ufeff"):  # json.loads's own refusal of a byte order mark, kept
        raise BadFile("not valid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig) at line 1)")
    try:
        return _DECODER.decode(data)
    except json.JSONDecodeError as exc:
        raise BadFile(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except BadFile:
        raise
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits; [[[[...]]]] x 100,000
        raise BadFile(f"not valid JSON ({str(exc)[:80]})") from None


def read_json(path: str | os.PathLike[str], cap: int = MAX_JSON_BYTES) -> Any:
    """A regular file of at most ``cap`` bytes of UTF-8 JSON (FileNotFoundError passes)."""
    return decode_json(read_bytes(path, cap))


# -- typed values --------------------------------------------------------------------------------
Check = Callable[[Any], Any]
"""A field check: returns the value (possibly made safe) or raises BadFile("is not ...")."""

# The checks below also say, as ``check.fast``, what a value that passes them unchanged looks
# like: ``(type, lo, hi, nullable)``; for a string ``lo`` is its longest length and ``hi`` its
# choices. :func:`check_object` accepts such a value with a few comparisons instead of a call
# (a record has ~40 fields and a 256-rank job ~2,300 records a scrape). Whatever the fast test
# does not accept goes through the check itself, which makes it safe or refuses it: the fast
# test only ever accepts what the check would return unchanged.
FastForm = tuple[type, Any, Any, bool]


def integer(lo: int = 0, hi: int = INT_MAX) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadFile(f"is {_what(v)}, not an integer")
        if not lo <= v < hi:
            raise BadFile(f"{v if abs(v) < 10**20 else 'a huge number'} is out of range")
        return v
    check.fast = (int, lo, hi, False)  # type: ignore[attr-defined]
    return check


def number(lo: float = 0.0, hi: float = TIME_MAX) -> Check:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise BadFile(f"is {_what(v)}, not a number")
        try:
            f = float(v)
        except OverflowError:
            raise BadFile("a huge number is out of range") from None
        if not (math.isfinite(f) and lo <= f <= hi):
            raise BadFile(f"{f:g} is out of range")
        return f
    if math.isfinite(lo) and math.isfinite(hi):  # a float between finite bounds is finite
        check.fast = (float, lo, hi, False)  # type: ignore[attr-defined]
    return check


def text(max_len: int = TEXT_MAX, *, cut: bool = True, choices: tuple[str, ...] | None = None) -> Check:
    """A string, safe to show; longer than ``max_len``: cut (free text, which may hold
    newlines) or refused (identities: one line, a newline shown as ``\\x0a``)."""
    def check(v: Any) -> str:
        if not isinstance(v, str):
            raise BadFile(f"is {_what(v)}, not a string")
        if choices is not None and v not in choices:
            raise BadFile(f"{printable(v[:40])!r} is not one of {', '.join(choices)}")
        if len(v) > max_len:
            if not cut:
                raise BadFile(f"is longer than {max_len} characters")
            v = v[:max_len] + "…"
        return printable(v, lines=cut)
    # printable() returns a printable ASCII string as it is
    check.fast = (str, max_len, None if choices is None else frozenset(choices), False)  # type: ignore[attr-defined]
    return check


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadFile(f"is {_what(v)}, not true/false")
    return v


boolean.fast = (bool, None, None, False)  # type: ignore[attr-defined]


def optional(check: Check) -> Check:
    def opt(v: Any) -> Any:
        return None if v is None else check(v)
    inner: FastForm | None = getattr(check, "fast", None)
    if inner is not None:
        opt.fast = (*inner[:3], True)  # type: ignore[attr-defined]
    return opt


def list_of(check: Check, max_items: int = 10_000) -> Check:
    def check_list(v: Any) -> list[Any]:
        if not isinstance(v, list):
            raise BadFile(f"is {_what(v)}, not a list")
        if len(v) > max_items:
            raise BadFile(f"has more than {max_items} items")
        out = []
        for i, item in enumerate(v):
            try:
                out.append(check(item))
            except BadFile as exc:
                raise BadFile(f"[{i}] {exc}") from None
        return out
    return check_list


def dict_of(check: Check, max_items: int = 100_000) -> Check:
    """A JSON object whose every value passes ``check`` (keys are strings by JSON's rules)."""
    def check_dict(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise BadFile(f"is {_what(v)}, not an object")
        if len(v) > max_items:
            raise BadFile(f"has more than {max_items} keys")
        out = {}
        for key, item in v.items():
            try:
                out[key] = check(item)
            except BadFile as exc:
                raise BadFile(f"[{printable(key[:40])!r}] {exc}") from None
        return out
    return check_dict


def obj(spec: Mapping[str, Check], *, required: tuple[str, ...] = (), unknown: Check | None = None) -> Check:
    """A JSON object whose known keys pass their checks (unknown keys are kept as
    :func:`safe_value`: a newer writer may add fields)."""
    def check_obj(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise BadFile(f"is {_what(v)}, not an object")
        return check_object(v, spec, required=required, unknown=unknown)
    return check_obj


def check_object(data: Any, spec: Mapping[str, Check], *, required: tuple[str, ...] = (),
                 unknown: Check | None = None, skip_unknown: bool = False) -> dict[str, Any]:
    """``data`` with every key of ``spec`` checked (BadFile "'key' <why>" on the first that
    fails); other keys pass through :func:`safe_value` (or ``unknown``), or are left out
    (``skip_unknown``)."""
    if not isinstance(data, dict):
        raise BadFile(f"a JSON {_what(data)}, not an object")
    for key in required:
        if key not in data:
            raise BadFile(f"missing required key {key!r}")
    fast = _fast_forms(spec)
    out: dict[str, Any] = {}
    for key, value in data.items():
        form = fast.get(key)
        if form is not None:  # the value as it is, when the check would return it unchanged
            kind, lo, hi, nullable = form
            if value is None:
                if nullable:
                    out[key] = None
                    continue
            elif value.__class__ is kind and (
                (lo <= value < hi) if kind is int
                else (lo <= value <= hi) if kind is float
                else (len(value) <= lo and value.isascii() and value.isprintable() and (hi is None or value in hi))
                if kind is str else True
            ):
                out[key] = value
                continue
        check = spec.get(key)
        if check is None and skip_unknown:
            continue
        try:
            out[key] = check(value) if check is not None else (unknown or safe_value)(value)
        except BadFile as exc:
            raise BadFile(f"{printable(key[:40])!r} {exc}") from None
    return out


_FAST_FORMS: dict[int, tuple[Mapping[str, Check], dict[str, FastForm]]] = {}


def _fast_forms(spec: Mapping[str, Check]) -> dict[str, FastForm]:
    """The fast forms of ``spec``'s checks, worked out once per spec (specs are module
    constants; the entry holds the spec itself, so its id is never reused while cached)."""
    hit = _FAST_FORMS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    forms = {key: form for key, check in spec.items() if (form := getattr(check, "fast", None)) is not None}
    if len(_FAST_FORMS) < 1024:
        _FAST_FORMS[id(spec)] = (spec, forms)
    return forms


def safe_value(v: Any, depth: int = 0) -> Any:
    """Any decoded JSON value made safe to show: strings cut to TEXT_MAX with their control
    characters made visible, containers cut to 1,000 items and 8 levels (JSON numbers are
    already finite here; integers stay exact)."""
    if isinstance(v, str):
        return printable(v if len(v) <= TEXT_MAX else v[:TEXT_MAX] + "…", lines=True)
    if isinstance(v, dict):
        if depth >= 8:
            return "{…}"
        return {printable(k[:200]): safe_value(x, depth + 1) for k, x in list(v.items())[:1000]}
    if isinstance(v, list):
        if depth >= 8:
            return "[…]"
        return [safe_value(x, depth + 1) for x in v[:1000]]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def display_number(v: Any) -> Any:
    """A metric value as a display can take it: finite numbers and short strings pass, an
    integer too large for a float becomes a float-sized string, anything else its JSON."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v if abs(v) < INT_MAX else f"{v:.3e}" if abs(v) < 10**300 else "huge"
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return printable(v[:200])
    return json.dumps(safe_value(v, 6), default=str)[:200]


def _what(v: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)
