"""What the instrumentation learns from torch, patched in when the program imports torch.

Phases (the record's ``phase``), from well-known calls, in the main thread:

=====================  =====================================================================
``dist.init``          inside ``torch.distributed.init_process_group``
``ddp.wrap``           inside ``DistributedDataParallel(...)`` / FSDP construction
``data``               waiting on a DataLoader iterator (``next(it)``)
``train`` / ``eval``   after the first batch or optimizer step; ``eval`` after
                       ``model.eval()`` once training has begun, ``train`` again after
                       ``model.train()`` or the next optimizer step
``checkpoint``         inside ``torch.save`` to a file
``load``               inside ``torch.load`` from a file
``collective:<op>``    inside a blocking ``torch.distributed`` collective, or waiting for an
                       async one (``Work.wait``, a functional collective's ``wait_tensor``);
                       the record's ``collective`` says op, sequence number in its group,
                       group (name, description, global ranks), call site, framework
                       context ("FSDP unshard of layers.3") and whether the call site is new
=====================  =====================================================================

Progress: optimizer steps (torch's global optimizer step hook) once any optimizer stepped,
batches before that (and for programs without an optimizer); the epoch from
``DistributedSampler.set_epoch``; the batch within the current pass in ``item``.

DataLoader workers (fork and spawn): each gets its own record (heartbeat, samples fetched,
the dataset index in flight) from a wrapper around the loader's ``worker_init_fn`` that
starts before the user's own. ``UPS_FORCE_NUM_WORKERS=0`` (``ups relaunch --num-workers
0``) makes every DataLoader load in the main process.

A job's own explicit phases (``encode``, ``write`` ...) are kept: a wrapped call restores
the phase it found, unless that was one of the automatic ones.

Cost: the hot-path wrappers (``next(it)``, ``backward``, the optimizer hook, a collective)
do no I/O, format nothing and read one monotonic clock: a few microseconds each in a real
loop, where the caches are cold (26 us a step in all in scripts/bench_instrument.py's loop
on a 2-core box); the heartbeat thread writes the record once a second. A
worker writes its record when it starts a batch (the index in flight must be on disk before
a read that may block holding the GIL), and ``torch.save`` at most four times a second.
"""

from __future__ import annotations

import os
import sys
import threading

from ups.instrument import flight, metrics, patching, process
from ups.status.exceptions import is_library_file

ENV_FORCE_NUM_WORKERS = "UPS_FORCE_NUM_WORKERS"
_AUTO_PHASES = frozenset(("start", "train", "eval"))
_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send",
    # what FSDP2 (all_gather_single, reduce_scatter_single: their names in torch 2.13), FSDP1
    # and older callers (_all_gather_base, _reduce_scatter_base) and pipelining (isend, irecv,
    # one call per op of batch_isend_irecv on a backend without coalescing) call
    "all_gather_single", "reduce_scatter_single", "_all_gather_base", "_reduce_scatter_base", "isend", "irecv",
    "all_reduce_coalesced", "all_gather_coalesced",
)
# torch.distributed._functional_collectives (DTensor redistribution, tensor parallel, FSDP2's
# DTensor clip_grad_norm_): issued here, waited in wait_tensor when the result is first used.
_FUNCTIONAL = (
    "all_reduce", "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
    "all_to_all_single", "broadcast", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
)
PENDING_KEPT = 64  # async works issued and not yet waited (bounded: a program that never waits; each keeps its buffers alive)


class _Tracking:
    """Main-thread phase nesting and progress counters of this process (slots: the hooks read
    them on every step)."""

    __slots__ = ("base", "batches", "cuda_dev", "depth", "forced_warned", "groups", "loaders", "main", "opt_counts",
                 "opt_steps", "pending", "seen", "world")

    def __init__(self) -> None:
        self.base = "start"
        self.depth = 0
        self.opt_steps = 0
        self.opt_counts: dict[int, int] = {}
        self.batches = 0
        self.cuda_dev: int | None = None
        self.main = threading.main_thread().ident
        self.loaders = 0
        self.forced_warned = False
        self.groups: dict[int, _Group] = {}  # id(process group) -> what the record says of it
        self.world: _Group | None = None  # the default group
        self.pending: dict[int, tuple] = {}  # id(work or tensor) -> (it, issued collective)
        self.seen: set = set()  # (op, site, context) of every collective issued so far


_t = _Tracking()
_get_ident = threading.get_ident


def reset_after_fork() -> None:
    global _t
    _t = _Tracking()
    _t.main = _get_ident()
    metrics.reset_after_fork()


def cuda_device() -> int | None:
    return _t.cuda_dev


def optimizer_steps() -> int:
    """Optimizer steps this process made (its progress when it trains)."""
    return _t.opt_steps


# ------------------------------------------------------------------------- phases
def enter_phase(rep, name: str, *, flush: bool = False) -> str | None:
    """Enter a phase for the duration of a wrapped call; the outermost wrapped call wins."""
    t = _t
    t.depth += 1
    if t.depth > 1:
        return None
    prev = rep.current_phase
    rep.phase(name, flush=flush)
    return prev


def leave_phase(rep, prev: str | None, *, failed: bool = False) -> None:
    """Back to the phase the call found; a call that raised keeps its phase, so a process
    that dies of the exception says where (``collective:all_reduce``, ``checkpoint``)."""
    t = _t
    t.depth -= 1
    if t.depth == 0 and prev is not None and not failed:
        rep.phase(t.base if prev in _AUTO_PHASES else prev, flush=False)


def _set_base(rep, name: str) -> None:
    t = _t
    if t.base != name:
        t.base = name
        if t.depth == 0 and rep.current_phase in _AUTO_PHASES:
            rep.phase(name, flush=False)


def rank_reporter():
    """The reporter of a rank's main thread, else None (workers, helpers, other threads)."""
    rep = process.state.rep
    if rep is None or rep.role != "rank" or _get_ident() != _t.main:
        return None
    return rep


# Both keyed by id(code), the code object kept in the value and compared: hashing a code
# object hashes its constants and names every time (tens of microseconds for a module's code),
# and this runs on every collective.
_LIBRARY_CODE: dict[int, tuple[object, bool]] = {}  # is it torch's / the stdlib's / ours
# (id(code), instruction offset) -> (code, "train.py:120"). The offset, not f_lineno: that one
# walks the code's line table on every read.
_SITES: dict[tuple[int, int], tuple[object, str]] = {}


# Frames of a framework that issues collectives for the program, by the end of their file:
# what the record's ``context`` says ("FSDP unshard of layers.3"). Looked at only while walking
# out to the program's own frame, which the call site needs anyway.
_FRAMEWORK_FILES = (
    ("fsdp/_fully_shard/_fsdp_param_group.py", "FSDP"),
    ("fsdp/_runtime_utils.py", "FSDP1"),
    ("fsdp/fully_sharded_data_parallel.py", "FSDP1"),
    ("tensor/parallel/style.py", "TP"),
    ("distributed/pipelining/schedules.py", "pipelining"),
    ("distributed/pipelining/stage.py", "pipelining"),
    ("nn/parallel/distributed.py", "DDP"),
    ("nn/utils/clip_grad.py", "clip_grad_norm_"),
    ("distributed/tensor/_api.py", "DTensor"),
    ("distributed/checkpoint/", "distributed checkpoint"),
)
_FSDP_WORDS = {"unshard": "unshard", "post_backward": "reduce-scatter of grads", "_unshard": "unshard",
               "_reduce_grad": "reduce-scatter of grads", "_pre_forward_unshard": "unshard",
               "_post_backward_hook": "reduce-scatter of grads", "lazy_init": "init", "_lazy_init": "init"}
_FRAMEWORK_CODE: dict[int, tuple[object, str | None]] = {}  # id(code) -> (code, framework or None)


def _framework_of(code) -> str | None:
    known = _FRAMEWORK_CODE.get(id(code))
    if known is None or known[0] is not code:
        name = code.co_filename.replace(os.sep, "/")
        known = _FRAMEWORK_CODE[id(code)] = (code, next((fw for end, fw in _FRAMEWORK_FILES if end in name), None))
    return known[1]


def _context(framework: str, frame) -> str | None:
    """What the framework's frame is doing, in words: "FSDP unshard of layers.3", "TP
    RowwiseParallel._prepare_output_fn", "pipelining fwd_send"; None for a comprehension's
    frame (its function's frame, next out, says it)."""
    code = frame.f_code
    name = code.co_name
    if name.startswith("<"):
        return None
    if framework == "FSDP":
        fqn = getattr(frame.f_locals.get("self"), "_module_fqn", None)
        return f"FSDP {_FSDP_WORDS.get(name, name)} of {fqn or 'root'}"
    if framework == "FSDP1":
        return f"FSDP1 {_FSDP_WORDS.get(name, name)}"
    if framework == "pipelining":
        desc = frame.f_locals.get("desc") if name in ("_batch_p2p", "_sorted_batch_p2p") else None
        return f"pipelining {desc if isinstance(desc, str) else name}"
    if framework == "TP":
        return f"TP {getattr(code, 'co_qualname', name)}"
    if framework == "clip_grad_norm_":
        return "clip_grad_norm_"
    return f"{framework} {name}"


def _site_and_context(depth: int = 2) -> tuple[str | None, str | None]:
    """file:line of the program's own frame that made the current call (cached per site), and
    the innermost framework frame between it and here, in words (None: the program's own call)."""
    frame = sys._getframe(depth)
    context = None
    weak = False  # DTensor's own frames say less than the TP style or FSDP around them
    while frame is not None:
        code = frame.f_code
        known = _LIBRARY_CODE.get(id(code))
        if known is None or known[0] is not code:
            known = _LIBRARY_CODE[id(code)] = (code, is_library_file(code.co_filename))
        if not known[1]:
            key = (id(code), frame.f_lasti)
            site = _SITES.get(key)
            if site is None or site[0] is not code:
                site = _SITES[key] = (code, f"{os.path.basename(code.co_filename)}:{frame.f_lineno}")
            return site[1], context
        if context is None or weak:
            framework = _framework_of(code)
            if framework is not None and (context is None or framework != "DTensor"):
                try:
                    context = _context(framework, frame) or context
                except Exception:  # noqa: BLE001 - a word less, never an error in the program
                    context = framework
                weak = framework == "DTensor"
        frame = frame.f_back
    return None, context


def _call_site() -> str | None:
    """file:line of the program's own frame that made the current call (cached per site)."""
    return _site_and_context(3)[0]


def _note_cuda_device() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        _t.cuda_dev = torch.cuda.current_device()


def set_enabled(enabled: bool) -> None:
    """Put torch's own functions back (False) or ours again (True): for measuring the cost of
    the instrumentation in one process (scripts/bench_instrument.py), not for programs."""
    for owner, name, original, wrapper in patching.PATCHED:
        setattr(owner, name, wrapper if enabled else original)
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.optim.optimizer import _global_optimizer_post_hooks

        ours = [k for k, h in _global_optimizer_post_hooks.items() if getattr(h, "__ups_hook__", False)]
        if enabled and not ours:
            _patch_optim(torch)
        for key in ours if not enabled else ():
            del _global_optimizer_post_hooks[key]


def phase_call(phase: str, *, flush: bool = False, describe=None):
    """A wrapper maker: the call is in ``phase`` (written at once with ``flush``). With
    ``describe(args, kwargs)`` (the savers): only calls it describes count, the outermost one
    names what it does as the record's item (written at once if the record is older than
    0.25 s: a write that hangs on dead storage may hold the GIL), and an exception it raises
    gets a note saying what was being done (torch's message does not name the file)."""
    def make(original):
        def wrapper(*args, **kwargs):
            what = describe(args, kwargs) if describe is not None else None
            rep = rank_reporter() if describe is None or what is not None else None
            if rep is None:
                return original(*args, **kwargs)
            prev = enter_phase(rep, phase, flush=flush)
            if what is not None and prev is not None:
                rep.item(what)
                rep.flush_if_older(0.25)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                if what is not None and prev is not None and isinstance(exc, Exception) and hasattr(exc, "add_note"):
                    exc.add_note(f"(ups: while {what})")
                leave_phase(rep, prev, failed=True)
                raise
            leave_phase(rep, prev)
            return result

        return wrapper

    return make


# --------------------------------------------------------------------- entry point
def patch_torch(torch) -> None:
    """Called right after ``import torch`` finished (post-import hook)."""
    steps = (_patch_distributed, _patch_spawn, _patch_data, _patch_optim, _patch_module_modes, _patch_metrics)
    for step in steps:
        try:
            step(torch)
        except Exception as exc:  # noqa: BLE001 - one failed patch must not stop the others
            process.warn(f"could not instrument {step.__name__[7:]} ({type(exc).__name__}: {exc})")
    from ups.instrument import imports

    imports.when_imported("torch.distributed.fsdp", _patch_fsdp)
    imports.when_imported("torch.distributed._functional_collectives", _patch_functional)
    imports.when_imported("torch.distributed.elastic.multiprocessing.errors.error_handler", _patch_error_handler)


def _patch_error_handler(module) -> None:
    """torch's ``@record`` calls ``faulthandler.enable()`` (to stderr) when the decorated
    function starts, which takes fatal-signal tracebacks away from the stack file that
    ``ups stacks`` reads. Put ours back after it (the rank's stderr is in its log anyway)."""

    def make(original):
        def initialize(self):
            original(self)
            rep = process.state.rep
            if rep is not None:
                rep.rearm_fatal_handler()

        return initialize

    patching.patch(module.ErrorHandler, "initialize", make)


# -------------------------------------------------------------------- distributed
def _patch_distributed(torch) -> None:
    dist = torch.distributed
    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    init = phase_call("dist.init", flush=True)

    def make_init(original):
        inner = init(original)

        def wrapper(*args, **kwargs):
            result = inner(*args, **kwargs)
            if _get_ident() == _t.main and dist.is_initialized():
                # Whatever started this process (torchrun, Lightning re-executing the script,
                # mp.spawn, srun), the group it joined says which rank it is.
                process.become_rank(dist.get_rank(), dist.get_world_size())
                flight.watch(process.state.rep)  # Flight Recorder dumps, when the program has it on
            return result

        return wrapper

    work_type = getattr(getattr(torch._C, "_distributed_c10d", None), "Work", None)
    collectives = ((op, _collective(op, work_type)) for op in _COLLECTIVES)
    for name, make in (("init_process_group", make_init), *collectives):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        patching.patch(c10d, name, make)
        if getattr(dist, name, None) is original:  # torch.distributed re-exports c10d's functions
            wrapper = getattr(c10d, name)
            setattr(dist, name, wrapper)
            patching.PATCHED.append((dist, name, original, wrapper))
    patching.patch(torch.nn.parallel.DistributedDataParallel, "__init__", phase_call("ddp.wrap", flush=True))
    if work_type is not None:  # async collectives (FSDP's all-gather, pipelining's p2p) are waited here
        patching.patch(work_type, "wait", _waiting("wait"))


def _patch_spawn(torch) -> None:
    """``torch.multiprocessing.spawn`` (``mp.spawn``, ``start_processes``): the calling process
    starts the ranks and is not one of them (its record becomes a helper's before the first
    rank starts); the ranks learn how many they are (see ``process._start_spawned_rank``)."""
    import importlib

    module = importlib.import_module("torch.multiprocessing.spawn")  # the attribute is the function

    def make(original):
        def start_processes(fn, args=(), nprocs=1, *rest, **kwargs):
            process.become_spawner(f"mp.spawn parent of {nprocs} processes")
            previous = os.environ.get(process.ENV_SPAWN_NPROCS)
            os.environ[process.ENV_SPAWN_NPROCS] = str(nprocs)
            try:
                return original(fn, args, nprocs, *rest, **kwargs)
            finally:
                if previous is None:
                    os.environ.pop(process.ENV_SPAWN_NPROCS, None)
                else:
                    os.environ[process.ENV_SPAWN_NPROCS] = previous

        return start_processes

    original = getattr(module, "start_processes", None)
    patching.patch(module, "start_processes", make)
    # mp.spawn calls start_processes through its module's globals: the patched one is used.
    if getattr(torch.multiprocessing, "start_processes", None) is original:
        torch.multiprocessing.start_processes = module.start_processes


class _Group:
    """A process group as the record names it: name, description (DeviceMesh sets
    ``mesh_<dim>``), global ranks, and this rank's sequence numbers in it (collectives, and
    p2p per direction and peer: a send to rank 1 pairs with rank 1's recv from this rank)."""

    __slots__ = ("desc", "name", "p2p", "pg", "ranks", "seq")

    def __init__(self, pg, dist) -> None:
        self.pg = pg
        self.seq = 0
        self.p2p: dict[tuple[str, int | None], int] = {}
        try:
            self.name = str(pg.group_name)
        except Exception:  # noqa: BLE001
            self.name = "?"
        try:
            self.desc = str(pg.group_desc)
        except Exception:  # noqa: BLE001
            self.desc = None
        try:
            self.ranks = tuple(dist.get_process_group_ranks(pg))
        except Exception:  # noqa: BLE001
            self.ranks = None


def _group(pg):
    """The :class:`_Group` of a process group (None: the default group), cached."""
    t = _t
    if pg is None:
        world = t.world
        dist = sys.modules["torch.distributed"]
        default = dist.distributed_c10d.GroupMember.WORLD
        if world is not None and world.pg is default:
            return world
        if default is None:
            return None
        pg = default
    g = t.groups.get(id(pg))
    if g is None or g.pg is not pg:
        g = t.groups[id(pg)] = _Group(pg, sys.modules["torch.distributed"])
        if pg is sys.modules["torch.distributed"].distributed_c10d.GroupMember.WORLD:
            t.world = g
    return g


_P2P = {"send": ("dst", "group_dst"), "isend": ("dst", "group_dst"), "recv": ("src", "group_src"),
        "irecv": ("src", "group_src")}


def _issue(op: str, g, peer, context_depth: int = 3) -> tuple:
    """A collective issued now: (op, seq in its group, site, info for the record)."""
    site, context = _site_and_context(context_depth)
    if g is None:
        seq, info = None, None
    else:
        if peer is None and op not in _P2P:
            seq = g.seq = g.seq + 1
        else:
            key = (op.lstrip("i"), peer)
            seq = g.p2p[key] = g.p2p.get(key, 0) + 1
        seen = _t.seen
        key = (op, site, context)
        new = key not in seen
        if new:
            seen.add(key)
        info = (g.name, g.desc, g.ranks, context, new, peer, False)
    return op, seq, site, info


def _peer(op: str, args, kwargs, g, index: dict) -> int | None:
    """The global rank of a send's destination or a recv's source."""
    names = _P2P.get(op)
    if names is None:
        return None
    glob, local = names
    peer = kwargs.get(glob)
    if peer is None:
        i = index.get(glob)
        peer = args[i] if i is not None and i < len(args) else None
    if peer is None:
        lp = kwargs.get(local)
        if lp is not None and g is not None and g.ranks is not None and 0 <= lp < len(g.ranks):
            peer = g.ranks[lp]
    return peer if isinstance(peer, int) else None


def _arg_index(original) -> dict[str, int]:
    import inspect

    try:
        return {name: i for i, name in enumerate(inspect.signature(original).parameters)}
    except (TypeError, ValueError):
        return {}


def _keep_pending(key, c: tuple, result) -> None:
    """An async collective's work (or a functional collective's tensor), waited later."""
    pending = _t.pending
    if len(pending) >= PENDING_KEPT:
        pending.pop(next(iter(pending)))
    pending[key] = (result, c)


def _storage_key(tensor) -> tuple:
    return ("storage", tensor.untyped_storage().data_ptr())


def _collective(op: str, work_type=None, *, functional: bool = False):
    phase = f"collective:{op}"

    def make(original):
        index = _arg_index(original)
        gi = index.get("group")

        def wrapper(*args, **kwargs):
            # On every collective of the program: _rank_reporter, _enter and _leave inlined.
            rep = process.state.rep
            t = _t
            if rep is None or t.depth or rep.role != "rank" or _get_ident() != t.main:
                return original(*args, **kwargs)  # nested (broadcast_object_list -> broadcast): the outer counts
            try:
                pg = kwargs.get("group") if "group" in kwargs else (args[gi] if gi is not None and gi < len(args) else None)
                g = _functional_group(pg, kwargs.get("tag", "")) if functional else _group(pg)
                c = _issue(op, g, _peer(op, args, kwargs, g, index) if op in _P2P else None)
            except Exception:  # noqa: BLE001 - never in the program's way
                c = (op, None, _call_site(), None)
            prev = rep.enter_collective(op, c[2], phase, c[1], c[3])
            if c[3] is not None and c[3][4]:
                # A call site never seen before (a one-sided or mismatched collective, most
                # often): on record before the call, since the backend may abort the process
                # (gloo's size check, NCCL's) before the next heartbeat. Once per site.
                rep.flush(wait=0.05)
            t.depth = 1
            try:
                result = original(*args, **kwargs)
            except BaseException:
                t.depth = 0  # the record keeps the collective it died in
                flight.on_error(rep)
                raise
            t.depth = 0
            rep.leave_collective(t.base if prev in _AUTO_PHASES else prev)
            if result is not None:
                if functional:
                    elem = getattr(result, "elem", None)  # an AsyncCollectiveTensor: waited in wait_tensor
                    if elem is not None and not getattr(result, "completed", True):
                        # By storage: wait_tensor may get a view of it (AsyncCollectiveTensor's
                        # own fast path for aten.view wraps a new tensor).
                        _keep_pending(_storage_key(elem), c, elem)
                elif work_type is not None and isinstance(result, work_type):
                    _keep_pending(id(result), c, result)
            return result

        return wrapper

    return make


def _functional_group(group, tag: str):
    """The :class:`_Group` of a functional collective's group argument (a ProcessGroup, a
    (DeviceMesh, dim), a list of ranks, a group name)."""
    funcol = sys.modules["torch.distributed._functional_collectives"]
    c10d = sys.modules["torch.distributed"].distributed_c10d
    if isinstance(group, c10d.ProcessGroup):
        return _group(group)
    name = funcol._resolve_group_name(group, tag)
    return _group(c10d._resolve_process_group(name))


def _waiting(what: str, *, tensors: bool = False):
    """``Work.wait`` / ``wait_tensor``: the rank waits for an async collective issued earlier;
    the record says which one (op, its sequence number and group, where it was issued)."""

    def make(original):
        def wait(self, *args, **kwargs):
            t = _t
            if not t.pending:
                return original(self, *args, **kwargs)
            if tensors:
                try:
                    entry = t.pending.pop(_storage_key(self), None)
                except Exception:  # noqa: BLE001 - not a tensor with storage: nothing of ours
                    entry = None
            else:
                entry = t.pending.pop(id(self), None)
                if entry is not None and entry[0] is not self:
                    entry = None
            if entry is None:
                return original(self, *args, **kwargs)
            rep = process.state.rep
            if rep is None or t.depth or _get_ident() != t.main:
                return original(self, *args, **kwargs)
            op, seq, site, info = entry[1]
            if info is not None:
                info = info[:6] + (True,)
            prev = rep.enter_collective(op, site, f"collective:{op}", seq, info, counted=False)
            t.depth = 1
            try:
                result = original(self, *args, **kwargs)
            except BaseException:
                t.depth = 0
                raise
            t.depth = 0
            rep.leave_collective(t.base if prev in _AUTO_PHASES else prev)
            return result

        wait.__name__ = what
        return wait

    return make


def _patch_functional(module) -> None:
    """torch.distributed._functional_collectives: DTensor and tensor parallel issue here."""
    for name in _FUNCTIONAL:
        if callable(getattr(module, name, None)):
            patching.patch(module, name, _collective(name, functional=True))
    patching.patch(module, "wait_tensor", _waiting("wait_tensor", tensors=True))


def _patch_fsdp(module) -> None:
    cls = getattr(module, "FullyShardedDataParallel", None)
    if cls is not None:
        patching.patch(cls, "__init__", phase_call("ddp.wrap", flush=True))
    if hasattr(module, "fully_shard") and callable(module.fully_shard):
        patching.patch(module, "fully_shard", phase_call("ddp.wrap", flush=True))


# --------------------------------------------------------------------------- data
def _patch_data(torch) -> None:
    dl = torch.utils.data.dataloader
    patching.patch(dl._BaseDataLoaderIter, "__next__", _make_next)
    patching.patch(dl._MultiProcessingDataLoaderIter, "__init__", _make_mp_iter_init)
    patching.patch(dl._MultiProcessingDataLoaderIter, "_shutdown_workers", _make_shutdown_workers)
    patching.patch(dl.DataLoader, "__init__", _make_loader_init)
    patching.patch(torch.utils.data.DistributedSampler, "set_epoch", _make_set_epoch)


def _patch_fetchers() -> None:
    """In a DataLoader worker only (the main process never pays for it): count samples and
    name the index in flight."""
    from torch.utils.data._utils import fetch

    from ups.instrument import io_hooks

    patching.patch(fetch._MapDatasetFetcher, "fetch", _make_fetch)
    patching.patch(fetch._IterableDatasetFetcher, "fetch", _make_fetch)
    patching.patch(fetch._MapDatasetFetcher, "__init__", _make_map_fetcher_init)
    io_hooks.patch_open()


class _SampleNoting:
    """Stands between a worker's fetcher and a map-style dataset: the record names the one
    index in flight (not only its batch), forgets the file the previous sample opened, and
    keeps the index whose ``__getitem__`` raised: the worker goes on to prefetch the next
    batch, which would otherwise overwrite it before the rank re-raises the error."""

    def __init__(self, dataset) -> None:
        self._ups_dataset = dataset

    def __getattr__(self, name: str):  # everything else is the dataset's own
        return getattr(self._ups_dataset, name)

    def __len__(self) -> int:
        return len(self._ups_dataset)

    def __getitem__(self, idx):
        rep = process.state.rep
        if rep is None:
            return self._ups_dataset[idx]
        from ups.instrument import io_hooks

        rep.item(f"index {idx}")
        io_hooks.forget_file(rep)
        try:
            return self._ups_dataset[idx]
        except Exception as exc:
            rep.metrics(raised_item=f"index {idx}", raised=type(exc).__name__)
            rep.flush()
            raise


def _make_map_fetcher_init(original):
    def __init__(self, dataset, *args, **kwargs):
        original(self, dataset, *args, **kwargs)
        if process.state.rep is not None and not isinstance(self.dataset, _SampleNoting):
            self.dataset = _SampleNoting(self.dataset)

    return __init__


class _BatchItem:
    """The record's ``item`` for a DataLoader iterator: ``batch 12/250 (loader 1)``, formatted by
    the heartbeat thread; the training thread only stores the count."""

    __slots__ = ("i", "loader", "n")

    def __init__(self, n, loader: int) -> None:  # int or "?"
        self.i = 0
        self.n = n
        self.loader = loader

    def __str__(self) -> str:
        return f"batch {self.i}/{self.n}" + (f" (loader {self.loader})" if self.loader else "")


def _batch_item(it) -> _BatchItem:
    try:
        n = len(it)
    except TypeError:
        n = "?"
    item = it.__dict__["_ups_item"] = _BatchItem(n, it.__dict__.get("_ups_loader", 0))
    return item


BATCH_SIZE_EVERY = 8  # batches: the size of one in eight is read, weighted by eight


def _make_next(original):
    def __next__(self):
        # On every batch of the program: the minimum here (a phase, a count, a monotonic time);
        # the item's text and the batch's size are left to the heartbeat thread or sampled.
        rep = process.state.rep
        t = _t
        if rep is None or rep.role != "rank" or _get_ident() != t.main:
            return original(self)
        outer = not t.depth
        if outer:
            prev = rep.enter("data")
        t.depth += 1
        try:
            batch = original(self)
        except StopIteration:
            t.depth -= 1
            if outer:
                rep.phase(t.base if prev in _AUTO_PHASES else prev, flush=False)
            raise
        except BaseException:
            t.depth -= 1  # the record keeps the phase it died in
            raise
        t.depth -= 1
        if t.base == "start":
            t.base = "train"
        add = 0 if t.opt_steps else 1
        if outer:
            rep.leave(t.base if prev in _AUTO_PHASES else prev, add)
        else:
            rep.auto_progress(add=add)
        n = t.batches = t.batches + 1
        item = self.__dict__.get("_ups_item") or _batch_item(self)
        item.i = self._num_yielded
        rep.current_item = item  # Reporter.item(), without the call
        if n % BATCH_SIZE_EVERY == 1:
            metrics.capture.note_batch(batch, BATCH_SIZE_EVERY if n > 1 else 1)
            if n % 64 == 1:
                _note_cuda_device()
        return batch

    return __next__


def _loader_id(loader) -> int:
    lid = loader.__dict__.get("_ups_loader")
    if lid is None:
        lid = _t.loaders
        _t.loaders += 1
        loader.__dict__["_ups_loader"] = lid
    return lid


def _make_loader_init(original):
    import inspect

    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        forced = os.environ.get(ENV_FORCE_NUM_WORKERS)
        if forced is not None and process.state.rep is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None
            if bound is not None:
                asked = bound.arguments.get("num_workers", 0)
                if asked != int(forced):
                    bound.arguments["num_workers"] = int(forced)
                    if int(forced) == 0:
                        # Options that only exist with worker processes would make DataLoader refuse.
                        for key, value in (("persistent_workers", False), ("prefetch_factor", None), ("timeout", 0),
                                           ("multiprocessing_context", None)):
                            if key in bound.arguments:
                                bound.arguments[key] = value
                    if not _t.forced_warned:
                        _t.forced_warned = True
                        print(f"ups: DataLoader num_workers={asked} forced to {forced} (relaunched with "
                              f"--num-workers {forced})", file=sys.stderr, flush=True)
                    process.state.rep.metrics(forced_num_workers=int(forced))
                original(*bound.args, **bound.kwargs)
                _loader_id(self)
                return
        original(self, *args, **kwargs)
        _loader_id(self)

    return __init__


class WorkerInit:
    """Wraps a DataLoader's ``worker_init_fn``: starts the worker's record first. Picklable, so
    spawn-context workers get it too (it is unpickled in the child from this module).

    A worker's record file is its slot's (``rank-0-worker-1``): the next epoch's worker of
    the slot takes it over. The new record carries the final state of the one before
    (``metrics.previous``), so the launcher, reading that end late on a loaded box, still
    reads a normal end as one (ups.launch.exits)."""

    def __init__(self, loader: int, rank: int, fn, owner: str | None = None) -> None:
        self.loader = loader
        self.rank = rank
        self.fn = fn
        self.owner = owner  # the record name of a process that is not a rank (its workers are its own)

    def record_name(self, worker_id: int) -> str:
        if self.owner:
            return f"{self.owner}-worker-{worker_id}" if not self.loader else \
                f"{self.owner}-loader-{self.loader}-worker-{worker_id}"
        from ups.status.schema import process_name

        return process_name("worker", self.rank, worker_id, loader=self.loader)

    def __call__(self, worker_id: int) -> None:
        if process.state.rep is None:
            try:
                name = self.record_name(worker_id)
                before = _slot_record(name)
                previous = None
                if before is not None and before.get("pid") != os.getpid():
                    previous = {k: before.get(k) for k in ("pid", "pid_start", "state", "phase", "step", "error",
                                                           "exit_code")}
                process.start_reporter("worker", worker=worker_id, loader=self.loader, rank=self.rank,
                                       name=name if self.owner else None,
                                       metrics={"previous": previous} if previous else None)
                _patch_fetchers()
            except Exception as exc:  # noqa: BLE001
                process.warn(f"no status record for DataLoader worker {worker_id} ({type(exc).__name__}: {exc})")
        if self.fn is not None:
            self.fn(worker_id)

    def ended(self, workers) -> None:  # the iterator's multiprocessing.Process list
        """In the rank, once the DataLoader has joined its workers: a worker whose record still
        says running never wrote its end (it left through ``os._exit``, or a signal killed it);
        the rank writes it, with the exit code or the signal it saw."""
        for worker_id, w in enumerate(workers):
            code = w.exitcode
            if code is not None:
                _write_worker_end(self.record_name(worker_id), w.pid, code)


def _slot_path(name: str) -> str | None:
    run_dir = os.environ.get("UPS_RUN_DIR")
    return os.path.join(run_dir, "status", f"{name}.json") if run_dir else None


def _slot_record(name: str) -> dict | None:
    """The record now in a worker slot's file, as a plain dict (None: none, or unreadable)."""
    path = _slot_path(name)
    if path is None:
        return None
    from ups.status.safeio import BadFile, read_json  # the runs folder is outside input

    try:
        data = read_json(path)
    except (BadFile, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_worker_end(name: str, pid: int, code: int) -> None:
    data = _slot_record(name)
    path = _slot_path(name)
    if data is None or path is None or data.get("pid") != pid or data.get("state") != "running":
        return  # it wrote its own end, or the file is another process's now
    import json

    from ups.status.confined import make_dirs, write_atomic_at

    if code == 0:
        data.update(state="done", phase="done", exit_code=0)
    else:
        import signal

        try:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        except ValueError:
            how = f"killed by signal {-code}"
        data.update(state="failed", exit_code=code, error=f"DataLoader worker {how}",
                    error_site="as its rank's DataLoader saw it")
    try:
        # status/ opened O_NOFOLLOW under the run folder and the record renamed into it: never
        # through a link (docs/safety.md), like the Reporter's own writes.
        folder = make_dirs(os.environ["UPS_RUN_DIR"], "status")
        try:
            write_atomic_at(folder, os.path.basename(path), json.dumps(data).encode())
        finally:
            os.close(folder)
    except OSError:
        pass


def _make_shutdown_workers(original):
    def _shutdown_workers(self):
        first = not getattr(self, "_shutdown", True)
        try:
            return original(self)
        finally:
            init = getattr(self, "_ups_worker_init", None)
            if first and init is not None:
                try:
                    init.ended(getattr(self, "_workers", ()))
                except Exception:  # noqa: BLE001 - noting the ends must never cost the program
                    pass

    return _shutdown_workers


def _make_mp_iter_init(original):
    def __init__(self, loader, *args, **kwargs):
        rep = process.state.rep
        if rep is None:
            return original(self, loader, *args, **kwargs)
        lid = _loader_id(loader)
        self._ups_loader = lid
        user_fn = loader.worker_init_fn
        init = WorkerInit(lid, rep.rank or 0, user_fn, None if rep.role == "rank" else rep.name)
        self._ups_worker_init = init
        loader.worker_init_fn = init
        try:
            original(self, loader, *args, **kwargs)
        finally:
            loader.worker_init_fn = user_fn

    return __init__


def _describe_index(index) -> str:
    if isinstance(index, list | tuple):
        if not index:
            return "index []"
        first, last = index[0], index[-1]
        if first is None:
            return f"batch of {len(index)}"
        if len(index) == 1:
            return f"index {first}"
        if isinstance(first, int) and isinstance(last, int) and last - first == len(index) - 1:
            return f"index {first}-{last}"
        return f"index {first} (+{len(index) - 1} more)"
    return "next item" if index is None else f"index {index}"


def _make_fetch(original):
    def fetch(self, possibly_batched_index):
        rep = process.state.rep
        if rep is None:
            return original(self, possibly_batched_index)
        rep.item(_describe_index(possibly_batched_index))
        # Written before the dataset is touched: a read that blocks holding the GIL (h5py on a
        # hung mount) stops the heartbeat thread too, and the record must already say what
        # (waiting out a heartbeat write in progress, which could not write it again after).
        rep.phase("fetch", flush=False)
        rep.flush(wait=0.25)
        data = original(self, possibly_batched_index)
        rep.auto_progress(add=len(possibly_batched_index) if isinstance(possibly_batched_index, list | tuple) else 1)
        rep.phase("idle", flush=False)
        return data

    return fetch


def _make_set_epoch(original):
    def set_epoch(self, epoch):
        original(self, epoch)
        rep = rank_reporter()
        if rep is not None:
            rep.metrics(epoch=epoch)

    return set_epoch


# -------------------------------------------------------------------------- optim
def _patch_optim(torch) -> None:
    from torch.optim.optimizer import (
        _global_optimizer_post_hooks,
        register_optimizer_step_post_hook,
    )

    if not any(getattr(h, "__ups_hook__", False) for h in _global_optimizer_post_hooks.values()):
        register_optimizer_step_post_hook(_on_optimizer_step)


def _on_optimizer_step(optimizer, args, kwargs) -> None:
    rep = process.state.rep  # on every optimizer step: _rank_reporter inlined
    t = _t
    if rep is None or rep.role != "rank" or _get_ident() != t.main:
        return
    key = id(optimizer)
    count = t.opt_counts.get(key, 0) + 1
    t.opt_counts[key] = count
    if count == 1:
        metrics.capture.note_optimizer(optimizer)  # its lr is read by the heartbeat thread
    if count > t.opt_steps:  # several optimizers (a GAN) step once each per iteration
        if t.opt_steps == 0 and t.cuda_dev is None:
            _note_cuda_device()
        t.opt_steps = count
        rep.auto_step(count)
    else:
        rep.auto_progress()
    if t.base != "train":
        _set_base(rep, "train")


_on_optimizer_step.__ups_hook__ = True  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- save/load
def _patch_module_modes(torch) -> None:
    def make(original):
        def train(self, mode=True):
            result = original(self, mode)
            if _t.opt_steps:
                rep = rank_reporter()
                if rep is not None:
                    _set_base(rep, "train" if mode else "eval")
            return result

        return train

    patching.patch(torch.nn.Module, "train", make)


# ------------------------------------------------------------------------ metrics
def _steps_done(rep) -> int:
    """Optimizer steps done before now: the 0-based index of the step in progress (the job's
    own count when it reports one, e.g. after resuming)."""
    return rep.step if rep.explicit_progress else _t.opt_steps


def _patch_metrics(torch) -> None:
    """Loss (what backward() is called on), grad norm (clip_grad_norm_'s return) and the
    loss under AMP (GradScaler.scale's input): references only, see ups.instrument.metrics."""
    Tensor = torch.Tensor

    def make_backward(original):
        def backward(tensors, *args, **kwargs):
            # On every backward: _rank_reporter and _steps_done inlined.
            rep = process.state.rep
            t = _t
            if rep is not None and rep.role == "rank" and _get_ident() == t.main:
                loss = tensors if isinstance(tensors, Tensor) else (
                    tensors[0] if isinstance(tensors, list | tuple) and len(tensors) == 1 else None)
                if loss is not None:
                    try:
                        metrics.capture.note_loss(loss, rep.step if rep.explicit_progress else t.opt_steps)
                    except Exception:  # noqa: BLE001 - never in the program's way
                        pass
            return original(tensors, *args, **kwargs)

        return backward

    patching.patch(torch.autograd, "backward", make_backward)

    def make_clip(original):
        def clip_grad_norm_(*args, **kwargs):
            norm = original(*args, **kwargs)
            rep = rank_reporter()
            if rep is not None:
                try:
                    metrics.capture.note_grad_norm(norm, _steps_done(rep))
                except Exception:  # noqa: BLE001
                    pass
            return norm

        return clip_grad_norm_

    utils = torch.nn.utils
    original_clip = getattr(utils, "clip_grad_norm_", None)
    patching.patch(utils.clip_grad, "clip_grad_norm_", make_clip)
    if original_clip is not None and original_clip is not utils.clip_grad.clip_grad_norm_:
        wrapper = utils.clip_grad.clip_grad_norm_
        utils.clip_grad_norm_ = wrapper  # torch.nn.utils re-exports it
        patching.PATCHED.append((utils, "clip_grad_norm_", original_clip, wrapper))

    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is not None:
        def make_scale(original):
            def scale(self, outputs):
                result = original(self, outputs)
                if isinstance(outputs, Tensor) and _get_ident() == _t.main:
                    metrics.capture.scaled = (result, outputs)
                return result

            return scale

        patching.patch(scaler, "scale", make_scale)
