"""The names of other programs' things that ups compares against, in one place: torch.distributed's
collectives (the ops the hooks wrap, a record's ``collective.op``, a frame that is in one, the
exporter's ``op`` label).

Light on purpose: every instrumented process imports it (no typing, no dataclasses).
"""

from __future__ import annotations

# -- collectives ---------------------------------------------------------------------------------
# torch.distributed's (c10d's) collectives, each wrapped by ups.instrument.torch.collectives under
# its own name, which a record's ``collective.op`` then carries.
C10D_COLLECTIVES = (
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
# DTensor clip_grad_norm_): issued there, waited in wait_tensor when the result is first used.
FUNCTIONAL_COLLECTIVES = (
    "all_reduce", "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
    "all_to_all_single", "broadcast", "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
)
COLLECTIVE_OPS = frozenset(C10D_COLLECTIVES + FUNCTIONAL_COLLECTIVES)
"""Every op a record's collective may name, and every function a stack is in a collective in."""
COLLECTIVE_WAITS = frozenset(("wait", "wait_tensor"))
"""Where an async collective is waited: ``Work.wait`` and the functional collectives' ``wait_tensor``."""
