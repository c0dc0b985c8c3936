"""Returns in time (docs/concepts/clock.md#returns-in-time): ``on_return: pull:timeout=S`` on
hand-built worlds whose comments work every time out by hand, the simulation without pull
against the vectorised schedules (one protocol), pairing and the settings' refusals.

Worlds: a star (device 0 in the middle) or the single link 0 – 1; K = 1 local step; every
link's latency 5 s unless said; uplinks instant unless said (a header then takes no time).
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_schedules import vectorised_async_schedule, vectorised_event_schedule

from sfg.clock.pull import all_events, simulate
from sfg.clock.schedule import (
    LOCAL,
    OFFLINE,
    World,
    async_schedule,
    event_schedule,
    lockstep_rounds,
    make_world,
)
from sfg.clock.settings import make_settings
from sfg.errors import SfgError
from sfg.round.kernel import EV_ALL, EV_TRAIN
from sfg.round.slots import RoundGraph
from sfg.world.graphs import Graph
from sfg.world.timeline import Intervals

STAR = np.array([[0, 1], [0, 2], [0, 3]])
LINK = np.array([[0, 1]])


def world(edges, compute, online, horizon, *, latency=5.0, uplink=None, loss=None) -> World:
    n = int(edges.max()) + 1
    g = Graph(n=n, edges=edges, positions=None, name="hand")
    rg = RoundGraph.from_graph(g)
    dev, s, e = zip(*[(d, a, b) for d, spans in online.items() for a, b in spans], strict=True)
    iv = Intervals.from_pairs(n, np.array(dev), np.array(s, float), np.array(e, float), horizon)
    lo = np.zeros(rg.n_slots)
    for (j, i), p in (loss or {}).items():  # (sender, receiver) -> probability
        lo[(rg.send == j) & (rg.recv == i)] = p
    up = np.full(n, np.inf) if uplink is None else np.array(uplink, float)
    return World(graph=g, rg=rg, online=iv, available=np.ones((1, n), bool),
                 compute=np.array(compute, float), uplink=up,
                 latency=np.where(rg.is_self, 0.0, latency), loss=lo, horizon=float(horizon))


def settings(protocol="async", on_return="pull:timeout=60", **kw):
    return make_settings({"clock": "virtual", "protocol": protocol, "round_seconds": 100.0,
                          "on_return": on_return, **kw})


def sched_of(w, s, K=1):
    f = async_schedule if s.protocol == "async" else event_schedule
    return f(w, s, local_steps=K, seed=1)


def local(sc, t, d):
    """The index of device d's local round aggregating at time t."""
    k = np.flatnonzero((sc.time == t) & (sc.dev == d) & (sc.kind == LOCAL))
    assert k.size == 1, (t, d, sc.time[sc.dev == d], sc.kind[sc.dev == d])
    return int(k[0])


def cands(sc, r, rg):
    """Local round r's candidates: (sender, the sending local round's time, waited units)."""
    a, b = sc.cptr[r], sc.cptr[r + 1]
    return [(int(rg.send[s]), None if m < 0 else float(sc.time[m]), round(float(d), 12))
            for s, m, d in zip(sc.cslot[a:b], sc.cmsg[a:b], sc.cwait[a:b], strict=True)]


# ----------------------------------------------------------------------------- the star
# async, P = Δ = 100 s, W = 1, no jitter: wakes at 0, 100, 200 (horizon 300). Compute 10 s
# per step (device 3: 1000 s, so it never finishes a local round: it has never sent).
# Online: 0 in [0, 50) and [195, 300): it returns at 195; 1 and 3 always; 2 in [0, 120).
#   t = 0:   0, 1, 2 train to 10 and send (arrive 15); 3's round would end after the run
#            (unfinished): busy to the end, every later wake skipped.
#   t = 100: 0 offline (+1); 1 and 2 train to 110, their messages to 0 (at 115) are lost.
#   t = 195: 0 returns and asks 1, 2, 3 (instant uplink): the requests arrive at 200.
#   t = 200: 1 wakes first (a wake before an arrival) and trains to 210; then the request
#            arrives: its latest sent message is round 100's (ended 110 ≤ 200; 210 is later),
#            held = 200 − 110 = 90 s; the reply arrives at 205.  2 is offline since 120:
#            "unreachable", answered at 200 + 5 = 205.  3 has never sent: empty, at 205.
#            Every request answered at 205 < 195 + 60: the window is [195, 205].
#            0's wake at 200 lies in it: moved to 205.
#   t = 205: 0 aggregates after the arrivals at 205: itself and 1's reply, waited
#            (205 − 205)/100 + 90/100 = 0.9 units. Without pull it aggregates at 200 alone
#            (1's message of round 0 arrived at 15, 185 s ago > W·P).
STAR_W = dict(compute=[10.0, 10.0, 10.0, 1000.0],
              online={0: [(0, 50), (195, 300)], 1: [(0, 300)], 2: [(0, 120)], 3: [(0, 300)]},
              horizon=300.0)


def test_a_reply_in_time_an_unreachable_neighbour_an_empty_answer_and_a_moved_wake():
    w = world(STAR, **STAR_W)
    sc = sched_of(w, settings())
    r = local(sc, 205.0, 0)
    assert cands(sc, r, w.rg) == [(0, None, 0.0), (1, 100.0, 0.9)]
    assert not np.any((sc.time == 200.0) & (sc.dev == 0))  # the wake moved
    st = sc.stats
    assert (st["pull_requests"], st["pull_replies"], st["pull_empty"],
            st["pull_unreachable"]) == (3, 1, 1, 1)
    assert st["pull_wait_seconds"] == 5.0  # the first local round: 205 instead of 200
    assert st["online_returns"] == 1 and st["online_returns_heard"] == 1  # 0 returns; 2 never
    none = sched_of(w, settings(on_return="none"))
    assert cands(none, local(none, 200.0, 0), w.rg) == [(0, None, 0.0)]
    assert none.stats["online_returns_heard"] == 0
    # pull's costs: 3 headers out, one model-sized reply and one empty header back
    mb = settings(message_bytes=1000.0)
    assert sched_of(w, mb).stats["pull_bytes"] == 3 * 256 + 1000 + 256


# A reply after the window: S = 8 s, so the window is [195, 203] and times out before the
# answers of 205. 0's wake moves to 203 and holds nothing. Device 1 goes offline at 205 (its
# round of 200 would end at 210: interrupted), so its newest message stays round 100's,
# which reaches 0 only as the late reply (arrived 205, held 90). At 0's next wake, 300 (the
# horizon is 311 here, so that its round ends 310 in time), the reply is an ordinary candidate: it arrived (300 − 205)/100 = 0.95
# periods ago (within W = 1) and waited 0.95 + 0.9 = 1.85 units — held counts.
def test_a_reply_after_the_window_is_a_later_candidate_older_by_its_held():
    kw = dict(STAR_W, online={**STAR_W["online"], 0: [(0, 50), (195, 311)], 1: [(0, 205)],
                              3: [(0, 311)]}, horizon=311.0)
    w = world(STAR, **kw)
    sc = sched_of(w, settings(on_return="pull:timeout=8"))
    assert cands(sc, local(sc, 203.0, 0), w.rg) == [(0, None, 0.0)]
    assert cands(sc, local(sc, 300.0, 0), w.rg) == [(0, None, 0.0), (1, 100.0, 1.85)]
    assert sc.stats["pull_timed_out"] == 1 and sc.stats["pull_wait_seconds"] == 3.0


# A lost request: the link 0 → 1 loses everything (its requests too). 1 never answers, so
# the window runs its full S = 60 s: [195, 255]; 0's wake at 200 moves to 255. Meanwhile
# 1's ordinary message of its round 200 (ended 210) arrived at 215 over 1 → 0, which loses
# nothing: 0 holds it, waited (255 − 215)/100 = 0.4.
def test_a_lost_request_keeps_the_window_open_until_its_timeout():
    w = world(STAR, **STAR_W, loss={(0, 1): 1.0})
    sc = sched_of(w, settings())
    assert cands(sc, local(sc, 255.0, 0), w.rg) == [(0, None, 0.0), (1, 200.0, 0.4)]
    assert sc.stats["pull_timed_out"] == 1 and sc.stats["pull_replies"] == 0


# Offline inside the window: 0 is online in [195, 202) only; its window [195, 205] is
# abandoned at 202 — no local round at 205, and the moved wake of 200 adds nothing (as an
# interrupted round). Its replies arrive at 205, when it is offline: lost.
def test_a_device_that_goes_offline_inside_its_window_abandons_the_wait():
    kw = dict(STAR_W, online={**STAR_W["online"], 0: [(0, 50), (195, 202)]})
    w = world(STAR, **kw)
    sc = sched_of(w, settings())
    mine = (sc.dev == 0) & (sc.time > 150)
    assert not mine.any()
    assert sc.stats["pull_abandoned"] == 1 and sc.stats["pull_replies_delivered"] == 0


# ----------------------------------------------------------------------------- one link
# A busy uplink: 0 – 1, message 1000 B, device 1's uplink 100 B/s (a message takes 10 s, a
# header 2.56 s; 0's uplink is instant). Compute 10 s. Online: 0 in [0, 50) and [200, 300),
# 1 always. Async, P = 100.
#   t = 0:   both train to 10; 1's broadcast leaves 10 → 20, arrives at 0 at 25.
#   t = 100: 0 offline; 1 trains to 110, sends 110 → 120 (to 0 at 125: lost).
#   t = 200: 0 returns (before its wake at 200, which moves); its request arrives at 205.
#            1 woke at 200 and trains to 210. The reply (round 100's message, held
#            205 − 110 = 95) is queued at 205 and leaves 205 → 215: it arrives at 220.
#            1's broadcast, queued at 210, waits behind it: 215 → 225, arriving at 230.
#            Window [200, 220]: 0 aggregates at 220 with the reply, waited 0.95.
#   t = 230: 1's round-200 message arrives (an ordinary message, later).
def test_a_reply_queues_on_a_busy_uplink_and_delays_the_next_broadcast():
    w = world(LINK, [10.0, 10.0], {0: [(0, 50), (200, 300)], 1: [(0, 300)]}, 300.0,
              uplink=[np.inf, 100.0])
    s = settings(message_bytes=1000.0)
    sc = sched_of(w, s)
    r = local(sc, 220.0, 0)
    assert cands(sc, r, w.rg) == [(0, None, 0.0), (1, 100.0, 0.95)]
    b = local(sc, 200.0, 1)
    assert sc.pulls[0][b] == 215.0  # the broadcast's start, behind the reply
    none = sched_of(w, settings(on_return="none", message_bytes=1000.0))
    assert none.pulls is None


# A reply that is not newer than what is held changes nothing: W = 1.5. 0 is offline in
# [50, 60) and 1 in [90, 300). 1's round-0 message reached 0 at 15. 0 returns at 60, asks
# 1 (arrives 65); 1's latest is still round 0's: the reply (held 65 − 10 = 55) arrives at 70.
# It is the message 0 already holds: nothing changes. At 0's wake 200 the held message
# arrived 185 s ago (1.85 > W): no candidate. Had the reply replaced it, its arrival (70)
# would keep it (1.3 ≤ W) as a candidate.
def test_a_reply_no_newer_than_the_held_message_changes_nothing():
    w = world(LINK, [10.0, 10.0], {0: [(0, 50), (60, 300)], 1: [(0, 90)]}, 300.0)
    sc = sched_of(w, settings(window=1.5))
    assert sc.stats["pull_replies_delivered"] == 1
    assert cands(sc, local(sc, 100.0, 0), w.rg) == [(0, None, 0.0), (1, 0.0, 0.85)]
    assert cands(sc, local(sc, 200.0, 0), w.rg) == [(0, None, 0.0)]


# ----------------------------------------------------------------------------- event
# Event, Δ = 100 s, 0 – 1, compute 10 s: a device trains back to back (10 s a round).
# 0 is online in [0, 50) and [150, 300); 1 always.
#   0's rounds start at 0, 10, 20, 30, 40; at 50 it is offline (off since 50).
#   1's rounds start every 10 s; its round ending at e sends to 0, arriving at e + 5.
#   t = 150: 0 returns: an offline span of (150 − 50)/100 = 1.0 unit. Its request reaches 1
#            at 155; 1's latest message ended at 150 (the round of 140): held 5 s, the
#            reply arrives at 160 — but that message already arrived at 155 (ordinary):
#            the reply is no newer. Window [150, 160]: 0 starts at 160 and holds round
#            140's message, waited (160 − 155)/100 = 0.05. Without pull it starts at 150
#            holding nothing (1's message of 145 arrived while 0 was offline).
def test_event_start_waits_for_the_window_and_holds_what_arrived_meanwhile():
    w = world(LINK, [10.0, 10.0], {0: [(0, 50), (150, 300)], 1: [(0, 300)]}, 300.0)
    sc = sched_of(w, settings("event"))
    back = np.flatnonzero((sc.dev == 0) & (sc.kind == OFFLINE))
    assert sc.time[back].tolist() == [150.0] and sc.amount[back].tolist() == [1.0]
    assert cands(sc, local(sc, 160.0, 0), w.rg) == [(0, None, 0.0), (1, 140.0, 0.05)]
    assert sc.stats["pull_wait_seconds"] == 10.0
    none = sched_of(w, settings("event", on_return="none"))
    assert cands(none, local(none, 150.0, 0), w.rg) == [(0, None, 0.0)]


# ----------------------------------------------------------------------------- cannot-communicate
# Anatomy cannot-communicate: offline, a device trains alone (K steps, no candidates, nothing
# sent), back to back under event; it neither asks nor answers while offline.
# Event, Δ = 100 s, 0 – 1; compute 40 s for 0, 100 s for 1. 0 is online in [0, 50) and
# [150, 300); 1 always.
#   0: its round 0 → 40 sends (to 1 at 40 + λ); the next, 40 → 80, is interrupted at 50, and
#      from 50 it trains alone: 50 → 90, 90 → 130, 130 → 170 (begun offline, ends online).
#   1: rounds 0 → 100 (its message reaches 0 at 100 + λ, offline: lost), 100 → 200, …
#   λ = 15 s: 0 returns at 150; its request reaches 1 at 165; 1's latest message is round
#      0's (ended 100): held 65 s, the reply arrives at 180. Window [150, 180]. The local
#      round 0 would start when the one it is in ends (170) lies in the window: it starts at
#      180 instead (waited 10 s), holding the reply: waited (180 − 180)/100 + 65/100 = 0.65.
#   λ = 5 s: the reply arrives at 160, window [150, 160], ended before 0's round does: no
#      start in it, none delayed. 0 starts at 170 as without pull, holding the reply:
#      (170 − 160)/100 + 55/100 = 0.65. Without pull it holds nothing at 170.
ALONE_W = dict(edges=LINK, compute=[40.0, 100.0], online={0: [(0, 50), (150, 300)],
                                                          1: [(0, 300)]}, horizon=300.0)


def alone_world(**kw):
    a = {**ALONE_W, **kw}
    return world(a.pop("edges"), a.pop("compute"), a.pop("online"), a.pop("horizon"), **a)


def test_cannot_communicate_a_round_begun_offline_that_ends_in_the_window_is_delayed():
    w = alone_world(latency=15.0)
    sc = event_schedule(w, settings("event"), local_steps=1, seed=1,
                        anatomy="cannot-communicate")
    mine = np.flatnonzero((sc.dev == 0) & (sc.kind == LOCAL))
    assert sc.time[mine].tolist()[:5] == [0.0, 50.0, 90.0, 130.0, 180.0]
    assert sc.caps[mine].tolist()[:5] == [EV_ALL, EV_TRAIN, EV_TRAIN, EV_TRAIN, EV_ALL]
    assert cands(sc, local(sc, 130.0, 0), w.rg) == [(0, None, 0.0)]  # alone: no candidates
    r = local(sc, 180.0, 0)
    assert cands(sc, r, w.rg) == [(0, None, 0.0), (1, 0.0, 0.65)]
    assert sc.pulls[1][r]  # the delayed start: after the arrivals at 180
    assert sc.stats["pull_wait_seconds"] == 10.0 and sc.stats["pull_replies_delivered"] == 1
    assert not (sc.kind == OFFLINE).any()  # trained alone: no offline span, age stays 0


def test_cannot_communicate_a_window_that_ends_first_delays_nothing():
    w = alone_world()
    sc = event_schedule(w, settings("event"), local_steps=1, seed=1,
                        anatomy="cannot-communicate")
    assert cands(sc, local(sc, 170.0, 0), w.rg) == [(0, None, 0.0), (1, 0.0, 0.65)]
    assert sc.stats["pull_wait_seconds"] == 0.0
    none = event_schedule(w, settings("event", on_return="none"), local_steps=1, seed=1,
                          anatomy="cannot-communicate")
    assert cands(none, local(none, 170.0, 0), w.rg) == [(0, None, 0.0)]
    assert none.time[none.dev == 0].tolist() == sc.time[sc.dev == 0].tolist()


# Offline again inside the window, idle: λ = 15 (window [150, 180]), 0 online in [150, 175)
# only. Its round begun offline ends at 170, in the window, so it waits; at 175 it goes
# offline: the wait is abandoned and it trains alone from 175 (175 → 215, …); nothing at 180.
def test_cannot_communicate_offline_inside_the_window_trains_alone_from_then():
    w = alone_world(latency=15.0, online={0: [(0, 50), (150, 175)], 1: [(0, 300)]})
    sc = event_schedule(w, settings("event"), local_steps=1, seed=1,
                        anatomy="cannot-communicate")
    mine = np.flatnonzero((sc.dev == 0) & (sc.kind == LOCAL))
    assert sc.time[mine].tolist() == [0.0, 50.0, 90.0, 130.0, 175.0, 215.0, 255.0]
    assert (sc.caps[mine[1:]] == EV_TRAIN).all()
    assert sc.stats["pull_abandoned"] == 1 and sc.stats["pull_wait_seconds"] == 0.0


# Async, P = 100, W = 1, no jitter, 0 – 1, λ = 5; compute 120 s for 0, 10 s for 1; 0 online
# in [0, 50) and [195, 430), 1 always; horizon 430.
#   t = 0:   0's round would end at 120: interrupted at 50. 1 trains to 10 and sends.
#   t = 100: 0 offline and free: it trains alone, 100 → 220.
#   t = 195: 0 returns; the request reaches 1 at 200, after 1's wake (it trains to 210); its
#            latest is round 100's (ended 110), held 90: the reply arrives at 205. Window
#            [195, 205]: 0's wake at 200 moves to 205 and finds it still busy (to 220):
#            skipped; nothing waited for.
#   t = 300: 0 trains (300 → 420) holding 1's round-200 message (arrived 215, 0.85); its
#            wake at 400 is skipped (busy). Without pull the wake of 200 is skipped at 200.
def test_cannot_communicate_a_moved_wake_that_finds_the_device_busy_is_skipped():
    w = alone_world(compute=[120.0, 10.0], online={0: [(0, 50), (195, 430)], 1: [(0, 430)]},
                    horizon=430.0)
    sc = async_schedule(w, settings(), local_steps=1, seed=1, anatomy="cannot-communicate")
    mine = np.flatnonzero((sc.dev == 0) & (sc.kind == LOCAL))
    assert sc.time[mine].tolist() == [100.0, 300.0]
    assert sc.caps[mine].tolist() == [EV_TRAIN, EV_ALL]
    assert cands(sc, mine[1], w.rg) == [(0, None, 0.0), (1, 200.0, 0.85)]
    assert sc.stats["pull_wait_seconds"] == 0.0 and sc.stats["pull_replies_delivered"] == 1
    none = async_schedule(w, settings(on_return="none"), local_steps=1, seed=1,
                          anatomy="cannot-communicate")
    assert none.stats["skipped"] == sc.stats["skipped"] == 2  # 200 (at 205) and 400


# ----------------------------------------------------------------------------- link failures
# Link failures are drawn per Δ-round (docs/concepts/outages.md#link-failures); a request or
# reply whose transfer ends while its link is down is lost (silent), as a message is.
# 0 – 1, event, Δ = 100, compute 10 s, λ = 5, S = 60; 1 always online; 0 offline for a
# moment in Δ-rounds chosen from the draws: returning at 10 s into a round whose link is
# down, its request is lost and its window runs to the timeout; in a round whose link (and
# the next) is up, it hears within 10 s; at 97 s into an up round followed by a down one,
# its request gets through but the reply (leaving at 102 s) is lost.
def test_a_request_over_a_failed_link_is_silent():
    from sfg.world.outages.links import link_failures

    p, T = 0.5, 40
    live = link_failures(LINK, T, p=p, seed=1)[:, 0]
    down = int(np.flatnonzero(~live[1:-1])[0]) + 1
    up = int(np.flatnonzero(live[1:-1] & live[2:])[0]) + 1
    up_down = int(np.flatnonzero(live[1:-1] & ~live[2:])[0]) + 1
    # (return time, windows timed out, wait, replies sent): the request lost; heard; the
    # request sent at 97 s into an up round, answered at 102 s, in the next, down, round
    for t_r, timed_out, wait, replies in ((down * 100.0 + 10, 1, 60.0, 0),
                                          (up * 100.0 + 10, 0, 10.0, 1),
                                          (up_down * 100.0 + 97, 1, 60.0, 1)):
        w = world(LINK, [10.0, 10.0], {0: [(0, t_r - 5.0), (t_r, T * 100.0)],
                                       1: [(0, T * 100.0)]}, T * 100.0)
        sc = event_schedule(w, settings("event"), local_steps=1, seed=1, link_failure=p)
        st = sc.stats
        assert (st["pull_timed_out"], st["pull_wait_seconds"], st["pull_replies"]) == \
            (timed_out, wait, replies), t_r


# ----------------------------------------------------------------------------- async jitter
def test_a_second_wake_inside_the_window_is_skipped():
    """With jitter two wakes can fall in one window: the first moves to the window's end,
    the second is skipped and counted. Device 0 is offline until just before a pair of its
    wakes that are closer than S (found from the jitter draws of seed 1)."""
    from sfg.round.staleness import wake_jitter

    P, J, S = 100.0, 0.9, 80.0
    jit = wake_jitter(1, 40, 2)[:, 0] * J * P
    wake = np.arange(40) * P + jit
    r = int(np.argmin(np.diff(wake)))
    assert wake[r + 1] - wake[r] < S - 1
    t_r = wake[r] - 0.5
    # latency 45 s: the answer would arrive at t_r + 90, after the window's S = 80 s, so the
    # window times out at t_r + 80, after both wakes
    w = world(LINK, [1.0, 1.0], {0: [(t_r, 4000.0)], 1: [(0, 4000.0)]}, 4000.0, latency=45.0)
    s = settings(period=P, jitter=J, on_return=f"pull:timeout={S:g}")
    sc = async_schedule(w, s, local_steps=1, seed=1)
    assert sc.stats["pull_skipped"] == 1
    ends = np.flatnonzero((sc.dev == 0) & (sc.kind == LOCAL))
    assert sc.time[ends[0]] == t_r + S and sc.stats["pull_timed_out"] == 1
    assert not np.isin(wake[[r, r + 1]], sc.time[ends]).any()


# ----------------------------------------------------------------------------- one protocol
@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("process", ["bursty:u=0.8", "iid:u=0.6"])
@pytest.mark.parametrize(("catchup", "anatomy"), [(False, "full"), (True, "full"),
                                                  (True, "cannot-communicate"),
                                                  (False, "cannot-train-shares"),
                                                  (True, "cannot-train-adopts")])
def test_without_pull_the_simulation_is_the_vectorised_schedule(protocol, process, catchup,
                                                                anatomy):
    """The one simulation of the protocols with pull off gives the vectorised reference's
    events and counts exactly, on random worlds (tests/reference_schedules.py, written the
    other way: per wake over all devices), and the schedule ``src`` assembles from it has the
    reference's digest — under every anatomy mode too: the local rounds an offline device
    trains alone, and what it keeps doing while it still communicates (ticks under event),
    their steps and capabilities."""
    for seed, kw in ((1, {"compute": "const:value=30"}),
                     (2, {"compute": "lognormal:median=30,sigma=1",
                          **({"jitter": 0.5} if protocol == "async" else {})}),
                     (3, {"compute": "const:value=100", "uplink": "const:value=1000",
                          "message_bytes": 50000.0, "latency": "const:value=3"})):
        st = make_settings({"protocol": protocol, **kw})
        w = make_world(st, process=process, graph="knn:k=4", n=30, rounds=40, seed=seed)
        ref = (vectorised_async_schedule if protocol == "async" else vectorised_event_schedule)(
            w, st, local_steps=5, seed=seed, catchup=catchup, anatomy=anatomy)
        one = (async_schedule if protocol == "async" else event_schedule)(
            w, st, local_steps=5, seed=seed, catchup=catchup, anatomy=anatomy)
        assert one.digest() == ref.digest()  # the schedule src makes is the reference's
        got = simulate(w, st, protocol, local_steps=5, seed=seed, catchup=catchup, pull=False,
                       anatomy=anatomy)
        E = all_events(got)
        E = E[np.lexsort((-E[:, 2], E[:, 1], E[:, 0]))]
        cols = [("time", 0), ("dev", 1), ("kind", 2), ("amount", 3), ("end", 4), ("step", 5),
                ("t", 6)]
        if anatomy == "cannot-communicate":
            assert (E[:, 10] == EV_TRAIN).sum() > 100  # rounds trained alone, offline
        if anatomy.startswith("cannot-train"):  # what an offline device keeps doing
            assert ((E[:, 10] != 0) & (E[:, 10] != EV_ALL)).sum() > 100
        if anatomy != "full":
            cols += [("nsteps", 7), ("caps", 10)]
        for k, col in cols:
            assert np.array_equal(getattr(ref, k), E[:, col]), (k, seed)
        c = got["counts"]
        assert (ref.stats["interrupted"], ref.stats["unfinished"]) == (c[1], c[2])
        if protocol == "async":
            assert (ref.stats["skipped"], ref.stats["offline_wakes"]) == (c[0], c[3])
        elif anatomy.startswith("cannot-train"):
            assert ref.stats["skipped"] == c[0]


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_pull_is_part_of_the_schedule_and_none_is_unchanged(protocol):
    """``pull`` changes the digest (and the same seed gives the same one); ``none`` is the
    schedule as it was (its digest is that of the settings without the key)."""
    base = {"protocol": protocol, "compute": "const:value=30", "latency": "const:value=2"}
    w = make_world(make_settings(base), process="bursty:u=0.8", graph="knn:k=4", n=30,
                   rounds=30, seed=4)
    d0 = sched_of(w, make_settings(base), K=5).digest()
    dn = sched_of(w, make_settings({**base, "on_return": "none"}), K=5).digest()
    dp = sched_of(w, make_settings({**base, "on_return": "pull:timeout=30"}), K=5).digest()
    dp2 = sched_of(w, make_settings({**base, "on_return": "pull:timeout=30"}), K=5).digest()
    assert d0 == dn and dp == dp2 and dp != dn


def test_in_a_fault_free_world_every_return_that_can_hear_does():
    """Instant transfers, latency 1 s, S = 30 s above the round trip: a return hears a
    neighbour when one is online at its request's arrival (t_r + 1) and has sent something
    the returning device has not held (a local round ended while it was away, by t_r + 1);
    a reply no newer than what is held changes nothing. Counted exactly, return by return."""
    from sfg.clock.pull import returns_of

    st = make_settings({"protocol": "event", "compute": "const:value=30",
                        "latency": "const:value=1", "on_return": "pull:timeout=30"})
    w = make_world(st, process="bursty:u=0.8", graph="knn:k=6", n=60, rounds=40, seed=3)
    sc = sched_of(w, st, K=5)
    rptr, rtime, _ = returns_of(w)
    on = w.online
    loc = sc.kind == LOCAL
    must = heard = 0
    for i in range(w.n):
        nb = w.rg.send[w.rg.indptr[i] + 1:w.rg.indptr[i + 1]]
        for k in range(rptr[i], rptr[i + 1]):
            t_r = rtime[k]
            away = on.end[on.indptr[i]:on.indptr[i + 1]]
            away = float(away[away <= t_r].max(initial=0.0))  # when it went offline
            up = nb[on.online_at(nb, np.full(nb.size, t_r + 1.0))]
            new = loc & np.isin(sc.dev, up) & (sc.end > away) & (sc.end <= t_r + 1.0)
            first = np.flatnonzero(loc & (sc.dev == i) & (sc.time >= t_r))
            if not new.any() or not first.size:
                continue
            must += 1
            heard += int(sc.cptr[first[0] + 1] - sc.cptr[first[0]] > 1)
    assert must > 20 and heard == must
    none = sched_of(w, make_settings({**{k: getattr(st, k) for k in ("protocol", "compute",
                                                                     "latency")}}), K=5)
    assert none.stats["online_returns_heard"] < sc.stats["online_returns_heard"]


def test_refusals():
    for kw, msg in (({"protocol": "async", "on_return": "pull:timeout=600"}, "below P"),
                    ({"protocol": "async", "on_return": "pull:timeout=0"}, "> 0"),
                    ({"protocol": "event", "on_return": "push"}, "pull:timeout=S")):
        with pytest.raises(SfgError, match=msg):
            make_settings(kw)
    st = make_settings({"protocol": "event", "compute": "const:value=30", "on_return": "pull"})
    w = make_world(st, process="bursty:u=0.8", graph="ring", n=6, rounds=5, seed=1)
    with pytest.raises(SfgError, match="under lockstep"):
        lockstep_rounds(w, make_settings({"protocol": "lockstep", "on_return": "pull"}),
                        local_steps=1, rounds=5, seed=1)


# ----------------------------------------------------------------------------- training, replay
TINY = dict(dataset="digits", model="mlp", n_clients=12, rounds=8, local_steps=2, batch_size=8,
            eval_every=4, graph="knn:k=3", backend="batched", process="bursty:u=0.6",
            clock="virtual", protocol="event", compute="const:value=30",
            latency="const:value=5")


def test_training_with_pull_is_paired_across_rules_and_deterministic():
    """Every rule of a seed trains on the same schedule (its digest) with pull; the same
    settings give bit-identical models; pull changes what a returning device holds, so the
    models differ from none's."""
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    def run(rule, on_return):
        return simulate_events(resolve_config({**TINY, "rule": rule, "on_return": on_return}))

    a, b = run("dfedavg", "pull:timeout=60"), run("sfg-l", "pull:timeout=60")
    again = run("dfedavg", "pull:timeout=60")
    none = run("dfedavg", "none")
    assert a["meta"]["schedule_digest"] == b["meta"]["schedule_digest"]
    assert a["meta"]["schedule_digest"] != none["meta"]["schedule_digest"]
    assert np.array_equal(np.asarray(a["params"]), np.asarray(again["params"]))
    assert not np.array_equal(np.asarray(a["params"]), np.asarray(none["params"]))
    m, mn = a["metrics"], none["metrics"]
    assert m["returns_heard"] > mn["returns_heard"]
    assert m["pull_requests"] > 0 and "pull_requests" not in mn


def test_the_replay_reports_returns_heard_with_and_without_pull():
    import json
    import subprocess
    import sys

    def replay(on_return):
        out = subprocess.run([sys.executable, "-m", "sfg", "replay", "--clock", "virtual",
                              "--protocol", "event", "--compute", "const:value=30",
                              "--latency", "const:value=1", "--on-return", on_return,
                              "-n", "30", "--rounds", "20", "--seeds", "1", "--rule", "dfedavg",
                              "--horizon", "0", "--json"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["summary"][0]

    none, pull = replay("none"), replay("pull:timeout=60")
    assert none["online_returns"] == pull["online_returns"] > 0
    assert none["online_heard"] == 0.0 < pull["online_heard"]
    assert none["online_alone"] == pull["online_alone"]
