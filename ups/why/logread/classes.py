"""The failure classes a log can name (tests/data/why_corpus/TAXONOMY.md): for each, what it
means, who did it, where to look, the fix, and the signs that show it in a log.

It is one table: 37 classes, each with its words and the signs that name it side by side, so
that a sign's wording is reviewed against the class it decides. The code that reads the table
is elsewhere (decide.py, events.py, lines.py), and so are the words a sign's pattern requires
(words.py) and the signs read in a traceback's frames (frames.py).

A sign is read on one event of the log (an exception with its message, an NCCL WARN line, a
kernel line, torchrun's report of a child), never on a context line (INFO, warnings, footers:
:mod:`ups.why.logread.lines`). Which event decides is :mod:`ups.why.logread.decide`'s
business, by causal order, not by the order of this table. A sign has a *tier*:

* ``CAUSE``: the event says what went wrong (CUDA out of memory, a full disk, Xid 79);
* ``KILLED``: a process died of a signal it did not send itself (SIGKILL, SIGSEGV, SIGBUS:
  exit code -9, "Killed", -11): it explains its peers' symptoms;
* ``SYMPTOM``: a consequence of something else when something else is in the log (a peer
  that went away, a collective that timed out, NCCL's generic "unhandled system error");
* ``EXIT``: only how a process ended otherwise (SIGABRT after a C++ exception, SIGTERM from
  its launcher, a cancelled step): the class when nothing says more.

When one event shows two classes, the one that *refines* the other wins (NCCL's invalid usage
whose "Last error" is "Duplicate GPU detected" is a duplicate GPU; "No space left on device"
in /dev/shm is shared memory, not a disk).
"""

from __future__ import annotations

import pickletools
import re
from dataclasses import dataclass

from ups.why.logread.words import required_words

CAUSE, KILLED, SYMPTOM, EXIT = 0, 1, 2, 3


@dataclass(frozen=True)
class LogClass:
    name: str
    what: str  # what happened, in an operator's words
    who: str  # who or what did it
    where: str  # where to look
    fix: str  # what to do next
    refines: tuple[str, ...] = ()  # classes this one is a more specific reading of


@dataclass(frozen=True)
class Sign:
    cls: str
    pattern: re.Pattern[str]
    tier: int = CAUSE
    on_warning: bool = False  # also read on WARNING lines (torchrun's "Received 15 death signal")
    unless_frames: re.Pattern[str] | None = None  # not when the event's traceback has such a frame
    words: tuple[str, ...] | None = None  # one of them is in every match (lowercase); None: no such words
    in_frames: re.Pattern[str] | None = None  # only when the error was raised there (its innermost frames)

    def may_match(self, lowered: str) -> bool:
        """False when the line cannot match: none of the words every match holds is in it (a
        substring test costs a fraction of a regex search; a log has many lines)."""
        return self.words is None or any(w in lowered for w in self.words)


def _s(cls: str, pattern: str, tier: int = CAUSE, *, on_warning: bool = False, unless_frames: str | None = None,
       in_frames: str | None = None) -> Sign:
    return Sign(cls, re.compile(pattern, re.I), tier, on_warning, re.compile(unless_frames) if unless_frames else None,
                required_words(pattern), re.compile(in_frames) if in_frames else None)


CLASSES: tuple[LogClass, ...] = (
    # -- distributed: NCCL, gloo, rendezvous -------------------------------------------------------
    LogClass("collective_mismatch", "the ranks entered different collectives, or the same one with different shapes",
             "the program: one rank took another path (a condition on the rank, data-dependent control flow, "
             "a metric logged on one rank only)",
             "the call site of each side (TORCH_DISTRIBUTED_DEBUG=DETAIL prints both ranks' collectives)",
             "make every rank issue the same collectives in the same order with the same shapes; "
             "find the call one rank makes alone",
             refines=("nccl_network",)),
    LogClass("collective_timeout", "a collective timed out: at least one rank never joined it (or the network stalled)",
             "the rank that was not in the collective (stuck, slower, or dead), not the ranks that report the timeout",
             "the first rank to stop making progress: its stack (`py-spy dump`, `ups stacks RUN --group`) and its log",
             "find and fix the rank that did not arrive; raise the process group timeout only if a step really "
             "takes that long"),
    # NCCL's RAS report (ncclras), read by ups.why.logread.ras, not by signs
    LogClass("nccl_rank_behind", "NCCL's RAS report: ranks of a communicator launched fewer collectives than the others; "
             "they stopped first and the others wait for them",
             "the ranks behind: stuck before their next collective (their own code, their data, their GPU)",
             "the stack and log of the ranks behind (`ups stacks RUN --group`, `py-spy dump`), around their last step",
             "find why the rank behind stopped (its stack says where) and fix it; a restart alone meets the same hang",
             refines=("collective_timeout",)),
    LogClass("nccl_process_lost", "NCCL's RAS report: job processes are dead or did not answer (crashed, hung hard, "
             "or their node went away)",
             "the processes and nodes the report names",
             "each named node: the process's log, the kernel log (`dmesg`: OOM killer, Xid), the node's reachability",
             "find what ended or froze the named process (its log, its node); restart without that node if it is at fault",
             refines=("collective_timeout", "peer_lost")),
    LogClass("nccl_heartbeat", "NCCL's watchdog itself got stuck (its heartbeat monitor timed out): a CUDA or NCCL call hung",
             "a hung NCCL/CUDA call (a peer that never joined, a GPU that stopped, a thread holding the GIL in CUDA)",
             "the rank's stack at the time (TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes the flight recorder)",
             "debug the hang first (the ranks' stacks, the GPUs' health); TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only if "
             "a call is known to be slow"),
    LogClass("peer_lost", "this rank failed because another rank or process went away (or the network between them broke)",
             "another rank: the one that ended first is the cause, this one only saw it go",
             "the log of the rank that exited first (its exception, its exit code, the OOM killer)",
             "fix what ended the other rank; if none ended, check the network between the nodes",
             refines=("nccl_system_error",)),
    LogClass("nccl_invalid_usage", "NCCL calls that are invalid or do not match between ranks (usage, configuration, or versions)",
             "the program or the environment: different NCCL builds or settings on the ranks, or an invalid call",
             "the NCCL version and NCCL_* environment on every node (NCCL_DEBUG=WARN prints the reason)",
             "run the same torch/NCCL build and NCCL_* settings on every node; rerun with NCCL_DEBUG=WARN for the reason"),
    LogClass("duplicate_gpu", "two ranks use the same GPU",
             "the launch: ranks were not given a device each (CUDA_VISIBLE_DEVICES, or no torch.cuda.set_device(local_rank))",
             "how each rank picks its device",
             "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group, and start one rank per "
             "GPU (--nproc-per-node = the number of visible GPUs)",
             refines=("nccl_invalid_usage",)),
    LogClass("nccl_network", "NCCL's network transport failed (sockets, InfiniBand/RoCE or another NET plugin)",
             "the network between the nodes (an interface, a switch, InfiniBand, a firewall)",
             "the interface NCCL picked (NCCL_DEBUG=INFO: NET/IB, NET/Socket) and the link to the peer it names",
             "set NCCL_SOCKET_IFNAME / NCCL_IB_HCA to the right interfaces, check that every node reaches the others "
             "(firewall, MTU), and the IB/RoCE links (ibstat)",
             refines=("peer_lost", "nccl_system_error")),
    LogClass("nccl_system_error", "NCCL hit a system error (a socket, shared memory, a device) and says no more",
             "the system NCCL runs on: sockets, /dev/shm, the device, or a peer",
             "rerun with NCCL_DEBUG=INFO: the WARN line before the error names the call that failed",
             "rerun with NCCL_DEBUG=INFO to see which system call failed; in containers give NCCL shared memory "
             "(--ipc=host or a larger /dev/shm)"),
    LogClass("rendezvous_timeout", "the ranks or nodes never met: the rendezvous or the store timed out",
             "the node or rank that did not arrive (not started, crashed early, or cannot reach the endpoint)",
             "the rendezvous endpoint (MASTER_ADDR:MASTER_PORT, --rdzv-endpoint) and whether every node reaches it",
             "start every node with the same --rdzv-endpoint, --rdzv-id and --nnodes; check that the endpoint's "
             "host:port is reachable from every node (firewall, the right interface)"),
    LogClass("address_in_use", "the rendezvous/master port is already taken",
             "another process on that host holds the port (often an earlier run that did not end)",
             "`ss -ltnp | grep PORT` on the master host",
             "stop the process that holds the port, or use another port (--master-port, or --standalone on one node)"),
    # -- GPU, CUDA, memory -------------------------------------------------------------------------
    LogClass("cuda_oom", "the GPU ran out of memory",
             "this process's GPU memory use (model, activations, batch), or another process on the same GPU",
             "the step that allocated (its frame), and nvidia-smi for other processes on the GPU",
             "lower the batch size (or use gradient accumulation / activation checkpointing / mixed precision); "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps fragmentation",
             refines=("nccl_system_error",)),
    LogClass("host_oom", "a host (CPU) memory allocation was refused inside the process",
             "this process's host memory use (a huge tensor or array, a dataset held in RAM), or the box's RAM limit",
             "the allocation's frame and its size (the message says how many bytes)",
             "allocate less host memory per process (smaller arrays, fewer DataLoader workers, memory-mapped data), "
             "or use a box with more RAM"),
    LogClass("oom_killed", "the process was killed with SIGKILL, most often by the kernel's OOM killer",
             "the kernel's OOM killer (or a cgroup/Kubernetes/SLURM memory limit), for host memory",
             "`dmesg | grep -i -e oom -e killed`, the cgroup's memory.events, the job's memory limit",
             "use less host memory per process (fewer DataLoader workers, smaller prefetch, no dataset held in RAM), "
             "or raise the job's memory limit"),
    LogClass("shm_full", "shared memory (/dev/shm) ran out",
             "the container or host's /dev/shm size (Docker's default is 64 MB) against DataLoader workers or NCCL",
             "`df -h /dev/shm` where the job runs",
             "give the job more shared memory (docker --shm-size / --ipc=host, a bigger /dev/shm in Kubernetes), "
             "or use fewer DataLoader workers",
             refines=("disk_full", "nccl_system_error", "peer_lost", "host_oom")),
    LogClass("cuda_illegal_memory_access", "a CUDA kernel read or wrote memory it does not own (illegal memory access)",
             "a kernel: a custom CUDA extension, an out-of-range index, or a bug in a library's kernel",
             "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel (the reported line may be a later call)",
             "rerun with CUDA_LAUNCH_BLOCKING=1 (or compute-sanitizer) to find the kernel; check custom extensions "
             "and index ranges"),
    LogClass("cuda_device_assert", "a CUDA kernel's assertion failed (usually an index out of range)",
             "the data or the model: a label >= num_classes, a token id >= the vocabulary size, a negative index",
             "the assertion's kernel and condition; the batch that triggered it",
             "run the same batch on CPU (or with CUDA_LAUNCH_BLOCKING=1) for the exact line; check label and "
             "index ranges against the model's sizes"),
    LogClass("cuda_no_kernel_image", "the CUDA binaries have no kernel for this GPU's architecture",
             "the install: torch (or an extension) was built without this GPU's compute capability",
             "`python -c 'import torch; print(torch.cuda.get_arch_list(), torch.cuda.get_device_capability())'`",
             "install a torch (or extension) build that includes this GPU's compute capability, or rebuild the "
             "extension with TORCH_CUDA_ARCH_LIST set for it"),
    LogClass("cuda_driver_insufficient", "the NVIDIA driver is older than the CUDA runtime the program was built with",
             "the install: the host's driver against torch's CUDA version",
             "`nvidia-smi` (the driver's CUDA version) against `python -c 'import torch; print(torch.version.cuda)'`",
             "update the NVIDIA driver, or install a torch build for a CUDA version the driver supports"),
    LogClass("cuda_device_busy", "the GPU is busy or unavailable (exclusive-process mode, or held by another process)",
             "another process on the GPU, or the GPU's compute mode",
             "`nvidia-smi` (processes, and the compute mode: Exclusive_Process)",
             "use a free GPU (CUDA_VISIBLE_DEVICES), stop the process that holds it, or set the compute mode to Default"),
    LogClass("gpu_lost", "the GPU stopped answering (fallen off the bus, \"GPU is lost\", Xid 79)",
             "the hardware: the GPU, its power or its PCIe link",
             "the node's kernel log (`dmesg | grep -e NVRM -e Xid`) and `nvidia-smi`",
             "drain the node: the GPU needs a reset or a reboot (check power and temperature); relaunch elsewhere"),
    LogClass("gpu_ecc", "the GPU's memory has uncorrectable ECC errors",
             "the hardware: the GPU's memory (HBM)",
             "`nvidia-smi -q -d ECC,ROW_REMAPPER` and the kernel log's Xid 48/63/64/92/94/95",
             "drain the node and reset the GPU (row remapping needs a reset); if errors persist, the GPU needs "
             "replacing; relaunch elsewhere"),
    LogClass("gpu_xid", "the GPU driver reported an Xid error",
             "the GPU or its driver (the Xid number says which: NVIDIA's Xid table)",
             "the kernel log (`dmesg | grep Xid`): the first Xid and its number",
             "look the Xid number up in NVIDIA's Xid table; a GPU that keeps reporting it needs a reset or draining"),
    # -- files, environment, processes -------------------------------------------------------------
    LogClass("disk_full", "a write failed: the disk is full",
             "the disk the job writes to (checkpoints, caches, logs)",
             "`df -h` on the folder it writes (the message names the file)",
             "free space where it writes (or write elsewhere), then relaunch; save checkpoints to a temp file and "
             "rename, so a full disk never leaves a broken one"),
    LogClass("disk_quota", "a write failed: the disk quota is exceeded",
             "your quota on that file system (space or number of files)",
             "`quota -s` (or the cluster's quota tool) and `du -sh` on your folders",
             "free space or files under your quota, or write to a file system with room (scratch)"),
    LogClass("read_only_fs", "a write failed: the file system is read-only",
             "the mount: a container image, a read-only volume, or a file system remounted read-only after errors",
             "`mount | grep ' ro,'` for the path the message names",
             "write outputs, caches and checkpoints to a writable folder (set the cache/output paths); if the disk "
             "was remounted read-only after errors, check the kernel log"),
    LogClass("permission_denied", "the OS refused the job access to a path: its user has no permission there",
             "the path's owner and mode against the user the job runs as (a folder another user or a container made, "
             "a shared folder, a file system mounted for another user)",
             "`ls -ld` on the path the message names and on each folder above it, and `id` of the user the job runs as",
             "write where the job's user may (an output or cache folder of its own, set by the job's paths), or give "
             "that user the right to write there (chown/chmod, the container's user)"),
    LogClass("checkpoint_corrupt", "a checkpoint or weights file could not be read: truncated, corrupt, or not a checkpoint",
             "the file: an interrupted download or save, or an HTML page / Git LFS pointer saved under a weights name",
             "the file's size and first bytes (`ls -l`, `head -c 200`)",
             "download or save it again (check its size or hash); resume from the previous checkpoint; write "
             "checkpoints atomically (temp file + rename)"),
    LogClass("checkpoint_weights_only", "torch.load refused a checkpoint: it holds Python objects that weights_only "
             "loading does not allow (torch >= 2.6 loads with weights_only=True by default)",
             "the checkpoint's contents (an argparse.Namespace, numpy values, a class of the program saved beside the "
             "weights) against torch.load's weights_only default",
             "the \"Unsupported global: GLOBAL ...\" line names the object; the torch.load call",
             "for a file you trust: allow that object (torch.serialization.add_safe_globals([...]) or the "
             "safe_globals context manager) or load it with torch.load(path, weights_only=False); save only tensors "
             "and state_dicts in checkpoints",
             refines=("checkpoint_corrupt",)),
    LogClass("checkpoint_cuda_on_cpu", "a checkpoint saved from GPU tensors was loaded where there is no CUDA",
             "the loading code: torch.load without map_location on a machine without a GPU",
             "the torch.load call",
             "load it with torch.load(path, map_location='cpu') (or the rank's own device)"),
    LogClass("file_missing", "a file or folder the job needs does not exist",
             "the path: a dataset, config, checkpoint or script that is not where the job looks (a relative path, "
             "a mount missing on this node)",
             "the path in the message, on the node and in the working directory the job ran in",
             "check the path on this node (absolute paths; the mount; the working directory), or create the file"),
    LogClass("import_error", "an import failed: a module is missing, or a compiled library does not load",
             "the environment the process runs in: a package not installed there, or built against another torch/CUDA",
             "the interpreter the job runs (`which python`, torchrun's python) and `pip list` in it",
             "install the package in the environment the job uses; rebuild or reinstall compiled extensions "
             "(flash-attn, apex ...) against the installed torch and CUDA",
             refines=("file_missing",)),
    LogClass("too_many_open_files", "the process ran out of file descriptors",
             "the open-files limit (ulimit -n) against DataLoader workers sharing tensors, or files never closed",
             "`ulimit -n` where the job runs; the number of DataLoader workers",
             "raise the limit (ulimit -n 65536), or torch.multiprocessing.set_sharing_strategy('file_system'); "
             "close files the code opens",
             refines=("shm_full",)),
    LogClass("segfault", "a process crashed (segmentation fault, or an abort in C++ code)",
             "native code: a C/C++/CUDA extension, a library built for another version, or memory corruption",
             "the crash's stack (faulthandler: python -X faulthandler, or `ups stacks`), and which library was in it",
             "rerun with python -X faulthandler to get the frame; update or rebuild the native extension it "
             "crashed in; for a DataLoader worker, try num_workers=0 to get the real error"),
    LogClass("loss_nonfinite", "the loss became NaN or inf",
             "the training's numbers: a learning rate too high, a bad batch (NaN or inf in the data, a log of 0), "
             "fp16 overflow without loss scaling",
             "the first step whose loss is NaN or inf (the line shown), its batch and the learning rate then",
             "find the step's batch and check it for NaN/inf; lower the learning rate or clip gradients; use bf16 or "
             "a GradScaler for fp16; torch.autograd.detect_anomaly() names the operation that made the first NaN"),
    LogClass("job_terminated", "the job was stopped from outside (a time limit, a preemption, a cancel, a signal)",
             "the scheduler or an operator (SLURM's time limit, a spot/preemption notice, scancel, kill)",
             "the scheduler's records (`sacct -j JOB`, the cloud's preemption notices)",
             "request more time or resume from the last checkpoint; save checkpoints often enough to survive a "
             "preemption"),
)

BY_NAME = {c.name: c for c in CLASSES}

_ECC_XIDS = (48, 63, 64, 92, 94, 95)
_PICKLE_OPCODES = tuple(str(ord(op.code)) for op in pickletools.opcodes)
# An exit status however a launcher words it: torchrun "exitcode: -9", DeepSpeed "exits with
# return code = -9", a shell's "exit code 137" (128 + the signal).
_EXIT_WORDS = ("exitcode", "exit code", "exit status", "return code", "returncode", "exited with code")


def _exit(*codes: str) -> str:
    """An exit status among ``codes``, however a launcher words it."""
    return "|".join(rf"{w}\s*[:=]?\s*(?:{'|'.join(codes)})\b" for w in _EXIT_WORDS)


SIGNS: tuple[Sign, ...] = (
    # collective_mismatch
    _s("collective_mismatch", r"Detected mismatch between collectives|Collectives differ in the following aspects|"
       r"Mismatched collective|collective mismatch|op\.preamble\.length <= op\.nbytes|"
       r"ranks entered different collectives|doesn't match expected size|"
       r"appears not to match (?:sizes|strides) of the same param in process|expects same model across all ranks|"
       # Horovod's coordinator: "Mismatched ALLREDUCE tensor shapes: One rank sent ..., but another rank sent ..."
       r"Mismatched [^:\n]{1,60}: One rank (?:had|did|sent|specified)[^\n]*but another rank|"
       # accelerate's gather/reduce checks the shapes of every process first
       r"Cannot apply desired operation due to shape mismatches|"
       # torch's flight recorder analyser (fr_trace) names the culprit rank and how its entry
       # differs: "Culprit rank 22; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes ...";
       # not COLLECTIVE_STATE_MISMATCH (one rank finished, another only scheduled: a rank that did
       # not arrive, a hang's sign rather than a different call)
       r"Error type: (?:COLLECTIVE_TYPE|SIZE_OR_SYNTAX|COLLECTIVE_DTYPE)_MISMATCH\b"),
    # collective_timeout
    _s("collective_timeout", r"Watchdog caught collective operation timeout|"
       r"WorkNCCL\([^)]*\) ran for \d+ milliseconds before timing out|"
       r"Timed out waiting \d+ ?ms for (?:recv|send) operation|failed to pass monitoredBarrier|"
       r"collective operation timeout|Timeout at NCCL work: \d+", SYMPTOM),
    # nccl_heartbeat
    _s("nccl_heartbeat", r"Heartbeat monitor timed out|watchdog got stuck for \d+ seconds|"
       r"detected no heartbeat of its watchdog", SYMPTOM),
    # peer_lost
    # A peer's socket gone is a distributed failure when gloo, c10d's store or NCCL says it; a
    # Python BrokenPipeError or an HTTP connection reset is not another rank.
    # NCCL's "Net : Connection closed by remote peer" given as the reason of an error (its "Last
    # error:") is the peer gone; NCCL's own WARN line of it is read as the network (below).
    _s("peer_lost", r"remote process exited or there was a network error|ncclRemoteError|"
       r"(?:gloo|pair\.cc|c10d|TCPStore|Dist\w*Error|NCCL|Net :|socket\w*:|sendBytes|recvBytes|Read error|Write error)[^\n]*"
       r"(?:Connection (?:closed|reset) by (?:remote )?peer|Broken pipe)|"
       r"recvValue failed|failed to recv, got 0 bytes|NCCL Error 6\b|"
       # Open MPI's help box when a peer's connection drops ("An MPI communication peer process has
       # unexpectedly disconnected. This usually indicates a failure in the peer process")
       r"MPI communication peer process has unexpectedly disconnected", SYMPTOM),
    # torch.multiprocessing.spawn's report of a process of the group that exited by itself with a
    # status of its own (1-127: not 128 + a signal) and left no traceback (one it raised is
    # "ProcessRaisedException", read on its own lines): how the group ended, when nothing says more
    _s("peer_lost", r"process \d+ terminated with exit code (?:[1-9]|[1-9]\d|1[01]\d|12[0-7])\b", EXIT),
    # nccl_invalid_usage
    _s("nccl_invalid_usage", r"ncclInvalidUsage|\binvalid usage\b|NCCL version mismatch|"
       r"receiv(?:ing|ed) \d+ bytes instead of \d+|ncclInvalidArgument|Invalid config blocking attribute|"
       r"NCCL error[^\n]*invalid argument|NCCL Error 5\b"),
    # duplicate_gpu
    _s("duplicate_gpu", r"Duplicate GPU detected"),
    # nccl_network
    _s("nccl_network", r"NET/(?:IB|Socket|OFI|Plugin|GDR)\b[^\n]*(?:error|fail|with status|completion)|"
       r"Got completion from peer[^\n]*with (?:error|status)|\bsocket(?:Progress|StartConnect|PollConnect|"
       r"FinalizeAccept|Connect|Accept|Wait)\b[^\n]*(?:fail|refused|error|wrong|timed? ?out|abort)|"
       r"Call to connect|Error encountered progressing operation=Connect|Failed to execute operation Connect|"
       r"no (?:socket )?interfaces? found|ibv_(?!reg_)\w+ failed|IBV_WC_\w+ERR|"
       r"transport retry counter exceeded|NCCL WARN[^\n]*Connect(?:ion)? (?:to|refused|failed)|"
       # NCCL's own WARN line of a socket call that failed for the network (NCCL's SYSCHECK:
       # "Call to recv failed : No route to host")
       r"NCCL WARN[^\n]*(?:No route to host|Network is unreachable|Connection timed out)"),
    # ... a connection the other end closed or reset, on NCCL's own WARN line: the network, unless
    # the log says why the peer went (its own error, its kill); a broken pipe is a peer gone (peer_lost)
    _s("nccl_network", r"NCCL WARN[^\n]*(?:Connection closed by remote peer|Connection reset by peer)", SYMPTOM),
    # nccl_system_error
    _s("nccl_system_error", r"unhandled system error|ncclSystemError|NCCL Error 2\b", SYMPTOM),
    # ... and the call that failed, when it registers memory with the NIC ("Call to ibv_reg_mr
    # failed", "ibv_reg_dmabuf_mr failed"): the host's locked-memory limit or GPUDirect's peer
    # memory module, not the network between the nodes
    _s("nccl_system_error", r"ibv_reg_(?:dmabuf_)?mr\w* failed"),
    # rendezvous_timeout
    _s("rendezvous_timeout", r"Rendezvous\w*TimeoutError|RendezvousConnectionError|"
       r"Timed out initializing process group in store based barrier|client socket has timed out|"
       r"client socket has failed to connect to any network address|"
       r"client socket has failed to connect to[^\n]*(?:timed out|errno: 11[03]|No route to host)|"
       r"Timed out after \d+ seconds waiting for clients|connect\(\) timed out|"
       r"DistStoreError[^\n]*(?:Timed out|timeout)|Socket Timeout|store->get\([^)]*\) got error: Wait timeout|"
       r"wait timeout after \d+ ?ms, keys:"),
    # address_in_use
    _s("address_in_use", r"Address already in use|EADDRINUSE|errno: 98\b|"
       r"server socket has failed to listen on any|failed to listen on any local network address|"
       r"WinError 10048\b|Only one usage of each socket address"),  # Windows' words
    # c10d says a socket failed at WARNING level, then retries or gives up in an error line: when
    # a capture stops before that line, the warning is all there is.
    _s("address_in_use", r"failed to bind to \S+ \(errno: 98", SYMPTOM, on_warning=True),
    _s("rendezvous_timeout", r"client socket has failed to connect to \S+ \(errno: 11[03]", SYMPTOM, on_warning=True),
    # cuda_oom
    _s("cuda_oom", r"CUDA out of memory|CUDA error: out of memory|(?:cuda|torch)\.OutOfMemoryError|"
       r"CUBLAS_STATUS_ALLOC_FAILED|Cuda failure '?out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
       r"THCudaCheck FAIL[^\n]*out of memory|HIP out of memory|MPS backend out of memory|Tried to allocate [\d.]+ [KMGT]i?B \(GPU \d|CUDNN_STATUS_ALLOC_FAILED|"
       r"cuda runtime error \(2\)|\bcuda\w*\b[^\n]{0,40}?\bout of memory|\b[GNXH]PU\b[^\n]{0,20}?\bout of memory|"
       # the accelerator's memory as other runtimes say it (TensorFlow, XLA / torch_xla)
       r"OOM when allocating tensor|RESOURCE_EXHAUSTED: Out of memory|Ran out of memory in memory space hbm|"
       # PaddlePaddle's allocator: "Out of memory error on GPU 0. Cannot allocate 18.06MB memory on GPU 0"
       r"\bout of memory\b[^\n]{0,12}?\bon [GNXH]PU\b|Cannot allocate [\d.]+ ?[KMGT]?i?B memory on [GNXH]PU\b"),
    # host_oom
    _s("host_oom", r"DefaultCPUAllocator|can't allocate memory|Cannot allocate memory|not enough memory: you tried|"
       r"Unable to allocate [\d.]+ [KMGTP]?i?B for an array|_ArrayMemoryError|std::bad_alloc|\[Errno 12\]|"
       r"^(?:[\w.]+\.)?MemoryError\b|\bENOMEM\b|Buy new RAM|"
       # Windows: the page file (the commit limit) cannot back the allocation
       r"The paging file is too small for this operation|WinError 1455\b"),
    # oom_killed: the kernel, a scheduler or a worker's death say it (a cause) ...
    _s("oom_killed", r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|invoked oom-killer|oom-kill|"
       r"OOMKilled|\boom_kill\b|killed by signal: Killed|task \d+: Out Of Memory|exceeded (?:job |step )?memory limit|"
       r"Killed process \d+ \(|(?:killed|kill\w*) (?:due to|because of) (?:the node )?(?:running low on memory|memory pressure)|"
       # the kernel's reaper after the kill; Kubernetes evicting a pod for the node's memory
       r"oom_reaper: reaped process|The node was low on resource: memory|"
       # a scheduler killing a job over its memory limit (PBS, LSF); a notebook's host doing it (Colab)
       r"job killed: p?v?mem\b[^\n]*?exceeded limit|Job exceeded a memory resource limit|TERM_MEMLIMIT\b|job killed after reaching LSF memory usage limit|"
       r"session crashed after using all available RAM"),
    # ... or only the exit code says it (how it ended)
    _s("oom_killed", _exit("-9", "137") + r"|Signal 9 \(SIGKILL\)|\bsignal 9\b|\bSIGKILL\b|"
       r"^Killed\s*$|\d+ Killed\s+\S|signal: killed\b|task \d+: Killed|^zsh: killed\b|"
       # a shell's "Killed" in the user's language (glibc's strsignal: zh_CN, de, ru, ja, ko, fr)
       r"^已杀死\s*$|\d+ 已杀死|^Getötet\s*$|\d+ Getötet\s|^Убито\s*$|^強制終了\s*$|^죽었음\s*$|^Processus arrêté\s*$|"
       r"^=+\s+EXIT CODE: (?:9|137)\s*$", KILLED),  # MPICH/Intel MPI's "BAD TERMINATION" box
    # shm_full
    # NCCL writes no file but its shared-memory segments: its "No space left" is /dev/shm's.
    _s("shm_full", r"NCCL WARN[^\n]*No space left on device|/dev/shm\b[^\n]*(?:No space left|failed|error)(?![^\n]*No such file)|No space left[^\n]*/dev/shm|"
       r"unable to write to file </torch_|unable to allocate shared memory|unable to mmap \d+ bytes from file </torch_|killed by signal: Bus error|"
       r"bus error encountered in (?:DataLoader )?worker|failed to extend /dev/shm\b|insufficient shared memory|shared memory segment[^\n]*No space left|"
       r"Error while creating shared memory segment|"
       # torch's shared tensors are files in /dev/shm ("</torch_1234_5678_0>"), whatever verb failed on them
       r"</torch_[\w-]*>[^\n]*(?:No space left|\(28\)|errno:? 28)"),
    # Where the error was raised says which device is full: POSIX semaphores and shared memory
    # segments (multiprocessing's Lock, SharedMemory; torch's shared tensors) live in /dev/shm.
    # pandarallel writes its chunks to files only on its memory file system (/dev/shm).
    _s("shm_full", r"No space left on device|\bENOSPC\b|\[Errno 28\]",
       in_frames=r"multiprocessing[/\\](?:synchronize|shared_memory|heap)\.py|torch[/\\]multiprocessing[/\\]|pandarallel[/\\]"),
    # joblib's start-up check creates a semaphore (in /dev/shm) and warns when it cannot: "[Errno 28]
    # No space left on device.  joblib will operate in serial mode"
    _s("shm_full", r"(?:No space left on device|\[Errno 28\])[^\n]*joblib will operate in serial mode", SYMPTOM, on_warning=True),
    _s("shm_full", _exit("-7", "135") + r"|Signal 7 \(SIGBUS\)|\bSIGBUS\b|^Bus error\b", KILLED),
    # cuda_illegal_memory_access
    # ... also as CUDA's debuggers report it: cuda-gdb's exceptions ("CUDA Exception: Warp Illegal
    # Address", CUDA_EXCEPTION_14) and compute-sanitizer's / cuda-memcheck's "Invalid __global__
    # read of size 4 bytes".
    _s("cuda_illegal_memory_access", r"illegal memory access|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS|"
       r"Cuda failure 700\b|(?:Warp|Lane|Device) (?:Illegal|Out-of-range) Address|CUDA_EXCEPTION_(?:1|5|14)\b|"
       r"Invalid __(?:global|shared|local)__ (?:read|write|atomic)|"
       r"Memory access fault by GPU node-\d+"),  # ROCm's words for it
    # CUDA's error is sticky: after the fault every call returns it, also the ones torch only warns
    # about (c10's "CUDA warning: an illegal memory access was encountered (function destroyEvent)")
    _s("cuda_illegal_memory_access", r"CUDA warning: an illegal memory access|cudaErrorIllegalAddress", on_warning=True),
    # cuda_device_assert
    _s("cuda_device_assert", r"device-side assert(?:ion)? triggered|\.cu(?:h)?:\d+:[^\n]*Assertion `[^\n]*` failed|"
       r"block: \[[\d,]+\], thread: \[[\d,]+\] Assertion|cudaErrorAssert|CUDA_ERROR_ASSERT"),
    # cuda_no_kernel_image
    _s("cuda_no_kernel_image", r"no kernel image is available|cudaErrorNoKernelImageForDevice|"
       r"(?:CUDA|HIP) error: invalid device function|invalid value for --gpu-architecture|"
       r"hipErrorNoBinaryForGpu|Unable to find code object for all current devices"),  # ROCm's
    # torch's warning that this GPU is not in its build: read on the warning's message (its
    # "UserWarning:" line or the line after), as a symptom: any error that says more decides.
    _s("cuda_no_kernel_image", r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation|"
       # ... and its older words for a GPU below the build's minimum
       r"Found GPU\d+ [^\n]* which is of cuda capability \d+\.\d+|PyTorch no longer supports this GPU because it is too old",
       SYMPTOM, on_warning=True),
    # cuda_driver_insufficient
    _s("cuda_driver_insufficient", r"driver version is insufficient|NVIDIA driver on your system is too old|"
       r"cudaErrorInsufficientDriver|CUDA_ERROR_INSUFFICIENT_DRIVER|unsupported display driver / cuda driver combination|"
       r"PTX was compiled with an unsupported toolchain|forward compatibility was attempted on non supported HW"),
    # cuda_device_busy
    _s("cuda_device_busy", r"busy or unavailable|cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE"),
    # gpu_lost
    _s("gpu_lost", r"fallen off the bus|\bGPU is lost\b|GpuIsLost|NVML_ERROR_GPU_IS_LOST|NV_ERR_GPU_IS_LOST|"
       r"GPU lost from the bus|"
       r"Unable to determine the device handle for GPU|\bXid\b[^\n]*?:\s*79\b|\bXid[ :]+79\b"),
    # The driver could not bring a GPU up (NVRM's "RmInitAdapter failed", "Cannot attach gpu"):
    # the GPU is gone for the driver, whatever put it there (an ECC or an Xid said beside it
    # says more).
    _s("gpu_lost", r"RmInitAdapter failed|rm_init_adapter failed|Cannot attach gpu", SYMPTOM),
    # gpu_ecc
    _s("gpu_ecc", r"uncorrectable ECC error|ECC error encountered|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE|"
       r"row remap(?:ping)? fail|double bit ECC|\bXid\b[^\n]*?:\s*(?:" + "|".join(map(str, _ECC_XIDS)) + r")\b|"
       r"\bXid[ :]+(?:" + "|".join(map(str, _ECC_XIDS)) + r")\b"),
    # gpu_xid: the driver's other Xids are often the trace of a program's fault (a bad kernel
    # shows as Xid 13/31/43): a symptom beside a CUDA error.
    _s("gpu_xid", r"NVRM: Xid|\bXid \(PCI:|\bXid[ :]+\d+\b|NVRM:[^\n]*(?:GSP|heartbeat)[^\n]*timed out", SYMPTOM),
    # disk_full
    _s("disk_full", r"No space left on device|There is not enough space on the disk|\bENOSPC\b|\[Errno 28\]|PytorchStreamWriter failed writing|file write failed|"
       r"unexpected pos \d+ vs \d+|Cannot write: No space|database or disk is full|"
       # numpy's short write of an array to a file (ndarray.tofile, np.save): only a full disk writes less
       r"\d+ requested and \d+ written|"
       # Kubernetes evicting a pod for the node's disk (its ephemeral storage)
       r"The node was low on resource: ephemeral-storage|ephemeral local storage usage exceeds|"
       # HF datasets' check before it downloads and prepares a dataset
       r"Not enough disk space\. Needed:"),
    # disk_quota
    _s("disk_quota", r"Disk quota exceeded|\bEDQUOT\b|\[Errno 122\]"),
    # read_only_fs
    _s("read_only_fs", r"Read-only file system|\bEROFS\b|\[Errno 30\]"),
    # checkpoint_corrupt
    _s("checkpoint_corrupt", r"PytorchStreamReader failed|failed finding central directory|invalid load key|"
       r"HeaderTooLarge|InvalidHeaderDeserialization|Error while deserializing header|MetadataIncompleteBuffer|"
       r"UnpicklingError(?!: Weights only load failed)|pickle data was truncated|unexpected EOF, expected \d+ more bytes|"
       r"Unable to load weights from pytorch checkpoint file|storage has wrong byte size|"
       r"is not a zip file|BadZipFile|file might be corrupted|\bPytorchStreamReader\b|Invalid magic number; corrupt file|"
       r"inline_container\.cc[^\n]*file not found|storage has wrong (?:byte )?size|"
       # a Git LFS pointer where the weights should be (transformers says so); an HDF5 weights file
       # (Keras) that is truncated or not HDF5 at all
       r"cloned a repository without having git-lfs installed|"
       r"Unable to (?:synchronously )?open file \((?:truncated file|file signature not found|bad object header)"),
    # torch.load's weights_only unpickler on a file that is no pickle at all (an HTML page: its first
    # byte '<' is "Unsupported operand 60"); an operand that is a pickle opcode is another story
    _s("checkpoint_corrupt", r"Unsupported operand (?!(?:" + "|".join(_PICKLE_OPCODES) + r")\b)\d+\b"),
    _s("checkpoint_corrupt", r"Ran out of input", unless_frames=r"multiprocessing|spawn\.py|reduction\.py|queues\.py"),
    # permission_denied: the OS's EACCES/EPERM on a path (Python's PermissionError, a C library's strerror)
    _s("permission_denied", r"PermissionError|\[Errno 13\]|\[Errno 1\] Operation not permitted|\bEACCES\b|"
       r"(?:/|\\)[^\s:'\"]*['\"]?:? ?Permission denied|Permission denied:? ['\"]?(?:/|\.{1,2}/|~/|[A-Za-z]:\\)|"
       r"cannot (?:open|create|write|remove|make)[^\n]*: Permission denied|"
       # torch's own stream writer (torch.save): "open file failed with strerror: Permission denied"
       r"strerror:? (?:Permission denied|Operation not permitted)"),
    # checkpoint_weights_only: torch.load's weights_only unpickler refused an object (torch >= 2.6)
    _s("checkpoint_weights_only", r"Unsupported global: GLOBAL|was not an allowed global by default|"
       r"Weights only load failed[^\n]*Unsupported (?:global|class)"),
    # checkpoint_cuda_on_cpu
    # ... or the end of its message ("... please use torch.load with map_location=torch.device('cpu') to map
    # your storages to the CPU."), when a paste or a wrap cut its start
    _s("checkpoint_cuda_on_cpu", r"Attempting to deserialize object on a CUDA\b|to map your storages to the CPU\b"),
    # file_missing
    _s("file_missing", r"FileNotFoundError|No such file or directory|\[Errno 2\]|can't open file|"
       r"errno = 2, error message = 'No such file|does not appear to have a file named|\bno file named [\w.]+|"
       r"The system cannot find the (?:file|path) specified"),
    # ... a local path transformers or huggingface_hub could not load from: a name that is a path
    # ("/data/models/x", "./ckpt") and not a Hub id is a folder that is not there
    _s("file_missing", r"(?:Can't load (?:the )?[\w ]{3,40}? (?:for|of) |Incorrect path_or_model_id: |Repo id must [^\n]*?: )"
       r"'(?:/|\.{1,2}/|~/|[A-Za-z]:[\\/])"),
    # import_error
    _s("import_error", r"ModuleNotFoundError|\bImportError\b|No module named|cannot open shared object file|"
       r"undefined symbol|DLL load failed|cannot import name|Failed to import [\w.]+ because|"
       r"version `[\w.]+' not found \(required by|The specified module could not be found|Error loading \"[^\"]+\.dll\""),
    # too_many_open_files
    _s("too_many_open_files", r"Too many open files|\bEMFILE\b|\[Errno 24\]|items of ancdata"),
    # segfault: a crash report is the cause; an exit code or an abort after a C++ exception is
    # only how the process ended.
    _s("segfault", r"Segmentation fault|段错误|Speicherzugriffsfehler|Erreur de segmentation|Ошибка сегментирования|"
       r"セグメンテーション違反|Violación de segmento|segmentation fault encountered in worker|killed by signal: Segmentation|"
       r"Fatal Python error: Segmentation|\bSIGSEGV\b received|double free or corruption|"
       r"free\(\): invalid|malloc\(\): corrupted|corrupted size vs\. prev_size|"
       # Windows' access violation (faulthandler's report of it)
       r"Windows fatal exception: access violation"),
    _s("segfault", _exit("-11", "139", "-1073741819", "3221225477") + r"|Signal 11 \(SIGSEGV\)|\bSIGSEGV\b|\bsignal 11\b|"
       r"\b0xC0000005\b", KILLED),  # Windows' exit status of an access violation
    _s("segfault", _exit("-6", "134") + r"|Signal 6 \(SIGABRT\)|\bSIGABRT\b|^Aborted\b|killed by signal: Aborted|"
       r"Fatal Python error: Aborted", EXIT),
    # loss_nonfinite: autograd's anomaly mode names the backward that made the first NaN
    _s("loss_nonfinite", r"Function '\w+' returned (?:nan|inf) values in its \d+\w* output"),
    # job_terminated
    _s("job_terminated", r"CANCELLED AT \S+ DUE TO|STEPD TERMINATED ON|Received (?:\d+|Signals\.\w+|SIG\w+) death signal|"
       r"got signal: (?:15|1|2|Signals\.SIG(?:TERM|HUP|INT))\b|DUE TO PREEMPTION|\bwas preempted\b|preemption notice|"
       r"Force Terminated job|spot (?:instance )?interruption|Received SIGTERM|"
       r"Job deleted at request of \S+|\bjob preempted\b|"  # PBS/Torque's notice
       # a scheduler's time limit as PBS and LSF word it
       r"job killed: walltime \S+ exceeded limit|TERM_(?:RUNLIMIT|PREEMPT|OWNER|FORCE_OWNER|REQUEUE_\w+)\b|"
       r"job killed after reaching LSF run time limit|"
       # a job's own handler for its scheduler's signal (submitit, Lightning's SLURM plugin); not
       # SIGINT: a user's Ctrl-C, often on a hang whose cause is elsewhere
       r"\b(?:is|was|been|being|got) preempted\b|\bpreempted by (?:the )?(?:scheduler|slurm|a higher)|"
       r"(?:caught|received|handling) (?:the )?signal:? SIG(?:TERM|HUP|USR1|USR2)\b", on_warning=True),
    _s("job_terminated", _exit("-15", "143") + r"|Signal 15 \(SIGTERM\)|^Terminated\s*$|tasks? [\d,-]+: Terminated|"
       r"srun: Job step aborted|CANCELLED AT \S+|<Signals\.SIGTERM: 15>|"
       # a task ended by SIGUSR1/2, which no crash sends: `scancel --signal`, `sbatch --signal=USR1@T`
       r"tasks? [\d,-]+: User defined signal [12]\b|^User defined signal [12]\s*$", EXIT),
)



# NCCL's notice that it retries a connection (INFO: "Call to connect returned Connection
# refused, retrying", "socketPollConnect: connect returned No route to host, retrying (3/34)"):
# the network, when the process never got past it (no other NCCL line of it follows).
NCCL_RETRY = re.compile(r"\bconnect returned [^,\n]+, retrying", re.I)
NCCL_RETRY_CLASS = "nccl_network"
# c10d's store-based barrier says every 10 s that it still waits for the other ranks to join
# ("Waiting in store based barrier to initialize process group for rank: 0, key:
# store_based_barrier_key:1 (world_size=4, worker_count=8, timeout=0:30:00)"; torch 2: "...
# num_workers_joined=1 ..."): the ranks never met, when the process never got past it.
STORE_BARRIER_WAIT = re.compile(r"Waiting in store based barrier to initialize process group", re.I)
STORE_BARRIER_WAIT_CLASS = "rendezvous_timeout"
# NCCL's return-code trace names the errno of a system error that failed ("misc/socket.cc:505 -> 2
# (Operation now in progress)"): an errno only a socket sets says the system call was the
# network's (a connect that never completed, a peer unreachable or refusing).
NCCL_NET_ERRNO = re.compile(r"-> 2 \((?:Operation now in progress|Connection (?:refused|timed out|reset by peer)|"
                            r"No route to host|Network is unreachable|Host is (?:down|unreachable)|"
                            r"Software caused connection abort|Cannot assign requested address)\)", re.I)


# A loss printed as NaN or inf on any line (a logger's INFO line, a progress bar's postfix, a
# print): "loss nan", "loss: inf", "train_loss=nan", "{'loss': nan, ...}", "loss is nan". Read
# by the decision apart from the signs, which never read context lines; its step and rank are
# the first such line's. Not a best or minimum loss so far, which starts at inf ("'best_train_loss': inf").
NONFINITE_LOSS = re.compile(r"(?<!best )(?<!min )\b(?!(?:best|min|lowest|prev|previous|init)\w*[_ ]loss)(?:\w+[_ ])?loss\b['\"]?\s*(?:[:=]|is|became|=\s*tensor\()?\s*[-+]?(?:nan|inf)\b", re.I)
NONFINITE_LOSS_CLASS = "loss_nonfinite"
STEP_OF = re.compile(r"\b(?:step|iter(?:ation)?|it|batch)\b\s*[:=#]?\s*(\d+)", re.I)


# Every word some sign needs: a line with none of them shows no class (most lines of a log).
ALL_WORDS = tuple(sorted({w for sign in SIGNS for w in sign.words or ()}, key=len))
EVERY_SIGN_HAS_WORDS = all(sign.words for sign in SIGNS)


def may_show_a_class(lowered: str) -> bool:
    return not EVERY_SIGN_HAS_WORDS or any(w in lowered for w in ALL_WORDS)
