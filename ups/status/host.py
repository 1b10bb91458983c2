"""The one place that says which host this process is on.

Every record (``host``), every manifest (``host``, ``nodes/<host>.json``) and every reader
(is this record's pid in *my* process table?) asks :func:`hostname`. ``UPS_HOSTNAME``
overrides the machine's name: an ops and test knob, e.g. two nodes of a multi-node run
started on one machine for a test, or a box whose hostname is not unique in the cluster.
Light on purpose: every instrumented process imports it.
"""

from __future__ import annotations

import os

ENV_HOSTNAME = "UPS_HOSTNAME"


def hostname() -> str:
    """``$UPS_HOSTNAME`` when set, else the machine's node name (``uname -n``)."""
    return os.environ.get(ENV_HOSTNAME) or os.uname().nodename
