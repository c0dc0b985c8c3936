"""Registry-wide conformance suite and hand-computed cases for the weight rules (docs/concepts/rules.md#scores-and-weights)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.round.kernel import candidate_mask, given_scores, play_round
from sfg.round.rules import parse_rule, rule_names
from sfg.round.slots import RoundGraph
from sfg.round.staleness import StalenessState
from sfg.world.outages.anatomy import Capabilities


# every registered rule that runs without models, picked up automatically, plus variants
def model_free_rules() -> list[str]:
    return [r for r in rule_names() if "model" not in parse_rule(r).tags]


MODEL_FREE = model_free_rules()
VARIANTS = MODEL_FREE + ["oracle-gls:kappa=0.3", "oracle-qp:kappa=5", "sfg-l:gamma=0.3+ipw",
                         "aoi+ipw", "sfg:gamma=0", "sfg-l:gamma=0+rounded", "sfg-cut:L=2",
                         "sfg:c=0.5", "limited-merging:L=2", "sfg-cut:L=0", "two-random+ipw",
                         "metropolis-hastings:c=0.5", "sfg-cut+guard+relative+cap",
                         "limited-merging:L=2,kappa=1.5,margin=0.5+cap+relative+guard"]


@st.composite
def candidates(draw, max_k: int = 8):
    """One receiver's candidates (index 0 = the receiver) with arbitrary staleness."""
    k = draw(st.integers(1, max_k))
    t = draw(st.integers(0, 40))
    ints = st.lists(st.integers(0, 12), min_size=k, max_size=k)
    ages = np.minimum(np.array(draw(ints)), t)
    extra = np.array(draw(st.lists(st.floats(0, 5), min_size=k, max_size=k)))
    lags = np.minimum(ages + extra, t)
    return dict(
        ages=ages, lags=lags, t=t,
        counts=np.array(draw(st.lists(st.integers(1, 20), min_size=k, max_size=k))),
        local_counts=np.array(draw(st.lists(st.integers(1, 20), min_size=k, max_size=k))),
        q_hat=np.array(draw(st.lists(st.floats(0.05, 1), min_size=k, max_size=k))),
        u=draw(st.floats(0, 0.999)),
        keys=np.array(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k))),
        degrees=np.array([k - 1] + draw(st.lists(st.integers(1, 9), min_size=k - 1,
                                                 max_size=k - 1)), dtype=np.int64),
        missed=np.array(draw(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=4,
                                               max_size=4), min_size=k, max_size=k))),
    )


def check_conformance(name: str, x: dict) -> None:
    """The conformance property of one rule on one receiver's candidates."""
    rule = parse_rule(name)
    w = rule.weights_one(**x)
    assert w.shape == (len(x["ages"]),)
    assert np.all(np.isfinite(w)) and np.all(w >= 0)
    assert abs(w.sum() - 1.0) < 1e-12
    np.testing.assert_array_equal(w, rule.weights_one(**x))


@settings(max_examples=300, deadline=None)
@given(x=candidates(), name=st.sampled_from(VARIANTS))
def test_conformance_one_receiver(x, name):
    """Every rule: weights over exactly its candidates, non-negative, finite, summing to 1,
    deterministic (docs/concepts/round.md#one-round)."""
    check_conformance(name, x)


def test_conformance_covers_every_registered_rule():
    names = {parse_rule(v).name for v in VARIANTS}
    assert {"two-random", "metropolis-hastings", "sfg-cut", "oracle-qp"} <= names
    assert names == {r for r in rule_names() if "model" not in parse_rule(r).tags}


@pytest.mark.parametrize("scores", [[0.0, 0.0, 0.0], [np.nan, np.inf, -1.0], [-2.0, 0.0, -0.0]])
def test_all_zero_or_invalid_scores_fall_back_to_self(scores):
    """The shared normalisation: non-finite or negative scores count as 0; an all-zero row
    keeps the own model, never NaN (docs/concepts/round.md#one-round)."""
    from sfg.round.kernel import _generic, scorer

    def weights(given, adopt=True):  # the round's own weights (sfg.round.kernel._weights)
        k, w = len(given), np.empty(len(given))
        _generic("one")(scorer(given_scores), np.zeros(0), 5, 0.5, np.zeros(k, np.int64),
                        np.zeros(k), np.ones(k, np.int64), np.ones(k, np.int64), np.ones(k),
                        np.ones(k, np.int64), np.zeros(k), np.array(given, float), 1.0, False,
                        adopt, w)
        return w

    np.testing.assert_array_equal(weights(scores), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(weights([np.nan, 2.0, 6.0]), [0.0, 0.25, 0.75])
    # a receiver that does not adopt keeps its own model whatever the scores
    np.testing.assert_array_equal(weights([np.nan, 2.0, 6.0], adopt=False), [1.0, 0.0, 0.0])


@settings(max_examples=150, deadline=None)
@given(x=candidates(), name=st.sampled_from([v for v in VARIANTS if not parse_rule(v).random]),
       seed=st.integers(0, 1000))
def test_relabelling_neighbours_permutes_weights(x, name, seed):
    """Reordering the neighbours reorders their weights (no rule reads a neighbour's index)."""
    rule = parse_rule(name)
    k = len(x["ages"])
    perm = np.concatenate([[0], 1 + np.random.default_rng(seed).permutation(k - 1)])
    y = {key: (v[perm] if isinstance(v, np.ndarray) else v) for key, v in x.items()}
    np.testing.assert_allclose(rule.weights_one(**y), rule.weights_one(**x)[perm], atol=1e-12)


def random_round(rng: np.random.Generator, n: int, p_edge: float = 0.4):
    """A random graph, staleness state and capabilities (one round)."""
    iu = np.triu_indices(n, 1)
    pick = rng.random(iu[0].size) < p_edge
    rg = RoundGraph.from_edges(n, np.stack([iu[0][pick], iu[1][pick]], 1))
    t = int(rng.integers(5, 30))
    ages = rng.integers(0, 6, n)
    lags = np.minimum(ages + rng.random(n) * 3 * (rng.random(n) < 0.7), t)
    q = rng.uniform(0.05, 1, rg.n_slots)
    q[rg.is_self] = 1
    state = StalenessState(t=t, ages=ages.astype(np.int64), lags=lags,
                           counts=rng.integers(1, 12, n).astype(np.int64),
                           local_counts=rng.integers(1, 12, n).astype(np.int64), q_hat=q,
                           missed=rng.random((n, t + 1)) * (rng.random((n, t + 1)) < 0.3))
    aggregate = rng.random(n) < 0.8
    caps = Capabilities(train=aggregate & (rng.random(n) < 0.8), send=rng.random(n) < 0.7,
                        aggregate=aggregate, adopt=aggregate & (rng.random(n) < 0.9))
    live = rng.random(int(pick.sum())) < 0.8
    return rg, state, caps, live


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 9), name=st.sampled_from(VARIANTS))
def test_round_equals_one_receiver(seed, n, name):
    """The round's weights for every receiver equal the one-receiver form on its candidates;
    the round's candidate sets equal S_i^t (docs/concepts/round.md#one-round)."""
    from sfg.round.kernel import rule_draws

    rule = parse_rule(name)
    rg, state, caps, live = random_round(np.random.default_rng(seed), n)
    rr = play_round(rule, rg, state, caps, seed=seed, live=live)
    w, cand = rr.weights, rr.candidate
    np.testing.assert_array_equal(cand, candidate_mask(rg, caps, live))
    u, key = rule_draws(seed, state.t, n, rg.n_slots)
    link = live[np.maximum(rg.edge_id, 0)] if live.size else True
    nb = caps.send[rg.send] & link & ~rg.is_self
    deg = np.bincount(rg.recv, weights=nb, minlength=n).astype(np.int64)
    for i in range(n):
        sl = slice(rg.indptr[i], rg.indptr[i + 1])
        c = cand[sl]
        if not caps.adopt[i]:
            np.testing.assert_array_equal(w[sl], rg.is_self[sl].astype(float))
            continue
        j = rg.send[sl][c]
        w1 = rule.weights_one(ages=state.ages[j], lags=state.lags[j], counts=state.counts[j],
                              local_counts=state.local_counts[j], q_hat=state.q_hat[sl][c],
                              t=state.t, u=float(u[i]) if rule.random else 0.5,
                              keys=key[sl][c] if rule.random else None, degrees=deg[j],
                              missed=state.missed[j])
        np.testing.assert_allclose(w[sl][c], w1, atol=1e-12)
        assert np.all(w[sl][~c] == 0)


# ------------------------------------------------------------------ semantics
def one(rule, **kw):
    return parse_rule(rule).weights_one(**kw)


@pytest.mark.parametrize("name", ["sfg", "sfg-l", "sfg-cut", "sfg-counts", "sfg:gamma=0",
                                  "sfg-l:gamma=0", "sfg-cut:L=0", "sfg-l:gamma=0.2+ipw"])
def test_sfg_family_equals_dfedavg_when_nothing_is_stale(name):
    k = 5
    w = one(name, ages=np.zeros(k), lags=np.full(k, 0.0), counts=np.full(k, 7), t=6)
    np.testing.assert_allclose(w, np.full(k, 1 / k))


def test_sfg_equals_relative_aoi_when_receiver_fresh():
    ages = np.array([0, 2, 0, 3, 1])
    w = one("sfg:gamma=0.5", ages=ages)
    h = np.array([1.0] + [0.5 ** a for a in ages[1:]])  # relative AoI, receiver fresh => min 0
    np.testing.assert_allclose(w, h / h.sum())


def test_sfg_hand_case_returning_receiver():
    w = one("sfg:gamma=0.5", ages=[4, 1, 2])  # min age 1
    h = np.array([0.5 ** 3, 1.0, 0.5])
    np.testing.assert_allclose(w, h / h.sum())


def test_sfg_l_hand_case():
    w = one("sfg-l:gamma=0.25", ages=[3, 0, 1], lags=[3.5, 0.5, 1.5], t=10)
    h = np.array([0.25 ** 3, 1.0, 0.25 ** 1])
    np.testing.assert_allclose(w, h / h.sum())


def test_sfg_cut_hand_case_drops_receiver():
    # t=10, lags 3.5 (receiver), 0.5, 1.2: L=1 keeps 0.5 and 1.2 only; scores 1+t-l
    w = one("sfg-cut:L=1", ages=[3, 0, 1], lags=[3.5, 0.5, 1.2], t=10)
    h = np.array([0.0, 10.5, 9.8])
    np.testing.assert_allclose(w, h / h.sum())
    assert w[0] == 0


def test_receiver_kept_never_drops_receiver():
    w = one("receiver-kept:L=1", ages=[3, 0, 1], lags=[3.5, 0.5, 1.2], t=10)
    h = np.array([7.5, 10.5, 9.8])
    np.testing.assert_allclose(w, h / h.sum())


def test_sfg_counts_hand_case():
    w = one("sfg-counts:gamma=0.5", ages=[2, 0, 0], counts=[5, 8, 7])
    h = np.array([0.5 ** 3, 1, 0.5])
    np.testing.assert_allclose(w, h / h.sum())


def test_limited_merging_drops_receiver_and_weights_by_counts():
    w = one("limited-merging:L=2", ages=[5, 0, 0], counts=[3, 9, 8])
    np.testing.assert_allclose(w, [0, 9 / 17, 8 / 17])


def test_local_counts_uses_uninherited_counters():
    w = one("local-counts:L=1", ages=[5, 0, 0], counts=[30, 9, 8], local_counts=[4, 6, 5])
    np.testing.assert_allclose(w, [0, 6 / 11, 5 / 11])


def test_gl_age_hand_case():
    np.testing.assert_allclose(one("gl-age", ages=[0, 0], counts=[1, 3]), [0.25, 0.75])


@pytest.mark.parametrize("name", ["aoi", "dfl-aa", "aoi+ipw"])
def test_aoi_and_dfl_aa_never_discount_the_receiver(name):
    # a very stale receiver keeps score 1
    w = one(name, ages=[50, 0, 0], q_hat=[1, 1, 1])
    np.testing.assert_allclose(w, [1 / 3, 1 / 3, 1 / 3])


def test_aoi_hand_case():
    w = one("aoi:gamma=0.5", ages=[3, 1, 2])  # absolute ages of neighbours
    h = np.array([1.0, 0.5, 0.25])
    np.testing.assert_allclose(w, h / h.sum())


def test_dfl_aa_hand_case():
    w = one("dfl-aa:gamma=0.5", ages=[9, 2, 3], q_hat=[1, 0.5, 0.25])
    h = np.array([1.0, 1 / 0.5, 0.5 / 0.25])  # min over live neighbours = 2
    np.testing.assert_allclose(w, h / h.sum())


def test_ipw_divides_neighbours_only():
    w = one("sfg:gamma=0.5+ipw", ages=[0, 0, 1], q_hat=[0.1, 0.5, 0.25])
    h = np.array([1.0, 1 / 0.5, 0.5 / 0.25])
    np.testing.assert_allclose(w, h / h.sum())


def test_base_self_weight_c():
    w = one("sfg:c=0.5", ages=[0, 0, 0])
    np.testing.assert_allclose(w, np.array([0.5, 1, 1]) / 2.5)


def test_self_weight_and_self_only_and_reset():
    np.testing.assert_allclose(one("self-weight", ages=[5, 0]), [0.5 / 1.5, 1 / 1.5])
    np.testing.assert_allclose(one("self-weight:c=0.25", ages=[0, 0]), [0.2, 0.8])
    np.testing.assert_allclose(one("self-only", ages=[2, 0]), [0.25 / 1.25, 1 / 1.25])
    np.testing.assert_allclose(one("self-only", ages=[0, 3]), [0.5, 0.5])  # not returning
    np.testing.assert_allclose(one("reset-on-return", ages=[2, 1, 0]), [0, 0.5, 0.5])
    np.testing.assert_allclose(one("reset-on-return", ages=[2]), [1.0])  # no live neighbour


def test_neighbour_only_controls():
    w = one("neighbour-only-lags:gamma=0.5", ages=[9, 1, 2], lags=[9.0, 1.0, 3.0], t=20)
    np.testing.assert_allclose(w, np.array([1, 1, 0.25]) / 2.25)
    w = one("neighbour-only-counts:gamma=0.5", ages=[9, 1, 2], counts=[1, 10, 9])
    np.testing.assert_allclose(w, np.array([1, 1, 0.5]) / 2.5)


def test_pinned_receiver():
    w = one("pinned-receiver:gamma=0.5", ages=[4, 0, 1], lags=[4.0, 1.0, 2.0], t=10)
    np.testing.assert_allclose(w, np.array([1, 1, 0.5]) / 2.5)


def test_cut_ages_and_gamma_zero_ties():
    np.testing.assert_allclose(one("cut-ages", ages=[3, 0, 1, 2]), [0, 0.5, 0.5, 0])
    np.testing.assert_allclose(one("sfg:gamma=0", ages=[2, 0, 0, 1]), [0, 0.5, 0.5, 0])
    # real lags: in effect copies the least-lagged; rounded ties average near-equal ones
    np.testing.assert_allclose(one("sfg-l:gamma=0", ages=[1, 0, 0], lags=[1.0, 0.4, 0.3], t=5),
                               [0, 0, 1])
    np.testing.assert_allclose(one("sfg-l:gamma=0+rounded", ages=[1, 0, 0],
                                   lags=[1.0, 0.4, 0.3], t=5), [0, 0.5, 0.5])


def test_copy_random_and_placebo_cut():
    w = one("copy-random", ages=[0, 0, 0, 0], u=0.6)  # floor(0.6*4) = 2
    np.testing.assert_array_equal(w, [0, 0, 1, 0])
    # sfg-cut would keep 2 (lags 0.5, 1.2); placebo keeps the 2 smallest keys
    w = one("placebo-cut:L=1", ages=[3, 0, 1], lags=[3.5, 0.5, 1.2], t=10, keys=[0.1, 0.9, 0.2])
    np.testing.assert_allclose(w, [0.5, 0, 0.5])


def test_two_histories_same_ages_and_counts_different_lags():
    """Ages and max-inherited counts agree but lags differ: only the lag rules tell them apart."""
    from sfg.round.staleness import init_state

    # two 3-client paths 0-1-2 with the same availability for clients 1, 2 but different mixing
    rg = RoundGraph.from_edges(3, np.array([[0, 1], [1, 2]]))
    allon = np.ones(3, bool)
    off0 = np.array([False, True, True])

    def run(weights_round1):
        st0 = init_state(rg)
        # round 0: client 0 offline, 1 and 2 keep their own models (local)
        st1 = play_round(parse_rule("local"), rg, st0, Capabilities(off0, off0, off0, off0),
                         seed=0).state
        # round 1: everyone online; client 1 mixes with the given weights over (1, 0, 2)
        h = rg.is_self.astype(float)
        h[rg.indptr[1]: rg.indptr[2]] = weights_round1
        return play_round(parse_rule("dfedavg"), rg, st1,
                          Capabilities(allon, allon, allon, allon), seed=0, scores=h).state

    a = run([0.5, 0.25, 0.25])  # slots of receiver 1: self, 0, 2
    b = run([0.5, 0.5, 0.0])
    np.testing.assert_array_equal(a.ages, b.ages)
    np.testing.assert_array_equal(a.counts, b.counts)
    assert a.lags[1] != b.lags[1]
    kw = {"ages": a.ages[[1, 0, 2]], "counts": a.counts[[1, 0, 2]], "t": 2}
    wa = one("sfg-l", lags=a.lags[[1, 0, 2]], **kw)
    wb = one("sfg-l", lags=b.lags[[1, 0, 2]], **kw)
    assert not np.allclose(wa, wb)
    np.testing.assert_allclose(one("sfg", lags=a.lags[[1, 0, 2]], **kw),
                               one("sfg", lags=b.lags[[1, 0, 2]], **kw))
    np.testing.assert_allclose(one("sfg-counts", lags=a.lags[[1, 0, 2]], **kw),
                               one("sfg-counts", lags=b.lags[[1, 0, 2]], **kw))


# ------------------------------------------------------------------ names and errors
@pytest.mark.parametrize("text, fragment", [
    ("sfg-cutt", "did you mean 'sfg-cut'"),
    ("sfg:gama=0.3", "did you mean 'gamma'"),
    ("sfg:gamma=-0.1", "gamma=-0.1 must lie in [0, 1]"),
    ("sfg-cut:L=-1", "L=-1"),
    ("sfg+ipww", "did you mean 'ipw'"),
    ("sfg:gamma=abc", "must be a number"),
    ("pwg+ipw", "does not support +ipw"),
    ("model-memory:c=0.5", "does not support c"),
])
def test_bad_rule_names(text, fragment):
    with pytest.raises(SfgError, match=None) as e:
        parse_rule(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_parse_forms():
    r = parse_rule("sfg-l:gamma=0.3+ipw")
    assert r.name == "sfg-l" and r.params["gamma"] == 0.3 and r.ipw
    r = parse_rule("aoi+ipw")
    assert r.name == "aoi" and r.ipw
    assert parse_rule("limited-merging:L=2").params["L"] == 2
    assert parse_rule("sfg-cut+catchup").catchup


def test_oracles_hand_case():
    # receiver missed 3 rounds, neighbour none: G = diag(3, 0) (A rows [1,1,1] and [0,0,0])
    A = np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    for name in ("oracle-gls:kappa=0.5", "oracle-qp:kappa=0.5"):
        w = one(name, ages=[3, 0], missed=A, t=3)
        np.testing.assert_allclose(w, np.array([1 / 2.5, 1.0]) / (1 / 2.5 + 1))
        # without staleness (A = 0) both are uniform
        np.testing.assert_allclose(one(name, ages=[0, 0, 0], missed=np.zeros((3, 4))), [1 / 3] * 3)


def test_oracle_qp_is_the_simplex_optimum():
    from scipy.optimize import minimize

    rng = np.random.default_rng(7)
    for _ in range(25):
        k = int(rng.integers(2, 7))
        A = rng.random((k, 6)) * (rng.random((k, 6)) < 0.5) + np.outer(rng.random(k) < 0.3, np.ones(6))
        kappa = float(rng.uniform(0.1, 5))
        w = one(f"oracle-qp:kappa={kappa}", ages=np.zeros(k), missed=A)
        M = np.eye(k) + kappa * A @ A.T
        res = minimize(lambda x, M=M: x @ M @ x, np.full(k, 1 / k), method="SLSQP",
                       bounds=[(0, 1)] * k,
                       constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
                       options={"ftol": 1e-14, "maxiter": 500})
        assert w @ M @ w <= res.fun + 1e-9
        assert abs(w.sum() - 1) < 1e-12 and np.all(w >= 0)


def test_dfedavg_local_and_update_amplification_hand_cases():
    np.testing.assert_allclose(one("dfedavg", ages=[5, 0, 2, 1]), [0.25] * 4)
    np.testing.assert_allclose(one("local", ages=[5, 0, 2]), [1, 0, 0])
    # update amplification mixes like DFedAvg; its effect is on the local update (sfg run)
    np.testing.assert_allclose(one("update-amplification:c=2", ages=[5, 0]), [0.5, 0.5])
    assert parse_rule("update-amplification:c=2").amplify == 2.0
    assert parse_rule("sfg").amplify is None


def test_two_random_hand_cases():
    """Two distinct candidates with the smallest keys of the rule's own stream, equal weights;
    the own model alone without a live neighbour (docs/concepts/rules.md#controls-and-ablations)."""
    np.testing.assert_array_equal(one("two-random", ages=[4, 0, 1, 2], keys=[0.7, 0.2, 0.9, 0.1]),
                                  [0, 0.5, 0, 0.5])
    np.testing.assert_array_equal(one("two-random", ages=[4, 0, 1], keys=[0.1, 0.2, 0.9]),
                                  [0.5, 0.5, 0])
    np.testing.assert_array_equal(one("two-random", ages=[4]), [1.0])
    # not "the receiver plus one": the receiver can be left out
    assert one("two-random", ages=[0, 0, 0], keys=[0.9, 0.1, 0.2])[0] == 0


def test_metropolis_hastings_hand_case():
    """w_ij = 1/(1 + max(d_i, d_j)) with d the live-neighbour counts, w_ii = 1 − Σ (docs/concepts/rules.md#controls-and-ablations);
    not 1/(1 + d_j) nor 1/max(d_i, d_j)."""
    w = one("metropolis-hastings", ages=[9, 0, 0], degrees=[2, 1, 3])
    np.testing.assert_allclose(w, [1 - 1 / 3 - 1 / 4, 1 / 3, 1 / 4])
    np.testing.assert_allclose(one("metropolis-hastings", ages=[0]), [1.0])


def test_metropolis_hastings_symmetric_and_doubly_stochastic_without_outages():
    rng = np.random.default_rng(3)
    for _ in range(5):
        n = int(rng.integers(3, 12))
        iu = np.triu_indices(n, 1)
        pick = rng.random(iu[0].size) < 0.4
        rg = RoundGraph.from_edges(n, np.stack([iu[0][pick], iu[1][pick]], 1))
        on = np.ones(n, bool)
        from sfg.round.staleness import init_state

        rr = play_round(parse_rule("metropolis-hastings"), rg, init_state(rg),
                        Capabilities(on, on, on, on), seed=1)
        W = rg.to_dense(rr.weights)
        np.testing.assert_allclose(W, W.T, atol=1e-15)
        np.testing.assert_allclose(W.sum(axis=0), 1.0, atol=1e-12)
        np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
        # with an outage the degrees count live neighbours only
        off = on.copy()
        off[0] = False
        rr = play_round(parse_rule("metropolis-hastings"), rg, init_state(rg),
                        Capabilities(off, off, off, off), seed=1)
        W = rg.to_dense(rr.weights)
        np.testing.assert_allclose(W, W.T, atol=1e-15)


# ------------------------------------------------------------------ defences (sfg.round.defences)
DEFENCES = ("guard", "relative", "cap", "guard+relative+cap")
DEFENDED = [f"{r}+{d}" for r in MODEL_FREE if parse_rule(r).compiled for d in DEFENCES]


@settings(max_examples=300, deadline=None)
@given(x=candidates(), name=st.sampled_from(DEFENDED + ["sfg-cut:L=2,kappa=1.5,margin=0+cap+relative"]))
def test_conformance_with_defences(x, name):
    """Every model-free rule with every defence keeps the conformance property (weights over
    its candidates, non-negative, summing to 1) whatever the claims."""
    check_conformance(name, x)


def _consistent(x: dict) -> dict:
    """Claims every honest history can produce: count ≤ t + 1 and lag ≥ max(age, 1 + t − count)."""
    t = x["t"]
    counts = np.minimum(x["counts"], t + 1)
    lags = np.maximum(x["lags"], np.maximum(x["ages"], 1 + t - counts))
    return {**x, "counts": counts, "lags": lags}


@settings(max_examples=300, deadline=None)
@given(x=candidates(), name=st.sampled_from([r for r in MODEL_FREE if parse_rule(r).compiled]))
def test_defences_change_nothing_where_claims_are_consistent(x, name):
    """+guard never changes consistent claims; +relative changes nothing when no neighbour
    claims more than the margin below (or, for counts, above) the other candidates; +cap
    changes nothing when no neighbour's weight exceeds κ/|S_i|."""
    x = _consistent(x)
    plain = parse_rule(name).weights_one(**x)
    np.testing.assert_array_equal(parse_rule(f"{name}+guard").weights_one(**x), plain)
    k = len(x["ages"])
    if np.all(plain[1:] <= 2.0 / k):
        np.testing.assert_array_equal(parse_rule(f"{name}+cap").weights_one(**x), plain)
    same = {**x, "ages": np.full(k, x["ages"].min()), "lags": np.full(k, x["lags"].min()),
            "counts": np.full(k, x["counts"].max())}
    np.testing.assert_array_equal(parse_rule(f"{name}+relative").weights_one(**same),
                                  parse_rule(name).weights_one(**same))


def test_defence_hand_cases():
    # +relative: a neighbour 4 below the others' minimum (3) is raised to 3 − 1 = 2
    w = one("sfg-l+relative", ages=[3, 3, 0], lags=[3.0, 3.0, -1.0], t=10)
    np.testing.assert_allclose(w, np.array([0.5, 0.5, 1.0]) / 2.0)
    # +cap: κ = 2, k = 4 → at most 0.5 per neighbour, the rest to the receiver
    w = one("sfg:gamma=0+cap", ages=[5, 0, 5, 5], t=10)
    np.testing.assert_allclose(w, [0.5, 0.5, 0.0, 0.0])
    w = one("sfg:gamma=0,kappa=1+cap", ages=[5, 0, 5, 5], t=10)
    np.testing.assert_allclose(w, [0.75, 0.25, 0.0, 0.0])
    # +guard: count 30 at t = 10 is clamped to 11; gl-age weights 5 : 11
    np.testing.assert_allclose(one("gl-age+guard", ages=[0, 0], counts=[5, 30], t=10),
                               [5 / 16, 11 / 16])
