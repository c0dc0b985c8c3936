"""Networked nodes (docs/concepts/nodes.md#networked-nodes), measured side by side in one run.

1. **Model exchange throughput on localhost**: the paper CNN (878,538 parameters, 3.5 MB of
   float32) delivered over sfg's gRPC transport — header + safetensors payload streamed in
   1 MiB chunks, encoded once in chunks as a node does — versus a raw TCP socket copy of the
   same bytes, to a receiver in another process (as between two nodes). Three figures per
   repetition, interleaved: raw TCP, the gRPC transport alone (the receiver only reads the
   bytes), and a full exchange (encode, send, receive, validate: digest,
   names/shapes/dtype, finiteness).
   **Fetch** (a lockstep node's pull): the same message pulled with ``Peer.fetch`` — bounded
   (the header read first, the stream stopped at the first chunk past the
   announced length or the node's limit) — versus the unbounded read it replaced (every
   chunk appended, then joined), interleaved in one run.
2. **Lockstep overhead**: ``N = 8`` digits MLP nodes in one process in lockstep mode versus
   ``sfg run --backend loop`` (same settings, same results), per round.
3. **N = 50 async nodes under FLASH-strict churn** (digits MLP) over worker processes on this
   machine: completes; wall time, memory per node (peak resident memory of the workers / N),
   messages.

    .venv/bin/python benchmarks/bench_net.py                   # all three (~2-4 min)
    .venv/bin/python benchmarks/bench_net.py --only throughput --repeats 20
    .venv/bin/python benchmarks/bench_net.py --only fetch --repeats 30
    .venv/bin/python benchmarks/bench_net.py --only swarm50 --flash PATH --rounds 60

Timings are medians over ``--repeats``; the load average is printed alongside (the
development machine is a shared 2-core VM).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from machine import banner

FLASH = "/work/shared/data/flash/flash_state_traces_subset.json"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------------- 1
def _paper_cnn():
    from sfg.net.wire import Layout
    from sfg.sim.params import ParamSpec, flatten
    from sfg.world.models import count_parameters, make_model

    model = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    return count_parameters(model), Layout.from_spec(ParamSpec.from_module(model)), \
        flatten(model).numpy()


def _raw_receive(srv: socket.socket) -> None:
    """Raw TCP receiver: per connection an 8-byte length, then that many bytes; replies b"k"."""
    while True:
        conn, _ = srv.accept()
        head = b""
        while len(head) < 8:
            head += conn.recv(8 - len(head))
        n = int.from_bytes(head, "little")
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = conn.recv_into(view[got:], min(1 << 20, n - got))
            if not k:
                break
            got += k
        conn.sendall(b"k")
        conn.close()


def receiver_main() -> None:
    """The receiving process: a raw TCP receiver and sfg's gRPC server; prints both ports.
    A message with round 0 is only read (transport); round 1 is also validated as a node does
    (payload joined, SHA-256, names/shapes/dtype, byte ranges, finiteness)."""
    from sfg.net.transport import Server
    from sfg.net.wire import check_message, unpack_header

    _, layout, _ = _paper_cnn()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    threading.Thread(target=_raw_receive, args=(srv,), daemon=True).start()

    async def deliver(h, chunks, identity, peer):
        parts = [c async for c in chunks]
        if unpack_header(h).round == 1:
            check_message(h, b"".join(parts), layout, neighbours={1})
        return True, ""

    from sfg.net.transport import CHUNK
    from sfg.net.wire import encode

    _, _, flat = _paper_cnn()
    own = encode(flat, layout, sender=1, round=0, age=0, lag=0.0, count=1, local_count=1,
                 chunk=CHUNK)

    async def run() -> None:
        server = Server(deliver, lambda t, w: own if t == 0 else None, max_bytes=1 << 27)
        port = await server.start("127.0.0.1", 0)
        print(port, srv.getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await server.stop()

    asyncio.run(run())


def _start_receiver():
    """The receiving node in another process (``--receiver``): (process, (gRPC port, raw
    TCP port)), read from its first line."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, __file__, "--receiver"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    ports = tuple(map(int, proc.stdout.readline().split()))
    return proc, ports


def _stop_receiver(proc) -> None:
    """Tell the receiver to stop (a line on its stdin) and wait for it."""
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)


def raw_tcp_seconds(data: bytes, port: int) -> float:
    """Seconds to copy ``data`` through a TCP socket to the receiver on 127.0.0.1:port."""
    c = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    c.sendall(len(data).to_bytes(8, "little"))
    c.sendall(data)
    c.recv(1)
    dt = time.perf_counter() - t
    c.close()
    return dt


def bench_throughput(repeats: int) -> dict:
    """Sender here, receiver in another process (two nodes are two processes); per repetition
    a raw TCP copy, a gRPC delivery of the node's pre-chunked message, and a full exchange
    (encode + deliver + validate), interleaved. Ratios are medians of per-repetition ratios."""

    from sfg.net.transport import CHUNK, Peer
    from sfg.net.wire import encode

    D, layout, flat = _paper_cnn()

    def message(r: int):
        return encode(flat, layout, sender=1, round=r, age=0, lag=0.0, count=1, local_count=1,
                      chunk=CHUNK)

    header, payload = message(0)
    nbytes = len(header) + payload.nbytes
    data = header + payload.join()
    proc, (grpc_port, raw_port) = _start_receiver()
    try:
        flat_payload = payload.join()

        async def run() -> tuple[list[float], list[float], list[float], list[float]]:
            peer = Peer(f"127.0.0.1:{grpc_port}", max_bytes=1 << 27)
            for r in (0, 1):  # warm-up: connection set up, both receive paths
                assert (await peer.deliver(*message(r)))[0]
            raw_tcp_seconds(data, raw_port)
            raw, transport, full, sliced = [], [], [], []

            async def timed(out: list, send) -> None:
                t = time.perf_counter()
                ok, _ = await send()
                out.append(time.perf_counter() - t)
                assert ok

            async def raw_copy():
                raw.append(raw_tcp_seconds(data, raw_port))
                return True, ""

            steps = [lambda: raw_copy(),
                     lambda: timed(transport, lambda: peer.deliver(header, payload)),
                     # the same bytes, sliced into chunks at each send
                     lambda: timed(sliced, lambda: peer.deliver(header, flat_payload)),
                     lambda: timed(full, lambda: peer.deliver(*message(1)))]
            for k in range(repeats):  # the order rotates: no figure always comes first
                for step in steps[k % 4:] + steps[:k % 4]:
                    await step()
            await peer.close()
            return raw, transport, full, sliced

        raw, transport, full, sliced = asyncio.run(run())
    finally:
        _stop_receiver(proc)
    mb = nbytes / 1e6
    med = statistics.median
    out = {"params": D, "MB": mb, "raw_MBps": mb / med(raw), "grpc_MBps": mb / med(transport),
           "exchange_MBps": mb / med(full),
           "grpc_vs_raw": med(r / g for r, g in zip(raw, transport, strict=True)),
           "exchange_vs_raw": med(r / f for r, f in zip(raw, full, strict=True)),
           "sliced_MBps": mb / med(sliced),
           "sliced_vs_raw": med(r / g for r, g in zip(raw, sliced, strict=True))}
    return out


async def unbounded_fetch(peer, t: int, me: int, timeout: float = 10.0):
    """The fetch before bounded transfers: every streamed chunk appended, nothing checked."""
    import grpc
    import msgpack

    try:
        parts = []
        req = msgpack.packb({"round": int(t), "node": int(me)})
        async for part in peer._fetch(req, timeout=timeout):
            parts.append(part)
    except grpc.aio.AioRpcError:
        return None
    if not parts:
        return None
    return parts[0], b"".join(parts[1:])


def bench_fetch(repeats: int) -> dict:
    """A pull of the paper CNN's message from a node in another process: ``Peer.fetch``
    (bounded) and the unbounded read it replaced, alternating, on one channel."""

    from sfg.net.transport import Peer

    proc, (grpc_port, _) = _start_receiver()
    try:

        async def run():
            peer = Peer(f"127.0.0.1:{grpc_port}", max_bytes=1 << 27)
            ref = await unbounded_fetch(peer, 0, 0)
            got = await peer.fetch(0, 0)
            assert ref is not None and got == ref
            old, new = [], []
            for k in range(repeats):
                pair = [(old, unbounded_fetch), (new, Peer.fetch)]
                for out, fn in pair[k % 2:] + pair[:k % 2]:
                    t = time.perf_counter()
                    m = await fn(peer, 0, 0)
                    out.append(time.perf_counter() - t)
                    assert m is not None
            await peer.close()
            return len(ref[0]) + len(ref[1]), old, new

        nbytes, old, new = asyncio.run(run())
    finally:
        _stop_receiver(proc)
    mb = nbytes / 1e6
    med = statistics.median
    return {"MB": mb, "unbounded_MBps": mb / med(old), "bounded_MBps": mb / med(new),
            "bounded_vs_unbounded": med(o / n for o, n in zip(old, new, strict=True))}


# ----------------------------------------------------------------------------------- 2
def bench_lockstep(rounds: int) -> dict:
    import torch

    from sfg.net.node import NodeConfig
    from sfg.net.swarm import run_nodes
    from sfg.net.world import build_world
    from sfg.sim.run import simulate

    torch.set_num_threads(1)
    cfg = dict(n_clients=8, rounds=rounds, process="bursty:u=0.8", rule="sfg-cut",
               dataset="digits", model="mlp", seed=1, eval_every=rounds)
    simulate({**cfg, "rounds": 20, "eval_every": 20}, backend="loop")  # warm-up
    t = time.perf_counter()
    sim = simulate(cfg, backend="loop")
    t_sim = time.perf_counter() - t
    world = build_world(cfg)
    t = time.perf_counter()
    res = asyncio.run(run_nodes(world, range(8), lambda i: NodeConfig(mode="lockstep")))
    t_net = time.perf_counter() - t
    same = np.allclose(sorted(r["acc"] for r in res), sorted(sim.accuracy.tolist()), atol=0)
    return {"rounds": rounds, "sim_ms_per_round": 1e3 * t_sim / rounds,
            "net_ms_per_round": 1e3 * t_net / rounds,
            "overhead_ms_per_round": 1e3 * (t_net - t_sim) / rounds,
            "ratio": t_net / t_sim, "same_accuracies": bool(same)}


# ----------------------------------------------------------------------------------- 3
def bench_swarm50(flash: str, rounds: int, procs: int, period: float) -> dict:
    from sfg.net.swarm import SwarmOptions, run_swarm
    from sfg.net.world import build_world

    cfg = dict(n_clients=50, rounds=rounds, process=f"flash:rule=strict,replace=true,path={flash}",
               rule="sfg-cut", dataset="digits", model="mlp", seed=1,
               eval_every=max(1, rounds // 3))
    world = build_world(cfg)
    t = time.perf_counter()
    out = run_swarm(world, SwarmOptions(mode="async", procs=procs, period=period, jitter=0.2,
                                        start_delay=2.0))
    m = out["metrics"]
    return {"nodes": 50, "rounds": rounds, "procs": procs, "period_s": period,
            "wall_s": time.perf_counter() - t, "rss_mb_per_node": m["rss_mb_per_node"],
            "startup_s": m["startup_seconds"],
            "acc_mean": m["acc_mean"], "messages": m["messages"],
            "unavailability": m["unavailability"], "rejected": m["rejected"],
            "send_failed": m["send_failed"], "deliveries_refused": m["deliveries_refused"]}


def main() -> None:
    if "--receiver" in sys.argv:
        receiver_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["throughput", "fetch", "lockstep", "swarm50"],
                    action="append")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the N = 50 swarm")
    ap.add_argument("--lockstep-rounds", type=int, default=50)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--period", type=float, default=0.5)
    ap.add_argument("--flash", default=FLASH)
    a = ap.parse_args()
    print(banner(), flush=True)
    which = a.only or ["throughput", "fetch", "lockstep", "swarm50"]
    print(f"load average at start: {_load()} ({os.cpu_count()} CPUs)")
    if "throughput" in which:
        r = bench_throughput(a.repeats)
        print(f"\n1. model exchange, paper CNN ({r['params']:,} parameters, {r['MB']:.2f} MB):")
        print(f"   raw TCP socket      {r['raw_MBps']:8.0f} MB/s")
        print(f"   gRPC transport      {r['grpc_MBps']:8.0f} MB/s  ({100 * r['grpc_vs_raw']:.0f} % of raw)")
        print(f"   gRPC, sliced per send {r['sliced_MBps']:6.0f} MB/s  ({100 * r['sliced_vs_raw']:.0f} % of raw; "
              "a bytes payload cut into chunks at each send)")
        print(f"   full exchange       {r['exchange_MBps']:8.0f} MB/s  ({100 * r['exchange_vs_raw']:.0f} % of raw; "
              "encode + send + validate)")
    if "fetch" in which:
        r = bench_fetch(a.repeats)
        print(f"\n1b. fetch (a lockstep pull), paper CNN, {r['MB']:.2f} MB, interleaved:")
        print(f"   unbounded read (before) {r['unbounded_MBps']:6.0f} MB/s")
        print(f"   Peer.fetch, bounded     {r['bounded_MBps']:6.0f} MB/s  "
              f"({100 * r['bounded_vs_unbounded']:.0f} % of before, median of pairs)")
    if "lockstep" in which:
        r = bench_lockstep(a.lockstep_rounds)
        print(f"\n2. lockstep, N = 8 digits MLP, {r['rounds']} rounds (same accuracies as the "
              f"simulator: {r['same_accuracies']}):")
        print(f"   sfg run --backend loop   {r['sim_ms_per_round']:7.1f} ms/round")
        print(f"   lockstep swarm (1 proc)  {r['net_ms_per_round']:7.1f} ms/round  "
              f"(+{r['overhead_ms_per_round']:.1f} ms, {r['ratio']:.2f}×)")
    if "swarm50" in which:
        if not Path(a.flash).is_file():
            print(f"\n3. skipped: FLASH trace {a.flash} not found (--flash PATH)")
        else:
            r = bench_swarm50(a.flash, a.rounds, a.procs, a.period)
            print(f"\n3. N = 50 async nodes, FLASH strict, {r['rounds']} rounds of "
                  f"{r['period_s']} s over {r['procs']} processes: completed in "
                  f"{r['wall_s']:.0f} s ({r['startup_s']:.0f} s of it starting the workers)")
            print(f"   memory {r['rss_mb_per_node']:.0f} MB per node; accuracy "
                  f"{r['acc_mean']:.3f}; unavailability {r['unavailability']:.2f}; "
                  f"messages {r['messages']:.0f}; rejected {r['rejected']:.0f}; "
                  f"failed sends {r['send_failed']:.0f}")
    print(f"\nload average at end: {_load()}")


if __name__ == "__main__":
    main()
