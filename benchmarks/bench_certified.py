"""What ``+certified`` costs between networked nodes (sfg.net.certify).

Two measurements, side by side in one run:

* **per degree** (``--degrees``): a node of degree d in a clique of d + 1 nodes, every node
  citing the d stamps it heard in the previous round. Header bytes plain and certified; the
  time to sign one round's message (stamp, prior, header: three Ed25519 signatures); the
  time to verify one round's d received messages in steady state (stamps seen before are not
  verified again) and with every stamp verified afresh, with the verification counts.
* **a swarm** (``--nodes``, ``--rounds``): the same in-process lockstep swarm over gRPC on
  127.0.0.1 with ``sfg-cut`` and ``sfg-cut+certified``, interleaved over ``--repeats``
  repetitions (minimum wall time of each): seconds per round, their ratio, header and payload
  bytes per message, signing and verification ms per node-round.

    python benchmarks/bench_certified.py [--degrees 2,4,8,16,32] [--nodes 16] [--rounds 10]
                                         [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402


def per_degree(d: int, ca: Path, repeats: int) -> dict:
    from sfg.net.certify import Keys, make_cert, make_stamp, read_cert
    from sfg.net.wire import make_header, unpack_header

    n = d + 1
    keys = {i: Keys.load(ca, i, range(n)) for i in range(n)}
    everyone = frozenset(range(n))
    nbrs = {i: everyone - {i} for i in range(n)}
    digest = (b"\1" * 32, 1 << 20)

    def message(i: int, r: int, prev: dict[int, bytes]) -> bytes:
        k = keys[i]
        cert = make_cert(make_stamp(k, r, 0, 1.5, 7), make_stamp(k, r - 1, 0, 1.5, 6),
                         nbrs[i], [prev[j] for j in sorted(nbrs[i])])
        return make_header(digest, sender=i, round=r, age=0, lag=1.5, count=7, local_count=7,
                           cert=cert, sign=k.sign)

    plain = len(make_header(digest, sender=1, round=3, age=0, lag=1.5, count=7, local_count=7))
    prev = {i: make_stamp(keys[i], 2, 0, 1.5, 6) for i in range(n)}
    t = time.perf_counter()
    for _ in range(repeats):
        msgs = {i: message(i, 3, prev) for i in range(1, n)}
    sign_ms = 1e3 * (time.perf_counter() - t) / (repeats * d)
    rx = keys[0]

    def verify_round(fresh: bool) -> tuple[float, int]:
        best, count = float("inf"), 0
        for _ in range(repeats):
            rx.stamps.clear()
            for s in prev.values():  # last round: the neighbours' stamps arrived and were checked
                from sfg.net.certify import read_stamp

                read_stamp(s, rx)
            before = rx.verified
            t = time.perf_counter()
            for raw in msgs.values():
                if fresh:
                    rx.stamps.clear()
                read_cert(unpack_header(raw), rx, nbrs.__getitem__)
            best = min(best, time.perf_counter() - t)
            count = rx.verified - before
        return 1e3 * best, count

    steady_ms, steady_n = verify_round(False)
    fresh_ms, fresh_n = verify_round(True)
    return {"degree": d, "header_bytes_plain": plain,
            "header_bytes_certified": len(next(iter(msgs.values()))),
            "sign_ms_per_round": sign_ms, "verify_ms_per_round": steady_ms,
            "verifications_per_round": steady_n, "verify_ms_per_round_uncached": fresh_ms,
            "verifications_per_round_uncached": fresh_n}


def swarm(ca: Path, nodes: int, rounds: int, repeats: int) -> dict:
    from sfg.net.certify import Keys
    from sfg.net.node import NodeConfig
    from sfg.net.swarm import run_nodes, summarise
    from sfg.net.world import build_world

    cfg = dict(n_clients=nodes, rounds=rounds, process="bursty:u=0.5", model="mlp",
               dataset="digits", seed=1, eval_every=rounds)
    out: dict[str, dict] = {}
    for _ in range(repeats):
        for rule in ("sfg-cut", "sfg-cut+certified"):
            world = build_world({**cfg, "rule": rule})
            keys = {i: Keys.load(ca, i, range(nodes)) for i in range(nodes)} \
                if world.rule.certified else {}
            t = time.perf_counter()
            res = asyncio.run(run_nodes(world, range(nodes), lambda i, keys=keys: NodeConfig(
                mode="lockstep", deadline=120, keys=keys.get(i))))
            wall = time.perf_counter() - t
            m = summarise(world, res, wall=wall)["metrics"]
            if rule not in out or wall < out[rule]["wall_s"]:
                out[rule] = {"wall_s": wall, "s_per_round": wall / rounds,
                             "header_bytes": m["header_bytes"],
                             "payload_bytes": world.layout.payload_bytes,
                             "sign_ms_per_node_round": m.get("sign_ms_per_node_round"),
                             "verify_ms_per_node_round": m.get("verify_ms_per_node_round"),
                             "claims_refused": m.get("claims_refused")}
    out["ratio"] = {"s_per_round": out["sfg-cut+certified"]["s_per_round"]
                    / out["sfg-cut"]["s_per_round"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degrees", default="2,4,8,16,32")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from sfg.net.tls import make_test_ca

    degrees = [int(x) for x in a.degrees.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        ca = make_test_ca(Path(tmp) / "ca", range(max(max(degrees) + 1, a.nodes)))
        rows = [per_degree(d, ca, a.repeats) for d in degrees]
        sw = swarm(ca, a.nodes, a.rounds, a.repeats)
    result = {"machine": describe(), "per_degree": rows, "swarm": sw,
              "swarm_config": {"nodes": a.nodes, "rounds": a.rounds, "repeats": a.repeats}}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"machine: {result['machine']}")
    print("degree  header B plain  certified  sign ms/round  verify ms/round (verifs)  "
          "uncached ms (verifs)")
    for r in rows:
        print(f"{r['degree']:>6}  {r['header_bytes_plain']:>14}  {r['header_bytes_certified']:>9}"
              f"  {r['sign_ms_per_round']:>13.3f}  {r['verify_ms_per_round']:>10.3f} "
              f"({r['verifications_per_round']:>4})  {r['verify_ms_per_round_uncached']:>11.3f}"
              f" ({r['verifications_per_round_uncached']:>4})")
    p, c = sw["sfg-cut"], sw["sfg-cut+certified"]
    print(f"swarm N={a.nodes} T={a.rounds} lockstep over gRPC: {p['s_per_round']:.3f} s/round "
          f"plain, {c['s_per_round']:.3f} certified (x{sw['ratio']['s_per_round']:.2f}); "
          f"header {p['header_bytes']:.0f} -> {c['header_bytes']:.0f} B per message "
          f"(payload {c['payload_bytes']} B); sign {c['sign_ms_per_node_round']:.3f} ms, "
          f"verify {c['verify_ms_per_node_round']:.3f} ms per node-round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
