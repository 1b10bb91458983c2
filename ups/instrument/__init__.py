"""Zero-code-change instrumentation of any Python program launched by ``ups launch``.

``ups launch torchrun|python`` (and our own jobs) put ``ups/instrument/site`` first on the
job's PYTHONPATH. Its ``sitecustomize`` calls :func:`ups.instrument.boot.boot` in every
Python process of the job, which starts the process's status record and, through
post-import hooks (:mod:`ups.instrument.imports`), patches torch if the program imports it
(:mod:`ups.instrument.torch`). Nothing here is imported on the CLI's path.
"""

from __future__ import annotations

import os

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
ENV_INSTRUMENT = "UPS_INSTRUMENT"


def job_environment(existing_pythonpath: str | None, *, top_role: str) -> dict[str, str]:
    """What a job's environment needs for its processes to be instrumented."""
    parts = [SITE_DIR] + [p for p in (existing_pythonpath or "").split(os.pathsep) if p and p != SITE_DIR]
    return {"PYTHONPATH": os.pathsep.join(parts), "UPS_TOP_ROLE": top_role}
