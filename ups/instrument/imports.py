"""Post-import hooks: run a function once a module has been imported (``wrapt``'s idea).

``when_imported("torch", patch)`` runs ``patch(torch)`` right after ``import torch`` has
finished executing, or at once if torch is already imported. A program that never imports
torch never pays for patching it. The finder sits first on ``sys.meta_path`` and costs one
dict lookup per import.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_finder_installed = False


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _run(hook, module)
        return
    _hooks.setdefault(name, []).append(hook)
    _install()


def _run(hook: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # noqa: BLE001 - a failed patch must not break the import
        from ups.instrument.process import warn

        warn(f"could not instrument {module.__name__} ({type(exc).__name__}: {exc})")


class _Loader:
    """Wraps the real loader: executes the module, then runs its hooks."""

    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for hook in _hooks.pop(self._name, []):
            _run(hook, module)

    def __getattr__(self, attr):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self._loader, attr)


class _Finder:
    def find_spec(self, name, path, target=None):
        if name not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


def _install() -> None:
    global _finder_installed
    if not _finder_installed:
        sys.meta_path.insert(0, _Finder())
        _finder_installed = True
