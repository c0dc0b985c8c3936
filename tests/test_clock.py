"""The virtual clock (docs/concepts/clock.md#the-virtual-clock) against the round-based system and its own guarantees.

* lockstep with zero compute time and latency is ``sfg run`` / the round-based replay, number
  for number, for rules, anatomy modes, link failures and attacks (docs/concepts/clock.md#the-three-protocols);
* stragglers, late and lost messages really drop out, in the replay and in training;
* the schedule's digest is the same for every rule and changes with the schedule's settings;
  same seed ⇒ bit-identical results, whatever the thread count (docs/concepts/clock.md#pairing-and-the-schedule-digest);
* the invariants of docs/concepts/staleness.md#invariants in every candidate and every header on random small worlds (hypothesis);
* pairing on the clock (docs/concepts/training.md#pairing, docs/concepts/clock.md#pairing-and-the-schedule-digest): what the rule can and cannot change under async and event;
* bad settings: one ``error:`` line, exit status 2, through the command line;
* grids with ``clock: virtual``, and run ids of round-based configs unchanged by the new keys.

The hand-computed schedules are in tests/test_clock_hand.py.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from shared_data import STUNNER_100

from sfg.cli.main import main
from sfg.clock.replay import replay_clock, staleness_events
from sfg.clock.schedule import LOCAL, lockstep_rounds, make_schedule, make_world
from sfg.clock.settings import DEFAULTS, make_settings
from sfg.clock.train import simulate_events
from sfg.errors import SfgError
from sfg.experiments.config import make_config, run_id
from sfg.modelfree.api import build_scenario, replay_trace
from sfg.round.attacks import parse_attack
from sfg.round.kernel import FACTS, caps_at, play_round
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.round.staleness import init_state
from sfg.sim.params import init_params
from sfg.sim.run import resolve_config, simulate
from sfg.world.graphs import make_graph
from sfg.world.models import make_model
from sfg.world.outages.anatomy import capabilities

ROOT = Path(__file__).resolve().parents[1]
F_AGE, F_LAG = FACTS.index("age"), FACTS.index("lag")

TINY = dict(dataset="digits", model="mlp", n_clients=12, rounds=6, local_steps=2, batch_size=8,
            eval_every=6, graph="knn:k=3", backend="batched")
VIRTUAL = make_settings({"clock": "virtual"})


def _same_metrics(a: dict, b: dict) -> list[str]:
    """Keys of ``a`` whose values differ in ``b`` (NaN equals NaN)."""
    return [k for k, v in a.items() if k not in b or not (
        v == b[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(b[k])))]


# ------------------------------------------------------------ 1. lockstep is sfg run
LATE_OK = {"latency": "const:value=1"}  # every message in time, through per-slot deliveries


@pytest.mark.parametrize("rule", ["dfedavg", "sfg", "sfg-l", "sfg-cut", "aoi+ipw",
                                  "limited-merging:L=2"])
@pytest.mark.crosspath
def test_lockstep_with_zero_time_is_sfg_run(rule):
    """docs/concepts/clock.md#the-three-protocols: with zero compute time and latency the lockstep clock gives sfg run's
    numbers, bit for bit; so does a latency far below Δ (every message in time), which takes
    the per-slot delivery path through the round."""
    for anatomy, lf, worlds in [("full", 0.0, [{}]), ("full", 0.4, [{}, LATE_OK]),
                                ("cannot-communicate", 0.4, [{}]),
                                ("cannot-train-shares", 0.0, [{}, LATE_OK])]:
        cfg = {**TINY, "process": "bursty:u=0.6", "rule": rule, "anatomy": anatomy,
               "link_failure": lf, "seed": 2}
        ref = simulate(cfg)
        for extra in worlds:
            got = simulate({**cfg, "clock": "virtual", **extra})
            what = (rule, anatomy, lf, extra)
            assert torch.equal(got.params, ref.params), what
            np.testing.assert_array_equal(got.accuracy, ref.accuracy)
            hours = got.curves.pop("hours")  # the clock adds virtual hours to the curves
            assert got.curves == ref.curves, what
            assert hours == [r * 600.0 / 3600.0 for r in ref.curves["round"]], what
            assert not _same_metrics(ref.metrics, got.metrics), what
            assert got.meta["clock"] == "virtual" and got.meta["protocol"] == "lockstep"
            assert got.metrics["stragglers"] == 0 and got.metrics["late"] == 0


@pytest.mark.crosspath
@pytest.mark.parametrize("process", ["bursty:u=0.6", "iid:u=0.4"])
def test_lockstep_replay_is_the_round_replay(process):
    """The model-free replay on the lockstep clock equals sfg.replay on the same trace:
    every metric and curve, with forged claims, link failures and another anatomy."""
    g, av = build_scenario(process, n=20, T=30, graph="knn:k=4", seed=2)
    for rule in ["dfedavg", "sfg", "sfg-l", "sfg-cut", "aoi+ipw", "limited-merging:L=2",
                 "copy-random"]:
        for attack, lf, anatomy in [(None, 0.0, "full"), ("forge:frac=0.1,claim=fresh", 0.0, "full"),
                                    (None, 0.4, "full"), (None, 0.0, "cannot-communicate"),
                                    ("forge:frac=0.1,claim=fresh", 0.4, "full")]:
            ref = replay_trace(av, g, rule, seed=2, attack=attack, link_failure=lf,
                               anatomy=anatomy, horizon=10)
            got = replay_clock(process, rule, seed=2, settings=VIRTUAL, n=20, rounds=30,
                               graph="knn:k=4", attack=attack, link_failure=lf,
                               anatomy=anatomy, horizon=10)
            what = (rule, attack, lf, anatomy)
            assert not _same_metrics(ref.metrics, got["metrics"]), what
            for k in ("round", "mean_age", "mean_lag"):
                np.testing.assert_array_equal(ref.curves[k], got["curves"][k], err_msg=str(what))
            assert got["meta"]["protocol"] == "lockstep" and got["metrics"]["stragglers"] == 0


# ------------------------------------------------ 2. stragglers, late and lost messages
def _compute_csv(tmp_path: Path, slow: dict[int, float], n: int, fast: float) -> str:
    p = tmp_path / "compute.csv"
    p.write_text("device,compute\n" + "".join(f"{i},{slow.get(i, fast)}\n" for i in range(n)))
    return f"trace:path={p}"


def test_straggler_is_never_a_participant(tmp_path):
    """A device whose K·compute exceeds Δ never takes part (docs/concepts/clock.md#the-three-protocols): it never trains, its
    model stays the initial one, nobody hears it, and the replay counts it as unavailable."""
    n, T, K = 12, 6, 2
    compute = _compute_csv(tmp_path, {3: 400.0, 7: 301.0}, n, 10.0)  # 2 · 301 > 600
    cfg = {**TINY, "process": "none", "rule": "dfedavg", "clock": "virtual", "compute": compute}
    res = simulate(cfg, record_weights=True)
    X0 = init_params(_digits_model, n, seed=1)
    assert torch.equal(res.params[[3, 7]], X0[[3, 7]])
    assert not torch.equal(res.params[[0, 1]], X0[[0, 1]])
    rg = RoundGraph.from_graph(make_graph("knn:k=3", n, seed=1))
    for w in res.weights_log:
        # the stragglers' rows are identity, and nobody gives them weight
        for s in (3, 7):
            assert w[rg.indptr[s]] == 1.0
        nb = ~rg.is_self
        assert not np.any(w[nb & np.isin(rg.send, [3, 7])] > 0)
    assert res.metrics["stragglers"] == 2 * T
    assert res.metrics["unavailability"] == pytest.approx(2 / n)
    assert res.metrics["compute_seconds"] == 10 * n * T * K - 10 * 2 * T * K
    rep = replay_clock("none", "dfedavg", seed=1, settings=make_settings(
        {"clock": "virtual", "compute": compute}), n=n, rounds=T, graph="knn:k=3",
        local_steps=K, horizon=2)
    assert rep["metrics"]["stragglers"] == 2 * T
    assert rep["metrics"]["unavailability"] == pytest.approx(2 / n)
    # K = 1: 400 s and 301 s fit in Δ, nobody straggles
    rep1 = replay_clock("none", "dfedavg", seed=1, settings=make_settings(
        {"clock": "virtual", "compute": compute}), n=n, rounds=T, graph="knn:k=3",
        local_steps=1, horizon=2)
    assert rep1["metrics"]["stragglers"] == 0 and rep1["metrics"]["unavailability"] == 0


def _digits_model():
    from sfg.world.data import load_federated

    data = load_federated("digits", n_clients=12, seed=1, data_root=None, alpha=0.5,
                          partition="dirichlet")
    return make_model("mlp", input_shape=tuple(data.input_shape), num_classes=data.num_classes)


@pytest.mark.parametrize("process", ["bursty:u=0.6", "iid:u=0.25"])
def test_total_loss_makes_every_rule_local(process):
    """loss = 1: no message is ever delivered, no neighbour is ever a candidate, so every rule
    trains exactly as ``local`` (and the replay sees no messages)."""
    base = {**TINY, "process": process, "clock": "virtual", "loss": "const:value=1"}
    ref = simulate({**base, "rule": "local"})
    plain = simulate({**TINY, "process": process, "rule": "local"})
    assert torch.equal(ref.params, plain.params)  # local never listens anyway
    lossy = make_settings({"clock": "virtual", "loss": "const:value=1"})
    rep_local = replay_clock(process, "local", seed=1, settings=lossy, n=12, rounds=30,
                             graph="knn:k=3", local_steps=2, horizon=5)["metrics"]
    for rule in ["dfedavg", "sfg", "sfg-cut", "aoi+ipw", "limited-merging:L=2", "copy-random"]:
        got = simulate({**base, "rule": rule})
        assert torch.equal(got.params, ref.params), rule
        assert got.metrics["messages"] == 0 and got.metrics["lost"] > 0
        rep = replay_clock(process, rule, seed=1, settings=lossy, n=12, rounds=30,
                           graph="knn:k=3", local_steps=2, horizon=5)["metrics"]
        assert rep["messages"] == 0 and rep["lost"] > 0, rule
        assert not _same_metrics(rep_local, rep), rule
    assert not torch.equal(simulate({**TINY, "process": process, "rule": "dfedavg"}).params,
                           ref.params)  # without the loss the rules do listen


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_total_loss_makes_every_rule_local_on_the_event_clock(protocol):
    """The same on the async and event clocks: no message is ever held, no candidate but the
    receiver, so every rule trains as ``local`` there too."""
    def train(rule: str) -> dict:
        c = {**TINY, "process": "bursty:u=0.5", "rule": rule, "rounds": 4, "eval_every": 4,
             **_clock_settings(protocol, loss="const:value=1")}
        return simulate_events(resolve_config(c))

    ref = train("local")
    assert ref["metrics"]["messages"] == 0 and ref["metrics"]["lost_random"] > 0
    for rule in ["dfedavg", "sfg-cut", "copy-random"]:
        assert torch.equal(train(rule)["params"], ref["params"]), rule


def test_per_slot_deliveries_honoured_by_training_and_replay():
    """Late messages (latency > Δ − K·c_receiver) and stragglers (K·c > Δ) drop out per
    directed slot: the weights of every round give a slot weight exactly when both ends take
    part and its message is in time, and the replay counts the same deliveries."""
    n, T, K = 12, 6, 2
    clock = {"clock": "virtual", "compute": "lognormal:median=250,sigma=0.4",
             "latency": "lognormal:median=100,sigma=1"}
    cfg = {**TINY, "process": "none", "rule": "dfedavg", **clock}
    res = simulate(cfg, record_weights=True)
    s = make_settings(clock)
    world = make_world(s, process="none", graph="knn:k=3", n=n, rounds=T, seed=1)
    rg = world.rg
    part = K * world.compute <= s.round_seconds  # online all the time: compute decides
    assert 0 < part.sum() < n, "the world should have stragglers and participants"
    nb = ~rg.is_self
    in_time = world.latency <= s.round_seconds - K * world.compute[rg.recv]
    expect = nb & part[rg.send] & part[rg.recv] & in_time
    assert 0 < expect.sum() < (nb & part[rg.send] & part[rg.recv]).sum(), "some late, some not"
    for w in res.weights_log:
        np.testing.assert_array_equal(w[nb] > 0, expect[nb])
    assert res.metrics["messages"] == T * expect.sum()
    assert res.metrics["late"] == T * (nb & part[rg.send] & part[rg.recv] & ~in_time).sum()
    rep = replay_clock("none", "dfedavg", seed=1, settings=s, n=n, rounds=T, graph="knn:k=3",
                       local_steps=K, horizon=2)
    assert rep["metrics"]["messages"] == T * expect.sum()
    assert rep["meta"]["schedule_digest"] == res.meta["schedule_digest"]
    # random loss removes a subset of those deliveries, the same in training and the replay
    lossy = {**clock, "loss": "const:value=0.5"}
    res2 = simulate({**cfg, **lossy}, record_weights=True)
    rep2 = replay_clock("none", "dfedavg", seed=1, settings=make_settings(lossy), n=n,
                        rounds=T, graph="knn:k=3", local_steps=K, horizon=2)
    for w in res2.weights_log:
        assert not np.any((w > 0) & nb & ~expect)
    assert 0 < res2.metrics["messages"] < res.metrics["messages"]
    assert rep2["metrics"]["messages"] == res2.metrics["messages"]


# ------------------------------------------------------ 3. digest, determinism, threads
CLOCK_WORLD = {"compute": "lognormal:median=20,sigma=0.5", "latency": "lognormal:median=5,sigma=1",
               "loss": "const:value=0.1"}


def _clock_settings(protocol: str, **kw) -> dict:
    extra = ({"jitter": 0.3} if protocol == "async" else
             {"compute": "lognormal:median=100,sigma=0.5"} if protocol == "event" else {})
    return {"clock": "virtual", "protocol": protocol, **CLOCK_WORLD, **extra, **kw}


def _rep(protocol: str, rule: str = "dfedavg", seed: int = 1, **kw) -> dict:
    return replay_clock("bursty:u=0.5", rule, seed=seed,
                        settings=make_settings(_clock_settings(protocol, **kw)), n=12,
                        rounds=20, graph="knn:k=3", local_steps=2, horizon=5)


@pytest.mark.parametrize("protocol", ["lockstep", "async", "event"])
def test_schedule_digest_is_the_rules_and_the_settings(protocol):
    """docs/concepts/clock.md#pairing-and-the-schedule-digest: the same digest for every rule of a seed; another digest when a schedule
    setting or the seed changes; the training run reports the replay's schedule."""
    digests = {r: _rep(protocol, r)["meta"]["schedule_digest"]
               for r in ["dfedavg", "sfg", "sfg-l", "sfg-cut", "aoi+ipw", "copy-random"]}
    assert len(set(digests.values())) == 1, digests
    d = digests["dfedavg"]
    changes = [{"seed": 2}, {"loss": "const:value=0.3"},
               {"compute": "lognormal:median=200,sigma=1"}]  # lockstep: stragglers
    if protocol == "async":
        changes += [{"jitter": 0.5}, {"period": 500.0}, {"compute": "const:value=20"},
                    {"latency": "const:value=5"}, {"window": 2.0}]
    if protocol == "event":
        changes += [{"compute": "const:value=20"}, {"window": 0.01}, {"round_seconds": 300.0}]
    for ch in changes:
        seed = ch.pop("seed", 1)
        assert _rep(protocol, seed=seed, **ch)["meta"]["schedule_digest"] != d, (protocol, ch)
    # training on the same world (instant uplinks: message size does not matter) has it too
    c = {**TINY, "rounds": 4, "eval_every": 4, "process": "bursty:u=0.5", "rule": "sfg",
         **_clock_settings(protocol)}
    rep = replay_clock("bursty:u=0.5", "sfg", seed=1, settings=make_settings(c), n=12, rounds=4,
                       graph="knn:k=3", local_steps=2, horizon=2)
    got = (simulate(c).meta if protocol == "lockstep" else simulate_events(resolve_config(c))["meta"])
    assert got["schedule_digest"] == rep["meta"]["schedule_digest"]


def _events_train(protocol: str, rule: str = "sfg") -> dict:
    c = {**TINY, "process": "bursty:u=0.5", "rule": rule, "rounds": 4, "eval_every": 2,
         **_clock_settings(protocol)}
    return simulate_events(resolve_config(c))


@pytest.mark.crosspath
@pytest.mark.parametrize("protocol", ["async", "event"])
def test_same_seed_is_bit_identical_whatever_the_threads(protocol):
    """Two runs of one seed are bit-identical (replay metrics and curves, trained parameters),
    under 1 and 2 torch threads and 1 and 2 numba threads — by construction, not by luck: the
    batched backend trains blocks of clients that depend on N only, every kernel on one
    intra-op thread (sfg.sim.backends._run_chunks), aggregation is the one in-order sum
    (sfg.sim.gossip.weighted_sum), and the replay's lanes each run on one thread."""
    base_threads, base_numba = torch.get_num_threads(), numba.get_num_threads()
    outs = []
    try:
        for tt, nt in [(1, 1), (2, min(2, numba.config.NUMBA_NUM_THREADS)), (1, 1)]:
            torch.set_num_threads(tt)
            numba.set_num_threads(nt)
            rep = _rep(protocol, "sfg-cut")
            tr = _events_train(protocol)
            outs.append((rep, tr))
    finally:
        torch.set_num_threads(base_threads)
        numba.set_num_threads(base_numba)
    (r0, t0) = outs[0]
    assert r0["metrics"]["aggregations"] > 0 and t0["meta"]["levels"] > 1
    for rep, tr in outs[1:]:
        assert not _same_metrics(r0["metrics"], rep["metrics"])
        assert rep["curves"] == r0["curves"]
        assert torch.equal(tr["params"], t0["params"])
        assert tr["curves"] == t0["curves"]
        assert tr["meta"]["schedule_digest"] == t0["meta"]["schedule_digest"]


@pytest.mark.crosspath
def test_lockstep_same_seed_is_bit_identical_whatever_the_threads():
    """As above for sfg run on the lockstep clock (the same construction)."""
    c = {**TINY, "process": "bursty:u=0.5", "rule": "sfg", **_clock_settings("lockstep")}
    base = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = simulate(c)
        torch.set_num_threads(2)
        b = simulate(c)
    finally:
        torch.set_num_threads(base)
    assert torch.equal(a.params, b.params) and a.meta["schedule_digest"] == b.meta["schedule_digest"]
    assert a.metrics["lost"] > 0


# ------------------------------------------------------------- 4. the invariants of docs/concepts/staleness.md#invariants
def _check_events(rule_name: str, world, sched, seed: int, attack, window: float) -> int:
    """Every candidate as the kernel saw it and every header sent obey docs/concepts/staleness.md#the-staleness-state: τ ≤ ℓ, ℓ ≥ 0, τ ≥ 0,
    counts ≥ 1; weights non-negative, summing to 1; messages causal and within the window.
    Returns the number of neighbour candidates checked."""
    rule = parse_rule(rule_name)
    got = staleness_events(rule, world, sched, seed=seed, attack=parse_attack(attack))
    hdr, hdr_lag, w, facts = got["hdr"], got["hdr_lag"], got["weights"], got["facts"]
    rg, unit = world.rg, sched.unit
    eps = 1e-9
    loc = np.flatnonzero(sched.kind == LOCAL)
    # the state before every event
    assert (facts[:, F_AGE] >= 0).all() and (facts[:, F_LAG] >= -eps).all()
    assert (facts[:, F_AGE] <= facts[:, F_LAG] + eps).all()
    # every header sent
    assert (hdr[0, loc] >= 0).all() and (hdr_lag[loc] >= -eps).all()
    assert (hdr[0, loc] <= hdr_lag[loc] + eps).all()
    assert (hdr[1, loc] >= 1).all() and (hdr[2, loc] >= 1).all()
    n_msgs = 0
    for r in loc:
        a, b = sched.cptr[r], sched.cptr[r + 1]
        wk = w[a:b]
        assert (wk >= 0).all() and abs(wk.sum() - 1.0) <= 1e-12, (r, wk)
        assert sched.cmsg[a] == -1 and sched.cslot[a] == rg.indptr[sched.dev[r]]
        for c in range(a + 1, b):
            m, d, e = sched.cmsg[c], sched.cwait[c], sched.cslot[c]
            assert 0 <= m < r and sched.kind[m] == LOCAL
            assert rg.recv[e] == sched.dev[r] and rg.send[e] == sched.dev[m]
            # arrived by the aggregation and not sent at its instant (the phases of one
            # instant: docs/concepts/clock.md#one-instant), after the sender's K steps, in the
            # window (under on_return pull a reply is older by its held, so its wait counts
            # from its sending and the window applies to its arrival:
            # docs/concepts/clock.md#returns-in-time)
            arrival = sched.time[r] - d * unit
            assert d >= 0 and sched.end[m] < sched.time[r]
            assert arrival >= sched.end[m] - eps * unit
            assert d <= window + eps or sched.pulls is not None
            age, lag = hdr[0, m] + math.floor(d), hdr_lag[m] + d
            assert 0 <= age <= lag + eps and hdr[1, m] >= 1
            n_msgs += 1
    assert (got["ages"] >= 0).all() and (got["lags"] >= -eps).all() and (got["counts"] >= 1).all()
    assert (got["ages"] <= got["lags"] + eps).all()
    assert ((got["q_hat"] >= 0.05 - eps) & (got["q_hat"] <= 1 + eps)).all()
    return n_msgs


def _check_lockstep(rule_name: str, world, s, K: int, T: int, seed: int) -> int:
    """docs/concepts/staleness.md#the-staleness-state on the lockstep clock, round by round through the round itself."""
    from sfg.clock.schedule import directed

    rule = parse_rule(rule_name)
    lk = lockstep_rounds(world, s, local_steps=K, rounds=T, seed=seed)
    rg = directed(world.rg) if lk.live is not None else world.rg
    caps_all = capabilities(lk.available, "full")
    state = init_state(rg, rounds=T, track_missed=rule.oracle)
    n_msgs = 0
    eps = 1e-9
    for t in range(T):
        caps = caps_at(caps_all, t)
        rw = play_round(rule, rg, state, caps, seed=seed,
                        live=None if lk.live is None else lk.live[t])
        for i in range(rg.n):
            a, b = rg.indptr[i], rg.indptr[i + 1]
            wk = rw.weights[a:b]
            assert (wk >= 0).all() and abs(wk.sum() - 1.0) <= 1e-12
            cand = rw.candidate[a:b]
            if lk.available[t, i]:
                snd = rg.send[a:b][cand]
                assert lk.available[t, snd].all()  # stragglers are never candidates
                if lk.live is not None:
                    assert lk.live[t, a:b][cand].all()  # nor late or lost messages
                assert (state.ages[snd] <= state.lags[snd] + eps).all()
                n_msgs += int(cand.sum()) - 1
            else:
                assert wk[0] == 1.0
        state = rw.state
        assert (state.lags >= -eps).all() and (state.ages >= 0).all()
        assert (state.ages <= state.lags + eps).all() and (state.counts >= 1).all()
    return n_msgs


GRAPHS = ["ring:k=1", "knn:k=2", "knn:k=3"]
RULES = ["dfedavg", "sfg", "sfg-l", "sfg-cut", "sfg-counts", "aoi+ipw", "limited-merging:L=2",
         "copy-random", "dfl-aa", "sfg-l+rounded", "metropolis-hastings", "two-random", "local",
         "oracle-gls", "sfg-cut+refute"]


@st.composite
def clock_worlds(draw, protocol: str):
    n = draw(st.integers(3, 12))
    graph = draw(st.sampled_from([g for g in GRAPHS if int(g[-1]) < n]))
    kinds = ["iid", "bursty"] + (["stunner"] if STUNNER_100.exists() else [])  # shared data
    kind = draw(st.sampled_from(kinds))
    rounds = max(draw(st.integers(8, 25)), math.ceil(150 / n))
    if kind == "stunner":
        process = f"stunner:path={STUNNER_100}"
    else:
        process = f"{kind}:u={draw(st.integers(1, 7)) / 10}"
    K = draw(st.integers(1, 3))
    low = 10.0 if protocol == "event" else 0.0  # event: local rounds must take time
    if draw(st.booleans()):
        compute = f"const:value={draw(st.floats(low, 150.0)):.3f}"
    else:
        compute = (f"lognormal:median={draw(st.floats(max(low, 1.0) * 3, 120.0)):.3f},"
                   f"sigma={draw(st.floats(0.0, 0.6)):.3f}")
    uplink = draw(st.sampled_from(["const:value=inf", "const:value=2000", "lognormal:median=5000,sigma=1"]))
    clock = {
        "clock": "virtual", "protocol": protocol, "compute": compute, "uplink": uplink,
        "message_bytes": 10_000.0,
        # no subnormal jitter: round 0's wake times would be ~1e-321 s, and a wait that small
        # underflows to 0 units when divided by Δ (the message did arrive strictly before)
        "jitter": draw(st.floats(0.0, 0.95, allow_subnormal=False)),
        "window": draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0])),
        "latency": draw(st.sampled_from(["const:value=0", "const:value=30",
                                         "lognormal:median=60,sigma=1.5"])),
        "loss": f"const:value={draw(st.sampled_from([0.0, 0.1, 0.5]))}",
    }
    if protocol == "async":
        clock["period"] = draw(st.sampled_from([None, 300.0, 900.0]))
    anatomy = draw(st.sampled_from(["full", "full", "cannot-communicate",
                                    "cannot-train-shares", "cannot-train-adopts"]))
    if protocol != "lockstep" and draw(st.booleans()):  # returns in time: a pull on return
        clock["on_return"] = f"pull:timeout={draw(st.sampled_from([5.0, 60.0, 250.0])):g}"
    return dict(n=n, graph=graph, process=process, rounds=rounds, K=K, clock=clock,
                anatomy=anatomy, link_failure=draw(st.sampled_from([0.0, 0.0, 0.4])),
                seed=draw(st.integers(0, 10_000)), rule=draw(st.sampled_from(RULES)),
                attack=draw(st.sampled_from([None, "forge:frac=0.2,claim=fresh"])))


def _world_or_reject(w):
    s = make_settings(w["clock"])
    try:
        world = make_world(s, process=w["process"], graph=w["graph"], n=w["n"],
                           rounds=w["rounds"], seed=w["seed"])
    except SfgError as e:  # a tiny trace that cannot calibrate to ±0.005: not a clock case
        assume("could not reach" not in str(e))
        raise
    return s, world


INVARIANTS = settings(max_examples=25, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_invariants_on_the_clock(protocol):
    seen = []

    @INVARIANTS
    @given(clock_worlds(protocol))
    def check(w):
        s, world = _world_or_reject(w)
        try:
            sched = make_schedule(world, s, local_steps=w["K"], seed=w["seed"],
                                  anatomy=w["anatomy"], link_failure=w["link_failure"])
        except SfgError as e:  # async: every device slower than the period
            assume("is not longer than the fastest" not in str(e))
            raise
        seen.append(_check_events(w["rule"], world, sched, w["seed"], w["attack"], s.window))

    check()
    assert sum(seen) > 0, "no example had a neighbour candidate"


def test_invariants_on_the_lockstep_clock():
    seen = []

    @INVARIANTS
    @given(clock_worlds("lockstep"))
    def check(w):
        s, world = _world_or_reject(w)
        s = s.with_bytes(10_000.0)
        seen.append(_check_lockstep(w["rule"], world, s, w["K"], w["rounds"], w["seed"]))

    check()
    assert sum(seen) > 0, "no example had a neighbour candidate"


# ---------------------------------------------------------------- 5. pairing on the clock


def _train(protocol: str, rule: str, **kw) -> dict:
    c = {**TINY, "process": "none", "rule": rule, "clock": "virtual", "protocol": protocol, **kw}
    return simulate_events(resolve_config(c))


@pytest.mark.crosspath
def test_async_pairing_without_outages():
    """Async, every device always online, jitter 0, compute 0: every wake r aggregates the
    neighbours' messages of wake r − 1, which waited exactly one period (d = 1: age + 1,
    lag + 1, counts unchanged) while the receiver's own model is fresh. So

    * the schedule and the minibatches do not depend on the rule; ``local`` is sfg run's
      ``local`` bit for bit (device i's wake r trains on sfg run's minibatches of round r);
    * dfedavg is sfg run's dfedavg (the same models, up to float summation order);
    * the count-based members (sfg-counts, limited-merging, gl-age) see equal counts and give
      dfedavg bit for bit — but the age- and lag-based ones (sfg, sfg-l, sfg-cut, aoi) do NOT:
      every neighbour is one period older than the receiver, so sfg weighs itself 1/(1+kγ)
      and each neighbour γ/(1+kγ). The pairing consequence "every SFG member reproduces DFedAvg" (docs/concepts/training.md#pairing) is a
      statement about synchronous rounds; on the async clock waiting is staleness."""
    family = ["sfg", "sfg-l", "sfg-cut", "aoi", "sfg-counts", "limited-merging:L=2", "gl-age"]
    res = {r: _train("async", r) for r in ["dfedavg", "local", *family]}
    digest = res["dfedavg"]["meta"]["schedule_digest"]
    assert all(r["meta"]["schedule_digest"] == digest for r in res.values())
    for rule in ["sfg-counts", "limited-merging:L=2", "gl-age"]:
        assert torch.equal(res[rule]["params"], res["dfedavg"]["params"]), rule
    for rule in ["sfg", "sfg-l", "sfg-cut", "aoi"]:
        assert not torch.allclose(res[rule]["params"], res["dfedavg"]["params"], atol=1e-4), rule
    plain = {r: simulate({**TINY, "process": "none", "rule": r}) for r in ["local", "dfedavg"]}
    assert torch.equal(res["local"]["params"], plain["local"].params)
    torch.testing.assert_close(res["dfedavg"]["params"], plain["dfedavg"].params, atol=1e-6,
                               rtol=0)
    # the waited period, by hand: sfg's weights at every wake after the first
    s = make_settings({"clock": "virtual", "protocol": "async"})
    world = make_world(s, process="none", graph="knn:k=3", n=12, rounds=6, seed=1)
    sched = make_schedule(world, s, local_steps=2, seed=1)
    got = staleness_events(parse_rule("sfg"), world, sched, seed=1)
    deg = np.diff(world.rg.indptr) - 1
    for r in np.flatnonzero(sched.kind == LOCAL):
        a, b = sched.cptr[r], sched.cptr[r + 1]
        if sched.step[r] == 0:
            assert b - a == 1  # nothing heard yet
            continue
        k = deg[sched.dev[r]]
        assert b - a == k + 1 and np.all(sched.cwait[a + 1:b] == 1.0)
        np.testing.assert_allclose(got["weights"][a:b], [1 / (1 + 0.5 * k)] + [0.5 / (1 + 0.5 * k)] * k,
                                   rtol=0, atol=1e-15)


@pytest.mark.crosspath
def test_event_pairing_without_outages():
    """Event, always online, compute 1 s per step (K = 2), Δ = 10 s: every local round takes
    2 s; a message arrives when its receiver starts its next round, which does not hold it yet
    (wakes before arrivals), so each round hears the neighbours' round before last, waited
    2 s = 0.2 Δ: ages unchanged (⌊0.2⌋ = 0), lags + 0.2, counts one behind. So

    * the schedule and the minibatches do not depend on the rule; ``local`` is sfg run's
      ``local`` over 30 rounds bit for bit (device i's k-th local round uses round k's);
    * the age-based members (sfg, aoi) give dfedavg bit for bit; the lag- and count-based ones
      (sfg-l, sfg-counts, limited-merging) do not."""
    kw = {"compute": "const:value=1", "round_seconds": 10.0}
    family = ["sfg", "aoi", "sfg-l", "sfg-counts", "limited-merging:L=2"]
    res = {r: _train("event", r, **kw) for r in ["dfedavg", "local", *family]}
    digest = res["dfedavg"]["meta"]["schedule_digest"]
    assert all(r["meta"]["schedule_digest"] == digest for r in res.values())
    assert res["dfedavg"]["metrics"]["local_rounds"] == 12 * 30
    for rule in ["sfg", "aoi"]:
        assert torch.equal(res[rule]["params"], res["dfedavg"]["params"]), rule
    for rule in ["sfg-l", "sfg-counts", "limited-merging:L=2"]:
        assert not torch.equal(res[rule]["params"], res["dfedavg"]["params"]), rule
    plain = simulate({**TINY, "process": "none", "rule": "local", "rounds": 30, "eval_every": 30})
    assert torch.equal(res["local"]["params"], plain.params)


# ------------------------------------------------------------- 6. bad settings, CLI
RUN = ["run", "-n", "12", "-T", "4", "-K", "2", "--dataset", "digits", "--model", "mlp",
       "--graph", "knn:k=3", "--eval-every", "4", "-p", "none", "--clock", "virtual"]
REPLAY = ["replay", "-n", "12", "-T", "20", "--graph", "knn:k=3", "-p", "iid:u=0.3", "--seeds",
          "1", "--clock", "virtual"]
BAD = [
    (RUN + ["--compute", "const:value=-1"], "compute"),
    (RUN + ["--latency", "const:value=-1"], "latency"),
    (RUN + ["--uplink", "const:value=0"], "uplink"),
    (RUN + ["--protocol", "async", "--period", "-5"], "period must be > 0"),
    (RUN + ["--round-seconds", "0"], "round_seconds must be > 0"),
    (RUN + ["--protocol", "async", "--jitter", "1.5"], "jitter must lie in [0, 1)"),
    (RUN + ["--protocol", "asynk"], "did you mean 'async'"),
    (RUN + ["--loss", "const:value=1.5"], "loss"),
    (RUN + ["--protocol", "async", "--period", "10", "--compute", "const:value=10"],
     "raise --period or lower --compute"),
    (RUN + ["--protocol", "event"], "give --compute a positive time"),
    (RUN + ["--protocol", "async", "--rule", "relative-variance:nu=0"], "nu=0.0 must lie"),
    (RUN + ["--protocol", "event", "--compute", "const:value=1", "--rule", "pwg:H=-1"],
     "must be >= 0"),
    (RUN + ["--protocol", "event", "--uplink", "const:value=1e6", "--anatomy",
            "cannot-communicate"], "trains alone, one local round after the other"),
    (["run", "--protocol", "async"], "add clock: virtual"),
    (["run", "--compute", "const:value=2"], "add clock: virtual"),
    (["replay", "--protocol", "async"], "add --clock virtual"),
    (["replay", "--jitter", "0.1"], "add --clock virtual"),
    (REPLAY + ["--protocol", "async", "--rule", "pwg"], "--protocol lockstep"),
    (REPLAY + ["--protocol", "event", "--rule", "relative-variance", "--compute",
               "const:value=5"], "--protocol lockstep"),
    (REPLAY + ["--protocol", "event"], "give --compute a positive time"),
    (REPLAY + ["--protocol", "async", "--period", "5", "--compute", "const:value=3", "-K", "2"],
     "raise --period"),
    (REPLAY + ["--window", "0"], "window must be > 0"),
    (REPLAY + ["--protocol", "event", "--compute", "const:value=nan"],
     "compute"),
]


def _one_error_line(stderr: str, fragment: str) -> None:
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    assert fragment in lines[0], lines[0]


def _case(args: list[str]) -> str:
    for head in (RUN, REPLAY):
        if args[:len(head)] == head:
            return f"{head[0]} {' '.join(args[len(head):])}"
    return " ".join(args)


@pytest.mark.parametrize("args, fragment", BAD, ids=[_case(a) for a, _ in BAD])
def test_bad_clock_settings_one_line_exit_2(args, fragment):
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        rc = main(args)
    assert rc == 2, err.getvalue()
    _one_error_line(err.getvalue(), fragment)


def test_compute_trace_missing_devices(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("device,compute\n0,1\n1,2\n")
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(RUN + ["--compute", f"trace:path={p}"])
    assert rc == 2
    _one_error_line(err.getvalue(), "has no row for 10 of the 12 devices")


@pytest.mark.parametrize("args, fragment", [
    (RUN + ["--protocol", "event"], "give --compute a positive time"),
    (["run", "--protocol", "async"], "add clock: virtual"),
])
def test_bad_clock_settings_as_a_program(args, fragment):
    """The installed program's path: a separate process, exit status 2, one line."""
    res = subprocess.run([sys.executable, "-m", "sfg", *args], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2, res.stderr
    _one_error_line(res.stderr, fragment)


# --------------------------------------------------------------------------- 7. grids
GRID = """\
name: clock
base: {kind: replay, clock: virtual, n_clients: 10, rounds: 20, graph: "ring:k=1",
       local_steps: 2, compute: "const:value=5", horizon: 5}
processes: ["iid:u=0.4"]
rules: [dfedavg, sfg-cut]
seeds: [1]
overrides: [{protocol: lockstep}, {protocol: async, jitter: 0.2}, {protocol: event}]
"""

TRAIN_GRID = """\
name: clock-train
base: {kind: train, clock: virtual, dataset: digits, model: mlp, n_clients: 12, rounds: 4,
       local_steps: 2, batch_size: 8, eval_every: 2, graph: "knn:k=3", backend: batched,
       compute: "const:value=5"}
processes: ["bursty:u=0.5"]
rules: [sfg]
seeds: [1]
overrides: [{protocol: lockstep}, {protocol: async}]
"""


def test_clock_grid_through_the_store(tmp_path):
    """A grid with clock: virtual runs through the grid runner into a real SQLite store: one
    row per protocol and rule, each with its own run id and the clock's own numbers."""
    from sfg.experiments.executors import run_grid
    from sfg.experiments.grid import load_grid
    from sfg.experiments.store import Store

    (tmp_path / "g.yaml").write_text(GRID)
    (tmp_path / "t.yaml").write_text(TRAIN_GRID)
    grid = load_grid(tmp_path / "g.yaml")
    train = load_grid(tmp_path / "t.yaml")
    store = tmp_path / "s.sqlite"
    assert run_grid(list(grid), store, workers=1).failed == 0
    assert run_grid(list(train), store, workers=1).failed == 0
    with Store(store, create=False) as s:
        recs = s.records()
    assert len(recs) == 8 and len({r["run_id"] for r in recs}) == 8
    reps = [r for r in recs if r["config"]["kind"] == "replay"]
    assert {(r["config"]["protocol"], r["rule"]) for r in reps} == {
        (p, ru) for p in ("lockstep", "async", "event") for ru in ("dfedavg", "sfg-cut")}
    for r in reps:
        c = r["config"]
        direct = replay_clock(c["process"], c["rule"], seed=1, settings=make_settings(c),
                              n=10, rounds=20, graph="ring:k=1", local_steps=2, horizon=5)
        assert not _same_metrics(direct["metrics"], r["metrics"]), c["protocol"]
    by = {r["config"]["protocol"]: r["metrics"] for r in reps if r["rule"] == "sfg-cut"}
    assert "wakes" in by["async"] and "wakes" not in by["event"]
    assert "stragglers" in by["lockstep"]
    trs = {r["config"]["protocol"]: r for r in recs if r["config"]["kind"] == "train"}
    assert set(trs) == {"lockstep", "async"}
    assert "time_to_accuracy_h" in trs["async"]["metrics"]
    assert trs["async"]["curves"]["hours"] == [600 * 2 / 3600, 600 * 4 / 3600]


def test_round_based_run_ids_unchanged_by_the_clock_keys():
    """Run ids of configs without the clock are those they had before the clock existed
    (computed at commit 673c536, before the keys were added), whether the keys are absent
    or given at their defaults with clock 'rounds'; with clock 'virtual' they change."""
    before = {  # run ids at the commit before the clock's keys existed
        "396d260db915acde": dict(kind="train", dataset="digits", model="mlp", rule="sfg",
                                 process="bursty:u=0.6", n_clients=12, rounds=6, eval_every=6,
                                 seed=3),
        "4dfc7f30327bfe36": dict(kind="replay", rule="sfg-cut", process="iid:u=0.5", seed=1),
        "fedea88c70eef9bd": {},
    }
    defaults = {**DEFAULTS, "clock": "rounds", "target_accuracy": 0.8}
    assert set(defaults) == {"clock", "protocol", "round_seconds", "period", "jitter", "window",
                             "compute", "uplink", "latency", "loss", "message_bytes",
                             "eval_seconds", "target_accuracy", "faults", "faults_seed", "on_return"}
    for rid, cfg in before.items():
        assert run_id(make_config(cfg)) == rid
        assert run_id(make_config({**cfg, **defaults})) == rid
        virtual = {run_id(make_config({**cfg, "clock": "virtual", "protocol": p}))
                   for p in ("lockstep", "async", "event")}
        assert len(virtual) == 3 and rid not in virtual
    # the faults' keys, added later, leave the virtual clock's earlier ids as they were
    # (computed at commit decf8ef, before the keys existed); given, they change the id
    cfg = dict(kind="replay", rule="sfg-cut", process="iid:u=0.5", seed=1, clock="virtual")
    for p, rid in (("lockstep", "4ee160255b405778"), ("async", "8e2a4a746ded4b29"),
                   ("event", "2a304580d3e874c4")):
        assert run_id(make_config({**cfg, "protocol": p})) == rid
        assert run_id(make_config({**cfg, "protocol": p, "faults": "none",
                                   "faults_seed": 0})) == rid
        assert run_id(make_config({**cfg, "protocol": p, "faults": "faults:loss=0.1"})) != rid



# ----------------------------------------------------------------------------- async/event:
# the rounds' modifiers, link failures and poisoned models (docs/concepts/rules.md#the-sfg-family, docs/concepts/outages.md#link-failures, attacks)
EV = {**TINY, "clock": "virtual", "protocol": "async", "jitter": 0.5, "rounds": 12,
      "compute": "const:value=30", "process": "bursty:u=0.6", "eval_every": 12}


def _events(**kw):
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    cfg = {**EV, **kw}
    if cfg["protocol"] == "event":  # no timer: the event protocol refuses a jitter
        cfg.pop("jitter")
    return simulate_events(resolve_config(cfg))


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_catchup_on_the_clock_takes_its_own_steps(protocol):
    """+catchup: a returning device's local round takes K·(1 + min(τ, 3)) steps — τ its own
    age before the round, which no rule changes — so its compute time and schedule are its own
    (the digest says so), and its extra steps draw from their own stream."""
    from sfg.clock.schedule import LOCAL, make_schedule, make_world
    from sfg.clock.settings import make_settings

    s = make_settings({**EV, "protocol": protocol})
    w = make_world(s.with_bytes(0.0), process=EV["process"], graph=EV["graph"],
                   n=EV["n_clients"], rounds=EV["rounds"], seed=1)
    plain = make_schedule(w, s, local_steps=2, seed=1)
    catch = make_schedule(w, s, local_steps=2, seed=1, catchup=True)
    assert plain.digest() != catch.digest()
    got = staleness_events(parse_rule("sfg-cut+catchup"), w, catch, seed=1)
    loc = catch.kind == LOCAL
    tau = got["facts"][loc, 1].astype(int)
    want = np.where(tau >= 1, 2 * (1 + np.minimum(tau, 3)), 2)
    assert (tau >= 1).any() and np.array_equal(catch.nsteps[loc], want)
    # a local round lasts its steps' compute time
    assert np.allclose(catch.end[loc] - catch.time[loc], want * 30.0)
    a, b = _events(rule="sfg-cut", protocol=protocol), _events(rule="sfg-cut+catchup",
                                                             protocol=protocol)
    assert b["meta"]["schedule_digest"] != a["meta"]["schedule_digest"]
    if protocol == "async":  # the same wakes, longer rounds for the returning
        assert b["meta"]["client_steps"] > a["meta"]["client_steps"]
    else:  # back to back: the same busy time in fewer, longer local rounds
        assert b["metrics"]["local_rounds"] < a["metrics"]["local_rounds"]


def test_amplification_on_the_clock():
    """update-amplification scales a returning device's update by 1 + min(τ, c): with no
    outages no device ever returns and it is DFedAvg bit for bit; with outages it differs."""
    none = {"process": "none"}
    assert torch.equal(_events(rule="update-amplification", **none)["params"],
                       _events(rule="dfedavg", **none)["params"])
    assert not torch.equal(_events(rule="update-amplification")["params"],
                           _events(rule="dfedavg")["params"])


def test_link_failures_on_the_clock():
    """docs/concepts/outages.md#link-failures on the clock: a message whose transfer ends in a Δ-round in which its link is
    down is lost; no candidate ever crosses such a link."""
    from sfg.clock.schedule import make_schedule, make_world
    from sfg.clock.settings import make_settings
    from sfg.world.outages.links import link_failures

    s = make_settings(EV).with_bytes(0.0)
    w = make_world(s, process=EV["process"], graph=EV["graph"], n=EV["n_clients"],
                   rounds=EV["rounds"], seed=1)
    sc = make_schedule(w, s, local_steps=2, seed=1, link_failure=0.5)
    live = link_failures(w.graph.edges, EV["rounds"], p=0.5, seed=1)
    nb = np.flatnonzero(sc.cmsg >= 0)
    r_of = (sc.end[sc.cmsg[nb]] // 600.0).astype(int)  # instant uplink: sent at the end
    assert nb.size and live[r_of, w.rg.edge_id[sc.cslot[nb]]].all()
    assert sc.stats["lost_link"] > 0
    base = make_schedule(w, s, local_steps=2, seed=1)
    assert base.stats["candidates"] > sc.stats["candidates"]


def test_poisoned_models_on_the_clock():
    """Attackers' messages carry the poisoned model (sign-flip) and attackers keep their own:
    honest accuracy drops; frac = 0 is exactly the run without an attack."""
    clean = _events(rule="sfg-cut")
    zero = _events(rule="sfg-cut", attack="forge:frac=0,model=sign-flip")
    assert torch.equal(zero["params"], clean["params"])
    hit = _events(rule="dfedavg", attack="forge:frac=0.25,claim=honest,model=sign-flip")
    ref = _events(rule="dfedavg")
    assert hit["metrics"]["acc_honest_mean"] < ref["metrics"]["acc_mean"] - 0.05
    assert hit["meta"]["schedule_digest"] == ref["meta"]["schedule_digest"]


def test_clip_on_the_clock_by_hand():
    """+clip per local round: x + Σ_{j≠i} w_j · clip(x_j − x, r), r the lower median of the
    neighbour candidates' distances. Receiver 0 at the origin with neighbours at distance 1
    and 3 (weights 0.5, 0.25, 0.25): r = 1, the far one is scaled to distance 1; receiver 1
    alone keeps its model."""
    from sfg.clock.train import _clipped

    M = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0], [5.0, 5.0]])
    wt = torch.tensor([0.5, 0.25, 0.25, 1.0])
    row = np.array([0, 0, 0, 1])
    got = _clipped(M, wt, row, np.array([0, 3]), 2)
    np.testing.assert_allclose(got.numpy(), [[0.25, 0.25], [5.0, 5.0]], atol=1e-7)
    # and in a run: with sign-flipping attackers +clip changes the models
    att = "forge:frac=0.25,claim=honest,model=sign-flip"
    assert not torch.equal(_events(rule="sfg-cut", attack=att)["params"],
                           _events(rule="sfg-cut+clip", attack=att)["params"])


def test_model_memory_on_the_clock():
    """model-memory on async/event: its kernel on an unbounded window (every neighbour's
    latest message remembered). With every device online, no jitter and local rounds shorter
    than the period, nothing older than one period is ever held, so it is DFedAvg bit for bit;
    with outages it also averages in the remembered models of offline neighbours, and
    differs."""
    for proto in ("async", "event"):
        none = {"process": "none", "protocol": proto, "jitter": 0.0}
        assert torch.equal(_events(rule="model-memory", **none)["params"],
                           _events(rule="dfedavg", **none)["params"]), proto
    a, b = _events(rule="model-memory+sfg-l"), _events(rule="sfg-l")
    assert not torch.equal(a["params"], b["params"])
    assert a["metrics"]["messages"] > b["metrics"]["messages"]  # remembered candidates
