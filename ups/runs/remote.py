"""Another node's view of a run, over the SSH its operators already have (no service of ours).

A multi-node run without a shared folder keeps each node's records on that node. A reader
on one node (``ups status RUN --remote HOST``, ``ups console --remote HOST``) runs

    ssh -o BatchMode=yes HOST ups status RUN --json --follow [--runs-dir DIR]

which streams one JSON snapshot per line (NDJSON) from the ``ups`` installed there: that
node's records, judged *there* (its pids, its clock). :class:`RemoteStatusSource` reads the
stream in a thread of its own (a console's poll never waits on ssh) and keeps the latest
snapshot; :func:`merge_remote` puts the nodes together into one :class:`RunView`. A node
whose stream ends before its run has, or stays silent past a deadline, is *unreachable*:
shown as such, never as dead ranks. Actions (stacks, kill) go over the same SSH call to
that node's ``ups`` (:func:`remote_ups`).

Knobs (environment): ``UPS_SSH`` the ssh command with its options (default ``ssh``);
``UPS_REMOTE_UPS`` the command that runs ``ups`` on the other node (default ``ups``; e.g.
``/opt/venv/bin/python -m ups``; ``{host}`` in it is replaced by the HOST given, shell-quoted).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import UpsError
from ups.runs.manifest_spec import check_manifest
from ups.runs.payload import STACK_SEND
from ups.runs.rundir import FINAL_RUN_STATES, RunDir, merge_node_states
from ups.runs.view import NodeView, ProcessView, RunView, node_views, with_lost_nodes
from ups.status.health import Health, HealthVerdict, Thresholds
from ups.status.host import hostname
from ups.status.record import RecordError, StatusRecord
from ups.status.safeio import BadFile, decode_json, number

ENV_SSH = "UPS_SSH"
ENV_REMOTE_UPS = "UPS_REMOTE_UPS"
SILENT_AFTER_S = 10.0
"""A stream with no line for this long (the remote writes one a second) is a lost node."""
RECONNECT_S = 3.0


@dataclass(frozen=True)
class RemoteSpec:
    """``HOST`` or ``HOST:RUNS_DIR`` (the runs folder on that node; default: its ``ups``'s)."""

    host: str
    runs_dir: str | None = None

    @classmethod
    def parse(cls, text: str) -> RemoteSpec:
        host, _, runs_dir = text.partition(":")
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise UpsError(f"--remote {text!r}: expected HOST or HOST:RUNS_DIR (a host ssh can reach)")
        return cls(host, runs_dir or None)

    def __str__(self) -> str:
        return self.host + (f":{self.runs_dir}" if self.runs_dir else "")

    def argv(self, *ups_args: str) -> list[str]:
        """The local command line that runs ``ups UPS_ARGS`` on that node."""
        ssh = shlex.split(os.environ.get(ENV_SSH) or "ssh")
        # HOST goes into a line a remote shell runs: quoted, so a name never becomes a command.
        remote_ups = (os.environ.get(ENV_REMOTE_UPS) or "ups").replace("{host}", shlex.quote(self.host))
        args = [*ups_args, *(["--runs-dir", self.runs_dir] if self.runs_dir else [])]
        command = f"{remote_ups} {' '.join(shlex.quote(a) for a in args)}"
        return [*ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", self.host, command]


def remote_ups(spec: RemoteSpec, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``ups ARGS`` on that node (an action: stacks, kill); its output and exit code."""
    try:
        return subprocess.run(spec.argv(*args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UpsError(f"{spec.host}: no answer from `ups {' '.join(args)}` over ssh within {timeout:g} s", exit_code=1) from None
    except OSError as exc:
        raise UpsError(f"cannot run ssh for {spec.host}: {exc.strerror or exc} (set {ENV_SSH})", exit_code=1) from None


class RemoteStatusSource:
    """The latest snapshot of one run on one other node, from its ``ups status --follow``."""

    def __init__(self, spec: RemoteSpec, run_ref: str, *, silent_after: float = SILENT_AFTER_S,
                 reconnect_s: float = RECONNECT_S) -> None:
        self.spec = spec
        self.run_ref = run_ref
        self.silent_after = silent_after
        self.reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._first = threading.Event()
        self._halt = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.latest: dict[str, Any] | None = None
        self.stacks: dict[str, str] = {}  # by record name: the latest sections of its stack file there
        self.received_mono: float | None = None
        self.error: str | None = None  # why the last stream ended (None while it flows)
        self.finished = False  # the stream ended because the run has ended there
        self.started_mono = time.monotonic()

    # -- life ---------------------------------------------------------------------------
    def start(self) -> RemoteStatusSource:
        if self._thread is None:
            self.started_mono = time.monotonic()
            self._thread = threading.Thread(target=self._run, name=f"ups-remote-{self.spec.host}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()

    def wait_first(self, timeout: float) -> bool:
        """Until the first snapshot or the first failure (True), or ``timeout`` (False)."""
        return self._first.wait(timeout)

    def _run(self) -> None:
        while not self._halt.is_set():
            self._stream_once()
            self._first.set()
            if self.finished or self._halt.wait(self.reconnect_s):
                return

    def _stream_once(self) -> None:
        argv = self.spec.argv("status", self.run_ref, "--json", "--follow")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            with self._lock:
                self.error = f"cannot run ssh: {exc.strerror or exc}"
            return
        self._proc = proc
        err_lines: list[str] = []
        err_thread = threading.Thread(target=lambda: err_lines.extend(proc.stderr or ()), daemon=True)
        err_thread.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            try:  # another node's word is outside input like a file: through the same boundary
                payload = decode_json(line)
                if isinstance(payload, dict) and payload.get("run") is not None:
                    payload["run"] = check_manifest(payload["run"])
            except BadFile:
                continue
            if not isinstance(payload, dict):
                continue
            stacks = payload.pop("stacks", None)
            with self._lock:
                self.latest, self.received_mono, self.error = payload, time.monotonic(), None
                if isinstance(stacks, dict):  # only those that changed since the stream's last line
                    self.stacks.update((k, v[-STACK_SEND:]) for k, v in stacks.items()
                                       if isinstance(k, str) and isinstance(v, str))
            self._first.set()
            if self._halt.is_set():
                break
        rc = proc.wait()
        err_thread.join(timeout=2)
        last = next((ln.strip() for ln in reversed(err_lines) if ln.strip()), "")
        with self._lock:
            state = ((self.latest or {}).get("run") or {}).get("state")
            if rc == 0 and state in FINAL_RUN_STATES:
                self.finished = True
                return
            self.error = f"ssh {self.spec.host}: " + (last or f"the stream ended (exit {rc})")

    # -- reading ------------------------------------------------------------------------
    def status(self, now_mono: float | None = None) -> tuple[str, str]:
        """("ok" | "connecting" | "unreachable", reason)."""
        now_mono = time.monotonic() if now_mono is None else now_mono
        with self._lock:
            latest, received, error = self.latest, self.received_mono, self.error
        if self.finished:
            return "ok", "the run has ended there"
        if latest is None or received is None:
            if error:
                return "unreachable", f"node {self.spec.host} unreachable: {error}"
            waited = now_mono - self.started_mono
            if waited > self.silent_after:
                return "unreachable", f"node {self.spec.host} unreachable: no answer over ssh for {waited:.0f} s"
            return "connecting", f"connecting to {self.spec.host} over ssh"
        silent = now_mono - received
        if error:
            return "unreachable", f"node {self.host} unreachable: {error} (last snapshot {silent:.0f} s ago)"
        if silent > self.silent_after:
            return "unreachable", f"node {self.host} unreachable: its ssh stream has been silent for {silent:.0f} s"
        return "ok", ""

    @property
    def host(self) -> str:
        """The node's own name (its records' host) once it answered; the ssh host before."""
        with self._lock:
            return str((self.latest or {}).get("host") or self.spec.host)

    def snapshot(self) -> tuple[dict[str, Any] | None, float | None]:
        with self._lock:
            return self.latest, self.received_mono

    def stack_text(self, name: str) -> str | None:
        """The end of a process's stack file on that node, as its stream last sent it."""
        with self._lock:
            return self.stacks.get(name)


def remote_processes(payload: dict[str, Any], received_mono: float, now_mono: float,
                     lost_reason: str | None) -> list[ProcessView]:
    """The process views a remote node sent: its records, with the health it judged there
    (its pids, its clock), aged by the time since we received them; when the node is lost,
    each running one is 'unreachable' (never 'dead': nothing here can tell)."""
    rows = {row.get("name"): row for row in payload.get("processes") or [] if isinstance(row, dict)}
    waited = max(0.0, now_mono - received_mono)
    out = []
    for data in payload.get("records") or []:
        try:
            rec = StatusRecord.from_dict(data)
        except RecordError:
            continue
        row = rows.get(rec.name) or {}
        try:
            health = Health(row.get("health"))
        except ValueError:
            health = Health.STARTING
        verdict = HealthVerdict(health, str(row.get("reason") or ""))
        if lost_reason and not rec.is_final:
            verdict = HealthVerdict(Health.UNREACHABLE, lost_reason)
        out.append(ProcessView(rec, verdict, _age(row.get("heartbeat_age")) + waited, _age(row.get("progress_age")) + waited))
    return out


def _age(value: Any) -> float:
    """An age another node sent: a finite number of seconds, else 0."""
    try:
        return number(0.0, 1e12)(value)
    except BadFile:
        return 0.0


def merge_remote(local: RunView | None, sources: list[RemoteStatusSource], *, run_id: str,
                 now_mono: float | None = None) -> RunView:
    """One view of a run from this node's folder (``local``, None when this host has none of
    it) and the other nodes' streams. Each node's records come from that node."""
    now_mono = time.monotonic() if now_mono is None else now_mono
    here = hostname()
    processes: dict[tuple[str, str], ProcessView] = {}
    if local is not None:
        processes.update(((p.record.host, p.record.name), p) for p in local.processes)
    manifest: dict[str, Any] = dict(local.manifest or {}) if local is not None else {}
    nodes: dict[str, dict[str, Any]] = dict(manifest.get("nodes") or {})
    if local is not None and local.manifest and not nodes:
        # A run launched here as one node, read with --remote: this host is its node, with
        # the state and end its own launcher recorded (else it would read as 'launching').
        nodes[here] = {k: local.manifest.get(k) for k in ("state", "summary", "failure", "ended_at", "launcher")}
    lost: dict[str, str] = {}
    remotes: list[dict[str, Any]] = []
    stacks: dict[str, str] = {}
    for src in sources:
        state, reason = src.status(now_mono)
        payload, received = src.snapshot()
        host = src.host
        remotes.append({"remote": str(src.spec), "host": host, "status": state, "reason": reason})
        if state == "unreachable":
            lost[host] = reason
        if payload is None or received is None:
            continue
        run = payload.get("run") if isinstance(payload.get("run"), dict) else {}
        if not manifest:
            manifest = {k: v for k, v in run.items() if k not in ("launcher", "job", "command", "host")}
        for h, m in (run.get("nodes") or {}).items():
            if h != here or h not in nodes:
                nodes[h] = m
        for p in remote_processes(payload, received, now_mono, lost.get(host)):
            if p.record.host != here:  # this host's own records are read here, never second-hand
                processes[(p.record.host, p.record.name)] = p
                text = src.stack_text(p.record.name)
                if text is not None:
                    stacks[p.record.name] = text
    merged = sorted(processes.values(), key=lambda p: _order(p.record))
    for key in ("summary", "failure", "ended_at", "failed_nodes", "unreachable_nodes"):
        manifest.pop(key, None)
    manifest.update(nodes=nodes, **merge_node_states(nodes, (manifest.get("multinode") or {}).get("nnodes")))
    if not manifest.get("multinode"):
        manifest["multinode"] = {"nnodes": len(nodes) or None}
    manifest.setdefault("id", run_id)
    views = list(node_views(manifest, tuple(merged), lost, here))
    for r in remotes:  # a node not heard from yet, or never: a row of its own
        if not any(n.host == r["host"] for n in views):
            health = Health.UNREACHABLE.value if r["status"] == "unreachable" else Health.STARTING.value
            views.append(NodeView(r["host"], None, None, health, r["reason"], 0))
    node_tuple = tuple(views)
    manifest = with_lost_nodes(manifest, node_tuple)
    manifest["remotes"] = remotes
    base = local or RunView(RunDir(Path(f"remote:{run_id}")), None, None, (), (), Thresholds(), time.time(), "supervised")
    supervision = "final" if manifest.get("state") in FINAL_RUN_STATES else base.supervision
    return dataclasses.replace(base, manifest=manifest, manifest_problem=None if manifest else base.manifest_problem,
                               processes=tuple(merged), nodes=node_tuple, supervision=supervision,
                               remote_stacks=stacks)


def _order(r: StatusRecord) -> tuple:
    from ups.status.reader import record_order

    return record_order(r)


def open_sources(specs: list[RemoteSpec], run_id: str, *, silent_after: float = SILENT_AFTER_S) -> list[RemoteStatusSource]:
    return [RemoteStatusSource(s, run_id, silent_after=silent_after).start() for s in specs]


def stop_sources(sources: list[RemoteStatusSource]) -> None:
    for s in sources:
        s.stop()
