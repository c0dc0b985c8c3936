"""The async and event protocols' schedules written a second way, vectorised over devices
(one step per wake under async, per free instant under event), as sfg once made them: the
reference the one time-ordered simulation of the protocols (``sfg.clock.pull``, behind
``sfg.clock.schedule.async_schedule`` and ``event_schedule``) is checked against, event by
event, with ``on_return: none`` (tests/test_clock_pull.py). Slow and obvious is the point;
nothing in ``src`` calls it."""

from __future__ import annotations

import numpy as np

from sfg.clock.links import offline_keeps, out_slots, transfer_seconds
from sfg.clock.schedule import (
    LOCAL,
    OFFLINE,
    Schedule,
    World,
    _check_budget,
    check_event,
    check_period,
    finish_schedule,
)
from sfg.clock.settings import ClockSettings
from sfg.round.kernel import EV_ALL, EV_SEND, EV_TRAIN
from sfg.round.rules import catchup_steps
from sfg.round.staleness import wake_jitter


def vectorised_async_schedule(world: World, settings: ClockSettings, *, local_steps: int,
                   seed: int, catchup: bool = False, link_failure: float = 0.0,
                   anatomy: str = "full") -> Schedule:
    """:func:`sfg.clock.schedule.async_schedule` (``on_return: none``), per wake over all
    devices."""
    n, P = world.n, settings.P
    keeps = offline_keeps(anatomy)
    talks = bool(keeps & EV_SEND)
    train = local_steps * world.compute
    check_period(train, P)
    wakes = int(np.ceil(world.horizon / P))
    _check_budget(float(n) * wakes, "async schedule")
    assert settings.pull_timeout is None or talks, "the reference is on_return none's"
    jit = wake_jitter(seed, wakes, n) * (settings.jitter * P)
    dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
    deg = np.diff(out_slots(world.rg)[0])
    busy = np.zeros(n)
    ids = np.arange(n)
    tau = np.zeros(n, np.int64)  # the device's own age (rule-independent): for +catchup
    parts: list[tuple[np.ndarray, ...]] = []
    steps_of: list[np.ndarray] = []
    caps_of: list[np.ndarray] | None = [] if keeps else None
    skipped = interrupted = offline_wakes = unfinished = 0
    for r in range(wakes):
        w = r * P + jit[r]
        inside = w < world.horizon
        on = world.online.online_at(ids, w) & inside
        off = np.flatnonzero(~on & inside)
        offline_wakes += off.size
        kept = np.zeros(0, np.int64)
        if keeps:  # offline wakes that still act (anatomy): a local round of what is kept
            free = w[off] >= busy[off]
            skipped += int(np.count_nonzero(~free))
            act = off[free]
            if keeps & EV_TRAIN:
                fe_k = w[act] + local_steps * world.compute[act]
                ok_k = fe_k <= world.horizon
                unfinished += int(np.count_nonzero(~ok_k))
                act, fe_k = act[ok_k], fe_k[ok_k]
                busy[act] = fe_k
            else:
                fe_k = w[act].copy()
                busy[act] = fe_k + deg[act] * dt[act]
            kept = act
            off = np.zeros(0, np.int64)  # no offline span: the kept local round settles it
        start = on & (w >= busy)
        skipped += int(np.count_nonzero(on & (w < busy)))
        d = np.flatnonzero(start)
        ns = catchup_steps(local_steps, tau[d]) if catchup else np.full(d.size, local_steps)
        fe = w[d] + ns * world.compute[d]
        through = world.online.online_through(d, w[d], np.minimum(fe, world.horizon))
        ok = through & (fe <= world.horizon)
        unfinished += int(np.count_nonzero(through & ~ok))
        bad = d[~ok]
        interrupted += int(np.count_nonzero(~through))
        busy[bad] = np.maximum(world.online.next_off(bad, w[bad]), w[bad])
        done = d[ok]
        fe = fe[ok]
        busy[done] = np.minimum(fe + deg[done] * dt[done], world.online.next_off(done, fe))
        steps_of.append(np.concatenate([np.zeros(off.size, np.int64), ns[ok]]))
        tau[off] += 1
        tau[done] = 0
        m = off.size + done.size
        parts.append((np.concatenate([w[off], w[done]]), np.concatenate([off, done]),
                      np.concatenate([np.full(off.size, OFFLINE), np.full(done.size, LOCAL)]),
                      np.concatenate([np.ones(off.size), np.zeros(done.size)]),
                      np.concatenate([w[off], fe]), np.full(m, r, np.int64),
                      np.full(m, r, np.int64)))
        if caps_of is not None:
            caps_of.append(np.concatenate([np.zeros(off.size, np.int64),
                                           np.full(done.size, EV_ALL, np.int64)]))
            k = kept.size
            parts.append((w[kept], kept, np.full(k, LOCAL), np.zeros(k), fe_k,
                          np.full(k, r, np.int64), np.full(k, r, np.int64)))
            trains_k = bool(keeps & EV_TRAIN)
            steps_of.append(np.full(k, local_steps if trains_k else 0, np.int64))
            caps_of.append(np.full(k, keeps, np.int64))
            if trains_k:
                tau[kept] = 0
            else:
                tau[kept] += 1
    return finish_schedule(world, settings, "async", parts, steps_of, seed=seed, catchup=catchup,
                   link_failure=link_failure, caps_of=caps_of, offline_talks=talks,
                   stats={"wakes": float(n * wakes), "skipped": float(skipped),
                          "interrupted": float(interrupted), "unfinished": float(unfinished),
                          "offline_wakes": float(offline_wakes)})


def vectorised_event_schedule(world: World, settings: ClockSettings, *, local_steps: int,
                   seed: int, catchup: bool = False, link_failure: float = 0.0,
                   anatomy: str = "full") -> Schedule:
    """:func:`sfg.clock.schedule.event_schedule` (``on_return: none``), per free instant
    over all devices."""
    check_event(world, settings, local_steps=local_steps, anatomy=anatomy)
    n, delta = world.n, float(settings.round_seconds)
    keeps = offline_keeps(anatomy)
    trains_off = bool(keeps & EV_TRAIN)
    ticks_off = bool(keeps) and not trains_off
    talks = bool(keeps & EV_SEND)
    train = local_steps * world.compute
    dt = transfer_seconds(world, float(settings.message_bytes or 0.0))
    deg = np.diff(out_slots(world.rg)[0])
    assert settings.pull_timeout is None or talks, "the reference is on_return none's"
    ids = np.arange(n)
    on0 = world.online.online_at(ids, np.zeros(n))
    cur = np.zeros(n) if keeps else world.online.next_on(ids, np.zeros(n))
    off_since = np.where(on0 | trains_off, np.nan, 0.0)
    count = np.zeros(n, np.int64)
    tau = np.zeros(n, np.int64)  # the device's own age (rule-independent): for +catchup
    parts: list[tuple[np.ndarray, ...]] = []
    steps_of: list[np.ndarray] = []
    caps_of: list[np.ndarray] | None = [] if keeps else None
    interrupted = unfinished = skipped = 0
    active = cur < world.horizon
    while active.any():
        d = np.flatnonzero(active)
        if keeps:  # devices offline at their free time: what the mode keeps, up to their return
            off_now = ~world.online.online_at(d, cur[d])
            if off_now.any():
                g = d[off_now]
                if trains_off:
                    unfinished += _kept_training(world, g, train[g], local_steps, keeps, delta,
                                                 cur, count, tau, parts, steps_of, caps_of)
                else:
                    skipped += _kept_ticks(world, g, deg[g] * dt[g], keeps, delta, cur,
                                           off_since, count, tau, parts, steps_of, caps_of)
                d = d[~off_now]
                if not d.size:
                    active = cur < world.horizon
                    continue
        s = cur[d]
        back = ~np.isnan(off_since[d])
        b = d[back]
        amt = (s[back] - off_since[b]) / delta
        off_since[b] = np.nan
        tau[b] += np.floor(amt).astype(np.int64)
        ns = catchup_steps(local_steps, tau[d]) if catchup else np.full(d.size, local_steps)
        fe = s + ns * world.compute[d]
        through = world.online.online_through(d, s, np.minimum(fe, world.horizon))
        ok = through & (fe <= world.horizon)
        done = d[ok]
        parts.append((np.concatenate([s[back], s[ok]]), np.concatenate([b, done]),
                      np.concatenate([np.full(b.size, OFFLINE), np.full(done.size, LOCAL)]),
                      np.concatenate([amt, np.zeros(done.size)]),
                      np.concatenate([s[back], fe[ok]]),
                      np.concatenate([np.full(b.size, -1), count[done]]),
                      np.floor(np.concatenate([s[back], s[ok]]) / delta).astype(np.int64)))
        steps_of.append(np.concatenate([np.zeros(b.size, np.int64), ns[ok]]))
        if caps_of is not None:
            caps_of.append(np.concatenate([np.zeros(b.size, np.int64),
                                           np.full(done.size, EV_ALL, np.int64)]))
        count[done] += 1
        tau[done] = 0
        # committed: busy through the sends (or until it goes offline), then at once again
        f = fe[ok]
        send_end = f + deg[done] * dt[done]
        off_at = world.online.next_off(done, f)
        gone = off_at <= send_end
        if keeps:  # free when it goes offline (its sends go on when the mode keeps sending)
            cur[done] = np.where(gone & talks, send_end, np.where(gone, off_at, send_end))
        else:
            cur[done] = np.where(gone, world.online.next_on(done, off_at), send_end)
        if not trains_off:
            off_since[done[gone]] = off_at[gone]
        # interrupted (went offline first), or the run ended before its K steps
        bad = d[~ok]
        unfinished += int(np.count_nonzero(through & ~ok))
        interrupted += int(np.count_nonzero(~through))
        off = world.online.next_off(bad, s[~ok])
        ended = through[~ok]
        cur[bad] = np.where(ended, world.horizon,
                            off if keeps else world.online.next_on(bad, off))
        if not trains_off:
            off_since[bad[~ended]] = off[~ended]
        active = cur < world.horizon
    stats = {"interrupted": float(interrupted), "unfinished": float(unfinished)}
    if ticks_off:
        stats["skipped"] = float(skipped)
    return finish_schedule(world, settings, "event", parts, steps_of, seed=seed, catchup=catchup,
                   link_failure=link_failure, caps_of=caps_of, offline_talks=talks,
                   stats=stats)


def _runs(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of the given lengths: each element's run and its position in it."""
    which = np.repeat(np.arange(lengths.size), lengths)
    pos = np.arange(which.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return which, pos


def _kept_training(world: World, g: np.ndarray, k: np.ndarray, steps: int, keeps: int,
                   delta: float, cur: np.ndarray, count: np.ndarray, tau: np.ndarray,
                   parts: list, steps_of: list, caps_of: list | None) -> int:
    """Event protocol, ``cannot-communicate``: devices ``g``, offline at their free time
    cur[g], train alone back to back (K steps of ``k`` [g] seconds each) from then until they
    are online again; a round that starts before the return ends before the next online
    round starts. Appends the local rounds, advances cur, count, tau; returns the number of
    devices whose next round would end after the run (unfinished)."""
    y = cur[g]
    lim = np.minimum(world.online.next_on(g, y), world.horizon)
    m = np.ceil((lim - y) / k).astype(np.int64) + 1
    which, pos = _runs(m)
    start = y[which] + pos * k[which]
    end = start + k[which]
    keep = start < lim[which]
    which, pos, start, end = which[keep], pos[keep], start[keep], end[keep]
    fin = end <= world.horizon
    short = np.bincount(which[~fin], minlength=g.size) > 0
    which, pos, start, end = which[fin], pos[fin], start[fin], end[fin]
    dev = g[which]
    r = start.size
    parts.append((start, dev, np.full(r, LOCAL), np.zeros(r), end, count[dev] + pos,
                  np.floor(start / delta).astype(np.int64)))
    steps_of.append(np.full(r, steps, np.int64))
    if caps_of is not None:
        caps_of.append(np.full(r, keeps, np.int64))
    n_done = np.bincount(which, minlength=g.size)
    last = np.full(g.size, -np.inf)
    np.maximum.at(last, which, end)
    count[g] += n_done
    tau[g[n_done > 0]] = 0
    cur[g] = np.where(short, world.horizon, last)
    return int(np.count_nonzero(short))


def _kept_ticks(world: World, g: np.ndarray, s: np.ndarray, keeps: int, delta: float,
                cur: np.ndarray, off_since: np.ndarray, count: np.ndarray, tau: np.ndarray,
                parts: list, steps_of: list, caps_of: list | None) -> int:
    """Event protocol, ``cannot-train-*``: devices ``g``, offline at their free time cur[g]
    since off_since[g] (the last unit counted), tick every Δ from off_since until they are
    online again: a tick at or after the free time acts (a local round of what the mode keeps,
    then its sends of ``s`` [g] seconds take every ⌈s/Δ⌉-th tick), any other tick is an
    offline span of one unit. Appends the events, advances cur (the return, or the end of
    the last sends if later), off_since (the last tick), count and tau; returns the number of
    ticks that were spans (the uplink busy)."""
    y, anchor = cur[g], off_since[g]
    lim = np.minimum(world.online.next_on(g, y), world.horizon)
    m = np.ceil((lim - anchor) / delta).astype(np.int64) + 1
    which, pos = _runs(m)
    tick = anchor[which] + (pos + 1) * delta
    keep = tick < lim[which]
    which, pos, tick = which[keep], pos[keep], tick[keep]
    free = tick >= y[which]
    first = np.full(g.size, np.iinfo(np.int64).max)
    np.minimum.at(first, which[free], pos[free])
    every = np.maximum(1, np.ceil(s / delta)).astype(np.int64)
    acts = free & ((pos - first[which]) % every[which] == 0)
    dev = g[which]
    r = tick.size
    rank = np.cumsum(acts) - 1
    base = np.concatenate([[0], np.cumsum(np.bincount(which[acts], minlength=g.size))])[:-1]
    step = np.where(acts, count[dev] + rank - base[which], -1)
    parts.append((tick, dev, np.where(acts, LOCAL, OFFLINE), np.where(acts, 0.0, 1.0), tick,
                  step, np.floor(tick / delta).astype(np.int64)))
    steps_of.append(np.zeros(r, np.int64))
    if caps_of is not None:
        caps_of.append(np.where(acts, keeps, 0).astype(np.int64))
    n_ticks = np.bincount(which, minlength=g.size)
    n_acts = np.bincount(which[acts], minlength=g.size)
    last_tick = anchor + n_ticks * delta
    busy = np.full(g.size, -np.inf)
    np.maximum.at(busy, which[acts], tick[acts] + s[which[acts]])
    busy = np.maximum(busy, y)
    count[g] += n_acts
    tau[g] += n_ticks
    off_since[g] = np.where(n_ticks > 0, last_tick, anchor)
    cur[g] = np.where(lim >= world.horizon, world.horizon, np.maximum(lim, busy))
    return int(r - np.count_nonzero(acts))
