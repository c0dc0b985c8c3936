"""Rules that read models on the async and event protocols (sfg.clock.scored, issue 19 item 2):
the events' staleness run one dependency level at a time with scores computed from the
models in between. Checked: level order gives exactly the time-order results (so running by
levels changes nothing), pwg with ρ = 0 is dfedavg model for model, the scores equal
hand computations, the schedule is the rules' common one (paired)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.clock.replay import EventStaleness
from sfg.clock.schedule import LOCAL, make_schedule, make_world
from sfg.clock.scored import PrecisionWeightedGossip, RelativeVariance
from sfg.clock.settings import make_settings
from sfg.clock.train import _levels, _offline_levels, simulate_events
from sfg.round.attacks import parse_attack
from sfg.round.rules import parse_rule
from sfg.sim.run import resolve_config

BASE = dict(dataset="digits", model="mlp", n_clients=16, rounds=16, local_steps=2,
            process="bursty:u=0.6", graph="knn:k=4", seed=2, eval_every=8, clock="virtual",
            compute="const:value=30", latency="const:value=5", jitter=0.5)


@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("rule,attack", [("sfg-cut", None), ("sfg-l+guard", None),
                                         ("aoi+ipw", None), ("copy-random", None),
                                         ("sfg-cut", "forge:frac=0.25,claim=fresh")])
def test_running_the_events_by_dependency_level_equals_time_order(protocol, rule, attack):
    """Every event reads only state written by its device's earlier events and its
    messages' sending events, so the levels (offline spans first, then the local rounds)
    give bit for bit the weights, facts, headers and state of one pass in time order."""
    cs = make_settings({"clock": "virtual", "protocol": protocol, "jitter": 0.5,
                        "compute": "const:value=40", "latency": "const:value=30"})
    world = make_world(cs, process="bursty:u=0.7", graph="knn:k=4", n=24, rounds=40, seed=3)
    sched = make_schedule(world, cs, local_steps=5, seed=3)
    r, att = parse_rule(rule), parse_attack(attack)
    whole = EventStaleness(r, world, sched, seed=3, attack=att)
    whole.run()
    by = EventStaleness(r, world, sched, seed=3, attack=att)
    level, _ = _levels(sched.kind, sched.dev, sched.cptr, sched.cmsg, world.n)
    loc = np.flatnonzero(sched.kind == LOCAL)
    top = int(level[loc].max())
    off = _offline_levels(sched.kind, sched.dev, level, world.n, top + 1)
    assert top > 3
    for L in range(1, top + 2):
        by.run(order=np.flatnonzero((sched.kind != LOCAL) & (off == L)))
        by.run(order=loc[level[loc] == L])
    a, b = whole.result(), by.result()
    for k in ("weights", "facts", "hdr", "hdr_lag", "ages", "lags", "counts", "q_hat"):
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_pwg_with_rho_zero_is_dfedavg_model_for_model(protocol):
    """pwg:rho=0 scores every candidate 1: through the level-by-level path (scores given
    from outside, the rule's normalisation) it trains the same models as dfedavg through
    the model-free path."""
    cfg = {**BASE, "protocol": protocol}
    a = simulate_events(resolve_config({**cfg, "rule": "pwg:rho=0"}))
    b = simulate_events(resolve_config({**cfg, "rule": "dfedavg"}))
    assert a["meta"]["schedule_digest"] == b["meta"]["schedule_digest"]
    assert torch.equal(a["params"], b["params"])
    assert a["accuracy"].tolist() == b["accuracy"].tolist()


@pytest.mark.parametrize("rule", ["relative-variance", "pwg", "pwg-l"])
def test_model_reading_rules_run_on_async_and_event_paired_and_deterministic(rule):
    """They run on both protocols, on the schedule every rule of the seed shares, the same
    seed gives the same models, and they differ from dfedavg (their scores matter) — except
    pwg under event, where a device's rounds follow each other within one Δ, so ages differ
    by whole units too rarely for a staleness difference to be seen (ρ̂ stays 0)."""
    for protocol in ("async", "event"):
        cfg = {**BASE, "protocol": protocol, "rule": rule}
        a = simulate_events(resolve_config(cfg))
        b = simulate_events(resolve_config(cfg))
        d = simulate_events(resolve_config({**cfg, "rule": "dfedavg"}))
        assert torch.equal(a["params"], b["params"])
        assert a["meta"]["schedule_digest"] == d["meta"]["schedule_digest"]
        if (rule, protocol) != ("pwg", "event"):
            assert (a["params"] - d["params"]).abs().max() > 1e-4
        assert 0.3 < a["metrics"]["acc_mean"] <= 1.0


def test_relative_variance_scores_by_hand():
    """Two receivers' local rounds: v starts at the first observation, then
    v ← (1 − ν) v + ν d²; h = 1/v; the previous aggregate is what it adopted last."""
    rv = RelativeVariance(parse_rule("relative-variance:nu=0.5"), n_slots=6,
                          X0=torch.tensor([[0.0, 0.0], [1.0, 1.0], [3.0, 0.0]]))
    # receiver 0 (slots 0, 1): itself [1, 0] and a message [0, 2]; receiver 2 (slot 5): itself
    M = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
    row, first, devs = np.array([0, 0, 1]), np.array([0, 2]), np.array([0, 2])
    h = rv.scores(M, row, first, devs, np.array([0, 1, 5]), None, None)
    assert np.allclose(h, [1 / 1.0, 1 / 4.0, 1 / 1.0])  # d² = 1, 4 from [0, 0]; 1 from [3, 0]
    rv.adopted(np.array([0]), torch.tensor([[2.0, 0.0]]))
    h = rv.scores(torch.tensor([[2.0, 0.0], [2.0, 2.0]]), np.array([0, 0]), np.array([0]),
                  np.array([0]), np.array([0, 1]), None, None)
    # d² from the adopted [2, 0]: 0 and 4; v = 0.5·1 + 0.5·0 = 0.5, 0.5·4 + 0.5·4 = 4
    assert np.allclose(h, [2.0, 0.25])


def test_pwg_scores_and_per_receiver_estimate_by_hand():
    """ρ̂ per receiver from its own pairs: m(0) from x = 0 pairs, m(x)/m(0) = 1 + (ρ/2)x;
    h = 1/(1 + ρ·relative age)."""
    pwg = PrecisionWeightedGossip(parse_rule("pwg"), 2, on_lags=False)
    z = torch.zeros(1, 2)
    # receiver 0 sees: itself (age 0) and two messages, ages 0 and 2, distances² 1 and 4
    M = torch.cat([z, torch.tensor([[1.0, 0.0], [2.0, 0.0]])])
    h = pwg.scores(M, np.array([0, 0, 0]), np.array([0]), np.array([0]), np.arange(3),
                   np.array([0, 0, 2]), None)
    # m(0) = 1, m(2) = 4: 4/1 = 1 + (ρ/2)·2 → ρ = 3; relative ages 0, 0, 2 → 1, 1, 1/7
    assert pwg.estimate(np.array([0, 1])).tolist() == [3.0, 0.0]
    assert np.allclose(h, [1.0, 1.0, 1 / 7])
    fixed = PrecisionWeightedGossip(parse_rule("pwg:rho=0.5"), 1, on_lags=True)
    h = fixed.scores(M, np.array([0, 0, 0]), np.array([0]), np.array([0]), np.arange(3),
                     None, np.array([1.0, 0.5, 3.0]))
    assert np.allclose(h, [1 / 1.25, 1.0, 1 / 2.25])  # relative lags 0.5, 0, 2.5


def test_oracles_are_still_refused_on_async_with_one_line(capsys):
    from sfg.cli.main import main

    code = main(["run", "--clock", "virtual", "--protocol", "async", "-r", "oracle-gls",
                 "-n", "8", "-T", "4", "--eval-every", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "lockstep" in err and len(err.strip().splitlines()) == 1, err
