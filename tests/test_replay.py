"""The vectorised replay against the per-client reference loop, and its analyses (docs/concepts/replay.md#model-free-analyses)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference import replay_reference

from sfg.errors import SfgError
from sfg.modelfree import build_scenario, horizon_pairs, replay, replay_config, replay_trace
from sfg.world.graphs import make_graph
from sfg.world.outages import make_process

RULES = ["dfedavg", "sfg", "sfg-l", "sfg-cut:L=2", "sfg-counts", "aoi+ipw", "dfl-aa",
         "limited-merging:L=2", "local-counts:L=1", "gl-age", "copy-random", "placebo-cut",
         "reset-on-return", "sfg-l:gamma=0+rounded", "pinned-receiver", "receiver-kept"]


def _close(a: dict, b: dict) -> None:
    for key, ref in b.items():
        got = a[key]
        if math.isnan(ref):
            assert math.isnan(got), key
        else:
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-9), key


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("process, link", [("iid:u=0.5", 0.0), ("bursty:u=0.6", 0.3)])
def test_vectorised_replay_equals_reference_loop(rule, process, link):
    g = make_graph("knn:k=3", 14, seed=3)
    avail = make_process(process).sample(60, 14, seed=3, positions=g.positions)
    fast = replay_trace(avail, g, rule, seed=3, link_failure=link, horizon=10)
    ref = replay_reference(avail, g, rule, seed=3, link_failure=link, horizon=10)
    _close(fast.metrics, ref)


def test_horizon_is_one_without_mixing():
    g = make_graph("ring", 6, seed=0)
    avail = np.ones((30, 6), bool)
    res = replay_trace(avail, g, "local", seed=0, horizon=5)
    assert res.metrics["H"] == pytest.approx(5.0)  # identity rows: every term is 1
    res = replay_trace(avail, g, "dfedavg", seed=0, horizon=1)
    assert res.metrics["H"] == pytest.approx(1.0)


def test_hand_computed_horizon_uniform_pair():
    # two clients always online, uniform averaging: [W^k]_ii = 1/2 for k >= 1
    from sfg.world.graphs import Graph

    g = Graph(n=2, edges=np.array([[0, 1]]), positions=None, name="pair")
    avail = np.ones((20, 2), bool)
    res = replay_trace(avail, g, "dfedavg", seed=0, horizon=4)
    assert res.metrics["H"] == pytest.approx(1 + 3 * 0.5)
    assert res.metrics["returning_aggregations"] == 0 and math.isnan(res.metrics["premise"])


def test_premise_and_self_weight_hand_case():
    # path 0-1; client 0 offline rounds 0-2, returns at round 3 with age 3 vs neighbour age 0
    from sfg.world.graphs import Graph

    g = Graph(n=2, edges=np.array([[0, 1]]), positions=None, name="pair")
    avail = np.ones((5, 2), bool)
    avail[0:3, 0] = False
    res = replay_trace(avail, g, "sfg:gamma=0.5", seed=0, horizon=0)
    m = res.metrics
    assert m["returning_aggregations"] == 1 and m["premise"] == 1.0
    assert m["self_weight_return"] == pytest.approx(0.125 / 1.125)
    assert m["unavailability"] == pytest.approx(3 / 10)


def test_sampled_horizon_for_large_trace():
    adopt = np.ones((200, 300), bool)
    pairs, sampled = horizon_pairs(adopt, 50, seed=1, exact_pairs=1000, sample=500)
    assert sampled and sum(v.size for v in pairs.values()) == 500
    pairs2, _ = horizon_pairs(adopt, 50, seed=1, exact_pairs=1000, sample=500)
    assert all(np.array_equal(pairs[k], pairs2[k]) for k in pairs)
    exact, sampled = horizon_pairs(adopt[:, :10], 50, seed=1)
    assert not sampled and sum(v.size for v in exact.values()) == 151 * 10


def test_replay_grid_shares_traces_and_is_deterministic():
    rows = replay(["iid:u=0.6", "bursty:u=0.8"], ["dfedavg", "sfg-cut"], [1, 2], n=30, T=80)
    assert len(rows) == 8
    again = replay(["iid:u=0.6", "bursty:u=0.8"], ["dfedavg", "sfg-cut"], [1, 2], n=30, T=80)
    assert rows == again
    by = {(r["process"], r["rule"], r["seed"]): r for r in rows}
    for p in ("iid:u=0.6", "bursty:u=0.8"):
        for s in (1, 2):
            # same trace for every rule (pairing): same unavailability and returns
            assert by[(p, "dfedavg", s)]["unavailability"] == by[(p, "sfg-cut", s)]["unavailability"]
            assert by[(p, "dfedavg", s)]["returning_aggregations"] == by[(p, "sfg-cut", s)]["returning_aggregations"]
    assert abs(by[("bursty:u=0.8", "dfedavg", 1)]["unavailability"] - 0.8) <= 0.005 + 1e-9


def test_sfg_cut_discounts_stale_receivers_more_than_dfedavg():
    g, avail = build_scenario("bursty:u=0.8", n=100, T=150, graph="knn:k=6", seed=1)
    d = replay_trace(avail, g, "dfedavg", seed=1, horizon=0).metrics
    c = replay_trace(avail, g, "sfg-cut", seed=1, horizon=0).metrics
    assert c["self_weight_return"] < d["self_weight_return"]
    assert c["kept"] < d["kept"]
    assert c["final_mean_lag"] < d["final_mean_lag"]


def test_anatomy_modes_change_ages():
    g, avail = build_scenario("bursty:u=0.5", n=40, T=60, graph="knn:k=4", seed=2)
    full = replay_trace(avail, g, "dfedavg", seed=2, horizon=0, anatomy="full").metrics
    comm = replay_trace(avail, g, "dfedavg", seed=2, horizon=0,
                        anatomy="cannot-communicate").metrics
    # clients that keep training never return stale
    assert comm["returning_aggregations"] == 0 and full["returning_aggregations"] > 0


def test_replay_config_shape():
    out = replay_config({"kind": "replay", "process": "iid:u=0.5", "rule": "sfg", "seed": 1,
                         "n_clients": 20, "rounds": 30, "horizon": 5})
    assert set(out) == {"metrics", "curves"} and len(out["curves"]["mean_lag"]) == 30


@pytest.mark.parametrize("kwargs, fragment", [
    ({"processes": ["bursty:u=1.2"]}, "u"),
    ({"processes": ["burst:u=0.8"]}, "did you mean 'bursty'"),
    ({"rules": ["sfg-cutt"]}, "did you mean 'sfg-cut'"),
    ({"rules": ["model-memory"]}, "reads model parameters"),
    ({"n": 6, "graph": "knn:k=0"}, "k"),  # (knn:k=6 at n=6 runs on k=5: test_short_runs)
])
def test_bad_input_is_one_line(kwargs, fragment):
    args = {"processes": ["iid:u=0.5"], "rules": ["sfg"], "seeds": [1], "n": 20, "T": 10}
    args.update(kwargs)
    with pytest.raises(SfgError) as e:
        replay(args.pop("processes"), args.pop("rules"), args.pop("seeds"), **args)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_stacked_lanes_give_exactly_what_each_lane_gives_alone():
    from sfg.modelfree import Lane, replay_batch
    from sfg.round.rules import parse_rule

    lanes = []
    for seed, proc in ((1, "iid:u=0.5"), (2, "bursty:u=0.7")):
        g, avail = build_scenario(proc, n=25, T=70, graph="knn:k=4", seed=seed)
        for r in ("sfg-cut", "copy-random", "dfedavg", "placebo-cut", "aoi+ipw"):
            lanes.append(Lane(avail, g, parse_rule(r), seed))
    stacked = replay_batch(lanes, link_failure=0.3, horizon=12)
    for ln, res in zip(lanes, stacked, strict=True):
        alone = replay_trace(ln.available, ln.graph, ln.rule, seed=ln.seed, link_failure=0.3,
                             horizon=12)
        _close(res.metrics, alone.metrics)
        assert res.curves == alone.curves
    rows = replay(["iid:u=0.5"], ["sfg", "dfedavg"], [1, 2], n=25, T=40, batch_clients=60,
                  horizon=10)
    rows_one = replay(["iid:u=0.5"], ["sfg", "dfedavg"], [1, 2], n=25, T=40, batch_clients=1,
                      horizon=10)
    assert rows == rows_one


def test_oracles_replay_and_train():
    """Oracle rules read A, which the replay tracks for them; stacked lanes agree."""
    from sfg.modelfree import Lane, replay_batch
    from sfg.round.rules import parse_rule

    g, avail = build_scenario("bursty:u=0.7", n=20, T=40, graph="knn:k=4", seed=3)
    lanes = [Lane(avail, g, parse_rule(r), 3) for r in ("oracle-gls", "dfedavg", "oracle-qp")]
    stacked = replay_batch(lanes, horizon=5)
    for ln, res in zip(lanes, stacked, strict=True):
        _close(res.metrics, replay_trace(avail, g, ln.rule, seed=3, horizon=5).metrics)
    gls, dfed = stacked[0].metrics, stacked[1].metrics
    assert gls["self_weight_return"] < dfed["self_weight_return"]  # stale receivers discounted
    from sfg.sim.run import simulate

    res = simulate(dict(dataset="digits", model="mlp", n_clients=12, rounds=4, local_steps=1,
                        batch_size=8, eval_every=2, graph="knn:k=3", process="bursty:u=0.6",
                        rule="oracle-gls", backend="batched"))
    assert np.isfinite(res.metrics["acc_mean"])
