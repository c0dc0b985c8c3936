"""The virtual clock (docs/concepts/clock.md#the-virtual-clock), measured side by side in one run.

1. **Model-free replay on the clock** (:func:`sfg.clock.replay.replay_clock`), bursty u = 0.8,
   kNN k = 6, ``sfg-cut``, 300 periods (T·Δ of virtual time), K = 10:
   * N = 10,000, ``async`` (jitter 0.5) and ``event`` (compute ``const:value=30``: K·c = 300 s
     per local round): wall time end to end (target <= 60 s), split into world
     (:func:`~sfg.clock.schedule.make_world`), schedule (:func:`~sfg.clock.schedule.make_schedule`),
     staleness (:func:`~sfg.clock.replay.staleness_events`, the rule over the events), the
     schedule's digest and the rest (the metrics' summary: end to end minus the parts, which
     are timed again on their own after it). Each runs in a fresh child process, so its peak memory is its own:
     ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the child (peak resident set), printed
     with the child's baseline after imports and warm-up.
   * N = 100, async, next to the round-based replay of the same process, rule and seeds
     (:func:`sfg.modelfree.build_scenario` + :func:`sfg.modelfree.replay_trace`, one thread), with
     the self-return H (horizon 50, as ``sfg replay`` runs it) and without it (horizon 0:
     the clock's async replay has no H). Repeats interleaved, the order rotating; the ratio
     is the median of the per-repeat ratios.
2. **Training on the clock** (:func:`sfg.clock.train.simulate_events`), async jitter 0.5,
   digits MLP, K = 10, bursty u = 0.8, ``sfg-cut``, 300 periods: time per useful client-step
   (``meta.client_steps``, the local SGD steps taken) against the synchronous
   :func:`sfg.sim.run.simulate` of the same settings, interleaved in this process (target
   <= 2×); then N = 1,000 in child processes, async and (for the ratio) synchronous, one
   each: completes, wall time and peak memory (ru_maxrss of the child). Digits has 1,258
   training images, which no Dirichlet split can give to 1,000 clients, so N = 1,000 uses
   ``partition classes:k=1`` (both runs). Every process first makes one tiny run of each
   (N = 8, 5 rounds), so numba's on-disk caches are loaded (or compiled) outside the
   figures; its time is printed.
3. **The networked swarm** (``sfg swarm --mode async``: :func:`sfg.net.swarm.run_swarm`,
   real worker processes, gRPC on 127.0.0.1) next to the clock on the same settings: N = 16,
   digits MLP, a few rounds of period P seconds with jitter and window W. The swarm's node
   wakes at t0 + r·P + jitter (a fraction of P) and reads trace row r; the clock's async
   protocol wakes at r·P + jitter and maps trace row r to [rΔ, (r+1)Δ), so the clock gets
   Δ = P (``round_seconds`` = period, the same P, jitter and W), zero compute time and
   instant messages (the real MLP's K steps and a localhost transfer take milliseconds of a
   period). Wall time of each, final mean accuracy and its difference, and the
   aggregated messages (the swarm's and the clock's ``messages``). The
   jitter draws differ (streams ``net-jitter`` and ``clock-jitter``), real arrivals race
   real wakes, and a node's server switches between answering and refusing at its own
   jittered wake (row r from t0 + r·P + jitter on) where the clock switches at r·Δ, so the
   runs are comparable, not identical. A control pair with jitter 0 (the wake times then
   coincide) follows the repeats (``--no-control`` skips it).

4. **Returns in time** (``on_return``, docs/concepts/clock.md#returns-in-time), in a world
   where a pull costs something: latency ``const:value=1``, uplinks of 100 kB/s,
   model-sized messages (36 kB in the replay, the MLP's own size in training), bursty
   u = 0.8, async jitter 0.5. The model-free async replay of N = 10,000 over 300 periods
   with ``pull:timeout=60`` against ``none`` (target <= 1.5×), and training (N = 100, digits
   MLP) with and without pull per useful client-step (target <= 1.2×); repeats interleaved
   in this process after a warm-up of both, the order rotating, the ratio the median of the
   per-repeat ratios. Pull's counts (requests, replies, waits) and returns heard are printed
   beside.

One table per part and a final JSON line with every figure.

    .venv/bin/python benchmarks/bench_clock.py            # all three (~8-10 min on 2 cores)
    .venv/bin/python benchmarks/bench_clock.py --quick    # small sizes (~1-2 min)
    .venv/bin/python benchmarks/bench_clock.py --only 1 --only 3
    .venv/bin/python benchmarks/bench_clock.py --only 4          # pull against none
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from machine import load, start

PROCESS, GRAPH, RULE, K = "bursty:u=0.8", "knn:k=6", "sfg-cut", 10
ASYNC = {"clock": "virtual", "protocol": "async", "jitter": 0.5}
EVENT = {"clock": "virtual", "protocol": "event", "compute": "const:value=30"}
TRAIN = {"dataset": "digits", "model": "mlp", "local_steps": K, "process": PROCESS,
         "rule": RULE, "graph": GRAPH, "seed": 1}


def _rss_mib() -> float:
    """Peak resident set of this process so far (ru_maxrss, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _med(xs) -> float:
    return float(statistics.median(xs))


# ----------------------------------------------------------------------------- children
def _warm_train() -> float:
    """One tiny synchronous and one tiny async run: numba's caches loaded (or compiled)."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config, simulate

    tiny = {**TRAIN, "n_clients": 8, "rounds": 5, "eval_every": 5}
    t0 = time.perf_counter()
    simulate(tiny)
    simulate_events(resolve_config({**tiny, **ASYNC}))
    return time.perf_counter() - t0


def child_replay(spec: dict) -> dict:
    """N clients on the clock, one protocol: end to end, then the parts; peak RSS."""
    from sfg.clock.replay import replay_clock, staleness_events
    from sfg.clock.schedule import make_schedule, make_world
    from sfg.clock.settings import make_settings
    from sfg.round.rules import parse_rule

    settings = make_settings(spec["settings"])
    n, T, seed = int(spec["n"]), int(spec["periods"]), 1
    t0 = time.perf_counter()
    replay_clock(PROCESS, RULE, seed=seed, settings=settings, n=100, rounds=20, graph=GRAPH,
                 local_steps=K)  # warm-up: numba caches
    warm = time.perf_counter() - t0
    base = _rss_mib()
    t_all, res = _timed(lambda: replay_clock(PROCESS, RULE, seed=seed, settings=settings, n=n,
                                             rounds=T, graph=GRAPH, local_steps=K))
    peak = _rss_mib()
    s0 = settings.with_bytes(0.0)  # as replay_clock sets it
    t_world, world = _timed(lambda: make_world(s0, process=PROCESS, graph=GRAPH, n=n, rounds=T,
                                               seed=seed))
    t_sched, sched = _timed(lambda: make_schedule(world, s0, local_steps=K, seed=seed))
    rule = parse_rule(RULE)
    t_stale, _ = _timed(lambda: staleness_events(rule, world, sched, seed=seed))
    t_digest, _ = _timed(sched.digest)
    m = res["metrics"]
    return {"n": n, "periods": T, "protocol": settings.protocol, "warmup_s": warm,
            "total_s": t_all, "world_s": t_world, "schedule_s": t_sched, "staleness_s": t_stale,
            "digest_s": t_digest, "rest_s": t_all - t_world - t_sched - t_stale - t_digest,
            "events": sched.n_events, "local_rounds": int(m["local_rounds"]),
            "candidates": int(sched.cptr[-1]), "edges": int(world.graph.edges.shape[0]),
            "baseline_rss_mib": base, "peak_rss_mib": peak, "peak_rss_after_parts_mib": _rss_mib()}


def child_train(spec: dict) -> dict:
    """One training run (synchronous or on the clock) after the warm-up; peak RSS."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config, simulate

    warm = _warm_train()
    base = _rss_mib()
    cfg = spec["cfg"]
    if cfg.get("clock") == "virtual":
        wall, got = _timed(lambda: simulate_events(resolve_config(cfg)))
        meta, metrics = got["meta"], got["metrics"]
    else:
        wall, got = _timed(lambda: simulate(cfg))
        meta, metrics = got.meta, got.metrics
    steps = int(meta["client_steps"])
    return {"warmup_s": warm, "wall_s": wall, "sim_s": float(meta["seconds"]),
            "client_steps": steps, "us_per_step": 1e6 * wall / steps,
            "acc_mean": float(metrics["acc_mean"]), "levels": meta.get("levels"),
            "peak_models": meta.get("peak_models"), "baseline_rss_mib": base,
            "peak_rss_mib": _rss_mib()}


def run_child(kind: str, spec: dict) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                          "--spec", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"child {kind} failed:\n{out.stderr[-3000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


# ----------------------------------------------------------------------------------- 1
def part_replay(big_n: int, periods: int, repeats: int, seeds: list[int]) -> dict:
    from sfg.clock.replay import replay_clock, staleness_events
    from sfg.clock.schedule import make_schedule, make_world
    from sfg.clock.settings import make_settings
    from sfg.modelfree import build_scenario, replay_trace, warm_compiled
    from sfg.round.rules import parse_rule

    big = {"async": run_child("replay", {"settings": ASYNC, "n": big_n, "periods": periods}),
           "event": run_child("replay", {"settings": EVENT, "n": big_n, "periods": periods})}

    settings = make_settings(ASYNC)
    s0 = settings.with_bytes(0.0)
    rule = parse_rule(RULE)
    warm_compiled([RULE])
    replay_clock(PROCESS, RULE, seed=1, settings=settings, n=100, rounds=20, graph=GRAPH,
                 local_steps=K)

    def clock(seed):
        return replay_clock(PROCESS, RULE, seed=seed, settings=settings, n=100, rounds=periods,
                            graph=GRAPH, local_steps=K)

    def rounds(seed, horizon):
        g, avail = build_scenario(PROCESS, n=100, T=periods, graph=GRAPH, seed=seed)
        return replay_trace(avail, g, RULE, seed=seed, threads=1, horizon=horizon)

    def parts(seed):
        t = {}
        t["world"], w = _timed(lambda: make_world(s0, process=PROCESS, graph=GRAPH, n=100,
                                                  rounds=periods, seed=seed))
        t["schedule"], sc = _timed(lambda: make_schedule(w, s0, local_steps=K, seed=seed))
        t["staleness"], _ = _timed(lambda: staleness_events(rule, w, sc, seed=seed))
        return t

    times: dict[str, list[float]] = {"clock": [], "rounds_H": [], "rounds_noH": []}
    part_t: dict[str, list[float]] = {"world": [], "schedule": [], "staleness": []}
    ratio_H, ratio_noH = [], []
    unav: dict[str, list[float]] = {"clock": [], "rounds": []}
    k = 0
    for _ in range(repeats):
        for seed in seeds:
            got: dict[str, float] = {}
            steps = [("clock", lambda s=seed: clock(s)), ("rounds_H", lambda s=seed: rounds(s, 50)),
                     ("rounds_noH", lambda s=seed: rounds(s, 0)), ("parts", lambda s=seed: parts(s))]
            for name, fn in steps[k % 4:] + steps[:k % 4]:  # the order rotates
                dt, out = _timed(fn)
                if name == "parts":
                    for p, v in out.items():
                        part_t[p].append(v)
                    continue
                got[name] = dt
                times[name].append(dt)
                if name == "clock":
                    unav["clock"].append(out["metrics"]["unavailability"])
                elif name == "rounds_H":
                    unav["rounds"].append(out.metrics["unavailability"])
            ratio_H.append(got["clock"] / got["rounds_H"])
            ratio_noH.append(got["clock"] / got["rounds_noH"])
            k += 1
    small = {"n": 100, "periods": periods, "seeds": seeds, "repeats": repeats,
             "clock_ms": 1e3 * _med(times["clock"]),
             "world_ms": 1e3 * _med(part_t["world"]),
             "schedule_ms": 1e3 * _med(part_t["schedule"]),
             "staleness_ms": 1e3 * _med(part_t["staleness"]),
             "rounds_H_ms": 1e3 * _med(times["rounds_H"]),
             "rounds_noH_ms": 1e3 * _med(times["rounds_noH"]),
             "ratio_vs_rounds_H": _med(ratio_H), "ratio_vs_rounds_noH": _med(ratio_noH),
             "unavailability_clock": statistics.fmean(unav["clock"]),
             "unavailability_rounds": statistics.fmean(unav["rounds"])}
    return {"big": big, "small": small}


def print_replay(r: dict) -> None:
    big, sm = r["big"], r["small"]
    n, T = big["async"]["n"], big["async"]["periods"]
    print(f"\n1. model-free replay on the clock: {PROCESS}, {GRAPH}, {RULE}, K={K}, {T} periods")
    print(f"   N={n:,} ({big['async']['edges']:,} edges), each in a fresh process; peak memory = "
          "ru_maxrss of that process (baseline: after imports and a warm-up replay)")
    print(f"   {'protocol':<28} {'total s':>8} {'world':>7} {'sched':>7} {'stale':>7} {'digest':>7} "
          f"{'rest':>7} {'events':>10} {'cands':>10} {'peak MiB':>9} {'base MiB':>9} {'<=60 s':>7}")
    for name, label in (("async", "async, jitter 0.5"), ("event", "event, compute const:30")):
        b = big[name]
        print(f"   {label:<28} {b['total_s']:8.2f} {b['world_s']:7.2f} {b['schedule_s']:7.2f} "
              f"{b['staleness_s']:7.2f} {b['digest_s']:7.2f} {b['rest_s']:7.2f} {b['events']:10,} "
              f"{b['candidates']:10,} {b['peak_rss_mib']:9.0f} {b['baseline_rss_mib']:9.0f} "
              f"{str(b['total_s'] <= 60):>7}")
    print("   (the parts are timed again in separate calls after the end-to-end run; rest = total − "
          "the parts: the metrics' summary, ± timing noise)")
    print(f"   N=100, async (jitter 0.5) vs the round-based replay of the same process, seeds "
          f"{sm['seeds']}, {sm['repeats']} interleaved repeats, medians (one thread):")
    print(f"   {'run':<48} {'ms':>8} {'clock / it':>11}")
    print(f"   {'clock (world + schedule + staleness + metrics)':<48} {sm['clock_ms']:8.1f} "
          f"{'':>11}")
    print(f"   {'  of it: world':<48} {sm['world_ms']:8.1f}")
    print(f"   {'  of it: schedule':<48} {sm['schedule_ms']:8.1f}")
    print(f"   {'  of it: staleness (the rule over the events)':<48} {sm['staleness_ms']:8.1f}")
    print(f"   {'rounds: build_scenario + replay_trace, H over 50':<48} {sm['rounds_H_ms']:8.1f} "
          f"{sm['ratio_vs_rounds_H']:10.2f}×")
    print(f"   {'rounds: build_scenario + replay_trace, no H':<48} {sm['rounds_noH_ms']:8.1f} "
          f"{sm['ratio_vs_rounds_noH']:10.2f}×")
    print(f"   (unavailability: clock {sm['unavailability_clock']:.4f}, rounds "
          f"{sm['unavailability_rounds']:.4f}; load {load()})")


# ----------------------------------------------------------------------------------- 2
def part_train(periods: int, repeats: int, n_big: int, periods_big: int) -> dict:
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config, simulate

    warm = _warm_train()
    cfg = {**TRAIN, "n_clients": 100, "rounds": periods}
    runs: dict[str, list[dict]] = {"sync": [], "async": []}

    def sync():
        wall, res = _timed(lambda: simulate(cfg))
        return {"wall_s": wall, "sim_s": float(res.meta["seconds"]),
                "client_steps": int(res.meta["client_steps"]),
                "acc_mean": float(res.metrics["acc_mean"])}

    def asyn():
        wall, res = _timed(lambda: simulate_events(resolve_config({**cfg, **ASYNC})))
        return {"wall_s": wall, "sim_s": float(res["meta"]["seconds"]),
                "client_steps": int(res["meta"]["client_steps"]),
                "acc_mean": float(res["metrics"]["acc_mean"]), "levels": res["meta"]["levels"],
                "peak_models": res["meta"]["peak_models"]}

    ratios = []
    for k in range(repeats):
        order = [("sync", sync), ("async", asyn)]
        for name, fn in order[k % 2:] + order[:k % 2]:
            runs[name].append(fn())
        s, a = runs["sync"][-1], runs["async"][-1]
        ratios.append((a["wall_s"] / a["client_steps"]) / (s["wall_s"] / s["client_steps"]))
    small: dict[str, Any] = {"n": 100, "periods": periods, "repeats": repeats, "warmup_s": warm,
                             "ratio_per_step": _med(ratios), "ratios": ratios}
    for name, rs in runs.items():
        small[name] = {"wall_s": _med(r["wall_s"] for r in rs),
                       "sim_s": _med(r["sim_s"] for r in rs),
                       "client_steps": rs[0]["client_steps"],
                       "us_per_step": _med(1e6 * r["wall_s"] / r["client_steps"] for r in rs),
                       "acc_mean": rs[0]["acc_mean"],
                       **({"levels": rs[0]["levels"], "peak_models": rs[0]["peak_models"]}
                          if name == "async" else {})}
    big_cfg = {**TRAIN, "n_clients": n_big, "rounds": periods_big, "partition": "classes:k=1"}
    big = {"n": n_big, "periods": periods_big, "partition": "classes:k=1",
           "async": run_child("train", {"cfg": {**big_cfg, **ASYNC}}),
           "sync": run_child("train", {"cfg": big_cfg})}
    big["ratio_per_step"] = big["async"]["us_per_step"] / big["sync"]["us_per_step"]
    return {"small": small, "big": big}


def print_train(r: dict) -> None:
    sm, big = r["small"], r["big"]
    print(f"\n2. training on the clock: digits MLP, K={K}, {PROCESS}, {RULE}; async jitter 0.5 vs "
          f"the synchronous simulate (numba caches warmed by a tiny run of each first: "
          f"{sm['warmup_s']:.1f} s, not counted)")
    print(f"   {'run':<40} {'wall s':>7} {'sim s':>7} {'steps':>9} {'µs/step':>8} "
          f"{'async/sync':>10} {'acc':>6} {'levels':>6} {'peak mdl':>8} {'peak MiB':>9}")
    def rows(lab: str, block: dict, rss: bool) -> None:
        for name in ("sync", "async"):
            x = block[name]
            ratio = format(block["ratio_per_step"], "9.2f") + "×" if name == "async" else ""
            mib = f"{x['peak_rss_mib']:9.0f}" if rss else f"{'':>9}"
            print(f"   {lab + ', ' + name:<40} {x['wall_s']:7.2f} {x['sim_s']:7.2f} "
                  f"{x['client_steps']:9,} {x['us_per_step']:8.1f} {ratio:>10} "
                  f"{x['acc_mean']:6.3f} {str(x.get('levels') or ''):>6} "
                  f"{str(x.get('peak_models') or ''):>8} {mib}")

    rows(f"N=100, {sm['periods']} periods, median of {sm['repeats']}", sm, False)
    rows(f"N={big['n']:,}, {big['periods']} periods, classes:k=1", big, True)
    print(f"   async/sync: time per useful client-step (target <= 2×), N=100 the median of "
          f"per-repeat ratios {[round(x, 2) for x in sm['ratios']]}; N={big['n']:,}: one run "
          f"each in its own process, back to back (baseline RSS after warm-up: async "
          f"{big['async']['baseline_rss_mib']:.0f} MiB, sync {big['sync']['baseline_rss_mib']:.0f} "
          f"MiB); load {load()}")


# ----------------------------------------------------------------------------------- 3
def part_swarm(n: int, rounds: int, period: float, jitter: float, window: float, procs: int,
               repeats: int, eval_every: int, control: bool) -> dict:
    from sfg.clock.train import simulate_events
    from sfg.net.swarm import SwarmOptions, run_swarm
    from sfg.net.world import build_world
    from sfg.sim.run import resolve_config, simulate

    _warm_train()
    cfg = {**TRAIN, "n_clients": n, "rounds": rounds, "eval_every": eval_every}
    clock_cfg = {**cfg, "clock": "virtual", "protocol": "async", "round_seconds": period,
                 "jitter": jitter, "window": window}
    world = build_world({**cfg, "backend": "loop"})  # as `sfg swarm` builds it
    swarm, clock = [], []
    # the repeats, interleaved; then (control) one pair with jitter 0, where the swarm's and
    # the clock's wake times are the same
    for k in range(repeats + int(control)):
        jit = jitter if k < repeats else 0.0
        opts = SwarmOptions(mode="async", procs=procs, period=period, jitter=jit, window=window)
        wall, out = _timed(lambda o=opts: run_swarm(world, o))
        m = out["metrics"]
        swarm.append({"wall_s": wall, "startup_s": float(m["startup_seconds"]),
                      "rounds_phase_s": wall - float(m["startup_seconds"]),
                      "acc_mean": float(m["acc_mean"]), "aggregated": float(m["messages"]),
                      "deliveries_refused": float(m["deliveries_refused"]), "send_failed": float(m["send_failed"]),
                      "rejected": float(m["rejected"]),
                      "rss_mb_per_node": float(m["rss_mb_per_node"]), "jitter": jit})
        wall, got = _timed(lambda j=jit: simulate_events(resolve_config({**clock_cfg,
                                                                          "jitter": j})))
        cm = got["metrics"]
        clock.append({"wall_s": wall, "acc_mean": float(cm["acc_mean"]),
                      "aggregated": float(cm["messages"]),
                      "delivered": float(cm["delivered"]),
                      "local_rounds": float(cm["local_rounds"]),
                      "virtual_s": float(rounds * period), "jitter": jit})
    control_pair = {"swarm": swarm.pop(), "clock": clock.pop()} if control else None
    t_sync, sync = _timed(lambda: simulate(cfg))
    acc_swarm = statistics.fmean(s["acc_mean"] for s in swarm)
    acc_clock = clock[0]["acc_mean"]
    return {"n": n, "rounds": rounds, "period_s": period, "jitter": jitter, "window": window,
            "procs": procs, "repeats": repeats, "swarm": swarm, "clock": clock,
            "available_rounds": int(world.available.sum()),
            "sync": {"wall_s": t_sync, "acc_mean": float(sync.metrics["acc_mean"])},
            "swarm_wall_s": _med(s["wall_s"] for s in swarm),
            "clock_wall_s": _med(c["wall_s"] for c in clock),
            "acc_swarm": acc_swarm, "acc_clock": acc_clock,
            "acc_diff_clock_minus_swarm": acc_clock - acc_swarm,
            "control_jitter0": control_pair and {
                **control_pair, "acc_diff_clock_minus_swarm":
                    control_pair["clock"]["acc_mean"] - control_pair["swarm"]["acc_mean"]}}


def print_swarm(r: dict) -> None:
    print(f"\n3. sfg swarm --mode async vs the clock: N={r['n']}, digits MLP, {RULE}, {PROCESS}, "
          f"{r['rounds']} rounds of P={r['period_s']} s, jitter {r['jitter']}, W={r['window']}; "
          f"swarm over {r['procs']} worker processes (gRPC, 127.0.0.1); clock: round_seconds = "
          f"period = {r['period_s']} s, compute 0, instant messages; {r['repeats']} interleaved "
          f"repeats{' + a control pair with jitter 0' if r['control_jitter0'] else ''} "
          f"({r['available_rounds']} available node-rounds in the trace)")
    print(f"   {'run':<34} {'wall s':>7} {'startup':>8} {'rounds s':>9} {'T·P s':>6} "
          f"{'acc':>7} {'aggregated':>10} {'refused':>8} {'failed':>7}")
    ctl = r["control_jitter0"]
    swarms = [(f"swarm #{k + 1}", s) for k, s in enumerate(r["swarm"])]
    clocks = [(f"clock #{k + 1} (virtual {c['virtual_s']:.0f} s)", c)
              for k, c in enumerate(r["clock"])]
    if ctl:
        swarms.append(("control, jitter 0: swarm", ctl["swarm"]))
        clocks.append(("control, jitter 0: clock", ctl["clock"]))
    for label, s in swarms:
        print(f"   {label:<34} {s['wall_s']:7.2f} {s['startup_s']:8.2f} "
              f"{s['rounds_phase_s']:9.2f} {r['rounds'] * r['period_s']:6.1f} {s['acc_mean']:7.4f} "
              f"{s['aggregated']:10.0f} {s['deliveries_refused']:8.0f} {s['send_failed'] + s['rejected']:7.0f}")
    for label, c in clocks:
        print(f"   {label:<34} {c['wall_s']:7.2f} "
              f"{'':>8} {'':>9} {'':>6} {c['acc_mean']:7.4f} {c['aggregated']:10.0f}")
    print(f"   {'synchronous simulate (reference)':<34} {r['sync']['wall_s']:7.2f} {'':>8} {'':>9} "
          f"{'':>6} {r['sync']['acc_mean']:7.4f}")
    print(f"   wall: swarm {r['swarm_wall_s']:.2f} s, clock {r['clock_wall_s']:.2f} s "
          f"({r['swarm_wall_s'] / r['clock_wall_s']:.0f}× faster); final mean accuracy clock − "
          f"swarm (mean of {r['repeats']}) = {r['acc_diff_clock_minus_swarm']:+.4f}; swarm memory "
          f"{statistics.fmean(s['rss_mb_per_node'] for s in r['swarm']):.0f} MB per node; "
          f"load {load()}")
    if ctl:
        print(f"   control (jitter 0): clock − swarm accuracy {ctl['acc_diff_clock_minus_swarm']:+.4f}, "
              f"aggregated messages swarm {ctl['swarm']['aggregated']:.0f}, clock "
              f"{ctl['clock']['aggregated']:.0f}")


# ----------------------------------------------------------------------------------- 4
PULL_WORLD = {"latency": "const:value=1", "uplink": "const:value=100000"}
PULL = "pull:timeout=60"


def part_pull(big_n: int, periods: int, repeats: int, train_periods: int) -> dict:
    from sfg.clock.replay import replay_clock
    from sfg.clock.settings import make_settings
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    def replay(on_return, n, T):
        st = make_settings({**ASYNC, **PULL_WORLD, "message_bytes": 36_000.0,
                            "on_return": on_return})
        wall, res = _timed(lambda: replay_clock(PROCESS, RULE, seed=1, settings=st, n=n,
                                                rounds=T, graph=GRAPH, local_steps=K))
        m = res["metrics"]
        return {"wall_s": wall, **{k: float(m[k]) for k in m if k.startswith("pull_")
                                   or k.startswith("returns")}}

    def train(on_return):
        cfg = {**TRAIN, **ASYNC, **PULL_WORLD, "n_clients": 100, "rounds": train_periods,
               "on_return": on_return}
        wall, res = _timed(lambda: simulate_events(resolve_config(cfg)))
        steps = int(res["meta"]["client_steps"])
        return {"wall_s": wall, "client_steps": steps, "us_per_step": 1e6 * wall / steps,
                "acc_mean": float(res["metrics"]["acc_mean"])}

    t0 = time.perf_counter()
    for on in ("none", PULL):  # warm-up: numba caches
        replay(on, 100, 20)
        cfg = {**TRAIN, **ASYNC, **PULL_WORLD, "n_clients": 8, "rounds": 5, "eval_every": 5,
               "on_return": on}
        simulate_events(resolve_config(cfg))
    warm = time.perf_counter() - t0
    out: dict[str, Any] = {"n": big_n, "periods": periods, "train_periods": train_periods,
                           "repeats": repeats, "warmup_s": warm, "world": PULL_WORLD}
    for name, fn in (("replay", lambda on: replay(on, big_n, periods)), ("train", train)):
        runs: dict[str, list[dict]] = {"none": [], "pull": []}
        ratios = []
        key = "wall_s" if name == "replay" else "us_per_step"
        for k in range(repeats):
            order = [("none", "none"), ("pull", PULL)]
            for lab, on in order[k % 2:] + order[:k % 2]:
                runs[lab].append(fn(on))
            ratios.append(runs["pull"][-1][key] / runs["none"][-1][key])
        out[name] = {"ratio": _med(ratios), "ratios": ratios,
                     **{lab: {**rs[0], key: _med(r[key] for r in rs)} for lab, rs in runs.items()}}
    return out


def print_pull(r: dict) -> None:
    print(f"\n4. returns in time: on_return {PULL} against none, async jitter 0.5, latency 1 s, "
          f"uplinks 100 kB/s, {PROCESS}, {RULE} (warm-up {r['warmup_s']:.1f} s, not counted)")
    rp, tr = r["replay"], r["train"]
    print(f"   model-free replay N={r['n']:,}, {r['periods']} periods, 36 kB messages: none "
          f"{rp['none']['wall_s']:.2f} s, pull {rp['pull']['wall_s']:.2f} s: "
          f"{rp['ratio']:.2f}× (target <= 1.5×; per repeat {[round(x, 2) for x in rp['ratios']]})")
    p = rp["pull"]

    def heard(d):
        return d.get("returns_heard", 0.0) / max(
            d.get("returns_aggregated", 0.0), 1.0)

    print(f"   returns heard: none {heard(rp['none']):.3f}, pull {heard(p):.3f}; per device-hour: "
          f"requests {p.get('pull_requests_per_device_hour', 0):.3f}, replies "
          f"{p.get('pull_replies_per_device_hour', 0):.3f}, unreachable "
          f"{p.get('pull_unreachable_per_device_hour', 0):.3f}, bytes "
          f"{p.get('pull_bytes_per_device_hour', 0):,.0f}, wait s "
          f"{p.get('pull_wait_seconds_per_device_hour', 0):.3f}")
    print(f"   training N=100, {r['train_periods']} periods: none "
          f"{tr['none']['us_per_step']:.1f} µs/step ({tr['none']['client_steps']:,} steps, acc "
          f"{tr['none']['acc_mean']:.3f}), pull {tr['pull']['us_per_step']:.1f} µs/step "
          f"({tr['pull']['client_steps']:,} steps, acc {tr['pull']['acc_mean']:.3f}): "
          f"{tr['ratio']:.2f}× per useful client-step (target <= 1.2×); load {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small sizes: N=2,000 replay, 60 periods of training, N=300, a short swarm")
    ap.add_argument("--only", type=int, choices=[1, 2, 3, 4], action="append")
    ap.add_argument("--big-n", type=int, default=None, help="part 1's large N (default 10,000)")
    ap.add_argument("--periods", type=int, default=None, help="periods of parts 1 and 2 (300)")
    ap.add_argument("--repeats", type=int, default=None, help="part 1 N=100 repeats (5)")
    ap.add_argument("--train-repeats", type=int, default=None, help="part 2 N=100 repeats (3)")
    ap.add_argument("--train-big-n", type=int, default=None, help="part 2's large N (1,000)")
    ap.add_argument("--train-big-periods", type=int, default=None, help="its periods (300)")
    ap.add_argument("--swarm-n", type=int, default=16)
    ap.add_argument("--swarm-rounds", type=int, default=None, help="(40)")
    ap.add_argument("--swarm-period", type=float, default=0.5)
    ap.add_argument("--swarm-jitter", type=float, default=0.5)
    ap.add_argument("--swarm-window", type=float, default=1.0)
    ap.add_argument("--swarm-procs", type=int, default=2)
    ap.add_argument("--swarm-repeats", type=int, default=None, help="(2)")
    ap.add_argument("--no-control", action="store_true",
                    help="skip part 3's control pair with jitter 0")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        fn = {"replay": child_replay, "train": child_train}[a.child]
        print("RESULT " + json.dumps(fn(json.loads(a.spec))), flush=True)
        return
    q = a.quick

    def pick(v, full, quick):
        return v if v is not None else (quick if q else full)

    machine = start(q)
    which = a.only or [1, 2, 3, 4]
    out: dict[str, Any] = {"machine": machine, "quick": q, "peak_memory": "ru_maxrss"}
    if 1 in which:
        r = part_replay(pick(a.big_n, 10_000, 2_000), pick(a.periods, 300, 300),
                        pick(a.repeats, 5, 2), [1, 2, 3])
        print_replay(r)
        out["replay"] = r
    if 2 in which:
        r = part_train(pick(a.periods, 300, 60), pick(a.train_repeats, 3, 1),
                       pick(a.train_big_n, 1_000, 300), pick(a.train_big_periods, 300, 30))
        print_train(r)
        out["train"] = r
    if 3 in which:
        rounds = pick(a.swarm_rounds, 40, 10)
        r = part_swarm(a.swarm_n, rounds, a.swarm_period, a.swarm_jitter, a.swarm_window,
                       a.swarm_procs, pick(a.swarm_repeats, 2, 1), max(1, min(10, rounds)),
                       not a.no_control)
        print_swarm(r)
        out["swarm"] = r
    if 4 in which:
        r = part_pull(pick(a.big_n, 10_000, 2_000), pick(a.periods, 300, 300),
                      pick(a.repeats, 3, 1), pick(a.periods, 300, 60))
        print_pull(r)
        out["pull"] = r
    print(f"\nload average at end: {load()}")
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
