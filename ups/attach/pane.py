"""A job whose output goes to a terminal that a tmux pane owns (``torchrun train.py`` typed in a
tmux session over SSH): its log is the pane, read read-only with ``tmux capture-pane``.

- Found from ``/proc`` alone: the job's stdout is a pty (``/dev/pts/N``); tmux servers are the
  processes named ``tmux: server``, each listening on a unix socket (its inode among the server's
  descriptors, its path in ``/proc/net/unix``); ``tmux -S SOCKET list-panes -a`` names the pane
  whose ``pane_tty`` is the job's terminal.
- Read with ``capture-pane -p -J`` on that pane, as the user who owns the server (as root:
  ``setpriv`` to that user; another user's server is never asked by anyone else). Nothing is
  typed into the pane and none of its settings change: ``list-panes`` and ``capture-pane`` only.
- Each read takes the pane's last :data:`CAPTURE_LINES` lines and gives back what is new since
  the previous read: the lines after the last ones it gave (the pane's own last line, which a
  progress bar rewrites in place, is given again whenever it changed, ended by ``\\r``). What
  scrolled past more than :data:`CAPTURE_LINES` lines between two reads, and what a ``clear``
  wiped, is not seen. GNU screen's windows are not read (docs/attach.md).
"""

from __future__ import annotations

import os
import subprocess

from ups.status import procfs

CAPTURE_LINES = 2000  # tmux's default history-limit
TIMEOUT_S = 5.0


def _server_sockets() -> list[tuple[int, str, int]]:
    """(server pid, socket path, server uid) of every tmux server whose descriptors can be read."""
    listening: dict[str, str] = {}
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and parts[7].startswith("/"):
                    listening[parts[6]] = parts[7]  # inode -> path
    except OSError:
        return []
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or not procfs.comm(int(name)).startswith("tmux"):
            continue
        pid = int(name)
        argv = procfs.cmdline(pid) or []
        if not argv or not argv[0].startswith("tmux"):
            continue
        for target in (procfs.fd_targets(pid) or {}).values():
            inode = target[len("socket:["):-1] if target.startswith("socket:[") else None
            if inode in listening:
                try:
                    uid = os.stat(f"/proc/{pid}").st_uid
                except OSError:
                    continue
                out.append((pid, listening[inode], uid))
    return out


def _as(uid: int) -> list[str] | None:
    """The command prefix that runs tmux as ``uid``; None when this process cannot."""
    if uid == os.geteuid():
        return []
    if os.geteuid() == 0:
        import pwd

        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return None


def tmux(pane: dict, *args: str) -> str | None:
    """``tmux -S SOCKET ARGS`` as the server's owner; its output, or None."""
    prefix = _as(int(pane["uid"]))
    if prefix is None:
        return None
    try:
        res = subprocess.run([*prefix, "tmux", "-S", pane["socket"], *args], capture_output=True, timeout=TIMEOUT_S,
                             stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.decode(errors="replace") if res.returncode == 0 else None


def pane_of(pid: int) -> dict | None:
    """The tmux pane whose terminal is the process's stdout: ``{"tty", "socket", "uid", "server",
    "pane", "where"}``; None when its stdout is no terminal, or no tmux server here owns it."""
    try:
        tty = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    if not tty.startswith("/dev/pts/"):
        return None
    for server, socket, uid in _server_sockets():
        probe = {"socket": socket, "uid": uid}
        listing = tmux(probe, "list-panes", "-a", "-F", "#{pane_tty} #{pane_id} #{session_name}:#{window_index}.#{pane_index}")
        for line in (listing or "").splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0] == tty:
                return {"tty": tty, "socket": socket, "uid": uid, "server": server, "pane": parts[1], "where": parts[2]}
    return None


class PaneReader:
    """What the pane shows that was not given before, as bytes of lines (the observer's log)."""

    def __init__(self, pane: dict) -> None:
        self.pane = pane
        self.given: list[str] | None = None  # the lines given so far that are still in the capture's range
        self.last: str | None = None  # the pane's last line as last given

    def read(self) -> tuple[bytes, bool]:
        text = tmux(self.pane, "capture-pane", "-p", "-J", "-S", f"-{CAPTURE_LINES}", "-t", self.pane["pane"])
        if text is None:
            return b"", False
        lines = text.rstrip("\n").split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            return b"", False
        done, tail = lines[:-1], lines[-1]
        backlog = self.given is None
        new = done if backlog else _after(self.given, done)
        self.given = done[-200:]
        out = "".join(line + "\n" for line in new)
        if tail != self.last:
            out += tail + "\r"
            self.last = tail
        return out.encode(), backlog


def _after(given: list[str], lines: list[str]) -> list[str]:
    """The lines of ``lines`` after the longest run of them that ends ``given`` (all of them when
    none does: the pane was cleared, or scrolled past the capture between two reads)."""
    for k in range(min(len(given), 20), 0, -1):
        anchor = given[-k:]
        for end in range(len(lines), k - 1, -1):
            if lines[end - k:end] == anchor:
                return lines[end:]
    return lines
