"""gRPC transport between nodes (grpcio's asyncio API), no protobuf code generation.

One service ``sfg.Node`` with raw-bytes methods:

* ``Deliver`` (client-streaming): the first request message is the msgpack header, the
  following ones are the safetensors payload in chunks of at most :data:`CHUNK` bytes (large
  models stream; no message ever exceeds gRPC's per-message limit). A node encodes its model
  once, already in chunks (:class:`~sfg.net.wire.Chunked`), so a send to each neighbour
  copies nothing more than gRPC itself does (on the benchmark's single send the saved copy
  is within the noise: gRPC's per-call cost and its own copies dominate). The reply is a msgpack
  map ``{"ok": bool, "reason": str}``. The receiver checks the header (neighbour, identity,
  announced size) before it reads the payload, and stops reading as soon as the payload
  exceeds the announced length.
* ``Fetch`` (server-streaming): ``{"round": t, "node": requester}`` in, the node's own round-``t`` message out (header
  then chunks) if it still holds it, else an empty stream. Lockstep nodes pull a message they
  did not get pushed (e.g. after a restart). The fetcher reads the header first and stops
  (cancels the call, :class:`~sfg.net.wire.Rejected` "oversize") as soon as the reply
  exceeds what the header announces or the node's message limit: a neighbour cannot make it
  buffer more than one chunk past either.
* ``Fetch`` with ``"pull": true`` (docs/concepts/nodes.md#returns-in-the-node): a returning node asks
  for the neighbour's latest *sent* message. The reply streams ``{"held": s}``
  (:func:`~sfg.net.wire.pack_held`: seconds since it was sent, on the replier's clock), then
  the header and chunks exactly as a ``Fetch`` reply, read with the same bounds
  (:meth:`Peer.pull`); an empty stream when the neighbour never sent; status ``UNAVAILABLE``
  when it is offline (as a refused connection): "unreachable".

Clients use deadlines on every call, keep-alive pings and bounded retries with backoff on
``UNAVAILABLE``. gRPC's per-message limit is the node's message limit, or one chunk when that
is larger (:func:`channel_options`). With mutual TLS a receiver takes the sender's identity
from its certificate's common name ``node-<id>``; a ``Fetch`` whose ``node`` is not the
caller's certificate identity is refused (an empty stream) and counted (reason
``identity``): nobody pulls the header meant for another node, or has it counted as
delivered to that node.

A neighbour whose certificate the TLS handshake refuses — outside its validity period
(``expired``) or not verifiable against the swarm CA (``identity``) — is a counted rejection
on the calling side (:func:`handshake_rejection`): ``Peer.fetch`` raises it as
:class:`~sfg.net.wire.Rejected`, ``Peer.deliver`` reports it to its ``refused`` callback and
does not retry. The serving side cannot count the converse (a caller presenting an expired
certificate): gRPC ends that handshake inside its C core, before any handler or interceptor
runs, and tells Python nothing (it only logs the failure).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import msgpack

from sfg.net.wire import (
    HEADER_LIMIT,
    Chunked,
    Rejected,
    pack_held,
    unpack_header,
    unpack_held,
)

CHUNK = 1 << 20
SERVICE = "sfg.Node"
log = logging.getLogger("sfg.net")

KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


# Large HTTP/2 frames and a large stream look-ahead (flow-control window): a model then
# crosses in few frames without waiting for window updates (measured on localhost with the
# paper CNN: about 1.5-2× the throughput of gRPC's defaults).
WINDOW = [("grpc.http2.lookahead_bytes", 1 << 24), ("grpc.http2.max_frame_size", (1 << 24) - 1)]


def message_limit(max_bytes: int) -> int:
    """gRPC's per-message limit for a node whose messages are at most ``max_bytes``: one
    stream message is a header (at most :data:`~sfg.net.wire.HEADER_LIMIT`: the plain
    fields, +certified's evidence, the membership entries) or one chunk of at most ``min(max_bytes, CHUNK)``
    bytes; plus gRPC's own framing slack."""
    return max(min(int(max_bytes), CHUNK), HEADER_LIMIT) + (1 << 16)


def channel_options(max_bytes: int) -> list[tuple[str, int]]:
    limit = message_limit(max_bytes)
    return [*KEEPALIVE, *WINDOW, ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.enable_retries", 0)]


def server_options(max_bytes: int) -> list[tuple[str, int]]:
    return [*channel_options(max_bytes),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.so_reuseport", 0)]


# ----------------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TlsFiles:
    """A node's mutual-TLS material: the swarm CA, its certificate and key (PEM bytes)."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, tls_dir: str | Path, node: int) -> TlsFiles:
        """Node ``node``'s bundle (:func:`sfg.net.tls.bundle_dir`: ``<dir>/node-<id>/`` of an
        ``sfg tls-ca`` folder, or ``<dir>`` itself): ``ca.pem``, ``node-<id>.pem`` and
        ``node-<id>.key``. :class:`~sfg.errors.SfgError` if a file is missing, the folder
        holds another node's or the CA's private key, or the node's own certificate is not
        ``node-<id>``'s or is outside its validity period now."""
        from cryptography import x509

        from sfg.errors import SfgError
        from sfg.net.tls import bundle_dir, check_bundle, check_validity

        d = bundle_dir(tls_dir, node)
        paths = [d / "ca.pem", d / f"node-{node}.pem", d / f"node-{node}.key"]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise SfgError(f"TLS file {missing[0]} not found; create a test CA with "
                           f"`sfg tls-ca --dir {Path(tls_dir)} --nodes N`")
        check_bundle(d, node)
        files = cls(*(p.read_bytes() for p in paths))
        try:
            cert = x509.load_pem_x509_certificate(files.cert)
        except ValueError as e:
            raise SfgError(f"{paths[1]} is not a PEM certificate ({e})") from None
        cn = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
        if cn != [f"node-{node}"]:
            raise SfgError(f"{paths[1]} names {cn}, not node-{node}")
        check_validity(cert, f"node {node}'s certificate {paths[1]}")
        return files


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                       require_client_auth=True)


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                        certificate_chain=tls.cert)


def peer_identity(context: grpc.aio.ServicerContext) -> int | None:
    """The node id in the client certificate's common name (``node-<id>``), or None."""
    auth = context.auth_context() or {}
    for cn in auth.get("x509_common_name", []):
        text = cn.decode(errors="replace") if isinstance(cn, bytes) else str(cn)
        if text.startswith("node-") and text[5:].isdigit():
            return int(text[5:])
    return None


# the TLS library's words for a peer certificate outside its validity period
_NOT_VALID_NOW = ("certificate has expired", "certificate is not yet valid")
_VERIFY_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED:?\s*([^:]*)")


def handshake_rejection(err: grpc.aio.AioRpcError, address: str) -> Rejected | None:
    """The :class:`~sfg.net.wire.Rejected` for a call that failed because the TLS handshake
    refused the neighbour's certificate — ``expired`` when it is outside its validity period
    (expired or not yet valid), ``identity`` when it otherwise fails verification (another
    CA, a host it does not name) — or None for any other failure (a neighbour offline, a
    deadline). gRPC reports the handshake's failure only in the status details (UNAVAILABLE,
    with the TLS library's verification error), so this reads them."""
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    text = err.details() or ""
    m = _VERIFY_FAILED.search(text)
    if m is not None:
        why = m.group(1).strip() or "certificate verification failed"
        reason = "expired" if any(w in why for w in _NOT_VALID_NOW) else "identity"
    elif "is not in peer certificate" in text or "Hostname Verification Check failed" in text:
        # gRPC's own check of the host name (the second: newer gRPC, and a pull's node-<id>)
        why, reason = "the certificate does not name the address", "identity"
    else:
        return None
    return Rejected(reason, f"the TLS handshake with {address} refused its certificate: {why}")


# ----------------------------------------------------------------------------------- server
DeliverFn = Callable[[bytes, AsyncIterator[bytes], int | None, str], Awaitable[tuple[bool, str]]]
FetchFn = Callable[[int, int], tuple[bytes, bytes | Chunked] | None]
RefusedFn = Callable[[Rejected, str], None]
# a pull (docs/concepts/nodes.md#returns-in-the-node): requester -> (header, payload, held),
# None (never sent: an empty answer), OFFLINE (unreachable) or SILENT (no answer at all)
PullFn = Callable[[int], "tuple[bytes, bytes | Chunked, float] | None | str"]
OFFLINE, SILENT = "offline", "silent"


class Unreachable:
    """A pull's answer from a neighbour that is offline or not running (a refused connection)."""

    def __repr__(self) -> str:
        return "UNREACHABLE"


class Empty:
    """A pull's answer from a neighbour that has sent nothing yet."""

    def __repr__(self) -> str:
        return "EMPTY"


UNREACHABLE, EMPTY = Unreachable(), Empty()


def chunks(payload, size: int | None = None):
    """The messages a payload streams as: a :class:`~sfg.net.wire.Chunked` payload's own
    chunks (no copy; a node encodes its model in chunks once and sends it to every
    neighbour), or slices of at most ``size`` bytes of a bytes payload."""
    size = size or CHUNK
    if isinstance(payload, tuple):
        if any(len(c) > size for c in payload):
            raise ValueError(f"a chunk exceeds {size} bytes")
        yield from payload
        return
    view = memoryview(payload)
    for off in range(0, len(payload), size):
        yield bytes(view[off:off + size])


class Server:
    """A node's gRPC server on ``host:port``; ``deliver`` and ``fetch`` are the node's handlers."""

    def __init__(self, deliver: DeliverFn, fetch: FetchFn, *, max_bytes: int,
                 tls: TlsFiles | None = None, refused: RefusedFn | None = None,
                 pull: PullFn | None = None):
        self.deliver, self.fetch, self.tls = deliver, fetch, tls
        self.pull = pull  # answers pulls (on_return: pull); None: a pull gets an empty stream
        self.refused = refused  # told of each Fetch refused here (the node counts it)
        self.max_bytes = max_bytes
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def _deliver(self, request_iterator, context) -> bytes:
        identity = peer_identity(context) if self.tls is not None else None
        it = request_iterator.__aiter__()
        try:
            header = await it.__anext__()
        except StopAsyncIteration:
            header = b""
        ok, reason = await self.deliver(header, it, identity, context.peer())
        return msgpack.packb({"ok": ok, "reason": reason})

    async def _fetch(self, request: bytes, context):
        try:
            req = msgpack.unpackb(request)
            t, who = int(req["round"]), int(req.get("node", -1))
            pull = req.get("pull", False) is True
        except Exception:  # noqa: BLE001 - a bad request gets an empty stream
            return
        if self.tls is not None:
            identity = peer_identity(context)
            if identity != who:
                if self.refused is not None:
                    by = "a caller without a node certificate" if identity is None \
                        else f"node {identity}"
                    self.refused(Rejected("identity", f"a fetch on behalf of node {who} by {by}"),
                                 context.peer())
                return
        if pull:
            got = self.pull(who) if self.pull is not None else None
            if got == OFFLINE:  # offline: answered as a refused connection is
                await context.abort(grpc.StatusCode.UNAVAILABLE, "offline")
            if got == SILENT:  # e.g. across a network cut: no answer
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no answer")
            if got is None or isinstance(got, str):
                return
            header, payload, held = got
            yield pack_held(held)
            yield header
            for c in chunks(payload):
                yield c
            return
        msg = self.fetch(t, who)
        if msg is None:
            return
        header, payload = msg
        yield header
        for c in chunks(payload):
            yield c

    async def start(self, host: str, port: int) -> int:
        self.server = grpc.aio.server(options=server_options(self.max_bytes))
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Deliver": grpc.stream_unary_rpc_method_handler(self._deliver),
            "Fetch": grpc.unary_stream_rpc_method_handler(self._fetch),
        })
        self.server.add_generic_rpc_handlers((handler,))
        addr = f"{host}:{port}"
        try:
            if self.tls is not None:
                self.port = self.server.add_secure_port(addr, server_credentials(self.tls))
            else:
                self.port = self.server.add_insecure_port(addr)
        except RuntimeError:  # grpcio >= 1.5x raises where older ones returned port 0
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen on {addr}")
        await self.server.start()
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None


# ----------------------------------------------------------------------------------- client
class Peer:
    """A channel to one neighbour, with deadlines and bounded retries. ``refused`` is told
    of each delivery the TLS handshake refused for the neighbour's certificate
    (:func:`handshake_rejection`; the node counts it)."""

    def __init__(self, address: str, *, max_bytes: int, tls: TlsFiles | None = None,
                 refused: RefusedFn | None = None, identity: int | None = None):
        self.address = address
        self.refused = refused
        self.max_bytes = int(max_bytes)
        self.tls, self.identity = tls, identity  # identity: the neighbour's id (pulls, TLS)
        self._pull_channel: grpc.aio.Channel | None = None
        opts = channel_options(max_bytes)
        if tls is not None:
            self.channel = grpc.aio.secure_channel(address, channel_credentials(tls), opts)
        else:
            self.channel = grpc.aio.insecure_channel(address, opts)
        self._deliver = self.channel.stream_unary(f"/{SERVICE}/Deliver")
        self._fetch = self.channel.unary_stream(f"/{SERVICE}/Fetch")

    async def deliver(self, header: bytes, payload: bytes | Chunked, *, timeout: float = 10.0,
                      retries: int = 3, backoff: float = 0.05) -> tuple[bool, str]:
        """Send one message; ``(accepted, reason)``. ``reason`` is the receiver's rejection
        reason, or a transport status such as ``"UNAVAILABLE"`` after the retries. A handshake
        that refuses the receiver's certificate is not retried: ``refused`` is told of it and
        ``reason`` is ``"TLS: "`` and its rejection reason (``"TLS: expired"``)."""
        status = ""
        for attempt in range(retries + 1):
            async def requests():
                yield header
                for c in chunks(payload):
                    yield c

            try:
                reply = await self._deliver(requests(), timeout=timeout)
                d = msgpack.unpackb(reply)
                return bool(d["ok"]), str(d["reason"])
            except grpc.aio.AioRpcError as e:
                refusal = handshake_rejection(e, self.address)
                if refusal is not None:
                    if self.refused is not None:
                        self.refused(refusal, f"delivery to {self.address}")
                    return False, f"TLS: {refusal.reason}"
                status = e.code().name
                if e.code() not in (grpc.StatusCode.UNAVAILABLE,) or attempt == retries:
                    break
                await asyncio.sleep(backoff * (2 ** attempt))
        return False, status

    async def fetch(self, t: int, me: int = -1, *,
                    timeout: float = 10.0) -> tuple[bytes, bytes] | None:
        """The neighbour's own round-``t`` message, or None if it does not hold it (yet) or
        the call fails. Bounded: the header is read first; a reply whose header announces
        more than the node's limit, or whose payload runs past what the header announces,
        stops the call at once and raises :class:`~sfg.net.wire.Rejected` ("oversize"; a
        header that does not parse: its reason). A TLS handshake that refuses the neighbour's
        certificate raises it too (:func:`handshake_rejection`: "expired", "identity")."""
        req = msgpack.packb({"round": int(t), "node": int(me)})
        call = self._fetch(req, timeout=timeout)
        try:
            _, header, parts = await self._read(call, held=False)
        except grpc.aio.AioRpcError as e:
            refusal = handshake_rejection(e, self.address)
            if refusal is not None:
                raise refusal from None
            return None
        except Rejected:
            call.cancel()
            raise
        if header is None:
            return None
        return header, b"".join(parts)

    async def _read(self, call, *, held: bool) -> tuple[float | None, bytes | None, list[bytes]]:
        """A ``Fetch`` reply, bounded (see :meth:`fetch`): (held or None, header or None,
        payload parts). ``held``: the reply starts with a pull's preamble
        (:func:`~sfg.net.wire.unpack_held`)."""
        h: float | None = None
        header: bytes | None = None
        parts: list[bytes] = []
        size = length = 0
        async for part in call:
            if held and h is None:
                h = unpack_held(part)
                continue
            if header is None:
                header = part
                length = unpack_header(part).length
                if length > self.max_bytes:
                    raise Rejected("oversize", f"the fetched header announces {length} "
                                               f"bytes > limit {self.max_bytes}")
                continue
            size += len(part)
            if size > length:
                raise Rejected("oversize", f"the fetched payload exceeds the announced "
                                           f"{length} bytes")
            parts.append(part)
        return h, header, parts

    async def pull(self, me: int, *, timeout: float):
        """A returning node's pull (docs/concepts/nodes.md#returns-in-the-node): the neighbour's
        latest sent message as ``(header, payload, held)``, :data:`EMPTY` (it never sent),
        :data:`UNREACHABLE` (offline, or not running: a refused connection), or None (no
        answer within ``timeout``, or a failed call). The same bounds as :meth:`fetch`; a
        reply past them, a bad preamble or a refused certificate raises
        :class:`~sfg.net.wire.Rejected`."""
        req = msgpack.packb({"round": -1, "node": int(me), "pull": True})
        call = self._pull_fetch()(req, timeout=timeout)
        try:
            held, header, parts = await self._read(call, held=True)
        except grpc.aio.AioRpcError as e:
            refusal = handshake_rejection(e, self.address)
            if refusal is not None:
                raise refusal from None
            return UNREACHABLE if e.code() == grpc.StatusCode.UNAVAILABLE else None
        except Rejected:
            call.cancel()
            raise
        if header is None:
            if held is not None:
                raise Rejected("truncated", "a pull reply without its message")
            return EMPTY
        assert held is not None
        return header, b"".join(parts), held

    def _pull_fetch(self):
        """The ``Fetch`` method a pull calls. With TLS and the neighbour's id, over a channel of
        its own that accepts only the certificate naming ``node-<id>`` (``sfg tls-ca`` puts
        the name in every node's certificate): the reply is the neighbour's, as a delivery's
        sender is checked on the serving side; a certificate without the name is refused
        (:func:`handshake_rejection`, ``identity``)."""
        if self.tls is None or self.identity is None:
            return self._fetch
        if self._pull_channel is None:
            opts = [*channel_options(self.max_bytes),
                    ("grpc.ssl_target_name_override", f"node-{int(self.identity)}")]
            self._pull_channel = grpc.aio.secure_channel(self.address,
                                                         channel_credentials(self.tls), opts)
        return self._pull_channel.unary_stream(f"/{SERVICE}/Fetch")

    async def close(self) -> None:
        await self.channel.close()
        if self._pull_channel is not None:
            await self._pull_channel.close()
