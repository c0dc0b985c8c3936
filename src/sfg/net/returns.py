"""A node's returns and its pull on return (docs/concepts/nodes.md#returns-in-the-node).

``pull_timeout`` (``on_return: pull:timeout=S``; docs/concepts/clock.md#returns-in-time): at a
return — the start of an online row after an offline one (not the run's start), or a restart
once online (:func:`sfg.net.asyncmode.return_time`) — an async node asks every neighbour
(under peers other than fixed: S devices drawn for the return) for its latest sent message
(:func:`pull_at`: ``Fetch`` with ``pull``, :meth:`sfg.net.transport.Peer.pull`; on the
virtual clock :meth:`sfg.net.memory.MemoryPeer.pull`, with the clock's engine's times), and
its first local round waits until each has answered (a reply, empty, unreachable) or S
seconds have passed. A
reply goes through the checks of any message (:func:`sfg.net.inbox.check`) and is a candidate
whose waited staleness starts at its sending: d = (held + now − arrival)/P; one not newer, by
the sender's round, than what the node holds from that neighbour changes nothing
(:func:`sfg.net.inbox.accept`). A node answers its neighbours' pulls with the latest message
it sent (:func:`serve_pull`). :func:`result` is what a node reports of its returns.

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sfg.net import inbox
from sfg.net.outgoing import header_for
from sfg.net.transport import EMPTY, OFFLINE, SILENT, UNREACHABLE
from sfg.net.wire import MEMBER_BYTES, Chunked, Rejected, unpack_header


async def pull_at(node: Any, t_ret: float) -> None:
    """At ``t_ret``, ask every neighbour for its latest sent message; return when each
    has answered (a reply, empty or unreachable) or S seconds have passed. A neighbour
    across a cut is asked and stays silent; a reply the checks reject, or none within
    the time-out, is no answer. A call still running at the window's end goes on (up to
    the RPC time-out): a reply that arrives later is an ordinary candidate for later
    aggregations, as on the clock (docs/concepts/clock.md#returns-in-time)."""
    delay = t_ret - node.clock.time()
    if delay > 0:
        await asyncio.sleep(delay)
    assert node.cfg.pull_timeout is not None
    S = float(node.cfg.pull_timeout)
    end = node.clock.monotonic() + S
    # the graph's neighbours, or under peers other than fixed the S drawn for this return,
    # in the order they are asked (docs/concepts/peers.md#the-node-on-the-clock)
    nbrs = [int(j) for j in node.nbrs] if node.membership.fixed else \
        node.membership.pull_targets()
    node.stats.requests += len(nbrs)
    asked = [j for j in nbrs if not node.blocked(j, node.round)]
    late = max(S, float(node.cfg.rpc_timeout))  # a reply after the window still counts
    tasks = [asyncio.ensure_future(pull_one(node, j, late)) for j in asked]
    got: list[str] = []
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=S)
        got = [t.result() for t in done if not t.cancelled() and t.exception() is None]
        node.backlog.extend(pending)  # bounded by their own time-out (the RPC's)
    answers = sum(1 for a in got if a)
    if not any(a in ("reply", "empty") for a in got):  # no online, reachable neighbour
        node.stats.returns_alone += 1
    if answers < len(nbrs):  # someone is silent: the window lasts S
        rest = end - node.clock.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)


async def pull_one(node: Any, j: int, S: float) -> str:
    """One pull from neighbour ``j``: its answer, ``reply``, ``empty`` or
    ``unreachable``, or ``""`` for none (no answer in time, a failed call, a rejected reply)."""
    try:
        got = await node.peers[j].pull(node.i, timeout=S)
    except Rejected as e:
        node.stats.pull_rejected += 1
        node.rejections.add(e, f"pull from {j}")
        return ""
    if got is UNREACHABLE:
        node.stats.unreachable += 1
        node.membership.forget(j)  # (online: j leaves the table)
        return "unreachable"
    if got is EMPTY:
        node.stats.empty += 1
        node.membership.heard_of(j, node.clock.monotonic())  # (online: j is there)
        return "empty"
    if got is None:  # no answer in time, or a failed call
        return ""
    raw, payload, held = got
    node.stats.pull_bytes += len(raw) + len(payload)
    t_in = node.clock.time()
    if not node.available_at(t_in):  # arrived while this node is offline: lost
        node.stats.pull_lost += 1
        return ""
    try:
        # with TLS the pull's channel accepted only node j's certificate (Peer.pull)
        msg = inbox.check(node, raw, payload,
                          identity=j if node.cfg.tls is not None else None)
        if msg.header.sender != j:
            raise Rejected("header", f"a pull reply from node {j} carries node "
                                     f"{msg.header.sender}'s message")
    except Rejected as e:
        node.stats.pull_rejected += 1
        node.rejections.add(e, f"pull from {j}")
        return ""
    node.stats.replies += 1
    inbox.accept(node, msg, len(raw) + len(payload), t_in, held=held)
    return "reply"


def pull_refusal(node: Any, who: int) -> str | None:
    """Whether this node refuses ``who``'s pull now, and how: ``OFFLINE`` while it is offline
    (or not async), ``SILENT`` across a network cut or to a non-neighbour; None: it answers
    (:func:`serve_pull`). No side effect: the virtual network asks it first, to give the
    instant's "unreachable" answers before it takes the requests it answers."""
    if node.cfg.mode != "async" or not node.available_at(node.clock.time()):
        return OFFLINE
    if who not in node.nbr_set or node.blocked(who, node.round):
        return SILENT
    return None


def serve_pull(node: Any, who: int) -> tuple[bytes, bytes | Chunked, float] | None | str:
    """Answer a returning neighbour's pull: the latest message this node sent, header and
    model as sent (under peers ``online`` its membership entries taken now), and the seconds
    since it sent it; None (an empty answer) if it never sent; ``OFFLINE`` while it is
    offline (or not async); ``SILENT`` across a network cut or to a non-neighbour."""
    refused = pull_refusal(node, who)
    if refused is not None:
        if who not in node.nbr_set:
            node.rejections.add(Rejected("non-neighbour", f"a pull by node {who}"))
        return refused
    now = node.clock.monotonic()
    # peers online: the asking node is heard of (on the virtual clock once the instant's
    # requests are answered: each reply carries the table as it stood before its arrivals)
    node.membership.heard_of(who, now)
    if node.last_sent is None:
        return None
    msg, sent_at = node.last_sent
    header = header_for(msg, who)
    if header is None:
        return None
    node.stats.answered_pulls += 1
    return node.membership.reply_header(header, now), msg[1], max(0.0, now - sent_at)


def reply_unsent(node: Any, header: bytes) -> None:
    """The virtual network's word that a reply this node made never left (it went offline
    before its transfer ended): its membership entries do not count as sent."""
    node.membership.unsent(len(unpack_header(header).members) // MEMBER_BYTES, reply=True)


def result(node: Any) -> dict[str, Any] | None:
    """An async node's returns and, with pull, its requests and answers; None for a
    lockstep node."""
    if node.cfg.mode != "async":
        return None
    s = node.stats
    out: dict[str, Any] = {"returns": s.returns, "returns_heard": s.returns_heard}
    if node.cfg.pull_timeout is not None:
        out.update(returns_alone=s.returns_alone, requests=s.requests, replies=s.replies,
                   replies_unused=s.replies_unused, empty=s.empty,
                   unreachable=s.unreachable, rejected=s.pull_rejected,
                   bytes=s.pull_bytes, wait_s=s.wait_s, abandoned=s.abandoned,
                   lost=s.pull_lost, answered=s.answered_pulls)
    return out
