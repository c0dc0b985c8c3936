"""A networked node: one model, its data, its staleness state and a round clock (docs/concepts/nodes.md#networked-nodes).

::

    world = build_world({"n_clients": 8, "rounds": 20, "rule": "sfg-cut"})
    node = Node(world, 3, NodeConfig(mode="lockstep"))
    port = await node.start()                      # gRPC server on 127.0.0.1:port
    node.connect({j: f"127.0.0.1:{port_j}" ...})   # neighbours' addresses
    result = await node.run()

Each round the node trains (docs/concepts/round.md#one-round step 3, the simulator's own training pieces via
:class:`~sfg.net.world.Trainer`), sends its model with its staleness scalars to its
neighbours, and aggregates what it holds with the rule's one-receiver form
:meth:`sfg.round.rules.Rule.weights_one` — the rule code ``sfg run`` and ``sfg replay`` use.
Everything is asyncio; a send never blocks the round on a neighbour that is gone.

**Lockstep** (docs/concepts/nodes.md#lockstep-mode): at round t an available node sends its start-of-round model and
scalars (τ, ℓ, n, local count) to every neighbour that is available and linked at t (the trace
is common knowledge), waits (with a deadline) for those neighbours' round-t messages, pulling
any that were not pushed (``Fetch``), then aggregates, trains and updates its state — exactly
docs/concepts/round.md#one-round, docs/concepts/staleness.md#the-staleness-state, so the models equal ``sfg run --backend loop``.

**Async** (docs/concepts/nodes.md#asynchronous-mode): node i's round r starts at ``t0 + r·P + jitter`` on its own clock
(jitter uniform in [0, jitter·P), keyed by (seed, i, r)). Availability is row r of the trace.
An available node takes as candidates itself and every neighbour whose latest message arrived
within the last W periods; a message that waited d = (now − arrival)/P periods is used with
age τ_j + ⌊d⌋ and lag ℓ_j + d (counts unchanged) — the clock's engine's own selection
(:func:`sfg.clock.schedule.held_units`, :func:`sfg.round.staleness.waited`). It aggregates with those scalars, sets its
lag to the weighted mean of the lags as used, trains (age 0, counts + 1) and sends to all
neighbours. An unavailable node neither trains, sends nor answers (its server refuses
deliveries); each of its rounds adds 1 to its age and lag. q̂_ij is updated with "j is a
candidate" as the event. Timestamps are the receiver's own clock only.

**Returns** (``pull_timeout``, ``on_return: pull:timeout=S``; docs/concepts/nodes.md#returns-in-the-node,
docs/concepts/clock.md#returns-in-time): at a return — the start of an online row after an
offline one (not the run's start), or a restart once online — an async node asks every
neighbour for its latest sent message (``Fetch`` with ``pull``, :meth:`Peer.pull`; on the
virtual clock :meth:`sfg.net.memory.MemoryPeer.pull`, with the clock's engine's times) and its
first local round waits until each has answered (a reply, empty, unreachable) or S seconds
have passed. A reply goes through the checks of any message and is a candidate whose waited
staleness starts at its sending: d = (held + now − arrival)/P; one not newer, by the sender's
round, than what the node holds from that neighbour changes nothing.

**Claims** (:mod:`sfg.net.claims`): what a node puts in its headers is its claim policy's
(``claims=``, by default the one :func:`sfg.net.claims.claim_policy` picks from the run's
``--attack``): its true state, or an attacker's forged claims and model. A receiver whose rule
has ``+guard``/``+relative`` clamps the header claims with the round's compiled clamp
(:func:`sfg.round.defences.clamp_one`) before the rule scores them, ``+guard`` with its own
evidence (:class:`sfg.net.evidence.GuardEvidence`); its staleness update then uses the claims
as clamped, as in ``sfg run``.

**Certified claims** (``+certified``, lockstep): every header is signed with the node's key
(``NodeConfig.keys``) and carries the evidence of its claim; a receiver checks it on arrival
and leaves out, when it aggregates, the claims the evidence refutes
(:class:`sfg.net.evidence.CertifiedEvidence`, :mod:`sfg.net.certify`).

**Network cuts** (``NodeConfig.partitions``): :class:`sfg.net.cuts.Cut` in rounds.

**Checkpoints** (:mod:`sfg.net.persist`): after every round, if ``checkpoint_dir`` is set, the
node's model, state, own messages a neighbour may still need (lockstep) and evidence are
written atomically; a node started with ``resume=True`` continues from them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sfg.clock.schedule import held_units
from sfg.clock.settings import check_timer
from sfg.errors import SfgError
from sfg.net import persist
from sfg.net.checkpoints import NodeState, Star
from sfg.net.claims import HonestClaims, claim_policy, own_claim
from sfg.net.cuts import Cut
from sfg.net.diagnose import NodeDiagnostics
from sfg.net.evidence import CertifiedEvidence, GuardEvidence, Prev
from sfg.net.simclock import WALL, NodeClock
from sfg.net.transport import CHUNK, EMPTY, OFFLINE, SILENT, UNREACHABLE, Peer, Server, TlsFiles
from sfg.net.wire import (
    DEFAULT_MAX_BYTES,
    Chunked,
    Message,
    Rejected,
    Rejections,
    check_header,
    check_message,
    encode_params,
    make_header,
    payload_digest,
    unpack_header,
)
from sfg.net.world import Trainer, World
from sfg.round.defences import GUARD, RELATIVE, claims_as_given, clamp_one, weights_after
from sfg.round.kernel import rule_draws
from sfg.round.staleness import waited as _waited
from sfg.round.staleness import wake_jitter
from sfg.sim.gossip import weighted_sum

# an own message: (header, payload), the payload in the transport's chunks or as bytes; the
# header one for all, or one per neighbour (a liar's per-receiver claims, claim=certified)
Outgoing = tuple[bytes | dict[int, bytes], bytes | Chunked]


def header_for(msg: Outgoing, j: int) -> bytes | None:
    """The header of own message ``msg`` meant for neighbour ``j`` (None: none for j)."""
    h = msg[0]
    return h.get(int(j)) if isinstance(h, dict) else h


log = logging.getLogger("sfg.net")
MODES = ("lockstep", "async")


def waited(age: int, lag: float, d: float) -> tuple[int, float]:
    """Scalars of a message that sat in the inbox for ``d`` periods (docs/concepts/nodes.md#asynchronous-mode):
    :func:`sfg.round.staleness.waited`, the clock's own definition, on d ≥ 0."""
    a, lg = _waited(np.int64(age), float(lag), max(0.0, float(d)))
    return int(a), float(lg)


@dataclass
class NodeConfig:
    """How a node runs. Times in seconds."""

    mode: str = "lockstep"
    host: str = "127.0.0.1"
    port: int = 0
    period: float = 0.2          # async: round period P
    jitter: float = 0.0          # async: start-time jitter as a fraction of P
    window: float = 1.0          # async: W, periods within which a neighbour counts as live
    deadline: float = 60.0       # lockstep: longest wait for a round's messages
    pull_after: float = 0.5      # lockstep: pull a missing message after this long
    rpc_timeout: float = 10.0
    retries: int = 3
    max_bytes: int = DEFAULT_MAX_BYTES
    checkpoint_dir: Path | None = None
    resume: bool = False
    tls: TlsFiles | None = None
    partitions: tuple[Cut, ...] = ()    # network cuts in rounds (sfg.net.cuts)
    record_headers: bool = False
    t0: float | None = None      # async: start of round 0 on the node's clock (wall: time.time())
    linger: float | None = None  # async: keep answering this long after the last round
    on_round: Any = None         # callback(node_id, round, available, acc or None)
    events: Any = None           # event log (sfg.net.eventlog.EventLog): record(node, ev, fields)
    keys: Any = None             # +certified: sfg.net.certify.Keys (from the sfg tls-ca folder)
    pull_timeout: float | None = None  # async, on_return pull:timeout=S: S wall seconds (None: none)
    # evaluate after every eval_every-th round and the last; False: an observer reads the
    # node's model instead (the virtual swarm, at the clock's instants: sfg.net.virtual)
    evaluate: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SfgError(f"unknown mode {self.mode!r}; choose lockstep or async")
        for name in ("period", "deadline", "rpc_timeout"):
            if not getattr(self, name) > 0:
                raise SfgError(f"{name} must be > 0, got {getattr(self, name)}")
        check_timer(self.jitter, self.window)
        if self.pull_timeout is not None:
            S = self.pull_timeout
            if self.mode != "async":
                raise SfgError("on_return pull runs under the async protocol; under lockstep a "
                               "returning node already aggregates its neighbours' round models: "
                               "drop --on-return or choose --protocol async")
            if not (math.isfinite(S) and 0 < S < self.period):
                raise SfgError(f"on_return pull:timeout={S:g} must be > 0 and below the period "
                               f"P = {self.period:g} s (the wait must end before the next wake)")
        for p in self.partitions:
            if p.unit != "rounds":
                raise SfgError(f"a node's partitions are in rounds, not {p.unit} "
                               f"({p.text()}); write --cut A|B@R1r-R2r")


@dataclass
class _Stats:
    messages: int = 0            # neighbour models aggregated (received and used)
    bytes: int = 0               # bytes of accepted messages
    sent: int = 0
    send_failed: int = 0         # not delivered: transport error or rejection
    offline_peer: int = 0        # refused by a neighbour that is offline
    refused: int = 0             # deliveries refused while unavailable or partitioned
    steps: int = 0
    trains: int = 0
    available_rounds: int = 0
    checked: int = 0             # +certified: neighbour claims checked against their evidence
    refuted: int = 0             # +certified: of those, refuted (left out, as lost messages)
    header_bytes: int = 0        # bytes of the headers of own messages handed to the transport
    headers: int = 0             # own messages handed to the transport (one per neighbour)
    interrupted: int = 0         # async: local rounds discarded (offline before K steps)
    unfinished: int = 0          # async, virtual clock: local rounds discarded (ending after the run)
    skipped: int = 0             # async, virtual clock: wakes while still busy
    # returns (docs/concepts/nodes.md#returns-in-the-node), counted with or without pull
    returns: int = 0             # returns: an online row after an offline one, a restart online
    returns_heard: int = 0       # of those, whose first aggregation held a neighbour's model
    returns_alone: int = 0       # pull: of those, with no neighbour answering (all unreachable/silent)
    requests: int = 0            # pull requests sent (one per neighbour and return)
    replies: int = 0             # replies accepted by the checks
    replies_unused: int = 0      # of those, not newer than what the node held (changed nothing)
    empty: int = 0               # empty answers (the neighbour never sent)
    unreachable: int = 0         # unreachable answers (offline, not running)
    pull_rejected: int = 0       # replies the checks rejected (also in the rejections)
    pull_bytes: int = 0          # bytes of replies received
    pull_lost: int = 0           # replies that arrived while this node was offline again
    wait_s: float = 0.0          # delay of first local rounds after returns (wall seconds)
    abandoned: int = 0           # waits abandoned: offline inside the window
    answered_pulls: int = 0      # pulls this node answered with a message
    curve: list[tuple[int, float]] = field(default_factory=list)


class Node:
    """One networked node; see the module docstring for the protocol."""

    def __init__(self, world: World, i: int, config: NodeConfig | None = None,
                 trainer: Trainer | None = None, *, net: Any = None,
                 clock: NodeClock | None = None, claims: HonestClaims | None = None):
        self.world, self.i = world, int(i)
        self.cfg = config or NodeConfig()
        if self.cfg.pull_timeout is None:  # the run's on_return (docs/concepts/nodes.md#returns-in-the-node)
            from sfg.clock.settings import parse_on_return

            S = parse_on_return(world.cfg.get("on_return"))
            if S is not None:
                self.cfg = replace(self.cfg, pull_timeout=S)  # checked as any NodeConfig
        # the transport (gRPC unless ``net``, e.g. sfg.net.memory.MemoryNetwork) and the clock
        # (the wall clock unless a virtual one, sfg.net.simclock): the protocol code is the same
        self.net = net
        self.clock = clock or WALL
        self.nbrs = world.neighbours(self.i)
        self.nbr_set = frozenset(int(j) for j in self.nbrs)
        self.pos = {int(j): k + 1 for k, j in enumerate(self.nbrs)}  # star index
        self.star = Star(len(self.nbrs), world.rule)
        self.trainer = trainer or Trainer(world, self.i)
        self.layout = world.layout
        self.x = world.x0.copy()
        self._owed = 0  # offline rounds not yet applied to the state (see the state property)
        self._state: NodeState = NodeState(q_hat=[1.0] * len(self.nbrs))
        self.stats = _Stats()
        self.rejections = Rejections(self.i)
        self.headers: list[dict] = []     # accepted headers' scalars (record_headers)
        self.weights: list[dict] = []     # each aggregation's weights (record_headers)
        self.guard = GuardEvidence()                    # +guard: content digest, first seen
        self.claimed: dict[int, int] = {}               # latest count each neighbour claimed
        self._claimed_round: dict[int, int] = {}
        # the rule that scores claims the node has already clamped (sfg.round.defences.clamp_one)
        self._scorer = claims_as_given(world.rule)
        self.restored: dict | None = None
        self.loaded: tuple[np.ndarray, NodeState] | None = None
        if net is None:
            self.server: Any = Server(self._on_deliver, self._on_fetch,
                                      max_bytes=self.cfg.max_bytes, tls=self.cfg.tls,
                                      refused=self.rejections.add, pull=self._on_pull)
        else:
            if self.cfg.pull_timeout is not None and not hasattr(net, "request"):
                raise SfgError("on_return pull needs a network that carries pulls (gRPC, or "
                               "the virtual clock's sfg.net.memory); this one does not")
            # the virtual clock's network (sfg.net.memory) carries pulls with the clock's
            # engine's times (docs/concepts/clock.md#returns-in-time)
            self.server = net.server(self.i, self._on_deliver, self._on_fetch,
                                     max_bytes=self.cfg.max_bytes, tls=self.cfg.tls,
                                     **({"pull": self._on_pull} if hasattr(net, "request")
                                        else {}))
        self.peers: dict[int, Any] = {}
        self.outbox: dict[int, Outgoing] = {}                  # own messages by round
        self.expected: dict[int, list[int]] = {}                   # who needs each of them
        self.heard: dict[int, int] = {}                            # latest round from each
        self._delivered: set[tuple[int, int]] = set()               # (neighbour, round) pushed
        self.inbox: dict[tuple[int, int], Message] = {}         # lockstep: (sender, round)
        self.latest: dict[int, tuple[Message, float]] = {}      # async: sender -> (msg, arrival)
        # async: sender -> held, when its latest message is a pull's reply (its waiting started
        # held seconds before its arrival; docs/concepts/nodes.md#returns-in-the-node)
        self.held: dict[int, float] = {}
        self.last_sent: tuple[Outgoing, float] | None = None     # async: own latest, sent at
        self._restarted = bool(self.cfg.resume)   # a return at the first online round
        self._returning = False                   # the next aggregation is a return's first
        self._pull: asyncio.Task | None = None    # the return's pull (its window)
        self._arrived = asyncio.Event()
        self.round = 0
        self.t0 = self.cfg.t0
        self.diagnostics = NodeDiagnostics.for_node(self)  # docs/concepts/diagnostics.md#training-diagnostics (None: none asked for)
        self.files = persist.NodeFiles(self.cfg.checkpoint_dir, self.i)
        self._sends: dict[int, asyncio.Task] = {}
        self._backlog: list[asyncio.Task] = []
        # what the node claims (sfg.net.claims), +certified's evidence (sfg.net.evidence)
        self.claims = claim_policy(world, self.i) if claims is None else claims
        self.certified = bool(world.rule.certified)
        from sfg.net.certify import NO_KEYS, check_run

        check_run(world, self.cfg.mode)
        if self.certified and self.cfg.keys is None:
            raise SfgError(NO_KEYS)
        self.evidence = CertifiedEvidence(self.i, self.cfg.keys, world.neighbours)
        if self.cfg.resume:
            persist.restore(self)
        self._log("open", resume=bool(self.cfg.resume),
                  restored=None if self.restored is None else int(self.restored["round"]))

    def _log(self, event: str, **fields: Any) -> None:
        """One event of the node's event log (:mod:`sfg.net.eventlog`); nothing without one."""
        if self.cfg.events is not None:
            self.cfg.events.record(self, event, fields)

    # ------------------------------------------------------------------ set-up
    @property
    def checkpoint_path(self) -> Path | None:
        return self.files.path

    async def start(self) -> int:
        """Start the gRPC server (after warming up the compiled round and the training
        backend, so that the round clock never waits on first-use set-up); returns the port."""
        self.warm_up()
        return await self.server.start(self.cfg.host, self.cfg.port)

    @property
    def state(self) -> NodeState:
        """The node's staleness state (docs/concepts/staleness.md#the-staleness-state). Offline rounds are owed, not applied one at
        a time: the first read after a run of them applies them all in one call of the
        compiled round (:meth:`Star.advance_offline`; the same state as one call per round,
        tested), since nothing reads the state while a node is offline."""
        if self._owed:
            self._state = self.star.advance_offline(self._state, self._owed)
            self._owed = 0
        return self._state

    @state.setter
    def state(self, value: NodeState) -> None:
        self._state, self._owed = value, 0

    @property
    def rounds_done(self) -> int:
        """The state's round index (``state.t``) without applying owed offline rounds."""
        return self._state.t + self._owed

    @property
    def prev(self) -> Prev | None:
        """What the node keeps of its previous lockstep round (:class:`sfg.net.evidence.Prev`;
        None before its first round, or when it keeps none: :attr:`keeps_prev`)."""
        return self.evidence.prev

    @property
    def keeps_prev(self) -> bool:
        """Whether the node keeps its previous round (+certified, or a claim policy that
        plays with it)."""
        return self.certified or self.claims.keeps_prev

    def pending_sends(self) -> int:
        """Sends handed to the transport and not yet done."""
        return sum(not t.done() for t in self._sends.values())

    def warm_up(self) -> None:
        """One throw-away weights call, staleness update and training step."""
        k = self.star.deg + 1
        self.world.rule.weights_one(ages=np.zeros(k, np.int64), t=0)
        self.star.advance(self.state, available=True, cand=np.ones(k, bool),
                          weights=np.full(k, 1.0 / k), ages=np.zeros(k, np.int64),
                          lags=np.zeros(k), counts=np.ones(k, np.int64),
                          local_counts=np.ones(k, np.int64))
        self.trainer.train(self.x, 0, 0)

    def connect(self, addresses: dict[int, str]) -> None:
        """Open channels to the neighbours (``addresses``: id -> "host:port")."""
        missing = [int(j) for j in self.nbrs if int(j) not in addresses]
        if missing:
            raise SfgError(f"node {self.i}: no address for neighbour(s) {missing}; list every "
                           "node in peers.yaml")
        for j in self.nbrs:
            if self.net is None:
                self.peers[int(j)] = Peer(addresses[int(j)], max_bytes=self.cfg.max_bytes,
                                          tls=self.cfg.tls, refused=self.rejections.add,
                                          identity=int(j))
            else:
                self.peers[int(j)] = self.net.peer(self.i, addresses[int(j)],
                                                   max_bytes=self.cfg.max_bytes,
                                                   tls=self.cfg.tls)

    async def close(self) -> None:
        for task in [*self._sends.values(), *self._backlog]:
            task.cancel()
        for p in self.peers.values():
            await p.close()
        await self.server.stop()

    # ------------------------------------------------------------------ availability in time
    def _row(self, t: float) -> int:
        """Async: the trace row in force at time ``t`` of this node's clock: row r covers
        [t0 + r·P, t0 + (r+1)·P) (docs/concepts/clock.md#the-world-in-time: a round-based trace as online intervals)."""
        return int(math.floor((t - float(self.t0 or 0.0)) / self.cfg.period))

    def _available_at(self, t: float) -> bool:
        """Async: online at time ``t`` of this node's clock (before round 0 and after the last
        round the node keeps answering)."""
        if self.t0 is None:
            return True
        r = self._row(t)
        if r < 0 or r >= self.world.rounds:
            return True
        return bool(self.world.available[r, self.i])

    def _online_through(self, t0: float, t1: float) -> bool:
        """Async: online during all of [t0, t1) of this node's clock."""
        r0 = self._row(t0)
        r1 = max(r0, int(math.ceil((t1 - float(self.t0 or 0.0)) / self.cfg.period)) - 1)
        return all(self._available_at(float(self.t0 or 0.0) + (r + 0.5) * self.cfg.period)
                   for r in range(r0, r1 + 1))

    # ------------------------------------------------------------------ receiving
    def _blocked(self, j: int, r: int) -> bool:
        return self._blocked_pair(self.i, j, r)

    def _accepting(self, sender: int, r: int, t: float | None = None) -> bool:
        if self.cfg.mode == "lockstep":
            # an unavailable node answers no message of a round it is offline in
            return bool(self.world.available[min(r, self.world.rounds - 1), self.i]) \
                and not self._blocked(sender, r)
        return self._available_at(self.clock.time() if t is None else t) and \
            not self._blocked(sender, self.round)

    async def _on_deliver(self, raw_header: bytes, chunks: AsyncIterator[bytes],
                          identity: int | None, peer: str) -> tuple[bool, str]:
        try:
            if not raw_header:  # a call cancelled before its first message, or an empty one
                await asyncio.sleep(0.05)
                raise Rejected("truncated", "empty stream")
            header = unpack_header(raw_header)
            check_header(header, neighbours=self.nbr_set, max_bytes=self.cfg.max_bytes,
                         identity=identity)
            t_in = self.clock.time()
            if not self._accepting(header.sender, header.round, t_in):
                self.stats.refused += 1
                return False, "unavailable"
            if self.cfg.mode == "lockstep":
                self._check_ahead(header.sender, header.round)
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
            msg = check_message(raw_header, b"".join(parts), self.layout, neighbours=self.nbr_set,
                                max_bytes=self.cfg.max_bytes, identity=identity, parsed=header)
            if self.certified and not self.evidence.admit(msg, raw_header, self.round):
                return True, ""  # the same message again (a retried push): nothing changes
        except Rejected as e:
            self.rejections.add(e, peer)
            return False, e.reason
        self._accept(msg, len(raw_header) + msg.header.length, t_in)
        return True, ""

    def _check_ahead(self, sender: int, r: int) -> None:
        """Lockstep bound on what a neighbour may have waiting here: a neighbour cannot pass a
        round in which both are available without this node's message, so it is at most one
        such round ahead — at most two of its messages (rounds >= this node's) are pending."""
        if r >= self.world.rounds:
            raise Rejected("ahead", f"round {r} is past the run's {self.world.rounds} rounds")
        pending = [k for k in self.inbox if k[0] == sender and k[1] >= self.round]
        if (sender, r) not in self.inbox and len(pending) >= 2:
            raise Rejected("ahead", f"node {sender} already has rounds "
                                    f"{sorted(k[1] for k in pending)} waiting here")

    def _accept(self, msg: Message, nbytes: int, t_in: float | None = None,
                held: float | None = None) -> None:
        """Take an accepted message. ``held``: a pull's reply, sent ``held`` seconds before it
        arrived (docs/concepts/nodes.md#returns-in-the-node): kept only if strictly newer, by
        the sender's round, than what the node holds from that sender (else nothing changes)."""
        h = msg.header
        now = self.clock.monotonic()
        if held is not None:
            old = self.latest.get(h.sender)
            if old is not None and h.round <= old[0].header.round:
                self.stats.replies_unused += 1
                return
        self._log("arrival", t=self.clock.time() if t_in is None else t_in, m=now,
                  sender=h.sender, round=h.round, sha256=h.sha256.hex(), **h.scalars())
        if held is None:
            self.stats.bytes += nbytes
        if self.cfg.record_headers:
            self.headers.append({"sender": h.sender, "receiver": self.i, "round": h.round,
                                 **h.scalars()})
        if self.cfg.mode == "lockstep":
            self.heard[h.sender] = max(self.heard.get(h.sender, -1), h.round)
            if h.round >= self.round:
                self.inbox[(h.sender, h.round)] = msg
        else:
            old = self.latest.get(h.sender)
            if old is None or h.round >= old[0].header.round:
                self.latest[h.sender] = (msg, now)
                if held is None:
                    self.held.pop(h.sender, None)
                else:
                    self.held[h.sender] = float(held)
                self.guard.arrived(h.sender, h.sha256, now)  # +guard evidence: first arrival
        if h.round >= self._claimed_round.get(h.sender, -1):
            self._claimed_round[h.sender] = h.round
            self.claimed[h.sender] = h.count
        self._arrived.set()

    def _prune_outbox(self) -> None:
        """Drop own round-r messages every neighbour expecting them is past: a neighbour that
        sent a message of a later round has finished round r. A delivery is no proof (the
        receiver may crash and restart from its checkpoint before using it; the reply to a
        pull may be lost on the way), see :meth:`_all_handed_out`."""
        for r in list(self.outbox):
            if all(self.heard.get(j, -1) > r for j in self.expected.get(r, ())):
                del self.outbox[r]
                self.expected.pop(r, None)

    def _all_handed_out(self) -> bool:
        """Whether every message left in the outbox was pushed to, or pulled by, every
        neighbour expecting it (the end of a run: nothing more to wait for)."""
        return all(self.heard.get(j, -1) > r or (j, r) in self._delivered
                   for r in self.outbox for j in self.expected.get(r, ()))

    def _on_fetch(self, t: int, who: int) -> tuple[bytes, bytes | Chunked] | None:
        msg = self.outbox.get(t)
        if msg is None:
            return None
        header = header_for(msg, who)
        if header is None:
            return None
        if who in self.nbr_set:
            self._delivered.add((who, t))
        return header, msg[1]

    def _on_pull(self, who: int) -> tuple[bytes, bytes | Chunked, float] | None | str:
        """Answer a returning neighbour's pull (docs/concepts/nodes.md#returns-in-the-node):
        the latest message this node sent, header and model as sent, and the seconds since it
        sent it; None (an empty answer) if it never sent; ``OFFLINE`` while it is offline
        (or not async); ``SILENT`` across a network cut or to a non-neighbour."""
        if self.cfg.mode != "async" or not self._available_at(self.clock.time()):
            return OFFLINE
        if who not in self.nbr_set:
            self.rejections.add(Rejected("non-neighbour", f"a pull by node {who}"))
            return SILENT
        if self._blocked(who, self.round):
            return SILENT
        if self.last_sent is None:
            return None
        msg, sent_at = self.last_sent
        header = header_for(msg, who)
        if header is None:
            return None
        self.stats.answered_pulls += 1
        return header, msg[1], max(0.0, self.clock.monotonic() - sent_at)

    # ------------------------------------------------------------------ sending
    def _message(self, targets: Iterable[int] | None = None) -> Outgoing:
        """This round's own message for ``targets`` (default every neighbour), as the claim
        policy (:attr:`claims`) says: one header for all, or one per target (a liar's
        per-receiver claims, claim=certified); with +certified each header carries its
        evidence, signed (:meth:`sfg.net.evidence.CertifiedEvidence.cert`)."""
        s = self.state
        payload = encode_params(self.claims.model(self), self.layout, chunk=CHUNK)
        digest = payload_digest(payload)
        targets = [int(j) for j in (self.nbrs if targets is None else targets)]

        def head(claim: tuple[int, float, int]) -> bytes:
            cert = self.evidence.cert(self.round, claim, len(self.nbrs)) if self.certified \
                else b""
            return make_header(digest, sender=self.i, round=self.round, age=claim[0],
                               lag=claim[1], count=claim[2], local_count=s.local_count,
                               cert=cert, sign=self.cfg.keys.sign if cert else None)

        header: bytes | dict[int, bytes]
        if self.claims.per_receiver:
            told = {j: self.claims.claim_for(self, j) for j in targets}
            header = {j: head(c) for j, c in told.items()}
        else:
            claim = self.claims.claim(self)
            told = dict.fromkeys(targets, claim)
            header = head(claim)
        self.evidence.told = told
        return header, payload

    async def _send(self, j: int, r: int, header: bytes, payload: bytes | Chunked) -> None:
        ok, reason = await self.peers[j].deliver(header, payload, timeout=self.cfg.rpc_timeout,
                                                 retries=self.cfg.retries)
        if ok:
            self.stats.sent += 1
            self._delivered.add((j, r))
        elif reason == "unavailable":
            self.stats.offline_peer += 1  # the neighbour is offline: its server refuses
        else:
            self.stats.send_failed += 1
            log.info("node %d -> %d round %d not delivered: %s", self.i, j, self.round, reason)

    def _send_all(self, targets: Iterable[int], msg: Outgoing) -> None:
        for j in targets:
            j = int(j)
            prev = self._sends.get(j)
            if prev is not None and not prev.done():
                if self.cfg.mode == "async":
                    prev.cancel()  # only the latest model matters: never pile up sends
                else:
                    self._backlog.append(prev)  # lockstep needs every round's message
            header = header_for(msg, j)
            if header is None:
                continue
            self.stats.header_bytes += len(header)
            self.stats.headers += 1
            self._sends[j] = asyncio.ensure_future(self._send(j, self.round, header, msg[1]))
        self._backlog = [t for t in self._backlog if not t.done()]

    # ------------------------------------------------------------------ the round
    def _degrees(self, r: int, nodes: list[int]) -> list[int] | None:
        """Lockstep: the live-neighbour counts of ``nodes`` at round r (the trace and graph are
        common knowledge), for rules that read them; async: None (the rule's default)."""
        if self.cfg.mode != "lockstep":
            return None
        A, out = self.world.available[r], []
        for j in nodes:
            nb = self.world.neighbours(j)
            out.append(int(sum(1 for k in nb if A[k] and not self._blocked_pair(j, int(k), r))))
        return out

    def _blocked_pair(self, a: int, b: int, r: int) -> bool:
        return any(p.blocks(a, b, r) for p in self.cfg.partitions)

    def _aggregate(self, r: int, senders: list[int], msgs: list[Message],
                   ages: list[int], lags: list[float]) -> tuple[np.ndarray, dict]:
        """Weights with the rule's one-receiver form (:meth:`Rule.weights_one`), the
        aggregate Σ_j w_j x_j, and the candidates' scalars as the rule saw them.

        The rule's claim defences (``+guard``, ``+relative``) first clamp the claims with the
        round's own compiled clamp (:func:`sfg.round.defences.clamp_one`, with this node's evidence,
        :meth:`sfg.net.evidence.GuardEvidence.bounds`); the rule then scores the clamped claims (``+cap`` applies to the
        weights), and the staleness update uses the claims as clamped — as in ``sfg run``."""
        # the candidates in slot order (the node first, then its neighbours by id), as the
        # rounds and the clock hold them: sums over candidates (the weights' normalisation,
        # the staleness update, the aggregate) then add in the same order in every engine
        order = sorted(range(len(senders)), key=lambda k: self.pos[senders[k]])
        senders, msgs = [senders[k] for k in order], [msgs[k] for k in order]
        ages, lags = [ages[k] for k in order], [lags[k] for k in order]
        s = self.state
        rule = self.world.rule
        counts = [s.count] + [m.header.count for m in msgs]
        local = [s.local_count] + [m.header.local_count for m in msgs]
        ages, lags, changed = [s.age, *ages], [s.lag, *lags], 0
        marks = None
        if rule.defence_flags & (GUARD | RELATIVE):
            min_ages = [0, *self.guard.bounds(
                r, senders, msgs, lockstep=self.cfg.mode == "lockstep",
                now=self.clock.monotonic(), period=self.cfg.period)] \
                if rule.defence_flags & GUARD else None
            a, lg, c, changed, marks = clamp_one(rule, r, ages, lags, counts, min_ages,
                                                 timed=self.cfg.mode != "lockstep")
            ages, lags, counts = a.tolist(), lg.tolist(), c.tolist()
        q = [1.0] + [s.q_hat[self.pos[j] - 1] for j in senders]
        u, keys = 0.5, None
        if rule.random:  # the round's own draws: stream keyed by (seed, round), global slots
            u_all, key_all = rule_draws(self.world.seed, r, self.world.n, self.world.rg.n_slots)
            seg = key_all[self.world.rg.indptr[self.i]:self.world.rg.indptr[self.i + 1]]
            u, keys = float(u_all[self.i]), seg[[0] + [self.pos[j] for j in senders]]
        w = self._scorer.weights_one(ages=ages, lags=lags, counts=counts, local_counts=local,
                                     q_hat=q, t=r, u=u, keys=keys,
                                     degrees=self._degrees(r, [self.i, *senders]))
        if marks is not None:  # +refute: the refuted dropped, then +cap, as the round does
            w = weights_after(rule, w, marks)
        if self.cfg.record_headers:
            self.weights.append({"round": r, "receiver": self.i, "candidates": [self.i, *senders],
                                 "weights": [float(v) for v in w], "clamped": changed,
                                 "rounds": [m.header.round for m in msgs],
                                 "claimed": [m.header.sha256 for m in msgs],
                                 # the digest of what is aggregated, not of what was announced
                                 "content": [hashlib.sha256(bytes(encode_params(
                                     m.params, self.layout))).digest() for m in msgs]})
        X = np.stack([self.x] + [m.params for m in msgs])
        if rule.clip and msgs:  # +clip: x + Σ_j w_j · clip(x_j − x, r), the rounds' own steps
            from sfg.sim.attack_train import clipped_steps

            Xt = torch.from_numpy(X)
            row = np.zeros(len(msgs), np.int64)
            out = Xt[:1].clone()
            out.index_add_(0, torch.from_numpy(row), clipped_steps(
                Xt[1:] - Xt[0], row, torch.from_numpy(w[1:].astype(np.float32)), 1))
            agg = out[0].numpy()
        else:
            # the one aggregation (sfg.sim.gossip.weighted_sum), candidates in slot order
            agg = weighted_sum(torch.from_numpy(X), np.arange(len(X)), w.astype(np.float32),
                               np.zeros(1, np.int64), np.full(1, len(X)))[0].numpy()
        k = self.star.deg + 1
        full = {"cand": np.zeros(k, bool), "weights": np.zeros(k), "ages": np.zeros(k, np.int64),
                "lags": np.zeros(k), "counts": np.ones(k, np.int64),
                "local_counts": np.ones(k, np.int64)}
        idx = [0] + [self.pos[j] for j in senders]
        full["cand"][idx] = True
        full["weights"][idx] = w
        full["ages"][idx] = ages
        full["lags"][idx] = lags
        full["counts"][idx] = counts
        full["local_counts"][idx] = local
        if self.diagnostics is not None:  # what this local round aggregated, for _commit
            self._aggregated = (r, msgs, agg, self.clock.time())
        return agg, full

    async def _train(self, r: int, agg: np.ndarray) -> tuple[np.ndarray, int]:
        """K local steps from ``agg`` (the trainer's; on the virtual clock, batched with the
        other nodes' requests and taking the device's compute time): (model, steps)."""
        n_steps = self.trainer.steps(self.state.age)
        x = await self.trainer.train_async(agg, r, self.state.age)
        return x, n_steps

    def _commit(self, x: np.ndarray, n_steps: int, full: dict) -> None:
        """The local round's result becomes the node's model and state (docs/concepts/staleness.md#the-staleness-state)."""
        if self.diagnostics is not None:  # docs/concepts/diagnostics.md#training-diagnostics: the local round, before the state changes
            r, msgs, agg, start = self._aggregated
            self.diagnostics.commit(r, own=self.x, age=self.state.age, lag=self.state.lag,
                                    full=full, neighbours=self.nbrs, agg=agg, trained=x,
                                    models=[m.params for m in msgs], start=start,
                                    end=self.clock.time())
        self.x = x
        self.stats.steps += n_steps
        self.stats.trains += 1
        self.stats.messages += int(full["cand"].sum()) - 1
        self.state = self.star.advance(self.state, available=True, **full)

    def offline_round(self) -> None:
        """A round in which the node is unavailable (docs/concepts/staleness.md#the-staleness-state: age and lag + 1)."""
        self._owed += 1  # applied when the state is next read (the state property)

    def _end_round(self, r: int, available: bool) -> None:
        T = self.world.rounds
        acc = None
        if self.cfg.evaluate and ((r + 1) % int(self.world.cfg["eval_every"]) == 0
                                  or r == T - 1):
            acc = self.trainer.evaluate(self.x)
            self.stats.curve.append((r + 1, acc))
        self.stats.available_rounds += int(available)
        self.checkpoint()
        if self.cfg.on_round is not None:
            self.cfg.on_round(self.i, r, available, acc)

    async def _wait_lockstep(self, r: int, expected: list[int]) -> None:
        start = self.clock.monotonic()
        last_pull = start
        while True:
            missing = [j for j in expected if (j, r) not in self.inbox]
            if not missing:
                return
            now = self.clock.monotonic()
            if now - start > self.cfg.deadline:
                raise SfgError(f"lockstep: node {self.i} did not get the round-{r} models of "
                               f"neighbour(s) {missing} within {self.cfg.deadline:g} s; are those "
                               "nodes running? (raise --deadline for slow machines)")
            if now - last_pull >= self.cfg.pull_after:
                last_pull = now
                got = await asyncio.gather(*(self.peers[j].fetch(r, self.i, timeout=self.cfg.rpc_timeout)
                                             for j in missing), return_exceptions=True)
                for j, m in zip(missing, got, strict=True):
                    if isinstance(m, Rejected):  # the reply ran past its limits: stopped
                        self.rejections.add(m, f"fetch from {j}")
                        continue
                    if isinstance(m, BaseException):
                        raise m
                    if m is None:
                        continue
                    try:
                        msg = check_message(m[0], m[1], self.layout, neighbours=self.nbr_set,
                                            max_bytes=self.cfg.max_bytes)
                        if msg.header.sender != j or msg.header.round != r:
                            raise Rejected("header", "fetched message of another node or round")
                        if self.certified and not self.evidence.admit(msg, m[0], self.round):
                            continue
                    except Rejected as e:
                        self.rejections.add(e, f"fetch from {j}")
                        continue
                    self._accept(msg, len(m[0]) + len(m[1]))
                continue
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=self.cfg.pull_after)
            except asyncio.TimeoutError:
                pass

    async def _lockstep_round(self, r: int) -> None:
        A = self.world.available
        if not A[r, self.i]:
            if self.keeps_prev:
                self.evidence.prev = Prev(aggregated=False, own=own_claim(self.state))
            self.offline_round()
            return
        expected = [int(j) for j in self.nbrs if A[r, j] and not self._blocked(int(j), r)]
        own = own_claim(self.state) if self.keeps_prev else None
        msg = self._message(expected)
        self.outbox[r] = msg
        self.expected[r] = expected
        self._prune_outbox()
        self._send_all(expected, msg)
        await self._wait_lockstep(r, expected)
        msgs = [self.inbox.pop((j, r)) for j in expected]
        for key in [k for k in self.inbox if k[1] < r]:
            del self.inbox[key]
        senders = expected
        if self.keeps_prev:
            assert own is not None
            prev = Prev(aggregated=True, own=own, heard=frozenset(expected),
                        got={j: (m.header.age, m.header.lag, m.header.count)
                             for j, m in zip(expected, msgs, strict=True)},
                        told=self.evidence.told)
            if self.certified:
                senders, msgs, n_refuted = self.evidence.screen(r, expected, msgs, prev)
                self.stats.checked += len(expected)
                self.stats.refuted += n_refuted
            self.evidence.prev = prev
        agg, full = self._aggregate(r, senders, msgs, [m.header.age for m in msgs],
                                    [m.header.lag for m in msgs])
        x, n_steps = await self._train(r, agg)
        self._commit(x, n_steps, full)

    def _async_candidates(self, r: int, now: float) -> tuple[list[int], list[Message],
                                                             list[int], list[float]]:
        """Async round r's neighbour candidates at ``now`` (this node's monotonic clock):
        each neighbour's latest message that :func:`sfg.clock.schedule.held_units` holds a
        candidate — the clock's engine's own selection — with its waited scalars
        (:func:`waited`): (senders, messages, ages, lags)."""
        senders, msgs, ages, lags = [], [], [], []
        for j in self.nbrs:
            j = int(j)
            got = self.latest.get(j)
            if got is None or self._blocked(j, r):
                continue
            msg, arrival = got
            d = held_units(now, arrival, float(self.cfg.window), float(self.cfg.period))
            if d < 0:  # the window applies to its arrival
                continue
            # a reply's waiting started at its sending (docs/concepts/nodes.md#returns-in-the-node):
            # d = (held + now − arrival)/P
            d += self.held.get(j, 0.0) / float(self.cfg.period)
            age, lag = waited(msg.header.age, msg.header.lag, d)
            senders.append(j)
            msgs.append(msg)
            ages.append(age)
            lags.append(lag)
        return senders, msgs, ages, lags

    async def _async_round(self, r: int) -> None:
        start = self.clock.time()
        now = self.clock.monotonic()
        available = bool(self.world.available[r, self.i])
        self._log("wake", t=start, m=now, round=r, available=available)
        if not available:
            self.offline_round()
            return
        if self._pull is not None:  # the return's window: wait for the answers, or S
            pull, self._pull = self._pull, None
            await pull
            waited_until = self.clock.time()
            self.stats.wait_s += max(0.0, waited_until - start)
            if not self._available_at(waited_until):
                self.stats.abandoned += 1  # offline inside the window: the wait is abandoned
            start, now = waited_until, self.clock.monotonic()
        cands = self._async_candidates(r, now)
        heard = False
        if self._returning:  # the return's first aggregation (counted once it is committed)
            self._returning = False
            heard = len(cands[0]) > 0
        agg, full = self._aggregate(r, *cands)
        x, n_steps = await self._train(r, agg)
        self.round = r + 1  # the state about to be computed is the start of round r + 1
        end = self.clock.time()
        online = self._online_through(start, end)
        self._log("trained", t=end, round=r, interrupted=not online)
        # on the virtual clock the run ends at T·P: a local round whose K steps end after it
        # is unfinished, as on the clock's engine (docs/concepts/clock.md#the-world-in-time)
        late = self.clock.virtual and \
            end > float(self.t0 or 0.0) + self.world.rounds * self.cfg.period
        if not online or late:
            # offline before its K steps were done (docs/concepts/clock.md#the-world-in-time): the local round is
            # discarded — model and staleness as they were, nothing sent
            if online:
                self.stats.unfinished += 1
            else:
                self.stats.interrupted += 1
            self.state = replace(self.state, t=self.state.t + 1)
            return
        self._commit(x, n_steps, full)
        # heard: the return's first aggregation, committed, held a neighbour's model (an
        # interrupted one ends the device's online time: no aggregation of that return)
        self.stats.returns_heard += int(heard)
        targets = [int(j) for j in self.nbrs if not self._blocked(int(j), r)]
        msg = self._message()
        self._send_all(targets, msg)
        self.last_sent = (msg, self.clock.monotonic())  # what a pull is answered with

    def checkpoint(self) -> None:
        """Write the node's checkpoint (if it has a folder): :func:`sfg.net.persist.save`."""
        persist.save(self)

    def wake_times(self) -> np.ndarray:
        """Async: [T] the wake-up time of each round on this node's clock, ``t0 + r·P +
        jitter`` (docs/concepts/clock.md#the-three-protocols; the jitter keyed by (seed, node, round))."""
        T, P = self.world.rounds, self.cfg.period
        jitter = self.cfg.jitter * P * wake_jitter(self.world.seed, T, self.world.n)[:, self.i]
        return float(self.t0 or 0.0) + P * np.arange(T) + jitter

    # ------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Run the remaining rounds; returns this node's result (see :meth:`result`)."""
        if self.cfg.mode == "lockstep":
            await self._run_lockstep()
        else:
            await self._run_async()
        self._log("end", round=self.state.t, final=self.x)
        return self.result()

    async def _run_lockstep(self) -> None:
        T = self.world.rounds
        while self.state.t < T:
            r = self.round = self.state.t
            await self._lockstep_round(r)
            self._end_round(r, bool(self.world.available[r, self.i]))
        await self._drain()
        # wait until every neighbour has the messages it needs (pushed or pulled); what is
        # left stays served until the server stops: a pull's reply can be lost after this
        # node handed it out, and the neighbour then pulls again
        end = self.clock.monotonic() + self.cfg.deadline
        while True:
            self._prune_outbox()
            if self._all_handed_out() or self.clock.monotonic() > end:
                break
            await asyncio.sleep(0.05)
        self.files.save_outbox(self.outbox, self.expected)  # drop what nobody needs any more

    async def _run_async(self) -> None:
        T = self.world.rounds
        if self.t0 is None:
            self.t0 = self.clock.time()
        persist.catch_up_missed(self)
        self._log("start", t0=self.t0, restored=self.restored)
        wakes = self.wake_times()
        while self.rounds_done < T:
            if self.clock.virtual and self.net is not None and self.pending_sends():
                # the sends just handed to the network take their place on the uplink before
                # the next wake asks whether the device is still busy sending
                await asyncio.sleep(0)
            r = self.round = self.rounds_done
            wake = float(wakes[r])
            delay = wake - self.clock.time()
            if self.clock.virtual and (delay < 0 or (
                    self.net is not None and self.net.busy_until(self.i) > wake)):
                # a wake while the node is still busy (training or sending) is skipped
                # (docs/concepts/clock.md#the-three-protocols); on the wall clock a late node runs its due rounds back to
                # back instead (it cannot tell an overrun from the machine's load)
                self.stats.skipped += 1
                self.state = replace(self.state, t=self.state.t + 1)
                self.round = self.state.t
                self._end_round(r, False)
                continue
            t_ret = self._return_time(r)
            if t_ret is not None:  # docs/concepts/nodes.md#returns-in-the-node
                self.stats.returns += 1
                self._returning = True
                if self.cfg.pull_timeout is not None:
                    self._pull = asyncio.ensure_future(self._pull_at(t_ret))
            # always let the others (and the server) run in between
            await self.clock.wake(r, delay)
            await self._async_round(r)
            self._end_round(r, bool(self.world.available[r, self.i]))
        await asyncio.sleep(self.cfg.linger if self.cfg.linger is not None else self.cfg.period)
        await self._drain()
        backlog = [t for t in self._backlog if not t.done()]
        if self.clock.virtual and self.net is not None and backlog:
            # the pulls still in flight (an async node's backlog holds only those): on the
            # virtual network each resolves by the run's end, and a reply that arrives is
            # taken and counted, as the clock's engine counts it
            await asyncio.wait(backlog)

    def _return_time(self, r: int) -> float | None:
        """Async: the time of the return whose first local round is round ``r`` (this node's
        clock), or None when round r follows no return (docs/concepts/nodes.md#returns-in-the-node):
        the start t0 + r·P of an online row after an offline one (not the run's start); after
        a restart, the restart itself if the node is online then, else the start of its first
        online row."""
        A = self.world.available[:, self.i]
        if not A[r]:
            return None
        start = float(self.t0 or 0.0) + r * self.cfg.period
        if self._restarted:
            self._restarted = False
            now = self.clock.time()
            return now if self._available_at(now) else max(now, start)
        if r >= 1 and not A[r - 1]:
            return start
        return None

    async def _pull_at(self, t_ret: float) -> None:
        """At ``t_ret``, ask every neighbour for its latest sent message; return when each
        has answered (a reply, empty or unreachable) or S seconds have passed. A neighbour
        across a cut is asked and stays silent; a reply the checks reject, or none within
        the time-out, is no answer. A call still running at the window's end goes on (up to
        the RPC time-out): a reply that arrives later is an ordinary candidate for later
        aggregations, as on the clock (docs/concepts/clock.md#returns-in-time)."""
        delay = t_ret - self.clock.time()
        if delay > 0:
            await asyncio.sleep(delay)
        assert self.cfg.pull_timeout is not None
        S = float(self.cfg.pull_timeout)
        end = self.clock.monotonic() + S
        nbrs = [int(j) for j in self.nbrs]
        self.stats.requests += len(nbrs)
        asked = [j for j in nbrs if not self._blocked(j, self.round)]
        late = max(S, float(self.cfg.rpc_timeout))  # a reply after the window still counts
        tasks = [asyncio.ensure_future(self._pull_one(j, late)) for j in asked]
        got: list[str] = []
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=S)
            got = [t.result() for t in done if not t.cancelled() and t.exception() is None]
            self._backlog.extend(pending)  # bounded by their own time-out (the RPC's)
        answers = sum(1 for a in got if a)
        if not any(a in ("reply", "empty") for a in got):  # no online, reachable neighbour
            self.stats.returns_alone += 1
        if answers < len(nbrs):  # someone is silent: the window lasts S
            rest = end - self.clock.monotonic()
            if rest > 0:
                await asyncio.sleep(rest)

    async def _pull_one(self, j: int, S: float) -> str:
        """One pull from neighbour ``j``: its answer, ``reply``, ``empty`` or
        ``unreachable``, or ``""`` for none (no answer in time, a failed call, a rejected reply)."""
        try:
            got = await self.peers[j].pull(self.i, timeout=S)
        except Rejected as e:
            self.stats.pull_rejected += 1
            self.rejections.add(e, f"pull from {j}")
            return ""
        if got is UNREACHABLE:
            self.stats.unreachable += 1
            return "unreachable"
        if got is EMPTY:
            self.stats.empty += 1
            return "empty"
        if got is None:  # no answer in time, or a failed call
            return ""
        raw, payload, held = got
        self.stats.pull_bytes += len(raw) + len(payload)
        t_in = self.clock.time()
        if not self._available_at(t_in):  # arrived while this node is offline: lost
            self.stats.pull_lost += 1
            return ""
        try:
            # with TLS the pull's channel accepted only node j's certificate (Peer.pull)
            msg = check_message(raw, payload, self.layout, neighbours=self.nbr_set,
                                max_bytes=self.cfg.max_bytes,
                                identity=j if self.cfg.tls is not None else None)
            if msg.header.sender != j:
                raise Rejected("header", f"a pull reply from node {j} carries node "
                                         f"{msg.header.sender}'s message")
        except Rejected as e:
            self.stats.pull_rejected += 1
            self.rejections.add(e, f"pull from {j}")
            return ""
        self.stats.replies += 1
        self._accept(msg, len(raw) + len(payload), t_in, held=held)
        return "reply"

    async def _drain(self) -> None:
        pending = [t for t in [*self._sends.values(), *self._backlog] if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.cfg.rpc_timeout)

    def _returns_result(self) -> dict[str, Any] | None:
        """An async node's returns and, with pull, its requests and answers
        (docs/concepts/nodes.md#returns-in-the-node); None for a lockstep node."""
        if self.cfg.mode != "async":
            return None
        s = self.stats
        out: dict[str, Any] = {"returns": s.returns, "returns_heard": s.returns_heard}
        if self.cfg.pull_timeout is not None:
            out.update(returns_alone=s.returns_alone, requests=s.requests, replies=s.replies,
                       replies_unused=s.replies_unused, empty=s.empty,
                       unreachable=s.unreachable, rejected=s.pull_rejected,
                       bytes=s.pull_bytes, wait_s=s.wait_s, abandoned=s.abandoned,
                       lost=s.pull_lost, answered=s.answered_pulls)
        return out

    def result(self) -> dict[str, Any]:
        s = self.stats
        acc = s.curve[-1][1] if s.curve else \
            self.trainer.evaluate(self.x) if self.cfg.evaluate else float("nan")
        att = self.world.attackers
        return {"node": self.i, "acc": acc, "curve": [list(c) for c in s.curve],
                "attacker": bool(att is not None and att[self.i]),
                "messages": s.messages, "bytes": s.bytes, "sent": s.sent,
                "send_failed": s.send_failed, "offline_peer": s.offline_peer,
                "refused": s.refused, "steps": s.steps,
                "trains": s.trains, "available_rounds": s.available_rounds,
                "rejected": self.rejections.as_dict(), "state": self.state.as_dict(),
                "restored": self.restored, "header_bytes": s.header_bytes, "headers": s.headers,
                "diagnostics": None if self.diagnostics is None else self.diagnostics.result(),
                "returns": self._returns_result(),
                "certified": None if not self.certified else {
                    "checked": s.checked, "refuted": s.refuted,
                    "signed": self.cfg.keys.signed, "verified": self.cfg.keys.verified,
                    "sign_s": self.cfg.keys.sign_s, "verify_s": self.cfg.keys.verify_s}}
