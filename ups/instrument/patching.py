"""Replacing a library's function by ours, once, keeping the original at hand.

Every hook of the instrumentation (torch, h5py, open(), the logging libraries) patches through
:func:`patch`: a function already wrapped is never wrapped twice (a module imported again, a
hook installed twice), the wrapper looks like the original to the program (its name, its
docstring, ``__wrapped__``), and :data:`PATCHED` keeps every original so that the cost of the
instrumentation can be measured with and without it in one process.
"""

from __future__ import annotations


def wrapped(original, wrapper):
    wrapper.__wrapped__ = original
    wrapper.__ups_wrapped__ = original
    for attr in ("__name__", "__qualname__", "__doc__"):
        try:
            setattr(wrapper, attr, getattr(original, attr))
        except (AttributeError, TypeError):
            pass
    return wrapper


PATCHED: list[tuple[object, str, object, object]] = []  # owner, name, original, wrapper


def patch(owner, name: str, make) -> None:
    """Replace ``owner.name`` by ``make(original)``, once."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__ups_wrapped__", None) is not None:
        return
    wrapper = wrapped(original, make(original))
    setattr(owner, name, wrapper)
    PATCHED.append((owner, name, original, wrapper))
