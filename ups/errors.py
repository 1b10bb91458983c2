"""Errors that the CLI turns into one line on stderr and a meaningful exit code."""

from __future__ import annotations


class UpsError(Exception):
    """A problem with the user's input or environment: printed as one line, no traceback.

    ``exit_code`` 2 means bad input (unknown run, corrupt manifest, bad option value);
    commands may use other codes where their help says so.
    """

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class RunNotFound(UpsError):
    """The run reference named no run under the runs root."""


class CorruptRun(UpsError):
    """A run directory exists but its manifest cannot be read."""


class Refused(UpsError):
    """An action on a run was refused: the run or the process is not provably this user's."""


class RefusedSignal(Refused):
    """A signal was refused because the target is not provably the run's process."""
