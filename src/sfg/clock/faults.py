"""Deterministic faults for the node on the virtual clock (docs/concepts/clock.md#the-node-on-the-clock).

``sfg swarm --clock virtual --faults faults:loss=0.1,delay=2.0 --faults-seed 7`` runs the
deployable node (:class:`sfg.net.node.Node`) on the in-memory network of
:mod:`sfg.net.memory` with faults that are events of the schedule: each decision about a
message is a counter-based draw (:func:`sfg.util.rng.counter_uniform`) keyed by the faults
seed and the fault kind, for the message's identity (sender, receiver, channel: push or reply
to a pull, and its number among the link's messages in the order its sender sends), so the
same (run seed, settings, faults, faults seed) replays the same faults exactly, a failing seed
is a reproducible bug report, and the clock's engine (``sfg run --clock virtual --protocol
async --faults ...``, :func:`sfg.clock.schedule.fault_plan`), which numbers its messages the
same way, faults the same messages (:meth:`FaultPlan.fates`; crashes and drift, faults of a
node's own timeline, are the node's only). The faults seed is independent of the run seed: the same run can be replayed under
many fault draws, and one fault draw under many runs.

Keys of the component string (``faults:key=value,...``; ``none`` = no faults):

=============  ==============================================================================
``loss``       probability that a message (a push, or the reply to a pull) is lost in transit
``delay``      extra delay of every message, uniform in [0, ``delay``] seconds
``reorder``    probability that a message is held back by ``hold`` seconds, long enough for the
               next message on its link to overtake it
``hold``       seconds a reordered message is held back (default 1.5 periods P)
``dup``        probability that a message is delivered ``copies`` more times, right after it
``copies``     extra copies of a duplicated message (default 1; a flood: ``dup=1,copies=20``)
``corrupt``    probability that one byte of a message's tensor data is flipped in transit (the
               value stays finite, the payload's SHA-256 no longer matches the header's)
``misroute``   probability that a copy of a message is also delivered to a random
               non-neighbour of its sender (which must reject it: "non-neighbour")
``partition``  ``A|B@T1-T2``: messages between node sets A and B sent in [T1, T2) seconds
               of virtual time are dropped (a :class:`sfg.net.cuts.Cut`); a set is ids and ranges joined by ``.``
               (``0-3``, ``0.2.5-7``) or ``*`` (every node not in the other set); several
               partitions are joined by ``;``
``crashes``    K crashes at random (node, time), time uniform in [0, ``span``): the node's task
               is cancelled, its server stopped (messages to it fail), and after ``downtime``
               seconds it is restarted from its last checkpoint (the node's own files, written
               and read by the code a deployed node uses)
``crash``      crashes at given times: ``NODE@SECONDS`` (a :class:`sfg.net.cuts.Crash`),
               several joined by ``;``
``downtime``   seconds a crashed node stays down (default 1.5 periods P)
``span``       seconds within which the random crashes fall (default the run's T · P)
``drift``      clock drift per node, uniform in [-``drift``, ``drift``] (a rate: 0.001 is 1 ms
               per second), fed to the node's own clock (:class:`sfg.net.simclock.NodeClock`)
=============  ==============================================================================

:class:`Faults` is the parsed setting; :meth:`Faults.plan` binds it to a run (nodes, graph,
period, rounds) as a :class:`FaultPlan`, the object the network consults per message
(``decide``, ``tamper``) and :func:`sfg.net.virtual.run_virtual_swarm` per node (``drifts``,
``crashes``). The plan counts what it did (``stats``), which the run's summary reports.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.net.cuts import Crash, Cut
from sfg.util.components import did_you_mean, parse_component
from sfg.util.rng import counter_key, counter_uniform, stream

KEYS = ("loss", "delay", "reorder", "hold", "dup", "copies", "corrupt", "misroute", "partition",
        "crashes", "crash", "downtime", "span", "drift")
_PROBS = ("loss", "reorder", "dup", "corrupt", "misroute")
_EXAMPLE = "faults:loss=0.1,delay=2.0,dup=0.05,crashes=2,downtime=900"


def _items(text: str) -> list[str]:
    """The non-empty items of a ``;``-joined list."""
    return [p.strip() for p in str(text).split(";") if p.strip()]


@dataclass(frozen=True)
class Faults:
    """The faults of a run, as parsed from a component string (see the module docstring)."""

    loss: float = 0.0
    delay: float = 0.0
    reorder: float = 0.0
    hold: float | None = None
    dup: float = 0.0
    copies: int = 1
    corrupt: float = 0.0
    misroute: float = 0.0
    partitions: tuple[Cut, ...] = ()
    crashes: int = 0
    crash_at: tuple[Crash, ...] = ()
    downtime: float | None = None
    span: float | None = None
    drift: float = 0.0
    seed: int = 0
    text: str = "none"

    @classmethod
    def parse(cls, text: str | None, *, seed: int = 0) -> Faults:
        """``faults:key=value,...`` (keys in the module docstring) or ``none``."""
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise SfgError(f"--faults-seed must be an integer >= 0, got {seed!r}")
        if text is None or str(text).strip().lower() in ("", "none"):
            return cls(seed=seed)
        comp = parse_component(str(text), kind="faults")
        if comp.name != "faults" or comp.modifiers:
            raise SfgError(f"cannot read --faults {text!r}; write 'none' or "
                           f"faults:key=value,..., e.g. {_EXAMPLE}")
        p = dict(comp.params)
        for k in p:
            if k not in KEYS:
                raise SfgError(f"unknown faults key {k!r}{did_you_mean(k, KEYS)}")
        kw: dict[str, Any] = {}
        for k in ("loss", "delay", "reorder", "hold", "dup", "corrupt", "misroute", "downtime",
                  "span", "drift"):
            if k in p:
                v = p[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise SfgError(f"faults key {k}={v!r} must be a number")
                kw[k] = float(v)
        for k in _PROBS:
            if not 0.0 <= kw.get(k, 0.0) <= 1.0:
                raise SfgError(f"faults key {k}={kw[k]} is a probability; use a value in [0, 1]")
        for k in ("delay", "hold", "downtime", "span"):
            if k in kw and kw[k] < 0:
                raise SfgError(f"faults key {k}={kw[k]} is seconds; use a value >= 0")
        if not 0.0 <= kw.get("drift", 0.0) < 0.5:
            raise SfgError(f"faults key drift={kw['drift']} is a rate; use a value in [0, 0.5)")
        for k in ("copies", "crashes"):
            if k in p:
                v = p[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < (1 if k == "copies" else 0):
                    raise SfgError(f"faults key {k}={v!r} must be an integer >= "
                                   f"{1 if k == 'copies' else 0}")
                kw[k] = int(v)
        if "partition" in p:
            kw["partitions"] = tuple(Cut.parse_seconds(c) for c in _items(p["partition"]))
        if "crash" in p:
            kw["crash_at"] = tuple(Crash.parse_seconds(c) for c in _items(p["crash"]))
        return cls(**kw, seed=seed, text=str(comp))

    @property
    def any(self) -> bool:
        """Whether any fault is on."""
        return bool(self.loss or self.delay or self.reorder or self.dup or self.corrupt
                    or self.misroute or self.partitions or self.crashes or self.crash_at
                    or self.drift)

    def plan(self, n: int, *, period: float, rounds: int,
             neighbours: Callable[[int], Iterable[int]] | None = None) -> FaultPlan:
        """Bind to a run of ``n`` nodes with round period ``period`` and ``rounds`` rounds."""
        for w in self.partitions:
            w.check_nodes(n, "--faults partition")
        for c in self.crash_at:
            if c.node >= n:
                raise SfgError(f"--faults crash names node {c.node}, but the run has nodes "
                               f"0..{n - 1}")
        return FaultPlan(self, int(n), float(period), int(rounds), neighbours)


@dataclass
class FaultPlan:
    """A :class:`Faults` bound to a run: the hooks :class:`sfg.net.memory.MemoryNetwork`
    and :func:`sfg.net.virtual.run_virtual_swarm` call, and the counts of what happened."""

    faults: Faults
    n: int
    period: float
    rounds: int
    neighbours: Callable[[int], Iterable[int]] | None = None
    stats: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.events: list[dict] = []  # crashes as they happened: node, crashed, restarted
        self._keys: dict[str, int] = {}
        self._count: dict[tuple[int, int, int], int] = {}  # messages decided per link
        self._strangers: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ draws
    def _u(self, kind: str, src, dst, channel, k):
        """The counter-based draw of fault ``kind`` for message ``k`` of ``channel`` (0: pushes,
        1: replies to pulls) on the link ``src`` → ``dst``: a pure function of the faults seed
        and the message's identity (:func:`sfg.util.rng.counter_uniform`), so the network,
        which decides one message at a time, and the clock's engine, which decides all at
        once, draw the same value for the same message."""
        key = self._keys.get(kind)
        if key is None:
            key = self._keys[kind] = counter_key(self.faults.seed, "faults", kind)
        return counter_uniform(key, src, dst, channel, k)

    def _next(self, channel: int, src: int, dst: int) -> int:
        c = (channel, src, dst)
        k = self._count[c] = self._count.get(c, -1) + 1
        return k

    @property
    def hold(self) -> float:
        f = self.faults
        return 1.5 * self.period if f.hold is None else f.hold

    @property
    def downtime(self) -> float:
        f = self.faults
        return 1.5 * self.period if f.downtime is None else f.downtime

    def decide(self, src: int, dst: int, t: float, k: int | None = None,
               channel: int = 0) -> tuple[bool, float, int]:
        """Message ``k`` (its index among the calls on the link, counted by the caller; None:
        counted here) of ``channel`` from ``src`` to ``dst``, leaving at time ``t``:
        (dropped, extra delay, copies). Every kind has its own draw per message, so switching
        one kind on leaves the others' decisions unchanged."""
        f = self.faults
        if k is None:
            k = self._next(channel, src, dst)
        lost = f.loss > 0 and self._u("loss", src, dst, channel, k) < f.loss
        extra = self._u("delay", src, dst, channel, k) * f.delay if f.delay > 0 else 0.0
        held = f.reorder > 0 and self._u("reorder", src, dst, channel, k) < f.reorder
        dup = f.dup > 0 and self._u("dup", src, dst, channel, k) < f.dup
        cut = any(w.blocks(src, dst, t) for w in f.partitions)
        if cut:
            self.stats["partitioned"] += 1
            return True, 0.0, 1
        if lost:
            self.stats["lost"] += 1
            return True, 0.0, 1
        if extra > 0:
            self.stats["delayed"] += 1
        if held:
            self.stats["reordered"] += 1
            extra += self.hold
        copies = 1 + (f.copies if dup else 0)
        self.stats["duplicated"] += copies - 1
        return False, extra, copies

    def fates(self, src: np.ndarray, dst: np.ndarray, k: np.ndarray, t: np.ndarray,
              channel: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`decide` and :meth:`tamper`'s corruption for arrays of pushes (message ``k``
        on the link ``src`` → ``dst``, leaving at ``t``), as the clock's engine applies them:
        (partitioned, lost, extra delay, corrupted). Duplicates and misrouted copies change no
        model (a copy replaces its original at the same instant; a non-neighbour's message is
        rejected), so they are not part of a fate."""
        f = self.faults
        z = np.zeros(src.shape, bool)
        cut = z.copy()
        for w in f.partitions:
            cut |= w.blocks_many(src, dst, t)
        lost = (self._u("loss", src, dst, channel, k) < f.loss) & ~cut if f.loss > 0 else z
        gone = cut | lost
        extra = self._u("delay", src, dst, channel, k) * f.delay if f.delay > 0 else np.zeros(src.shape)
        if f.reorder > 0:
            extra = extra + np.where(self._u("reorder", src, dst, channel, k) < f.reorder, self.hold, 0.0)
        extra = np.where(gone, 0.0, extra)
        bad = (self._u("corrupt", src, dst, channel, k) < f.corrupt) & ~gone if f.corrupt > 0 else z
        return cut, lost, extra, bad

    def _stranger(self, src: int, k: int) -> int | None:
        got = self._strangers.get(src)
        if got is None:
            near = set() if self.neighbours is None else {int(j) for j in self.neighbours(src)}
            got = self._strangers[src] = [k for k in range(self.n) if k != src and k not in near]
        if not got:
            return None
        return got[int(self._u("misroute-to", src, src, 0, k) * len(got))]

    def tamper(self, src: int, dst: int, t: float, payload, *, misroute: bool = True,
               k: int | None = None, channel: int = 0) -> tuple[Any, int | None]:
        """In transit: maybe flip one byte of the payload's tensor data (``corrupt``), and
        maybe name a non-neighbour of ``src`` that also gets a copy (``misroute``; not for the
        replies to pulls). ``k``, ``channel``: the message, as for :meth:`decide` (None: the
        last one :meth:`decide` counted on the link). Returns (payload, stranger or None)."""
        f = self.faults
        if k is None:
            k = self._count.get((channel, src, dst), 0)
        if f.corrupt > 0 and self._u("corrupt", src, dst, channel, k) < f.corrupt:
            body = bytearray(b"".join(payload) if isinstance(payload, tuple) else payload)
            (head,) = struct.unpack("<Q", bytes(body[:8]))
            n_values = (len(body) - 8 - head) // 4
            if n_values > 0:
                at = int(self._u("corrupt-at", src, dst, channel, k) * n_values)
                body[8 + head + 4 * at] ^= 0x01  # the lowest mantissa bit: still finite
                payload = bytes(body)
                self.stats["corrupted"] += 1
        stranger = None
        if misroute and f.misroute > 0 and \
                self._u("misroute", src, dst, channel, k) < f.misroute:
            stranger = self._stranger(src, k)
            if stranger is not None:
                self.stats["misrouted"] += 1
        return payload, stranger

    def drifts(self, n: int) -> np.ndarray:
        """[n] clock drift rates, uniform in [-drift, drift]."""
        d = self.faults.drift
        if d <= 0:
            return np.zeros(n)
        return stream(self.faults.seed, "faults", "drift").uniform(-d, d, n)

    def crashes(self) -> list[tuple[int, float]]:
        """(node, virtual seconds) of every crash, in time order (random ones and given ones)."""
        f = self.faults
        out = [c.pair for c in f.crash_at]
        if f.crashes:
            g = stream(f.seed, "faults", "crashes")
            span = self.rounds * self.period if f.span is None else f.span
            nodes = g.integers(0, self.n, f.crashes)
            times = g.uniform(0.0, span, f.crashes)
            out += [(int(i), float(t)) for i, t in zip(nodes, times, strict=True)]
        return sorted(out, key=lambda c: (c[1], c[0]))

    def summary(self) -> dict[str, Any]:
        """The faults setting, its seed and the counts (for the run's JSON)."""
        keys = ("lost", "partitioned", "delayed", "reordered", "duplicated", "corrupted",
                "misrouted", "crashes", "restarts", "crashes_skipped")
        return {"spec": self.faults.text, "seed": self.faults.seed,
                **{k: int(self.stats.get(k, 0)) for k in keys},
                "crash_log": [dict(e) for e in self.events]}


def as_plan(faults: Any, n: int, *, period: float, rounds: int,
            neighbours: Callable[[int], Iterable[int]] | None = None) -> Any:
    """``faults`` as the network's hook object: None (no faults), a component string, a
    :class:`Faults`, or an object that already has the hooks (a :class:`FaultPlan` or any
    object with ``decide``) — returned as it is."""
    if faults is None:
        return None
    if isinstance(faults, str):
        faults = Faults.parse(faults)
    if isinstance(faults, Faults):
        return faults.plan(n, period=period, rounds=rounds, neighbours=neighbours)
    return faults
