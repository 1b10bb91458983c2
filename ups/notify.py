"""Telling someone when a run needs them: ``--notify TARGET`` on every launch.

Targets:

* ``cmd:SHELL COMMAND``: run with the message as JSON on stdin and ``UPS_NOTIFY_*`` variables
  (event, run id and folder, state, mode, summary) in its environment;
* ``http://...`` / ``https://...``: a JSON POST whose ``text`` (Slack) and ``content``
  (Discord) fields hold the summary line; a URL on an ntfy server (host name with ``ntfy``)
  gets ntfy's plain-text body with a Title header instead;
* ``mailto:ADDRESS``: an e-mail through the SMTP server of the user's config
  (:mod:`ups.userconfig`: host, port, starttls, user; the password from an environment
  variable only).

When (the supervisor calls these): the run's verdict turns to a problem (:data:`PROBLEMS`),
once per episode; a restart after a hang; the run's end. A phone-sized summary line heads each
message. Rate-limited per target (``min_interval_s``); the run's end always goes.

Never in the way: messages are queued and delivered by a daemon thread, each delivery with a
time limit; the supervisor never waits on it (at the end it gives the last messages a bounded
moment after the run's state is written). A delivery that fails or times out is a
``notify.failed`` event; one delivered, ``notify.sent``.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ups.errors import UpsError

PROBLEMS = frozenset(("stalled", "unresponsive", "hung", "dead", "node_unreachable", "rank_stuck_peers_wait", "one_sided_collective",
                      "collective_mismatch", "collective_timeout", "worker_stuck_in_read", "worker_stuck",
                      "dataloader_resources", "loss_nonfinite", "loss_diverged", "step_rate_dropped", "gpu_memory_leak",
                      "gpu_hardware", "unsupervised", "straggler_input", "straggler_compute", "straggler_host",
                      "straggler_node", "straggler_unknown"))
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MIN_INTERVAL_S = 60.0
LINE_CHARS = 160


def check_targets(targets: list[str] | None) -> list[str]:
    """Validate ``--notify`` values at launch (bad input: one line, exit 2)."""
    out = []
    for t in targets or []:
        if t.startswith("cmd:") and t[4:].strip():
            out.append(t)
        elif t.startswith(("http://", "https://")) and urlsplit(t).hostname:
            out.append(t)
        elif t.startswith("mailto:") and "@" in t[7:]:
            out.append(t)
        else:
            raise UpsError(f"--notify {t!r}: expected cmd:COMMAND, http(s)://URL or mailto:ADDRESS")
    return out


def describe_target(target: str) -> str:
    """A target as events show it: no URL path or query (webhook URLs carry secrets), no command."""
    if target.startswith(("http://", "https://")):
        u = urlsplit(target)
        return f"{u.scheme}://{u.hostname}" + (f":{u.port}" if u.port else "") + "/…"
    if target.startswith("cmd:"):
        return "cmd:…"
    return target


@dataclass
class Message:
    event: str  # problem | restart | end
    run_id: str
    run_dir: str
    line: str  # the phone-sized summary
    state: str | None = None
    mode: str | None = None
    verdict: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # What a notification says goes to another screen (a phone, a mail reader, a shell
        # command): one line for the summary (also a mail's Subject), no control characters.
        from ups.status.printable import printable
        from ups.status.safeio import safe_value

        self.line = printable(self.line)
        if self.verdict is not None:
            self.verdict = safe_value(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "run_id": self.run_id, "run_dir": self.run_dir, "summary": self.line,
                "state": self.state, "mode": self.mode, "verdict": self.verdict, **self.extra,
                "text": self.line, "content": self.line}


def summary_line(run_id: str, text: str) -> str:
    line = f"ups {run_id}: {text}"
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"


# ----------------------------------------------------------------------------- delivery
def deliver(target: str, msg: Message, *, timeout: float, smtp: dict[str, Any]) -> None:
    """Send one message to one target; raises on failure (the caller logs it)."""
    if target.startswith("cmd:"):
        _deliver_cmd(target[4:], msg, timeout)
    elif target.startswith(("http://", "https://")):
        _deliver_http(target, msg, timeout)
    else:
        _deliver_mail(target[7:], msg, timeout, smtp)


def _deliver_cmd(command: str, msg: Message, timeout: float) -> None:
    import subprocess

    env = dict(os.environ, UPS_NOTIFY_EVENT=msg.event, UPS_NOTIFY_RUN_ID=msg.run_id, UPS_NOTIFY_RUN_DIR=msg.run_dir,
               UPS_NOTIFY_STATE=msg.state or "", UPS_NOTIFY_MODE=msg.mode or "", UPS_NOTIFY_SUMMARY=msg.line)
    res = subprocess.run(command, shell=True, input=json.dumps(msg.to_dict()).encode(), env=env, timeout=timeout,  # the user's own command
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if res.returncode != 0:
        err = res.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"exit code {res.returncode} {err[0][:200]}".strip())


def _deliver_http(url: str, msg: Message, timeout: float) -> None:
    import urllib.request

    host = urlsplit(url).hostname or ""
    if "ntfy" in host:
        body, headers = msg.line.encode(), {"Title": f"ups {msg.run_id}: {msg.event}", "Content-Type": "text/plain"}
    else:
        body, headers = json.dumps(msg.to_dict()).encode(), {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # the user's own URL
        resp.read(1 << 16)


def _deliver_mail(address: str, msg: Message, timeout: float, smtp: dict[str, Any]) -> None:
    import smtplib
    from email.message import EmailMessage

    host = smtp.get("host")
    if not host:
        from ups.userconfig import config_dir

        raise RuntimeError(f"no SMTP host: set [smtp] host in {config_dir() / 'config.toml'}")
    mail = EmailMessage()
    mail["Subject"] = msg.line
    mail["From"] = smtp.get("from") or smtp.get("user") or f"ups@{os.uname().nodename}"
    mail["To"] = address
    mail.set_content(msg.line + "\n\n" + ((msg.verdict or {}).get("text") or "") + f"\n\nrun folder: {msg.run_dir}\n")
    with smtplib.SMTP(host, int(smtp.get("port") or 25), timeout=timeout) as server:
        if smtp.get("starttls"):
            server.starttls()
        password = os.environ.get(str(smtp.get("password_env") or "UPS_SMTP_PASSWORD"))
        if smtp.get("user") and password:
            server.login(str(smtp["user"]), password)
        server.send_message(mail)


# ------------------------------------------------------------------------------ notifier
class Notifier:
    """Queued, rate-limited delivery for one run, off the supervisor's path."""

    def __init__(self, run: Any, targets: list[str], config: dict[str, Any] | None = None, *, actor: str = "launcher") -> None:
        self.run = run
        self.targets = list(targets)
        cfg = (config or {}).get("notify") or {}
        self.smtp = (config or {}).get("smtp") or {}
        self.timeout = float(os.environ.get("UPS_NOTIFY_TIMEOUT") or cfg.get("timeout_s") or DEFAULT_TIMEOUT_S)
        interval = os.environ.get("UPS_NOTIFY_MIN_INTERVAL")
        self.min_interval = float(interval if interval is not None else cfg.get("min_interval_s", DEFAULT_MIN_INTERVAL_S))
        self.actor = actor
        self.episode: tuple | None = None
        self._last_sent: dict[str, float] = {}
        self._queue: queue.Queue[tuple[str, Message] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_run(cls, run: Any, manifest: dict[str, Any], *, actor: str = "launcher") -> Notifier | None:
        """The run's notifier: --notify targets, else the config file's; None when there are none.
        ``actor``: who its events name (the launcher, or an attached run's observer)."""
        try:
            from ups.userconfig import load_user_config

            config = load_user_config()
        except UpsError as exc:
            run.append_event("notify.failed", actor=actor, target="config", error=str(exc))
            config = {}
        targets = manifest.get("notify") or ((config.get("notify") or {}).get("targets") or [])
        try:
            targets = check_targets([str(t) for t in targets])
        except UpsError as exc:
            run.append_event("notify.failed", actor=actor, target="config", error=str(exc))
            return None
        return cls(run, targets, config, actor=actor) if targets else None

    # -- what the supervisor calls (never blocks) --------------------------------------------
    def on_verdict(self, verdict: Any, *, hang: bool = False, proof: dict[str, Any] | None = None) -> None:
        """A problem is told once per episode. A ``hang`` (stalled, stuck, one-sided ...) only
        once it is proven (``proof``: ups.launch.proof), with the proof: a display word alone
        ("stalled") never wakes anyone."""
        if verdict.mode not in PROBLEMS:
            self.episode = None
            return
        if hang and proof is None:
            return
        key = (verdict.mode, (verdict.who or {}).get("name"))
        if key == self.episode:
            return
        self.episode = key
        line = verdict.headline + (f" (proof: {proof['text']})" if proof else "")
        self._put(Message("problem", self.run.run_id, str(self.run.path), summary_line(self.run.run_id, line),
                          mode=verdict.mode, verdict=verdict.to_dict(), extra={"proof": proof} if proof else {}))

    def on_restart(self, attempt: int, verdict: Any) -> None:
        self._put(Message("restart", self.run.run_id, str(self.run.path),
                          summary_line(self.run.run_id, f"restarted (attempt {attempt}) after: {verdict.headline}"),
                          mode=verdict.mode, verdict=verdict.to_dict(), extra={"attempt": attempt}))

    def on_end(self, state: str, summary: str, verdict: dict[str, Any] | None) -> None:
        self._put(Message("end", self.run.run_id, str(self.run.path), summary_line(self.run.run_id, f"{state}: {summary}"),
                          state=state, mode=(verdict or {}).get("mode"), verdict=verdict), always=True)

    def drain(self, timeout: float) -> bool:
        """Wait at most ``timeout`` for queued messages (the supervisor, after the run's end is written)."""
        return self._idle.wait(timeout)

    # -- delivery ----------------------------------------------------------------------------
    def _put(self, msg: Message, *, always: bool = False) -> None:
        now = time.monotonic()
        for target in self.targets:
            last = self._last_sent.get(target)
            if not always and last is not None and now - last < self.min_interval:
                self._event("notify.suppressed", target, msg, reason=f"rate limit: one per {self.min_interval:g} s")
                continue
            self._last_sent[target] = now
            self._idle.clear()
            self._queue.put((target, msg))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ups-notify", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            target, msg = item
            started = time.monotonic()
            try:
                deliver(target, msg, timeout=self.timeout, smtp=self.smtp)
                self._event("notify.sent", target, msg, seconds=round(time.monotonic() - started, 3))
            except Exception as exc:  # noqa: BLE001 - a failed notification is an event, never a crash
                self._event("notify.failed", target, msg, error=f"{type(exc).__name__}: {exc}"[:300],
                            seconds=round(time.monotonic() - started, 3))
            if self._queue.empty():
                self._idle.set()

    def _event(self, event: str, target: str, msg: Message, **fields: Any) -> None:
        try:
            self.run.append_event(event, actor=self.actor, target=describe_target(target), about=msg.event,
                                  summary=msg.line, **fields)
        except OSError:
            pass
