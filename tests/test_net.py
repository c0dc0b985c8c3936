"""Networked nodes (docs/concepts/nodes.md#networked-nodes): lockstep equals the simulator, async learns, crashes recover,
TLS keeps strangers out. Real gRPC servers on 127.0.0.1 only; every run is bounded in time."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from crosspath import assert_same_bits

from sfg.net import localround, lockstep, outgoing
from sfg.net.cuts import Cut
from sfg.net.node import Node, NodeConfig
from sfg.net.swarm import SwarmOptions, run_nodes, run_swarm, summarise
from sfg.net.world import build_world

LOCKSTEP = dict(n_clients=8, rounds=20, process="bursty:u=0.8", rule="sfg-cut", model="mlp",
                dataset="digits", seed=1, eval_every=5)


def _run(world, make_config, timeout=300.0):
    nodes: list[Node] = []
    res = asyncio.run(asyncio.wait_for(run_nodes(world, range(world.n), make_config,
                                                 nodes_out=nodes), timeout))
    return sorted(res, key=lambda r: r["node"]), sorted(nodes, key=lambda n: n.i)


# ------------------------------------------------------------------ lockstep (docs/concepts/nodes.md#lockstep-mode)
def test_lockstep_swarm_equals_the_loop_simulator():
    from sfg.sim.run import simulate

    sim = simulate(LOCKSTEP, backend="loop")
    world = build_world(LOCKSTEP)
    res, nodes = _run(world, lambda i: NodeConfig(mode="lockstep", deadline=60))
    X = np.stack([n.x for n in nodes])
    assert_same_bits(X, sim.params.numpy())
    assert [r["acc"] for r in res] == pytest.approx(sim.accuracy.tolist(), abs=0)
    assert [r["state"]["age"] for r in res] == sim.state.ages.tolist()
    assert [r["state"]["lag"] for r in res] == pytest.approx(sim.state.lags.tolist(), abs=1e-12)
    assert [r["state"]["count"] for r in res] == sim.state.counts.tolist()
    out = summarise(world, res, wall=1.0)
    for key in ("acc_mean", "acc_p10", "acc_time_avg", "messages", "scalars",
                "local_steps_rel", "unavailability", "acc_q1", "acc_q4"):
        assert out["metrics"][key] == pytest.approx(sim.metrics[key], abs=1e-9), key
    assert out["curves"]["acc_mean"] == pytest.approx(sim.curves["acc_mean"], abs=1e-9)
    assert out["metrics"]["rejected"] == 0 and out["metrics"]["messages"] > 0


def test_lockstep_partition_cuts_exactly_the_scheduled_links():
    cfg = {**LOCKSTEP, "process": "none", "rounds": 6, "eval_every": 6}
    world = build_world(cfg)
    part = Cut.parse_rounds("0,1,2,3|4,5,6,7@2-3")
    res, nodes = _run(world, lambda i: NodeConfig(mode="lockstep", partitions=(part,),
                                                  record_headers=True))
    heads = [h for n in nodes for h in n.headers]
    crossing = [h for h in heads if part.blocks(h["sender"], h["receiver"], 2)]
    assert crossing and all(h["round"] not in (2, 3) for h in crossing)
    assert {h["round"] for h in heads} == set(range(6))
    deg = sum(len(world.neighbours(i)) for i in range(8))
    cut = sum(1 for a, b in world.graph.edges if part.blocks(int(a), int(b), 2))
    assert summarise(world, res, wall=0)["metrics"]["messages"] == 6 * deg - 2 * 2 * cut


# ------------------------------------------------------------------ async (docs/concepts/nodes.md#asynchronous-mode)
ASYNC = dict(n_clients=16, rounds=30, local_steps=5, process="bursty:u=0.8", seed=3,
             eval_every=10)


def _async_period() -> float:
    """A round period measured on this machine, now: the wall time of a whole round of the
    same 16 nodes in this one process (every node available, training, sending to and
    receiving from all its neighbours — the most work an async round can hold), from a short
    lockstep run after warm-up, times 3. Waiting then reflects the protocol, not a loaded
    test machine (a 2-core CI runner, other tests); no fixed period is assumed."""
    import time

    world = build_world({**ASYNC, "rule": "sfg-cut", "rounds": 4, "process": "none",
                         "eval_every": 4})
    stamps: list[float] = []

    def on_round(i, r, available, acc):
        if i == 0:
            stamps.append(time.perf_counter())

    _run(world, lambda i: NodeConfig(mode="lockstep", deadline=120, on_round=on_round),
         timeout=300)
    per_round = max(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    return max(0.1, 3 * per_round)


def _async_run(rule: str, period: float):
    # W = 1.5 periods: with start jitter up to 0.2·P a neighbour's last message may be a
    # little over one period old at the next round start; it still counts (aged by ⌊d⌋).
    # The time-out allows every round 10 periods.
    world = build_world({**ASYNC, "rule": rule})
    return world, _run(world, lambda i: NodeConfig(mode="async", period=period, jitter=0.2,
                                                   window=1.5, record_headers=True, linger=0.2),
                       timeout=60 + 10 * period * world.rounds)


def test_async_sfg_cut_learns_better_than_local_training_on_the_virtual_clock():
    """The learning comparison runs the node code on the virtual clock (the same async
    protocol, with time simulated): its outcome does not depend on how loaded the machine
    is, and the same seed gives the same accuracies every run."""
    from sfg.net.virtual import run_virtual_swarm

    opts = SwarmOptions(mode="async", period=600.0, jitter=0.2, window=1.5)
    acc = {rule: run_virtual_swarm(build_world({**ASYNC, "rule": rule}), opts)["metrics"]
           ["acc_mean"] for rule in ("sfg-cut", "local")}
    assert acc["sfg-cut"] > acc["local"] + 0.05, acc


def test_async_sfg_cut_over_grpc_exchanges_models_and_scalars_obey_spec():
    """The real-time async run over gRPC: models cross, nothing is rejected, every header
    and final state obeys docs/concepts/staleness.md#the-staleness-state (no learning comparison here: that one is on the virtual
    clock, above)."""
    period = _async_period()
    world, (res_cut, nodes) = _async_run("sfg-cut", period)
    heads = [h for n in nodes for h in n.headers]
    assert len(heads) > 50
    for h in heads:
        assert h["lag"] >= 0 and h["age"] >= 0 and h["age"] <= h["lag"] + 1e-9, h
        assert h["receiver"] in world.neighbours(h["sender"])
    for r in res_cut:  # final states too
        assert 0 <= r["state"]["age"] <= r["state"]["lag"] + 1e-9
        assert r["rejected"] == {}
    assert sum(r["messages"] for r in res_cut) > 0


# ------------------------------------------------------------------ crash and restart
def test_sigkilled_node_restarts_from_checkpoint_with_missed_rounds_added(tmp_path, capsys):
    """`sfg swarm --mode async --kill 2@4 --json --store`: the run completes, node 2 restarts
    from its checkpoint with age and lag grown by exactly the rounds it missed, and the JSON
    has the metric fields of `sfg run --json` plus the swarm's own; the store holds the run."""
    from sfg.experiments.store import Store

    code, out, err = _cli(["swarm", "--nodes", "4", "-T", "30", "-p", "iid:u=0.2", "-r",
                           "sfg-cut", "--graph", "ring:k=1", "--eval-every", "10", "--mode",
                           "async", "--period", "0.25", "--procs", "2", "--kill", "2@4",
                           "--workdir", str(tmp_path / "w"), "--store",
                           str(tmp_path / "r.sqlite"), "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    m = res["metrics"]
    for key in ("acc_mean", "acc_p10", "acc_time_avg", "acc_q1", "acc_q4", "messages",
                "scalars", "local_steps_rel", "unavailability"):  # as `sfg run --json`
        assert isinstance(m[key], float), key
    for key in ("wall_seconds", "rejected", "restarts", "bytes", "rss_mb_per_node"):
        assert isinstance(m[key], float), key
    assert m["restarts"] == 1
    # the only rejection a SIGKILL may cause: a model its sender was streaming when it died
    reasons = {r for n in res["nodes"] for r in n["rejected"]}
    assert reasons <= {"truncated"}, reasons
    node2 = next(n for n in res["nodes"] if n["node"] == 2)
    rest = node2["restored"]
    assert rest is not None and rest["round"] >= 5 and rest["missed"] >= 1
    assert rest["age_after"] == rest["age"] + rest["missed"]
    assert rest["lag_after"] == pytest.approx(rest["lag"] + rest["missed"])
    assert len(res["nodes"]) == 4 and all(n["restored"] is None for n in res["nodes"]
                                          if n["node"] != 2)
    assert all(0 <= n["age"] <= n["lag"] + 1e-9 for n in res["nodes"])
    ckpt = tmp_path / "w" / "checkpoints"
    assert (ckpt / "node-2.safetensors").is_file()
    assert not [p for p in ckpt.iterdir() if ".tmp" in p.name]
    with Store(tmp_path / "r.sqlite") as st:
        (rec,) = st.records()
    assert rec["run_id"] == res["run_id"]
    assert rec["metrics"]["acc_mean"] == pytest.approx(m["acc_mean"])


def test_lockstep_survives_a_sigkill_and_still_equals_the_simulator(tmp_path):
    """The restarted node resumes from its checkpoint; its neighbours keep (and serve) the
    messages it needs until they hear from it again, so no round is lost."""
    from sfg.sim.run import simulate

    cfg = dict(n_clients=4, rounds=12, process="iid:u=0.25", rule="sfg-cut", seed=1,
               eval_every=4, graph="ring:k=1")
    sim = simulate(cfg, backend="loop")
    out = run_swarm(build_world(cfg), SwarmOptions(mode="lockstep", procs=2, kills=[(2, 5)],
                                                   deadline=180, workdir=str(tmp_path)))
    assert out["metrics"]["restarts"] == 1
    node2 = next(n for n in out["nodes"] if n["node"] == 2)
    assert node2["restored"] is not None and node2["restored"]["missed"] == 0
    assert [n["acc"] for n in out["nodes"]] == sim.accuracy.tolist()
    assert [n["age"] for n in out["nodes"]] == sim.state.ages.tolist()


# ------------------------------------------------------------------ TLS
def test_tls_node_with_certificate_from_another_ca_cannot_deliver(tmp_path):
    from sfg.net.tls import make_test_ca
    from sfg.net.transport import Peer, TlsFiles
    from sfg.net.wire import encode

    make_test_ca(tmp_path / "swarm", range(4))
    make_test_ca(tmp_path / "other", range(4))
    world = build_world(dict(n_clients=4, rounds=4, graph="ring:k=1", process="none",
                             eval_every=4))
    h, p = encode(world.x0 + 1, world.layout, sender=1, round=1, age=0, lag=0.0, count=2,
                  local_count=2)

    async def main():
        node = Node(world, 0, NodeConfig(mode="async", tls=TlsFiles.load(tmp_path / "swarm", 0)))
        port = await node.start()
        replies = []
        for ca, who in (("other", 1), ("swarm", 3), ("swarm", 1)):
            peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 26,
                        tls=TlsFiles.load(tmp_path / ca, who))
            replies.append(await peer.deliver(h, p, timeout=30, retries=1))
            if not replies[-1][0]:
                assert not node.latest  # nothing got in
            await peer.close()
        await node.close()
        return node, replies

    node, replies = asyncio.run(asyncio.wait_for(main(), 180))
    assert replies[0] == (False, "UNAVAILABLE")        # handshake refused: wrong CA
    assert replies[1] == (False, "identity")           # node-3's certificate, header says 1
    assert replies[2] == (True, "")                    # the real node 1
    assert node.rejections.as_dict() == {"identity": 1}


# ------------------------------------------------------------------ CLI
def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("args,needle", [
    (["swarm", "--protocol", "sideways", "-n", "8", "-T", "20"], "lockstep or async"),
    (["swarm", "--crash", "3", "-n", "8", "-T", "20"], "NODE@ROUND"),
    (["swarm", "--crash", "9@2r", "-n", "8", "-T", "20"], "does not exist"),
    (["swarm", "--cut", "0,1|1,2@3r-4r", "-n", "8", "-T", "20"], "disjoint"),
    (["swarm", "--rule", "model-memory", "-n", "8", "-T", "20"], "staleness scalars"),
    (["swarm", "--tls-dir", "/nonexistent", "-n", "8", "-T", "20"], "sfg tls-ca"),
])
def test_swarm_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    code, _, err = _cli(args, capsys)
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in err, err


def test_swarm_whose_worker_fails_exits_1_with_one_error_line(tmp_path, capsys):
    """Certificates for nodes 0-1 only: the worker holding nodes 2-3 fails; the swarm stops
    the other worker at once and reports the worker's error (exit status 1)."""
    from sfg.net.tls import make_test_ca

    make_test_ca(tmp_path / "ca", range(2))
    code, _, err = _cli(["swarm", "--nodes", "4", "-T", "20", "-p", "none", "--graph",
                         "ring:k=1", "--procs", "2", "--tls-dir", str(tmp_path / "ca"),
                         "--deadline", "60"], capsys)
    assert code == 1, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: swarm failed:")
    assert "node-2.pem" in err or "node-3.pem" in err


def test_node_cli_checks_peers_file(tmp_path, capsys):
    peers = tmp_path / "peers.yaml"
    peers.write_text("nodes: {0: 127.0.0.1:1, 2: 127.0.0.1:2}\n")
    code, _, err = _cli(["node", "--id", "0", "--listen", "127.0.0.1:0", "--peer-file", str(peers)],
                        capsys)
    assert code == 2 and "0..N-1" in err
    code, _, err = _cli(["node", "--id", "0", "--listen", "nowhere", "--peer-file", str(peers)],
                        capsys)
    assert code == 2 and "error:" in err


def run_two_nodes(tmp_path, args: list[str]) -> list[dict]:
    """Two `sfg node` processes on 127.0.0.1 that find each other through a peers.yaml
    (nodes 0 and 1, one edge), with ``args``; their JSON results (each must exit 0)."""
    import subprocess
    import sys

    from sfg.net.swarm import free_ports

    p0, p1 = free_ports(2)
    peers = tmp_path / "peers.yaml"
    peers.write_text(f"nodes:\n  0: 127.0.0.1:{p0}\n  1: 127.0.0.1:{p1}\nedges: [[0, 1]]\n")
    common = ["--peer-file", str(peers), "--json", "--deadline", "240", *args]
    procs = [subprocess.Popen([sys.executable, "-m", "sfg.cli.main", "node", "--id", str(i),
                               "--listen", f"127.0.0.1:{port}", *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, port in ((0, p0), (1, p1))]
    outs = [p.communicate(timeout=400) for p in procs]
    for p, (_, e) in zip(procs, outs, strict=True):
        assert p.returncode == 0, e
    return [json.loads(o) for o, _ in outs]


def test_node_cli_runs_two_nodes_from_a_peers_file(tmp_path):
    """Two `sfg node` processes on 127.0.0.1 that find each other through peers.yaml."""
    res = run_two_nodes(tmp_path, ["-T", "5", "-p", "none", "--rule", "dfedavg",
                                   "--eval-every", "5"])
    assert [r["messages"] for r in res] == [5, 5]      # one model from the other each round
    assert all(r["state"]["age"] == 0 and r["state"]["t"] == 5 for r in res)


def test_tls_ca_command_writes_a_ca_and_node_certificates(tmp_path, capsys):
    code, out, err = _cli(["tls-ca", "--dir", str(tmp_path / "ca"), "--nodes", "3"], capsys)
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "ca").iterdir())
    assert names == ["ca.pem", "node-0", "node-1", "node-2"]   # one bundle per node
    names = sorted(p.name for p in (tmp_path / "ca" / "node-1").iterdir())
    assert names == ["ca.pem", "node-0.pem", "node-1.key", "node-1.pem", "node-1.sign",
                     "node-2.pem"]
    assert oct((tmp_path / "ca" / "node-1" / "node-1.sign").stat().st_mode & 0o777) == "0o600"


def test_store_writes_an_in_process_swarm_run_into_the_results_store(tmp_path):
    from sfg.cli.net import _store
    from sfg.experiments.config import make_config, run_id
    from sfg.experiments.store import Store

    world = build_world({**LOCKSTEP, "rounds": 10, "process": "none", "eval_every": 5})
    res, _ = _run(world, lambda i: NodeConfig(mode="lockstep"))
    out = summarise(world, res, wall=2.0)
    rid = _store(str(tmp_path / "r.sqlite"), make_config({**world.cfg, "nodes": "real"}), out)
    with Store(tmp_path / "r.sqlite") as st:
        (rec,) = st.records()
        curves = st.curves(rid)
    assert rec["rule"] == "sfg-cut" and rec["config"]["nodes"] == "real"
    assert rid == run_id(make_config(rec["config"]))  # the run's own identity
    assert rec["metrics"]["acc_mean"] == pytest.approx(out["metrics"]["acc_mean"])
    assert rec["metrics"]["rejected"] == 0.0
    assert curves[rid]["acc_mean"] == pytest.approx(out["curves"]["acc_mean"])


# ------------------------------------------------------------------ forged claims
FORGE = dict(n_clients=6, rounds=10, process="iid:u=0.5", rule="sfg-cut", model="mlp",
             dataset="digits", seed=1, eval_every=10, graph="ring:k=1", local_steps=2,
             attack="forge:frac=0.2,claim=fresh,model=constant,always_on=true")


def _attacker_weights(world, nodes):
    """(attacker weight, honest weight) of every honest aggregation with an attacker candidate."""
    out = []
    for n in nodes:
        if world.attackers[n.i]:
            continue
        for w in n.weights:
            if any(world.attackers[c] for c in w["candidates"]):
                att = sum(v for c, v in zip(w["candidates"], w["weights"], strict=True)
                          if world.attackers[c])
                out.append((att, 1.0 - att, w["clamped"]))
    return out


def test_swarm_fresh_claiming_node_takes_all_weight_and_guard_stops_it():
    """Lockstep swarm with one attacker (always on, claims age 0 / lag 0 / largest count + 1,
    sends its unchanging initial model): under sfg-cut it takes its honest neighbours' whole
    weight (they and their own models are cut); with +guard the node's evidence (the payload
    SHA-256 did not change, so the age claim is too small) clamps it and it never does."""
    plain = build_world(FORGE)
    assert plain.attackers.sum() == 1
    att = int(np.flatnonzero(plain.attackers)[0])
    assert plain.available[:, att].all()  # always_on
    _, nodes = _run(plain, lambda i: NodeConfig(mode="lockstep", record_headers=True, deadline=60))
    forged = [h for n in nodes for h in n.headers if h["sender"] == att]
    assert forged and all(h["age"] == 0 and h["lag"] == 0.0 for h in forged)
    honest = [h for n in nodes for h in n.headers if h["sender"] != att]
    assert any(h["lag"] > 1 for h in honest)  # honest claims are not forged
    w_plain = _attacker_weights(plain, nodes)
    assert w_plain and max(a for a, _, _ in w_plain) == 1.0
    assert all(c == 0 for _, _, c in w_plain)

    guarded = build_world({**FORGE, "rule": "sfg-cut+guard"})
    _, nodes_g = _run(guarded, lambda i: NodeConfig(mode="lockstep", record_headers=True,
                                                    deadline=60))
    w_guard = _attacker_weights(guarded, nodes_g)
    assert len(w_guard) == len(w_plain)  # the same trace, the same aggregations
    assert max(a for a, _, _ in w_guard) < 1.0
    assert sum(c for _, _, c in w_guard) >= len(w_guard)  # the forged claim clamped each time
    assert sum(a for a, _, _ in w_guard) < sum(a for a, _, _ in w_plain)


def _hand_node_and_round(rule: str):
    """The hand-built 4-client case of forged claims on a real Node under ``rule``: receiver 0
    (age 1, lag 4, count 7 at t = 10), honest neighbours 1 and 2 (the same claims) and the
    fresh-claiming attacker 3; and the compiled round on the same case. Returns (node, msg
    (a message factory), the node's aggregation, the round's result, its graph, t)."""
    import hashlib

    from sfg.net.checkpoints import NodeState
    from sfg.net.node import Message
    from sfg.net.wire import Header
    from sfg.round.attacks import claims, parse_attack
    from sfg.round.kernel import play_round
    from sfg.round.rules import parse_rule
    from sfg.round.slots import RoundGraph
    from sfg.round.staleness import StalenessState
    from sfg.world.outages.anatomy import Capabilities

    edges = np.array([[0, 1], [0, 2], [0, 3]])
    world = build_world(dict(n_clients=4, rounds=20, process="none", rule=rule,
                             eval_every=20), edges=edges)
    node = Node(world, 0, NodeConfig(mode="lockstep", record_headers=True))
    t = 10
    node.state = NodeState(t=t, age=1, lag=4.0, count=7, local_count=7, q_hat=[1.0] * 3)

    def msg(j, age, lag, count, content):
        x = world.x0 + content
        head = Header(sender=j, round=t, age=age, lag=lag, count=count, local_count=7,
                      length=0, sha256=hashlib.sha256(x.tobytes()).digest())
        return Message(head, x)

    msgs = [msg(1, 1, 4.0, 7, 1.0), msg(2, 1, 4.0, 7, 2.0), msg(3, 0, 0.0, 8, 3.0)]
    _, full = localround.aggregate(node, t, [1, 2, 3], msgs, [1, 1, 0], [4.0, 4.0, 0.0])
    rg = RoundGraph.from_edges(4, edges)
    st = StalenessState(t=t, ages=np.ones(4, np.int64), lags=np.full(4, 4.0),
                        counts=np.full(4, 7, np.int64), local_counts=np.full(4, 7, np.int64),
                        q_hat=np.ones(rg.n_slots))
    on = np.ones(4, bool)
    rr = play_round(parse_rule(rule), rg, st, Capabilities(on, on, on, on), seed=0,
                    slot_staleness=claims(parse_attack("forge:claim=fresh"), rg, st,
                                          np.array([0, 0, 0, 1], bool), seed=0))
    return node, msg, full, rr, rg, t


def test_node_clamps_claims_with_the_rounds_defence_and_keeps_them_for_its_state():
    """The hand-built 4-client case of forged claims on a real Node: receiver 0, honest neighbours 1
    and 2, attacker 3. The node's weights and its next staleness state equal the compiled
    round's (play_round with +guard: forged lag 0 clamped to 1 + t − count = 3); with the same
    content seen again 6 rounds later, the evidence bound clamps the attacker's age to 6."""
    node, msg, full, rr, rg, t = _hand_node_and_round("sfg-cut+guard")
    sl = slice(rg.indptr[0], rg.indptr[1])
    want = dict(zip(rg.send[sl].tolist(), rr.weights[sl].tolist(), strict=True))
    assert full["weights"].tolist() == pytest.approx([want[j] for j in range(4)], abs=1e-12)
    assert full["weights"][3] == pytest.approx(8 / 29)
    assert full["lags"].tolist() == [4.0, 4.0, 4.0, 3.0]  # the forged lag as clamped
    nxt = node.star.advance(node.state, available=True, **full)
    assert nxt.lag == pytest.approx(rr.state.lags[0], abs=1e-12)
    assert nxt.count == rr.state.counts[0] and nxt.age == rr.state.ages[0]
    assert node.weights[-1]["clamped"] == 1
    # evidence: the attacker's content unchanged 6 rounds later -> age >= 6, lag >= 6
    _, full = localround.aggregate(node, t + 6, [1, 2, 3], [msg(1, 1, 10.0, 7, 4.0), msg(2, 1, 10.0, 7, 5.0),
                                                 msg(3, 0, 0.0, 8, 3.0)],
                              [1, 1, 0], [10.0, 10.0, 0.0])
    assert full["ages"][3] == 6 and full["lags"][3] >= 6.0
    assert full["ages"][1] == 1 and full["lags"][1] == 10.0  # changed content: untouched


@pytest.mark.parametrize("rule", ["sfg-cut+refute", "sfg-cut:kappa=1.2+refute+cap"])
def test_node_refutes_as_the_round_does(rule):
    """+refute on a real Node (the hand case above): the forged fresh claim is refuted and its
    sender dropped, then +cap — the compiled round's weights and next state."""
    node, _, full, rr, rg, _ = _hand_node_and_round(rule)
    sl = slice(rg.indptr[0], rg.indptr[1])
    want = dict(zip(rg.send[sl].tolist(), rr.weights[sl].tolist(), strict=True))
    assert full["weights"].tolist() == pytest.approx([want[j] for j in range(4)], abs=1e-12)
    assert full["weights"][3] == 0.0 and node.weights[-1]["clamped"] == 1
    if "cap" in rule:  # κ/k = 0.3 per neighbour: the excess stays with the receiver
        assert full["weights"].tolist() == pytest.approx([0.4, 0.3, 0.3, 0.0], abs=1e-12)
    nxt = node.star.advance(node.state, available=True, **full)
    assert nxt.count == rr.state.counts[0] == 8 and nxt.lag == pytest.approx(rr.state.lags[0])


def test_swarm_cli_rejects_a_poisoned_model_attack(capsys):
    code, _, err = _cli(["swarm", "-n", "10", "-T", "10", "--attack",
                         "forge:frac=0.2,claim=fresh,model=sign-flip"], capsys)
    assert code == 2 and "model=none or constant" in err, err


def test_swarm_cli_attack_reaches_the_worker_nodes(tmp_path, capsys):
    """`sfg swarm --attack ...`: the worker processes build the same attackers."""
    code, out, err = _cli(["swarm", "--nodes", "4", "-T", "4", "-p", "none", "--graph",
                           "ring:k=1", "--procs", "1", "-K", "1", "--eval-every", "4",
                           "--attack", "forge:frac=0.25,claim=fresh", "--workdir",
                           str(tmp_path), "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["config"]["attack"] == "forge:claim=fresh,frac=0.25"
    assert sum(n["attacker"] for n in res["nodes"]) == 1


def test_restarted_lockstep_node_still_serves_its_unfetched_older_messages(tmp_path):
    """A neighbour offline in the node's next round may still wait for an older message when
    the node crashes: the checkpoint keeps the node's pending messages, and the restarted node
    serves them (Fetch), byte for byte; messages of later rounds are not resurrected."""
    from sfg.net.checkpoints import NodeState

    world = build_world(dict(n_clients=4, rounds=8, graph="ring:k=1", process="none",
                             eval_every=8))
    cfg = dict(mode="lockstep", checkpoint_dir=tmp_path)
    node = Node(world, 2, NodeConfig(**cfg))
    node.state = NodeState(t=6, age=0, lag=0.0, count=7, local_count=7, q_hat=[1.0, 1.0])
    for r in (4, 5):
        node.round = r
        node.outbox[r] = outgoing.message(node)
        node.expected[r] = [1] if r == 4 else [1, 3]
    node.checkpoint()
    want = {r: (h, p.join()) for r, (h, p) in node.outbox.items()}
    back = Node(world, 2, NodeConfig(**cfg, resume=True))
    assert back.state.t == 6 and sorted(back.outbox) == [4, 5]
    assert lockstep.serve_fetch(back, 4, 1) == want[4] and lockstep.serve_fetch(back, 5, 3) == want[5]
    assert back.expected == {4: [1], 5: [1, 3]}
    # once every neighbour is past round 4 it is pruned, and so is its file
    back.heard = {1: 5, 3: 5}
    lockstep.prune_outbox(back)
    back.files.save_outbox(back.outbox, back.expected)
    assert sorted(back.outbox) == [5]
    assert sorted(p.name for p in tmp_path.glob("node-2-out-*")) == ["node-2-out-5.msgpack"]
    # a checkpoint of an earlier round does not bring back messages of its own or later rounds
    back.state = NodeState(t=5, age=0, lag=0.0, count=6, local_count=6, q_hat=[1.0, 1.0])
    back.checkpoint()
    again = Node(world, 2, NodeConfig(**cfg, resume=True))
    assert again.outbox == {} and not list(tmp_path.glob("node-2-out-*"))


def test_rejections_warn_once_per_reason_then_at_powers_of_ten(caplog):
    """Under message faults a node rejects thousands of messages: the first of each reason
    and the 10th, 100th, ... are warnings (with the count), the rest debug lines; every one
    is counted."""
    import logging

    from sfg.net.wire import Rejected, Rejections

    r = Rejections(3)
    with caplog.at_level(logging.DEBUG, logger="sfg.net"):
        for _ in range(250):
            r.add(Rejected("digest", "SHA-256 of the payload does not match the header"))
        r.add(Rejected("garbage"))
    warn = [m.getMessage() for m in caplog.records if m.levelno == logging.WARNING]
    assert len(warn) == 4 and "(100 rejected for digest so far)" in warn[2]
    assert warn[0].startswith("node 3 rejected a message: digest") and "garbage" in warn[3]
    assert sum(m.levelno == logging.DEBUG for m in caplog.records) == 247
    assert r.as_dict() == {"digest": 250, "garbage": 1} and r.total == 251
