"""Record the figures that the round's redesign must keep (run once, before it; commit output).

    PYTHONPATH=src python tests/make_baseline.py

Writes ``tests/fixtures/baseline.json``: replay rows (every metric) of every model-free rule
and modifier on three processes, every anatomy mode and link failures; ``weights_one`` on hand
inputs; and short training runs (final accuracies, metrics, a parameter digest) for several
rules and each backend. ``tests/test_baseline.py`` compares today's code against it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "fixtures" / "baseline.json"

# rule texts replayed on every scenario (model-free; oracles included)
REPLAY_RULES = [
    "sfg", "sfg:gamma=0", "sfg:gamma=0.3+ipw", "sfg-l", "sfg-l:gamma=0", "sfg-l:gamma=0+rounded",
    "sfg-l+ipw", "sfg-cut", "sfg-cut:L=0", "sfg-cut:L=2+rounded", "sfg-cut:c=0.5",
    "sfg-counts", "sfg-counts:gamma=0", "dfedavg", "dfedavg:c=0.25", "local", "aoi", "aoi+ipw",
    "dfl-aa", "dfl-aa:gamma=0", "gl-age", "limited-merging", "limited-merging:L=0",
    "local-counts", "update-amplification", "self-weight", "self-weight:c=0.2", "self-only",
    "self-only:base=0.25", "reset-on-return", "neighbour-only-lags", "neighbour-only-counts",
    "pinned-receiver", "copy-random", "placebo-cut", "placebo-cut:L=0", "cut-ages",
    "receiver-kept", "receiver-kept:L=0+ipw", "oracle-gls", "oracle-qp:kappa=3",
]
PROCESSES = ["bursty:u=0.8", "iid:u=0.5", "heterogeneous:u=0.6"]
SCENARIOS = [  # (anatomy, link failure)
    ("full", 0.0), ("cannot-communicate", 0.0), ("cannot-train-shares", 0.0),
    ("cannot-train-adopts", 0.0), ("full", 0.3),
]
N, T, HORIZON = 24, 40, 8

WEIGHTS_ONE = [  # (rule, inputs)
    *[(r, dict(ages=[3, 0, 1, 0, 5], lags=[3.4, 0.5, 1.2, 0.5, 5.0], counts=[4, 9, 8, 9, 2],
               local_counts=[5, 7, 7, 2, 9], q_hat=[1.0, 0.9, 0.5, 0.25, 1.0], t=10, u=0.7,
               keys=[0.9, 0.1, 0.5, 0.3, 0.7]))
      for r in REPLAY_RULES if not r.startswith("oracle")],
    *[(r, dict(ages=[0, 2, 2], lags=[0.0, 2.0, 1.0000000001], t=4, u=0.1))
      for r in ["sfg", "sfg-l", "sfg-cut", "sfg-cut:L=0", "dfl-aa", "self-only", "copy-random",
                "receiver-kept:L=0", "cut-ages", "limited-merging:L=0"]],
    *[(r, dict(ages=[2])) for r in ["sfg", "sfg-cut", "dfedavg", "self-only", "copy-random"]],
]

TRAIN_BASE = dict(dataset="digits", model="mlp", n_clients=12, rounds=6, local_steps=2,
                  batch_size=8, eval_every=3, graph="knn:k=4", process="bursty:u=0.6")
TRAIN_RUNS = [
    dict(rule="dfedavg", backend="batched"), dict(rule="sfg-cut", backend="batched"),
    dict(rule="sfg-l:gamma=0.3+ipw", backend="batched", link_failure=0.2),
    dict(rule="sfg+catchup", backend="batched"), dict(rule="update-amplification:c=2", backend="batched"),
    dict(rule="copy-random", backend="batched"), dict(rule="self-only", backend="batched",
                                                      anatomy="cannot-train-adopts"),
    dict(rule="model-memory+sfg", backend="batched"), dict(rule="pwg-l", backend="batched"),
    dict(rule="relative-variance", backend="batched"), dict(rule="oracle-gls", backend="batched"),
    dict(rule="sfg-cut", backend="loop"), dict(rule="sfg-cut", backend="vmap"),
    dict(rule="sfg-l", backend="batched", backbone="ditto"),
]


def replay_rows() -> list[dict]:
    from sfg.modelfree import replay

    rows = []
    for anatomy, lf in SCENARIOS:
        for p in PROCESSES:
            out = replay([p], REPLAY_RULES, [1], n=N, T=T, horizon=HORIZON, anatomy=anatomy,
                         link_failure=lf)
            rows += [{**r, "anatomy": anatomy, "link_failure": lf} for r in out]
    return rows


def weights_one() -> list[dict]:
    from sfg.round.rules import parse_rule

    return [{"rule": r, "inputs": kw, "weights": parse_rule(r).weights_one(**kw).tolist()}
            for r, kw in WEIGHTS_ONE]


def training() -> list[dict]:
    from sfg.sim.run import simulate

    out = []
    for run in TRAIN_RUNS:
        cfg = {**TRAIN_BASE, **run}
        res = simulate(cfg)
        digest = hashlib.blake2b(res.params.numpy().tobytes(), digest_size=16).hexdigest()
        out.append({"config": cfg, "metrics": res.metrics, "accuracy": res.accuracy.tolist(),
                    "params_digest": digest, "params_sum": float(res.params.double().sum()),
                    "minibatch_digest": res.meta["minibatch_digest"],
                    "ages": res.state.ages.tolist(), "lags": res.state.lags.tolist()})
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = {"replay": {"n": N, "T": T, "horizon": HORIZON, "rows": replay_rows()},
            "weights_one": weights_one(), "training": training()}
    OUT.write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    print(f"wrote {OUT}: {len(data['replay']['rows'])} replay rows, "
          f"{len(data['weights_one'])} weights_one cases, {len(data['training'])} training runs")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
