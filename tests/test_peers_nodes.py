"""Peers chosen per exchange on real nodes (docs/concepts/peers.md#real-nodes): the targets
drawn from the keyed streams of sfg.world.peers, the membership entries in the header (wire
format 2) and their checks, messages taken from any device of the run, the table in the
checkpoint, and what a lockstep node refuses. Real gRPC servers on 127.0.0.1 only; every run
is bounded in time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.net import persist
from sfg.net.membership import Membership
from sfg.net.node import Node, NodeConfig
from sfg.net.simclock import NodeClock
from sfg.net.swarm import run_nodes, summarise
from sfg.net.transport import Peer
from sfg.net.wire import (
    VERSION,
    Rejected,
    check_members,
    encode_params,
    make_header,
    pack_members,
    payload_digest,
    unpack_header,
    unpack_members,
)
from sfg.net.world import build_world
from sfg.world.peers import NEVER, draw_epidemic, peers_key

# a ring: every node has two graph neighbours, so most peers drawn are not neighbours
SMALL = dict(n_clients=5, rounds=10, local_steps=2, process="iid:u=0.2", seed=3,
             eval_every=10, rule="sfg-cut", graph="ring:k=1", model="mlp", dataset="digits")


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


def _header(members: bytes = b"", sender: int = 1, version: int | None = None) -> bytes:
    payload = encode_params(np.zeros(9, np.float32), _layout())
    raw = make_header(payload_digest(payload), sender=sender, round=2, age=0, lag=0.0,
                      count=1, local_count=1, members=members)
    if version is None:
        return raw
    d = msgpack.unpackb(raw)
    d["version"] = version
    return msgpack.packb(d, use_bin_type=True)


def _layout():
    from sfg.net.wire import Layout

    return Layout(names=("a.weight", "a.bias"), shapes=((3, 2), (3,)))


# ------------------------------------------------------------------ the wire
def test_header_entries_round_trip_in_the_signed_part():
    assert VERSION == 2
    ids, secs = [4, 0, 7], [0.0, 12.5, 3600.25]
    raw = _header(pack_members(ids, secs))
    h = unpack_header(raw)
    assert len(h.members) == 3 * 12
    got_ids, got_s = unpack_members(h.members)
    assert got_ids.tolist() == ids and got_s.tolist() == secs
    i2, s2 = check_members(h, gossip=3, n=8, longest=7200.0)
    assert i2.tolist() == ids and s2.tolist() == secs
    # the entries are part of what a +certified sender signs
    other = unpack_header(_header(pack_members(ids, [0.0, 12.5, 3600.5])))
    assert h.signed_part() != other.signed_part()
    # a header without entries packs without the field (fixed runs carry none)
    plain = unpack_header(_header())
    assert plain.members == b"" and b"members" not in _header()
    assert check_members(plain, gossip=0, n=8, longest=1.0)[0].size == 0


@pytest.mark.parametrize("ids, secs, why", [
    ([2, 3, 4, 5], [1.0] * 4, "more than M"),
    ([2, 9], [1.0, 1.0], "an id outside the run"),
    ([2, 2], [1.0, 2.0], "an id twice"),
    ([2, 1], [1.0, 2.0], "the sender itself"),
    ([2], [float("nan")], "non-finite"),
    ([2], [float("inf")], "infinite"),
    ([2], [-0.5], "negative"),
    ([2], [100.5], "longer than the run"),
])
def test_malformed_entries_are_rejected_as_membership(ids, secs, why):
    h = unpack_header(_header(pack_members(ids, secs), sender=1))
    with pytest.raises(Rejected) as e:
        check_members(h, gossip=3, n=8, longest=100.0)
    assert e.value.reason == "membership", why


def test_entries_naming_the_receiver_are_taken_and_fixed_runs_take_none():
    h = unpack_header(_header(pack_members([0, 3], [1.0, 2.0]), sender=1))
    assert check_members(h, gossip=2, n=4, longest=10.0)[0].tolist() == [0, 3]
    with pytest.raises(Rejected) as e:  # peers fixed or epidemic: M = 0
        check_members(h, gossip=0, n=4, longest=10.0)
    assert e.value.reason == "membership"


@pytest.mark.parametrize("members, reason", [
    (b"\x00" * 13, "membership"),      # not whole 12-byte entries
    ("text", "membership"),            # not bytes
])
def test_entries_that_do_not_parse_are_rejected(members, reason):
    d = msgpack.unpackb(_header())
    d["members"] = members
    with pytest.raises(Rejected) as e:
        unpack_header(msgpack.packb(d, use_bin_type=True))
    assert e.value.reason == reason


def test_a_version_1_header_is_refused():
    with pytest.raises(Rejected) as e:
        unpack_header(_header(version=1))
    assert e.value.reason == "version"


# ------------------------------------------------------------------ real nodes
def _swarm(world, peers, mode="async", period=0.25, timeout=60.0, pull=None):
    nodes: list[Node] = []

    async def ready(ports):
        return time.time() + 0.2 if mode == "async" else None

    t = time.perf_counter()
    res = asyncio.run(asyncio.wait_for(run_nodes(
        world, range(world.n),
        lambda i: NodeConfig(mode=mode, period=period, peers=peers, deadline=20,
                             record_headers=True, rpc_timeout=5, pull_timeout=pull),
        ready=ready, nodes_out=nodes), timeout))
    out = summarise(world, res, wall=time.perf_counter() - t)
    # nothing the peers bring is rejected (a loaded machine may cut a superseded send short)
    for r in res:
        assert not {"membership", "non-neighbour", "identity", "version"} & set(r["rejected"])
    return sorted(res, key=lambda r: r["node"]), sorted(nodes, key=lambda n: n.i), out


def _non_neighbour_pairs(world, nodes):
    pairs = {(h["sender"], h["receiver"]) for n in nodes for h in n.headers}
    return {p for p in pairs if p[0] not in set(world.neighbours(p[1]).tolist())}


def test_epidemic_nodes_send_to_the_keyed_draws_and_take_non_neighbours(world):
    res, nodes, out = _swarm(world, "epidemic:s=2")
    assert out["metrics"]["messages"] > 0
    assert _non_neighbour_pairs(world, nodes)
    key, tgt = np.uint64(peers_key(world.seed)), np.empty(2, np.int64)
    for n in nodes:
        for h in n.headers:  # every message went to a target of its sender's draw
            draw_epidemic(key, h["sender"], h["round"] - 1, world.n, 2, tgt)
            assert h["receiver"] in tgt.tolist(), h
    m = out["metrics"]
    assert m["peer_messages_per_device_hour"] > 0 and m["membership_bytes_per_device_hour"] == 0
    assert all(r["peers"]["table"] == 0 for r in res)


@pytest.mark.parametrize("peers", ["epidemic:s=3", "online:s=3,view=4,gossip=2"])
def test_nodes_pull_from_the_devices_drawn_for_each_return(world, peers):
    """A real node's pull on return asks the 3 devices drawn for the return (the ring gives
    each node 2 graph neighbours; under ``online`` from its table), over gRPC, and takes
    their replies — under ``online`` with the replier's entries in the header, checked and
    heard like a message's (no rejection)."""
    res, nodes, out = _swarm(world, peers, pull=0.1)
    rets = [r["returns"] for r in res]
    assert sum(r["returns"] for r in rets) > 0
    for r, n in zip(rets, nodes, strict=True):
        assert r["requests"] == 3 * r["returns"] == 3 * n.membership.pulls
    assert sum(r["replies"] + r["empty"] + r["unreachable"] for r in rets) > 0


def test_online_nodes_keep_tables_from_first_and_second_hand(world):
    res, nodes, out = _swarm(world, "online:s=2,view=3,gossip=2")
    m = out["metrics"]
    assert m["messages"] > 0
    assert _non_neighbour_pairs(world, nodes)
    assert m["membership_bytes_per_device_hour"] > 0
    heard_of = set()
    for n in nodes:
        row = n.membership.row()
        assert 1 <= len(row) <= 3 and n.i not in [j for j, _ in row]
        heard_of |= {(n.i, j) for j, t in row if t > NEVER}
    # some node heard of a device that is not its graph neighbour
    assert any(j not in set(world.neighbours(i).tolist()) for i, j in heard_of)
    assert sum(r["peers"]["membership_bytes"] for r in res) > 0


def test_lockstep_epidemic_nodes_equal_the_rounds_engine(world):
    from sfg.sim.run import simulate

    cfg = {**SMALL, "rounds": 6, "eval_every": 6}
    try:
        sim = simulate({**cfg, "peers": "epidemic:s=2"}, backend="loop")
    except SfgError as e:  # the rounds engine does not train with peers in this tree
        pytest.skip(str(e))
    res, nodes, out = _swarm(build_world(cfg), "epidemic:s=2", mode="lockstep")
    X = np.stack([n.x for n in nodes])
    assert np.array_equal(X, sim.params.numpy())
    assert [r["state"]["age"] for r in res] == sim.state.ages.tolist()
    assert out["metrics"]["rejected"] == 0


def test_a_node_rejects_bad_entries_over_grpc_and_keeps_working(world):
    layout = world.layout

    async def main():
        node = Node(world, 0, NodeConfig(mode="async", peers="online:s=2,view=3,gossip=2"))
        port = await node.start()
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26)
        payload = encode_params(world.x0, layout)

        def head(sender, members):
            return make_header(payload_digest(payload), sender=sender, round=1, age=0,
                               lag=0.0, count=1, local_count=1, members=members)

        bad = await peer.deliver(head(2, pack_members([3, 3], [1.0, 1.0])), payload,
                                 timeout=10)
        long = await peer.deliver(head(2, pack_members([3], [1e9])), payload, timeout=10)
        good = await peer.deliver(head(2, pack_members([3, 0], [0.5, 0.1])), payload,
                                  timeout=10)
        await peer.close()
        await node.close()
        return node, bad, long, good

    node, bad, long, good = asyncio.run(asyncio.wait_for(main(), 60))
    assert bad == (False, "membership") and long == (False, "membership")
    assert good == (True, "")   # node 2 is no graph neighbour of node 0 on the ring
    assert node.rejections.as_dict() == {"membership": 2}
    row = dict(node.membership.row())
    assert row[2] > row[3] > NEVER and 0 not in row  # first hand fresher than second hand


def test_fixed_nodes_still_reject_non_neighbours(world):
    async def main():
        node = Node(world, 0, NodeConfig(mode="async"))
        port = await node.start()
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26)
        payload = encode_params(world.x0, world.layout)
        got = await peer.deliver(make_header(payload_digest(payload), sender=2, round=1,
                                             age=0, lag=0.0, count=1, local_count=1),
                                 payload, timeout=10)
        await peer.close()
        await node.close()
        return got

    assert asyncio.run(asyncio.wait_for(main(), 60)) == (False, "non-neighbour")


# ------------------------------------------------------------------ checkpoints
class _Clock(NodeClock):
    """A clock set by hand: its monotonic and its wall time."""

    def __init__(self, mono: float, wall: float):
        self.mono, self.wall = mono, wall

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall


def test_the_table_survives_a_restart_older_by_the_downtime(world, tmp_path):
    peers = "online:s=2,view=3,gossip=2"
    clock = _Clock(1000.0, 5000.0)
    a = Node(world, 0, NodeConfig(mode="async", peers=peers, checkpoint_dir=tmp_path),
             clock=clock)
    m = a.membership
    m.fill([(2, 990.0), (1, 995.0)])  # 1 heard 5 s ago, 2 heard 10 s ago, 4 never
    before = m.row()
    persist.save(a)
    clock2 = _Clock(50.0, 5030.0)  # a new process: another monotonic origin, 30 s later
    b = Node(world, 0, NodeConfig(mode="async", peers=peers, checkpoint_dir=tmp_path,
                                  resume=True), clock=clock2)
    after = b.membership.row()
    assert [j for j, _ in after] == [j for j, _ in before]
    got = {j: t for j, t in after}
    assert got[1] == pytest.approx(50.0 - 5.0 - 30.0) and got[2] == pytest.approx(50 - 10 - 30)
    assert all(t == NEVER for j, t in after if j not in (1, 2))


def test_an_old_checkpoint_migrates_and_another_setting_is_refused(world, tmp_path):
    plain = Node(world, 0, NodeConfig(mode="async", checkpoint_dir=tmp_path))
    persist.save(plain)  # peers fixed: no table (as an older checkpoint)
    peers = "online:s=2,view=3,gossip=2"
    fresh = Membership(peers, world, 0, longest=10.0).row()
    b = Node(world, 0, NodeConfig(mode="async", peers=peers, checkpoint_dir=tmp_path,
                                  resume=True))
    assert b.membership.row() == fresh  # the graph neighbours, never heard
    persist.save(b)
    with pytest.raises(SfgError, match="written under peers"):
        Node(world, 0, NodeConfig(mode="async", peers="epidemic:s=2",
                                  checkpoint_dir=tmp_path, resume=True))


# ------------------------------------------------------------------ what nodes refuse
def test_lockstep_nodes_refuse_online_and_rules_with_state_per_neighbour(world):
    with pytest.raises(SfgError, match="lockstep node cannot know whom to wait for"):
        NodeConfig(mode="lockstep", peers="online:s=2")
    with pytest.raises(SfgError, match="lockstep node cannot know whom to wait for"):
        Node(build_world({**SMALL, "rule": "sfg-cut"}), 0, NodeConfig(mode="lockstep",
                                                                      peers="online:s=2"))
    with pytest.raises(SfgError, match="per neighbour|q̂"):
        Node(build_world({**SMALL, "rule": "dfl-aa"}), 0,
             NodeConfig(mode="async", peers="epidemic:s=2"))
    with pytest.raises(SfgError, match="below the number of devices"):
        Node(world, 0, NodeConfig(mode="async", peers="epidemic:s=5"))


def test_sfg_node_refuses_online_under_lockstep_with_one_line(tmp_path):
    peers = tmp_path / "peers.yaml"
    peers.write_text("nodes: {0: 127.0.0.1:7001, 1: 127.0.0.1:7002, 2: 127.0.0.1:7003}\n")
    out = subprocess.run([sys.executable, "-m", "sfg.cli.main", "node", "--id", "0",
                          "--listen", "127.0.0.1:7001", "--peer-file", str(peers),
                          "--peers", "online:s=1", "--protocol", "lockstep",
                          "--graph", "ring:k=1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "lockstep" in lines[0]
    assert "Traceback" not in out.stderr


def test_a_nodes_table_is_its_row_of_the_engines_tables(world):
    """The node's table (its row, held alone) changes exactly as that row of the tables the
    engines hold under the same heard sequence (sfg.world.peers.hear, one definition)."""
    from sfg.world.peers import hear, new_tables, parse_peers, tie_key

    peers = parse_peers("online:s=2,view=3,gossip=2")
    full = new_tables(peers, world.seed, world.graph)
    m = Membership(peers, world, 2, longest=100.0)
    tk = np.uint64(tie_key(world.seed))
    rng = np.random.default_rng(0)
    for _ in range(60):
        j, t = int(rng.integers(world.n)), float(rng.integers(0, 40))  # ties too
        hear(tk, 2, j, t, *full)
        hear(tk, 2, j, t, *m.tables)
        assert m.row() == [(int(a), float(b)) for a, b in
                           zip(full[0][2, :full[3][2]], full[1][2, :full[3][2]], strict=True)]


def test_real_swarm_stores_its_peers_setting(tmp_path, capsys):
    """`sfg swarm --peers … --store` on real nodes: the setting is the run's, so the stored
    settings and run id carry it (one run per peers value), and the peer counts are there."""
    from sfg.cli.main import main
    from sfg.experiments.store import records

    store = str(tmp_path / "runs.sqlite")
    code = main(["swarm", "--nodes", "4", "-T", "4", "-p", "iid:u=0.2", "-K", "1",
                 "--graph", "ring:k=1", "--mode", "async", "--period", "0.25", "--procs", "0",
                 "--peers", "epidemic:s=2", "--store", store, "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    got = json.loads(cap.out)
    assert got["config"]["peers"] == "epidemic:s=2"
    assert got["metrics"]["peer_messages_per_device_hour"] > 0
    runs = records(store)
    assert [r["config"]["peers"] for r in runs] == ["epidemic:s=2"]
    assert runs[0]["run_id"] == got["run_id"]
