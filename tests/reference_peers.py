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
            for k, j in enumerate(targets):
                tx = t + (k + 1) * dt[i]
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
