"""The async and event protocols (docs/concepts/clock.md#the-three-protocols), with
``on_return: none`` or ``pull:timeout=S`` (docs/concepts/clock.md#returns-in-time), as one
discrete-event simulation in time order — the one definition of their schedules
(:func:`sfg.clock.schedule.async_schedule` and :func:`~sfg.clock.schedule.event_schedule`
assemble what it makes). Every device's uplink is a first-in-first-out queue and the events
run in time order (:func:`_simulate`, compiled): ``pull`` couples devices in time (a
neighbour's reply waits on its uplink behind a broadcast in progress and delays the broadcast
queued after it, and the returning device's first local round waits for the replies), and so
will peers chosen per exchange. Written a second way, vectorised per wake over all devices,
the protocols without pull are the reference it is checked against, event by event, on
random worlds under every anatomy mode (tests/reference_schedules.py, tests/test_clock_pull.py).

What happens (everything a function of the seed and the settings, never of the rule):

* **Return**: the start of an online interval after time 0. The device queues a pull request
  (:data:`~sfg.clock.settings.HEADER_BYTES`) to every neighbour, in the order of their ids,
  back to back on its uplink (which is empty: what it was sending when it went offline was
  lost). Request k of a return leaves at t_r + (k+1)·h_i (h_i: a header's transfer time) and
  arrives after the link's latency λ_ij. A request is lost (silent) when the device goes
  offline before it leaves, with the link's loss probability (stream ``clock-pull-request``)
  or to a message fault on the faults' channel 2.
* **Answers**: a neighbour online when the request arrives queues a reply on its uplink: its
  latest sent message (the last local round whose K steps ended at or before the arrival)
  with ``held`` = the seconds since that local round ended, or an empty answer (a header)
  when it has sent nothing yet. The reply leaves when the uplink is free, is lost when the
  neighbour goes offline before it has left, when the receiver is offline at its arrival, with
  the link's loss probability (stream ``clock-pull-reply``) or a fault of channel 3 (drawn at
  the reply's queueing). A request that reaches an offline neighbour is answered
  "unreachable" λ_ji after its arrival (no uplink, no bytes, never lost).
* **Window** [t_r, t_end]: t_end is when every request is answered (reply, empty or
  unreachable) or t_r + S, whichever is first. Under ``async`` the first wake in the window
  moves to t_end and later wakes in it are skipped (counted, ``pull_skipped``); under
  ``event`` the local round the device would start at its return starts at t_end. The moved
  start aggregates after the arrivals at t_end (``Schedule.closes``). A device that goes
  offline inside its window abandons the wait (``pull_abandoned``; the moved wake adds
  nothing, as an interrupted local round).
* **Uplink**: a broadcast is queued when its local round's K steps end and starts when the
  replies queued before it have left (``Schedule.bstart``); replies do not make a device busy
  for its own wakes, but a broadcast delayed behind them keeps it busy until it has left.
* **Anatomy** ``cannot-communicate``: an offline device trains alone (a local round with
  the capabilities the mode keeps: no candidates, nothing sent), at its offline wakes
  (async) or back to back from when it went offline (event); a request that reaches it is
  unreachable. Back online in the middle of such a round, it finishes it first: under
  ``event`` its next local round would start when that round ends, and is delayed to the
  window's end if that lies in the window; under ``async`` the moved wake finds it busy and
  is skipped. Gone offline while it waits, it trains alone from then.
* **Link failures** (per Δ-round, :func:`sfg.clock.links.live_links`): a request or reply
  whose transfer ends while its link is down is lost (silent).

Event priorities at one instant, the phases of one instant (:mod:`sfg.clock.instant`): a
return, a request's arrival (answered with the message sent before the instant), a window's
end, a local round's end (its broadcast queued, behind a reply queued at the same instant),
a wake (async) or a free device's start (event). A local round's end comes before the wakes
of its instant so that a device whose round and sends end at t is free for a wake at t (busy
on [start, end)); what it sends at t is held by no local round starting at t
(:func:`sfg.clock.instant.held_at`: by time, not by the order of processing).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from numba import types
from numba.typed import Dict

from sfg.clock.peersim import (
    P_COUNTS,
    P_KIND,
    P_LATENCY,
    P_LOSS,
    P_M,
    P_PULL_KEY,
    P_REPLY_KEY,
    P_REQUEST_KEY,
    P_S,
    P_TAB_ID,
    P_TAB_N,
    arrivals,
    draw_targets,
    fates,
    grow,
    heard,
    new_pool,
    pair_counts,
    put,
    reply_entries,
    room,
    unreachable,
)
from sfg.clock.settings import HEADER_BYTES, ClockSettings
from sfg.errors import SfgError
from sfg.util.numba_start import njit
from sfg.world.locate import locate_one, near_start
from sfg.world.peers import draw_epidemic, draw_online, hear_scratch, uniform4

# event kinds of the simulation, in their order at one instant (the phases of one instant,
# sfg.clock.instant: a return, a request's arrival, a window's end, then the local rounds'
# ends booked before the wakes — a device whose local round and sends end at t is free for a
# wake at t, busy on [start, end) as availability is online on [start, end) — while what is
# sent at t is held by no local round starting at t: sfg.clock.instant.held_at)
_RETURN, _REQUEST, _WINDOW, _COMMIT, _WAKE = 0, 2, 4, 5, 6
# peers chosen per exchange (sfg.clock.peersim): an "unreachable" answer removes its peer from
# the asking device's table before the instant's requests are answered (phase 2), and the
# instant's arrivals are heard after them (each reply carries its sender's table as it stood
# before the instant's arrivals); a message that arrives at the instant it was sent is heard
# after all of the instant's events (kept aside, not in the heap: _simulate's ``late``)
_FORGET, _HEAR = 1, 3
# request fates known before the simulation
ARRIVES, UNREACHABLE, SILENT = 0, 1, 2
# schedule events (sfg.clock.schedule.LOCAL, OFFLINE)
_LOCAL, _OFFLINE = 0, 1


@njit(cache=True, nogil=True)
def _online(ipt, ist, ien, i, t, horizon):  # pragma: no cover - compiled
    return t < horizon and locate_one(ipt, ist, ien, i, t)[1]


@njit(cache=True, nogil=True)
def _next_off(ipt, ist, ien, i, t):  # pragma: no cover - compiled
    k, on = locate_one(ipt, ist, ien, i, t)
    return ien[k] if on else t


@njit(cache=True, nogil=True)
def _put(E, k, time, dev, kind, amount, end, step, t, nsteps, bstart, closes,
         caps):  # pragma: no cover - compiled
    if k >= E.shape[1]:
        raise ValueError("more events than the schedule's bound")
    E[0, k] = time
    E[1, k] = dev
    E[2, k] = kind
    E[3, k] = amount
    E[4, k] = end
    E[5, k] = step
    E[6, k] = t
    E[7, k] = nsteps
    E[8, k] = bstart
    E[9, k] = closes
    E[10, k] = caps


# per-device state of the simulation: floats F[:, k] and integers G[:, k]
_BUSY, _UFREE, _SENT_FE, _OFF_SINCE, _W_START, _W_MOVED, _W_LAST, _CHAIN_AT = range(8)
(_TAU, _COUNT, _SENT_ID, _TOKEN, _W_OPEN, _W_RET, _W_ROUND, _W_LEFT, _W_SILENT,
 _CHAIN_POS) = range(10)
# counts
(_SKIPPED, _INTERRUPTED, _UNFINISHED, _OFFLINE_WAKES, _PULL_SKIPPED, _ABANDONED, _WAIT,
 _WINDOWS, _TIMED_OUT) = range(9)


@njit(cache=True, nogil=True)
def _on_commit(heap, E, F, G, i, r, proto, alone, talk, pull, ipt, ist, ien, deg,
               dt):  # pragma: no cover - compiled
    """Local round r of device i has done its steps: its broadcast is queued on the uplink
    (behind what was queued before), the device stays busy until it has left (``alone``:
    offline devices train alone, anatomy ``cannot-communicate``; ``talk``: they keep
    communicating, ``cannot-train-*``). Without ``pull`` nothing but broadcasts uses the
    uplink, and a local round starts only once the last has left or the device went
    offline: a broadcast starts at its round's end."""
    start = max(E[4, r], F[i, _UFREE]) if pull else E[4, r]
    bend = start + deg[i] * dt[i]
    F[i, _UFREE] = bend
    E[8, r] = start
    G[i, _SENT_ID] = r
    F[i, _SENT_FE] = E[4, r]
    off = _next_off(ipt, ist, ien, i, E[4, r])
    F[i, _BUSY] = min(bend, off)
    if proto == 0:
        return
    if off > bend:
        heapq.heappush(heap, (bend, _WAKE, i, 0))
    elif alone:  # gone before its sends are done: it trains alone from then
        heapq.heappush(heap, (off, _WAKE, i, 0))
    elif talk:  # gone before its sends are done, which go on: it ticks from then
        F[i, _OFF_SINCE] = off
        heapq.heappush(heap, (bend, _WAKE, i, 0))
    else:
        F[i, _OFF_SINCE] = off  # gone before its sends are done: free at its next return


@njit(cache=True, nogil=True)
def _on_return(heap, E, ne, F, G, st, i, k, now, proto, pull, alone, talk, S, unit, rptr,
               rtime, rend, deg, dth, qptr, qcode, qtime):  # pragma: no cover - compiled
    """Return k of device i at ``now``: the offline span (event), the requests and the
    window's end at the latest (pull), or the start at once (event without pull; ``alone``:
    the local round it trains alone, if any, starts the next when it ends). Returns the
    events' count."""
    if talk:  # a device that keeps communicating has no returns: its ticks say when it starts
        return ne
    if k + 1 < rptr[i + 1]:
        heapq.heappush(heap, (rtime[k + 1], _RETURN, i, k + 1))
    if G[i, _W_OPEN]:  # the last window ended by going offline: abandoned
        G[i, _W_OPEN] = 0
        st[_ABANDONED] += 1
    G[i, _TOKEN] += 1
    G[i, _CHAIN_POS] = -1  # (training alone, the local rounds after a return start anew)
    F[i, _UFREE] = now  # what the uplink held when the device went offline was lost
    if proto == 1 and not np.isnan(F[i, _OFF_SINCE]):  # the offline span, counted now
        amt = (now - F[i, _OFF_SINCE]) / unit
        _put(E, ne, now, i, _OFFLINE, amt, now, -1, np.floor(now / unit), 0, now, False, 0)
        ne += 1
        G[i, _TAU] += np.int64(np.floor(amt))
        F[i, _OFF_SINCE] = np.nan
    if not pull:
        if proto == 1 and not alone:
            heapq.heappush(heap, (now, _WAKE, i, 0))
        return ne
    F[i, _UFREE] = now + deg[i] * dth[i]  # the requests, back to back
    G[i, _W_OPEN] = 1
    F[i, _W_START] = now
    G[i, _W_RET] = k
    # the start the window delays: under event the one at the return (a device training
    # alone starts its next local round when the one it is in ends: that one, if in the window)
    pending = proto == 1 and not alone
    F[i, _W_MOVED] = now if pending else np.nan
    G[i, _W_ROUND] = 0 if pending else -1
    G[i, _W_SILENT] = 0
    F[i, _W_LAST] = now
    left = 0
    for q in range(qptr[k], qptr[k + 1]):
        if qcode[q] == ARRIVES:
            left += 1  # its arrival: the sorted request table (rt, rd, rq)
        elif qcode[q] == UNREACHABLE:
            F[i, _W_LAST] = max(F[i, _W_LAST], qtime[q])
        else:
            G[i, _W_SILENT] = 1
    G[i, _W_LEFT] = left
    st[_WINDOWS] += 1
    t_end = now + S
    if left == 0 and not G[i, _W_SILENT]:
        t_end = min(t_end, F[i, _W_LAST])
    heapq.heappush(heap, (t_end, _WINDOW, i, G[i, _TOKEN]))
    if alone and rend[k] < t_end:  # going offline ends the wait: it trains alone from then
        heapq.heappush(heap, (rend[k], _WINDOW, i, G[i, _TOKEN]))
    return ne


@njit(cache=True, nogil=True)
def _on_request(heap, F, G, i, q, now, S, horizon, ipt, ist, ien, dt, dth, qptr, qlat, qextra,
                qdrop, qret, qedge, live, lf_unit, rep):  # pragma: no cover - compiled
    """Request q arrives at device i (online): its reply is queued on i's uplink; the
    returning device's window learns the answer (or that there will be none). ``live``
    [T, E]: the links up in each Δ-round (link failures; a reply whose transfer ends while
    its link is down is lost)."""
    rep_src, rep_held, rep_arr, rep_ok, rep_sent = rep
    ret_dev = qret[q]
    src = G[i, _SENT_ID]
    start = max(now, F[i, _UFREE])
    end = start + (dt[i] if src >= 0 else dth[i])
    F[i, _UFREE] = end
    rep_src[q] = src
    rep_held[q] = (now - F[i, _SENT_FE]) if src >= 0 else 0.0
    sent = end <= _next_off(ipt, ist, ien, i, now) and end <= horizon
    rep_sent[q] = sent
    arr = end + qlat[q] + qextra[q]
    rep_arr[q] = arr
    lr = min(np.int64(end // lf_unit), live.shape[0] - 1)
    ok = sent and (not qdrop[q]) and live[lr, qedge[q]] \
        and _online(ipt, ist, ien, ret_dev, arr, horizon)
    rep_ok[q] = ok
    rk = G[ret_dev, _W_RET]
    if G[ret_dev, _W_OPEN] and qptr[rk] <= q < qptr[rk + 1]:  # its open window's request
        G[ret_dev, _W_LEFT] -= 1
        if ok:
            F[ret_dev, _W_LAST] = max(F[ret_dev, _W_LAST], arr)
        else:
            G[ret_dev, _W_SILENT] = 1
        if G[ret_dev, _W_LEFT] == 0 and not G[ret_dev, _W_SILENT] \
                and F[ret_dev, _W_LAST] < F[ret_dev, _W_START] + S:
            heapq.heappush(heap, (max(F[ret_dev, _W_LAST], now), _WINDOW, ret_dev,
                                  G[ret_dev, _TOKEN]))


@njit(cache=True, nogil=True)
def _on_window(F, G, st, i, token, now, proto, alone, S, horizon, ipt, ist,
               ien):  # pragma: no cover - compiled
    """The end of device i's window: the start it delays (its arg, < 0), 1 (event, a device
    gone offline while it waited: it trains alone from now) or 0 (none)."""
    if not G[i, _W_OPEN] or token != G[i, _TOKEN]:
        return 0  # an earlier end of this window was already taken, or a stale one
    G[i, _W_OPEN] = 0
    if now >= F[i, _W_START] + S:
        st[_TIMED_OUT] += 1
    gone = _next_off(ipt, ist, ien, i, F[i, _W_START])
    if not _online(ipt, ist, ien, i, now, horizon) or gone < now:
        st[_ABANDONED] += 1  # offline inside the window: the wait is abandoned
        if proto == 1:
            if alone:  # (now is when it went offline: the window ends then at the latest)
                return 1 if G[i, _W_ROUND] >= 0 else 0
            F[i, _OFF_SINCE] = gone
        return 0
    if G[i, _W_ROUND] < 0:
        return 0  # nothing to start in the window (still training alone, or no wake in it)
    if now >= F[i, _BUSY]:  # (a moved wake that finds the device busy waited for nothing)
        st[_WAIT] += now - F[i, _W_MOVED]
    if proto == 1:
        return -1
    return -1 - G[i, _W_ROUND]  # the moved wake of that round


@njit(cache=True, nogil=True)
def _on_start(heap, E, ne, F, G, st, i, arg, now, proto, defer, alone, talk, horizon, unit,
              ipt, ist, ien, compute, K, ns_table, keeps, ev_all, deg,
              dt):  # pragma: no cover - compiled
    """A wake (async; arg: its round, or −1 − round when moved to a window's end) or a free
    device's start (event; arg < 0 when moved): the local round, an offline wake (``alone``:
    a local round trained alone, capabilities ``keeps``; ``talk``: what the mode keeps, its
    sends taking deg·dt seconds), a skip. Without ``defer`` (pull, or peers chosen per
    exchange, whose commits draw from the tables in their place) the local round's commit is made
    at once (:func:`_on_commit`: nothing else reads it). Returns the events' count."""
    k, on = locate_one(ipt, ist, ien, i, now)  # online now, and until when
    on = on and now < horizon
    off = ien[k] if on else now
    if talk and not on:  # offline, still communicating (anatomy cannot-train-*)
        if now >= horizon:
            return ne
        if proto == 1:
            return _ticks(heap, E, ne, F, G, st, i, now, horizon, unit, ipt, ist, ien,
                          deg[i] * dt[i], keeps)
        st[_OFFLINE_WAKES] += 1
        if now < F[i, _BUSY]:
            st[_SKIPPED] += 1
            return ne
        _put(E, ne, now, i, _LOCAL, 0.0, now, arg, arg, 0, now, False, keeps)
        F[i, _BUSY] = now + deg[i] * dt[i]
        G[i, _TAU] += 1
        return ne + 1
    if talk and proto == 1 and not np.isnan(F[i, _OFF_SINCE]):  # back: the offline span
        amt = (now - F[i, _OFF_SINCE]) / unit
        _put(E, ne, now, i, _OFFLINE, amt, now, -1, np.floor(now / unit), 0, now, False, 0)
        ne += 1
        G[i, _TAU] += np.int64(np.floor(amt))
        F[i, _OFF_SINCE] = np.nan
    if alone and not on:  # offline: K steps alone, no candidates, nothing sent
        if now >= horizon:
            return ne
        k_s = K * compute[i]
        if proto == 0:
            st[_OFFLINE_WAKES] += 1
            if now < F[i, _BUSY]:
                st[_SKIPPED] += 1
                return ne
            step, t_ev = arg, arg
        else:
            # back to back from when it went offline: the p-th starts at that time + p·K·c_i
            if G[i, _CHAIN_POS] >= 0 and now == F[i, _BUSY]:
                G[i, _CHAIN_POS] += 1
                now = F[i, _CHAIN_AT] + G[i, _CHAIN_POS] * k_s
            else:
                G[i, _CHAIN_POS] = 0
                F[i, _CHAIN_AT] = now
            step, t_ev = G[i, _COUNT], np.int64(np.floor(now / unit))
        fe = now + k_s
        if fe > horizon:
            st[_UNFINISHED] += 1
            return ne
        _put(E, ne, now, i, _LOCAL, 0.0, fe, step, t_ev, K, fe, False, keeps)
        F[i, _BUSY] = fe
        G[i, _COUNT] += 1
        G[i, _TAU] = 0
        if proto == 1:
            heapq.heappush(heap, (fe, _WAKE, i, 0))
        return ne + 1
    G[i, _CHAIN_POS] = -1
    if proto == 0:
        if arg >= 0:
            r = arg
            if G[i, _W_OPEN] and on:
                if G[i, _W_ROUND] < 0:  # the first wake in the window moves to its end
                    G[i, _W_ROUND] = r
                    F[i, _W_MOVED] = now
                else:
                    st[_PULL_SKIPPED] += 1
                return ne
        else:
            r = -1 - arg
        if not on:
            st[_OFFLINE_WAKES] += 1
            _put(E, ne, now, i, _OFFLINE, 1.0, now, r, r, 0, now, False, 0)
            G[i, _TAU] += 1
            return ne + 1
        if now < F[i, _BUSY]:
            st[_SKIPPED] += 1
            return ne
        step, t_ev = r, r
    else:
        if arg >= 0 and G[i, _W_OPEN] and on:  # the start waits for the window's end
            if G[i, _W_ROUND] < 0:
                G[i, _W_ROUND] = 0
                F[i, _W_MOVED] = now
            return ne
        step, t_ev = G[i, _COUNT], np.int64(np.floor(now / unit))
    tau = G[i, _TAU]
    ns = ns_table[min(tau, ns_table.shape[0] - 1)]  # the rule's steps at this age
    fe = now + ns * compute[i]
    through = min(fe, horizon) <= off
    if not (through and fe <= horizon):
        st[_UNFINISHED if through else _INTERRUPTED] += 1
        F[i, _BUSY] = max(off, now)
        if proto == 1 and not through:
            if alone:
                heapq.heappush(heap, (off, _WAKE, i, 0))  # it trains alone from then
            elif talk:
                F[i, _OFF_SINCE] = off
                heapq.heappush(heap, (off, _WAKE, i, 0))  # it ticks from then
            else:
                F[i, _OFF_SINCE] = off
        return ne
    _put(E, ne, now, i, _LOCAL, 0.0, fe, step, t_ev, ns, fe, arg < 0, ev_all)
    G[i, _COUNT] += 1
    G[i, _TAU] = 0
    if defer:  # the commit at fe, in its place among the requests, replies and arrivals
        F[i, _BUSY] = np.inf
        heapq.heappush(heap, (fe, _COMMIT, i, ne))
    else:  # nothing but the device itself reads its commit: made at once
        _on_commit(heap, E, F, G, i, ne, proto, alone, talk, False, ipt, ist, ien, deg, dt)
    return ne + 1


@njit(cache=True, nogil=True)
def _ticks(heap, E, ne, F, G, st, i, y, horizon, delta, ipt, ist, ien, s_i,
           keeps):  # pragma: no cover - compiled
    """Event protocol, ``cannot-train-*``: device i, offline at its free time ``y`` since
    its last unit counted (``_OFF_SINCE``), ticks every Δ = ``delta`` from then until it is
    online again: a tick at or after ``y`` acts (a local round of what the mode keeps, then
    its sends of ``s_i`` seconds take every ⌈s_i/Δ⌉-th tick), any other tick is an offline
    span of one unit (counted as skipped). Its next start: its return, or the end of its
    last sends if later. Returns the events' count."""
    anchor = F[i, _OFF_SINCE]
    k, _ = locate_one(ipt, ist, ien, i, y)
    nxt = ist[k + 1] if k + 1 < ipt[i + 1] else np.inf  # the next online interval's start
    lim = min(nxt, horizon)
    every = max(1, np.int64(np.ceil(s_i / delta)))
    first, pos, busy = -1, 0, y
    tick = anchor + delta
    while tick < lim:
        if first < 0 and tick >= y:
            first = pos
        if first >= 0 and (pos - first) % every == 0:
            _put(E, ne, tick, i, _LOCAL, 0.0, tick, G[i, _COUNT], np.floor(tick / delta), 0,
                 tick, False, keeps)
            G[i, _COUNT] += 1
            busy = max(busy, tick + s_i)
        else:
            _put(E, ne, tick, i, _OFFLINE, 1.0, tick, -1, np.floor(tick / delta), 0, tick,
                 False, 0)
            st[_SKIPPED] += 1
        ne += 1
        G[i, _TAU] += 1
        pos += 1
        tick = anchor + (pos + 1) * delta
    if pos > 0:
        F[i, _OFF_SINCE] = anchor + pos * delta
    if lim < horizon:
        heapq.heappush(heap, (max(lim, busy), _WAKE, i, 0))
    return ne


@njit(cache=True, nogil=True)
def _ask(P, heap, i, k, now, n, horizon, ipt, ist, ien, rptr, rend, dth, qptr, qj, qcode,
         qtime, qlat, qdrop, qret, qsent, targets, buf):  # pragma: no cover - compiled
    """Return k of device i under peers chosen per exchange (docs/concepts/peers.md#targets):
    its S requests' targets drawn now, from the stream (seed, "peers", "pull"), ids (device,
    its return's index, try) — ``epidemic`` uniformly from all others, ``online`` from its
    table as it stands — and what is known of each at once, as :func:`_requests` knows it
    for the graph's links (constant latency and loss); the arrivals (and, ``online``, the
    "unreachable" answers, which remove their peer) wait in the heap."""
    kind, pkey, s, lat, p_loss = P[P_KIND], P[P_PULL_KEY], P[P_S], P[P_LATENCY], P[P_LOSS]
    qkey, rkey = P[P_REQUEST_KEY], P[P_REPLY_KEY]
    nth = k - rptr[i]
    if kind == 1:
        draw_epidemic(pkey, i, nth, n, s, targets)
    else:
        draw_online(pkey, i, nth, n, s, P[P_TAB_ID], P[P_TAB_N], buf, targets)
    for a in range(s):
        q = qptr[k] + a
        j = targets[a]
        tx = now + (a + 1) * dth[i]
        sent = tx <= rend[k] and tx <= horizon
        drop = p_loss > 0.0 and uniform4(qkey, i, j, 0, nth) < p_loss
        arr = tx + lat
        ok = sent and not drop and arr < horizon
        qj[q], qret[q], qsent[q], qlat[q] = j, i, sent, lat
        qdrop[q] = p_loss > 0.0 and uniform4(rkey, j, i, 0, nth) < p_loss
        if ok and _online(ipt, ist, ien, j, arr, horizon):
            qcode[q], qtime[q] = ARRIVES, arr
            heapq.heappush(heap, (arr, _REQUEST, j, q))
        elif ok:
            qcode[q], qtime[q] = UNREACHABLE, arr + lat
            if kind == 2:
                heapq.heappush(heap, (arr + lat, _FORGET, i, q))
        else:
            qcode[q], qtime[q] = SILENT, arr


@njit(cache=True, nogil=True)
def _simulate(proto, pull, alone, talk, keeps, ev_all, S, n, horizon, unit, ipt, ist, ien, rptr,
              rtime, rend, compute, K, ns_table, deg, dt, dth, qptr, qj, qcode, qtime,
              qlat, qextra, qdrop, qret, qedge, live, lf_unit, max_events, wt, wd, wr, rt, rd,
              rq, F, G, st, hq, fresh, t_stop, P, qsent,
              msg_cap):  # pragma: no cover - compiled
    """The events in time order (see the module docstring) before ``t_stop``. proto 0:
    async, 1: event; ``alone``: offline devices train alone (capabilities ``keeps``).
    F [N, 8], G [N, 10], st [9]: the devices' state and the counts, carried from one span of
    time to the next (:func:`fresh_state`); hq (times, kinds, devices, args): the pending
    events the last span left (``fresh``: none yet, the first span). Returns the events
    (time, dev, kind, amount, end, step, t, nsteps, bstart, closes, caps), the replies per
    request (src local round −1: empty or none, held, arrival, delivered, sent), the counts,
    the pending events and the messages to peers chosen per exchange (``P``:
    :func:`sfg.clock.peersim.peer_state`; columns :data:`sfg.clock.peersim.M_SEND`…; none
    under fixed). Under peers ≠ fixed a pull's requests are drawn at each return (``qsent``
    and the request columns are written then)."""
    # the events by column (time dev kind amount end step t nsteps bstart closes caps)
    E = np.empty((11, max_events))
    ne = 0
    NQ = qj.shape[0]
    rep = (np.full(NQ, -1, np.int64), np.zeros(NQ), np.full(NQ, np.inf),
           np.zeros(NQ, np.bool_), np.zeros(NQ, np.bool_))
    heap = [(np.inf, 9, 0, 0)]
    pk, s_p, M_p = P[P_KIND], max(P[P_S], 1), max(P[P_M], 1)
    msg, nm = np.empty((4, max(msg_cap, 1024) if pk else 0)), 0
    pool, free, top = new_pool(M_p)
    nth = Dict.empty(key_type=types.int64, value_type=types.int64)
    V_p = max(P[P_TAB_ID].shape[1], 1)
    targets, buf, qs = np.empty(s_p, np.int64), np.empty(V_p, np.int64), np.zeros(s_p, np.int64)
    car_id, car_s = np.empty(M_p, np.int64), np.empty(M_p)
    rslot = np.full(NQ, -1, np.int64)
    scr = (np.empty(M_p + 1, np.int64), np.empty(M_p + 1),
           hear_scratch(V_p, M_p))  # (sfg.world.peers.hear_many)
    near = near_start(ipt if pk else ipt[:1], ist)  # each device's interval found last
    defer = pull or pk > 0  # commits in their place among the arrivals (phase 5)
    # the messages that arrive at the instant they are sent (receiver, key), heard once the
    # instant's other events are done (phase 5 comes before them), at late_t
    late = [(np.int64(0), np.int64(0)) for _ in range(0)]
    late_t = -np.inf
    for h in range(hq[0].shape[0]):
        heapq.heappush(heap, (hq[0][h], hq[1][h], hq[2][h], hq[3][h]))
    for i in range(n if fresh else 0):
        if rptr[i] < rptr[i + 1]:
            heapq.heappush(heap, (rtime[rptr[i]], _RETURN, i, rptr[i]))
        if proto == 0:
            pass  # async wakes: the sorted table (wt, wd, wr), merged with the heap below
        elif alone or _online(ipt, ist, ien, i, 0.0, horizon):
            heapq.heappush(heap, (0.0, _WAKE, i, 0))
        elif talk:  # offline at 0: it ticks from 0
            heapq.heappush(heap, (0.0, _WAKE, i, 0))
            F[i, _OFF_SINCE] = 0.0
        else:
            F[i, _OFF_SINCE] = 0.0
    wi, NW, ri, NR = 0, wt.shape[0], 0, rt.shape[0]
    while True:
        # the next event: the heap's first, the next async wake of the table or the next
        # request's arrival of its table, whichever comes first in the heap's order (time,
        # kind, device; the three never hold one kind at one time for one device)
        t0, k0, d0 = heap[0][0], heap[0][1], heap[0][2]
        src = 0
        if wi < NW and (wt[wi] < t0 or (wt[wi] == t0 and (_WAKE < k0 or (
                _WAKE == k0 and wd[wi] <= d0)))):
            t0, k0, d0, src = wt[wi], _WAKE, wd[wi], 1
        if ri < NR and (rt[ri] < t0 or (rt[ri] == t0 and (_REQUEST < k0 or (
                _REQUEST == k0 and rd[ri] <= d0)))):
            t0, src = rt[ri], 2
        if len(late) and t0 > late_t:  # the arrivals at the instant they were sent: heard
            for h in range(len(late)):  # after everything else of that instant
                top = heard(P, late[h][1], late[h][0], late_t, msg, pool, free, top, qj, qret,
                            rep[1], rslot, scr)
            late.clear()
        if t0 >= t_stop:
            break  # the span ends: what is pending waits in the heap
        if src == 1:
            now, kind, i, arg = wt[wi], _WAKE, wd[wi], wr[wi]
            wi += 1
        elif src == 2:
            now, kind, i, arg = rt[ri], _REQUEST, rd[ri], rq[ri]
            ri += 1
        else:
            now, kind, i, arg = heapq.heappop(heap)
            if kind == 9:
                break
        if kind == _COMMIT:
            _on_commit(heap, E, F, G, i, arg, proto, alone, talk, pull, ipt, ist, ien, deg, dt)
            if pk:  # its messages to peers chosen per exchange (sfg.clock.peersim)
                h = draw_targets(P, E, arg, i, n, targets, buf, car_id, car_s)
                msg, row, nm0 = grow(msg, nm + P[P_S]), -1, nm
                if pk == 2 and h:  # the carried entries, read by the arrivals
                    pool, free, top = room(pool, free, top)
                    top, row = put(pool, free, top, car_id, car_s, h, 0)
                if P[P_LOSS] > 0.0:
                    pair_counts(nth, i, n, targets, P[P_S], qs)
                nm = fates(P, E, arg, i, n, horizon, ipt, ist, ien, dt, msg, nm, h, qs,
                           targets, near)
                if pk == 2:  # (epidemic keeps no tables: nothing hears)
                    arrivals(heap, late, msg, nm0, nm, E[4, arg], 3 * ((i << 31) | (row + 1)),
                             _HEAR)
                    if row >= 0:  # read by the messages that reached (or freed: by none)
                        pool[row, 1] = nm - nm0
                        if nm == nm0:
                            free[top] = row
                            top += 1
                late_t = now
        elif kind == _RETURN:
            if pk and pull and not talk:
                _ask(P, heap, i, arg, now, n, horizon, ipt, ist, ien, rptr, rend, dth, qptr, qj,
                     qcode, qtime, qlat, qdrop, qret, qsent, targets, buf)
            ne = _on_return(heap, E, ne, F, G, st, i, arg, now, proto, pull, alone, talk, S,
                            unit, rptr, rtime, rend, deg, dth, qptr, qcode, qtime)
        elif kind == _REQUEST:
            _on_request(heap, F, G, i, arg, now, S, horizon, ipt, ist, ien, dt, dth, qptr,
                        qlat, qextra, qdrop, qret, qedge, live, lf_unit, rep)
            if pk == 2:  # the reply's entries; the asking device is heard
                pool, free, top = reply_entries(P, arg, i, now, rep[0][arg] >= 0, rep[4][arg],
                                                rep[3][arg], pool, free, top, rslot, car_id,
                                                car_s)
                heapq.heappush(heap, (now, _HEAR, i, 3 * arg + 2))
                if rep[3][arg]:
                    heapq.heappush(heap, (rep[2][arg], _HEAR, qret[arg], 3 * arg + 1))
        elif kind == _FORGET:
            unreachable(P, qret[arg], qj[arg])
        elif kind == _HEAR:
            top = heard(P, arg, i, now, msg, pool, free, top, qj, qret, rep[1], rslot, scr)
        else:
            if kind == _WINDOW:
                arg = _on_window(F, G, st, i, arg, now, proto, alone, S, horizon, ipt, ist,
                                 ien)
                if arg == 0:
                    continue
            ne = _on_start(heap, E, ne, F, G, st, i, arg, now, proto, defer, alone, talk,
                           horizon, unit, ipt, ist, ien, compute, K, ns_table, keeps, ev_all,
                           deg, dt)
    m = len(heap) - 1  # the pending events, in order (the sentinel last)
    out = (np.empty(m), np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64))
    for h in range(m):
        out[0][h], out[1][h], out[2][h], out[3][h] = heapq.heappop(heap)
    return E[:, :ne].T, rep[0], rep[1], rep[2], rep[3], rep[4], st, out, msg[:, :nm]


@njit(cache=True, nogil=True)
def fresh_state(n):  # pragma: no cover - compiled
    """The simulation's state before time 0 (:func:`_simulate`): F [N, 8], G [N, 10], the
    counts [9]."""
    F = np.zeros((n, 8))
    F[:, _OFF_SINCE] = np.nan
    F[:, _W_MOVED] = np.nan
    G = np.zeros((n, 10), np.int64)
    G[:, _CHAIN_POS] = -1
    G[:, _SENT_ID] = -1
    G[:, _W_RET] = -1
    G[:, _W_ROUND] = -1
    return F, G, np.zeros(9)


# ----------------------------------------------------------------------------- the wrapper
def returns_of(world) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every device's returns: the starts of its online intervals after time 0 (and before
    the horizon), CSR-packed: (ptr [N+1], time [NR], the interval's end [NR])."""
    on = world.online
    keep = (on.start > 0.0) & (on.start < world.horizon)
    dev = np.repeat(np.arange(world.n), np.diff(on.indptr))
    ptr = np.zeros(world.n + 1, np.int64)
    np.cumsum(np.bincount(dev[keep], minlength=world.n), out=ptr[1:])
    return ptr, np.ascontiguousarray(on.start[keep]), np.ascontiguousarray(on.end[keep])


def _drawn_requests(R: int, S: int) -> dict[str, np.ndarray]:
    """The request table of R returns under peers chosen per exchange: S requests each, their
    targets and fates written by the simulation at each return (:func:`_ask`)."""
    z = np.zeros(R * S, np.int64)
    return {"qptr": np.arange(R + 1, dtype=np.int64) * S, "qj": z.copy(),
            "qcode": np.full(R * S, SILENT, np.int64), "qtime": np.zeros(R * S),
            "qlat": np.zeros(R * S), "qextra": np.zeros(R * S), "qdrop": np.zeros(R * S, bool),
            "qret": z.copy(), "qslot": np.full(R * S, -1, np.int64),
            "qback": np.full(R * S, -1, np.int64), "qedge": z.copy(),
            "sent": np.zeros(R * S, bool)}


def _requests(world, settings: ClockSettings, rptr: np.ndarray, rtime: np.ndarray,
              rend: np.ndarray, *, seed: int, dth: np.ndarray, live: np.ndarray,
              lf_unit: float, peers=None) -> dict[str, np.ndarray]:
    """Every return's requests and what is known of them before the simulation (see the
    module docstring): per request the neighbour, its fate (:data:`ARRIVES` with the
    arrival, :data:`UNREACHABLE` with the answer's time, :data:`SILENT`), and its reply's
    latency, fault delay, whether it is dropped on the way and its link (``live``: the links
    up per Δ-round, :func:`sfg.clock.links.live_links`)."""
    from sfg.clock.links import (
        arrival_time,
        fault_plan,
        link_round,
        loss_key,
        out_slots,
        transfer_end,
        transfer_lost,
    )

    rg = world.rg
    ptr, out, _ = out_slots(rg)
    deg = np.diff(ptr)
    n_ret = np.diff(rptr)
    ret_dev = np.repeat(np.arange(world.n), n_ret)
    nth_ret = np.arange(rtime.size) - np.repeat(rptr[:-1], n_ret)
    if peers is not None and not peers.fixed:
        return _drawn_requests(rtime.size, peers.s)
    per = deg[ret_dev]
    qptr = np.zeros(rtime.size + 1, np.int64)
    np.cumsum(per, out=qptr[1:])
    ret = np.repeat(np.arange(rtime.size), per)
    k = np.arange(ret.size) - np.repeat(qptr[:-1], per)
    i = ret_dev[ret]
    slot = out[ptr[i] + k]
    j = rg.recv[slot]
    back = _reverse_slots(rg)[slot]
    lat_q, lat_r = world.latency[slot], world.latency[back]
    loss_q, loss_r = world.loss[slot], world.loss[back]
    nth = nth_ret[ret]
    tx_end = transfer_end(rtime[ret], k, dth[i])
    sent = (tx_end <= rend[ret]) & (tx_end <= world.horizon)
    drop = np.zeros(ret.size, bool)
    if loss_q.any():
        drop = transfer_lost(loss_key(seed, "request"), i, j, nth, loss_q)
    rdrop = np.zeros(ret.size, bool)
    if loss_r.any():
        rdrop = transfer_lost(loss_key(seed, "reply"), j, i, nth, loss_r)
    rextra = np.zeros(ret.size)
    plan = fault_plan(settings, world.n)
    qextra: np.ndarray | float = 0.0
    if plan is not None:
        cut, lost, qextra, bad = plan.fates(i, j, nth, tx_end, channel=2)
        drop |= cut | lost | bad
    arrival = arrival_time(tx_end, lat_q, qextra)
    edge = rg.edge_id[slot].astype(np.int64)
    if live.shape[0] > 1 or not live.all():  # link failures: a request sent over a down link
        drop |= ~live[link_round(tx_end, lf_unit, live.shape[0]), edge]
    ok = sent & ~drop & (arrival < world.horizon)
    on = world.online.online_at(j, arrival) & ok
    if plan is not None:  # the reply's faults, drawn when it is queued (the request's arrival)
        cut, lost, extra, bad = plan.fates(j, i, nth, arrival, channel=3)
        rdrop |= cut | lost | bad
        rextra = extra
    code = np.where(on, ARRIVES, np.where(ok, UNREACHABLE, SILENT)).astype(np.int64)
    when = np.where(code == UNREACHABLE, arrival + lat_r, arrival)
    return {"qptr": qptr, "qj": j.astype(np.int64), "qcode": code, "qtime": when,
            "qlat": np.ascontiguousarray(lat_r, float), "qextra": rextra,
            "qdrop": rdrop, "qret": i.astype(np.int64), "qslot": slot, "qback": back,
            "qedge": edge, "sent": sent}


def _reverse_slots(rg) -> np.ndarray:
    """[E] the slot of the opposite direction (j → i for i → j); self slots map to themselves."""
    key = rg.send.astype(np.int64) * rg.n + rg.recv
    rkey = rg.recv.astype(np.int64) * rg.n + rg.send
    order = np.argsort(key, kind="stable")
    return order[np.searchsorted(key[order], rkey)]


def _wake_table(jit: np.ndarray, P: float, horizon: float, online, r0: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The async wakes of rounds r0, r0 + 1, … (jit [rounds, N]: their jitter in seconds)
    before the horizon, sorted by (time, device): times, devices, rounds and whether the
    device is online then (asked round by round in the order of the devices, which keeps
    the availability's search local)."""
    wakes, n = jit.shape
    t0 = np.arange(r0, r0 + wakes, dtype=np.float64)[:, None] * P + jit
    up = online.online_at(np.tile(np.arange(n, dtype=np.int64), wakes), t0.ravel())
    # round r's wakes lie in [rP, (r+1)P) (jitter < 1): sorting each round's is enough, by
    # time and, at one time, by device (a stable sort of the devices in id order)
    d = np.argsort(jit, axis=1, kind="stable")
    t = np.take_along_axis(t0, d, axis=1).ravel()
    up = np.take_along_axis(up.reshape(wakes, n), d, axis=1).ravel()
    r = np.repeat(np.arange(r0, r0 + wakes, dtype=np.int64), n)
    d = d.ravel().astype(np.int64)
    keep = t < horizon
    return t[keep], d[keep], r[keep], up[keep]


class Simulation:
    """:func:`_simulate` on a world, span by span of time (``pull`` False: the protocol
    without it). ``anatomy``: what an offline device still does (``cannot-communicate``: it
    trains alone; ``cannot-train-*``: it keeps communicating, and has no returns);
    ``link_failure``: the per-round link failures, for the requests and replies (the
    ordinary messages' are applied when the schedule is assembled). :meth:`span` runs the
    events before a time and keeps the devices' state and the pending events for the next;
    one span over the whole run is :func:`simulate`. Spans need no pull, no anatomy mode and
    no link failures (:attr:`spans`): then nothing but its own state couples a device's
    events across time, apart from the messages, which the assembly carries."""

    def __init__(self, world, settings: ClockSettings, protocol: str, *, local_steps: int,
                 seed: int, catchup: bool, pull: bool = True, anatomy: str = "full",
                 link_failure: float = 0.0, peers=None):
        from sfg.clock.links import live_links, out_slots, transfer_seconds
        from sfg.round.kernel import EV_SEND
        from sfg.round.rules import CATCHUP_CAP, catchup_steps
        from sfg.util.rng import stream

        n, H = world.n, world.horizon
        on = world.online
        self.world, self.settings, self.catchup = world, settings, catchup
        rptr, rtime, rend = self.returns = returns_of(world)
        dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
        dth = transfer_seconds(world, float(HEADER_BYTES)) if pull else np.zeros(n)
        from sfg.clock.peersim import peer_state

        P = peer_state(peers, seed, world.graph, n, settings)
        # a broadcast's transfers: one per neighbour, or the S targets drawn
        deg = np.full(n, float(P[P_S])) if P[P_KIND] else \
            np.diff(out_slots(world.rg)[0]).astype(np.float64)
        self.keeps = keeps = _keeps(anatomy, pull)
        self.spans = not pull and not keeps and not link_failure and not P[P_KIND]
        # local steps by the device's own age (index min(τ, last)): +catchup's, or K
        ns_table = catchup_steps(local_steps, np.arange(CATCHUP_CAP + 1)) if catchup else \
            np.array([local_steps], np.int64)
        talk = bool(keeps & EV_SEND)
        alone = keeps != 0 and not talk
        live, lf_unit = live_links(world, settings, link_failure if pull else 0.0, seed)
        if pull:
            rq = _requests(world, settings, rptr, rtime, rend, seed=seed, dth=dth, live=live,
                           lf_unit=lf_unit, peers=peers)
        else:
            z = np.zeros(0, np.int64)
            rq = {"qptr": np.zeros(rtime.size + 1, np.int64), "qj": z, "qcode": z,
                  "qtime": np.zeros(0), "qlat": np.zeros(0), "qextra": np.zeros(0),
                  "qdrop": np.zeros(0, bool), "qret": z, "qslot": z, "qback": z, "qedge": z,
                  "sent": np.zeros(0, bool)}
        self.requests = rq
        if protocol == "async":
            self.P = settings.P
            self.wakes = int(np.ceil(H / self.P))
            self.jitter = stream(int(seed), "clock-jitter")  # rows drawn span by span
            self.max_events = n + 1  # a span's, per round of wakes
            proto, unit = 0, self.P
        elif protocol == "event":
            proto, unit = 1, float(settings.round_seconds)
            train = local_steps * world.compute
            dur = np.maximum(train + deg * dt, 1e-300)
            L = on.end - on.start
            idev = np.repeat(np.arange(n), np.diff(on.indptr))
            max_events = int(np.ceil(L / dur[idev]).sum()) + 2 * L.size + 2 * n + 1
            off_s = np.maximum(H - on.online_seconds(), 0.0)
            if alone:  # local rounds trained alone while offline
                max_events += int(np.ceil(off_s / np.maximum(train, 1e-300)).sum()) + L.size + n
            elif talk:  # a tick every Δ while offline
                max_events += int(np.ceil(off_s / unit).sum()) + 2 * L.size + 2 * n
            self.max_events = max_events
        else:
            raise SfgError(f"protocol {protocol!r} has no event schedule")
        self.proto, self.unit, self.r0 = proto, unit, 0
        # every request's arrival (their returns are the world's: all known before), sorted
        # as the heap would pop them: time, then the device it reaches, then the request
        ra = np.flatnonzero(rq["qcode"] == ARRIVES)
        ro = ra[np.lexsort((ra, rq["qj"][ra], rq["qtime"][ra]))]
        rt, rd = np.ascontiguousarray(rq["qtime"][ro]), np.ascontiguousarray(rq["qj"][ro])
        from sfg.round.kernel import EV_ALL

        self.args = (proto, bool(pull), alone, talk, int(keeps), int(EV_ALL),
                     float(settings.pull_timeout or 0.0), n, float(H), float(unit), on.indptr,
                     on.start, on.end, rptr, rtime, rend,
                     np.ascontiguousarray(world.compute, float), int(local_steps), ns_table,
                     deg, dt, dth, rq["qptr"], rq["qj"], rq["qcode"], rq["qtime"], rq["qlat"],
                     rq["qextra"], rq["qdrop"], rq["qret"], rq["qedge"], live, float(lf_unit))
        self.req = (rt, rd, ro.astype(np.int64))
        self.peers = (P, rq["sent"])
        self.state = fresh_state(n)
        z64 = np.zeros(0, np.int64)
        self.hq = (np.zeros(0), z64, z64, z64)

    def span(self, r1: int | None = None) -> dict[str, Any]:
        """The events before r1 units of time (None: all the rest): as :func:`simulate`
        returns them, the counts so far."""
        world, n, H = self.world, self.world.n, self.world.horizon
        z64 = np.zeros(0, np.int64)
        r0 = self.r0
        if r1 is not None and not self.spans and (r0 > 0 or r1 * self.unit < H):
            raise SfgError("the simulation runs in one span under pull, anatomy modes and "
                           "link failures")
        t_stop = np.inf if r1 is None else float(r1) * self.unit
        offline = (np.zeros(0), z64, z64)
        if self.proto == 0:
            r1 = self.wakes if r1 is None else min(int(r1), self.wakes)
            jit = self.jitter.random((max(r1 - r0, 0), n)) * (self.settings.jitter * self.P)
            wt, wd, wr, up = _wake_table(jit, self.P, H, world.online, r0)
            max_events = self.max_events * max(r1 - r0, 0) + 1
            local_max = int(np.count_nonzero(up))  # a local round per online wake at most
            if not self.catchup and not self.keeps:
                # an offline wake only counts a unit of offline time (its age matters to
                # +catchup alone): those are made here, at once (``offline``: time, device,
                # round), and the simulation runs the online ones
                offline = (wt[~up], wd[~up], wr[~up])
                wt, wd, wr = wt[up], wd[up], wr[up]
        else:
            wt, wd, wr = np.zeros(0), z64, z64
            max_events = self.max_events
            local_max = min(max_events, 1 << 20)
        # room for the messages to peers: S per local round (one per online wake at most
        # under async; under event grown as needed)
        S = int(self.peers[0][P_S])
        msg_cap = S * local_max
        self.r0 = r0 if r1 is None else r1
        F, G, st = self.state
        E, src, held, arr, ok, sent, st, self.hq, msg = _simulate(
            *self.args, int(max_events), wt, wd, wr, *self.req, F, G, st, self.hq, r0 == 0,
            t_stop, *self.peers, msg_cap)
        st[_OFFLINE_WAKES] += offline[0].size
        P = self.peers[0]
        return {"events": E, "offline": offline, "requests": self.requests, "reply_src": src,
                "reply_held": held, "reply_arrival": arr, "reply_ok": ok, "reply_sent": sent,
                "counts": st, "returns": self.returns, "keeps": self.keeps,
                "messages": msg if P[P_KIND] else None, "peer_counts": P[P_COUNTS]}


def simulate(world, settings: ClockSettings, protocol: str, *, local_steps: int, seed: int,
             catchup: bool, pull: bool = True, anatomy: str = "full",
             link_failure: float = 0.0) -> dict[str, Any]:
    """The whole run's events (:class:`Simulation`, one span): the events (columns of
    :func:`_put`; async offline wakes that only count a unit apart, as (time, device,
    round): :func:`all_events` joins them), the replies (slot, sending event, arrival, held)
    that reached their device, the counts and ``keeps`` (the capabilities of a local round
    trained alone; 0: none)."""
    return Simulation(world, settings, protocol, local_steps=local_steps, seed=seed,
                      catchup=catchup, pull=pull, anatomy=anatomy,
                      link_failure=link_failure).span()


def protocol_parts(world, settings: ClockSettings, protocol: str, *, local_steps: int,
                   seed: int, catchup: bool, link_failure: float, anatomy: str,
                   stats: dict[str, float] | None = None):
    """The async or event protocol's events (see the module docstring; ``on_return`` pull
    or none) in one span, as :func:`sfg.clock.schedule.finish_schedule` assembles them:
    (parts, each event's local steps, the counts, the pull's part of the schedule or None,
    the capabilities or None, whether offline devices keep communicating, the messages to
    peers chosen per exchange or None)."""
    return next(protocol_spans(world, settings, protocol, local_steps=local_steps, seed=seed,
                               catchup=catchup, link_failure=link_failure, anatomy=anatomy,
                               stats=stats))[1:]


def protocol_spans(world, settings: ClockSettings, protocol: str, *, local_steps: int,
                   seed: int, catchup: bool, link_failure: float, anatomy: str,
                   stats: dict[str, float] | None = None, every: int | None = None,
                   peers=None):
    """:func:`protocol_parts` span by span: every ``every`` units of time (None: one span),
    each as (its end in seconds, then :func:`protocol_parts`' tuple, the counts so far).
    Spans need :attr:`Simulation.spans` (else one span) — or peers chosen per exchange
    without pull, whose simulation runs whole (the tables couple every device's sends) and
    is then cut into spans of time (:func:`_slice`) for the assembly."""
    from sfg.clock.links import offline_keeps
    from sfg.round.kernel import EV_SEND

    # a device that keeps communicating while offline has no returns: nothing to pull
    # (docs/concepts/clock.md#returns-in-time), the schedule is on_return none's
    pull_on = settings.pull_timeout is not None and not offline_keeps(anatomy) & EV_SEND
    sim = Simulation(world, settings, protocol, local_steps=local_steps, seed=seed,
                     catchup=catchup, pull=pull_on, anatomy=anatomy, link_failure=link_failure,
                     peers=peers)
    cut = every is not None and sim.peers[0][P_KIND] != 0 and not pull_on and not sim.keeps \
        and not link_failure
    whole = sim.span() if cut else None
    if not sim.spans and not cut:
        every = None
    total = sim.wakes if protocol == "async" else int(np.ceil(world.horizon / sim.unit))
    r0, r1 = 0, 0
    while True:
        r0, r1 = r1, (None if every is None or r1 + every >= total else r1 + every)
        until = np.inf if r1 is None else r1 * sim.unit
        r = _slice(whole, r0 * sim.unit, until) if whole is not None else sim.span(r1)
        yield (until, *_parts(r, settings, protocol, stats, pull_on))
        if r1 is None:
            return


def _slice(r: dict[str, Any], since: float, until: float) -> dict[str, Any]:
    """The part of a whole run's result ``r`` (:meth:`Simulation.span`, peers chosen per
    exchange, no pull) in the span of time [since, until): its events, its offline wakes and
    the messages its local rounds sent (``index``: their rows in the whole table ``all``),
    with the whole run's counts."""
    from sfg.clock.peersim import M_EVENT

    E = r["events"]
    keep = (E[:, 0] >= since) & (E[:, 0] < until)
    row = np.cumsum(keep) - 1  # an event's row in the span
    ow, od, orr = r["offline"]
    off = (ow >= since) & (ow < until)
    msg = r["messages"]
    ev = msg[M_EVENT].astype(np.int64)
    mine = np.flatnonzero(keep[ev])
    part = msg[:, mine]
    part[M_EVENT] = row[ev[mine]]
    return {**r, "events": E[keep], "offline": (ow[off], od[off], orr[off]), "messages": part,
            "index": mine, "all": msg}


def _parts(r: dict[str, Any], settings: ClockSettings, protocol: str,
           stats: dict[str, float] | None, pull_on: bool):
    """One span's result of :class:`Simulation` as :func:`protocol_parts` gives it."""
    import hashlib

    from sfg.round.kernel import EV_SEND

    E, rq, c = r["events"], r["requests"], r["counts"]
    time, kind = E[:, 0], E[:, 2].astype(np.int64)
    parts = [(time, E[:, 1].astype(np.int64), kind, E[:, 3], E[:, 4], E[:, 5].astype(np.int64),
              E[:, 6].astype(np.int64))]
    steps_of = [E[:, 7].astype(np.int64)]
    keeps = r["keeps"]
    caps_of = [E[:, 10].astype(np.int64)] if keeps else None
    ow, od, orr = r["offline"]
    if ow.size:  # (never with keeps: no capabilities to add)
        parts.append((ow, od, np.full(ow.size, _OFFLINE, np.int64), np.ones(ow.size), ow, orr,
                      orr))
        steps_of.append(np.zeros(ow.size, np.int64))
    talks = bool(keeps & EV_SEND)
    out = dict(stats or {})
    if protocol == "async":
        out.update(skipped=float(c[0]), interrupted=float(c[1]), unfinished=float(c[2]),
                   offline_wakes=float(c[3]))
    else:
        out.update(interrupted=float(c[1]), unfinished=float(c[2]))
        if talks:  # ticks that were offline spans (the uplink still busy)
            out.update(skipped=float(c[0]))
    to_peers = None if r["messages"] is None else {
        "messages": r["messages"], "counts": r["peer_counts"],
        "index": r.get("index", np.arange(r["messages"].shape[1])),
        "all": r.get("all", r["messages"])}
    if not pull_on:
        return parts, steps_of, out, None, caps_of, talks, to_peers
    src, sent, ok = r["reply_src"], r["reply_sent"], r["reply_ok"]
    model = src >= 0
    got = ok & model
    mb = float(settings.message_bytes or 0.0)
    n_req = int(rq["sent"].sum())
    out.update(pull_requests=float(n_req),
               pull_replies=float((sent & model).sum()),
               pull_empty=float((sent & ~model).sum()),
               pull_unreachable=float((rq["qcode"] == UNREACHABLE).sum()),
               pull_replies_delivered=float(got.sum()),
               pull_bytes=float(n_req * HEADER_BYTES + (sent & model).sum() * mb
                                + (sent & ~model).sum() * HEADER_BYTES),
               pull_wait_seconds=float(c[6]), pull_skipped=float(c[4]),
               pull_abandoned=float(c[5]), pull_windows=float(c[7]),
               pull_timed_out=float(c[8]))
    h = hashlib.blake2b(digest_size=16)
    # the sending local round by its device and time (not its row in the simulation's output)
    s_dev = np.where(model, E[np.maximum(src, 0), 1], -1.0)
    s_time = np.where(model, E[np.maximum(src, 0), 0], -1.0)
    for a in (rq["qcode"], rq["qtime"], s_dev, s_time, r["reply_held"], r["reply_arrival"], ok,
              sent):
        h.update(np.ascontiguousarray(a).tobytes())
    pull = {"bstart": np.concatenate([E[:, 8], ow]),
            "asks": rq["qret"][got], "asked": rq["qj"][got],  # (the reply's receiver, sender)
            "closes": np.concatenate([E[:, 9] > 0, np.zeros(ow.size, bool)]), "slot": rq["qback"][got],
            "src": src[got], "arrival": r["reply_arrival"][got], "held": r["reply_held"][got],
            "digest": h.hexdigest()}
    return parts, steps_of, out, pull, caps_of, talks, to_peers


def all_events(r: dict[str, Any]) -> np.ndarray:
    """The events of :func:`simulate`'s result ``r`` as rows (the columns of :func:`_put`),
    the async offline wakes made apart included (for the tests)."""
    ow, od, orr = r["offline"]
    z = np.zeros(ow.size)
    off = np.stack([ow, od.astype(float), np.full(ow.size, float(_OFFLINE)), np.ones(ow.size),
                    ow, orr.astype(float), orr.astype(float), z, ow, z, z], axis=1)
    return np.concatenate([r["events"], off])


def _keeps(anatomy: str, pull: bool) -> int:
    """What an offline device still does under ``anatomy`` in the simulation: 0 (``full``),
    the capabilities of a local round trained alone (``cannot-communicate``) or of what the
    modes that keep communicating while offline do (``cannot-train-*``: they have no
    returns, so ``pull`` is refused there)."""
    from sfg.clock.links import offline_keeps
    from sfg.round.kernel import EV_SEND

    keeps = offline_keeps(anatomy)
    if pull and keeps & EV_SEND:
        raise SfgError(f"under anatomy {anatomy!r} a device keeps communicating while offline: "
                       "it has no returns, so on_return pull has nothing to do")
    return keeps

