"""Hand-computed values of the model-reading rules ``pwg``, ``pwg-l`` and ``relative-variance``.

A star of three clients (0 is the hub; 1 and 2 are its leaves) with small models of known
parameters and known staleness. Every expected weight below is worked out by hand from the
formulas of docs/concepts/rules.md#baselines (module docstring of ``sfg.sim.model_rules``); inverting a rule's
weights (favouring the stale or distant model) fails these tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.round.staleness import init_state
from sfg.sim.model_rules import make_model_rule
from sfg.world.outages.anatomy import capabilities

RG = RoundGraph.from_edges(3, np.array([[0, 1], [0, 2]]))
ON = capabilities(np.ones(3, bool))
X0 = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=torch.float64)


def slot(recv: int, send: int) -> int:
    return int(np.flatnonzero((RG.recv == recv) & (RG.send == send))[0])


def state(ages=(0, 0, 0), lags=(0.0, 0.0, 0.0)):
    st = init_state(RG)
    return dataclasses.replace(st, ages=np.array(ages, np.int64),
                               lags=np.array(lags, np.float64))


def weights_of(rw, recv: int) -> list[float]:
    return [float(rw.weights[slot(recv, j)]) for j in range(3) if (RG.recv == recv).any()
            and ((RG.recv == recv) & (RG.send == j)).any()]


# ------------------------------------------------------------------------------ pwg / pwg-l
def test_pwg_fixed_rho_discounts_relative_age():
    # hub 0 sees ages 0 (itself), 2 and 5: relative ages 0, 2, 5; rho = 0.5
    # h = 1/(1 + 0.5 * [0, 2, 5]) = [1, 1/2, 1/3.5]; sum = 1 + 0.5 + 2/7 = 25/14
    rule = make_model_rule(parse_rule("pwg:rho=0.5"), N=3, D=2, device="cpu")
    agg, rw = rule.aggregate(X0, RG, state(ages=(0, 2, 5)), ON, live=None, seed=0)
    expected = np.array([1.0, 0.5, 2.0 / 7.0]) / (25.0 / 14.0)  # [0.56, 0.28, 0.16]
    np.testing.assert_allclose(weights_of(rw, 0), expected, rtol=1e-12)
    np.testing.assert_allclose(expected, [0.56, 0.28, 0.16], rtol=1e-12)
    # the hub's new model is that weighted average: 0.28*[3,4] + 0.16*[6,8] = [1.8, 2.4]
    torch.testing.assert_close(agg[0], torch.tensor([1.8, 2.4], dtype=torch.float64))
    # leaf 2 (age 5) sees the hub (age 0): relative ages 0 (hub) and 5 (itself), in sender
    # order; h = [1, 1/3.5] -> weights [7/9, 2/9]
    np.testing.assert_allclose(weights_of(rw, 2), [7.0 / 9.0, 2.0 / 9.0], rtol=1e-12)


def test_pwg_l_reads_lags_not_ages():
    # lags 1, 0, 3 (ages all equal): relative lags at the hub 1, 0, 3; rho = 1
    # h = [1/2, 1, 1/4]; sum = 7/4 -> weights [2/7, 4/7, 1/7]
    rule = make_model_rule(parse_rule("pwg-l:rho=1"), N=3, D=2, device="cpu")
    _, rw = rule.aggregate(X0, RG, state(lags=(1.0, 0.0, 3.0)), ON, live=None, seed=0)
    np.testing.assert_allclose(weights_of(rw, 0), [2 / 7, 4 / 7, 1 / 7], rtol=1e-12)
    # pwg on the same state sees equal ages: uniform weights
    same = make_model_rule(parse_rule("pwg:rho=1"), N=3, D=2, device="cpu")
    _, rw_age = same.aggregate(X0, RG, state(lags=(1.0, 0.0, 3.0)), ON, live=None, seed=0)
    np.testing.assert_allclose(weights_of(rw_age, 0), [1 / 3] * 3, rtol=1e-12)


def test_pwg_estimates_rho_from_distances_against_staleness_gaps():
    rule = make_model_rule(parse_rule("pwg:H=2"), N=3, D=2, device="cpu")
    # no pair at staleness gap 0 yet: rho_hat = 0, so weights are uniform this round
    _, rw = rule.aggregate(X0, RG, state(ages=(0, 2, 5)), ON, live=None, seed=0)
    np.testing.assert_allclose(weights_of(rw, 0), [1 / 3] * 3, rtol=1e-12)
    # the round recorded the live pairs: (0,1) at gap 2 with d^2 = 25, (0,2) at gap 5 with 100
    assert rule.counts[2] == 1 and rule.sums[2] == 25.0
    assert rule.counts[5] == 1 and rule.sums[5] == 100.0
    assert rule.counts.sum() == 2
    # hand-set running means: m(0) = 2, m(1) = 3, m(2) = 4 (one pair each)
    # r = m(x)/m(0) = 1.5, 2; slope = (1*0.5 + 2*1) / (1 + 4) = 0.5; rho_hat = 2*slope = 1
    rule.sums[:] = 0
    rule.counts[:] = 0
    rule.sums[[0, 1, 2]] = [4.0, 3.0, 4.0]
    rule.counts[[0, 1, 2]] = [2, 1, 1]
    assert rule.estimate() == pytest.approx(1.0, rel=1e-12)
    # distances shrinking with the gap give a negative slope, clipped to 0
    rule.sums[[1, 2]] = [1.0, 0.5]
    assert rule.estimate() == 0.0


def test_pwg_uses_h_times_rho_hat():
    # with rho_hat = 1 already estimated and H = 2: rho = 2; ages 0, 1, 1 at the hub
    # (the new pairs in this round have gaps 1 and 1 and change the means; so fix them first)
    rule = make_model_rule(parse_rule("pwg:H=2"), N=3, D=2, device="cpu")
    rule.sums[[0, 1]] = [1e6, 1.5e6]  # m(0) = 1, m(1) = 1.5: r(1) = 1.5 -> rho_hat = 1
    rule.counts[[0, 1]] = [1e6, 1e6]
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # d^2 = 1
    _, rw = rule.aggregate(X, RG, state(ages=(0, 1, 1)), ON, live=None, seed=0)
    # the two new pairs (d^2 = 1 at gap 1) barely move m(1): rho_hat = 2*(m(1) - 1) ~ 1 - 1e-6
    rho = 2 * rule.rho_hat
    h = np.array([1.0, 1 / (1 + rho), 1 / (1 + rho)])
    np.testing.assert_allclose(weights_of(rw, 0), h / h.sum(), rtol=1e-12)
    assert rule.rho_hat == pytest.approx(2 * ((1.5e6 + 2) / (1e6 + 2) - 1), rel=1e-12)
    np.testing.assert_allclose(weights_of(rw, 0), [0.6, 0.2, 0.2], rtol=1e-5)


# ------------------------------------------------------------------------------ relative variance
def test_relative_variance_weights_are_inverse_squared_distances():
    rule = make_model_rule(parse_rule("relative-variance:nu=0.5"), N=3, D=2, device="cpu")
    agg0, rw0 = rule.aggregate(X0, RG, state(), ON, live=None, seed=0)
    # round 0: v starts at the first observation, ||x_j - x_0^prev||^2 with x^prev = X0:
    # self 0 (floored at 1e-12), client 1: 3^2+4^2 = 25, client 2: 6^2+8^2 = 100
    h = np.array([1e12, 1 / 25, 1 / 100])
    np.testing.assert_allclose(weights_of(rw0, 0), h / h.sum(), rtol=1e-12)
    w = weights_of(rw0, 0)
    assert w[1] / w[2] == pytest.approx(4.0, rel=1e-12)  # the nearer model weighs 4x more
    # leaf 1 sees the hub at distance 25 and itself at 0
    np.testing.assert_allclose(weights_of(rw0, 1), np.array([1 / 25, 1e12]) / (1e12 + 0.04),
                               rtol=1e-12)
    # round 1: v <- (1 - nu) v + nu ||x_j - x_0^prev||^2 with x_0^prev the hub's aggregate
    X1 = torch.tensor([[1.0, 1.0], [1.0, 2.0], [4.0, 5.0]], dtype=torch.float64)
    prev = agg0[0].numpy()
    d2 = [float(((X1[j].numpy() - prev) ** 2).sum()) for j in range(3)]
    v = [0.5 * 0 + 0.5 * d2[0], 0.5 * 25 + 0.5 * d2[1], 0.5 * 100 + 0.5 * d2[2]]
    _, rw1 = rule.aggregate(X1, RG, state(), ON, live=None, seed=0)
    h1 = np.array([1 / v[0], 1 / v[1], 1 / v[2]])
    np.testing.assert_allclose(weights_of(rw1, 0), h1 / h1.sum(), rtol=1e-9)
    # with prev ~ [0, 0]: v ~ [1, 15, 70.5], so weights ~ 1 : 1/15 : 1/70.5
    np.testing.assert_allclose(v, [1.0, 15.0, 70.5], rtol=1e-9)


def test_relative_variance_keeps_offline_slots_and_rows():
    rule = make_model_rule(parse_rule("relative-variance:nu=0.5"), N=3, D=2, device="cpu")
    rule.aggregate(X0, RG, state(), ON, live=None, seed=0)
    v_before = rule.v.copy()
    caps = capabilities(np.array([True, True, False]))
    X1 = X0 + 1.0
    agg, rw = rule.aggregate(X1, RG, state(), caps, live=None, seed=0)
    # the slot from offline client 2 keeps its variance and gets no weight
    assert rule.v[slot(0, 2)] == v_before[slot(0, 2)]
    assert rw.weights[slot(0, 2)] == 0.0
    torch.testing.assert_close(agg[2], X1[2])  # offline row untouched
