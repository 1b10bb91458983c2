"""What an exception says, short enough for a record: its type and first line, and the
innermost frame of the program's own code (not torch's, not the standard library's).
Light on purpose: every instrumented process imports it.
"""

from __future__ import annotations

import os

from ups.status.vocabulary import is_library_file  # what is never "the program's own code"

MAX_ERROR_CHARS = 300


def short_message(exc: BaseException) -> str:
    """``Type: first line of the message`` (separator lines skipped), at most 300 characters:
    torchrun's ChildFailedError carries its whole failure report as the message."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    lines = [ln for ln in lines if ln and ln.strip("=-*_ ")]
    text = type(exc).__name__ + (f": {lines[0]}" if lines else "")
    if len(lines) > 1 or len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 2].rstrip() + " …"
    return text


def describe_exception(exc: BaseException) -> tuple[str, str | None]:
    """``Type: message (at file:line in func)`` and ``file:line``, short enough for a table cell.

    The frame named is the innermost one of the program's own code (not torch's, not the
    standard library's), else the innermost of all."""
    text = short_message(exc)
    tb = exc.__traceback__
    last = own = None
    while tb is not None:
        last = tb
        if not is_library_file(tb.tb_frame.f_code.co_filename):
            own = tb
        tb = tb.tb_next
    pick = own or last
    if pick is None:
        return text, None
    code = pick.tb_frame.f_code
    site = f"{os.path.basename(code.co_filename)}:{pick.tb_lineno}"
    return f"{text} (at {site} in {code.co_name})", site
