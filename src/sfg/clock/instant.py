"""One instant (docs/concepts/clock.md#one-instant): the phases in which the events of one
virtual instant t are processed, the same in the clock's engine (:mod:`sfg.clock.schedule`,
:mod:`sfg.clock.pull`, :mod:`sfg.clock.train`) and in the node on the virtual clock
(:class:`sfg.net.simclock.VirtualLoop`, :func:`sfg.net.virtual.run_virtual_swarm`), written
once here:

1. :attr:`Phase.AVAILABILITY` — availability changes (intervals are half-open: online on
   [start, end));
2. :attr:`Phase.ARRIVAL` — arrivals of messages, pull replies and answers;
3. :attr:`Phase.PULL_END` — the ends of pull windows;
4. :attr:`Phase.WAKE` — wakes and starts of local rounds: they see every arrival of phase 2
   but nothing sent at t;
5. :attr:`Phase.COMMIT` — the ends of local rounds: commit, queue sends;
6. :attr:`Phase.EVALUATE` — evaluations, which see every commit at t.

Within a phase the order does not depend on device ids: events of one phase at one instant
do not read each other (a wake reads what arrived before it, an evaluation what was
committed), so the engine's canonical order inside a phase (by device, an offline span
before a local round of the same device: :func:`sfg.clock.schedule.time_order`) orders its
arrays (and so its digest) and changes no result.

How each part keeps the phases:

* the schedule (:func:`sfg.clock.schedule.held_latest`) holds, at a wake at t, the messages
  that arrived before t (:data:`WAKE_SIDE`): a message sent at t (phase 5) is not held by a
  wake at t (phase 4); a local round's start moved to its pull window's end (phase 3 then 4)
  holds the arrivals at that instant too (:data:`CLOSE_SIDE`);
* an evaluation at t reads each device's last local round whose K steps ended at or before
  t (:data:`EVAL_SIDE`; :meth:`sfg.clock.train.EventLoop.finished_by`), at the instants
  :func:`evaluation_instants`;
* the node on the virtual clock evaluates at the same instants at the end of the instant
  (:meth:`sfg.net.simclock.VirtualLoop.call_at_instant_end`: when nothing else is ready at t,
  no idle hook has work and before the clock moves), so after every commit at t.

Where the engine's order departs from the phases (kept, so that schedules and digests do not
change; docs/concepts/clock.md#one-instant lists them): a wake holds only what arrived
strictly before it, so a message sent before t that arrives exactly at t (a positive latency
or transfer time landing on a wake) is not held, where phase 2 would hold it; a local round's
sends (and a return's pull requests) are queued in the order of the neighbours' ids, so with a
finite uplink the order of one broadcast's transfers depends on the ids; and the simulation
of returns (:mod:`sfg.clock.pull`, its event kinds in their order at one instant: commit,
return, wake, request, window) answers a request arriving at t with a local round that ends
at t, and ends a window after the wakes of its instant.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Phase(IntEnum):
    """The phases of one instant, in the order they are processed (see the module docstring)."""

    AVAILABILITY = 1
    ARRIVAL = 2
    PULL_END = 3
    WAKE = 4
    COMMIT = 5
    EVALUATE = 6


#: a wake at t holds the messages that arrived before t (``np.searchsorted`` side over the
#: arrival times): what is sent at t (phase 5) comes after the wakes at t (phase 4)
WAKE_SIDE = "left"
#: a start moved to its pull window's end (phase 3, then 4) holds the arrivals at that instant
CLOSE_SIDE = "right"
#: an evaluation at t (phase 6) sees every local round whose K steps ended at or before t
EVAL_SIDE = "right"


def instant_order(time: np.ndarray, phase: np.ndarray | int, *keys: np.ndarray) -> np.ndarray:
    """The order of events by time, then :class:`Phase`, then ``keys`` (most significant
    first: a canonical order inside a phase), the input order at full ties. Computed as a
    stable sort by time (fast on the nearly sorted times the simulations make) refined within
    the groups of equal times only."""
    time = np.asarray(time)
    o = np.argsort(time, kind="stable")
    ts = time[o]
    new = np.ones(o.size, bool)
    new[1:] = ts[1:] != ts[:-1]
    if new.all():
        return o
    g = np.cumsum(new) - 1
    idx = np.flatnonzero(np.bincount(g)[g] > 1)  # positions in a group of equal times
    sub = o[idx]
    ph = np.broadcast_to(np.asarray(phase, np.int64), time.shape)
    cols = [k[sub] for k in reversed(keys)]
    o[idx] = sub[np.lexsort((*cols, ph[sub], g[idx]))]
    return o


def evaluation_instants(horizon: float, every: float) -> np.ndarray:
    """The instants of the evaluations (docs/concepts/clock.md#metrics): k·every
    for k = 1, 2, … up to the horizon, and the horizon itself when it is not one of them."""
    te = np.arange(every, horizon + 1e-9 * every, every)
    if te.size == 0 or te[-1] < horizon - 1e-9 * every:
        te = np.append(te, horizon)
    return te


def eval_every_seconds(eval_seconds: float | None, eval_every: int,
                       round_seconds: float) -> float:
    """Seconds between evaluations: ``eval_seconds``, or ``eval_every`` rounds of Δ =
    ``round_seconds`` (the node's period on the virtual clock)."""
    return float(eval_seconds) if eval_seconds else float(eval_every) * float(round_seconds)
