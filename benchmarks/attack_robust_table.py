"""The tables of docs/findings/attacks.md, "Robust aggregators against model poisoning", from
the store of ``sfg grid run examples/attack-robust.yaml --store attack-robust.sqlite``:

    python benchmarks/attack_robust_table.py attack-robust.sqlite

Honest clients' mean accuracy (%) and paired differences (percentage points, per seed) with
the half-width of the 95 % t-interval over the seeds; cells with fewer seeds (diverged runs
are stored as failed and left out) say how many."""

from __future__ import annotations

import collections
import sys

import numpy as np
from scipy.stats import t as tdist

from sfg.experiments.store import records

ATTACKS = [None, "sign-flip", "alie", "alie,z=10", "ipm", "dissensus"]


def model_of(attack: str | None) -> str | None:
    return None if attack is None else attack.split("model=")[1].split(",always_on")[0]


def interval(d) -> tuple[float, float]:
    d = np.asarray(d, float)
    if d.size < 2:
        return float(d.mean()), float("nan")
    return float(d.mean()), float(tdist.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))


def cell(pairs: list[tuple[float, float]], n_seeds: int, with_mean: bool) -> str:
    if not pairs:
        return "–"
    d, h = interval([a - b for a, b in pairs])
    text = f"{np.mean([a for a, _ in pairs]):.1f} / " if with_mean else ""
    text += f"{d:+.1f} ±{h:.1f}"
    return text + ("" if len(pairs) == n_seeds else f" ({len(pairs)} seeds)")


def main(path: str) -> None:
    recs = records(path)
    acc: dict = collections.defaultdict(dict)
    for r in recs:
        a = model_of(r["config"].get("attack"))
        m = r["metrics"]
        acc[(r["rule"], a)][r["seed"]] = 100 * (m["acc_honest_mean"] if a else m["acc_mean"])
    rules = list(dict.fromkeys(r["rule"] for r in recs))
    n_seeds = len({r["seed"] for r in recs})

    def pairs(x: dict, y: dict) -> list[tuple[float, float]]:
        return [(x[s], y[s]) for s in sorted(set(x) & set(y))]

    print("| rule | no attack (%) | "
          + " | ".join(f"{a}: acc (%) / Δ (pp)" for a in ATTACKS[1:]) + " |")
    print("|" + "---|" * (len(ATTACKS) + 1))
    for rule in rules:
        base = acc[(rule, None)]
        cells = [f"{np.mean(list(base.values())):.1f}"]
        cells += [cell(pairs(acc.get((rule, a), {}), base), n_seeds, True) for a in ATTACKS[1:]]
        print(f"| {rule} | " + " | ".join(cells) + " |")
    print()
    print("| rule + defence | "
          + " | ".join("cost, no attack" if a is None else a for a in ATTACKS) + " |")
    print("|" + "---|" * (len(ATTACKS) + 1))
    for rule in rules:
        if "+" not in rule:
            continue
        plain = rule.split("+")[0].split(":")[0]
        cells = [cell(pairs(acc.get((rule, a), {}), acc.get((plain, a), {})), n_seeds, False)
                 for a in ATTACKS]
        print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
