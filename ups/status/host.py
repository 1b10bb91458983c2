"""The one place that says which host this process is on, and which boot of it.

Every record (``host``), every manifest (``host``, ``nodes/<host>.json``) and every reader
(is this record's pid in *my* process table?) asks :func:`hostname`. ``UPS_HOSTNAME``
overrides the machine's name: an ops and test knob, e.g. two nodes of a multi-node run
started on one machine for a test, or a box whose hostname is not unique in the cluster.
Light on purpose: every instrumented process imports it.
"""

from __future__ import annotations

import os

ENV_HOSTNAME = "UPS_HOSTNAME"
_BOOT_ID: str | None = None


def hostname() -> str:
    """``$UPS_HOSTNAME`` when set, else the machine's node name (``uname -n``)."""
    return os.environ.get(ENV_HOSTNAME) or os.uname().nodename


def boot_id() -> str | None:
    """This boot of this host (Linux): records with the same boot id share CLOCK_MONOTONIC."""
    global _BOOT_ID
    if _BOOT_ID is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as fh:
                _BOOT_ID = fh.read().strip() or ""
        except OSError:
            _BOOT_ID = ""
    return _BOOT_ID or None
