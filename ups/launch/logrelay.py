"""The job's output relay: the job writes to a pipe, this process appends it to ``logs/job.log``.

Why not hand the job the log file as its stdout: on a full disk every ``print`` of the
program then fails (``OSError: [Errno 28]``), and the program dies of its own log. Through a
pipe, the program's writes only ever fill a pipe this relay keeps draining; what cannot be
written to the log is dropped, counted, and said (a line in the log when space returns, and
a report to the launcher, which puts it in run.json and the event log).

Why a process of its own, not a thread of the launcher: if the launcher dies (OOM killer, a
bug) the job runs on (``ups adopt`` takes it over), and a reader of the pipe must outlive it,
or the job's next write gets EPIPE. The relay ignores SIGINT, SIGTERM and SIGHUP, imports
nothing but the standard library's ``os``, and ends when every writer of the pipe has closed
it (the job and everything it started).

Usage (the launcher's): ``python -m ups.launch.logrelay LOG_FD`` with the pipe on stdin and
the report pipe on stdout: one JSON line per change (``{"dropped": N, "error": ..., "since":
T}``, then ``"resumed"``), and a final one with ``"end": true``.

It also reads the counter the program prints ("converted 5/40 files": ups.launch.lineprogress)
and reports it (``{"progress": {"k", "n", "at", "text"}}``, at most once a second): a program
with no other progress signal has one. Only the last lines of each batch are read.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from ups.launch.lineprogress import LineProgress

CHUNK = 1 << 20  # the whole pipe at once
NAP_S = 0.01
LINES_READ = 64  # of each batch, the last lines: a counter is what was printed last
PROGRESS_EVERY_S = 1.0


class Relay:
    def __init__(self, src: int, log: int, report: int | None) -> None:
        self.src, self.log, self.report = src, log, report
        self.dropped = 0  # bytes never written
        self.total = 0
        self.error: str | None = None  # why the current drop episode began (None: writing)
        self.since: float | None = None
        self.episodes: list[dict] = []
        self.lines = LineProgress()
        self._partial = b""
        self._said_progress: tuple | None = None
        self._progress_at = 0.0

    def say(self, **fields: object) -> None:
        if self.report is None:
            return
        try:
            os.write(self.report, (json.dumps({"dropped": self.dropped, "total": self.total, **fields}) + "\n").encode())
        except OSError:
            self.report = None  # the launcher is gone: the job's output still matters

    def _write_all(self, data: bytes) -> OSError | None:
        """Write all of ``data``; the error that stopped it (what was not written is counted)."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.log, view)
            except InterruptedError:
                continue
            except OSError as exc:
                self.dropped += len(view)
                return exc
            view = view[n:]
        return None

    def write(self, data: bytes) -> None:
        if self.error is not None and not self.resume():
            self.dropped += len(data)  # still no space: one failed write per chunk, no more
            return
        exc = self._write_all(data)
        if exc is not None:
            self.error, self.since = exc.strerror or str(exc), time.time()
            self.say(error=self.error, since=self.since)

    def resume(self) -> bool:
        """Try to say in the log what is missing before what follows; True once it is said."""
        lost = self.dropped - sum(e["bytes"] for e in self.episodes)
        stamp = time.strftime("%H:%M:%S", time.localtime(self.since or time.time()))
        note = (f"\n[ups: {lost} bytes of the job's output were dropped from {stamp} to "
                f"{time.strftime('%H:%M:%S')}: {self.error}]\n").encode()
        before = self.dropped
        if self._write_all(note) is not None:
            self.dropped = before  # our own note is not the job's output
            return False
        self.episodes.append({"bytes": lost, "error": self.error, "since": self.since, "until": time.time()})
        self.say(resumed=time.time(), error=self.error, since=self.since)
        self.error = self.since = None
        return True

    def read_progress(self, data: bytes) -> None:
        """The counter in the latest lines (never in the program's way: any error is dropped)."""
        try:
            text = self._partial + data
            cut = max(text.rfind(b"\n"), text.rfind(b"\r")) + 1
            self._partial = text[cut:][-4096:]
            at = time.time()
            for line in text[:cut].decode("utf-8", "replace").splitlines()[-LINES_READ:]:
                self.lines.feed(line, at)
            now = time.monotonic()
            if now - self._progress_at < PROGRESS_EVERY_S:
                return
            current = self.lines.current()
            if current is not None and (current["k"], current["n"]) != self._said_progress:
                self._said_progress, self._progress_at = (current["k"], current["n"]), now
                self.say(progress=current)
        except Exception:  # noqa: BLE001 - reading the output must never cost the output
            pass

    def run(self) -> int:
        while True:
            try:
                data = os.read(self.src, CHUNK)
            except InterruptedError:
                continue
            if not data:
                break
            self.total += len(data)
            self.write(data)
            self.read_progress(data)
            if len(data) < CHUNK:
                # A program that prints line by line (unbuffered, as the launcher sets it) would
                # wake us once per line; a short nap lets the pipe (1 MiB) gather a batch, so the
                # relay costs one read and one write per batch, not per line, and the program
                # never waits (it would need to print 1 MiB within the nap).
                time.sleep(NAP_S)
        if self.error is not None:
            self.resume()
        self.say(end=True, error=self.error, since=self.since, episodes=self.episodes)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return Relay(0, int(args[0]), 1).run()


if __name__ == "__main__":
    sys.exit(main())
