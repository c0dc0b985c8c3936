"""Peers chosen per exchange, model-free (docs/findings/peers.md): returns heard, the premise,
mean lag, messages, membership bytes and messages to offline peers under ``fixed``,
``epidemic`` and ``online``, on bursty, iid and the FLASH trace, in rounds and on the virtual
clock (async and event, ``on_return: none`` and ``pull:timeout=120``), seeds 1-5, N = 100 over 300 rounds of 10
minutes. S is the graph's mean degree rounded (knn:k=6: 7.1 -> 7), so every setting sends
about the messages per device-hour that ``fixed`` sends.

    .venv/bin/python benchmarks/peers_grid.py            # prints the table (a few minutes)
    .venv/bin/python benchmarks/peers_grid.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLASH = ROOT.parent / "shared" / "data" / "flash" / "flash_state_traces_subset.json"
PROCESSES = {"bursty": "bursty:u=0.8", "iid": "iid:u=0.8",
             "FLASH": f"flash:rule=strict,path={FLASH},replace=true"}
RULES = ("dfedavg", "sfg-cut")
DEGREE = 7.1  # knn:k=6's mean degree at N = 100
CLOCK = {"jitter": 0.5, "compute": "const:value=30"}  # as docs/findings/time.md


def rows_for(process: str, protocol: str, peers: str, seeds: list[int], n: int, T: int,
             K: int, pull: bool = False) -> list[dict]:
    if protocol == "rounds":
        from sfg.modelfree import replay

        return replay([process], list(RULES), seeds, n=n, T=T, horizon=0, peers=peers,
                      threads=1)
    from sfg.clock.replay import replay_clock_rows
    from sfg.clock.settings import make_settings

    s = make_settings({"clock": "virtual", "protocol": protocol, **CLOCK,
                       **({"on_return": "pull:timeout=120"} if pull else {})})
    return replay_clock_rows([process], list(RULES), seeds, settings=s, n=n, rounds=T,
                             local_steps=K, horizon=0, peers=peers)


def summary(rows: list[dict], n: int, T: int) -> dict[str, float]:
    d = [r for r in rows if r["rule"] == "dfedavg"]
    c = [r for r in rows if r["rule"] == "sfg-cut"]

    def mean(key, rs=d, f=lambda v: v):
        vals = [f(r[key]) for r in rs if key in r and r[key] == r[key]]
        return statistics.fmean(vals) if vals else math.nan

    out = {"heard": mean("returning_aggregations_heard"), "premise": mean("premise"),
           "lag_dfedavg": mean("final_mean_lag"), "lag_sfg_cut": mean("final_mean_lag", c)}
    if "returns_aggregated" in d[0]:  # returns in time (the virtual clock)
        agg = mean("returns_aggregated")
        out["back_heard"] = mean("returns_heard") / agg if agg else math.nan
        out["alone"] = mean("returns_alone") / mean("returns")
    if "pull_requests" in d[0]:  # the share of a pull's requests that found their target offline
        asked = mean("pull_requests")
        out["asked_offline"] = mean("pull_unreachable") / asked if asked else math.nan
    if "peer_messages_per_device_hour" in d[0]:
        out["messages"] = mean("peer_messages_per_device_hour")
        out["to_offline"] = mean("messages_to_offline_per_device_hour")
        out["membership_bytes"] = mean("membership_bytes_per_device_hour")
    elif "messages_sent_per_device_hour" in d[0]:
        out["messages"] = mean("messages_sent_per_device_hour")
    else:  # in rounds: every available device sends to each neighbour (mean degree 7.1)
        out["messages"] = (1.0 - mean("unavailability")) * DEGREE * 6.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("-T", type=int, default=300)
    ap.add_argument("-K", type=int, default=5)
    ap.add_argument("-s", type=int, default=7, help="S of epidemic and online")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    peers = ("fixed", f"epidemic:s={args.s}", f"online:s={args.s}")
    out = []
    print("| world | protocol | peers | returns heard | back heard | alone | premise | "
          "mean lag dfedavg | mean lag sfg-cut | messages/dh | to offline/dh | "
          "membership B/dh | pull asked offline |\n|" + "---|" * 13, flush=True)
    runs = [(proto, p, False) for proto in ("rounds", "async", "event") for p in peers]
    # pull on return: a returning device asks its neighbours, S drawn devices or S peers of
    # its table
    runs += [(proto, p, True) for proto in ("async", "event") for p in peers]
    for pname, process in PROCESSES.items():
        for protocol, p, pull in runs:
            s = summary(rows_for(process, protocol, p, seeds, args.n, args.T, args.K, pull),
                        args.n, args.T)
            shown = protocol + (" + pull" if pull else "")
            out.append({"world": pname, "protocol": shown, "peers": p, **s})
            f = lambda k, d=3, s=s: "–" if k not in s or s[k] != s[k] else f"{s[k]:.{d}f}"  # noqa: E731
            print(f"| {pname} | {shown} | `{p}` | {f('heard')} | {f('back_heard')} | "
                  f"{f('alone')} | {f('premise')} | {f('lag_dfedavg', 2)} | "
                  f"{f('lag_sfg_cut', 2)} | {f('messages', 2)} | {f('to_offline', 2)} | "
                  f"{f('membership_bytes', 0)} | {f('asked_offline')} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
