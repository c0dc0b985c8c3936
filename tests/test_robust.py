"""Robust aggregators (+median, +trim, +scclip, +balance; sfg.sim.robust) and the model
attacks alie, ipm, dissensus (sfg.sim.attack_train), in training.

* each aggregator and each attack on a case computed by hand;
* what each defence changes without an attack: a consensus is left as it is by all four;
  +trim with beta=0, +scclip with delta=0, and +balance accepting everyone with alpha equal to
  the rule's self-weight are the weighted mean; +median is not (it is the median);
* tiny training runs: honest accuracy under sign-flip and ALIE (z=10) with each defence at
  least that without one (+scclip at the default delta=0.1 changes nothing there: the
  attackers hold more than delta of their receivers' neighbour weight);
* pairing: frac=0 is the run without attack bit for bit, same minibatches under every attack;
* parsing, the one-line refusals (replay, virtual clock async/event, nodes) and the CLI.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.round.attacks import check_rounds_only, parse_attack, place
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.sim.attack_train import (
    alie_z,
    clipped_gossip,
    dissensus,
    mix,
    robust_gossip,
    sent_models,
)
from sfg.sim.gossip import gossip


def _star(values, weights):
    """Receiver 0 with neighbours 1..k: models [k+1, D] (row 0 the receiver) and its slot
    weights in candidate order (self first, then the neighbours by index); the neighbours'
    own rows get equal weights."""
    X = torch.tensor(values, dtype=torch.float64)
    n = X.shape[0]
    rg = RoundGraph.from_edges(n, np.array([[0, j] for j in range(1, n)]))
    w = np.zeros(rg.n_slots)
    w[rg.indptr[0]:rg.indptr[1]] = weights
    for i in range(1, n):
        w[rg.indptr[i]:rg.indptr[i + 1]] = 0.5
    return X, rg, w


def _agg0(text, values, weights, *, t=0, rounds=10):
    """Receiver 0's aggregate under the rule ``text`` (only receiver 0 aggregates)."""
    X, rg, w = _star(values, weights)
    rows = np.zeros(rg.n, bool)
    rows[0] = True
    out = robust_gossip(X, X, rg, w, np.ones(rg.n_slots, bool), rows, parse_rule(text), t=t,
                        rounds=rounds)
    assert torch.equal(out[1:], X[1:])  # the others do not aggregate
    return out[0].numpy()


# ----------------------------------------------------------------------------- +median
def test_median_equal_weights_is_the_lower_median():
    # per coordinate: 4 candidates (even) -> the lower middle value; 5 -> the middle one
    got = _agg0("dfedavg+median", [[1.0, 7.0], [5.0, 2.0], [3.0, 9.0], [100.0, -4.0]],
                [0.25] * 4)
    np.testing.assert_array_equal(got, [3.0, 2.0])
    got = _agg0("dfedavg+median", [[1.0], [5.0], [3.0], [100.0], [4.0]], [0.2] * 5)
    np.testing.assert_array_equal(got, [4.0])


def test_weighted_median_half_mass_and_zero_weights():
    # cumulative weight reaches W/2 exactly at the first value: the lower weighted median
    np.testing.assert_array_equal(
        _agg0("dfedavg+median", [[0.0], [10.0], [20.0]], [0.5, 0.25, 0.25]), [0.0])
    np.testing.assert_array_equal(
        _agg0("dfedavg+median", [[0.0], [10.0], [20.0]], [0.4, 0.35, 0.25]), [10.0])
    # twelve weights 1/12 sum to 0.49999999999999994 at the sixth: still the lower median
    # (6), not 7 — the half-mass test's relative slack
    twelve = [[float(v)] for v in (7, 1, 12, 3, 9, 5, 2, 11, 4, 8, 6, 10)]
    np.testing.assert_array_equal(_agg0("dfedavg+median", twelve, [1 / 12] * 12), [6.0])
    # a candidate with weight 0 does not take part (the 1000 would be the median of 3)
    np.testing.assert_array_equal(
        _agg0("dfedavg+median", [[0.0], [1000.0], [1000.0]], [0.5, 0.5, 0.0]), [0.0])


# ----------------------------------------------------------------------------- +trim
def test_trimmed_mean_whole_and_partial_weights():
    five = [[0.0], [1.0], [2.0], [3.0], [100.0]]
    # beta = 0.2 of five equal weights: exactly one candidate per tail
    np.testing.assert_allclose(_agg0("dfedavg:beta=0.2+trim", five, [0.2] * 5), [2.0])
    # beta = 0.1: each extreme keeps half its weight: (0·.1 + (1+2+3)·.2 + 100·.1) / 0.8
    np.testing.assert_allclose(_agg0("dfedavg:beta=0.1+trim", five, [0.2] * 5), [14.0])
    # weighted: [0,.5] keeps .25 of value 0, [.5,.8] keeps .25 of 10, [.8,1] nothing of 20
    np.testing.assert_allclose(
        _agg0("dfedavg:beta=0.25+trim", [[0.0], [10.0], [20.0]], [0.5, 0.3, 0.2]), [5.0])
    # beta = 0 is the weighted mean
    np.testing.assert_allclose(
        _agg0("dfedavg:beta=0+trim", [[0.0], [10.0], [20.0]], [0.5, 0.3, 0.2]), [7.0])


# ----------------------------------------------------------------------------- +scclip
def test_scclip_adaptive_radius_and_clipped_update():
    # neighbours at distance 5, 10, 50, relative mass 1/3 each; delta = 0.4: the closest 0.6
    # of the mass = all of the first and 0.6 − 1/3 of the second:
    # tau² = (1/0.4)·(25/3 + (0.6 − 1/3)·100) = 87.5
    tau = math.sqrt(87.5)
    vals = [[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [30.0, 40.0]]
    got = _agg0("dfedavg:delta=0.4+scclip", vals, [0.25] * 4)
    want = 0.25 * np.array([3.0, 4.0]) * (1 + 2 * tau / 10 + 10 * tau / 50)
    np.testing.assert_allclose(got, want)
    # delta = 0: no clipping, the weighted mean
    np.testing.assert_allclose(_agg0("dfedavg:delta=0+scclip", vals, [0.25] * 4),
                               0.25 * np.array(vals).sum(axis=0))


def test_scclip_the_authors_code_radii_by_hand():
    """The authors' code's choices: scclip_rank=k, the k-th largest neighbour distance
    (k = 2, its adaptive default, clips only the farthest; k past the neighbour count: the
    smallest distance), and a fixed scclip_tau. Neighbours at distances 5, 10, 50, the
    differences (3, 4)·(1, 2, 10), weights 1/4."""
    vals = [[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [30.0, 40.0]]
    base = 0.25 * np.array([3.0, 4.0])

    def agg(params):
        return _agg0(f"dfedavg:{params}+scclip", vals, [0.25] * 4)

    np.testing.assert_allclose(agg("scclip_rank=2"), base * (1 + 2 + 10 * 10 / 50))
    np.testing.assert_allclose(agg("scclip_rank=1"), base * (1 + 2 + 10))      # no clipping
    np.testing.assert_allclose(agg("scclip_rank=5"), base * (1 + 2 * 5 / 10 + 10 * 5 / 50))
    np.testing.assert_allclose(agg("scclip_tau=2.5"),
                               base * (2.5 / 5 + 2 * 2.5 / 10 + 10 * 2.5 / 50))


def test_scclip_and_clip_share_the_clipping():
    """+clip is +scclip's clipping with the median radius: with a delta whose radius equals
    the median distance both give the same update."""
    vals = [[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [30.0, 40.0]]
    X, rg, w = _star(vals, [0.25] * 4)
    rows = np.array([True, False, False, False])
    cand = np.ones(rg.n_slots, bool)
    clip = clipped_gossip(X, X, rg, w, cand, rows)[0].numpy()  # radius: median distance 10
    # delta = 1/3 ... the closest 2/3: distances 5 and 10 -> tau² = 3·(25 + 100)/3 = 125
    sc = _agg0("dfedavg:delta=0.3333333333333333+scclip", vals, [0.25] * 4)
    t = math.sqrt(125.0)
    np.testing.assert_allclose(sc, 0.25 * np.array([3.0, 4.0]) * (1 + 2 + 10 * t / 50))
    np.testing.assert_allclose(clip, 0.25 * np.array([3.0, 4.0]) * (1 + 2 + 10 * 10 / 50))


# ----------------------------------------------------------------------------- +balance
def test_balance_acceptance_and_update():
    vals = [[3.0, 4.0], [3.3, 4.4], [6.0, 4.0], [-3.0, -4.0]]  # distances 0.5, 3, 10; ‖x‖ = 5
    # gamma 0.5: radius 2.5 at t = 0 -> only the first: 0.5·x + 0.5·x_1
    np.testing.assert_allclose(_agg0("dfedavg+balance", vals, [0.25] * 4), [3.15, 4.2])
    # at t = 5 of 10 the radius is 2.5·e^{-0.5} = 1.52: still the first only
    np.testing.assert_allclose(_agg0("dfedavg+balance", vals, [0.25] * 4, t=5), [3.15, 4.2])
    # gamma 1 (radius 5): the first two, with the rule's weights .3 and .1 renormalised
    got = _agg0("dfedavg:balance_gamma=1+balance", vals, [0.4, 0.3, 0.1, 0.2])
    np.testing.assert_allclose(got, 0.5 * np.array([3.0, 4.0]) + 0.5 * np.array([3.975, 4.3]))
    # the decay: kappa = 10 at t = 5 of 10 -> radius 5·e^{-5} = 0.034: nobody, x unchanged
    np.testing.assert_array_equal(
        _agg0("dfedavg:balance_gamma=1,balance_kappa=10+balance", vals, [0.25] * 4, t=5),
        [3.0, 4.0])
    # alpha 0.2 with gamma 0.05 (radius 0.25): nobody accepted, unchanged
    np.testing.assert_array_equal(
        _agg0("dfedavg:balance_gamma=0.05,balance_alpha=0.2+balance", vals, [0.25] * 4),
        [3.0, 4.0])


# ----------------------------------------------------------------------------- honest runs
def _ring(n=8, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn((n, d), generator=g, dtype=torch.float64)
    rg = RoundGraph.from_edges(n, np.array([[i, (i + 1) % n] for i in range(n)]))
    w = np.full(rg.n_slots, 1.0 / 3)
    return X, rg, w, np.ones(rg.n_slots, bool), np.ones(n, bool)


@pytest.mark.parametrize("text", ["dfedavg+median", "dfedavg+trim", "dfedavg+scclip",
                                  "dfedavg+balance"])
def test_a_consensus_is_left_unchanged(text):
    X, rg, w, cand, rows = _ring()
    C = X[:1].repeat(rg.n, 1)
    out = robust_gossip(C, C, rg, w, cand, rows, parse_rule(text), t=3, rounds=10)
    torch.testing.assert_close(out, C, rtol=0, atol=1e-15)


def test_without_attack_what_each_defence_changes():
    X, rg, w, cand, rows = _ring()
    mean = gossip(X, rg, w, rows)
    run = lambda text: robust_gossip(X, X, rg, w, cand, rows, parse_rule(text), t=0,  # noqa: E731
                                     rounds=10)
    torch.testing.assert_close(run("dfedavg:beta=0+trim"), mean)
    torch.testing.assert_close(run("dfedavg:delta=0+scclip"), mean)
    # everyone accepted and alpha = the rule's self-weight 1/3: the weighted mean
    torch.testing.assert_close(run("dfedavg:balance_gamma=1e9,balance_alpha="
                                   "0.3333333333333333+balance"), mean)
    # the median of three is not their mean: it is their middle value
    med = run("dfedavg+median")
    assert not torch.allclose(med, mean)
    nbr = torch.stack([X, X.roll(1, 0), X.roll(-1, 0)])  # self, i−1, i+1
    torch.testing.assert_close(med, nbr.median(dim=0).values, rtol=0, atol=0)


# ----------------------------------------------------------------------------- attacks
def _attack_world():
    """Attacker 3 with honest neighbours 0, 1, 2 and attacker neighbour 4."""
    X = torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 8.0], [9.0, 9.0], [-7.0, 7.0]],
                     dtype=torch.float64)
    rg = RoundGraph.from_edges(5, np.array([[0, 3], [1, 3], [2, 3], [3, 4]]))
    att = np.array([False, False, False, True, True])
    return X, rg, att


def test_alie_sends_mean_minus_z_std_of_its_honest_neighbours():
    X, rg, att = _attack_world()
    sent = sent_models(X, X, att, parse_attack("forge:frac=0.4,claim=honest,model=alie,z=1.5"),
                       seed=1, t=0, rg=rg)
    # mean (3, 4); unbiased std (2, √12); attacker 4 has no honest neighbour: its own model
    np.testing.assert_allclose(sent[3].numpy(), [3 - 1.5 * 2, 4 - 1.5 * math.sqrt(12)])
    np.testing.assert_array_equal(sent[4].numpy(), [-7.0, 7.0])
    torch.testing.assert_close(sent[:3], X[:3], rtol=0, atol=0)


def test_alie_z_max_by_hand():
    # n = 16, m = 2: s = 9 − 2 = 7, Φ⁻¹((14 − 7)/14) = Φ⁻¹(1/2) = 0
    assert alie_z(16, 2) == 0.0
    # n = 100, m = 10: s = 41, Φ⁻¹(49/90) = Φ⁻¹(0.5444), between Φ(0.11) = 0.5438 and 0.12
    assert 0.11 < alie_z(100, 10) < 0.113
    with pytest.raises(SfgError, match="z_max is undefined"):
        alie_z(10, 6)


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    X, rg, att = _attack_world()
    sent = sent_models(X, X, att, parse_attack("forge:frac=0.4,claim=honest,model=ipm"),
                       seed=1, t=0, rg=rg)
    np.testing.assert_allclose(sent[3].numpy(), [-0.3, -0.4])  # −0.1 · (3, 4)
    sent = sent_models(X, X, att, parse_attack("forge:claim=honest,model=ipm,epsilon=2"),
                       seed=1, t=0, rg=rg)
    np.testing.assert_allclose(sent[3].numpy(), [-6.0, -8.0])


def test_dissensus_is_per_receiver():
    # 0 at (0,0): honest 1 (2,0), 2 (0,4), attacker 3; 1 at (2,0): honest 0, attacker 3
    X = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [9.0, 9.0]], dtype=torch.float64)
    rg = RoundGraph.from_edges(4, np.array([[0, 1], [0, 2], [0, 3], [1, 3]]))
    w = np.zeros(rg.n_slots)
    for i in range(4):
        k = rg.indptr[i + 1] - rg.indptr[i]
        w[rg.indptr[i]:rg.indptr[i + 1]] = 1.0 / k
    att = np.array([False, False, False, True])
    cand, rows = np.ones(rg.n_slots, bool), np.ones(4, bool)
    S, cols = dissensus(X, X, rg, w, cand, rows, att, 1.5)
    to = {int(rg.recv[s]): S[cols[s]].numpy() for s in np.flatnonzero(rg.send == 3)
          if rg.recv[s] != 3}
    # receiver 0: h = ¼(2,0) + ¼(0,4) = (.5, 1), A = ¼ -> z = −1.5·(2, 4)
    np.testing.assert_allclose(to[0], [-3.0, -6.0])
    # receiver 1: h = ⅓(−2, 0), A = ⅓ -> z = (2,0) − 1.5·(−2, 0) = (5, 0)
    np.testing.assert_allclose(to[1], [5.0, 0.0])
    # plain gossip under it: x_i + (1 − ε)·h_i; the attacker keeps its own model
    out = mix(X, X, rg, w, cand, rows, att, parse_attack("forge:claim=honest,model=dissensus"),
              clip=False, seed=1, t=0)
    np.testing.assert_allclose(out[0].numpy(), [-0.25, -0.5])
    np.testing.assert_allclose(out[1].numpy(), [2.0 + 0.5 * 2 / 3, 0.0])  # h = (−⅔, 0)
    np.testing.assert_array_equal(out[3].numpy(), [9.0, 9.0])


# ----------------------------------------------------------------------------- training
TINY = dict(dataset="digits", model="mlp", n_clients=16, rounds=8, local_steps=2, batch_size=8,
            eval_every=4, process="bursty:u=0.6", graph="knn:k=4", seed=3, backend="loop")


def _train(**kw):
    from sfg.sim.run import simulate

    return simulate({**TINY, **kw})


DEFENDED = ["dfedavg+clip", "dfedavg+median", "dfedavg+trim", "dfedavg:delta=0.3+scclip",
            "dfedavg+scclip", "dfedavg+balance"]


@pytest.mark.parametrize("model", ["sign-flip", "alie,z=10"])
def test_defences_keep_honest_accuracy_under_attack(model):
    attack = f"forge:frac=0.2,claim=honest,model={model}"
    none = _train(rule="dfedavg", attack=attack).metrics["acc_honest_mean"]
    clean = _train(rule="dfedavg").metrics["acc_mean"]
    assert none < clean - 0.05  # the attack hurts
    got = {r: _train(rule=r, attack=attack).metrics["acc_honest_mean"] for r in DEFENDED}
    assert all(v >= none for v in got.values()), (none, got)
    # +scclip at delta = 0.1: the attackers hold more than a tenth of their receivers'
    # neighbour weight, so the closest 90 % include them and the radius lets them through
    assert got["dfedavg+scclip"] == pytest.approx(none, abs=1e-9)
    assert got["dfedavg:delta=0.3+scclip"] > none + 0.03


@pytest.mark.parametrize("model", ["alie", "ipm", "dissensus"])
def test_frac_zero_is_the_no_attack_run_and_attacks_are_paired(model):
    base = _train(rule="sfg-cut+median")
    zero = _train(rule="sfg-cut+median", attack=f"forge:frac=0,claim=fresh,model={model}")
    assert bool((zero.params == base.params).all())
    assert zero.meta["minibatch_digest"] == base.meta["minibatch_digest"]
    assert zero.metrics["acc_honest_mean"] == base.metrics["acc_mean"]
    hit = _train(rule="sfg-cut+median", attack=f"forge:frac=0.2,claim=fresh,model={model}")
    assert hit.meta["minibatch_digest"] == base.meta["minibatch_digest"]
    assert not bool((hit.params == base.params).all())
    att = place(parse_attack("forge:frac=0.2"), 16, np.zeros(16), seed=3)
    assert hit.metrics["acc_honest_mean"] == pytest.approx(float(hit.accuracy[~att].mean()))


def test_robust_runs_are_reproducible_and_differ_from_the_mean():
    a = _train(rule="dfedavg+trim")
    b = _train(rule="dfedavg+trim")
    assert bool((a.params == b.params).all())
    assert not bool((a.params == _train(rule="dfedavg").params).all())


# ----------------------------------------------------------------------------- parsing, refusals
@pytest.mark.parametrize("text, fragment", [
    ("dfedavg:beta=0.7+trim", "beta=0.7 must lie in [0, 0.5)"),
    ("dfedavg:delta=0.5+scclip", "delta=0.5 must lie in [0, 0.5)"),
    ("dfedavg:scclip_rank=1.5+scclip", "scclip_rank must be a whole number"),
    ("dfedavg:scclip_rank=2,delta=0.2+scclip", "give one of delta"),
    ("dfedavg:scclip_tau=-1+scclip", "scclip_tau=-1 must be >= 0"),
    ("sfg:scclip_rank=2", "scclip_rank is a parameter of the +scclip defence"),
    ("dfedavg:beta=0.1", "beta is a parameter of the +trim defence"),
    ("dfedavg:balance_alpha=2+balance", "must lie in [0, 1]"),
    ("dfedavg+median+clip", "at most one model-reading defence"),
    ("pwg+median", "only +catchup composes"),
    ("dfedavg+medain", "did you mean 'median'"),
])
def test_bad_robust_rules(text, fragment):
    with pytest.raises(SfgError) as e:
        parse_rule(text)
    assert fragment in str(e.value)


def test_defaults_and_flags():
    r = parse_rule("sfg-cut+trim")
    assert (r.robust, r.defence_param("beta"), r.clip, r.defence_flags) == ("trim", 0.2, False, 0)
    b = parse_rule("dfedavg+balance")
    assert [b.defence_param(k) for k in ("balance_gamma", "balance_kappa", "balance_alpha")] \
        == [0.5, 1.0, 0.5]
    assert parse_rule("dfedavg+scclip").defence_param("delta") == 0.1
    assert parse_rule("dfedavg+clip").robust is None
    a = parse_attack("forge:model=dissensus")
    assert (a.eps, parse_attack("forge:model=ipm").eps, parse_attack("forge:model=alie").z) \
        == (1.5, 0.1, None)


@pytest.mark.parametrize("text, fragment", [
    ("forge:model=alie,epsilon=1", "epsilon=1 is a parameter of model=ipm or model=dissensus"),
    ("forge:model=ipm,z=1", "z=1 is a parameter of model=alie"),
    ("forge:model=alie,z=-1", "z=-1 must be a number >= 0"),
    ("forge:model=ipm,epsilon=-1", "epsilon=-1 must be a number >= 0"),
])
def test_bad_model_attacks(text, fragment):
    with pytest.raises(SfgError) as e:
        parse_attack(text)
    assert fragment in str(e.value)


def test_refused_where_they_do_not_run():
    from sfg.experiments.config import make_config
    from sfg.modelfree import replay

    with pytest.raises(SfgError, match=r"\+median reads model parameters"):
        replay(["bursty:u=0.7"], ["sfg+median"], [1], n=8, T=5, graph="ring:k=1")
    with pytest.raises(SfgError, match=r"\+trim reads model parameters.*async"):
        make_config({"kind": "train", "rule": "sfg+trim", "clock": "virtual",
                     "protocol": "async"})
    with pytest.raises(SfgError, match=r"\+scclip reads model parameters.*replay"):
        make_config({"kind": "replay", "rule": "sfg+scclip"})
    make_config({"kind": "train", "rule": "sfg+trim", "clock": "virtual", "protocol": "lockstep"})
    for model in ("alie", "ipm", "dissensus"):
        with pytest.raises(SfgError, match=f"model={model} is computed in the round"):
            check_rounds_only(parse_attack(f"forge:model={model}"), "the networked nodes")
    from sfg.net.world import build_world

    with pytest.raises(SfgError, match=r"\+balance reads model parameters.*networked"):
        build_world({**TINY, "rule": "sfg+balance", "backend": "auto", "device": "cpu"})


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sfg.cli.main", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_run_and_bad_parameter():
    small = ["--dataset", "digits", "--model", "mlp", "-n", "16", "-T", "8", "-K", "1",
             "--graph", "knn:k=4", "-p", "bursty:u=0.6", "--eval-every", "3", "--json"]
    res = _cli("run", "--rule", "dfedavg+median", "--attack",
               "forge:frac=0.1,claim=honest,model=alie", *small)
    assert res.returncode == 0, res.stderr
    assert "acc_honest_mean" in res.stdout
    res = _cli("run", "--rule", "dfedavg:beta=0.7+trim", *small)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "beta=0.7" in lines[0], \
        res.stderr


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_the_clocks_events_refuse_the_robust_aggregators_even_called_directly(protocol):
    """Called from Python (no CLI, no run schema), the clock's async/event training and its
    event staleness refuse +median & co. with one line instead of ignoring them."""
    from sfg.clock.replay import EventStaleness
    from sfg.clock.schedule import make_schedule, make_world
    from sfg.clock.settings import make_settings
    from sfg.clock.train import simulate_events
    from sfg.errors import SfgError
    from sfg.round.rules import parse_rule
    from sfg.sim.run import resolve_config

    cfg = dict(dataset="digits", model="mlp", n_clients=8, rounds=4, local_steps=1,
               process="bursty:u=0.5", graph="knn:k=3", seed=1, eval_every=4, clock="virtual",
               protocol=protocol, compute="const:value=30", rule="dfedavg+median")
    with pytest.raises(SfgError, match=r"\+median reads model parameters"):
        simulate_events(resolve_config(cfg))
    cs = make_settings({"clock": "virtual", "protocol": protocol, "compute": "const:value=30"})
    world = make_world(cs, process="bursty:u=0.5", graph="knn:k=3", n=8, rounds=4, seed=1)
    sched = make_schedule(world, cs, local_steps=1, seed=1)
    with pytest.raises(SfgError, match=r"\+trim reads model parameters"):
        EventStaleness(parse_rule("sfg-cut+trim"), world, sched, seed=1)
