"""Training-simulator speed: the default run's round overhead, side by side in one run.

1. **Whole process.** ``sfg run`` with its defaults (digits, MLP, N = 100, T = 300, K = 10,
   bursty u = 0.8, ``dfedavg``) as a fresh subprocess, several times: wall time, CPU time and
   the simulator's own time (``meta.seconds``: data, set-up and the round loop). With
   ``--before SRC`` an older source tree (e.g. a ``git worktree`` of the commit before the
   round loop was optimised) runs the same command in alternation, so both see the same
   machine load. Target: the default run <= 4 s whole-process.
2. **Per useful client-step.** In this process: the simulator's time divided by the local
   steps actually taken by available clients (``meta.client_steps``), next to a plain
   per-client loop (an ``nn.Module`` and a ``torch.optim.SGD`` per client, one minibatch per
   step, one intra-op thread) on the same MLP, batch and number of clients (20, as trains in
   a round), and next to the batched backend's ``train`` alone on the same minibatches.
3. **Profile.** One default run under ``cProfile`` with CPU time as the clock and
   ``backend=batched:workers=1`` (so that all the work runs on the profiled thread), split
   into phases: local training, gossip, weights and staleness, minibatches, evaluation,
   set-up, and the rest (per-round bookkeeping). The profiler inflates Python-heavy phases.

The load average is printed: on the shared 2-core development machine other processes often
hold both cores, which stretches wall time (not CPU time) by 2-3×.

    PYTHONPATH=src python benchmarks/bench_sim.py [--repeats 3] [--before /tmp/sfg-before/src]
    git worktree add /tmp/sfg-before 5e84f52    # the code before the optimisation
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from machine import banner

from sfg.sim.backends import make_backend
from sfg.sim.params import init_params, load_flat
from sfg.sim.run import simulate
from sfg.world.models import make_model

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
RUN = [sys.executable, "-m", "sfg.cli.main", "run", "--json"]


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def whole_process(src: str) -> dict[str, float]:
    """One ``sfg run`` (defaults) as a subprocess with ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": src}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(RUN, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "sim": float(res["meta"]["seconds"]),
            "acc": float(res["metrics"]["acc_mean"])}


def plain_sgd_step_time(n: int, K: int, B: int, repeats: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per client-step, best of ``repeats``, of a plain per-client loop
    (``load_flat`` into one module, a fresh ``torch.optim.SGD``, K steps of zero_grad /
    backward / step) and of the batched backend's ``train`` on the same minibatches."""
    factory = lambda: make_model("mlp", input_shape=(1, 8, 8), num_classes=10)  # noqa: E731
    model = factory()
    params = init_params(factory, n, seed=0)
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(n, K, B, 1, 8, 8, generator=gen)
    ys = torch.randint(0, 10, (n, K, B), generator=gen)

    def loop():
        for i in range(n):
            load_flat(model, params[i])
            opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=5e-4)
            for k in range(K):
                opt.zero_grad()
                F.cross_entropy(model(xs[i, k]), ys[i, k]).backward()
                opt.step()

    backend = make_backend("batched", model)

    def batched():
        backend.train(params, xs, ys, lr=0.05, weight_decay=5e-4)

    best = {"plain": (float("inf"),) * 2, "batched": (float("inf"),) * 2}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels: extra intra-op threads only stall (as in the loop)
    try:
        loop()
        batched()
        for _ in range(repeats):  # interleaved, best of
            for name, fn in (("plain", loop), ("batched", batched)):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    finally:
        torch.set_num_threads(threads)
    return {k: (v[0] / (n * K), v[1] / (n * K)) for k, v in best.items()}


PHASES = [  # (label, [(file suffix, function name)]) -- cumulative CPU time of these calls
    ("local training", [("sim/backends.py", "train")]),
    ("gossip (mixing the store)", [("sim/gossip.py", "gossip_"),
                                   ("sim/model_rules.py", "aggregate")]),
    ("weights and staleness (the compiled round)", [("round.py", "play_round")]),
    ("minibatches (draw, gather)", [("sim/run.py", "minibatch_indices"),
                                    ("sim/run.py", "gather")]),
    ("evaluation", [("sim/run.py", "evaluate")]),
    ("set-up (data, graph, trace, model)", [("data/base.py", "load_federated"),
                                            ("graphs.py", "make_graph"),
                                            ("sim/params.py", "init_params"),
                                            ("sim/backends.py", "make_backend"),
                                            ("sim/run.py", "resolve_config")]),
]


def profile_breakdown() -> tuple[float, list[tuple[str, float]]]:
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    simulate({"backend": "batched:workers=1"})
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
    total = max(v[3] for (f, _, fn), v in stats.items() if fn == "simulate")
    rows = []
    for label, keys in PHASES:
        t = sum(v[3] for (f, _, fn), v in stats.items()
                if any(f.endswith(suffix) and fn == name for suffix, name in keys))
        rows.append((label, t))
    rows.append(("rest: per-round bookkeeping", total - sum(t for _, t in rows)))
    return total, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="whole-process runs per tree")
    ap.add_argument("--before", default="", help="an older source tree to time alongside")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    print(banner(), flush=True)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load()}\n")

    trees = [("now", SRC)] + ([("before", args.before)] if args.before else [])
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(args.repeats):
        for name, src in trees:
            runs[name].append(whole_process(src))
    print("1. sfg run (defaults: digits, mlp, N=100, T=300, K=10, bursty u=0.8, dfedavg), "
          f"whole process, median of {args.repeats}:")
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"   {name:<7} wall {med['wall']:6.2f} s   CPU {med['cpu']:6.2f} s   "
              f"simulator {med['sim']:6.2f} s   (acc_mean {med['acc']:.4f}; "
              f"wall range {min(r['wall'] for r in rs):.2f}-{max(r['wall'] for r in rs):.2f})")
    if args.before:
        now = statistics.median(r["wall"] for r in runs["now"])
        old = statistics.median(r["wall"] for r in runs["before"])
        print(f"   speed-up (wall) {old / now:.1f}×, CPU "
              f"{statistics.median(r['cpu'] for r in runs['before']) / statistics.median(r['cpu'] for r in runs['now']):.1f}×")
    print(f"   load average {load()}\n")

    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate({})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = int(res.meta["client_steps"])
    ref = plain_sgd_step_time(20, 10, 32, repeats=5)
    sim = (wall / steps, cpu / steps)
    print(f"2. per useful client-step ({steps:,} local steps taken by available clients), "
          "wall / CPU:")
    print(f"   simulator, everything included     {sim[0] * 1e6:7.1f} / {sim[1] * 1e6:6.1f} µs"
          f"   ({wall:.2f} s / {cpu:.2f} s in-process, default backend)")
    print(f"   batched backend train() alone      {ref['batched'][0] * 1e6:7.1f} / "
          f"{ref['batched'][1] * 1e6:6.1f} µs   (20 clients × 10 steps, best of 5)")
    print(f"   plain per-client torch.optim.SGD   {ref['plain'][0] * 1e6:7.1f} / "
          f"{ref['plain'][1] * 1e6:6.1f} µs   (best of 5)")
    print(f"   plain / simulator: {ref['plain'][0] / sim[0]:.1f}× (wall), "
          f"{ref['plain'][1] / sim[1]:.1f}× (CPU); plain / train(): "
          f"{ref['plain'][1] / ref['batched'][1]:.1f}× (CPU)")
    print(f"   load average {load()}\n")

    if not args.no_profile:
        total, rows = profile_breakdown()
        print(f"3. profile of one run (CPU time, batched:workers=1, under cProfile): {total:.2f} s")
        for label, t in rows:
            print(f"   {label:<44} {t:6.2f} s  {100 * t / total:5.1f} %")
        print(f"   load average {load()}")


if __name__ == "__main__":
    main()
