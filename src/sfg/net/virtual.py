"""``sfg swarm --clock virtual``: the networked node's own code (:class:`sfg.net.node.Node`,
lockstep and async) run by the thousand in one process under the virtual clock (docs/concepts/clock.md#the-node-on-the-clock).

Every node is the deployable node — its protocol, claims, defences, acceptance checks,
checkpoints and restore — with three parts swapped for the simulation: the clock
(:class:`sfg.net.simclock.NodeClock` on a :class:`~sfg.net.simclock.VirtualLoop`), the transport
(:class:`sfg.net.memory.MemoryNetwork`: the same encoded messages through the same handler)
and the trainer (:class:`BatchTrainer`: the requests every node makes at one virtual instant
run together as one batch through the simulator's training backend, and each result is
handed back after the device's compute time, K · c_i seconds of virtual time).

The world in time is that of the clock's engine (:func:`sfg.clock.schedule.make_world`): the
same graph, trace, per-device compute and uplink, per-link latency. Under the async protocol
with a period P equal to Δ the node under the virtual clock and ``sfg run --clock virtual
--protocol async`` therefore run the same protocol on the same schedule and give the same
models bit for bit (tested; the same backend, :mod:`sfg.sim.gossip`'s one aggregation),
with the message faults of :mod:`sfg.clock.faults` too, and with ``on_return:
pull:timeout=S`` (the node's pull over :meth:`sfg.net.memory.MemoryNetwork.request`, on the
times of :mod:`sfg.clock.pull`; tests/test_vswarm_pull.py).
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sfg.clock.instant import Phase
from sfg.errors import SfgError
from sfg.net.simclock import resolve as _resolve
from sfg.sim.context import single_threaded

EVAL_BATCH = 256  # deferred evaluations run in batches of this many models (memory bound)


@dataclass
class _Request:
    i: int
    x: np.ndarray
    t: int
    age: int
    fut: asyncio.Future
    due: float  # virtual time at which the result is needed (request time + K·c_i)
    made: float  # virtual time of the request


class BatchTrainer:
    """Local training of many simulated nodes, batched per virtual instant (see the module
    docstring). ``for_node(i)`` gives node i's view with the :class:`sfg.net.world.Trainer`
    interface (``steps``, ``train``, ``train_async``, ``evaluate``)."""

    def __init__(self, world, *, compute: np.ndarray | None = None, backend: str = "auto",
                 max_batch: int | None = None, serial_below: int = 48,
                 defer_eval: bool = False):
        run = world.run
        self.world = world
        self.run = run
        self.K = run.K
        self.lr = run.lr
        self.compute = np.zeros(world.n) if compute is None else np.asarray(compute, float)
        self.backend = run.make_backend(backend)
        # a small batch trains faster in this thread alone than split over the worker
        # threads (their hand-off costs more than it saves); every chunk of the split runs
        # with one intra-op thread, so a client's arithmetic is the same either way (tested)
        self.serial_below = int(serial_below)
        self._serial = (run.make_backend(f"{backend}:workers=1")
                        if ":" not in backend and self.serial_below > 0 else None)
        self.clients = run.clients
        self.batches = run.minibatches(keep=64)
        self._one = [None] * world.n  # per-node Trainer for train() (made on first use)
        self._eval: Any = None  # the evaluation backend (made on first use)
        self.pending: list[_Request] = []
        self.max_batch = max_batch  # None: every request pending at a flush in one batch
        self.batches_run = 0
        self.requests = 0
        # deferred evaluation (run_virtual_swarm): a node's accuracy is only read at the end of
        # the run, so ``evaluate`` keeps a copy of the model and answers NaN, and the models
        # are evaluated in batches (whenever EVAL_BATCH are waiting, and at the end); the
        # k-th NaN in a node's curve is its k-th evaluation (resolve)
        self.defer_eval = bool(defer_eval)
        # (node, model, evaluation instant k or None: the node's own evaluation)
        self._to_eval: list[tuple[int, np.ndarray, int | None]] = []
        self._accs: dict[int, list[float]] = {}
        self.at: dict[int, np.ndarray] = {}  # instant k -> [N] accuracies (evaluate_at)

    def for_node(self, i: int) -> _NodeTrainer:
        return _NodeTrainer(self, int(i))

    def flush(self) -> bool:
        """Run every pending request as one batch; True if there were any. Called when a
        result falls due (a timer at the earliest request's time + K·c_i) and by the loop
        when nothing else is ready (requests with no compute time): every request made
        before the first result is needed is trained in the same batch."""
        if not self.pending:
            return False
        # a crashed node's request (its task cancelled the future) is not trained
        reqs, self.pending = [r for r in self.pending if not r.fut.done()], []
        if not reqs:
            return True
        m = self.max_batch
        if m is not None and len(reqs) > m:
            for k in range(0, len(reqs), m):  # the same requests, in batches of at most m
                self.pending = reqs[k:k + m]
                self.flush()
            return True
        loop = asyncio.get_running_loop()
        devs = np.array([r.i for r in reqs], np.int64)
        ts = np.array([r.t for r in reqs], np.int64)
        xs, ys = self.clients.gather(devs, *self.batches.select(devs, ts, self.K))
        start = torch.from_numpy(np.stack([np.ascontiguousarray(r.x, np.float32) for r in reqs]))
        if self._serial is not None and len(reqs) < self.serial_below:
            with single_threaded():
                out = self.run.train(self._serial, start, xs, ys).numpy()
        else:
            out = self.run.train(self.backend, start, xs, ys).numpy()
        self.batches_run += 1
        self.requests += len(reqs)
        now = loop.time()
        for k, r in enumerate(reqs):
            new = out[k].copy()
            if not np.isfinite(new).all():
                r.fut.set_exception(SfgError(
                    f"training diverged (non-finite parameters) at round {r.t} on node {r.i}; "
                    f"lower --lr (now {self.lr})"))
            elif r.due > now:  # the local round ends then, in its phase of that instant
                loop.call_at_phase(r.due, Phase.COMMIT, _resolve, r.fut, new)
            else:
                r.fut.set_result(new)
        return True

    def evaluate(self, i: int, x: np.ndarray) -> float:
        """Personalised test accuracy of ``x`` on client i's own test set, as
        :meth:`sfg.net.world.Trainer.evaluate` computes it, with one backend for all nodes
        (not a model and backend per node)."""
        if self.defer_eval:
            self._defer(int(i), x, None)
            return float("nan")
        if self._eval is None:  # the single-client backend of Trainer, one for all nodes
            from sfg.net.world import NODE_BACKEND

            self._eval = self.run.make_backend(NODE_BACKEND)
        P = torch.from_numpy(np.ascontiguousarray(x, np.float32))[None]
        return float(self.run.evaluate(P, [int(i)], backend=self._eval)[0])

    def evaluate_at(self, k: int, models: list[np.ndarray]) -> None:
        """The evaluation at instant k of every node's model (``models`` [N], node i's
        first): deferred, then found in ``at[k]`` (after :meth:`resolve`)."""
        at = self.at[int(k)] = np.full(len(models), np.nan)
        for i, x in enumerate(models):
            if self.defer_eval:
                self._defer(i, x, int(k))
            else:
                at[i] = self.evaluate(i, x)

    def _defer(self, i: int, x: np.ndarray, k: int | None) -> None:
        self._to_eval.append((i, np.array(x, np.float32), k))
        if len(self._to_eval) >= EVAL_BATCH:
            self._evaluate_waiting()

    def _evaluate_waiting(self) -> None:
        """Evaluate the deferred models in one batch with the training backend (each on its
        own node's test set, as the clock's engine evaluates them: the same accuracies,
        tested)."""
        if not self._to_eval:
            return
        waiting, self._to_eval = self._to_eval, []
        P = torch.from_numpy(np.stack([x for _, x, _ in waiting]))
        accs = self.run.evaluate(P, [i for i, _, _ in waiting], backend=self.backend)
        for (i, _, k), a in zip(waiting, accs, strict=True):
            if k is None:
                self._accs.setdefault(i, []).append(float(a))
            else:
                self.at[k][i] = a

    def resolve(self, results: list[dict], nodes: list) -> None:
        """Fill the deferred accuracies into the nodes' results and curves (in order)."""
        if not self.defer_eval:
            return
        self._evaluate_waiting()
        for i, (res, nd) in enumerate(zip(results, nodes, strict=True)):
            if not nd.cfg.evaluate:  # evaluated at the clock's instants instead (at)
                continue
            vals = iter(self._accs.get(i, []))
            curve = [(r, next(vals) if a != a else a) for r, a in nd.stats.curve]
            nd.stats.curve[:] = curve
            res["curve"] = [list(c) for c in curve]
            if res["acc"] != res["acc"]:
                res["acc"] = curve[-1][1] if curve else next(vals)

    def idle(self) -> bool:
        """The loop's idle hook: run the pending batch if a request made now is due now (no
        compute time: its local round ends at the instant it started, after the instant's
        wakes), else leave it for the first one due, in the commit phase of its instant."""
        now = asyncio.get_running_loop().time()
        if any(r.due <= now and r.made >= now for r in self.pending):
            return self.flush()
        return False

    def request(self, i: int, x: np.ndarray, t: int, age: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        now = loop.time()
        due = now + self.K * float(self.compute[i])
        if not self.pending or due < min(r.due for r in self.pending):
            if due > now:
                loop.call_at_phase(due, Phase.COMMIT, self.flush)
        self.pending.append(_Request(int(i), x, int(t), int(age), fut, due, now))
        return fut


class _NodeTrainer:
    """Node i's view of a :class:`BatchTrainer` (the :class:`sfg.net.world.Trainer` interface)."""

    def __init__(self, owner: BatchTrainer, i: int):
        self.owner, self.i = owner, i

    def _single(self):
        from sfg.net.world import Trainer

        t = self.owner._one[self.i]
        if t is None:
            t = self.owner._one[self.i] = Trainer(self.owner.world, self.i)
        return t

    def steps(self, age: int) -> int:
        return self.owner.K

    def train(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        return self._single().train(x, t, age)

    async def train_async(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        return await self.owner.request(self.i, x, t, age)

    def evaluate(self, x: np.ndarray) -> float:
        return self.owner.evaluate(self.i, x)


def _online_through(online):
    """``online(i, t0, t1)``: device i online during all of [t0, t1) (t1 < t0 read as t0) by
    :meth:`sfg.world.timeline.Intervals.online_through`'s rule, one device per call in plain
    Python (the network asks once per message: numpy's per-call cost dominated)."""
    import bisect

    starts = [online.start[online.indptr[i]:online.indptr[i + 1]].tolist()
              for i in range(online.n)]
    ends = [online.end[online.indptr[i]:online.indptr[i + 1]].tolist() for i in range(online.n)]

    def through(i: int, t0: float, t1: float) -> bool:
        s = starts[i]
        j = bisect.bisect_right(s, t0) - 1  # the last interval starting at or before t0
        return j >= 0 and t0 < ends[i][j] and max(t0, t1) <= ends[i][j]

    def next_off(i: int, t: float) -> float:
        """When device i, online at t, goes offline (t itself when offline at t)."""
        j = bisect.bisect_right(starts[i], t) - 1
        return ends[i][j] if j >= 0 and t < ends[i][j] else t

    through.next_off = next_off  # type: ignore[attr-defined]
    return through


def lockstep_world(world, cw, cs):
    """The node world of lockstep on the virtual clock: availability = the participants of
    :func:`sfg.clock.schedule.lockstep_rounds` on the clock world ``cw`` with settings ``cs``
    (a device online at rΔ whose sends and K steps cannot finish online by (r+1)Δ is a
    straggler, unavailable in round r: a function of the world, so common knowledge as the
    trace is, docs/concepts/nodes.md#lockstep-mode), attackers made always-on as in ``sfg run``. The node's lockstep
    waits for every expected message (a missing one past its deadline is an error), so a
    world in which the clock's lockstep would count a message late or lost is refused."""
    from dataclasses import replace

    from sfg.clock.schedule import lockstep_rounds
    from sfg.round.attacks import availability

    lk = lockstep_rounds(cw, cs, local_steps=int(world.cfg["local_steps"]), rounds=world.rounds,
                         seed=world.seed)
    late, lost = int(lk.stats["late"]), int(lk.stats["lost"])
    if late or lost:
        what = " and ".join(x for x in (f"{late} message(s) would arrive after their round's "
                                        "deadline" if late else "",
                                        f"{lost} would be lost" if lost else "") if x)
        raise SfgError(
            f"lockstep on the virtual clock: with these --latency/--uplink/--loss settings "
            f"{what}, but the node's lockstep waits for every message of a round (a missing one "
            "past its deadline is an error); use --protocol async, or a lower latency, a faster "
            "uplink, no --loss (lost pushes: --faults loss=P, which the node recovers by pulling)")
    return replace(world, available=availability(lk.available, world.attack, world.attackers))


def run_virtual_swarm(world, opts, *, clock_settings=None, faults=None,
                      progress=None, nodes_out: list | None = None,
                      record_headers: bool = False,
                      net_log: list | None = None,
                      trainer_options: dict | None = None) -> dict[str, Any]:
    """Run every node of ``world`` (a :class:`sfg.net.world.World`) with ``opts``
    (:class:`sfg.net.swarm.SwarmOptions`: mode, period, jitter, window, deadline) on the
    virtual clock; returns :func:`sfg.net.swarm.summarise`'s JSON plus the clock's figures.

    faults: None, a component string, a :class:`sfg.clock.faults.Faults` (bound here to the
    run) or a hook object (:class:`sfg.clock.faults.FaultPlan`); with crashes every node
    checkpoints into a temporary folder after each round, a crashed node's task is cancelled
    and its server stopped, and after the downtime a new node restarts from its checkpoint
    files (``NodeConfig(resume=True)``), as a deployed one would. The JSON's ``faults`` holds
    the counts. For inspection: ``nodes_out`` gets every node object made (restarted ones
    too, in order), ``record_headers`` makes the nodes record what they accept and aggregate,
    ``net_log`` (a list) gets every delivery attempt (:attr:`MemoryNetwork.log`);
    ``trainer_options``: keywords of :class:`BatchTrainer` (``max_batch``, ``serial_below``;
    for checks).

    ``opts.deadline`` is in virtual seconds. Lockstep rounds follow the messages, not the
    clock (docs/concepts/nodes.md#lockstep-mode): a node can wait for a neighbour several rounds of training behind, so
    give at least the run's T·P (what ``sfg swarm --clock virtual`` sets by default)."""
    import contextlib
    import os
    import tempfile
    from pathlib import Path

    from sfg.clock.faults import as_plan
    from sfg.net.memory import address
    from sfg.net.node import Node, NodeConfig
    from sfg.net.simclock import NodeClock, VirtualLoop

    rule = world.rule
    N, T, P = world.n, world.rounds, float(opts.period)
    faults = as_plan(faults, N, period=P, rounds=T, neighbours=world.neighbours)
    world, cw, net = _clock_network(world, opts, clock_settings, faults)
    net.log = net_log
    loop = VirtualLoop()
    # the run's own backend (sfg run's --backend; "auto" as sfg run resolves it): with the
    # same backend as the engine, each client's training is the engine's arithmetic
    trainer = BatchTrainer(world, compute=cw.compute,
                           **{"defer_eval": True, "backend": str(world.cfg.get("backend", "auto")),
                              **(trainer_options or {})})
    loop.add_idle_hook(trainer.idle)
    drift = (np.zeros(N) if faults is None else faults.drifts(N))
    crashes = [] if faults is None or not hasattr(faults, "crashes") else faults.crashes()
    downtime = float(getattr(faults, "downtime", P))
    fstats = getattr(faults, "stats", None)
    # the checkpoints go through the node's own code (write, fsync, rename); in memory-backed
    # storage where there is one, as the simulated devices' disks need not be this machine's
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.TemporaryDirectory(prefix="sfg-vswarm-", dir=shm) if crashes else None
    ckpt = None if tmp is None else Path(tmp.name)
    done = [0]

    def on_round(i, r, available, acc):
        done[0] += 1
        if progress is not None:
            progress(done[0], N * T)

    clocks = [NodeClock(drift=float(drift[i]), virtual=True) for i in range(N)]
    keys = _simulated_keys(world) if rule.certified else None  # +certified (sfg.net.certify)

    # async: every node's model evaluated at the clock's engine's instants, at the end of each
    # instant (after every commit there: docs/concepts/clock.md#one-instant); lockstep rounds
    # follow the messages, not the clock: each node evaluates after its rounds, as sfg run
    te = evaluation_times(world, P) if opts.mode == "async" else None

    def make_node(i: int, resume: bool = False) -> Node:
        nd = Node(world, i, NodeConfig(mode=opts.mode, period=P, jitter=opts.jitter,
                                       window=opts.window, deadline=opts.deadline, t0=0.0,
                                       linger=0.0, on_round=on_round, checkpoint_dir=ckpt,
                                       resume=resume, record_headers=record_headers,
                                       keys=None if keys is None else keys[i],
                                       evaluate=te is None),
                  trainer.for_node(i), net=net, clock=clocks[i])
        if nodes_out is not None:
            nodes_out.append(nd)
        return nd

    nodes = [make_node(i) for i in range(N)]
    tasks: list[asyncio.Task] = []
    restarts = [0]

    async def crash(i: int, at: float) -> None:
        """Node i crashes at ``at`` (virtual seconds) and restarts ``downtime`` later."""
        await asyncio.sleep(max(0.0, at - loop.time()))
        if tasks[i].done():  # already finished (or down): nothing to crash
            if fstats is not None:
                fstats["crashes_skipped"] += 1
            return
        tasks[i].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[i]
        await nodes[i].close()
        event = {"node": i, "crashed": float(loop.time()), "restarted": None}
        if fstats is not None:
            fstats["crashes"] += 1
            faults.events.append(event)
        await asyncio.sleep(downtime)
        nd = nodes[i] = make_node(i, resume=True)
        await nd.server.start("mem", 0)
        nd.connect({int(j): address(int(j)) for j in nd.nbrs})
        tasks[i] = loop.create_task(nd.run())
        restarts[0] += 1
        event["restarted"] = float(loop.time())
        if fstats is not None:
            fstats["restarts"] += 1

    evaluated = loop.create_future()  # the last instant's evaluation done

    def evaluate(k: int) -> None:
        try:
            trainer.evaluate_at(k, [nd.x for nd in nodes])
        except BaseException as e:  # the run's error, not the loop's handler's
            if not evaluated.done():
                evaluated.set_exception(e)
            return
        if k == len(te) - 1 and not evaluated.done():
            evaluated.set_result(None)

    async def main():
        for nd in nodes:
            await nd.server.start("mem", 0)
        for nd in nodes:
            nd.connect({int(j): address(int(j)) for j in nd.nbrs})
        tasks.extend(loop.create_task(nd.run()) for nd in nodes)
        control = {loop.create_task(crash(i, at)) for i, at in crashes}
        if te is not None:
            for k, t in enumerate(te):
                loop.call_at_instant_end(float(t), evaluate, k)
            control.add(evaluated)
        return await _supervise(tasks, control, nodes)

    wall = time.perf_counter()
    # the set-up's objects (data, models, nodes) are kept out of the cyclic collector's
    # passes while the run makes its many short-lived ones (a few percent of the run's time)
    gc.freeze()
    try:
        results = loop.run_until_complete(main())
    finally:
        gc.unfreeze()
        loop.close()
        if tmp is not None:
            tmp.cleanup()
    trainer.resolve(results, nodes)
    evaluations = None if te is None else _curves_at(te, trainer, results)
    return _result(world, results, nodes, time.perf_counter() - wall, restarts[0], loop, trainer,
                   net, faults, evaluations=evaluations, period=P)


async def _supervise(tasks: list, control: set, nodes: list) -> list:
    """Wait until every node's last run is done (a node's error ends the run: raised here);
    then cancel what is left — the control tasks, the sends and pulls still in flight — and
    close the nodes. Returns the nodes' results."""
    try:
        while True:
            live = {t for t in tasks if not t.done()} | {c for c in control if not c.done()}
            if not live:
                break
            done, _ = await asyncio.wait(live, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()
        return [t.result() for t in tasks]
    finally:
        for t in [*tasks, *control]:
            t.cancel()
        await asyncio.gather(*tasks, *control, return_exceptions=True)
        for nd in nodes:
            await nd.close()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:  # sends and pulls still in flight (a run cut short by an error)
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


def _curves_at(te: np.ndarray, trainer, results: list) -> tuple[np.ndarray, np.ndarray]:
    """The nodes' curves: their accuracies at the evaluation instants ``te`` (into each
    node's result); returns (te, accuracies [len(te), N])."""
    accs = np.stack([trainer.at[k] for k in range(len(te))])
    for i, res in enumerate(results):
        res["acc"] = float(accs[-1, i])
        res["curve"] = [[float(t), float(a)] for t, a in zip(te, accs[:, i], strict=True)]
    return te, accs


def evaluation_times(world, period: float) -> np.ndarray:
    """The instants (virtual seconds) at which the virtual swarm evaluates every node, those
    of the clock's engine (:func:`sfg.clock.instant.evaluation_instants`): every
    ``eval_seconds``, or ``eval_every`` periods, up to the horizon T·P, and the horizon."""
    from sfg.clock.instant import eval_every_seconds, evaluation_instants

    c = world.cfg
    return evaluation_instants(world.rounds * period, eval_every_seconds(
        c.get("eval_seconds"), int(c["eval_every"]), period))


def _simulated_keys(world) -> list:
    """+certified: the simulated nodes' keys, from the seed (:class:`sfg.net.certify.Keys`)."""
    from sfg.net.certify import Keys

    return Keys.simulated(world.n, world.seed)


def _clock_network(world, opts, clock_settings, faults):
    """The clock world of the swarm (:func:`sfg.clock.schedule.make_world`, the clock's
    engine's: graph, trace, compute, uplink, latency, loss), the node world in it (lockstep:
    its participants) and the in-memory network between the nodes."""
    from sfg.clock.schedule import check_period
    from sfg.clock.settings import make_settings
    from sfg.net.memory import MemoryNetwork
    from sfg.world.timeline import Intervals

    rule = world.rule
    if rule.catchup or rule.amplify is not None:
        raise SfgError(f"rule {str(rule)!r} changes local training by rounds (catch-up, "
                       "amplification); sfg swarm --clock virtual trains K steps per round")
    N, P = world.n, float(opts.period)
    cs = world.run.clock_settings(make_settings({
        **(clock_settings or {}), "clock": "virtual",
        "protocol": "async" if opts.mode == "async" else "lockstep", "round_seconds": P}))
    cw = world.run.world_in_time(cs)
    if not np.array_equal(cw.graph.edges, world.graph.edges):
        raise SfgError("the virtual swarm needs the generated graph of --graph (not peers.yaml)")
    if opts.mode == "lockstep":
        world = lockstep_world(world, cw, cs)
    else:
        check_period(int(world.cfg["local_steps"]) * cw.compute, P)
    latency, loss = _pair_links(world, cw, cs, faults)
    if opts.mode == "lockstep":
        # lockstep rounds follow the messages, not the clock: a node sends in round r only
        # while it takes part, to those that take part (its round, not its virtual time,
        # says who is online), and a round may run past T·P
        net = MemoryNetwork(N, latency=latency, uplink=cw.uplink, faults=faults,
                            message_bytes=cs.message_bytes, loss=loss, loss_seed=world.seed)
        return world, cw, net
    online_through = _online_through(Intervals.from_rounds(world.available, P))
    net = MemoryNetwork(N, latency=latency, uplink=cw.uplink,
                        online=online_through, faults=faults, message_bytes=cs.message_bytes,
                        loss=loss, loss_seed=world.seed, next_off=online_through.next_off,
                        horizon=float(cw.horizon))
    return world, cw, net


def _pair_links(world, cw, cs, faults):
    """The network's ``latency(j, i)`` and ``loss(j, i)`` (None: no loss): the clock world's
    per-link values on the graph's links, or under peers other than fixed (any device may
    send to any other) the one constant latency and loss of every pair, as the clock's
    engine has them (:func:`sfg.clock.peersim.check_clock`, which refuses the rest: drawn
    per-link latency or loss, faults, link failures; docs/concepts/peers.md)."""
    from sfg.world.peers import parse_peers

    peers = parse_peers(world.cfg.get("peers"))
    if not peers.fixed:
        from sfg.clock.peersim import check_clock

        if faults is not None:
            raise SfgError(f"peers {str(peers)!r} on the virtual clock does not run with "
                           "faults in this version; use peers fixed for it")
        lat_c, loss_c = check_clock(peers, cs, anatomy=str(world.cfg.get("anatomy", "full")),
                                    link_failure=float(world.cfg.get("link_failure") or 0.0))
        return (lambda j, i: lat_c), ((lambda j, i: loss_c) if loss_c > 0 else None)
    rg = cw.rg
    lat = {(int(j), int(i)): float(v) for j, i, v, s in
           zip(rg.send, rg.recv, cw.latency, rg.is_self, strict=True) if not s}
    loss = {(int(j), int(i)): float(v) for j, i, v, s in
            zip(rg.send, rg.recv, cw.loss, rg.is_self, strict=True) if not s}
    return (lambda j, i: lat[(j, i)]), ((lambda j, i: loss[(j, i)]) if cw.loss.any() else None)


def network_metrics(world, stats: dict[str, int],
                    message_bytes: float | None) -> dict[str, float]:
    """The in-memory network's counts as metrics (sfg.metrics): the messages sent and their
    nominal bytes, and the pull's requests and answers, counted as the clock's engine counts
    them and under its names; the network's own counts as ``net_*``."""
    from sfg.clock.settings import HEADER_BYTES
    from sfg.net.swarm import sent_metrics

    out = {f"net_{k}": float(v) for k, v in stats.items()
           if k not in ("pull_requests", "pull_replies", "pull_empty", "pull_unreachable")}
    out.update(sent_metrics(world, float(stats["sent"] - stats["lost_sender"]), message_bytes))
    if "pull_requests" in stats:  # on_return pull
        pull = {k: float(stats.get(k, 0)) for k in ("pull_requests", "pull_replies",
                                                     "pull_empty", "pull_unreachable")}
        out.update(pull, pull_bytes=(pull["pull_requests"] + pull["pull_empty"]) * HEADER_BYTES
                   + pull["pull_replies"] * float(message_bytes or 0.0))
    return out


def _result(world, results, nodes, wall, restarts, loop, trainer, net, faults, *,
            evaluations=None, period: float) -> dict[str, Any]:
    """:func:`sfg.net.swarm.summarise`'s JSON plus the clock's figures and the final models."""
    from sfg.net.swarm import summarise

    res = summarise(world, results, wall=wall, restarts=restarts, evaluations=evaluations,
                    round_seconds=period)
    res["metrics"].update({
        "virtual_seconds": float(loop.time()), "train_batches": float(trainer.batches_run),
        "train_requests": float(trainer.requests),
        "interrupted": float(sum(nd.stats.interrupted for nd in nodes)),
        "unfinished": float(sum(nd.stats.unfinished for nd in nodes)),
        "skipped": float(sum(nd.stats.skipped for nd in nodes)),
        **network_metrics(world, net.stats, net.message_bytes)})
    if faults is not None and hasattr(faults, "summary"):
        res["faults"] = faults.summary()
    res["params"] = np.stack([nd.x for nd in nodes])
    return res
