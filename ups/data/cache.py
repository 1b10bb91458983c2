"""The latent cache: one file per sample, a metadata file per ``{task}_{split}``.

Layout::

    cache_dir/{task}_{split}/sample_{idx:05d}.pt   {"latent", "params", "bc", "meta"}
    cache_dir/{task}_{split}/.cache_metadata.json  hash, shapes, count, created_at, ...

* Every tensor is a CPU tensor (``latent`` fp16 by default); each file is written to a temp
  name in the same folder and renamed, so a reader never sees half a sample and a crash
  leaves at most a stray temp file (``ups cache fix`` removes them).
* ``meta.hash`` in each sample equals the metadata's ``hash``: a hash of everything that
  changes the latents (config, overrides, encoder weights, dtype). A rerun with the same
  hash skips valid samples; another hash refuses to mix unless told to overwrite.
* Loading uses ``torch.load(..., weights_only=True)``. Files whose tensors were saved on a
  CUDA device are found without CUDA, from the storage location tags in the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ups.errors import UpsError
from ups.status.files import write_atomic

METADATA_NAME = ".cache_metadata.json"
SAMPLE_RE = re.compile(r"^sample_(\d{5,})\.pt$")
TEMP_RE = re.compile(r"^\..*\.tmp$|\.tmp$")


class CacheError(UpsError):
    """The cache cannot be used as asked (mixed hashes, unwritable folder ...)."""


def sample_name(index: int) -> str:
    return f"sample_{index:05d}.pt"


def split_dir(cache_dir: str | os.PathLike[str], task: str, split: str) -> Path:
    return Path(cache_dir) / f"{task}_{split}"


def config_hash(parts: dict[str, Any]) -> str:
    """Stable hash of a JSON-able dict (keys sorted)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# -------------------------------------------------------------------------- metadata
def read_metadata(folder: Path) -> dict[str, Any] | None:
    path = folder / METADATA_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path}: unreadable cache metadata ({exc})") from None
    if not isinstance(data, dict) or "hash" not in data:
        raise CacheError(f"{path}: cache metadata without a hash")
    return data


def prepare_split(folder: Path, metadata: dict[str, Any], *, overwrite: bool) -> set[int]:
    """Make ``folder`` ready for ``metadata`` and return the sample indices already valid.

    A folder written with another hash is refused unless ``overwrite`` (then its samples
    are deleted first).
    """
    folder.mkdir(parents=True, exist_ok=True)
    old = read_metadata(folder)
    if old is not None and old["hash"] != metadata["hash"]:
        if not overwrite:
            was, now = old.get("skipped_shards") or [], metadata.get("skipped_shards") or []
            why = (f"shards left out then: {', '.join(was) or 'none'}, now: {', '.join(now) or 'none'}" if was != now
                   else "different config, encoder or dtype")
            raise CacheError(
                f"{folder}: cache was written with hash {old['hash']}, this run has {metadata['hash']} "
                f"({why}); pass --overwrite to replace it"
            )
        for p in folder.iterdir():
            if SAMPLE_RE.match(p.name) or TEMP_RE.search(p.name):
                p.unlink()
        old = None
    meta = dict(metadata)
    meta["created_at"] = (old or {}).get("created_at", time.time())
    write_atomic(folder / METADATA_NAME, (json.dumps(meta, indent=1) + "\n").encode())
    return existing_valid(folder, meta["hash"], meta["count"])


def existing_valid(folder: Path, expected_hash: str, count: int) -> set[int]:
    """Indices whose sample file exists and loads with the expected hash (resume)."""
    done = set()
    for p in folder.glob("sample_*.pt"):
        m = SAMPLE_RE.match(p.name)
        if not m or int(m.group(1)) >= count:
            continue
        try:
            sample = read_sample(p)
        except Exception:  # noqa: BLE001 - anything unreadable is recomputed
            continue
        if sample.get("meta", {}).get("hash") == expected_hash:
            done.add(int(m.group(1)))
    return done


# ---------------------------------------------------------------------- sample files
def write_sample(
    folder: Path, index: int, latent: Any, params: Any, bc: Any, *, hash_: str, source: str, write: Any = os.write
) -> Path:
    """Save one sample atomically; all tensors moved to CPU first, each in a storage of its own.

    ``torch.save`` writes a tensor's whole storage: a row of a batch passed as is would carry
    the whole batch (a file ``batch_size`` times too big, written and read back every time).
    """
    import io

    import torch

    payload = {
        "latent": _compact(latent.detach().to("cpu")),
        "params": _compact(torch.as_tensor(params).detach().to("cpu", torch.float32)),
        "bc": _compact(torch.as_tensor(bc).detach().to("cpu", torch.float32)),
        "meta": {"hash": hash_, "index": int(index), "source": source},
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    path = folder / sample_name(index)
    write_atomic(path, buf.getvalue(), write=write)
    return path


def _compact(t: Any) -> Any:
    """``t`` itself when it fills its storage, else a contiguous copy that does."""
    import torch

    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def read_sample(path: str | os.PathLike[str]) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def storage_locations(path: str | os.PathLike[str]) -> set[str]:
    """The device tags ("cpu", "cuda:0" ...) the file's tensors were saved with (no CUDA needed)."""
    import torch

    seen: set[str] = set()

    def record(storage: Any, location: str) -> Any:
        seen.add(location)
        return storage

    torch.load(path, map_location=record, weights_only=True)
    return seen


# ----------------------------------------------------------------------- verification
@dataclass(frozen=True)
class CacheProblem:
    path: str
    kind: str  # missing | corrupt | cuda | hash | temp | metadata
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.kind}: {self.detail}"


def split_dirs(cache_dir: Path) -> list[Path]:
    """Folders of a cache root that hold a cache (metadata or sample files)."""
    if (cache_dir / METADATA_NAME).exists():
        return [cache_dir]
    return sorted(
        p for p in cache_dir.iterdir()
        if p.is_dir() and ((p / METADATA_NAME).exists() or any(p.glob("sample_*.pt")))
    )


def verify_cache(cache_dir: str | os.PathLike[str]) -> tuple[list[CacheProblem], dict[str, Any]]:
    """Every problem of a cache root (or one split folder), and counts per split."""
    root = Path(cache_dir)
    if not root.is_dir():
        raise CacheError(f"{root}: cache folder not found")
    problems: list[CacheProblem] = []
    summary: dict[str, Any] = {}
    folders = split_dirs(root)
    if not folders:
        problems.append(CacheProblem(str(root), "missing", "no cache here (no .cache_metadata.json, no sample files)"))
    for folder in folders:
        try:
            meta = read_metadata(folder)
        except CacheError as exc:
            problems.append(CacheProblem(str(folder / METADATA_NAME), "metadata", str(exc).split(": ", 1)[-1]))
            meta = None
        if meta is None and not any(p.kind == "metadata" and p.path.startswith(str(folder)) for p in problems):
            problems.append(CacheProblem(str(folder / METADATA_NAME), "metadata", "missing"))
        count = int(meta["count"]) if meta else None
        present = {}
        for p in sorted(folder.iterdir()):
            if TEMP_RE.search(p.name):
                problems.append(CacheProblem(str(p), "temp", "stray temp file from an interrupted write"))
                continue
            m = SAMPLE_RE.match(p.name)
            if m:
                present[int(m.group(1))] = p
        quarantined = set((meta or {}).get("quarantined", []))
        ok = 0
        for _idx, p in sorted(present.items()):
            try:
                sample = read_sample(p)
                locations = storage_locations(p)
            except Exception as exc:  # noqa: BLE001 - any load failure is "corrupt"
                problems.append(CacheProblem(str(p), "corrupt", _short(exc)))
                continue
            cuda = sorted(loc for loc in locations if loc.startswith("cuda"))
            if cuda:
                problems.append(CacheProblem(str(p), "cuda", f"tensors saved on {', '.join(cuda)} (ups cache fix moves them to CPU)"))
                continue
            if meta and sample.get("meta", {}).get("hash") != meta["hash"]:
                problems.append(CacheProblem(str(p), "hash", f"sample hash {sample.get('meta', {}).get('hash')} != metadata {meta['hash']}"))
                continue
            ok += 1
        if count is not None:
            missing = [i for i in range(count) if i not in present and i not in quarantined]
            if missing:
                shown = ", ".join(sample_name(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
                problems.append(CacheProblem(str(folder), "missing", f"{len(missing)} of {count} samples missing: {shown}"))
        summary[folder.name] = {"count": count, "present": len(present), "valid": ok, "quarantined": sorted(quarantined)}
    return problems, summary


def fix_cache(cache_dir: str | os.PathLike[str]) -> list[str]:
    """Rewrite CUDA-saved samples to CPU and delete stray temp files; what was done."""
    import io

    import torch

    done = []
    root = Path(cache_dir)
    if not root.is_dir():
        raise CacheError(f"{root}: cache folder not found")
    for folder in split_dirs(root) or [root]:
        for p in sorted(folder.iterdir()):
            if TEMP_RE.search(p.name):
                p.unlink()
                done.append(f"removed temp file {p}")
            elif SAMPLE_RE.match(p.name):
                try:
                    if not any(loc.startswith("cuda") for loc in storage_locations(p)):
                        continue
                    sample = torch.load(p, map_location="cpu", weights_only=True)
                except Exception:  # noqa: BLE001 - corrupt files are for verify to report
                    continue
                buf = io.BytesIO()
                torch.save(sample, buf)
                write_atomic(p, buf.getvalue())
                done.append(f"moved tensors of {p} to CPU")
    return done


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"
