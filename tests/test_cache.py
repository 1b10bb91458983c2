"""Latent cache files: atomic writes, verification of each problem it names, and repairs."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from helpers import run_ups

from ups.data import cache as cache_mod
from ups.data.cache import CacheError, fix_cache, prepare_split, verify_cache, write_sample


def make_cache(root, count=4, hash_="h1"):
    folder = root / "burgers1d_train"
    prepare_split(folder, {"hash": hash_, "count": count}, overwrite=False)
    for i in range(count):
        write_sample(folder, i, torch.randn(16, 4, 8).half(), torch.tensor([0.1]), torch.zeros(1), hash_=hash_, source=f"f.h5#{i}")
    return folder


def save_with_cuda_tag(obj, path, monkeypatch):
    """What torch.save writes for tensors that lived on cuda:0, made without a GPU."""
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    torch.save(obj, path)
    monkeypatch.undo()


def test_samples_round_trip_as_cpu_tensors(tmp_path):
    folder = make_cache(tmp_path)
    sample = cache_mod.read_sample(folder / "sample_00002.pt")
    assert sample["latent"].dtype == torch.float16 and sample["latent"].device.type == "cpu"
    assert sample["meta"] == {"hash": "h1", "index": 2, "source": "f.h5#2"}
    assert verify_cache(tmp_path)[0] == []


def test_a_row_of_a_batch_is_saved_without_the_rest_of_the_batch(tmp_path):
    latents, params = torch.randn(16, 8, 16, 32).half(), torch.randn(16, 3)
    path = write_sample(tmp_path, 5, latents[5], params[5], torch.zeros(2), hash_="h", source="f.h5#5")
    sample = cache_mod.read_sample(path)
    assert torch.equal(sample["latent"], latents[5]) and torch.equal(sample["params"], params[5])
    assert sample["latent"].untyped_storage().nbytes() == latents[5].numel() * 2
    assert path.stat().st_size < latents.numel() * 2 // 4


def test_failed_write_leaves_no_partial_file(tmp_path):
    folder = make_cache(tmp_path, count=1)

    def half_then_full(fd, data):
        import os

        os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_sample(folder, 1, torch.zeros(2), torch.zeros(1), torch.zeros(1), hash_="h1", source="x", write=half_then_full)
    assert sorted(p.name for p in folder.iterdir()) == [".cache_metadata.json", "sample_00000.pt"]


def test_mixed_hash_is_refused_unless_overwrite(tmp_path):
    folder = make_cache(tmp_path)
    with pytest.raises(CacheError, match="written with hash h1, this run has h2"):
        prepare_split(folder, {"hash": "h2", "count": 4}, overwrite=False)
    assert prepare_split(folder, {"hash": "h1", "count": 4}, overwrite=False) == {0, 1, 2, 3}
    assert prepare_split(folder, {"hash": "h2", "count": 4}, overwrite=True) == set()
    assert not list(folder.glob("sample_*.pt"))


def test_verify_names_every_problem_and_fix_repairs_what_it_can(tmp_path, monkeypatch):
    folder = make_cache(tmp_path, count=6)
    (folder / "sample_00000.pt").unlink()                                   # missing
    (folder / "sample_00001.pt").write_bytes(b"PK\x03\x04 torn")            # corrupt
    good = cache_mod.read_sample(folder / "sample_00002.pt")
    save_with_cuda_tag(good, folder / "sample_00002.pt", monkeypatch)      # saved on cuda:0
    other = dict(cache_mod.read_sample(folder / "sample_00003.pt"), meta={"hash": "zz", "index": 3, "source": "x"})
    torch.save(other, folder / "sample_00003.pt")                          # hash mismatch
    (folder / ".sample_00004.pt.123.456.tmp").write_bytes(b"half")         # stray temp
    problems, summary = verify_cache(tmp_path)
    kinds = sorted((p.kind, p.path.rsplit("/", 1)[-1]) for p in problems)
    assert kinds == [
        ("corrupt", "sample_00001.pt"),
        ("cuda", "sample_00002.pt"),
        ("hash", "sample_00003.pt"),
        ("missing", "burgers1d_train"),
        ("temp", ".sample_00004.pt.123.456.tmp"),
    ]
    assert "cuda:0" in next(p.detail for p in problems if p.kind == "cuda")
    res = run_ups("cache", "verify", str(tmp_path), "--json")
    assert res.returncode == 1 and len(json.loads(res.stdout)["problems"]) == 5

    done = fix_cache(tmp_path)
    assert any("moved tensors of" in d and "sample_00002.pt" in d for d in done)
    assert any("removed temp file" in d for d in done)
    remaining = sorted(p.kind for p in verify_cache(tmp_path)[0])
    assert remaining == ["corrupt", "hash", "missing"]  # not fixable: must be recomputed
    assert cache_mod.storage_locations(folder / "sample_00002.pt") == {"cpu"}


def test_verify_cli_ok_and_bad_path(tmp_path):
    make_cache(tmp_path)
    res = run_ups("cache", "verify", str(tmp_path))
    assert res.returncode == 0 and "cache OK" in res.stderr
    res = run_ups("cache", "verify", str(tmp_path / "nope"))
    assert res.returncode == 2 and "cache folder not found" in res.stderr
