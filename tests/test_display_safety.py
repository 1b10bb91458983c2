"""What another user writes into a runs folder never acts on the terminal that shows it.

A run planted in a shared (1777) runs folder can carry terminal escapes in any string: its
name, a record's phase or error, an event, a stack dump, a log. Shown raw, an OSC sequence
retitles the window or sets the clipboard (OSC 52), ``ESC [2J`` clears the screen, a carriage
return rewrites a line, Rich markup (``[link=…]``) becomes a live link. Every read command
must print such text as text: control characters visible (``\\x1b``) or, in a program's own
log, removed except its colours.

The property test writes arbitrary text (every control character, escape sequences, markup)
into every string field of a record and of run.json, into an event, a stack dump, a log, and
a status file's name, then runs every read command's real code in-process and checks that
no control character (C0 but tab and newline, DEL, C1, bidi overrides) reaches its output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_ups

from ups.runs.rundir import RunDir

HOSTILE = [
    "\x1b]0;pwned title\x07", "\x1b[2J\x1b[H", "\x1b]52;c;ZXZpbA==\x07", "\x9b2J", "\x9d0;t\x9c", "over\rwrite",
    "back\x08\x08space", "\x1b[31mred\x1b[0m", "\x1bP+q\x1b\\", "\u202egnp.exe", "a\u2028b", "bell\x07", "nul\x00",
    "[link=http://evil.example]click[/link]", "[/]", "[bold red]x[/]", ":smile:", "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
]
# What must never reach a terminal: C0 controls but tab and newline, DEL, C1, bidi controls
# and Unicode line separators.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
SGR = re.compile(r"\x1b\[[0-9;:]*m")


def unsafe_in(text: str, *, allow_sgr: bool = False) -> list[str]:
    if allow_sgr:
        text = SGR.sub("", text)
    return [repr(m.group()) for m in UNSAFE.finditer(text)]


_COMMAND = None


def read_commands(run_id: str) -> list[tuple[list[str], bool]]:
    """Every command that reads a run, and whether its output may keep SGR colours."""
    return [
        (["runs"], False), (["runs", "--wide"], False), (["runs", "--json"], False),
        (["status", run_id], False), (["status", run_id, "--wide"], False), (["status", run_id, "--json"], False),
        (["why", run_id], False), (["why", run_id, "--json"], False),
        (["stacks", run_id], False), (["stacks", run_id, "--group"], False), (["stacks", run_id, "--json"], False),
        (["logs", run_id], True), (["plot", run_id, "--plain"], False),
    ]


def invoke(args: list[str], root: Path) -> tuple[int, str, str]:
    """The real command's code in this process (as `ups ARGS` runs it): its code, stdout, stderr."""
    global _COMMAND
    from typer.main import get_command
    from typer.testing import CliRunner

    from ups.cli.app import app

    _COMMAND = _COMMAND or get_command(app)
    runner = CliRunner()
    with runner.isolation() as streams:
        try:
            _COMMAND.main(args=[*args, "--runs-dir", str(root)], prog_name="ups")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = (s.getvalue().decode(errors="replace") for s in streams[:2])
    return code, out, err


def check_every_reader(root: Path, run: RunDir, planted: str) -> None:
    for args, allow_sgr in read_commands(run.run_id):
        code, out, err = invoke(args, root)
        assert "Traceback" not in out + err, (args, (out + err)[-2000:])
        bad = unsafe_in(out + err, allow_sgr=allow_sgr)
        assert not bad, f"`ups {' '.join(args)}` printed {bad[:5]} (planted {planted!r:.80})"
        if "--json" in args and code == 0:
            json.loads(out)  # JSON escapes what it carries, and stays one valid document


def copy_run(src: Path, root: Path) -> RunDir:
    dst = root / src.name
    shutil.copytree(src, dst, symlinks=True)
    return RunDir(dst)


def _string_fields(obj: dict) -> list[str]:
    return sorted(k for k, v in obj.items() if isinstance(v, str))


def test_no_control_character_from_a_runs_folder_reaches_the_output_of_any_read_command(finished_run, tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    root = tmp_path_factory.mktemp("prop") / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    rec_path = run.status_dir / "rank-0.json"
    good_record = json.loads(rec_path.read_text())
    good_manifest = json.loads(run.manifest_path.read_text())
    stack = run.stacks_dir / "rank-0.txt"
    good_record["stack_file"] = f"stacks/{stack.name}"
    good_record["metrics"] = {"loss": 0.5}
    # Every string a reader shows: each string field, and the strings inside objects.
    record_targets = [("record", k) for k in _string_fields(good_record)] + [
        ("record", "metrics.note"), ("record", "metrics.key"), ("record", "collective.op"), ("record", "collective.site")]
    manifest_targets = [("manifest", k) for k in sorted(set(_string_fields(good_manifest)) | {"name", "summary"})] + [
        ("manifest", "failure.error"), ("manifest", "verdict.headline"), ("manifest", "config.key"), ("manifest", "argv.0")]
    file_targets = [("event", "text"), ("stack", "text"), ("log", "text"), ("status_file", "name")]
    hostile_text = st.one_of(
        st.sampled_from(HOSTILE),
        st.text(st.characters(min_codepoint=0, max_codepoint=0x2070), min_size=1, max_size=40),
        st.lists(st.sampled_from(HOSTILE), min_size=2, max_size=4).map("ok ".join),
    )

    def plant(target: tuple[str, str], value: str) -> None:
        rec, man = json.loads(json.dumps(good_record)), json.loads(json.dumps(good_manifest))
        kind, key = target
        where = rec if kind == "record" else man
        if kind in ("record", "manifest"):
            head, _, tail = key.partition(".")
            if not tail:
                where[head] = value
            elif tail == "key":
                where[head] = {value: 1}
            elif tail == "0":
                where[head] = [value]
            else:
                where[head] = {**(where.get(head) if isinstance(where.get(head), dict) else {}), tail: value,
                               **({"seq": 3} if head == "collective" else {})}
        rec_path.write_text(json.dumps(rec))
        run.manifest_path.write_text(json.dumps(man))
        stack.write_text('Thread 0x1 (most recent call first):\n  File "x.py", line 3 in main\n'
                         + (value if kind == "stack" else ""))
        log = run.logs_dir / "job.log"
        log.write_bytes(b"step 1\n" + (value.encode("utf-8", "surrogatepass") if kind == "log" else b"") + b"\ndone\n")
        for extra in run.status_dir.glob("planted*"):
            extra.unlink()
        if kind == "status_file":
            name = "planted" + value.replace("/", "_").replace("\x00", "_")[:60] + ".json"
            (run.status_dir / name).write_text("{not json")
        events = run.events_path.read_text().splitlines()[:3]
        if kind == "event":
            events.append(json.dumps({"event": value, "actor": value, "ts": time.time(), "text": value}))
            events.append(value)  # not JSON at all
        run.events_path.write_text("\n".join(events) + "\n")

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(target=st.sampled_from(record_targets + manifest_targets + file_targets), value=hostile_text)
    def check(target, value) -> None:
        plant(target, value)
        check_every_reader(root, run, f"{target}={value!r}")

    check()
    # And every known sequence in every field once, exhaustively.
    for target in record_targets + manifest_targets + file_targets:
        plant(target, "x".join(HOSTILE))
        check_every_reader(root, run, f"{target}=every sequence")


def test_markup_and_escapes_in_a_run_are_shown_as_written_on_a_real_terminal(finished_run, tmp_path):
    """On a colour terminal (FORCE_COLOR) our own styles are SGR; a planted name's markup is
    shown as the characters it is (no link, no bold), its escapes as visible text."""
    root = tmp_path / "runs"
    root.mkdir()
    planted_id = "[link=https:evil.example]click\x1b]0;pwned\x07"  # no "/" in a folder name
    run = RunDir(root / planted_id)  # a run folder's name is what `ups runs` lists
    shutil.copytree(finished_run, run.path)
    manifest = json.loads(run.manifest_path.read_text())
    run.manifest_path.write_text(json.dumps({**manifest, "id": planted_id, "summary": "[bold]ok[/bold] \x1b[2J"}))
    rec_path = run.status_dir / "rank-0.json"
    rec_path.write_text(json.dumps({**json.loads(rec_path.read_text()), "phase": "\x1b]52;c;ZXZpbA==\x07train"}))
    for args in (["runs", "--wide"], ["status", str(run.path), "--wide"], ["why", str(run.path)]):
        res = run_ups(*args, "--runs-dir", str(root), env={"FORCE_COLOR": "1", "COLUMNS": "300", "TERM": "xterm-256color"})
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "\x1b]" not in out and "\x9d" not in out, f"`ups {' '.join(args)}` sent an OSC sequence"
        assert not unsafe_in(out, allow_sgr=True), out
        if args[0] == "runs":
            assert "[link=https:evil.example]click\\x1b]0;pwned\\x07" in SGR.sub("", out)
        if args[0] == "status":
            assert "\\x1b]52;c;ZXZpbA==\\x07train" in SGR.sub("", out)
            assert "[bold]ok[/bold] \\x1b[2J" in SGR.sub("", out)


def test_ups_logs_keeps_colours_strips_the_rest_and_raw_gives_the_bytes(finished_run, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    raw = (b"\x1b[32mINFO\x1b[0m loading\n\x1b]0;pwned\x07title\n\x1b[2J\x1b[Hcleared\n"
           b"progress 10%\rprogress 50%\rprogress 100%\n\x1b]52;c;ZXZpbA==\x07clip\n")
    (run.logs_dir / "job.log").write_bytes(raw)
    res = run_ups("logs", run.run_id, "--runs-dir", str(root))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "\x1b[32mINFO\x1b[0m loading" in out  # colours kept
    assert not unsafe_in(out, allow_sgr=True), out
    assert "title" in out and "cleared" in out and "clip" in out
    assert "progress 50%" in out.splitlines()  # a redrawn progress line is a line of its own
    res = subprocess.run([sys.executable, "-m", "ups", "logs", run.run_id, "--raw", "--runs-dir", str(root)],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == raw


def test_the_console_shows_a_planted_run_as_text(finished_run, tmp_path):
    """The console's runs table, run screen and verdict line show escapes as visible text
    and markup as written (Textual cells are Text, never markup)."""
    import asyncio

    from console.app import UpsConsole

    root = tmp_path / "runs"
    root.mkdir()
    run = copy_run(finished_run, root)
    manifest = json.loads(run.manifest_path.read_text())
    run.manifest_path.write_text(json.dumps({**manifest, "name": "[b]bold?[/b]\x1b]0;t\x07",
                                             "summary": "[link=http://evil]x[/link]"}))
    rec_path = run.status_dir / "rank-0.json"
    rec_path.write_text(json.dumps({**json.loads(rec_path.read_text()), "phase": "[red]p[/red]\x1b[2J",
                                    "error": "boom\x1b]52;c;ZXZpbA==\x07"}))

    async def drive() -> str:
        app = UpsConsole(root, run_id=run.run_id, readonly=True, refresh=0.2)
        async with app.run_test(size=(160, 40)) as pilot:
            for _ in range(50):
                await pilot.pause(0.1)
                if "[red]p[/red]" in _screen_text(app):
                    break
            return _screen_text(app)

    text = asyncio.run(drive())
    assert not unsafe_in(text), text
    assert "[red]p[/red]\\x1b[2J" in text, text


def _screen_text(app) -> str:
    """What the app's screen shows, as plain text (its rendered lines)."""
    from rich.console import Console

    console = Console(file=open(os.devnull, "w"), width=200, record=True, color_system=None)
    lines = []
    for widget in app.screen.walk_children():
        try:
            rendered = widget.render()
        except Exception:  # noqa: BLE001 - containers render nothing of their own
            continue
        console.print(rendered)
    lines.append(console.export_text())
    from textual.widgets import DataTable

    for table in app.screen.query(DataTable):
        for row in range(table.row_count):
            lines.append(" ".join(str(c) for c in table.get_row_at(row)))
    return "\n".join(lines)


@pytest.mark.skipif(sys.platform != "linux", reason="notifications' cmd: target runs through sh")
def test_a_notification_carries_no_control_characters(finished_run, tmp_path):
    from ups.notify import Message, deliver

    out = tmp_path / "got.json"
    msg = Message("problem", "run-1", str(tmp_path), "ups run-1: \x1b]0;t\x07rank 1 \x1b[2Jfailed\nforged line",
                  verdict={"text": "boom\x1b]52;c;ZXZpbA==\x07\nsecond line", "headline": "\x9b2Jx"})
    deliver(f"cmd:cat > {out}; printf %s \"$UPS_NOTIFY_SUMMARY\" > {out}.env", msg, timeout=10, smtp={})
    payload = json.loads(out.read_text())
    env_summary = Path(f"{out}.env").read_text()
    for text in (payload["summary"], payload["verdict"]["text"], payload["verdict"]["headline"], env_summary):
        assert not unsafe_in(text), text
    assert "\n" not in payload["summary"] and "\\x0a" in payload["summary"]  # a one-line summary stays one line
    assert "second line" in payload["verdict"]["text"].splitlines()[1]
