"""Wire format and trust (docs/concepts/nodes.md#wire-format-and-trust): every bad message is rejected, counted, and changes nothing.

The rejection tests deliver over a real gRPC server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct

import msgpack
import numpy as np
import pytest

from sfg.net.checkpoints import NodeState, Star, load_checkpoint, save_checkpoint
from sfg.net.node import Node, NodeConfig
from sfg.net.transport import Peer
from sfg.net.wire import (
    Header,
    Layout,
    Rejected,
    check_message,
    decode_params,
    encode,
    encode_params,
    unpack_header,
)
from sfg.net.world import build_world

LAYOUT = Layout(names=("a.weight", "a.bias"), shapes=((3, 2), (3,)))


def _msg(flat, layout=LAYOUT, **kw):
    args = dict(sender=1, round=4, age=2, lag=3.5, count=7, local_count=5)
    args.update(kw)
    return encode(flat, layout, **args)


def test_roundtrip_keeps_params_and_scalars_exactly():
    flat = np.arange(9, dtype=np.float32) / 7
    h, p = _msg(flat)
    m = check_message(h, p, LAYOUT, neighbours={1})
    assert m.params.dtype == np.float32 and np.array_equal(m.params, flat)
    assert (m.header.sender, m.header.round, m.header.age, m.header.lag, m.header.count,
            m.header.local_count) == (1, 4, 2, 3.5, 7, 5)
    assert m.header.sha256 == hashlib.sha256(p).digest()
    # the payload is a plain safetensors file with one tensor per named parameter
    from safetensors.numpy import load

    t = load(p)
    assert t["a.weight"].shape == (3, 2) and np.array_equal(t["a.bias"], flat[6:])


def _reason(h, p, layout=LAYOUT, **kw) -> str:
    with pytest.raises(Rejected) as e:
        check_message(h, p, layout, neighbours=kw.pop("neighbours", {1}), **kw)
    return e.value.reason


def test_each_kind_of_bad_message_has_its_reason():
    flat = np.ones(9, np.float32)
    h, p = _msg(flat)
    assert _reason(b"\xc1garbage", p) == "garbage"
    assert _reason(h, p[:-5]) == "truncated"
    assert _reason(h, p + b"xx") == "garbage"
    assert _reason(h, p, neighbours={2, 3}) == "non-neighbour"
    assert _reason(h, p, max_bytes=len(p) - 1) == "oversize"
    assert _reason(h, p, identity=2) == "identity"
    bad = bytearray(p)
    bad[-1] ^= 0xFF
    assert _reason(h, bytes(bad)) == "digest"
    hn, pn = _msg(np.where(np.arange(9) == 4, np.nan, 1.0).astype(np.float32))
    assert _reason(hn, pn) == "non-finite"
    other = Layout(names=("a.weight", "a.bias"), shapes=((2, 3), (3,)))
    hs, ps = _msg(flat, other)
    assert _reason(hs, ps) == "shape"
    renamed = Layout(names=("b.weight", "a.bias"), shapes=((3, 2), (3,)))
    hr, pr = _msg(flat, renamed)
    assert _reason(hr, pr) == "names"
    from safetensors.numpy import save

    p64 = save({"a.weight": np.ones((3, 2)), "a.bias": np.ones(3)})  # float64
    h64 = Header(1, 4, 2, 3.5, 7, 5, len(p64), hashlib.sha256(p64).digest()).pack()
    assert _reason(h64, p64) == "dtype"
    d = msgpack.unpackb(h)
    assert _reason(msgpack.packb({**d, "version": 99}), p) == "version"
    assert _reason(msgpack.packb({**d, "age": 5, "lag": 1.0}), p) == "staleness"  # τ > ℓ
    assert _reason(msgpack.packb({**d, "lag": -1.0}), p) == "staleness"
    assert _reason(msgpack.packb({k: v for k, v in d.items() if k != "round"}), p) == "header"


def test_safetensors_header_lies_are_caught_before_parsing():
    flat = np.ones(9, np.float32)
    p = encode_params(flat, LAYOUT)
    n = struct.unpack("<Q", p[:8])[0]
    index = json.loads(p[8:8 + n])
    index["a.bias"]["data_offsets"] = [24, 10_000]  # points past the end
    text = json.dumps(index).encode()
    forged = struct.pack("<Q", len(text)) + text + p[8 + n:]
    with pytest.raises(Rejected) as e:
        decode_params(forged, LAYOUT)
    assert e.value.reason in ("truncated", "garbage")
    with pytest.raises(Rejected):
        decode_params(struct.pack("<Q", 1 << 40) + b"{}", LAYOUT)


def test_unpack_header_rejects_non_map_and_wrong_types():
    for raw in (msgpack.packb([1, 2]), msgpack.packb("x"), b""):
        with pytest.raises(Rejected):
            unpack_header(raw)
    h, _ = _msg(np.ones(9, np.float32))
    d = msgpack.unpackb(h)
    with pytest.raises(Rejected):
        unpack_header(msgpack.packb({**d, "sender": "1"}))
    with pytest.raises(Rejected):
        unpack_header(msgpack.packb({**d, "sha256": b"short"}))


# ------------------------------------------------------------------ over gRPC, against a node
def test_node_rejects_and_counts_bad_deliveries_and_keeps_working(tmp_path):
    world = build_world(dict(n_clients=4, rounds=4, graph="ring:k=1", process="none",
                             eval_every=4))
    assert list(world.neighbours(0)) == [1, 3]
    layout = world.layout
    good = (world.x0 + 0.25).astype(np.float32)

    async def main():
        node = Node(world, 0, NodeConfig(mode="async", max_bytes=layout.payload_bytes + 4096))
        port = await node.start()
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26)
        x_before = node.x.copy()
        replies = {}
        h, p = encode(good, layout, sender=1, round=1, age=0, lag=0.0, count=2, local_count=2)
        nan = good.copy()
        nan[7] = np.nan
        hn, pn = encode(nan, layout, sender=1, round=1, age=0, lag=0.0, count=2, local_count=2)
        wrong = Layout(layout.names, tuple(s[::-1] for s in layout.shapes))
        hw, pw = encode(good, wrong, sender=1, round=1, age=0, lag=0.0, count=2, local_count=2)
        hx, px = encode(good, layout, sender=2, round=1, age=0, lag=0.0, count=2, local_count=2)
        big = np.zeros(layout.D + 5000, np.float32)
        big_layout = Layout(("x",), ((layout.D + 5000,),))
        hb, pb = encode(big, big_layout, sender=3, round=1, age=0, lag=0.0, count=2,
                        local_count=2)
        cases = {
            "garbage": (b"\x93\x00\xff not msgpack", b"\x00" * 64),
            "truncated": (h, p[: len(p) // 2]),
            "shape": (hw, pw),
            "non-finite": (hn, pn),
            "oversize": (hb, pb),
            "non-neighbour": (hx, px),
        }
        for name, (hh, pp) in cases.items():
            replies[name] = await peer.deliver(hh, pp, timeout=30)
        assert not node.latest, "a rejected message must not reach the inbox"
        assert np.array_equal(node.x, x_before)
        ok = await peer.deliver(h, p, timeout=30)
        await peer.close()
        await node.close()
        return node, replies, ok

    node, replies, ok = asyncio.run(asyncio.wait_for(main(), 180))
    for name, (accepted, reason) in replies.items():
        assert not accepted and reason == name, (name, reason)
    assert node.rejections.as_dict() == {k: 1 for k in replies}
    assert ok == (True, "")
    msg, _ = node.latest[1]
    assert np.array_equal(msg.params, good)           # the valid message arrived intact
    assert np.array_equal(node.x, world.x0)           # and nothing touched the model


# ------------------------------------------------------------------ state and checkpoints
def test_star_update_matches_spec_hand_case():
    """Receiver with neighbours 1, 2; candidates self and 2 with weights 0.25 / 0.75."""
    from sfg.round.rules import parse_rule

    star = Star(2, parse_rule("sfg-l+ipw"))  # modifiers must not touch the given weights
    s = NodeState(t=3, age=2, lag=2.5, count=4, local_count=3, q_hat=[1.0, 0.5])
    new = star.advance(s, available=True, cand=np.array([True, False, True]),
                       weights=np.array([0.25, 0.0, 0.75]), ages=np.array([2, 0, 1]),
                       lags=np.array([2.5, 0.0, 1.5]), counts=np.array([4, 1, 9]),
                       local_counts=np.array([3, 1, 5]))
    assert new.t == 4 and new.age == 0
    assert new.lag == pytest.approx(0.25 * 2.5 + 0.75 * 1.5)   # Σ w ℓ; training keeps it
    assert new.count == 9 + 1 and new.local_count == 4
    assert new.q_hat == pytest.approx([0.9 * 1.0 + 0.0, 0.9 * 0.5 + 0.1])
    k = np.zeros(3, np.int64)
    off = star.advance(new, available=False, cand=np.zeros(3, bool),
                       weights=np.array([1.0, 0, 0]), ages=k, lags=np.zeros(3),
                       counts=k + 1, local_counts=k + 1)
    assert (off.t, off.age, off.lag, off.count, off.local_count, off.q_hat) == (
        5, 1, new.lag + 1, new.count, new.local_count, new.q_hat)


def test_waited_messages_age_by_whole_rounds_and_lag_by_real_periods():
    from sfg.net.node import waited

    assert waited(2, 3.0, 0.0) == (2, 3.0)
    assert waited(2, 3.0, 0.75) == (2, 3.75)
    assert waited(2, 3.0, 1.5) == (3, 4.5)
    assert waited(0, 0.0, 3.0) == (3, 3.0)
    age, lag = waited(4, 4.0, 2.3)
    assert age <= lag  # the invariant τ ≤ ℓ of docs/concepts/staleness.md#invariants is kept


def test_checkpoint_roundtrip_is_atomic_and_exact(tmp_path):
    flat = np.random.default_rng(0).standard_normal(9).astype(np.float32)
    st = NodeState(t=5, age=1, lag=2.25, count=3, local_count=2, q_hat=[0.5, 0.9])
    path = tmp_path / "node-1.safetensors"
    save_checkpoint(path, flat, LAYOUT, st, {"t0": 12.5})
    x, s2, extra = load_checkpoint(path, LAYOUT)
    assert np.array_equal(x, flat) and s2 == st and extra == {"t0": 12.5}
    assert [p.name for p in tmp_path.iterdir()] == ["node-1.safetensors"]  # no temp left


def test_lockstep_node_bounds_what_a_neighbour_may_queue_ahead():
    """A lockstep neighbour is at most one shared round ahead: two pending messages per
    sender; a third round, or one past the run, is rejected as "ahead" (bounded memory)."""
    world = build_world(dict(n_clients=4, rounds=4, graph="ring:k=1", process="none",
                             eval_every=4))

    async def main():
        node = Node(world, 0, NodeConfig(mode="lockstep"))
        port = await node.start()
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26)
        replies = []
        for r in (0, 1, 1, 2, 9):
            h, p = encode(world.x0, world.layout, sender=1, round=r, age=0, lag=0.0, count=1,
                          local_count=1)
            replies.append(await peer.deliver(h, p, timeout=30))
        await peer.close()
        await node.close()
        return node, replies

    node, replies = asyncio.run(asyncio.wait_for(main(), 180))
    assert replies == [(True, ""), (True, ""), (True, ""), (False, "ahead"), (False, "ahead")]
    assert sorted(node.inbox) == [(1, 0), (1, 1)]
    assert node.rejections.as_dict() == {"ahead": 2}


def test_chunked_encoding_is_the_same_payload_in_transport_sized_pieces():
    from sfg.net.transport import chunks
    from sfg.net.wire import Chunked

    layout = Layout(names=("a.weight", "a.bias"), shapes=((30, 20), (30,)))
    flat = np.random.default_rng(4).standard_normal(layout.D).astype(np.float32)
    h, p = encode(flat, layout, sender=1, round=3, age=0, lag=0.0, count=2, local_count=2)
    hc, pc = encode(flat, layout, sender=1, round=3, age=0, lag=0.0, count=2, local_count=2,
                    chunk=256)
    assert isinstance(pc, Chunked) and len(pc) > 2
    assert hc == h and pc.join() == p and pc.nbytes == len(p)
    assert all(len(c) == 256 for c in pc[:-1]) and 0 < len(pc[-1]) <= 256
    assert list(chunks(pc, 256)) == list(pc)                # sent as they are
    assert b"".join(chunks(p, 256)) == p                    # bytes are sliced
    with pytest.raises(ValueError):
        list(chunks(pc, 128))                               # never above the limit
    with pytest.raises(ValueError):
        encode(flat, layout, sender=1, round=3, age=0, lag=0.0, count=2, local_count=2, chunk=64)
    assert np.array_equal(check_message(hc, pc.join(), layout, neighbours={1}).params, flat)
