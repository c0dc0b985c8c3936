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

A returning node's pull (``on_return: pull``, docs/concepts/clock.md#returns-in-time;
:meth:`MemoryPeer.pull`, :meth:`MemoryNetwork.request`) takes the clock's engine's times and
draws (:mod:`sfg.clock.pull`): the requests of a return leave back to back on the returning
device's uplink (emptied at the return: what it held was lost), a header each; a neighbour
online at a request's arrival queues its answer (the node's own :func:`sfg.net.returns.serve_pull`) on its uplink
behind what was queued before; the losses and faults of requests and replies are drawn on
their own streams and channels (``clock-pull-request``, ``clock-pull-reply``; faults'
channels 2 and 3), by the return's index among the device's returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from sfg.clock.instant import Phase
from sfg.clock.links import (
    arrival_time,
    loss_key,
    transfer_end,
    transfer_lost,
    transfer_time,
)
from sfg.clock.settings import HEADER_BYTES
from sfg.net.simclock import resolve as _resolve
from sfg.net.transport import EMPTY, OFFLINE, SILENT, UNREACHABLE, chunks

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
    encoded message's own length). next_off(i, t): when device i, online at t, goes offline
    (a device that goes offline while sending is busy no longer); horizon: the run's end in
    virtual seconds (nothing is sent or arrives at or after it).
    """

    def __init__(self, n: int, *, latency: Callable[[int, int], float] | None = None,
                 uplink: np.ndarray | None = None,
                 online: Callable[[int, float, float], bool] | None = None,
                 faults: Any = None, message_bytes: float | None = None,
                 loss: Callable[[int, int], float] | None = None, loss_seed: int = 0,
                 next_off: Callable[[int, float], float] | None = None,
                 horizon: float = float("inf")):
        self.n = int(n)
        # the world's per-link loss probability (docs/concepts/clock.md#the-world-in-time), drawn per message as the clock's
        # engine draws it (sfg.clock.schedule: key "clock-loss" of the run's seed)
        self.loss = loss
        self.loss_key = loss_key(loss_seed, "message")
        # a pull's requests and replies: streams of their own (sfg.clock.pull._requests)
        self.request_key = loss_key(loss_seed, "request")
        self.reply_key = loss_key(loss_seed, "reply")
        self.next_off = next_off
        self.horizon = float(horizon)
        self._count: dict[tuple[int, int, int], int] = {}
        self.message_bytes = message_bytes
        self.latency = latency or (lambda j, i: 0.0)
        self.uplink = np.full(self.n, np.inf) if uplink is None else np.asarray(uplink, float)
        self.online = online
        self.faults = faults
        self.servers: dict[str, MemoryServer] = {}
        self.uplink_free = np.zeros(self.n)
        self.busy = np.zeros(self.n)  # until when each device's latest broadcast is sending
        self._queued = np.full(self.n, -np.inf)  # when each device last queued a transfer
        # each device's broadcast being queued: [queued at, its start, transfers so far,
        # seconds each, the last one's end]
        self._job: dict[int, list] = {}
        self._batch: dict[int, list] = {}  # device -> [return time, requests queued, return index]
        self._returns: dict[int, int] = {}  # device -> returns pulled so far
        self._arrivals: dict[float, list] = {}  # time -> the pull requests arriving then
        self.stats = {"sent": 0, "lost_sender": 0, "lost_random": 0, "past_horizon": 0,
                      "dropped": 0, "duplicated": 0,
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
    def server(self, i: int, deliver, fetch, *, max_bytes: int, tls=None,
               pull=None, unsent=None, refusal=None) -> MemoryServer:
        return MemoryServer(self, int(i), deliver, fetch, pull, unsent, refusal)

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
        """Until when device i is busy sending its latest broadcast (virtual seconds): the end
        of its last transfer, or when it went offline if earlier (what it was sending is
        lost). Replies to pulls occupy the uplink (:meth:`reserve`) but keep no device busy."""
        return float(self.busy[int(i)])

    def seconds(self, i: int, nbytes: float) -> float:
        """The transfer time of ``nbytes`` on device i's uplink
        (:func:`sfg.clock.links.transfer_time`, as the clock's engine times it)."""
        return float(transfer_time(float(nbytes), float(self.uplink[int(i)])))

    def reserve(self, i: int, now: float, seconds: float, *,
                alone: bool = False) -> tuple[float, float]:
        """Queue a transfer of ``seconds`` on device i's uplink at ``now`` (first in, first
        out): (start, end), timed as the clock's engine times it
        (:func:`sfg.clock.links.transfer_end`): the messages of one broadcast (queued at one
        instant, one after the other) leave back to back from the broadcast's start, the k-th
        ending at start + (k+1)·seconds; ``alone``: a transfer of its own (a pull's reply). A
        device that was offline since it last queued something lost what its uplink held (the
        clock's engine empties it at each return)."""
        free = float(self.uplink_free[i])
        if free > now and self.online is not None and \
                not self.online(i, float(self._queued[i]), now):
            free = now
        job = self._job.get(i)
        if alone or job is None or job[0] != now or job[3] != seconds or job[4] != free:
            # a new broadcast (or a transfer of its own): it starts when the uplink is free
            job = self._job[i] = [now, max(now, free), 0, seconds, None]
        start = free if job[2] else job[1]
        end = float(transfer_end(job[1], job[2], seconds))
        job[2] += 1
        job[4] = end
        if alone:
            self._job.pop(i, None)
        self.uplink_free[i] = end
        self._queued[i] = now
        return start, end

    # ------------------------------------------------------------------ pulls
    def _pull_drop(self, key, src: int, dst: int, nth: int, t: float, channel: int
                   ) -> tuple[bool, float]:
        """A pull's request (``channel`` 2) or reply (3), the ``nth`` of its link's returns,
        leaving ``src`` at ``t``: (lost, extra delay), drawn as the clock's engine draws
        them (:func:`sfg.clock.pull._requests`)."""
        drop = False
        if self.loss is not None:
            drop = bool(transfer_lost(key, src, dst, nth, self.loss(src, dst)))
        extra = 0.0
        fates = getattr(self.faults, "fates", None)
        if fates is not None:
            cut, lost, ex, bad = fates(np.array([src]), np.array([dst]), np.array([nth]),
                                       np.array([t]), channel=channel)
            if cut[0] or lost[0] or bad[0]:
                self.stats["pull_faults"] = self.stats.get("pull_faults", 0) + 1
            drop = drop or bool(cut[0] or lost[0] or bad[0])
            extra = ex[0]
        return drop, extra

    def request(self, i: int, j: int) -> asyncio.Future:
        """Device i's pull request to neighbour j, made at i's return (now): a future of the
        answer, as :meth:`sfg.net.transport.Peer.pull` gives it (``(header, payload, held)``,
        ``EMPTY``, ``UNREACHABLE`` or None: none), resolved when it arrives at i. The
        requests of one return are made at one instant, in the order of the neighbours' ids."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        fut = loop.create_future()
        b = self._batch.get(i)
        if b is None or b[0] != now:  # a new return: the uplink held nothing still to send
            nth = self._returns[i] = self._returns.get(i, -1) + 1
            b = self._batch[i] = [now, 0, nth]
            self.uplink_free[i] = now
        k, nth = b[1], b[2]
        b[1] += 1
        tx_end = transfer_end(now, k, self.seconds(i, HEADER_BYTES))
        self.uplink_free[i] = tx_end
        self._queued[i] = now
        sent = tx_end <= self.horizon and (self.online is None or self.online(i, now, tx_end))
        self.stats["pull_requests"] = self.stats.get("pull_requests", 0) + int(sent)
        drop, extra = self._pull_drop(self.request_key, i, j, nth, tx_end, 2)
        arrival = arrival_time(tx_end, float(self.latency(i, j)), extra)
        if not sent or drop or not arrival < self.horizon:
            fut.set_result(None)  # silent: the returning node waits S for it
            return fut
        at = self._arrivals.get(arrival)
        if at is None:
            at = self._arrivals[arrival] = []
            # answered in the instant's arrival phase, after its timers (and the "unreachable"
            # answers they bring), in the engine's order (docs/concepts/clock.md#one-instant)
            loop.call_at_phase(arrival, Phase.ARRIVAL, self._serve,  # type: ignore[attr-defined]
                               arrival)
        at.append((j, i, nth, k, fut))
        return fut

    def _serve(self, q: float) -> None:
        """The pull requests arriving at ``q``, in the clock's engine's order (by the
        neighbour, then the returning device and its return): first the "unreachable"
        answers (a target offline refuses the connection), then, once the instant's answers
        that arrive with them are taken (:attr:`sfg.clock.instant.Phase.PULL_END`), the
        replies (docs/concepts/clock.md#one-instant)."""
        loop = asyncio.get_running_loop()
        answered = []
        for j, i, nth, k, fut in sorted(self._arrivals.pop(q), key=lambda r: r[:4]):
            srv = self.servers.get(address(j))
            if srv is None or srv.pull is None or (
                    srv.refusal is not None and srv.refusal(i) == OFFLINE):
                self._unreachable(q, j, i, fut)
            else:
                answered.append((j, i, nth, k, fut))
        if answered:
            loop.call_at_phase(q, Phase.PULL_END, self._answer,  # type: ignore[attr-defined]
                               q, answered)

    def _unreachable(self, q: float, j: int, i: int, fut: asyncio.Future) -> None:
        """j refuses i's request arriving at ``q``: answered as a refused connection is."""
        self.stats["pull_unreachable"] = self.stats.get("pull_unreachable", 0) + 1
        asyncio.get_running_loop().call_at(q + float(self.latency(j, i)), _resolve, fut,
                                           UNREACHABLE)

    def _answer(self, q: float, answered: list) -> None:
        """The replies (a model, empty, or none) of the requests arriving at ``q`` that were
        not refused (:meth:`_serve`)."""
        loop = asyncio.get_running_loop()
        for j, i, nth, _k, fut in answered:
            srv = self.servers.get(address(j))
            got = OFFLINE if srv is None or srv.pull is None else srv.pull(i)
            if got == OFFLINE:
                self._unreachable(q, j, i, fut)
                continue
            if got == SILENT:
                _resolve(fut, None)
                continue
            model = got is not None
            drop, extra = self._pull_drop(self.reply_key, j, i, nth, q, 3)
            size = (self.message_bytes or 0.0) if model else HEADER_BYTES
            _, end = self.reserve(j, q, self.seconds(j, size), alone=True)
            sent = end <= self.horizon and (self.online is None or self.online(j, q, end))
            name = "pull_replies" if model else "pull_empty"
            self.stats[name] = self.stats.get(name, 0) + int(sent)
            if model and not sent and srv.unsent is not None:
                srv.unsent(got[0])
            arr = arrival_time(end, float(self.latency(j, i)), extra)
            ok = sent and not drop and arr < self.horizon and \
                (self.online is None or self.online(i, arr, arr))
            if not ok:
                _resolve(fut, None)
                continue
            if model:
                h, p, held = got
                body = b"".join(p) if isinstance(p, tuple) else bytes(p)
                self.note(src=j, dst=i, kind="pull", changed=False, header=h, ok=True, reason="")
                loop.call_at(arr, _resolve, fut, (h, body, held))
            else:
                loop.call_at(arr, _resolve, fut, EMPTY)


async def _until(t: float) -> None:
    """Wait until the loop's instant ``t`` exactly (a timer at ``t``, not ``now + (t −
    now)``, which floats may round to another instant); at once (yielding) when it has
    passed."""
    loop = asyncio.get_running_loop()
    if t <= loop.time():
        await asyncio.sleep(0)
        return
    fut = loop.create_future()
    loop.call_at(t, _resolve, fut, None)
    await fut


class MemoryServer:
    def __init__(self, net: MemoryNetwork, i: int, deliver, fetch, pull=None, unsent=None,
                 refusal=None):
        self.net, self.i, self.deliver, self.fetch = net, i, deliver, fetch
        self.pull = pull  # answers pulls (sfg.net.returns.serve_pull); None: none
        self.unsent = unsent  # told of a reply that never left (sfg.net.returns.reply_unsent)
        self.refusal = refusal  # whether it refuses a pull now (sfg.net.returns.pull_refusal)
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
        _, end = net.reserve(self.src, now, net.seconds(self.src, size))
        # busy until the broadcast has left, or the device has gone offline
        net.busy[self.src] = end if net.next_off is None else min(end, net.next_off(self.src, now))
        if end > now:
            await _until(end)
        net.stats["sent"] += 1
        if net.log is not None:
            net.note(src=self.src, dst=self.dst, kind="send", changed=False, header=header,
                     ok=True, reason="")
        if net.online is not None and not net.online(self.src, now, end):
            net.stats["lost_sender"] += 1
            return False, "lost"
        reached = True  # without faults: the receiver is there at the arrival (the engine's
        if net.faults is None:  # order: a receiver's absence before the link's loss)
            at = arrival_time(end, float(net.latency(self.src, self.dst)), 0.0)
            if not at < net.horizon:  # after the run's end, when no device is online
                net.stats["past_horizon"] += 1
                return False, "unavailable"
            reached = net.online is None or net.online(self.dst, at, at)
        if net.loss is not None and reached:
            p = net.loss(self.src, self.dst)
            if p > 0 and transfer_lost(net.loss_key, self.src, self.dst, k, p):
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
        transit = self._transit(header, sent,
                                arrival_time(end, float(net.latency(self.src, self.dst)), extra),
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

    async def _transit(self, header: bytes, sent, arrival: float, copies: int,
                       stranger: int | None, changed: bool) -> tuple[bool, str]:
        net = self.net
        await _until(arrival)
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

    async def pull(self, me: int, *, timeout: float = 10.0):
        """A returning node's pull of this neighbour (:meth:`MemoryNetwork.request`): the
        answer when it arrives. A reply arrives whenever its transfer says, after the
        returning node's time-out too (the clock's engine's later candidate), so ``timeout``
        bounds nothing here."""
        return await self.net.request(self.src, self.dst)

    async def close(self) -> None:
        return None
