"""Network cuts and crashes: one parsed type each, whatever syntax they were written in.

A **cut** (:class:`Cut`) drops the traffic between two node sets during a span of time, in
rounds (a real swarm's ``--partition A|B@R1-R2``, docs/concepts/nodes.md#networked-nodes) or in seconds of virtual time (the
clock's ``--faults ...,partition=A|B@T1-T2``, docs/concepts/clock.md#the-node-on-the-clock). A **crash** (:class:`Crash`) stops a
node at a round (``--kill NODE@ROUND``) or at a time (``crash=NODE@SECONDS``). The parsers
(:meth:`Cut.parse_rounds`, :meth:`Cut.parse_seconds`, :meth:`Crash.parse_round`,
:meth:`Crash.parse_seconds`) read the syntaxes users type; every consumer — the node, the
virtual network, the clock's engine — uses the parsed objects.

The two cut syntaxes::

    0,1,2|3,4@5-9         rounds 5..9 (both included); a set is ids joined by ','
    0-3|4-7@1200-3600     seconds [1200, 3600); a set is ids and ranges joined by '.'
                          (0-3, 0.2.5-7) or '*' (every node not in the other set)

A cut is held as the half-open span [start, end) of its unit: the round span R1..R2 is
[R1, R2 + 1).

The one grammar of the command line (``--cut``, ``--crash``) writes the unit on every number
(:meth:`Cut.parse`, :meth:`Crash.parse`)::

    0,1|2,3@5r-9r         rounds 5..9 (both included: a round is one step)
    0-3|4-7@1200s-3600s   seconds [1200, 3600) of virtual time
    3@10r  /  3@1500s     node 3 crashes at the start of round 10 / at 1500 s

A node set is ids and ranges joined by ``,`` or ``.`` (``0-3``, ``0,2,5-7``), or ``*`` (every
node not in the other set; seconds only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sfg.errors import SfgError

UNITS = ("rounds", "seconds")


def _check_unit(unit: str) -> None:
    if unit not in UNITS:
        raise SfgError(f"unknown unit {unit!r}; choose rounds or seconds")


@dataclass(frozen=True)
class Cut:
    """Traffic between node sets ``a`` and ``b`` is dropped at every instant ``start <= at <
    end`` of ``unit`` (``"rounds"``: round indices; ``"seconds"``: virtual time). ``None`` for
    a set means every node not in the other (seconds syntax only)."""

    a: frozenset[int] | None
    b: frozenset[int] | None
    start: float
    end: float
    unit: str = "rounds"

    def __post_init__(self) -> None:
        _check_unit(self.unit)

    @property
    def nodes(self) -> frozenset[int]:
        """The nodes named on either side (a ``*`` side names none)."""
        return (self.a or frozenset()) | (self.b or frozenset())

    @property
    def last_round(self) -> int:
        """A round cut's last round (R2 of ``R1-R2``, included)."""
        return int(self.end) - 1

    def blocks(self, i: int, j: int, at: float) -> bool:
        """Whether a message between nodes ``i`` and ``j`` at ``at`` (a round, or seconds) is
        dropped."""
        if not self.start <= at < self.end:
            return False
        return (_inside(i, self.a, self.b) and _inside(j, self.b, self.a)) or \
            (_inside(i, self.b, self.a) and _inside(j, self.a, self.b))

    def blocks_many(self, i: np.ndarray, j: np.ndarray, at: np.ndarray) -> np.ndarray:
        """:meth:`blocks` for arrays of messages (the clock's engine)."""
        def inside(x, s, other):
            return ~np.isin(x, list(other or ())) if s is None else np.isin(x, list(s))

        a_b = inside(i, self.a, self.b) & inside(j, self.b, self.a)
        b_a = inside(i, self.b, self.a) & inside(j, self.a, self.b)
        return (self.start <= at) & (at < self.end) & (a_b | b_a)

    def text(self) -> str:
        """The cut in the syntax of its unit (what :meth:`parse_rounds` / :meth:`parse_seconds`
        read back)."""
        if self.unit == "rounds":
            return (",".join(map(str, sorted(self.a or ()))) + "|" +
                    ",".join(map(str, sorted(self.b or ()))) + f"@{int(self.start)}-{self.last_round}")

        def side(s: frozenset[int] | None) -> str:
            return "*" if s is None else ".".join(map(str, sorted(s)))

        return f"{side(self.a)}|{side(self.b)}@{self.start!r}-{self.end!r}"

    @classmethod
    def parse_rounds(cls, text: str) -> Cut:
        """``"0,1,2|3,4@5-9"``: nodes {0,1,2} and {3,4} cut off from each other in rounds
        5..9 (a real swarm's ``--partition``)."""
        try:
            sets, rounds = text.split("@")
            a, b = sets.split("|")
            r1, r2 = (int(v) for v in rounds.split("-"))
            pa = frozenset(int(x) for x in a.split(",") if x.strip())
            pb = frozenset(int(x) for x in b.split(",") if x.strip())
        except ValueError:
            raise SfgError(f"cannot read partition {text!r}; write A|B@R1-R2, e.g. "
                           "--partition 0,1,2|3,4@5-9") from None
        if not pa or not pb or pa & pb or r1 > r2 or r1 < 0:
            raise SfgError(f"partition {text!r} needs two disjoint non-empty node sets and "
                           "rounds R1 <= R2, e.g. 0,1|2,3@5-9")
        return cls(pa, pb, r1, r2 + 1, "rounds")

    @classmethod
    def parse_seconds(cls, text: str) -> Cut:
        """``"0-3|4-7@1200-3600"``: nodes 0..3 and 4..7 cut off from each other for messages
        sent in [1200, 3600) seconds of virtual time (the clock's ``partition=`` fault)."""
        try:
            sets, times = text.split("@")
            sa, sb = sets.split("|")
            t1, t2 = (float(v) for v in times.split("-"))
        except ValueError:
            raise SfgError(f"cannot read partition {text!r}; write A|B@T1-T2 (node sets, "
                           "seconds), e.g. partition=0-3|4-7@1200-3600") from None
        a, b = _node_set(sa, text), _node_set(sb, text)
        if a is None and b is None:
            raise SfgError(f"partition {text!r}: at most one side may be '*'")
        if (a is not None and not a) or (b is not None and not b) or (a and b and a & b):
            raise SfgError(f"partition {text!r} needs two disjoint non-empty node sets")
        if not (math.isfinite(t1) and math.isfinite(t2)) or t1 < 0 or t2 <= t1:
            raise SfgError(f"partition {text!r}: the window T1-T2 needs 0 <= T1 < T2 seconds")
        return cls(a, b, t1, t2, "seconds")

    @classmethod
    def parse(cls, text: str) -> Cut:
        """``"0,1|2,3@5r-9r"`` (rounds 5..9) or ``"0-3|4-7@1200s-3600s"`` (seconds [1200,
        3600)): the command line's ``--cut``, its unit written on both ends."""
        sets, at, span = str(text).partition("@")
        lo, dash, hi = span.strip().partition("-")
        unit = _unit(lo, text, "cut") if at and dash else ""
        if not unit or _unit(hi, text, "cut") != unit:
            raise SfgError(f"cannot read --cut {text!r}; write A|B@R1r-R2r (rounds, both "
                           "included) or A|B@T1s-T2s (seconds), e.g. 0,1|2,3@5r-9r or "
                           "0-3|4-7@1200s-3600s")
        sides = sets.split("|")
        if len(sides) != 2:
            raise SfgError(f"cannot read --cut {text!r}: the node sets are two, A|B, e.g. "
                           "0,1|2,3@5r-9r")
        a, b = (_node_set(side.replace(",", "."), text) for side in sides)
        if unit == "rounds" and (a is None or b is None):
            raise SfgError(f"--cut {text!r}: '*' (the other nodes) is for cuts in seconds; "
                           "name both node sets of a cut in rounds")
        try:
            if unit == "seconds":
                return cls.parse_seconds(f"{_side(a)}|{_side(b)}@{lo.strip()[:-1]}-"
                                         f"{hi.strip()[:-1]}")
            return cls.parse_rounds(f"{_side(a, ',')}|{_side(b, ',')}@{lo.strip()[:-1]}-"
                                    f"{hi.strip()[:-1]}")
        except SfgError:
            raise SfgError(f"--cut {text!r} needs two disjoint non-empty node sets and a span "
                           "start <= end (seconds: start < end), both >= 0, e.g. "
                           "0,1|2,3@5r-9r or 0-3|4-7@1200s-3600s") from None

    def check_nodes(self, n: int, where: str) -> None:
        """One ``error:`` line if the cut names a node outside 0..n-1."""
        big = max(self.nodes, default=-1)
        if big >= n:
            raise SfgError(f"{where} names node {big}, but the run has nodes 0..{n - 1}")


def _unit(text: str, where: str, what: str) -> str:
    """``rounds`` for ``5r``, ``seconds`` for ``1200s``; one error line otherwise."""
    t = text.strip().lower()
    if t.endswith("r") and t[:-1].strip():
        return "rounds"
    if t.endswith("s") and t[:-1].strip():
        return "seconds"
    example = "0,1|2,3@5r-9r or 0-3|4-7@1200s-3600s" if what == "cut" else "3@10r or 3@1500s"
    raise SfgError(f"--{what} {where!r}: write the unit on every number, r (rounds) or s "
                   f"(seconds), e.g. {example}")


def _side(s: frozenset[int] | None, sep: str = ".") -> str:
    return "*" if s is None else sep.join(map(str, sorted(s)))


def _inside(i: int, s: frozenset[int] | None, other: frozenset[int] | None) -> bool:
    return (i not in (other or ())) if s is None else i in s


def _node_set(text: str, where: str) -> frozenset[int] | None:
    text = text.strip()
    if text == "*":
        return None
    out: set[int] = set()
    for item in text.split("."):
        lo, dash, hi = item.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise SfgError(f"cannot read node set {text!r} in {where!r}; write ids and ranges "
                           "joined by '.', e.g. 0-3 or 0.2.5-7, or * for the rest") from None
        if a < 0 or b < a:
            raise SfgError(f"node range {item!r} in {where!r} must be LO-HI with 0 <= LO <= HI")
        out.update(range(a, b + 1))
    return frozenset(out)


@dataclass(frozen=True)
class Crash:
    """Node ``node`` crashes at ``at`` of ``unit`` (``"rounds"``: at the start of that round,
    a real swarm's ``--kill``; ``"seconds"``: at that virtual time, the clock's ``crash=``)."""

    node: int
    at: float
    unit: str = "seconds"

    def __post_init__(self) -> None:
        _check_unit(self.unit)

    @property
    def pair(self) -> tuple[int, float]:
        """(node, at): a round as an int, seconds as a float."""
        return self.node, (int(self.at) if self.unit == "rounds" else float(self.at))

    @classmethod
    def parse(cls, text: str) -> Crash:
        """``"3@10r"`` (node 3 at the start of round 10) or ``"3@1500s"`` (at 1500 s of
        virtual time): the command line's ``--crash``, its unit written."""
        node, at, when = str(text).partition("@")
        if not at:
            raise SfgError(f"cannot read --crash {text!r}; write NODE@ROUNDr or NODE@SECONDSs, "
                           "e.g. 3@10r or 3@1500s")
        unit = _unit(when, text, "crash")
        inner = f"{node.strip()}@{when.strip()[:-1]}"
        try:
            return cls.parse_seconds(inner) if unit == "seconds" else cls.parse_round(inner)
        except SfgError:
            raise SfgError(f"cannot read --crash {text!r}; write NODE@ROUNDr or NODE@SECONDSs "
                           "with a node id >= 0 and a round (an integer) or time >= 0, e.g. "
                           "3@10r or 3@1500s") from None

    @classmethod
    def parse_round(cls, text: str) -> Crash:
        """``"3@10"``: node 3 killed at round 10 (a real swarm's ``--kill``)."""
        try:
            node, r = text.split("@")
            i, at = int(node), int(r)
        except ValueError:
            raise SfgError(f"cannot read --kill {text!r}; write NODE@ROUND, e.g. --kill 3@10") \
                from None
        if i < 0 or at < 0:
            raise SfgError(f"--kill {text!r}: node and round must be >= 0")
        return cls(i, at, "rounds")

    @classmethod
    def parse_seconds(cls, text: str) -> Crash:
        """``"3@1500"``: node 3 crashes at 1500 s of virtual time (the clock's ``crash=``)."""
        try:
            node, at = text.split("@")
            i, t = int(node), float(at)
        except ValueError:
            raise SfgError(f"cannot read crash {text!r}; write NODE@SECONDS, e.g. "
                           "crash=3@1500 or crash=3@1500;5@2400") from None
        if i < 0 or not math.isfinite(t) or t < 0:
            raise SfgError(f"crash {text!r} needs a node id >= 0 and a time >= 0 seconds")
        return cls(i, t, "seconds")
