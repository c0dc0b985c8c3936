"""Registry-wide conformance suite and hand-computed cases for the weight rules (SPEC §3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfg.errors import SfgError
from sfg.rounds import RoundGraph
from sfg.rules import BatchSlots, parse_rule, rule_names

MODEL_FREE = [r for r in rule_names() if "model" not in parse_rule(r).tags]
VARIANTS = MODEL_FREE + ["oracle-gls:kappa=0.3", "oracle-qp:kappa=5","sfg-l:gamma=0.3+ipw", "aoi+ipw", "sfg:gamma=0", "sfg-l:gamma=0+rounded",
                         "sfg-cut:L=2", "sfg:c=0.5", "limited-merging:L=2", "sfg-cut:L=0"]


def random_instance(rng: np.random.Generator, n: int, p_edge: float = 0.4, t: int | None = None):
    """A random graph, staleness state and candidate mask (a 'round view')."""
    iu = np.triu_indices(n, 1)
    pick = rng.random(iu[0].size) < p_edge
    edges = np.stack([iu[0][pick], iu[1][pick]], 1)
    rg = RoundGraph.from_edges(n, edges)
    t = int(rng.integers(5, 30)) if t is None else t
    ages = rng.integers(0, 6, n)
    lags = ages + rng.random(n) * 3 * (rng.random(n) < 0.7)
    lags = np.minimum(lags, t)
    counts = rng.integers(1, 12, n)
    local_counts = rng.integers(1, 12, n)
    q = rng.uniform(0.05, 1, rg.n_slots)
    q[rg.is_self] = 1
    aggregating = rng.random(n) < 0.8
    sends = rng.random(n) < 0.7
    cand = aggregating[rg.recv] & (rg.is_self | sends[rg.send])
    u = rng.random(n)[rg.recv]
    key = rng.random(rg.n_slots)
    missed = rng.random((n, t)) * (rng.random((n, t)) < 0.3)  # rows of A (oracles)
    s = BatchSlots(rg=rg, t=t, is_self=rg.is_self, cand=cand, age=ages[rg.send],
                   lag=lags[rg.send], count=counts[rg.send], local_count=local_counts[rg.send],
                   q=q, u=u, key=key, missed=missed[rg.send])
    return rg, s, aggregating


def row(rg, w, i):
    return w[rg.indptr[i]: rg.indptr[i + 1]]


@pytest.mark.parametrize("name", VARIANTS)
def test_conformance(name):
    rule = parse_rule(name)
    rng = np.random.default_rng(0)
    for _ in range(20):
        rg, s, agg = random_instance(rng, int(rng.integers(2, 12)))
        w = rule.weights(s, aggregating=agg)
        assert np.all(np.isfinite(w)) and np.all(w >= 0)
        sums = np.bincount(rg.recv, weights=w, minlength=rg.n)
        np.testing.assert_allclose(sums, 1.0, atol=1e-12)
        assert np.all(w[~s.cand & ~rg.is_self] == 0), "weight outside the candidate set"
        ident = rg.is_self.astype(float)
        for i in np.flatnonzero(~agg):
            np.testing.assert_array_equal(row(rg, w, i), row(rg, ident, i))
        # determinism
        np.testing.assert_array_equal(w, rule.weights(s, aggregating=agg))


@pytest.mark.parametrize("name", VARIANTS)
def test_all_zero_scores_fall_back_to_self(name):
    """q̂ extremes, zero-weight kernels: never NaN; an all-zero row keeps the own model."""
    rule = parse_rule(name)
    rng = np.random.default_rng(1)
    rg, s, agg = random_instance(rng, 6)
    # force scores to zero through the kernel
    from sfg.rules import normalise

    w = normalise(np.zeros(rg.n_slots), s, agg)
    np.testing.assert_array_equal(w, rg.is_self.astype(float))
    w = normalise(np.full(rg.n_slots, np.nan), s, agg)
    np.testing.assert_array_equal(w, rg.is_self.astype(float))
    assert np.all(np.isfinite(rule.weights(s, aggregating=agg)))


@pytest.mark.parametrize("name", VARIANTS)
def test_relabelling_invariance(name):
    rule = parse_rule(name)
    rng = np.random.default_rng(2)
    for _ in range(10):
        n = int(rng.integers(3, 10))
        rg, s, agg = random_instance(rng, n)
        perm = rng.permutation(n)  # new label of old client i is perm[i]
        edges_old = np.stack([rg.recv[~rg.is_self], rg.send[~rg.is_self]], 1)
        edges_old = edges_old[edges_old[:, 0] < edges_old[:, 1]]
        new_edges = np.sort(perm[edges_old], axis=1)
        rg2 = RoundGraph.from_edges(n, new_edges)
        # map every new slot to the old slot (recv, send)
        old_index = {(int(a), int(b)): k for k, (a, b) in enumerate(zip(rg.recv, rg.send, strict=True))}
        inv = np.argsort(perm)
        m = np.array([old_index[(int(inv[a]), int(inv[b]))] for a, b in zip(rg2.recv, rg2.send, strict=True)])
        s2 = BatchSlots(rg=rg2, t=s.t, is_self=rg2.is_self, cand=s.cand[m], age=s.age[m], lag=s.lag[m],
                        count=s.count[m], local_count=s.local_count[m], q=s.q[m], u=s.u[m], key=s.key[m],
                        missed=s.missed[m])
        w1 = rule.weights(s, aggregating=agg)
        w2 = rule.weights(s2, aggregating=agg[inv])
        if rule.random:
            # random rules relabel their draws along with the clients except for slot order
            # inside a segment; compare the number of kept candidates instead
            k1 = np.bincount(rg.recv, weights=w1 > 0, minlength=n)
            k2 = np.bincount(rg2.recv, weights=w2 > 0, minlength=n)
            np.testing.assert_array_equal(k1[inv], k2)
        else:
            np.testing.assert_allclose(w1[m], w2, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 9), name=st.sampled_from(VARIANTS))
def test_batched_equals_one_receiver(seed, n, name):
    rule = parse_rule(name)
    rg, s, agg = random_instance(np.random.default_rng(seed), n)
    w = rule.weights(s, aggregating=agg)
    for i in np.flatnonzero(agg):
        sl = slice(rg.indptr[i], rg.indptr[i + 1])
        c = s.cand[sl]
        w1 = rule.weights_one(ages=s.age[sl][c], lags=s.lag[sl][c], counts=s.count[sl][c],
                              local_counts=s.local_count[sl][c], q_hat=s.q[sl][c], t=s.t,
                              u=float(s.u[sl][0]), keys=s.key[sl][c], missed=s.missed[sl][c])
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
    from sfg.staleness import init_state, update_state

    # two 3-client paths 0-1-2 with the same availability for clients 1, 2 but different mixing
    rg = RoundGraph.from_edges(3, np.array([[0, 1], [1, 2]]))

    def run(weights_round1):
        st0 = init_state(rg)
        allon = np.ones(3, bool)
        off0 = np.array([False, True, True])
        # round 0: client 0 offline, 1 and 2 keep their own models (local)
        w = rg.is_self.astype(float)
        cand = off0[rg.recv] & (rg.is_self | off0[rg.send])
        st1 = update_state(st0, rg, w, cand, trains=off0, adopts=off0)
        # round 1: everyone online; client 1 mixes with the given weights over (1, 0, 2)
        w = rg.is_self.astype(float)
        seg = slice(rg.indptr[1], rg.indptr[2])
        w[seg] = weights_round1
        cand = allon[rg.recv] & np.ones(rg.n_slots, bool)
        return update_state(st1, rg, w, cand, trains=allon, adopts=allon)

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
