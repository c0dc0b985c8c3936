"""Start-up time of ``sfg`` commands, as whole processes, side by side with ``import numpy``.

Every command runs as a fresh subprocess (what a user waits for), several times in interleaved
order, after one warm-up pass that fills numba's on-disk cache; the table gives the median wall
time and its ratio to ``python -c "import numpy"`` measured in the same run (so a loaded or slow
machine shifts both). Targets: ``sfg --help`` <= 0.5 s, the N = 100 replay
<= 1.2 s, the N = 2,000 two-process replay <= 1.5 s; the default ``sfg run`` <= 4 s.

    PYTHONPATH=src python benchmarks/bench_startup.py [--repeats 7] [--json]

``--importtime`` adds, per command, the slowest top-level imports from ``python -X importtime``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from machine import banner, describe

PY = sys.executable
SFG = [PY, "-m", "sfg.cli.main"]

CASES: list[tuple[str, list[str], float | None]] = [
    ("python -c 'import numpy'", [PY, "-c", "import numpy"], None),
    ("python -c 'import numba'", [PY, "-c", "import numba"], None),
    ("sfg --help", [*SFG, "--help"], 0.5),
    ("sfg replay -p bursty:u=0.8 -r sfg-cut --seeds 1",
     [*SFG, "replay", "-p", "bursty:u=0.8", "-r", "sfg-cut", "--seeds", "1"], 1.2),
    ("sfg replay --clients 2000 -p iid:u=0.6 -p bursty:u=0.8 -r sfg-l --seeds 1",
     [*SFG, "replay", "--clients", "2000", "-p", "iid:u=0.6", "-p", "bursty:u=0.8", "-r",
      "sfg-l", "--seeds", "1"], 1.5),
    ("sfg run  (default: digits, MLP, N = 100, T = 300)", [*SFG, "run"], 4.0),
    ("sfg rules", [*SFG, "rules"], None),
    ("sfg traces --help", [*SFG, "traces", "--help"], None),
]


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=os.environ)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    return dt


def slowest_imports(cmd: list[str], top: int = 6) -> list[tuple[str, float]]:
    """(module, cumulative seconds) of the slowest top-level imports of one run."""
    res = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    rows = []
    for line in res.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m and not m.group(2).startswith(" "):
            rows.append((m.group(2).strip(), int(m.group(1)) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


BREAKDOWN = r"""
import time
t0 = time.perf_counter()
import numpy
t1 = time.perf_counter()
import typer, sfg.cli.main
t2 = time.perf_counter()
import numba
t3 = time.perf_counter()
from sfg.modelfree import replay
t4 = time.perf_counter()
kw = dict(n={n}, T=300)
replay(["bursty:u=0.8"], ["{rule}"], [1], **kw)  # first call: loads the cached kernels
t5 = time.perf_counter()
replay(["bursty:u=0.8"], ["{rule}"], [2], **kw)  # the replay itself
t6 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4 - (t6 - t5), t6 - t5)
"""
PHASES = ["import numpy", "import typer + sfg.cli.main (all sub-commands)", "import numba",
          "import sfg.modelfree (graphs, outages, rules)", "load the cached kernels (first call)",
          "the replay itself (N = {n}, T = 300, with H)"]


def breakdown(repeats: int, n: int = 100, rule: str = "sfg-cut") -> list[tuple[str, float]]:
    """Median seconds of each phase of the N = 100 replay command, in one process each."""
    runs = []
    for _ in range(repeats):
        res = subprocess.run([PY, "-c", BREAKDOWN.format(n=n, rule=rule)], capture_output=True,
                             text=True, check=True)
        runs.append([float(x) for x in res.stdout.split()])
    return [(name.format(n=n), statistics.median(r[i] for r in runs))
            for i, name in enumerate(PHASES)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the phases of the N = 100 replay inside one process")
    args = ap.parse_args()

    for _, cmd, _ in CASES:  # warm-up: numba's cache, the OS page cache
        wall(cmd)
    times: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for _ in range(args.repeats):
        for name, cmd, _ in CASES:  # interleaved, so drifting load hits every case alike
            times[name].append(wall(cmd))
    base = statistics.median(times[CASES[0][0]])
    rows = []
    for name, cmd, target in CASES:
        med = statistics.median(times[name])
        rows.append({"command": name, "median_s": round(med, 3),
                     "min_s": round(min(times[name]), 3), "ratio_to_numpy": round(med / base, 2),
                     "target_s": target, "meets_target": None if target is None else med <= target,
                     **({"slowest_imports": slowest_imports(cmd)} if args.importtime else {})})
    phases = breakdown(args.repeats) if args.breakdown else []
    if args.json:
        print(json.dumps({"repeats": args.repeats, "python": sys.version.split()[0],
                          "cpus": os.cpu_count(), "machine": describe(), "rows": rows,
                          "replay_phases_s": dict(phases)}, indent=2))
        return
    print(banner())
    print(f"start-up, whole processes, median of {args.repeats} (warm numba cache), "
          f"{os.cpu_count()} CPUs")
    width = max(len(r["command"]) for r in rows)
    print(f"{'command':<{width}}  {'median s':>8}  {'min s':>6}  {'× numpy':>7}  target")
    for r in rows:
        target = "" if r["target_s"] is None else (
            f"<= {r['target_s']} s {'ok' if r['meets_target'] else 'MISSED'}")
        print(f"{r['command']:<{width}}  {r['median_s']:>8.3f}  {r['min_s']:>6.3f}  "
              f"{r['ratio_to_numpy']:>7.2f}  {target}")
        for mod, sec in r.get("slowest_imports", []):
            print(f"{'':<{width}}    import {mod}: {sec:.3f} s")
    if phases:
        print("\nphases of the N = 100 replay inside one process (median s):")
        for name, sec in phases:
            print(f"  {name:<48} {sec:.3f}")


if __name__ == "__main__":
    main()
