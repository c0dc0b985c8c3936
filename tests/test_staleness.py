"""Staleness invariants (docs/concepts/staleness.md#the-staleness-state): τ ≤ ℓ, lags = row sums of A, lag mass conservation.

The update is part of the shared round (:func:`sfg.round.kernel.play_round`); these tests drive it
with rules, or with given scores to impose hand-chosen weights."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.round.kernel import play_round
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.round.staleness import Q_HAT_FLOOR, init_state
from sfg.world.outages.anatomy import Capabilities

DFEDAVG = parse_rule("dfedavg")


def random_graph(rng, n, p=0.4):
    iu = np.triu_indices(n, 1)
    pick = rng.random(iu[0].size) < p
    return RoundGraph.from_edges(n, np.stack([iu[0][pick], iu[1][pick]], 1))


def caps_of(train, adopt=None, send=None, aggregate=None):
    adopt = train if adopt is None else adopt
    aggregate = adopt if aggregate is None else aggregate
    send = aggregate if send is None else send
    return Capabilities(np.asarray(train), np.asarray(send), np.asarray(aggregate),
                        np.asarray(adopt))


def with_weights(state, rg, w, caps):
    """One round with the given slot weights (rows of adopters sum to 1) as scores."""
    return play_round(DFEDAVG, rg, state, caps, seed=0, scores=w).state


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 10),
       rule=st.sampled_from(["dfedavg", "sfg", "sfg-l", "sfg-cut", "limited-merging:L=2",
                             "copy-random", "dfl-aa", "local", "two-random",
                             "metropolis-hastings"]))
def test_age_below_lag_and_lags_are_row_sums_of_A(seed, n, rule):
    rng = np.random.default_rng(seed)
    rg = random_graph(rng, n)
    T = 25
    r = parse_rule(rule)
    state = init_state(rg, rounds=T, track_missed=True)
    for _ in range(T):
        avail = rng.random(n) < 0.6
        state = play_round(r, rg, state, caps_of(avail), seed=seed).state
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
    mh = parse_rule("metropolis-hastings")  # symmetric and doubly stochastic (docs/concepts/rules.md#controls-and-ablations)
    for _ in range(20):
        avail = rng.random(n) < 0.5
        before = state.lags.sum()
        state = play_round(mh, rg, state, caps_of(avail), seed=0).state
        np.testing.assert_allclose(state.lags.sum() - before, (~avail).sum(), atol=1e-9)


def test_hand_computed_two_clients():
    rg = RoundGraph.from_edges(2, np.array([[0, 1]]))
    st = init_state(rg)
    on = np.array([True, True])
    off1 = np.array([True, False])
    # round 0: client 1 offline
    st = with_weights(st, rg, rg.is_self.astype(float), caps_of(off1))
    assert st.ages.tolist() == [0, 1] and st.lags.tolist() == [0.0, 1.0]
    assert st.counts.tolist() == [2, 1]
    # q̂ of client 0 for link from 1 decays: 0.9
    assert np.isclose(st.q_hat[~rg.is_self & (rg.recv == 0)][0], 0.9)
    # round 1: both online, uniform mixing
    st = with_weights(st, rg, np.full(4, 0.5), caps_of(on))
    assert st.ages.tolist() == [0, 0]
    np.testing.assert_allclose(st.lags, [0.5, 0.5])
    assert st.counts.tolist() == [3, 3]
    np.testing.assert_allclose(st.mean_counts, 1 + 2 - st.lags)


def test_anatomy_updates():
    """cannot-communicate keeps age 0 and the lag; adopt-without-train is youngest merged + 1."""
    rg = RoundGraph.from_edges(2, np.array([[0, 1]]))
    st = init_state(rg, rounds=3, track_missed=True)
    # client 1 cannot communicate but trains
    st1 = with_weights(st, rg, rg.is_self.astype(float),
                       caps_of([True, True], adopt=[True, False], send=[True, False]))
    assert st1.ages.tolist() == [0, 0] and st1.lags.tolist() == [0.0, 0.0]
    # client 1 adopts an aggregate but cannot train
    st2 = with_weights(st1, rg, np.full(4, 0.5), caps_of([True, False], adopt=[True, True]))
    assert st2.ages.tolist() == [0, 1]
    np.testing.assert_allclose(st2.lags, [0.0, 1.0])
    np.testing.assert_allclose(st2.missed.sum(1), st2.lags)


def test_q_hat_floor_and_offline_receivers_keep_their_estimates():
    rg = RoundGraph.from_edges(2, np.array([[0, 1]]))
    st = init_state(rg)
    only0 = np.array([True, False])
    for _ in range(60):
        st = with_weights(st, rg, rg.is_self.astype(float), caps_of(only0))
    q0 = st.q_hat[~rg.is_self & (rg.recv == 0)][0]
    q1 = st.q_hat[~rg.is_self & (rg.recv == 1)][0]
    assert q0 == Q_HAT_FLOOR and q1 == 1.0
