"""A networked node: one model, its data, its staleness state and a round clock (SPEC §11).

::

    world = build_world({"n_clients": 8, "rounds": 20, "rule": "sfg-cut"})
    node = Node(world, 3, NodeConfig(mode="lockstep"))
    port = await node.start()                      # gRPC server on 127.0.0.1:port
    node.connect({j: f"127.0.0.1:{port_j}" ...})   # neighbours' addresses
    result = await node.run()

Each round the node trains (SPEC §1 step 3, the simulator's own training pieces via
:class:`~sfg.net.world.Trainer`), sends its model with its staleness scalars to its
neighbours, and aggregates what it holds with the rule's one-receiver form
:meth:`sfg.round.rules.Rule.weights_one` — the rule code ``sfg run`` and ``sfg replay`` use.
Everything is asyncio; a send never blocks the round on a neighbour that is gone.

**Lockstep** (SPEC §11.1): at round t an available node sends its start-of-round model and
scalars (τ, ℓ, n, local count) to every neighbour that is available and linked at t (the trace
is common knowledge), waits (with a deadline) for those neighbours' round-t messages, pulling
any that were not pushed (``Fetch``), then aggregates, trains and updates its state — exactly
SPEC §1–§2, so the models equal ``sfg run --backend loop``.

**Async** (SPEC §11.2): node i's round r starts at ``t0 + r·P + jitter`` on its own clock
(jitter uniform in [0, jitter·P), keyed by (seed, i, r)). Availability is row r of the trace.
An available node takes as candidates itself and every neighbour whose latest message arrived
within the last W periods; a message that waited d = (now − arrival)/P periods is used with
age τ_j + ⌊d⌋ and lag ℓ_j + d (counts unchanged). It aggregates with those scalars, sets its
lag to the weighted mean of the lags as used, trains (age 0, counts + 1) and sends to all
neighbours. An unavailable node neither trains, sends nor answers (its server refuses
deliveries); each of its rounds adds 1 to its age and lag. q̂_ij is updated with "j is a
candidate" as the event. Timestamps are the receiver's own clock only.

**Forged claims and defences** (:mod:`sfg.round.attacks`, :mod:`sfg.round.defences`): an attacker of the
run's ``--attack forge:...`` puts the forged claim of :func:`sfg.round.attacks.claims` in its headers
(played on its star: the largest count it hears is its own and the last its neighbours
claimed); ``model=constant`` sends the initial model every time. A receiver whose rule has
``+guard``/``+relative`` clamps the header claims with the round's compiled clamp
(:func:`sfg.round.defences.clamp_one`) before the rule scores them, ``+guard`` with its own evidence:
per neighbour, the payload SHA-256 last aggregated and when it was first seen
(:meth:`Node._evidence`); its staleness update then uses the claims as clamped, as in
``sfg run``.

**Certified claims** (``+certified``, lockstep; :mod:`sfg.net.certify`): every header is
signed with the node's key (``NodeConfig.keys``) and carries the evidence of its claim (its
prior, its heard-set and the stamps it merged in the previous round, :meth:`Node._cert`); a
receiver checks it on arrival (:meth:`Node._admit`) and leaves out, when it aggregates, the
claims the evidence refutes (:meth:`Node._screen`). The liar of ``claim=certified`` sends a
header per receiver (:meth:`Node._best_claim`). What a node keeps of its previous round
(:class:`_Prev`) is part of its checkpoint.

**Checkpoints**: after every round, if ``checkpoint_dir`` is set, the model and state are written
atomically (``node-<id>.safetensors``), in lockstep with the node's own messages that a
neighbour may still need (``node-<id>-out-<round>.msgpack``, :meth:`Node._save_outbox`). A node started with ``resume=True`` continues from it; in
async mode the rounds it missed while down (by its own clock) are applied as unavailable rounds,
so its age and lag grow by the missed rounds.
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

import msgpack
import numpy as np
import torch

from sfg.errors import SfgError
from sfg.net.checkpoints import NodeState, Star, load_checkpoint, save_checkpoint, write_atomic
from sfg.net.simclock import WALL, NodeClock
from sfg.net.transport import CHUNK, Peer, Server, TlsFiles
from sfg.net.wire import (
    CERT_MAX_BYTES,
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


@dataclass
class _Prev:
    """What a node keeps of its previous lockstep round for +certified and claim=certified
    (:mod:`sfg.net.certify`): whether it aggregated, its state at the start of that round,
    its heard-set, the claims (and stamps) it received and the claims it told each
    neighbour, and the received stamps it accepted without refusing them."""

    aggregated: bool
    own: tuple[int, float, int]
    heard: frozenset[int] | None = None
    got: dict[int, tuple[int, float, int]] = field(default_factory=dict)
    stamps: dict[int, bytes] = field(default_factory=dict)
    told: dict[int, tuple[int, float, int]] = field(default_factory=dict)
    known: dict[int, Any] = field(default_factory=dict)

log = logging.getLogger("sfg.net")
MODES = ("lockstep", "async")


def waited(age: int, lag: float, d: float) -> tuple[int, float]:
    """Scalars of a message that sat in the inbox for ``d`` periods (SPEC §11.2):
    :func:`sfg.round.staleness.waited`, the clock's own definition, on d ≥ 0."""
    a, lg = _waited(np.int64(age), float(lag), max(0.0, float(d)))
    return int(a), float(lg)


@dataclass(frozen=True)
class Partition:
    """Traffic between node sets ``a`` and ``b`` is dropped in rounds ``r1..r2`` (inclusive)."""

    a: frozenset[int]
    b: frozenset[int]
    r1: int
    r2: int

    def blocks(self, i: int, j: int, r: int) -> bool:
        return self.r1 <= r <= self.r2 and ((i in self.a and j in self.b) or
                                            (i in self.b and j in self.a))

    @classmethod
    def parse(cls, text: str) -> Partition:
        """``"0,1,2|3,4@5-9"``: nodes {0,1,2} and {3,4} cut off from each other in rounds 5..9."""
        try:
            sets, rounds = text.split("@")
            a, b = sets.split("|")
            r1, r2 = rounds.split("-")
            pa = frozenset(int(x) for x in a.split(",") if x.strip())
            pb = frozenset(int(x) for x in b.split(",") if x.strip())
            p = cls(pa, pb, int(r1), int(r2))
        except ValueError:
            raise SfgError(f"cannot read partition {text!r}; write A|B@R1-R2, e.g. "
                           "--partition 0,1,2|3,4@5-9") from None
        if not pa or not pb or pa & pb or p.r1 > p.r2 or p.r1 < 0:
            raise SfgError(f"partition {text!r} needs two disjoint non-empty node sets and "
                           "rounds R1 <= R2, e.g. 0,1|2,3@5-9")
        return p


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
    partitions: tuple[Partition, ...] = ()
    record_headers: bool = False
    t0: float | None = None      # async: start of round 0 on the node's clock (wall: time.time())
    linger: float | None = None  # async: keep answering this long after the last round
    on_round: Any = None         # callback(node_id, round, available, acc or None)
    events: Any = None           # event log (sfg.net.eventlog.EventLog): record(node, ev, fields)
    keys: Any = None             # +certified: sfg.net.certify.Keys (from the sfg tls-ca folder)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SfgError(f"unknown mode {self.mode!r}; choose lockstep or async")
        for name in ("period", "deadline", "rpc_timeout"):
            if not getattr(self, name) > 0:
                raise SfgError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.jitter < 1:
            raise SfgError(f"jitter must lie in [0, 1) (a fraction of the period), got {self.jitter}")
        if not self.window > 0:
            raise SfgError(f"window W must be > 0 periods, got {self.window}")


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
    skipped: int = 0             # async, virtual clock: wakes while still busy
    curve: list[tuple[int, float]] = field(default_factory=list)


class Node:
    """One networked node; see the module docstring for the protocol."""

    def __init__(self, world: World, i: int, config: NodeConfig | None = None,
                 trainer: Trainer | None = None, *, net: Any = None,
                 clock: NodeClock | None = None):
        self.world, self.i = world, int(i)
        self.cfg = config or NodeConfig()
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
        self.seen: dict[int, tuple[bytes, float]] = {}  # +guard: content digest, first seen
        self.claimed: dict[int, int] = {}               # latest count each neighbour claimed
        self._claimed_round: dict[int, int] = {}
        # the rule that scores claims the node has already clamped (sfg.round.defences.clamp_one)
        self._scorer = claims_as_given(world.rule)
        self.restored: dict | None = None
        self.loaded: tuple[np.ndarray, NodeState] | None = None
        if net is None:
            self.server: Any = Server(self._on_deliver, self._on_fetch,
                                      max_bytes=self.cfg.max_bytes, tls=self.cfg.tls,
                                      refused=self.rejections.add)
        else:
            self.server = net.server(self.i, self._on_deliver, self._on_fetch,
                                     max_bytes=self.cfg.max_bytes, tls=self.cfg.tls)
        self.peers: dict[int, Any] = {}
        self.outbox: dict[int, Outgoing] = {}                  # own messages by round
        self._expected: dict[int, list[int]] = {}                  # who needs each of them
        self.heard: dict[int, int] = {}                            # latest round from each
        self._delivered: set[tuple[int, int]] = set()               # (neighbour, round) pushed
        self.inbox: dict[tuple[int, int], Message] = {}         # lockstep: (sender, round)
        self.latest: dict[int, tuple[Message, float]] = {}      # async: sender -> (msg, arrival)
        self._arrived = asyncio.Event()
        self.round = 0
        self.t0 = self.cfg.t0
        self._saved_out: set[int] = set()                          # outbox rounds on disk
        self._sends: dict[int, asyncio.Task] = {}
        self._backlog: list[asyncio.Task] = []
        # +certified (sfg.net.certify) and the liar that answers it (claim=certified)
        self.certified = bool(world.rule.certified)
        att = world.attack
        self._liar = att is not None and att.claim == "certified" and self._attacker
        from sfg.net.certify import NO_KEYS, check_run

        check_run(world, self.cfg.mode)
        if self.certified and self.cfg.keys is None:
            raise SfgError(NO_KEYS)
        self._prev: _Prev | None = None                        # the previous round (_Prev)
        self._told: dict[int, tuple[int, float, int]] = {}     # claims sent this round
        self._prior_stamp: tuple[int, bytes] | None = None
        self._certs: dict[tuple[int, int], Any] = {}          # (sender, round) -> Cert
        self._accepted: dict[tuple[int, int], bytes] = {}     # -> SHA-256 of its header
        self._nbr_cache: dict[int, frozenset[int]] = {}
        if self.cfg.resume:
            self._restore()
        self._log("open", resume=bool(self.cfg.resume),
                  restored=None if self.restored is None else int(self.restored["round"]))

    def _log(self, event: str, **fields: Any) -> None:
        """One event of the node's event log (:mod:`sfg.net.eventlog`); nothing without one."""
        if self.cfg.events is not None:
            self.cfg.events.record(self, event, fields)

    # ------------------------------------------------------------------ set-up
    @property
    def checkpoint_path(self) -> Path | None:
        d = self.cfg.checkpoint_dir
        return None if d is None else Path(d) / f"node-{self.i}.safetensors"

    async def start(self) -> int:
        """Start the gRPC server (after warming up the compiled round and the training
        backend, so that the round clock never waits on first-use set-up); returns the port."""
        self.warm_up()
        return await self.server.start(self.cfg.host, self.cfg.port)

    @property
    def state(self) -> NodeState:
        """The node's staleness state (SPEC §2). Offline rounds are owed, not applied one at
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
                                          tls=self.cfg.tls, refused=self.rejections.add)
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
        [t0 + r·P, t0 + (r+1)·P) (SPEC §12.1: a round-based trace as online intervals)."""
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
            if self.certified and not self._admit(msg, raw_header):
                return True, ""  # the same message again (a retried push): nothing changes
        except Rejected as e:
            self.rejections.add(e, peer)
            return False, e.reason
        self._accept(msg, len(raw_header) + msg.header.length, t_in)
        return True, ""

    def _neighbours_of(self, j: int) -> frozenset[int]:
        got = self._nbr_cache.get(j)
        if got is None:
            got = self._nbr_cache[j] = frozenset(int(k) for k in self.world.neighbours(j))
        return got

    def _admit(self, msg: Message, raw_header: bytes) -> bool:
        """+certified checks on arrival (:func:`sfg.net.certify.read_cert`, and replays:
        a header of an earlier round this node did not accept in time — a replay, or a copy
        delayed past its round, which a receiver cannot tell apart and which changes nothing
        either way — or a second, different header for a (sender, round) it accepted);
        :class:`Rejected` on failure. False: the very header it accepted already (a retry, a
        push that arrives after a pull, a duplicate of the last two rounds)."""
        from sfg.net.certify import read_cert

        h = msg.header
        key = (h.sender, h.round)
        digest = hashlib.sha256(raw_header).digest()
        have = self._accepted.get(key)
        if have is not None:
            if have == digest:
                return False
            raise Rejected("replayed", f"a second, different header for node {h.sender}'s "
                                       f"round {h.round}")
        if h.round < self.round:
            raise Rejected("replayed", f"node {h.sender}'s header of round {h.round}, a round "
                                       f"past here (now {self.round}) not accepted in time "
                                       "(a replay, or a copy delayed past its round)")
        cert = read_cert(h, self.cfg.keys, self._neighbours_of)
        self._certs[key] = cert
        self._accepted[key] = digest
        return True

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

    def _accept(self, msg: Message, nbytes: int, t_in: float | None = None) -> None:
        h = msg.header
        now = self.clock.monotonic()
        self._log("arrival", t=self.clock.time() if t_in is None else t_in, m=now,
                  sender=h.sender, round=h.round, sha256=h.sha256.hex(), **h.scalars())
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
                seen = self.seen.get(h.sender)
                if seen is None or seen[0] != h.sha256:  # +guard evidence: first arrival
                    self.seen[h.sender] = (h.sha256, now)
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
            if all(self.heard.get(j, -1) > r for j in self._expected.get(r, ())):
                del self.outbox[r]
                self._expected.pop(r, None)

    def _all_handed_out(self) -> bool:
        """Whether every message left in the outbox was pushed to, or pulled by, every
        neighbour expecting it (the end of a run: nothing more to wait for)."""
        return all(self.heard.get(j, -1) > r or (j, r) in self._delivered
                   for r in self.outbox for j in self._expected.get(r, ()))

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

    # ------------------------------------------------------------------ sending
    def _message(self, targets: Iterable[int] | None = None) -> Outgoing:
        """This round's own message for ``targets`` (default every neighbour): one header
        for all, or one per target for a liar's per-receiver claims (claim=certified); with
        +certified each header carries its evidence, signed (:meth:`_cert`)."""
        s = self.state
        att = self.world.attack
        x = self.world.x0 if (att is not None and att.model == "constant"
                              and self._attacker) else self.x
        payload = encode_params(x, self.layout, chunk=CHUNK)
        digest = payload_digest(payload)
        targets = [int(j) for j in (self.nbrs if targets is None else targets)]

        def head(claim: tuple[int, float, int]) -> bytes:
            cert = self._cert(claim) if self.certified else b""
            return make_header(digest, sender=self.i, round=self.round, age=claim[0],
                               lag=claim[1], count=claim[2], local_count=s.local_count,
                               cert=cert, sign=self.cfg.keys.sign if cert else None)

        header: bytes | dict[int, bytes]
        if self._liar:
            self._told = {j: self._best_claim(j) for j in targets}
            header = {j: head(c) for j, c in self._told.items()}
        else:
            claim = self._claims()
            self._told = dict.fromkeys(targets, claim)
            header = head(claim)
        return header, payload

    def _cert(self, claim: tuple[int, float, int]) -> bytes:
        """+certified: the evidence of this round's claim (:func:`sfg.net.certify.make_cert`):
        its stamp, the prior (this node's state at the start of the previous round), the
        previous round's heard-set and the stamps received then."""
        from sfg.net.certify import make_cert, make_stamp

        keys, r, prev = self.cfg.keys, self.round, self._prev
        stamp = make_stamp(keys, r, *claim)
        if r == 0:
            return make_cert(stamp, None, None, [])
        if prev is None:
            raise SfgError(f"node {self.i}: +certified has no evidence of round {r - 1}")
        if self._prior_stamp is None or self._prior_stamp[0] != r:
            self._prior_stamp = (r, make_stamp(keys, r - 1, *prev.own))
        heard = prev.heard if prev.aggregated else None
        cert = make_cert(stamp, self._prior_stamp[1], heard,
                         [prev.stamps[j] for j in sorted(heard or ())])
        if len(cert) > CERT_MAX_BYTES:
            raise SfgError(f"node {self.i}: its certified evidence of {len(cert)} bytes (degree "
                           f"{len(self.nbrs)}) exceeds the {CERT_MAX_BYTES}-byte limit receivers "
                           "accept; +certified runs on graphs of degree up to about 500")
        return cert

    def _best_claim(self, j: int) -> tuple[int, float, int]:
        """claim=certified toward neighbour ``j``: the best claim this liar can back
        (:func:`sfg.round.certified.best_claims`, played with what it knows): trained,
        from its prior as j knows it (what it told j in the previous round, else its own
        state then) and, if it aggregated then, the claims it received — the smallest lag,
        the largest count + 1; round 0: the initial model's."""
        prev = self._prev
        if prev is None:
            return 0, 0.0, 1
        p = prev.told.get(int(j), prev.own)
        lags, counts = [p[1]], [p[2]]
        if prev.aggregated:
            lags += [g[1] for g in prev.got.values()]
            counts += [g[2] for g in prev.got.values()]
        return 0, float(min(lags)), int(max(counts)) + 1

    def _own(self) -> tuple[int, float, int]:
        s = self.state
        return int(s.age), float(s.lag), int(s.count)

    def _claims(self) -> tuple[int, float, int]:
        """The (age, lag, count) this node claims in its headers: its true state, or, for an
        attacker of the run's ``--attack forge:...``, the forged claim of
        :func:`sfg.round.attacks.claims` played on this node's star (the largest count it hears:
        its own and the last its neighbours claimed)."""
        s = self.state
        att = self.world.attack
        if att is None or not att.forges or not self._attacker:
            return s.age, s.lag, s.count
        from sfg.round.attacks import claims
        from sfg.round.staleness import StalenessState

        k, E = self.star.deg + 1, self.star.rg.n_slots
        counts = np.array([s.count] + [self.claimed.get(int(j), 1) for j in self.nbrs], np.int64)
        st = StalenessState(t=s.t, ages=np.full(k, s.age, np.int64), lags=np.full(k, s.lag),
                            counts=counts, local_counts=np.ones(k, np.int64), q_hat=np.ones(E))
        me = np.zeros(k, bool)
        me[0] = True
        age, lag, count = claims(att, self.star.rg, st, me, seed=self.world.seed,
                                 ids=np.array([self.i, *self.nbrs], np.int64), n_all=self.world.n)
        e = int(np.flatnonzero((self.star.rg.send == 0) & ~self.star.rg.is_self)[0])
        return int(age[e]), float(lag[e]), int(count[e])

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

    def _evidence(self, r: int, senders: list[int], msgs: list[Message]) -> list[int]:
        """The ``+guard`` evidence bound per neighbour candidate (:mod:`sfg.round.defences`): the
        rounds since that neighbour's model content (the payload's SHA-256, checked on
        arrival) last changed as this node observed it — an unchanged model was not trained
        since. Lockstep: this node's rounds since it first aggregated that content, as the
        round counts it in ``sfg run``. Async: ⌊(now − first arrival of that content)/P⌋,
        which an honest waited age τ + ⌊d⌋ never undercuts. Kept in memory only (a restarted
        node starts without evidence: weaker, never wrong)."""
        out = []
        now = self.clock.monotonic()
        for j, m in zip(senders, msgs, strict=True):
            seen = self.seen.get(j)
            if self.cfg.mode == "lockstep":
                if seen is None or seen[0] != m.header.sha256:
                    self.seen[j] = (m.header.sha256, float(r))
                    out.append(0)
                else:
                    out.append(int(r - seen[1]))
            else:  # first arrivals are kept by _accept
                first = seen[1] if seen is not None and seen[0] == m.header.sha256 else now
                out.append(max(0, math.floor((now - first) / self.cfg.period)))
        return out

    def _aggregate(self, r: int, senders: list[int], msgs: list[Message],
                   ages: list[int], lags: list[float]) -> tuple[np.ndarray, dict]:
        """Weights with the rule's one-receiver form (:meth:`Rule.weights_one`), the
        aggregate Σ_j w_j x_j, and the candidates' scalars as the rule saw them.

        The rule's claim defences (``+guard``, ``+relative``) first clamp the claims with the
        round's own compiled clamp (:func:`sfg.round.defences.clamp_one`, with this node's evidence,
        :meth:`_evidence`); the rule then scores the clamped claims (``+cap`` applies to the
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
            min_ages = [0, *self._evidence(r, senders, msgs)] if rule.defence_flags & GUARD \
                else None
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
        return agg, full

    async def _train(self, r: int, agg: np.ndarray) -> tuple[np.ndarray, int]:
        """K local steps from ``agg`` (the trainer's; on the virtual clock, batched with the
        other nodes' requests and taking the device's compute time): (model, steps)."""
        n_steps = self.trainer.steps(self.state.age)
        x = await self.trainer.train_async(agg, r, self.state.age)
        return x, n_steps

    def _commit(self, x: np.ndarray, n_steps: int, full: dict) -> None:
        """The local round's result becomes the node's model and state (SPEC §2)."""
        self.x = x
        self.stats.steps += n_steps
        self.stats.trains += 1
        self.stats.messages += int(full["cand"].sum()) - 1
        self.state = self.star.advance(self.state, available=True, **full)

    def _offline_round(self) -> None:
        self._owed += 1  # applied when the state is next read (the state property)

    def _end_round(self, r: int, available: bool) -> None:
        T = self.world.rounds
        acc = None
        if (r + 1) % int(self.world.cfg["eval_every"]) == 0 or r == T - 1:
            acc = self.trainer.evaluate(self.x)
            self.stats.curve.append((r + 1, acc))
        self.stats.available_rounds += int(available)
        self._checkpoint()
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
                        if self.certified and not self._admit(msg, m[0]):
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

    @property
    def _keeps_prev(self) -> bool:
        """Whether the node keeps its previous round (:class:`_Prev`)."""
        return self.certified or self._liar

    async def _lockstep_round(self, r: int) -> None:
        A = self.world.available
        if not A[r, self.i]:
            if self._keeps_prev:
                self._prev = _Prev(aggregated=False, own=self._own())
            self._offline_round()
            return
        expected = [int(j) for j in self.nbrs if A[r, j] and not self._blocked(int(j), r)]
        own = self._own() if self._keeps_prev else None
        msg = self._message(expected)
        self.outbox[r] = msg
        self._expected[r] = expected
        self._prune_outbox()
        self._send_all(expected, msg)
        await self._wait_lockstep(r, expected)
        msgs = [self.inbox.pop((j, r)) for j in expected]
        for key in [k for k in self.inbox if k[1] < r]:
            del self.inbox[key]
        senders = expected
        if self._keeps_prev:
            assert own is not None
            prev = _Prev(aggregated=True, own=own, heard=frozenset(expected),
                         got={j: (m.header.age, m.header.lag, m.header.count)
                              for j, m in zip(expected, msgs, strict=True)},
                         told=self._told)
            if self.certified:
                senders, msgs = self._screen(r, expected, msgs, prev)
            self._prev = prev
        agg, full = self._aggregate(r, senders, msgs, [m.header.age for m in msgs],
                                    [m.header.lag for m in msgs])
        x, n_steps = await self._train(r, agg)
        self._commit(x, n_steps, full)

    def _screen(self, r: int, expected: list[int], msgs: list[Message],
                prev: _Prev) -> tuple[list[int], list[Message]]:
        """+certified: the round's candidates without the claims their evidence refutes
        (:func:`sfg.net.certify.refuted`, with this node's previous round); ``prev`` (this
        round, for the next) takes the stamps received and the ones accepted."""
        from sfg.net.certify import refuted

        certs = {j: self._certs.pop((j, r)) for j in expected}
        for key in [k for k in self._certs if k[1] < r]:
            del self._certs[key]
        for key in [k for k in self._accepted if k[1] < r - 1]:
            del self._accepted[key]
        last = self._prev
        bad = refuted(r == 0, certs, known={} if last is None else last.known,
                      me_heard=None if last is None or not last.aggregated else last.heard,
                      neighbours=self._neighbours_of)
        self.stats.checked += len(expected)
        self.stats.refuted += int(sum(bad.values()))
        prev.stamps = {j: c.stamp.raw for j, c in certs.items()}
        prev.known = {j: c.stamp for j, c in certs.items() if not bad[j]}
        keep = [k for k, j in enumerate(expected) if not bad[j]]
        return [expected[k] for k in keep], [msgs[k] for k in keep]

    async def _async_round(self, r: int) -> None:
        P = self.cfg.period
        start = self.clock.time()
        now = self.clock.monotonic()
        available = bool(self.world.available[r, self.i])
        self._log("wake", t=start, m=now, round=r, available=available)
        if not available:
            self._offline_round()
            return
        senders, msgs, ages, lags = [], [], [], []
        for j in self.nbrs:
            j = int(j)
            got = self.latest.get(j)
            if got is None or self._blocked(j, r):
                continue
            msg, arrival = got
            d = max(0.0, (now - arrival) / P)
            if d > self.cfg.window:
                continue
            age, lag = waited(msg.header.age, msg.header.lag, d)
            senders.append(j)
            msgs.append(msg)
            ages.append(age)
            lags.append(lag)
        agg, full = self._aggregate(r, senders, msgs, ages, lags)
        x, n_steps = await self._train(r, agg)
        self.round = r + 1  # the state about to be computed is the start of round r + 1
        end = self.clock.time()
        online = self._online_through(start, end)
        self._log("trained", t=end, round=r, interrupted=not online)
        if not online:
            # offline before its K steps were done (SPEC §12.1): the local round is
            # discarded — model and staleness as they were, nothing sent
            self.stats.interrupted += 1
            self.state = replace(self.state, t=self.state.t + 1)
            return
        self._commit(x, n_steps, full)
        targets = [int(j) for j in self.nbrs if not self._blocked(int(j), r)]
        self._send_all(targets, self._message())

    def _checkpoint(self) -> None:
        path = self.checkpoint_path
        if path is None:
            return
        self._save_outbox()
        s = self.stats
        extra = {"t0": self.t0, "stats": {k: getattr(s, k) for k in s.__dataclass_fields__}}
        if self._keeps_prev:
            extra["evidence"] = self._evidence_record()
        save_checkpoint(path, self.x, self.layout, self.state, extra)

    def _evidence_record(self) -> dict:
        """The previous round (:class:`_Prev`) and the headers accepted from past rounds, for
        the checkpoint (+certified and claim=certified resume with their evidence)."""
        t = self.rounds_done
        rec: dict[str, Any] = {"accepted": [[j, r, d.hex()] for (j, r), d in
                                            self._accepted.items() if r < t]}
        p = self._prev
        if p is not None:
            rec["prev"] = {
                "aggregated": p.aggregated, "own": list(p.own),
                "heard": None if p.heard is None else sorted(p.heard),
                "got": [[j, *v] for j, v in p.got.items()],
                "told": [[j, *v] for j, v in p.told.items()],
                "stamps": [[j, b.hex()] for j, b in p.stamps.items()],
                "known": [[j, st.raw.hex()] for j, st in p.known.items()]}
        return rec

    def _restore_evidence(self, rec: dict) -> None:
        """The inverse of :meth:`_evidence_record` (the stamps verified again)."""
        from sfg.net.certify import read_stamp

        self._accepted = {(int(j), int(r)): bytes.fromhex(d) for j, r, d in rec["accepted"]}
        p = rec.get("prev")
        if p is None:
            return

        def claim(v: list) -> tuple[int, float, int]:
            return int(v[0]), float(v[1]), int(v[2])

        try:
            known = {int(j): read_stamp(bytes.fromhex(b), self.cfg.keys) for j, b in p["known"]}
        except Rejected as e:
            raise SfgError(f"node {self.i}: the evidence in checkpoint {self.checkpoint_path} "
                           f"does not verify ({e}); delete the checkpoint to start afresh") \
                from None
        self._prev = _Prev(
            aggregated=bool(p["aggregated"]), own=claim(p["own"]),
            heard=None if p["heard"] is None else frozenset(int(j) for j in p["heard"]),
            got={int(v[0]): claim(v[1:]) for v in p["got"]},
            told={int(v[0]): claim(v[1:]) for v in p["told"]},
            stamps={int(j): bytes.fromhex(b) for j, b in p["stamps"]}, known=known)

    @property
    def _attacker(self) -> bool:
        """Whether this node forges its claims (one of the run's attackers)."""
        return self.world.attackers is not None and bool(self.world.attackers[self.i])

    def _outbox_path(self, r: int) -> Path:
        return self._checkpoint_dir / f"node-{self.i}-out-{r}.msgpack"

    @property
    def _checkpoint_dir(self) -> Path:
        if self.cfg.checkpoint_dir is None:  # callers run only with checkpoints on
            raise SfgError(f"node {self.i}: no checkpoint folder configured")
        return Path(self.cfg.checkpoint_dir)

    def _save_outbox(self) -> None:
        """Lockstep: own messages a neighbour may still need are part of the checkpoint (one
        msgpack file per round, written atomically once, removed when pruned). A neighbour that
        was offline in the node's next round can still be waiting for an older message when
        the node crashes; the restarted node must serve it (``Fetch``) or that neighbour,
        and the swarm, would wait forever."""
        if self.cfg.mode != "lockstep" or self.cfg.checkpoint_dir is None:
            return
        for r, (header, payload) in self.outbox.items():
            if r not in self._saved_out:
                body = payload.join() if isinstance(payload, Chunked) else payload
                write_atomic(self._outbox_path(r), msgpack.packb(
                    {"round": r, "header": header, "payload": body,
                     "expected": list(self._expected.get(r, ()))}, use_bin_type=True))
                self._saved_out.add(r)
        for r in sorted(self._saved_out - set(self.outbox)):
            self._outbox_path(r).unlink(missing_ok=True)
            self._saved_out.discard(r)

    def _restore_outbox(self) -> None:
        """The saved own messages of rounds before the checkpoint's (later ones are made again)."""
        for f in self._checkpoint_dir.glob(f"node-{self.i}-out-*.msgpack"):
            d = msgpack.unpackb(f.read_bytes(), raw=False, strict_map_key=False)
            r = int(d["round"])
            if r < self.state.t:
                h = d["header"]  # one header, or one per neighbour (a liar's claims)
                header = {int(j): bytes(v) for j, v in h.items()} if isinstance(h, dict) \
                    else bytes(h)
                self.outbox[r] = (header, bytes(d["payload"]))
                self._expected[r] = [int(j) for j in d["expected"]]
                self._saved_out.add(r)
            else:
                f.unlink(missing_ok=True)

    def _restore(self) -> None:
        path = self.checkpoint_path
        if path is None or not path.is_file():
            return  # nothing to resume from: start fresh
        self.x, self.state, extra = load_checkpoint(path, self.layout)
        self.loaded = (self.x.copy(), self.state)  # what the checkpoint held (for checks)
        st = extra.get("stats", {})
        for k, v in st.items():
            setattr(self.stats, k, [tuple(e) for e in v] if k == "curve" else v)
        if extra.get("t0") is not None:
            self.t0 = float(extra["t0"])
        self.round = self.state.t
        self.restored = {"round": self.state.t, "age": self.state.age, "lag": self.state.lag,
                         "missed": 0}
        if self.cfg.mode == "lockstep":
            self._restore_outbox()
        if self._keeps_prev and extra.get("evidence") is not None:
            self._restore_evidence(extra["evidence"])

    def _catch_up_missed(self) -> None:
        """Async resume: the own rounds whose wake-up passed while the node was down count
        as unavailable rounds (age and lag + 1 each), as an offline wake does (SPEC §12.2); the
        node goes on with the first round whose wake-up is still ahead. A node restarted
        before its first checkpoint starts from the initial state, and its missed rounds
        count all the same."""
        if (self.restored is None and not self.cfg.resume) or self.t0 is None:
            return
        now = self.clock.time()
        T, P = self.world.rounds, self.cfg.period
        jitter = self.cfg.jitter * P * wake_jitter(self.world.seed, T, self.world.n)[:, self.i]
        wakes = self.t0 + P * np.arange(T) + jitter
        missed = int(np.sum(wakes[self.state.t:] < now))
        if self.restored is None:
            if missed == 0:
                return
            self.restored = {"round": self.state.t, "age": self.state.age,
                             "lag": self.state.lag, "missed": 0, "checkpoint": False}
        for _ in range(missed):
            self._offline_round()
        if missed:
            self._checkpoint()  # a second crash before the next round resumes from here
        self.restored.update(missed=missed, age_after=self.state.age, lag_after=self.state.lag,
                             at=now)

    # ------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        """Run the remaining rounds; returns this node's result (see :meth:`result`)."""
        T = self.world.rounds
        if self.cfg.mode == "lockstep":
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
            self._save_outbox()  # drop the saved messages nobody needs any more
        else:
            if self.t0 is None:
                self.t0 = self.clock.time()
            self._catch_up_missed()
            self._log("start", t0=self.t0, restored=self.restored)
            P = self.cfg.period
            jitter = self.cfg.jitter * P * wake_jitter(self.world.seed, T, self.world.n)[:, self.i]
            while self.rounds_done < T:
                r = self.round = self.rounds_done
                wake = self.t0 + r * P + float(jitter[r])
                delay = wake - self.clock.time()
                if self.clock.virtual and (delay < 0 or (
                        self.net is not None and self.net.busy_until(self.i) > wake)):
                    # a wake while the node is still busy (training or sending) is skipped
                    # (SPEC §12.2); on the wall clock a late node runs its due rounds back to
                    # back instead (it cannot tell an overrun from the machine's load)
                    self.stats.skipped += 1
                    self.state = replace(self.state, t=self.state.t + 1)
                    self.round = self.state.t
                    self._end_round(r, False)
                    continue
                # always let the others (and the server) run in between
                await self.clock.wake(r, delay)
                await self._async_round(r)
                self._end_round(r, bool(self.world.available[r, self.i]))
            await asyncio.sleep(self.cfg.linger if self.cfg.linger is not None else P)
            await self._drain()
        self._log("end", round=self.state.t, final=self.x)
        return self.result()

    async def _drain(self) -> None:
        pending = [t for t in [*self._sends.values(), *self._backlog] if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.cfg.rpc_timeout)

    def result(self) -> dict[str, Any]:
        s = self.stats
        acc = s.curve[-1][1] if s.curve else self.trainer.evaluate(self.x)
        att = self.world.attackers
        return {"node": self.i, "acc": acc, "curve": [list(c) for c in s.curve],
                "attacker": bool(att is not None and att[self.i]),
                "messages": s.messages, "bytes": s.bytes, "sent": s.sent,
                "send_failed": s.send_failed, "offline_peer": s.offline_peer,
                "refused": s.refused, "steps": s.steps,
                "trains": s.trains, "available_rounds": s.available_rounds,
                "rejected": self.rejections.as_dict(), "state": self.state.as_dict(),
                "restored": self.restored, "header_bytes": s.header_bytes, "headers": s.headers,
                "certified": None if not self.certified else {
                    "checked": s.checked, "refuted": s.refuted,
                    "signed": self.cfg.keys.signed, "verified": self.cfg.keys.verified,
                    "sign_s": self.cfg.keys.sign_s, "verify_s": self.cfg.keys.verify_s}}
