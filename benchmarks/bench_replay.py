"""Replay speed, side by side in one run (issue: model-free core, performance).

1. The replay against the straightforward per-client Python loop (``tests/reference.py``,
   the reference it is tested against) on the same trace, N = 100, T = 300, kNN k = 6, with
   the self-return H (horizon 50): the compiled round on one thread and with its default
   threads for H. Target: >= 50x faster than the loop.
2. The replay command's usual shape, processes x seeds x rules, loop vs ``replay()``.
3. N = 10,000 clients on a sparse kNN graph, T = 300, one rule: wall time and peak memory.
   Target: under a minute, memory growing with edges, not N^2.

Each rule's round is JIT-compiled on its first use and cached on disk; a warm-up call per
rule before timing keeps compilation out of the figures (the first is printed separately).

Run: ``.venv/bin/python benchmarks/bench_replay.py [--quick]``
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from sfg.modelfree import build_scenario, default_threads, replay, replay_trace, warm_compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from machine import banner
from reference import replay_reference  # noqa: E402  (the test oracle)


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
    print(banner(), flush=True)

    g, avail = build_scenario("bursty:u=0.8", n=100, T=300, graph="knn:k=6", seed=1)
    t_first, _ = timed(lambda: replay_trace(avail, g, "placebo-cut", seed=1))
    print(f"first call (JIT compile or load from the on-disk cache): {t_first:.2f} s\n")
    warm_compiled(["dfedavg", "sfg", "sfg-cut"])

    print(f"one replay, N=100, T=300, knn k=6, H over 50 rounds (loop: one run; round: best "
          f"of 5, with 1 thread, and with the default of up to {default_threads()} threads "
          "for H)")
    print(f"{'process':<13} {'rule':<9} {'loop s':>7} {'1 thread ms':>12} {'speed-up':>9} "
          f"{'default ms':>11} {'speed-up':>9} {'H agrees':>9}")
    for proc in ("bursty:u=0.8", "iid:u=0.6"):
        g, avail = build_scenario(proc, n=100, T=300, graph="knn:k=6", seed=1)
        for rule in ("dfedavg", "sfg", "sfg-cut"):
            t_loop, ref = timed(lambda r=rule, a=avail, g=g: replay_reference(a, g, r, seed=1))
            t_1, fast = timed(lambda r=rule, a=avail, g=g: replay_trace(
                a, g, r, seed=1, threads=1), repeat=5)
            t_c, _ = timed(lambda r=rule, a=avail, g=g: replay_trace(a, g, r, seed=1), repeat=5)
            agree = abs(fast.metrics["H"] - ref["H"]) < 1e-9
            print(f"{proc:<13} {rule:<9} {t_loop:7.2f} {t_1 * 1e3:12.1f} {t_loop / t_1:8.0f}x "
                  f"{t_c * 1e3:11.1f} {t_loop / t_c:8.0f}x {str(agree):>9}")

    # the replay command's usual shape: processes x seeds x rules
    procs, rules, seeds = ["iid:u=0.6", "bursty:u=0.8"], ["dfedavg", "sfg-cut"], [1, 2, 3]
    scen = {(p, s): build_scenario(p, n=100, T=300, graph="knn:k=6", seed=s)
            for p in procs for s in seeds}
    t0 = time.perf_counter()
    for (_p, s), (g2, a2) in scen.items():
        for r in rules:
            replay_reference(a2, g2, r, seed=s)
    t_loop = time.perf_counter() - t0
    n_rep = len(scen) * len(rules)
    print()
    for threads, label in ((1, "1 thread"), (None, "default threads")):
        t_fast, _ = timed(lambda k=threads: replay(procs, rules, seeds, threads=k), repeat=2)
        print(f"{n_rep} replays (2 processes x 3 seeds x 2 rules, with H), {label}: "
              f"loop {t_loop:.1f} s, replay() {t_fast:.2f} s -> {t_loop / t_fast:.0f}x")
    if args.quick:
        return
    t0 = time.perf_counter()
    g, avail = build_scenario("bursty:u=0.8", n=10_000, T=300, graph="knn:k=6", seed=1)
    t_setup = time.perf_counter() - t0
    print()
    for threads in (1, None):
        t_run, res = timed(lambda k=threads: replay_trace(avail, g, "sfg-cut", seed=1, threads=k))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"N=10,000, T=300, knn k=6 ({g.edges.shape[0]} edges), sfg-cut, threads={threads}: "
              f"setup {t_setup:.2f} s, replay {t_run:.1f} s, peak RSS so far {peak:.0f} MiB "
              f"(a dense N×N float64 matrix alone would be {10_000**2 * 8 / 2**20:.0f} MiB); "
              f"H estimated on {int(res.metrics['H_pairs'])} sampled pairs: "
              f"{res.metrics['H']:.2f} ± {res.metrics['H_se']:.2f}")


if __name__ == "__main__":
    main()
