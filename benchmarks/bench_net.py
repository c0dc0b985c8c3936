"""Networked nodes (SPEC §11), measured side by side in one run.

1. **Model exchange throughput on localhost**: the paper CNN (878,538 parameters, 3.5 MB of
   float32) delivered over sfg's gRPC transport — header + safetensors payload streamed in
   1 MiB chunks — versus a raw TCP socket copy of the same bytes. Three figures per
   repetition: raw TCP, the gRPC transport alone (receiver only counts bytes), and a full
   exchange (encode, send, receive, validate: digest, names/shapes/dtype, finiteness).
2. **Lockstep overhead**: ``N = 8`` digits MLP nodes in one process in lockstep mode versus
   ``sfg run --backend loop`` (same settings, same results), per round.
3. **N = 50 async nodes under FLASH-strict churn** (digits MLP) over worker processes on this
   machine: completes; wall time, memory per node (peak resident memory of the workers / N),
   messages.

    .venv/bin/python benchmarks/bench_net.py                   # all three (~2-4 min)
    .venv/bin/python benchmarks/bench_net.py --only throughput --repeats 20
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
import threading
import time
from pathlib import Path

import numpy as np

FLASH = "/work/shared/data/flash/flash_state_traces_subset.json"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------------- 1
def raw_tcp_seconds(data: bytes) -> float:
    """Seconds to copy ``data`` through a TCP socket on 127.0.0.1 (receiver reads it all)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    n = len(data)
    done = threading.Event()

    def receive() -> None:
        conn, _ = srv.accept()
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = conn.recv_into(view[got:], min(1 << 20, n - got))
            if not k:
                break
            got += k
        conn.sendall(b"k")
        conn.close()
        done.set()

    th = threading.Thread(target=receive)
    th.start()
    c = socket.create_connection(("127.0.0.1", port))
    t = time.perf_counter()
    c.sendall(data)
    c.recv(1)
    dt = time.perf_counter() - t
    c.close()
    th.join()
    srv.close()
    return dt


def bench_throughput(repeats: int) -> dict:
    from sfg.models import count_parameters, make_model
    from sfg.net.transport import Peer, Server
    from sfg.net.wire import Layout, check_message, encode
    from sfg.sim.params import ParamSpec, flatten

    model = make_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    D = count_parameters(model)
    layout = Layout.from_spec(ParamSpec.from_module(model))
    flat = flatten(model).numpy()
    header, payload = encode(flat, layout, sender=1, round=0, age=0, lag=0.0, count=1,
                             local_count=1)
    nbytes = len(header) + len(payload)

    async def run() -> tuple[list[float], list[float]]:
        validate = {"on": False}

        async def deliver(h, chunks, identity, peer):
            parts = [c async for c in chunks]
            if validate["on"]:
                check_message(h, b"".join(parts), layout, neighbours={1})
            return True, ""

        srv = Server(deliver, lambda t, w: None, max_bytes=1 << 27)
        port = await srv.start("127.0.0.1", 0)
        peer = Peer(f"127.0.0.1:{port}", max_bytes=1 << 27)
        await peer.deliver(header, payload)  # warm-up: connection set up
        transport, full = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            ok, _ = await peer.deliver(header, payload)
            transport.append(time.perf_counter() - t)
            assert ok
            validate["on"] = True
            t = time.perf_counter()
            h, p = encode(flat, layout, sender=1, round=0, age=0, lag=0.0, count=1,
                          local_count=1)
            ok, _ = await peer.deliver(h, p)
            full.append(time.perf_counter() - t)
            validate["on"] = False
            assert ok
        await peer.close()
        await srv.stop()
        return transport, full

    raw = []
    transport: list[float] = []
    full: list[float] = []
    data = header + payload
    raw_tcp_seconds(data)  # warm-up
    for _ in range(3):  # interleave: raw, then a batch of gRPC, repeatedly
        raw += [raw_tcp_seconds(data) for _ in range(max(1, repeats // 3))]
        tr, fu = asyncio.run(run())
        transport += tr
        full += fu
    mb = nbytes / 1e6
    out = {"params": D, "MB": mb,
           "raw_MBps": mb / statistics.median(raw),
           "grpc_MBps": mb / statistics.median(transport),
           "exchange_MBps": mb / statistics.median(full)}
    out["grpc_vs_raw"] = out["grpc_MBps"] / out["raw_MBps"]
    out["exchange_vs_raw"] = out["exchange_MBps"] / out["raw_MBps"]
    return out


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
            "send_failed": m["send_failed"], "refused": m["refused"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["throughput", "lockstep", "swarm50"], action="append")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the N = 50 swarm")
    ap.add_argument("--lockstep-rounds", type=int, default=50)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--period", type=float, default=0.5)
    ap.add_argument("--flash", default=FLASH)
    a = ap.parse_args()
    which = a.only or ["throughput", "lockstep", "swarm50"]
    print(f"load average at start: {_load()} ({os.cpu_count()} CPUs)")
    if "throughput" in which:
        r = bench_throughput(a.repeats)
        print(f"\n1. model exchange, paper CNN ({r['params']:,} parameters, {r['MB']:.2f} MB):")
        print(f"   raw TCP socket      {r['raw_MBps']:8.0f} MB/s")
        print(f"   gRPC transport      {r['grpc_MBps']:8.0f} MB/s  ({100 * r['grpc_vs_raw']:.0f} % of raw)")
        print(f"   full exchange       {r['exchange_MBps']:8.0f} MB/s  ({100 * r['exchange_vs_raw']:.0f} % of raw; "
              "encode + send + validate)")
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
