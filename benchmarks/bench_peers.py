"""What the availability-aware sampler costs on the clock: ``sfg replay --clock virtual
--protocol async -r sfg-cut -n 10000 -T 300`` with ``--peers online:s=7`` (and ``epidemic:s=7``)
against ``fixed``, whole processes in turn (fixed, online, epidemic, fixed, ...), each run's
wall time and peak resident set (``ru_maxrss`` of the child by ``os.wait4``), and the ratio to
``fixed`` pair by pair. Target (docs/concepts/peers.md#costs): online within 1.5x of fixed.

    .venv/bin/python benchmarks/bench_peers.py              # 3 rounds of the three
    .venv/bin/python benchmarks/bench_peers.py -n 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LIMIT = 1.5


def once(n: int, T: int, peers: str) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "sfg", "replay", "--clock", "virtual", "--protocol", "async",
           "-r", "sfg-cut", "--seeds", "1", "-n", str(n), "-T", str(T), "--horizon", "0",
           "--peers", peers, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("-T", type=int, default=300)
    ap.add_argument("-s", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    here = Path(__file__).resolve()
    print(subprocess.run([sys.executable, str(here.parent / "machine.py")], check=True,
                         capture_output=True, text=True).stdout.strip(), flush=True)
    kinds = ("fixed", f"online:s={args.s}", f"epidemic:s={args.s}")
    once(min(args.n, 500), 20, kinds[1])  # compile and load the caches
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for k in kinds:
            got[k].append(once(args.n, args.T, k))
    base = got["fixed"]
    for k in kinds:
        walls = [w for w, _ in got[k]]
        ratio = [w / b for (w, _), (b, _) in zip(got[k], base, strict=True)]
        peak = max(m for _, m in got[k])
        verdict = "" if k == "fixed" else (
            f"  ratio to fixed median {statistics.median(ratio):.2f}"
            + (f" [target <= {LIMIT:g}: {'met' if statistics.median(ratio) <= LIMIT else 'NOT MET'}]"
               if k.startswith("online") else ""))
        print(f"{k:14s} N={args.n:,} T={args.T}: wall median {statistics.median(walls):6.2f} s "
              f"(min {min(walls):.2f}, max {max(walls):.2f}), peak {peak:6.0f} MiB{verdict}",
              flush=True)


if __name__ == "__main__":
    main()
