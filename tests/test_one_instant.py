"""One instant (docs/concepts/clock.md#one-instant): the events of one virtual instant are
processed in the same phases by the clock's engine and by the node on the virtual clock
(sfg.clock.instant), so the same run gives the same curves on both — every evaluation point
(its instant, mean and 10th percentile) and every accuracy metric, time to accuracy included —
through the entry points users call (``sfg.run(clock="virtual")`` and
``sfg.swarm(nodes="virtual")``): lockstep and async, ``on_return`` pull off and on, with
message faults, under the defaults (zero compute and latency, no jitter: local rounds end
exactly at the evaluation instants) and with jitter. And relabelling the devices of a world
only permutes the per-device results of its schedule and staleness."""

from __future__ import annotations

import math

import numpy as np
import pytest
from crosspath import assert_same_bits
from running import bounded

import sfg
from sfg.clock.instant import Phase, evaluation_instants, instant_order
from sfg.clock.replay import staleness_events
from sfg.clock.schedule import LOCAL, World, make_schedule, time_order
from sfg.clock.settings import make_settings
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.world.graphs import Graph
from sfg.world.timeline import Intervals

# digits and the mlp, 8 devices, 12 periods of 600 s; evaluations every 2 periods
BASE = dict(n_clients=8, rounds=12, local_steps=2, dataset="digits", model="mlp",
            process="bursty:u=0.5", rule="sfg-cut", seed=1, eval_every=2, backend="loop",
            target_accuracy=0.3)
# every accuracy figure both engines report
SHARED = ("acc_mean", "acc_p10", "acc_time_avg", "acc_q1", "acc_q2", "acc_q3", "acc_q4",
          "time_to_accuracy_h", "reached_target")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _both(**settings):
    """The same run on the clock's engine and on the node under the virtual clock."""
    eng = bounded(lambda: sfg.run(BASE, clock="virtual", **settings), 120, "the engine hangs")
    nodes = bounded(lambda: sfg.swarm(BASE, nodes="virtual", **settings), 120,
                    "the swarm hangs")
    return eng, nodes


def assert_same_run(eng, nodes) -> None:
    """The whole curves and every shared accuracy metric equal, and the same models."""
    assert nodes.curves == eng.curves  # every point: its instant (and round), mean and p10
    assert len(eng.curves["hours"]) >= 4
    for k in SHARED:
        assert k in eng.metrics and k in nodes.metrics, k
        assert _same(nodes.metrics[k], eng.metrics[k]), (k, nodes.metrics[k], eng.metrics[k])
    assert [nd["acc"] for nd in nodes["nodes"]] == eng.accuracy.tolist()
    assert_same_bits(nodes.params, eng.params)


@pytest.mark.crosspath
@pytest.mark.parametrize("settings", [
    pytest.param({}, id="defaults"),  # every round ends at an evaluation instant
    pytest.param({"compute": "const:value=150", "latency": "const:value=2"}, id="compute"),
])
def test_lockstep_node_has_the_engines_curves(settings):
    eng, nodes = _both(protocol="lockstep", **settings)
    assert eng.curves["round"] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert_same_run(eng, nodes)
    assert eng.metrics["reached_target"] == 1.0  # the time to accuracy is a number


@pytest.mark.crosspath
@pytest.mark.parametrize("settings", [
    # the defaults: every wake, commit and arrival of a period at its start, which is also
    # an evaluation instant; the node once evaluated before the commits there
    pytest.param({}, id="defaults"),
    # jitter: the instants fall between the wakes; eval_seconds not a multiple of P
    pytest.param({"jitter": 0.5, "compute": "lognormal:median=20,sigma=0.5",
                  "latency": "const:value=2", "eval_seconds": 450.0}, id="jitter"),
    # message faults (lost, delayed) under the defaults' ties
    pytest.param({"faults": "faults:loss=0.2,delay=40", "faults_seed": 3}, id="faults"),
    # a finite uplink: each broadcast's transfers back to back, times that floats round
    # (the one link model, sfg.clock.links, for the engine and the node's network)
    pytest.param({"uplink": "const:value=30000", "compute": "const:value=7",
                  "latency": "const:value=0.3", "jitter": 0.3}, id="uplink"),
    # pull on return: K steps of 150 s end on every other evaluation instant (300 s apart)
    pytest.param({"on_return": "pull:timeout=60", "compute": "const:value=150",
                  "eval_seconds": 300.0}, id="pull"),
    pytest.param({"on_return": "pull:timeout=60", "compute": "const:value=150",
                  "latency": "const:value=3", "jitter": 0.3,
                  "faults": "faults:loss=0.1,delay=20", "faults_seed": 2}, id="pull-jitter-faults"),
])
def test_async_node_has_the_engines_curves(settings):
    eng, nodes = _both(protocol="async", **settings)
    every = settings.get("eval_seconds", 2 * 600.0)
    want = evaluation_instants(12 * 600.0, every) / 3600.0
    assert eng.curves["hours"] == want.tolist()
    assert_same_run(eng, nodes)


@pytest.mark.crosspath
def test_the_example_of_the_report_gives_one_curve():
    """``sfg swarm --clock virtual --nodes 8 --protocol async`` and ``sfg run --clock
    virtual --protocol async --clients 8`` with the same flags: once 0.54125 against 0.54375
    (the node evaluated after its round 9, before the commits at 1.67 h)."""
    s = dict(n_clients=8, dataset="digits", model="mlp", process="bursty:u=0.8",
             rule="sfg-cut", seed=1, rounds=20, protocol="async", backend="loop")
    eng = bounded(lambda: sfg.run(s, clock="virtual"), 120, "the engine hangs")
    nodes = bounded(lambda: sfg.swarm(s, nodes="virtual"), 120, "the swarm hangs")
    assert nodes.curves == eng.curves
    assert nodes.metrics["acc_time_avg"] == eng.metrics["acc_time_avg"] == 0.5437500048428774


@pytest.mark.crosspath
def test_target_accuracy_and_eval_seconds_reach_the_node():
    """The node honours both settings as the engine does: another target moves the time to
    accuracy, another eval_seconds the instants."""
    a = bounded(lambda: sfg.swarm(BASE, nodes="virtual", protocol="async"), 120, "hangs")
    b = bounded(lambda: sfg.swarm(BASE, nodes="virtual", protocol="async", target_accuracy=0.99,
                                  eval_seconds=900.0), 120, "hangs")
    assert a.metrics["reached_target"] == 1.0 and b.metrics["reached_target"] == 0.0
    assert math.isnan(b.metrics["time_to_accuracy_h"])
    assert b.curves["hours"] == (evaluation_instants(7200.0, 900.0) / 3600.0).tolist()
    assert a.curves["hours"] != b.curves["hours"]


@pytest.mark.crosspath
def test_the_swarm_command_takes_eval_seconds_and_target_accuracy(capsys):
    """``sfg swarm --clock virtual --eval-seconds S --target-accuracy A`` prints the engine's
    curve (``sfg run --clock virtual`` with the same flags); lockstep refuses eval_seconds
    (the lockstep engine evaluates by rounds), real nodes both (they take their own time)."""
    import json

    from sfg.cli.main import main

    flags = ["-n", "8", "-T", "12", "-K", "2", "-p", "bursty:u=0.5", "--protocol", "async",
             "--eval-seconds", "900", "--target-accuracy", "0.3", "--json"]
    assert main(["swarm", "--clock", "virtual", *flags]) == 0  # the nodes train with loop
    nodes = json.loads(capsys.readouterr().out)
    assert main(["run", "--clock", "virtual", *flags, "--backend", "loop"]) == 0
    eng = json.loads(capsys.readouterr().out)
    assert nodes["curves"] == eng["curves"]
    assert nodes["curves"]["hours"] == (evaluation_instants(7200.0, 900.0) / 3600.0).tolist()
    assert nodes["metrics"]["time_to_accuracy_h"] == eng["metrics"]["time_to_accuracy_h"]
    for extra, needle in [(["--clock", "virtual", "--protocol", "lockstep"], "eval_seconds"),
                          ([], "--eval-seconds is a setting of the virtual clock")]:
        args = ["swarm", *extra, "-n", "8", "-T", "4", "--eval-seconds", "900"]
        assert main(args) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
        assert len(err) == 1 and needle in err[0], err


def test_a_local_round_ending_after_the_run_is_unfinished_on_the_node_too():
    """A wake late in the last period whose K steps end after T·P: the engine counts it
    unfinished (nothing committed); so does the node, and the models stay equal."""
    s = dict(BASE, rounds=10, protocol="async", jitter=0.9, compute="const:value=150")
    eng = bounded(lambda: sfg.run(s, clock="virtual"), 120, "the engine hangs")
    nodes = bounded(lambda: sfg.swarm(s, nodes="virtual"), 120, "the swarm hangs")
    assert eng.metrics["unfinished"] >= 1
    assert nodes.metrics["unfinished"] == eng.metrics["unfinished"]
    assert_same_bits(nodes.params, eng.params)


def test_pull_with_local_rounds_that_take_no_time_runs_and_the_node_agrees():
    """Under ``on_return: pull`` with compute 0 a request arriving at t meets a local round
    that ends at t: the request (phase 2) is answered before the commit (phase 5), so the
    reply carries the message sent before t. This was refused with one line while the
    simulation of returns committed first; now it runs, the node and the engine agree, and
    the model-free replay gives the schedule the engine trains on."""
    s = dict(BASE, rounds=20, process="bursty:u=0.8", protocol="async",
             on_return="pull:timeout=60")
    eng, nodes = _both(**s)
    assert_same_run(eng, nodes)
    rep = sfg.replay(dict(s, clock="virtual"))
    assert rep.metrics["pull_replies"] > 0
    assert rep.meta["schedule_digest"] == eng.meta["schedule_digest"]


@pytest.mark.crosspath
@pytest.mark.parametrize("settings", [
    # K·c + λ = 2·30 + 540 = P: every message arrives exactly at its receiver's next wake
    pytest.param({"latency": "const:value=540", "compute": "const:value=30"}, id="async"),
    pytest.param({"latency": "const:value=540", "compute": "const:value=30",
                  "faults": "faults:loss=0.2,delay=40", "faults_seed": 3,
                  "on_return": "pull:timeout=120"}, id="async-pull-faults"),
])
def test_a_message_arriving_at_a_wake_is_held_by_node_and_engine(settings):
    """A message sent before t that arrives exactly at a wake at t is held by it (phase 2
    before phase 4), on the engine and on the node; the engine once left it for the next
    wake, where the node took it: curves and models differed."""
    eng, nodes = _both(protocol="async", **settings)
    assert_same_run(eng, nodes)
    rep = sfg.replay(dict(BASE, protocol="async", clock="virtual", **settings))
    assert rep.metrics["returns_heard"] > 0  # what arrives at a wake is heard there


def test_the_nodes_network_times_a_broadcast_as_the_engine():
    """The in-memory network's uplink queue (sfg.net.memory.MemoryNetwork.reserve) gives a
    broadcast's k-th transfer the engine's end, start + (k+1)·s (sfg.clock.links.
    transfer_end), not a running sum; a transfer of its own (a reply) starts a new queue."""
    from sfg.clock.links import transfer_end
    from sfg.net.memory import MemoryNetwork
    from sfg.net.simclock import run_virtual

    s = 0.1
    net = MemoryNetwork(2, uplink=np.array([10.0, 10.0]))

    async def main() -> list[float]:
        ends = [net.reserve(0, 0.7, s)[1] for _ in range(7)]
        ends.append(net.reserve(0, 0.7, s, alone=True)[1])  # a reply behind the broadcast
        ends.append(net.reserve(0, 0.7, s)[1])              # a new broadcast behind it
        return ends

    ends = run_virtual(main())
    want = [transfer_end(0.7, k, s) for k in range(7)]
    assert ends[:7] == want
    running = 0.7
    for _ in range(7):
        running += s
    assert running != want[-1]  # the running sum rounds elsewhere: the case is real
    assert ends[7] == transfer_end(want[-1], 0, s) and ends[8] == transfer_end(ends[7], 0, s)


def test_held_at_is_the_rule_the_schedule_counts():
    """The one rule of what a local round starting at t holds (sfg.clock.instant.held_at),
    by hand, and the schedule's compiled count (sfg.clock.schedule.held_count) against it on
    random sorted messages full of ties."""
    from sfg.clock.instant import held_at
    from sfg.clock.schedule import held_count

    assert held_at(600.0, 599.0, 10.0)                # arrived before
    assert held_at(600.0, 600.0, 60.0)                # arrives at t, sent before: phase 2
    assert not held_at(600.0, 600.0, 600.0)           # sent at t (phase 5): not yet
    assert not held_at(600.0, 601.0, 10.0)            # arrives after
    assert held_at(600.0, 600.0, -np.inf)             # a pull's reply arriving at t
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(0, 8))
        arrival = rng.integers(0, 5, m).astype(float)
        sent = np.minimum(arrival, rng.integers(0, 5, m).astype(float))
        o = np.lexsort((sent, arrival))
        arrival, sent = arrival[o], sent[o]
        now = float(rng.integers(0, 6))
        want = sum(held_at(now, a, s) for a, s in zip(arrival, sent, strict=True))
        assert held_count(arrival, sent, 0, m, now) == want


# ----------------------------------------------------------------------------- the phases
def test_the_phases_are_the_specifications_order():
    assert [p.name for p in Phase] == ["AVAILABILITY", "ARRIVAL", "PULL_END", "WAKE", "COMMIT",
                                       "EVALUATE"]
    assert list(Phase) == sorted(Phase)


def test_instant_order_ranks_by_time_then_phase_then_keys():
    time = np.array([5.0, 1.0, 5.0, 5.0, 1.0, 5.0])
    phase = np.array([Phase.COMMIT, Phase.WAKE, Phase.WAKE, Phase.ARRIVAL, Phase.WAKE,
                      Phase.WAKE])
    dev = np.array([0, 3, 2, 9, 1, 2])
    kind = np.array([0, 0, 0, 0, 0, 1])
    o = instant_order(time, phase, dev, -kind)
    assert o.tolist() == [4, 1, 3, 5, 2, 0]
    # the schedule's order is the wake phase's: time, device, an offline span first
    assert time_order(time, dev, kind).tolist() == np.lexsort((-kind, dev, time)).tolist()


def test_the_virtual_loop_ends_an_instant_after_everything_else_of_it():
    """``VirtualLoop.call_at_instant_end(t, f)``: f runs once the clock is at t, after every
    timer due at t, the callbacks they make ready and the idle hooks' work at t, and before
    any timer after t; an instant with nothing but its end is reached too."""
    import asyncio

    from sfg.net.simclock import VirtualLoop, run_virtual

    loop = VirtualLoop()
    seen: list[tuple[float, str]] = []
    pending: list[tuple[str, asyncio.Future]] = []

    def hook() -> bool:  # the batched trainer's part: the instant's requests, at once
        if not pending:
            return False
        for name, fut in pending:
            seen.append((loop.time(), f"train {name}"))
            fut.set_result(None)
        pending.clear()
        return True

    loop.add_idle_hook(hook)

    async def node(name: str, at: float) -> None:
        await asyncio.sleep(at)
        seen.append((loop.time(), f"wake {name}"))
        fut = loop.create_future()
        pending.append((name, fut))
        await fut
        seen.append((loop.time(), f"commit {name}"))

    async def main() -> None:
        loop.call_at_instant_end(10.0, lambda: seen.append((loop.time(), "end 10")))
        loop.call_at_instant_end(5.0, lambda: seen.append((loop.time(), "end 5")))
        await asyncio.gather(node("a", 10.0), node("b", 10.0), node("c", 10.0 + 1e-9))

    run_virtual(main(), loop=loop)
    loop.close()
    names = [n for _, n in seen]
    assert seen[0] == (5.0, "end 5")  # no timer at 5 s: reached for its end alone
    end = names.index("end 10")
    assert set(names[1:end]) == {"wake a", "wake b", "train a", "train b", "commit a",
                                 "commit b"}
    assert names[end + 1:] == ["wake c", "train c", "commit c"]
    assert seen[end][0] == 10.0 and seen[end + 1][0] > 10.0


def test_the_virtual_loop_runs_an_instants_phases_in_order():
    """``VirtualLoop.call_at_phase``: at one instant the timers (arrivals, time-outs) run
    first, then each phase's callbacks together, lowest phase first, whatever order they
    were given in; a callback given for the instant while it runs takes its phase's turn."""
    import asyncio

    from sfg.net.simclock import VirtualLoop, run_virtual

    loop = VirtualLoop()
    seen: list[tuple[float, str]] = []

    def note(what: str) -> None:
        seen.append((loop.time(), what))

    def wake(name: str) -> None:
        note(f"wake {name}")
        if name == "a":  # a local round that takes no time: it ends in this instant
            loop.call_at_phase(loop.time(), Phase.COMMIT, note, "commit a")

    async def arrival() -> None:
        await asyncio.sleep(10.0)
        note("arrival")

    async def main() -> None:
        loop.call_at_phase(10.0, Phase.EVALUATE, note, "evaluate")
        loop.call_at_phase(10.0, Phase.COMMIT, note, "commit b")
        loop.call_at_phase(10.0, Phase.WAKE, wake, "a")
        loop.call_at_phase(10.0, Phase.WAKE, wake, "b")
        loop.call_at_phase(4.0, Phase.WAKE, wake, "c")
        await arrival()
        await asyncio.sleep(5.0)
        note("later")

    run_virtual(main(), loop=loop)
    loop.close()
    assert seen == [(4.0, "wake c"), (10.0, "arrival"), (10.0, "wake a"), (10.0, "wake b"),
                    (10.0, "commit b"), (10.0, "commit a"), (10.0, "evaluate"),
                    (15.0, "later")]


# ----------------------------------------------------------------------------- relabelling
# a hand-built world (docs/concepts/clock.md#one-instant): 5 devices on a graph with degrees
# 1 to 3, whole-second compute and latency and online intervals on multiples of 10 s, so many
# events share an instant; instant uplinks, no loss, no jitter (the draws that are keyed by
# device ids are absent)
EDGES = np.array([[0, 1], [1, 2], [2, 3], [1, 3], [3, 4]])
ONLINE = {0: [(0, 60)], 1: [(0, 20), (30, 60)], 2: [(10, 60)], 3: [(0, 40), (50, 60)],
          4: [(0, 60)]}
COMPUTE = [2.0, 2.0, 5.0, 2.0, 10.0]


def _world(perm: np.ndarray) -> World:
    """The world with device i named perm[i] (every quantity moved with it)."""
    n = len(perm)
    g = Graph(n=n, edges=perm[EDGES], positions=None, name="hand")
    rg = RoundGraph.from_graph(g)
    dev, s, e = zip(*[(perm[d], a, b) for d, spans in ONLINE.items() for a, b in spans],
                    strict=True)
    iv = Intervals.from_pairs(n, np.array(dev), np.array(s, float), np.array(e, float), 60.0)
    inv = np.argsort(perm)
    # a link's latency from its ends' original names: 1 + (3·sender + receiver) mod 4 seconds
    lat = np.where(rg.is_self, 0.0, 1.0 + (3 * inv[rg.send] + inv[rg.recv]) % 4)
    compute = np.empty(n)
    compute[perm] = COMPUTE
    return World(graph=g, rg=rg, online=iv, available=np.ones((1, n), bool), compute=compute,
                 uplink=np.full(n, np.inf), latency=lat, loss=np.zeros(rg.n_slots),
                 horizon=60.0)


def _events(sched, perm_inv, got):
    """Every event under the original names: (time, device, kind, end, candidates as
    (sender, its sending event's time and device, waited units, weight))."""
    out = []
    for r in range(sched.n_events):
        a, b = sched.cptr[r], sched.cptr[r + 1]
        cands = []
        for c in range(a, b):
            m = int(sched.cmsg[c])
            sent = (float(sched.time[m]), int(perm_inv[sched.dev[m]])) if m >= 0 else None
            cands.append((sent, round(float(sched.cwait[c]), 9),
                          round(float(got["weights"][c]), 9)))
        out.append((float(sched.time[r]), int(perm_inv[sched.dev[r]]), int(sched.kind[r]),
                    float(sched.end[r]), tuple(sorted(cands, key=repr))))
    return sorted(out, key=repr)


@pytest.mark.parametrize("protocol,on_return", [("async", "none"), ("event", "none"),
                                                ("async", "pull:timeout=4"),
                                                ("event", "pull:timeout=4")])
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg"])
def test_relabelling_the_devices_only_permutes_the_results(protocol, on_return, rule):
    settings = make_settings({"clock": "virtual", "protocol": protocol, "round_seconds": 10.0,
                              "window": 2.0, "on_return": on_return})
    ident = np.arange(5)
    perm = np.array([3, 0, 4, 1, 2])
    out = []
    for p in (ident, perm):
        w = _world(p)
        sched = make_schedule(w, settings, local_steps=1, seed=1)
        got = staleness_events(parse_rule(rule), w, sched, seed=1)
        out.append((sched, got, np.argsort(p)))
    (s0, g0, i0), (s1, g1, i1) = out
    assert (s0.kind == LOCAL).sum() > 10  # a world with some work
    same_instant = np.unique(s0.time, return_counts=True)[1]
    assert same_instant.max() >= 3  # ties: several devices act at one instant
    # the events, their candidates, waits and weights: the same under the original names
    assert _events(s1, i1, g1) == _events(s0, i0, g0)
    # every count the same; per device, the final state permuted
    assert s1.stats == s0.stats
    assert g1["ages"][perm].tolist() == g0["ages"].tolist()
    # (lags: sums over a device's candidates in slot order, which the names change)
    assert np.allclose(g1["lags"][perm], g0["lags"], rtol=1e-12, atol=1e-12)
