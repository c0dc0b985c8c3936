"""The clock's model-free replay at fleet size: ``sfg replay --clock virtual`` (async and
event, ``-r sfg-cut``, pull off, the fixed graph) over 300 periods, whole process, each run in a
fresh child (wall time and peak resident set, ``ru_maxrss`` of that child by ``os.wait4``).

The replay runs through its schedule in pieces of about a million events, so its memory is
O(N), not O(N x periods) (docs/concepts/clock.md#limits). Targets: N = 136,000 (the FLASH
study's fleet) within 4 GB and 2 minutes. The schedule digests of the runs are printed, to
compare with another source tree (``--src``: PYTHONPATH) run by run.

    .venv/bin/python benchmarks/bench_clock_fleet.py                     # 10,000 and 136,000
    .venv/bin/python benchmarks/bench_clock_fleet.py --clients 10000 --src /old/checkout/src
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_fleet_trace import command, start

LIMIT_S, LIMIT_MIB = 120.0, 4e9 / 2 ** 20  # 2 minutes and 4 GB at 136,000 devices
PROTOCOLS = {"async": [], "event": ["--compute", "const:value=30"]}


def run(n: int, protocol: str, rounds: int, env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MiB, exit status, the run's digest or the output's tail)."""
    cmd = [sys.executable, "-m", "sfg", "replay", "--clock", "virtual", "--protocol", protocol,
           *PROTOCOLS[protocol], "-r", "sfg-cut", "--seeds", "1", "-n", str(n), "-T",
           str(rounds), "--json"]
    wall, mib, rc, out = command(cmd, env)
    try:
        got, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
        row = got["rows"][0]
        info = (f"digest {row['schedule_digest']}, returns {row['returning_aggregations']:.0f}, "
                f"mean final lag {row['final_mean_lag']:.3f}")
    except (ValueError, KeyError, IndexError, TypeError):
        info = " ".join(out.split())[-300:]
    return wall, mib, rc, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10_000, 136_000])
    ap.add_argument("--rounds", type=int, default=300, help="periods (T)")
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    ap.add_argument("--src", type=Path, default=None, help="run this source tree's sfg")
    args = ap.parse_args()
    env = start(args.src)
    for protocol in args.protocols:
        for n in args.clients:
            wall, mib, rc, info = run(n, protocol, args.rounds, env)
            target = ""
            if n >= 136_000:
                ok = rc == 0 and wall <= LIMIT_S and mib <= LIMIT_MIB
                target = f"  [target <= {LIMIT_S:g} s, 4 GB: {'met' if ok else 'NOT MET'}]"
            print(f"{protocol:5s} N={n:>9,} T={args.rounds}: {wall:7.2f} s {mib:7.0f} MiB peak "
                  f"(exit {rc}) {info}{target}", flush=True)


if __name__ == "__main__":
    main()
