"""Peers chosen per exchange, trained (docs/findings/peers-trained.md): the family of 24
comparisons examples/peers-digits.yaml declares — (a) each rule's gain in mean accuracy over
DFedAvg under fixed, epidemic:s=7 and online:s=7, in rounds and under async with pull, and (b)
each peer setting's effect (epidemic − fixed, online − fixed) per rule in both — from
``sfg report``'s paired tables, Holm-corrected over the 24 together.

    .venv/bin/sfg grid run examples/peers-digits.yaml --store peers.sqlite --workers 2
    .venv/bin/python benchmarks/peers_trained.py --store peers.sqlite

``--grid FILE`` takes the peer settings compared with ``fixed`` and the declared family size m
from another grid of the same shape (CIFAR-10 small-cnn, examples/peers-cifar10.yaml):

    .venv/bin/sfg grid run examples/peers-cifar10.yaml --store peers-cifar10.sqlite --workers 1
    .venv/bin/python benchmarks/peers_trained.py --store peers-cifar10.sqlite \
        --grid examples/peers-cifar10.yaml
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ONLINE = "online:s=7,view=28,gossip=7"
DIGITS = (("epidemic:s=7", ONLINE), 24)  # examples/peers-digits.yaml: the sampled peers, m


def _from_grid(path: Path) -> tuple[tuple[str, ...], int]:
    """The peer settings other than ``fixed`` (canonical, in the grid's order) and the declared
    family size m of the grid file ``path``."""
    from sfg.experiments.grid import load_grid

    grid = load_grid(path)
    if not grid.family:
        raise SystemExit(f"{path}: the grid declares no family (family: {{comparisons: m}})")
    sampled = tuple(dict.fromkeys(c.peers for c in grid if c.peers not in (None, "fixed")))
    if not sampled:
        raise SystemExit(f"{path}: the grid has no peer setting other than fixed")
    return sampled, int(grid.family["comparisons"])


def _report(store: Path, out: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "sfg", "report", "--store", str(store), "--out",
                    str(out), *extra], check=True, capture_output=True, text=True)


def _protocol(setting: str) -> str:
    return "async + pull" if "async" in setting else "rounds"


def main() -> None:
    from sfg.experiments.stats import holm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--grid", type=Path, default=None,
                    help="grid file whose sampled peer settings and declared family size to "
                         "use (default: those of examples/peers-digits.yaml)")
    args = ap.parse_args()
    sampled, declared = _from_grid(args.grid) if args.grid else DIGITS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _report(args.store, t / "gains")
        for r in csv.DictReader(open(t / "gains" / "comparisons.csv", encoding="utf-8")):
            peers = r["setting"].rsplit("peers ", 1)[-1]
            rows.append(("gain over dfedavg", r["rule"], _protocol(r["setting"]),
                         peers.split(",view")[0], r))
        for b in sampled:
            _report(args.store, t / b, "--across", f"peers=fixed,{b}")
            for r in csv.DictReader(open(t / b / "across.csv", encoding="utf-8")):
                if r["metric"] == "acc_mean":
                    rows.append((f"{b.split(',')[0]} − fixed", r["rule"],
                                 _protocol(r["setting"]), "", r))
    adj = holm([float(r[-1]["p_perm"]) for r in rows])
    print(f"family: {len(rows)} comparisons (declared {declared}), Holm over all of them\n")
    print(f"| comparison | rule | protocol | peers | Δ acc (pp) [95% CI] | wins | p "
          f"| p Holm ({declared}) |")
    print("|---|---|---|---|---|---|---|---|")
    for (what, rule, proto, peers, r), p_adj in zip(rows, adj, strict=True):
        g, lo, hi = (100 * float(r[k]) for k in ("mean_gain", "ci_low", "ci_high"))
        print(f"| {what} | {rule} | {proto} | {peers or '–'} | {g:+.2f} [{lo:+.2f}, {hi:+.2f}] "
              f"| {r['wins']}/{r['runs']} | {float(r['p_perm']):.3g} | {p_adj:.3g} |")


if __name__ == "__main__":
    main()
