"""Peers chosen per exchange, trained (docs/findings/peers-trained.md): the family of 24
comparisons examples/peers-digits.yaml declares — (a) each rule's gain in mean accuracy over
DFedAvg under fixed, epidemic:s=7 and online:s=7, in rounds and under async with pull, and (b)
each peer setting's effect (epidemic − fixed, online − fixed) per rule in both — from
``sfg report``'s paired tables, Holm-corrected over the 24 together.

    .venv/bin/sfg grid run examples/peers-digits.yaml --store peers.sqlite --workers 2
    .venv/bin/python benchmarks/peers_trained.py --store peers.sqlite
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ONLINE = "online:s=7,view=28,gossip=7"


def _report(store: Path, out: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "sfg", "report", "--store", str(store), "--out",
                    str(out), *extra], check=True, capture_output=True, text=True)


def _protocol(setting: str) -> str:
    return "async + pull" if "async" in setting else "rounds"


def main() -> None:
    from sfg.experiments.stats import holm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _report(args.store, t / "gains")
        for r in csv.DictReader(open(t / "gains" / "comparisons.csv", encoding="utf-8")):
            peers = r["setting"].rsplit("peers ", 1)[-1]
            rows.append(("gain over dfedavg", r["rule"], _protocol(r["setting"]),
                         peers.split(",view")[0], r))
        for b in ("epidemic:s=7", ONLINE):
            _report(args.store, t / b, "--across", f"peers=fixed,{b}")
            for r in csv.DictReader(open(t / b / "across.csv", encoding="utf-8")):
                if r["metric"] == "acc_mean":
                    rows.append((f"{b.split(',')[0]} − fixed", r["rule"],
                                 _protocol(r["setting"]), "", r))
    adj = holm([float(r[-1]["p_perm"]) for r in rows])
    print(f"family: {len(rows)} comparisons (declared 24), Holm over all of them\n")
    print("| comparison | rule | protocol | peers | Δ acc (pp) [95% CI] | wins | p | p Holm (24) |")
    print("|---|---|---|---|---|---|---|---|")
    for (what, rule, proto, peers, r), p_adj in zip(rows, adj, strict=True):
        g, lo, hi = (100 * float(r[k]) for k in ("mean_gain", "ci_low", "ci_high"))
        print(f"| {what} | {rule} | {proto} | {peers or '–'} | {g:+.2f} [{lo:+.2f}, {hi:+.2f}] "
              f"| {r['wins']}/{r['runs']} | {float(r['p_perm']):.3g} | {p_adj:.3g} |")


if __name__ == "__main__":
    main()
