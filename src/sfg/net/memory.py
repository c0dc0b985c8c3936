"""An in-memory network for nodes on the virtual clock (docs/concepts/clock.md#the-node-on-the-clock), with the gRPC transport's
interface (:class:`sfg.net.transport.Server`, :class:`~sfg.net.transport.Peer`).

The node encodes its messages exactly as for gRPC (msgpack header + safetensors payload in
chunks) and the receiving node runs the same handler on the same bytes (header checks,
neighbour and identity, size, digest, tensor layout, finite values): nothing of the protocol or
its acceptance checks is re-implemented here. What the network adds is time (docs/concepts/clock.md#the-world-in-time): a
message from j to i leaves j's uplink after the messages queued before it (one at a time,
size ÷ uplink rate each), arrives after the link's latency, and is lost when the sender goes
offline before its transfer ends; a receiver that is offline at the arrival refuses it (its
own handler says so). The world's quantities (per-slot latency, per-device uplink) are those
of :func:`sfg.clock.schedule.make_world`, so the node under the virtual clock and the clock's
own engine see the same network.

Faults (:class:`sfg.clock.faults.FaultPlan`) are consulted per message, by the message's
number on its link (:meth:`MemoryNetwork.next_message`), as is the world's per-link loss: loss, extra delay (reordering), duplication,
partitions between node sets for a window of time (``decide``), and in transit a flipped byte
or a copy to a non-neighbour (``tamper``); the replies to pulls (``Fetch``) go through the same
faults, less the misrouting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from sfg.net.transport import chunks
from sfg.util.rng import counter_key, counter_uniform

ADDRESS = "mem:{}"


def address(i: int) -> str:
    return ADDRESS.format(int(i))


class MemoryNetwork:
    """The nodes' servers by address, the world's link quantities and the faults.

    latency: [N, N] dict-like ``latency(j, i)`` seconds; uplink [N] bytes/s (inf: instant);
    online(i, t0, t1): whether device i is online during [t0, t1) of virtual time (the
    sender-side loss rule); faults: None or an object with ``decide(src, dst, t)`` returning
    ``(drop, extra_delay, copies)``; message_bytes: the size a transfer takes on the uplink
    (the world's message size, docs/concepts/clock.md#the-world-in-time, as the clock's engine charges it; None: the
    encoded message's own length).
    """

    def __init__(self, n: int, *, latency: Callable[[int, int], float] | None = None,
                 uplink: np.ndarray | None = None,
                 online: Callable[[int, float, float], bool] | None = None,
                 faults: Any = None, message_bytes: float | None = None,
                 loss: Callable[[int, int], float] | None = None, loss_seed: int = 0):
        self.n = int(n)
        # the world's per-link loss probability (docs/concepts/clock.md#the-world-in-time), drawn per message as the clock's
        # engine draws it (sfg.clock.schedule: key "clock-loss" of the run's seed)
        self.loss = loss
        self.loss_key = counter_key(loss_seed, "clock-loss")
        self._count: dict[tuple[int, int, int], int] = {}
        self.message_bytes = message_bytes
        self.latency = latency or (lambda j, i: 0.0)
        self.uplink = np.full(self.n, np.inf) if uplink is None else np.asarray(uplink, float)
        self.online = online
        self.faults = faults
        self.servers: dict[str, MemoryServer] = {}
        self.uplink_free = np.zeros(self.n)
        self.stats = {"sent": 0, "lost_sender": 0, "lost_random": 0, "dropped": 0, "duplicated": 0,
                      "delayed": 0, "partitioned": 0, "no_server": 0}
        # every delivery attempt that reached the receiving side, when a list (for checks
        # and logs): dicts of time, src, dst, kind ("push", "copy", "stranger", "fetch"),
        # whether a fault changed the payload, the raw header and the receiver's answer
        self.log: list[dict] | None = None
        self.in_flight: set[asyncio.Future] = set()  # messages held back by faults

    def note(self, **event) -> None:
        if self.log is not None:
            event["t"] = float(asyncio.get_running_loop().time())
            self.log.append(event)

    # the transport's factories, as the node calls them
    def server(self, i: int, deliver, fetch, *, max_bytes: int, tls=None) -> MemoryServer:
        return MemoryServer(self, int(i), deliver, fetch)

    def peer(self, i: int, addr: str, *, max_bytes: int, tls=None) -> MemoryPeer:
        return MemoryPeer(self, int(i), addr)

    def next_message(self, channel: int, src: int, dst: int) -> int:
        """The index of a new message of ``channel`` (0: pushes, 1: replies to pulls) on the
        link ``src`` → ``dst``, counted from 0 in the order the calls are made: the identity
        its loss and faults are drawn for (the clock's engine numbers its messages alike)."""
        c = (channel, src, dst)
        k = self._count[c] = self._count.get(c, -1) + 1
        return k

    def busy_until(self, i: int) -> float:
        """When device i's uplink is free again (virtual seconds)."""
        return float(self.uplink_free[int(i)])


class MemoryServer:
    def __init__(self, net: MemoryNetwork, i: int, deliver, fetch):
        self.net, self.i, self.deliver, self.fetch = net, i, deliver, fetch
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.net.servers[address(self.i)] = self
        return self.i

    async def stop(self, grace: float | None = 0.5) -> None:
        if self.net.servers.get(address(self.i)) is self:
            del self.net.servers[address(self.i)]


async def _stream(payload) -> AsyncIterator[bytes]:
    for c in chunks(payload):
        yield c


class MemoryPeer:
    """The channel from node ``src`` to the node at ``addr``."""

    def __init__(self, net: MemoryNetwork, src: int, addr: str):
        self.net, self.src, self.address = net, src, addr
        self.dst = int(addr.split(":", 1)[1])

    async def deliver(self, header: bytes, payload, *, timeout: float = 10.0, retries: int = 3,
                      backoff: float = 0.05) -> tuple[bool, str]:
        net, loop = self.net, asyncio.get_running_loop()
        k = net.next_message(0, self.src, self.dst)
        size = net.message_bytes if net.message_bytes is not None else \
            len(header) + (sum(len(c) for c in payload) if isinstance(payload, tuple)
                           else len(payload))
        now = loop.time()
        up = net.uplink[self.src]
        start = max(now, float(net.uplink_free[self.src]))
        end = start if np.isinf(up) else start + size / up
        net.uplink_free[self.src] = end
        if end > now:
            await asyncio.sleep(end - now)
        net.stats["sent"] += 1
        if net.log is not None:
            net.note(src=self.src, dst=self.dst, kind="send", changed=False, header=header,
                     ok=True, reason="")
        if net.online is not None and not net.online(self.src, now, end):
            net.stats["lost_sender"] += 1
            return False, "lost"
        if net.loss is not None:
            p = net.loss(self.src, self.dst)
            if p > 0 and counter_uniform(net.loss_key, self.src, self.dst, 0, k) < p:
                net.stats["lost_random"] += 1
                await asyncio.sleep(timeout)
                return False, "DEADLINE_EXCEEDED"
        drop, extra, copies = (False, 0.0, 1) if net.faults is None else \
            net.faults.decide(self.src, self.dst, end, k)
        if drop:
            net.stats["dropped"] += 1
            await asyncio.sleep(timeout)
            return False, "DEADLINE_EXCEEDED"
        if extra > 0:
            net.stats["delayed"] += 1
        tamper = getattr(net.faults, "tamper", None)
        sent, stranger = (payload, None) if tamper is None else \
            tamper(self.src, self.dst, end, payload, k=k)
        changed = sent is not payload
        transit = self._transit(header, sent, float(net.latency(self.src, self.dst)) + extra,
                                copies, stranger, changed)
        if extra <= 0:
            return await transit
        # a message a fault holds back is on its way: it still arrives when its sender gives
        # up on the call (after ``timeout``) or is cancelled (it has a newer model to send)
        flight = asyncio.ensure_future(transit)
        net.in_flight.add(flight)
        flight.add_done_callback(net.in_flight.discard)
        try:
            return await asyncio.wait_for(asyncio.shield(flight), timeout)
        except asyncio.TimeoutError:
            return False, "DEADLINE_EXCEEDED"

    async def _transit(self, header: bytes, sent, delay: float, copies: int,
                       stranger: int | None, changed: bool) -> tuple[bool, str]:
        net = self.net
        await asyncio.sleep(delay)
        ok, reason = await self._arrive(header, sent, kind="push", changed=changed)
        for _ in range(copies - 1):  # duplicates arrive right after the original
            net.stats["duplicated"] += 1
            await self._arrive(header, sent, kind="copy", changed=changed)
        if stranger is not None:  # misrouted: a copy reaches a node that is no neighbour
            await self._arrive(header, sent, kind="stranger", changed=changed, to=stranger)
        return ok, reason

    async def _arrive(self, header: bytes, payload, *, kind: str = "push",
                      changed: bool = False, to: int | None = None) -> tuple[bool, str]:
        dst = self.dst if to is None else int(to)
        srv = self.net.servers.get(address(dst))
        if srv is None:  # the node is down (crashed, not yet restarted)
            self.net.stats["no_server"] += 1
            ok, reason = False, "UNAVAILABLE"
        else:
            ok, reason = await srv.deliver(header, _stream(payload), self.src,
                                           address(self.src))
        if self.net.log is not None:
            self.net.note(src=self.src, dst=dst, kind=kind, changed=changed, header=header,
                          ok=ok, reason=reason)
        return ok, reason

    async def fetch(self, t: int, me: int = -1, *, timeout: float = 10.0):
        net, loop = self.net, asyncio.get_running_loop()
        lat = float(net.latency(self.dst, self.src))
        await asyncio.sleep(float(net.latency(self.src, self.dst)))
        srv = net.servers.get(self.address)
        if srv is None:
            return None
        got = srv.fetch(int(t), int(me))
        if got is None:
            await asyncio.sleep(lat)
            return None
        h, p = got
        if net.faults is not None:  # the reply travels from the served node back
            k = net.next_message(1, self.dst, self.src)
            drop, extra, _ = net.faults.decide(self.dst, self.src, loop.time(), k, channel=1)
            if drop:
                net.stats["dropped"] += 1
                await asyncio.sleep(timeout)
                return None
            tamper = getattr(net.faults, "tamper", None)
            if tamper is not None:
                p, _ = tamper(self.dst, self.src, loop.time(), p, misroute=False, k=k,
                              channel=1)
            lat += extra
            if lat > timeout:  # the fetcher gives up first; the late reply is discarded
                await asyncio.sleep(timeout)
                return None
        await asyncio.sleep(lat)
        body = b"".join(p) if isinstance(p, tuple) else bytes(p)
        net.note(src=self.dst, dst=self.src, kind="fetch", changed=p is not got[1], header=h,
                 ok=True, reason="")  # the fetcher's own checks decide (its Rejections)
        return h, body

    async def close(self) -> None:
        return None
