"""Returns in the real node (docs/concepts/nodes.md#returns-in-the-node): a returning
async node pulls its neighbours' latest sent models over gRPC on 127.0.0.1 before it trains.
Assertions count events, never wall time; every run is bounded."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.net import asyncmode, inbox, returns
from sfg.net.node import Node, NodeConfig
from sfg.net.swarm import run_nodes, summarise
from sfg.net.transport import Server
from sfg.net.wire import (
    Layout,
    check_message,
    encode_params,
    make_header,
    pack_held,
    payload_digest,
    unpack_held,
)
from sfg.net.world import build_world

P = 0.4   # the round period (wall seconds); training a round takes a few ms here
S = 0.25  # the pull's longest wait, below P
# a small world with outages: six nodes, short rounds of a tiny model (the period is the run's
# setting: the pull's wait is checked against it)
CHURN = dict(n_clients=6, rounds=12, local_steps=2, batch_size=8, graph="ring:k=1",
             process="iid:u=0.5", rule="sfg-cut", seed=2, eval_every=12, nodes="real",
             protocol="async", period=P)


def _swarm(world, make_config, timeout=60.0):
    nodes: list[Node] = []
    res = asyncio.run(asyncio.wait_for(run_nodes(world, range(world.n), make_config,
                                                 nodes_out=nodes), timeout))
    return sorted(res, key=lambda r: r["node"]), sorted(nodes, key=lambda n: n.i)


def _returns_in_trace(world) -> int:
    """Returns the trace holds: an online row after an offline one (not the run's start)."""
    A = world.available
    return int((A[1:] & ~A[:-1]).sum())


# ------------------------------------------------------------------ (1) a swarm under churn
def test_async_swarm_with_pull_hears_its_neighbours_at_returns_and_none_asks_nothing():
    world = build_world({**CHURN, "on_return": f"pull:timeout={S}"})
    assert _returns_in_trace(world) >= 6
    res, nodes = _swarm(world, lambda i: NodeConfig(mode="async", period=P, linger=0.2))
    assert all(n.cfg.pull_timeout == S for n in nodes)  # taken from the run's on_return
    m = summarise(world, res, wall=1.0)["metrics"]
    assert m["returns"] == _returns_in_trace(world)
    deg = {n.i: len(n.nbrs) for n in nodes}
    # every return asks every neighbour once
    per_node = [r["returns"] for r in res]
    assert all(x["requests"] == x["returns"] * deg[r["node"]] for x, r in zip(per_node, res,
                                                                            strict=True))
    assert m["pull_requests_made"] > 0
    answered = m["pull_replies_delivered"] + m["pull_empty_received"] + m["pull_unreachable_received"]
    assert m["pull_replies_delivered"] > 0 and answered <= m["pull_requests_made"]
    assert m["pull_rejected"] == 0 and m["rejected"] == 0
    assert m["wire_pull_bytes_received"] > 0 and m["pull_wait_seconds"] >= 0
    assert 0 < m["returns_heard"] <= m["returns"]
    assert m["returns_unanswered"] <= m["returns"]
    # the nodes that answered with a message: as many as the replies received
    assert sum(n.stats.answered_pulls for n in nodes) >= m["pull_replies_delivered"]

    # on_return none: the same world's returns, no request at all
    world0 = build_world(CHURN)
    res0, nodes0 = _swarm(world0, lambda i: NodeConfig(mode="async", period=P, linger=0.2))
    m0 = summarise(world0, res0, wall=1.0)["metrics"]
    assert m0["returns"] == m["returns"]
    assert "pull_requests" not in m0
    assert all(n.stats.requests == 0 and n.stats.answered_pulls == 0 for n in nodes0)


def test_sfg_swarm_passes_on_return_to_its_worker_processes(tmp_path, capsys):
    """`sfg swarm --protocol async --on-return pull:timeout=S --json`: the nodes in the worker
    process take the run's on_return, and the summary holds their counts."""
    import json

    from sfg.cli.main import main

    code = main(["swarm", "--nodes", "6", "-T", "10", "-p", "iid:u=0.5", "-r", "sfg-cut",
                 "--graph", "ring:k=1", "--eval-every", "10", "--protocol", "async",
                 "--period", "0.3", "--on-return", "pull:timeout=0.2", "--procs", "1",
                 "--workdir", str(tmp_path / "w"), "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    res = json.loads(cap.out)
    m = res["metrics"]
    assert res["config"]["on_return"] == "pull:timeout=0.2"
    assert m["returns"] > 0 and m["pull_requests_made"] == 2 * m["returns"]
    assert m["pull_replies_delivered"] + m["pull_empty_received"] + m["pull_unreachable_received"] <= m["pull_requests_made"]
    assert sum(n["returns"]["requests"] for n in res["nodes"]) == m["pull_requests_made"]


# ------------------------------------------------------------------ (2) crash and restart
def test_a_node_restarted_while_online_makes_a_return_and_pulls(tmp_path):
    """Node 2 of four (no outages in the trace) crashes after its round 3 — its run is
    cancelled and its server closed, as a SIGKILL leaves it — and a new node 2 resumes from its
    checkpoint on the same port while the others run on: the restart is its one return, and
    it asks both neighbours, which answer with the models they last sent."""
    import time

    world = build_world({**CHURN, "process": "none", "n_clients": 4, "rounds": 12,
                         "on_return": "pull:timeout=0.4"})
    period = 0.5
    crashed = asyncio.Event()

    def on_round(i, r, available, acc):
        if i == 2 and r >= 3:
            crashed.set()

    def config(**kw):
        return NodeConfig(mode="async", period=period, linger=0.3, checkpoint_dir=tmp_path,
                          on_round=on_round, **kw)

    async def go():
        nodes = [Node(world, i, config()) for i in range(world.n)]
        back = None
        try:
            ports = {n.i: await n.start() for n in nodes}
            addresses = {i: f"127.0.0.1:{p}" for i, p in ports.items()}
            for n in nodes:
                n.connect(addresses)
            t0 = time.time() + 0.2
            for n in nodes:
                n.t0 = t0
            runs = {n.i: asyncio.ensure_future(n.run()) for n in nodes}
            await asyncio.wait_for(crashed.wait(), 30)
            runs[2].cancel()  # the crash
            await asyncio.gather(runs[2], return_exceptions=True)
            await nodes[2].close()
            back = Node(world, 2, config(resume=True, port=ports[2], t0=t0))
            await back.start()
            back.connect(addresses)
            res2 = await back.run()
            others = await asyncio.gather(*(runs[i] for i in (0, 1, 3)))
        finally:
            for n in [*nodes, *([back] if back else [])]:
                await n.close()
        return res2, others

    res2, others = asyncio.run(asyncio.wait_for(go(), 60))
    got = res2["returns"]
    assert res2["restored"] is not None and res2["restored"]["round"] >= 4
    assert got["returns"] == 1 and got["requests"] == 2
    assert got["replies"] >= 1 and got["replies"] + got["empty"] + got["unreachable"] <= 2
    assert got["rejected"] == 0 and got["returns_heard"] == 1
    assert all(r["returns"]["returns"] == 0 and r["returns"]["requests"] == 0 for r in others)
    assert sum(r["returns"]["answered"] for r in others) >= got["replies"]


# ------------------------------------------------------------------ (3), (4) the candidates
@pytest.fixture(scope="module")
def node():
    world = build_world({**CHURN, "process": "none", "graph": "ring:k=1"})
    return Node(world, 0, NodeConfig(mode="async", period=0.5, window=1.0, pull_timeout=0.3))


def _msg(node, sender, round, age, lag, x=None):
    x = node.world.x0 if x is None else x
    payload = bytes(encode_params(x, node.layout))
    raw = make_header(payload_digest(payload), sender=sender, round=round, age=age, lag=lag,
                      count=3, local_count=2)
    return check_message(raw, payload, node.layout, neighbours=node.nbr_set), raw, payload


def test_a_replys_waited_staleness_starts_at_its_sending(node):
    """d = (held + now − arrival)/P; the window applies to the arrival."""
    j, k = (int(v) for v in node.nbrs)
    m, _, _ = _msg(node, j, round=5, age=2, lag=2.5)
    mk, _, _ = _msg(node, k, round=5, age=1, lag=1.0)
    node.latest, node.held = {j: (m, 10.0), k: (mk, 10.0)}, {j: 0.35}
    senders, _, ages, lags = asyncmode.candidates(node, 7, 10.3)
    got = dict(zip(senders, zip(ages, lags, strict=True), strict=True))
    # j: d = (0.35 + 0.3)/0.5 = 1.3 → age 2 + 1, lag 2.5 + 1.3
    assert got[j][0] == 3 and got[j][1] == pytest.approx(3.8, abs=1e-12)
    # k, an ordinary message: d = 0.3/0.5 = 0.6 → age 1 + 0, lag 1.6
    assert got[k][0] == 1 and got[k][1] == pytest.approx(1.6, abs=1e-12)
    # a long-held reply that arrived within the window is a candidate, much older
    node.latest, node.held = {j: (m, 10.0)}, {j: 5.0}
    senders, _, ages, lags = asyncmode.candidates(node, 7, 10.3)
    assert senders == [j] and ages == [2 + 10] and lags[0] == pytest.approx(2.5 + 10.6)
    # one that arrived more than W periods ago is none, held or not
    node.latest, node.held = {j: (m, 10.0), k: (mk, 10.0)}, {k: 0.1}
    assert asyncmode.candidates(node, 7, 10.6)[0] == []


def test_a_reply_not_newer_than_what_is_held_changes_nothing(node):
    j = int(node.nbrs[0])
    node.latest, node.held = {}, {}
    node.stats.replies_unused = 0
    pushed, _, _ = _msg(node, j, round=6, age=0, lag=0.0)
    inbox.accept(node, pushed, 100)
    held = node.latest[j]
    for r in (6, 5):  # as old as, or older than, the message held
        reply, _, _ = _msg(node, j, round=r, age=4, lag=9.0, x=node.world.x0 + 1)
        inbox.accept(node, reply, 100, held=0.1)
        assert node.latest[j] is held and j not in node.held
    assert node.stats.replies_unused == 2
    newer, _, _ = _msg(node, j, round=7, age=1, lag=1.0)
    inbox.accept(node, newer, 100, held=0.2)
    assert node.latest[j][0] is newer and node.held[j] == 0.2
    # a push of the same round replaces the reply, waiting from its own arrival
    push7, _, _ = _msg(node, j, round=7, age=1, lag=1.0)
    inbox.accept(node, push7, 100)
    assert node.latest[j][0] is push7 and j not in node.held


# ------------------------------------------------------------------ (5) a bad reply
def test_forged_oversized_and_misshapen_replies_are_rejected_and_counted():
    """A neighbour's server that answers pulls with what a test hands it: every bad reply is
    rejected by the wire checks (over real gRPC on 127.0.0.1), counted, and changes nothing."""
    world = build_world({**CHURN, "process": "none"})
    me = Node(world, 0, NodeConfig(mode="async", period=1.0, pull_timeout=0.5))
    j, k = (int(v) for v in me.nbrs)
    x = world.x0
    payload = bytes(encode_params(x, me.layout))

    def header(sender=j, digest=None, round=3):
        return make_header(digest or payload_digest(payload), sender=sender, round=round,
                           age=0, lag=0.0, count=1, local_count=1)

    lay = me.layout
    wrong = Layout(lay.names, tuple((*s[:-1], s[-1] + 1) if n == 0 else s
                                    for n, s in enumerate(lay.shapes)))
    bad_shape = bytes(encode_params(np.zeros(wrong.D, np.float32), wrong))
    nan = bytes(encode_params(np.full_like(x, np.nan), lay))
    cases = {
        "other sender": ((header(sender=k), payload, 0.1), "header"),
        "non-neighbour": ((header(sender=3), payload, 0.1), "non-neighbour"),
        "digest": ((header(digest=payload_digest(nan)), payload, 0.1), "digest"),
        "oversize": ((header(digest=(b"\0" * 32, 1 << 40)), payload, 0.1), "oversize"),
        "shape": ((header(digest=payload_digest(bad_shape)), bad_shape, 0.1), "shape"),
        "non-finite": ((header(digest=payload_digest(nan)), nan, 0.1), "non-finite"),
        "negative held": ((header(), payload, -1.0), "header"),
    }
    answer: dict = {}

    async def go():
        srv = Server(lambda *a: None, lambda t, who: None, max_bytes=me.cfg.max_bytes,
                     pull=lambda who: answer["reply"])
        port = await srv.start("127.0.0.1", 0)
        me.connect({j: f"127.0.0.1:{port}", k: f"127.0.0.1:{port}"})
        out = {}
        try:
            for name, (reply, _) in cases.items():
                answer["reply"] = reply
                out[name] = await returns.pull_one(me, j, 2.0)
            answer["reply"] = (header(), payload, 0.1)  # a good one is taken
            out["good"] = await returns.pull_one(me, j, 2.0)
        finally:
            await me.close()
            await srv.stop()
        return out

    out = asyncio.run(asyncio.wait_for(go(), 60))
    assert {n: out[n] for n in cases} == dict.fromkeys(cases, "")
    assert out["good"] == "reply" and me.stats.replies == 1
    assert me.stats.pull_rejected == len(cases)
    want: dict[str, int] = {}
    for _, reason in cases.values():
        want[reason] = want.get(reason, 0) + 1
    assert me.rejections.as_dict() == want
    assert list(me.latest) == [j] and me.held[j] == pytest.approx(0.1)


@pytest.mark.parametrize("offline_then", [False, True])
def test_a_reply_after_the_window_is_kept_as_a_later_candidate(offline_then):
    """The window ends at S without neighbour j's answer (its server holds the reply back
    until the test lets it go, after the window); the call goes on, and the reply, when it
    comes, is an ordinary candidate with its held (as on the clock) — or lost, if the node
    is offline by then. Neighbour k is not running: unreachable. Over real gRPC on
    127.0.0.1; no wall-time assertion (rounds of 100 s)."""
    import socket
    import threading

    world = build_world({**CHURN, "process": "none"})
    me = Node(world, 0, NodeConfig(mode="async", period=100.0, pull_timeout=0.2,
                                   rpc_timeout=20.0))
    j, k = (int(v) for v in me.nbrs)
    payload = bytes(encode_params(world.x0, me.layout))
    reply = (make_header(payload_digest(payload), sender=j, round=3, age=0, lag=0.0, count=1,
                         local_count=1), payload, 0.1)
    gate, asked = threading.Event(), threading.Event()

    def answer(who):  # the server's own thread: hold the reply until the gate opens
        asked.set()
        gate.wait(20)
        return reply

    loop = asyncio.new_event_loop()
    srv = Server(lambda *a: None, lambda t, who: None, max_bytes=me.cfg.max_bytes, pull=answer)
    port = loop.run_until_complete(srv.start("127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with socket.socket() as sk:  # a port nobody listens on: node k is not running
        sk.bind(("127.0.0.1", 0))
        dead = sk.getsockname()[1]

    async def go():
        me.connect({j: f"127.0.0.1:{port}", k: f"127.0.0.1:{dead}"})
        try:
            await returns.pull_at(me, me.clock.time())
            in_window = (dict(me.latest), me.stats.replies, me.stats.unreachable)
            if offline_then:  # from now on, row 0 of the node's trace, where it is offline
                world.available[0, 0] = False
                me.t0 = me.clock.time()
            gate.set()
            await asyncio.wait(me.backlog, timeout=20)
            return in_window, asked.is_set()
        finally:
            gate.set()
            await me.close()

    try:
        (latest, replies, unreachable), was_asked = asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)
    assert was_asked and latest == {} and replies == 0 and unreachable == 1
    if offline_then:
        assert me.stats.pull_lost == 1 and me.stats.replies == 0 and me.latest == {}
    else:
        assert me.stats.replies == 1 and list(me.latest) == [j] and me.stats.pull_lost == 0
        assert me.held[j] == pytest.approx(0.1)


def test_held_preamble_checks():
    assert unpack_held(pack_held(1.5)) == 1.5
    from sfg.net.wire import Rejected

    for bad in (pack_held(float("nan")), pack_held(-0.1), pack_held(1e9), b"\xc1",
                b"\x81\xa4held\xa1x", b"x" * 100):
        with pytest.raises(Rejected):
            unpack_held(bad)


# ------------------------------------------------------------------ (6) refusals
def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.err


@pytest.mark.parametrize("args,needle", [
    (["swarm", "--protocol", "lockstep", "--on-return", "pull:timeout=0.1"], "lockstep"),
    (["swarm", "--protocol", "async", "--on-return", "pull"], "below the period"),
    (["swarm", "--protocol", "async", "--on-return", "pull:timeout=0.1", "--record-log",
      "x.jsonl"], "--record-log"),
    (["swarm", "--protocol", "async", "--on-return", "pull:timeout=0.1", "-r",
      "sfg-cut+certified"], "+certified"),
    (["swarm", "--protocol", "lockstep", "--on-return", "pull:timeout=60", "--clock",
      "virtual"], "lockstep"),
    (["swarm", "--protocol", "async", "--on-return", "pull:timeout=900", "--clock",
      "virtual", "--period", "600"], "period P"),
    (["swarm", "--protocol", "async", "--on-return", "pull:wait=3"], "unknown parameter"),
    (["run", "--on-return", "pull:timeout=0.1"], "engine rounds"),
])
def test_pull_where_it_does_not_run_is_one_line_and_exit_2(args, needle, capsys):
    code, err = _cli([*args, "-n", "8", "-T", "20"], capsys)
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in err, err


def test_node_config_refuses_pull_in_lockstep_and_at_or_above_the_period():
    with pytest.raises(SfgError, match="lockstep"):
        NodeConfig(mode="lockstep", pull_timeout=0.1)
    with pytest.raises(SfgError, match="below the period"):
        NodeConfig(mode="async", period=0.2, pull_timeout=0.2)


def test_with_tls_a_pull_reply_comes_only_from_the_neighbour_its_certificate_names(tmp_path):
    """With mutual TLS the pull's channel accepts only the certificate naming the neighbour
    asked: a swarm node serving at that neighbour's address with its own (valid) certificate
    is refused (``identity``, counted); the neighbour itself is heard."""
    from sfg.net.tls import make_test_ca
    from sfg.net.transport import TlsFiles

    ca = make_test_ca(tmp_path / "ca", range(6))
    world = build_world({**CHURN, "process": "none"})
    me = Node(world, 0, NodeConfig(mode="async", period=1.0, pull_timeout=0.5,
                                   tls=TlsFiles.load(ca, 0)))
    j, k = (int(v) for v in me.nbrs)
    payload = bytes(encode_params(world.x0, me.layout))
    raw = make_header(payload_digest(payload), sender=j, round=2, age=0, lag=0.0, count=1,
                      local_count=1)

    async def answer(as_node):
        srv = Server(lambda *a: None, lambda t, who: None, max_bytes=me.cfg.max_bytes,
                     tls=TlsFiles.load(ca, as_node), pull=lambda who: (raw, payload, 0.1))
        port = await srv.start("127.0.0.1", 0)
        me.connect({j: f"127.0.0.1:{port}", k: f"127.0.0.1:{port}"})
        try:
            return await returns.pull_one(me, j, 5.0)
        finally:
            for p in me.peers.values():
                await p.close()
            await srv.stop()

    impostor = asyncio.run(asyncio.wait_for(answer(3), 60))
    genuine = asyncio.run(asyncio.wait_for(answer(j), 60))
    assert impostor == "" and me.rejections.as_dict() == {"identity": 1}
    assert genuine == "reply" and me.stats.replies == 1 and list(me.latest) == [j]
