"""The links of the virtual clock's world (docs/concepts/clock.md#the-world-in-time): the
one link model — a transfer's time on an uplink (:func:`transfer_time`), when back-to-back
transfers end (:func:`transfer_end`), when a transfer arrives (:func:`arrival_time`) and
whether the link's loss takes it (:func:`transfer_lost`, on the streams of
:data:`LOSS_STREAMS`) — each sender's outgoing slots in sending order, the message faults as
the schedule applies them, the link failures, and what an offline device keeps under an
anatomy mode. Shared by the clock's engine (:mod:`sfg.clock.schedule`,
:mod:`sfg.clock.pull`) and the node's in-memory network (:mod:`sfg.net.memory`), which asks
the same functions for every transfer instead of deriving them again."""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.clock.settings import ClockSettings
from sfg.errors import SfgError
from sfg.round.slots import RoundGraph
from sfg.util.rng import counter_key, counter_uniform

#: the streams of the links' loss draws, by what a transfer carries: ordinary messages, a
#: pull's requests and its replies (each its own, so that one kind's draws never move
#: another's: docs/concepts/clock.md#returns-in-time)
LOSS_STREAMS = {"message": "clock-loss", "request": "clock-pull-request",
                "reply": "clock-pull-reply"}


def loss_key(seed: int, kind: str):
    """The key of the loss draws of ``kind`` (:data:`LOSS_STREAMS`) under ``seed``."""
    return counter_key(seed, LOSS_STREAMS[kind])


def transfer_time(nbytes: float, uplink: Any) -> Any:
    """Seconds ``nbytes`` take on an uplink of ``uplink`` bytes/s (an array or one value):
    none at an infinite rate or for no bytes."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dt = np.where(np.isinf(uplink) | (nbytes == 0), 0.0, nbytes / uplink)
    return dt if np.ndim(dt) else float(dt)


def transfer_seconds(world: Any, nbytes: float) -> np.ndarray:
    """[N] seconds one message takes on each device's uplink (:func:`transfer_time`)."""
    return np.asarray(transfer_time(nbytes, world.uplink))


def transfer_end(start: Any, k: Any, seconds: Any) -> Any:
    """When the transfer at position ``k`` (from 0) of a queue that starts at ``start`` ends,
    the transfers leaving back to back, ``seconds`` each."""
    return start + (k + 1) * seconds


def arrival_time(tx_end: Any, latency: Any, extra: Any = 0.0) -> Any:
    """When a transfer that ends at ``tx_end`` arrives over a link of ``latency`` seconds,
    held back ``extra`` seconds more by a fault."""
    return tx_end + latency + extra


def transfer_lost(key: Any, snd: Any, rcv: Any, nth: Any, p: Any) -> Any:
    """Whether the link's loss takes the ``nth`` transfer (from 0, of the stream ``key``:
    :func:`loss_key`) on the link ``snd`` → ``rcv`` of loss probability ``p``: a
    counter-based draw, so the engine (all at once) and the node's network (one at a time)
    draw the same."""
    return counter_uniform(key, snd, rcv, 0, nth) < p


def out_slots(rg: RoundGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each sender's outgoing slots in the order it sends (receivers by id): (ptr [N+1],
    slots [2M], position [E] of each slot in its sender's order, −1 on self slots)."""
    nb = np.flatnonzero(~rg.is_self)
    order = nb[np.lexsort((rg.recv[nb], rg.send[nb]))]
    ptr = np.zeros(rg.n + 1, np.int64)
    np.cumsum(np.bincount(rg.send[order], minlength=rg.n), out=ptr[1:])
    pos = np.full(rg.n_slots, -1, np.int64)
    pos[order] = np.arange(order.size) - ptr[rg.send[order]]
    return ptr, order, pos


def fault_plan(settings: ClockSettings, n: int):
    """The faults of ``settings`` (``faults``, ``faults_seed``) as the clock's engine applies
    them (:meth:`sfg.clock.faults.FaultPlan.fates`), or None. Faults of the node's own timeline
    (crashes, clock drift) are the node's (``sfg swarm --clock virtual``): refused here."""
    from sfg.clock.faults import Faults

    f = Faults.parse(settings.faults, seed=int(settings.faults_seed))
    if not f.any:
        return None
    if f.crashes or f.crash_at or f.drift:
        raise SfgError("crashes and clock drift are faults of the node's own timeline; they run "
                       "on the deployable node: sfg swarm --clock virtual --faults ... (the "
                       "clock's engine takes the message faults: loss, delay, reorder, dup, "
                       "corrupt, misroute, partition)")
    return f.plan(n, period=settings.P, rounds=1)


def live_links(world: Any, settings: ClockSettings, link_failure: float, seed: int
               ) -> tuple[np.ndarray, float]:
    """The links up in each Δ-round of virtual time (docs/concepts/outages.md#link-failures,
    drawn per Δ-round as in rounds): (``live`` [T, M] over the graph's edges, Δ). A message
    (or a pull's request or reply) whose transfer ends in round ⌊end/Δ⌋ while its link is down
    is lost; times at or after the last round count in it. Without link failures: one round,
    every link up."""
    delta = float(settings.round_seconds)
    if link_failure <= 0:
        return np.ones((1, max(1, len(world.graph.edges))), bool), delta
    from sfg.world.outages.links import link_failures

    T = max(1, int(np.ceil(world.horizon / delta)))
    return link_failures(world.graph.edges, T, p=float(link_failure), seed=seed), delta


def link_round(end: np.ndarray, delta: float, T: int) -> np.ndarray:
    """The Δ-round of link failures each transfer ending at ``end`` falls in."""
    return np.minimum((end // delta).astype(np.int64), T - 1)


def offline_keeps(anatomy: str) -> int:
    """The capabilities (EV_* bits) an offline device keeps under an anatomy mode
    (docs/concepts/outages.md#anatomy-modes, :mod:`sfg.world.outages.anatomy`): 0 under
    ``full``."""
    from sfg.round.kernel import EV_AGGREGATE, EV_SEND, EV_TRAIN
    from sfg.world.outages.anatomy import capabilities

    c = capabilities(np.array([False]), anatomy)
    return ((EV_TRAIN if c.train[0] else 0) | (EV_SEND if c.send[0] else 0)
            | (EV_AGGREGATE if c.aggregate[0] else 0))
