"""Running many nodes: in one asyncio loop, or over worker processes with a churn controller.

* :func:`run_nodes` — nodes of one process: start their servers, connect, run, close.
* :func:`summarise` — the nodes' results as the metrics of ``sfg run --json`` (docs/concepts/statistics.md#paired-statistics) plus
  wall time, messages rejected, restarts and per-node final staleness.
* :func:`run_swarm` — ``sfg swarm``: N nodes over P worker processes (``python -m
  sfg.net.worker``), each node with its own server port on 127.0.0.1. The controller reads the
  workers' progress lines, shows progress, and injects faults: ``--kill NODE@ROUND`` SIGKILLs the
  process holding NODE once NODE reports ROUND and restarts it from its checkpoints.

Churn: every node reads its availability from the trace of the run's outage process (any
``--process`` sfg reads: synthetic, ``flash:...``, ``trace:path=...``), row r for its round r; an
unavailable node stops training and its server refuses deliveries.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.net.cuts import Crash, Cut
from sfg.net.membership import check_node_peers, pooled
from sfg.net.node import Node, NodeConfig
from sfg.net.world import World
from sfg.world.peers import parse_peers


async def run_nodes(world: World, ids, make_config: Callable[[int], NodeConfig],
                    addresses: dict[int, str] | None = None,
                    ready: Callable[[dict[int, int]], Awaitable[float | None]] | None = None,
                    nodes_out: list | None = None) -> list[dict]:
    """Run nodes ``ids`` of ``world`` in this event loop; returns their results.

    ``addresses`` maps every node id to "host:port" (the ports these nodes listen on must match);
    without it the nodes listen on free ports of 127.0.0.1 and find each other directly.
    ``ready(ports)`` is awaited once every server listens; it may return the wall-clock start
    ``t0`` of round 0 (async mode) for the nodes that did not resume one from a checkpoint.
    """
    nodes = [Node(world, i, make_config(i)) for i in ids]
    if nodes_out is not None:
        nodes_out.extend(nodes)  # for inspection (tests, embedding)
    try:
        ports = {n.i: await n.start() for n in nodes}
        if addresses is None:
            addresses = {i: f"127.0.0.1:{p}" for i, p in ports.items()}
        for n in nodes:
            n.connect(addresses)
        if ready is not None:
            t0 = await ready(ports)
            for n in nodes:
                if t0 is not None and n.t0 is None:
                    n.t0 = t0
        results = await asyncio.gather(*(n.run() for n in nodes))
    finally:
        for n in nodes:
            await n.close()
    return list(results)


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def summarise(world: World, results: list[dict], *, wall: float, restarts: int = 0,
              realised: np.ndarray | None = None,
              evaluations: tuple[np.ndarray, np.ndarray] | None = None,
              round_seconds: float | None = None):
    """Swarm results as the one result type of a run (:class:`sfg.result.RunResult`):
    ``sfg run``'s metrics (docs/concepts/statistics.md#paired-statistics) plus the swarm's own figures; the nodes under ``nodes``.

    realised: bool [T, N] the availability the nodes actually had (default the trace).
    evaluations: (instants [K] in virtual seconds, accuracies [K, N]): the evaluations of
    every node at the clock's instants (the async nodes on the virtual clock), the curves
    then over ``hours`` as the clock's engine's; otherwise the nodes' own evaluations after
    their rounds (``round``), with ``hours`` too when ``round_seconds`` (Δ, virtual) is
    given. On the virtual clock the metrics add ``time_to_accuracy_h`` and
    ``reached_target`` (``target_accuracy``), computed as the clock's engine computes them.
    """
    from sfg.metrics import unavailability
    from sfg.net.diagnose import pool as pool_diagnostics
    from sfg.result import RunResult
    from sfg.sim.context import accuracy_metrics, clock_hours, curve_point, time_to_target

    res = sorted(results, key=lambda r: r["node"])
    avail = world.available if realised is None else realised
    K = int(world.cfg["local_steps"])
    curves: dict[str, list[float]] = {}
    if evaluations is not None:  # at the clock's instants
        instants, accs = evaluations
        acc = np.asarray(accs[-1], np.float64)
        points = [curve_point(np.asarray(a, np.float64)) for a in accs]
        curves["hours"] = clock_hours(list(instants))
    else:  # after the nodes' rounds
        acc = np.array([r["acc"] for r in res], np.float64)
        rounds = sorted({c[0] for r in res for c in r["curve"]})
        points = [curve_point(np.array([c[1] for r in res for c in r["curve"] if c[0] == t],
                                       np.float64)) for t in rounds]
        curves["round"] = [float(t) for t in rounds]
    curve_mean, curve_p10 = [m for m, _ in points], [p for _, p in points]
    curves.update(acc_mean=curve_mean, acc_p10=curve_p10)
    if evaluations is None and round_seconds is not None:
        curves["hours"] = clock_hours([r * float(round_seconds) for r in curves["round"]])
    timed = {}
    if "hours" in curves:
        timed = time_to_target(curves["hours"], curve_mean,
                               float(world.cfg.get("target_accuracy", 0.8)))
    messages = sum(r["messages"] for r in res)
    trains = sum(r["trains"] for r in res)
    metrics = {
        **accuracy_metrics(acc, curve_mean, avail.mean(axis=0),
                           world.attackers if world.cfg.get("attack") is not None else None),
        **timed,
        "messages": float(messages),
        "scalars": float(messages * world.scalars_per_message),
        # nominal bytes sent, as the clock's engine counts them (sfg.metrics); the encoded bytes
        # received beside them
        **sent_metrics(world, float(sum(r.get("headers", 0) for r in res))),
        "wire_bytes_received": float(sum(r["bytes"] for r in res)),
        "local_rounds": float(trains),
        "local_steps_rel": float(sum(r["steps"] for r in res) / (trains * K)) if trains else float("nan"),
        "unavailability": unavailability(avail.sum(axis=0), avail.shape[0]),
        "wall_seconds": float(wall),
        "rejected": float(sum(sum(r["rejected"].values()) for r in res)),
        "deliveries_refused": float(sum(r["refused"] for r in res)),
        "send_failed": float(sum(r["send_failed"] for r in res)),
        "restarts": float(restarts),
    }
    sent = sum(r.get("headers", 0) for r in res)
    if sent:
        metrics["header_bytes"] = float(sum(r.get("header_bytes", 0) for r in res) / sent)
    cert = [r["certified"] for r in res if r.get("certified")]
    if cert:  # +certified (sfg.net.certify): refusals and the signatures' cost
        checked = sum(c["checked"] for c in cert)
        metrics["claims_refused"] = float(sum(c["refuted"] for c in cert) / checked) \
            if checked else 0.0
        metrics["signatures"] = float(sum(c["signed"] for c in cert))
        metrics["verifications"] = float(sum(c["verified"] for c in cert))
        per_round = max(1, len(res) * world.rounds)
        metrics["sign_ms_per_node_round"] = 1e3 * sum(c["sign_s"] for c in cert) / per_round
        metrics["verify_ms_per_node_round"] = 1e3 * sum(c["verify_s"] for c in cert) / per_round
    metrics.update(return_metrics(res))
    metrics.update(pooled(res))  # peers chosen per exchange: per device-hour
    nodes = [{"node": r["node"], "acc": float(a), "attacker": bool(r.get("attacker", False)),
              **{k: r["state"][k] for k in
              ("age", "lag", "count", "local_count")}, "rejected": r["rejected"],
              "restored": r["restored"],
              **({"returns": r["returns"]} if r.get("returns") else {})}
             for r, a in zip(res, acc, strict=True)]
    # docs/concepts/diagnostics.md#training-diagnostics: the nodes' per-bin sums added (sfg.net.diagnose); None when none recorded
    diagnostics = pool_diagnostics(r.get("diagnostics") for r in res)
    return RunResult(metrics=metrics, curves=curves, accuracy=acc, diagnostics=diagnostics,
                     extra={"nodes": nodes})


# the nodes' return counts summed into the swarm's metrics (docs/concepts/nodes.md#returns-in-the-node):
# result key -> metric name
# (sfg.metrics: the counts that the clock's engine counts alike share its names)
RETURN_METRICS = {"returns": "returns", "returns_heard": "returns_heard",
                  "returns_alone": "returns_unanswered", "requests": "pull_requests_made",
                  "replies": "pull_replies_delivered",
                  "replies_unused": "pull_replies_unused", "empty": "pull_empty_received",
                  "unreachable": "pull_unreachable_received", "rejected": "pull_rejected",
                  "bytes": "wire_pull_bytes_received", "wait_s": "pull_wait_seconds",
                  "abandoned": "pull_abandoned", "lost": "pull_replies_lost"}


def sent_metrics(world: World, messages_sent: float,
                 message_bytes: float | None = None) -> dict[str, float]:
    """``messages_sent`` and the nominal ``bytes`` they make: ``message_bytes`` each
    (default the run's: the model's float32 parameters and a header, as the clock's engine
    counts them, :meth:`sfg.sim.context.Run.clock_settings`)."""
    if message_bytes is None:
        message_bytes = world.run.clock_settings().message_bytes if world.run is not None \
            else None
    return {"messages_sent": float(messages_sent),
            "bytes": float(messages_sent * float(message_bytes or 0.0))}


def return_metrics(results: list[dict]) -> dict[str, float]:
    """The nodes' returns (async) and, with ``on_return: pull``, their requests, answers,
    bytes and waits, summed over the nodes; nothing for nodes that report none (lockstep)."""
    rets = [r["returns"] for r in results if r.get("returns")]
    out: dict[str, float] = {}
    for key, name in RETURN_METRICS.items():
        vals = [x[key] for x in rets if key in x]
        if vals:
            out[name] = float(sum(vals))
    return out


# ----------------------------------------------------------------------------------- processes
@dataclass
class SwarmOptions:
    """``sfg swarm`` options beyond the run settings."""

    mode: str = "lockstep"
    procs: int = 1
    period: float = 0.2
    jitter: float = 0.0
    window: float = 1.0
    deadline: float = 60.0
    kills: list[tuple[int, int]] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    tls_dir: str | None = None
    workdir: str | None = None
    start_delay: float = 0.0
    record_log: str | None = None   # async: write the run's event log here (sfg.net.eventlog)
    pull_timeout: float | None = None  # on_return pull:timeout=S (the run's setting), checked here
    peers: str | None = None   # peers chosen per exchange (sfg.net.membership), every node's

    def __post_init__(self) -> None:
        if self.mode not in ("lockstep", "async"):
            raise SfgError(f"unknown mode {self.mode!r}; choose lockstep or async")
        if self.record_log is not None and self.mode != "async":
            raise SfgError("--record-log records async runs (a lockstep run's models do not "
                           "depend on its timing); add --protocol async")
        if self.procs < 1:
            raise SfgError(f"--procs must be >= 1, got {self.procs}")
        for p in self.partitions:
            Cut.parse_rounds(p)
        if self.record_log is not None and self.pull_timeout is not None:
            raise SfgError("--record-log replays arrivals on the virtual clock, whose node does "
                           "not implement on_return pull; drop --record-log or --on-return")
        NodeConfig(mode=self.mode, period=self.period, jitter=self.jitter, window=self.window,
                   deadline=self.deadline, pull_timeout=self.pull_timeout,
                   peers=self.peers)  # every node's checks


def parse_kill(text: str) -> tuple[int, int]:
    """``"3@10"`` -> (node 3, round 10): a real swarm's ``--kill`` (:class:`sfg.net.cuts.Crash`)."""
    return Crash.parse_round(text).pair


def _rss_bytes(pid: int) -> float | None:
    """Resident memory of a process (Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def groups(n: int, procs: int) -> list[list[int]]:
    """Nodes 0..n-1 dealt round-robin over ``procs`` worker processes."""
    procs = max(1, min(procs, n))
    return [list(range(p, n, procs)) for p in range(procs)]


async def _launch(spec_path: Path, ids: list[int], resume: bool) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    args = [sys.executable, "-m", "sfg.net.worker", str(spec_path),
            "--nodes", ",".join(map(str, ids))]
    if resume:
        args.append("--resume")
    return await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env)


def check_nodes(world: World, opts: SwarmOptions) -> None:
    N = world.n
    for node, r in opts.kills:
        if node >= N:
            raise SfgError(f"--crash {node}@{r}r: node {node} does not exist; nodes are "
                           f"0..{N - 1}")
    for p in opts.partitions:
        part = Cut.parse_rounds(p)
        bad = sorted(x for x in part.nodes if x >= N)
        if bad:
            raise SfgError(f"--cut {Cut.parse_rounds(p).text()!r}: node {bad[0]} does not "
                           f"exist; nodes are 0..{N - 1}")
    from sfg.net.certify import NO_KEYS, Keys, check_run

    check_run(world, opts.mode)
    check_node_peers(parse_peers(opts.peers), world, opts.mode)
    if world.rule.certified:
        if opts.tls_dir is None:
            raise SfgError(NO_KEYS)
        Keys.check_folder(opts.tls_dir, range(N))


async def _swarm(world: World, opts: SwarmOptions, progress) -> dict[str, Any]:
    N = world.n
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="sfg-swarm-"))
    work.mkdir(parents=True, exist_ok=True)
    ports = free_ports(N)
    spec = {"cfg": world.cfg, "mode": opts.mode, "ports": ports, "period": opts.period,
            "jitter": opts.jitter, "window": opts.window, "deadline": opts.deadline,
            "partitions": opts.partitions, "tls_dir": opts.tls_dir, "peers": opts.peers,
            "checkpoint_dir": str(work / "checkpoints"),
            "results_dir": str(work / "results")}
    (work / "checkpoints").mkdir(exist_ok=True)
    (work / "results").mkdir(exist_ok=True)
    if opts.record_log is not None:  # each node appends to its own log; merged at the end
        events = work / "events"
        events.mkdir(exist_ok=True)
        for f in events.glob("node-*"):
            f.unlink()
        spec["events_dir"] = str(events)
    spec_path = work / "swarm.json"
    spec_path.write_text(json.dumps(spec))
    parts = groups(N, opts.procs)
    # a killed node gets a process of its own
    killed = sorted({k for k, _ in opts.kills})
    if killed:
        rest = [i for i in range(N) if i not in killed]
        parts = [[k] for k in killed]
        if rest:
            parts += [[rest[j] for j in g]
                      for g in groups(len(rest), max(1, opts.procs - len(killed)))]
    pending_kills = sorted(opts.kills, key=lambda x: x[1])
    restarts = 0
    done: dict[int, dict] = {}
    live_round: dict[int, int] = {}
    errors: list[str] = []
    realised = world.available.copy()

    peak_rss: dict[int, float] = {}          # worker slot -> peak resident memory (bytes)
    live_pids: dict[int, int] = {}

    async def sample_memory() -> None:
        while True:
            for slot, pid in list(live_pids.items()):
                rss = _rss_bytes(pid)
                if rss is not None:
                    peak_rss[slot] = max(peak_rss.get(slot, 0.0), rss)
            await asyncio.sleep(0.25)

    # round 0 starts (async clocks) once every worker's servers listen: workers report
    # "ready" and wait for the start time on stdin; a restarted worker gets the same one
    start_at: asyncio.Future = asyncio.get_running_loop().create_future()
    ready_slots: set[int] = set()

    async def send_start(proc) -> None:
        t0 = await start_at
        proc.stdin.write(f"{t0!r}\n".encode())
        await proc.stdin.drain()

    async def supervise(slot: int, ids: list[int]) -> None:
        nonlocal restarts
        resume = False
        while True:
            proc = await _launch(spec_path, ids, resume)
            live_pids[slot] = proc.pid
            killed_now = False
            starter = None
            assert proc.stdout is not None
            async for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if ev.get("event") == "ready":
                    ready_slots.add(slot)
                    if len(ready_slots) == len(parts) and not start_at.done():
                        start_at.set_result(time.time() + 0.2 + opts.start_delay)
                    starter = asyncio.ensure_future(send_start(proc))
                elif ev.get("event") == "round":
                    i, r = int(ev["node"]), int(ev["round"])
                    live_round[i] = r
                    if progress is not None:
                        progress(ev)
                    for kn, kr in list(pending_kills):
                        if kn == i and r >= kr:
                            pending_kills.remove((kn, kr))
                            proc.send_signal(signal.SIGKILL)
                            killed_now = True
                elif ev.get("event") == "done":
                    done[int(ev["node"])] = ev["result"]
            await proc.wait()
            if starter is not None:
                starter.cancel()
            err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
            if killed_now:
                restarts += 1
                resume = True
                continue
            live_pids.pop(slot, None)
            if proc.returncode != 0:
                lines = [ln for ln in err.strip().splitlines() if ln.strip()]
                first_error = not errors
                errors.append(lines[-1] if lines else f"worker exited with {proc.returncode}")
                if first_error:  # fail fast: the others would only wait for its nodes
                    for pid in list(live_pids.values()):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            return

    start = time.perf_counter()
    wall_start = time.time()
    sampler = asyncio.ensure_future(sample_memory())
    try:
        await asyncio.gather(*(supervise(slot, ids) for slot, ids in enumerate(parts)))
    finally:
        sampler.cancel()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(errors[0].removeprefix("error: "))
    missing = sorted(set(range(N)) - set(done))
    if missing:
        raise RuntimeError(f"nodes {missing[:5]} finished without a result")
    out = summarise(world, list(done.values()), wall=wall, restarts=restarts, realised=realised)
    if opts.record_log is not None:
        from sfg.net.eventlog import merge

        merge(sorted(Path(spec["events_dir"]).glob("node-*.jsonl")), opts.record_log,
              settings={"procs": opts.procs, "kills": [f"{k}@{r}" for k, r in opts.kills]})
        out["record_log"] = str(opts.record_log)
    # a worker's memory is shared by its nodes (one interpreter, torch, the data set)
    out["metrics"]["rss_mb_per_node"] = (sum(peak_rss.values()) / 2**20 / N if peak_rss
                                         else float("nan"))
    out["metrics"]["startup_seconds"] = (start_at.result() - opts.start_delay - wall_start
                                         if start_at.done() else float("nan"))
    out["workdir"] = str(work)
    return out


def run_swarm(world: World, opts: SwarmOptions, *, progress=None) -> dict[str, Any]:
    """``sfg swarm``: run the world's N nodes over worker processes; the summary dict."""
    check_nodes(world, opts)
    return asyncio.run(_swarm(world, opts, progress))
