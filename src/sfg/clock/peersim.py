"""Peers chosen per exchange on the virtual clock (docs/concepts/peers.md): who each committed
local round sends to, whom a return asks, and what each device hears of whom — the sampler's
membership tables and target draws of :mod:`sfg.world.peers` (the same functions as the
replay in rounds), run inside the time-ordered simulation of the async and event protocols
(:func:`sfg.clock.pull._simulate` calls the parts here), so that a pull on return draws its
targets from the table as it stands at the return and its requests and replies feed the
tables.

At one instant (:mod:`sfg.clock.instant`): returns draw their pull targets (phase 1, from the
tables as they stood before the instant's arrivals); then, in phase 2, "unreachable" answers
remove their peer, requests arriving queue their replies (each carrying its sender's table as
it stood before the instant's arrivals), and the instant's arrivals are heard (a message, a
reply, a request's sender); then the local rounds committing at it draw their targets (phase
5, device order); a message sent at t that arrives at t is heard after them. A commit at t
draws S targets (send counter: the local round's key ``step``), sends them back to back on
its uplink from its broadcast's start (transfer k ends at b + (k+1)·dt_i) and carries its M
freshest heard entries as seconds since heard at t. A message is lost when its sender goes
offline before its transfer ends, when its target is offline at its arrival (counted as sent
to an offline peer) or by the loss (the draw of message k on the pair, as on the graph's
links). A message that arrives at t_a makes its receiver hear of the sender at t_a (transit
time ignored) and of each carried entry at t_a − its seconds; a reply at t_a − held (and its
entries that much older; an empty answer carries none); a request makes its receiver hear of
the asking device.

The carried entries wait in a pool until the last message that carries them is heard (memory:
the entries in flight, never one row per message).
"""

from __future__ import annotations

import heapq

import numpy as np

from sfg.errors import SfgError
from sfg.util.numba_start import NO_REFCOUNT, njit
from sfg.world.locate import online_near
from sfg.world.peers import (
    Peers,
    carry,
    draw_epidemic,
    draw_online,
    forget,
    hear,
    hear_many,
    uniform4,
)

# a message that reached its target: its columns (float rows of the simulation's table)
M_SEND, M_RECV, M_EVENT, M_ARRIVAL = range(4)
# the counts: messages sent (their sender online until the transfer ended), to offline
# targets, entries carried, lost at the sender, lost on the way, reached; and the messages'
# fingerprint (:func:`fingerprint`)
C_SENT, C_OFFLINE, C_ENTRIES, C_LOST_SENDER, C_LOST_RANDOM, C_DELIVERED, C_PRINT = range(7)
# a message's fate: reached, lost at the sender, target offline, lost on the way
REACHED, LOST_SENDER, TARGET_OFFLINE, LOST_RANDOM = range(4)
FINGERPRINT_KEY = 0x243F6A8885A308D3
# the simulation's peers (:func:`peer_state`), by position: kind (0 fixed, 1 epidemic, 2
# online), the keys of the targets, the pull's targets, the ties and the message, request and
# reply losses, S, M, the pairs' latency and loss, the tables (ids, times, tie hashes, sizes)
# and the counts (C_SENT…)
(P_KIND, P_KEY, P_PULL_KEY, P_TIE_KEY, P_LOSS_KEY, P_REQUEST_KEY, P_REPLY_KEY, P_S, P_M,
 P_LATENCY, P_LOSS, P_TAB_ID, P_TAB_T, P_TAB_H, P_TAB_N, P_COUNTS) = range(16)


@njit(cache=True, nogil=True)
def fingerprint(event, k, recv, fate):  # pragma: no cover - compiled
    """Message k of local round ``event`` (its row in the simulation's events) to ``recv``,
    of ``fate``, as a 53-bit integer (:func:`sfg.util.rng.counter_uniform`'s draw of the four
    ids under :data:`FINGERPRINT_KEY`); their sum modulo 2^64 stands for every message in
    the digest, the lost ones too, without a row each."""
    return np.int64(uniform4(np.uint64(FINGERPRINT_KEY), event, k, recv, fate)
                    * 9007199254740992.0)


@njit(cache=True, nogil=True)
def grow(a, need):  # pragma: no cover - compiled
    """``a`` [k, cap] with room for ``need`` columns (doubled when short)."""
    if need <= a.shape[1]:
        return a
    b = np.empty((a.shape[0], max(need, 2 * a.shape[1])), a.dtype)
    b[:, :a.shape[1]] = a[:, :]
    return b


@njit(cache=True, nogil=True)
def room(pool, free, top):  # pragma: no cover - compiled
    """The pool of carried entries (rows: count, readers, ids, seconds; ``free`` [cap]: the
    free rows' stack, ``top`` of them) with a free row: doubled when none is left. Returns
    (pool, free, top)."""
    if top == 0:
        cap = pool.shape[0]
        bigger = np.empty((2 * cap, pool.shape[1]))
        bigger[:cap] = pool
        pool = bigger
        free = np.empty(2 * cap, np.int64)
        for a in range(cap):
            free[a] = 2 * cap - 1 - a
        top = cap
    return pool, free, top


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def put(pool, free, top, ids, secs, h, refs):  # pragma: no cover - compiled
    """Store h carried entries with ``refs`` readers in a free row of the pool (there is one:
    :func:`room`): (top, row)."""
    top -= 1
    row = free[top]
    Mw = (pool.shape[1] - 2) // 2
    pool[row, 0] = h
    pool[row, 1] = refs
    for e in range(h):
        pool[row, 2 + e] = ids[e]
        pool[row, 2 + Mw + e] = secs[e]
    return top, row


@njit(cache=True, nogil=True)
def _take(pool, free, top, ids, secs, h, refs):  # pragma: no cover - compiled
    """:func:`room`, then :func:`put`: (pool, free, top, row)."""
    pool, free, top = room(pool, free, top)
    top, row = put(pool, free, top, ids, secs, h, refs)
    return pool, free, top, row


@njit(cache=True, nogil=True)
def new_pool(M):  # pragma: no cover - compiled
    """An empty pool of carried entries of at most M each (:func:`room`)."""
    cap = 64
    free = np.empty(cap, np.int64)
    for a in range(cap):
        free[a] = cap - 1 - a
    return np.zeros((cap, 2 + 2 * max(M, 1))), free, cap


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def draw_targets(P, E, r, i, n, targets, buf, car_id, car_s):  # pragma: no cover - compiled
    """Local round r of device i commits: its S targets drawn into ``targets`` and, online,
    the M freshest heard entries it carries into (car_id, car_s). Returns how many it
    carries. The commit's parts (:func:`sfg.clock.pull._simulate` runs them in turn): this,
    the carried entries kept in the pool (:func:`room`, :func:`put`), each pair's message
    count when messages are lost at random (:func:`pair_counts`), the fates
    (:func:`fates`) and the arrivals to be heard (:func:`arrivals`); those that allocate
    nothing compile without reference counting, as :mod:`sfg.world.peers`' draws."""
    kind, key, s, M = P[P_KIND], P[P_KEY], P[P_S], P[P_M]
    if kind == 1:
        draw_epidemic(key, i, np.int64(E[5, r]), n, s, targets)
        return 0
    draw_online(key, i, np.int64(E[5, r]), n, s, P[P_TAB_ID], P[P_TAB_N], buf, targets)
    return carry(i, E[4, r], M, P[P_TAB_ID], P[P_TAB_T], P[P_TAB_N], car_id, car_s)


@njit(cache=True, nogil=True)
def pair_counts(nth, i, n, targets, s, qs):  # pragma: no cover - compiled
    """qs[k]: how many messages device i sent to targets[k] before (``nth``: by pair,
    counted here), for the loss draw of each."""
    for k in range(s):
        pair = i * n + targets[k]
        qs[k] = nth[pair] if pair in nth else 0
        nth[pair] = qs[k] + 1


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _sender_until(ipt, ist, ien, i, t):  # pragma: no cover - compiled
    """The end of device i's online interval holding t (−inf: offline at t): the search of
    :func:`sfg.world.locate.locate_one`."""
    a, lo, hi = ipt[i], ipt[i], ipt[i + 1]
    while lo < hi:  # the first interval starting after t
        mid = (lo + hi) // 2
        if ist[mid] <= t:
            lo = mid + 1
        else:
            hi = mid
    k = lo - 1
    return ien[k] if k >= a and t < ien[k] else -np.inf


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def fates(P, E, r, i, n, horizon, ipt, ist, ien, dt, msg, nm, h, qs, targets,
          near):  # pragma: no cover - compiled
    """The fates of the S messages of local round r of device i (its broadcast starts at
    E[8, r]; ``targets`` drawn, h entries carried, ``qs``: each pair's message count when
    messages are lost at random; ``near``: each device's interval found last,
    :func:`sfg.world.locate.online_near`): counted, and those that reach written to ``msg``
    from column nm (room for S: :func:`grow`). Returns the new nm."""
    s, lat, p_loss, lkey = P[P_S], P[P_LATENCY], P[P_LOSS], P[P_LOSS_KEY]
    counts = P[P_COUNTS]
    b = E[8, r]
    nm0 = nm
    lim = min(_sender_until(ipt, ist, ien, i, E[0, r]), horizon)  # the sender online until
    for k in range(s):
        j = targets[k]
        tx = b + (k + 1) * dt[i]
        arr = tx + lat
        fate = REACHED
        if not tx <= lim:  # gone offline (or past the horizon) before its transfer ended
            fate = LOST_SENDER
            counts[C_LOST_SENDER] += 1
        else:
            counts[C_SENT] += 1
            counts[C_ENTRIES] += h
            if not (arr < horizon and online_near(ipt, ist, ien, j, arr, near)):
                fate = TARGET_OFFLINE
                counts[C_OFFLINE] += 1
            elif p_loss > 0.0 and uniform4(lkey, i, j, 0, qs[k]) < p_loss:
                fate = LOST_RANDOM
                counts[C_LOST_RANDOM] += 1
        counts[C_PRINT] += fingerprint(r, k, j, fate)  # (wraps around: modulo 2^64)
        if fate != REACHED:
            continue
        msg[M_SEND, nm], msg[M_RECV, nm], msg[M_EVENT, nm] = i, j, r
        msg[M_ARRIVAL, nm] = arr
        nm += 1
    counts[C_DELIVERED] += nm - nm0
    return nm


@njit(cache=True, nogil=True)
def arrivals(heap, late, msg, nm0, nm, t, key, hear_kind):  # pragma: no cover - compiled
    """The messages msg[:, nm0:nm] sent at t, to be heard at their arrivals (``hear_kind``,
    argument ``key``: :func:`heard`), or after the instant's events (``late``) for those that
    arrive at the instant they are sent."""
    for x in range(nm0, nm):
        j, arr = np.int64(msg[M_RECV, x]), msg[M_ARRIVAL, x]
        if t < arr:
            heapq.heappush(heap, (arr, hear_kind, j, key))
        else:
            late.append((j, key))


@njit(cache=True, nogil=True, **NO_REFCOUNT)  # (per message: no reference counts, see sfg.world.peers)
def _hear_row(P, j, sender, at, pool, free, top, row, scr):  # pragma: no cover - compiled
    """j hears of ``sender`` at ``at`` and of the pool row's entries at ``at`` − their
    seconds (one merge: :func:`sfg.world.peers.hear_many`); the row is freed after its last
    reader. Returns the free stack's top."""
    ids, ts = scr[0], scr[1]
    ids[0], ts[0] = sender, at
    cnt = 1
    if row >= 0:
        Mw = (pool.shape[1] - 2) // 2
        for e in range(np.int64(pool[row, 0])):
            ids[cnt], ts[cnt] = np.int64(pool[row, 2 + e]), at - pool[row, 2 + Mw + e]
            cnt += 1
        pool[row, 1] -= 1
        if pool[row, 1] <= 0:
            free[top] = row
            top += 1
    hear_many(P[P_TIE_KEY], j, ids, ts, cnt, P[P_TAB_ID], P[P_TAB_T], P[P_TAB_H],
              P[P_TAB_N], scr[2])
    return top


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def heard(P, arg, j, now, msg, pool, free, top, qj, qret, held, rslot,
          scr):  # pragma: no cover - compiled
    """A membership arrival at device j (arg: 3·(sender·2^31 + pool row + 1), a message;
    3q + 1, the reply to request q; 3q + 2, request q itself). Returns the free stack's
    top."""
    what, x = arg % 3, arg // 3
    if what == 0:
        return _hear_row(P, j, x >> 31, now, pool, free, top, (x & 0x7FFFFFFF) - 1, scr)
    if what == 1:
        return _hear_row(P, j, qj[x], now - held[x], pool, free, top, rslot[x], scr)
    hear(P[P_TIE_KEY], j, qret[x], now, P[P_TAB_ID], P[P_TAB_T], P[P_TAB_H], P[P_TAB_N])
    return top


@njit(cache=True, nogil=True)
def reply_entries(P, q, j, now, model, sent, ok, pool, free, top, rslot, car_id,
                  car_s):  # pragma: no cover - compiled
    """The reply of device j to request q, queued at ``now``: with a ``model`` (j sent
    one) it carries j's M freshest heard entries (counted when it is ``sent``; kept for its
    arrival when ``ok``); an empty answer carries none (it has no header), and is heard as
    its sender alone. Returns (pool, free, top)."""
    if not model:
        return pool, free, top
    h = carry(j, now, P[P_M], P[P_TAB_ID], P[P_TAB_T], P[P_TAB_N], car_id, car_s)
    if sent:
        P[P_COUNTS][C_ENTRIES] += h
    if ok and h:
        pool, free, top, rslot[q] = _take(pool, free, top, car_id, car_s, h, 1)
    return pool, free, top


@njit(cache=True, nogil=True)
def unreachable(P, i, j):  # pragma: no cover - compiled
    """Device i's request to j was answered "unreachable": j leaves i's table."""
    forget(i, j, P[P_TAB_ID], P[P_TAB_T], P[P_TAB_H], P[P_TAB_N])


def peer_state(peers: Peers | None, seed: int, graph, n: int, settings):
    """The simulation's peers (:func:`sfg.clock.pull._simulate`): (kind 0 fixed, 1 epidemic,
    2 online; the target key; the pull's key; the tie key; the message, request and reply
    loss keys; S; M; latency; loss; the tables ids, times, hashes, sizes; the counts)."""
    from sfg.clock.links import loss_key
    from sfg.world.peers import empty_tables, new_tables, peers_key, pull_key, tie_key

    sampled = peers is not None and not peers.fixed
    kind = 0 if not sampled else (1 if peers.kind == "epidemic" else 2)
    tables = new_tables(peers, seed, graph) if kind == 2 else empty_tables(n)
    lat, loss = pair_world(settings) if sampled else (0.0, 0.0)
    keys = [np.uint64(k) for k in (peers_key(seed), pull_key(seed),
                                   tie_key(seed), loss_key(seed, "message"),
                                   loss_key(seed, "request"), loss_key(seed, "reply"))]
    s = int(peers.s) if sampled else 0
    M = int(peers.gossip) if kind == 2 else 0
    return (kind, keys[0], keys[1], keys[2], keys[3], keys[4], keys[5], s, M, float(lat),
            float(loss), *tables, np.zeros(7, np.int64))


def pair_world(settings) -> tuple[float, float]:
    """The constant latency (seconds) and loss probability of every pair of devices
    (:func:`check_clock` refuses a drawn one first)."""
    from sfg.util.components import parse_component

    return tuple(float(parse_component(str(getattr(settings, k)), kind=k).params.get(
        "value", 0.0)) for k in ("latency", "loss"))  # type: ignore[return-value]


def check_clock(peers: Peers, settings, *, anatomy: str, link_failure: float) -> tuple[float, float]:
    """Refuse (one line) what the clock's replay does not run with ``peers`` ≠ fixed in this
    version; returns the constant latency (seconds) and loss probability of every pair."""
    from sfg.util.components import parse_component

    what = None
    if anatomy != "full":
        what = f"anatomy {anatomy!r}"
    elif link_failure:
        what = "link failures"
    elif str(settings.faults) not in ("none", "None", ""):
        what = "faults"
    for name in ("latency", "loss"):
        c = parse_component(str(getattr(settings, name)), kind=name)
        if c.name != "const" or c.modifiers:
            what = what or f"a {name} drawn per link ({getattr(settings, name)}; pairs outside " \
                "the graph have none: give const:value=X)"
    if what is not None:
        raise SfgError(f"peers {str(peers)!r} on the virtual clock does not run with {what} in "
                       "this version; use peers fixed for it")
    return pair_world(settings)
