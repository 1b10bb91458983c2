"""The names of other programs' things that ups compares against, in one place: torch.distributed's
collectives (the ops the hooks wrap, a record's ``collective.op``, a frame that is in one, the
exporter's ``op`` label) and what a library's file is (never "the program's own code", in a
record's error site, a stack's own frame or a log's traceback).

Light on purpose: every instrumented process imports it (no typing, no dataclasses).
"""

from __future__ import annotations

import os
import re

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

# -- library files -------------------------------------------------------------------------------
# Installed packages, the standard library (a venv's, a distribution's, Windows'), eggs, torch
# (a source build is not in site-packages), frozen modules, and ups's own machinery in a rank.
_LIBRARY = re.compile(
    r"site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]Lib[/\\]|\\[Ll]ib\\|\.egg[/\\]|[/\\]torch[/\\]|^/usr/lib/"
    r"|[/\\]python\d\.\d+[/\\]|(?:^|[/\\])runpy\.py$|(?:^|[/\\])threading\.py$"
    r"|[/\\]ups[/\\](?:instrument|status|launch)[/\\]"
    # a C frame's shared object (py-spy --native: libc.so.6, libpython3.11.so.1.0, libtorch_cpu.so)
    r"|\.so(?:\.\d+)*$")
# Code with no file: ``<frozen runpy>``, torch.fx's ``<eval_with_key>.3``, ``<decorator-gen-12>``
# are libraries'; the program's own has these names (``python -c``, stdin, a notebook's cell).
_OWN_PSEUDO_FILES = re.compile(r"<(?:string|stdin|console|input|ipython-input-[^>]*)>$|^Cell In\[\d+\]")


def is_library_file(filename: str) -> bool:
    """A frame in this file is a library's, never "the program's own code"."""
    if filename.startswith("<"):
        return not _OWN_PSEUDO_FILES.match(filename)
    return _LIBRARY.search(filename) is not None


def is_stdlib_file(filename: str) -> bool:
    """The standard library's file (not an installed package's)."""
    return ("site-packages" not in filename and "dist-packages" not in filename
            and (os.sep + "lib" + os.sep + "python3") in filename)
