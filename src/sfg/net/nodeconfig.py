"""How a node runs (:class:`NodeConfig`) and what it counts (:class:`NodeStats`).

Both belong to :class:`sfg.net.node.Node` (and are importable from :mod:`sfg.net.node`); the
protocol's modules beside it (:mod:`sfg.net.lockstep`, :mod:`sfg.net.asyncmode`,
:mod:`sfg.net.returns`, :mod:`sfg.net.inbox`, :mod:`sfg.net.outgoing`) read the one and add to
the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sfg.clock.settings import check_timer
from sfg.errors import SfgError
from sfg.net.cuts import Cut
from sfg.net.transport import TlsFiles
from sfg.net.wire import DEFAULT_MAX_BYTES

MODES = ("lockstep", "async")


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
    # peers chosen per exchange (sfg.world.peers.Peers or its text; None: the run's ``peers``,
    # docs/concepts/peers.md#real-nodes)
    peers: Any = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SfgError(f"unknown mode {self.mode!r}; choose lockstep or async")
        if self.peers is not None:
            from sfg.net.membership import check_mode
            from sfg.world.peers import parse_peers

            self.peers = parse_peers(self.peers)
            check_mode(self.peers, self.mode)
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

    def with_on_return(self, on_return: Any) -> NodeConfig:
        """This config with the run's ``on_return`` pull time-out (docs/concepts/nodes.md#returns-in-the-node)
        unless it sets its own; checked as any NodeConfig."""
        if self.pull_timeout is not None:
            return self
        from sfg.clock.settings import parse_on_return

        S = parse_on_return(on_return)
        return self if S is None else replace(self, pull_timeout=S)


@dataclass
class NodeStats:
    """A node's counts (reported by :meth:`sfg.net.node.Node.result`)."""

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
    # peers chosen per exchange (docs/concepts/peers.md#real-nodes): their counts are the
    # node's sfg.net.membership.Membership's
