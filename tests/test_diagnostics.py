"""Training diagnostics (docs/concepts/diagnostics.md#training-diagnostics): hand-computed laws on N = 4, a planted ρ, returning
clients and fine-tuned geometry against direct computations, and bit-identical training."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.round.kernel import candidate_mask
from sfg.round.slots import RoundGraph
from sfg.sim.diagnostics import (
    Diagnostics,
    ValidationLoss,
    binned_means,
    fit_rate,
    law_rates,
    parse_diagnostics,
    pool,
)
from sfg.sim.params import ParamSpec
from sfg.sim.run import simulate
from sfg.world.outages.anatomy import capabilities

EDGES = np.array([[0, 1], [0, 2], [1, 2], [2, 3]])


def round_dict(rg, X, *, t, ages, lags, avail, weights=None, X_agg=None, X_next=None):
    caps = capabilities(np.asarray(avail, bool)[None, :], "full")
    caps = type(caps)(caps.train[0], caps.send[0], caps.aggregate[0], caps.adopt[0])
    cand = candidate_mask(rg, caps)
    state = SimpleNamespace(ages=np.asarray(ages, np.int64), lags=np.asarray(lags, float), t=t)
    w = np.zeros(rg.n_slots) if weights is None else weights
    return {"t": t, "X": X, "X_agg": X if X_agg is None else X_agg,
            "X_next": X if X_next is None else X_next, "weights": w, "candidate": cand,
            "caps": caps, "state": state, "rg": rg}


def test_raw_and_lag_laws_on_four_clients_by_hand():
    rg = RoundGraph.from_edges(4, EDGES)
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    d = Diagnostics(["raw", "lag"], rg=rg, available=np.ones((10, 4), bool), seed=1)
    d.observe(round_dict(rg, X, t=0, ages=[0, 0, 1, 3], lags=[0, 0.4, 1.2, 4.0],
                         avail=[1, 1, 1, 1]))
    # round 1 is not a law round (every 5): nothing recorded even with other states
    d.observe(round_dict(rg, X, t=1, ages=[0, 0, 0, 0], lags=[0, 0, 0, 0], avail=[1] * 4))
    res = d.result()
    # raw: receiver 0 -> 1 (age 0, d=1), 2 (age 1, d=4), fresh mean 1; receiver 1 -> 0 (d=1),
    # 2 (age 1, d=5). Age 0: (1 + 1)/2 = 1; age 1: (4 + 5)/2 = 4.5
    bins, means, counts = binned_means(res["raw"], "ratio")
    assert bins.tolist() == [0, 1] and means.tolist() == [1.0, 4.5] and counts.tolist() == [2, 2]
    # live pairs: (0,1) d=1 Δτ=0 Δℓ=0; (0,2) d=4 Δτ=1 Δℓ=1; (1,2) d=5 Δτ=1 Δℓ=1;
    # (2,3) d=13 Δτ=2 Δℓ=round(2.8)=3; the zero-difference mean is 1 for both
    bins, means, _ = binned_means(res["lag"]["age"], "ratio")
    assert bins.tolist() == [0, 1, 2] and means.tolist() == [1.0, 4.5, 13.0]
    bins, means, _ = binned_means(res["lag"]["lag"], "ratio")
    assert bins.tolist() == [0, 1, 3] and means.tolist() == [1.0, 4.5, 13.0]
    # ρ/2 = Σ x (y − 1) / Σ x²: ages (3.5 + 2·12)/5 = 5.5; lags (3.5 + 3·12)/10 = 3.95
    assert res["lag"]["rho_age"] == pytest.approx(11.0)
    assert res["lag"]["rho_lag"] == pytest.approx(7.9)
    assert res["lag"]["rho_ratio"] == pytest.approx(7.9 / 11.0)
    assert res["lag"]["snapshots"] == 1


def test_unavailable_clients_and_dead_links_are_not_live_pairs():
    rg = RoundGraph.from_edges(4, EDGES)
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    d = Diagnostics(["raw", "lag"], rg=rg, available=np.ones((10, 4), bool), seed=1)
    # client 2 offline: only the pair (0, 1) is live; receiver 0's neighbour 2 is gone
    d.observe(round_dict(rg, X, t=0, ages=[0, 0, 1, 3], lags=[0, 0.4, 1.2, 4.0],
                         avail=[1, 1, 0, 1]))
    res = d.result()
    assert binned_means(res["raw"], "ratio")[0].tolist() == [0]
    assert binned_means(res["lag"]["age"], "ratio")[2].tolist() == [1]


def test_rho_fit_recovers_a_planted_rate():
    # fit_rate on exact points, and end to end: models on one shared random walk, each
    # client's position = its age, plus independent noise: E d² = 2νD + σ²D·Δτ, so that
    # E d² / E d₀² = 1 + (σ²/2ν)·Δτ and ρ = σ²/ν
    x = np.arange(0, 25)
    assert fit_rate(x, 1 + 0.5 * 1.7 * x) == pytest.approx(1.7)
    assert math.isnan(fit_rate([0, 30], [1.0, 9.0]))
    rng = np.random.default_rng(0)
    n, D, sigma2, nu = 400, 4000, 0.02, 0.05
    ring = np.stack([np.arange(n), (np.arange(n) + 1) % n], 1)
    extra = np.stack([np.arange(n), (np.arange(n) + 7) % n], 1)
    rg = RoundGraph.from_edges(n, np.concatenate([ring, extra]))
    ages = rng.integers(0, 12, n)
    walk = np.cumsum(rng.normal(0, math.sqrt(sigma2), (13, D)), axis=0)
    X = torch.tensor(walk[ages] + rng.normal(0, math.sqrt(nu), (n, D)), dtype=torch.float32)
    d = Diagnostics(["lag"], rg=rg, available=np.ones((10, n), bool), seed=1)
    d.observe(round_dict(rg, X, t=0, ages=ages, lags=ages.astype(float), avail=[1] * n))
    rates = d.result()["lag"]
    assert rates["rho_age"] == pytest.approx(sigma2 / nu, rel=0.1)
    assert rates["rho_lag"] == pytest.approx(sigma2 / nu, rel=0.1)


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 3)

    def forward(self, x):
        return self.fc(x)


def _val():
    model = _Lin()
    spec = ParamSpec.from_module(model)
    xs = [torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([[2.0, 1.0]]),
          torch.tensor([[0.0, 3.0], [1.0, 2.0]]), torch.zeros((0, 2))]
    ys = [torch.tensor([0, 1, 0]), torch.tensor([2]), torch.tensor([1, 1]),
          torch.zeros(0, dtype=torch.int64)]
    return model, spec, xs, ys, ValidationLoss(model, spec, xs, ys, torch.device("cpu"))


def _oracle(model, spec, xs, ys, row, client):
    """Loss and accuracy of one flat model on one client's validation split (a plain loop)."""
    if len(ys[client]) == 0:
        return math.nan, math.nan
    w = spec.unflatten(row)
    out = xs[client] @ w["fc.weight"].T + w["fc.bias"]
    loss = torch.nn.functional.cross_entropy(out, ys[client]).item()
    return loss, (out.argmax(1) == ys[client]).double().mean().item()


def test_validation_loss_matches_a_loop_and_the_zero_model_by_hand():
    model, spec, xs, ys, val = _val()
    P = torch.randn(5, spec.D, generator=torch.Generator().manual_seed(0))
    P[4] = 0.0
    owner = np.array([0, 1, 2, 3, 0])
    loss, acc = val.losses(P, owner)
    for k in range(4):
        want = _oracle(model, spec, xs, ys, P[k], owner[k])
        if math.isnan(want[0]):
            assert math.isnan(loss[k]) and math.isnan(acc[k])
        else:
            assert loss[k] == pytest.approx(want[0], rel=1e-5) and acc[k] == pytest.approx(want[1])
    # the zero model: uniform logits, loss ln 3, argmax ties go to class 0 (2 of 3 labels)
    assert loss[4] == pytest.approx(math.log(3)) and acc[4] == pytest.approx(2 / 3)


def test_returning_clients_on_four_clients():
    model, spec, xs, ys, val = _val()
    rg = RoundGraph.from_edges(4, EDGES)
    T = 10
    avail = np.ones((T, 4), bool)
    avail[0:3, 0] = False  # client 0 returns at t = 3 with age 3
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4, spec.D, generator=g)
    X[0] = 0.0  # the stale model: loss ln 3
    X_agg, X_next, X_later = (torch.randn(4, spec.D, generator=g) for _ in range(3))
    d = Diagnostics(["returning"], rg=rg, available=avail, seed=1, val=val)
    for t in range(T):
        ages = [t if t <= 3 else 0, 0, 0, 0]  # offline rounds 0..2: age 3 at return
        w = np.zeros(rg.n_slots)
        w[rg.indptr[0]] = 0.25
        d.observe(round_dict(rg, X, t=t, ages=ages, lags=ages, avail=avail[t], weights=w,
                             X_agg=X_agg, X_next=X_later if t == 8 else X_next))
    res = d.result()["returning"]
    assert res["returns"] == 1
    for col, row in (("stale", X[0]), ("agg", X_agg[0]), ("trained", X_next[0]),
                     ("later", X_later[0])):
        bins, means, counts = binned_means(res, f"loss_{col}")
        want = _oracle(model, spec, xs, ys, row, 0)
        assert bins.tolist() == [3] and counts.tolist() == [1]
        assert means[0] == pytest.approx(want[0], rel=1e-5), col
        assert binned_means(res, f"acc_{col}")[1][0] == pytest.approx(want[1])
    assert binned_means(res, "loss_stale")[1][0] == pytest.approx(math.log(3))
    # live neighbours of 0 at t = 3: clients 1 and 2 (their models at the start of the round)
    nb = np.mean([_oracle(model, spec, xs, ys, X[j], 0)[0] for j in (1, 2)])
    assert binned_means(res, "loss_neighbours")[1][0] == pytest.approx(nb, rel=1e-5)
    assert binned_means(res, "self_weight")[1].tolist() == [0.25]


def test_finetune_selection_normalisation_and_losses():
    model, spec, xs, ys, val = _val()
    rg = RoundGraph.from_edges(4, EDGES)
    g = torch.Generator().manual_seed(2)
    X = torch.randn(4, spec.D, generator=g)
    calls = []

    def train_batches(i, t):
        calls.append((i, t))
        return torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.int64)

    def train(P, bx, by):  # "training" that doubles every parameter: distances × 4
        assert bx.shape[0] == P.shape[0] == by.shape[0]
        return 2 * P

    d = Diagnostics(["finetune"], rg=rg, available=np.ones((20, 4), bool), seed=1, val=val,
                    train_batches=train_batches, train=train)
    # ages: 0, 1 fresh; 2 of age 2, 3 of age 1. Receiver 0 (neighbours 1 fresh, 2 stale) and
    # receiver 1 (0 fresh, 2 stale) are eligible; 2 and 3 are not fresh
    d.observe(round_dict(rg, X, t=10, ages=[0, 0, 2, 1], lags=[0, 0, 2, 1], avail=[1] * 4))
    d.observe(round_dict(rg, X, t=11, ages=[0, 0, 2, 1], lags=[0, 0, 2, 1], avail=[1] * 4))
    res = d.result()["finetune"]
    assert res["receivers"] == 2 and sorted(calls) == [(0, 10), (1, 10)]

    def dist(a, b):
        return float(((X[a] - X[b]).double() ** 2).sum())

    age2 = np.mean([dist(0, 2) / dist(0, 1), dist(1, 2) / dist(1, 0)])
    for col in ("before", "after"):  # normalised by the fresh neighbour: invariant to × 2
        bins, means, counts = binned_means(res, col)
        assert bins.tolist() == [0, 2] and counts.tolist() == [2, 2]
        assert means[0] == pytest.approx(1.0) and means[1] == pytest.approx(age2, rel=1e-6)
    want = np.mean([_oracle(model, spec, xs, ys, 2 * X[2], i)[0] for i in (0, 1)])
    assert binned_means(res, "loss")[1][1] == pytest.approx(want, rel=1e-5)
    own = [_oracle(model, spec, xs, ys, 2 * X[i], i)[0] for i in (0, 1)]
    assert res["own_loss"][0] / res["own_loss"][1] == pytest.approx(np.mean(own), rel=1e-5)


def test_parse_pool_and_errors():
    assert parse_diagnostics("lag, raw") == ("raw", "lag")
    assert parse_diagnostics("all") == ("raw", "lag", "finetune", "returning")
    assert parse_diagnostics("") == ()
    with pytest.raises(SfgError, match="did you mean 'returning'"):
        parse_diagnostics("returnin")
    with pytest.raises(SfgError, match="validation split"):
        Diagnostics(["returning"], rg=RoundGraph.from_edges(4, EDGES),
                    available=np.ones((2, 4), bool), seed=1)
    a = {"x": {"sum": [1.0, 2.0], "count": [1, 1]}}
    b = {"x": {"sum": [0.0, 2.0, 6.0], "count": [0, 1, 2]}}
    assert pool([a, b]) == {"x": {"sum": [1.0, 4.0, 6.0], "count": [1, 2, 2]}}
    assert math.isnan(law_rates({"age": {"ratio": {"sum": [1.0], "count": [1]}},
                                 "lag": {"ratio": {"sum": [1.0], "count": [1]}}})["rho_age"])


def test_law_rates_from_per_bin_sums_by_hand():
    # the fit on stored sums and counts (what a run's JSON and the store hold): bin means
    # first, bin 0 and bins beyond 20 outside the fit, empty bins absent
    age = {"ratio": {"sum": [2.0, 3.0, 0.0, 12.0] + [0.0] * 17 + [100.0],
                     "count": [2, 2, 0, 3] + [0] * 17 + [1]}}
    lag = {"ratio": {"sum": [5.0, 4.0, 3.0], "count": [5, 2, 1]}}
    rates = law_rates({"age": age, "lag": lag})
    # ages: means 1.5 at x=1, 4 at x=3 (x=21 ignored): ρ = 2·(1·0.5 + 3·3)/(1 + 9) = 1.9
    # lags: means 2 at x=1, 3 at x=2: ρ = 2·(1·1 + 2·2)/(1 + 4) = 2
    assert rates["rho_age"] == pytest.approx(1.9, rel=1e-12)
    assert rates["rho_lag"] == pytest.approx(2.0, rel=1e-12)
    assert rates["rho_ratio"] == pytest.approx(2.0 / 1.9, rel=1e-12)
    # a zero age rate leaves the ratio undefined (NaN, not inf)
    flat = {"ratio": {"sum": [1.0, 1.0], "count": [1, 1]}}
    zero = law_rates({"age": flat, "lag": lag})
    assert zero["rho_age"] == 0.0 and math.isnan(zero["rho_ratio"])


TINY = dict(dataset="digits", model="mlp", n_clients=16, rounds=12, local_steps=2,
            batch_size=8, eval_every=4, graph="knn:k=4", backend="batched",
            process="bursty:u=0.8")


@pytest.mark.crosspath
@pytest.mark.parametrize("rule,extra", [("sfg-l", {}), ("dfedavg", {"momentum": 0.5})])
def test_diagnostics_do_not_change_training(rule, extra):
    plain = simulate({**TINY, **extra, "rule": rule})
    diag = simulate({**TINY, **extra, "rule": rule, "diagnostics": "raw,lag,finetune,returning"})
    assert torch.equal(plain.params, diag.params)
    assert plain.meta["minibatch_digest"] == diag.meta["minibatch_digest"]
    assert plain.metrics == diag.metrics and plain.curves == diag.curves
    assert plain.diagnostics is None
    res = diag.diagnostics
    assert res["kinds"] == ["raw", "lag", "finetune", "returning"]
    assert res["returning"]["returns"] > 0 and res["finetune"]["receivers"] > 0
    assert sum(res["lag"]["age"]["ratio"]["count"]) > 0
