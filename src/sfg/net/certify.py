"""Certified claims between networked nodes: ``+certified`` in ``sfg swarm`` / ``sfg node``
(lockstep) — the protocol :mod:`sfg.round.certified` models in rounds, with
its evidence signed and carried on the wire.

**Keys.** Every node has an Ed25519 header-signing key (``node-<id>.sign`` from ``sfg
tls-ca``); its public half is an extension of the node's X.509 certificate, which the swarm
CA signs, so a signature by that key is bound to the TLS identity ``node-<id>``
(:class:`Keys`: a node loads its own private key and every node's certificate, checking that
each is issued by ``ca.pem`` and names ``node-<id>``).

**What a round-r message carries** (:func:`make_cert`; the header's ``cert`` field, the
whole header signed by the sender, :meth:`sfg.net.wire.Header.signed_part` — which covers the
payload's SHA-256 and the round stamp):

* ``stamp``: the claim (sender, r, τ, ℓ, n), signed on its own, so that others can cite it;
* ``prior``: the sender's stamp of its state at the start of round r − 1 (none in round 0);
* ``heard``: the sender's heard-set of round r − 1 — the neighbours whose round r − 1
  messages it received — or none if it did not aggregate then (it was offline);
* ``prov`` and ``src``: the claim's provenance: the SHA-256 digests of the round r − 1 stamps
  it merged (signed with the header) and those stamps themselves (each signed by its author).

**What a receiver checks.** On arrival (:func:`read_cert`; a failure rejects the message,
which is counted and changes nothing): the header's signature (``signature``); the stamps'
signatures (``signature``); that the stamp repeats the header's claim, the prior is the
sender's of round r − 1, every source is a stamp of round r − 1 by a distinct graph
neighbour of the sender, listed by its digest, and the heard-set names exactly the sources'
authors (``provenance``). The node itself refuses a header of an earlier round it never
accepted, or a second, different header for a (sender, round) it holds (``replayed``).
When it aggregates (:func:`refuted`): the claim must follow from its sources by docs/concepts/staleness.md#the-staleness-state (the
hull of :func:`sfg.round.certified.verdict`) — the prior being the stamp the receiver itself
accepted from the sender in round r − 1 if it has one, else the cited one — and a claim that
can only be a trained one is refuted when the receiver, or a candidate of this round that is
a neighbour of the sender, aggregated in round r − 1 without hearing the sender (its signed
heard-set). A refuted claim is left out of the aggregation, as a lost message: exactly the
refusals of the rounds model (tested model for model against ``sfg run``).

**What is certified, and what is not.** Certified: who said what in which round (signatures
bound to TLS identities, round stamps, payload digests); that a claim follows from the
claims its sender received, as far as the hull of its sources allows; absence, where an
online neighbour of the sender aggregated without hearing it. Not certified: a colluding
witness (a liar's heard-set is taken at its word, and could frame an honest sender); a lossy
link (an honest sender whose message was lost looks absent; lockstep has no lost links, the
deadline turns a missing message into an error); a lie inside the hull's slack; and the
cited prior of a sender the receiver did not hear in round r − 1 (signed by the sender
alone). Cost (``benchmarks/bench_certified.py``): three signatures per round (the stamp,
the prior, the header; a liar with a claim per receiver signs a stamp and a header for
each); per received message one header verification plus its stamps not seen before (a
stamp is verified once per node, :data:`STAMP_CACHE`); two stamps plus ``degree`` × (digest
+ stamp) bytes per header.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from sfg.errors import SfgError
from sfg.net.wire import Header, Rejected

SIG = 64


class Keys:
    """A node's signing key and the swarm's verification keys by node id."""

    def __init__(self, node: int, private, public: dict[int, object],
                 valid: dict[int, tuple[Any, Any]] | None = None):
        self.node, self._private, self._public = int(node), private, public
        # each node's certificate validity period (not-before, not-after; UTC datetimes):
        # a signature by a node whose certificate is not valid now is refused ("expired")
        self.valid = valid or {}
        self.signed = self.verified = 0
        self.sign_s = self.verify_s = 0.0
        # stamps already verified, by their bytes: a round-r stamp reaches a node in the
        # message of its author and cited by every common neighbour, and is checked once
        self.stamps: dict[bytes, Stamp] = {}

    @classmethod
    def load(cls, tls_dir: str | Path, node: int, ids) -> Keys:
        """From node ``node``'s bundle (:func:`sfg.net.tls.bundle_dir`): its private key
        ``node-<id>.sign`` and the public keys in every ``node-<j>.pem`` of ``ids`` (each
        checked: issued by ``ca.pem``, named ``node-<j>``, carrying a signing key; the node's
        own matching its private key and valid now)."""
        from sfg.net.tls import bundle_dir, check_bundle, check_validity

        d = bundle_dir(tls_dir, node)
        check_bundle(d, int(node))
        public, valid, certs = _public_keys(d, ids)
        check_validity(certs[int(node)], f"node {node}'s certificate {d / f'node-{node}.pem'}")
        return cls(node, _private_key(d, node, public), public, valid)

    @staticmethod
    def check_folder(tls_dir: str | Path, ids) -> None:
        """What :meth:`load` checks, for every node of ``ids`` at once (one line on the first
        problem): before a swarm's nodes start, not in each of them."""
        for i in ids:
            Keys.load(tls_dir, int(i), ids)

    def check_valid(self, node: int) -> None:
        """:class:`Rejected` ("expired") unless node ``node``'s certificate is valid now (by
        the wall clock; keys without certificates, :meth:`simulated`, are always valid)."""
        period = self.valid.get(int(node))
        if period is None:
            return
        import datetime as dt

        now = dt.datetime.now(dt.timezone.utc)
        if not period[0] <= now <= period[1]:
            raise Rejected("expired", f"node {node}'s certificate is valid from {period[0]} to "
                                      f"{period[1]}, not now")

    @classmethod
    def simulated(cls, n: int, seed: int) -> list[Keys]:
        """Keys for the ``n`` nodes of a simulated swarm (``sfg swarm --clock virtual``):
        derived from ``seed`` in memory, the same every run (Ed25519 signatures are
        deterministic, so a simulated run replays bit for bit). No certificate binds them:
        there is no TLS in the simulation."""
        from cryptography.hazmat.primitives.asymmetric import ed25519

        private = [ed25519.Ed25519PrivateKey.from_private_bytes(
            hashlib.sha256(f"sfg simulated signing key {int(seed)} {i}".encode()).digest())
            for i in range(int(n))]
        public = {i: k.public_key() for i, k in enumerate(private)}
        return [cls(i, k, public) for i, k in enumerate(private)]

    def sign(self, data: bytes) -> bytes:
        import time

        t = time.perf_counter()
        sig = self._private.sign(data)
        self.sign_s += time.perf_counter() - t
        self.signed += 1
        return sig

    def verify(self, node: int, sig: bytes, data: bytes) -> bool:
        """Whether ``sig`` is ``node``'s signature of ``data`` (False for unknown nodes)."""
        import time

        from cryptography.exceptions import InvalidSignature

        key = self._public.get(int(node))
        if key is None:
            return False
        t = time.perf_counter()
        try:
            key.verify(sig, data)  # type: ignore[attr-defined]
            ok = True
        except InvalidSignature:
            ok = False
        self.verify_s += time.perf_counter() - t
        self.verified += 1
        return ok


def _hint(d: Path) -> str:
    return f"create the swarm's keys with `sfg tls-ca --dir {d} --nodes N`"


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise SfgError(f"{path} not found; +certified signs headers with keys from `sfg "
                       f"tls-ca`: {_hint(path.parent)}")
    return path.read_bytes()


def _public_keys(d: Path, ids) -> tuple[dict[int, object], dict[int, tuple[Any, Any]],
                                        dict[int, Any]]:
    """The verification key of every node of ``ids``, from its certificate (checked); each
    certificate's validity period; the certificates."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from sfg.net.tls import SIGNING_KEY_OID

    try:
        ca = x509.load_pem_x509_certificate(_read(d / "ca.pem"))
    except SfgError:
        raise
    except Exception as e:  # noqa: BLE001 - not a PEM certificate
        raise SfgError(f"{d / 'ca.pem'} is not a PEM certificate ({type(e).__name__}); "
                       f"{_hint(d)}") from None
    oid = x509.ObjectIdentifier(SIGNING_KEY_OID)
    public: dict[int, object] = {}
    valid: dict[int, tuple[Any, Any]] = {}
    certs: dict[int, Any] = {}
    for j in sorted({int(x) for x in ids}):
        path = d / f"node-{j}.pem"
        try:
            cert = x509.load_pem_x509_certificate(_read(path))
            cert.verify_directly_issued_by(ca)
        except SfgError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure: not a certificate of this CA
            raise SfgError(f"{path} is not a certificate issued by {d / 'ca.pem'} "
                           f"({type(e).__name__}); {_hint(d)}") from None
        cn = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
        if cn != [f"node-{j}"]:
            raise SfgError(f"{path} names {cn}, not node-{j}; {_hint(d)}")
        try:
            raw = cert.extensions.get_extension_for_oid(oid).value.value
            public[j] = ed25519.Ed25519PublicKey.from_public_bytes(raw)
        except Exception:  # noqa: BLE001
            raise SfgError(f"{path} carries no header-signing key (made before +certified "
                           f"existed?); {_hint(d)}") from None
        valid[j] = (cert.not_valid_before_utc, cert.not_valid_after_utc)
        certs[j] = cert
    return public, valid, certs


def _private_key(d: Path, node: int, public: dict[int, object]):
    """Node ``node``'s signing key ``node-<id>.sign``, checked against its certificate's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    path = d / f"node-{int(node)}.sign"
    try:
        private = serialization.load_pem_private_key(_read(path), None)
    except SfgError:
        raise
    except Exception as e:  # noqa: BLE001 - not a PEM key
        raise SfgError(f"{path} is not a PEM private key ({type(e).__name__}); "
                       f"{_hint(d)}") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise SfgError(f"{path} is not an Ed25519 key; {_hint(d)}")
    raw_pub = private.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
    mine = public.get(int(node))
    if mine is None or mine.public_bytes(serialization.Encoding.Raw,  # type: ignore[attr-defined]
                                         serialization.PublicFormat.Raw) != raw_pub:
        raise SfgError(f"{path} does not match the key in node-{node}.pem; {_hint(d)}")
    return private


NO_KEYS = ("+certified signs every header with the nodes' keys from `sfg tls-ca`; give "
           "--tls-dir (make one with `sfg tls-ca --dir DIR --nodes N`)")


def check_run(world, mode: str) -> None:
    """+certified and the liar that answers it (``claim=certified``) run in lockstep only:
    refused in ``mode`` async with one line."""
    att = world.attack
    if world.rule.certified or (att is not None and att.claim == "certified"):
        what = "+certified" if world.rule.certified else "attack claim=certified"
        if mode != "lockstep":
            raise SfgError(f"{what} runs in lockstep mode (its evidence is the previous "
                           "round's); drop --protocol async, or the certification")


def keys_for(world, tls_dir: str | Path | None, node: int) -> Keys | None:
    """Node ``node``'s :class:`Keys` when the run is +certified (else None), from the
    ``sfg tls-ca`` folder ``tls_dir``."""
    if not world.rule.certified:
        return None
    if tls_dir is None:
        raise SfgError(NO_KEYS)
    return Keys.load(tls_dir, node, range(world.n))


# ----------------------------------------------------------------------------- stamps
@dataclass(frozen=True)
class Stamp:
    """A signed claim: (sender, round, age τ, lag ℓ, count n); ``raw`` its bytes on the wire."""

    sender: int
    round: int
    age: int
    lag: float
    count: int
    raw: bytes

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.raw).digest()

    @property
    def claim(self) -> tuple[int, float, int]:
        return self.age, self.lag, self.count


def make_stamp(keys: Keys, round: int, age: int, lag: float, count: int) -> bytes:
    """This node's signed stamp of a claim."""
    body = msgpack.packb([keys.node, int(round), int(age), float(lag), int(count)])
    return msgpack.packb([body, keys.sign(body)], use_bin_type=True)


STAMP_CACHE = 1 << 14  # verified stamps a node keeps (a few rounds of its two-hop neighbourhood)


def read_stamp(raw, keys: Keys) -> Stamp:
    """Parse and verify a stamp (:class:`Rejected` "provenance" if malformed, "signature" if
    its author did not sign it); a stamp verified before is not verified again."""
    if isinstance(raw, bytes):
        hit = keys.stamps.get(raw)
        if hit is not None:
            keys.check_valid(hit.sender)  # verified before; its author's certificate may not be now
            return hit
    try:
        if not isinstance(raw, bytes) or len(raw) > 256:
            raise ValueError
        body, sig = msgpack.unpackb(raw, raw=False, max_bin_len=128, max_array_len=8)
        sender, rnd, age, lag, count = msgpack.unpackb(body, raw=False, max_array_len=8)
        ints = (sender, rnd, age, count)
        if (not all(type(v) is int and v >= 0 for v in ints) or type(lag) is not float
                or not math.isfinite(lag) or lag < 0 or count < 1
                or not isinstance(sig, bytes) or len(sig) != SIG):
            raise ValueError
    except Exception:  # noqa: BLE001 - anything malformed
        raise Rejected("provenance", "a stamp is malformed") from None
    keys.check_valid(sender)
    if not keys.verify(sender, sig, body):
        raise Rejected("signature", f"a stamp is not signed by node {sender}")
    stamp = Stamp(sender, rnd, age, lag, count, raw)
    if len(keys.stamps) >= STAMP_CACHE:
        keys.stamps.clear()
    keys.stamps[raw] = stamp
    return stamp


# ----------------------------------------------------------------------------- evidence
@dataclass(frozen=True)
class Cert:
    """A received header's verified evidence."""

    stamp: Stamp
    prior: Stamp | None
    heard: frozenset[int] | None
    sources: tuple[Stamp, ...]


def make_cert(stamp: bytes, prior: bytes | None, heard, sources: list[bytes]) -> bytes:
    """The evidence of a round's message (see the module docstring), as header bytes."""
    return msgpack.packb({"stamp": stamp, "prior": prior,
                          "heard": None if heard is None else sorted(int(j) for j in heard),
                          "prov": [hashlib.sha256(s).digest() for s in sources],
                          "src": list(sources)}, use_bin_type=True)


def read_cert(header: Header, keys: Keys, neighbours) -> Cert:
    """Verify a certified header (the checks on arrival in the module docstring);
    ``neighbours(j)``: node j's graph neighbours (a set). :class:`Rejected` on failure."""
    if not header.cert:
        raise Rejected("uncertified", "the run is +certified and this header carries no evidence")
    keys.check_valid(header.sender)
    if not keys.verify(header.sender, header.sig, header.signed_part()):
        raise Rejected("signature", f"the header is not signed by node {header.sender}")
    try:
        d = msgpack.unpackb(header.cert, raw=False, max_array_len=4096, max_map_len=8,
                            max_bin_len=256)
        if not isinstance(d, dict) or set(d) != {"stamp", "prior", "heard", "prov", "src"}:
            raise ValueError
        prov, src, heard = d["prov"], d["src"], d["heard"]
        if (not isinstance(prov, list) or not isinstance(src, list) or len(prov) != len(src)
                or not (heard is None or (isinstance(heard, list)
                                          and all(type(j) is int for j in heard)))):
            raise ValueError
    except Exception:  # noqa: BLE001
        raise Rejected("provenance", "the evidence is malformed") from None
    j, r = header.sender, header.round
    stamp = read_stamp(d["stamp"], keys)
    if (stamp.sender, stamp.round, stamp.claim) != (j, r, (header.age, header.lag, header.count)):
        raise Rejected("provenance", "the stamp does not repeat the header's claim")
    prior = None
    if r == 0:
        if d["prior"] is not None or heard is not None or src:
            raise Rejected("provenance", "round 0 has no prior round to cite")
    else:
        if d["prior"] is None:
            raise Rejected("provenance", "no prior state cited")
        prior = read_stamp(d["prior"], keys)
        if (prior.sender, prior.round) != (j, r - 1):
            raise Rejected("provenance", f"the prior is node {prior.sender}'s of round "
                                         f"{prior.round}, not node {j}'s of round {r - 1}")
    nb = neighbours(j)
    sources = []
    for digest, raw in zip(prov, src, strict=True):
        if not isinstance(raw, bytes) or hashlib.sha256(raw).digest() != digest:
            raise Rejected("provenance", "a cited stamp does not match its digest")
        s = read_stamp(raw, keys)
        if s.round != r - 1 or s.sender not in nb:
            raise Rejected("provenance", f"a cited stamp is node {s.sender}'s of round "
                                         f"{s.round}, not a neighbour's of round {r - 1}")
        sources.append(s)
    authors = [s.sender for s in sources]
    if len(set(authors)) != len(authors):
        raise Rejected("provenance", "a neighbour is cited twice")
    if heard is None:
        if sources:
            raise Rejected("provenance", "sources cited without a heard-set")
        heard_set = None
    else:
        heard_set = frozenset(heard)
        if heard_set != frozenset(authors) or len(heard) != len(heard_set):
            raise Rejected("provenance", "the heard-set does not name the cited sources")
    return Cert(stamp, prior, heard_set, tuple(sources))


def refuted(first: bool, certs: dict[int, Cert], *, known: dict[int, Stamp],
            me_heard: frozenset[int] | None, neighbours) -> dict[int, bool]:
    """Per candidate sender j of this round (``certs``: its verified evidence): whether its
    claim is refuted — the hull of its sources under the staleness update (docs/concepts/staleness.md#the-staleness-state) and the absence witnesses, with the one
    verdict of the rounds model (:func:`sfg.round.certified.verdict`). ``first``: round 0
    (any claim but the initial model's is refuted); ``known``: the round r − 1 stamps this
    node accepted and did not refuse, by sender (the sender's prior as this node knows it);
    ``me_heard``: this node's heard-set of round r − 1 (None: it did not aggregate then)."""
    import numpy as np

    from sfg.round.certified import verdict

    senders = sorted(certs)
    if not senders:
        return {}
    a = np.array([certs[j].stamp.age for j in senders], np.int64)
    lg = np.array([certs[j].stamp.lag for j in senders], np.float64)
    c = np.array([certs[j].stamp.count for j in senders], np.int64)
    if first:
        bad = ~((a == 0) & (lg == 0.0) & (c == 1))
        return {j: bool(v) for j, v in zip(senders, bad, strict=True)}
    hull = np.zeros((len(senders), 6))
    absent = np.zeros(len(senders), bool)
    for n, j in enumerate(senders):
        cert = certs[j]
        prior = known.get(j, cert.prior)
        src = [prior, *cert.sources] if cert.heard is not None else [prior]
        ages = [s.age for s in src]
        lags = [s.lag for s in src]
        counts = [s.count for s in src]
        hull[n] = (min(ages), max(ages), min(lags), max(lags), min(counts), max(counts))
        nb = neighbours(j)
        absent[n] = (me_heard is not None and j not in me_heard) or any(
            k != j and k in nb and certs[k].heard is not None and j not in certs[k].heard
            for k in senders)
    out = verdict(a, lg, c, *(hull[:, q] for q in range(6)), absent=absent, witness=True)
    return {j: bool(v) for j, v in zip(senders, out, strict=True)}
