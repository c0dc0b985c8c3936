"""One swarm from one run's settings: the node on the virtual clock or real nodes, built and
run the same way for every entry point — ``sfg swarm``, :func:`sfg.swarm`, a grid's run with
``nodes`` set, and the tests (docs/concepts/engines.md#one-run-every-engine).

The run's settings (:class:`sfg.experiments.config.RunConfig`) say everything that decides its
results, resolved once and stored: ``nodes`` (virtual or real), ``protocol``, the timer
(``period``, ``jitter``, ``window``: virtual seconds on the virtual clock, where P is also
Δ; wall seconds for real nodes, ``period`` 0.2 s where none is given), the clock world and
``faults`` on the virtual clock, ``on_return``, and ``backend`` (the nodes' ``auto`` is
``loop``). What is left here only hosts the run: a lockstep round's ``deadline`` (a missing
message past it is an error, never a different result), real nodes' worker processes
(``procs``; 0 runs every node in this process), their ``workdir``, TLS keys, event log, and
the crashes and cuts of ``sfg swarm``'s ``--crash``/``--cut`` for real nodes.

This module imports nothing heavy: the swarm's modules load when a swarm runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sfg.errors import SfgError

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only
    from sfg.experiments.config import RunConfig
    from sfg.result import RunResult

#: a lockstep round's longest wait for real nodes, in wall seconds (``sfg swarm``, ``sfg
#: node`` and :func:`sfg.swarm`); on the virtual clock the default is the run's T·P
REAL_DEADLINE = 300.0
# the clock world's settings the virtual network takes (the clock's own names)
WORLD_KEYS = ("compute", "uplink", "latency", "loss", "message_bytes")


def run_nodes_config(cfg: RunConfig, *, deadline: float | None = None, procs: int = 1,
                     workdir: str | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     on_round: Callable[[dict], None] | None = None,
                     kills: Sequence[tuple[int, int]] = (), partitions: Sequence[str] = (),
                     tls_dir: str | None = None, record_log: str | None = None,
                     edges: Any = None, peers: str | None = None) -> RunResult:
    """Build and run the swarm of ``cfg`` (``nodes`` virtual or real) and return its
    :class:`sfg.result.RunResult` with ``meta``: ``config`` (the stored settings),
    ``run_id`` and ``engine``.

    ``progress(done, total)`` counts node-rounds; ``on_round(event)`` gets real nodes' round
    events (node, round, available, acc). Real nodes only: ``procs`` worker processes (0:
    every node in this process's event loop, no checkpoints or crashes), ``workdir``,
    ``kills`` (node, round) and ``partitions`` (cuts in rounds), ``tls_dir``, ``record_log``;
    ``edges`` replace the graph's (in this process only); ``peers``: the nodes' peers chosen
    per exchange (docs/concepts/peers.md#real-nodes), as the settings' ``peers`` (which it
    must not contradict). A failed real node raises ``RuntimeError``."""
    from sfg.engines import engine_of, refuse
    from sfg.experiments.config import run_id
    from sfg.world.peers import parse_peers

    c = cfg.model_dump()
    engine = engine_of(c)
    refuse(engine, c)  # before anything is built: one line naming the engine and setting
    if peers is not None and c.get("peers") is not None and \
            str(parse_peers(peers)) != str(parse_peers(c["peers"])):
        raise SfgError(f"peers {peers!r} and the settings' peers {c['peers']!r} disagree; "
                       "give one")
    peers = c.get("peers") if peers is None else peers
    if cfg.nodes == "virtual":
        res = _virtual(c, deadline, progress)
    elif cfg.nodes == "real":
        res = _real(c, deadline=deadline, procs=procs, workdir=workdir, progress=progress,
                    on_round=on_round, kills=kills, partitions=partitions, tls_dir=tls_dir,
                    record_log=record_log, edges=edges, peers=peers)
    else:
        raise SfgError("nodes none: the run is the simulators' (sfg run); give nodes virtual "
                       "(the node on the virtual clock) or real (real nodes over gRPC)")
    res.meta.update(config=cfg.model_dump(mode="json"), run_id=run_id(cfg), engine=engine)
    return res


def _virtual(c: dict[str, Any], deadline: float | None,
             progress: Callable[[int, int], None] | None) -> RunResult:
    from sfg.clock.faults import Faults
    from sfg.clock.settings import parse_on_return
    from sfg.net.swarm import SwarmOptions
    from sfg.net.virtual import run_virtual_swarm
    from sfg.net.world import build_world

    P = float(c["period"])  # resolved: also Δ (round_seconds)
    opts = SwarmOptions(mode=c["protocol"], procs=1, period=P, jitter=float(c["jitter"]),
                        window=float(c["window"]),
                        deadline=float(int(c["rounds"]) * P if deadline is None else deadline),
                        pull_timeout=parse_on_return(c["on_return"]))
    plan = Faults.parse(c["faults"], seed=int(c["faults_seed"]))
    world = build_world(c)
    return run_virtual_swarm(world, opts, progress=progress,
                             clock_settings={k: c[k] for k in WORLD_KEYS if c[k] is not None},
                             faults=plan if plan.any else None)


def _real(c: dict[str, Any], *, deadline: float | None, procs: int, workdir: str | None,
          progress: Callable[[int, int], None] | None, on_round: Callable[[dict], None] | None,
          kills: Sequence[tuple[int, int]], partitions: Sequence[str], tls_dir: str | None,
          record_log: str | None, edges: Any, peers: str | None) -> RunResult:
    from sfg.clock.settings import parse_on_return
    from sfg.engines import REAL_PERIOD
    from sfg.net.swarm import SwarmOptions, check_nodes, run_swarm
    from sfg.net.world import build_world

    if procs < 0:
        raise SfgError(f"procs must be >= 0 (0: every node in this process), got {procs}")
    here = procs == 0
    if here and (kills or record_log is not None or workdir is not None):
        raise SfgError("nodes in this process (procs 0) keep no checkpoints: crashes, an event "
                       "log and a workdir need worker processes (procs >= 1)")
    if edges is not None and not here:
        raise SfgError("edges replace the graph for nodes in this process only (procs 0)")
    opts = SwarmOptions(mode=c["protocol"], procs=max(1, procs),
                        period=float(REAL_PERIOD if c["period"] is None else c["period"]),
                        jitter=float(c["jitter"]), window=float(c["window"]),
                        deadline=REAL_DEADLINE if deadline is None else float(deadline),
                        kills=list(kills), partitions=list(partitions), tls_dir=tls_dir,
                        workdir=workdir, record_log=record_log,
                        pull_timeout=parse_on_return(c.get("on_return")), peers=peers)
    world = build_world(c, edges=edges)
    check_nodes(world, opts)
    total, done = world.n * world.rounds, [0]

    def rounds_done(event: dict) -> None:
        done[0] += 1
        if on_round is not None:
            on_round(event)
        if progress is not None:
            progress(min(done[0], total), total)

    if here:
        return _in_process(world, opts, rounds_done)
    return run_swarm(world, opts, progress=rounds_done)


def _in_process(world: Any, opts: Any, on_round: Callable[[dict], None]) -> RunResult:
    """Every real node in this process's event loop over gRPC on 127.0.0.1, as a worker
    process runs its share (:mod:`sfg.net.worker`): the same node settings."""
    import asyncio
    import time

    import numpy as np

    from sfg.net.certify import keys_for
    from sfg.net.cuts import Cut
    from sfg.net.node import NodeConfig
    from sfg.net.swarm import run_nodes, summarise
    from sfg.net.transport import TlsFiles

    def cfg_of(i: int) -> NodeConfig:
        return NodeConfig(mode=opts.mode, period=opts.period, jitter=opts.jitter,
                          window=opts.window, deadline=opts.deadline,
                          tls=None if opts.tls_dir is None else TlsFiles.load(opts.tls_dir, i),
                          keys=keys_for(world, opts.tls_dir, i),
                          partitions=tuple(Cut.parse_rounds(p) for p in opts.partitions),
                          peers=opts.peers,
                          on_round=lambda n, r, a, acc: on_round(
                              {"node": n, "round": r, "available": a, "acc": acc}))

    async def ready(ports: dict[int, int]) -> float | None:
        return time.time() + 0.2 if opts.mode == "async" else None

    nodes: list = []
    t = time.perf_counter()
    results = asyncio.run(run_nodes(world, range(world.n), cfg_of, ready=ready,
                                    nodes_out=nodes))
    res = summarise(world, results, wall=time.perf_counter() - t)
    res.params = np.stack([n.x for n in sorted(nodes, key=lambda n: n.i)])
    return res

