"""Peers chosen per exchange on the virtual clock (sfg.clock.peersim): the compiled pass equals
the plain reference (tests/reference_peers.py) message by message on random worlds, the
schedule's candidates are the messages that reached, rules stay paired, and what does not run
with peers in this version is refused with one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from reference_peers import messages as reference_messages

from sfg.clock.events import time_order
from sfg.clock.links import loss_key, transfer_seconds
from sfg.clock.pull import Simulation, all_events
from sfg.clock.replay import replay_clock
from sfg.clock.schedule import LOCAL, make_schedule, make_world
from sfg.clock.settings import make_settings
from sfg.errors import SfgError
from sfg.util.rng import counter_key
from sfg.world.peers import new_tables, parse_peers, peers_key, tie_key

CASES = [
    ("async", "epidemic:s=3", {"jitter": 0.5}),
    ("async", "online:s=2,view=5,gossip=2", {"latency": "const:value=120", "jitter": 0.3}),
    ("event", "online:s=3", {"uplink": "const:value=2000", "message_bytes": 100000,
                             "loss": "const:value=0.2"}),
    ("event", "epidemic:s=2", {"latency": "const:value=300"}),
    # instant, and every device commits at once: messages arrive at the instant they leave
    ("async", "online:s=2,view=3,gossip=1", {"compute": "const:value=20"}),
]


def _world(protocol, extra, seed, n=30):
    s = make_settings({"clock": "virtual", "protocol": protocol,
                       "compute": "lognormal:median=20,sigma=0.5", **extra})
    return s, make_world(s, process="bursty:u=0.6", graph="knn:k=4", n=n, rounds=40, seed=seed)


def _same_messages(r, msg, want):
    """The simulation's messages that reached (its table) and its counts and fingerprint of
    all of them (sfg.clock.peersim.fingerprint) are the reference's ``want``."""
    from reference_peers import fingerprint

    from sfg.clock import peersim as ps

    mine = list(zip(msg[ps.M_EVENT].astype(int).tolist(), msg[ps.M_SEND].astype(int).tolist(),
                    msg[ps.M_RECV].astype(int).tolist(), msg[ps.M_ARRIVAL].tolist(),
                    strict=True))
    assert mine == [(e, i, j, a) for e, i, j, a, f in want if f == 0]
    c = r["peer_counts"]
    fates = [f for *_, f in want]
    assert [c[ps.C_DELIVERED], c[ps.C_LOST_SENDER], c[ps.C_OFFLINE], c[ps.C_LOST_RANDOM]] == \
        [fates.count(f) for f in range(4)]
    assert c[ps.C_SENT] == len(fates) - fates.count(1)
    assert c[ps.C_PRINT] == fingerprint(want)
    assert fates.count(0) and fates.count(2)  # some reached, some found their target offline


def _simulated_messages(world, s, p, protocol, seed, pull=False):
    """The simulation's events and its messages to peers (sfg.clock.peersim), by event row."""
    sim = Simulation(world, s, protocol, local_steps=5, seed=seed, catchup=False, pull=pull,
                     peers=p)
    r = sim.span()
    return sim, r, r["messages"]


@pytest.mark.parametrize("protocol,peers,extra", CASES)
def test_compiled_pass_is_the_reference(protocol, peers, extra):
    seed = 3
    s, world = _world(protocol, extra, seed)
    p = parse_peers(peers)
    _, r, msg = _simulated_messages(world, s, p, protocol, seed)
    E = r["events"]
    loc = np.flatnonzero(E[:, 2] == LOCAL)
    const = {k: float(str(getattr(s, k)).split("=")[-1]) for k in ("latency", "loss")}
    on = world.online
    tid, tt, _, tn = new_tables(p, seed, world.graph)
    start = {i: {int(tid[i, a]): float(tt[i, a]) for a in range(tn[i])} for i in range(world.n)}
    order = loc[np.lexsort((E[loc, 1], E[loc, 4]))]
    commits = [(E[e, 0], E[e, 4], int(E[e, 1]), int(E[e, 5]), int(e)) for e in order]
    want = reference_messages(
        p.kind, p.s, max(p.view, 1), p.gossip, world.n, world.horizon,
        lambda i, t: bool(on.online_at(i, t)),
        lambda i, a, b: bool(on.online_through(i, a, b)) and b <= on.next_off(i, a),
        commits, transfer_seconds(world, float(s.message_bytes or 0.0)), const["latency"],
        const["loss"], peers_key(seed), tie_key(seed), loss_key(seed, "message"), start)
    _same_messages(r, msg, want)
    # the schedule's candidates are messages that reached the event's device before it
    sched = make_schedule(world, s, local_steps=5, seed=seed, peers=p)
    A = all_events(r)  # (the async offline wakes made apart after the simulation's rows)
    rank = np.empty(A.shape[0], np.int64)
    rank[time_order(A[:, 0], A[:, 1].astype(np.int64), A[:, 2].astype(np.int64))] = \
        np.arange(A.shape[0])
    reached = {(int(rank[e]), j) for e, _, j, a, f in want if f == 0}
    for r_ in np.flatnonzero(sched.kind == LOCAL)[:200]:
        for c in range(sched.cptr[r_] + 1, sched.cptr[r_ + 1]):
            src = int(sched.cmsg[c])
            assert (src, int(sched.dev[r_])) in reached and src < r_
    assert sched.stats["delivered"] == len(reached)


@pytest.mark.parametrize("protocol,peers,extra", CASES)
def test_recent_messages_give_every_links_candidates(monkeypatch, protocol, peers, extra):
    import sfg.clock.assemble as asm

    s, world = _world(protocol, {**extra, "window": 1.5}, 4)
    walk = make_schedule(world, s, local_steps=5, seed=4, peers=parse_peers(peers))
    monkeypatch.setattr(asm, "WALK", False)  # a query per link of the union graph
    every = make_schedule(world, s, local_steps=5, seed=4, peers=parse_peers(peers))
    for name in ("cptr", "cslot", "cmsg", "cwait"):
        assert np.array_equal(getattr(walk, name), getattr(every, name)), name
    assert walk.digest() == every.digest() and walk.stats["candidates"] > 0


def test_rules_paired_and_digests_distinct():
    s, world = _world("async", {"jitter": 0.4}, 5)
    kw = {"seed": 5, "settings": s, "n": 30, "rounds": 40, "local_steps": 5, "world": world}
    a = replay_clock("bursty:u=0.6", "dfedavg", peers="online:s=3", **kw)
    b = replay_clock("bursty:u=0.6", "sfg-cut", peers="online:s=3", **kw)
    again = replay_clock("bursty:u=0.6", "dfedavg", peers="online:s=3", **kw)
    other = replay_clock("bursty:u=0.6", "dfedavg", peers="epidemic:s=3", **kw)
    fixed = replay_clock("bursty:u=0.6", "dfedavg", **kw)
    assert a["meta"]["schedule_digest"] == b["meta"]["schedule_digest"]
    assert json.dumps(a, sort_keys=True) == json.dumps(again, sort_keys=True)  # (NaN too)
    digests = {x["meta"]["schedule_digest"] for x in (a, other, fixed)}
    assert len(digests) == 3
    for k in ("peer_messages_per_device_hour", "membership_bytes_per_device_hour",
              "returning_aggregations"):
        assert a["metrics"][k] == b["metrics"][k]
    assert "peer_messages_per_device_hour" not in fixed["metrics"]
    assert other["metrics"]["membership_bytes_per_device_hour"] == 0.0
    assert a["metrics"]["membership_bytes_per_device_hour"] > 0.0


@pytest.mark.parametrize("extra,peers,words", [
    ({"protocol": "lockstep", "on_return": "pull:timeout=60"}, "epidemic:s=2", "lockstep"),
    ({"latency": "lognormal:median=1,sigma=1", "on_return": "pull:timeout=60"}, "online:s=2",
     "latency drawn per link"),
    ({"latency": "lognormal:median=1,sigma=1"}, "epidemic:s=2", "latency drawn per link"),
    ({"faults": "faults:loss=0.1"}, "epidemic:s=2", "faults"),
])
def test_what_does_not_run_is_refused(extra, peers, words):
    s = make_settings({"clock": "virtual", "protocol": "async", **extra})
    with pytest.raises(SfgError, match=words) as e:
        replay_clock("bursty:u=0.8", "dfedavg", seed=1, settings=s, n=20, rounds=10,
                     peers=peers)
    assert "\n" not in str(e.value)
    with pytest.raises(SfgError, match="cannot run with peers"):
        replay_clock("bursty:u=0.8", "dfl-aa", seed=1, settings=make_settings(
            {"clock": "virtual", "protocol": "async"}), n=20, rounds=10, peers="epidemic:s=2")


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_epidemic_pull_asks_drawn_targets(protocol):
    """A return's S requests go to the targets drawn at the return (stream (seed, "peers",
    "pull"), ids (device, its return's index, try)); the replies that came back are
    candidates of the returning device's first aggregation, on the run's links."""
    from sfg.clock.pull import Simulation, returns_of
    from sfg.util.rng import counter_key
    from sfg.world.peers import draw_epidemic

    s, world = _world(protocol, {"on_return": "pull:timeout=120", "latency": "const:value=5"}, 6)
    p = parse_peers("epidemic:s=3")
    sim = Simulation(world, s, protocol, local_steps=5, seed=6, catchup=False, peers=p)
    sim.span()  # (the requests are drawn at the returns)
    rq = sim.requests
    rptr = returns_of(world)[0]
    key, buf = np.uint64(counter_key(6, "peers", "pull")), np.empty(3, np.int64)
    q = 0
    for i in range(world.n):
        for k in range(rptr[i + 1] - rptr[i]):
            draw_epidemic(key, i, k, world.n, 3, buf)
            assert rq["qj"][q:q + 3].tolist() == buf.tolist() and (rq["qret"][q:q + 3] == i).all()
            q += 3
    assert q == rq["qj"].size > 0
    sched = make_schedule(world, s, local_steps=5, seed=6, peers=p)
    assert sched.stats["pull_replies_delivered"] > 0
    assert sched.stats["pull_requests"] == float(rq["sent"].sum())
    kw = {"seed": 6, "settings": s, "n": 30, "rounds": 40, "local_steps": 5, "world": world}
    a = replay_clock("bursty:u=0.6", "dfedavg", peers="epidemic:s=3", **kw)
    b = replay_clock("bursty:u=0.6", "sfg-cut", peers="epidemic:s=3", **kw)
    assert a["meta"]["schedule_digest"] == b["meta"]["schedule_digest"] == sched.digest()
    assert a["metrics"]["returns_heard"] == b["metrics"]["returns_heard"] > 0


@pytest.mark.parametrize("peers", ["epidemic:s=3", "online:s=3"])
def test_lockstep_is_the_rounds_replay_on_a_trivial_clock(peers):
    """With no compute, latency or transfer time the clock's lockstep is the replay in rounds:
    the same participants, the same sampled sends, the same metrics."""
    from sfg.modelfree import replay

    s = make_settings({"clock": "virtual", "protocol": "lockstep"})
    kw = {"n": 40, "rounds": 60}
    clock = replay_clock("bursty:u=0.8", "sfg-cut", seed=2, settings=s, horizon=20,
                         peers=peers, **kw)
    rounds = replay(["bursty:u=0.8"], ["sfg-cut"], [2], n=40, T=60, horizon=20, peers=peers,
                    threads=1)[0]
    for k in ("returning_aggregations", "returning_aggregations_heard", "premise", "spread_lag",
              "final_mean_lag", "H", "peer_messages_per_device_hour",
              "membership_bytes_per_device_hour"):
        assert clock["metrics"][k] == pytest.approx(rounds[k], rel=1e-12, nan_ok=True), k


def test_lockstep_deadlines_make_messages_late():
    slow = make_settings({"clock": "virtual", "protocol": "lockstep", "compute": "const:value=50",
                          "latency": "const:value=400"})
    quick = make_settings({"clock": "virtual", "protocol": "lockstep",
                           "compute": "const:value=50"})
    kw = {"seed": 3, "n": 40, "rounds": 60, "local_steps": 5, "peers": "epidemic:s=3"}
    a = replay_clock("bursty:u=0.8", "dfedavg", settings=quick, **kw)
    b = replay_clock("bursty:u=0.8", "dfedavg", settings=slow, **kw)
    c = replay_clock("bursty:u=0.8", "sfg-cut", settings=slow, **kw)
    assert a["metrics"]["late"] == 0 and b["metrics"]["late"] > 0
    assert b["meta"]["schedule_digest"] == c["meta"]["schedule_digest"] != \
        a["meta"]["schedule_digest"]
    assert b["metrics"]["returning_aggregations_heard"] < a["metrics"]["returning_aggregations_heard"]


PULL_CASES = [
    ("async", "online:s=2,view=5,gossip=2", {"jitter": 0.5, "latency": "const:value=5"}),
    ("event", "online:s=3", {"uplink": "const:value=2000", "message_bytes": 100000,
                             "loss": "const:value=0.2", "latency": "const:value=20"}),
    ("async", "online:s=3,view=4,gossip=1", {"compute": "const:value=20"}),  # instants shared
    ("event", "epidemic:s=2", {"latency": "const:value=30"}),
    # long first local rounds: devices asked before they sent a model answer empty, some of
    # them after they heard of others (an empty answer carries no entries)
    ("async", "online:s=3", {"compute": "lognormal:median=100,sigma=1", "jitter": 0.5}),
]


@pytest.mark.parametrize("protocol,peers,extra", PULL_CASES)
def test_pull_draws_from_the_tables_as_they_stand(protocol, peers, extra):
    """With pull on return the tables change along the simulation: a return draws its S
    requests' targets from its table as it stands, the requests, replies and "unreachable"
    answers feed the tables, and commits draw from them. The plain reference replays the
    tables along the simulation's own timings and fates (tests/reference_peers.py) and draws
    the same targets for every commit and every return, and carries as many entries."""
    from reference_peers import membership

    seed = 7
    s, world = _world(protocol, {**extra, "on_return": "pull:timeout=120"}, seed)
    p = parse_peers(peers)
    sim, r, msg = _simulated_messages(world, s, p, protocol, seed, pull=True)
    E, rq = r["events"], sim.requests
    tid, tt, _, tn = new_tables(p, seed, world.graph)
    start = {i: {int(tid[i, a]): float(tt[i, a]) for a in range(tn[i])} for i in range(world.n)}
    loc = np.flatnonzero(E[:, 2] == LOCAL)
    loc = loc[np.lexsort((loc, E[loc, 1], E[loc, 4]))]  # as the simulation commits them
    commits = [(E[e, 4], E[e, 8], E[e, 0], int(E[e, 1]), int(E[e, 5]), int(e)) for e in loc]
    on = world.online
    const = {k: float(str(getattr(s, k)).split("=")[-1]) for k in ("latency", "loss")}
    rptr, rtime, _ = sim.returns
    returns = [(rtime[k], i, k - rptr[i], int(rq["qptr"][k])) for i in range(world.n)
               for k in range(rptr[i], rptr[i + 1])]
    requests = {q: (int(rq["qret"][q]), int(rq["qj"][q]), int(rq["qcode"][q]), rq["qtime"][q])
                for q in range(rq["qj"].size)}
    replies = {q: (r["reply_arrival"][q], r["reply_held"][q], bool(r["reply_ok"][q]),
                   bool(r["reply_sent"][q]), bool(r["reply_src"][q] >= 0))
               for q in range(rq["qj"].size)}
    want, asked, entries = membership(
        p.kind, p.s, max(p.view, 1), p.gossip, world.n, peers_key(seed),
        counter_key(seed, "peers", "pull"), tie_key(seed), start, commits, returns, requests,
        replies, (world.horizon, lambda i, t: bool(on.online_at(i, t)),
                  lambda i, a, b: bool(on.online_through(i, a, b)) and b <= on.next_off(i, a),
                  transfer_seconds(world, float(s.message_bytes or 0.0)), const["latency"],
                  const["loss"], loss_key(seed, "message")))
    _same_messages(r, msg, want)
    for k in range(rtime.size):
        q0, q1 = rq["qptr"][k], rq["qptr"][k + 1]
        assert rq["qj"][q0:q1].tolist() == asked[int(q0)]
    assert entries == r["peer_counts"][2] and (entries > 0) == (p.kind == "online")
    codes = set(rq["qcode"].tolist())
    assert {0, 1} <= codes  # some requests reached their target, some found it offline
    assert r["reply_ok"].any()
    if "lognormal:median=100" in str(extra):  # empty answers (targets that sent nothing yet)
        assert ((r["reply_src"] < 0) & r["reply_ok"]).any()


def test_online_near_answers_as_the_search_does():
    """sfg.world.locate.online_near (a row per device: the interval found last) answers what
    locate_one's search answers, for queries nearly in time order and for jumps back and
    forth, on devices with no interval, one, or many (touching ones too)."""
    from sfg.world.locate import locate_one, near_start, online_near

    rng = np.random.default_rng(9)
    n = 12
    counts = rng.integers(0, 6, n)
    counts[:2] = (0, 1)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    start, end = np.empty(ptr[-1]), np.empty(ptr[-1])
    for i in range(n):
        edges = np.sort(rng.choice(np.arange(0.0, 60.0, 2.0), 2 * counts[i], replace=False))
        start[ptr[i]:ptr[i + 1]], end[ptr[i]:ptr[i + 1]] = edges[0::2], edges[1::2]
        if counts[i] > 1:  # an interval that ends where the next one starts
            end[ptr[i]] = start[ptr[i] + 1]
    near = near_start(ptr, start)
    t = np.sort(rng.uniform(-5, 70, 3000))
    t[::7] = rng.uniform(-5, 70, t[::7].size)  # jumps
    t[::11] = np.round(t[::11] / 2.0) * 2.0  # on the intervals' ends
    for q in range(t.size):
        i = int(rng.integers(0, n))
        assert online_near(ptr, start, end, i, t[q], near) == locate_one(ptr, start, end, i,
                                                                         t[q])[1]
