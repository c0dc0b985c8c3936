"""A slow, obvious reference of peers chosen per exchange on the virtual clock
(sfg.clock.peersim), written in plain Python from docs/concepts/peers.md: the oracle the
compiled pass is checked against (tests/test_peers_clock.py). Tables are dicts peer -> time."""

from __future__ import annotations

import heapq

from sfg.util.rng import counter_uniform


def _rank(tkey, i, j, t):
    return (t, counter_uniform(tkey, i, j, 0))


def hear(tables, V, tkey, i, j, t):
    if j == i:
        return
    tab = tables[i]
    if j in tab:
        if t > tab[j]:
            tab[j] = t
        return
    if len(tab) < V:
        tab[j] = t
        return
    last = min(tab, key=lambda p: _rank(tkey, i, p, tab[p]))
    if _rank(tkey, i, j, t) > _rank(tkey, i, last, tab[last]):
        del tab[last]
        tab[j] = t


def ordered(tables, tkey, i):
    tab = tables[i]
    return sorted(tab, key=lambda p: _rank(tkey, i, p, tab[p]), reverse=True)


def draw(kind, key, tables, tkey, i, count, n, s):
    out: list[int] = []
    if kind == "online":
        entries = ordered(tables, tkey, i)
        m = len(entries)
        for k in range(min(s, m)):
            r = k + int(counter_uniform(key, i, count, k) * (m - k))
            entries[k], entries[r] = entries[r], entries[k]
            out.append(entries[k])
        k = s
    else:
        k = 0
    while len(out) < s:
        j = int(counter_uniform(key, i, count, k) * (n - 1))
        k += 1
        j += j >= i
        if j not in out:
            out.append(j)
    return out


def fates(i, t0, b, targets, dt, lat, p_loss, lkey, horizon, online_at, online_through, nth):
    """(target, arrival, fate) of the messages of a local round of device i started at t0 whose
    broadcast starts at b: 0 reached, 1 its sender offline before its transfer ended, 2 its
    target offline at the arrival, 3 lost on the way (the pair's message count ``nth``)."""
    out = []
    for k, j in enumerate(targets):
        tx = b + (k + 1) * dt[i]
        q = nth.get((i, j), 0)
        nth[(i, j)] = q + 1
        arr = tx + lat
        if not (tx <= horizon and online_through(i, t0, tx)):
            fate = 1
        elif not (arr < horizon and online_at(j, arr)):
            fate = 2
        elif p_loss > 0 and counter_uniform(lkey, i, j, 0, q) < p_loss:
            fate = 3
        else:
            fate = 0
        out.append((j, arr, fate))
    return out


def fingerprint(messages):
    """The sum modulo 2^64 (as a signed 64-bit integer) of every message's 53-bit draw of
    (its local round's event, its position k in the local round, receiver, fate)."""
    from sfg.clock.peersim import FINGERPRINT_KEY

    pos: dict[int, int] = {}
    total = 0
    for e, _, j, _, f in messages:
        k = pos.get(e, 0)
        pos[e] = k + 1
        total += int(counter_uniform(FINGERPRINT_KEY, e, k, j, f) * 2.0**53)
    total %= 2**64
    return total - 2**64 if total >= 2**63 else total


def messages(kind, s, V, M, n, horizon, online_at, online_through, commits, dt, lat, p_loss,
             key, tkey, lkey, start_tables):
    """commits: (start, end, dev, step, event) sorted by (end, dev). Returns the messages as
    (event, sender, receiver, arrival, fate) in the order they are sent."""
    tables = {i: dict(t) for i, t in start_tables.items()}
    heap: list = []
    out = []
    nth: dict[tuple[int, int], int] = {}
    carried = {}
    ci = 0
    while ci < len(commits) or heap:
        if ci < len(commits) and (not heap or commits[ci][1] < heap[0][0]
                                  or (commits[ci][1] == heap[0][0] and heap[0][1] >= 1)):
            t0, t, i, step, ev = commits[ci]
            targets = draw(kind, key, tables, tkey, i, step, n, s)
            if kind == "online":
                heard = [p for p in ordered(tables, tkey, i) if tables[i][p] != float("-inf")]
                carried[ci] = [(p, t - tables[i][p]) for p in heard[:M]]
            else:
                carried[ci] = []
            for j, arr, fate in fates(i, t0, t, targets, dt, lat, p_loss, lkey, horizon,
                                      online_at, online_through, nth):
                if fate == 0:
                    heapq.heappush(heap, (arr, 0 if t < arr else 2, j, len(out), ci))
                out.append((ev, i, j, arr, fate))
            ci += 1
            continue
        arr, _, j, m, c = heapq.heappop(heap)
        if kind == "online":
            hear(tables, V, tkey, j, out[m][1], arr)
            for p, secs in carried[c]:
                hear(tables, V, tkey, j, p, arr - secs)
    return out


def _carry(tables, tkey, i, now, M):
    heard = [p for p in ordered(tables, tkey, i) if tables[i][p] != float("-inf")]
    return [(p, now - tables[i][p]) for p in heard[:M]]


def membership(kind, s, V, M, n, key, pkey, tkey, start_tables, commits, returns, requests,
               replies, world):
    """The tables of ``online`` (or none, ``epidemic``) along the simulation's own timings
    and fates, in the phases of one instant (docs/concepts/clock.md#one-instant): returns
    draw their pull targets (phase 1); "unreachable" answers remove their peer, then
    requests arriving queue their replies (carrying the table as it stood before the
    instant's arrivals), then the arrivals are heard — messages, replies and the asking
    devices (phase 2); commits draw their targets (phase 5); a message that arrives at the
    instant it was sent is heard last.

    commits: (commit time, broadcast start, start, device, step, event); returns: (time,
    device, return index, request ids); requests: id -> (asking device, target, code, time)
    with code 0 arrives, 1 unreachable, 2 silent; replies: id -> (arrival, held, delivered,
    sent, with a model); world: (horizon, online_at, online_through, dt, latency, loss, loss key) for
    :func:`fates`. Returns (every message as (event, sender, receiver, arrival, fate), the
    targets of every return by its first request id, the entries carried in sent messages
    and replies)."""
    horizon, online_at, online_through, dt, lat, p_loss, lkey = world
    pair_nth: dict = {}
    out = []
    tables = {i: dict(t) for i, t in start_tables.items()}
    ev = []  # (time, phase, order, what, payload)
    for t, b, t0, i, step, e in commits:
        ev.append((t, 5, len(ev), "commit", (i, step, e, b, t0)))
    for t, i, nth, qs in returns:
        ev.append((t, 1, len(ev), "return", (i, nth, qs)))
    for q, (i, j, code, t) in requests.items():
        if code == 1:
            ev.append((t, 2, len(ev), "forget", (i, j)))
        elif code == 0:
            ev.append((t, 3, len(ev), "request", (q, i, j)))
    heapq.heapify(ev)
    asked, entries = {}, 0
    while ev:
        t, _, _, what, x = heapq.heappop(ev)
        if what == "commit":
            i, step, e, b, t0 = x
            targets = draw(kind, key, tables, tkey, i, step, n, s)
            c = _carry(tables, tkey, i, t, M) if kind == "online" else []
            for j, arr, fate in fates(i, t0, b, targets, dt, lat, p_loss, lkey, horizon,
                                      online_at, online_through, pair_nth):
                out.append((e, i, j, arr, fate))
                entries += len(c) * (fate != 1)
                if fate == 0 and kind == "online":
                    heapq.heappush(ev, (arr, 4 if t < arr else 7, len(ev) + 10**9, "hear",
                                        (j, i, arr, c)))
        elif what == "return":
            i, nth, qs = x
            asked[qs] = draw(kind, pkey, tables, tkey, i, nth, n, s)
        elif what == "forget" and kind == "online":
            tables[x[0]].pop(x[1], None)
        elif what == "request" and kind == "online":
            q, i, j = x
            arr, held, ok, sent, model = replies[q]
            c = _carry(tables, tkey, j, t, M) if model else []  # an empty answer: none
            entries += len(c) * sent
            heapq.heappush(ev, (t, 4, q, "hear", (j, i, t, [])))  # j hears the asking i
            if ok:
                heapq.heappush(ev, (arr, 4, q, "hear", (i, j, arr - held, c)))
        elif what == "hear":
            j, i, at, c = x
            hear(tables, V, tkey, j, i, at)
            for p, secs in c:
                hear(tables, V, tkey, j, p, at - secs)
    return out, asked, entries


def draw_online_copying(key, i, count, n, s, tab_id, tab_n, out):
    """sfg.world.peers.draw_online as it was first written (O(V) a send): the row copied into
    a buffer, a partial Fisher–Yates shuffle of the copy, then the uniform top-up; the
    compiled draw, which reads the row in place, must draw exactly this."""
    m = int(tab_n[i])
    buf = [int(x) for x in tab_id[i, :m]]
    take = min(s, m)
    for k in range(take):
        r = k + int(counter_uniform(key, i, count, k) * (m - k))
        buf[k], buf[r] = buf[r], buf[k]
        out[k] = buf[k]
    got, k = take, s
    while got < s:  # the top-up of sfg.world.peers._top_up, from try s on
        j = int(counter_uniform(key, i, count, k) * (n - 1))
        k += 1
        j += j >= i
        if j not in [int(x) for x in out[:got]]:
            out[got] = j
            got += 1
