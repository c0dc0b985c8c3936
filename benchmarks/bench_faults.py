"""Fault-sweep throughput: simulated node-rounds per second of the seeded sweep of
``tests/faultsweep.py`` — the deployable node on the virtual clock under random faults, with
every property check of the sweep (the network's log of every delivery, the nodes' records).

    .venv/bin/python benchmarks/bench_faults.py                  # the suite's sweep (24 runs)
    .venv/bin/python benchmarks/bench_faults.py --seeds 1 2 --sizes 32 --rounds 20
    .venv/bin/python benchmarks/bench_faults.py --json

A node-round is one round of one node (an offline or skipped one included: the node's clock
still passes it); the lockstep runs' fault-free reference runs are part of the wall time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from machine import banner, describe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--sizes", type=int, nargs="+", default=[6, 8, 10])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from faultsweep import standard_cases, sweep

    logging.getLogger("sfg.net").setLevel(logging.ERROR)
    if not a.json:
        print(banner())
    cases = standard_cases(tuple(a.seeds), sizes=tuple(a.sizes), rounds=a.rounds)
    t0 = time.perf_counter()
    res = sweep(cases)
    wall = time.perf_counter() - t0
    by_mode: dict[str, list[float]] = {}
    for o in res.outcomes:
        got = by_mode.setdefault(o.case.mode, [0.0, 0.0])
        got[0] += o.node_rounds
        got[1] += o.wall
    out = {"runs": len(res.outcomes), "node_rounds": res.node_rounds, "wall_seconds": wall,
           "node_rounds_per_second": res.node_rounds / wall,
           "per_mode": {m: {"node_rounds": int(v[0]), "run_seconds": v[1],
                            "node_rounds_per_second": v[0] / v[1]} for m, v in by_mode.items()},
           "violations": len(res.violations), "load": os.getloadavg()}
    if a.json:
        print(json.dumps({"machine": describe(), **out}, indent=1))
    else:
        print(f"{out['runs']} runs (seeds {a.seeds}, sizes {a.sizes}, {a.rounds} rounds): "
              f"{res.node_rounds} node-rounds in {wall:.1f} s = "
              f"{out['node_rounds_per_second']:.0f} simulated node-rounds/s "
              f"(load {' '.join(f'{x:.1f}' for x in out['load'])})")
        for m, v in out["per_mode"].items():
            print(f"  {m:8s} {v['node_rounds']:6d} node-rounds, {v['run_seconds']:.1f} s in the "
                  f"runs = {v['node_rounds_per_second']:.0f}/s")
        print(f"violations: {len(res.violations)}")
    return 1 if res.violations else 0


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(os.path.dirname(here), "tests")]  # machine, faultsweep
    sys.exit(main())
