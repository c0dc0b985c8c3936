"""The clock's async and event schedules assembled span by span of time (sfg.clock.assemble):
the pieces joined are the schedule made in one span, event by event and digest by digest; the
model-free replay run through the pieces gives the whole replay's digest and metrics; its
memory does not grow with the length of the run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import sfg.clock.replay as replay_mod
from sfg.clock.assemble import join
from sfg.clock.pull import Simulation
from sfg.clock.replay import replay_clock
from sfg.clock.schedule import exact_parts, make_schedule, make_world
from sfg.clock.settings import make_settings
from sfg.round.staleness import wake_jitter

VARIANTS = [
    {},
    {"jitter": 0.5, "compute": "lognormal:median=20,sigma=1",
     "latency": "lognormal:median=200,sigma=1"},
    {"faults": "faults:loss=0.1,delay=300,reorder=0.2", "jitter": 0.3},
    {"uplink": "const:value=1000", "message_bytes": 100000},
    {"window": 3, "latency": "const:value=900"},
]
COLUMNS = ("time", "dev", "kind", "t", "amount", "end", "step", "cptr", "cslot", "cmsg",
           "cwait", "samples")


def _settings(protocol: str, extra: dict) -> object:
    return make_settings({"clock": "virtual", "protocol": protocol,
                          "compute": "const:value=30", **extra})


@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("k", range(len(VARIANTS)))
def test_pieces_joined_are_the_whole_schedule(protocol, k):
    s = _settings(protocol, VARIANTS[k])
    world = make_world(s, process="bursty:u=0.8", graph="knn:k=4", n=80, rounds=30, seed=k)
    for catchup in (False, True):
        whole = make_schedule(world, s, local_steps=10, seed=k, catchup=catchup)
        for every in (1, 4, 11):
            pieces = list(make_schedule(world, s, local_steps=10, seed=k, catchup=catchup,
                                        every=every))
            assert len(pieces) == math.ceil(30 / every)
            got = join(pieces)
            for name in COLUMNS:
                assert np.array_equal(getattr(whole, name), getattr(got, name)), name
            assert whole.stats == got.stats
            assert list(whole.stats) == list(got.stats)
            assert whole.digest() == got.digest()


@pytest.mark.parametrize("protocol,peers,k", [
    ("async", "online:s=3,view=6,gossip=2", 1), ("event", "epidemic:s=2", 3),
    ("async", "epidemic:s=3", 4), ("event", "online:s=2", 0)])
def test_sampled_peers_cut_into_pieces_are_the_whole_schedule(protocol, peers, k):
    """Peers chosen per exchange: the simulation runs whole, its events and messages cut into
    spans of time are assembled piece by piece over the run's union graph, and the pieces
    joined are the whole schedule."""
    from sfg.world.peers import parse_peers

    s = _settings(protocol, {**VARIANTS[k], "latency": "const:value=90"} if k in (1, 4) else
                  VARIANTS[k])
    world = make_world(s, process="bursty:u=0.8", graph="knn:k=4", n=60, rounds=30, seed=k)
    p = parse_peers(peers)
    whole = make_schedule(world, s, local_steps=10, seed=k, peers=p)
    for every in (1, 7):
        pieces = list(make_schedule(world, s, local_steps=10, seed=k, every=every, peers=p))
        assert len(pieces) == math.ceil(30 / every) and all(q.rg is whole.rg or
                                                             q.rg.n_slots == whole.rg.n_slots
                                                             for q in pieces)
        got = join(pieces)
        for name in COLUMNS:
            assert np.array_equal(getattr(whole, name), getattr(got, name)), name
        assert whole.stats == got.stats and whole.stats["delivered"] > 0
        assert whole.digest() == got.digest()


def test_jitter_drawn_span_by_span_is_the_nodes():
    s = _settings("async", {"jitter": 0.7})
    world = make_world(s, process="bursty:u=0.8", graph="knn:k=4", n=50, rounds=20, seed=4)
    sim = Simulation(world, s, "async", local_steps=10, seed=4, catchup=False, pull=False)
    rows = [sim.jitter.random((k, 50)) for k in (3, 9, 8)]
    assert np.array_equal(np.concatenate(rows), wake_jitter(4, 20, 50))


def test_a_pull_runs_in_one_span():
    s = make_settings({"clock": "virtual", "protocol": "async", "on_return": "pull:timeout=120",
                       "compute": "const:value=30"})
    world = make_world(s, process="bursty:u=0.8", graph="knn:k=4", n=40, rounds=20, seed=1)
    pieces = list(make_schedule(world, s, local_steps=5, seed=1, every=2))
    assert len(pieces) == 1
    assert pieces[0].digest() == make_schedule(world, s, local_steps=5, seed=1).digest()


@pytest.mark.parametrize("protocol,extra,rule", [
    ("async", {"jitter": 0.5}, "sfg-cut"),
    ("event", {"latency": "const:value=700"}, "sfg-l"),
    ("async", {"faults": "faults:loss=0.2,delay=100"}, "dfedavg+guard"),
    ("async", {"on_return": "pull:timeout=120"}, "sfg-cut"),
])
def test_streamed_replay_is_the_whole_replay(monkeypatch, protocol, extra, rule):
    s = _settings(protocol, extra)
    kw = {"seed": 2, "settings": s, "n": 90, "rounds": 40, "local_steps": 5}
    monkeypatch.setattr(replay_mod, "SPAN_EVENTS", 10**12)  # one piece
    whole = replay_clock("bursty:u=0.8", rule, **kw)
    monkeypatch.setattr(replay_mod, "SPAN_EVENTS", 90 * 3)  # pieces of 3 units
    cut = replay_clock("bursty:u=0.8", rule, **kw)
    assert whole["meta"]["schedule_digest"] == cut["meta"]["schedule_digest"]
    assert whole["curves"] == cut["curves"]
    assert whole["metrics"].keys() == cut["metrics"].keys()
    for name, v in whole["metrics"].items():
        w = cut["metrics"][name]
        # the facts are summed piece by piece: equal up to the order of a float sum
        assert (math.isnan(v) and math.isnan(w)) or w == pytest.approx(v, rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("protocol,peers", [("async", "online:s=3"), ("event", "epidemic:s=2")])
def test_streamed_replay_with_peers_is_the_whole_replay(monkeypatch, protocol, peers):
    s = _settings(protocol, {"jitter": 0.5} if protocol == "async" else {})
    kw = {"seed": 3, "settings": s, "n": 90, "rounds": 40, "local_steps": 5, "peers": peers}
    monkeypatch.setattr(replay_mod, "SPAN_EVENTS", 10**12)  # one piece
    whole = replay_clock("bursty:u=0.8", "sfg-cut", **kw)
    monkeypatch.setattr(replay_mod, "SPAN_EVENTS", 90 * 3)  # pieces of 3 units
    cut = replay_clock("bursty:u=0.8", "sfg-cut", **kw)
    assert whole["meta"]["schedule_digest"] == cut["meta"]["schedule_digest"]
    assert whole["curves"] == cut["curves"]
    for name, v in whole["metrics"].items():
        w = cut["metrics"][name]
        assert (math.isnan(v) and math.isnan(w)) or w == pytest.approx(v, rel=1e-12, abs=1e-12), name


def test_exact_parts_make_fsum_independent_of_the_cut():
    rng = np.random.default_rng(0)
    vals = (rng.standard_normal(2000) * 10.0 ** rng.integers(-20, 20, 2000)).tolist()
    vals += [1e16, 1.0, -1e16, 1.0, 3.3]
    want = math.fsum(vals)
    for cut in (1, 7, 500, 1999):
        parts = exact_parts(vals[:cut]) + exact_parts(vals[cut:])
        assert math.fsum(parts) == want
    assert exact_parts([1e16, 1.0]) == [1e16, 1.0]  # the rounded sum, then what it left out
    assert exact_parts([]) == []


def test_timeline_compiled_search_is_the_vectorised_one(monkeypatch):
    import sfg.world.timeline as tl

    s = _settings("async", {})
    world = make_world(s, process="bursty:u=0.8", graph="knn:k=4", n=300, rounds=50, seed=3)
    on = world.online
    rng = np.random.default_rng(1)
    d = rng.integers(0, 300, 60_000)
    t = rng.uniform(-5.0, world.horizon + 5.0, d.size)
    per = np.repeat(np.arange(300), np.diff(on.indptr))
    m = min(per.size, 20_000)
    d[:m], t[:m] = per[:m], on.start[:m]  # at a start (online), then at an end (offline)
    d[m:2 * m], t[m:2 * m] = per[:m], on.end[:m]
    monkeypatch.setattr(tl, "LOCATE_COMPILED", 1)
    j1, o1 = on._locate(d, t)
    monkeypatch.setattr(tl, "LOCATE_COMPILED", 10**12)
    j2, o2 = on._locate(d, t)
    assert np.array_equal(j1, j2) and np.array_equal(o1, o2)
    assert o1[:m].all() and not o1[m:2 * m][on.end[:m] > on.start[:m]].any()


PEAK = """
import json, resource, sys
import sfg.clock.replay as rp
rp.SPAN_EVENTS = int(sys.argv[2])
from sfg.clock.replay import replay_clock
from sfg.clock.settings import make_settings
s = make_settings({"clock": "virtual", "protocol": "async"})
out = replay_clock("bursty:u=0.8", "sfg-cut", seed=1, settings=s, n=3000, rounds=int(sys.argv[1]))
print(json.dumps({"kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "digest": out["meta"]["schedule_digest"]}))
"""


def _peak(rounds: int, span_events: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PEAK, str(rounds), str(span_events)],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_streamed_replay_memory_does_not_grow_with_the_run():
    """3,000 devices, pieces of 10 periods: 30 periods and 600 (1.8 million events, about
    1 GB held whole) peak within 120 MB of each other."""
    short, long = _peak(30, 30_000), _peak(600, 30_000)
    assert long["kb"] - short["kb"] < 120_000, (short, long)
