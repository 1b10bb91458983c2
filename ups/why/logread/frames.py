"""Signs read in a traceback's frames rather than in its message: a Python traceback cut off
before its exception, read by the library function where it stopped (:data:`FRAME_SIGNS`), and
a C++ exception's stack, read by the function that raised it (:data:`CPP_FRAME_SIGNS`). Both are
weak (``EXIT``): the class only when nothing else in the log says more."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ups.why.logread.classes import EXIT


@dataclass(frozen=True)
class FrameSign:
    """A traceback cut off before its exception (a paste that stops early, the message being in
    the thread's title) is read by where it stopped: a library function whose failures are of
    one class. Weak (``EXIT``): only when nothing else in the log says more."""

    cls: str
    path: re.Pattern[str]
    function: re.Pattern[str]
    tier: int = EXIT


FRAME_SIGNS: tuple[FrameSign, ...] = (
    # torch.load restoring a storage onto the device it was saved from: the CUDA check
    # (validate_cuda_device) is what fails in these frames on a machine without CUDA.
    FrameSign("checkpoint_cuda_on_cpu", re.compile(r"torch[/\\]serialization\.py$"),
              re.compile(r"^(?:validate_cuda_device|_cuda_deserialize|default_restore_location)$")),
)


# A C++ exception's stack (c10's "frame #N: symbol + 0x..." dump, under a message a paste may
# have cut) is read by the function that raised it: the first frame past c10's error
# constructors. Weak (``EXIT``), like a cut Python traceback.
CPP_FRAME_SIGNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("collective_timeout", re.compile(r"ProcessGroupNCCL::WorkNCCL::checkTimeout\b")),
    ("nccl_heartbeat", re.compile(r"ProcessGroupNCCL::(?:HeartbeatMonitor::runLoop|heartbeatMonitor)\b")),
    ("cuda_oom", re.compile(r"DeviceCachingAllocator::malloc\b")),  # the caching allocator found no block
    ("rendezvous_timeout", re.compile(r"c10d::TCPStore::doWait\b")),  # a key the store never got
)


def cpp_frame_class(symbol: str) -> str | None:
    """The class a C++ frame's function shows (the function that raised), if any."""
    return next((cls for cls, pattern in CPP_FRAME_SIGNS if pattern.search(symbol)), None)


def frame_class(frames: list[tuple[str, int, str | None]]) -> FrameSign | None:
    """The frame sign the innermost frame of a cut traceback shows."""
    if not frames:
        return None
    path, _, fn = frames[-1]
    return next((f for f in FRAME_SIGNS if fn and f.path.search(path) and f.function.match(fn)), None)
