"""Rules that read models on the async and event protocols (sfg.clock.scored, sfg.sim.model_rules):
the events' staleness run one dependency level at a time with scores computed from the
models in between. Checked: level order gives exactly the time-order results (so running by
levels changes nothing), pwg with ρ = 0 is dfedavg model for model, the scores equal
hand computations, the schedule is the rules' common one (paired)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sfg.clock.replay import EventStaleness
from sfg.clock.schedule import LOCAL, _levels, _offline_levels, make_schedule, make_world
from sfg.clock.scored import make_scorer
from sfg.clock.settings import make_settings
from sfg.clock.train import simulate_events
from sfg.round.attacks import parse_attack
from sfg.round.rules import parse_rule
from sfg.sim.run import resolve_config

BASE = dict(dataset="digits", model="mlp", n_clients=16, rounds=16, local_steps=2,
            process="bursty:u=0.6", graph="knn:k=4", seed=2, eval_every=8, clock="virtual",
            compute="const:value=30", latency="const:value=5")


def _cfg(protocol: str, **kw) -> dict:
    """BASE on ``protocol``, with wake-up jitter where the protocol has periodic wakes (async;
    the event protocol refuses a jitter)."""
    return {**BASE, "protocol": protocol, **({"jitter": 0.5} if protocol == "async" else {}),
            **kw}


@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("rule,attack", [("sfg-cut", None), ("sfg-l+guard", None),
                                         ("aoi+ipw", None), ("copy-random", None),
                                         ("sfg-cut", "forge:frac=0.25,claim=fresh"),
                                         ("sfg-cut+refute", "forge:frac=0.25,claim=fresh")])
@pytest.mark.crosspath
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
@pytest.mark.parametrize("anatomy", ["full", "cannot-train-shares", "cannot-train-adopts"])
def test_guard_and_refute_on_the_clock_never_touch_an_honest_claim(protocol, anatomy):
    """On the clock the claim defences keep only the bounds that hold in time (τ ≤ ℓ, ℓ ≥ 0,
    counts ≥ 1; sfg.round.defences.TIMED): with jitter, lognormal devices, the anatomy modes
    and the event protocol's many local rounds per unit, no honest claim is clamped and the
    weights are sfg-cut's bit for bit (with the rounds' count and evidence bounds, thousands
    were). A claim that breaks τ ≤ ℓ (claim=random) is refuted and its sender dropped."""
    from sfg.round.kernel import FACTS

    cs = make_settings({"clock": "virtual", "protocol": protocol, "jitter": 0.95,
                        "compute": "lognormal:median=40,sigma=1",
                        "latency": "lognormal:median=30,sigma=1", "window": 2.0})
    world = make_world(cs, process="bursty:u=0.7", graph="knn:k=4", n=24, rounds=40, seed=1)
    sched = make_schedule(world, cs, local_steps=5, seed=1, anatomy=anatomy)

    def run(rule, attack=None):
        es = EventStaleness(parse_rule(rule), world, sched, seed=1, attack=parse_attack(attack))
        es.run()
        return es.result()

    plain = run("sfg-cut")
    for rule in ("sfg-cut+guard", "sfg-cut+refute"):
        got = run(rule)
        assert np.array_equal(plain["weights"], got["weights"]), rule
        assert got["facts"][:, FACTS.index("clamped")].sum() == 0, rule
    att_w, clamped = FACTS.index("attacker_weight"), FACTS.index("clamped")
    lie = "forge:frac=0.25,claim=random"
    liar, refuted = run("sfg-cut", lie)["facts"], run("sfg-cut+refute", lie)["facts"]
    assert refuted[:, clamped].sum() > 0
    assert refuted[:, att_w].sum() < liar[:, att_w].sum()


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_pwg_with_rho_zero_is_dfedavg_model_for_model(protocol):
    """pwg:rho=0 scores every candidate 1: through the level-by-level path (scores given
    from outside, the rule's normalisation) it trains the same models as dfedavg through
    the model-free path."""
    cfg = _cfg(protocol)
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
        cfg = _cfg(protocol, rule=rule)
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
    rv = make_scorer(parse_rule("relative-variance:nu=0.5"), n=3, n_slots=6,
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
    pwg = make_scorer(parse_rule("pwg"), n=2, n_slots=3, X0=torch.zeros(2, 2))
    z = torch.zeros(1, 2)
    # receiver 0 sees: itself (age 0) and two messages, ages 0 and 2, distances² 1 and 4
    M = torch.cat([z, torch.tensor([[1.0, 0.0], [2.0, 0.0]])])
    h = pwg.scores(M, np.array([0, 0, 0]), np.array([0]), np.array([0]), np.arange(3),
                   np.array([0, 0, 2]), None)
    # m(0) = 1, m(2) = 4: 4/1 = 1 + (ρ/2)·2 → ρ = 3; relative ages 0, 0, 2 → 1, 1, 1/7
    assert pwg.estimate(np.array([0, 1])).tolist() == [3.0, 0.0]
    assert np.allclose(h, [1.0, 1.0, 1 / 7])
    fixed = make_scorer(parse_rule("pwg-l:rho=0.5"), n=1, n_slots=3, X0=torch.zeros(1, 2))
    h = fixed.scores(M, np.array([0, 0, 0]), np.array([0]), np.array([0]), np.arange(3),
                     None, np.array([1.0, 0.5, 3.0]))
    assert np.allclose(h, [1 / 1.25, 1.0, 1 / 2.25])  # relative lags 0.5, 0, 2.5


def test_missed_fraction_rows_and_oracle_scores_by_hand():
    """Device 0 trains at unit 0, device 1 at unit 2 holding 0's message, device 0 again at
    unit 3 holding 1's: the rows A and oracle-gls's scores (κ = 1) computed by hand."""
    from dataclasses import dataclass

    from sfg.clock.missed import MissedRows

    @dataclass
    class Sched:  # the fields MissedRows reads
        cmsg: np.ndarray
        time: np.ndarray
        horizon: float = 4.0
        unit: float = 1.0
        caps: np.ndarray | None = None

    # candidates: e0 = [self]; e1 = [self, msg e0]; e2 = [self, msg e1]
    sched = Sched(cmsg=np.array([-1, -1, 0, -1, 1]), time=np.array([0.0, 2.0, 3.0]))
    rows = MissedRows(parse_rule("oracle-gls:kappa=1"), sched, prev=np.array([-1, -1, 0]), n=2)
    w = np.array([1.0, 0.5, 0.5, 0.5, 0.5])
    for ev, cidx in ((np.array([0]), np.array([0])), (np.array([1]), np.array([1, 2])),
                     (np.array([2]), np.array([3, 4]))):
        row = np.zeros(cidx.size, np.int64)
        h = rows.scores(None, row, np.array([0]), None, None, None, None, ev=ev, cidx=cidx)
        if ev[0] == 1:  # own [1, 1, 0, 0], message [0, 0, 0, 0]: Σ' = diag(3, 1)
            assert np.allclose(h, [1 / 3, 1.0])
        rows.adopted(None, None, ev=ev, cidx=cidx, row=row, weights=w)
    assert rows.rows[0].tolist() == [0, 0, 0, 0]
    assert rows.rows[1].tolist() == [0.5, 0.5, 0, 0]      # ½·[1, 1, 0, 0] + ½·[0, 0, 0, 0]
    assert rows.rows[2].tolist() == [0.25, 0.75, 0.5, 0]  # ½·[0, 1, 1, 0] + ½·row 1, col 3 = 0
    # an anatomy mode's offline local round that cannot train (cannot-train-adopts: send and
    # aggregate only) misses its own unit: column 3 = 1
    from sfg.round.kernel import EV_AGGREGATE, EV_ALL, EV_SEND

    sched.caps = np.array([EV_ALL, EV_ALL, EV_SEND | EV_AGGREGATE])
    rows.rows.pop(2)
    ev, cidx, row = np.array([2]), np.array([3, 4]), np.zeros(2, np.int64)
    rows.scores(None, row, np.array([0]), None, None, None, None, ev=ev, cidx=cidx)
    rows.adopted(None, None, ev=ev, cidx=cidx, row=row, weights=w)
    assert rows.rows[2].tolist() == [0.25, 0.75, 0.5, 1.0]


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_oracles_run_on_the_clock_paired_and_their_two_passes_agree(protocol):
    """The replay's level pass and its time-order pass with the scores give the same
    weights; training runs on the shared schedule and the oracle's scores matter."""
    from sfg.clock.missed import oracle_scores
    from sfg.clock.replay import staleness_events

    cs = make_settings({"clock": "virtual", "protocol": protocol, "jitter": 0.5,
                        "compute": "const:value=40", "latency": "const:value=30"})
    world = make_world(cs, process="bursty:u=0.7", graph="knn:k=4", n=24, rounds=40, seed=3)
    sched = make_schedule(world, cs, local_steps=5, seed=3)
    for name in ("oracle-gls", "oracle-qp:kappa=3"):
        r = parse_rule(name)
        es = EventStaleness(r, world, sched, seed=3)
        oracle_scores(es, r, sched, world.n)
        two = staleness_events(r, world, sched, seed=3)
        assert np.array_equal(es.w, two["weights"]) and np.array_equal(es.facts, two["facts"])
        dfed = staleness_events(parse_rule("dfedavg"), world, sched, seed=3)
        assert np.abs(two["weights"] - dfed["weights"]).max() > 0.05
    cfg = _cfg(protocol)
    a = simulate_events(resolve_config({**cfg, "rule": "oracle-gls"}))
    d = simulate_events(resolve_config({**cfg, "rule": "dfedavg"}))
    assert a["meta"]["schedule_digest"] == d["meta"]["schedule_digest"]
    assert (a["params"] - d["params"]).abs().max() > 1e-4
