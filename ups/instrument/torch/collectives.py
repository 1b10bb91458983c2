"""``torch.distributed``: the process group's start and every collective the rank waits in.

- ``init_process_group`` is the phase ``dist.init``, and the group it joined says which
  rank the process is (whatever started it: torchrun, Lightning re-executing the script,
  ``mp.spawn``, srun); ``DistributedDataParallel(...)`` and FSDP's wrapping are ``ddp.wrap``.
- ``torch.multiprocessing.spawn``: the calling process starts the ranks and is not one.
- A blocking collective is the phase ``collective:<op>``; an async one (``Work.wait``) and a
  functional one (``wait_tensor``: DTensor, tensor parallel) while it is waited. The record's
  ``collective`` says the op, its sequence number in its group (p2p per direction and peer),
  the group (name, description, global ranks), the program's call site, the framework
  context ("FSDP unshard of layers.3") and whether the call site is new.

A new framework that issues collectives for the program is named here
(``_FRAMEWORK_FILES``, ``_context``).
"""

from __future__ import annotations

import os
import sys

from ups.instrument import flight, patching, process
from ups.instrument.torch.phases import AUTO_PHASES, phase_call
from ups.instrument.torch.state import get_ident, track
from ups.status.vocabulary import C10D_COLLECTIVES, FUNCTIONAL_COLLECTIVES, is_library_file

PENDING_KEPT = 64  # async works issued and not yet waited (bounded: a program that never waits; each keeps its buffers alive)


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


# -------------------------------------------------------------------- distributed
def patch_distributed(torch) -> None:
    dist = torch.distributed
    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    init = phase_call("dist.init", flush=True)

    def make_init(original):
        inner = init(original)

        def wrapper(*args, **kwargs):
            result = inner(*args, **kwargs)
            if get_ident() == track.main and dist.is_initialized():
                # Whatever started this process (torchrun, Lightning re-executing the script,
                # mp.spawn, srun), the group it joined says which rank it is.
                process.become_rank(dist.get_rank(), dist.get_world_size())
                flight.watch(process.state.rep)  # Flight Recorder dumps, when the program has it on
            return result

        return wrapper

    work_type = getattr(getattr(torch._C, "_distributed_c10d", None), "Work", None)
    collectives = ((op, _collective(op, work_type)) for op in C10D_COLLECTIVES)
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


def patch_spawn(torch) -> None:
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
    t = track
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
        seen = track.seen
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
    pending = track.pending
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
            # On every collective of the program: rank_reporter, enter_phase and leave_phase inlined.
            rep = process.state.rep
            t = track
            if rep is None or t.depth or rep.role != "rank" or get_ident() != t.main:
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
            rep.leave_collective(t.base if prev in AUTO_PHASES else prev)
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
            t = track
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
            if rep is None or t.depth or get_ident() != t.main:
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
            rep.leave_collective(t.base if prev in AUTO_PHASES else prev)
            return result

        wait.__name__ = what
        return wait

    return make


def patch_functional(module) -> None:
    """torch.distributed._functional_collectives: DTensor and tensor parallel issue here."""
    for name in FUNCTIONAL_COLLECTIVES:
        if callable(getattr(module, name, None)):
            patching.patch(module, name, _collective(name, functional=True))
    patching.patch(module, "wait_tensor", _waiting("wait_tensor", tensors=True))


def patch_fsdp(module) -> None:
    cls = getattr(module, "FullyShardedDataParallel", None)
    if cls is not None:
        patching.patch(cls, "__init__", phase_call("ddp.wrap", flush=True))
    if hasattr(module, "fully_shard") and callable(module.fully_shard):
        patching.patch(module, "fully_shard", phase_call("ddp.wrap", flush=True))
