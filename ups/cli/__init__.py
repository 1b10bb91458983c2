"""The ``ups`` command line (Typer). See :mod:`ups.cli.app`."""

import os

# Typer's rich help formatter costs ~150 ms of imports on every invocation; plain help is
# just as readable over SSH and keeps `ups --help` fast. Set TYPER_USE_RICH=1 to get it back.
os.environ.setdefault("TYPER_USE_RICH", "0")
