"""The async and event protocols on hand-built worlds (docs/concepts/clock.md#the-virtual-clock), against schedules and
staleness worked out by hand in the comments: wake-ups, an interrupted local round, skipped
wakes, a lost message, waited age and lag, offline spans.

World: the path 0 – 1 – 2, K = 1 local step, latency 1 s on every link, instant uplinks.
"""

from __future__ import annotations

import numpy as np
import pytest

from sfg.clock.replay import staleness_events
from sfg.clock.schedule import LOCAL, OFFLINE, World, async_schedule, event_schedule
from sfg.clock.settings import make_settings
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph
from sfg.world.graphs import Graph
from sfg.world.timeline import Intervals

EDGES = np.array([[0, 1], [1, 2]])


def world(compute, online, horizon, *, loss=None) -> World:
    """The path with ``online`` {device: [(start, end), ...]} and per-device ``compute``."""
    g = Graph(n=3, edges=EDGES, positions=None, name="path")
    rg = RoundGraph.from_graph(g)
    dev, s, e = zip(*[(d, a, b) for d, spans in online.items() for a, b in spans], strict=True)
    iv = Intervals.from_pairs(3, np.array(dev), np.array(s, float), np.array(e, float), horizon)
    lat = np.where(rg.is_self, 0.0, 1.0)
    lo = np.zeros(rg.n_slots)
    for (j, i), p in (loss or {}).items():  # (sender, receiver) -> probability
        lo[(rg.send == j) & (rg.recv == i)] = p
    return World(graph=g, rg=rg, online=iv, available=np.ones((1, 3), bool),
                 compute=np.array(compute, float), uplink=np.full(3, np.inf), latency=lat,
                 loss=lo, horizon=float(horizon))


def candidates(sched, r):
    """Local round r's candidates as (sender, sending event or -1, waited units)."""
    a, b = sched.cptr[r], sched.cptr[r + 1]
    rg = RoundGraph.from_edges(3, EDGES)
    return [(int(rg.send[s]), int(m), round(float(d), 12))
            for s, m, d in zip(sched.cslot[a:b], sched.cmsg[a:b], sched.cwait[a:b], strict=True)]


# ----------------------------------------------------------------------------- async
# P = Δ = 10 s, W = 2 periods, no jitter: every device wakes at 0, 10, 20, 30, 40 (horizon 50).
# compute: device 0 2 s, device 1 3 s, device 2 15 s.  Online: 0 and 2 always, 1 in
# [0, 12) and [25, 50).
#   device 0: rounds at 0, 10, 20, 30, 40 (done 2 s later), message to 1 arrives at end + 1:
#             3 (held), 13 and 23 (1 is offline: lost), 33, 43 (held).
#   device 1: wake 0 trains to 3, sends at 3 (arrive 4 at 0 and at 2); wake 10 starts but goes
#             offline at 12 before its 3 s are done: interrupted (nothing changes, nothing
#             sent); wake 20 offline (+1 age and lag); wake 30 trains to 33 (arrive 34);
#             wake 40 trains to 43 (arrive 44).
#   device 2: wake 0 trains to 15 (message to 1 arrives 16: 1 offline, lost); wake 10 busy:
#             skipped; wake 20 trains to 35 (arrives 36 at 1); wake 30 busy: skipped; wake 40
#             would end at 55, after the run: unfinished.
# Events in order (time, device):
#   e0 (0, 0)  e1 (0, 1)  e2 (0, 2)  e3 (10, 0)  e4 (20, 0)  e5 (20, 1) offline  e6 (20, 2)
#   e7 (30, 0)  e8 (30, 1)  e9 (40, 0)  e10 (40, 1)
# Candidates (latest message that arrived strictly before, within W·P = 20 s; waited d in P):
#   e3: 1's message of e1 (arrived 4): d = 0.6      e4: e1 again, d = 1.6
#   e6: 1's e1 (arrived 4), d = 1.6                  e7, e8: none (4 is 26 s old; 16 lost)
#   e9: 1's e8 (arrived 34), d = 0.6
#   e10: 0's e7 (arrived 33), d = 0.7 and 2's e6 (arrived 36), d = 0.4
ASYNC = dict(compute=[2.0, 3.0, 15.0], online={0: [(0, 50)], 1: [(0, 12), (25, 50)], 2: [(0, 50)]},
             horizon=50.0)


def async_sched(**kw):
    s = make_settings({"clock": "virtual", "protocol": "async", "round_seconds": 10.0,
                       "window": 2.0})
    return async_schedule(world(**{**ASYNC, **kw}), s, local_steps=1, seed=1)


def test_async_schedule_by_hand():
    sc = async_sched()
    assert list(zip(sc.time.tolist(), sc.dev.tolist(), sc.kind.tolist(), strict=True)) == [
        (0, 0, LOCAL), (0, 1, LOCAL), (0, 2, LOCAL), (10, 0, LOCAL), (20, 0, LOCAL),
        (20, 1, OFFLINE), (20, 2, LOCAL), (30, 0, LOCAL), (30, 1, LOCAL), (40, 0, LOCAL),
        (40, 1, LOCAL)]
    assert sc.t.tolist() == [0, 0, 0, 1, 2, 2, 2, 3, 3, 4, 4]  # the wake index (own clock)
    assert sc.end.tolist()[:3] == [2.0, 3.0, 15.0]
    expect = {0: [(0, -1, 0.0)], 3: [(0, -1, 0.0), (1, 1, 0.6)], 4: [(0, -1, 0.0), (1, 1, 1.6)],
              6: [(2, -1, 0.0), (1, 1, 1.6)], 7: [(0, -1, 0.0)], 8: [(1, -1, 0.0)],
              9: [(0, -1, 0.0), (1, 8, 0.6)], 10: [(1, -1, 0.0), (0, 7, 0.7), (2, 6, 0.4)]}
    for r, want in expect.items():
        assert candidates(sc, r) == want, r
    st = sc.stats
    assert (st["interrupted"], st["skipped"], st["unfinished"], st["offline_wakes"]) == (1, 2, 1, 1)
    # messages: 0 sends 5, 1 sends 3 rounds x 2, 2 sends 2; lost at the offline receiver: 3
    assert (st["messages_sent"], st["lost_receiver"], st["delivered"]) == (13, 3, 10)


def test_async_staleness_by_hand_dfedavg():
    got = staleness_events(parse_rule("dfedavg"), world(**ASYNC), async_sched(), seed=1)
    hdr, lag = got["hdr"], got["hdr_lag"]
    # e3: self (age 0, lag 0, count 2) and 1's e1 waited 0.6: (0 + ⌊0.6⌋, 0 + 0.6, 2)
    #     -> lag (0 + 0.6) / 2 = 0.3, count max(2, 2) + 1 = 3
    assert (hdr[0, 3], lag[3], hdr[1, 3]) == (0, pytest.approx(0.3, abs=1e-15), 3)
    # e4: self (0, 0.3, 3), e1 waited 1.6: age 1, lag 1.6 -> lag 0.95, count 4
    assert lag[4] == pytest.approx(0.95, abs=1e-15) and hdr[1, 4] == 4
    # e5: device 1 offline at its wake: age 0 + 1, lag 0 + 1 (the interrupted round at 10
    # changed nothing); e8: it trains alone: lag stays 1, age 0, count 2 + 1
    assert (hdr[0, 8], lag[8], hdr[1, 8]) == (0, 1.0, 3)
    # e6: device 2 self (0, 0, 2) and e1 waited 1.6 -> lag 0.8, count 3
    assert lag[6] == pytest.approx(0.8, abs=1e-15) and hdr[1, 6] == 3
    # e9: self (0, 0.95, 5) and e8 waited 0.6: (0, 1.6, 3) -> lag 1.275, count 6
    assert lag[9] == pytest.approx(1.275, abs=1e-15) and hdr[1, 9] == 6
    # e10: self (0, 1, 3), e7 waited 0.7: (0, 0.95 + 0.7, 5), e6 waited 0.4: (0, 0.8 + 0.4, 3)
    assert lag[10] == pytest.approx((1 + 1.65 + 1.2) / 3, abs=1e-15) and hdr[1, 10] == 6
    w = got["weights"]
    a = got["facts"]
    assert w[got["facts"].shape[0] * 0:].sum() == pytest.approx(10.0)  # 10 local rounds, rows of 1
    assert a[5, 0] == 0.0  # the offline span adopts nothing
    assert got["ages"].tolist() == [0, 0, 0]
    assert got["lags"].tolist() == pytest.approx([1.275, (1 + 1.65 + 1.2) / 3, 0.8], abs=1e-15)


def test_async_staleness_by_hand_sfg_rules():
    sc = async_sched()
    w_of = {}
    for name in ("sfg", "sfg-l", "sfg-cut"):
        got = staleness_events(parse_rule(name), world(**ASYNC), sc, seed=1)
        w_of[name] = got["weights"][sc.cptr[4]: sc.cptr[5]], got
    # e4 (t = 2): self age 0; neighbour (waited 1.6) age 1, lag 1.6
    assert w_of["sfg"][0] == pytest.approx([1 / 1.5, 0.5 / 1.5], abs=1e-15)  # γ^(τ − τmin)
    # sfg-l: at e3 the receiver (lag 0) weighted the neighbour's lag 0.6 by 0.5^0.6, so its
    # own lag is 0.6 · 0.5^0.6 / (1 + 0.5^0.6); at e4 the neighbour is 1.6 − that behind
    own = 0.6 * 0.5 ** 0.6 / (1 + 0.5 ** 0.6)
    h = 0.5 ** (1.6 - own)
    assert w_of["sfg-l"][0] == pytest.approx([1 / (1 + h), h / (1 + h)], abs=1e-15)
    # sfg-cut: (1 + t − ℓ) for ℓ within L = 1 of the least lag: 1.6 − 0.3 > 1 is cut
    assert w_of["sfg-cut"][0] == pytest.approx([1.0, 0.0], abs=1e-15)
    # e3 (t = 1): self lag 0, neighbour lag 0.6 (within 1): scores 2 and 1.4
    got = w_of["sfg-cut"][1]
    assert got["weights"][sc.cptr[3]: sc.cptr[4]] == pytest.approx([2 / 3.4, 1.4 / 3.4], abs=1e-15)
    assert got["hdr_lag"][3] == pytest.approx(0.6 * 1.4 / 3.4, abs=1e-15)


def test_async_random_loss_removes_the_candidate():
    # every message from 1 to 0 lost: e3, e4 and e9 keep only themselves; 2 still hears 1
    sc = async_sched(loss={(1, 0): 1.0})
    assert candidates(sc, 3) == [(0, -1, 0.0)] and candidates(sc, 9) == [(0, -1, 0.0)]
    assert candidates(sc, 6) == [(2, -1, 0.0), (1, 1, 1.6)]
    assert sc.stats["lost_random"] == 3  # e1, e8, e10 each sent one message to 0


# The window's edge: P = 10 s, W = 2 periods (20 s). Device 1 is online in [0, 9.75) only: its
# one local round (wake 0, compute c) ends at c and its message reaches 0 at c + 1 s. Device 0
# (compute 1 s) wakes at 0, 10, 20, 30, 40; at its wake at 30 that message has waited
# d = (30 − c − 1)/10 periods. A message at exactly the wake is not yet held (c = 9: not at 10).
@pytest.mark.parametrize("c,at_30", [
    (9.0, [(0, -1, 0.0), (1, 1, 2.0)]),    # arrived at 10: d = W exactly, still a candidate
    (9.5, [(0, -1, 0.0), (1, 1, 1.95)]),   # arrived at 10.5: d = 1.95, inside
    (8.5, [(0, -1, 0.0)]),                 # arrived at 9.5: d = 2.05, outside
])
def test_async_window_edge_by_hand(c, at_30):
    """docs/concepts/clock.md#the-three-protocols: "A receiver aggregates itself and, per
    neighbour, the latest message it holds, if that arrived within the last W units (W
    included: a message that waited exactly d = W units is still a candidate)"; one that waited
    longer is not."""
    s = make_settings({"clock": "virtual", "protocol": "async", "round_seconds": 10.0,
                       "window": 2.0})
    w = world([1.0, c, 1.0], {0: [(0, 50)], 1: [(0, 9.75)], 2: [(0, 50)]}, 50.0)
    sc = async_schedule(w, s, local_steps=1, seed=1)
    wakes = {float(t): r for r, (t, d) in enumerate(zip(sc.time, sc.dev, strict=True)) if d == 0}
    assert sorted(wakes) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert candidates(sc, wakes[30.0]) == at_30
    assert candidates(sc, wakes[40.0]) == [(0, -1, 0.0)]  # d ≥ 3: out whatever c


# ----------------------------------------------------------------------------- event
# Δ = 10 s, W = 2 (units of Δ), horizon 60; compute 10, 15, 30 s. Online: 0 always; 1 in
# [0, 12) and [25, 60); 2 from 5 s on.
#   device 0: rounds back to back at 0, 10, 20, 30, 40, 50; its message to 1 arrives at
#             end + 1 = 11 (held), 21 (1 offline: lost), 31, 41, 51 (held), 61 (after the run)
#   device 1: starts at 0, goes offline at 12 before its 15 s: interrupted. Back at 25: the
#             offline span 12 → 25 adds 1.3 to its lag and ⌊1.3⌋ = 1 to its age; rounds
#             25 → 40 (arrives 41 at 0 and 2) and 40 → 55 (arrives 56); 55 → 70 unfinished
#   device 2: offline from 0 to 5: +0.5 lag, +0 age; round 5 → 35 (arrives 36 at 1);
#             35 → 65 unfinished
# Events: E0 (0,0)  E1 (5,2) offline 0.5  E2 (5,2)  E3 (10,0)  E4 (20,0)  E5 (25,1) offline 1.3
#         E6 (25,1)  E7 (30,0)  E8 (40,0)  E9 (40,1)  E10 (50,0)
# Candidates: E6: 0's E0 (arrived 11): d = 1.4;  E9: 0's E4 (arrived 31): 0.9, 2's E2 (36): 0.4;
#             E10: 1's E6 (arrived 41): 0.9
EVENT = dict(compute=[10.0, 15.0, 30.0],
             online={0: [(0, 60)], 1: [(0, 12), (25, 60)], 2: [(5, 60)]}, horizon=60.0)


def event_sched(**kw):
    s = make_settings({"clock": "virtual", "protocol": "event", "round_seconds": 10.0,
                       "window": 2.0})
    return event_schedule(world(**{**EVENT, **kw}), s, local_steps=1, seed=1)


def test_event_schedule_by_hand():
    sc = event_sched()
    assert list(zip(sc.time.tolist(), sc.dev.tolist(), sc.kind.tolist(), strict=True)) == [
        (0, 0, LOCAL), (5, 2, OFFLINE), (5, 2, LOCAL), (10, 0, LOCAL), (20, 0, LOCAL),
        (25, 1, OFFLINE), (25, 1, LOCAL), (30, 0, LOCAL), (40, 0, LOCAL), (40, 1, LOCAL),
        (50, 0, LOCAL)]
    assert sc.amount[1] == pytest.approx(0.5) and sc.amount[5] == pytest.approx(1.3)
    assert sc.t.tolist() == [0, 0, 0, 1, 2, 2, 2, 3, 4, 4, 5]  # ⌊time / Δ⌋
    assert candidates(sc, 6) == [(1, -1, 0.0), (0, 0, 1.4)]
    assert candidates(sc, 9) == [(1, -1, 0.0), (0, 4, 0.9), (2, 2, 0.4)]
    assert candidates(sc, 10) == [(0, -1, 0.0), (1, 6, 0.9)]
    for r in (0, 2, 3, 4, 7, 8):
        assert len(candidates(sc, r)) == 1, r
    st = sc.stats
    assert (st["local_rounds"], st["interrupted"], st["unfinished"]) == (9, 1, 2)
    assert (st["messages_sent"], st["delivered"], st["lost_receiver"]) == (11, 9, 2)
    # the step key of each local round: the device's count of completed rounds
    assert sc.step[sc.kind == LOCAL].tolist() == [0, 0, 1, 2, 0, 3, 4, 1, 5]


def test_event_staleness_by_hand_dfedavg():
    got = staleness_events(parse_rule("dfedavg"), world(**EVENT), event_sched(), seed=1)
    hdr, lag, facts = got["hdr"], got["hdr_lag"], got["facts"]
    # E2: device 2 after its offline start: age 0 + ⌊0.5⌋, lag 0.5; it trains alone
    assert facts[2, 1] == 0 and facts[2, 2] == pytest.approx(0.5)  # age, lag before E2
    assert (hdr[0, 2], lag[2], hdr[1, 2]) == (0, 0.5, 2)
    # E6: device 1 before: age 1, lag 1.3 (the interrupted round changed nothing); with 0's
    # E0 (age 0, lag 0) waited 1.4: age 1, lag 1.4 -> lag 1.35, count max(1, 2) + 1
    assert facts[6, 1] == 1 and facts[6, 2] == pytest.approx(1.3)
    assert lag[6] == pytest.approx(1.35, abs=1e-15) and hdr[1, 6] == 3
    # E9: self (0, 1.35, 3), 0's E4 (0, 0 + 0.9, 4), 2's E2 (0, 0.5 + 0.4, 2)
    assert lag[9] == pytest.approx((1.35 + 0.9 + 0.9) / 3, abs=1e-15) and hdr[1, 9] == 5
    # E10: self (0, 0, 6), 1's E6 waited 0.9: (0, 2.25, 3) -> lag 1.125, count 7
    assert lag[10] == pytest.approx(1.125, abs=1e-15) and hdr[1, 10] == 7
    assert facts[5, 0] == 0.0 and facts[1, 0] == 0.0  # offline spans adopt nothing


def test_event_needs_time_per_round():
    from sfg.errors import SfgError

    s = make_settings({"clock": "virtual", "protocol": "event"})
    with pytest.raises(SfgError, match="never stop"):
        event_schedule(world(**{**EVENT, "compute": [0.0, 1.0, 1.0]}), s, local_steps=1, seed=1)


def test_schedule_is_the_same_for_every_rule():
    sc = async_sched()
    assert sc.digest() == async_sched().digest()
    assert sc.digest() != async_sched(compute=[2.0, 3.0, 14.0]).digest()


def test_returns_heard_by_hand():
    """The replay's ``returning_aggregations_heard``: async e8 is device 1's only return (age 1 after its
    offline wake) and holds no neighbour's message; event E6 is the only return (age 1 after
    1.3 Δ offline; E2 comes back after 0.5 Δ, age 0) and holds device 0's."""
    from sfg.modelfree.metrics import Accumulator, RunEnd

    for w, sc, want in ((world(**ASYNC), async_sched(), 0.0), (world(**EVENT), event_sched(), 1.0)):
        acc = Accumulator()
        acc.add(staleness_events(parse_rule("dfedavg"), w, sc, seed=1)["facts"][None])
        got, _ = acc.summary(RunEnd(np.zeros((1, 1), bool), np.zeros(0), False, np.zeros(3)))
        assert got["returning_aggregations"] == 1.0 and got["returning_aggregations_heard"] == want


# ----------------------------------------------------------------------------- anatomy modes
# The path 0 – 1 – 2, P = Δ = 10 s, W = 2 periods, K = 1 step of 2 s on every device, latency
# 1 s, horizon 40. Device 1 is offline in [12, 25); 0 and 2 always online. Every device wakes
# at 0, 10, 20, 30. Online rounds: wake w trains to w + 2 and sends, arriving at w + 3.
# Device 1's wake 20 is offline; what it still does (docs/concepts/outages.md#anatomy-modes):
#   full:                 an offline span (+1 age and lag); messages to it at 23 are lost
#   cannot-communicate:   trains alone 20 → 22 (age 0, count + 1), sends nothing; messages to
#                         it while offline are lost
#   cannot-train-shares:  sends its model as it is at 20 (arrives 21), age + 1; it keeps
#                         communicating, so 0's and 2's messages of wake 20 (at 23) reach it
#   cannot-train-adopts:  aggregates what it holds (0's and 2's messages of wake 10, arrived
#                         13: waited 0.7), untrained, and sends the aggregate at 20
ANATOMY = dict(compute=[2.0, 2.0, 2.0], online={0: [(0, 40)], 1: [(0, 12), (25, 40)],
                                               2: [(0, 40)]}, horizon=40.0)


def anatomy_sched(mode):
    s = make_settings({"clock": "virtual", "protocol": "async", "round_seconds": 10.0,
                       "window": 2.0})
    return async_schedule(world(**ANATOMY), s, local_steps=1, seed=1, anatomy=mode)


def _event(sc, t, d):
    return int(np.flatnonzero((sc.time == t) & (sc.dev == d))[0])


def _local(sc, t, d):
    return int(np.flatnonzero((sc.time == t) & (sc.dev == d) & (sc.kind == LOCAL))[0])


@pytest.mark.parametrize("mode", ["full", "cannot-communicate", "cannot-train-shares",
                                  "cannot-train-adopts"])
def test_anatomy_modes_on_async_by_hand(mode):
    from sfg.round.kernel import FACTS

    sc = anatomy_sched(mode)
    e = _event(sc, 20.0, 1)
    e0_10, e2_10, e0_20 = _event(sc, 10.0, 0), _event(sc, 10.0, 2), _event(sc, 20.0, 0)
    e1_30, e0_30 = _event(sc, 30.0, 1), _event(sc, 30.0, 0)
    kind = {"full": OFFLINE}.get(mode, LOCAL)
    assert sc.kind[e] == kind
    got = staleness_events(parse_rule("dfedavg"), world(**ANATOMY), sc, seed=1)
    age, lag = FACTS.index("age"), FACTS.index("lag")
    before = got["facts"][e1_30]  # device 1's state after its wake 20
    # after wake 10 device 1 has age 0 and lag L10: it averaged itself (0) and the messages of
    # 0 and 2 of wake 0 (arrived 3, waited 0.7: lag 0.7); 0 and 2 at wake 10 averaged
    # themselves and 1's message of wake 0: lag 0.35, which waits 0.7 more by 1's wake 20
    L10 = (0.0 + 0.7 + 0.7) / 3
    if mode == "full":
        assert sc.caps is None
        assert before[age] == 1 and abs(before[lag] - (L10 + 1)) < 1e-12
        assert candidates(sc, e1_30) == [(1, -1, 0.0)]                # 0's and 2's at 23 lost
    elif mode == "cannot-communicate":
        assert candidates(sc, e) == [(1, -1, 0.0)] and sc.nsteps[e] == 1
        assert before[age] == 0 and abs(before[lag] - L10) < 1e-12  # it trained alone
        assert candidates(sc, e1_30) == [(1, -1, 0.0)]                # still cut off
        assert e not in {int(m) for m in sc.cmsg[sc.cptr[e0_30]:sc.cptr[e0_30 + 1]]}
    elif mode == "cannot-train-shares":
        assert candidates(sc, e) == [(1, -1, 0.0)] and sc.nsteps[e] == 0
        assert before[age] == 1 and abs(before[lag] - (L10 + 1)) < 1e-12  # frozen: + 1
        # its model reaches 0 (sent 20, arrived 21: waited 0.9 at 30), and 0's of wake 20
        # (arrived 23) reached it while offline (waited 0.7 at 30)
        assert (1, e, 0.9) in candidates(sc, e0_30)
        assert (0, e0_20, 0.7) in candidates(sc, e1_30)
    else:  # cannot-train-adopts
        assert candidates(sc, e) == [(1, -1, 0.0), (0, e0_10, 0.7), (2, e2_10, 0.7)]
        assert sc.nsteps[e] == 0
        # untrained aggregate: age = youngest (0 + ⌊0.7⌋ = 0) + 1; lag = the mean (dfedavg:
        # thirds) of L10 and the two messages' 0.35 + 0.7, + 1
        assert before[age] == 1
        assert abs(before[lag] - ((L10 + 2 * (0.35 + 0.7)) / 3 + 1.0)) < 1e-12
        w = got["weights"][sc.cptr[e]:sc.cptr[e + 1]]
        assert np.allclose(w, 1 / 3)
        assert (1, e, 0.9) in candidates(sc, e0_30)


# The event protocol under the anatomy modes: the path 0 – 1 – 2, Δ = 10 s, W = 2 units,
# K = 1 step; compute 10, 4, 10 s; latency 1 s, instant uplinks, horizon 40. 0 and 2 always
# online: rounds at 0, 10, 20, 30, messages arriving at 11, 21, 31 (41: after the run).
# Device 1 online in [0, 13) and [25, 40): rounds 0 → 4, 4 → 8, 8 → 12 (arriving 5, 9, 13),
# alone each time (nothing has arrived yet), so age 0, lag 0 and count 1 + 3; 12 → 16
# interrupted at 13.
# Offline 13 → 25, what it still does (docs/concepts/outages.md#anatomy-modes; no timer, so it keeps the pace of what
# it does, sfg.clock.schedule.event_schedule):
#   full:                 back at 25: an offline span of 1.2 units (age 1, lag 1.2); the
#                         messages at 21 are lost
#   cannot-communicate:   trains alone back to back 13 → 17, 17 → 21, 21 → 25 (age 0, lag 0,
#                         count 4 + 3); sends nothing, still loses the messages at 21
#   cannot-train-shares:  one tick at 23 (13 + Δ): sends its model as it is (arrives 24),
#                         age 1, lag 1; back at 25 a span of 0.2: age 1, lag 1.2; it hears
#                         the messages at 21
#   cannot-train-adopts:  at the tick 23 it aggregates itself and 0's and 2's messages of
#                         their rounds at 10 (arrived 21, waited 0.2: age 0, lag 0.05 + 0.2),
#                         adopts untrained (age 1, lag (0 + 2·0.25)/3 + 1) and sends it;
#                         back at 25 + 0.2
# At 0's round at 30 it holds 1's newest message in every mode: 1's round at 25 (ended 29,
# arrived 30 exactly, waited 0), held because it arrives in the instant's phase 2 and was sent
# before it (docs/concepts/clock.md#one-instant); before that it held the tick's (arrived 24)
# or, without one, the round at 8 (arrived 13).
EVENT_ANATOMY = dict(compute=[10.0, 4.0, 10.0],
                     online={0: [(0, 40)], 1: [(0, 13), (25, 40)], 2: [(0, 40)]},
                     horizon=40.0)


def event_anatomy_sched(mode, **kw):
    s = make_settings({"clock": "virtual", "protocol": "event", "round_seconds": 10.0,
                       "window": 2.0, **kw.pop("settings", {})})
    return event_schedule(world(**{**EVENT_ANATOMY, **kw}), s, local_steps=1, seed=1,
                          anatomy=mode)


@pytest.mark.parametrize("mode", ["full", "cannot-communicate", "cannot-train-shares",
                                  "cannot-train-adopts"])
def test_anatomy_modes_on_event_by_hand(mode):
    from sfg.round.kernel import EV_AGGREGATE, EV_ALL, EV_SEND, EV_TRAIN, FACTS

    sc = event_anatomy_sched(mode)
    one = [(float(t), int(k)) for t, k, d in zip(sc.time, sc.kind, sc.dev, strict=True)
           if d == 1]
    e1_25 = _local(sc, 25.0, 1)
    e0_0, e0_10, e2_0, e2_10 = (_event(sc, 0.0, 0), _event(sc, 10.0, 0), _event(sc, 0.0, 2),
                                _event(sc, 10.0, 2))
    e0_30 = _event(sc, 30.0, 0)
    got = staleness_events(parse_rule("dfedavg"), world(**EVENT_ANATOMY), sc, seed=1)
    age, lag = FACTS.index("age"), FACTS.index("lag")
    before = got["facts"][e1_25]  # device 1's state as it comes back
    head = [(0.0, LOCAL), (4.0, LOCAL), (8.0, LOCAL)]
    tail = [(25.0, LOCAL), (29.0, LOCAL), (33.0, LOCAL)]  # 37 -> 41: unfinished
    held_0 = [(1, -1, 0.0), (0, e0_0, 1.4), (2, e2_0, 1.4)]     # the messages at 11
    held_10 = [(1, -1, 0.0), (0, e0_10, 0.4), (2, e2_10, 0.4)]  # the messages at 21
    if mode == "full":
        assert sc.caps is None and one == head + [(25.0, OFFLINE)] + tail
        assert sc.amount[_event(sc, 25.0, 1)] == pytest.approx(1.2)  # the span comes first
        assert before[age] == 1 and before[lag] == pytest.approx(1.2, abs=1e-12)
        assert candidates(sc, e1_25) == held_0
        assert (1, e1_25, 0.0) in candidates(sc, e0_30)
        return
    if mode == "cannot-communicate":
        assert one == head + [(13.0, LOCAL), (17.0, LOCAL), (21.0, LOCAL)] + tail
        kept = [_event(sc, t, 1) for t in (13.0, 17.0, 21.0)]
        assert sc.end[kept].tolist() == [17.0, 21.0, 25.0]
        assert all(candidates(sc, e) == [(1, -1, 0.0)] for e in kept)
        assert sc.caps[kept].tolist() == [EV_TRAIN] * 3 and sc.nsteps[kept].tolist() == [1] * 3
        assert sc.step[kept + [e1_25]].tolist() == [3, 4, 5, 6]  # minibatch keys go on
        assert before[age] == 0 and before[lag] == 0.0 and got["hdr"][1, kept[-1]] == 7
        assert candidates(sc, e1_25) == held_0
        assert (1, e1_25, 0.0) in candidates(sc, e0_30)
        assert sc.caps[e1_25] == EV_ALL
        return
    e = _event(sc, 23.0, 1)
    assert one == head + [(23.0, LOCAL), (25.0, OFFLINE)] + tail
    assert sc.amount[e + 1] == pytest.approx(0.2) and sc.nsteps[e] == 0
    assert candidates(sc, e1_25) == held_10
    assert (1, e1_25, 0.0) in candidates(sc, e0_30)
    if mode == "cannot-train-shares":
        assert sc.caps[e] == EV_SEND and candidates(sc, e) == [(1, -1, 0.0)]
        assert (got["hdr"][0, e], got["hdr_lag"][e], got["hdr"][1, e]) == (1, 1.0, 4)
        assert before[age] == 1 and before[lag] == pytest.approx(1.2, abs=1e-12)
    else:
        assert sc.caps[e] == EV_SEND | EV_AGGREGATE
        assert candidates(sc, e) == [(1, -1, 0.0), (0, e0_10, 0.2), (2, e2_10, 0.2)]
        assert np.allclose(got["weights"][sc.cptr[e]:sc.cptr[e + 1]], 1 / 3)
        want = (0.0 + 2 * (0.05 + 0.2)) / 3 + 1.0
        assert got["hdr"][0, e] == 1 and got["hdr_lag"][e] == pytest.approx(want, abs=1e-12)
        assert before[age] == 1 and before[lag] == pytest.approx(want + 0.2, abs=1e-12)


def test_event_offline_ticks_while_the_uplink_is_busy():
    """cannot-train-shares with device 1's broadcast taking 12 s (two 6 s transfers) > Δ:
    online 0 → 13 and from 60; its round 0 → 4 sends until 16 (it goes on sending offline);
    ticks at 23, 33, 43, 53: 23 acts (free since 16), 33 is busy (sends until 35): a span of
    one unit, 43 acts, 53 a span; back at 60 a span of 0.7 — 4.7 units in all, the 47 s
    offline, as under ``full``."""
    from dataclasses import replace

    w = world(compute=[10.0, 4.0, 10.0], online={0: [(0, 70)], 1: [(0, 13), (60, 70)],
                                                  2: [(0, 70)]}, horizon=70.0)
    w = replace(w, uplink=np.array([np.inf, 10.0, np.inf]))
    s = make_settings({"clock": "virtual", "protocol": "event", "round_seconds": 10.0,
                       "window": 2.0, "message_bytes": 60.0})
    sc = event_schedule(w, s, local_steps=1, seed=1, anatomy="cannot-train-shares")
    one = [(float(t), int(k), float(a)) for t, k, a, d
           in zip(sc.time, sc.kind, sc.amount, sc.dev, strict=True) if d == 1]
    assert one[:6] == [(0.0, LOCAL, 0.0), (23.0, LOCAL, 0.0), (33.0, OFFLINE, 1.0),
                       (43.0, LOCAL, 0.0), (53.0, OFFLINE, 1.0), (60.0, OFFLINE, 0.7)]
    assert one[6][:2] == (60.0, LOCAL) and sc.stats["skipped"] == 2
    got = staleness_events(parse_rule("dfedavg"), w, sc, seed=1)
    from sfg.round.kernel import FACTS

    f = got["facts"][_local(sc, 60.0, 1)]
    assert f[FACTS.index("lag")] == pytest.approx(4.7, abs=1e-12)
    assert f[FACTS.index("age")] == 4


def test_event_offline_training_needs_compute_time():
    from sfg.errors import SfgError

    with pytest.raises(SfgError, match="never stop"):
        event_anatomy_sched("cannot-communicate", compute=[10.0, 0.0, 10.0],
                            settings={"message_bytes": 1.0, "uplink": "const:value=1"})
