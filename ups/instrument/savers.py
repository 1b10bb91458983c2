"""Checkpoints by what they are: a rank that saves or loads is in phase ``checkpoint`` or
``load``, whatever it writes to and whichever library does it.

``torch.save`` to a path, a file, an fsspec/s3fs file or any stream without a name (a client
to remote storage) is a checkpoint; to an ``io.BytesIO`` it is not by itself (a model
serialised to memory), but it is when another saver is already running (Lightning serialises
to memory, then writes through fsspec). The usual savers are seen too: safetensors,
torch.distributed.checkpoint (save, async_save, load), Lightning's ``Trainer.save_checkpoint``
and ``Fabric.save``, the HF Trainer's checkpoint and ``save_pretrained``, accelerate's
``save_state``. The record's item names what is written ("torch.save → RemoteStream"); nested
savers keep the outer label. Only the rank's main thread changes the phase: DCP's
``async_save`` writes again from a thread of its own while the rank trains on.

A checkpoint's stall limit is the phase's own (600 s), or twice the longest one of the run so
far (ups.status.health): a checkpoint is a pause, not a hang.
"""

from __future__ import annotations

import io
import os
from typing import Any

from ups.instrument import imports, patching, process
from ups.instrument.torch.phases import phase_call

# (module, owner or None for a module-level function, function, phase, label)
SAVERS = (
    ("safetensors.torch", None, "save_file", "checkpoint", "safetensors.save_file"),
    ("safetensors.torch", None, "save_model", "checkpoint", "safetensors.save_model"),
    ("safetensors.torch", None, "load_file", "load", "safetensors.load_file"),
    ("torch.distributed.checkpoint.state_dict_saver", None, "save", "checkpoint", "dcp.save"),
    ("torch.distributed.checkpoint.state_dict_saver", None, "async_save", "checkpoint", "dcp.async_save"),
    ("torch.distributed.checkpoint.state_dict_saver", None, "save_state_dict", "checkpoint", "dcp.save_state_dict"),
    ("torch.distributed.checkpoint.state_dict_loader", None, "load", "load", "dcp.load"),
    ("torch.distributed.checkpoint.state_dict_loader", None, "load_state_dict", "load", "dcp.load_state_dict"),
    ("lightning.pytorch.trainer.trainer", "Trainer", "save_checkpoint", "checkpoint", "Trainer.save_checkpoint"),
    ("pytorch_lightning.trainer.trainer", "Trainer", "save_checkpoint", "checkpoint", "Trainer.save_checkpoint"),
    ("lightning.fabric.fabric", "Fabric", "save", "checkpoint", "Fabric.save"),
    ("transformers.trainer", "Trainer", "_save_checkpoint", "checkpoint", "Trainer checkpoint"),
    ("transformers.trainer", "Trainer", "save_model", "checkpoint", "Trainer.save_model"),
    ("transformers.modeling_utils", "PreTrainedModel", "save_pretrained", "checkpoint", "save_pretrained"),
    ("accelerate.accelerator", "Accelerator", "save_state", "checkpoint", "Accelerator.save_state"),
)


def target_name(f: Any) -> str | None:
    """What ``torch.save``/``torch.load`` writes to or reads from, in words; None for an
    in-memory buffer (not a checkpoint by itself)."""
    if isinstance(f, str | os.PathLike):
        return os.fspath(f)
    if isinstance(f, io.BytesIO):
        return None
    name = getattr(f, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(name, int):  # os.fdopen(fd): the fd's file
        try:
            return os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            return f"fd {name}"
    path, fs = getattr(f, "path", None), getattr(f, "fs", None)  # fsspec, s3fs, gcsfs ...
    if isinstance(path, str) and fs is not None:
        proto = getattr(fs, "protocol", None)
        proto = proto[0] if isinstance(proto, tuple | list) and proto else proto
        return f"{proto}://{path}" if isinstance(proto, str) and proto not in ("file", "local") else path
    inner = getattr(f, "fileobj", None)  # gzip.GzipFile(fileobj=...): what it writes to
    if inner is not None and inner is not f:
        return target_name(inner)
    return type(f).__name__  # a stream with no name: a client to remote storage


def _describe_call(label: str, args: tuple, kwargs: dict) -> str:
    """"dcp.save → /ckpt/step-10", from the call's path-like arguments where there is one."""
    for value in (*args[1:3], kwargs.get("checkpoint_id"), kwargs.get("filepath"), kwargs.get("filename"),
                  kwargs.get("save_directory"), kwargs.get("output_dir"), kwargs.get("path")):
        if isinstance(value, str | os.PathLike):
            return f"{label} → {os.fspath(value)}"
    writer = kwargs.get("storage_writer") or kwargs.get("storage_reader")
    where = getattr(writer, "path", None) or getattr(writer, "checkpoint_id", None)
    return f"{label} → {os.fspath(where)}" if isinstance(where, str | os.PathLike) else label


def patch_torch(torch: Any) -> None:
    """torch.save and torch.load (torch.serialization's, which torch re-exports)."""
    ser = torch.serialization
    original_save, original_load = ser.save, ser.load

    def saving(args: tuple, kwargs: dict) -> str | None:
        f = args[1] if len(args) > 1 else kwargs.get("f")
        target = target_name(f)
        return None if target is None else f"torch.save → {target}"

    def loading(args: tuple, kwargs: dict) -> str | None:
        f = args[0] if args else kwargs.get("f")
        target = target_name(f)
        return None if target is None else f"torch.load ← {target}"

    patching.patch(ser, "save", phase_call("checkpoint", describe=saving))
    patching.patch(ser, "load", phase_call("load", describe=loading))
    if torch.save is original_save:
        torch.save = ser.save
    if torch.load is original_load:
        torch.load = ser.load
    for module, owner, func, phase, label in SAVERS:
        imports.when_imported(module, lambda m, o=owner, f=func, p=phase, lb=label: _patch_saver(m, o, f, p, lb))


def _patch_saver(module: Any, owner: str | None, func: str, phase: str, label: str) -> None:
    target = getattr(module, owner, None) if owner else module
    if target is None:
        return
    try:
        patching.patch(target, func, phase_call(phase, describe=lambda args, kwargs: _describe_call(label, args, kwargs)))
    except (AttributeError, TypeError) as exc:
        process.warn(f"could not follow {label} ({type(exc).__name__}: {exc})")
