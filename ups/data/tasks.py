"""Per-task specs: how each PDE's data is laid out on disk.

Two layouts are read:

* the stack's own layout: ``{root}/{task}_{split}.h5`` or shards ``{task}_{split}_*.h5``,
  each with a float32 dataset ``data`` shaped (N, T, X, C) for 1D tasks and
  (N, T, H, W, C) for 2D, plus optional ``params`` (N, P) and ``bc`` (N, B);
* raw PDEBench files (dataset ``tensor``, with ``x-coordinate`` / ``t-coordinate``), found by
  the task's ``raw_glob`` and split by index range, since PDEBench files carry no split.

A *steady* task (Darcy flow) has one frame per sample and no time to step through: its first
``input_channels`` channels are the coefficient (Darcy's permeability, PDEBench's ``nu``) and
the rest the solution. It is cached as two latent frames, coefficient alone then the whole
field (:class:`ups.models.encoder.SteadyMapEncoder`), and trained as the map from the first
to the second; a time-dependent task is trained on consecutive frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from ups.errors import UpsError

SPLITS = ("train", "val", "test")
# Raw PDEBench files are one pool of samples; splits take these fractions of it, in order.
RAW_SPLIT_FRACTIONS = {"train": (0.0, 0.8), "val": (0.8, 0.9), "test": (0.9, 1.0)}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    spatial_dims: int  # 1 or 2
    channels: int
    raw_glob: str  # raw PDEBench file pattern under the root
    raw_extra_channel: str | None = None  # raw dataset prepended as a channel (darcy's "nu")
    input_channels: int = 0  # steady task: leading channels that are the coefficient (0: time-dependent)

    @property
    def steady(self) -> bool:
        """One frame per sample, trained as a map coefficient -> solution (not a time step)."""
        return self.input_channels > 0

    @property
    def data_rank(self) -> int:
        """Rank of the ``data`` dataset: N, T, spatial..., C."""
        return 3 + self.spatial_dims


TASKS: dict[str, TaskSpec] = {
    "advection1d": TaskSpec("advection1d", 1, 1, "1D_Advection_Sols_*.hdf5"),
    "burgers1d": TaskSpec("burgers1d", 1, 1, "1D_Burgers_Sols_*.hdf5"),
    "darcy2d": TaskSpec("darcy2d", 2, 2, "2D_DarcyFlow_*.hdf5", raw_extra_channel="nu", input_channels=1),
}


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise UpsError(f"unknown task {name!r} (known: {', '.join(TASKS)})") from None


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise UpsError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    return split
