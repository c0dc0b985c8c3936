"""The model-reading rules (docs/concepts/rules.md#baselines) as one registered object each (sfg.sim.model_rules):
one registry keyed by rule name that the rounds (make_model_rule) and the virtual clock
(sfg.clock.scored.make_scorer) both dispatch through, and one formula per rule that gives the
hand-computed value on either path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sfg.clock.scored import make_scorer
from sfg.errors import SfgError
from sfg.round.rules import parse_rule, rule_names
from sfg.round.slots import RoundGraph
from sfg.round.staleness import init_state
from sfg.sim.model_rules import MODEL_RULES, make_model_rule, memory_kernel, model_rule
from sfg.world.outages.anatomy import capabilities


def test_every_model_reading_rule_is_registered_once():
    model = sorted(r for r in rule_names() if parse_rule(r).reads_models)
    assert model and sorted(MODEL_RULES) == model
    for name, cls in MODEL_RULES.items():
        assert name in cls.names
        assert type(model_rule(parse_rule(name))) is cls


def test_non_model_rules_are_refused_in_one_line():
    with pytest.raises(SfgError, match="does not read models") as e:
        make_model_rule(parse_rule("sfg"), N=2, D=1, device="cpu")
    assert "\n" not in str(e.value)
    with pytest.raises(SfgError, match="model-reading rules are relative-variance, pwg, pwg-l"):
        make_scorer(parse_rule("model-memory"), n=2, n_slots=2, X0=torch.zeros(2, 1))
    with pytest.raises(SfgError, match="nu=2.0 must lie in"):
        model_rule(parse_rule("relative-variance:nu=2"))


def test_memory_kernel_by_hand():
    assert str(memory_kernel(parse_rule("model-memory"))) == "dfedavg"
    k = memory_kernel(parse_rule("model-memory+sfg-l:gamma=0.3"))
    assert k.name == "sfg-l" and k.params["gamma"] == 0.3
    assert memory_kernel(parse_rule("model-memory+sfg")).params["gamma"] == 0.5
    assert memory_kernel(parse_rule("pwg")) is None


def test_pwg_in_rounds_and_on_the_clock_gives_the_hand_value():
    """The star 0 – {1, 2}, models [0, 0], [3, 4], [6, 8], ages 0, 0, 2. The pairs (0, 1):
    age difference 0, d² = 25; (0, 2): difference 2, d² = 100. m(2)/m(0) = 4 = 1 + (ρ/2)·2:
    ρ̂ = 3; the hub's relative ages 0, 0, 2 give h = 1, 1, 1/7. Rounds see both pairs in the
    round; on the clock the hub sees them as its candidates (its own estimator)."""
    rg = RoundGraph.from_edges(3, np.array([[0, 1], [0, 2]]))
    X = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=torch.float64)
    st = dataclasses.replace(init_state(rg), ages=np.array([0, 0, 2], np.int64))
    h = np.array([1.0, 1.0, 1.0 / 7.0])
    hub = slice(rg.indptr[0], rg.indptr[1])

    rounds = make_model_rule(parse_rule("pwg"), N=3, D=2, device="cpu")
    _, rr = rounds.aggregate(X, rg, st, capabilities(np.ones(3, bool)), live=None, seed=0)
    assert rounds.rho_hat == pytest.approx(3.0, rel=1e-12)
    np.testing.assert_allclose(rr.weights[hub], h[rg.send[hub]] / h.sum(), rtol=1e-12)

    clock = make_scorer(parse_rule("pwg"), n=3, n_slots=rg.n_slots, X0=X)
    got = clock.scores(X, np.zeros(3, np.int64), np.array([0]), np.array([0]),
                       np.arange(3), np.array([0, 0, 2]), None)
    assert clock.estimate(np.array([0, 1])).tolist() == pytest.approx([3.0, 0.0], rel=1e-12)
    np.testing.assert_allclose(got, h, rtol=1e-12)


def test_relative_variance_in_rounds_and_on_the_clock_gives_the_hand_value():
    """ν = 0.5; previous aggregates = the initial models; the hub's candidates' d² from its
    own [0, 0]: 0, 25, 100 -> v starts there, h = 1/max(v, 1e-12) = 1e12, 1/25, 1/100."""
    rg = RoundGraph.from_edges(3, np.array([[0, 1], [0, 2]]))
    X = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=torch.float64)
    h = np.array([1e12, 1 / 25, 1 / 100])
    hub = slice(rg.indptr[0], rg.indptr[1])

    rounds = make_model_rule(parse_rule("relative-variance:nu=0.5"), N=3, D=2, device="cpu")
    _, rr = rounds.aggregate(X, rg, init_state(rg), capabilities(np.ones(3, bool)), live=None,
                             seed=0)
    np.testing.assert_allclose(rr.weights[hub], h[rg.send[hub]] / h.sum(), rtol=1e-12)

    clock = make_scorer(parse_rule("relative-variance:nu=0.5"), n=3, n_slots=rg.n_slots, X0=X)
    slots = np.arange(hub.start, hub.stop)
    got = clock.scores(X[rg.send[hub]], np.zeros(3, np.int64), np.array([0]), np.array([0]),
                       slots, None, None)
    np.testing.assert_allclose(got, h[rg.send[hub]], rtol=1e-12)
