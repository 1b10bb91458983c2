"""Text from outside made safe to show: the one place where outside strings become display text.

Everything a runs folder, a log, a stack dump or another node's stream holds may have been
written by someone else (docs/design.md, "Trust boundary"). A string from there must never act on
the terminal that shows it: an ESC starts a sequence that can clear the screen, retitle the
window, rewrite what was printed or set the clipboard (OSC 52); a C1 character (U+0080 to
U+009F) is the same sequence in one code point for terminals that take 8-bit controls; a
carriage return or a backspace overwrites what is already on the line; bidirectional
overrides reorder what a reader sees.

:func:`printable` makes every such character visible as an escape (``\\x1b``, ``\\u202e``): the
text still says what was there, and nothing in it is a control any more. It is applied where
outside bytes become values (:mod:`ups.status.safeio`: every string of a record, a manifest,
an event or a control request; the tails of logs and stack files), so every display (tables,
``ups why``, the console, notifications) only ever holds safe text. :func:`sgr_only` is for the
job's own output (``ups logs``), which may keep its colours (SGR) and nothing else.

Rich markup in such text is a separate matter: displays pass outside text as ``Text``, never as
markup, so ``[link=...]`` is shown as written.
"""

from __future__ import annotations

import re

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_LINE_SEPARATORS = (0x2028, 0x2029, 0x0085)


def _escape(cp: int) -> str:
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}"


# What is not printed as itself: C0 (tab and newline aside), DEL, C1, bidi controls and the
# Unicode line separators (a newline in disguise).
_TABLE = {cp: _escape(cp) for cp in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *_BIDI, *_LINE_SEPARATORS)}
del _TABLE[0x09]
_ONE_LINE = dict(_TABLE)
_TABLE.pop(0x0A)
_UNSAFE = re.compile("[" + "".join(re.escape(chr(cp)) for cp in _TABLE) + "]")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character made visible (``\\x1b``): nothing in the result
    acts on a terminal. Tabs are kept; newlines too when ``lines`` (free text such as an error
    or a traceback), escaped otherwise (a name, a phase: one line of a table)."""
    if text.isascii() and text.isprintable():
        return text  # the common case: one C-level scan
    if lines and not _UNSAFE.search(text):
        return text  # free text with newlines and nothing else (a log, a traceback)
    return text.translate(_TABLE if lines else _ONE_LINE)


# The job's own output: SGR ("ESC [ params m", the colours and bold that loggers print) is kept;
# any other escape sequence (cursor moves, screen clears, titles, OSC 8 links, OSC 52 clipboard,
# DCS ...) and any other control character is removed.
_SGR = r"\x1b\[[0-9;:]*m"
_OTHER_SEQUENCE = (
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI other than SGR
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC ... BEL or ST (or cut off)
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC ... ST
    r"|\x1b[ -/]*[0-~]?"  # any other ESC sequence (or a lone ESC)
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x9d\x90\x98\x9e\x9f][^\x1b\x9c\x07]*[\x9c\x07]?"  # 8-bit OSC, DCS, SOS, PM, APC
)
_TOKENS = re.compile(f"({_SGR})|{_OTHER_SEQUENCE}")
_STRIP = {cp: None for cp in _ONE_LINE if cp not in (0x0A, 0x0D, 0x1B)}


def sgr_only(text: str) -> str:
    """A program's output with its colours kept and every other control removed: lone carriage
    returns (progress bars redrawn in place) become newlines; tabs and newlines stay."""
    if text.isascii() and text.isprintable():
        return text
    text = _TOKENS.sub(lambda m: m.group(1) or "", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.translate(_STRIP)


_SGR_TOKEN = re.compile(_SGR)


def plain_text(text: str) -> str:
    """Outside text to read, not to colour (a log ``ups why --log`` reads): every escape
    sequence and control character removed, colours included; tabs and newlines stay, and a
    carriage return (a progress bar redrawn in place) ends a line."""
    return _SGR_TOKEN.sub("", sgr_only(text))
