"""A node's evidence about claims: the ``+guard`` bounds and ``+certified``'s signed record.

* :class:`GuardEvidence` (``+guard``, :mod:`sfg.round.defences`): per neighbour, the payload
  SHA-256 last aggregated and when it was first seen; an unchanged model was not trained since,
  which bounds the age its sender may claim (:meth:`GuardEvidence.bounds`).
* :class:`CertifiedEvidence` (``+certified``, lockstep; :mod:`sfg.net.certify`): the
  evidence a node signs into its own headers (:meth:`~CertifiedEvidence.cert`: its prior, its
  heard-set and the stamps it merged in the previous round), the checks on a neighbour's header
  on arrival (:meth:`~CertifiedEvidence.admit`), the claims that evidence refutes, left out
  when the node aggregates (:meth:`~CertifiedEvidence.screen`), and what of it a checkpoint
  holds (:meth:`~CertifiedEvidence.record`, :meth:`~CertifiedEvidence.restore`). What a node
  keeps of its previous round (:class:`Prev`) is also what a liar of ``claim=certified`` plays
  with (:mod:`sfg.net.claims`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sfg.errors import SfgError
from sfg.net.wire import CERT_MAX_BYTES, Message, Rejected


@dataclass
class Prev:
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


class GuardEvidence:
    """``+guard``'s evidence per neighbour: (content digest, when first seen). Kept in memory
    only (a restarted node starts without evidence: weaker, never wrong)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[bytes, float]] = {}

    def arrived(self, sender: int, digest: bytes, now: float) -> None:
        """Async: a message arrived; its content's first arrival is kept."""
        seen = self.seen.get(sender)
        if seen is None or seen[0] != digest:
            self.seen[sender] = (digest, now)

    def bounds(self, r: int, senders: list[int], msgs: list[Message], *, lockstep: bool,
               now: float, period: float) -> list[int]:
        """The evidence bound per neighbour candidate: the rounds since that neighbour's model
        content (the payload's SHA-256, checked on arrival) last changed as this node observed
        it. Lockstep: this node's rounds since it first aggregated that content, as the round
        counts it in ``sfg run``. Async: ⌊(now − first arrival of that content)/P⌋, which an
        honest waited age τ + ⌊d⌋ never undercuts."""
        out = []
        for j, m in zip(senders, msgs, strict=True):
            seen = self.seen.get(j)
            if lockstep:
                if seen is None or seen[0] != m.header.sha256:
                    self.seen[j] = (m.header.sha256, float(r))
                    out.append(0)
                else:
                    out.append(int(r - seen[1]))
            else:  # first arrivals are kept by arrived()
                first = seen[1] if seen is not None and seen[0] == m.header.sha256 else now
                out.append(max(0, math.floor((now - first) / period)))
        return out


class CertifiedEvidence:
    """Node ``i``'s ``+certified`` evidence (see the module docstring); ``neighbours(j)``:
    node j's neighbours (the graph is common knowledge)."""

    def __init__(self, i: int, keys: Any, neighbours: Callable[[int], Any]):
        self.i, self.keys = int(i), keys
        self._graph = neighbours
        self.prev: Prev | None = None                           # the previous round
        self.told: dict[int, tuple[int, float, int]] = {}       # claims sent this round
        self._prior_stamp: tuple[int, bytes] | None = None
        self.certs: dict[tuple[int, int], Any] = {}            # (sender, round) -> Cert
        self.accepted: dict[tuple[int, int], bytes] = {}       # -> SHA-256 of its header
        self._nbr_cache: dict[int, frozenset[int]] = {}

    def neighbours_of(self, j: int) -> frozenset[int]:
        got = self._nbr_cache.get(j)
        if got is None:
            got = self._nbr_cache[j] = frozenset(int(k) for k in self._graph(j))
        return got

    def cert(self, r: int, claim: tuple[int, float, int], degree: int) -> bytes:
        """The evidence of round ``r``'s claim (:func:`sfg.net.certify.make_cert`): its stamp,
        the prior (this node's state at the start of the previous round), the previous round's
        heard-set and the stamps received then."""
        from sfg.net.certify import make_cert, make_stamp

        keys, prev = self.keys, self.prev
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
                           f"{degree}) exceeds the {CERT_MAX_BYTES}-byte limit receivers "
                           "accept; +certified runs on graphs of degree up to about 500")
        return cert

    def admit(self, msg: Message, raw_header: bytes, current: int) -> bool:
        """Checks on arrival (:func:`sfg.net.certify.read_cert`, and replays: a header of an
        earlier round than ``current`` this node did not accept in time — a replay, or a copy
        delayed past its round, which a receiver cannot tell apart and which changes nothing
        either way — or a second, different header for a (sender, round) it accepted);
        :class:`Rejected` on failure. False: the very header it accepted already (a retry, a
        push that arrives after a pull, a duplicate of the last two rounds)."""
        from sfg.net.certify import read_cert

        h = msg.header
        key = (h.sender, h.round)
        digest = hashlib.sha256(raw_header).digest()
        have = self.accepted.get(key)
        if have is not None:
            if have == digest:
                return False
            raise Rejected("replayed", f"a second, different header for node {h.sender}'s "
                                       f"round {h.round}")
        if h.round < current:
            raise Rejected("replayed", f"node {h.sender}'s header of round {h.round}, a round "
                                       f"past here (now {current}) not accepted in time "
                                       "(a replay, or a copy delayed past its round)")
        cert = read_cert(h, self.keys, self.neighbours_of)
        self.certs[key] = cert
        self.accepted[key] = digest
        return True

    def screen(self, r: int, expected: list[int], msgs: list[Message],
               prev: Prev) -> tuple[list[int], list[Message], int]:
        """The round's candidates without the claims their evidence refutes
        (:func:`sfg.net.certify.refuted`, with this node's previous round), and how many
        were refuted; ``prev`` (this round, for the next) takes the stamps received and the
        ones accepted."""
        from sfg.net.certify import refuted

        certs = {j: self.certs.pop((j, r)) for j in expected}
        for key in [k for k in self.certs if k[1] < r]:
            del self.certs[key]
        for key in [k for k in self.accepted if k[1] < r - 1]:
            del self.accepted[key]
        last = self.prev
        bad = refuted(r == 0, certs, known={} if last is None else last.known,
                      me_heard=None if last is None or not last.aggregated else last.heard,
                      neighbours=self.neighbours_of)
        prev.stamps = {j: c.stamp.raw for j, c in certs.items()}
        prev.known = {j: c.stamp for j, c in certs.items() if not bad[j]}
        keep = [k for k, j in enumerate(expected) if not bad[j]]
        return [expected[k] for k in keep], [msgs[k] for k in keep], int(sum(bad.values()))

    def record(self, rounds_done: int) -> dict:
        """The previous round (:class:`Prev`) and the headers accepted from rounds before
        ``rounds_done``, for the checkpoint (+certified and claim=certified resume with their
        evidence)."""
        rec: dict[str, Any] = {"accepted": [[j, r, d.hex()] for (j, r), d in
                                            self.accepted.items() if r < rounds_done]}
        p = self.prev
        if p is not None:
            rec["prev"] = {
                "aggregated": p.aggregated, "own": list(p.own),
                "heard": None if p.heard is None else sorted(p.heard),
                "got": [[j, *v] for j, v in p.got.items()],
                "told": [[j, *v] for j, v in p.told.items()],
                "stamps": [[j, b.hex()] for j, b in p.stamps.items()],
                "known": [[j, st.raw.hex()] for j, st in p.known.items()]}
        return rec

    def restore(self, rec: dict, where: Any) -> None:
        """The inverse of :meth:`record` (the stamps verified again); ``where``: the
        checkpoint, for the error."""
        from sfg.net.certify import read_stamp

        self.accepted = {(int(j), int(r)): bytes.fromhex(d) for j, r, d in rec["accepted"]}
        p = rec.get("prev")
        if p is None:
            return

        def claim(v: list) -> tuple[int, float, int]:
            return int(v[0]), float(v[1]), int(v[2])

        try:
            known = {int(j): read_stamp(bytes.fromhex(b), self.keys) for j, b in p["known"]}
        except Rejected as e:
            raise SfgError(f"node {self.i}: the evidence in checkpoint {where} does not verify "
                           f"({e}); delete the checkpoint to start afresh") from None
        self.prev = Prev(
            aggregated=bool(p["aggregated"]), own=claim(p["own"]),
            heard=None if p["heard"] is None else frozenset(int(j) for j in p["heard"]),
            got={int(v[0]): claim(v[1:]) for v in p["got"]},
            told={int(v[0]): claim(v[1:]) for v in p["told"]},
            stamps={int(j): bytes.fromhex(b) for j, b in p["stamps"]}, known=known)
