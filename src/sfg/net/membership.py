"""A real node's peers chosen per exchange (docs/concepts/peers.md#real-nodes): its target
draws and, under ``online``, its membership table — with the functions every engine runs
(:mod:`sfg.world.peers`: :func:`~sfg.world.peers.draw_epidemic`,
:func:`~sfg.world.peers.draw_online`, :func:`~sfg.world.peers.hear`,
:func:`~sfg.world.peers.carry`, :func:`~sfg.world.peers.new_tables`), never a copy of them.

* **Targets**: the send of wake (async) or round (lockstep) ``c`` draws S targets from the
  keyed stream (seed, i, c): under ``epidemic`` uniformly among all other devices, under
  ``online`` among the table's entries (topped up from all others).
* **The table** (``online``): its row of the tables at the start
  (:func:`~sfg.world.peers.new_tables`: the graph neighbours, "never heard"), kept and updated
  in place (:func:`own_row`). Times are the node's own monotonic clock: first-hand, a
  message from j that arrives at t_a (sent ``held`` seconds before) is j heard at
  t_a − held; second-hand, each entry (k, s) it carries is k heard at t_a − held − s, kept
  only when strictly fresher. A message carries the M freshest heard entries as durations
  taken when it is made (:meth:`Membership.carried`).
* **Pull on return**: the return's S targets from the keyed stream (seed, "peers", "pull"),
  keyed by the return's index (:meth:`Membership.pull_targets`); under ``online`` from the
  table as it stands. A request makes its target hear of the asking node; a reply carries
  the replier's entries taken when it is made (:meth:`Membership.reply_header`) and is heard
  as a message (at its arrival minus its ``held``); an empty answer is heard as its sender
  alone, at its arrival; "unreachable" removes the peer (:meth:`Membership.forget`).
* **Lockstep** (``epidemic`` only: under ``online`` a node cannot know whom to wait for): the
  senders a node waits for in round t are the available devices whose round-t draw names
  it (:meth:`Membership.expected`): the draws are keyed streams every node computes.
* **Checkpoints**: the table as durations relative to the checkpoint's time
  (:meth:`Membership.snapshot`); on restart the downtime is added (:meth:`Membership.restore`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.net.wire import Header, Rejected, check_members, pack_members, unpack_header
from sfg.world.peers import (
    ENTRY_BYTES,
    NEVER,
    Peers,
    carry,
    draw_epidemic,
    draw_online,
    forget,
    hear,
    new_tables,
    parse_peers,
    peers_key,
    pull_key,
    tie_key,
)

log = logging.getLogger("sfg.net")


def check_mode(peers: Peers, mode: str) -> None:
    """Refuse ``online`` on a lockstep node (one line): whom to wait for would depend on
    tables no other node holds."""
    if peers.kind == "online" and mode == "lockstep":
        raise SfgError(f"peers {str(peers)!r}: a lockstep node cannot know whom to wait for "
                       "when each device draws from its own table; run it with --protocol "
                       "async, or peers epidemic:s=S")


def check_node_peers(peers: Peers, world: Any, mode: str) -> None:
    """Refuse (one line) what a node does not run under ``peers``: ``online`` on lockstep
    nodes (whom to wait for depends on tables no other node holds), S ≥ N, and a rule that
    keeps state per neighbour (:func:`sfg.modelfree.peers.check_rule`). The node on the
    virtual clock runs the rest (its world's refusals: :func:`sfg.clock.peersim.check_clock`)."""
    if peers.fixed:
        return
    from sfg.modelfree.peers import check_rule

    check_mode(peers, mode)
    peers.check(world.n)
    check_rule(world.rule, peers)


def own_row(tables: tuple[np.ndarray, ...], i: int) -> tuple[np.ndarray, ...]:
    """Device ``i``'s row of the tables (:func:`~sfg.world.peers.new_tables`) as tables of
    the same shape whose every row is that one row (stride 0): the compiled functions index
    row i as they do in the engines, and a node holds O(V), not O(N·V)."""
    from numpy.lib.stride_tricks import as_strided

    out = []
    for a in tables:
        row = a[i:i + 1].copy()
        out.append(as_strided(row, shape=a.shape, strides=(0, *row.strides[1:])))
    return tuple(out)


def node_membership(world: Any, i: int, cfg: Any, *, virtual: bool = False) -> Membership:
    """Node ``i``'s :class:`Membership` under its config's ``peers`` (else the run's),
    checked (:func:`check_node_peers`); on the ``virtual`` clock its tables hear in the
    instant's order (:func:`sfg.net.simclock.after_arrivals`). An entry may say at most the
    run's length: T·P (async; T times the deadline, lockstep) plus one RPC time-out (a node
    late on its clock)."""
    peers = parse_peers(cfg.peers if cfg.peers is not None else world.cfg.get("peers"))
    check_node_peers(peers, world, cfg.mode)
    per = cfg.period if cfg.mode == "async" else cfg.deadline
    m = Membership(peers, world, i, longest=world.rounds * float(per) + float(cfg.rpc_timeout))
    if virtual and m.online:  # on the virtual clock: heard in the instant's order
        from sfg.net.simclock import after_arrivals

        m.defer = after_arrivals
    return m


class Membership:
    """Node ``i``'s peers (see the module docstring). ``longest``: the most seconds an
    entry may say (the run's length); ``gossip`` is M (0 unless ``online``)."""

    def __init__(self, peers: Any, world: Any, i: int, *, longest: float):
        self.peers = parse_peers(peers)
        self.i, self.n = int(i), int(world.n)
        self.longest = float(longest)
        p = self.peers
        self.gossip = p.gossip if p.kind == "online" else 0
        self.key = np.uint64(peers_key(world.seed))
        self.pull_key = np.uint64(pull_key(world.seed))
        self.pulls = 0          # returns that drew their pull's targets
        self.tkey = np.uint64(tie_key(world.seed))
        self.tables = own_row(new_tables(p, world.seed, world.graph), self.i) \
            if p.kind == "online" else None
        self._out = np.empty(max(p.s, 1), np.int64)
        self._buf = np.empty(max(p.view, 1), np.int64)
        self._cid = np.empty(max(self.gossip, 1), np.int64)
        self._cs = np.empty(max(self.gossip, 1))
        # where the node runs on the virtual clock: defer(fn, *args) runs a table's hearing
        # in the instant's phase after its arrivals (None: at once; sfg.net.node)
        self.defer: Callable[..., None] | None = None
        self.sends = 0          # targets drawn (messages to the peers drawn)
        self.entries = 0        # entries carried, summed over the messages handed out
        self.last = 0           # entries the latest own message carries
        self.offline = 0        # lockstep: targets drawn offline in their round (not sent)

    @property
    def fixed(self) -> bool:
        return self.peers.fixed

    def candidates(self, world: Any) -> np.ndarray:
        """int64 [k] whom the node may hear from: its graph neighbours, or under peers other
        than fixed every other device of the run (any may draw it)."""
        if self.fixed:
            return world.neighbours(self.i)
        return np.array([j for j in range(self.n) if j != self.i], np.int64)

    @property
    def online(self) -> bool:
        return self.tables is not None

    # ------------------------------------------------------------------ targets
    def draw(self, i: int, count: int, key: np.uint64 | None = None) -> list[int]:
        """Device ``i``'s S targets of its send ``count`` (for another device: ``epidemic``),
        from the targets' stream, or ``key``'s (a pull's: :meth:`pull_targets`)."""
        p, out, key = self.peers, self._out, self.key if key is None else key
        if p.kind == "online":
            assert i == self.i and self.tables is not None, "a node holds its own table only"
            tab_id, _, _, tab_n = self.tables
            draw_online(key, self.i, int(count), self.n, p.s, tab_id, tab_n, self._buf, out)
        else:
            draw_epidemic(key, int(i), int(count), self.n, p.s, out)
        return [int(j) for j in out[:p.s]]

    def unsent(self, entries: int, *, reply: bool = False) -> None:
        """A message to a drawn target (or a pull's ``reply``) was lost at its sender (gone
        offline before its transfer ended): neither it nor the ``entries`` it carried count
        as sent, as the engines count them (sfg.clock.peersim)."""
        if not self.fixed:
            self.sends -= 0 if reply else 1
            self.entries -= int(entries)

    def pull_targets(self) -> list[int]:
        """The S devices this node's next return asks (its returns counted from 0: the
        return's index), from the stream (seed, "peers", "pull"), in the order asked: under
        ``epidemic`` uniformly from all others, under ``online`` from the table as it stands
        (docs/concepts/peers.md#targets)."""
        nth, self.pulls = self.pulls, self.pulls + 1
        return self.draw(self.i, nth, self.pull_key)

    def forget(self, j: int) -> None:
        """A pull's request to ``j`` was answered "unreachable": j leaves the table
        (``online``)."""
        if self.tables is not None:
            tab_id, tab_t, tab_h, tab_n = self.tables
            forget(self.i, int(j), tab_id, tab_t, tab_h, tab_n)

    def heard_of(self, j: int, t: float) -> None:
        """Device ``j`` heard of at ``t`` (this node's monotonic clock) first-hand, nothing
        carried (``online``): a pull's request from j, or j's empty answer to this node's
        pull."""
        if self.tables is not None:
            self._hear([int(j)], [float(t)])

    def _hear(self, ids: list[int], ts: list[float]) -> None:
        """Hear of each of ``ids`` at its time of ``ts`` (:func:`~sfg.world.peers.hear`): at
        once, or where the node runs on the virtual clock (``defer``, set by the node) once
        the instant's "unreachable" answers and requests are taken, as the engine orders
        one instant (docs/concepts/peers.md#on-the-virtual-clock)."""
        if self.defer is not None:
            self.defer(self._hear_now, ids, ts)
        else:
            self._hear_now(ids, ts)

    def _hear_now(self, ids: list[int], ts: list[float]) -> None:
        assert self.tables is not None
        tab_id, tab_t, tab_h, tab_n = self.tables
        for j, t in zip(ids, ts, strict=True):
            hear(self.tkey, self.i, j, t, tab_id, tab_t, tab_h, tab_n)

    def reply_header(self, header: bytes, now: float) -> bytes:
        """The header of a pull's reply made at ``now``: the message's own, its membership
        entries taken again now (``online``; the reply is counted as carrying them: undone
        by :meth:`unsent` when it never leaves). A header with +certified evidence is
        answered as it was signed (no rule with evidence runs under peers)."""
        if self.tables is None:
            return header
        h = unpack_header(header)
        if h.cert:
            return header
        members = self.carried(now)
        self.entries += len(members) // ENTRY_BYTES
        return replace(h, members=members).pack()

    def targets(self, count: int) -> list[int]:
        """This node's targets of its send ``count``, counted."""
        got = self.draw(self.i, count)
        self.sends += len(got)
        return got

    def expected(self, r: int, available: np.ndarray,
                 blocked: Callable[[int], bool]) -> list[int]:
        """Lockstep, ``epidemic``: the devices that send to this node in round ``r`` (those
        available at r, not cut off, whose round-r draw names it), in id order."""
        out = []
        for j in range(self.n):
            if j != self.i and available[j] and not blocked(j) and self.i in self.draw(j, r):
                out.append(j)
        return out

    def sends_to(self, j: int, r: int) -> bool:
        """Whether device ``j``'s round-``r`` draw names this node (``epidemic``)."""
        return self.i in self.draw(j, r)

    # ------------------------------------------------------------------ the table
    def carried(self, now: float) -> bytes:
        """The header's ``members`` of a message made at ``now`` (this node's monotonic
        clock): its M freshest heard entries as seconds since heard (b"" unless online)."""
        if self.tables is None:
            return b""
        tab_id, tab_t, _, tab_n = self.tables
        h = carry(self.i, float(now), self.gossip, tab_id, tab_t, tab_n, self._cid, self._cs)
        return pack_members(self._cid[:h], np.maximum(self._cs[:h], 0.0)) if h else b""

    def check(self, header: Header) -> tuple[np.ndarray, np.ndarray]:
        """The entries of an arriving header, checked (:func:`sfg.net.wire.check_members`)."""
        return check_members(header, gossip=self.gossip, n=self.n, longest=self.longest)

    def heard(self, header: Header, t_arrival: float, held: float = 0.0) -> None:
        """Merge what a message arriving at ``t_arrival`` says (``online``): its sender heard
        at t_arrival − held, each entry at t_arrival − held − its seconds."""
        if self.tables is None:
            return
        ids, secs = self.check(header)
        t = float(t_arrival) - float(held)
        self._hear([int(header.sender), *ids.tolist()],
                   [t, *(t - float(s) for s in secs.tolist())])

    def row(self) -> list[tuple[int, float]]:
        """The table's entries (peer, heard time), freshest first."""
        if self.tables is None:
            return []
        tab_id, tab_t, _, tab_n = self.tables
        return [(int(tab_id[self.i, a]), float(tab_t[self.i, a]))
                for a in range(int(tab_n[self.i]))]

    def fill(self, row: list[tuple[int, float]]) -> None:
        """Set the table to ``row`` (peer, heard time), ranked as
        :func:`~sfg.world.peers.hear` ranks."""
        assert self.tables is not None
        tab_id, tab_t, tab_h, tab_n = self.tables
        tab_n[self.i] = 0
        tab_id[self.i, :], tab_t[self.i, :], tab_h[self.i, :] = -1, NEVER, 0.0
        for j, t in row:  # hear sorts them (the tie hash from (seed, i, j))
            hear(self.tkey, self.i, int(j), float(t), tab_id, tab_t, tab_h, tab_n)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, now: float, wall: float) -> dict[str, Any]:
        """The table for a checkpoint: entries as seconds since heard at ``now`` (None:
        never heard) and the checkpoint's ``wall`` time (to add the downtime on restart)."""
        return {"peers": str(self.peers), "at": float(wall),
                "table": [[j, None if t == NEVER else max(0.0, float(now) - t)]
                          for j, t in self.row()]}

    def restore(self, saved: dict[str, Any] | None, now: float, wall: float, where: str) -> None:
        """The table of a checkpoint (:meth:`snapshot`), each entry older by the downtime
        (``wall`` now minus the checkpoint's). A checkpoint written before tables were kept
        (None) migrates: the table stays at its start (the graph neighbours, never heard).
        One written under another ``peers`` is refused (one line)."""
        if saved is None:
            if self.tables is not None:
                log.info("node %d: %s keeps no membership table (an older checkpoint); the "
                         "table starts from the graph neighbours", self.i, where)
            return
        if saved.get("peers") != str(self.peers):
            raise SfgError(f"node {self.i}: the checkpoint {where} was written under peers "
                           f"{saved.get('peers')!r}, this run has {str(self.peers)!r}; "
                           "resume with the same peers, or start without --resume")
        if self.tables is None:
            return
        try:
            down = max(0.0, float(wall) - float(saved["at"]))
            row = [(int(j), NEVER if s is None else float(now) - float(s) - down)
                   for j, s in saved["table"]]
        except (KeyError, TypeError, ValueError):
            raise SfgError(f"node {self.i}: the membership table in {where} does not "
                           "parse; start without --resume") from None
        if len(row) > self.peers.view or any(not 0 <= j < self.n or j == self.i
                                             for j, _ in row):
            raise SfgError(f"node {self.i}: the membership table in {where} does not fit "
                           "this run; start without --resume")
        self.fill(row)

    # ------------------------------------------------------------------ counts
    def result(self, node: Any, to_offline: int) -> dict[str, Any] | None:
        """The node's peer counts (None under ``fixed``): targets drawn, those offline
        (``to_offline`` refused as offline, and lockstep's targets offline in their round),
        membership bytes carried, the table's size, and per hour of the node's run (T·P
        async and on the virtual clock, its wall time on a real lockstep node) the messages,
        those to offline peers and the membership bytes."""
        if self.fixed:
            return None
        if node.cfg.mode == "async" or node.clock.virtual:  # (lockstep: P is Δ there)
            seconds = node.world.rounds * float(node.cfg.period)
        elif node.started is not None:
            seconds = max(0.0, node.clock.monotonic() - node.started)
        else:
            seconds = 0.0
        out = {"peers": str(self.peers), "messages": self.sends,
               "to_offline": int(to_offline) + self.offline,
               "membership_bytes": self.entries * ENTRY_BYTES, "table": len(self.row()),
               "seconds": float(seconds), "hours": float(seconds) / 3600.0}
        out.update(per_hour(out, seconds / 3600.0))
        return out


#: a node's peer counts -> the metric per device-hour (sfg.metrics)
PER_HOUR = {"messages": "peer_messages_per_device_hour",
            "to_offline": "messages_to_offline_per_device_hour",
            "membership_bytes": "membership_bytes_per_device_hour"}


def per_hour(counts: dict[str, Any], hours: float) -> dict[str, float]:
    """The peer counts per device-hour (NaN over no time)."""
    return {name: float(counts[k]) / hours if hours > 0 else float("nan")
            for k, name in PER_HOUR.items()}


def pooled(results: list[dict]) -> dict[str, float]:
    """The nodes' peer counts summed and per device-hour (the sum of the nodes' time):
    nothing when they ran peers fixed."""
    got = [r["peers"] for r in results if r.get("peers")]
    if not got:
        return {}
    total = {k: sum(g[k] for g in got) for k in PER_HOUR}
    # the nodes' seconds summed exactly, then in hours: N·T·P/3600 as the engines divide
    return per_hour(total, math.fsum(g["seconds"] for g in got) / 3600.0)


def reject_unexpected(m: Membership, sender: int, r: int) -> None:
    """Lockstep under ``epidemic``: refuse a round-``r`` message from a device whose draw
    does not name this node ("non-neighbour": it is no peer of this exchange)."""
    if not m.fixed and not m.sends_to(sender, r):
        raise Rejected("non-neighbour", f"node {sender} does not send to node {m.i} in round "
                                        f"{r} under peers {str(m.peers)!r}")
