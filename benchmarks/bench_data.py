"""Data loading speed: decode once, then cached reloads (docs/concepts/training.md#the-training-protocol data).

1. The CIFAR-10 image folder (all 60,000 JPEGs in ``cifar10_jpeg_q75_raw.tar.gz``): first
   decode into an empty cache with the default worker processes (and, with
   ``--compare-workers``, with one process), then the cached reload of the arrays, then a
   whole ``load_federated("cifar10", n_clients=100)`` from the cache (partition, validation
   hold-out, 300 label-matched test images per client, normalisation).
   Targets: cached reload in a few seconds; first decode "may take a minute".
2. FEMNIST (LEAF JSON, 5 % sample): first parse vs cached reload.

Run: ``.venv/bin/python benchmarks/bench_data.py [--data-root ../shared/data]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from machine import banner

from sfg.world.data import load_federated
from sfg.world.data.femnist import detect_leaf, read_leaf
from sfg.world.data.imagefolder import detect_image_folder, read_image_folder

ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-root", default=str(ROOT))
    ap.add_argument("--workers", type=int, default=None, help="decode processes (default: cores)")
    ap.add_argument("--compare-workers", action="store_true",
                    help="also time the first decode with a single process")
    args = ap.parse_args()
    print(banner(), flush=True)
    root = Path(args.data_root)
    cifar = detect_image_folder(root / "cifar10-jpeg" / "cifar10_jpeg_q75_raw.tar.gz")
    leaf = detect_leaf(root / "femnist-leaf" / "femnist_leaf_niid_05_json.tar.gz")
    tmp = Path(tempfile.mkdtemp(prefix="sfg-bench-data-"))
    try:
        print(f"cores: {os.cpu_count()}, cache: {tmp}")
        print("CIFAR-10 image folder, 60,000 JPEGs (32x32, q75)")
        if args.compare_workers:
            t1, _ = timed(lambda: read_image_folder(cifar, workers=1, cache_dir=tmp / "one"))
            print(f"  first decode, 1 process        {t1:8.2f} s")
        t_first, (arrays, _) = timed(lambda: read_image_folder(cifar, workers=args.workers,
                                                               cache_dir=tmp))
        print(f"  first decode, default workers  {t_first:8.2f} s   "
              f"train {arrays['train_x'].shape}, test {arrays['test_x'].shape}")
        t_cached, (_, info) = timed(lambda: read_image_folder(cifar, cache_dir=tmp))
        assert not info["decoded"]
        size = Path(info["cache"]).stat().st_size / 2**20
        print(f"  cached reload                  {t_cached:8.2f} s   ({size:.0f} MiB cache)")
        print(f"  first / cached                 {t_first / t_cached:8.1f} x")
        t_fed, data = timed(lambda: load_federated("cifar10", n_clients=100, seed=1,
                                                   data_root=root, cache_dir=tmp))
        own = data.sizes("train") + data.sizes("val")
        print(f"  load_federated N=100 (cached)  {t_fed:8.2f} s   clients {own.min()}..{own.max()} "
              f"images, test {data.sizes('test')[0]} each")

        print("FEMNIST, LEAF JSON (5 % sample, 55 shards)")
        t_parse, _ = timed(lambda: read_leaf(leaf, cache_dir=tmp))
        t_leaf, _ = timed(lambda: read_leaf(leaf, cache_dir=tmp))
        print(f"  first parse                    {t_parse:8.2f} s")
        print(f"  cached reload                  {t_leaf:8.2f} s   ({t_parse / t_leaf:.0f} x)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
