"""The links of the virtual clock's world (docs/concepts/clock.md#the-world-in-time): a
message's transfer time on each uplink, each sender's outgoing slots in sending order, and the
message faults as the schedule applies them. Shared by :mod:`sfg.clock.schedule` and
:mod:`sfg.clock.pull`."""

from __future__ import annotations

from typing import Any

import numpy as np

from sfg.clock.settings import ClockSettings
from sfg.errors import SfgError
from sfg.round.slots import RoundGraph


def transfer_seconds(world: Any, nbytes: float) -> np.ndarray:
    """[N] seconds one message takes on each device's uplink."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dt = np.where(np.isinf(world.uplink) | (nbytes == 0), 0.0, nbytes / world.uplink)
    return dt


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
