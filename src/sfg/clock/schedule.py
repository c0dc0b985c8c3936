"""The schedule: who acts when on the virtual clock (docs/concepts/clock.md#the-virtual-clock), model-free and
rule-independent.

A :class:`World` is one seed's world in time: the graph, every device's online intervals,
compute time per local step, uplink rate, and every directed link's latency and loss. From it
and the :class:`~sfg.clock.settings.ClockSettings` the protocols fix everything that happens
before any rule is consulted:

* ``lockstep`` (:func:`lockstep_rounds`): global rounds [rΔ, (r+1)Δ). Device i takes part in
  round r when it is online from rΔ until it has sent its start-of-round model to each of
  its neighbours (back to back on its uplink, k·bytes/uplink) and trained K steps
  (K·c_i), all by (r+1)Δ; otherwise it is a straggler and counts as unavailable (docs/concepts/clock.md#the-three-protocols).
  The message of j reaches i when both take part, it arrives (its transfer end plus the
  link's latency) while i is online and early enough for i to train K steps by the deadline,
  and it is not lost; a message that arrives later is *late*. The result is the round-based
  availability [T, N] and the per-slot deliveries [T, E] that the round (docs/concepts/round.md#one-round) runs on, so
  every rule, modifier, anatomy mode, defence and attack runs there unchanged; with zero
  compute time, latency and transfer time it is exactly ``sfg run``'s availability.
* ``async`` (:func:`async_schedule`): device i wakes at rP + jitter_ir (jitter uniform in
  [0, jitter·P), stream ``clock-jitter`` keyed by the seed). An offline wake adds one unit to
  its age and lag; a wake while it is still busy is skipped; otherwise it starts a local
  round: aggregate at the wake, train K·c_i seconds, then send to every neighbour (in the
  order of their ids, back to back). Busy lasts until the last transfer ends (or the device
  goes offline). Under an anatomy mode (docs/concepts/outages.md#anatomy-modes) an offline wake is a local round of what
  the mode keeps (``Schedule.caps``; see :func:`async_schedule`).
* ``event`` (:func:`event_schedule`): no timer; an online, idle device starts a local round at
  once and starts the next one as soon as its sends are done. Offline time adds
  (offline seconds)/Δ to its lag and ⌊offline seconds/Δ⌋ to its age when it comes back.
  Under an anatomy mode an offline device keeps the pace of what it still does (training
  back to back, or ticks one Δ apart when it cannot train; see :func:`event_schedule`).

The async and event protocols are written once, as one time-ordered simulation
(:mod:`sfg.clock.pull`, with ``on_return`` pull or none); this module checks their settings
and assembles what it makes (messages, candidates, counts). tests/reference_schedules.py
writes them a second way, vectorised per wake over all devices, as the reference the
simulation is checked against event by event.

Shared rules of time (docs/concepts/clock.md#the-world-in-time): a local round that the device cannot finish online (it
goes offline, or the run ends, before its K steps are done) is *interrupted*: discarded,
nothing sent, state unchanged (its wake then adds nothing). A message is lost when its sender
goes offline before its transfer ends, when the receiver is offline at its arrival, or with
the link's loss probability (stream ``clock-loss``). Events at one instant are processed in the
phases of :mod:`sfg.clock.instant` (docs/concepts/clock.md#one-instant): a message sent at t is
not yet held by a receiver that aggregates at t.
A receiver aggregates itself and, per neighbour, the latest message held, if it arrived
within the last W units; it waited d = (now − arrival)/unit units.

The result (:class:`Schedule`) lists the events in the order the staleness runs through them
(time, then device, an offline span before a local round), each local round with its candidates (the receiver first, then the
messages: slot, sending local round, waited units), plus the counts of what happened and a
digest (:func:`Schedule.digest`). Nothing in it depends on the rule (docs/concepts/clock.md#pairing-and-the-schedule-digest).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sfg.clock.events import (  # noqa: F401 - the schedule's events, here as they were
    LATER_CANDIDATE,
    LOCAL,
    OFFLINE,
    Schedule,
    held_count,
    held_latest,
    held_units,
    newest_so_far,
    time_order,
)
from sfg.clock.links import (
    arrival_time,
    fault_plan,
    loss_key,
    offline_keeps,
    out_slots,
    transfer_end,
    transfer_lost,
    transfer_seconds,
)
from sfg.clock.settings import ClockSettings
from sfg.errors import SfgError
from sfg.round.kernel import EV_TRAIN
from sfg.round.slots import RoundGraph
from sfg.util.numba_start import njit

# the most local rounds a schedule may hold (memory: about 100 bytes each, plus candidates)
MAX_EVENTS = 30_000_000
# the most a model-free replay runs through in pieces (time: about 3 µs each)
MAX_STREAMED = 500_000_000


@dataclass(frozen=True, eq=False)
class World:
    """One seed's world in time (docs/concepts/clock.md#the-world-in-time).

    graph: the graph; rg: its round slots; online: :class:`sfg.world.timeline.Intervals` [N];
    available: bool[T, N] the round-based process as ``sfg run`` samples it (the reference);
    compute [N] seconds per local step; uplink [N] bytes/s (inf: instant); latency [E] and
    loss [E] per slot (the directed link send → recv; 0 on self slots); horizon = T·Δ.
    """

    graph: Any
    rg: RoundGraph
    online: Any
    available: np.ndarray
    compute: np.ndarray
    uplink: np.ndarray
    latency: np.ndarray
    loss: np.ndarray
    horizon: float
    device_ids: list[str] | None = None

    @property
    def n(self) -> int:
        return self.rg.n


def slot_direction(rg: RoundGraph, edges: np.ndarray) -> np.ndarray:
    """[E] index of each slot's direction in ``sfg.world.devices.link_quantity``'s order
    (edges[:, 0] → edges[:, 1] for all M, then the reverse); −1 on self slots."""
    m = np.asarray(edges).reshape(-1, 2).shape[0]
    eid = rg.edge_id
    out = np.full(rg.n_slots, -1, np.int64)
    nb = eid >= 0
    fwd = np.asarray(edges)[eid[nb], 0] == rg.send[nb]
    out[nb] = np.where(fwd, eid[nb], m + eid[nb])
    return out


def make_world(settings: ClockSettings, *, process: str, graph: str, n: int, rounds: int,
               seed: int) -> World:
    """The world of one seed: graph and trace as the round-based run draws them (same
    devices on the same nodes), availability as online intervals at the trace's own
    resolution, devices' and links' quantities from their own streams (docs/concepts/clock.md#the-world-in-time)."""
    from sfg.world.devices import device_quantity, link_quantity
    from sfg.world.graphs import make_graph
    from sfg.world.outages import make_process
    from sfg.world.timeline import make_intervals

    g = make_graph(graph, n, seed=seed)
    online, available = make_intervals(process, rounds, n, seed=seed, positions=g.positions,
                                       round_seconds=settings.round_seconds)
    proc = make_process(process)
    ids = proc.device_ids(n, seed=seed) if hasattr(proc, "device_ids") else None
    rg = RoundGraph.from_graph(g)
    direction = slot_direction(rg, g.edges)
    nb = direction >= 0

    def per_slot(kind: str, spec: str) -> np.ndarray:
        vals = link_quantity(kind, spec, g.edges, seed=seed)
        out = np.zeros(rg.n_slots)
        out[nb] = vals[direction[nb]]
        return out

    return World(graph=g, rg=rg, online=online, available=np.asarray(available, bool),
                 compute=device_quantity("compute", settings.compute, n, seed=seed,
                                         device_ids=ids),
                 uplink=device_quantity("uplink", settings.uplink, n, seed=seed, device_ids=ids),
                 latency=per_slot("latency", settings.latency),
                 loss=per_slot("loss", settings.loss),
                 horizon=float(rounds) * settings.round_seconds, device_ids=ids)


# ----------------------------------------------------------------------------- lockstep
@dataclass(frozen=True, eq=False)
class Rounds:
    """Lockstep on the clock: the round-based inputs of docs/concepts/round.md#one-round.

    available: bool[T, N] participants (online through their sends and K steps, by the
    deadline); live: bool[T, E] per slot, whether the message over it was delivered in time
    (None when every message of two participants is: the round's own candidate sets);
    stats: counts (stragglers, late, lost); digest of the schedule."""

    available: np.ndarray
    live: np.ndarray | None
    stats: dict[str, float]
    digest: str


def participation(world: World, settings: ClockSettings, *, local_steps: int, rounds: int,
                  sends: np.ndarray) -> tuple[np.ndarray, ...]:
    """Lockstep's participants: device i takes part in round r when it is online from rΔ
    until its ``sends`` [N] transfers and its K steps are done, by (r+1)Δ. Returns (round
    starts [T, 1], participants [T, N], online at the start [T, N], K steps' seconds [N],
    transfer seconds [N])."""
    n, T = world.n, int(rounds)
    delta = float(settings.round_seconds)
    dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
    train = local_steps * world.compute
    start = (np.arange(T, dtype=np.float64) * delta)[:, None]
    finish = start + (sends * dt + train)[None, :]
    dev = np.broadcast_to(np.arange(n), (T, n))
    online0 = world.online.online_at(dev.ravel(), np.broadcast_to(start, (T, n)).ravel()
                                     ).reshape(T, n)
    part = (world.online.online_through(dev.ravel(), np.broadcast_to(start, (T, n)).ravel(),
                                        finish.ravel()).reshape(T, n)
            & (finish <= start + delta))
    return start, part, online0, train, dt


def lockstep_rounds(world: World, settings: ClockSettings, *, local_steps: int, rounds: int,
                    seed: int) -> Rounds:
    """The lockstep protocol's participants and deliveries (see the module docstring)."""
    if fault_plan(settings, world.n) is not None:
        raise SfgError("--faults run on the async and event protocols; in lockstep the node "
                       "recovers a faulty message by pulling it again (sfg swarm --clock virtual "
                       "--mode lockstep --faults ...), and lost messages on the clock's lockstep "
                       "are --loss")
    if settings.pull_timeout is not None:
        from sfg.clock.settings import REFUSE_LOCKSTEP_PULL

        raise SfgError(REFUSE_LOCKSTEP_PULL)
    rg, T = world.rg, int(rounds)
    delta = float(settings.round_seconds)
    ptr, _, pos = out_slots(rg)
    start, part, online0, train, dt = participation(world, settings, local_steps=local_steps,
                                                    rounds=T, sends=np.diff(ptr))
    nb = ~rg.is_self
    s_nb = np.flatnonzero(nb)
    j, i = rg.send[s_nb], rg.recv[s_nb]
    both = part[:, j] & part[:, i]
    trivial = (not dt.any()) and (not world.latency.any()) and (not world.loss.any())
    live = None
    late = lost = 0
    if not trivial:
        arrival = arrival_time(transfer_end(start, pos[s_nb][None, :], dt[j][None, :]),
                               world.latency[s_nb][None, :])
        in_time = arrival <= start + delta - train[i][None, :]
        rx = world.online.online_at(np.broadcast_to(i, arrival.shape).ravel(),
                                    arrival.ravel()).reshape(arrival.shape)
        # the message of round r over a link is that link's message r (counter-based draws,
        # as the node's network makes them: sfg.net.memory)
        dropped = transfer_lost(loss_key(seed, "message"), j[None, :], i[None, :],
                                np.arange(T)[:, None], world.loss[s_nb][None, :])
        ok = both & in_time & rx & ~dropped
        late = int(np.count_nonzero(both & ~in_time))
        lost = int(np.count_nonzero(both & in_time & ~(rx & ~dropped)))
        live = np.ones((T, rg.n_slots), bool)
        live[:, s_nb] = ok | ~both  # non-participants are excluded by the round itself
    stats = {"participations": float(part.sum()), "stragglers": float((online0 & ~part).sum()),
             "late": float(late), "lost": float(lost),
             "messages_sent": float(both.sum()),
             "compute_seconds": float((part * train[None, :] * 1.0).sum()),
             "bytes_sent": float(both.sum() * float(settings.message_bytes or 0.0))}
    h = hashlib.blake2b(digest_size=16)
    h.update(b"lockstep")
    h.update(np.ascontiguousarray(part).tobytes())
    if live is not None:
        h.update(np.ascontiguousarray(live).tobytes())
    return Rounds(available=part, live=live, stats=stats, digest=h.hexdigest())


def directed(rg: RoundGraph) -> RoundGraph:
    """``rg`` with one link id per slot (``live`` then given per slot, [E]): for lockstep's
    deliveries, which are per direction."""
    from dataclasses import replace

    return replace(rg, edge_id=np.where(rg.is_self, -1, np.arange(rg.n_slots)))


def per_slot_live(rg: RoundGraph, delivered: np.ndarray, links: np.ndarray | None) -> np.ndarray:
    """bool[T, E] per slot: the lockstep deliveries, and the link failures of docs/concepts/outages.md#link-failures
    (``links`` [T, M] per undirected edge, or None), for a :func:`directed` round graph."""
    out = np.ascontiguousarray(delivered, bool).copy()
    if links is not None:
        nb = ~rg.is_self
        out[:, nb] &= np.asarray(links, bool)[:, rg.edge_id[nb]]
    return out


def finish_schedule(world: World, settings: ClockSettings, protocol: str,
            parts: list[tuple[np.ndarray, ...]], steps_of: list[np.ndarray], *, seed: int,
            catchup: bool, link_failure: float, stats: dict[str, float],
            caps_of: list[np.ndarray] | None = None, offline_talks: bool = False,
            pull: dict[str, Any] | None = None, assembler=None,
            until: float = np.inf, sent: dict[str, Any] | None = None) -> Schedule:
    """A protocol's events, gathered in the order they were made (parts of (time, dev, kind,
    amount, end, step, t) and each event's local steps), counted (local rounds,
    compute-seconds, after the protocol's own ``stats``) and assembled
    (:class:`sfg.clock.assemble.Assembler`: one span, or the span of ``assembler`` that
    ends at ``until``)."""
    from sfg.clock.assemble import Assembler

    if assembler is None:
        assembler = Assembler(world, settings, protocol, seed=seed, link_failure=link_failure,
                              offline_talks=offline_talks)
    cols = [np.concatenate([p[k] for p in parts]) if parts else np.zeros(0) for k in range(7)]
    time, dev, kind, amount, end, step, t = cols
    dev = dev.astype(np.int64)
    kind = kind.astype(np.int64)
    nsteps = np.concatenate(steps_of) if steps_of else np.zeros(0, np.int64)
    loc = kind == LOCAL
    # local rounds and compute-seconds (exactly rounded: the order the events were made in,
    # and the spans, do not matter)
    got = assembler.tally
    got["local_rounds"] += int(np.count_nonzero(loc))
    got["compute"].extend(exact_parts((nsteps[loc] * world.compute[dev[loc]]).tolist()))
    stats = {**stats, "local_rounds": float(got["local_rounds"]),
             "compute_seconds": math.fsum(got["compute"])}
    return assembler.piece(time=time.astype(np.float64), dev=dev, kind=kind, amount=amount,
                           end=end, step=step.astype(np.int64), t=t.astype(np.int64),
                           stats=stats, until=until,
                           nsteps=nsteps if (catchup or caps_of is not None) else None,
                           caps=None if caps_of is None else
                           np.concatenate(caps_of).astype(np.int64), pull=pull, sent=sent)


def exact_parts(values: list[float]) -> list[float]:
    """Floats whose exact sum is the exact sum of ``values`` (a few: math.fsum's rounded sum,
    then what it left out, and so on), so that math.fsum over the parts of several lists is
    math.fsum over all their values."""
    out: list[float] = []
    for _ in range(64):  # each part takes 53 more bits of the exact sum
        r = math.fsum(values + [-p for p in out])
        if r == 0.0:
            break
        out.append(r)
    return out


def _check_budget(n_events: float, what: str, every: int | None = None) -> None:
    """A schedule held whole holds at most :data:`MAX_EVENTS` events; one made in pieces
    (``every``) holds one piece at a time, and runs at most :data:`MAX_STREAMED` (time)."""
    limit = MAX_EVENTS if every is None else MAX_STREAMED
    if n_events > limit:
        raise SfgError(f"the {what} would hold about {n_events:.3g} local rounds, more than "
                       f"the limit of {limit:.3g}; use fewer clients or rounds, or "
                       "longer local rounds (--compute, --uplink)")


def check_event(world: World, settings: ClockSettings, *, local_steps: int,
                anatomy: str, every: int | None = None) -> None:
    """The event protocol's refusals: a local round that takes no time (it would never
    stop), an offline device trained alone with no compute time, and a schedule over the
    budget of local rounds (:data:`MAX_EVENTS`)."""
    n, delta = world.n, float(settings.round_seconds)
    keeps = offline_keeps(anatomy)
    trains_off = bool(keeps & EV_TRAIN)
    ticks_off = bool(keeps) and not trains_off
    train = local_steps * world.compute
    dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
    deg = np.diff(out_slots(world.rg)[0])
    dur = train + deg * dt
    if n and float(dur.min()) <= 0.0:
        i = int(np.argmin(dur))
        raise SfgError(f"the event protocol starts a device's next local round as soon as the "
                       f"last one is done; device {i}'s takes no time (compute 0 and instant "
                       "transfers), so it would never stop: give --compute a positive time "
                       "(e.g. const:value=1) or a finite --uplink with --message-bytes")
    if trains_off and n and float(train.min()) <= 0.0:
        i = int(np.argmin(train))
        raise SfgError(f"under anatomy {anatomy!r} an offline device trains alone, one local "
                       f"round after the other; device {i}'s K steps take no time (compute 0), "
                       "so it would never stop: give --compute a positive time "
                       "(e.g. const:value=1)")
    on_s = world.online.online_seconds()
    est = float((on_s / np.maximum(dur, 1e-300)).sum())
    off_s = np.maximum(world.horizon - on_s, 0.0)
    if trains_off:
        est += float((off_s / np.maximum(train, 1e-300)).sum())
    elif ticks_off:
        est += float(off_s.sum()) / delta
    _check_budget(est, "event schedule", every)


def _simulated(world: World, settings: ClockSettings, protocol: str, *, local_steps: int,
               seed: int, catchup: bool, link_failure: float, anatomy: str,
               stats: dict[str, float] | None = None, every: int | None = None,
               peers=None):
    """The async or event protocol's schedule, from the one time-ordered simulation of the
    protocols (:func:`sfg.clock.pull.protocol_spans`, ``on_return`` pull or none),
    assembled: one :class:`Schedule` (``every`` None), or its pieces, one per ``every``
    units of time (a generator; :mod:`sfg.clock.assemble`)."""
    from sfg.clock.assemble import Assembler
    from sfg.clock.pull import protocol_spans

    def pieces():
        asm = None
        for until, parts, steps_of, st, pull, caps_of, talks, sent in protocol_spans(
                world, settings, protocol, local_steps=local_steps, seed=seed,
                catchup=catchup, link_failure=link_failure, anatomy=anatomy, stats=stats,
                every=every, peers=peers):
            if asm is None:
                asm = Assembler(world, settings, protocol, seed=seed,
                                link_failure=link_failure, offline_talks=talks,
                                peers=peers, anatomy=anatomy)
            yield finish_schedule(world, settings, protocol, parts, steps_of, seed=seed,
                                  catchup=catchup, link_failure=link_failure, stats=st,
                                  pull=pull, caps_of=caps_of, offline_talks=talks,
                                  assembler=asm, until=until, sent=sent)

    return pieces() if every is not None else next(pieces())


def check_period(train: np.ndarray, P: float) -> None:
    """Async: the period must be longer than the fastest device's K local steps (``train``,
    [N] seconds), else every device would skip every wake after its first (the clock's
    engine and the node under the virtual clock, :mod:`sfg.net.virtual`, both refuse it)."""
    if train.size and float(train.min()) >= P:
        raise SfgError(f"the period P = {P:g} s is not longer than the fastest device's K "
                       f"local steps ({float(train.min()):g} s): every device would still be "
                       "busy at its next wake and skip it; raise --period or lower --compute")


def async_schedule(world: World, settings: ClockSettings, *, local_steps: int,
                   seed: int, catchup: bool = False, link_failure: float = 0.0,
                   anatomy: str = "full", every: int | None = None, peers=None):
    """The async protocol's schedule (see the module docstring). ``catchup``: local rounds
    of returning devices take ``+catchup``'s steps (the schedule then depends on that rule,
    which says so: docs/concepts/clock.md#pairing-and-the-schedule-digest); ``link_failure``: the per-round link failures of docs/concepts/outages.md#link-failures, per
    Δ-round of virtual time. ``anatomy`` (docs/concepts/outages.md#anatomy-modes): what an offline wake still does —
    ``cannot-communicate`` trains K steps alone (no candidates, nothing sent),
    ``cannot-train-shares`` sends its model as it is, ``cannot-train-adopts`` aggregates what
    it holds, adopts it untrained and sends it; under the last two a device keeps
    communicating while offline (its messages leave and arrive whatever its availability). A
    wake while still busy is skipped, as online."""
    n, P = world.n, settings.P
    check_period(local_steps * world.compute, P)
    wakes = int(np.ceil(world.horizon / P))
    _check_budget(float(n) * wakes, "async schedule", every)
    return _simulated(world, settings, "async", local_steps=local_steps, seed=seed,
                      catchup=catchup, link_failure=link_failure, anatomy=anatomy,
                      stats={"wakes": float(n * wakes)}, every=every, peers=peers)


def event_schedule(world: World, settings: ClockSettings, *, local_steps: int,
                   seed: int, catchup: bool = False, link_failure: float = 0.0,
                   anatomy: str = "full", every: int | None = None, peers=None):
    """The event protocol's schedule (see the module docstring; ``catchup`` and
    ``link_failure`` as for :func:`async_schedule`).

    ``anatomy`` (docs/concepts/outages.md#anatomy-modes): what an offline device still does. The event protocol has no
    timer, so an offline device keeps the pace of what it still does:

    * ``cannot-communicate`` trains alone, back to back, as it does online: a local round of
      K·c_i seconds from the moment it goes offline (or its sends end), then the next, with no
      candidates and nothing sent; age stays 0. A local round running when it comes back is
      finished first; one that would end after the run is unfinished. Every device then needs
      a positive compute time.
    * ``cannot-train-shares`` and ``cannot-train-adopts`` do not train, so no compute paces
      them: they act on *ticks* one Δ apart from the moment the device went offline (each
      tick one staleness unit: the untrained round's + 1), sending their model back to back as
      online (``shares``) or aggregating what they hold, adopting it untrained and sending it
      (``adopts``). A tick while the uplink is still busy with the last sends (a broadcast of
      s_i = k·transfer seconds takes every ⌈s_i/Δ⌉-th tick) or with the sends of the local
      round it went offline in is an offline span of one unit. Back online at t, the part of
      a unit since the last tick is an offline span ((t − tick)/Δ lag, its floor age), so the
      offline time counts exactly as under ``full``. Their messages leave and arrive whatever
      the availability, as under async."""
    check_event(world, settings, local_steps=local_steps, anatomy=anatomy, every=every)
    return _simulated(world, settings, "event", local_steps=local_steps, seed=seed,
                      catchup=catchup, link_failure=link_failure, anatomy=anatomy,
                      every=every, peers=peers)


@njit(cache=True, nogil=True)
def _levels(kind, dev, cptr, cmsg, n):  # pragma: no cover - compiled
    """Level of every local round (1 + the levels of the models it reads: its device's
    previous local round, or the initial model at level 0, and its messages' senders), and
    each local round's previous local round on its device (−1: the initial model)."""
    R = kind.shape[0]
    level = np.zeros(R, np.int64)
    prev = np.full(R, -1, np.int64)
    last = np.full(n, -1, np.int64)
    for r in range(R):
        if kind[r] != 0:
            continue
        i = dev[r]
        p = last[i]
        prev[r] = p
        lv = level[p] if p >= 0 else 0
        for c in range(cptr[r] + 1, cptr[r + 1]):
            m = cmsg[c]
            if level[m] > lv:
                lv = level[m]
        level[r] = lv + 1
        last[i] = r
    return level, prev


@njit(cache=True, nogil=True)
def _offline_levels(kind, dev, level, n, end_level):  # pragma: no cover - compiled
    """The level of every offline span: that of its device's next local round (it must be
    counted before that round reads the state), or ``end_level`` after its last one."""
    R = kind.shape[0]
    out = np.full(R, -1, np.int64)
    nxt = np.full(n, end_level, np.int64)
    for r in range(R - 1, -1, -1):
        if kind[r] == 0:
            nxt[dev[r]] = level[r]
        else:
            out[r] = nxt[dev[r]]
    return out


def level_candidates(sched: Schedule, ev: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates of the local rounds ``ev``: their indices ``cidx`` into the schedule's
    candidate arrays, ``row`` [C] the local round (0..len(ev)−1) each belongs to, and
    ``first`` [len(ev)] the position of each local round's own entry."""
    lens = sched.cptr[ev + 1] - sched.cptr[ev]
    first = np.cumsum(lens) - lens
    row = np.repeat(np.arange(ev.size), lens)
    cidx = np.repeat(sched.cptr[ev], lens) + (np.arange(row.size) - first[row])
    return cidx.astype(np.int64), row, first


def dependency_levels(sched: Schedule, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``level`` [R] of every local round (1 + the levels of the models it reads: its
    device's previous local round, or the initial model at level 0, and its messages'
    senders) and ``prev`` [R] each local round's previous local round on its device (−1: the
    initial model)."""
    return _levels(sched.kind, sched.dev, sched.cptr, sched.cmsg, n)


def level_plan(sched: Schedule, n: int) -> dict[str, Any]:
    """The schedule's dependency levels (for rules whose scores are computed between the
    levels, :mod:`sfg.clock.train`, :mod:`sfg.clock.missed`): ``level`` [R] of the local
    rounds and ``prev`` [R] (each one's previous local round on its device, −1: none),
    ``n_levels``, and per level L = 1..n_levels+1 the local rounds ``local(L)`` and the
    offline spans ``offline(L)`` to count before them (those after a device's last local
    round: level n_levels + 1), each in time order."""
    level, prev = dependency_levels(sched, n)
    loc = np.flatnonzero(sched.kind == LOCAL)
    n_levels = int(level[loc].max()) if loc.size else 0
    by_level = loc[np.argsort(level[loc], kind="stable")]
    bounds = np.searchsorted(level[by_level], np.arange(1, n_levels + 3))
    off_level = _offline_levels(sched.kind, sched.dev, level, n, n_levels + 1)
    offline = np.flatnonzero(sched.kind != LOCAL)
    offline = offline[np.argsort(off_level[offline], kind="stable")]
    off_bounds = np.searchsorted(off_level[offline], np.arange(1, n_levels + 3))
    return {"level": level, "prev": prev, "n_levels": n_levels,
            "local": lambda L: by_level[bounds[L - 1]:bounds[L]],
            "offline": lambda L: offline[off_bounds[L - 1]:off_bounds[L]]}


def make_schedule(world: World, settings: ClockSettings, *, local_steps: int,
                  seed: int, catchup: bool = False, link_failure: float = 0.0,
                  anatomy: str = "full", every: int | None = None, peers=None):
    """The async or event protocol's :class:`Schedule` (``catchup``, ``link_failure``,
    ``anatomy``: see :func:`async_schedule` and :func:`event_schedule`); with ``every``, its
    pieces one per ``every`` units of time (:mod:`sfg.clock.assemble`); ``peers``
    (:class:`sfg.world.peers.Peers`, None: fixed): whom each local round sends to
    (:mod:`sfg.clock.peersim`; one piece)."""
    kw = {"local_steps": local_steps, "seed": seed, "catchup": catchup,
          "link_failure": link_failure, "every": every, "peers": peers}
    if settings.protocol == "async":
        return async_schedule(world, settings, anatomy=anatomy, **kw)  # type: ignore[arg-type]
    if settings.protocol == "event":
        return event_schedule(world, settings, anatomy=anatomy, **kw)  # type: ignore[arg-type]
    raise SfgError(f"protocol {settings.protocol!r} has no event schedule (lockstep runs in rounds)")
