"""Write docs/commands.md, the command reference, from the CLI itself, so it cannot drift.

    python scripts/gen_cli_docs.py           # rewrite docs/commands.md
    python scripts/gen_cli_docs.py --check   # exit 1, in one line, when docs/commands.md is stale

It walks the Click command tree that Typer builds from ``ups.cli.app.app`` and writes, for
every command and sub-command, its usage line, its help text and each option and argument
with its help, default, environment variable and whether it is required. The output depends
only on the code: commands are sorted by name, nothing is wrapped to a terminal width and no
colour or markup is produced. ``tests/test_docs.py`` compares the file with this output.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "docs" / "commands.md"
REGENERATE = "python scripts/gen_cli_docs.py"
WIDTH = 100  # a fixed width for every context built here: nothing depends on the terminal

if str(REPO) not in sys.path:  # document this checkout's `ups`, not an installed one
    sys.path.insert(0, str(REPO))


def _escape(text: str) -> str:
    """Markdown-escape prose (outside `code spans`): the help texts are plain text."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:  # a code span, kept as written
            out.append(part)
            continue
        part = re.sub(r"([\\*<>\[\]])", r"\\\1", part)
        # An underscore between two word characters never starts emphasis: leave
        # num_workers alone, escape the rest.
        part = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", part)
        out.append(part)
    return "".join(out)


def _escape_line(line: str) -> str:
    """A prose line that Markdown would read as a list item, a heading or a rule is escaped."""
    line = _escape(line)
    if re.match(r"[-+#](\s|$)|[-=]+$", line):
        return "\\" + line
    return re.sub(r"^(\d+)([.)])(?=\s|$)", r"\1\\\2", line)


def _code(text: str) -> str:
    """`text` as one code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _help_blocks(help_text: str) -> list[str]:
    """A command's help as Markdown blocks: prose paragraphs, and click's ``\\b`` (no-rewrap)
    paragraphs as code blocks."""
    help_text = help_text.split("\f", 1)[0]  # click hides what follows a form feed
    blocks = []
    for para in re.split(r"\n\s*\n", help_text.strip()):
        if para.startswith("\b"):
            body = textwrap.dedent(para[1:].strip("\n")).rstrip()
            blocks.append(f"```\n{body}\n```")
        else:
            blocks.append("\n".join(_escape_line(line.strip()) for line in para.splitlines()))
    return [b for b in blocks if b.strip()]


def _first_sentence(help_text: str) -> str:
    para = re.split(r"\n\s*\n", help_text.split("\f", 1)[0].strip(), maxsplit=1)[0]
    para = " ".join(para.split())
    match = re.match(r"(.+?\.)(\s|$)", para)
    return match.group(1) if match else para


def _param_line(param, ctx) -> str | None:
    """One list item: names and metavar, help, then default / env var / required as
    ``--help`` shows them."""
    record = param.get_help_record(ctx)
    if record is None:  # hidden
        return None
    names, shown = record
    help_text = getattr(param, "help", None) or ""
    extras: list[str] = []
    tail = shown[len(help_text):].strip() if shown.startswith(help_text) else ""
    if tail.startswith("[") and tail.endswith("]"):
        for item in tail[1:-1].split("; "):
            key, sep, value = item.partition(": ")
            extras.append(f"{key}: {_code(value)}" if sep else key)
    line = f"- {_code(names)}"
    if help_text:
        line += ": " + _escape(" ".join(help_text.split()))
    if extras:
        line += f" ({'; '.join(extras)})"
    return line


def _walk(command, name: str, parent=None):
    """(context, command) for the command and every sub-command below it, sorted by name."""
    ctx = command.context_class(
        command, info_name=name, parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
    )
    yield ctx, command
    if hasattr(command, "list_commands"):  # a group (click's or typer's vendored click)
        for sub_name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, sub_name, ctx)


def _section(ctx, command) -> str:
    path = ctx.command_path
    out = [f"## {_code(path)}", ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    out += ["```", usage, "```", ""]
    for block in _help_blocks(command.help or ""):
        out += [block, ""]
    params = [p for p in command.get_params(ctx) if p.name != "help"]
    arguments = [line for p in params if p.param_type_name == "argument"
                 if (line := _param_line(p, ctx))]
    options = [line for p in params if p.param_type_name != "argument"
               if (line := _param_line(p, ctx))]
    if arguments:
        out += ["Arguments:", "", *arguments, ""]
    if options:
        out += ["Options:", "", *options, ""]
    if hasattr(command, "list_commands"):
        subs = sorted(command.list_commands(ctx))
        out += ["Commands: " + ", ".join(
            f"[{_code(f'{path} {s}')}](#{_anchor(f'{path} {s}')})" for s in subs), ""]
    return "\n".join(out)


def _anchor(path: str) -> str:
    """GitHub's anchor for a heading that reads `path`."""
    return re.sub(r"[^a-z0-9 -]", "", path.lower()).replace(" ", "-")


def render() -> str:
    """docs/commands.md as the CLI makes it now."""
    import typer

    from ups.cli.app import app

    root = typer.main.get_command(app)
    entries = list(_walk(root, "ups"))
    out = [
        "# Command reference",
        "",
        f"<!-- Generated from the CLI by scripts/gen_cli_docs.py: do not edit; run `{REGENERATE}`. -->",
        "",
        "Every `ups` command, sub-command and option, generated from the command line itself "
        f"(`{REGENERATE}`), so it says what `ups ... --help` says. Every command also takes "
        "`-h` / `--help`. A run is named by its id, a unique prefix of it, or the path of its "
        "folder; the runs folder is `./runs` unless `--runs-dir` or `UPS_RUNS_DIR` says otherwise.",
        "",
        "| command | what for |",
        "| --- | --- |",
    ]
    for ctx, command in entries:
        path = ctx.command_path
        summary = _escape(_first_sentence(command.help or "")).replace("|", "\\|")
        out.append(f"| [{_code(path)}](#{_anchor(path)}) | {summary} |")
    out.append("")
    for ctx, command in entries:
        out.append(_section(ctx, command))
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/commands.md differs from what the CLI gives")
    args = parser.parse_args(argv)
    text = render()
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else None
    if args.check:
        if current != text:
            print(f"docs/commands.md is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        TARGET.write_text(text, encoding="utf-8")
        print(f"wrote {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
