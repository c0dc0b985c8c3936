"""The lockstep protocol of a node (docs/concepts/nodes.md#lockstep-mode).

At round t an available node sends its start-of-round model and scalars (τ, ℓ, n, local
count) to every neighbour that is available and linked at t (the trace is common knowledge),
waits (with a deadline) for those neighbours' round-t messages (under ``peers`` ``epidemic``:
sends to its S targets drawn for round t and waits for the devices whose round-t draw names
it, :meth:`sfg.net.membership.Membership.expected`), fetching any that were not
pushed (``Fetch``, :func:`wait`), then aggregates (:func:`sfg.net.localround.aggregate`), trains
and updates its state — exactly docs/concepts/round.md#one-round,
docs/concepts/staleness.md#the-staleness-state, so the models equal ``sfg run --backend loop``.
Its own messages stay in ``node.outbox`` (served to a ``Fetch``: :func:`serve_fetch`) until
every neighbour expecting them is past their round (:func:`prune_outbox`); the run ends once
each was handed out (:func:`all_handed_out`).

**Certified claims** (``+certified``): every header carries the evidence of its claim, signed
(:mod:`sfg.net.outgoing`); a receiver checks it on arrival and leaves out, when it aggregates,
the claims the evidence refutes (:class:`sfg.net.evidence.CertifiedEvidence`); what it keeps of
the round (:class:`sfg.net.evidence.Prev`) backs its next claims.

Each function takes the node (a :class:`sfg.net.node.Node`) first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sfg.errors import SfgError
from sfg.net import inbox, outgoing
from sfg.net.claims import own_claim
from sfg.net.evidence import Prev
from sfg.net.localround import aggregate, commit, train
from sfg.net.wire import Chunked, Rejected


async def run(node: Any) -> None:
    """The node's remaining rounds, then the wait until its messages were handed out."""
    T = node.world.rounds
    while node.state.t < T:
        r = node.round = node.state.t
        await one_round(node, r)
        node.end_round(r, bool(node.world.available[r, node.i]))
    await outgoing.drain(node)
    # wait until every neighbour has the messages it needs (pushed or pulled); what is
    # left stays served until the server stops: a pull's reply can be lost after this
    # node handed it out, and the neighbour then pulls again
    end = node.clock.monotonic() + node.cfg.deadline
    while True:
        prune_outbox(node)
        if all_handed_out(node) or node.clock.monotonic() > end:
            break
        await asyncio.sleep(0.05)
    node.files.save_outbox(node.outbox, node.expected)  # drop what nobody needs any more


async def one_round(node: Any, r: int) -> None:
    """Round ``r``: send, wait for the neighbours' messages, aggregate, train, commit."""
    A = node.world.available
    if not A[r, node.i]:
        if node.keeps_prev:
            node.evidence.prev = Prev(aggregated=False, own=own_claim(node.state))
        node.offline_round()
        return
    expected = [int(j) for j in node.nbrs if A[r, j] and not node.blocked(int(j), r)]
    targets = expected
    if not node.membership.fixed:  # epidemic: the keyed draws say who sends to whom
        drawn = node.membership.targets(r)
        targets = [j for j in drawn if A[r, j] and not node.blocked(j, r)]
        # a target offline in round r (common knowledge in lockstep): the message is lost
        node.membership.offline += sum(1 for j in drawn if not A[r, j])
        expected = node.membership.expected(r, A[r], lambda j: node.blocked(j, r))
    own = own_claim(node.state) if node.keeps_prev else None
    msg = outgoing.message(node, targets)
    node.outbox[r] = msg
    node.expected[r] = targets
    prune_outbox(node)
    outgoing.send_all(node, targets, msg)
    await wait(node, r, expected)
    msgs = [node.inbox.pop((j, r)) for j in expected]
    for key in [k for k in node.inbox if k[1] < r]:
        del node.inbox[key]
    senders = expected
    if node.keeps_prev:
        assert own is not None
        prev = Prev(aggregated=True, own=own, heard=frozenset(expected),
                    got={j: (m.header.age, m.header.lag, m.header.count)
                         for j, m in zip(expected, msgs, strict=True)},
                    told=node.evidence.told)
        if node.certified:
            senders, msgs, n_refuted = node.evidence.screen(r, expected, msgs, prev)
            node.stats.checked += len(expected)
            node.stats.refuted += n_refuted
        node.evidence.prev = prev
    agg, full = aggregate(node, r, senders, msgs, [m.header.age for m in msgs],
                          [m.header.lag for m in msgs])
    x, n_steps = await train(node, r, agg)
    commit(node, x, n_steps, full)


async def wait(node: Any, r: int, expected: list[int]) -> None:
    """Wait for the round-``r`` messages of ``expected``, fetching the missing ones every
    ``pull_after`` seconds; past the deadline, an error."""
    start = node.clock.monotonic()
    last_pull = start
    while True:
        missing = [j for j in expected if (j, r) not in node.inbox]
        if not missing:
            return
        now = node.clock.monotonic()
        if now - start > node.cfg.deadline:
            raise SfgError(f"lockstep: node {node.i} did not get the round-{r} models of "
                           f"neighbour(s) {missing} within {node.cfg.deadline:g} s; are those "
                           "nodes running? (raise --deadline for slow machines)")
        if now - last_pull >= node.cfg.pull_after:
            last_pull = now
            await fetch(node, r, missing)
            continue
        node.arrived.clear()
        try:
            await asyncio.wait_for(node.arrived.wait(), timeout=node.cfg.pull_after)
        except asyncio.TimeoutError:
            pass


async def fetch(node: Any, r: int, missing: list[int]) -> None:
    """Ask each of ``missing`` for its round-``r`` message (``Fetch``); take what passes."""
    got = await asyncio.gather(*(node.peers[j].fetch(r, node.i, timeout=node.cfg.rpc_timeout)
                                 for j in missing), return_exceptions=True)
    for j, m in zip(missing, got, strict=True):
        if isinstance(m, Rejected):  # the reply ran past its limits: stopped
            node.rejections.add(m, f"fetch from {j}")
            continue
        if isinstance(m, BaseException):
            raise m
        if m is None:
            continue
        try:
            msg = inbox.check(node, m[0], m[1])
            if msg.header.sender != j or msg.header.round != r:
                raise Rejected("header", "fetched message of another node or round")
            if node.certified and not node.evidence.admit(msg, m[0], node.round):
                continue
        except Rejected as e:
            node.rejections.add(e, f"fetch from {j}")
            continue
        inbox.accept(node, msg, len(m[0]) + len(m[1]))


def prune_outbox(node: Any) -> None:
    """Drop own round-r messages every neighbour expecting them is past: a neighbour that
    sent a message of a later round has finished round r. A delivery is no proof (the
    receiver may crash and restart from its checkpoint before using it; the reply to a
    pull may be lost on the way), see :func:`all_handed_out`."""
    for r in list(node.outbox):
        if all(node.heard.get(j, -1) > r for j in node.expected.get(r, ())):
            del node.outbox[r]
            node.expected.pop(r, None)


def all_handed_out(node: Any) -> bool:
    """Whether every message left in the outbox was pushed to, or pulled by, every
    neighbour expecting it (the end of a run: nothing more to wait for)."""
    return all(node.heard.get(j, -1) > r or (j, r) in node.delivered
               for r in node.outbox for j in node.expected.get(r, ()))


def serve_fetch(node: Any, t: int, who: int) -> tuple[bytes, bytes | Chunked] | None:
    """The server's answer to neighbour ``who``'s ``Fetch`` of round ``t``: the own message
    as sent (None: none kept)."""
    msg = node.outbox.get(t)
    if msg is None:
        return None
    header = outgoing.header_for(msg, who)
    if header is None:
        return None
    if who in node.nbr_set:
        node.delivered.add((who, t))
    return header, msg[1]
