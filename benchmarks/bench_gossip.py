"""Aggregation, side by side: sfg's one in-order sum (``sfg.sim.gossip.weighted_sum``) against
the sparse CSR product the rounds used before it (``torch.sparse_csr_tensor @ X``), on kNN
graphs, single-threaded as the round loop runs them. Interleaved repeats (A B A B ...), the
best of each; the load average is in the banner.

    .venv/bin/python benchmarks/bench_gossip.py            # ~30 s
    .venv/bin/python benchmarks/bench_gossip.py --repeats 20

The sparse product is kept here only as the contender: it is not CPU-independent (MKL fuses
and splits its sums by CPU), which is why sfg no longer uses it.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from machine import banner

from sfg.round.slots import RoundGraph
from sfg.sim.gossip import slot_matmul


def csr_product(rg: RoundGraph, w: np.ndarray, rows: np.ndarray, M: torch.Tensor) -> torch.Tensor:
    idx = np.flatnonzero(rows)
    starts, ends = rg.indptr[idx], rg.indptr[idx + 1]
    lens = ends - starts
    crow = np.concatenate([[0], np.cumsum(lens)])
    slot = np.repeat(starts - crow[:-1], lens) + np.arange(crow[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        W = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(rg.send[slot]),
                                    torch.from_numpy(w[slot]).to(M.dtype),
                                    size=(idx.size, M.shape[0]))
        return W @ M


def knn_graph(n: int, k: int, seed: int = 0) -> RoundGraph:
    g = np.random.default_rng(seed)
    edges = {(min(i, j), max(i, j)) for i in range(n)
             for j in g.choice(np.delete(np.arange(n), i), k // 2, replace=False)}
    return RoundGraph.from_edges(n, np.array(sorted(edges)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(banner())
    print(f"{'N':>6} {'D':>9} {'rows':>6}  {'in-order sum ms':>16} {'CSR product ms':>15}  ratio")
    for n, D, frac in [(100, 8970, 0.2), (100, 8970, 1.0), (1000, 8970, 1.0),
                       (100, 102_078, 0.2), (100, 878_538, 0.2)]:
        rg = knn_graph(n, 6)
        g = np.random.default_rng(1)
        X = torch.from_numpy(g.standard_normal((n, D)).astype(np.float32))
        w = g.random(rg.n_slots)
        rows = g.random(n) < frac
        contenders = {"sum": lambda rg=rg, w=w, rows=rows, X=X: slot_matmul(rg, w, rows, X),
                      "csr": lambda rg=rg, w=w, rows=rows, X=X: csr_product(rg, w, rows, X)}
        best = {k: float("inf") for k in contenders}
        for f in contenders.values():
            f()  # warm-up (compiles the sum once)
        for _ in range(args.repeats):
            for k, f in contenders.items():
                t = time.perf_counter()
                f()
                best[k] = min(best[k], time.perf_counter() - t)
        print(f"{n:>6} {D:>9} {int(rows.sum()):>6}  {best['sum'] * 1e3:>16.2f} "
              f"{best['csr'] * 1e3:>15.2f}  {best['csr'] / best['sum']:.2f}×")


if __name__ == "__main__":
    main()
