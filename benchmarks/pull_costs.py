"""What a pull on return costs and what it buys (docs/concepts/clock.md#returns-in-time),
model-free: ``sfg replay`` on the virtual clock with ``on_return`` none and
``pull:timeout=60``, under async (jitter 0.5) and event, on bursty u = 0.8 and the FLASH
strict trace, in a world where a pull costs something (latency 1 s per link, uplinks of
100 kB/s, 36 kB messages, 30 s per local step, K = 10), N = 100, 300 rounds' worth of virtual
time, seeds 1-3, rule dfedavg (the schedule, and so every count here, is the same for every
rule).

Prints one table: returns (online again after an outage) per device-hour, the share of those
that aggregated whose first aggregation held a neighbour's model ("heard"), the share with no
neighbour online ("alone"), and pull's requests, replies, empty and unreachable answers,
bytes and wait seconds per device-hour.

    .venv/bin/python benchmarks/pull_costs.py            # about a minute on 2 cores
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FLASH = Path(__file__).resolve().parents[2] / "shared/data/flash/flash_state_traces_subset.json"
WORLDS = {"bursty u=0.8": "bursty:u=0.8",
          "FLASH strict": f"flash:rule=strict,path={FLASH},replace=true"}
COMMON = ["--clock", "virtual", "--compute", "const:value=30", "--latency", "const:value=1",
          "--uplink", "const:value=100000", "--message-bytes", "36000", "-n", "100",
          "--rounds", "300", "--seeds", "1,2,3", "--rule", "dfedavg", "--horizon", "0",
          "--json"]
COSTS = ("requests", "replies", "empty", "unreachable", "bytes", "wait_seconds")


def replay(process: str, protocol: str, on_return: str) -> dict:
    extra = ["--jitter", "0.5"] if protocol == "async" else []
    out = subprocess.run([sys.executable, "-m", "sfg", "replay", "--process", process,
                          "--protocol", protocol, "--on-return", on_return, *extra, *COMMON],
                         capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)["rows"]
    hours = 100 * 300 * 600 / 3600.0
    tot = {k: sum(float(r.get(f"returns{k}", 0.0)) for r in rows)
           for k in ("", "_aggregated", "_heard", "_alone")}
    got = {"returns_per_device_hour": tot[""] / len(rows) / hours,
           "heard": tot["_heard"] / max(tot["_aggregated"], 1.0),
           "alone": tot["_alone"] / max(tot[""], 1.0)}
    for k in COSTS:
        got[k] = sum(float(r.get(f"pull_{k}_per_device_hour", 0.0)) for r in rows) / len(rows)
    return got


def main() -> None:
    print(f"{'world':<14} {'protocol':<8} {'on_return':<16} {'ret/dev-h':>9} {'heard':>6} "
          f"{'alone':>6} " + " ".join(f"{k[:11]:>11}" for k in COSTS))
    out = []
    for wname, process in WORLDS.items():
        for protocol in ("async", "event"):
            for on_return in ("none", "pull:timeout=60"):
                g = replay(process, protocol, on_return)
                out.append({"world": wname, "protocol": protocol, "on_return": on_return, **g})
                print(f"{wname:<14} {protocol:<8} {on_return:<16} "
                      f"{g['returns_per_device_hour']:9.3f} {g['heard']:6.3f} {g['alone']:6.3f} "
                      + " ".join(f"{g[k]:11.3f}" if k != "bytes" else f"{g[k]:11,.0f}"
                                 for k in COSTS), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
