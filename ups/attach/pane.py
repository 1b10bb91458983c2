"""A job whose output goes to a terminal that a tmux pane or a GNU screen window owns
(``torchrun train.py`` typed in a tmux or screen session over SSH): its log is the pane, read
read-only (``tmux capture-pane``; screen's ``hardcopy -h``).

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
  wiped, is not seen.
- A screen window is found from the job's environment, which screen gives every window's
  process: ``STY`` (``PID.NAME``: the session, its server's pid) and ``WINDOW`` (its number),
  each checked against ``/proc``: the server is a process named ``screen`` of the job's user,
  and the job's terminal is the one its window's first process holds. Read as the server's
  owner with ``screen -S STY -p WINDOW -X hardcopy -h FILE`` into a folder of that user's made
  for it, then a query (``-Q windows``) that returns once the server has written it (it takes
  commands one after another), the file read as that user (``cat``): nothing is typed into the
  window. A screen's scrollback is its ``defscrollback`` (100 lines unless set), its lines cut at
  the window's width: what scrolled past it between two reads is not seen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

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
    """The command prefix that runs a tool as ``uid``; None when this process cannot."""
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


def _env(uid: int) -> dict[str, str]:
    """A tool's environment: PATH, a UTF-8 locale, and the user's names (screen finds its
    sockets' folder by the user's login name)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
    try:
        import pwd

        entry = pwd.getpwuid(uid)
        env.update(USER=entry.pw_name, LOGNAME=entry.pw_name, HOME=entry.pw_dir)
    except KeyError:
        pass
    return env


def _run(uid: int, *argv: str) -> str | None:
    """``argv`` as ``uid``; its output, or None."""
    prefix = _as(uid)
    if prefix is None:
        return None
    try:
        res = subprocess.run([*prefix, *argv], capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                             env=_env(uid))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.decode(errors="replace") if res.returncode == 0 else None


def tmux(pane: dict, *args: str) -> str | None:
    """``tmux -S SOCKET ARGS`` as the server's owner; its output, or None."""
    return _run(int(pane["uid"]), "tmux", "-S", pane["socket"], *args)


def screen_window_of(pid: int, tty: str) -> dict | None:
    """The GNU screen window whose terminal ``tty`` is the stdout of ``pid``, from the session and
    window screen put in its environment (``STY``, ``WINDOW``), each checked against /proc; None
    when it is no screen's."""
    env = procfs.environ(pid) or {}
    sty, window = env.get("STY", ""), env.get("WINDOW", "")
    head = sty.split(".", 1)[0]
    if not head.isdigit() or not window.isdigit() or shutil.which("screen") is None:
        return None
    server = int(head)
    if procfs.comm(server) != "screen":
        return None
    try:
        uid = os.stat(f"/proc/{server}").st_uid
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return None  # a session of another user than the job's
    except OSError:
        return None
    # The window's first process (a child of the server, the job or an ancestor of it) holds the terminal.
    here, seen = pid, 0
    while here > 1 and seen < 64:
        st = procfs.stat(here)
        if st is None:
            return None
        if st.ppid == server:
            held = procfs.fd_targets(here) or {}
            if tty not in (held.get(0), held.get(1), held.get(2)):
                return None
            return {"kind": "screen", "tty": tty, "session": sty, "window": window, "uid": uid, "server": server,
                    "where": f"session {sty} window {window}"}
        here, seen = st.ppid, seen + 1
    return None


def screen_hardcopy(pane: dict) -> str | None:
    """The window's scrollback and screen (``hardcopy -h``), read as the session's owner; None
    when it cannot be read."""
    uid = int(pane["uid"])
    if _as(uid) is None:
        return None
    folder = tempfile.mkdtemp(prefix="ups-screen-")
    try:
        if uid != os.geteuid():
            os.chown(folder, uid, -1)  # the user's screen writes there; ups reads it as that user
        copy = os.path.join(folder, "hardcopy")
        target = ["screen", "-S", pane["session"], "-p", str(pane["window"])]
        if _run(uid, *target, "-X", "hardcopy", "-h", copy) is None:
            return None
        _run(uid, "screen", "-S", pane["session"], "-Q", "windows")  # returns once the server did the hardcopy
        return _run(uid, "cat", "--", copy)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def capture(pane: dict) -> str | None:
    """What the pane or window shows, with its scrollback."""
    if pane.get("kind") == "screen":
        return screen_hardcopy(pane)
    return tmux(pane, "capture-pane", "-p", "-J", "-S", f"-{CAPTURE_LINES}", "-t", pane["pane"])


def pane_of(pid: int) -> dict | None:
    """The tmux pane or screen window whose terminal is the process's stdout: ``{"kind", "tty",
    "uid", "server", "where"}`` and ``"socket", "pane"`` (tmux) or ``"session", "window"``
    (screen); None when its stdout is no terminal, or no tmux server or screen here owns it."""
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
                return {"kind": "tmux", "tty": tty, "socket": socket, "uid": uid, "server": server, "pane": parts[1],
                        "where": parts[2]}
    return screen_window_of(pid, tty)


def describe(pane: dict) -> str:
    """The chain from the terminal to what owns it, for ``ups attach``'s output."""
    if pane.get("kind") == "screen":
        return f"{pane['tty']} → screen window {pane['window']} (session {pane['session']}, server pid {pane['server']})"
    return f"{pane['tty']} → tmux pane {pane['pane']} ({pane['where']}, server pid {pane['server']})"


class PaneReader:
    """What the pane shows that was not given before, as bytes of lines (the observer's log)."""

    def __init__(self, pane: dict) -> None:
        self.pane = pane
        self.given: list[str] | None = None  # the lines given so far that are still in the capture's range
        self.last: str | None = None  # the pane's last line as last given

    def read(self) -> tuple[bytes, bool]:
        text = capture(self.pane)
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
