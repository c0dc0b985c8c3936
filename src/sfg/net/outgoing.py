"""What a node sends: its own message (:func:`message`) and the pushes to its neighbours.

An own message (:data:`Outgoing`) is a header and the model's payload: the header and the
model are its claim policy's (:mod:`sfg.net.claims`), with +certified's evidence signed into
it (:meth:`sfg.net.evidence.CertifiedEvidence.cert`). :func:`send_all` pushes it to each
target without waiting (a send never blocks the round on a neighbour that is gone): async
keeps only the latest send per neighbour, lockstep every round's (``node.backlog``).
The answers to a neighbour's ``Fetch`` (:func:`sfg.net.lockstep.serve_fetch`) and pull
(:func:`sfg.net.returns.serve_pull`) hand out the same messages.

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from sfg.net.transport import CHUNK
from sfg.net.wire import MEMBER_BYTES, Chunked, encode_params, make_header, payload_digest

# an own message: (header, payload), the payload in the transport's chunks or as bytes; the
# header one for all, or one per neighbour (a liar's per-receiver claims, claim=certified)
Outgoing = tuple[bytes | dict[int, bytes], bytes | Chunked]

log = logging.getLogger("sfg.net")


def header_for(msg: Outgoing, j: int) -> bytes | None:
    """The header of own message ``msg`` meant for neighbour ``j`` (None: none for j)."""
    h = msg[0]
    return h.get(int(j)) if isinstance(h, dict) else h


def message(node: Any, targets: Iterable[int] | None = None) -> Outgoing:
    """This round's own message for ``targets`` (default every neighbour), as the claim
    policy (``node.claims``) says: one header for all, or one per target (a liar's
    per-receiver claims, claim=certified); with +certified each header carries its
    evidence, signed (:meth:`sfg.net.evidence.CertifiedEvidence.cert`)."""
    s = node.state
    payload = encode_params(node.claims.model(node), node.layout, chunk=CHUNK)
    digest = payload_digest(payload)
    targets = [int(j) for j in (node.nbrs if targets is None else targets)]
    # peers online: the M freshest entries of the node's table, as durations now
    # (docs/concepts/peers.md#real-nodes)
    members = node.membership.carried(node.clock.monotonic())
    node.membership.last = len(members) // MEMBER_BYTES

    def head(claim: tuple[int, float, int]) -> bytes:
        cert = node.evidence.cert(node.round, claim, len(node.nbrs)) if node.certified \
            else b""
        return make_header(digest, sender=node.i, round=node.round, age=claim[0],
                           lag=claim[1], count=claim[2], local_count=s.local_count,
                           cert=cert, sign=node.cfg.keys.sign if cert else None,
                           members=members)

    header: bytes | dict[int, bytes]
    if node.claims.per_receiver:
        told = {j: node.claims.claim_for(node, j) for j in targets}
        header = {j: head(c) for j, c in told.items()}
    else:
        claim = node.claims.claim(node)
        told = dict.fromkeys(targets, claim)
        header = head(claim)
    node.evidence.told = told
    return header, payload


async def send(node: Any, j: int, r: int, header: bytes, payload: bytes | Chunked,
               entries: int = 0) -> None:
    """Push round ``r``'s message to neighbour ``j`` (carrying ``entries`` membership
    entries) and count how it went."""
    ok, reason = await node.peers[j].deliver(header, payload, timeout=node.cfg.rpc_timeout,
                                             retries=node.cfg.retries)
    if reason == "lost" and node.cfg.mode == "async":
        # its sender went offline before it had left: never sent (lockstep fetches it)
        node.membership.unsent(entries)
    if ok:
        node.stats.sent += 1
        node.delivered.add((j, r))
    elif reason == "unavailable":
        node.stats.offline_peer += 1  # the neighbour is offline: its server refuses
    else:
        node.stats.send_failed += 1
        log.info("node %d -> %d round %d not delivered: %s", node.i, j, node.round, reason)


def send_all(node: Any, targets: Iterable[int], msg: Outgoing) -> None:
    """Hand ``msg`` to the transport for each of ``targets`` (see the module docstring)."""
    for j in targets:
        j = int(j)
        prev = node.sends.get(j)
        if prev is not None and not prev.done():
            if node.cfg.mode == "async":
                prev.cancel()  # only the latest model matters: never pile up sends
            else:
                node.backlog.append(prev)  # lockstep needs every round's message
        header = header_for(msg, j)
        if header is None:
            continue
        node.stats.header_bytes += len(header)
        node.stats.headers += 1
        node.membership.entries += node.membership.last
        node.sends[j] = asyncio.ensure_future(send(node, j, node.round, header, msg[1],
                                                   node.membership.last))
    node.backlog = [t for t in node.backlog if not t.done()]


async def drain(node: Any) -> None:
    """Wait (up to the RPC time-out) for the sends and pulls still in flight."""
    waiting = [t for t in [*node.sends.values(), *node.backlog] if not t.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=node.cfg.rpc_timeout)
