"""Staleness invariants (SPEC §2): τ ≤ ℓ, lags = row sums of A, lag mass conservation."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.rounds import RoundGraph
from sfg.rules import BatchSlots, parse_rule
from sfg.staleness import Q_HAT_FLOOR, init_state, update_state


def random_graph(rng, n, p=0.4):
    iu = np.triu_indices(n, 1)
    pick = rng.random(iu[0].size) < p
    return RoundGraph.from_edges(n, np.stack([iu[0][pick], iu[1][pick]], 1))


def metropolis(rg: RoundGraph, cand: np.ndarray) -> np.ndarray:
    """Symmetric doubly-stochastic weights on the live candidate edges."""
    nb = cand & ~rg.is_self
    # an edge is usable when both directions are candidates
    key = {(int(a), int(b)) for a, b, c in zip(rg.recv, rg.send, nb, strict=True) if c}
    both = np.array([(int(b), int(a)) in key and c for a, b, c in zip(rg.recv, rg.send, nb, strict=True)])
    deg = np.bincount(rg.recv, weights=both, minlength=rg.n)
    w = np.where(both, 1.0 / (1.0 + np.maximum(deg[rg.recv], deg[rg.send])), 0.0)
    self_w = 1.0 - np.bincount(rg.recv, weights=w, minlength=rg.n)
    return np.where(rg.is_self, self_w[rg.recv], w)


def rule_round(rule, rg, state, avail, rng):
    cand = avail[rg.recv] & (rg.is_self | avail[rg.send])
    s = BatchSlots(rg=rg, t=state.t, is_self=rg.is_self, cand=cand, age=state.ages[rg.send],
                   lag=state.lags[rg.send], count=state.counts[rg.send],
                   local_count=state.local_counts[rg.send], q=state.q_hat,
                   u=rng.random(rg.n)[rg.recv], key=rng.random(rg.n_slots))
    return rule.weights(s, aggregating=avail), cand


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 10),
       rule=st.sampled_from(["dfedavg", "sfg", "sfg-l", "sfg-cut", "limited-merging:L=2",
                             "copy-random", "dfl-aa", "local"]))
def test_age_below_lag_and_lags_are_row_sums_of_A(seed, n, rule):
    rng = np.random.default_rng(seed)
    rg = random_graph(rng, n)
    T = 25
    r = parse_rule(rule)
    state = init_state(rg, rounds=T, track_missed=True)
    for _ in range(T):
        avail = rng.random(n) < 0.6
        w, cand = rule_round(r, rg, state, avail, rng)
        state = update_state(state, rg, w, cand, trains=avail, adopts=avail)
        assert np.all(state.ages <= state.lags + 1e-9)
        assert np.all(state.lags >= 0)
        np.testing.assert_allclose(state.missed.sum(axis=1), state.lags, atol=1e-9)
        assert np.all(state.q_hat >= Q_HAT_FLOOR) and np.all(state.q_hat <= 1)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 12))
def test_doubly_stochastic_total_lag_grows_by_offline_count(seed, n):
    rng = np.random.default_rng(seed)
    rg = random_graph(rng, n)
    state = init_state(rg)
    for _ in range(20):
        avail = rng.random(n) < 0.5
        cand = avail[rg.recv] & (rg.is_self | avail[rg.send])
        w = metropolis(rg, cand)
        before = state.lags.sum()
        state = update_state(state, rg, w, cand, trains=avail, adopts=avail)
        np.testing.assert_allclose(state.lags.sum() - before, (~avail).sum(), atol=1e-9)


def test_hand_computed_two_clients():
    rg = RoundGraph.from_edges(2, np.array([[0, 1]]))
    st = init_state(rg)
    on = np.array([True, True])
    off1 = np.array([True, False])
    # round 0: client 1 offline
    w = rg.is_self.astype(float)
    cand = off1[rg.recv] & (rg.is_self | off1[rg.send])
    st = update_state(st, rg, w, cand, trains=off1, adopts=off1)
    assert st.ages.tolist() == [0, 1] and st.lags.tolist() == [0.0, 1.0]
    assert st.counts.tolist() == [2, 1]
    # q̂ of client 0 for link from 1 decays: 0.9
    assert np.isclose(st.q_hat[~rg.is_self & (rg.recv == 0)][0], 0.9)
    # round 1: both online, uniform mixing
    w = np.full(4, 0.5)
    st = update_state(st, rg, w, np.ones(4, bool), trains=on, adopts=on)
    assert st.ages.tolist() == [0, 0]
    np.testing.assert_allclose(st.lags, [0.5, 0.5])
    assert st.counts.tolist() == [3, 3]
    np.testing.assert_allclose(st.mean_counts, 1 + 2 - st.lags)


def test_anatomy_updates():
    """cannot-communicate keeps age 0 and the lag; adopt-without-train is youngest merged + 1."""
    rg = RoundGraph.from_edges(2, np.array([[0, 1]]))
    st = init_state(rg, rounds=3, track_missed=True)
    ident = rg.is_self.astype(float)
    # client 1 cannot communicate but trains
    st1 = update_state(st, rg, ident, rg.is_self & np.array([True, False, False, False])[[0, 1, 2, 3]],
                       trains=np.array([True, True]), adopts=np.array([True, False]))
    assert st1.ages.tolist() == [0, 0] and st1.lags.tolist() == [0.0, 0.0]
    # client 1 adopts an aggregate but cannot train
    w = np.full(4, 0.5)
    st2 = update_state(st1, rg, w, np.ones(4, bool), trains=np.array([True, False]),
                       adopts=np.array([True, True]))
    assert st2.ages.tolist() == [0, 1]
    np.testing.assert_allclose(st2.lags, [0.0, 1.0])
    np.testing.assert_allclose(st2.missed.sum(1), st2.lags)
