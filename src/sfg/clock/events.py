"""The events of the async and event protocols' schedules (docs/concepts/clock.md#the-virtual-clock):
the :class:`Schedule` they assemble into, what a local round holds of its neighbours'
messages (:func:`held_latest`: the phases of one instant, the window), the events' order and
the schedule's digest. Written once for the clock's engine (:mod:`sfg.clock.schedule`,
:mod:`sfg.clock.assemble`) and the networked node (:mod:`sfg.net.asyncmode`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sfg.clock.instant import Phase, instant_order
from sfg.util.numba_start import njit

LOCAL, OFFLINE = 0, 1
# a local round holds only messages sent before it starts (sfg.clock.instant.held_at): a
# candidate made at or after the local round that reads it is a fault of the schedule
LATER_CANDIDATE = ("a local round would hold a message made after it started (the phases of "
                   "one instant, docs/concepts/clock.md#one-instant): an internal error of the "
                   "schedule; please report it with the command that gave it")


@dataclass(frozen=True, eq=False)
class Schedule:
    """Events of the async or event protocol in processing order (docs/concepts/clock.md#the-virtual-clock).

    time [R] when a local round aggregates or an offline span is counted; dev [R]; kind [R]
    (:data:`LOCAL` or :data:`OFFLINE`); t [R] the receiver's round index as its rule sees it
    (⌊time/unit⌋); amount [R] an offline span's units; end [R] when a local round's K steps
    are done (its model exists); step [R] the device's local-round key (minibatch streams);
    cptr [R+1], cslot / cmsg / cwait [C]: candidates, the receiver first (cmsg −1), then the
    messages (slot, sending event, waited units); samples [S] the times of the per-unit
    curves; stats: counts; unit: seconds per staleness unit.
    """

    protocol: str
    n: int
    unit: float
    horizon: float
    time: np.ndarray
    dev: np.ndarray
    kind: np.ndarray
    t: np.ndarray
    amount: np.ndarray
    end: np.ndarray
    step: np.ndarray
    cptr: np.ndarray
    cslot: np.ndarray
    cmsg: np.ndarray
    cwait: np.ndarray
    samples: np.ndarray
    stats: dict[str, float] = field(default_factory=dict)
    nsteps: np.ndarray | None = None  # [R] local steps of each local round (K unless +catchup)
    caps: np.ndarray | None = None  # [R] capabilities (anatomy modes; None: every local round all)
    # on_return pull (sfg.clock.pull): [R] broadcast starts, [R] starts moved to a window's
    # end, and the digest of the requests and replies; None under on_return none
    pulls: tuple[np.ndarray, np.ndarray, str] | None = None
    # a piece of a schedule assembled span by span (sfg.clock.assemble): the index of its
    # first event in the whole schedule (cmsg counts in the whole), and the events before
    # its end that later pieces' candidates may still name (None: a whole schedule)
    first: int = 0
    keep: np.ndarray | None = None
    # peers chosen per exchange (docs/concepts/peers.md): the run's own links (the union of
    # the pairs that exchanged a message; None: the world's graph) and the digest of the
    # sampled messages
    rg: Any = None
    peers: str | None = None

    @property
    def n_events(self) -> int:
        return int(self.time.shape[0])

    def digest(self) -> str:
        """A digest of every event and candidate (docs/concepts/clock.md#pairing-and-the-schedule-digest: the same for every rule;
        :func:`digest_of`)."""
        cols: dict[str, Any] = {name: [np.ascontiguousarray(getattr(self, name)).tobytes()]
                                for name in DIGESTED}
        for name, _ in TAGGED:  # +catchup: the schedule of its own compute; anatomy's caps
            a = getattr(self, name)
            cols[name] = None if a is None else [np.ascontiguousarray(a).tobytes()]
        return digest_of(self.protocol, cols, self.pulls, self.peers)


@njit(cache=True, nogil=True)
def newest_so_far(ptr, sender_event, is_reply, out):  # pragma: no cover
    """Per slot, over its messages sorted by arrival (between ptr[s] and ptr[s+1]): the index
    of the newest message (the latest sending local round, ``sender_event``) among those
    arrived so far. A receiver keeps a neighbour's newest model, not its last-arrived one
    (sfg.net.node: an older message overtaken by a newer is ignored when it arrives); without
    faults that delay messages unevenly, arrival order is sending order and this is the
    identity. A reply to a pull (``is_reply``, docs/concepts/clock.md#returns-in-time) takes
    the place of the message held only when it is strictly newer."""
    for s in range(ptr.shape[0] - 1):
        best = -1
        for k in range(ptr[s], ptr[s + 1]):
            if best < 0 or sender_event[k] > sender_event[best] or \
                    (sender_event[k] == sender_event[best] and not is_reply[k]):
                best = k
            out[k] = best


@njit(cache=True, nogil=True)
def held_units(now, arrival, window, unit):  # pragma: no cover - compiled
    """Async candidate selection (docs/concepts/nodes.md#asynchronous-mode, docs/concepts/clock.md#staleness-on-the-clock), written once for the clock's engine
    (:func:`held_latest`) and the networked node (:class:`sfg.net.node.Node`): the units
    d = (now − arrival)/unit ≥ 0 that a neighbour's latest message has waited at ``now``, or
    −1.0 when it arrived more than ``window`` units ago (then it is no candidate). A
    candidate counts as older by d: :func:`sfg.round.staleness.waited`."""
    d = max(0.0, now - arrival) / unit
    return d if d <= window else -1.0


@njit(cache=True, nogil=True)
def held_count(arrival, sent, a, b, now):  # pragma: no cover - compiled
    """How many of the messages ``a:b`` (sorted by arrival, then by sending time) a local
    round starting at ``now`` holds, by :func:`sfg.clock.instant.held_at` (arrived by
    ``now``, not sent at ``now``): those that arrived before ``now``, and those arriving at
    ``now`` that were sent before it."""
    k = a + np.searchsorted(arrival[a:b], now, side="left")
    while k < b and arrival[k] == now and sent[k] < now:
        k += 1
    return k - a


@njit(cache=True, nogil=True)
def held_latest(ptr, arrival, sent, newest, offset, qslot, qtime, window, unit, out_idx,
                out_wait):  # pragma: no cover
    """For each query (slot, time): the newest message over the slot (:func:`newest_so_far`)
    among those a local round starting at that time holds (the phases of one instant,
    :func:`held_count`: arrived by then, not sent then; ``sent``: each
    message's commit, −inf for a pull's reply), if :func:`held_units` holds it a candidate
    (arrived within ``window`` units of ``unit`` seconds; index into ``arrival``, sorted per
    slot between ptr[s] and ptr[s+1] by arrival, then sending), or −1; and the units it
    waited, plus ``offset`` seconds (a reply's ``held``: its waiting started at its sending,
    docs/concepts/clock.md#returns-in-time)."""
    for q in range(qslot.shape[0]):
        s = qslot[q]
        a, b = ptr[s], ptr[s + 1]
        k = a + held_count(arrival, sent, a, b, qtime[q]) - 1
        d = -1.0
        if k >= a:
            k = newest[k]
            d = held_units(qtime[q], arrival[k], window, unit)
        if d >= 0.0:
            out_idx[q] = k
            out_wait[q] = d + offset[k] / unit
        else:
            out_idx[q] = -1
            out_wait[q] = 0.0


def time_order(time: np.ndarray, dev: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The events' order: by time, then the phase of one instant (every event of a schedule
    is a wake or a start: :attr:`~sfg.clock.instant.Phase.WAKE`), then inside it by device,
    then kind (an offline span is counted before a round), input order at full ties —
    ``np.lexsort((-kind, dev, time))`` (:func:`sfg.clock.instant.instant_order`)."""
    return instant_order(time, Phase.WAKE, dev, -kind)


# a schedule's columns in its digest, in order (Schedule.digest), then the tagged ones
DIGESTED = ("time", "dev", "kind", "t", "amount", "end", "step", "cptr", "cslot", "cmsg",
            "cwait")
TAGGED = (("nsteps", b"catchup"), ("caps", b"caps"))


def digest_of(protocol: str, columns, pulls=None, peers: str | None = None) -> str:
    """The schedule digest (docs/concepts/clock.md#pairing-and-the-schedule-digest) of
    ``columns``: name -> an iterable of byte blocks, or None for a tagged column the
    schedule lacks; ``pulls``: the pull's part (broadcast starts, moved starts, digest)."""

    h = hashlib.blake2b(digest_size=16)
    h.update(protocol.encode())
    for name in DIGESTED:
        for block in columns[name]:
            h.update(block)
    for name, tag in TAGGED:
        if columns.get(name) is not None:
            h.update(tag)
            for block in columns[name]:
                h.update(block)
    if pulls is not None:  # on_return pull: the uplinks' queues, the waits, the replies
        h.update(b"pull")
        for a in pulls[:2]:
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(pulls[2].encode())
    if peers is not None:  # peers chosen per exchange: the sampled messages
        h.update(b"peers")
        h.update(peers.encode())
    return h.hexdigest()
