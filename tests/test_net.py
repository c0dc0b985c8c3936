"""Networked nodes (SPEC §11): lockstep equals the simulator, async learns, crashes recover,
TLS keeps strangers out. Real gRPC servers on 127.0.0.1 only; every run is bounded in time."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from sfg.net.node import Node, NodeConfig, Partition
from sfg.net.swarm import SwarmOptions, run_nodes, run_swarm, summarise
from sfg.net.world import build_world

LOCKSTEP = dict(n_clients=8, rounds=20, process="bursty:u=0.8", rule="sfg-cut", model="mlp",
                dataset="digits", seed=1, eval_every=5)


def _run(world, make_config, timeout=120.0):
    nodes: list[Node] = []
    res = asyncio.run(asyncio.wait_for(run_nodes(world, range(world.n), make_config,
                                                 nodes_out=nodes), timeout))
    return sorted(res, key=lambda r: r["node"]), sorted(nodes, key=lambda n: n.i)


# ------------------------------------------------------------------ lockstep (SPEC §11.1)
def test_lockstep_swarm_equals_the_loop_simulator():
    from sfg.sim.run import simulate

    sim = simulate(LOCKSTEP, backend="loop")
    world = build_world(LOCKSTEP)
    res, nodes = _run(world, lambda i: NodeConfig(mode="lockstep", deadline=60))
    X = np.stack([n.x for n in nodes])
    assert np.abs(X - sim.params.numpy()).max() <= 1e-5
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
    part = Partition.parse("0,1,2,3|4,5,6,7@2-3")
    res, nodes = _run(world, lambda i: NodeConfig(mode="lockstep", partitions=(part,),
                                                  record_headers=True))
    heads = [h for n in nodes for h in n.headers]
    crossing = [h for h in heads if part.blocks(h["sender"], h["receiver"], 2)]
    assert crossing and all(h["round"] not in (2, 3) for h in crossing)
    assert {h["round"] for h in heads} == set(range(6))
    deg = sum(len(world.neighbours(i)) for i in range(8))
    cut = sum(1 for a, b in world.graph.edges if part.blocks(int(a), int(b), 2))
    assert summarise(world, res, wall=0)["metrics"]["messages"] == 6 * deg - 2 * 2 * cut


# ------------------------------------------------------------------ async (SPEC §11.2)
def _async_run(rule: str):
    # the period leaves every node of this one process time to train each round (about 3×
    # their summed training time, measured here), so that waiting reflects the protocol, not
    # an overloaded test machine. W = 1.5 periods: with start jitter up to 0.2·P a neighbour's
    # last message may be a little over one period old at the next round start; it still
    # counts (aged by ⌊d⌋).
    import time

    from sfg.net.world import Trainer

    cfg = dict(n_clients=16, rounds=30, local_steps=5, process="bursty:u=0.8", rule=rule,
               seed=3, eval_every=10)
    world = build_world(cfg)
    tr = Trainer(world, 0)
    tr.train(world.x0, 0, 0)
    times = []
    for r in range(3):
        t = time.perf_counter()
        tr.train(world.x0, r, 0)
        times.append(time.perf_counter() - t)
    period = max(0.1, 3 * world.n * min(times))
    return world, _run(world, lambda i: NodeConfig(mode="async", period=period, jitter=0.2,
                                                   window=1.5, record_headers=True, linger=0.2),
                       timeout=240)


def test_async_sfg_cut_learns_across_the_network_and_scalars_obey_spec():
    world, (res_cut, nodes) = _async_run("sfg-cut")
    _, (res_local, _) = _async_run("local")
    acc_cut = np.mean([r["acc"] for r in res_cut])
    acc_local = np.mean([r["acc"] for r in res_local])
    assert acc_cut > acc_local, (acc_cut, acc_local)
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
                                                   deadline=60, workdir=str(tmp_path)))
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
            replies.append(await peer.deliver(h, p, timeout=3, retries=1))
            if not replies[-1][0]:
                assert not node.latest  # nothing got in
            await peer.close()
        await node.close()
        return node, replies

    node, replies = asyncio.run(asyncio.wait_for(main(), 60))
    assert replies[0] == (False, "UNAVAILABLE")        # handshake refused: wrong CA
    assert replies[1] == (False, "identity")           # node-3's certificate, header says 1
    assert replies[2] == (True, "")                    # the real node 1
    assert node.rejections.as_dict() == {"identity": 1}


# ------------------------------------------------------------------ CLI
def _cli(args, capsys):
    from sfg.cli import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("args,needle", [
    (["swarm", "--mode", "sideways", "-n", "8", "-T", "20"], "lockstep or async"),
    (["swarm", "--kill", "3", "-n", "8", "-T", "20"], "NODE@ROUND"),
    (["swarm", "--kill", "9@2", "-n", "8", "-T", "20"], "does not exist"),
    (["swarm", "--partition", "0,1|1,2@3-4", "-n", "8", "-T", "20"], "disjoint"),
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
    code, _, err = _cli(["node", "--id", "0", "--listen", "127.0.0.1:0", "--peers", str(peers)],
                        capsys)
    assert code == 2 and "0..N-1" in err
    code, _, err = _cli(["node", "--id", "0", "--listen", "nowhere", "--peers", str(peers)],
                        capsys)
    assert code == 2 and "error:" in err


def test_node_cli_runs_two_nodes_from_a_peers_file(tmp_path):
    """Two `sfg node` processes on 127.0.0.1 that find each other through peers.yaml."""
    import subprocess
    import sys

    from sfg.net.swarm import free_ports

    p0, p1 = free_ports(2)
    peers = tmp_path / "peers.yaml"
    peers.write_text(f"nodes:\n  0: 127.0.0.1:{p0}\n  1: 127.0.0.1:{p1}\nedges: [[0, 1]]\n")
    common = ["--peers", str(peers), "-T", "5", "-p", "none", "--rule", "dfedavg",
              "--eval-every", "5", "--json", "--deadline", "60"]
    procs = [subprocess.Popen([sys.executable, "-m", "sfg.cli", "node", "--id", str(i),
                               "--listen", f"127.0.0.1:{port}", *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, port in ((0, p0), (1, p1))]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, e) in zip(procs, outs, strict=True):
        assert p.returncode == 0, e
    res = [json.loads(o) for o, _ in outs]
    assert [r["messages"] for r in res] == [5, 5]      # one model from the other each round
    assert all(r["state"]["age"] == 0 and r["state"]["t"] == 5 for r in res)


def test_tls_ca_command_writes_a_ca_and_node_certificates(tmp_path, capsys):
    code, out, err = _cli(["tls-ca", "--dir", str(tmp_path / "ca"), "--nodes", "3"], capsys)
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "ca").iterdir())
    assert names == ["ca.key", "ca.pem", "node-0.key", "node-0.pem", "node-1.key",
                     "node-1.pem", "node-2.key", "node-2.pem"]


def test_store_writes_an_in_process_swarm_run_into_the_results_store(tmp_path):
    from sfg.experiments.store import Store
    from sfg.net.cli import _store

    world = build_world({**LOCKSTEP, "rounds": 10, "process": "none", "eval_every": 5})
    res, _ = _run(world, lambda i: NodeConfig(mode="lockstep"))
    out = summarise(world, res, wall=2.0)
    rid = _store(str(tmp_path / "r.sqlite"), world.cfg, "lockstep", out)
    with Store(tmp_path / "r.sqlite") as st:
        (rec,) = st.records()
        curves = st.curves(rid)
    assert rec["rule"] == "sfg-cut"
    assert rec["metrics"]["acc_mean"] == pytest.approx(out["metrics"]["acc_mean"])
    assert rec["metrics"]["rejected"] == 0.0
    assert curves[rid]["acc_mean"] == pytest.approx(out["curves"]["acc_mean"])
