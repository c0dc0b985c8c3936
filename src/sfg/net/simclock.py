"""A virtual-time asyncio event loop (SPEC §12.6): the node's own asyncio code, unchanged, on a
clock that jumps to the next timer instead of waiting for it.

:class:`VirtualLoop` is asyncio's selector loop with two differences: ``loop.time()`` is a
virtual clock in seconds starting at 0, and the selector never blocks — when nothing is ready
it first calls the loop's *idle hooks* (e.g. the batched trainer, which then runs every
training request of this instant together and resolves their futures), and only when no hook
has work does it move the clock to the earliest scheduled timer. ``asyncio.sleep``,
``wait_for`` and every timeout therefore run in virtual time, deterministically: the same
program gives the same sequence of events on every run (no threads, no real I/O; the
in-memory network of :mod:`sfg.net.memory` carries the messages).

A program that waits with nothing scheduled and no hook pending would wait forever; the loop
raises :class:`Deadlock` instead.

Per-node clocks (:class:`NodeClock`) read the loop's clock through a drift rate and an offset,
as a device's own clock would (SPEC §11.2: timestamps are the receiver's own clock only).
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
        when = loop._next_timer()
        if when is None:
            raise Deadlock("every node is waiting and nothing is scheduled: the run would "
                           "wait forever (a missing message with no deadline?)")
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
        self.wall_started = time.perf_counter()

    def time(self) -> float:
        return self._vtime

    def add_idle_hook(self, hook: Callable[[], bool]) -> None:
        """``hook()`` is called when nothing is ready at the current instant; it returns True
        if it made something ready (then the clock does not move)."""
        self._idle_hooks.append(hook)

    def _run_idle_hooks(self) -> bool:
        return any([h() for h in self._idle_hooks])

    def _next_timer(self) -> float | None:
        # the timers are asyncio's heap: drop cancelled ones from its head, as asyncio's own
        # _run_once does, and read the head (O(1), not a scan of every timer)
        heap = self._scheduled  # type: ignore[attr-defined]
        while heap and heap[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(heap)._scheduled = False
        return heap[0]._when if heap else None


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
        :class:`sfg.net.replaylog.ReplayClock`)."""
        await asyncio.sleep(max(0.0, self.to_loop(seconds)))


WALL = NodeClock()
