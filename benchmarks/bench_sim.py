"""Training-simulator speed, side by side in one run.

1. A full default run: digits, MLP, N = 100, T = 300, K = 10, bursty u = 0.8, sfg-cut
   (target: under 20 s on the 2-core development CPU), with the time split by phase.
2. Gossip: one round's mixing of the flat [N, D] store as a sparse CSR product (what the
   simulator uses) against a dense N×N product, for the MLP and the paper CNN sizes.

Run: ``.venv/bin/python benchmarks/bench_sim.py [--quick]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from sfg.graphs import make_graph
from sfg.rounds import RoundGraph
from sfg.sim import gossip as gossip_mod
from sfg.sim.gossip import gossip
from sfg.sim.run import simulate


def best_of(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 60 instead of 300")
    args = ap.parse_args()
    T = 60 if args.quick else 300
    t0 = time.perf_counter()
    res = simulate(dict(dataset="digits", model="mlp", n_clients=100, rounds=T, local_steps=10,
                        process="bursty:u=0.8", rule="sfg-cut", seed=1))
    wall = time.perf_counter() - t0
    print(f"full run: digits, mlp, N=100, T={T}, K=10, bursty u=0.8, sfg-cut: {wall:.1f} s "
          f"(backend {res.meta['backend']}, acc {res.metrics['acc_mean']:.3f})")

    print("\ngossip of one round, N=100, knn k=6 (rows = clients that aggregate):")
    default_limit = gossip_mod.DENSE_MAX_ROWS
    g = make_graph("knn:k=6", 100, seed=1)
    rg = RoundGraph.from_graph(g)
    deg = np.diff(rg.indptr)
    w = 1.0 / deg[rg.recv]
    for D, name in ((8970, "mlp"), (878538, "paper cnn")):
        X = torch.randn(100, D)
        for frac in (0.2, 1.0):
            rows = np.zeros(100, bool)
            rows[: int(100 * frac)] = True
            times = {}
            for label, limit in (("dense rows", 10**9), ("sparse CSR", 0)):
                gossip_mod.DENSE_MAX_ROWS = limit
                times[label] = best_of(lambda X=X, r=rows: gossip(X, rg, w, r))
            gossip_mod.DENSE_MAX_ROWS = default_limit
            print(f"  {name:<10} D={D:>7} rows={rows.sum():>3}: "
                  + ", ".join(f"{k} {v * 1e3:7.2f} ms" for k, v in times.items()))


if __name__ == "__main__":
    main()
