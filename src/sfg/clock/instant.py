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

* what a local round starting at t holds is one rule, :func:`held_at` (arrived at or before
  t, sent before t), counted by the schedule over each link's messages sorted by arrival
  (:func:`sfg.clock.schedule.held_latest`);
* the simulation of returns (:mod:`sfg.clock.pull`) processes an instant's events in the
  phases: returns, requests arriving, windows' ends, local rounds' ends, wakes (a device is
  busy on [start, end) of its local round and broadcast, so a wake at the instant they end
  finds it free; what is sent at t is still held by no local round starting at t);
* an evaluation at t reads each device's last local round whose K steps ended at or before
  t (:data:`EVAL_SIDE`; :meth:`sfg.clock.train.EventLoop.finished_by`), at the instants
  :func:`evaluation_instants`;
* the node on the virtual clock runs an instant's timers first (messages and answers
  arriving, time-outs, returns), then its wakes (:attr:`Phase.WAKE`), its local rounds' ends
  (:attr:`Phase.COMMIT`) and its evaluations (:attr:`Phase.EVALUATE`), each phase's callbacks
  together (:meth:`sfg.net.simclock.VirtualLoop.call_at_phase`).

A broadcast's transfers (and a return's pull requests) leave back to back in the order of
the neighbours' ids, and requests arriving at one device at one instant are answered in the
order of the asking devices' ids: orders on one uplink, not events of one instant
(docs/concepts/clock.md#one-instant).
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


#: an evaluation at t (phase 6) sees every local round whose K steps ended at or before t
EVAL_SIDE = "right"


def held_at(now: float, arrival: float, sent: float) -> bool:
    """Whether a local round starting at ``now`` (phase 4) holds a message that arrives at
    ``arrival`` and was sent at ``sent`` (its local round's commit; −inf for a pull's reply,
    answered in phase 2): every arrival up to ``now`` (phase 2 comes first), but nothing sent
    at ``now`` (phase 5 comes after) — ``arrival <= now and sent < now``. The one rule of both
    the clock's engine (:func:`sfg.clock.schedule.held_count`, over sorted arrays) and the
    node on the clock (:mod:`sfg.net.simclock`: its wakes run after the instant's arrivals
    and before its commits)."""
    return arrival <= now and sent < now


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
