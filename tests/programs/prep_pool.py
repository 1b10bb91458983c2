"""Convert raw sample files to a compact format, in parallel: the usual data-preparation script.

    python prep_pool.py [SRC_DIR] [DST_DIR] [--files N] [--workers 2]

SRC_DIR is made with N synthetic raw files when it does not exist. Each conversion is a small
CPU job (parse, normalise, checksum: ~0.5-1 s). Progress is a tqdm bar over imap_unordered;
nothing else is printed.
"""

import argparse
import hashlib
import os
import random
import struct
import tempfile
from multiprocessing import Pool

from tqdm import tqdm


def make_raw(src, n):
    os.makedirs(src, exist_ok=True)
    rng = random.Random(0)
    for i in range(n):
        with open(os.path.join(src, f"sample_{i:04d}.txt"), "w") as f:
            f.write("\n".join(" ".join(f"{rng.random():.6f}" for _ in range(16)) for _ in range(1000)))


def convert(job):
    src, dst = job
    with open(src) as f:
        rows = [[float(v) for v in line.split()] for line in f]
    # normalise per column, several passes (stands for the real feature extraction)
    digest = hashlib.sha256()
    for _ in range(250):
        cols = list(zip(*rows, strict=True))
        means = [sum(c) / len(c) for c in cols]
        rows = [[v - m for v, m in zip(r, means, strict=True)] for r in rows]
        for r in rows:
            digest.update(struct.pack("16f", *r))
    with open(dst, "wb") as f:
        for r in rows:
            f.write(struct.pack("16f", *r))
        f.write(digest.digest())
    return dst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("src", nargs="?")
    parser.add_argument("dst", nargs="?")
    parser.add_argument("--files", type=int, default=int(os.environ.get("PREP_FILES", "40")))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="prep_pool.")
    src = args.src or os.path.join(base, "raw")
    dst = args.dst or os.path.join(base, "out")
    if not os.path.isdir(src):
        make_raw(src, args.files)
    os.makedirs(dst, exist_ok=True)
    jobs = [(os.path.join(src, name), os.path.join(dst, name.replace(".txt", ".bin")))
            for name in sorted(os.listdir(src))]
    with Pool(args.workers) as pool:
        for _ in tqdm(pool.imap_unordered(convert, jobs), total=len(jobs), desc="converting", unit="file"):
            pass


if __name__ == "__main__":
    main()
