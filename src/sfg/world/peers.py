"""Peers chosen per exchange (docs/concepts/peers.md): the ``peers`` setting, the membership
table of the availability-aware sampler and the target draws, written once for every engine
that runs them.

* ``fixed`` (the default): a device sends to its graph neighbours, as before.
* ``epidemic:s=S``: each send goes to S distinct devices drawn uniformly from all others
  (Epidemic Learning's oracle variant).
* ``online:s=S,view=V,gossip=M``: every device keeps a table of at most V peers (id, when it
  was last heard of online), never itself; at the start its graph neighbours, "never heard"
  (ranked lowest). It hears first-hand of the sender of every message that reaches it (at
  the message's sending time) and second-hand of the M freshest entries the message carries
  (their times as the sender knew them; an entry replaces one only when strictly fresher).
  The table keeps the V freshest, ties ordered by a keyed hash of (seed, i, j), never by id.
  Each send goes to S distinct entries drawn uniformly (topped up uniformly from all others
  when the table holds fewer). Nothing reads true availability.

Draws are counter-based (:func:`sfg.util.rng.counter_uniform`, compiled here as
:func:`uniform`): send c of device i under seed s draws from the stream (s, "peers"), ids
(i, c, k) for its k-th try, so every rule of a seed, and the engine and a node, draw the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.util.numba_start import NO_REFCOUNT, njit

KINDS = ("fixed", "epidemic", "online")
# limits: a send draws its targets in O(S²) at worst (distinct), a table row holds V entries
MAX_S, MAX_VIEW = 1_000, 10_000
NEVER = -np.inf  # a table entry not heard of yet (the graph neighbours at the start)
ENTRY_BYTES = 12  # a carried entry: u32 id, f64 seconds


@dataclass(frozen=True)
class Peers:
    """A parsed ``peers`` setting: ``kind`` (:data:`KINDS`), S, V and M (0 under ``fixed``)."""

    kind: str = "fixed"
    s: int = 0
    view: int = 0
    gossip: int = 0

    def __str__(self) -> str:
        if self.kind == "fixed":
            return "fixed"
        if self.kind == "epidemic":
            return f"epidemic:s={self.s}"
        return f"online:s={self.s},view={self.view},gossip={self.gossip}"

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed"

    def check(self, n: int) -> Peers:
        """Refuse S ≥ N (one line): a device cannot send to S distinct others."""
        if not self.fixed and self.s >= n:
            raise SfgError(f"peers {str(self)!r}: s={self.s} needs more devices than that; "
                           f"s must be below the number of devices ({n}), e.g. s=6")
        return self


def _whole(text: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(float(value)) or float(value) != int(value) or int(value) < low:
        raise SfgError(f"peers {text!r}: {name} must be a whole number ≥ {low}, got {value!r} "
                       "(e.g. online:s=6,view=24,gossip=6)")
    if int(value) > high:
        raise SfgError(f"peers {text!r}: {name}={int(value)} is over the limit of {high:,} "
                       "(e.g. online:s=6,view=24,gossip=6)")
    return int(value)


def parse_peers(text: Any) -> Peers:
    """``fixed`` (None too), ``epidemic:s=S`` or ``online:s=S,view=V,gossip=M`` (V ≥ S,
    default 4S; 1 ≤ M ≤ V, default S); anything else is one error line."""
    from sfg.util.components import did_you_mean, parse_component

    if text is None or isinstance(text, Peers):
        return text or Peers()
    c = parse_component(str(text), kind="peers")
    if c.name not in KINDS or c.modifiers:
        raise SfgError(f"unknown peers {str(text)!r}{did_you_mean(c.name, KINDS)} (fixed: the "
                       "graph, the default; epidemic:s=S; online:s=S,view=V,gossip=M)")
    allowed = {"fixed": (), "epidemic": ("s",), "online": ("s", "view", "gossip")}[c.name]
    extra = sorted(set(c.params) - set(allowed))
    if extra:
        takes = ", ".join(allowed) if allowed else "no parameters"
        raise SfgError(f"peers {str(text)!r}: unknown parameter {extra[0]!r}; {c.name} takes "
                       f"{takes}")
    if c.name == "fixed":
        return Peers()
    if "s" not in c.params:
        raise SfgError(f"peers {str(text)!r}: give s, the peers of each send (e.g. {c.name}:s=6)")
    s = _whole(str(text), "s", c.params["s"], 1, MAX_S)
    if c.name == "epidemic":
        return Peers("epidemic", s)
    v = _whole(str(text), "view", c.params.get("view", 4 * s), 1, MAX_VIEW)
    m = _whole(str(text), "gossip", c.params.get("gossip", s), 1, MAX_VIEW)
    if v < s:
        raise SfgError(f"peers {str(text)!r}: view={v} must be at least s={s} (default 4·s)")
    if m > v:
        raise SfgError(f"peers {str(text)!r}: gossip={m} must be at most view={v}")
    return Peers("online", s, v, m)


def union_links(n: int, send: np.ndarray, recv: np.ndarray, name: str):
    """The run's own graph under peers chosen per exchange: every pair that exchanged a
    message (``send`` → ``recv``) a link. Returns (the graph, its round slots, each message's
    slot: the receiver's slot of its sender)."""
    from sfg.round.slots import RoundGraph
    from sfg.world.graphs import Graph, sorted_unique

    pairs = sorted_unique(np.minimum(send, recv) * n + np.maximum(send, recv))
    lo, hi = pairs // n, pairs % n
    keep = lo != hi  # (none is drawn: a device never sends to itself)
    # the canonical edges already (i < j, sorted, each once): Graph.from_edges' sort not redone
    union = Graph(n, np.stack([lo[keep], hi[keep]], axis=1), None, name)
    rg = RoundGraph.from_graph(union)
    slot = np.empty(send.size, np.int64)
    slots_of(rg.indptr, rg.send, np.ascontiguousarray(recv, np.int64),
             np.ascontiguousarray(send, np.int64), slot)
    return union, rg, slot


@njit(cache=True, nogil=True)
def slots_of(indptr, snd, recv, send, out):  # pragma: no cover - compiled
    """out[m]: the slot of send[m] → recv[m] (the receiver's segment holds its self slot
    first, then its senders by id: a search in the segment)."""
    for m in range(recv.shape[0]):
        lo, hi = indptr[recv[m]] + 1, indptr[recv[m] + 1]
        while lo < hi:
            mid = (lo + hi) // 2
            if snd[mid] < send[m]:
                lo = mid + 1
            else:
                hi = mid
        out[m] = lo


def canonical_peers(text: Any) -> str:
    """The canonical text of a ``peers`` setting (defaults written out)."""
    return str(parse_peers(text))


def peers_key(seed: int) -> int:
    """The key of the target draws under ``seed`` (stream (seed, "peers"))."""
    from sfg.util.rng import counter_key

    return counter_key(seed, "peers")


def pull_key(seed: int) -> int:
    """The key of a pull's target draws under ``seed`` (stream (seed, "peers", "pull")),
    keyed by (device, its return's index)."""
    from sfg.util.rng import counter_key

    return counter_key(seed, "peers", "pull")


def tie_key(seed: int) -> int:
    """The key of the table's tie order under ``seed`` (stream (seed, "peers-ties"))."""
    from sfg.util.rng import counter_key

    return counter_key(seed, "peers-ties")


# ----------------------------------------------------------------------------- compiled
# The draws and the table's functions run once per send or per message heard; those that
# allocate nothing compile without numba's reference counting (``NO_REFCOUNT``,
# sfg.util.numba_start: numba's private ``_nrt=False`` where it has it): with it each
# call counted references to every array it was passed, in and out (atomic operations that
# cost the clock's simulation about a tenth of its time).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _mix(z):  # pragma: no cover - compiled
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def uniform(key, a, b, c):  # pragma: no cover - compiled
    """:func:`sfg.util.rng.counter_uniform` (key, a, b, c), compiled: the same value."""
    z = np.uint64(key)
    z = _mix(z + np.uint64(a) * _GOLDEN)
    z = _mix(z + np.uint64(b) * _GOLDEN)
    z = _mix(z + np.uint64(c) * _GOLDEN)
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def uniform4(key, a, b, c, d):  # pragma: no cover - compiled
    """:func:`sfg.util.rng.counter_uniform` (key, a, b, c, d), compiled (a link's loss draw:
    :func:`sfg.clock.links.transfer_lost`)."""
    z = np.uint64(key)
    z = _mix(z + np.uint64(a) * _GOLDEN)
    z = _mix(z + np.uint64(b) * _GOLDEN)
    z = _mix(z + np.uint64(c) * _GOLDEN)
    z = _mix(z + np.uint64(d) * _GOLDEN)
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def draw_epidemic(key, i, count, n, s, out):  # pragma: no cover - compiled
    """out[:s]: s distinct devices other than i, uniform (send ``count`` of device i; try k
    draws ids (i, count, k), a device drawn twice is drawn again)."""
    _top_up(key, i, count, n, s, out, 0, 0)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _top_up(key, i, count, n, s, out, got, k):  # pragma: no cover - compiled
    """out[got:s]: devices other than i and out[:got], uniform, from try k on."""
    while got < s:
        j = np.int64(uniform(key, i, count, k) * (n - 1))
        k += 1
        if j >= i:
            j += 1
        dup = False
        for m in range(got):
            if out[m] == j:
                dup = True
                break
        if not dup:
            out[got] = j
            got += 1


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def draw_online(key, i, count, n, s, tab_id, tab_n, buf, out):  # pragma: no cover - compiled
    """out[:s]: s distinct entries of device i's table drawn uniformly (a partial shuffle of
    its entries, try k drawing ids (i, count, k)), topped up uniformly from all other devices
    when it holds fewer than s (tries (i, count, s + k)). ``buf`` [at least min(s, V)]:
    scratch.

    The shuffle is virtual: it reads the row in place and records in ``buf`` only the
    positions it moved (position · 2^32 + the row position whose entry is there now), so a
    send reads O(S) entries of the table whatever its size V, and draws what a partial
    Fisher–Yates shuffle of a copy of the row draws (tests/reference_peers.py)."""
    m = tab_n[i]
    take = min(s, m)
    w = 0  # moved positions recorded
    for k in range(take):
        r = k + np.int64(uniform(key, i, count, k) * (m - k))
        at_k, at_r, rec = k, r, -1  # the row positions whose entries are now at k and at r
        for x in range(w):
            p = buf[x] >> 32
            if p == k:
                at_k = buf[x] & 0xFFFFFFFF
            if p == r:
                at_r, rec = buf[x] & 0xFFFFFFFF, x
        out[k] = tab_id[i, at_r]
        if r != k:  # position r now holds what position k held (k is never read again)
            if rec < 0:
                rec = w
                w += 1
            buf[rec] = (r << 32) | at_k
    _top_up(key, i, count, n, s, out, take, s)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def carry(i, now, M, tab_id, tab_t, tab_n, out_id, out_s):  # pragma: no cover - compiled
    """The M freshest heard entries of device i's table as (peer, seconds since heard at
    ``now``) into out_id, out_s (what a message it sends at ``now`` carries); returns how many."""
    h = 0
    for a in range(tab_n[i]):
        if h >= M:
            break
        if tab_t[i, a] > NEVER:
            out_id[h] = tab_id[i, a]
            out_s[h] = now - tab_t[i, a]
            h += 1
    return h


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _before(t1, h1, t2, h2):  # pragma: no cover - compiled
    """Entry (t1, h1) ranks before (t2, h2): fresher, or as fresh with a larger tie hash."""
    return t1 > t2 or (t1 == t2 and h1 > h2)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _unheard(i, j, t, tab_t, m):  # pragma: no cover - compiled
    """The first test of :func:`_fresher`, before the row is searched: device i hearing of j
    at t cannot change its table of m entries (j is i, or t is staler than every entry of a
    full table)."""
    return j == i or (m == tab_t.shape[1] and t < tab_t[i, m - 1])


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _fresher_at(tkey, i, j, t, pos, tab_t, tab_h):  # pragma: no cover - compiled
    """The rest of :func:`_fresher` once j's position in the row is known (−1: absent)."""
    if pos >= 0:
        return (pos, tab_h[i, pos]) if t > tab_t[i, pos] else (-2, 0.0)
    return -1, uniform(tkey, i, j, 0)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def _fresher(tkey, i, j, t, tab_id, tab_t, tab_h, m):  # pragma: no cover - compiled
    """Whether device i hearing of j at t can change its table of m entries, the rule of
    :func:`hear` and :func:`hear_many`: (−2: it cannot — j is i, or no fresher than j's entry,
    or staler than every entry of a full table; else j's position, −1 when absent; j's tie
    hash)."""
    if _unheard(i, j, t, tab_t, m):
        return -2, 0.0
    pos = -1
    for a in range(m):
        if tab_id[i, a] == j:
            pos = a
            break
    return _fresher_at(tkey, i, j, t, pos, tab_t, tab_h)


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def hear(tkey, i, j, t, tab_id, tab_t, tab_h, tab_n):  # pragma: no cover - compiled
    """Device i hears that j was online at t: j's entry is set to t when that is strictly
    fresher (or j enters, when the table has room or t ranks before its last entry, which
    then leaves). The row stays sorted, freshest first; tab_h holds each entry's tie hash.
    Returns whether it changed."""
    m = tab_n[i]
    V = tab_id.shape[1]
    pos, hj = _fresher(tkey, i, j, t, tab_id, tab_t, tab_h, m)
    if pos == -2:
        return False
    if pos < 0:
        if m < V:
            pos = m
            tab_n[i] = m + 1
        else:
            last = m - 1
            if not _before(t, hj, tab_t[i, last], tab_h[i, last]):
                return False
            pos = last
    # move the entry up to its rank
    while pos > 0 and _before(t, hj, tab_t[i, pos - 1], tab_h[i, pos - 1]):
        tab_id[i, pos] = tab_id[i, pos - 1]
        tab_t[i, pos] = tab_t[i, pos - 1]
        tab_h[i, pos] = tab_h[i, pos - 1]
        pos -= 1
    tab_id[i, pos] = j
    tab_t[i, pos] = t
    tab_h[i, pos] = hj
    return True


@njit(cache=True, nogil=True, **NO_REFCOUNT)
def hear_many(tkey, i, ids, ts, cnt, tab_id, tab_t, tab_h, tab_n, scr):  # pragma: no cover
    """Device i hears of the distinct peers ids[:cnt] at ts[:cnt]: the table :func:`hear` of
    each in turn leaves (a table keeps the V freshest of what it heard, whatever the order),
    in one merge of the row with what is fresher. ``scr``: :func:`hear_scratch`.

    One scan of the row finds every peer heard; the merge runs in place from the row's end
    (an entry kept never moves up: each one that leaves for a fresher time re-enters above
    its old place) and stops where the row no longer changes: a call costs O(cnt·m) compares
    and O(cnt + the entries shifted) moves, no copy of the row."""
    kin_id, kin_t, kin_h, gone = scr[0], scr[1], scr[2], scr[3]
    cid, ct, cpos = scr[4], scr[5], scr[6]
    m = tab_n[i]
    V = tab_id.shape[1]
    nc = 0  # the peers that may change the row (_fresher's rule), found in one scan of it
    for x in range(cnt):
        if not _unheard(i, ids[x], ts[x], tab_t, m):
            cid[nc], ct[nc], cpos[nc] = ids[x], ts[x], -1
            nc += 1
    for a in range(m):
        y = tab_id[i, a]
        for c in range(nc):
            if cid[c] == y:
                cpos[c] = a
    kk = g = 0  # entries kept, freshest first; the old positions of the heard ones, ascending
    for c in range(nc):
        j, t = cid[c], ct[c]
        pos, h = _fresher_at(tkey, i, j, t, cpos[c], tab_t, tab_h)
        if pos == -2:
            continue
        if pos >= 0:
            q = g
            while q > 0 and gone[q - 1] > pos:
                gone[q] = gone[q - 1]
                q -= 1
            gone[q] = pos
            g += 1
        p = kk
        while p > 0 and _before(t, h, kin_t[p - 1], kin_h[p - 1]):
            kin_id[p], kin_t[p], kin_h[p] = kin_id[p - 1], kin_t[p - 1], kin_h[p - 1]
            p -= 1
        kin_id[p], kin_t[p], kin_h[p] = j, t, h
        kk += 1
    if kk == 0:
        return
    # the merge, last entry first: at a tie the row's entry ranks first; the `drop` last of
    # the merged entries are beyond V and leave; once every kept entry is placed and every
    # heard one passed, the rest of the row is where it was (w == a)
    size = min(V, m - g + kk)
    drop = m - g + kk - size
    a, b, gi, w = m - 1, kk - 1, g - 1, size - 1
    while True:
        while gi >= 0 and a == gone[gi]:
            a -= 1
            gi -= 1
        if b < 0 and gi < 0:
            break
        if b >= 0 and (a < 0 or not _before(kin_t[b], kin_h[b], tab_t[i, a], tab_h[i, a])):
            if drop > 0:
                drop -= 1
            else:
                tab_id[i, w], tab_t[i, w], tab_h[i, w] = kin_id[b], kin_t[b], kin_h[b]
                w -= 1
            b -= 1
        else:
            if drop > 0:
                drop -= 1
            else:
                tab_id[i, w], tab_t[i, w], tab_h[i, w] = tab_id[i, a], tab_t[i, a], tab_h[i, a]
                w -= 1
            a -= 1
    tab_n[i] = size


@njit(cache=True, nogil=True)
def hear_scratch(V, M):  # pragma: no cover - compiled
    """The buffers of :func:`hear_many` for M + 1 peers heard at once (tables of V entries):
    the kept entries (ids, times, tie hashes), the old positions of the heard ones and the
    peers that may change the row (ids, times, positions)."""
    return (np.empty(M + 1, np.int64), np.empty(M + 1), np.empty(M + 1),
            np.empty(M + 1, np.int64), np.empty(M + 1, np.int64), np.empty(M + 1),
            np.empty(M + 1, np.int64))


@njit(cache=True, nogil=True)
def forget(i, j, tab_id, tab_t, tab_h, tab_n):  # pragma: no cover - compiled
    """Device i drops j from its table (an "unreachable" answer); the entries after it move
    up. Returns whether j was there."""
    m = tab_n[i]
    for a in range(m):
        if tab_id[i, a] == j:
            for b in range(a, m - 1):
                tab_id[i, b] = tab_id[i, b + 1]
                tab_t[i, b] = tab_t[i, b + 1]
                tab_h[i, b] = tab_h[i, b + 1]
            tab_n[i] = m - 1
            return True
    return False


@njit(cache=True, nogil=True)
def start_tables(tkey, indptr, nbr, tab_id, tab_t, tab_h, tab_n):  # pragma: no cover - compiled
    """Every device's table at the start: its graph neighbours (CSR ``indptr``, ``nbr``),
    never heard, the V first in the tie order."""
    for i in range(tab_n.shape[0]):
        tab_n[i] = 0
        for a in range(indptr[i], indptr[i + 1]):
            hear(tkey, i, nbr[a], NEVER, tab_id, tab_t, tab_h, tab_n)


def new_tables(peers: Peers, seed: int, graph) -> tuple[np.ndarray, ...]:
    """(ids [N, V], heard times [N, V], tie hashes [N, V], sizes [N]): the tables at the
    start (:func:`start_tables`)."""
    from sfg.util.safety import check_memory

    n = graph.n
    V = max(peers.view, 1)
    check_memory(24.0 * n * V, f"the membership tables of peers {str(peers)!r} ({n} devices × "
                 f"{V} entries)", fix="give a smaller view")
    e = np.asarray(graph.edges, np.int64).reshape(-1, 2)
    src = np.concatenate([e[:, 0], e[:, 1]])
    dst = np.concatenate([e[:, 1], e[:, 0]])
    o = np.lexsort((dst, src))
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    tab_id = np.full((n, V), -1, np.int64)
    tab_t = np.full((n, V), NEVER)
    tab_h = np.zeros((n, V))
    tab_n = np.zeros(n, np.int64)
    start_tables(np.uint64(tie_key(seed)), indptr, dst[o], tab_id, tab_t, tab_h, tab_n)
    return tab_id, tab_t, tab_h, tab_n


@njit(cache=True, nogil=True)
def _round_sends(kind, key, tkey, s, M, avail, delta, tab_id, tab_t, tab_h, tab_n, snd, rcv,
                 rnd, ok, counts):  # pragma: no cover - compiled
    """The sends of every round (kind 1: epidemic, 2: online): round t's available devices
    draw their targets (send counter t) from the tables as they stood after round t − 1's
    arrivals; a message reaches its target when the target is available in round t; round
    t's arrivals merge after all its sends (first-hand: the sender at t·Δ; second-hand: the
    sender's M freshest heard entries as durations at the send, stored as t·Δ − duration).
    Writes (sender, receiver, round, reached) per message; counts: messages, to offline
    targets, entries carried."""
    T, n = avail.shape
    V = tab_id.shape[1]
    targets = np.empty(s, np.int64)
    buf = np.empty(max(V, 1), np.int64)
    h_id = np.empty((n, max(M, 1)), np.int64)
    h_d = np.empty((n, max(M, 1)))
    h_n = np.zeros(n, np.int64)
    m = 0
    for t in range(T):
        now = t * delta
        first = m
        for i in range(n):
            if not avail[t, i]:
                continue
            if kind == 1:
                draw_epidemic(key, i, t, n, s, targets)
            else:
                draw_online(key, i, t, n, s, tab_id, tab_n, buf, targets)
                h_n[i] = carry(i, now, M, tab_id, tab_t, tab_n, h_id[i], h_d[i])
                counts[2] += h_n[i] * s
            for q in range(s):
                j = targets[q]
                snd[m], rcv[m], rnd[m] = i, j, t
                ok[m] = avail[t, j]
                counts[0] += 1
                if not ok[m]:
                    counts[1] += 1
                m += 1
        if kind == 2:
            for k in range(first, m):
                if not ok[k]:
                    continue
                i, j = snd[k], rcv[k]
                hear(tkey, j, i, now, tab_id, tab_t, tab_h, tab_n)
                for e in range(h_n[i]):
                    hear(tkey, j, h_id[i, e], now - h_d[i, e], tab_id, tab_t, tab_h, tab_n)
    return m


def empty_tables(n: int) -> tuple[np.ndarray, ...]:
    """Tables of one unused entry each (``epidemic`` keeps none)."""
    return (np.zeros((n, 1), np.int64), np.zeros((n, 1)), np.zeros((n, 1)),
            np.zeros(n, np.int64))


def round_sends(peers: Peers, seed: int, available: np.ndarray, graph,
                round_seconds: float) -> dict[str, Any]:
    """Every message of a run in rounds under ``peers`` (not ``fixed``; :func:`_round_sends`):
    ``send``, ``recv``, ``round``, ``reached`` [messages] and the counts ``messages``,
    ``to_offline`` and ``membership_bytes`` (entries carried × :data:`ENTRY_BYTES`)."""
    avail = np.ascontiguousarray(available, bool)
    T, n = avail.shape
    peers.check(n)
    bound = int(avail.sum()) * peers.s
    from sfg.util.safety import check_memory

    check_memory(25.0 * bound, f"the messages of peers {str(peers)!r} ({bound:.3g} sends)",
                 fix="use a smaller s, or fewer devices or rounds")
    snd = np.empty(bound, np.int64)
    rcv = np.empty(bound, np.int64)
    rnd = np.empty(bound, np.int64)
    ok = np.empty(bound, bool)
    counts = np.zeros(3, np.int64)
    tables = new_tables(peers, seed, graph) if peers.kind == "online" else empty_tables(n)
    m = _round_sends(1 if peers.kind == "epidemic" else 2, np.uint64(peers_key(seed)),
                     np.uint64(tie_key(seed)), int(peers.s), int(peers.gossip), avail,
                     float(round_seconds), *tables, snd, rcv, rnd, ok, counts)
    return {"send": snd[:m], "recv": rcv[:m], "round": rnd[:m], "reached": ok[:m],
            "messages": int(counts[0]), "to_offline": int(counts[1]),
            "membership_bytes": int(counts[2]) * ENTRY_BYTES}
