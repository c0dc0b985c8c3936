"""Peers chosen per exchange on the virtual clock (docs/concepts/peers.md): who each committed
local round sends to, and what reaches whom, in time order — the sampler's membership tables
and target draws of :mod:`sfg.world.peers` (the same functions as the replay in rounds) run
along the async and event protocols' local rounds (``on_return: none``: their times do not
depend on the messages, so the simulation of :mod:`sfg.clock.pull` fixes them first).

At one instant (:mod:`sfg.clock.instant`): the arrivals of messages sent before it are heard,
then the local rounds committing at it draw their targets (device order), then the arrivals of
messages sent at it (a message sent at t is heard by no draw at t, as it is held by no local
round starting at t). A commit at t draws S targets (send counter: the local round's key
``step``), sends them back to back on its uplink (transfer k ends at t + (k+1)·dt_i) and carries
its M freshest heard entries as seconds since heard at t. A message is lost when its sender goes
offline before its transfer ends, when its target is offline at its arrival (counted as sent to
an offline peer) or by the link's loss (the draw of message k on the pair, as on the graph's
links). A message that arrives at t_a makes its receiver hear of the sender at t_a (transit
time ignored) and of each carried entry at t_a − its seconds.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from numba import types
from numba.typed import Dict

from sfg.errors import SfgError
from sfg.util.numba_start import njit
from sfg.world.locate import locate_one
from sfg.world.peers import (
    ENTRY_BYTES,
    Peers,
    carry,
    draw_epidemic,
    draw_online,
    hear,
    uniform4,
)


@njit(cache=True, nogil=True)
def _online_through(ipt, ist, ien, i, t0, t1):  # pragma: no cover - compiled
    k, on = locate_one(ipt, ist, ien, i, t0)
    return on and t1 <= ien[k]


@njit(cache=True, nogil=True)
def _run(kind, key, tkey, lkey, s, M, n, horizon, ipt, ist, ien, cstart, cend, cdev, cstep,
         dt, lat, p_loss, tab_id, tab_t, tab_h, tab_n, msnd, mrcv, mcom, marr, mfate,
         counts):  # pragma: no cover - compiled
    """The commits (cstart, cend, cdev, cstep [C], sorted by (cend, cdev)) and the messages'
    arrivals in time order (module docstring). Writes per message its sender, receiver,
    commit, arrival and fate (0 reached, 1 sender offline before its transfer ended, 2 target
    offline at the arrival or after the run, 3 lost on the way); counts: messages sent, to
    offline targets, entries carried. Returns the number of messages."""
    targets = np.empty(s, np.int64)
    V = tab_id.shape[1]
    buf = np.empty(max(V, 1), np.int64)
    C = cend.shape[0]
    car_id = np.empty((C, max(M, 1)), np.int64)
    car_s = np.empty((C, max(M, 1)))
    car_n = np.zeros(C, np.int64)
    nth = Dict.empty(key_type=types.int64, value_type=types.int64)
    heap = [(np.inf, 9, 0, 0)]
    m = 0
    ci = 0
    while True:
        top_t, top_c = heap[0][0], heap[0][1]
        if ci < C and (cend[ci] < top_t or (cend[ci] == top_t and top_c >= 1)):
            i, t = cdev[ci], cend[ci]
            if kind == 1:
                draw_epidemic(key, i, cstep[ci], n, s, targets)
            else:
                draw_online(key, i, cstep[ci], n, s, tab_id, tab_n, buf, targets)
                car_n[ci] = carry(i, t, M, tab_id, tab_t, tab_n, car_id[ci], car_s[ci])
            for k in range(s):
                j = targets[k]
                tx = t + (k + 1) * dt[i]
                q = 0
                if p_loss > 0.0:  # the pair's message count, for its loss draw
                    pair = i * n + j
                    q = nth[pair] if pair in nth else 0
                    nth[pair] = q + 1
                msnd[m], mrcv[m], mcom[m] = i, j, ci
                arr = tx + lat
                marr[m] = arr
                if not (tx <= horizon and _online_through(ipt, ist, ien, i, cstart[ci], tx)):
                    mfate[m] = 1
                else:
                    counts[0] += 1
                    counts[2] += car_n[ci]
                    if not (arr < horizon and locate_one(ipt, ist, ien, j, arr)[1]):
                        mfate[m] = 2
                        counts[1] += 1
                    elif p_loss > 0.0 and uniform4(lkey, i, j, 0, q) < p_loss:
                        mfate[m] = 3
                    else:
                        mfate[m] = 0
                        if kind == 2:  # (epidemic keeps no tables: nothing hears)
                            heapq.heappush(heap, (arr, 0 if t < arr else 2, j, m))
                m += 1
            ci += 1
            continue
        if top_c == 9:
            break
        arr, _, j, k = heapq.heappop(heap)
        if kind == 2:
            i = msnd[k]
            hear(tkey, j, i, arr, tab_id, tab_t, tab_h, tab_n)
            c = mcom[k]
            for e in range(car_n[c]):
                hear(tkey, j, car_id[c, e], arr - car_s[c, e], tab_id, tab_t, tab_h, tab_n)
    return m


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
    if settings.pull_timeout is not None and peers.kind != "epidemic":
        what = "on_return pull (epidemic pulls: its targets need no table)"
    elif anatomy != "full":
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


def peer_messages(world, settings, peers: Peers, seed: int, *, time: np.ndarray,
                  dev: np.ndarray, end: np.ndarray, step: np.ndarray, sends: np.ndarray,
                  latency: float, loss: float) -> dict[str, Any]:
    """The messages of the local rounds ``sends`` (indices into the events, in the
    schedule's order) under ``peers`` (:func:`_run`): per message its sending event, sender,
    receiver, arrival and fate, and the counts (``peer_messages``, ``messages_to_offline``,
    ``membership_bytes``)."""
    from sfg.clock.links import loss_key, transfer_seconds
    from sfg.world.peers import empty_tables, new_tables, peers_key, tie_key

    n = world.n
    peers.check(n)
    order = sends[np.lexsort((dev[sends], end[sends]))]  # commits by (time, device)
    on = world.online
    dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
    tables = new_tables(peers, seed, world.graph) if peers.kind == "online" else \
        empty_tables(n)
    bound = order.size * peers.s
    from sfg.util.safety import check_memory

    check_memory(41.0 * bound, f"the messages of peers {str(peers)!r} ({bound:.3g} sends)",
                 fix="use a smaller s, or fewer devices or rounds")
    msnd, mrcv, mcom = (np.empty(bound, np.int64) for _ in range(3))
    marr, mfate = np.empty(bound), np.empty(bound, np.int64)
    counts = np.zeros(3, np.int64)
    m = _run(1 if peers.kind == "epidemic" else 2, np.uint64(peers_key(seed)),
             np.uint64(tie_key(seed)), np.uint64(loss_key(seed, "message")), int(peers.s),
             int(peers.gossip), n, float(world.horizon), on.indptr, on.start, on.end,
             np.ascontiguousarray(time[order], float), np.ascontiguousarray(end[order], float),
             np.ascontiguousarray(dev[order], np.int64),
             np.ascontiguousarray(step[order], np.int64), np.ascontiguousarray(dt, float),
             float(latency), float(loss), *tables, msnd, mrcv, mcom, marr, mfate, counts)
    return {"src": order[mcom[:m]], "send": msnd[:m], "recv": mrcv[:m], "arrival": marr[:m],
            "fate": mfate[:m], "peer_messages": float(counts[0]),
            "messages_to_offline": float(counts[1]),
            "membership_bytes": float(counts[2] * ENTRY_BYTES)}
