"""Pairing across rules in training (docs/concepts/training.md#pairing): runs of different rules at one seed share every
paired input — the graph, the availability trace, the link failures, the data split (training,
validation and test sets), the initial parameters and the minibatch of every (client, round,
step) — exactly.

What each run used is recorded from inside the simulator: the round observer sees the round
graph, every round's capabilities (the availability trace under the anatomy mode) and the
parameters at the start of round 0; the data split is recorded as ``simulate`` receives it from
``sfg.world.data.load_federated``, the link failures as the simulator draws them; the minibatches
twice: the digest of every minibatch drawn (``meta['minibatch_digest']``, all clients, every
round) and the indices each trainer's first K local steps actually gathered. Only the rule
differs between the runs, so everything recorded must be bit-identical; a different seed must
change each of them (so the comparison can fail). ``dfedavg+catchup`` trains returning clients
for more steps (from its own ``catchup`` stream): its first K steps still use the paired ones.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import sfg.world.data
from sfg.sim import run
from sfg.sim.run import simulate

TINY = dict(dataset="digits", model="mlp", n_clients=12, rounds=6, local_steps=1, batch_size=8,
            eval_every=3, graph="knn:k=3", backend="batched", process="bursty:u=0.6",
            link_failure=0.3)
RULES = ["dfedavg", "sfg-l", "sfg-cut:L=2", "pwg", "relative-variance", "aoi+ipw",
         "dfedavg+catchup"]


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _record(monkeypatch, **cfg) -> dict:
    seen: dict = {"train": [], "send": [], "aggregate": [], "adopt": [], "links": [],
                  "minibatches": {}}
    real = sfg.world.data.load_federated
    real_links = run.live_links_round
    real_gather = run.ClientData.gather
    K = TINY["local_steps"]

    def load_and_record(*args, **kwargs):
        data = real(*args, **kwargs)
        seen["data"] = {k: _digest(getattr(data, k)) for k in
                        ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y")}
        return data

    def observe(r: dict) -> None:
        if r["t"] == 0:
            seen["X0"] = r["X"].detach().clone()
            seen["graph"] = (r["rg"].recv.copy(), r["rg"].send.copy())
        for k in ("train", "send", "aggregate", "adopt"):
            seen[k].append(np.asarray(getattr(r["caps"], k)).copy())

    def links_and_record(*args, **kwargs):
        live = real_links(*args, **kwargs)
        seen["links"].append(np.asarray(live).copy())
        return live

    def gather_and_record(self, clients, local_idx, flips):
        t = len(seen["train"])  # the observer has seen the rounds before this one
        for i, idx in zip(clients, local_idx, strict=True):
            assert (t, int(i)) not in seen["minibatches"]
            seen["minibatches"][t, int(i)] = (idx[:K].copy(),
                                              None if flips is None else flips[:K].copy())
        return real_gather(self, clients, local_idx, flips)

    monkeypatch.setattr(sfg.world.data, "load_federated", load_and_record)
    monkeypatch.setattr(run, "live_links_round", links_and_record)
    monkeypatch.setattr(run.ClientData, "gather", gather_and_record)
    res = simulate({**TINY, **cfg}, observer=observe)
    monkeypatch.setattr(sfg.world.data, "load_federated", real)
    monkeypatch.setattr(run, "live_links_round", real_links)
    monkeypatch.setattr(run.ClientData, "gather", real_gather)
    seen["minibatch_digest"] = res.meta["minibatch_digest"]
    seen["links"] = np.stack(seen["links"])
    for k in ("train", "send", "aggregate", "adopt"):
        seen[k] = np.stack(seen[k])
    return seen


def _same(a: dict, b: dict) -> dict[str, bool]:
    return {
        "graph": all(np.array_equal(x, y) for x, y in zip(a["graph"], b["graph"], strict=True)),
        "availability": all(np.array_equal(a[k], b[k])
                            for k in ("train", "send", "aggregate", "adopt")),
        "link failures": np.array_equal(a["links"], b["links"]),
        "data": a["data"] == b["data"],
        "initial parameters": torch.equal(a["X0"], b["X0"]),
        "minibatches drawn": a["minibatch_digest"] == b["minibatch_digest"],
        "minibatches trained on": _same_minibatches(a["minibatches"], b["minibatches"]),
    }


def _same_minibatches(a: dict, b: dict) -> bool:
    """The same (round, client) trained in both, on the same examples (and flips) per step."""
    return a.keys() == b.keys() and all(
        np.array_equal(a[k][0], b[k][0])
        and (a[k][1] is None) == (b[k][1] is None)
        and (a[k][1] is None or np.array_equal(a[k][1], b[k][1])) for k in a)


@pytest.fixture(scope="module")
def reference(request):
    mp = pytest.MonkeyPatch()
    try:
        return _record(mp, rule=RULES[0], seed=4)
    finally:
        mp.undo()


@pytest.mark.parametrize("rule", RULES[1:])
def test_rules_at_one_seed_share_every_paired_input(monkeypatch, rule, reference):
    other = _record(monkeypatch, rule=rule, seed=4)
    same = _same(reference, other)
    assert all(same.values()), f"{rule} differs from {RULES[0]} in: " \
                               f"{[k for k, v in same.items() if not v]}"
    # the availability really has outages and links really fail, so that sharing them is not
    # trivial; every round some clients train, each on K steps of B examples
    assert 0 < reference["train"].mean() < 1 and 0 < reference["links"].mean() < 1
    assert len(reference["links"]) == TINY["rounds"]
    assert {t for t, _ in reference["minibatches"]} == set(range(TINY["rounds"]))
    assert sorted(reference["minibatches"]) == sorted(
        (t, int(i)) for t in range(TINY["rounds"]) for i in np.flatnonzero(reference["train"][t]))


def test_another_seed_changes_each_of_them(monkeypatch, reference):
    other = _record(monkeypatch, rule=RULES[0], seed=5)
    same = _same(reference, other)
    assert not any(same.values()), same
