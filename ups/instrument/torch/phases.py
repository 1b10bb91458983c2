"""Phases: a wrapped call puts the rank's record in a phase for its duration (``dist.init``,
``ddp.wrap``, ``checkpoint``, ``load``, ``collective:<op>``, ``data``) and restores the one it
found; ``train`` and ``eval`` are the base the automatic phases return to. Every family of
hooks enters and leaves its phases through here; the nesting is :data:`state.track`'s.
"""

from __future__ import annotations

from ups.instrument.torch.state import rank_reporter, track

AUTO_PHASES = frozenset(("start", "train", "eval"))


def enter_phase(rep, name: str, *, flush: bool = False) -> str | None:
    """Enter a phase for the duration of a wrapped call; the outermost wrapped call wins."""
    t = track
    t.depth += 1
    if t.depth > 1:
        return None
    prev = rep.current_phase
    rep.phase(name, flush=flush)
    return prev


def leave_phase(rep, prev: str | None, *, failed: bool = False) -> None:
    """Back to the phase the call found; a call that raised keeps its phase, so a process
    that dies of the exception says where (``collective:all_reduce``, ``checkpoint``)."""
    t = track
    t.depth -= 1
    if t.depth == 0 and prev is not None and not failed:
        rep.phase(t.base if prev in AUTO_PHASES else prev, flush=False)


def set_base(rep, name: str) -> None:
    t = track
    if t.base != name:
        t.base = name
        if t.depth == 0 and rep.current_phase in AUTO_PHASES:
            rep.phase(name, flush=False)


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
