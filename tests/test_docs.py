"""The documentation stays true: the command reference is what the CLI says, the README stays
a short page for users whose test command is the CI's, and no link points at nothing."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


@functools.cache
def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_command_reference_is_what_the_cli_says():
    gen = _generator()
    current = gen.TARGET.read_text(encoding="utf-8") if gen.TARGET.exists() else ""
    assert current == gen.render(), (
        f"docs/commands.md is stale (a command, option or help text changed): run `{gen.REGENERATE}`"
    )


def test_the_generator_does_not_depend_on_the_terminal(monkeypatch):
    gen = _generator()
    first = gen.render()
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("FORCE_COLOR", "1")
    second = gen.render()
    assert first == second
    assert "\x1b" not in first and "\b" not in first


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _fenced_lines(text: str) -> list[str]:
    """The non-empty lines inside ``` fences, in order."""
    lines = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        lines += [line for line in block.splitlines() if line.strip()]
    return lines


def test_readme_is_short_and_its_test_command_is_the_ci_s():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    assert lines <= 200, f"README.md has {lines} lines (at most 200: the rest belongs in docs/)"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_command = [line for line in ci if line.strip() and not line.lstrip().startswith("#")][-1]
    commands = _fenced_lines(_section(text, "Quickstart"))
    assert len(commands) >= 2, "the Quickstart shows the demo command, then the test command"
    assert commands[1] == ci_command, "the Quickstart's second command must be .ci/run's, exactly"


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """The text without code blocks and code spans, which hold no links or headings."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_links(text: str) -> list[str]:
    """Links to files of this repository (a URL, mailto: or a same-page anchor is no file)."""
    return [target for target in LINK.findall(_prose(text))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("#")]


def _anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_points_at_a_file_and_heading():
    pages = [README, *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for target in _relative_links(page.read_text(encoding="utf-8")):
            path, _, anchor = target.partition("#")
            file = page.parent / path
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{page.relative_to(REPO)} -> {target} (no such heading)")
    assert not broken, "links to nothing: " + ", ".join(broken)


def test_the_link_check_reads_links_as_github_does():
    text = "[a](docs/x.md#y) [b](https://e.org) [c](#z) `[d](e.md)` [e](f.md \"title\")"
    assert _relative_links(text) == ["docs/x.md#y", "f.md"]
    assert _anchors("# `ups why --json`\n## Several nodes, launcher by launcher\n```\n# no\n```") == {
        "ups-why---json", "several-nodes-launcher-by-launcher"}


def test_the_code_cites_only_files_the_repository_holds():
    """A docstring or comment that sends the reader to a page ("docs/design.md, 'Trust
    boundary'") names a file of this repository, and a section of it that exists: someone who
    clones the project can follow every one."""
    cited = re.compile(r"\b((?:docs/)?[\w./-]+\.md)\b(?:,\s*\"([^\"]+)\")?")
    missing = []
    for path in sorted([*REPO.glob("ups/**/*.py"), *REPO.glob("console/**/*.py"), *REPO.glob("scripts/*.py")]):
        text = path.read_text(encoding="utf-8")
        for m in cited.finditer(text):
            name, section = m.group(1), m.group(2)
            target = REPO / name if "/" in name else REPO / "docs" / name
            if name.startswith(("http", "www")) or not (target.exists() or (REPO / name).exists()):
                missing.append(f"{path.relative_to(REPO)}: {name}")
                continue
            if section:
                heads = [h.strip("# ").strip().lower() for h in target.read_text(encoding="utf-8").splitlines()
                         if h.startswith("#")]
                if not any(h.startswith(section.lower().replace("\n", " ")) for h in heads):
                    missing.append(f"{path.relative_to(REPO)}: {name}, section {section!r}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)
