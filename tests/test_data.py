"""Data layer: synthetic PDE data, shard discovery and validation, lazy per-process reads."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from helpers import run_ups

from ups.data.shards import DataError, SampleReader, ShardIndex, manifest_path
from ups.data.synth import darcy_operator, synthesize


def test_synth_is_deterministic_for_a_seed(tmp_path):
    a = synthesize(tmp_path / "a", "burgers1d", "train", 8, seed=3)
    b = synthesize(tmp_path / "b", "burgers1d", "train", 8, seed=3)
    c = synthesize(tmp_path / "c", "burgers1d", "train", 8, seed=4)
    with h5py.File(a.files[0]) as fa, h5py.File(b.files[0]) as fb, h5py.File(c.files[0]) as fc:
        assert np.array_equal(fa["data"][:], fb["data"][:])
        assert not np.array_equal(fa["data"][:], fc["data"][:])
        assert fa["data"].dtype == np.float32 and fa["data"].shape == (8, 16, 64, 1)


def test_advection_is_the_shifted_initial_profile(tmp_path):
    r = synthesize(tmp_path, "advection1d", "train", 4, timesteps=8, resolution=64)
    with h5py.File(r.files[0]) as f:
        u = f["data"][:, :, :, 0]
    # A pure shift keeps every Fourier magnitude: |FFT(u(t))| == |FFT(u(0))|.
    mag = np.abs(np.fft.rfft(u, axis=-1))
    assert np.allclose(mag, mag[:, :1], atol=1e-3)
    assert not np.allclose(u[:, -1], u[:, 0])  # and it did move


def test_burgers_energy_decays(tmp_path):
    r = synthesize(tmp_path, "burgers1d", "train", 4)
    with h5py.File(r.files[0]) as f:
        u = f["data"][:, :, :, 0]
        nu = f["params"][:, 0]
    energy = (u.astype(np.float64) ** 2).sum(-1)
    assert np.all(np.diff(energy, axis=1) <= 1e-4 * energy[:, :1])
    assert np.all((nu > 0) & (nu < 0.1)) and np.isfinite(u).all()


def test_darcy_solution_satisfies_the_discrete_equation(tmp_path):
    r = synthesize(tmp_path, "darcy2d", "train", 3, resolution=32)
    with h5py.File(r.files[0]) as f:
        data = f["data"][:]
    assert data.shape == (3, 1, 16, 16, 2)
    a, u = data[:, 0, :, :, 0].astype(np.float64), data[:, 0, :, :, 1].astype(np.float64)
    assert set(np.unique(a)) <= {3.0, 12.0}
    residual = darcy_operator(a)(u) - 1.0
    assert np.abs(residual).max() < 1e-3  # float32 storage of a 1e-8 CG solution
    assert (u > 0).all()  # maximum principle: positive forcing, zero boundary


def test_index_spans_shards_and_names_samples(tmp_path):
    synthesize(tmp_path, "advection1d", "train", 10, shards=3)
    for use_manifest in (True, False):
        idx = ShardIndex.discover(tmp_path, "advection1d", "train", use_manifest=use_manifest)
        assert len(idx) == 10 and len(idx.shards) == 3
        assert idx.source(0) == "advection1d_train_000.h5#0"
        assert idx.source(9) == "advection1d_train_002.h5#3"


def _shard(tmp_path, name="burgers1d_train.h5", shape=(4, 8, 16, 1), key="data"):
    path = tmp_path / name
    with h5py.File(path, "w") as f:
        f.create_dataset(key, data=np.zeros(shape, np.float32))
    return path


def test_wrong_key_or_rank_is_named(tmp_path):
    path = _shard(tmp_path, key="fields")
    with pytest.raises(DataError, match=f"{path}: no dataset 'data' \\(has: fields\\)"):
        ShardIndex.discover(tmp_path, "burgers1d", "train")
    path.unlink()
    path = _shard(tmp_path, shape=(4, 8, 16))
    with pytest.raises(DataError, match=f"{path}: dataset 'data' has shape \\(4, 8, 16\\), expected rank 4"):
        ShardIndex.discover(tmp_path, "burgers1d", "train")


def test_truncated_garbage_missing_and_fifo_files_are_named(tmp_path):
    synthesize(tmp_path, "burgers1d", "train", 6, shards=2)
    first = tmp_path / "burgers1d_train_000.h5"
    data = first.read_bytes()
    first.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=f"{first}: not a readable HDF5 file"):
        ShardIndex.discover(tmp_path, "burgers1d", "train", use_manifest=False)
    first.write_bytes(b"this is not hdf5" * 100)
    with pytest.raises(DataError, match=f"{first}: not a readable HDF5 file"):
        ShardIndex.discover(tmp_path, "burgers1d", "train", use_manifest=False)
    first.unlink()
    with pytest.raises(DataError, match=f"{first}: file not found \\(listed in"):
        ShardIndex.discover(tmp_path, "burgers1d", "train")
    os.mkfifo(first)
    with pytest.raises(DataError, match="a FIFO; opening it would block"):
        ShardIndex.discover(tmp_path, "burgers1d", "train", use_manifest=False)
    with pytest.raises(DataError, match="no shards for darcy2d/train"):
        ShardIndex.discover(tmp_path, "darcy2d", "train")


def test_skipped_shards_are_left_out_before_anything_is_opened(tmp_path):
    synthesize(tmp_path, "burgers1d", "train", 6, shards=3)
    fifo = tmp_path / "burgers1d_train_001.h5"
    fifo.unlink()
    os.mkfifo(fifo)  # opening it would block (or, here, be refused): it must not be touched
    for use_manifest in (True, False):
        index = ShardIndex.discover(tmp_path, "burgers1d", "train", use_manifest=use_manifest, skip={fifo.name})
        assert index.skipped == (fifo.name,) and [s.name for s in index.shards] == ["burgers1d_train_000.h5", "burgers1d_train_002.h5"]
        assert len(index) == 4 and index.source(2) == "burgers1d_train_002.h5#0"
    with pytest.raises(DataError, match=r"no shards for burgers1d/train \(3 skipped\)"):
        ShardIndex.discover(tmp_path, "burgers1d", "train", skip={f"burgers1d_train_00{i}.h5" for i in range(3)})


def test_reader_is_lazy_and_never_reuses_handles_across_fork(tmp_path):
    synthesize(tmp_path, "advection1d", "train", 4)
    reader = SampleReader(ShardIndex.discover(tmp_path, "advection1d", "train"))
    assert reader.open_files == 0  # nothing opened before the first read
    parent = reader.read(1)
    assert reader.open_files == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: inherited handles must not count, a fresh one is opened
        ok = reader.open_files == 0 and np.array_equal(reader.read(1).fields, parent.fields) and reader.open_files == 1
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_reader_says_which_file_this_process_holds_open(tmp_path):
    """What a precompute worker's record names before a read: data.open or read."""
    synthesize(tmp_path, "advection1d", "train", 4, shards=2)
    reader = SampleReader(ShardIndex.discover(tmp_path, "advection1d", "train"))
    first, second = (s.path for s in reader.index.shards)
    assert not reader.is_open(first)
    reader.read(0)
    assert reader.is_open(first) and not reader.is_open(second)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a handle inherited across fork is not this process's
        os.write(w, b"1" if not reader.is_open(first) else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_raw_pdebench_layout_is_read_through_the_task_spec(tmp_path):
    path = tmp_path / "1D_Advection_Sols_beta0.1.hdf5"
    tensor = np.random.default_rng(0).standard_normal((10, 5, 32)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("tensor", data=tensor)
        f.create_dataset("x-coordinate", data=np.linspace(0, 1, 32))
        f.create_dataset("t-coordinate", data=np.linspace(0, 1, 6))
    train = ShardIndex.discover(tmp_path, "advection1d", "train")
    test = ShardIndex.discover(tmp_path, "advection1d", "test")
    assert (len(train), len(test)) == (8, 1)
    sample = SampleReader(test).read(0)
    assert sample.fields.shape == (5, 32, 1) and np.array_equal(sample.fields[..., 0], tensor[9])
    assert sample.source == f"{path.name}#9"


def test_synth_cli(tmp_path):
    res = run_ups("data", "synth", "--task", "darcy2d", "--root", str(tmp_path), "--samples", "4", "--json")
    assert res.returncode == 0, res.stderr
    assert manifest_path(tmp_path, "darcy2d", "train").exists()
    res = run_ups("data", "synth", "--task", "navier", "--root", str(tmp_path))
    assert res.returncode == 2 and "unknown task 'navier'" in res.stderr and "Traceback" not in res.stderr
