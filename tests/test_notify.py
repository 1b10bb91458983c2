"""Notifications: a local webhook (http.server) and a local SMTP server (aiosmtpd) on
127.0.0.1 receive what a real run says; a notifier that never answers changes nothing about
the run."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import run_ups, wait_for

from ups.runs.rundir import RunDir

PROGRAMS = Path(__file__).parent / "programs"
HANG = str(PROGRAMS / "hang_train.py")


@pytest.fixture
def webhook():
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append({"path": self.path, "body": json.loads(body), "type": self.headers.get("Content-Type")})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/T000/secret", got
    server.shutdown()


@pytest.fixture
def smtp_server():
    aiosmtpd = pytest.importorskip("aiosmtpd.controller")
    from aiosmtpd.handlers import Message

    got: list = []

    class Keep(Message):
        def handle_message(self, message):
            got.append(message)

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]  # the Controller checks it is up by connecting to its port: not 0
    probe.close()
    controller = aiosmtpd.Controller(Keep(), hostname="127.0.0.1", port=port)
    controller.start()
    yield port, got
    controller.stop()


def _config(tmp_path: Path, smtp_port: int) -> dict[str, str]:
    folder = tmp_path / "xdg" / "ups"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(
        f'[notify]\nmin_interval_s = 0\n\n[smtp]\nhost = "127.0.0.1"\nport = {smtp_port}\nstarttls = false\n'
        'from = "ups@gpu-box"\n')
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "UPS_HEARTBEAT_INTERVAL": "0.3"}


@pytest.mark.slow
def test_webhook_mail_and_command_hear_the_hang_and_the_end(runs_root, tmp_path, webhook, smtp_server):
    url, posts = webhook
    port, mails = smtp_server
    out = tmp_path / "cmd.jsonl"
    res = run_ups("launch", "python", "--detach", "--json", "--stalled-after", "2", "--on-hang", "kill",
                  "--notify", url, "--notify", "mailto:oncall@example.org", "--notify", f"cmd:cat >> {out}; echo >> {out}",
                  HANG, "--hang-step", "3", env=_config(tmp_path, port), timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = RunDir(json.loads(res.stdout)["run_dir"])
    # Each message goes to the targets in turn (the webhook, the mail, then the command), and each
    # delivery's notify.sent event follows it: wait for all of them.
    wait_for(lambda: len(posts) >= 2 and len(mails) >= 2
             and sum(e["event"] == "notify.sent" for e in run.read_events()) >= 6,
             90, interval=0.2, message="two messages at each target")
    problem, end = posts[0]["body"], posts[1]["body"]
    assert problem["event"] == "problem" and problem["mode"] == "stalled" and problem["run_id"] == run.run_id
    assert problem["text"] == problem["content"] and problem["text"].startswith(f"ups {run.run_id}: rank 0 is stalled")
    assert len(problem["text"]) <= 160 and posts[0]["path"] == "/hooks/T000/secret"
    assert end["event"] == "end" and end["state"] == "failed" and "ended on hang" in end["text"]
    assert mails[0]["To"] == "oncall@example.org" and "rank 0 is stalled" in mails[0]["Subject"]
    assert "failed: ended on hang" in mails[1]["Subject"] and run.run_id in mails[1].get_payload()
    lines = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
    assert [m["event"] for m in lines] == ["problem", "end"] and lines[0]["verdict"]["who"]["rank"] == 0
    sent = [e for e in run.read_events() if e["event"] == "notify.sent"]
    assert len(sent) == 6 and all("secret" not in e["target"] for e in sent)  # webhook URLs carry secrets


@pytest.mark.slow
def test_a_notifier_that_never_answers_does_not_slow_the_run(runs_root, tmp_path, never_answers):
    limit = 15.0
    env = {"UPS_NOTIFY_TIMEOUT": str(limit)}
    res = run_ups("launch", "python", "--json", "--notify", never_answers, HANG, "--steps", "10", "--hang-step", "999",
                  env=env, timeout=120, cwd=tmp_path)
    run = RunDir(json.loads(res.stdout)["run_dir"])
    m = run.read_manifest()
    assert res.returncode == 0 and m["state"] == "succeeded"  # its exit code and record as without a notifier
    last_record = json.loads((run.status_dir / "rank-0.json").read_text())["heartbeat_at"]
    # Had the supervisor waited for the notifier, the run's end would be written at least the
    # notifier's time limit after the program's last record. It was written well before: the
    # margin left is for a loaded box, where the program's exit and the supervisor's sweep and
    # write of the end have taken over 3 s.
    assert m["ended_at"] - last_record < limit - 3, m["ended_at"] - last_record
    failed = wait_for(lambda: [e for e in run.read_events() if e["event"] == "notify.failed"], limit + 30,
                      message="the failure event")
    assert failed[0]["ts"] - m["ended_at"] >= limit - 1 and "timed out" in failed[0]["error"]
    assert failed[0]["target"] == never_answers.rsplit("/", 1)[0] + "/…"


def test_bad_notify_target_is_refused_before_anything_starts(runs_root, tmp_path):
    res = run_ups("launch", "python", "--notify", "carrier-pigeon", HANG, cwd=tmp_path)
    assert res.returncode == 2 and "--notify 'carrier-pigeon': expected cmd:COMMAND" in res.stderr
    assert "Traceback" not in res.stderr and not list(Path(runs_root).glob("*"))


def test_every_hang_on_hang_acts_on_is_also_told():
    # A hang --on-hang ends or restarts must reach the operator first: a worker stuck outside a
    # read was restarted with no message (worker_stuck was missing here).
    from ups.launch.onhang import HANG_MODES
    from ups.notify import PROBLEMS

    assert HANG_MODES <= PROBLEMS, sorted(HANG_MODES - PROBLEMS)
