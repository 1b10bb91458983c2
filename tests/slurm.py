"""A real one-node SLURM cluster for the tests: Debian's ``slurm-wlm`` and ``munge``, started in
a folder of the test's own and stopped after the tests.

``Cluster.start(root)`` writes ``root/slurm.conf`` (this host's short name as the one node, 2
CPUs, ``proctrack/linuxproc`` and ``task/none``: no cgroup, no systemd), makes a munge key of
its own and starts ``munged``, ``slurmctld`` and ``slurmd`` in the foreground as this process's
children, on ports no other cluster uses, with every state, spool, pid and log file under
``root``; nothing outside ``root`` is written. Clients find the cluster through ``SLURM_CONF``
(:attr:`Cluster.env`). ``stop()`` cancels what is left and ends the daemons it started, by
their pids. Where a daemon cannot start, :class:`Unavailable` says why in one line (the tests
skip with it).

SLURM's own output (``scontrol show job -o``) is read here, once, for the tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "sinfo", "squeue")
START_S = 30.0


class Unavailable(RuntimeError):
    """The cluster cannot run here (a tool missing, not root, a daemon that would not start)."""


def _tool(name: str) -> str:
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{name} is not installed (apt-get install slurm-wlm munge)")
    return found


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


CONF = """\
ClusterName=upstest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=600
OverTimeLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_s: float | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a client of this cluster needs in its environment."""
        return {"SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, root: Path) -> Cluster:
        if os.geteuid() != 0:
            raise Unavailable("slurmd runs each task as its user: the local cluster needs root")
        tools = {name: _tool(name) for name in DAEMONS + CLIENTS}
        c = cls(root)
        t0 = time.monotonic()
        for d in ("munge", "state", "spool", "log"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (root / "plugstack.conf").write_text("")
        ctld_port, slurmd_port = _free_ports(2)
        c.conf.write_text(CONF.format(host=c.host, root=root, ctld_port=ctld_port, slurmd_port=slurmd_port))
        try:
            m = root / "munge"
            c._spawn([tools["munged"], "-F", "-f", f"--key-file={key}", f"--socket={m}/munge.sock",
                      f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
                     "munged")
            c._wait(lambda: (m / "munge.sock").exists(), "munged made no socket", "munge/munged.log")
            c._spawn([tools["slurmctld"], "-D", "-i", "-c", "-f", str(c.conf)], "slurmctld")
            c._spawn([tools["slurmd"], "-D", "-f", str(c.conf)], "slurmd")
            c._wait(lambda: c.client("sinfo", "-h", "-o", "%t", check=False).strip() == "idle",
                    "the node never became idle", "log/slurmd.log")
        except BaseException:
            c.stop()
            raise
        c.started_s = time.monotonic() - t0
        return c

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        try:
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                               cwd=self.root, start_new_session=True))
        finally:
            out.close()

    def _wait(self, ready, what: str, log: str) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if ready():
                return
            dead = next((p for p in self.procs if p.poll() is not None), None)
            if dead is not None:
                break
            time.sleep(0.1)
        tail = ""
        for f in (self.root / log, *sorted((self.root / "log").glob("*.out"))):
            if f.exists():
                tail += " | ".join(f.read_text(errors="replace").strip().splitlines()[-2:])
        raise Unavailable(f"local SLURM did not start: {what} ({tail[-300:]})")

    def client(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        res = subprocess.run([argv[0], *argv[1:]], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **self.env})
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def sbatch(self, script: Path, *args: str, env: dict[str, str] | None = None) -> int:
        """Submit ``script`` from its folder (its output is that folder's ``slurm-<job>.out``)."""
        res = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True, timeout=30,
                             cwd=script.parent, env={**os.environ, **(env or {}), **self.env})
        if res.returncode != 0:
            raise RuntimeError(f"sbatch: exit {res.returncode}: {res.stderr.strip()}")
        return int(res.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o``'s fields (JobState, Reason, ...); {} once SLURM forgot it."""
        out = self.client("scontrol", "show", "job", "-o", str(job_id), check=False)
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} never reached {states}: {info.get('JobState')} {info.get('Reason')}")

    def idle(self, timeout: float = 60) -> None:
        """Every job of the cluster cancelled and gone (so the next test has both CPUs)."""
        self.client("scancel", "--full", "--partition=debug", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.client("squeue", "-h", "-t", "PD,R,CG,S", check=False).strip():
                return
            time.sleep(0.2)
        raise AssertionError("jobs left on the local cluster: " + self.client("squeue", check=False))

    def stop(self) -> None:
        try:
            if any(p.poll() is None for p in self.procs[1:]):
                self.idle(timeout=20)
        except Exception:  # noqa: BLE001 - stopping anyway
            pass
        for p in reversed(self.procs):  # slurmd, slurmctld, munged: the ones started here, by pid
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        self.procs.clear()
