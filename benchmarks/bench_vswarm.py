"""The networked node on the virtual clock: ``sfg swarm --clock virtual``
(:func:`sfg.net.virtual.run_virtual_swarm`: every node's own code in one process, on the
virtual loop, the in-memory network and the batched trainer) next to the synchronous ``sfg run``
(:func:`sfg.sim.run.simulate`) of the same settings.

Settings: digits MLP, K = 10, ``sfg-cut``, kNN k = 6, bursty u = 0.8, seed 1, 300 periods of
P = Δ = 600 s; async with jitter 0.5, compute ``const:value=30`` (K·c = 300 s, half a period)
and latency ``const:value=1`` (the synchronous run has no time: its other settings are the
same). Every run is a fresh child process that first makes one tiny run of each kind (N = 8,
5 rounds: numba's caches loaded or compiled, torch warmed up) and then the timed one; its peak
memory is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the child (peak resident set),
printed with the child's baseline after the warm-up.

1. **N = 100**: ``repeats`` pairs (virtual swarm, synchronous run), interleaved with the order
   alternating; the ratio is the median of the per-pair ratios (target <= 3×). Then one
   run of the clock's own engine (:func:`sfg.clock.train.simulate_events`, the same async
   settings) whose final parameters are compared with the virtual swarm's (they are the same
   protocol: the maximum absolute difference), and a no-batching control: compute 0 with
   jitter 0.5 (every wake at its own instant, so every training request runs alone;
   ``--no-control`` skips it).
2. **N = 1,000** (``partition classes:k=1``: digits has 1,258 training images, which no
   Dirichlet split can give to 1,000 clients): one virtual swarm (target: completes in
   <= 15 min) and one synchronous run, each in its own child.

Per run: wall time of the run (not the child's start-up or warm-up), peak memory, final mean
accuracy, and for the virtual swarm its batches and requests (``train_batches``,
``train_requests``), the messages sent and the virtual seconds. A table per part and a final
JSON line with every figure.

    .venv/bin/python benchmarks/bench_vswarm.py            # both parts (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench_vswarm.py --quick    # N = 32 and 200, 30 periods (~1 min)
    .venv/bin/python benchmarks/bench_vswarm.py --only 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from machine import load, start

P = 600.0
TRAIN = {"dataset": "digits", "model": "mlp", "local_steps": 10, "process": "bursty:u=0.8",
         "rule": "sfg-cut", "graph": "knn:k=6", "seed": 1}
ASYNC = {"jitter": 0.5, "compute": "const:value=30", "latency": "const:value=1"}
NO_BATCH = {"jitter": 0.5, "compute": "const:value=0", "latency": "const:value=0"}


def _rss_mib() -> float:
    """Peak resident set of this process so far (ru_maxrss, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------- children
def _vswarm(cfg: dict, world_set: dict):
    from sfg.net.swarm import SwarmOptions
    from sfg.net.virtual import run_virtual_swarm
    from sfg.net.world import build_world

    world = build_world({**cfg, "backend": "loop"})  # as sfg swarm builds it
    opts = SwarmOptions(mode="async", period=P, jitter=world_set["jitter"], window=1.0)
    settings = {k: v for k, v in world_set.items() if k != "jitter"}
    return run_virtual_swarm(world, opts, clock_settings=settings)


def _engine(cfg: dict, world_set: dict):
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    return simulate_events(resolve_config({**cfg, **world_set, "clock": "virtual",
                                           "protocol": "async", "period": P}))


def _warm_up() -> float:
    from sfg.sim.run import simulate

    tiny = {**TRAIN, "n_clients": 8, "rounds": 5, "eval_every": 5}
    t0 = time.perf_counter()
    simulate(tiny)
    _vswarm(tiny, ASYNC)
    _engine(tiny, ASYNC)
    return time.perf_counter() - t0


def child(spec: dict) -> dict:
    """One run (kind ``vswarm``, ``sync`` or ``engine``) after the warm-up; peak RSS."""
    import numpy as np

    from sfg.sim.run import simulate

    warm = _warm_up()
    base = _rss_mib()
    cfg, kind = spec["cfg"], spec["kind"]
    t0 = time.perf_counter()
    if kind == "sync":
        res = simulate(cfg)
        wall = time.perf_counter() - t0
        out = {"acc_mean": float(res.metrics["acc_mean"]),
               "client_steps": int(res.meta["client_steps"])}
        params = None
    elif kind == "vswarm":
        res = _vswarm(cfg, spec["world"])
        wall = time.perf_counter() - t0
        m = res["metrics"]
        out = {"acc_mean": float(m["acc_mean"]), "train_batches": int(m["train_batches"]),
               "train_requests": int(m["train_requests"]), "net_sent": int(m["net_sent"]),
               "messages": int(m["messages"]), "virtual_s": float(m["virtual_seconds"]),
               "skipped": int(m["skipped"]), "interrupted": int(m["interrupted"])}
        params = res["params"]
    else:
        res = _engine(cfg, spec["world"])
        wall = time.perf_counter() - t0
        out = {"acc_mean": float(res["metrics"]["acc_mean"])}
        params = res["params"].numpy()
    if spec.get("save") and params is not None:
        np.save(spec["save"], params)
    return {"kind": kind, "n": int(cfg["n_clients"]), "wall_s": wall, "warmup_s": warm,
            "baseline_rss_mib": base, "peak_rss_mib": _rss_mib(), **out}


def run_child(spec: dict) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                          "--spec", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child {spec['kind']} failed:\n{out.stderr[-3000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


# ----------------------------------------------------------------------------------- 1
def part_small(n: int, periods: int, repeats: int, control: bool) -> dict:
    import numpy as np

    cfg = {**TRAIN, "n_clients": n, "rounds": periods}
    runs: dict[str, list[dict]] = {"vswarm": [], "sync": []}
    ratios = []
    tmp = tempfile.mkdtemp(prefix="bench-vswarm-")
    for k in range(repeats):
        order = [("vswarm", {"kind": "vswarm", "cfg": cfg, "world": ASYNC,
                             "save": os.path.join(tmp, "vswarm.npy") if k == 0 else None}),
                 ("sync", {"kind": "sync", "cfg": cfg})]
        for name, spec in order[k % 2:] + order[:k % 2]:
            runs[name].append(run_child(spec))
        ratios.append(runs["vswarm"][-1]["wall_s"] / runs["sync"][-1]["wall_s"])
    engine = run_child({"kind": "engine", "cfg": cfg, "world": ASYNC,
                        "save": os.path.join(tmp, "engine.npy")})
    diff = float(np.abs(np.load(os.path.join(tmp, "vswarm.npy"))
                        - np.load(os.path.join(tmp, "engine.npy"))).max())
    nobatch = run_child({"kind": "vswarm", "cfg": cfg, "world": NO_BATCH}) if control else None
    med = {name: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                  "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                  "baseline_rss_mib": rs[0]["baseline_rss_mib"], "acc_mean": rs[0]["acc_mean"]}
           for name, rs in runs.items()}
    return {"n": n, "periods": periods, "repeats": repeats, "runs": runs, "median": med,
            "ratio": statistics.median(ratios), "ratios": ratios, "engine": engine,
            "max_param_diff_vs_engine": diff, "no_batching": nobatch}


def print_small(r: dict) -> None:
    v, s = r["median"]["vswarm"], r["median"]["sync"]
    v0 = r["runs"]["vswarm"][0]
    print(f"\n1. N={r['n']}, {r['periods']} periods of P=Δ={P:.0f} s, digits MLP, K=10, "
          f"{TRAIN['rule']}, {TRAIN['process']}; virtual swarm async (jitter 0.5, compute "
          f"const 30 s, latency 1 s) vs the synchronous sfg run; {r['repeats']} interleaved "
          "pairs, each run a fresh child process (peak memory = its ru_maxrss)")
    print(f"   {'run':<44} {'wall s':>7} {'peak MiB':>9} {'base MiB':>9} {'acc':>7} "
          f"{'batches':>8} {'requests':>9} {'sent':>7}")
    print(f"   {'virtual swarm (median)':<44} {v['wall_s']:7.2f} {v['peak_rss_mib']:9.0f} "
          f"{v['baseline_rss_mib']:9.0f} {v['acc_mean']:7.4f} {v0['train_batches']:8,} "
          f"{v0['train_requests']:9,} {v0['net_sent']:7,}")
    print(f"   {'synchronous sfg run (median)':<44} {s['wall_s']:7.2f} {s['peak_rss_mib']:9.0f} "
          f"{s['baseline_rss_mib']:9.0f} {s['acc_mean']:7.4f}")
    e = r["engine"]
    print(f"   {'clock engine, same async settings (one run)':<44} {e['wall_s']:7.2f} "
          f"{e['peak_rss_mib']:9.0f} {e['baseline_rss_mib']:9.0f} {e['acc_mean']:7.4f}")
    nb = r["no_batching"]
    if nb:
        print(f"   {'control: compute 0, jitter 0.5 (no batching)':<44} {nb['wall_s']:7.2f} "
              f"{nb['peak_rss_mib']:9.0f} {nb['baseline_rss_mib']:9.0f} {nb['acc_mean']:7.4f} "
              f"{nb['train_batches']:8,} {nb['train_requests']:9,} {nb['net_sent']:7,}")
    print(f"   virtual swarm / sfg run: {r['ratio']:.2f}× (median of "
          f"{[round(x, 2) for x in r['ratios']]}; target <= 3×: "
          f"{'met' if r['ratio'] <= 3 else 'not met'}); virtual swarm vs the clock's engine: "
          f"max |Δ parameters| = {r['max_param_diff_vs_engine']:.3g}, accuracy "
          f"{v['acc_mean']:.4f} vs {e['acc_mean']:.4f}; {v0['virtual_s']:,.0f} virtual seconds; "
          f"load {load()}")


# ----------------------------------------------------------------------------------- 2
def part_big(n: int, periods: int) -> dict:
    cfg = {**TRAIN, "n_clients": n, "rounds": periods, "partition": "classes:k=1"}
    v = run_child({"kind": "vswarm", "cfg": cfg, "world": ASYNC})
    s = run_child({"kind": "sync", "cfg": cfg})
    return {"n": n, "periods": periods, "partition": "classes:k=1", "vswarm": v, "sync": s,
            "ratio": v["wall_s"] / s["wall_s"], "within_15_min": v["wall_s"] <= 900}


def print_big(r: dict) -> None:
    v, s = r["vswarm"], r["sync"]
    print(f"\n2. N={r['n']:,}, {r['periods']} periods, partition {r['partition']}, the same "
          "settings otherwise; one run each, each in its own child process")
    print(f"   {'run':<44} {'wall s':>7} {'peak MiB':>9} {'base MiB':>9} {'acc':>7} "
          f"{'batches':>8} {'requests':>9} {'sent':>9}")
    print(f"   {'virtual swarm':<44} {v['wall_s']:7.1f} {v['peak_rss_mib']:9.0f} "
          f"{v['baseline_rss_mib']:9.0f} {v['acc_mean']:7.4f} {v['train_batches']:8,} "
          f"{v['train_requests']:9,} {v['net_sent']:9,}")
    print(f"   {'synchronous sfg run':<44} {s['wall_s']:7.1f} {s['peak_rss_mib']:9.0f} "
          f"{s['baseline_rss_mib']:9.0f} {s['acc_mean']:7.4f}")
    print(f"   completes in <= 15 min: {r['within_15_min']} ({v['wall_s'] / 60:.1f} min); "
          f"virtual swarm / sfg run: {r['ratio']:.2f}×; {v['virtual_s']:,.0f} virtual seconds; "
          f"load {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N=32 and 200, 30 periods")
    ap.add_argument("--only", type=int, choices=[1, 2], action="append")
    ap.add_argument("--periods", type=int, default=None, help="(300)")
    ap.add_argument("--repeats", type=int, default=None, help="part 1's pairs (3)")
    ap.add_argument("--small-n", type=int, default=None, help="(100)")
    ap.add_argument("--big-n", type=int, default=None, help="(1,000)")
    ap.add_argument("--no-control", action="store_true", help="skip the no-batching control")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(json.loads(a.spec))), flush=True)
        return
    q = a.quick

    def pick(v, full, quick):
        return v if v is not None else (quick if q else full)

    machine = start(q)
    which = a.only or [1, 2]
    periods = pick(a.periods, 300, 30)
    out: dict[str, Any] = {"machine": machine, "quick": q, "peak_memory": "ru_maxrss",
                           "settings": {**TRAIN, "period": P, **ASYNC}}
    if 1 in which:
        r = part_small(pick(a.small_n, 100, 32), periods, pick(a.repeats, 3, 1),
                       not a.no_control)
        print_small(r)
        out["small"] = r
    if 2 in which:
        r = part_big(pick(a.big_n, 1_000, 200), periods)
        print_big(r)
        out["big"] = r
    print(f"\nload average at end: {load()}")
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
