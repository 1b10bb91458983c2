"""PyTorch's Flight Recorder dumps of a run, read as evidence: where the ranks' collectives part.

With its buffer on (``TORCH_FR_BUFFER_SIZE``, formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``) torch
records each rank's last collectives per process group: the sequence number in the group
(``collective_seq_id``), the op (``profiling_name``, ``nccl:all_reduce`` / ``gloo:broadcast``),
sizes, state and the Python frames. A dump is written by NCCL's watchdog on a timeout to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + the rank (a pickle), and by ups's instrumentation
(:mod:`ups.instrument.flight`: torch's JSON form) when a collective raises or lasts; both land in
the run's ``flight/`` folder, one file per rank, named with the rank at the end
(``rank-1.json``, ``nccl_trace_rank_1``).

Reading is pure (files of the run, no process touched). JSON is preferred. A pickle is read
only when :class:`~ups.runs.ownership.OwnRun` proves the run is the acting user's and the file
and its folder are theirs with no one else allowed to write them, and then by an unpickler that
builds plain containers only (no class is ever looked up): a pickle another user could have
written is never opened.

:func:`parting` compares the ranks' dumps group by group: the first sequence number that not
every rank reached (the rank ahead entered a collective its peers never did: one-sided), or the
first one whose op or sizes differ between ranks (mismatched).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
from dataclasses import dataclass, field

FLIGHT_DIR = "flight"
MAX_DUMP_BYTES = 32 << 20
MAX_DUMPS = 1024
_RANK = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


@dataclass
class Dump:
    rank: int
    file: str  # relative to the run folder
    form: str  # "json" | "pickle"
    entries: list[dict]


@dataclass
class Reading:
    """The dumps found in a run, and what could not be read (file -> why)."""

    dumps: list[Dump] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)


@dataclass
class Parting:
    """Where the ranks' collectives part in one process group."""

    group: str
    seq: int
    kind: str  # "missing": some ranks never entered #seq; "mismatch": they entered different ops
    ahead: dict[int, dict] = field(default_factory=dict)  # rank -> its entry at seq
    behind: dict[int, dict | None] = field(default_factory=dict)  # rank -> its last entry before seq (missing)
    files: list[str] = field(default_factory=list)

    @property
    def odd_ranks(self) -> list[int]:
        """The ranks out of step: those ahead (one-sided); for a mismatch, the smaller side."""
        if self.kind == "missing":
            return sorted(self.ahead)
        by_op: dict[str, list[int]] = {}
        for rank, e in self.ahead.items():
            by_op.setdefault(op_of(e), []).append(rank)
        sides = sorted(by_op.values(), key=lambda v: (len(v), v))
        return sorted(sides[0]) if len(sides) > 1 and len(sides[0]) < len(sides[-1]) else []

    def text(self) -> str:
        where = f"Flight Recorder ({', '.join(self.files[:2])}{' ...' if len(self.files) > 2 else ''})"
        group = "" if self.group in ("default_pg", "0") else f" of group {self.group}"
        if self.kind == "missing":
            ahead = "; ".join(f"rank {r} entered {op_of(e)} #{self.seq} ({e.get('state') or '?'})"
                              for r, e in sorted(self.ahead.items()))
            behind = "; ".join(f"rank {r} never did (its last: {op_of(e)} #{e.get('collective_seq_id')})" if e
                               else f"rank {r} never did (no collective recorded)" for r, e in sorted(self.behind.items()))
            return f"{where}: the ranks part at collective #{self.seq}{group}: {ahead}; {behind}"
        sides = "; ".join(f"rank {r}: {op_of(e)} {e.get('input_sizes')}" for r, e in sorted(self.ahead.items()))
        return f"{where}: the ranks part at collective #{self.seq}{group}, different collectives: {sides}"


def op_of(entry: dict) -> str:
    """``all_reduce`` of ``gloo:all_reduce``, ``send 1->2`` of ``nccl:send 1->2``."""
    name = str(entry.get("profiling_name") or "?")
    return name.split(":", 1)[1] if ":" in name else name


# --------------------------------------------------------------------------- reading
def read_run_dumps(run_path: str | os.PathLike[str]) -> Reading:
    """Every rank's dump in ``<run>/flight/``; never raises."""
    out = Reading()
    folder = os.path.join(os.fspath(run_path), FLIGHT_DIR)
    try:
        names = sorted(os.listdir(folder))[:MAX_DUMPS]
    except OSError:
        return out
    owned = None  # the ownership proof, opened once and only if a pickle is met
    try:
        for name in names:
            m = _RANK.search(name)
            if name.startswith(".") or m is None:
                continue
            rel = f"{FLIGHT_DIR}/{name}"
            try:
                data, form = _read_one(os.path.join(folder, name))
                if form == "pickle":
                    if owned is None:
                        owned = _own(run_path)
                    if isinstance(owned, str):
                        raise ValueError(owned)
                    _check_folder(folder, owned.owner)
                    data = _unpickle(owned.read(rel, MAX_DUMP_BYTES))
            except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
                out.problems[rel] = str(exc) or type(exc).__name__
                continue
            except Exception as exc:  # noqa: BLE001 - a Refused from the proof, a foreign shape
                out.problems[rel] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                continue
            entries = data.get("entries") if isinstance(data, dict) else None
            if not isinstance(entries, list):
                out.problems[rel] = "not a Flight Recorder dump (no entries)"
                continue
            out.dumps.append(Dump(int(m.group(1)), rel, form, [e for e in entries if isinstance(e, dict)]))
    finally:
        if owned is not None and not isinstance(owned, str):
            owned.close()
    return out


_DECODED: dict[tuple, object] = {}  # JSON dumps by (device, inode, mtime, size): the console asks every second
_DECODED_KEPT = 256


def _read_one(path: str) -> tuple[object, str]:
    """(decoded JSON, "json") or (None, "pickle"): the bytes say which; a pickle is decoded only
    after the ownership proof, by the caller."""
    from ups.status.safeio import BadFile, decode_json, read_bytes

    st = os.stat(path, follow_symlinks=False)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key in _DECODED:
        return _DECODED[key], "json"
    try:
        raw = read_bytes(path, MAX_DUMP_BYTES)
    except BadFile as exc:
        raise ValueError(str(exc)) from None
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            data = decode_json(raw)
        except BadFile as exc:
            raise ValueError(f"bad JSON ({exc})") from None
        if len(_DECODED) >= _DECODED_KEPT:
            _DECODED.clear()
        _DECODED[key] = data
        return data, "json"
    if raw[:1] == b"\x80":  # pickle protocol 2+
        return None, "pickle"
    raise ValueError("neither JSON nor a pickle")


def _own(run_path: str | os.PathLike[str]):  # OwnRun, or why not
    from ups.errors import Refused
    from ups.runs.ownership import OwnRun

    try:
        return OwnRun(run_path, nothing="its Flight Recorder pickles were not read")
    except Refused as exc:
        return str(exc)


def _check_folder(folder: str, owner: int) -> None:
    st = os.stat(folder, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"{FLIGHT_DIR}/ is not a folder of yours that only you can write: its pickles were not read")


class _PlainUnpickler(pickle.Unpickler):
    """Dicts, lists, tuples, strings and numbers only: no class or function is ever looked up."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name} (a dump holds plain values only)")


def _unpickle(raw: bytes) -> object:
    return _PlainUnpickler(io.BytesIO(raw)).load()


# --------------------------------------------------------------------------- judging
def _group_of(entry: dict) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        desc = pg[1] if len(pg) > 1 and isinstance(pg[1], str) and pg[1] else None
        return desc or str(pg[0])
    return str(entry.get("pg_id", "?"))


def _collectives(dump: Dump) -> dict[str, dict[int, dict]]:
    """group -> seq -> entry, collectives only (p2p has its own numbering)."""
    out: dict[str, dict[int, dict]] = {}
    for e in dump.entries:
        seq = e.get("collective_seq_id")
        if e.get("is_p2p") or isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
            continue
        out.setdefault(_group_of(e), {})[seq] = e
    return out


def parting(dumps: list[Dump]) -> Parting | None:
    """The first place, over the groups of the dumps, where the ranks' collectives part; None
    when fewer than two ranks dumped or every rank went through the same collectives."""
    by_rank = {}
    for d in dumps:
        by_rank.setdefault(d.rank, d)  # one dump a rank
    if len(by_rank) < 2:
        return None
    colls = {rank: _collectives(d) for rank, d in by_rank.items()}
    files = [d.file for _, d in sorted(by_rank.items())]
    found: list[Parting] = []
    for group in sorted({g for c in colls.values() for g in c}):
        seqs = {rank: c.get(group, {}) for rank, c in colls.items()}
        members = {rank: s for rank, s in seqs.items() if s}
        if len(members) < 2:
            continue
        lasts = {rank: max(s) for rank, s in members.items()}
        firsts = {rank: min(s) for rank, s in members.items()}
        low = min(lasts.values())
        # Ops compared where every rank's buffer still holds them.
        for seq in range(max(firsts.values()), low + 1):
            entries = {rank: s.get(seq) for rank, s in members.items()}
            if any(e is None for e in entries.values()):
                continue
            if len({(op_of(e), str(e.get("input_sizes"))) for e in entries.values()}) > 1:
                found.append(Parting(group, seq, "mismatch", ahead=entries, files=files))
                break
        else:
            if len(set(lasts.values())) > 1:
                seq = low + 1
                ahead = {rank: s[seq] for rank, s in members.items() if seq in s}
                if ahead:
                    behind = {rank: s.get(low) for rank, s in members.items() if lasts[rank] == low}
                    found.append(Parting(group, seq, "missing", ahead=ahead, behind=behind, files=files))
    if not found:
        return None
    return min(found, key=lambda p: (p.kind != "missing", p.group not in ("default_pg", "0"), p.seq))


def evidence_lines(reading: Reading) -> list[str]:
    """What the dumps say, for a verdict's evidence (empty when there are none)."""
    if not reading.dumps:
        return []
    p = parting(reading.dumps)
    if p is not None:
        return [p.text()]
    if len({d.rank for d in reading.dumps}) < 2:
        return []
    lasts = []
    for d in sorted(reading.dumps, key=lambda d: d.rank):
        groups = _collectives(d)
        default = groups.get("default_pg") or next(iter(groups.values()), {})
        if default:
            e = default[max(default)]
            lasts.append(f"rank {d.rank} {op_of(e)} #{max(default)} ({e.get('state') or '?'})")
    if not lasts:
        return []
    return [f"Flight Recorder ({len(reading.dumps)} dumps): the ranks went through the same collectives; last: "
            + "; ".join(lasts[:4])]
