"""The wire format between nodes and its validation (docs/concepts/nodes.md#wire-format-and-trust).

A message is two parts:

* a **header**, a msgpack map with the fields of :class:`Header` (format version, sender id,
  sender round, age τ, effective lag ℓ, max-inherited count n, local count, payload length
  and the payload's SHA-256; under ``peers`` ``online`` also ``members``, the sender's
  freshest membership entries, :func:`pack_members`, checked by :func:`check_members`);
* a **payload**: the model's parameters as safetensors bytes, one float32 tensor per named
  parameter of the model (``ParamSpec.names``, so a payload is also a valid ``.safetensors``
  file).

Nothing between peers is ever unpickled. :func:`check_message` accepts a message only if every
check passes; otherwise it raises :class:`Rejected` with a short reason (one of
:data:`REASONS`), which the receiver counts in :class:`Rejections`, logs, and otherwise ignores:
a rejected message changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
from collections import Counter
from dataclasses import dataclass, replace

import msgpack
import numpy as np

# 2: the header's ``members`` (peers chosen per exchange, docs/concepts/peers.md#real-nodes)
VERSION = 2
DEFAULT_MAX_BYTES = 64 << 20   # 64 MiB: above any model sfg ships (ResNet-18-GN is ~45 MB)
HEADER_MAX_BYTES = 4096
CERT_MAX_BYTES = 64 << 10   # +certified: the evidence a header carries (sfg.net.certify)
MEMBER_BYTES = 12           # a membership entry: u32 peer id, f64 seconds since heard (LE)
MEMBERS_MAX_BYTES = MEMBER_BYTES * 10_000   # at most gossip ≤ view ≤ 10,000 entries
#: the largest header: the plain fields, +certified's evidence and the membership entries
HEADER_LIMIT = HEADER_MAX_BYTES + CERT_MAX_BYTES + MEMBERS_MAX_BYTES

log = logging.getLogger("sfg.net")

REASONS = ("garbage", "truncated", "version", "header", "non-neighbour", "identity",
           "oversize", "digest", "names", "shape", "dtype", "non-finite", "staleness",
           "ahead", "signature", "replayed", "provenance", "uncertified", "expired",
           "membership")


class Rejected(Exception):
    """A message failed a check; ``reason`` is one of :data:`REASONS`, ``detail`` says more."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Header:
    """What travels with a model (docs/concepts/nodes.md#wire-format-and-trust). ``lag`` is real-valued; the rest are ints."""

    sender: int
    round: int
    age: int
    lag: float
    count: int
    local_count: int
    length: int
    sha256: bytes
    version: int = VERSION
    # peers online (docs/concepts/peers.md#real-nodes): the sender's freshest membership
    # entries, :func:`pack_members`; empty in other headers, which then pack without it. In
    # the signed part (:meth:`signed_part`) with every other field
    members: bytes = b""
    # +certified (sfg.net.certify): the evidence (msgpack bytes) and the sender's Ed25519
    # signature over every other field (:meth:`signed_part`); empty in plain headers, which
    # then pack without them
    cert: bytes = b""
    sig: bytes = b""

    def pack(self) -> bytes:
        # the fields in their declared order (what dataclasses.asdict gives, without its
        # recursive copying: one header per message sent)
        d = {f: getattr(self, f) for f in _FIELDS}
        if not self.cert:
            del d["cert"], d["sig"]
        if not self.members:
            del d["members"]
        return msgpack.packb(d, use_bin_type=True)

    def signed_part(self) -> bytes:
        """The bytes the sender signs: every field but the signature, in a fixed order."""
        return msgpack.packb([getattr(self, f) for f in _FIELDS if f != "sig"],
                             use_bin_type=True)

    def scalars(self) -> dict[str, float]:
        return {"age": self.age, "lag": self.lag, "count": self.count,
                "local_count": self.local_count}


_FIELDS = tuple(Header.__dataclass_fields__)
_FIELD_SET = frozenset(_FIELDS) - {"cert", "sig", "members"}
_CERT_FIELDS = frozenset(("cert", "sig"))
_INT_FIELDS = ("sender", "round", "age", "count", "local_count", "length", "version")


def unpack_header(raw: bytes) -> Header:
    """Parse and type-check a header; :class:`Rejected` ("garbage", "header", "version")."""
    if len(raw) > HEADER_LIMIT:
        raise Rejected("header", f"header of {len(raw)} bytes exceeds {HEADER_LIMIT}")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=MEMBERS_MAX_BYTES,
                            max_str_len=64, max_array_len=16, max_map_len=16)
    except Exception as e:  # noqa: BLE001 - any decoding failure is garbage
        raise Rejected("garbage", f"header is not msgpack ({type(e).__name__})") from None
    if not isinstance(d, dict):
        raise Rejected("garbage", "header is not a msgpack map")
    if d.get("version") != VERSION:
        raise Rejected("version", f"format version {d.get('version')!r}, expected {VERSION}")
    extra = d.keys() - _FIELD_SET
    members = extra & {"members"}
    extra -= members
    if not _FIELD_SET <= d.keys() or (extra and extra != _CERT_FIELDS):
        raise Rejected("header", f"fields {sorted(set(d) ^ _FIELD_SET)} missing or unexpected")
    plain = len(raw)
    if members:
        m = d["members"]
        if not isinstance(m, bytes) or not m or len(m) % MEMBER_BYTES:
            raise Rejected("membership", f"members must be non-empty bytes of {MEMBER_BYTES}-"
                                         "byte entries")
        plain -= len(m)
    if extra:
        if not (isinstance(d["cert"], bytes) and d["cert"] and isinstance(d["sig"], bytes)
                and len(d["sig"]) == 64):
            raise Rejected("header", "cert must be non-empty bytes and sig 64 bytes")
        if len(d["cert"]) > CERT_MAX_BYTES:
            raise Rejected("header", f"cert of {len(d['cert'])} bytes exceeds {CERT_MAX_BYTES}")
    elif plain > HEADER_MAX_BYTES:
        raise Rejected("header", f"header of {len(raw)} bytes exceeds {HEADER_MAX_BYTES}")
    for k in _INT_FIELDS:
        v = d[k]
        if type(v) is not int and (not isinstance(v, int) or isinstance(v, bool)) or v < 0:
            raise Rejected("header", f"{k} must be a non-negative integer")
    if not isinstance(d["lag"], (int, float)) or not math.isfinite(d["lag"]) or d["lag"] < 0:
        raise Rejected("staleness", f"lag {d['lag']!r} must be a finite number >= 0")
    if d["age"] > d["lag"] + 1e-9:
        raise Rejected("staleness", f"age {d['age']} exceeds lag {d['lag']} (a message's age never exceeds its lag)")
    if d["count"] < 1 or d["local_count"] < 1:
        raise Rejected("staleness", "update counts start at 1")
    if not isinstance(d["sha256"], bytes) or len(d["sha256"]) != 32:
        raise Rejected("header", "sha256 must be 32 bytes")
    d["lag"] = float(d["lag"])
    return Header(**d)


@dataclass(frozen=True)
class Layout:
    """The tensors a receiver expects: names, shapes (float32), in flat order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_spec(cls, spec) -> Layout:
        return cls(tuple(spec.names), tuple(tuple(s) for s in spec.shapes))

    @property
    def D(self) -> int:
        return int(sum(math.prod(s) for s in self.shapes))

    @property
    def payload_bytes(self) -> int:
        """Exact size of a payload of this layout (safetensors header included)."""
        return len(encode_params(np.zeros(self.D, np.float32), self))


class Chunked(tuple):
    """A payload held as the chunks the transport sends (bytes objects, in order): a node
    sends one message to all its neighbours and serves it to ``Fetch`` without copying it
    again. ``nbytes`` is the payload's length, :meth:`join` the flat payload."""

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self)

    def join(self) -> bytes:
        return b"".join(self)


def encode_params(flat: np.ndarray, layout: Layout, metadata: dict[str, str] | None = None,
                  chunk: int | None = None) -> bytes | Chunked:
    """``flat: [D] float32`` -> safetensors bytes, one tensor per named parameter.

    Written directly (the format is an 8-byte little-endian header length, a JSON index padded
    to 8 bytes, then the tensors' bytes): the parameters are one contiguous block in layout
    order, so the payload is the index followed by ``flat``'s bytes, copied once. Readable by
    any safetensors library. With ``chunk``, the same bytes as a :class:`Chunked` of pieces of
    at most ``chunk`` bytes, each byte still copied once.
    """
    flat = np.ascontiguousarray(flat, dtype="<f4").reshape(-1)
    if flat.shape[0] != layout.D:
        raise ValueError(f"flat parameters have {flat.shape[0]} values, layout needs {layout.D}")
    index: dict = {"__metadata__": dict(metadata)} if metadata else {}
    off = 0
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        size = 4 * math.prod(shape)
        index[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    head = json.dumps(index, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    prefix = struct.pack("<Q", len(head)) + head
    data = memoryview(flat).cast("B")
    if chunk is None:
        return b"".join([prefix, data])
    if chunk <= len(prefix):
        raise ValueError(f"chunk of {chunk} bytes cannot hold the {len(prefix)}-byte index")
    first = chunk - len(prefix)
    parts = [b"".join([prefix, data[:first]])]
    parts += [bytes(data[a:a + chunk]) for a in range(first, len(data), chunk)]
    return Chunked(parts)


def encode(flat: np.ndarray, layout: Layout, *, sender: int, round: int, age: int, lag: float,
           count: int, local_count: int, chunk: int | None = None) -> tuple[bytes, bytes | Chunked]:
    """A message: ``(header bytes, payload)``; the payload as bytes, or with ``chunk`` as a
    :class:`Chunked` ready for the transport (same bytes, same digest)."""
    payload = encode_params(flat, layout, chunk=chunk)
    header = make_header(payload_digest(payload), sender=sender, round=round, age=age, lag=lag,
                         count=count, local_count=local_count)
    return header, payload


def payload_digest(payload: bytes | Chunked) -> tuple[bytes, int]:
    """(SHA-256, length) of a payload, as its header announces them."""
    if isinstance(payload, Chunked):
        h = hashlib.sha256()
        for c in payload:
            h.update(c)
        return h.digest(), payload.nbytes
    return hashlib.sha256(payload).digest(), len(payload)


def make_header(digest: tuple[bytes, int], *, sender: int, round: int, age: int, lag: float,
                count: int, local_count: int, cert: bytes = b"", sign=None,
                members: bytes = b"") -> bytes:
    """A packed header for a payload of ``digest`` = (SHA-256, length) (:func:`payload_digest`);
    with ``cert`` (``+certified``'s evidence) signed by ``sign(bytes) -> 64 bytes`` over
    :meth:`Header.signed_part`; ``members``: the sender's membership entries
    (:func:`pack_members`)."""
    header = Header(sender=int(sender), round=int(round), age=int(age), lag=float(lag),
                    count=int(count), local_count=int(local_count), length=int(digest[1]),
                    sha256=digest[0], members=members, cert=cert)
    if cert:
        header = replace(header, sig=sign(header.signed_part()))
    return header.pack()


def _safetensors_index(payload: bytes) -> dict:
    """The JSON index of a safetensors payload, read without touching tensor bytes."""
    if len(payload) < 8:
        raise Rejected("truncated", f"payload of {len(payload)} bytes has no safetensors header")
    (n,) = struct.unpack("<Q", payload[:8])
    if n > min(len(payload) - 8, 1 << 20):
        raise Rejected("truncated" if n <= 1 << 20 else "garbage",
                       "safetensors header longer than the payload")
    try:
        index = json.loads(payload[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Rejected("garbage", "safetensors header is not JSON") from None
    if not isinstance(index, dict):
        raise Rejected("garbage", "safetensors header is not a JSON object")
    index.pop("__metadata__", None)
    return index


def decode_params(payload: bytes, layout: Layout) -> np.ndarray:
    """Validate a payload against ``layout`` and return ``[D] float32`` (a fresh array).

    Checks, in order: safetensors structure, tensor names, dtypes, shapes, the byte ranges
    (each tensor's exactly, inside the data, no overlaps or gaps), finiteness. The tensors are
    read straight from the checked byte ranges (one copy, into the flat vector).
    """
    index = _safetensors_index(payload)
    if set(index) != set(layout.names):
        extra = sorted(set(index) - set(layout.names))[:3]
        missing = sorted(set(layout.names) - set(index))[:3]
        raise Rejected("names", f"unexpected {extra}, missing {missing}")
    (n,) = struct.unpack("<Q", payload[:8])
    data_len = len(payload) - 8 - n
    spans = []
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        entry = index[name]
        if not isinstance(entry, dict) or entry.get("dtype") != "F32":
            raise Rejected("dtype", f"{name}: dtype {entry.get('dtype') if isinstance(entry, dict) else '?'}, expected F32")
        if tuple(entry.get("shape", ())) != shape:
            raise Rejected("shape", f"{name}: shape {entry.get('shape')}, expected {list(shape)}")
        off = entry.get("data_offsets")
        if (not isinstance(off, list) or len(off) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in off)):
            raise Rejected("garbage", f"{name}: bad data_offsets")
        if off[1] - off[0] != 4 * math.prod(shape) or off[0] < 0:
            raise Rejected("garbage", f"{name}: byte range does not match its shape")
        if off[1] > data_len:
            raise Rejected("truncated", f"{name}: byte range ends past the payload")
        spans.append((off[0], off[1], name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise Rejected("garbage", f"{name}: tensors overlap or leave gaps")
        pos = end
    if pos != data_len:
        raise Rejected("garbage", f"{data_len - pos} stray bytes after the tensors")
    base = 8 + n
    flat = np.empty(layout.D, np.float32)
    at = 0
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        begin, end = index[name]["data_offsets"]
        size = math.prod(shape)
        flat[at:at + size] = np.frombuffer(payload, dtype="<f4", count=size, offset=base + begin)
        at += size
    if not np.isfinite(flat).all():
        raise Rejected("non-finite", f"{int((~np.isfinite(flat)).sum())} non-finite values")
    return flat


@dataclass(frozen=True)
class Message:
    """An accepted message: its header and parameters ``[D] float32``."""

    header: Header
    params: np.ndarray


def check_header(header: Header, *, neighbours, max_bytes: int = DEFAULT_MAX_BYTES,
                 identity: int | None = None) -> None:
    """The checks that need no payload: sender is a neighbour (and, with TLS, the certificate
    identity), announced size under the limit."""
    if identity is not None and identity != header.sender:
        raise Rejected("identity", f"certificate says node {identity}, header says {header.sender}")
    if header.sender not in neighbours:
        raise Rejected("non-neighbour", f"node {header.sender} is not a graph neighbour")
    if header.length > max_bytes:
        raise Rejected("oversize", f"{header.length} bytes > limit {max_bytes}")


def check_message(raw_header: bytes, payload: bytes, layout: Layout, *, neighbours,
                  max_bytes: int = DEFAULT_MAX_BYTES, identity: int | None = None,
                  parsed: Header | None = None) -> Message:
    """Every check of docs/concepts/nodes.md#wire-format-and-trust on a received message; :class:`Rejected` on the first failure.
    ``parsed``: ``unpack_header(raw_header)`` when the caller already has it (not parsed
    twice); every check on it is made here all the same."""
    header = unpack_header(raw_header) if parsed is None else parsed
    check_header(header, neighbours=neighbours, max_bytes=max_bytes, identity=identity)
    if len(payload) > max_bytes:
        raise Rejected("oversize", f"{len(payload)} bytes > limit {max_bytes}")
    if len(payload) < header.length:
        raise Rejected("truncated", f"{len(payload)} of {header.length} payload bytes")
    if len(payload) > header.length:
        raise Rejected("garbage", f"{len(payload) - header.length} bytes past the announced length")
    if hashlib.sha256(payload).digest() != header.sha256:
        raise Rejected("digest", "SHA-256 of the payload does not match the header")
    return Message(header, decode_params(payload, layout))


# ------------------------------------------------------------------ membership entries
#: a membership entry on the wire: peer id (u32) and seconds since heard (f64), little-endian
_MEMBER = np.dtype([("id", "<u4"), ("s", "<f8")])


def pack_members(ids, seconds) -> bytes:
    """Membership entries (docs/concepts/peers.md#real-nodes) as a header's ``members``: 12
    bytes each, (peer id u32, seconds since heard f64), little-endian, in the given order."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    out = np.empty(ids.shape[0], _MEMBER)
    out["id"] = ids
    out["s"] = np.asarray(seconds, np.float64).reshape(-1)
    return out.tobytes()


def unpack_members(raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [m], seconds float64 [m]) of a header's ``members`` (unchecked:
    :func:`check_members`)."""
    if len(raw) % MEMBER_BYTES:
        raise Rejected("membership", f"members of {len(raw)} bytes are not whole "
                                     f"{MEMBER_BYTES}-byte entries")
    got = np.frombuffer(raw, _MEMBER)
    return got["id"].astype(np.int64), got["s"].astype(np.float64)


def check_members(header: Header, *, gossip: int, n: int,
                  longest: float) -> tuple[np.ndarray, np.ndarray]:
    """The membership entries a header carries, checked (docs/concepts/peers.md#real-nodes):
    at most ``gossip`` (M; 0 when the run carries none), ids of devices of the run
    (0..n−1), distinct, never the sender itself (its own table never holds it), seconds
    finite and in [0, ``longest``] (the run's length). An entry naming the receiver is
    allowed (an honest sender may have heard of it) and ignored when merged. Returns
    (ids, seconds); :class:`Rejected` ("membership") on anything else."""
    if not header.members:
        return np.empty(0, np.int64), np.empty(0)
    ids, secs = unpack_members(header.members)
    if ids.shape[0] > gossip:
        raise Rejected("membership", f"{ids.shape[0]} entries, at most {gossip} carried in "
                                     "this run")
    if ids.max() >= n:
        raise Rejected("membership", f"entry for node {int(ids.max())}: the run has "
                                     f"nodes 0..{n - 1}")
    if np.unique(ids).shape[0] != ids.shape[0]:
        raise Rejected("membership", "an entry repeated")
    if (ids == header.sender).any():
        raise Rejected("membership", f"an entry for the sender {header.sender} itself")
    if not (np.isfinite(secs).all() and (secs >= 0).all() and (secs <= longest).all()):
        raise Rejected("membership", f"seconds since heard must be finite and in "
                                     f"[0, {longest:g}]")
    return ids, secs


# ------------------------------------------------------------------ pull replies
#: the most bytes a pull reply's ``held`` preamble may take (a msgpack map with one float)
HELD_MAX_BYTES = 64
#: the longest ``held`` a reply may claim (seconds): a day; anything longer is no reply of this run
HELD_MAX_SECONDS = 86400.0


def pack_held(held: float) -> bytes:
    """The preamble of a pull reply (docs/concepts/nodes.md#returns-in-the-node): ``{"held": s}``,
    the seconds since the replying node sent the message that follows, on its own clock."""
    return msgpack.packb({"held": float(held)}, use_bin_type=True)


def unpack_held(raw: bytes) -> float:
    """A pull reply's ``held`` (seconds, finite, in [0, :data:`HELD_MAX_SECONDS`]);
    :class:`Rejected` (``header``/``garbage``) on anything else. A negative or non-finite
    ``held`` would make a reply look fresher than any message; it is refused."""
    if len(raw) > HELD_MAX_BYTES:
        raise Rejected("oversize", f"a pull reply's preamble of {len(raw)} bytes > "
                                   f"{HELD_MAX_BYTES}")
    try:
        d = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 - any parse failure is garbage
        raise Rejected("garbage", f"a pull reply's preamble does not parse: {e}") from None
    if not isinstance(d, dict) or set(d) != {"held"}:
        raise Rejected("header", "a pull reply's preamble must be {'held': seconds}")
    h = d["held"]
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(float(h)) \
            or not 0.0 <= float(h) <= HELD_MAX_SECONDS:
        raise Rejected("header", f"a pull reply's held {h!r} is not a number of seconds in "
                                 f"[0, {HELD_MAX_SECONDS:g}]")
    return float(h)


class Rejections:
    """Counts of rejected messages by reason, with logging: a warning for a node's first
    rejection of each reason and then at every power of ten of that reason's count (10th,
    100th, ...), with the count so far; the others at debug level (a run under message
    faults rejects thousands, and the counts are in the node's results anyway)."""

    def __init__(self, node: int):
        self.node = node
        self.counts: Counter[str] = Counter()

    def add(self, err: Rejected, peer: str = "") -> None:
        self.counts[err.reason] += 1
        n = self.counts[err.reason]
        loud = n == 1 or (n % 10 == 0 and math.log10(n).is_integer())
        log.log(logging.WARNING if loud else logging.DEBUG,
                "node %d rejected a message%s: %s%s", self.node,
                f" from {peer}" if peer else "", err,
                "" if n == 1 else f" ({n} rejected for {err.reason} so far)")

    @property
    def total(self) -> int:
        return int(sum(self.counts.values()))

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.counts.items())}
