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

:class:`Node` holds what the protocols share (model, staleness state, inbox and outbox, server
and peers, the round's bookkeeping) and runs one of them; the parts live beside it, as
functions of the node: :mod:`~sfg.net.lockstep` (docs/concepts/nodes.md#lockstep-mode),
:mod:`~sfg.net.asyncmode` (docs/concepts/nodes.md#asynchronous-mode), :mod:`~sfg.net.returns`
(the pull on return, docs/concepts/nodes.md#returns-in-the-node), :mod:`~sfg.net.inbox` (what
arrives), :mod:`~sfg.net.outgoing` (what it sends), :mod:`~sfg.net.localround` (aggregate,
train, commit; the claims clamped by ``+guard``/``+relative``), :mod:`~sfg.net.claims` (what
it claims), :mod:`~sfg.net.evidence` (``+guard``'s and ``+certified``'s evidence),
:mod:`~sfg.net.persist` (checkpoints, ``resume``), :mod:`~sfg.net.cuts` (network cuts) and
:mod:`~sfg.net.nodeconfig` (:class:`NodeConfig`, :class:`NodeStats`).
"""

from __future__ import annotations

import asyncio
import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.net import asyncmode, inbox, lockstep, persist, returns
from sfg.net.asyncmode import waited
from sfg.net.checkpoints import NodeState, Star
from sfg.net.claims import HonestClaims, claim_policy
from sfg.net.diagnose import NodeDiagnostics
from sfg.net.evidence import CertifiedEvidence, GuardEvidence, Prev
from sfg.net.membership import node_membership
from sfg.net.nodeconfig import MODES, NodeConfig, NodeStats
from sfg.net.outgoing import Outgoing, header_for
from sfg.net.simclock import WALL, NodeClock
from sfg.net.transport import Peer, Server
from sfg.net.wire import Message, Rejections
from sfg.net.world import Trainer, World
from sfg.round.defences import claims_as_given
from sfg.round.staleness import wake_jitter

__all__ = ["MODES", "Message", "Node", "NodeConfig", "NodeStats", "Outgoing", "header_for",
           "waited"]


class Node:
    """One networked node: what its protocols share; see the module docstring for its parts."""

    def __init__(self, world: World, i: int, config: NodeConfig | None = None,
                 trainer: Trainer | None = None, *, net: Any = None,
                 clock: NodeClock | None = None, claims: HonestClaims | None = None):
        self.world, self.i = world, int(i)
        self.cfg = (config or NodeConfig()).with_on_return(world.cfg.get("on_return"))
        # the transport (gRPC unless ``net``, e.g. sfg.net.memory.MemoryNetwork) and the clock
        # (the wall clock unless a virtual one, sfg.net.simclock): the protocol code is the same
        self.net = net
        self.clock = clock or WALL
        # peers chosen per exchange (sfg.net.membership); the candidates: the graph
        # neighbours, or under peers other than fixed every other device of the run
        self.membership = node_membership(world, self.i, self.cfg, virtual=self.clock.virtual)
        self.nbrs = self.membership.candidates(world)
        self.nbr_set = frozenset(int(j) for j in self.nbrs)
        self.pos = {int(j): k + 1 for k, j in enumerate(self.nbrs)}  # star index
        self.star = Star(len(self.nbrs), world.rule)
        self.trainer = trainer or Trainer(world, self.i)
        self.layout = world.layout
        self.x = world.x0.copy()
        self._owed = 0  # offline rounds not yet applied to the state (see the state property)
        self._state: NodeState = NodeState(q_hat=[1.0] * len(self.nbrs))
        self.stats = NodeStats()
        self.rejections = Rejections(self.i)
        self.headers: list[dict] = []     # accepted headers' scalars (record_headers)
        self.weights: list[dict] = []     # each aggregation's weights (record_headers)
        self.guard = GuardEvidence()                    # +guard: content digest, first seen
        self.claimed: dict[int, int] = {}               # latest count each neighbour claimed
        self.claimed_round: dict[int, int] = {}         # the round of that claim
        # the rule that scores claims the node has already clamped (sfg.round.defences.clamp_one)
        self.scorer = claims_as_given(world.rule)
        self.restored: dict | None = None
        self.loaded: tuple[np.ndarray, NodeState] | None = None
        self.server = self._server(net)
        self.peers: dict[int, Any] = {}
        self.outbox: dict[int, Outgoing] = {}                  # own messages by round
        self.expected: dict[int, list[int]] = {}                   # who needs each of them
        self.heard: dict[int, int] = {}                            # latest round from each
        self.delivered: set[tuple[int, int]] = set()               # (neighbour, round) pushed
        self.inbox: dict[tuple[int, int], Message] = {}         # lockstep: (sender, round)
        self.latest: dict[int, tuple[Message, float]] = {}      # async: sender -> (msg, arrival)
        # async: sender -> held, when its latest message is a pull's reply (its waiting started
        # held seconds before its arrival; docs/concepts/nodes.md#returns-in-the-node)
        self.held: dict[int, float] = {}
        self.last_sent: tuple[Outgoing, float] | None = None     # async: own latest, sent at
        self.restarted = bool(self.cfg.resume)   # a return at the first online round
        self.returning = False                   # the next aggregation is a return's first
        self.pull_window: asyncio.Task | None = None    # the return's pull (its window)
        self.arrived = asyncio.Event()                  # a message was taken (lockstep waits)
        self.round = 0
        self.started: float | None = None  # when run() began (its own clock)
        self.t0 = self.cfg.t0
        self.diagnostics = NodeDiagnostics.for_node(self)  # docs/concepts/diagnostics.md#training-diagnostics (None: none asked for)
        self.last_aggregation: tuple | None = None  # diagnostics: what the round aggregated
        self.files = persist.NodeFiles(self.cfg.checkpoint_dir, self.i)
        self.sends: dict[int, asyncio.Task] = {}   # the latest send to each neighbour
        self.backlog: list[asyncio.Task] = []      # older sends (lockstep) and pulls in flight
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
        self.log_event("open", resume=bool(self.cfg.resume),
                       restored=None if self.restored is None else int(self.restored["round"]))

    def _server(self, net: Any) -> Any:
        """The node's server: pushes into its inbox, fetches and pulls from its own messages."""
        deliver, fetch = partial(inbox.deliver, self), partial(lockstep.serve_fetch, self)
        pull = partial(returns.serve_pull, self)
        if net is None:
            return Server(deliver, fetch, max_bytes=self.cfg.max_bytes, tls=self.cfg.tls,
                          refused=self.rejections.add, pull=pull)
        if self.cfg.pull_timeout is not None and not hasattr(net, "request"):
            raise SfgError("on_return pull needs a network that carries pulls (gRPC, or "
                           "the virtual clock's sfg.net.memory); this one does not")
        # the virtual clock's network (sfg.net.memory) carries pulls with the clock's
        # engine's times (docs/concepts/clock.md#returns-in-time)
        return net.server(self.i, deliver, fetch, max_bytes=self.cfg.max_bytes, tls=self.cfg.tls,
                          **({"pull": pull, "unsent": partial(returns.reply_unsent, self),
                              "refusal": partial(returns.pull_refusal, self)}
                             if hasattr(net, "request") else {}))

    def log_event(self, event: str, **fields: Any) -> None:
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
        return sum(not t.done() for t in self.sends.values())

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
        for task in [*self.sends.values(), *self.backlog]:
            task.cancel()
        for p in self.peers.values():
            await p.close()
        await self.server.stop()

    # ------------------------------------------------------------------ time, trace and cuts
    def row(self, t: float) -> int:
        """Async: the trace row in force at time ``t`` of this node's clock: row r covers
        [t0 + r·P, t0 + (r+1)·P) (docs/concepts/clock.md#the-world-in-time: a round-based trace as online intervals)."""
        return int(math.floor((t - float(self.t0 or 0.0)) / self.cfg.period))

    def available_at(self, t: float) -> bool:
        """Async: online at time ``t`` of this node's clock (before round 0 and after the last
        round the node keeps answering)."""
        if self.t0 is None:
            return True
        r = self.row(t)
        if r < 0 or r >= self.world.rounds:
            return True
        return bool(self.world.available[r, self.i])

    def wake_times(self) -> np.ndarray:
        """Async: [T] the wake-up time of each round on this node's clock, ``t0 + r·P +
        jitter`` (docs/concepts/clock.md#the-three-protocols; the jitter keyed by (seed, node, round))."""
        T, P = self.world.rounds, self.cfg.period
        jitter = self.cfg.jitter * P * wake_jitter(self.world.seed, T, self.world.n)[:, self.i]
        return float(self.t0 or 0.0) + P * np.arange(T) + jitter

    def blocked(self, j: int, r: int) -> bool:
        """Whether a network cut separates this node from ``j`` in round ``r``."""
        return self.blocked_pair(self.i, j, r)

    def blocked_pair(self, a: int, b: int, r: int) -> bool:
        """Whether a network cut separates nodes ``a`` and ``b`` in round ``r``."""
        return any(p.blocks(a, b, r) for p in self.cfg.partitions)

    # ------------------------------------------------------------------ the round's end
    def offline_round(self) -> None:
        """A round in which the node is unavailable (docs/concepts/staleness.md#the-staleness-state: age and lag + 1)."""
        self._owed += 1  # applied when the state is next read (the state property)

    def end_round(self, r: int, available: bool) -> None:
        """After round ``r``: evaluate (when due), count, checkpoint, report."""
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

    def checkpoint(self) -> None:
        """Write the node's checkpoint (if it has a folder): :func:`sfg.net.persist.save`."""
        persist.save(self)

    # ------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Run the remaining rounds; returns this node's result (see :meth:`result`)."""
        self.started = self.clock.monotonic()
        if self.cfg.mode == "lockstep":
            await lockstep.run(self)
        else:
            await asyncmode.run(self)
        self.log_event("end", round=self.state.t, final=self.x)
        return self.result()

    def result(self) -> dict[str, Any]:
        """This node's accuracy, counts, rejections, state and reports."""
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
                "returns": returns.result(self),
                "peers": self.membership.result(self, s.offline_peer),
                "certified": None if not self.certified else {
                    "checked": s.checked, "refuted": s.refuted,
                    "signed": self.cfg.keys.signed, "verified": self.cfg.keys.verified,
                    "sign_s": self.cfg.keys.sign_s, "verify_s": self.cfg.keys.verify_s}}
