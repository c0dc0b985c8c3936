"""The asynchronous protocol of a node (docs/concepts/nodes.md#asynchronous-mode).

Node i's round r starts at ``t0 + r·P + jitter`` on its own clock (jitter uniform in
[0, jitter·P), keyed by (seed, i, r): :meth:`sfg.net.node.Node.wake_times`). Availability is
row r of the trace. An available node takes as candidates itself and every neighbour whose
latest message arrived within the last W periods (:func:`candidates`); a message that waited
d = (now − arrival)/P periods is used with age τ_j + ⌊d⌋ and lag ℓ_j + d (counts unchanged,
:func:`waited`) — the clock's engine's own selection (:func:`sfg.clock.schedule.held_units`,
:func:`sfg.round.staleness.waited`). It aggregates with those scalars
(:func:`sfg.net.localround.aggregate`), sets its lag to the weighted mean of the lags as used,
trains (age 0, counts + 1) and sends to all neighbours (under ``peers`` other than fixed: to
the S targets it draws at the commit, :mod:`sfg.net.membership`, and every other device is
a candidate). An unavailable node neither trains,
sends nor answers (its server refuses deliveries); each of its rounds adds 1 to its age and
lag. q̂_ij is updated with "j is a candidate" as the event. Timestamps are the receiver's own
clock only. At a return, with ``on_return: pull``, the first local round waits for the pull's
window (:mod:`sfg.net.returns`).

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import numpy as np

from sfg.clock.events import held_units
from sfg.net import outgoing, persist, returns
from sfg.net.localround import aggregate, commit, train
from sfg.net.wire import Message
from sfg.round.staleness import waited as _waited


def waited(age: int, lag: float, d: float) -> tuple[int, float]:
    """Scalars of a message that sat in the inbox for ``d`` periods (docs/concepts/nodes.md#asynchronous-mode):
    :func:`sfg.round.staleness.waited`, the clock's own definition, on d ≥ 0."""
    a, lg = _waited(np.int64(age), float(lag), max(0.0, float(d)))
    return int(a), float(lg)


async def run(node: Any) -> None:
    """The node's remaining wakes, then a linger while its neighbours finish."""
    T = node.world.rounds
    if node.t0 is None:
        node.t0 = node.clock.time()
    persist.catch_up_missed(node)
    node.log_event("start", t0=node.t0, restored=node.restored)
    wakes = node.wake_times()
    while node.rounds_done < T:
        if node.clock.virtual and node.net is not None and node.pending_sends():
            # the sends just handed to the network take their place on the uplink before
            # the next wake asks whether the device is still busy sending
            await asyncio.sleep(0)
        r = node.round = node.rounds_done
        wake = float(wakes[r])
        delay = wake - node.clock.time()
        if node.clock.virtual and node.world.available[r, node.i] and (delay < 0 or (
                node.net is not None and node.net.busy_until(node.i) > wake)):
            # a wake while the node is still busy (training or sending) is skipped (a wake
            # in an offline row is that row's offline wake, busy or not, as on the engine)
            # (docs/concepts/clock.md#the-three-protocols); on the wall clock a late node runs its due rounds back to
            # back instead (it cannot tell an overrun from the machine's load)
            node.stats.skipped += 1
            node.state = replace(node.state, t=node.state.t + 1)
            node.round = node.state.t
            node.end_round(r, False)
            continue
        t_ret = return_time(node, r)
        if t_ret is not None:  # docs/concepts/nodes.md#returns-in-the-node
            node.stats.returns += 1
            node.returning = True
            if node.cfg.pull_timeout is not None:
                node.pull_window = asyncio.ensure_future(returns.pull_at(node, t_ret))
        # always let the others (and the server) run in between
        await node.clock.wake(r, delay)
        await one_round(node, r)
        node.end_round(r, bool(node.world.available[r, node.i]))
    await asyncio.sleep(node.cfg.linger if node.cfg.linger is not None else node.cfg.period)
    await outgoing.drain(node)
    backlog = [t for t in [*node.backlog, *node.sends.values()] if not t.done()]
    if node.clock.virtual and node.net is not None and backlog:
        # the pulls and sends still in flight (an async node's backlog holds only pulls): on
        # the virtual network each resolves by the run's end, and a reply that arrives is
        # taken and counted, and a send refused by an offline peer counted, as the clock's
        # engine counts them
        await asyncio.wait(backlog)


async def one_round(node: Any, r: int) -> None:
    """The local round of wake ``r``: (the pull's window,) aggregate, train, commit, send."""
    start = node.clock.time()
    now = node.clock.monotonic()
    available = bool(node.world.available[r, node.i])
    node.log_event("wake", t=start, m=now, round=r, available=available)
    if not available:
        node.offline_round()
        return
    if node.pull_window is not None:  # the return's window: wait for the answers, or S
        pull, node.pull_window = node.pull_window, None
        await pull
        waited_until = node.clock.time()
        node.stats.wait_s += max(0.0, waited_until - start)
        if not node.available_at(waited_until):
            node.stats.abandoned += 1  # offline inside the window: the wait is abandoned
        start, now = waited_until, node.clock.monotonic()
    cands = candidates(node, r, now)
    heard = False
    if node.returning:  # the return's first aggregation (counted once it is committed)
        node.returning = False
        heard = len(cands[0]) > 0
    agg, full = aggregate(node, r, *cands)
    x, n_steps = await train(node, r, agg)
    node.round = r + 1  # the state about to be computed is the start of round r + 1
    end = node.clock.time()
    online = online_through(node, start, end)
    node.log_event("trained", t=end, round=r, interrupted=not online)
    # on the virtual clock the run ends at T·P: a local round whose K steps end after it
    # is unfinished, as on the clock's engine (docs/concepts/clock.md#the-world-in-time)
    late = node.clock.virtual and \
        end > float(node.t0 or 0.0) + node.world.rounds * node.cfg.period
    if not online or late:
        # offline before its K steps were done (docs/concepts/clock.md#the-world-in-time): the local round is
        # discarded — model and staleness as they were, nothing sent
        if online:
            node.stats.unfinished += 1
        else:
            node.stats.interrupted += 1
        node.state = replace(node.state, t=node.state.t + 1)
        return
    commit(node, x, n_steps, full)
    # heard: the return's first aggregation, committed, held a neighbour's model (an
    # interrupted one ends the device's online time: no aggregation of that return)
    node.stats.returns_heard += int(heard)
    if node.membership.fixed:
        targets = [int(j) for j in node.nbrs if not node.blocked(int(j), r)]
        msg = outgoing.message(node)
    else:  # peers drawn at the commit, send counter r (docs/concepts/peers.md#real-nodes)
        targets = [j for j in node.membership.targets(r) if not node.blocked(j, r)]
        msg = outgoing.message(node, targets)
    outgoing.send_all(node, targets, msg)
    node.last_sent = (msg, node.clock.monotonic())  # what a pull is answered with


def candidates(node: Any, r: int, now: float) -> tuple[list[int], list[Message],
                                                         list[int], list[float]]:
    """Async round r's neighbour candidates at ``now`` (this node's monotonic clock):
    each neighbour's latest message that :func:`sfg.clock.schedule.held_units` holds a
    candidate — the clock's engine's own selection — with its waited scalars
    (:func:`waited`): (senders, messages, ages, lags)."""
    senders, msgs, ages, lags = [], [], [], []
    for j in node.nbrs:
        j = int(j)
        got = node.latest.get(j)
        if got is None or node.blocked(j, r):
            continue
        msg, arrival = got
        d = held_units(now, arrival, float(node.cfg.window), float(node.cfg.period))
        if d < 0:  # the window applies to its arrival
            continue
        # a reply's waiting started at its sending (docs/concepts/nodes.md#returns-in-the-node):
        # d = (held + now − arrival)/P
        d += node.held.get(j, 0.0) / float(node.cfg.period)
        age, lag = waited(msg.header.age, msg.header.lag, d)
        senders.append(j)
        msgs.append(msg)
        ages.append(age)
        lags.append(lag)
    return senders, msgs, ages, lags


def online_through(node: Any, t0: float, t1: float) -> bool:
    """Online during all of [t0, t1) of this node's clock."""
    r0 = node.row(t0)
    r1 = max(r0, int(math.ceil((t1 - float(node.t0 or 0.0)) / node.cfg.period)) - 1)
    return all(node.available_at(float(node.t0 or 0.0) + (r + 0.5) * node.cfg.period)
               for r in range(r0, r1 + 1))


def return_time(node: Any, r: int) -> float | None:
    """The time of the return whose first local round is round ``r`` (this node's clock), or
    None when round r follows no return (docs/concepts/nodes.md#returns-in-the-node): the
    start t0 + r·P of an online row after an offline one (not the run's start); after a
    restart, the restart itself if the node is online then, else the start of its first
    online row."""
    A = node.world.available[:, node.i]
    if not A[r]:
        return None
    start = float(node.t0 or 0.0) + r * node.cfg.period
    if node.restarted:
        node.restarted = False
        now = node.clock.time()
        return now if node.available_at(now) else max(now, start)
    if r >= 1 and not A[r - 1]:
        return start
    return None
