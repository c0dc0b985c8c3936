"""Certified claims between networked nodes (``+certified`` in sfg swarm / sfg node,
sfg.net.certify): signing keys bound to the TLS certificates, hand-built
witnesses and provenance on real Ed25519 stamps, forged signatures, replayed headers and
provenance digests that do not match rejected on a real Node, and the swarm equal to
``sfg run`` model for model, with and without liars. Loopback only; every run is bounded."""

from __future__ import annotations

import asyncio
import hashlib
import json

import msgpack
import numpy as np
import pytest
from crosspath import assert_same_bits

from sfg.errors import SfgError
from sfg.net import inbox, outgoing
from sfg.net.certify import Keys, make_cert, make_stamp, read_stamp, refuted
from sfg.net.evidence import Prev
from sfg.net.node import Node, NodeConfig
from sfg.net.swarm import run_nodes, summarise
from sfg.net.tls import make_test_ca
from sfg.net.wire import Rejected, unpack_header
from sfg.net.world import build_world

# the triangle 0 – 1 – 2 plus 3 hanging off 1 (the rounds model's hand case): receiver 0,
# sender 1, witness 2
EDGES = np.array([[0, 1], [0, 2], [1, 2], [1, 3]])
NB = {0: frozenset({1, 2}), 1: frozenset({0, 2, 3}), 2: frozenset({0, 1}), 3: frozenset({1})}


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return make_test_ca(tmp_path_factory.mktemp("ca"), range(8))


def _keys(ca, i, n=4):
    return Keys.load(ca, i, range(n))


# ------------------------------------------------------------------ keys
def test_signing_keys_are_bound_to_the_nodes_certificates(ca, tmp_path):
    k0, k1 = _keys(ca, 0), _keys(ca, 1)
    sig = k1.sign(b"round 3")
    assert k0.verify(1, sig, b"round 3")
    assert not k0.verify(2, sig, b"round 3")      # another node's key
    assert not k0.verify(1, sig, b"round 4")      # other bytes
    assert not k0.verify(9, sig, b"round 3")      # not in the swarm
    # a certificate of another CA, a folder made before +certified, a key that does not match
    other = make_test_ca(tmp_path / "other", range(4))
    (tmp_path / "mixed").mkdir()
    for f in ("ca.pem", "node-0.pem", "node-0.sign"):
        (tmp_path / "mixed" / f).write_bytes((ca / "node-0" / f).read_bytes())
    (tmp_path / "mixed" / "node-1.pem").write_bytes((other / "node-0" / "node-1.pem").read_bytes())
    with pytest.raises(SfgError, match="not a certificate issued by"):
        Keys.load(tmp_path / "mixed", 0, range(2))
    (tmp_path / "mixed" / "node-0.sign").unlink()
    (tmp_path / "mixed" / "node-0.sign").write_bytes((other / "node-0" / "node-0.sign").read_bytes())
    with pytest.raises(SfgError, match="does not match the key in node-0.pem"):
        Keys.load(tmp_path / "mixed", 0, range(1))
    (other / "node-2" / "node-2.sign").unlink()
    with pytest.raises(SfgError, match="node-2.sign not found"):
        Keys.load(other, 2, range(4))
    # a folder holding another node's signing key is nobody's bundle
    (tmp_path / "mixed" / "node-1.sign").write_bytes((ca / "node-1" / "node-1.sign").read_bytes())
    with pytest.raises(SfgError, match="private keys other than node 0's"):
        Keys.load(tmp_path / "mixed", 0, range(1))


# ------------------------------------------------------------------ hand-built refutations
def _stamps(ca):
    """Round r − 1 = 4: every client's state then (age 1, lag 2, count 5), signed."""
    ks = {i: _keys(ca, i) for i in range(4)}
    return ks, {i: read_stamp(make_stamp(ks[i], 4, 1, 2.0, 5), ks[0]) for i in range(4)}


def _cert(ks, stamps, j, claim, heard):
    """Node j's verified round-5 evidence for ``claim``: its prior, its heard-set and the
    stamps of round 4 it cites (those of ``heard``)."""
    from sfg.net.certify import read_cert
    from sfg.net.wire import make_header

    src = [stamps[k].raw for k in sorted(heard or ())]
    cert = make_cert(make_stamp(ks[j], 5, *claim), stamps[j].raw, heard, src)
    raw = make_header((b"\0" * 32, 10), sender=j, round=5, age=claim[0], lag=claim[1],
                      count=claim[2], local_count=5, cert=cert, sign=ks[j].sign)
    return read_cert(unpack_header(raw), ks[0], NB.__getitem__)


ALONE = (0, 2.0, 6)   # "I trained alone": age 0, my own lag, my count + 1


def test_a_witness_refutes_the_sleeping_liars_trained_alone_claim(ca):
    """Client 1 slept in round 4 (no heard-set) and claims to have trained alone. Client 2,
    a neighbour of both and a candidate of receiver 0 now, aggregated in round 4 without
    hearing 1 (its signed heard-set is {0}): refuted. The honest witness is not."""
    ks, st = _stamps(ca)
    certs = {1: _cert(ks, st, 1, ALONE, None), 2: _cert(ks, st, 2, (0, 2.0, 6), {0})}
    got = refuted(False, certs, known={}, me_heard=None, neighbours=NB.__getitem__)
    assert got == {1: True, 2: False}
    # without the witness, nothing refutes it — unless receiver 0 itself aggregated in
    # round 4 without hearing 1
    alone = {1: certs[1]}
    assert refuted(False, alone, known={}, me_heard=None, neighbours=NB.__getitem__) == {1: False}
    assert refuted(False, alone, known={}, me_heard=frozenset({2}),
                   neighbours=NB.__getitem__) == {1: True}


def test_an_honest_waking_client_with_the_same_claims_and_no_refuting_witness_is_not(ca):
    """The same claim from client 1 that was awake while its neighbours slept (it trained
    alone for real, heard-set empty): the witness 2 slept too (no heard-set) — not refuted;
    and with 2 awake and hearing 1, neither."""
    ks, st = _stamps(ca)
    certs = {1: _cert(ks, st, 1, ALONE, set()), 2: _cert(ks, st, 2, (2, 3.0, 5), None)}
    assert refuted(False, certs, known={}, me_heard=None,
                   neighbours=NB.__getitem__) == {1: False, 2: False}
    certs = {1: _cert(ks, st, 1, ALONE, {0, 2}), 2: _cert(ks, st, 2, (0, 2.0, 6), {0, 1})}
    assert refuted(False, certs, known={}, me_heard=frozenset({1, 2}),
                   neighbours=NB.__getitem__) == {1: False, 2: False}


def test_provenance_refutes_a_claim_its_cited_sources_do_not_give(ca):
    """Every source says lag 2, count 5: lag 0, a count of 9 and an untrained age 1 are
    refuted; the truth after sleeping (age 2, lag 3, count 5) is not. A prior the receiver
    heard itself (a lie it accepted: lag 0.5, count 9) replaces the cited one."""
    ks, st = _stamps(ca)

    def verdict(claim, known=None):
        c = {1: _cert(ks, st, 1, claim, None)}
        return refuted(False, c, known=known or {}, me_heard=None,
                       neighbours=NB.__getitem__)[1]

    assert verdict((0, 0.0, 6)) and verdict((0, 2.0, 9)) and verdict((1, 3.0, 5))
    assert not verdict((2, 3.0, 5))
    heard = read_stamp(make_stamp(ks[1], 4, 0, 0.5, 9), ks[0])
    assert verdict((0, 0.5, 10)) and not verdict((0, 0.5, 10), {1: heard})
    # round 0: only the initial model
    assert refuted(True, {1: _cert(ks, st, 1, (0, 0.0, 1), None)}, known={}, me_heard=None,
                   neighbours=NB.__getitem__) == {1: False}


# ------------------------------------------------------------------ arrival checks on a Node
def _hand_world(rule="sfg-cut+certified"):
    return build_world(dict(n_clients=4, rounds=8, process="none", rule=rule, eval_every=8,
                            model="mlp", dataset="digits"), edges=EDGES)


async def _deliver(node, header: bytes, payload: bytes):
    async def chunks():
        yield payload

    return await inbox.deliver(node, header, chunks(), None, "test")


def _nodes(ca, world):
    return {i: Node(world, i, NodeConfig(mode="lockstep", keys=_keys(ca, i))) for i in range(4)}


def _round_message(sender: Node, r: int, heard: set[int], stamps: dict[int, bytes]):
    """Sender's round-r message to its neighbours, its previous round as given."""
    sender.round = r
    if r:
        sender.evidence.prev = Prev(aggregated=True, own=(0, 0.0, 1), heard=frozenset(heard),
                                    stamps=stamps)
    head, payload = outgoing.message(sender)
    body = payload.join() if hasattr(payload, "join") else payload
    return head, body


def test_forged_replayed_and_mismatched_headers_are_rejected_counted_and_change_nothing(ca):
    world = _hand_world()
    n = _nodes(ca, world)
    rx = n[0]
    head, body = _round_message(n[1], 0, set(), {})
    # a forged signature: one bit of it flipped
    d = msgpack.unpackb(head, raw=False)
    d["sig"] = bytes([d["sig"][0] ^ 1]) + d["sig"][1:]
    assert asyncio.run(_deliver(rx, msgpack.packb(d, use_bin_type=True), body)) == \
        (False, "signature")
    # a claim changed after signing
    d = msgpack.unpackb(head, raw=False)
    d["lag"] = 0.5
    assert asyncio.run(_deliver(rx, msgpack.packb(d, use_bin_type=True), body)) == \
        (False, "signature")
    # a plain header in a certified run
    d = msgpack.unpackb(head, raw=False)
    del d["cert"], d["sig"]
    assert asyncio.run(_deliver(rx, msgpack.packb(d, use_bin_type=True), body)) == \
        (False, "uncertified")
    assert not rx.inbox and not rx.evidence.certs
    # the real one is accepted; the same bytes again change nothing
    assert asyncio.run(_deliver(rx, head, body)) == (True, "")
    assert asyncio.run(_deliver(rx, head, body)) == (True, "")
    assert list(rx.inbox) == [(1, 0)] and rx.stats.bytes == len(head) + len(body)
    # replayed: round 0's header to a node now in round 2 that never accepted it, and a
    # second, different header for a (sender, round) it holds
    rx2 = n[2]
    rx2.round = 2
    assert asyncio.run(_deliver(rx2, head, body)) == (False, "replayed")
    n[1].x = n[1].x + 1.0
    head_b, body_b = _round_message(n[1], 0, set(), {})
    assert asyncio.run(_deliver(rx, head_b, body_b)) == (False, "replayed")
    # a provenance digest that does not match the stamp it lists
    s3 = make_stamp(_keys(ca, 3), 0, 0, 0.0, 1)
    s0 = make_stamp(_keys(ca, 0), 0, 0, 0.0, 1)
    head1, body1 = _round_message(n[1], 1, {0, 3}, {0: s0, 3: s3})
    assert asyncio.run(_deliver(n[3], head1, body1)) == (True, "")  # the honest original
    h = unpack_header(head1)
    cert = msgpack.unpackb(h.cert, raw=False)
    cert["prov"][0] = hashlib.sha256(b"another stamp").digest()
    from sfg.net.wire import make_header

    forged = make_header((h.sha256, h.length), sender=1, round=1, age=h.age, lag=h.lag,
                         count=h.count, local_count=h.local_count,
                         cert=msgpack.packb(cert, use_bin_type=True), sign=n[1].cfg.keys.sign)
    n[0].round = 1
    assert asyncio.run(_deliver(n[0], forged, body1)) == (False, "provenance")
    # a cited stamp of a round other than the previous, or by a non-neighbour of the sender
    head_x, _ = _round_message(n[1], 1, {0, 3}, {0: make_stamp(_keys(ca, 0), 0, 0, 0.0, 1),
                                                 3: make_stamp(_keys(ca, 3), 3, 0, 0.0, 1)})
    assert asyncio.run(_deliver(n[0], head_x, body1)) == (False, "provenance")
    assert rx.rejections.as_dict() == {"signature": 2, "uncertified": 1, "replayed": 1,
                                       "provenance": 2}
    assert rx2.rejections.as_dict() == {"replayed": 1}
    assert list(rx.inbox) == [(1, 0)] and set(rx.evidence.certs) == {(1, 0)}
    assert not rx2.inbox and not rx2.evidence.certs


# ------------------------------------------------------------------ the swarm against sfg run
SWARM = dict(n_clients=8, rounds=12, process="bursty:u=0.8", model="mlp", dataset="digits",
             seed=1, eval_every=4)


def _swarm(ca, cfg):
    world = build_world(cfg)
    nodes: list[Node] = []
    res = asyncio.run(asyncio.wait_for(run_nodes(
        world, range(world.n),
        lambda i: NodeConfig(mode="lockstep", deadline=60,
                             keys=Keys.load(ca, i, range(8)) if world.rule.certified else None),
        nodes_out=nodes), 300))
    X = np.stack([n.x for n in sorted(nodes, key=lambda n: n.i)])
    return summarise(world, res, wall=1.0), X


@pytest.mark.parametrize("rule,attack", [
    ("sfg-cut+certified", None),
    ("sfg-cut+certified", "forge:frac=0.25,claim=certified"),
    ("sfg+certified", "forge:frac=0.25,claim=fresh"),
    ("aoi+ipw+certified", "forge:frac=0.25,claim=fresh"),
    ("sfg-l+certified+cap", "forge:frac=0.25,claim=certified"),
    ("sfg-cut", "forge:frac=0.25,claim=certified"),
])
def test_the_certified_swarm_equals_sfg_run_model_for_model(ca, rule, attack):
    """Lockstep nodes signing, citing and checking real evidence refuse exactly the claims
    the rounds model refuses, and train the same models as ``sfg run`` (the liars'
    per-receiver claims included); without liars nothing is refused."""
    from sfg.sim.run import simulate

    cfg = {**SWARM, "rule": rule, "attack": attack}
    out, X = _swarm(ca, cfg)
    sim = simulate(cfg, backend="loop")
    assert np.abs(X - sim.params.numpy()).max() <= 1e-6
    m = out["metrics"]
    assert m["rejected"] == 0
    if "+certified" in rule:
        assert m["claims_refused"] == pytest.approx(sim.metrics["claims_refused"], abs=1e-12)
        assert (m["claims_refused"] > 0) == (attack is not None)
        assert m["signatures"] > 0 and m["verifications"] > m["signatures"]
    else:
        assert "claims_refused" not in m


def test_certified_headers_cost_bytes_and_signatures_measured(ca):
    plain, _ = _swarm(ca, {**SWARM, "rule": "sfg-cut"})
    cert, _ = _swarm(ca, {**SWARM, "rule": "sfg-cut+certified"})
    assert cert["metrics"]["header_bytes"] > plain["metrics"]["header_bytes"] + 64 + 2 * 90
    m = cert["metrics"]
    # both costs are measured; a node checks more signatures than it makes (counted, not
    # timed: which of two sub-millisecond wall times is larger depends on the machine's load)
    assert m["sign_ms_per_node_round"] > 0 and m["verify_ms_per_node_round"] > 0
    assert m["verifications"] > m["signatures"] > 0


# ------------------------------------------------------------------ the command line
def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize("extra,needle", [
    ([], "give --tls-dir"),
    (["--protocol", "async", "--tls-dir", "CA"], "runs in lockstep mode"),
])
def test_swarm_cli_refuses_what_certified_cannot_do_in_one_line(ca, extra, needle, capsys):
    extra = [str(ca) if a == "CA" else a for a in extra]
    code, _, err = _cli(["swarm", "-n", "4", "-T", "4", "--eval-every", "4", "--graph",
                         "ring:k=1", "-p", "none", "--rule", "sfg-cut+certified", *extra],
                        capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err


def test_swarm_cli_runs_certified_worker_nodes_over_tls(ca, tmp_path, capsys):
    """`sfg swarm --rule ...+certified --tls-dir`: worker processes over mutual TLS, each
    with its key from the folder; the liars' claims refused as in sfg run."""
    from sfg.sim.run import simulate

    args = ["--nodes", "8", "-T", "8", "-p", "iid:u=0.5", "--graph", "ring:k=2", "-K", "1",
            "--eval-every", "8", "--rule", "sfg-cut+certified", "--attack",
            "forge:frac=0.25,claim=fresh"]
    code, out, err = _cli(["swarm", *args, "--procs", "2", "--tls-dir", str(ca), "--workdir",
                           str(tmp_path), "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    sim = simulate({"n_clients": 8, "rounds": 8, "process": "iid:u=0.5", "graph": "ring:k=2",
                    "local_steps": 1, "eval_every": 8, "rule": "sfg-cut+certified",
                    "attack": "forge:frac=0.25,claim=fresh"}, backend="loop")
    assert res["metrics"]["claims_refused"] == pytest.approx(sim.metrics["claims_refused"], abs=1e-12)
    assert res["metrics"]["claims_refused"] > 0 and res["metrics"]["rejected"] == 0


def test_node_cli_runs_certified_nodes_from_a_peers_file_over_tls(ca, tmp_path):
    """Two `sfg node` processes with +certified: each signs with its own key from the folder
    and checks the other's headers; nothing is rejected or refused between honest nodes."""
    from test_net import run_two_nodes

    res = run_two_nodes(tmp_path, ["-T", "4", "-p", "none", "--rule", "sfg-cut+certified",
                                   "--eval-every", "4", "--tls-dir", str(ca)])
    assert [r["messages"] for r in res] == [4, 4] and all(not r["rejected"] for r in res)
    assert [r["certified"]["checked"] for r in res] == [4, 4]
    assert [r["certified"]["refuted"] for r in res] == [0, 0]
    assert all(r["certified"]["signed"] == 3 * 4 - 1 for r in res)  # no prior in round 0


@pytest.mark.parametrize("attack", [None, "forge:frac=0.25,claim=certified"])
def test_a_certified_node_killed_mid_run_resumes_with_its_evidence(ca, tmp_path, attack):
    """SIGKILL a node of a +certified swarm (the liars answering it, or none): it resumes
    from its checkpoint with its previous round's evidence and the headers it accepted, and
    the swarm still refuses what sfg run refuses and reaches its accuracies."""
    from sfg.net.swarm import SwarmOptions, run_swarm
    from sfg.sim.run import simulate

    cfg = dict(n_clients=8, rounds=10, process="iid:u=0.25", rule="sfg-cut+certified", seed=1,
               eval_every=5, graph="ring:k=2", local_steps=2, attack=attack)
    sim = simulate(cfg, backend="loop")
    out = run_swarm(build_world(cfg), SwarmOptions(mode="lockstep", procs=2, kills=[(2, 4)],
                                                   deadline=180, workdir=str(tmp_path),
                                                   tls_dir=str(ca)))
    assert out["metrics"]["restarts"] == 1 and out["metrics"]["rejected"] == 0
    node2 = next(n for n in out["nodes"] if n["node"] == 2)
    assert node2["restored"] is not None
    assert [n["acc"] for n in out["nodes"]] == sim.accuracy.tolist()
    assert out["metrics"]["claims_refused"] == pytest.approx(sim.metrics["claims_refused"], abs=1e-12)


def test_the_evidence_a_checkpoint_holds_comes_back_as_it_was(ca):
    """The previous round and the accepted headers survive CertifiedEvidence.record →
    restore field for field (the known stamps verified again)."""
    world = _hand_world()
    a, b = _nodes(ca, world)[1], _nodes(ca, world)[1]
    k0 = _keys(ca, 0)
    known = read_stamp(make_stamp(k0, 4, 0, 0.5, 9), a.cfg.keys)
    a.evidence.prev = Prev(aggregated=True, own=(1, 2.5, 5), heard=frozenset({0, 3}),
                           got={0: (0, 0.5, 9), 3: (2, 3.0, 5)}, stamps={0: known.raw},
                           told={0: (0, 0.25, 10), 2: (0, 0.5, 10)}, known={0: known})
    a.evidence.accepted = {(0, 4): b"\1" * 32, (3, 4): b"\2" * 32}
    a.state = a.state.__class__(t=5, age=0, lag=0.0, count=1, local_count=1, q_hat=[1.0] * 3)
    b.evidence.restore(json.loads(json.dumps(a.evidence.record(a.rounds_done))), "test")
    assert b.evidence.prev == a.evidence.prev and b.evidence.accepted == a.evidence.accepted
    forged = {**a.evidence.record(a.rounds_done)}
    forged["prev"]["known"] = [[0, (known.raw[:-1] + bytes([known.raw[-1] ^ 1])).hex()]]
    with pytest.raises(SfgError, match="does not verify"):
        b.evidence.restore(forged, "test")


def test_hostile_evidence_is_rejected_never_a_crash(ca):
    """Random mutations of a real certified header (bytes flipped, cut or inserted in the
    header or its evidence) are Rejected with a reason, never another exception."""
    import random

    from sfg.net.certify import read_cert
    from sfg.net.wire import Header, make_header

    ks, st = _stamps(ca)
    cert = make_cert(make_stamp(ks[1], 5, 0, 2.0, 6), st[1].raw, {0, 2},
                     [st[0].raw, st[2].raw])
    raw = make_header((b"\0" * 32, 10), sender=1, round=5, age=0, lag=2.0, count=6,
                      local_count=5, cert=cert, sign=ks[1].sign)
    rng = random.Random(7)
    reasons = set()
    for n in range(600):
        target = cert if n % 2 else raw
        b = bytearray(target)
        for _ in range(rng.randint(1, 4)):
            op, at = rng.random(), rng.randrange(len(b))
            if op < 0.6:
                b[at] ^= 1 << rng.randrange(8)
            elif op < 0.8:
                del b[at:at + rng.randint(1, 8)]
            else:
                b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            if n % 2:  # the evidence mutated, the header re-signed: the checks behind the signature
                h = unpack_header(raw)
                forged = Header(**{**{f: getattr(h, f) for f in Header.__dataclass_fields__},
                                   "cert": bytes(b) or b"\0", "sig": b""})
                forged = Header(**{**forged.__dict__, "sig": ks[1].sign(forged.signed_part())})
                read_cert(forged, ks[0], NB.__getitem__)
            else:
                read_cert(unpack_header(bytes(b)), ks[0], NB.__getitem__)
        except Rejected as e:
            reasons.add(e.reason)
    assert {"signature", "provenance"} <= reasons


def test_a_partition_makes_honest_senders_look_absent_across_the_cut(ca):
    """The limit, measured (as the rounds model's failed links): a scheduled partition cuts
    links, so an honest sender that trained looks absent to a witness across the cut — with
    no liar at all, some claims are refused; without the partition none is."""
    from sfg.net.cuts import Cut

    cfg = dict(n_clients=8, rounds=8, process="iid:u=0.5", graph="ring:k=2", local_steps=1,
               eval_every=8, rule="sfg-cut+certified", seed=1)
    world = build_world(cfg)
    part = Cut.parse_rounds("0,1|2,3@2-3")

    def run(partitions):
        res = asyncio.run(asyncio.wait_for(run_nodes(
            world, range(8), lambda i: NodeConfig(mode="lockstep", deadline=60,
                                                  partitions=partitions,
                                                  keys=Keys.load(ca, i, range(8)))), 300))
        return summarise(world, res, wall=1.0)["metrics"]["claims_refused"]

    assert run(()) == 0.0
    assert run((part,)) > 0.0


@pytest.mark.parametrize("attack", [None, "forge:frac=0.25,claim=certified"])
def test_certified_nodes_on_the_virtual_clock_under_every_fault_equal_sfg_run(attack):
    """The same node code on the virtual clock (keys derived from the seed): lost, delayed,
    reordered, duplicated, corrupted and misrouted messages and a crash with restart from
    the checkpoint change nothing — the models and the claims refused are sfg run's (a
    corrupted certified header is rejected and pulled again; a duplicate changes nothing)."""
    from test_vswarm import BASE, lockstep_under_every_fault

    from sfg.sim.run import simulate

    cfg = {**BASE, "n_clients": 8, "rule": "sfg-cut+certified", "rounds": 12, "attack": attack}
    res = lockstep_under_every_fault(build_world({**cfg, "backend": "loop"}))
    plain = simulate(cfg, backend="loop")
    assert_same_bits(res["params"], plain.params.numpy())
    assert [nd["acc"] for nd in res["nodes"]] == plain.accuracy.tolist()
    assert res["metrics"]["claims_refused"] == pytest.approx(plain.metrics["claims_refused"], abs=1e-12)
    assert (res["metrics"]["claims_refused"] > 0) == (attack is not None)
    f = res["faults"]
    assert f["lost"] > 0 and f["corrupted"] > 0 and f["restarts"] >= 1, f


@pytest.mark.parametrize("damage,needle", [
    ("no-sign", "node-3.sign not found"),
    ("garbage-ca", "ca.pem is not a PEM certificate"),
    ("garbage-sign", "node-2.sign is not a PEM private key"),
    ("swapped-sign", "node-1.sign does not match the key in node-1.pem"),
])
def test_swarm_cli_checks_every_nodes_keys_before_starting(ca, tmp_path, damage, needle, capsys):
    """A keys folder that cannot serve +certified is one line and exit 2, found before any
    node starts (not a failed worker)."""
    import shutil

    d = tmp_path / "keys"
    shutil.copytree(ca, d)
    if damage == "no-sign":
        (d / "node-3" / "node-3.sign").unlink()
    elif damage == "garbage-ca":
        (d / "node-0" / "ca.pem").write_text("not a certificate")
    elif damage == "garbage-sign":
        (d / "node-2" / "node-2.sign").write_bytes(b"\x00" * 40)
    else:
        (d / "node-1" / "node-1.sign").write_bytes((ca / "node-0" / "node-0.sign").read_bytes())
    code, _, err = _cli(["swarm", "-n", "8", "-T", "4", "--eval-every", "4", "--graph",
                         "ring:k=2", "-p", "none", "--rule", "sfg-cut+certified", "--tls-dir",
                         str(d)], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
