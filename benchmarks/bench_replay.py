"""Replay speed, side by side in one run (issue: model-free core, performance).

1. The vectorised replay against the straightforward per-client Python loop
   (``sfg.replay_reference``, the reference it is tested against) on the same trace:
   N = 100, T = 300, bursty u = 0.8, kNN k = 6. Target: >= 50x faster.
2. N = 10,000 clients on a sparse kNN graph, T = 300, one rule: wall time and peak memory.
   Target: under a minute, memory growing with edges, not N^2.

Run: ``.venv/bin/python benchmarks/bench_replay.py [--quick]``
"""

from __future__ import annotations

import argparse
import resource
import time

from sfg.replay import build_scenario, replay, replay_trace
from sfg.replay_reference import replay_reference


def timed(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the N = 10,000 run")
    args = ap.parse_args()

    g, avail = build_scenario("bursty:u=0.8", n=100, T=300, graph="knn:k=6", seed=1)
    print("replay, N=100, T=300, bursty u=0.8, knn k=6 (best of 3 for the vectorised replay)")
    print(f"{'rule':<12} {'loop s':>8} {'vectorised s':>13} {'speed-up':>9} {'no-H vect. s':>13} {'H agrees':>9}")
    for rule in ("dfedavg", "sfg", "sfg-cut"):
        t_loop, ref = timed(lambda r=rule: replay_reference(avail, g, r, seed=1))
        t_fast, fast = timed(lambda r=rule: replay_trace(avail, g, r, seed=1), repeat=3)
        t_noh, _ = timed(lambda r=rule: replay_trace(avail, g, r, seed=1, horizon=0), repeat=3)
        agree = abs(fast.metrics["H"] - ref["H"]) < 1e-9
        print(f"{rule:<12} {t_loop:8.2f} {t_fast:13.3f} {t_loop / t_fast:8.0f}x {t_noh:13.3f} {str(agree):>9}")

    # the replay command's usual shape: processes x seeds x rules, stacked into batches
    procs, rules, seeds = ["iid:u=0.6", "bursty:u=0.8"], ["dfedavg", "sfg-cut"], [1, 2, 3]
    scen = {(p, s): build_scenario(p, n=100, T=300, graph="knn:k=6", seed=s)
            for p in procs for s in seeds}
    t0 = time.perf_counter()
    for (_p, s), (g2, a2) in scen.items():
        for r in rules:
            replay_reference(a2, g2, r, seed=s)
    t_loop = time.perf_counter() - t0
    n_rep = len(scen) * len(rules)
    for h in (50, 0):
        t_fast, _ = timed(lambda h=h: replay(procs, rules, seeds, horizon=h), repeat=2)
        label = "with H" if h else "without H"
        print(f"{n_rep} replays (2 processes x 3 seeds x 2 rules), {label}: loop {t_loop:.1f} s "
              f"(with H), vectorised {t_fast:.2f} s -> {t_loop / t_fast:.0f}x")
    if args.quick:
        return
    t0 = time.perf_counter()
    g, avail = build_scenario("bursty:u=0.8", n=10_000, T=300, graph="knn:k=6", seed=1)
    t_setup = time.perf_counter() - t0
    t_run, res = timed(lambda: replay_trace(avail, g, "sfg-cut", seed=1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nN=10,000, T=300, knn k=6 ({g.edges.shape[0]} edges), sfg-cut: setup {t_setup:.2f} s, "
          f"replay {t_run:.1f} s, peak RSS {peak:.0f} MiB "
          f"(a dense N×N float64 matrix alone would be {10_000**2 * 8 / 2**20:.0f} MiB); "
          f"H estimated on {int(res.metrics['H_pairs'])} sampled pairs: "
          f"{res.metrics['H']:.2f} ± {res.metrics['H_se']:.2f}")


if __name__ == "__main__":
    main()
