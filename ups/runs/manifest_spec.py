"""What a run's manifest (``run.json``, ``nodes/<host>.json``) must hold to be read.

The manifest is written by ``ups`` itself, but it sits in a runs folder, where anything may
have replaced it (docs/design.md, "Trust boundary"). Every key a reader looks at is checked here,
through :mod:`ups.status.safeio`, before any other code sees the manifest: a key of the wrong
type or out of range makes the whole manifest unreadable, with the key and why ("run.json:
'created_at' is a string, not a number"), and the run is listed as such. Keys nobody reads
pass through made safe for display (a newer ``ups`` may add some).
"""

from __future__ import annotations

from typing import Any

from ups.status.safeio import (
    INT_MAX,
    NAME_MAX,
    PID_MAX,
    BadFile,
    Check,
    boolean,
    check_object,
    dict_of,
    integer,
    list_of,
    number,
    obj,
    optional,
    safe_value,
    text,
)

RUN_STATES = ("launching", "running", "succeeded", "partial", "failed", "killed", "lost", "ended")
MANIFEST_SCHEMA = 1


def _int_or_text(v: Any) -> Any:
    """A signal: its number or its name."""
    if isinstance(v, str):
        return text(64, cut=False)(v)
    return integer(-(1 << 31), 1 << 31)(v)


_NAME = text(NAME_MAX, cut=False)
_TIME = optional(number(0.0))
_PID = integer(1, PID_MAX)
_CODE = optional(integer(-(1 << 31), 1 << 31))
_COUNT = optional(integer(0, INT_MAX))
_SMALL = optional(integer(0, PID_MAX))
_ARGV = list_of(text(), 100_000)
_PROCESS = optional(obj({"pid": _PID, "pid_start": _TIME, "pgid": optional(_PID), "adopted": optional(boolean),
                         "command": optional(_ARGV), "host": optional(_NAME)}, required=("pid",)))
_FAILURE_ENTRY = obj({"rank": _SMALL, "state": optional(_NAME), "signal": optional(_int_or_text), "exit_code": _CODE})
_FAILURE = optional(obj({
    "rank": _SMALL, "name": optional(_NAME), "node": optional(_NAME), "pid": optional(_PID), "phase": optional(_NAME),
    "error": optional(text()), "error_site": optional(text(1024)), "signal": optional(_int_or_text), "exit_code": _CODE,
    "step": _COUNT, "clean": optional(boolean), "torchrun_root": _SMALL, "followed_by": optional(list_of(_FAILURE_ENTRY)),
}))
_THRESHOLD = optional(number(0.0, 1e9))
_THRESHOLDS = optional(obj({
    "phase_stalled_after": optional(dict_of(_THRESHOLD, 1000)),
}, unknown=_THRESHOLD))
_VERDICT = optional(obj({key: optional(text()) for key in ("mode", "headline", "next", "text")}
                        | {"ok": optional(boolean), "since": _TIME, "evidence": optional(list_of(safe_value)),
                           "who": optional(dict_of(safe_value)), "where": optional(dict_of(safe_value))}))
_MULTINODE = optional(obj({"nnodes": optional(integer(1, 1 << 20)), "node_rank": _SMALL,
                           "rdzv_endpoint": optional(text(1024))}))

MANIFEST_SPEC: dict[str, Check] = {
    "schema": integer(0, MANIFEST_SCHEMA + 1),
    "id": _NAME, "kind": _NAME, "name": optional(_NAME), "state": text(choices=RUN_STATES),
    "created_at": _TIME, "ended_at": _TIME, "host": optional(_NAME),
    "argv": optional(_ARGV), "command": optional(_ARGV), "command_template": optional(_ARGV),
    "config": optional(dict_of(safe_value)), "env": optional(dict_of(text())), "cwd": optional(text(4096)),
    "launcher": _PROCESS, "job": _PROCESS, "previous_launchers": optional(list_of(_PROCESS)),
    "ranks": optional(dict_of(safe_value)),
    "thresholds": _THRESHOLDS,
    "instrument": optional(boolean), "top_role": optional(_NAME), "automatic": optional(text(choices=("act", "observe"))),
    "world_size": _SMALL, "node_rank": _SMALL,  # nproc, nnodes: torchrun's words ("gpu", "1:4"), shown as given
    "exit_code": _CODE, "signal": optional(_int_or_text), "summary": optional(text()), "failure": _FAILURE,
    "verdict": _VERDICT, "launcher_lost": optional(boolean), "multinode": _MULTINODE,
    "program": optional(dict_of(safe_value)),
    "failed_nodes": optional(list_of(_NAME)), "unreachable_nodes": optional(list_of(_NAME)),
    "stages": optional(list_of(obj({"stage": optional(_NAME), "run_id": optional(_NAME), "state": optional(_NAME),
                                    "summary": optional(text())}))),
    "skipped_shards": optional(list_of(safe_value)),
    # Unattended runs (--on-hang, --max-restarts, --notify): each attempt's end and verdict.
    "attempt": optional(integer(1, INT_MAX)), "restarts": _COUNT, "max_restarts": _COUNT,
    "on_hang": optional(text(choices=("observe", "dump", "kill", "restart"))),
    "on_worker_hang": optional(text(choices=("same", "fallback"))),
    "notify": optional(list_of(text(4096), 100)),
    "restart_window": optional(number(0.0)), "first_step_s": _TIME,
    "attempts": optional(list_of(obj({"attempt": optional(integer(1, INT_MAX)), "ended_at": _TIME,
                                      "ended": optional(text()), "verdict": _VERDICT,
                                      "records": optional(text(4096)),
                                      # the restart policy's facts (ups.launch.policy) and what the attempt cost
                                      "hang": optional(dict_of(safe_value)), "step": _COUNT, "reason": optional(text()),
                                      "started_at": _TIME, "restarted_at": _TIME,
                                      "first_step_s": _TIME, "hang_to_restart_s": _TIME}), 10_000)),
    # Multi-node runs: the node manifests merged on read (each one checked on its own).
    "nodes": optional(dict_of(dict_of(safe_value), 100_000)),
}


# What a launcher turns into a process: kept exactly as written (not made safe for display),
# and read only from a run proven the acting user's (ups.runs.ownership.OwnRun).
EXEC_FIELDS = ("command", "command_template", "env", "cwd", "notify")


def exec_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The command, its template, environment, working folder and notification targets of a
    manifest, type-checked but byte for byte; BadFile("'key' <why>") otherwise."""

    def strings(v: Any, what: str) -> list[str]:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BadFile(f"{what} is not a list of strings")
        return list(v)

    out: dict[str, Any] = {}
    for key in ("command", "command_template", "notify"):
        if data.get(key) is not None:
            out[key] = strings(data[key], repr(key))
    env = data.get("env")
    if env is not None:
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise BadFile("'env' is not an object of strings")
        out["env"] = dict(env)
    if data.get("cwd") is not None:
        if not isinstance(data["cwd"], str):
            raise BadFile("'cwd' is not a string")
        out["cwd"] = data["cwd"]
    return out


def check_manifest(data: Any) -> dict[str, Any]:
    """A decoded manifest, every key a reader uses checked; BadFile("'key' <why>") otherwise."""
    if not isinstance(data, dict):
        raise BadFile(f"a JSON {type(data).__name__}, not an object")
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or not 0 <= schema <= MANIFEST_SCHEMA:
        raise BadFile(f"unknown manifest schema {safe_value(schema)!r:.40}")
    return check_object(data, MANIFEST_SPEC, required=("schema",))
