"""``sfg swarm --replay-log FILE --clock virtual``: a real run, re-executed from its event log by
the same node code under the virtual clock (docs/concepts/clock.md#the-node-on-the-clock) — the test that the simulation is the
deployment.

The log (:mod:`sfg.net.eventlog`) holds, per node, every wake-up, every accepted arrival with
its header's payload digest and claims, the end of every local training, and the process
starts (restarts from checkpoints) — each with the readings of the node's own clock it acted
on. The replay runs every node as :class:`sfg.net.node.Node` on a
:class:`~sfg.net.simclock.VirtualLoop` with three parts swapped:

* the clock (:class:`ReplayClock`): the virtual loop's time is the recorded machine's
  monotonic clock (shifted to start near 0); at an instant the log recorded for this node,
  ``time()`` and ``monotonic()`` return exactly the readings recorded there, and the node
  wakes for round r at the logged instant of its round-r wake-up (the deployment's lateness
  included). Wall-clock semantics otherwise: a late round runs, none is skipped;
* the trainer (:class:`_ReplayTrainer`): the deployment's own :class:`sfg.net.world.Trainer`,
  whose result is handed back at the logged end of that training;
* the transport (:class:`ReplayNetwork`): when a replayed node sends, each logged arrival of
  that (sender, round) at that receiver is delivered at its logged instant through the
  receiver's own handler (every acceptance check). The message content is the replayed
  sender's: its payload digest and claims must equal the logged ones, or the run diverged and
  the replay stops with an error naming the node, round and sender. Messages the real run
  never delivered (refused, lost, cancelled) are not delivered.

A crash (a new ``open`` in a node's log) kills the replayed incarnation at that instant and
starts a new one from the checkpoint the replayed node wrote (the same code as on disk), at
the logged instants. Nodes on machines with different monotonic clocks are aligned by each
node's wall-clock offset (then causality is only as good as the machines' clock sync).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sfg.errors import SfgError
from sfg.net.eventlog import Recording, model_digest
from sfg.net.simclock import NodeClock

_DIVERGED = "the replay diverged from the recorded run"


def _diverged(what: str) -> SfgError:
    return SfgError(f"{_DIVERGED}: {what}")


@dataclass
class _Arrival:
    L: float
    dst: int
    src: int
    round: int
    sha256: str
    claims: tuple[int, float, int, int]  # age, lag, count, local count
    taken: bool = False


@dataclass
class _Incarnation:
    """One process lifetime of a node: from its ``open`` to the next (or the end)."""

    k: int
    open_L: float
    open: dict
    start_L: float | None = None
    start: dict | None = None
    wakes: dict[int, float] = field(default_factory=dict)
    trained: dict[int, tuple[float, bool]] = field(default_factory=dict)
    last_L: float = 0.0          # the last instant of its own rounds (start, wakes, trainings)
    end_L: float | None = None
    death_L: float = math.inf    # the next incarnation's open
    last: bool = False


@dataclass
class _NodePlan:
    i: int
    shift: float                 # loop time = monotonic reading - shift
    toff: float                  # time() - monotonic() on this node (when not at a mark)
    marks: dict[float, tuple[float, float]] = field(default_factory=dict)
    incs: list[_Incarnation] = field(default_factory=list)
    end: dict | None = None


async def _until(L: float) -> None:
    loop = asyncio.get_running_loop()
    if L <= loop.time():
        await asyncio.sleep(0)
        return
    fut = loop.create_future()
    h = loop.call_at(L, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        h.cancel()


async def _forever() -> None:
    """A wait for an event the log does not have in a crashed incarnation: its crash ends it."""
    await asyncio.get_running_loop().create_future()


class ReplayClock(NodeClock):
    """A node's clock in the replay (see the module docstring). ``virtual`` is False: the
    recorded node ran on the wall clock, where a late round runs instead of being skipped."""

    def __init__(self, plan: _NodePlan, inc: _Incarnation):
        super().__init__(virtual=False)
        self.plan, self.inc = plan, inc

    def _at(self) -> tuple[float, tuple[float, float] | None]:
        L = asyncio.get_running_loop().time()
        return L, self.plan.marks.get(L)

    def monotonic(self) -> float:
        L, mark = self._at()
        return mark[1] if mark is not None else L + self.plan.shift

    def time(self) -> float:
        L, mark = self._at()
        return mark[0] if mark is not None else L + self.plan.shift + self.plan.toff

    def to_loop(self, seconds: float) -> float:
        return seconds

    async def wake(self, r: int, seconds: float) -> None:
        L = self.inc.wakes.get(r)
        if L is None:
            if self.inc.last:
                raise _diverged(f"node {self.plan.i} reaches round {r}, for which the recorded "
                                "node never woke")
            await _forever()
            return
        now = asyncio.get_running_loop().time()
        if L < now:
            raise _diverged(f"node {self.plan.i} is ready for round {r} {now - L:.6f} s after "
                            "the recorded node woke for it")
        await _until(L)


class _ReplayTrainer:
    """The deployment's trainer, its result handed back at the logged end of the training."""

    def __init__(self, inner, plan: _NodePlan, inc: _Incarnation):
        self.inner, self.plan, self.inc = inner, plan, inc

    def steps(self, age: int) -> int:
        return self.inner.steps(age)

    def train(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        return self.inner.train(x, t, age)

    async def train_async(self, x: np.ndarray, t: int, age: int) -> np.ndarray:
        new = self.inner.train(x, t, age)
        got = self.inc.trained.get(int(t))
        if got is None:
            if self.inc.last:
                raise _diverged(f"node {self.plan.i} trains in round {t}; the recorded node "
                                "never finished a training in it")
            await _forever()
        else:
            await _until(got[0])
        return new

    def evaluate(self, x: np.ndarray) -> float:
        return self.inner.evaluate(x)


class _Checker:
    """The replayed node's own event hook: its decisions must be the recorded node's."""

    def __init__(self, plan: _NodePlan, inc: _Incarnation, counts: dict):
        self.plan, self.inc, self.counts = plan, inc, counts

    def record(self, node, event: str, fields: dict[str, Any]) -> None:
        i, inc = self.plan.i, self.inc
        if event == "open":
            want = inc.open.get("restored")
            if fields["restored"] != want:
                raise _diverged(f"node {i} restarted from its round-{want} checkpoint in the "
                                f"recorded run, from round {fields['restored']} in the replay")
        elif event == "start":
            got, want = fields["restored"] or {}, (inc.start or {}).get("restored") or {}
            for key in ("round", "missed"):
                if got.get(key) != want.get(key):
                    raise _diverged(f"node {i} restarted with {key} {want.get(key)} in the "
                                    f"recorded run, {got.get(key)} in the replay")
        elif event == "trained":
            r = int(fields["round"])
            want_int = inc.trained[r][1]
            if bool(fields["interrupted"]) != want_int:
                raise _diverged(f"node {i}'s round {r} was "
                                f"{'interrupted' if want_int else 'completed'} in the recorded "
                                f"run, {'interrupted' if fields['interrupted'] else 'completed'} "
                                "in the replay")
        elif event == "end":
            want = (self.plan.end or {}).get("sha256")
            self.counts["final_digests_equal"] += int(model_digest(fields["final"]) == want)


class _Server:
    def __init__(self, net: ReplayNetwork, i: int, deliver, fetch):
        self.net, self.i, self.deliver, self.fetch = net, i, deliver, fetch

    async def start(self, host: str, port: int) -> int:
        self.net.servers[self.i] = self
        return self.i

    async def stop(self, grace: float | None = None) -> None:
        if self.net.servers.get(self.i) is self:
            del self.net.servers[self.i]


async def _stream(payload) -> AsyncIterator[bytes]:
    from sfg.net.transport import chunks

    for c in chunks(payload):
        yield c


class _Peer:
    def __init__(self, net: ReplayNetwork, src: int, addr: str):
        self.net, self.src = net, src
        self.dst = int(addr.rsplit(":", 1)[1])

    async def deliver(self, header: bytes, payload, *, timeout: float = 10.0, retries: int = 3,
                      backoff: float = 0.05) -> tuple[bool, str]:
        return self.net.send(self.src, self.dst, header, payload)

    async def fetch(self, t: int, me: int = -1, *, timeout: float = 10.0):
        return None  # async nodes never fetch

    async def close(self) -> None:
        return None


class ReplayNetwork:
    """Delivers the logged arrivals of what the replayed nodes send (module docstring)."""

    def __init__(self, arrivals: dict[tuple[int, int, int], list[_Arrival]],
                 plans: dict[int, _NodePlan]):
        self.arrivals, self.plans = arrivals, plans
        self.servers: dict[int, _Server] = {}
        self.failed: asyncio.Future | None = None
        self.delivered = 0
        self.checked = 0
        self._tasks: set[asyncio.Task] = set()

    def server(self, i: int, deliver, fetch, *, max_bytes: int, tls=None) -> _Server:
        return _Server(self, int(i), deliver, fetch)

    def peer(self, i: int, addr: str, *, max_bytes: int, tls=None) -> _Peer:
        return _Peer(self, int(i), addr)

    def busy_until(self, i: int) -> float:
        return 0.0

    def fail(self, err: SfgError) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_exception(err)

    def _lifetime(self, src: int, now: float) -> tuple[float, float]:
        """The loop-time span of the sender's incarnation alive at ``now``."""
        for inc in self.plans[src].incs:
            if inc.open_L <= now < inc.death_L:
                return inc.open_L, inc.death_L
        return now, now

    def send(self, src: int, dst: int, header: bytes, payload) -> tuple[bool, str]:
        from sfg.net.wire import unpack_header

        loop = asyncio.get_running_loop()
        now = loop.time()
        h = unpack_header(header)
        lo, hi = self._lifetime(src, now)
        todo = [a for a in self.arrivals.get((dst, src, h.round), ())
                if not a.taken and lo <= a.L < hi]
        for a in todo:
            a.taken = True
            where = f"at node {dst}, round {h.round} of sender {src}"
            if a.L < now:
                self.fail(_diverged(f"{where}: the log has it arrive {now - a.L:.6f} s before "
                                    "the replayed sender sent it"))
                return False, "diverged"
            got = h.sha256.hex()
            if got != a.sha256:
                self.fail(_diverged(f"{where}: the recorded arrival has payload digest "
                                    f"{a.sha256[:16]}…, the replayed sender's model has "
                                    f"{got[:16]}…"))
                return False, "diverged"
            claims = (h.age, h.lag, h.count, h.local_count)
            if claims[0] != a.claims[0] or claims[2:] != a.claims[2:] or \
                    abs(claims[1] - a.claims[1]) > 1e-9 * max(1.0, abs(a.claims[1])):
                self.fail(_diverged(f"{where}: the recorded header claims (age, lag, count, "
                                    f"local count) {a.claims}, the replayed sender {claims}"))
                return False, "diverged"
            self.checked += 1
            loop.call_at(a.L, self._spawn, a, header, payload)
        return (True, "") if todo else (False, "not delivered in the recorded run")

    def _spawn(self, a: _Arrival, header: bytes, payload) -> None:
        t = asyncio.ensure_future(self._arrive(a, header, payload))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _arrive(self, a: _Arrival, header: bytes, payload) -> None:
        srv = self.servers.get(a.dst)
        where = f"at node {a.dst}, round {a.round} of sender {a.src}"
        if srv is None:
            self.fail(_diverged(f"{where}: the receiver is down in the replay when the "
                                "recorded run accepted the message"))
            return
        ok, reason = await srv.deliver(header, _stream(payload), None, f"replay:{a.src}")
        if not ok:
            self.fail(_diverged(f"{where}: the receiver did not accept the message "
                                f"({reason}); the recorded run did"))
            return
        self.delivered += 1

    def unsent(self) -> list[_Arrival]:
        return sorted((a for v in self.arrivals.values() for a in v if not a.taken),
                      key=lambda a: a.L)


# ----------------------------------------------------------------------------------- plan
def _settings(rec: Recording) -> dict[str, Any]:
    s = rec.settings
    if s.get("mode") != "async":
        raise SfgError(f"the event log records a {s.get('mode')!r} run; only async runs are "
                       "replayed (a lockstep run's models do not depend on its timing: "
                       "`sfg swarm --clock virtual --protocol lockstep` gives them)")
    for key in ("period", "jitter", "window"):
        v = s.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise SfgError(f"the event log's settings need a number {key!r}, got {v!r}")
    parts = s.get("partitions", [])
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise SfgError("the event log's settings need partitions as a list of A|B@R1-R2")
    return s


def _world(rec: Recording):
    from sfg.net.world import build_world

    try:
        edges = None if rec.edges is None else np.asarray(rec.edges, np.int64).reshape(-1, 2)
        return build_world(rec.world, edges=edges)
    except SfgError as e:
        raise SfgError(f"the event log's run settings do not build a world: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise SfgError(f"the event log's run settings are damaged ({type(e).__name__}: {e}); "
                       "record the run again") from None


def _plan(rec: Recording, world) -> tuple[dict[int, _NodePlan], dict, int]:
    N, T = world.n, world.rounds
    missing = sorted(set(range(N)) - set(rec.events))
    extra = sorted(set(rec.events) - set(range(N)))
    if missing or extra:
        raise SfgError(f"the event log covers nodes {sorted(rec.events)[:10]}, the run has "
                       f"0..{N - 1}; pass the logs of every node of one run")
    clocks = {ev.get("clock") for evs in rec.events.values() for ev in evs if ev["ev"] == "open"}
    shared = len(clocks) == 1 and None not in clocks
    toff = {i: float(np.median([ev["t"] - ev["m"] for ev in evs])) for i, evs in rec.events.items()}
    # one time axis: the shared monotonic clock, else each node's on the wall-clock scale
    g = {i: (0.0 if shared else toff[i]) for i in rec.events}
    base = min(ev["m"] + g[i] for i, evs in rec.events.items() for ev in evs) - 1.0
    plans: dict[int, _NodePlan] = {}
    arrivals: dict[tuple[int, int, int], list[_Arrival]] = {}
    restarts = 0
    from sfg.world.peers import parse_peers

    drawn = not parse_peers(world.cfg.get("peers")).fixed  # any device sends to any other
    for i in range(N):
        plan = plans[i] = _NodePlan(i, shift=base - g[i], toff=toff[i])
        nbrs = set(range(N)) - {i} if drawn else {int(j) for j in world.neighbours(i)}
        prev_L = -math.inf
        for k, ev in enumerate(rec.events[i]):
            name, L = ev["ev"], float(ev["m"] - plan.shift)
            where = f"node {i}'s event {k + 1} ({name})"
            if name == "open":
                if plan.incs:
                    plan.incs[-1].death_L = L
                    if not ev["resume"]:
                        raise SfgError(f"event log: {where}: a restart that did not resume "
                                       "from the checkpoint cannot be replayed")
                    restarts += 1
                elif ev["restored"] is not None:
                    raise SfgError(f"event log: node {i} starts from a round-{ev['restored']} "
                                   "checkpoint the log does not contain; record the run from "
                                   "its start")
                plan.incs.append(_Incarnation(len(plan.incs), L, ev))
                prev_L = L
                continue
            inc = plan.incs[-1]
            if L < prev_L:
                raise SfgError(f"event log: {where} is earlier than the event before it; the "
                               "file is damaged")
            prev_L = L
            if name in ("start", "wake", "arrival", "trained"):
                plan.marks.setdefault(L, (float(ev["t"]), float(ev["m"])))
            if name == "start":
                if inc.start is not None:
                    raise SfgError(f"event log: {where}: a second start in one incarnation")
                inc.start_L, inc.start, inc.last_L = L, ev, L
            elif name == "wake":
                r = ev["round"]
                if r >= T:
                    raise SfgError(f"event log: {where}: round {r} past the run's {T} rounds "
                                   "(a log of another run's settings?)")
                if ev["available"] != bool(world.available[r, i]):
                    raise SfgError(f"event log: node {i} was {'' if ev['available'] else 'un'}"
                                   f"available in round {r}, the settings' trace says otherwise:"
                                   " a log of another run's settings")
                if inc.start is None or r in inc.wakes:
                    raise SfgError(f"event log: {where}: a wake before the start, or twice")
                inc.wakes[r], inc.last_L = L, L
            elif name == "trained":
                r = ev["round"]
                if r not in inc.wakes or r in inc.trained:
                    raise SfgError(f"event log: {where}: the end of a training in round {r} "
                                   "without its wake")
                inc.trained[r], inc.last_L = (L, ev["interrupted"]), L
            elif name == "arrival":
                j = ev["sender"]
                if j not in nbrs:
                    what = "another device of the run" if drawn else f"a neighbour of node {i}"
                    raise SfgError(f"event log: {where}: an arrival from node {j}, which is "
                                   f"not {what} (a log of another run?)")
                arrivals.setdefault((i, j, ev["round"]), []).append(_Arrival(
                    L, i, j, ev["round"], ev["sha256"],
                    (ev["age"], float(ev["lag"]), ev["count"], ev["local_count"])))
            elif name == "end":
                inc.end_L, plan.end = L, ev
        last = plan.incs[-1]
        last.last = True
        if last.start is None:
            raise SfgError(f"event log: node {i}'s last process never started its rounds")
    return plans, arrivals, restarts


# ----------------------------------------------------------------------------------- replay
def replay(rec: Recording, *, workdir: str | Path | None = None) -> dict[str, Any]:
    """Re-execute the logged run (see the module docstring); returns the swarm's summary
    (:func:`sfg.net.swarm.summarise`) with the replay's figures, ``max_param_diff`` against
    the real run's final models where the log kept them, and ``params`` [N, D]."""
    import torch

    from sfg.net.cuts import Cut
    from sfg.net.node import Node, NodeConfig
    from sfg.net.simclock import Deadlock, VirtualLoop
    from sfg.net.swarm import summarise
    from sfg.net.world import Trainer

    s = _settings(rec)
    world = _world(rec)
    plans, arrivals, restarts = _plan(rec, world)
    N, P = world.n, float(s["period"])
    parts = tuple(Cut.parse_rounds(p) for p in s.get("partitions", []))
    ckdir = Path(workdir or tempfile.mkdtemp(prefix="sfg-replay-")) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    net = ReplayNetwork(arrivals, plans)
    counts = {"final_digests_equal": 0}
    trainers = {i: Trainer(world, i) for i in range(N)}
    finals: dict[int, Node] = {}

    def make(i: int, inc: _Incarnation) -> Node:
        plan = plans[i]
        t0 = (inc.start or {}).get("t0")
        linger = max(0.0, (inc.end_L or inc.last_L) - inc.last_L) if inc.last else P
        cfg = NodeConfig(mode="async", period=P, jitter=float(s["jitter"]),
                         window=float(s["window"]), partitions=parts,
                         t0=None if t0 is None else float(t0), linger=linger,
                         checkpoint_dir=ckdir if len(plan.incs) > 1 else None,
                         resume=inc.k > 0, events=_Checker(plan, inc, counts))
        return Node(world, i, cfg, _ReplayTrainer(trainers[i], plan, inc), net=net,
                    clock=ReplayClock(plan, inc))

    async def drive(i: int) -> dict:
        node, task = None, None
        for inc in plans[i].incs:
            if node is not None:  # the previous process dies here (SIGKILL)
                await _until(inc.open_L)
                assert task is not None
                if task.done():
                    task.result()
                    raise _diverged(f"node {i} finished its rounds before its recorded restart")
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await node.close()
            node = make(i, inc)
            await node.start()
            node.connect({int(j): f"replay:{int(j)}" for j in node.nbrs})
            if inc.start_L is None:
                task = asyncio.ensure_future(_forever())
                continue
            await _until(inc.start_L)
            task = asyncio.ensure_future(node.run())
        assert task is not None and node is not None
        res = await task
        await node.close()
        finals[i] = node
        return res

    async def main() -> list[dict]:
        net.failed = asyncio.get_running_loop().create_future()
        every = asyncio.gather(*(drive(i) for i in range(N)))
        await asyncio.wait({every, net.failed}, return_when=asyncio.FIRST_COMPLETED)
        if net.failed.done():
            every.cancel()
            await asyncio.gather(every, return_exceptions=True)
            raise net.failed.exception()  # type: ignore[misc]
        return every.result()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the swarm's workers train
    loop = VirtualLoop()
    wall = time.perf_counter()
    try:
        results = loop.run_until_complete(main())
    except Deadlock:
        raise _diverged("every replayed node waits for an event the log does not have") \
            from None
    finally:
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        vtime = loop.time()
        loop.close()
        torch.set_num_threads(threads)
    wall = time.perf_counter() - wall
    unsent = net.unsent()
    if unsent:
        a = unsent[0]
        raise _diverged(f"at node {a.dst}, round {a.round} of sender {a.src}: the log has an "
                        "arrival the replayed sender never sent")
    res = summarise(world, results, wall=wall, restarts=restarts)
    X = np.stack([finals[i].x for i in range(N)])
    common = sorted(i for i in rec.final if i < N)
    if any(rec.final[i].shape != X[i].shape for i in common):
        raise SfgError("the final models next to the event log have another size than the "
                       "run's model; they belong to another run")
    diff = (float(np.abs(X[common] - np.stack([rec.final[i] for i in common])).max())
            if common else None)
    n_arr = sum(len(v) for v in arrivals.values())
    res["metrics"]["virtual_seconds"] = float(vtime)
    res["replay"] = {"log": [str(p) for p in rec.paths], "events": rec.n_events,
                     "arrivals": n_arr, "delivered": net.delivered,
                     "digests_matched": net.checked, "restarts": restarts,
                     "final_models_compared": len(common),
                     "final_digests_equal": counts["final_digests_equal"]}
    res["max_param_diff"] = diff
    res["params"] = X
    return res
