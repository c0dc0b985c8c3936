"""A node's inbox: the checks on what arrives, and what the node keeps of it.

Every message a :class:`~sfg.net.node.Node` takes — pushed to its server (:func:`deliver`),
fetched by lockstep (:func:`sfg.net.lockstep.wait`) or pulled on a return
(:func:`sfg.net.returns.pull_one`) — passes :func:`check` (:func:`sfg.net.wire.check_message`
with the node's neighbours and limits) and is taken by :func:`accept`: lockstep keeps it by
(sender, round) in ``node.inbox`` and notes the latest round each neighbour sent
(``node.heard``); async keeps each sender's latest in ``node.latest`` (``node.held`` for a
pull's reply); both note the count each neighbour claimed (``node.claimed``) and wake a waiting
round (``node.arrived``). A node refuses deliveries while it is unavailable or cut off
(:func:`accepting`); lockstep bounds what a neighbour may have waiting (:func:`check_ahead`).

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sfg.net.membership import reject_unexpected
from sfg.net.wire import Message, Rejected, check_header, check_message, unpack_header


def check(node: Any, raw_header: bytes, payload: bytes, **kw: Any) -> Message:
    """The checks of any message this node takes (:func:`sfg.net.wire.check_message` with
    its neighbours — every other device of the run under peers other than fixed — and size
    limit, then the membership entries its header carries,
    :meth:`sfg.net.membership.Membership.check`; ``kw``: ``identity``, ``parsed``)."""
    msg = check_message(raw_header, payload, node.layout, neighbours=node.nbr_set,
                        max_bytes=node.cfg.max_bytes, **kw)
    node.membership.check(msg.header)
    return msg


def accepting(node: Any, sender: int, r: int, t: float | None = None) -> bool:
    """Whether the node takes ``sender``'s round-``r`` delivery (at time ``t``, async)."""
    if node.cfg.mode == "lockstep":
        # an unavailable node answers no message of a round it is offline in
        return bool(node.world.available[min(r, node.world.rounds - 1), node.i]) \
            and not node.blocked(sender, r)
    return node.available_at(node.clock.time() if t is None else t) and \
        not node.blocked(sender, node.round)


async def deliver(node: Any, raw_header: bytes, chunks: AsyncIterator[bytes],
                  identity: int | None, peer: str) -> tuple[bool, str]:
    """The server's handler of a push: (taken, the reason it was not)."""
    try:
        if not raw_header:  # a call cancelled before its first message, or an empty one
            await asyncio.sleep(0.05)
            raise Rejected("truncated", "empty stream")
        header = unpack_header(raw_header)
        check_header(header, neighbours=node.nbr_set, max_bytes=node.cfg.max_bytes,
                     identity=identity)
        t_in = node.clock.time()
        if not accepting(node, header.sender, header.round, t_in):
            node.stats.refused += 1
            return False, "unavailable"
        if node.cfg.mode == "lockstep":
            reject_unexpected(node.membership, header.sender, header.round)
            check_ahead(node, header.sender, header.round)
        node.membership.check(header)  # before the payload is read
        parts, size = [], 0
        async for c in chunks:
            parts.append(c)
            size += len(c)
            if size > header.length:
                raise Rejected("oversize", f"payload exceeds the announced {header.length} bytes")
        if size < header.length:
            # a sender that cancels its call (it has a newer model, or is shutting down)
            # ends the stream early too; gRPC then cancels this handler within moments,
            # so only a stream that was really closed short is counted as truncated
            await asyncio.sleep(0.05)
        msg = check(node, raw_header, b"".join(parts), identity=identity, parsed=header)
        if node.certified and not node.evidence.admit(msg, raw_header, node.round):
            return True, ""  # the same message again (a retried push): nothing changes
    except Rejected as e:
        node.rejections.add(e, peer)
        return False, e.reason
    accept(node, msg, len(raw_header) + msg.header.length, t_in)
    return True, ""


def check_ahead(node: Any, sender: int, r: int) -> None:
    """Lockstep bound on what a neighbour may have waiting here: a neighbour cannot pass a
    round in which both are available without this node's message, so it is at most one
    such round ahead — at most two of its messages (rounds >= this node's) are pending.
    Under ``epidemic`` a sender need not wait for this node, so it may be further ahead: its
    messages are bounded instead by the rounds whose draw names this node
    (:func:`sfg.net.membership.reject_unexpected`), at most the run's rounds."""
    if r >= node.world.rounds:
        raise Rejected("ahead", f"round {r} is past the run's {node.world.rounds} rounds")
    if not node.membership.fixed:
        return
    pending = [k for k in node.inbox if k[0] == sender and k[1] >= node.round]
    if (sender, r) not in node.inbox and len(pending) >= 2:
        raise Rejected("ahead", f"node {sender} already has rounds "
                                f"{sorted(k[1] for k in pending)} waiting here")


def accept(node: Any, msg: Message, nbytes: int, t_in: float | None = None,
           held: float | None = None) -> None:
    """Take an accepted message. ``held``: a pull's reply, sent ``held`` seconds before it
    arrived (docs/concepts/nodes.md#returns-in-the-node): kept only if strictly newer, by
    the sender's round, than what the node holds from that sender (else nothing changes)."""
    h = msg.header
    now = node.clock.monotonic()
    if held is not None:
        old = node.latest.get(h.sender)
        if old is not None and h.round <= old[0].header.round:
            node.stats.replies_unused += 1
            node.membership.heard(h, now, float(held))  # (peers online: heard all the same)
            return
    node.log_event("arrival", t=node.clock.time() if t_in is None else t_in, m=now,
                   sender=h.sender, round=h.round, sha256=h.sha256.hex(), **h.scalars())
    if held is None:
        node.stats.bytes += nbytes
    # peers online: the sender and the entries it carries (sfg.net.membership)
    node.membership.heard(h, now, 0.0 if held is None else float(held))
    if node.cfg.record_headers:
        node.headers.append({"sender": h.sender, "receiver": node.i, "round": h.round,
                             **h.scalars()})
    if node.cfg.mode == "lockstep":
        node.heard[h.sender] = max(node.heard.get(h.sender, -1), h.round)
        if h.round >= node.round:
            node.inbox[(h.sender, h.round)] = msg
    else:
        old = node.latest.get(h.sender)
        if old is None or h.round >= old[0].header.round:
            node.latest[h.sender] = (msg, now)
            if held is None:
                node.held.pop(h.sender, None)
            else:
                node.held[h.sender] = float(held)
            node.guard.arrived(h.sender, h.sha256, now)  # +guard evidence: first arrival
    if h.round >= node.claimed_round.get(h.sender, -1):
        node.claimed_round[h.sender] = h.round
        node.claimed[h.sender] = h.count
    node.arrived.set()
