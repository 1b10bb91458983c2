"""A front whose names load on first use (PEP 562): ``ups.runs`` (what a reader reads) and
``ups.actions`` (what a front end asks for) name what lives in deeper modules, and importing
the front costs nothing until a name is used (``ups --help`` stays fast)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_front(module: str, names: dict[str, str], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the front ``module``: ``names`` maps each name to
    the module that defines it; a name is loaded once, into ``namespace`` (the front's globals)."""

    def getattr_(name: str) -> Any:
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value  # loaded once
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *names})

    return getattr_, dir_
