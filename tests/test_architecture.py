"""The architecture as contracts (docs/architecture.md), checked here rather than hoped for.

1. Layers: each imports only those below it, ``status < runs < why < launch < jobs < cli,
   console`` (gpu and instrument beside status), and no two files import each other at any
   depth: import-linter's contracts in pyproject.toml, function-level imports included.
2. No module uses another module's private names: neither ``from x import _name`` nor
   ``x._name`` of a module, nor ``obj._attr`` of a private attribute that another module of
   ``ups`` defines (tests and scripts included: they use the public functions too).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("ups", "console")
# The standard library's private names that are its public API (os._exit, sys._getframe ...).
STDLIB_PRIVATE = {"_exit", "_getframe", "_replace", "_asdict", "_fields", "_make", "_current_frames"}


def test_the_layers_and_no_circle_across_files():
    """import-linter's contracts (pyproject.toml [tool.importlinter]); what breaks one is
    printed: `lint-imports` shows the same."""
    from importlinter.application.use_cases import lint_imports
    from importlinter.configuration import configure

    configure()
    kept = lint_imports(config_filename=str(REPO / "pyproject.toml"), cache_dir=None, no_logo=True)
    assert kept, "an import-linter contract is broken (the imports are printed above; `lint-imports` shows them)"


def _modules() -> dict[str, Path]:
    out = {}
    for base in ROOTS:
        for path in (REPO / base).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_private(tree: ast.AST) -> set[str]:
    """Private names a file defines: functions, classes, module names, ``self._x`` attributes."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(n.name):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and _private(n.id):
            names.add(n.id)
        elif isinstance(n, ast.arg) and _private(n.arg):
            names.add(n.arg)
        elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _private(n.attr)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            names.add(n.attr)
    return names


def private_name_uses(extra: tuple[Path, ...] = ()) -> list[str]:
    """Every use of another module's private name, as ``file:line what`` (``extra``: more files
    to read as ours, outside the tree)."""
    modules = _modules()
    files = list(modules.values()) + sorted((REPO / "tests").glob("*.py")) + sorted((REPO / "scripts").glob("*.py")) \
        + list(extra)
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    own = {p: _defined_private(t) for p, t in trees.items()}
    ours = set().union(*(own[p] for p in modules.values()))
    found = []
    for path, tree in trees.items():
        me = next((m for m, p in modules.items() if p == path), None)
        package = (me if path.name == "__init__.py" else (me or "").rpartition(".")[0]) if me else ""
        aliases: dict[str, str] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = package.split(".")[: len(package.split(".")) - n.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                if base.split(".")[0] not in ROOTS:
                    continue
                for a in n.names:
                    full = f"{base}.{a.name}"
                    if full in modules:
                        aliases[a.asname or a.name] = full
                    if _private(a.name) and base != me:
                        found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{n.lineno} imports {a.name} from {base}")
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.split(".")[0] in ROOTS and a.asname:
                        aliases[a.asname] = a.name
        for n in ast.walk(tree):
            if not isinstance(n, ast.Attribute) or not _private(n.attr) or n.attr in STDLIB_PRIVATE:
                continue
            if isinstance(n.value, ast.Name) and n.value.id in aliases and aliases[n.value.id] != me:
                found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{n.lineno} uses {aliases[n.value.id]}.{n.attr}")
            elif (n.attr in ours and n.attr not in own[path]
                  and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
                found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{n.lineno} uses .{n.attr}, private to another module of ups")
    return found


def test_no_module_uses_another_modules_private_names():
    # the check's own probe (written and removed by the test below, maybe at the same time
    # under pytest -n) is not the code base's
    assert [line for line in private_name_uses() if not line.startswith("tests/_probe_private_names.py")] == []


def test_the_private_name_check_finds_what_it_must(tmp_path):
    """The check itself: each form it must catch, caught (a check that cannot fail proves nothing)."""
    import textwrap

    # Outside the tree (tmp_path): a probe in tests/ was seen by the checks running beside it
    # under xdist (this one and ruff's read the whole tree).
    probe = tmp_path / "_probe_private_names.py"
    probe.write_text(textwrap.dedent("""
        from ups.runs.view import _disk_full_verdicts
        from ups.gpu import nvml as n
        n._init()
        def f(rep):
            return rep._gpu_sampler
    """))
    found = [line for line in private_name_uses((probe,)) if "_probe_private_names" in line]
    assert any("imports _disk_full_verdicts from ups.runs.view" in f for f in found), found
    assert any("uses ups.gpu.nvml._init" in f for f in found), found
    assert any("uses ._gpu_sampler" in f for f in found), found


def _ruff() -> str:
    exe = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert exe, "ruff is not installed (it is in the test extra: pip install -e '.[test]')"
    return exe


def test_ruff_is_clean_with_the_checked_in_configuration():
    """ruff with pyproject.toml's [tool.ruff] (the same `ruff check` a developer runs): unused
    imports (F401), import order (I), a blind `except Exception` without its reason (BLE001),
    a heavy module imported at module level on the CLI's path (TID253), and a `noqa` that
    silences nothing (RUF100) all fail here, not only in someone's editor."""
    # the private-name check's probe (written and removed by its test, maybe at the same time
    # under pytest -n) is not the code base's
    res = subprocess.run([_ruff(), "check", "--no-cache", "--extend-exclude", "tests/_probe_private_names.py",
                          "ups", "console", "tests", "scripts"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_ruff_check_finds_what_it_must(tmp_path):
    """The check above can fail: an unused noqa and an unused import are findings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = 1  # noqa: E501\n")
    res = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "F401" in res.stdout and "RUF100" in res.stdout, res.stdout


FILE_MAX, CLASS_MAX = 600, 300
SAYS_WHY = "longer than 600 lines because"


def test_rooms_of_one_idea_no_file_over_600_lines_no_class_over_300():
    """A file past ~600 lines or a class past ~300 usually holds two ideas (docs/architecture.md):
    no file in ups/ or console/ is longer, unless its first lines say why; no class is longer."""
    long_files, long_classes = [], []
    for base in ROOTS:
        for path in sorted((REPO / base).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(REPO)
            if text.count("\n") > FILE_MAX and SAYS_WHY not in "\n".join(text.splitlines()[:12]):
                long_files.append(f"{rel}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_MAX:
                    long_classes.append(f"{rel}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert not long_files, "files over 600 lines that do not say why in their first lines:\n" + "\n".join(long_files)
    assert not long_classes, "classes over 300 lines:\n" + "\n".join(long_classes)


# What the console may import of ups: its two fronts, and what only draws or names an error.
CONSOLE_FRONTS = {
    "ups.runs": "reading a run (the package's front, never its modules)",
    "ups.actions": "every request: kill, stacks, fallback, adopt, relaunch, attach, the doctor",
    "ups.why": "the verdict on a view (its package's front: diagnose_view, Verdict)",
    "ups.format": "numbers and ages as text",
    "ups.plot": "charts as text",
    "ups.errors": "the error a request raises",
}


def _ups_imports(tree: ast.AST) -> set[str]:
    """The ups modules a file imports, at any depth (function-level imports included)."""
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            found.add(n.module)
        elif isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
    return {m for m in found if m == "ups" or m.startswith("ups.")}


def test_the_console_reaches_the_layers_through_its_fronts_only():
    """The console reads through ``ups.runs`` and acts through ``ups.actions`` (as nvitop's TUI
    imports only ``nvitop.api``): no screen reaches past them into a layer's modules."""
    stray = []
    for path in sorted((REPO / "console").rglob("*.py")):
        for module in sorted(_ups_imports(ast.parse(path.read_text(encoding="utf-8")))):
            if module not in CONSOLE_FRONTS:
                stray.append(f"{path.relative_to(REPO)} imports {module}")
    assert not stray, "the console imports past its fronts (ups.runs, ups.actions):\n" + "\n".join(stray)
    # the check can fail: a deep module, another layer, a plain import are all found
    probe = ast.parse("from ups.runs.view import RunView\nimport ups.launch.relaunch\nfrom ups.runs import open_run\n"
                      "def f():\n    from ups.gpu import get_provider\n")
    assert _ups_imports(probe) - set(CONSOLE_FRONTS) == {"ups.runs.view", "ups.launch.relaunch", "ups.gpu"}
