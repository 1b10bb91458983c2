"""Failure classes read from a process's own words (its error, its exception, its log tail):
one table, pattern -> class, what it means and the fix. Ordered: the first class whose pattern
matches a line decides, so specific texts come before generic ones (a quota before a full
disk, a CUDA OOM before a host allocation failure, a checkpoint that cannot be read before a
missing file).

The patterns are checked against real excerpts from public issue threads
(tests/data/failure_corpus.json, scripts/bench_why_corpus.py): what users paste, not our words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class LogClass:
    name: str  # the verdict's mode
    pattern: re.Pattern[str]
    what: str  # what happened, in an operator's words
    fix: str  # what to do next


def _c(name: str, pattern: str, what: str, fix: str) -> LogClass:
    return LogClass(name, re.compile(pattern, re.I), what, fix)


TABLE: tuple[LogClass, ...] = (
    _c("collective_mismatch", r"Detected mismatch between collectives|Is there a distributed collective mismatch|"
       r"collective mismatch|Mismatched collective|doesn't match expected size",
       "the ranks entered different collectives (a collective mismatch)",
       "every rank must make the same collectives in the same order, with the same shapes; find the call one rank "
       "makes alone (TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides)"),
    _c("nccl_watchdog_timeout", r"Watchdog caught collective operation timeout|collective operation timeout",
       "NCCL's watchdog timed a collective out (a rank never joined it, or the network stalled)",
       "find the rank that was not in that collective (`ups stacks RUN --group`); raise the process group timeout only "
       "if the step really takes that long"),
    _c("nccl_remote_error", r"remote process exited or there was a network error|ncclRemoteError",
       "NCCL lost a peer: another rank exited or the network failed",
       "look at the rank that ended first (it is the cause; this one saw it go), then the network (NCCL_DEBUG=INFO)"),
    _c("nccl_version_mismatch", r"NCCL version mismatch|receiving \d+ bytes instead of \d+|invalid usage.*NCCL version|"
       r"ncclInvalidUsage",
       "NCCL calls that do not match between ranks or libraries (a version or configuration mismatch, or invalid usage)",
       "run the same torch/NCCL build and the same NCCL_* environment on every node; NCCL_DEBUG=INFO prints both"),
    _c("nccl_socket", r"NCCL WARN.*(?:socket|connect)|socketProgress|socketFinalizeAccept|Call to connect",
       "NCCL's socket transport failed (a peer closed the connection or could not be reached)",
       "check the interface NCCL uses (NCCL_SOCKET_IFNAME) and that every node reaches the others; then the peer's log"),
    _c("nccl_system_error", r"unhandled system error|ncclSystemError",
       "NCCL hit a system error (a socket, shared memory, or an InfiniBand device)",
       "rerun with NCCL_DEBUG=INFO; in containers give it shared memory (--ipc=host or a larger /dev/shm)"),
    _c("cuda_oom", r"CUDA out of memory|CUDA error: out of memory|cuda\.OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
       "the GPU ran out of memory",
       "lower the batch size (or use gradient accumulation / activation checkpointing); "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps fragmentation"),
    _c("host_oom", r"DefaultCPUAllocator|can't allocate memory|Cannot allocate memory|not enough memory: you tried",
       "a host (CPU) memory allocation was refused",
       "less host memory per process: fewer DataLoader workers, smaller prefetch, or a box with more RAM"),
    _c("cuda_illegal_memory_access", r"illegal memory access",
       "a CUDA kernel read or wrote memory it does not own (illegal memory access)",
       "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel (the reported line may be a later call); "
       "check custom CUDA extensions and indices"),
    _c("cuda_device_assert", r"device-side assert|Assertion `[^`]*` failed",
       "a CUDA kernel's assertion failed (usually an index out of range: labels >= num_classes, an embedding index)",
       "run the same batch on CPU (or CUDA_LAUNCH_BLOCKING=1) to get the exact line; check label and index ranges"),
    _c("cuda_no_kernel_image", r"no kernel image is available",
       "the CUDA binaries have no kernel for this GPU's architecture",
       "install a torch (or extension) build that includes this GPU's compute capability, or rebuild with "
       "TORCH_CUDA_ARCH_LIST set for it"),
    _c("cuda_driver_insufficient", r"driver version is insufficient|NVIDIA driver on your system is too old",
       "the NVIDIA driver is older than the CUDA runtime torch was built with",
       "update the NVIDIA driver, or install a torch build for the CUDA version the driver supports"),
    _c("gpu_fallen_off_bus", r"fallen off the bus|Xid[^\n]*\b79\b",
       "a GPU fell off the bus (Xid 79): the hardware stopped answering",
       "drain this node: the GPU needs a reset or a reboot (check power and temperature); relaunch elsewhere"),
    _c("gpu_xid", r"NVRM: Xid",
       "the GPU driver reported an Xid error",
       "look the Xid number up (NVIDIA's Xid table); 48/63/64/94/95 are memory (ECC) errors: drain the node"),
    _c("checkpoint_cuda_on_cpu", r"Attempting to deserialize object on a CUDA device",
       "a checkpoint saved from GPU tensors is loaded where there is no CUDA",
       "load it with torch.load(path, map_location='cpu') (or the rank's own device)"),
    _c("checkpoint_truncated", r"PytorchStreamReader|failed finding central directory|Ran out of input|"
       r"unexpected EOF, expected \d+ more bytes",
       "a checkpoint could not be read: truncated or corrupt (a write that never finished, an incomplete download)",
       "resume from the previous checkpoint (or download it again); write checkpoints atomically (temp file + rename)"),
    _c("disk_quota", r"Disk quota exceeded|EDQUOT|\[Errno 122\]",
       "a write failed: the disk quota is exceeded (space, or the number of files)",
       "free space or files under your quota (quota -s; du), or write to a folder with room"),
    _c("read_only_fs", r"Read-only file system|EROFS|\[Errno 30\]",
       "a write failed: the file system is read-only",
       "write outputs and checkpoints to a writable folder (a container's image and some mounts are read-only)"),
    _c("disk_full", r"No space left on device|ENOSPC|\[Errno 28\]|PytorchStreamWriter failed writing|file write failed|"
       r"unexpected pos \d+ vs \d+",
       "a write failed: the disk is full",
       "free space where it writes (df -h), then relaunch; torch.save to a temp file + rename keeps the last good one"),
    _c("module_not_found", r"ModuleNotFoundError|No module named",
       "an import failed: the module is not installed in the environment this process runs in",
       "install it in the environment the ranks use (torchrun's python may not be your venv's: "
       "`python -m torch.distributed.run`)"),
    _c("dataset_missing", r"FileNotFoundError|No such file or directory",
       "a file the program reads does not exist (a dataset path)",
       "check the path on this node (a mount missing, a relative path from another working directory)"),
    _c("rendezvous_timeout", r"RendezvousTimeoutError|RendezvousConnectionError|client socket has timed out|"
       r"connect\(\) timed out|Timed out after \d+ seconds waiting for clients",
       "the rendezvous timed out: not every node joined in time",
       "start the missing node (or fix --nnodes); every node needs the same --rdzv-endpoint and --rdzv-id"),
    _c("killed_sigkill", r"Signal 9 \(SIGKILL\)|exitcode: -9|signal 9|SIGKILL|killed by signal: Killed|exit code 137",
       "a process was killed with SIGKILL (most often the kernel's OOM killer)",
       "check `dmesg | grep -i oom` and the cgroup's memory.events; use less host memory per process"),
)

BY_NAME = {c.name: c for c in TABLE}
_RANK = re.compile(r"\[rank(\d+)\]|\[Rank (\d+)\]|local_rank: (\d+)|Rank (\d+) is running")
_SITE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+)|(?P<cfile>[\w./-]+\.(?:cc|cpp|cu|py)):(?P<cline>\d+)')


@dataclass(frozen=True)
class Match:
    cls: LogClass
    line: str  # the line that matched
    rank: int | None  # the rank the text names, if it does
    site: str | None  # file:line nearest the matching line, if any


def classify(text: str) -> Match | None:
    """The first class of the table that a line of ``text`` matches (the last such line)."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    for cls in TABLE:
        hit = next((k for k in range(len(lines) - 1, -1, -1) if cls.pattern.search(lines[k])), None)
        if hit is None:
            continue
        line = lines[hit].strip()
        rank = next((int(g) for m in [_RANK.search(line)] if m for g in m.groups() if g is not None), None)
        site = None
        for k in range(hit, max(-1, hit - 6), -1):  # the frame printed just above the error
            m = _SITE.search(lines[k])
            if m:
                path = m["path"] or m["cfile"]
                site = f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{m['line'] or m['cline']}"
                break
        return Match(cls, line[:300], rank, site)
    return None
