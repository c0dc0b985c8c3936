"""The assembly of the async and event protocols' events into a schedule
(:class:`sfg.clock.schedule.Schedule`; docs/concepts/clock.md#the-virtual-clock): every committed
local round's messages, each local round's candidates, the counts. It runs span by span of
time (:class:`Assembler`): the events of one span in, one piece of the schedule out, with what
a later span can still need carried over — per link the newest message already arrived and
every message still in flight, the links' message counts, the returns still waiting for
their first aggregation. Memory is then O(N) whatever the length of the run; one span over the
whole run is the whole schedule (:func:`sfg.clock.schedule.finish_schedule`), and the pieces
of any cut into spans, joined (:func:`join`), are that schedule (tests/test_clock_spans.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.clock.events import (
    DIGESTED,
    LATER_CANDIDATE,
    LOCAL,
    TAGGED,
    Schedule,
    digest_of,
    held_count,
    held_latest,
    held_units,
    newest_so_far,
    time_order,
)
from sfg.clock.links import (
    arrival_time,
    fault_plan,
    link_round,
    live_links,
    loss_key,
    out_slots,
    transfer_end,
    transfer_lost,
    transfer_seconds,
)
from sfg.clock.settings import ClockSettings
from sfg.errors import SfgError
from sfg.round.kernel import EV_AGGREGATE, EV_SEND
from sfg.util.numba_start import njit

# counts summed over the spans (integers: exact in any order)
COUNTS = ("messages_sent", "lost_sender", "lost_receiver", "lost_random", "lost_link",
          "delivered", "candidates", "fault_partitioned", "fault_lost", "fault_delayed",
          "fault_corrupted")
_MSG = ("slot", "arr", "src", "sent", "rep", "off")  # a message's columns
# the counts of peers chosen per exchange (sfg.clock.peersim)
PEER_COUNTS = ("peer_messages", "messages_to_offline", "membership_bytes")
# with peers, candidates by each device's recent messages (held_recent) instead of a query per
# link of the run's union graph (the same candidates; tests/test_peers_clock.py flips it)
WALK = True


class Assembler:
    """Pieces of one schedule, span by span (see the module docstring). ``pull``
    (:mod:`sfg.clock.pull`, one span only): each event's broadcast start ``bstart`` and
    ``closes``, and the replies that reached their device."""

    def __init__(self, world, settings: ClockSettings, protocol: str, *, seed: int,
                 link_failure: float = 0.0, offline_talks: bool = False, peers=None,
                 anatomy: str = "full"):
        self.world, self.settings, self.protocol, self.seed = world, settings, protocol, seed
        self.link_failure, self.talks = link_failure, offline_talks
        # peers chosen per exchange (sfg.clock.peersim, one span): the run's own links
        self.peers = None if peers is None or peers.fixed else peers
        self.sampled: dict[str, Any] | None = None  # (peers: the counts and the digest)
        self.union_slot = np.zeros(0, np.int64)
        if self.peers is not None:
            from sfg.clock.peersim import check_clock

            check_clock(self.peers, settings, anatomy=anatomy, link_failure=link_failure)
        self.rg = rg = world.rg
        self.dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
        self.ptr, self.out, _ = out_slots(rg)
        self.deg = np.diff(self.ptr)
        self.plan = fault_plan(settings, world.n)
        self.nth0 = np.zeros(rg.n_slots, np.int64)  # messages sent so far per link
        self.counts = dict.fromkeys(COUNTS, 0)
        self.faulty = self.plan is not None
        self.carry = {k: np.zeros(0, v) for k, v in zip(
            _MSG, (np.int64, float, np.int64, float, bool, float), strict=True)}
        self.first = self.c0 = 0  # events and candidates of the pieces so far
        self.tally: dict[str, Any] = {"local_rounds": 0, "compute": []}  # exact, over spans
        self.since = 0.0  # the current span's start
        self.returns = Returns(world, settings, talks=offline_talks,
                               anyone=self.peers is not None)
        self.samples = curve_times(world, settings.unit)

    def _messages(self, time: np.ndarray, dev: np.ndarray, end: np.ndarray,
                  bstart: np.ndarray, loc: np.ndarray, base: int) -> dict[str, np.ndarray]:
        """The messages of the local rounds ``loc`` that reach their receiver (columns
        :data:`_MSG`), counted."""
        world, settings, rg = self.world, self.settings, self.rg
        deg, ptr = self.deg, self.ptr
        # messages: every committed local round to each neighbour, back to back
        src = np.repeat(loc, deg[dev[loc]])
        first = np.repeat(ptr[dev[loc]], deg[dev[loc]])
        k = np.arange(src.size) - np.repeat(np.cumsum(deg[dev[loc]]) - deg[dev[loc]],
                                            deg[dev[loc]])
        slot = self.out[first + k]
        tx_end = transfer_end(bstart[src], k, self.dt[dev[src]])
        sent = (tx_end <= world.horizon) if self.talks else \
            world.online.online_through(dev[src], time[src], tx_end) & (tx_end <= world.horizon)
        # message k over a link is the link's k-th, in the order its sender sends (the
        # identity its loss and faults are drawn for, as the node's network numbers them:
        # sfg.net.memory), counted on from the earlier spans
        nth = np.empty(slot.size, np.int64)
        link_counts(slot, self.nth0, nth)
        snd, rcv = rg.send[slot], rg.recv[slot]
        dropped = np.zeros(src.size, bool)
        if world.loss.any():
            dropped = transfer_lost(loss_key(self.seed, "message"), snd, rcv, nth,
                                    world.loss[slot])
        bad = np.zeros(src.size, bool)
        extra = 0.0
        c = self.counts
        if self.plan is not None:  # the faults as events of the schedule
            fcut, flost, extra, bad = self.plan.fates(snd, rcv, nth, tx_end)
            ok_sent = sent & ~dropped
            c["fault_partitioned"] += int((ok_sent & fcut).sum())
            c["fault_lost"] += int((ok_sent & flost).sum())
            c["fault_delayed"] += int((ok_sent & ~fcut & ~flost & (extra > 0)).sum())
            dropped = dropped | fcut | flost
        arrival = arrival_time(tx_end, world.latency[slot], extra)
        rx = (arrival < world.horizon) if self.talks else \
            world.online.online_at(rcv, arrival) & (arrival < world.horizon)
        if self.plan is not None:  # a flipped byte: the receiver's digest check refuses it
            c["fault_corrupted"] += int((sent & rx & ~dropped & bad).sum())
        cut = np.zeros(src.size, bool)
        if self.link_failure > 0:  # per Δ-round: a message sent while its link is down is lost
            live, delta = live_links(world, settings, self.link_failure, self.seed)
            cut = ~live[link_round(tx_end, delta, live.shape[0]), rg.edge_id[slot]]
            dropped = dropped | cut
        ok = sent & rx & ~dropped & ~bad
        c["messages_sent"] += int(sent.sum())
        c["lost_sender"] += int((~sent).sum())
        c["lost_receiver"] += int((sent & ~rx).sum())
        c["lost_random"] += int((sent & rx & dropped & ~cut).sum())
        c["lost_link"] += int((sent & rx & cut).sum())
        c["delivered"] += int(ok.sum())
        new = {"slot": slot[ok], "arr": arrival[ok], "src": src[ok] + base,
               "sent": end[src[ok]],  # a message is sent when its local round commits
               "rep": np.zeros(int(ok.sum()), bool), "off": np.zeros(int(ok.sum()))}
        return new

    def piece(self, *, time: np.ndarray, dev: np.ndarray, kind: np.ndarray,
              amount: np.ndarray, end: np.ndarray, step: np.ndarray, t: np.ndarray,
              stats: dict[str, float], until: float = np.inf,
              nsteps: np.ndarray | None = None, caps: np.ndarray | None = None,
              pull: dict[str, Any] | None = None, sent: dict[str, Any] | None = None):
        """The piece of the schedule of the events before ``until`` (all of them at or after
        the last piece's ``until``). ``stats``: the counts so far (the protocol's, local
        rounds, compute), which the piece reports with the messages' and the returns'."""
        world, settings, rg = self.world, self.settings, self.world.rg
        unit = settings.unit
        if time.size and float(time.min()) < self.since:
            raise SfgError("an event before its span: an internal error of the schedule")
        order = time_order(time, dev, kind)
        time, dev, kind, amount, end, step, t = (a[order] for a in (time, dev, kind, amount,
                                                                      end, step, t))
        bstart, closes = end, None
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        if pull is not None:
            bstart, closes = pull["bstart"][order], pull["closes"][order]
        if nsteps is not None:
            nsteps = nsteps[order]
        if caps is not None:
            caps = caps[order]
        R, base = time.shape[0], self.first
        loc_all = np.flatnonzero(kind == LOCAL)
        loc = loc_all if caps is None else loc_all[(caps[loc_all] & EV_SEND) != 0]
        new = self._messages(time, dev, end, bstart, loc, base) if self.peers is None else \
            self._peer_messages(sent, rank, end, base, until, pull)
        rg = self.rg
        c = self.counts
        if pull is not None:  # the replies: candidates like messages, older by their held
            nrep = pull["slot"].size
            new = {"slot": np.concatenate([new["slot"], pull["slot"]]),
                   "arr": np.concatenate([new["arr"], pull["arrival"]]),
                   "src": np.concatenate([new["src"], rank[pull["src"]] + base]),
                   "sent": np.concatenate([new["sent"], np.full(nrep, -np.inf)]),  # phase 2
                   "rep": np.concatenate([new["rep"], np.ones(nrep, bool)]),
                   "off": np.concatenate([new["off"], pull["held"]])}
        m = {k: np.concatenate([self.carry[k], new[k]]) for k in _MSG}
        mo = np.lexsort((m["sent"], m["arr"], m["slot"]))
        m = {k: v[mo] for k, v in m.items()}
        mptr = np.zeros(rg.n_slots + 1, np.int64)
        np.cumsum(np.bincount(m["slot"], minlength=rg.n_slots), out=mptr[1:])
        newest = np.empty(m["src"].size, np.int64)
        newest_so_far(mptr, m["src"], m["rep"], newest)
        loc = loc_all if caps is None else loc_all[(caps[loc_all] & EV_AGGREGATE) != 0]
        if self.peers is None or not WALK:
            # queries: every local round that aggregates × the receiver's incoming slots
            nin = np.diff(rg.indptr) - 1
            qn = nin[dev[loc]]
            qev = np.repeat(loc, qn)
            qk = np.arange(qev.size) - np.repeat(np.cumsum(qn) - qn, qn)
            qslot = rg.indptr[dev[qev]] + 1 + qk
            idx = np.empty(qev.size, np.int64)
            wait = np.empty(qev.size)
            held_latest(mptr, m["arr"], m["sent"], newest, m["off"], qslot, time[qev],
                        float(settings.window), unit, idx, wait)
        else:  # a device has many links, few of them recent: its messages of the window
            qev, qslot, idx, wait = _recent(rg, m, mptr, newest, loc, dev, time,
                                            float(settings.window), unit)
        got = idx >= 0
        c["candidates"] += int(got.sum())
        # candidates per event: the receiver first, then the messages held
        per = np.zeros(R, np.int64)
        per[loc_all] = 1
        per[loc] += np.bincount(qev[got], minlength=R)[loc]
        cptr = np.zeros(R + 1, np.int64)
        np.cumsum(per, out=cptr[1:])
        C = int(cptr[-1])
        cslot = np.empty(C, np.int64)
        cmsg = np.full(C, -1, np.int64)
        cwait = np.zeros(C)
        cslot[cptr[loc_all]] = rg.indptr[dev[loc_all]]
        gq = np.flatnonzero(got)
        if gq.size:
            ge = qev[gq]
            # position of each held message after its event's self entry (queries in order)
            rk = np.arange(gq.size) - np.searchsorted(ge, ge, side="left")
            at = cptr[ge] + 1 + rk
            cslot[at] = qslot[gq]
            cmsg[at] = m["src"][idx[gq]]
            cwait[at] = wait[gq]
            if (m["src"][idx[gq]] >= ge + base).any():  # a candidate made after its reader
                raise SfgError(LATER_CANDIDATE)
        self.carry = _carried(m, mptr, newest, until)
        samples = self.samples[(self.samples >= self.since) & (self.samples < until)]
        self.first += R
        self.c0 += C
        self.since = until
        self.returns.add(time, dev, kind, caps, cptr, until)
        out: dict[str, float] = {}
        if until == np.inf:  # the counts are the last piece's
            out = dict(stats)
            if self.faulty:
                out.update({k: float(c[k]) for k in COUNTS if k.startswith("fault_")})
            out.update({k: float(c[k]) for k in COUNTS[:6]})
            out["bytes_sent"] = float(c["messages_sent"] * float(settings.message_bytes or 0.0))
            out["candidates"] = float(c["candidates"])
            out.update(self.returns.counts())
            if self.peers is not None:
                out.update({k: self.sampled[k] for k in PEER_COUNTS})  # type: ignore[index]
        return Schedule(protocol=self.protocol, n=world.n, unit=unit, horizon=world.horizon,
                        time=time, dev=dev, kind=kind, t=t, amount=amount, end=end, step=step,
                        cptr=cptr, cslot=cslot, cmsg=cmsg, cwait=cwait, samples=samples,
                        stats=out, nsteps=nsteps, caps=caps,
                        pulls=None if pull is None else (bstart, closes, pull["digest"]),
                        first=base, keep=np.unique(self.carry["src"]),
                        rg=None if self.peers is None else rg,
                        peers=None if self.sampled is None else self.sampled["digest"])

    def _peer_messages(self, sent: dict[str, Any] | None, rank: np.ndarray, end: np.ndarray,
                       base: int, until: float,
                       pull: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The messages under ``peers`` that the span's local rounds sent (``sent``: the
        simulation's, columns :data:`sfg.clock.peersim.M_SEND`… by the span's events, which
        ``rank`` maps to the sorted ones; ``all``: the whole run's, ``index``: theirs among
        them): the run's graph is the union of the pairs that exchanged one over the whole
        run (a message, or a pull's reply: ``pull``'s replies get their slots in it; pull runs
        in one span), made and counted at the first span."""
        from sfg.clock import peersim as ps

        if sent is None or (pull is not None and (until != np.inf or base)):
            raise SfgError("peers chosen per exchange: an internal error of the schedule")
        if self.sampled is None:
            self._union(sent, pull)
        msg = sent["messages"]
        src = rank[msg[ps.M_EVENT].astype(np.int64)]
        slot = self.union_slot[sent["index"]]
        return {"slot": slot, "arr": msg[ps.M_ARRIVAL], "src": src + base, "sent": end[src],
                "rep": np.zeros(src.size, bool), "off": np.zeros(src.size)}

    def _union(self, sent: dict[str, Any], pull: dict[str, Any] | None) -> None:
        """The run's union graph and every message's slot in it (:meth:`_peer_messages`), the
        counts, and the digest of the messages: each by its fingerprint in the counts
        (:func:`sfg.clock.peersim.fingerprint`), and those that reached by their sending local
        round (its row in the simulation) and receiver."""
        import hashlib

        from sfg.clock import peersim as ps
        from sfg.world.peers import ENTRY_BYTES, union_links

        msg, counts = sent["all"], sent["counts"]
        s, r = msg[ps.M_SEND].astype(np.int64), msg[ps.M_RECV].astype(np.int64)
        nreached = s.size
        if pull is not None:  # the replies: from the asked device to the returning one
            s = np.concatenate([s, pull["asked"]])
            r = np.concatenate([r, pull["asks"]])
        _, self.rg, slot = union_links(self.world.n, s, r, f"peers {self.peers}")
        if pull is not None:
            pull["slot"] = slot[nreached:]
        self.union_slot = slot[:nreached]
        c = self.counts
        c["messages_sent"] += int(counts[ps.C_SENT])
        c["lost_sender"] += int(counts[ps.C_LOST_SENDER])
        c["lost_receiver"] += int(counts[ps.C_OFFLINE])
        c["lost_random"] += int(counts[ps.C_LOST_RANDOM])
        c["delivered"] += int(counts[ps.C_DELIVERED])
        h = hashlib.blake2b(digest_size=16)
        h.update(str(self.peers).encode())
        h.update(np.ascontiguousarray(counts).tobytes())
        for a in (msg[ps.M_EVENT].astype(np.int64), r[:nreached].astype(np.int32)):
            h.update(np.ascontiguousarray(a).tobytes())
        self.sampled = {"peer_messages": float(counts[ps.C_SENT]),
                        "messages_to_offline": float(counts[ps.C_OFFLINE]),
                        "membership_bytes": float(counts[ps.C_ENTRIES] * ENTRY_BYTES),
                        "digest": h.hexdigest()}


def _recent(rg, m, mptr, newest, loc, dev, time, window: float, unit: float):
    """The candidates of the local rounds ``loc`` (:func:`held_recent`) as the queries of the
    graph's links give them: (event, slot, message, waited units), by event then slot."""
    recv = rg.recv[m["slot"]]
    rptr = np.zeros(rg.n + 1, np.int64)
    np.cumsum(np.bincount(recv, minlength=rg.n), out=rptr[1:])
    # by receiver, then arrival: the messages come by slot, so by receiver already (a
    # receiver's slots are one segment); each receiver's sorted by arrival, stably
    rpos = np.empty(recv.size, np.int64)
    by_arrival(rptr, np.ascontiguousarray(m["arr"]), rpos)
    cap = max(16, 4 * loc.size)
    while True:
        out = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64),
               np.empty(cap))
        k = held_recent(rptr, rpos, np.ascontiguousarray(m["arr"][rpos]), m["arr"], m["sent"],
                        m["off"], mptr, newest, m["slot"], loc, dev[loc], time[loc], window, unit,
                        np.full(rg.n_slots, -1, np.int64), *out)
        if k >= 0:
            return tuple(a[:k] for a in out)
        cap *= 4


@njit(cache=True, nogil=True)
def by_arrival(ptr, arr, out):  # pragma: no cover - compiled
    """out[ptr[i]:ptr[i+1]]: the positions of segment i sorted by ``arr``, stably."""
    for i in range(ptr.shape[0] - 1):
        a, b = ptr[i], ptr[i + 1]
        out[a:b] = a + np.argsort(arr[a:b], kind="mergesort")


@njit(cache=True, nogil=True)
def held_recent(rptr, rpos, rarr, arr, sent, off, mptr, newest, slot, ev, ev_dev, ev_time,
                window, unit, mark, o_ev, o_slot, o_idx, o_wait):  # pragma: no cover - compiled
    """:func:`sfg.clock.schedule.held_latest` for the links that carried a message to the
    event's device within the window before it: walking back its messages by arrival (``rpos``
    [rptr[i]:rptr[i+1]], arrivals ``rarr``) while they lie within ``window`` units, each link met
    once, its newest message held (the same test as on every link: a link with no message in
    the window has no candidate). Returns the candidates' count, or −1 when the outputs are too
    short."""
    n_out = 0
    for q in range(ev.shape[0]):
        i, t = ev_dev[q], ev_time[q]
        a, b = rptr[i], rptr[i + 1]
        k = a + np.searchsorted(rarr[a:b], t, side="right") - 1
        first = n_out
        while k >= a and (t - rarr[k]) / unit <= window:
            s = slot[rpos[k]]
            k -= 1
            if mark[s] == q:
                continue
            mark[s] = q
            h = mptr[s] + held_count(arr, sent, mptr[s], mptr[s + 1], t) - 1
            if h < mptr[s]:
                continue
            h = newest[h]
            d = held_units(t, arr[h], window, unit)
            if d < 0.0:
                continue
            if n_out >= o_ev.shape[0]:
                return -1
            o_ev[n_out], o_slot[n_out], o_idx[n_out] = ev[q], s, h
            o_wait[n_out] = d + off[h] / unit
            n_out += 1
        for x in range(first + 1, n_out):  # by slot, as the links' queries come
            y = x
            while y > first and o_slot[y - 1] > o_slot[y]:
                for arr_ in (o_ev, o_slot, o_idx):
                    arr_[y - 1], arr_[y] = arr_[y], arr_[y - 1]
                o_wait[y - 1], o_wait[y] = o_wait[y], o_wait[y - 1]
                y -= 1
    return n_out


@njit(cache=True, nogil=True)
def link_counts(slot, count, nth):  # pragma: no cover - compiled
    """nth [M]: each message's number on its link (``slot``), counting on from ``count``
    [E] (the messages the link carried before), which is advanced."""
    for k in range(slot.shape[0]):
        nth[k] = count[slot[k]]
        count[slot[k]] += 1


def _carried(m: dict[str, np.ndarray], mptr: np.ndarray, newest: np.ndarray,
             until: float) -> dict[str, np.ndarray]:
    """What a later span needs of the messages ``m`` (sorted per link by arrival): per link,
    the newest of those arrived before ``until`` (every local round after it holds them all,
    :func:`sfg.clock.instant.held_at`) and every message arriving at or after it."""
    if until == np.inf:
        return {k: v[:0] for k, v in m.items()}
    later = m["arr"] >= until
    slot = m["slot"]
    # per link, the last message arrived before until: its newest so far
    before = np.flatnonzero(~later)
    last = before[np.r_[slot[before][1:] != slot[before][:-1], True]] if before.size else before
    keep = np.sort(np.concatenate([newest[last], np.flatnonzero(later)]))
    return {k: v[keep] for k, v in m.items()}


class Returns:
    """Returns in time (docs/concepts/clock.md#returns-in-time), span by span:
    ``online_returns`` (starts of online intervals after time 0; none when the anatomy mode
    keeps a device communicating while offline, ``talks``), ``online_returns_aggregated``
    (those followed by an aggregation before the device goes offline again),
    ``online_returns_heard`` (whose first aggregation holds at least one neighbour's model)
    and ``online_returns_alone`` (no neighbour online, and not cut off by a partition, at
    the return). The replay's ``returns`` and ``returns_heard`` count aggregations at age ≥ 1
    instead."""

    def __init__(self, world, settings: ClockSettings, *, talks: bool, anyone: bool = False):
        from sfg.clock.faults import Faults
        from sfg.clock.pull import returns_of

        self.world, self.anyone = world, anyone
        rptr, rtime, rend = returns_of(world)
        self.none = talks or not rtime.size
        dev = np.repeat(np.arange(world.n), np.diff(rptr))
        o = np.argsort(rtime, kind="stable")  # the returns in time order
        self.dev, self.time, self.end = dev[o], rtime[o], rend[o]
        self.next = 0
        self.wait = np.zeros(0, np.int64)  # returns still without their first aggregation
        self.faults = Faults.parse(settings.faults, seed=int(settings.faults_seed))
        self.n = dict.fromkeys(("online_returns", "online_returns_aggregated",
                                "online_returns_heard", "online_returns_alone"), 0)

    def counts(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.n.items()}

    def add(self, time, dev, kind, caps, cptr, until: float) -> None:
        """The events of one span (in the schedule's order), before ``until``."""

        if self.none:
            return
        stop = int(np.searchsorted(self.time, until, side="left"))
        new = np.arange(self.next, stop)
        self.next = stop
        self.n["online_returns"] += new.size
        self.n["online_returns_alone"] += self._alone(new)
        ret = np.concatenate([self.wait, new])
        agg = kind == LOCAL
        if caps is not None:
            agg &= (caps & EV_AGGREGATE) != 0
        ev = np.flatnonzero(agg)
        # the first aggregation at or after each return on its device: returns and
        # aggregations sorted together by (device, time, a return first), then each
        # return's next aggregation
        nr = ret.size
        if not nr:
            return
        d_all = np.concatenate([self.dev[ret], dev[ev]])
        t_all = np.concatenate([self.time[ret], time[ev]])
        is_ev = np.concatenate([np.zeros(nr, np.int64), np.ones(ev.size, np.int64)])
        o = np.lexsort((is_ev, t_all, d_all))
        pos_ev = np.where(is_ev[o] == 1, np.arange(o.size), o.size)
        nxt = np.minimum.accumulate(pos_ev[::-1])[::-1]  # the next aggregation at or after
        where = np.empty(o.size, np.int64)
        where[o] = np.arange(o.size)
        k = nxt[where[:nr]]
        kk = np.minimum(k, o.size - 1)
        same = (k < o.size) & (d_all[o[kk]] == self.dev[ret])
        first = np.where(same, ev[np.maximum(o[kk] - nr, 0)] if ev.size else -1, -1)
        cand = np.where(same, t_all[o[kk]], np.inf)
        aggregated = (first >= 0) & (cand < self.end[ret])
        heard = aggregated & (np.diff(cptr)[np.maximum(first, 0)] > 1) if ev.size else aggregated
        self.n["online_returns_aggregated"] += int(aggregated.sum())
        self.n["online_returns_heard"] += int(heard.sum())
        # still waiting: no aggregation yet, and one can still come before it goes offline
        self.wait = ret[(first < 0) & (self.end[ret] > until)]

    def _alone(self, new: np.ndarray) -> int:
        if self.anyone:  # peers chosen per exchange: no other device online at the return
            on = self.world.online
            t = self.time[new]
            up = np.searchsorted(np.sort(on.start), t, side="right") - \
                np.searchsorted(np.sort(on.end), t, side="right")
            return int((up <= 1).sum())
        rg, dev, time = self.world.rg, self.dev[new], self.time[new]
        nb = np.diff(rg.indptr) - 1
        q_ret = np.repeat(np.arange(new.size), nb[dev])
        k = np.arange(q_ret.size) - np.repeat(np.cumsum(nb[dev]) - nb[dev], nb[dev])
        slot = rg.indptr[dev[q_ret]] + 1 + k
        j = rg.send[slot]
        up = self.world.online.online_at(j, time[q_ret])
        for w in self.faults.partitions:
            up &= ~w.blocks_many(dev[q_ret], j, time[q_ret])
        return int((np.bincount(q_ret[up], minlength=new.size) == 0).sum())


def join(pieces: list) -> Any:
    """One schedule out of its pieces in time order (:meth:`Assembler.piece`): the same as
    the schedule assembled in one span."""
    p0, last = pieces[0], pieces[-1]
    cat = lambda name: np.concatenate([getattr(p, name) for p in pieces])  # noqa: E731
    offs = np.cumsum([0] + [int(p.cptr[-1]) for p in pieces])
    cptr = np.concatenate([p.cptr[:-1] + o for p, o in zip(pieces, offs[:-1], strict=True)]
                          + [np.array([offs[-1]], np.int64)])
    return Schedule(protocol=p0.protocol, n=p0.n, unit=p0.unit, horizon=p0.horizon,
                    time=cat("time"), dev=cat("dev"), kind=cat("kind"), t=cat("t"),
                    amount=cat("amount"), end=cat("end"), step=cat("step"), cptr=cptr,
                    cslot=cat("cslot"), cmsg=cat("cmsg"), cwait=cat("cwait"),
                    samples=cat("samples"), stats=last.stats,
                    nsteps=None if p0.nsteps is None else cat("nsteps"),
                    caps=None if p0.caps is None else cat("caps"), pulls=p0.pulls, rg=p0.rg,
                    peers=pieces[-1].peers)


def curve_times(world, unit: float) -> np.ndarray:
    """The times of a schedule's per-unit curves: every ``unit`` seconds from 0 to the
    horizon."""
    n_samples = int(np.floor(world.horizon / unit)) + 1
    return np.arange(n_samples, dtype=np.float64) * unit


class SpilledDigest:
    """The digest of a schedule met piece by piece (:meth:`add`, in time order), equal to
    the whole schedule's (:meth:`sfg.clock.schedule.Schedule.digest`): each column's bytes
    go to a file of a temporary directory (about 100 bytes an event), read back in order by
    :meth:`hexdigest`, so memory stays that of one piece."""

    def __init__(self, protocol: str):
        import tempfile

        self.protocol = protocol
        self.dir = tempfile.TemporaryDirectory(prefix="sfg-digest-")
        self.files: dict[str, Any] = {}
        self.c0 = 0
        self.pulls = None
        self.peers: str | None = None

    def add(self, p) -> None:
        cols = {name: getattr(p, name) for name in DIGESTED + ("nsteps", "caps")}
        cols["cptr"] = p.cptr[:-1] + self.c0
        self.c0 += int(p.cptr[-1])
        self.pulls, self.peers = p.pulls, p.peers
        for name, a in cols.items():
            if a is None:
                continue
            if name not in self.files:
                self.files[name] = open(f"{self.dir.name}/{name}", "wb")  # noqa: SIM115
            self.files[name].write(np.ascontiguousarray(a).tobytes())

    def hexdigest(self) -> str:
        from pathlib import Path

        if "cptr" not in self.files:
            self.files["cptr"] = open(f"{self.dir.name}/cptr", "wb")  # noqa: SIM115
        self.files["cptr"].write(np.array([self.c0], np.int64).tobytes())
        for f in self.files.values():
            f.close()

        def blocks(name):
            with open(Path(self.dir.name) / name, "rb") as fh:
                while block := fh.read(1 << 24):
                    yield block

        try:
            cols = {name: (blocks(name) if name in self.files else [b""])
                    for name in DIGESTED}
            for name, _ in TAGGED:
                cols[name] = blocks(name) if name in self.files else None
            return digest_of(self.protocol, cols, self.pulls, self.peers)
        finally:
            self.dir.cleanup()
