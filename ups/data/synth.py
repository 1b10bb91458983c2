"""Synthetic PDE data in the stack's layout: real solutions, deterministic for a seed.

* advection1d: u_t + beta u_x = 0 on the periodic unit interval; the exact solution is the
  initial profile shifted, u(x, t) = u0(x - beta t).
* burgers1d: u_t + (u^2/2)_x = nu u_xx, periodic; pseudo-spectral in space with 2/3-rule
  dealiasing, the viscous term integrated exactly (integrating factor), RK4 in time.
* darcy2d: -div(a grad u) = 1 on the unit square, u = 0 on the boundary, with a piecewise
  constant permeability a (thresholded smooth random field, values 12 and 3, as PDEBench);
  5-point finite volumes solved by conjugate gradients, all samples at once.

Files are written to a temp name and renamed, with a manifest ``{task}_{split}.index.json``
listing every shard, its sample count and shape.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ups.data.shards import ShardIndex, ShardInfo, manifest_path
from ups.data.tasks import check_split, get_task
from ups.status.files import write_atomic


@dataclass(frozen=True)
class SynthResult:
    task: str
    split: str
    samples: int
    files: tuple[str, ...]
    sample_shape: tuple[int, ...]
    manifest: str


def _rng(seed: int, task: str, split: str) -> np.random.Generator:
    # Separate, stable streams per task and split for one seed.
    salt = sum(ord(c) * (i + 1) for i, c in enumerate(f"{task}/{split}"))
    return np.random.default_rng([seed, salt])


def _random_profiles(rng: np.random.Generator, n: int, x: np.ndarray, modes: int = 4) -> np.ndarray:
    k = np.arange(1, modes + 1)
    amp = rng.uniform(-1, 1, (n, modes)) / k
    phase = rng.uniform(0, 2 * np.pi, (n, modes))
    return amp, phase, k


def advection1d(n: int, timesteps: int, resolution: int, rng: np.random.Generator):
    x = (np.arange(resolution) + 0.5) / resolution
    t = np.linspace(0.0, 1.0, timesteps)
    beta = rng.uniform(0.1, 2.0, n)
    amp, phase, k = _random_profiles(rng, n, x)
    # u(x, t) = sum_k a_k sin(2 pi k (x - beta t) + phi_k): the exact shifted profile.
    arg = 2 * np.pi * k[None, None, None, :] * (x[None, None, :, None] - beta[:, None, None, None] * t[None, :, None, None])
    u = (amp[:, None, None, :] * np.sin(arg + phase[:, None, None, :])).sum(-1)
    params = beta[:, None]
    bc = np.zeros((n, 1))  # 0 = periodic
    return u[..., None], params, bc


def burgers1d(n: int, timesteps: int, resolution: int, rng: np.random.Generator):
    x = np.arange(resolution) / resolution
    nu = rng.uniform(0.005, 0.05, n)
    amp, phase, k = _random_profiles(rng, n, x, modes=3)
    u = (amp[:, None, :] * np.sin(2 * np.pi * k[None, None, :] * x[None, :, None] + phase[:, None, :])).sum(-1)
    kx = 2 * np.pi * np.fft.rfftfreq(resolution, d=1.0 / resolution)
    dealias = np.abs(np.fft.rfftfreq(resolution, d=1.0 / resolution)) < resolution / 3
    t_end, out_every = 1.0, timesteps - 1
    dt_target = min(0.4 / resolution, 0.002)
    steps_per_out = max(1, int(np.ceil(t_end / out_every / dt_target)))
    dt = t_end / out_every / steps_per_out
    uh = np.fft.rfft(u, axis=-1)
    lin = -nu[:, None] * kx[None, :] ** 2  # exact viscous decay (integrating factor)
    e_half = np.exp(lin * dt / 2)
    e_full = np.exp(lin * dt)

    def nonlinear(vh: np.ndarray) -> np.ndarray:
        v = np.fft.irfft(vh * dealias, n=resolution, axis=-1)
        return -0.5j * kx * np.fft.rfft(v * v, axis=-1)

    frames = [u.copy()]
    for _ in range(out_every):
        for _ in range(steps_per_out):
            k1 = nonlinear(uh)
            k2 = nonlinear(e_half * (uh + dt / 2 * k1))
            k3 = nonlinear(e_half * uh + dt / 2 * k2)
            k4 = nonlinear(e_full * uh + dt * e_half * k3)
            uh = e_full * uh + dt / 6 * (e_full * k1 + 2 * e_half * (k2 + k3) + k4)
        frames.append(np.fft.irfft(uh, n=resolution, axis=-1))
    data = np.stack(frames, axis=1)
    return data[..., None], nu[:, None], np.zeros((n, 1))


def _smooth_field(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    noise = rng.standard_normal((n, size, size))
    f = np.fft.fftfreq(size)
    decay = np.exp(-((f[:, None] ** 2 + f[None, :] ** 2) * (size / 4) ** 2))
    return np.real(np.fft.ifft2(np.fft.fft2(noise) * decay))


def darcy_operator(a: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The discrete -div(a grad .) on interior cells of the unit square, u = 0 outside."""
    resolution = a.shape[-1]
    h = 1.0 / (resolution + 1)
    ap = np.pad(a, ((0, 0), (1, 1), (1, 1)), mode="edge")
    # Harmonic means of a at the four faces of each cell.
    def face(b: np.ndarray) -> np.ndarray:
        return 2 * a * b / (a + b)

    aw, ae = face(ap[:, 1:-1, :-2]), face(ap[:, 1:-1, 2:])
    an, as_ = face(ap[:, :-2, 1:-1]), face(ap[:, 2:, 1:-1])
    diag = aw + ae + an + as_

    def apply(u: np.ndarray) -> np.ndarray:
        up = np.pad(u, ((0, 0), (1, 1), (1, 1)))  # u = 0 on the boundary
        return (diag * u - aw * up[:, 1:-1, :-2] - ae * up[:, 1:-1, 2:] - an * up[:, :-2, 1:-1] - as_ * up[:, 2:, 1:-1]) / h**2

    return apply


def darcy2d(n: int, timesteps: int, resolution: int, rng: np.random.Generator):
    del timesteps  # steady state: one frame
    a = np.where(_smooth_field(rng, n, resolution) > 0, 12.0, 3.0)
    apply = darcy_operator(a)
    f = np.ones_like(a)
    u = np.zeros_like(a)
    r = f - apply(u)
    p = r.copy()
    rs = (r * r).sum(axis=(1, 2))
    for _ in range(4 * resolution * resolution):
        ap_ = apply(p)
        alpha = rs / (p * ap_).sum(axis=(1, 2))
        u += alpha[:, None, None] * p
        r -= alpha[:, None, None] * ap_
        rs_new = (r * r).sum(axis=(1, 2))
        if np.all(np.sqrt(rs_new) < 1e-8 * np.sqrt((f * f).sum(axis=(1, 2)))):
            break
        p = r + (rs_new / rs)[:, None, None] * p
        rs = rs_new
    data = np.stack([a, u], axis=-1)[:, None]  # (N, 1, H, W, 2): permeability, pressure
    params = np.full((n, 1), 1.0)  # forcing
    bc = np.zeros((n, 1))  # 0 = homogeneous Dirichlet
    return data, params, bc


SOLVERS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    "advection1d": advection1d,
    "burgers1d": burgers1d,
    "darcy2d": darcy2d,
}


def synthesize(
    root: str | os.PathLike[str],
    task: str,
    split: str,
    samples: int,
    *,
    seed: int = 0,
    shards: int = 1,
    timesteps: int = 16,
    resolution: int = 64,
    progress: Callable[[str], None] | None = None,
) -> SynthResult:
    """Write ``samples`` solutions of ``task`` as ``shards`` files under ``root``."""
    import h5py

    spec = get_task(task)
    check_split(split)
    if samples < 1 or shards < 1 or shards > samples:
        raise ValueError("need samples >= shards >= 1")
    if timesteps < 2 and spec.spatial_dims == 1:
        raise ValueError("need at least 2 timesteps")
    res = resolution if spec.spatial_dims == 1 else max(8, resolution // 2)
    rng = _rng(seed, task, split)
    data, params, bc = SOLVERS[task](samples, timesteps, res, rng)
    data = data.astype(np.float32)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, samples, shards + 1).astype(int)
    files, infos = [], []
    for s in range(shards):
        name = f"{task}_{split}.h5" if shards == 1 else f"{task}_{split}_{s:03d}.h5"
        path = root / name
        tmp = root / f".{name}.tmp"
        lo, hi = bounds[s], bounds[s + 1]
        with h5py.File(tmp, "w") as f:
            f.create_dataset("data", data=data[lo:hi], chunks=(1, *data.shape[1:]))
            f.create_dataset("params", data=params[lo:hi].astype(np.float32))
            f.create_dataset("bc", data=bc[lo:hi].astype(np.float32))
            f.attrs.update({"task": task, "split": split, "seed": seed, "first_index": int(lo)})
        os.replace(tmp, path)
        files.append(str(path))
        infos.append(ShardInfo(str(path), int(hi - lo), 0, "ups", tuple(data.shape[1:])))
        if progress:
            progress(f"wrote {path} ({hi - lo} samples)")
    index = ShardIndex(task, split, infos)
    man = manifest_path(root, task, split)
    write_atomic(man, (json.dumps(index.to_manifest(), indent=1) + "\n").encode())
    return SynthResult(task, split, samples, tuple(files), tuple(data.shape[1:]), str(man))
