"""A virtual-time asyncio event loop (docs/concepts/clock.md#the-node-on-the-clock): the node's own asyncio code, unchanged, on a
clock that jumps to the next timer instead of waiting for it.

:class:`VirtualLoop` is asyncio's selector loop with two differences: ``loop.time()`` is a
virtual clock in seconds starting at 0, and the selector never blocks — when nothing is ready
it first calls the loop's *idle hooks* (e.g. the batched trainer, which then runs every
training request of this instant together and resolves their futures), and only when no hook
has work does it run the callbacks given for this instant's phases, one phase after the
other (:meth:`VirtualLoop.call_at_phase`, the phases of :mod:`sfg.clock.instant`: wakes, then
local rounds' ends, then evaluations, which see every event of the instant) — and only then
move the clock to the earliest scheduled timer or
instant's end. ``asyncio.sleep``,
``wait_for`` and every timeout therefore run in virtual time, deterministically: the same
program gives the same sequence of events on every run (no threads, no real I/O; the
in-memory network of :mod:`sfg.net.memory` carries the messages).

A program that waits with nothing scheduled and no hook pending would wait forever; the loop
raises :class:`Deadlock` instead.

The loop keeps its own record of its timers (every timer is made by ``loop.call_at``, which
it extends, and read through the handles' public ``when()`` and ``cancelled()``), not asyncio's
private heap. The one asyncio internal it relies on is the loop's ``_clock_resolution``, which
it sets (see :meth:`_Selector.select`) and asyncio's ``_run_once`` reads: that is checked at
import (``clock-resolution`` in :mod:`sfg.util.internals`); where asyncio does not read it, or
under ``SFG_PUBLIC_API=1``, the clock runs as it does up to 2^22 s (past which asyncio's own
resolution can no longer tell an instant from the next) and a run that would pass that stops
with an error instead of spinning.

Per-node clocks (:class:`NodeClock`) read the loop's clock through a drift rate and an offset,
as a device's own clock would (docs/concepts/nodes.md#asynchronous-mode: timestamps are the receiver's own clock only).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass

from sfg.errors import SfgError


class Deadlock(SfgError):
    """Every task waits for something that nothing scheduled will ever provide."""


def _resolution_read() -> bool:
    """Whether asyncio's loop reads ``_clock_resolution`` when it runs the timers due (and
    sfg may rely on it: not under ``SFG_PUBLIC_API=1``); noted in :mod:`sfg.util.internals`."""
    from sfg.util import internals

    run_once = getattr(asyncio.BaseEventLoop, "_run_once", None)
    names = getattr(getattr(run_once, "__code__", None), "co_names", ())
    return not internals.taken("clock-resolution",
                               internals.forced() or "_clock_resolution" not in names)


#: where asyncio does not read the loop's ``_clock_resolution``: the virtual clock's limit
#: (asyncio's own resolution, ~1 ns, is still above one float step there)
UNREAD_LIMIT = 2.0 ** 22


class _Selector(selectors.BaseSelector):
    """Holds the loop's registrations (its self-pipe) but never waits: the loop's clock
    advances instead (see the module docstring)."""

    def __init__(self) -> None:
        self._map: dict[int, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj, events, data=None):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def modify(self, fileobj, events, data=None):
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout=None):
        loop = self.loop
        if loop is None or (timeout is not None and timeout <= 0):
            return []
        if loop._run_idle_hooks():
            return []  # a hook made callbacks ready at this instant
        if loop._end_instant():
            return []  # the instant's last phase made callbacks ready
        when = loop._next_timer()
        end = loop._next_instant_end()
        if end is not None and (when is None or end < when):
            when = end  # an instant with nothing but its end (no timer due then)
        if when is None:
            raise Deadlock("every node is waiting and nothing is scheduled: the run would "
                           "wait forever (a missing message with no deadline?)")
        if when > UNREAD_LIMIT and not loop.resolution_read:
            raise SfgError(f"the virtual clock would pass {UNREAD_LIMIT:.0f} s, where this "
                           "Python's asyncio cannot tell its instants apart (see "
                           "sfg.util.internals); run a shorter simulation")
        loop._vtime = max(loop._vtime, when)
        # asyncio runs the timers due before time() + _clock_resolution: that must exceed
        # time() itself, i.e. be at least one float step at this clock reading (a fixed
        # 1e-12 s is below it from 2^14 s on, and the loop would spin at that instant)
        loop._clock_resolution = max(1e-12, math.ulp(loop._vtime))
        return []

    def get_map(self):
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """asyncio on a virtual clock (see the module docstring)."""

    def __init__(self) -> None:
        sel = _Selector()
        super().__init__(selector=sel)
        sel.loop = self
        self._vtime = 0.0
        self._idle_hooks: list[Callable[[], bool]] = []
        self._clock_resolution = 1e-12
        self.resolution_read = _resolution_read()
        self.wall_started = time.perf_counter()
        # (when, order, timer) of every timer made by call_at; fired and cancelled ones are
        # dropped when they reach the head
        self._timers: list[tuple[float, int, _Timer]] = []
        self._made = 0
        # (when, phase, order, callback, args) of the callbacks at a phase of an instant
        self._ends: list[tuple[float, int, int, Callable, tuple]] = []

    def time(self) -> float:
        return self._vtime

    def add_idle_hook(self, hook: Callable[[], bool]) -> None:
        """``hook()`` is called when nothing is ready at the current instant; it returns True
        if it made something ready (then the clock does not move)."""
        self._idle_hooks.append(hook)

    def _run_idle_hooks(self) -> bool:
        return any([h() for h in self._idle_hooks])

    def call_at_phase(self, when: float, phase: int, callback: Callable, *args) -> None:
        """Run ``callback(*args)`` at the instant ``when`` (virtual seconds) in ``phase`` of
        that instant (:class:`sfg.clock.instant.Phase`): once the clock has reached ``when``,
        nothing is ready, no idle hook has work and no timer is due at ``when`` (the timers —
        messages and answers arriving, time-outs — come first), and every callback of an
        earlier phase of the instant has run. Callbacks of one phase run together, in the
        order they were given. The node's wakes take :attr:`~sfg.clock.instant.Phase.WAKE`
        (they hold what arrived at the instant, nothing sent at it), its local rounds' ends
        :attr:`~sfg.clock.instant.Phase.COMMIT`, its evaluations
        :attr:`~sfg.clock.instant.Phase.EVALUATE`."""
        self._made += 1
        heapq.heappush(self._ends, (float(when), int(phase), self._made, callback, args))

    def call_at_instant_end(self, when: float, callback: Callable, *args) -> None:
        """Run ``callback(*args)`` at the end of the instant ``when``: after every other event
        of that instant, before the clock moves on (the last phase of one instant,
        :attr:`sfg.clock.instant.Phase.EVALUATE`, :meth:`call_at_phase`)."""
        from sfg.clock.instant import Phase

        self.call_at_phase(when, Phase.EVALUATE, callback, *args)

    def _next_instant_end(self) -> float | None:
        return self._ends[0][0] if self._ends else None

    def _end_instant(self) -> bool:
        """Make ready the callbacks of the earliest phase due at the clock's instant (every
        entry due is at the instant: the clock never passes one); True if any."""
        ends, now = self._ends, self._vtime
        if not ends or ends[0][0] > now:
            return False
        phase = ends[0][1]
        while ends and ends[0][0] <= now and ends[0][1] == phase:
            _, _, _, cb, args = heapq.heappop(ends)
            self.call_soon(cb, *args)
        return True

    def call_at(self, when, callback, *args, context=None):
        """asyncio's ``call_at`` (every ``call_later``, ``sleep`` and timeout comes here), the
        timer also noted in this loop's own record (:meth:`_next_timer`)."""
        timer = _Timer(callback)
        handle = super().call_at(when, timer, *args, context=context)
        timer.handle = handle
        self._made += 1
        heapq.heappush(self._timers, (handle.when(), self._made, timer))
        return handle

    def _next_timer(self) -> float | None:
        """When the earliest timer still to run is due (None: none is): the head of this loop's
        record, once the timers that ran or were cancelled are dropped from it (O(1) a
        timer, not a scan of every timer). The same instant as the head of asyncio's own
        heap: a timer leaves that heap only to run, or cancelled."""
        heap = self._timers
        while heap and (heap[0][2].fired or heap[0][2].handle.cancelled()):
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class _Timer:
    """A timer's callback, noting that it ran (for :meth:`VirtualLoop._next_timer`)."""

    __slots__ = ("callback", "fired", "handle")

    def __init__(self, callback: Callable) -> None:
        self.callback, self.fired = callback, False
        self.handle: asyncio.TimerHandle

    def __call__(self, *args):
        self.fired = True
        return self.callback(*args)

    def __repr__(self) -> str:
        return repr(self.callback)


def after_arrivals(fn: Callable, *args) -> None:
    """``fn(*args)`` on the virtual clock once the instant's arrivals are taken (in
    :attr:`sfg.clock.instant.Phase.WAKE`): after its "unreachable" answers and the requests
    it answers (:attr:`~sfg.clock.instant.Phase.PULL_END`, :mod:`sfg.net.memory`), before
    its commits (docs/concepts/clock.md#one-instant); what a node on the clock hears of its
    peers waits for it (:class:`sfg.net.membership.Membership`)."""
    from sfg.clock.instant import Phase

    loop = asyncio.get_running_loop()
    loop.call_at_phase(loop.time(), Phase.WAKE, fn, *args)  # type: ignore[attr-defined]


def resolve(fut: asyncio.Future, value=None) -> None:
    """Give ``fut`` its result ``value`` unless it is done (cancelled, say): the callback the
    virtual loop's timers and phases run to wake a waiting task."""
    if not fut.done():
        fut.set_result(value)


def run_virtual(coro, *, loop: VirtualLoop | None = None):
    """Run ``coro`` to completion on a (new) :class:`VirtualLoop`; returns its result."""
    own = loop is None
    lp = loop or VirtualLoop()
    try:
        return lp.run_until_complete(coro)
    finally:
        if own:
            lp.close()


@dataclass
class NodeClock:
    """A node's own clock: ``monotonic()`` = (1 + drift) · loop time + offset, ``time()`` the
    same on the wall-clock scale. The wall clock (:data:`WALL`) reads the real clocks."""

    drift: float = 0.0
    offset: float = 0.0
    virtual: bool = False

    def monotonic(self) -> float:
        if not self.virtual:
            return time.monotonic()
        return (1.0 + self.drift) * asyncio.get_running_loop().time() + self.offset

    def time(self) -> float:
        if not self.virtual:
            return time.time()
        return self.monotonic()

    def to_loop(self, seconds: float) -> float:
        """Loop seconds that pass while this clock advances by ``seconds``."""
        return seconds / (1.0 + self.drift) if self.virtual else seconds

    async def wake(self, r: int, seconds: float) -> None:
        """Sleep until the node's round-``r`` wake, ``seconds`` from now on this clock (always
        yielding to the other tasks; a replay's clock wakes at the logged time instead,
        :class:`sfg.net.replaylog.ReplayClock`). On the virtual loop the wake takes its phase
        of the instant (:meth:`VirtualLoop.call_at_phase`): after the instant's arrivals,
        before its local rounds' ends."""
        loop = asyncio.get_running_loop()
        delay = max(0.0, self.to_loop(seconds))
        if not isinstance(loop, VirtualLoop):
            await asyncio.sleep(delay)
            return
        from sfg.clock.instant import Phase

        fut = loop.create_future()
        loop.call_at_phase(loop.time() + delay, Phase.WAKE, resolve, fut)
        await fut


WALL = NodeClock()
