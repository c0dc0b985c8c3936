"""The networked node on the virtual clock (docs/concepts/clock.md#the-node-on-the-clock): ``sfg swarm
--clock virtual`` runs the deployable node's code (sfg.net.node) on the virtual loop, the
in-memory network and the batched trainer, and gives the same models as the clock's own engine
(async) and as ``sfg run`` (lockstep). Everything runs in this process on virtual time: no
sockets, no sleeping; every run is bounded by a wall-clock timeout."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from crosspath import assert_same_bits
from running import bounded

from sfg.errors import SfgError
from sfg.net.simclock import Deadlock, VirtualLoop, run_virtual
from sfg.net.swarm import SwarmOptions
from sfg.net.virtual import run_virtual_swarm
from sfg.net.world import build_world

P = 600.0
# 30 periods of 600 s: the virtual clock passes 2^14 s (where a fixed 1e-12 s timer
# resolution fell below the clock's float step and the loop spun at one instant)
BASE = dict(rounds=30, local_steps=2, process="bursty:u=0.5", graph="knn:k=6", seed=1,
            eval_every=10, dataset="digits", model="mlp", backend="loop")
WORLD = {"compute": "const:value=30", "latency": "const:value=2"}
# lockstep rounds follow the messages (docs/concepts/nodes.md#lockstep-mode): a node may wait for a neighbour many rounds
# behind, so the deadline (virtual seconds) is the run's T·P, as sfg swarm --clock virtual sets it
DEADLINE = BASE["rounds"] * P

pytestmark = pytest.mark.crosspath


def _bounded(fn, timeout: float = 120.0):
    return bounded(fn, timeout, "the run hangs")


def _world(n: int, rule: str, **over):
    return build_world({**BASE, "n_clients": n, "rule": rule, **over, "backend": "loop"})


# ------------------------------------------------------------------ async = the clock's engine
@pytest.mark.parametrize("n", [8, 32])
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg"])
def test_async_node_on_the_virtual_clock_equals_the_clocks_engine(n, rule):
    """Same seed, graph, data, trace, compute, network and rule: the node's async protocol on
    the virtual clock and sfg run --clock virtual --protocol async give the same models."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    world = _world(n, rule)
    opts = SwarmOptions(mode="async", period=P, jitter=0.5, window=1.0)
    res = _bounded(lambda: run_virtual_swarm(world, opts, clock_settings=WORLD))
    eng = simulate_events(resolve_config({**BASE, "n_clients": n, "rule": rule, **WORLD,
                                          "clock": "virtual", "protocol": "async",
                                          "period": P, "jitter": 0.5}))
    X, Y = res["params"], eng["params"].numpy()
    # bit-identical today (max |X - Y| == 0.0); the guarantee is 1e-5
    assert_same_bits(X, Y)
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    assert res["metrics"]["acc_mean"] == eng["metrics"]["acc_mean"]
    m = res["metrics"]
    assert m["messages"] == eng["metrics"]["messages"] > 0  # neighbour models aggregated
    assert m["virtual_seconds"] > 2 ** 14


def test_async_node_clips_as_the_clocks_engine_does():
    """+clip runs in the node (the rounds' own clipped steps): the same models as the engine's
    sfg-cut+clip, and not those of plain sfg-cut (the clipping happened)."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    opts = SwarmOptions(mode="async", period=P, jitter=0.5, window=1.0)
    res = _bounded(lambda: run_virtual_swarm(_world(8, "sfg-cut+clip"), opts,
                                             clock_settings=WORLD))
    plain = _bounded(lambda: run_virtual_swarm(_world(8, "sfg-cut"), opts, clock_settings=WORLD))
    eng = simulate_events(resolve_config({**BASE, "n_clients": 8, "rule": "sfg-cut+clip",
                                          **WORLD, "clock": "virtual", "protocol": "async",
                                          "period": P, "jitter": 0.5}))
    assert_same_bits(res["params"], eng["params"].numpy())
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    assert np.abs(res["params"] - plain["params"]).max() > 1e-4
    # lockstep: the rounds' clipped gossip of sfg run
    from sfg.sim.run import simulate

    lock = _bounded(lambda: run_virtual_swarm(
        _world(8, "sfg-cut+clip"), SwarmOptions(mode="lockstep", period=P, deadline=DEADLINE),
        clock_settings={"compute": "const:value=30"}))
    ref = simulate({**BASE, "n_clients": 8, "rule": "sfg-cut+clip"}, backend="loop")
    assert_same_bits(lock["params"], ref.params.numpy())
    assert [nd["acc"] for nd in lock["nodes"]] == ref.accuracy.tolist()


def test_async_equality_holds_with_a_finite_uplink_and_lognormal_devices():
    """Transfers take size ÷ uplink back to back (the world's message size, as the engine
    charges it), and devices' compute times differ: still the engine's models."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    world_set = {"compute": "lognormal:median=20,sigma=0.5", "latency": "const:value=1",
                 "uplink": "const:value=2000"}
    world = _world(8, "sfg-cut")
    res = _bounded(lambda: run_virtual_swarm(world, SwarmOptions(mode="async", period=P,
                                                                 jitter=0.3),
                                             clock_settings=world_set))
    eng = simulate_events(resolve_config({**BASE, "n_clients": 8, "rule": "sfg-cut",
                                          **world_set, "clock": "virtual",
                                          "protocol": "async", "period": P, "jitter": 0.3}))
    assert_same_bits(res["params"], eng["params"].numpy())
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    assert res["metrics"]["net_sent"] > 0


# message faults as events of the schedule: the engine draws the same faults for the same
# messages (counter-based per link and message, sfg.clock.faults) and keeps a neighbour's
# newest model when a delayed older one arrives after it, as the node does
FAULTS = ("faults:loss=0.1,delay=40,reorder=0.15,hold=700,dup=0.1,copies=2,corrupt=0.05,"
          "misroute=0.05,partition=0-2|3-5@3000-9000")


@pytest.mark.parametrize("n", [8, 32])
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg"])
def test_async_equality_holds_under_message_faults_and_a_lossy_world(n, rule):
    """Same settings plus --faults (loss, extra delay, reordering, duplicates, corruption,
    misrouting, a partition) and the world's per-link --loss: the node under the virtual
    clock and sfg run --clock virtual --protocol async --faults give the same models, and
    the faults did happen (some messages lost, corrupted, overtaken)."""
    from sfg.clock.faults import Faults
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    world_set = {**WORLD, "loss": "const:value=0.05"}
    world = _world(n, rule)
    opts = SwarmOptions(mode="async", period=P, jitter=0.5, window=1.0)
    res = _bounded(lambda: run_virtual_swarm(world, opts, clock_settings=world_set,
                                             faults=Faults.parse(FAULTS, seed=5)))
    eng = simulate_events(resolve_config({**BASE, "n_clients": n, "rule": rule, **world_set,
                                          "clock": "virtual", "protocol": "async",
                                          "period": P, "jitter": 0.5, "faults": FAULTS,
                                          "faults_seed": 5}))
    assert_same_bits(res["params"], eng["params"].numpy())
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    assert res["metrics"]["messages"] == eng["metrics"]["messages"] > 0
    f, m = res["faults"], res["metrics"]
    assert f["lost"] > 0 and f["partitioned"] > 0 and f["corrupted"] > 0
    assert f["reordered"] > 0 and f["duplicated"] > 0 and m["net_lost_random"] > 0
    assert sum(nd["rejected"].get("digest", 0) for nd in res["nodes"]) > 0
    # another faults seed: other faults, other models (the faults reach the models)
    other = simulate_events(resolve_config({**BASE, "n_clients": n, "rule": rule, **world_set,
                                            "clock": "virtual", "protocol": "async",
                                            "period": P, "jitter": 0.5, "faults": FAULTS,
                                            "faults_seed": 6}))
    assert np.abs(other["params"].numpy() - eng["params"].numpy()).max() > 1e-4


def test_the_engine_keeps_a_neighbours_newest_model_when_an_older_one_arrives_later():
    """Hand-built: device 0 sends rounds 0 and 1 to device 1; the first is held back past
    the second's arrival. At device 1's next wake the held message is round 1's (the newest),
    waited from its own arrival, and round 0's late arrival does not replace it."""
    from sfg.clock.schedule import held_latest, newest_so_far

    ptr = np.array([0, 3])                     # one slot, three messages sorted by arrival
    arrival = np.array([10.0, 12.0, 20.0])     # rounds 1, 2 arrive; round 0 arrives last
    sender = np.array([5, 9, 2])               # sending events: 2 (round 0) < 5 < 9
    newest = np.empty(3, np.int64)
    newest_so_far(ptr, sender, np.zeros(3, bool), newest)
    assert newest.tolist() == [0, 1, 1]
    idx, wait = np.empty(3, np.int64), np.empty(3)
    sent = arrival - 1.0
    held_latest(ptr, arrival, sent, newest, np.zeros(3), np.zeros(3, np.int64),
                np.array([11.0, 25.0, 9.0]), 100.0, 1.0, idx, wait)
    assert idx.tolist() == [0, 1, -1] and wait.tolist() == [1.0, 13.0, 0.0]
    held_latest(ptr, arrival, sent, newest, np.zeros(3), np.zeros(1, np.int64), np.array([25.0]),
                6.0, 2.0, idx, wait)
    assert idx[0] == -1  # the newest is older than the window: nothing (not round 0's copy)


# ------------------------------------------------------------------ lockstep = sfg run
@pytest.mark.parametrize("n,compute", [(8, "const:value=30"), (32, "const:value=0")])
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg"])
def test_lockstep_node_on_the_virtual_clock_equals_sfg_run(n, compute, rule):
    """Zero latency, K·c shorter than a round: the node's lockstep on the virtual clock,
    sfg run --clock virtual (lockstep) and plain sfg run --backend loop give the same models.
    (With compute > 0 a lockstep node waiting for a neighbour rounds behind polls it every
    pull_after = 0.5 virtual seconds: the N = 32 case keeps compute 0 to stay fast.)"""
    from sfg.sim.run import simulate

    cfg = {**BASE, "n_clients": n, "rule": rule}
    world = _world(n, rule)
    res = _bounded(lambda: run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=P,
                                                                    deadline=DEADLINE),
                                             clock_settings={"compute": compute}))
    clock = simulate({**cfg, "clock": "virtual", "protocol": "lockstep", "compute": compute},
                     backend="loop")
    plain = simulate(cfg, backend="loop")
    X = res["params"]
    for ref in (clock, plain):
        assert_same_bits(X, ref.params.numpy())
        assert [nd["acc"] for nd in res["nodes"]] == ref.accuracy.tolist()
    assert res["metrics"]["messages"] == plain.metrics["messages"] > 0
    # the messages sent and their nominal bytes, as the lockstep clock counts them (a round
    # follows the messages, not the clock: no send is lost to the node's virtual time)
    for k in ("messages_sent", "bytes"):
        assert res["metrics"][k] == clock.metrics[k] > 0, k
    assert res["metrics"]["net_lost_sender"] == 0


@pytest.mark.parametrize("rule", ["sfg-cut", "sfg-l+ipw", "aoi"])
def test_lockstep_node_weights_are_sfg_runs_bit_for_bit(rule):
    """The model-free trajectory, exactly: every weight every node gave every candidate in
    every round is the one sfg run's round gave (float64, bit for bit). A node's staleness
    update replays its own weights as given (kernel.WEIGHTS_GIVEN): normalising them once more
    moved lags by an ulp from round 25 on (N = 32, sfg-cut), which a comparison of trained
    float32 parameters does not see."""
    from sfg.sim.run import simulate

    n = 32
    nodes: list = []
    res = _bounded(lambda: run_virtual_swarm(
        _world(n, rule), SwarmOptions(mode="lockstep", period=P, deadline=DEADLINE),
        clock_settings={"compute": "const:value=0"}, nodes_out=nodes, record_headers=True))
    plain = simulate({**BASE, "n_clients": n, "rule": rule}, record_weights=True)
    assert_same_bits(res["params"], plain.params.numpy())
    rg = nodes[0].world.rg
    checked = 0
    for nd in nodes:
        for rec in nd.weights:
            i, wl = rec["receiver"], plain.weights_log[rec["round"]]
            seg = slice(rg.indptr[i], rg.indptr[i + 1])
            engine = dict(zip(rg.send[seg].tolist(), wl[seg].tolist(), strict=True))
            node = dict(zip(rec["candidates"], rec["weights"], strict=True))
            for j in set(engine) | set(node):
                assert engine.get(j, 0.0) == node.get(j, 0.0), (rec["round"], i, j)
                checked += 1
    assert checked > 1000


@pytest.mark.parametrize("attack", ["forge:frac=0.25,claim=fresh",
                                    "forge:frac=0.25,claim=stale-others"])
def test_lockstep_liars_know_what_sfg_run_says_they_observed(attack):
    """A forging node knows only the claims it received (sfg.net.node: each neighbour's last
    count); sfg run's default liar (knowledge=observed, sfg.round.attacks.Heard) knows the
    same, so the models are equal under a count-reading rule — and the omniscient
    knowledge=rushing liar of the rounds is another adversary (its models differ)."""
    from sfg.sim.run import simulate

    cfg = {**BASE, "n_clients": 8, "rule": "sfg-counts", "attack": attack}
    world = _world(8, "sfg-counts", attack=attack)
    res = _bounded(lambda: run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=P,
                                                                    deadline=DEADLINE),
                                             clock_settings={"compute": "const:value=30"}))
    plain = simulate(cfg, backend="loop")
    assert_same_bits(res["params"], plain.params.numpy())
    assert [nd["acc"] for nd in res["nodes"]] == plain.accuracy.tolist()
    rushing = simulate({**cfg, "attack": attack + ",knowledge=rushing"}, backend="loop")
    assert np.abs(res["params"] - rushing.params.numpy()).max() > 1e-3


def lockstep_under_every_fault(world) -> dict:
    """``world`` (12 rounds) in lockstep on the virtual clock under loss, delay, reordering,
    duplicates, corruption, misrouting, drift and two crashes with restarts."""
    from sfg.clock.faults import Faults

    faults = Faults.parse("faults:loss=0.15,delay=20,reorder=0.1,dup=0.1,corrupt=0.05,"
                          "misroute=0.05,drift=0.01,crash=1@150;2@300,downtime=100", seed=2)
    return _bounded(lambda: run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=P,
                                                                     deadline=12 * P),
                                              clock_settings={"compute": "const:value=30"},
                                              faults=faults), 240)


@pytest.mark.parametrize("n", [8, 32])
def test_lockstep_node_under_every_fault_still_equals_sfg_run(n):
    """Lockstep rounds follow the messages (docs/concepts/nodes.md#lockstep-mode): a lost, delayed, duplicated,
    corrupted or misrouted push is pulled again, a crashed node resumes from its checkpoint
    and redoes its round, clocks drift. The models are sfg run's, faults or not."""
    from sfg.sim.run import simulate

    cfg = {**BASE, "n_clients": n, "rule": "sfg-cut", "rounds": 12}
    res = lockstep_under_every_fault(_world(n, "sfg-cut", rounds=12))
    plain = simulate(cfg, backend="loop")
    assert_same_bits(res["params"], plain.params.numpy())
    assert [nd["acc"] for nd in res["nodes"]] == plain.accuracy.tolist()
    f = res["faults"]
    assert f["lost"] > 0 and f["corrupted"] > 0 and f["restarts"] >= 1, f


def test_lockstep_stragglers_are_unavailable_in_their_rounds():
    """Devices whose K steps do not fit in a round are stragglers (the lockstep schedule's
    participants, a function of the world): the node world drops them exactly as the clock's
    lockstep does, and messages that arrive within the round count (latency 5 s)."""
    from sfg.sim.run import simulate

    world_set = {"compute": "lognormal:median=300,sigma=0.5", "latency": "const:value=5"}
    cfg = {**BASE, "n_clients": 8, "rule": "sfg-cut", "rounds": 12, "eval_every": 12}
    world = build_world({**cfg, "backend": "loop"})
    res = _bounded(lambda: run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=P,
                                                                 deadline=DEADLINE),
                                             clock_settings=world_set))
    clock = simulate({**cfg, **world_set, "clock": "virtual", "protocol": "lockstep"},
                     backend="loop")
    assert_same_bits(res["params"], clock.params.numpy())
    # there are stragglers: fewer participants than the trace's available devices
    assert res["metrics"]["unavailability"] > 1 - world.available.mean()
    assert res["metrics"]["unavailability"] == pytest.approx(clock.metrics["unavailability"])


def test_lockstep_refuses_a_world_where_messages_would_be_late():
    world = _world(8, "sfg-cut", rounds=6, eval_every=6)
    with pytest.raises(SfgError, match="after their round's deadline"):
        run_virtual_swarm(world, SwarmOptions(mode="lockstep", period=P),
                          clock_settings={"latency": "const:value=700"})


# ------------------------------------------------------------------ the batched trainer
def test_batched_trainer_batches_and_equals_training_one_by_one():
    """With jitter the wakes are spread over the period; requests made before the first
    result falls due (K·c = 60 s later) are trained together. Batches of one give the same
    models, and so do batches split over the worker threads instead of trained in one."""
    world = _world(16, "sfg-cut", rounds=12, eval_every=12)
    opts = SwarmOptions(mode="async", period=P, jitter=0.05)

    def run(**kw):
        return run_virtual_swarm(world, opts, clock_settings=WORLD, trainer_options=kw)

    batched, single, threads = _bounded(lambda: (run(), run(max_batch=1), run(serial_below=0)))
    mb, ms = batched["metrics"], single["metrics"]
    assert mb["train_requests"] == ms["train_requests"] > 0
    assert mb["train_batches"] < mb["train_requests"] / 2  # really batched
    assert ms["train_batches"] == ms["train_requests"]       # one by one
    for other in (single, threads):
        # equal bit for bit today; the guarantee is 1e-5
        assert_same_bits(batched["params"], other["params"])
        assert [n["acc"] for n in batched["nodes"]] == [n["acc"] for n in other["nodes"]]


def test_deferred_batched_evaluation_equals_evaluating_each_model_at_once(monkeypatch):
    """The virtual swarm evaluates the nodes' models later, in batches (their accuracies are
    read only at the end): every curve point and final accuracy equals evaluating each
    model when it was made, with batches as small as 3 models (a crash and restart too:
    the restored curve's points are filled in order)."""
    import sfg.net.virtual as virtual
    from sfg.clock.faults import Faults

    world = _world(12, "sfg-cut", rounds=16, eval_every=4)
    opts = SwarmOptions(mode="async", period=P, jitter=0.5)
    faults = Faults.parse("faults:crash=3@2500;7@5000,downtime=900", seed=1)

    def run(**kw):
        return run_virtual_swarm(world, opts, clock_settings=WORLD, faults=faults,
                                 trainer_options=kw)

    now = _bounded(lambda: run(defer_eval=False))
    monkeypatch.setattr(virtual, "EVAL_BATCH", 3)
    later = _bounded(lambda: run())
    assert later["faults"]["restarts"] == 2
    assert later["curves"] == now["curves"] and len(now["curves"]["hours"]) == 4
    assert not np.isnan(later["curves"]["acc_p10"]).any()
    assert [nd["acc"] for nd in later["nodes"]] == [nd["acc"] for nd in now["nodes"]]
    assert later["metrics"]["acc_mean"] == now["metrics"]["acc_mean"]


def test_bound_round_refuses_inputs_it_would_have_to_copy():
    """A bound round runs on the caller's own buffers; an input it would have to convert
    (and so would not see the caller's later writes) is refused."""
    from sfg.round import kernel
    from sfg.round.rules import parse_rule
    from sfg.round.slots import RoundGraph

    rg = RoundGraph.from_edges(3, np.array([[0, 1], [0, 2]]))
    n, E = 3, rg.n_slots
    st, lags, q = np.zeros((4, n), np.int64), np.zeros(n), np.ones(E)
    w, cand, facts = np.empty((1, E)), np.empty(E, bool), np.empty((1, n, len(kernel.FACTS)))
    r = parse_rule("sfg-cut")
    args = (kernel.NONE_B, kernel.NONE_F, kernel.NONE_F, st, lags, q, w, cand, facts)
    caps = np.ones((4, 1, n), bool)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel.bound_rounds(r.fn, np.array(r.args, np.float64), 0.0, False, False, 0, 0.0, 0.0, rg,
                            caps.astype(np.int8), *args)
    step = kernel.bound_rounds(r.fn, np.array(r.args, np.float64), 0.0, False, False, 0, 0.0, 0.0, rg,
                               caps, *args)
    step(0)
    assert st[0].tolist() == [0, 0, 0] and np.allclose(w.sum(), n)


@pytest.mark.parametrize("rule", ["sfg-cut", "sfg-l+guard", "dfedavg", "aoi", "copy-random"])
def test_star_update_through_the_compiled_round_directly_equals_play_round(rule):
    """A node's staleness update (Star.advance) calls the compiled round with buffers made
    once; it equals play_round's on random states, online and offline (copy-random draws:
    the star then goes through play_round itself)."""
    from sfg.net.checkpoints import NodeState, Star
    from sfg.round.rules import parse_rule

    rng = np.random.default_rng(7)
    for deg in (1, 4, 9):
        fast, ref = Star(deg, parse_rule(rule)), Star(deg, parse_rule(rule))
        ref._direct_ok = False  # play_round, as before
        k = deg + 1
        s = NodeState(q_hat=[1.0] * deg)
        for _ in range(300):
            on = bool(rng.random() < 0.5)
            cand = (rng.random(k) < 0.6) & on
            cand[0] = on
            w = rng.random(k) * cand if on else np.eye(k)[0]
            kw = dict(cand=cand, weights=w / w.sum(), ages=rng.integers(0, 6, k),
                      lags=rng.random(k) * 6, counts=rng.integers(1, 60, k),
                      local_counts=rng.integers(1, 30, k))
            got, want = fast.advance(s, available=on, **kw), ref.advance(s, available=on, **kw)
            assert got == want
            s = got
        assert s.t == 300 and s.age > 0


@pytest.mark.parametrize("rule", ["sfg-cut", "sfg-l+guard", "dfedavg", "aoi+ipw", "copy-random"])
def test_owed_offline_rounds_applied_at_once_equal_one_round_at_a_time(rule):
    """A node applies a run of offline rounds when its state is next read, in one call of the
    compiled round (blocks of OFFLINE_BLOCK): the state equals m offline rounds applied one
    by one through play_round, for runs longer and shorter than a block, between online
    rounds that change q̂, counts and lags."""
    from sfg.net.checkpoints import OFFLINE_BLOCK, NodeState, Star
    from sfg.round.rules import parse_rule

    rng = np.random.default_rng(3)
    for deg in (1, 5):
        fast, ref = Star(deg, parse_rule(rule)), Star(deg, parse_rule(rule))
        ref._direct_ok = False
        k = deg + 1
        s = r_s = NodeState(q_hat=[1.0] * deg)
        for m in (1, 2, 7, OFFLINE_BLOCK, OFFLINE_BLOCK + 3, 3 * OFFLINE_BLOCK + 1, 0, 5):
            cand = rng.random(k) < 0.6
            cand[0] = True
            w = rng.random(k) * cand
            kw = dict(cand=cand, weights=w / w.sum(), ages=rng.integers(0, 6, k),
                      lags=rng.random(k) * 6, counts=rng.integers(1, 60, k),
                      local_counts=rng.integers(1, 30, k))
            s, r_s = fast.advance(s, available=True, **kw), ref.advance(r_s, available=True, **kw)
            s = fast.advance_offline(s, m)
            for _ in range(m):
                r_s = ref.advance(r_s, available=False, **ref.offline)
            assert s == r_s, (m, s, r_s)
        assert s.age > 0 and s.t > 4 * OFFLINE_BLOCK


# ------------------------------------------------------------------ nothing waits forever
def test_lockstep_neighbour_that_never_sends_is_the_deadline_error_not_a_hang():
    """Node 0 is cut off from everyone for the whole run (every push and every pull's reply
    dropped): its neighbours hit their deadline in virtual seconds; the run stops at once
    with the node's one-line error."""
    world = _world(6, "sfg-cut", rounds=6, eval_every=6, graph="ring:k=1")
    opts = SwarmOptions(mode="lockstep", period=P, deadline=120.0)
    with pytest.raises(SfgError, match=r"did not get the round-0 models .* within 120 s") as e:
        _bounded(lambda: run_virtual_swarm(world, opts,
                                           faults="faults:partition=0|*@0-1000000"), 60)
    assert "\n" not in str(e.value) and "[0]" in str(e.value) or "node 0 " in str(e.value)


def test_a_loop_with_nothing_scheduled_raises_deadlock():
    async def wait_forever():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock, match="wait forever"):
        _bounded(lambda: run_virtual(wait_forever()), 30)
    # and the clock jumps: an hour of virtual sleep takes no time
    loop = VirtualLoop()
    assert _bounded(lambda: run_virtual(asyncio.sleep(3600.0, "woke"), loop=loop), 10) == "woke"
    assert loop.time() == 3600.0
    loop.close()


# ------------------------------------------------------------------ the CLI
def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


SWARM = ["swarm", "--clock", "virtual", "-n", "8", "-T", "12", "--eval-every", "6",
         "-K", "2", "-p", "bursty:u=0.5"]


def test_cli_virtual_swarm_prints_the_swarms_json_and_is_byte_identical_across_runs(capsys):
    args = [*SWARM, "--protocol", "async", "--jitter", "0.5", "--compute", "const:value=30",
            "--latency", "const:value=2", "--loss", "const:value=0.1",
            "--faults", "faults:delay=5,dup=0.1", "--faults-seed", "3", "--json"]
    first = _bounded(lambda: _cli(args, capsys))
    second = _bounded(lambda: _cli(args, capsys))
    assert first[0] == 0 and second[0] == 0, first[2]
    assert first[1] == second[1]  # byte-identical JSON
    out = json.loads(first[1])
    assert set(out) >= {"config", "metrics", "curves", "nodes"} and "params" not in out
    assert len(out["nodes"]) == 8 and "wall_seconds" not in out["metrics"]
    m = out["metrics"]
    assert m["messages"] > 0 and m["train_batches"] <= m["train_requests"]
    # --loss is the world's (per link, drawn as sfg run --clock virtual draws it), next to
    # --faults' own keys
    assert m["net_lost_random"] > 0 and out["faults"]["lost"] == 0
    assert out["faults"]["duplicated"] > 0
    assert out["config"]["clock"] == "virtual" and out["config"]["faults_seed"] == 3
    other = _bounded(lambda: _cli([*args[:-3], "--faults-seed", "4", "--json"], capsys))
    assert other[0] == 0 and other[1] != first[1]  # another faults seed, another run


def test_cli_virtual_lockstep_runs_the_lockstep_schedule(capsys):
    code, out, err = _bounded(lambda: _cli([*SWARM, "--protocol", "lockstep", "--rule", "dfedavg",
                                             "--json"], capsys))
    assert code == 0, err
    from sfg.sim.run import simulate

    got = json.loads(out)
    ref = simulate({**BASE, "n_clients": 8, "rounds": 12, "eval_every": 6, "rule": "dfedavg"},
                   backend="loop")
    assert got["metrics"]["acc_mean"] == ref.metrics["acc_mean"]
    assert got["config"]["deadline"] == 12 * P  # virtual seconds: the run's T·P


@pytest.mark.parametrize("extra,needle", [
    (["--crash", "1@3r"], "--crash in rounds is for real nodes"),
    (["--cut", "0|1@2r-3r"], "--cut in rounds is for real nodes"),
    (["--tls-dir", "/nonexistent"], "--tls-dir is for real nodes"),
    (["--protocol", "lockstep", "--latency", "const:value=700"], "after their round's deadline"),
    (["--protocol", "lockstep", "--loss", "const:value=0.5"], "does not implement loss="),
    (["--protocol", "async", "--compute", "const:value=400"], "not longer than"),
    (["--compute", "const:value=-1"], "compute"),
    (["--period", "0"], "--period must be > 0"),
    (["--jitter", "1.5"], "jitter"),
])
def test_cli_virtual_swarm_bad_input_is_one_line_and_exit_2(extra, needle, capsys):
    code, _, err = _bounded(lambda: _cli([*SWARM, *extra], capsys), 60)
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in err, err


@pytest.mark.parametrize("args,needle", [
    (["swarm", "-n", "8", "--compute", "const:value=3"], "add --clock virtual"),
    (["swarm", "-n", "8", "--clock", "sundial"], "choose rounds"),
])
def test_cli_world_flags_need_the_virtual_clock(args, needle, capsys):
    code, _, err = _cli(args, capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_the_node_world_takes_the_runs_partition_as_sfg_run_does():
    """build_world splits the data with the run's partition (it used to take the default
    Dirichlet split whatever the settings said): the same clients' data as sfg run."""
    from sfg.world.data import load_federated

    world = _world(12, "sfg-cut", partition="classes:k=1")
    want = load_federated("digits", n_clients=12, seed=1, partition="classes:k=1")
    for got_y, want_y in zip(world.data.train_y, want.train_y, strict=True):
        assert got_y.tolist() == want_y.tolist()
    assert all(len(set(y.tolist())) == 1 for y in world.data.train_y)  # one class each


def test_a_wake_offline_while_still_training_is_an_offline_wake_not_a_skipped_one():
    """Local rounds longer than the period (lognormal compute, median 60 s, K = 2, P = 600 s
    with a heavy tail): a wake that falls in an offline row while the node is still busy
    is that row's offline wake, as on the clock's engine, not a skipped one; the node and
    the engine count the same skipped wakes (and give the same models)."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    world_set = {"compute": "lognormal:median=60,sigma=1", "latency": "const:value=2"}
    over = {"graph": "knn:k=4", "seed": 2, "rounds": 20}
    world = _world(20, "sfg-l", **over)
    res = _bounded(lambda: run_virtual_swarm(
        world, SwarmOptions(mode="async", period=P, jitter=0.5, window=1.0),
        clock_settings=world_set))
    eng = simulate_events(resolve_config({**BASE, "n_clients": 20, "rule": "sfg-l", **over,
                                          **world_set, "clock": "virtual",
                                          "protocol": "async", "period": P, "jitter": 0.5}))
    assert_same_bits(res["params"], eng["params"].numpy())
    assert res["metrics"]["skipped"] == eng["metrics"]["skipped"] > 0
    assert eng["metrics"]["unfinished"] + eng["metrics"]["interrupted"] > 0  # long rounds
