"""Safe to deploy: bounded transfers, identities taken from certificates, no
plaintext by accident, one key bundle per node, certificates checked against their validity.
Hostile peers are real gRPC servers on 127.0.0.1; every call has a deadline."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import stat
import sys

import grpc
import msgpack
import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.net import inbox, lockstep, outgoing
from sfg.net.node import Node, NodeConfig, header_for
from sfg.net.tls import make_test_ca
from sfg.net.transport import SERVICE, Peer, Server, TlsFiles, channel_options, message_limit
from sfg.net.wire import Rejected, encode, make_header
from sfg.net.world import build_world

RING4 = dict(n_clients=4, rounds=4, graph="ring:k=1", process="none", eval_every=4,
             model="mlp", dataset="digits")


def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_error_line(err: str) -> str:
    # a note (a setting adjusted so a small run runs) is not an error line
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


# ------------------------------------------------------------------ a hostile neighbour
class Hostile:
    """A real gRPC server speaking sfg.Node whose ``Fetch`` answers with a header and then
    streams chunks without end (bounded here at ``limit`` chunks so that the test ends); it
    counts what it yielded (in all, and per call) and notes when the call was stopped."""

    def __init__(self, header: bytes, chunk: int = 1 << 16, limit: int = 2000):
        self.header, self.chunk, self.limit = header, chunk, limit
        self.yielded = 0
        self.per_call: list[int] = []  # the chunks each finished call yielded
        self.stopped = asyncio.Event()
        self.server: grpc.aio.Server | None = None

    async def _fetch(self, request, context):
        n = 0
        try:
            yield self.header
            block = b"\0" * self.chunk
            for _ in range(self.limit):
                self.yielded += 1
                n += 1
                yield block
        finally:
            self.per_call.append(n)
            self.stopped.set()

    async def start(self) -> int:
        self.server = grpc.aio.server(options=channel_options(1 << 26))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Fetch": grpc.unary_stream_rpc_method_handler(self._fetch)}),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(0)


def _header(length: int, sender: int = 1, round: int = 0) -> bytes:
    return make_header((b"\1" * 32, length), sender=sender, round=round, age=0, lag=0.0,
                       count=1, local_count=1)


def _fetch_from(hostile, *, max_bytes: int):
    """A fetch from the hostile server on loopback that must be rejected: (the rejection,
    the server), after the server's stream has stopped (bounded: 60 s, 180 s in all)."""
    async def main():
        port = await hostile.start()
        peer = Peer(f"127.0.0.1:{port}", max_bytes=max_bytes)
        try:
            with pytest.raises(Rejected) as e:
                await peer.fetch(0, 0, timeout=120)
            await asyncio.wait_for(hostile.stopped.wait(), 60)
        finally:
            await peer.close()
            await hostile.stop()
        return e.value

    return asyncio.run(asyncio.wait_for(main(), 180)), hostile


def test_a_fetch_stops_as_soon_as_the_reply_runs_past_its_header():
    """An endless stream after a header announcing 1000 bytes: the fetch rejects it
    ("oversize") at the first chunk past 1000 bytes and cancels the call (the server's stream
    is stopped), instead of buffering until the deadline."""
    err, hostile = _fetch_from(Hostile(_header(1000)), max_bytes=1 << 26)
    assert err.reason == "oversize" and "announced 1000" in str(err)
    assert hostile.yielded < hostile.limit  # stopped, not run to the end


def test_a_fetch_whose_header_announces_more_than_the_limit_reads_no_payload():
    err, _ = _fetch_from(Hostile(_header(8 << 20)), max_bytes=1 << 20)
    assert err.reason == "oversize" and "limit 1048576" in str(err)


def test_a_lockstep_node_counts_an_endless_fetch_reply_as_a_rejection(caplog):
    """docs/reference/wire.md: "the fetcher reads its header first and cancels the call,
    counting `oversize`, as soon as the reply runs past the announced length [...] (a
    neighbour cannot make it buffer more than one chunk past either)". A node pulling a missing
    round-0 message from the hostile neighbour (1000 bytes announced, then chunks without
    end): each pull is cut there — the rejection names the announced length, and every one of
    the neighbour's streams was stopped long before its end — and the round times out with one
    error."""
    world = build_world(RING4)

    async def main():
        hostile = Hostile(_header(1000, sender=1))
        port = await hostile.start()
        node = Node(world, 0, NodeConfig(mode="lockstep", pull_after=0.0, deadline=2.0,
                                         rpc_timeout=60))
        node.connect({1: f"127.0.0.1:{port}", 3: f"127.0.0.1:{port}"})
        try:
            with pytest.raises(SfgError, match="did not get the round-0 models"):
                await lockstep.wait(node, 0, [1])
        finally:
            for p in node.peers.values():
                await p.close()
            await hostile.stop()
        return node, hostile

    with caplog.at_level(logging.WARNING, logger="sfg"):
        node, hostile = asyncio.run(asyncio.wait_for(main(), 180))
    assert node.rejections.as_dict().get("oversize", 0) >= 1, node.rejections.as_dict()
    assert set(node.rejections.as_dict()) == {"oversize"}
    assert "the fetched payload exceeds the announced 1000 bytes" in caplog.text, caplog.text
    # every stream stopped at the first chunk past 1000 bytes (plus what gRPC's flow control
    # let the server send ahead: 3 to 64 of the 2000 chunks here), not read to its end
    assert hostile.per_call and max(hostile.per_call) < hostile.limit // 4, hostile.per_call
    assert not node.inbox


def test_channel_options_apply_the_nodes_message_limit():
    """A server configured for messages of at most 4 KiB: gRPC itself refuses a 1 MiB
    stream message before the handler holds it (the limit is where it is configured)."""
    assert message_limit(4096) < message_limit(1 << 26)
    opts = dict(channel_options(4096))
    assert opts["grpc.max_receive_message_length"] == message_limit(4096)
    got: list[int] = []

    async def deliver(header, chunks, identity, peer):
        try:
            async for c in chunks:
                got.append(len(c))
        except Exception:  # noqa: BLE001 - the call was failed by gRPC
            return False, "refused"
        return True, ""

    async def main():
        server = Server(deliver, lambda t, w: None, max_bytes=4096)
        port = await server.start("127.0.0.1", 0)
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26)
        try:
            small = await peer.deliver(b"h", b"\0" * 1000, timeout=60, retries=0)
            big = await peer.deliver(b"h", b"\0" * (1 << 20), timeout=60, retries=0)
        finally:
            await peer.close()
            await server.stop()
        return small, big

    small, big = asyncio.run(asyncio.wait_for(main(), 120))
    assert small == (True, "")
    assert big[0] is False and big[1] == "RESOURCE_EXHAUSTED", big
    assert max(got) == 1000  # the 1 MiB message never reached the handler


# ------------------------------------------------------------------ identity on Fetch
def test_with_tls_a_fetch_on_another_nodes_behalf_is_refused_and_counted(tmp_path):
    """Node 0 holds its round-0 message. Node 3 (a neighbour, real certificate) asks for it
    as node 1: refused, counted as identity, and not recorded as delivered to node 1; asked
    as itself, node 3 gets it, and so does the real node 1."""
    ca = make_test_ca(tmp_path / "ca", range(4))
    world = build_world(RING4)

    async def main():
        node = Node(world, 0, NodeConfig(mode="lockstep", tls=TlsFiles.load(ca, 0)))
        port = await node.start()
        node.outbox[0] = outgoing.message(node)
        node.expected[0] = [1, 3]
        out = {}
        try:
            for name, who, me in (("3 as 1", 3, 1), ("3 as 3", 3, 3), ("1 as 1", 1, 1)):
                peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26, tls=TlsFiles.load(ca, who))
                out[name] = await peer.fetch(0, me, timeout=60)
                out[name + " delivered"] = set(node.delivered)
                await peer.close()
        finally:
            await node.close()
        return node, out

    node, out = asyncio.run(asyncio.wait_for(main(), 180))
    assert out["3 as 1"] is None and out["3 as 1 delivered"] == set()
    assert out["3 as 3"] is not None and out["3 as 3 delivered"] == {(3, 0)}
    assert out["1 as 1"] is not None and out["1 as 1 delivered"] == {(3, 0), (1, 0)}
    assert node.rejections.as_dict() == {"identity": 1}


# ------------------------------------------------------------------ no plaintext by accident
@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                       ("[::1]", True), ("localhost", True), ("LOCALHOST", True),
                                       ("0.0.0.0", False), ("10.0.0.1", False), ("::", False),
                                       ("node7.example", False), ("", False)])
def test_loopback_addresses(host, loop):
    from sfg.cli.net import is_loopback

    assert is_loopback(host) is loop


def _peers(tmp_path, port: int = 1):
    p = tmp_path / "peers.yaml"
    p.write_text(f"nodes: {{0: 127.0.0.1:{port}, 1: 127.0.0.1:{port + 1}}}\nedges: [[0, 1]]\n")
    return p


def test_node_on_a_public_address_without_tls_needs_insecure(tmp_path, capsys):
    """0.0.0.0 without --tls-dir: one error line, exit 2, before binding (the port is held by
    another socket here, so a node that tried to bind would say it cannot serve). With
    --insecure it goes on to bind (and then cannot: the port is taken); on loopback it needs
    no flag."""
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen(1)
    port = held.getsockname()[1]
    run = ["--peer-file", str(_peers(tmp_path)), "-T", "1", "--eval-every", "1", "-p", "none",
           "--dataset", "digits",
           "--model", "mlp"]
    try:
        code, out, err = _cli(["node", "--id", "0", "--listen", f"0.0.0.0:{port}", *run], capsys)
        assert code == 2 and not out
        line = _one_error_line(err)
        assert "plaintext" in line and "--insecure" in line and "--tls-dir" in line
        code, _, err = _cli(["node", "--id", "0", "--listen", f"0.0.0.0:{port}", "--insecure",
                             *run], capsys)
        assert code == 2 and f"cannot serve on 0.0.0.0:{port}" in _one_error_line(err)
        code, _, err = _cli(["node", "--id", "0", "--listen", f"127.0.0.1:{port}", *run], capsys)
        assert code == 2 and f"cannot serve on 127.0.0.1:{port}" in _one_error_line(err)
    finally:
        held.close()


# ------------------------------------------------------------------ key bundles
def test_tls_ca_writes_one_bundle_per_node_and_keeps_the_ca_key_out(tmp_path, capsys):
    d = tmp_path / "certs"
    code, out, err = _cli(["tls-ca", "--dir", str(d), "--nodes", "3"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in d.iterdir()) == ["ca.pem", "node-0", "node-1", "node-2"]
    for i in range(3):
        assert sorted(p.name for p in (d / f"node-{i}").iterdir()) == sorted(
            ["ca.pem", "node-0.pem", "node-1.pem", "node-2.pem", f"node-{i}.key",
             f"node-{i}.sign"])
    assert not list(d.rglob("*ca.key"))  # the CA's key is not kept unless asked
    assert "node-0" in out
    # asked: in a folder of its own, in no bundle
    code, out, err = _cli(["tls-ca", "--dir", str(tmp_path / "kept"), "--nodes", "2",
                           "--keep-ca-key"], capsys)
    assert code == 0, err
    assert [p.relative_to(tmp_path / "kept").as_posix()
            for p in (tmp_path / "kept").rglob("*ca.key")] == ["ca-key/ca.key"]
    # one bundle is enough to run the node: its TLS files and its signing keys load from it
    tls = TlsFiles.load(d / "node-1", 1)
    assert tls.key == (d / "node-1" / "node-1.key").read_bytes()
    from sfg.net.certify import Keys

    k = Keys.load(d / "node-1", 1, range(3))
    assert k.verify(1, k.sign(b"x"), b"x")
    # and the whole folder serves sfg swarm (each node its own bundle)
    assert TlsFiles.load(d, 2).key == (d / "node-2" / "node-2.key").read_bytes()


@pytest.fixture(scope="module")
def kept_ca(tmp_path_factory):
    """Two nodes' bundles and the CA's private key (``--keep-ca-key``)."""
    return make_test_ca(tmp_path_factory.mktemp("kept"), range(2), keep_ca_key=True)


@pytest.mark.parametrize("loader", ["tls", "signing"])
@pytest.mark.parametrize("stray", ["node-1.key", "node-1.sign", "ca.key"])
def test_a_bundle_holding_another_nodes_or_the_cas_private_key_is_refused(kept_ca, tmp_path,
                                                                          loader, stray):
    """docs/howto/deploy-nodes.md: "A node loads its bundle (`--tls-dir certs/node-<id>`) and
    refuses a folder holding another node's or the CA's private key" — each private key on its
    own (node 1's TLS key, node 1's signing key, the CA's key), by both loaders of the bundle
    (the TLS files and the +certified signing keys)."""
    from sfg.net.certify import Keys

    def load(d):
        return TlsFiles.load(d, 0) if loader == "tls" else Keys.load(d, 0, range(2))

    bundle = tmp_path / "node-0"
    bundle.mkdir()
    for p in (kept_ca / "node-0").iterdir():
        (bundle / p.name).write_bytes(p.read_bytes())
    load(bundle)  # node 0's own bundle loads
    source = kept_ca / ("ca-key" if stray == "ca.key" else "node-1") / stray
    (bundle / stray).write_bytes(source.read_bytes())
    with pytest.raises(SfgError, match=rf"private keys other than node 0's \({stray}\)"):
        load(bundle)


def test_existing_keys_are_not_replaced_without_force(tmp_path, capsys):
    d = tmp_path / "certs"
    assert _cli(["tls-ca", "--dir", str(d), "--nodes", "2"], capsys)[0] == 0
    before = (d / "node-0" / "node-0.key").read_bytes()
    code, _, err = _cli(["tls-ca", "--dir", str(d), "--nodes", "2"], capsys)
    assert code == 2 and "--force" in _one_error_line(err) and "node-0.key exists" in err
    assert (d / "node-0" / "node-0.key").read_bytes() == before
    code, _, err = _cli(["tls-ca", "--dir", str(d), "--nodes", "2", "--force"], capsys)
    assert code == 0, err
    assert (d / "node-0" / "node-0.key").read_bytes() != before
    TlsFiles.load(d, 0)  # the new bundle is whole


_WATCH: list = []   # [folder, findings] while a test watches file operations under folder


def _audit(event: str, args) -> None:
    """After every file operation under the watched folder, any file or folder there that
    group or others may read (or enter) is a finding: a key was exposed in between."""
    if not _WATCH or event not in ("open", "os.chmod", "os.mkdir", "os.rename", "os.remove"):
        return
    root, found = _WATCH
    path = str(args[0]) if args and isinstance(args[0], str | os.PathLike) else ""
    if not path.startswith(str(root)):
        return
    _WATCH.clear()  # no recursion from our own os.walk/stat
    try:
        for dirpath, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                p = os.path.join(dirpath, name)
                mode = os.stat(p).st_mode
                private = name.endswith((".key", ".sign")) or stat.S_ISDIR(mode)
                if private and mode & 0o077:
                    found.append((event, p, oct(mode & 0o777)))
    finally:
        _WATCH.extend([root, found])


def test_private_files_are_never_readable_by_others_even_under_umask_0(tmp_path):
    """Under umask 0, every file operation of ``sfg tls-ca`` is followed by a look at every
    key and folder (an audit hook): none is ever open to group or others — not between the
    creation of a key and a later chmod — and the final modes are 0600 and 0700. A key file
    someone else created first is never written into (O_EXCL)."""
    from sfg.net.tls import write_private

    sys.addaudithook(_audit)
    found: list = []
    old = os.umask(0)
    try:
        _WATCH.extend([tmp_path / "certs", found])
        make_test_ca(tmp_path / "certs", range(3), keep_ca_key=True)
        _WATCH.clear()
    finally:
        _WATCH.clear()
        os.umask(old)
    assert found == []
    d = tmp_path / "certs"
    for p in [*d.rglob("*.key"), *d.rglob("*.sign")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    for p in [d, *(x for x in d.rglob("*") if x.is_dir())]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    planted = tmp_path / "planted.key"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)
    with pytest.raises(FileExistsError):
        write_private(planted, b"secret")
    assert planted.read_bytes() == b""


# ------------------------------------------------------------------ validity
def _past(days_ago: float, days: float = 1.0):
    now = dt.datetime.now(dt.timezone.utc)
    return now - dt.timedelta(days=days_ago), now - dt.timedelta(days=days_ago - days)


@pytest.mark.parametrize("when", ["expired", "not yet valid"])
def test_a_node_whose_own_certificate_is_not_valid_now_stops_at_start(tmp_path, capsys, when):
    period = _past(10) if when == "expired" else _past(-5)
    ca = make_test_ca(tmp_path / "certs", range(2), validity={0: period})
    code, out, err = _cli(["node", "--id", "0", "--listen", "127.0.0.1:0", "--peer-file",
                           str(_peers(tmp_path)), "--tls-dir", str(ca / "node-0"), "-T", "1",
                           "-p", "none", "--dataset", "digits", "--model", "mlp"], capsys)
    assert code == 2 and not out
    line = _one_error_line(err)
    assert "node 0's certificate" in line and "not now" in line
    TlsFiles.load(ca / "node-1", 1)  # the others' are fine
    from sfg.net.certify import Keys

    with pytest.raises(SfgError, match="not now"):
        Keys.load(ca, 0, range(2))


def test_a_peers_expired_certificate_is_a_counted_rejection(tmp_path):
    """+certified: node 1's certificate expired (its signature and stamps still verify
    against its key): node 0 rejects its header as expired and counts it; node 2's, valid,
    is accepted."""
    from cryptography.hazmat.primitives import serialization

    from sfg.net.certify import Keys, make_cert, make_stamp, read_stamp
    from sfg.net.wire import encode_params, payload_digest

    ca = make_test_ca(tmp_path / "certs", range(4), validity={1: _past(10)})
    k0 = Keys.load(ca, 0, range(4))
    raw = (ca / "node-1" / "node-1.sign").read_bytes()
    k1 = Keys(1, serialization.load_pem_private_key(raw, None), {})  # the holder of node 1's key
    k2 = Keys.load(ca, 2, range(4))
    world = build_world({**RING4, "rule": "sfg-cut+certified"},
                        edges=np.array([[0, 1], [0, 2], [1, 2], [1, 3]]))
    node = Node(world, 0, NodeConfig(mode="lockstep", keys=k0))
    payload = encode_params(world.x0, world.layout)

    def header(keys, sender):
        cert = make_cert(make_stamp(keys, 0, 0, 0.0, 1), None, None, [])
        return make_header(payload_digest(payload), sender=sender, round=0, age=0, lag=0.0,
                           count=1, local_count=1, cert=cert, sign=keys.sign)

    async def deliver(h):
        async def chunks():
            yield payload

        return await inbox.deliver(node, h, chunks(), None, "test")

    assert asyncio.run(deliver(header(k1, 1))) == (False, "expired")
    assert asyncio.run(deliver(header(k2, 2))) == (True, "")
    assert node.rejections.as_dict() == {"expired": 1}
    assert list(node.inbox) == [(2, 0)]
    with pytest.raises(Rejected, match="expired"):
        read_stamp(make_stamp(k1, 0, 0, 0.0, 1), k0)
    assert msgpack.unpackb(make_stamp(k2, 0, 0, 0.0, 1))  # a valid node's stamp reads
    read_stamp(make_stamp(k2, 0, 0, 0.0, 1), k0)
    _ = encode  # (imported for the hostile tests' messages)


def _tls_as_is(ca, node: int) -> TlsFiles:
    """Node ``node``'s bundle read without TlsFiles.load's checks: a certificate that expired
    while its node runs (TlsFiles.load refuses it at start)."""
    d = ca / f"node-{node}"
    return TlsFiles(*((d / n).read_bytes() for n in ("ca.pem", f"node-{node}.pem",
                                                     f"node-{node}.key")))


@pytest.mark.parametrize("when", ["expired", "not yet valid"])
def test_a_neighbours_certificate_refused_by_the_tls_handshake_is_a_counted_rejection(tmp_path,
                                                                                       when):
    """Without +certified, three real nodes over mutual TLS on 127.0.0.1, all certificates
    from one CA; node 1's is outside its validity period. Node 0's pulls from node 1 and its
    push to node 1 fail in the handshake and are counted as rejections (reason expired);
    node 3's message, pulled alike, is accepted; nothing of node 1's reaches node 0's inbox.
    Node 1 calling node 0 is refused by node 0's handshake, which gRPC does not let node 0
    count (see sfg.net.transport)."""
    period = _past(10) if when == "expired" else _past(-5)
    ca = make_test_ca(tmp_path / "ca", range(4), validity={1: period})
    world = build_world(RING4)  # node 0's neighbours: 1 and 3

    async def main():
        n0 = Node(world, 0, NodeConfig(mode="lockstep", tls=TlsFiles.load(ca, 0), pull_after=0.2,
                                       deadline=1.5, rpc_timeout=30, retries=2))
        n1 = Node(world, 1, NodeConfig(mode="lockstep", tls=_tls_as_is(ca, 1)))
        n3 = Node(world, 3, NodeConfig(mode="lockstep", tls=TlsFiles.load(ca, 3)))
        nodes = (n0, n1, n3)
        addr = {}
        for n in nodes:
            addr[n.i] = f"127.0.0.1:{await n.start()}"
        for n in (n1, n3):  # each holds its round-0 message for node 0
            n.outbox[0] = outgoing.message(n)
            n.expected[0] = [0, 2]
        n0.connect({**addr, 2: addr[3]})
        out = {}
        try:
            with pytest.raises(SfgError, match=r"did not get the round-0 models of neighbour\(s\) \[1\]"):
                await lockstep.wait(n0, 0, [1, 3])
            out["pulled"] = dict(n0.rejections.as_dict())
            msg = outgoing.message(n0, [1])
            await outgoing.send(n0, 1, 0, header_for(msg, 1), msg[1])
            out["pushed"] = dict(n0.rejections.as_dict())
            back = Peer(addr[0], max_bytes=1 << 26, tls=_tls_as_is(ca, 1))
            n0.outbox[0], n0.expected[0] = msg, [1]
            out["node 1 fetches"] = await back.fetch(0, 1, timeout=30)
            await back.close()
        finally:
            for n in nodes:
                await n.close()
        return n0, n1, out

    n0, n1, out = asyncio.run(asyncio.wait_for(main(), 180))
    pulls = out["pulled"].get("expired", 0)
    assert pulls >= 1 and set(out["pulled"]) == {"expired"}, out
    assert out["pushed"] == {"expired": pulls + 1}, out  # the push: one more, not retried
    assert n0.stats.send_failed == 1 and n0.stats.sent == 0
    assert list(n0.inbox) == [(3, 0)]  # node 3's message only: nothing from node 1
    assert not n1.inbox and (1, 0) not in n0.delivered
    assert out["node 1 fetches"] is None  # refused by node 0's handshake ...
    assert n0.rejections.as_dict() == out["pushed"]  # ... which node 0 cannot count
