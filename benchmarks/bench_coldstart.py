"""First use of ``sfg replay`` on a cold numba cache, as whole processes.

Every measurement is a fresh ``sfg`` process (what a user waits for) with its own fresh
``NUMBA_CACHE_DIR``, so that nothing compiled by an earlier measurement is reused:

* **first rule, cold**: ``sfg replay -p bursty:u=0.8 -r sfg-cut --seeds 1`` on an empty cache
  (target <= 4 s);
* **further rule**: one more rule after the first (the cache holds what the first command
  compiled: a copy of a cache filled by it), for each of :data:`FURTHER` (target <= 1.5 s);
* **five rules, cold**: the five rules of :data:`FIVE` in one command on an empty cache
  (target <= 8 s);
* **warm**: the first and the five-rule command again on a full cache (today's figures,
  +-10 %).

With ``--against SRC`` (the ``src`` folder of another checkout, e.g. a ``git worktree`` of the
previous commit) every case also runs with ``PYTHONPATH=SRC``, interleaved with this checkout
in each repetition, so that a loaded machine slows both alike; the table then gives both and
their ratio. Each figure is the minimum over ``--repeats`` repetitions.

    python benchmarks/bench_coldstart.py [--repeats 3] [--against /tmp/old/src] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
HERE = str(Path(__file__).resolve().parents[1] / "src")
REPLAY = ["replay", "-p", "bursty:u=0.8", "--seeds", "1"]
FIRST = "sfg-cut"
FURTHER = ["sfg-l", "dfedavg", "placebo-cut"]
FIVE = ["dfedavg", "aoi+ipw", "sfg", "sfg-l", "sfg-cut"]
TARGETS = {"first rule, cold": 4.0, "further rule": 1.5, "five rules, cold": 8.0}


def machine() -> dict:
    """CPU model (from /proc/cpuinfo), usable cores and the load average now."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpu": model, "cores": cores, "cpu_count": os.cpu_count(),
            "loadavg": [round(x, 2) for x in load], "python": sys.version.split()[0]}


def run(src: str, cache: str, rules: list[str]) -> float:
    """Wall seconds of one ``sfg replay`` process with ``rules`` (src on PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=src, NUMBA_CACHE_DIR=cache)
    cmd = [PY, "-m", "sfg", *REPLAY]  # works for the old layout (sfg.cli) and the new
    for r in rules:
        cmd += ["-r", r]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (PYTHONPATH={src}) failed: {res.stderr.strip()}")
    return dt


def one_pass(src: str, tmp: Path) -> dict[str, float]:
    """Every case once for the checkout at ``src``, each in fresh cache folders."""
    out: dict[str, float] = {}
    first = tempfile.mkdtemp(dir=tmp)
    out["first rule, cold"] = run(src, first, [FIRST])
    out["first rule, warm"] = run(src, first, [FIRST])
    for rule in FURTHER:  # a copy of the cache the first command filled, one per rule
        cache = tempfile.mkdtemp(dir=tmp)
        shutil.copytree(first, cache, dirs_exist_ok=True)
        out[f"further rule: {rule}"] = run(src, cache, [rule])
    five = tempfile.mkdtemp(dir=tmp)
    out["five rules, cold"] = run(src, five, FIVE)
    out["five rules, warm"] = run(src, five, FIVE)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", metavar="SRC", help="the src folder of another checkout")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    srcs = {"this": HERE}
    if args.against:
        srcs["against"] = str(Path(args.against).resolve())
    before = machine()
    best: dict[str, dict[str, float]] = {k: {} for k in srcs}
    with tempfile.TemporaryDirectory(prefix="sfg-coldstart-") as tmp:
        for _ in range(args.repeats):
            for name, src in srcs.items():  # interleaved: drifting load hits both alike
                for case, sec in one_pass(src, Path(tmp)).items():
                    best[name][case] = min(best[name].get(case, float("inf")), sec)
    after = machine()
    if args.json:
        print(json.dumps({"machine": before, "loadavg_after": after["loadavg"],
                          "repeats": args.repeats, "srcs": srcs, "min_s": best}, indent=2))
        return
    print(f"machine: {before['cpu']}, {before['cores']} usable cores "
          f"({before['cpu_count']} CPUs), Python {before['python']}; load average "
          f"{before['loadavg'][0]} before, {after['loadavg'][0]} after")
    print(f"sfg {' '.join(REPLAY)} -r RULE, whole processes, each with a fresh NUMBA_CACHE_DIR; "
          f"min of {args.repeats} (s)")
    cases = list(best["this"])
    head = f"{'case':<28} {'this':>7}"
    if "against" in srcs:
        head += f" {'against':>8} {'ratio':>6}"
    print(head + "  target")
    for case in cases:
        row = f"{case:<28} {best['this'][case]:7.2f}"
        if "against" in srcs:
            b = best["against"][case]
            row += f" {b:8.2f} {best['this'][case] / b:6.2f}"
        target = TARGETS.get(case.split(":")[0])
        if target is not None:
            row += f"  <= {target} s {'ok' if best['this'][case] <= target else 'MISSED'}"
        print(row)
    print(f"five rules: {', '.join(FIVE)}; further rules after {FIRST}: {', '.join(FURTHER)}")
    if "against" in srcs:
        print(f"against: PYTHONPATH={srcs['against']}")


if __name__ == "__main__":
    main()
