"""The training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) measured by the networked nodes (sfg.net.diagnose): the
node on the virtual clock under async runs the clock engine's schedule (docs/concepts/clock.md#the-node-on-the-clock), so its
pooled diagnostics equal the engine's (sfg.clock.diagnostics) — counts exactly, sums up to the
order of addition; recording them never changes training; the lag law's per-round
normalisation over all nodes' pairs and the LATER rule are checked on hand-made local rounds."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from running import bounded

from sfg.net.diagnose import NodeDiagnostics, pool
from sfg.net.swarm import SwarmOptions
from sfg.net.virtual import run_virtual_swarm
from sfg.net.world import build_world
from sfg.sim.diagnostics import RETURN_COLUMNS

P = 600.0
# a window of 4 periods: messages wait whole periods, so candidates have waited ages >= 1 (the
# raw law's bins beyond 0, the fine-tuning's eligibility); N = 8 <= 16, so the clock engine
# fine-tunes every eligible receiver, as every node does
BASE = dict(rounds=30, local_steps=2, process="bursty:u=0.5", graph="knn:k=4", seed=2,
            eval_every=10, dataset="digits", model="mlp", backend="loop", n_clients=8,
            rule="sfg-l")
WORLD = {"compute": "const:value=30", "latency": "const:value=5"}
OPTS = SwarmOptions(mode="async", period=P, jitter=0.5, window=4.0)
ALL = "raw,lag,finetune,returning"

pytestmark = pytest.mark.crosspath


def _swarm(diagnostics: str | None, nodes: list | None = None, **settings) -> dict:
    world = build_world({**BASE, **settings, "diagnostics": diagnostics or ""})
    return bounded(lambda: run_virtual_swarm(world, OPTS, clock_settings=WORLD, nodes_out=nodes),
                   240, "the run hangs")


def _engine(diagnostics: str, **settings) -> dict:
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    return simulate_events(resolve_config({**BASE, **WORLD, **settings, "clock": "virtual",
                                           "protocol": "async", "period": P, "jitter": 0.5,
                                           "window": 4, "diagnostics": diagnostics}))


def _node_diagnostics(nodes: list) -> list:
    last = {nd.i: nd for nd in nodes}  # a restarted node's last object
    return [last[i].result()["diagnostics"] for i in sorted(last)]


# sums: every node adds its own measurements, the engine a batch of local rounds at a time:
# per-bin sums of float64 ratios agree up to the order of addition (measured: 2e-16
# relative); the losses are evaluated in float32 over a node's validation split alone, where
# the engine pads and reduces it in a chunk of several clients' splits (measured: 5e-8
# relative, a float32 ulp); counts are exact
RATIOS, LOSSES = 1e-12, 1e-6


def _same_block(got: dict, want: dict, columns, what: str, rtol: float = RATIOS) -> int:
    n = 0
    for col in columns:
        gc = np.trim_zeros(np.asarray(got[col]["count"]), "b")
        wc = np.trim_zeros(np.asarray(want[col]["count"]), "b")
        assert gc.tolist() == wc.tolist(), (what, col)
        k = len(gc)
        np.testing.assert_allclose(got[col]["sum"][:k], want[col]["sum"][:k], rtol=rtol,
                                   atol=1e-12, err_msg=f"{what} {col}")
        n += int(np.sum(gc))
    return n


def test_async_node_diagnostics_equal_the_clock_engines():
    """Same settings, async with P = Δ: the nodes' pooled diagnostics are the clock engine's
    for every kind (the fine-tuning's choice of at most 16 receivers keeps them all here)."""
    nodes: list = []
    res = _swarm(ALL, nodes)
    eng = _engine(ALL)
    assert np.array_equal(res["params"], eng["params"].numpy())  # the same schedule and models
    per_node = _node_diagnostics(nodes)
    json.dumps(per_node, allow_nan=False)  # what a node process hands the swarm
    got, want = pool(per_node), eng["diagnostics"]
    assert got["kinds"] == want["kinds"] == ["raw", "lag", "finetune", "returning"]
    assert _same_block(got["raw"], want["raw"], ["ratio"], "raw") > 0
    assert len(np.trim_zeros(np.asarray(want["raw"]["ratio"]["count"]), "b")) >= 2  # ages beyond 0 seen
    lag = got["lag"]
    assert lag["snapshots"] == want["lag"]["snapshots"] > 0
    for by in ("age", "lag"):
        assert _same_block(lag[by], want["lag"][by], ["ratio"], f"lag {by}") > 0
    for k in ("rho_age", "rho_lag", "rho_ratio"):
        assert math.isclose(lag[k], want["lag"][k], rel_tol=1e-9), k
    ft, wft = got["finetune"], want["finetune"]
    assert ft["receivers"] == wft["receivers"] > 0
    assert _same_block(ft, wft, ["before", "after"], "finetune") > 0
    assert _same_block(ft, wft, ["loss", "acc"], "finetune", LOSSES) > 0
    for k in ("own_loss", "own_acc"):
        assert ft[k][1] == wft[k][1] > 0
        assert math.isclose(ft[k][0], wft[k][0], rel_tol=LOSSES), k
    ret, wret = got["returning"], want["returning"]
    assert ret["returns"] == wret["returns"] > 0
    assert _same_block(ret, wret, RETURN_COLUMNS, "returning", LOSSES) > 0
    assert 0 < sum(ret["loss_later"]["count"]) < ret["returns"]


def test_node_diagnostics_are_computed_at_the_runs_precision():
    """precision=bf16 (the local training under bf16 autocast, sfg.sim.precision): a node's
    fine-tuning is the run's local training at the run's precision, as the clock engine's
    is, so the pooled fine-tuned geometry equals the engine's at bf16 — and is not the fp32
    run's (nor would a node fine-tuning in fp32 give the engine's bf16 numbers)."""
    nodes: list = []
    res = _swarm("finetune", nodes, precision="bf16")
    eng = _engine("finetune", precision="bf16")
    assert np.array_equal(res["params"], eng["params"].numpy())  # bf16 training, both
    got, want = pool(_node_diagnostics(nodes))["finetune"], eng["diagnostics"]["finetune"]
    assert got["receivers"] == want["receivers"] > 0
    assert _same_block(got, want, ["before", "after"], "finetune") > 0
    assert _same_block(got, want, ["loss", "acc"], "finetune", LOSSES) > 0
    for k in ("own_loss", "own_acc"):
        assert got[k][1] == want[k][1] > 0
        assert math.isclose(got[k][0], want[k][0], rel_tol=LOSSES), k
    fp32 = _engine("finetune")["diagnostics"]["finetune"]
    assert got["receivers"] == fp32["receivers"] and got["after"] != fp32["after"]


def test_diagnostics_never_change_the_nodes_training():
    with_ = _swarm(ALL)
    nodes: list = []
    without = _swarm(None, nodes)
    assert all(nd.diagnostics is None for nd in nodes)
    assert pool([None] * len(nodes)) is None
    assert np.array_equal(with_["params"], without["params"])
    assert [nd["acc"] for nd in with_["nodes"]] == [nd["acc"] for nd in without["nodes"]]


# ------------------------------------------------------------------ hand-made local rounds
class _Val:
    """A stand-in validation split: a model's loss is its first parameter, its accuracy its
    second."""

    def losses(self, P: torch.Tensor, owner) -> tuple[np.ndarray, np.ndarray]:
        P = P.double().numpy()
        return P[:, 0].copy(), P[:, 1].copy()


def _recorder(i: int, kinds: str, *, lockstep: bool = False, rounds: int = 100):
    return NodeDiagnostics(kinds.split(","), world=SimpleNamespace(seed=1), i=i,
                           lockstep=lockstep, unit=1.0, rounds=rounds, tools={"val": _Val()})


def _v(*x) -> np.ndarray:
    return np.array(x, np.float32)


def test_the_lag_law_normalises_each_round_over_every_nodes_pairs():
    """Round 5: node 0 (age 0, lag 0) holds node 1 (age 0, lag 0.2) at squared distance 4
    and node 2 (age 2, lag 2.6) at 9; node 1 (age 1, lag 1.0) holds node 0 (age 0, lag 0) at
    16. Against ages the round's zero-difference pairs are (0, 1) alone: mean 4, so bin 0
    holds 4/4 and bin 1 16/4, bin 2 9/4; against lags round(0.2) = 0, round(1.0) = 1,
    round(2.6) = 3: bin 0 = 1, bin 1 = 4, bin 3 = 9/4. Round 10 has no zero-difference pair
    against ages (nothing normalised there) but one against lags. A node alone would
    normalise by its own pairs; the pooled law by the round's."""
    a, b = _recorder(0, "lag"), _recorder(1, "lag")
    o = _v(0, 0)
    a.local_round(5, own=o, age=0, lag=0.0, senders=[2, 1], models=[_v(3, 0), _v(2, 0)],
                  ages=[2, 0], lags=[2.6, 0.2], self_weight=0.5, agg=o, trained=o)
    b.local_round(5, own=_v(4, 0), age=1, lag=1.0, senders=[0], models=[o], ages=[0],
                  lags=[0.0], self_weight=0.5, agg=o, trained=o)
    b.local_round(10, own=_v(1, 0), age=3, lag=0.4, senders=[0], models=[o], ages=[0],
                  lags=[0.0], self_weight=0.5, agg=o, trained=o)
    b.local_round(7, own=_v(9, 9), age=0, lag=0.0, senders=[0], models=[o], ages=[0],
                  lags=[0.0], self_weight=0.5, agg=o, trained=o)  # not a law round
    got = pool([json.loads(json.dumps(x.result())) for x in (a, b)])["lag"]
    assert got["age"]["ratio"] == {"sum": [1.0, 4.0, 2.25], "count": [1, 1, 1]}
    assert got["lag"]["ratio"] == {"sum": [2.0, 4.0, 0.0, 2.25], "count": [2, 1, 0, 1]}
    assert got["snapshots"] == 2
    alone = pool([json.loads(json.dumps(b.result()))])["lag"]
    assert alone["snapshots"] == 1 and alone["lag"]["ratio"]["count"] == [1]  # round 10 only


def test_lockstep_pairs_are_measured_once_by_the_lower_id():
    """Lockstep: both ends of a pair see the same start-of-round models and scalars; node 1
    does not measure its pair with node 0, node 0 does (as the rounds count a pair once)."""
    a, b = _recorder(0, "lag,raw", lockstep=True), _recorder(1, "lag,raw", lockstep=True)
    x0, x1 = _v(0, 0), _v(1, 1)
    a.local_round(0, own=x0, age=0, lag=0.0, senders=[1], models=[x1], ages=[0], lags=[0.0],
                  self_weight=0.5, agg=x0, trained=x0)
    b.local_round(0, own=x1, age=0, lag=0.0, senders=[0], models=[x0], ages=[0], lags=[0.0],
                  self_weight=0.5, agg=x0, trained=x0)
    got = pool([a.result(), b.result()])
    assert got["lag"]["age"]["ratio"] == {"sum": [1.0], "count": [1]}
    assert got["raw"]["ratio"] == {"sum": [2.0], "count": [2]}  # the raw law: per receiver


def test_returning_rounds_and_the_model_later():
    """Async on the node's clock (unit 1 here): node 0 returns at start 10 (age 3, done at 11):
    its model LATER = 5 units on is that of its last local round done by 15 — the one done at
    14.5, not the one done at 16; the return at 20 (done at 21) keeps its own model, the
    last done by 25. A return whose 5 units pass the horizon (32) has no model later; one
    still waiting at the end of the run takes the last model."""
    rec = _recorder(0, "returning", rounds=32)
    kw = dict(lag=0.0, senders=[1, 2], models=[_v(0.5, 0.25), _v(1.5, 0.75)], ages=[0, 1],
              lags=[0.0, 1.0])

    def rnd(start, end, age, trained, self_weight=0.5):
        rec.local_round(int(start), own=_v(7, 0.5), age=age, self_weight=self_weight,
                        agg=_v(2, 0.5), trained=trained, start=start, end=end, **kw)

    rnd(10, 11, 3, _v(3, 1), self_weight=0.25)  # returns: D = 3, q = 15
    rnd(12.5, 14.5, 0, _v(5, 1))               # done by 15: D = 3's model later
    rnd(15.5, 16, 0, _v(6, 1))                 # done after 15
    rnd(20, 21, 1, _v(8, 0))                   # returns: D = 1, q = 25: its own model
    rnd(26, 27, 2, _v(9, 0))                   # returns: D = 2, q = 31 <= 32
    rnd(28, 29, 4, _v(10, 0))                  # returns: D = 4, q = 33 > 32: none later
    got = rec.result()["returning"]
    assert got["returns"] == 4
    assert got["loss_stale"]["count"] == [0, 1, 1, 1, 1] and got["loss_stale"]["sum"][3] == 7.0
    assert got["loss_agg"]["sum"][3] == 2.0 and got["loss_trained"]["sum"][3] == 3.0
    assert got["loss_neighbours"]["sum"][3] == 1.0 and got["acc_neighbours"]["sum"][3] == 0.5
    assert got["self_weight"]["sum"][3] == 0.25
    # D = 2 waits past the last round: the run's last model (done at 29)
    assert got["loss_later"] == {"sum": [0.0, 8.0, 10.0, 5.0], "count": [0, 1, 1, 1]}


def test_lockstep_node_diagnostics_equal_sfg_runs():
    """Lockstep (docs/concepts/nodes.md#lockstep-mode) is the rounds' protocol: with zero compute time the nodes on the
    virtual clock give sfg run's models, and their pooled diagnostics are sfg run's (pairs
    once, by the lower id; LATER = the model after round t + 5)."""
    from sfg.sim.run import simulate

    nodes: list = []
    world = build_world({**BASE, "diagnostics": ALL})
    res = bounded(lambda: run_virtual_swarm(
        world, SwarmOptions(mode="lockstep", period=P, deadline=BASE["rounds"] * P),
        clock_settings={"compute": "const:value=0"}, nodes_out=nodes), 240, "the run hangs")
    ref = simulate({**BASE, "diagnostics": ALL}, backend="loop")
    assert np.array_equal(res["params"], ref.params.numpy())
    got, want = pool(_node_diagnostics(nodes)), ref.diagnostics
    assert _same_block(got["raw"], want["raw"], ["ratio"], "raw") > 0
    assert got["lag"]["snapshots"] == want["lag"]["snapshots"] > 0
    for by in ("age", "lag"):
        assert _same_block(got["lag"][by], want["lag"][by], ["ratio"], f"lag {by}") > 0
    assert got["finetune"]["receivers"] == want["finetune"]["receivers"] > 0
    assert _same_block(got["finetune"], want["finetune"], ["before", "after"], "finetune") > 0
    assert _same_block(got["finetune"], want["finetune"], ["loss", "acc"], "finetune",
                       LOSSES) > 0
    assert got["returning"]["returns"] == want["returning"]["returns"] > 0
    assert _same_block(got["returning"], want["returning"], RETURN_COLUMNS, "returning",
                       LOSSES) > 0


def test_a_node_fine_tunes_at_every_eligible_local_round():
    """Rounds and the clock fine-tune at most 16 receivers per round, chosen among all the
    eligible ones, which no node sees (with more than 16 the two cannot coincide); a node
    fine-tunes at each of its eligible local rounds: a multiple of 10, its own age 0, a
    candidate of age 0 and one of age >= 1. Here the "training" halves every model: the
    distances before (4 and 16) and after (1 and 4), each divided by the fresh one's."""
    rec = NodeDiagnostics(["finetune"], world=SimpleNamespace(seed=1), i=0, lockstep=False,
                          unit=1.0, rounds=100,
                          tools={"val": _Val(), "train": lambda P, xs, ys: P * 0.5,
                                 "train_batches": lambda i, t: (torch.zeros(2, 1, 1),
                                                                torch.zeros(2, 1))})
    o = _v(0, 0)
    kw = dict(lag=0.0, senders=[2, 1], models=[_v(0, 4), _v(2, 0)], lags=[1.0, 0.0],
              self_weight=0.5, agg=o, trained=o)
    rec.local_round(20, own=o, age=0, ages=[1, 0], **kw)  # eligible
    rec.local_round(25, own=o, age=0, ages=[1, 0], **kw)  # not a multiple of 10
    rec.local_round(30, own=o, age=1, ages=[1, 0], **kw)  # its own age is 1
    rec.local_round(40, own=o, age=0, ages=[0, 0], **kw)  # no candidate of age >= 1
    got = rec.result()["finetune"]
    assert got["receivers"] == 1
    assert got["before"] == {"sum": [1.0, 4.0], "count": [1, 1]}
    assert got["after"] == {"sum": [1.0, 4.0], "count": [1, 1]}
    assert got["loss"] == {"sum": [1.0, 0.0], "count": [1, 1]}  # the halved (1, 0), (0, 2)
    assert got["acc"] == {"sum": [0.0, 2.0], "count": [1, 1]}
    assert got["own_loss"] == [0.0, 1]
