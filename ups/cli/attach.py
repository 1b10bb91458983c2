"""``ups attach``: a PyTorch job ups did not start, found from any of its pids and watched from outside."""

from __future__ import annotations

from typing import Annotated

import typer

from ups.cli.common import JsonOption, RunsDirOption, default_runs_dir, fail, print_json
from ups.cli.launch_options import NotifyOption

commands = typer.Typer()  # registered by ups.cli.app, the root
ORPHAN_NOTE = "its ranks share no parent now (one torchrun run id): `ups attach PID` on any one of them watches them all"


@commands.command("attach")
def attach_cmd(
    pid: Annotated[int | None, typer.Argument(help="Any process of the job: torchrun's agent, a rank, a DataLoader "
                                                   "worker, an mp.spawn parent, a launcher.", show_default=False)] = None,
    scan: Annotated[bool, typer.Option("--scan", help="List every PyTorch job on this host that ups does not watch "
                                                      "(once each), and ranks whose agent died; attach nothing.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the job's processes and their roles; attach nothing.")] = False,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Name the attached run (default: a new id). A job "
                                                                "of several nodes: give the same id on each node, "
                                                                "and they make one run.")] = None,
    notify: NotifyOption = None,
    inject: Annotated[bool, typer.Option("--inject", help="Also start ups's in-process reporter inside each rank "
                                                          "(Python >= 3.14 in the job: PEP 768 sys.remote_exec). It runs "
                                                          "code in the program and stays until it ends: see docs/attach.md. "
                                                          "Where it cannot, one line says why; the job is attached anyway.")] = False,
    share: Annotated[bool, typer.Option("--share", help="Another user's job: leave its run folder readable by every "
                                                        "user (as a run of yours). By default it is yours alone (mode "
                                                        "700): its stacks and log come from a job others cannot read. "
                                                        "The log copy is never wider than the job's own file.")] = False,
    log_cap: Annotated[int | None, typer.Option("--log-cap", min=1, metavar="MIB", show_default=False,
                                                help="Cap of the job's log copy (logs/job.log) in MiB, default 64; "
                                                     "past it the copy becomes job.log.1 (one kept).")] = None,
    runs_dir: RunsDirOption = default_runs_dir(),
    json: JsonOption = False,
) -> None:
    """Watch a job ups did not launch (a plain torchrun, a SLURM script, a notebook's job)
    from outside, as a run: `ups status`, `why`, `stacks`, `logs` and `kill` then work on it.

    From PID it walks the process tree up to the job's top and down to every process, and
    names each one's role from its environment (RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
    TORCHELASTIC_*, MASTER_ADDR/PORT), command line and parentage; its log is where its stdout
    or stderr go to a file.

    Then one observer process (detached; the run's only writer) samples each process from
    /proc (CPU, I/O, state, kernel wait, threads), reads its stacks with `py-spy dump
    --nonblocking` every 10 s (its memory read while it runs: no pause, no signal; `pip install
    'ups[attach]'`), and reads progress and errors from the log. Nothing goes into the job and
    nothing signals it. Where ptrace is refused it says so once, with the fix, and goes on
    without stacks. It is never acted on automatically.

    A job of several nodes: run `ups attach PID --run-id ID` on each node with the same ID
    (and a shared runs folder, or each node's read with `--remote`): one run, each node's
    observer writing its own node's records, ended when every node's job has ended.

    An orphan (a rank whose torchrun agent died, re-parented to init) is attached with every
    other orphaned rank of its job on this host, and their DataLoader workers: one run.

    A SLURM step's tasks (started by srun under slurmstepd) are its ranks by SLURM_PROCID, one
    job from any task's pid, named by job id, step, user and node; its log is the job's
    output file (slurm-<job>.out).

    --scan lists the jobs on this host ups does not watch (jobs started by `ups launch` and
    attached ones left out), and orphans, with the ports they listen on and the GPU memory
    they hold (NVML). See docs/attach.md.

    --notify tells someone as for a launched run: a hang once the observer proved it (idle
    windows and the same stack twice, the proof in the message), another problem verdict, and
    the job's end (failed, with the cause read from its log). Delivery never holds up the
    observer, and nothing is sent to the job.

    --inject (on request only) goes further than watching: through sys.remote_exec (PEP 768,
    Python >= 3.14 in the job; the permission a debugger needs) each rank runs ups's start-up
    at its next bytecode boundary: the hooks `ups launch` installs and the Reporter's heartbeat
    thread, inside the program, until it ends (it cannot be undone). Where the job's Python is
    older, its owner turned remote debugging off (PYTHON_DISABLE_REMOTE_DEBUG, -X
    disable_remote_debug) or ptrace is refused, one line says so and the job is attached
    without it.

    Exit codes: 0 attached (or listed), 2 bad input (no such pid, not a PyTorch job, already
    watched). --json prints the job ({"top", "given", "log", "world_size", "nnodes", "node_rank",
    "orphan", "roots", "slurm", "processes": [...]}) with "run_id" and "multinode"; with --scan,
    {"jobs": [...], "orphans": [...], "gpu"}.
    """
    from ups.attach.find import find_job
    from ups.attach.find import scan as scan_jobs
    from ups.errors import UpsError

    if scan:
        if pid is not None:
            raise fail("give a pid or --scan, not both")
        found = scan_jobs(runs_dir)
        if json:
            print_json(found)
            return
        if not found["jobs"]:
            typer.echo("no PyTorch job on this host that ups does not watch")
            return
        for j in found["jobs"]:
            _say(("ORPHAN (its agent died) " if j["orphan"] else "") + j["describe"] + (f"; log {j.get('log_via') or j['log']}" if j["log"] or j.get("log_pane") else ""))
            for p in j["processes"]:
                held = ""
                if p.get("ports"):
                    held += f", listens on {', '.join(map(str, p['ports']))}"
                if p.get("gpu_bytes"):
                    held += f", {p['gpu_bytes'] / 2**30:.1f} GiB GPU memory"
                _say(f"  pid {p['pid']:>7}  {p['label']:<22} {' '.join(p['argv'])[:70]}{held}")
            if j["orphan"] and sum(p["role"] == "rank" for p in j["processes"]) > 1:
                _say(f"  {ORPHAN_NOTE}")
        if found["gpu"] != "NVML":
            _say(found["gpu"])
        typer.echo("attach one with: ups attach PID")
        return
    if pid is None:
        raise fail("give the pid of any process of the job (or --scan to list them)")
    try:
        job = find_job(pid)
    except UpsError as exc:
        raise fail(str(exc)) from None
    if dry_run:
        if json:
            print_json(job.to_dict())
            return
        _show(job)
        return
    from ups.attach.joblog import LOG_CAP
    from ups.attach.start import attach_job, who
    from ups.cli.launch_options import notify_fields

    try:
        fields = {**notify_fields(notify), **({"inject": True} if inject else {})}  # a bad target: one line, nothing attached
        run, proc = attach_job(job, runs_dir, actor=f"cli:{who()}", run_id=run_id, fields=fields, share=share,
                               log_cap=log_cap << 20 if log_cap else LOG_CAP)
    except UpsError as exc:
        raise fail(str(exc)) from None
    injected, lines = [], []
    if inject:
        from ups.attach.inject import inject_job

        injected, lines = inject_job(run, job, actor=f"cli:{who()}")  # a refusal is a line, never a failure: the run is attached
    if json:
        print_json({**job.to_dict(), "run_id": run.run_id, "run_dir": str(run.path), "multinode": run.is_multinode,
                    **({"inject": [o.to_dict() for o in injected]} if inject else {})})
        return
    _show(job, joined=run.is_multinode)
    if run.is_multinode:
        from ups.status.host import hostname

        typer.echo(f"node {hostname()} (node rank {job.node_rank} of {job.nnodes}) joined run {run.run_id}")
    typer.echo(f"attached as run {run.run_id} (observer pid {proc.pid}); try: ups why {run.run_id}")
    for line in lines:
        _say(line)


def _say(text: str) -> None:
    """A line about other people's processes (their command lines, log paths): shown as text,
    never as terminal control sequences (ups.status.printable)."""
    from ups.status.printable import printable

    typer.echo(printable(text))


def _show(job, *, joined: bool = False) -> None:  # ups.attach.find.Job, imported lazily
    _say(job.describe() + (f"; log {job.log_via or job.log}" if job.log or job.log_pane else
                           "; no log file (stdout and stderr are not files, no reader of a pipe writes one, and no "
                           "tmux pane or screen window here owns its terminal)"))
    if job.orphan:
        typer.echo(f"its torchrun agent is gone: the {len(job.ranks)} rank(s) it left on this host (re-parented to "
                   "init) are watched as one job")
    if (job.nnodes or 1) > 1 and not joined:
        typer.echo(f"this job spans {job.nnodes} nodes (this one is node rank {job.node_rank}): this host's "
                   "processes only; attach each node with the same --run-id to make one run")
    for p in job.procs:
        env = " ".join(f"{k}={v}" for k, v in p.env.items() if k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
                                                                         "SLURM_PROCID"))
        _say(f"  pid {p.pid:>7}  {p.label:<22} {env:<40} {' '.join(p.argv)[:60]}")
