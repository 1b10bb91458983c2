"""The precompute loop a user would write by hand: the baseline for scripts/bench_precompute.py.

Reads every shard of ``{task}_{split}*.h5`` under ``--root`` into memory at start, a Dataset
over the arrays, a DataLoader (``--workers``, ``--batch-size``), the project's encoder built
with the same seed in the main process, and one ``torch.save`` per sample through a temp file
and ``os.replace``. Same payload as ``ups launch precompute`` writes (latent in the cache
dtype, params, bc, meta),
one compact file per sample. No watchdog, no status, no resume: that is what ``ups`` adds.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ups.models.encoder import build_encoder


class InMemory(torch.utils.data.Dataset):
    def __init__(self, files: list[str]) -> None:
        data, params, bc, sources = [], [], [], []
        for path in files:
            with h5py.File(path, "r") as f:
                data.append(np.asarray(f["data"], dtype=np.float32))
                params.append(np.asarray(f["params"], dtype=np.float32))
                bc.append(np.asarray(f["bc"], dtype=np.float32))
            sources += [f"{os.path.basename(path)}#{i}" for i in range(len(data[-1]))]
        self.data, self.params, self.bc = np.concatenate(data), np.concatenate(params), np.concatenate(bc)
        self.sources = sources

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "fields": torch.from_numpy(self.data[i]), "params": torch.from_numpy(self.params[i]),
                "bc": torch.from_numpy(self.bc[i])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--task", default="burgers1d")
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latent-tokens", type=int, default=16)
    ap.add_argument("--latent-dim", type=int, default=32)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.root, f"{args.task}_{args.split}.h5"))
                   + glob.glob(os.path.join(args.root, f"{args.task}_{args.split}_*.h5")))
    ds = InMemory(files)
    device = torch.device(args.device)
    enc = build_encoder(ds.data.shape[-1], ds.data.ndim - 3, latent_tokens=args.latent_tokens,
                        latent_dim=args.latent_dim, seed=args.seed).to(device)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with torch.inference_mode():
        for batch in loader:
            latents = enc(batch["fields"].to(device)).to(torch.float16).cpu()
            for j, i in enumerate(batch["index"].tolist()):
                path = out / f"sample_{i:05d}.pt"
                tmp = out / f".sample_{i:05d}.pt.tmp"
                # clone(): a row of the batch saved as is would carry the whole batch's storage
                torch.save({"latent": latents[j].clone(), "params": batch["params"][j].clone(), "bc": batch["bc"][j].clone(),
                            "meta": {"index": i, "source": ds.sources[i]}}, tmp)
                os.replace(tmp, path)
                n += 1
    print(f"plain: {n} samples cached in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
