"""Protocol properties of the node under random faults: a seeded sweep.

:func:`check_case` runs one virtual swarm (:func:`sfg.net.virtual.run_virtual_swarm`, the
deployable node on the virtual clock) under one fault setting and checks, from the network's
log of every delivery and the nodes' own records (``record_headers``), properties that must
hold whatever the faults:

* **acceptance**: no corrupted payload and no message from a non-neighbour is ever accepted
  (the receiver answers every one with a rejection or a refusal), and every model a node
  aggregates is from itself or a graph neighbour, with content whose SHA-256 is the one its
  header announced and one its sender really sent; the receivers' :class:`Rejections` count
  exactly the misrouted copies they answered "non-neighbour", and no other reason than the
  faults can cause appears;
* **staleness** (docs/concepts/staleness.md#the-staleness-state, docs/concepts/clock.md#staleness-on-the-clock): every header sent has τ ≤ ℓ, ℓ ≥ 0 finite, counts ≥ 1;
  an async node never aggregates an older round of a neighbour after a newer one; a
  lockstep node aggregates exactly round r in round r;
* **restarts**: a restarted node resumes exactly the state its crashed predecessor had
  (model and staleness, through the checkpoint files), and in async mode its age and lag grow
  by exactly the rounds whose wake-up passed while it was down (counted here from the wake
  schedule, not by the node);
* **progress**: async never blocks (the run ends, every node did all its rounds, no
  :class:`~sfg.net.simclock.Deadlock`); lockstep either ends or a missing message turns into the
  deadline's error (allowed only where the case says the faults outlast the deadline); a
  lockstep run that ends gives the same models as the fault-free run;
* **bounded memory**: sampled at every round end, an async node holds at most one message per
  neighbour (``latest``, ``seen``, sends in flight), a lockstep node at most two pending
  messages per neighbour; the loop's tasks stay within a fixed multiple of the edges, however
  many copies a flood makes.

:func:`sweep` runs a list of cases and collects the violations (an empty list: the sweep
passed). The test suite runs it (tests/test_faults.py) and also runs it against planted
protocol bugs to show that it catches them.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from sfg.errors import SfgError


@dataclass(frozen=True)
class Case:
    """One run of the sweep."""

    mode: str                 # lockstep | async
    rule: str
    faults: str
    seed: int = 1             # the run's seed
    faults_seed: int = 0
    n: int = 8
    rounds: int = 8
    process: str = "bursty:u=0.5"
    graph: str = "knn:k=4"
    period: float = 600.0
    jitter: float = 0.5
    deadline: float = 60.0
    compute: str = "const:value=30"
    latency: str = "const:value=2"
    may_time_out: bool = False  # lockstep: the faults outlast the deadline (an error is right)

    @property
    def label(self) -> str:
        return (f"{self.mode} {self.rule} n={self.n} seed={self.seed} {self.faults} "
                f"faults_seed={self.faults_seed}")

    def world_cfg(self) -> dict[str, Any]:
        return dict(n_clients=self.n, rounds=self.rounds, local_steps=2, rule=self.rule,
                    process=self.process, graph=self.graph, eval_every=self.rounds,
                    seed=self.seed, backend="loop")

    def clock_settings(self) -> dict[str, Any] | None:
        if self.mode == "lockstep":
            return None  # lockstep rounds follow the messages, not the clock (docs/concepts/nodes.md#lockstep-mode)
        return {"compute": self.compute, "latency": self.latency}


@dataclass
class Outcome:
    case: Case
    violations: list[str] = field(default_factory=list)
    summary: dict | None = None
    error: str | None = None
    wall: float = 0.0
    node_rounds: int = 0
    peaks: dict[str, int] = field(default_factory=dict)


def _header(raw: bytes) -> dict:
    return msgpack.unpackb(raw, raw=False)


Fail = Callable[[str], None]  # records one violation


def check_case(case: Case, *, reference: np.ndarray | None = None,
               max_violations: int = 20) -> Outcome:
    """Run ``case`` and check the properties of the module docstring; ``reference``: the
    fault-free lockstep run's parameters (lockstep runs that end must equal them)."""
    from sfg.clock.faults import Faults
    from sfg.net.world import build_world

    out = Outcome(case)
    bad = out.violations

    def fail(msg: str) -> None:
        if len(bad) < max_violations:
            bad.append(f"[{case.label}] {msg}")

    world = build_world(case.world_cfg())
    faults = Faults.parse(case.faults, seed=case.faults_seed)
    plan = faults.plan(world.n, period=case.period, rounds=world.rounds,
                       neighbours=world.neighbours)
    res, nodes, log = _run(case, world, faults, plan, out, fail)
    genuine = _check_headers(log, fail)
    _check_acceptance(case, faults, nodes, log, fail)
    _check_aggregated(case, nodes, genuine, fail)
    latest = _check_restarts(case, world, plan, nodes, fail)
    # ---------------------------------------------------------------- progress and results
    if res is not None:
        for nd in latest.values():
            if nd.state.t != world.rounds:
                fail(f"node {nd.i} ended at round {nd.state.t} of {world.rounds}")
        if case.mode == "lockstep" and reference is not None:
            diff = float(np.abs(res["params"] - reference).max())
            if diff > 1e-5:
                fail(f"lockstep under faults differs from the fault-free run by {diff:.3g}")
    return out


def _run(case: Case, world: Any, faults: Any, plan: Any, out: Outcome,
         fail: Fail) -> tuple[dict | None, list, list[dict]]:
    """The case's virtual swarm, its memory sampled at every round end (bounded memory):
    (its summary or None if it failed, every node incarnation, the network's log)."""
    from sfg.net.swarm import SwarmOptions
    from sfg.net.virtual import run_virtual_swarm

    opts = SwarmOptions(mode=case.mode, period=case.period, jitter=case.jitter,
                        deadline=case.deadline)
    nodes: list = []
    log: list[dict] = []
    N = world.n
    deg = {i: len(world.neighbours(i)) for i in range(N)}
    edges = int(sum(deg.values()))
    peaks = out.peaks

    def sample(done: int, total: int) -> None:
        import asyncio

        current: dict[int, Any] = {}
        for nd in nodes:
            current[nd.i] = nd  # the latest incarnation of each node
        for nd in current.values():
            d = deg[nd.i]
            if case.mode == "async":
                for name, size in (("latest", len(nd.latest)), ("seen", len(nd.guard.seen)),
                                   ("sends", nd.pending_sends())):
                    peaks[name] = max(peaks.get(name, 0), size)
                    if size > d:
                        fail(f"node {nd.i} holds {size} entries in {name} > degree {d}")
            else:
                per: dict[int, int] = {}
                for (j, r) in nd.inbox:
                    if r >= nd.round:
                        per[j] = per.get(j, 0) + 1
                worst = max(per.values(), default=0)
                peaks["pending_per_neighbour"] = max(peaks.get("pending_per_neighbour", 0), worst)
                peaks["inbox"] = max(peaks.get("inbox", 0), len(nd.inbox))
                if worst > 2:
                    fail(f"node {nd.i} has {worst} pending messages of one neighbour (> 2)")
                if len(nd.inbox) > 3 * d:
                    fail(f"node {nd.i} inbox holds {len(nd.inbox)} messages > 3 x degree {d}")
        n_tasks = len(asyncio.all_tasks())
        peaks["tasks"] = max(peaks.get("tasks", 0), n_tasks)
        bound = 4 * (edges + N) + len(faults.crash_at) + faults.crashes
        if case.mode == "async" and n_tasks > bound:
            fail(f"{n_tasks} tasks in the loop > {bound} (4 x (edges + nodes))")

    wall = time.perf_counter()
    log_level = logging.getLogger("sfg.net").level
    logging.getLogger("sfg.net").setLevel(logging.ERROR)  # rejections are expected here
    try:
        res = run_virtual_swarm(world, opts, clock_settings=case.clock_settings(),
                                faults=plan, progress=sample, nodes_out=nodes,
                                record_headers=True, net_log=log)
    except SfgError as e:
        res = None
        out.error = str(e)
        deadline_error = "did not get the round" in str(e)
        if not (case.mode == "lockstep" and case.may_time_out and deadline_error):
            fail(f"the run failed: {type(e).__name__}: {e}")
        if "\n" in str(e):
            fail("the error is not one line")
    finally:
        logging.getLogger("sfg.net").setLevel(log_level)
    out.wall = time.perf_counter() - wall
    out.node_rounds = sum(nd.state.t - (nd.loaded[1].t if nd.loaded is not None else 0)
                          for nd in nodes)
    if res is not None:
        out.summary = res
    return res, nodes, log


def _check_headers(log: list[dict], fail: Fail) -> set[tuple[int, bytes]]:
    """Headers sent (docs/concepts/staleness.md#the-staleness-state): τ ≤ ℓ, ℓ ≥ 0 finite, counts ≥ 1, the sender its own; returns
    the (sender, payload SHA-256) of every model really sent."""
    genuine: set[tuple[int, bytes]] = set()
    for e in log:
        if e["kind"] != "send":
            continue
        h = _header(e["header"])
        genuine.add((e["src"], h["sha256"]))
        age, lag, cnt, loc = h["age"], h["lag"], h["count"], h["local_count"]
        if not (isinstance(lag, (int, float)) and math.isfinite(lag) and lag >= 0):
            fail(f"node {e['src']} sent lag {lag!r}")
        elif age > lag + 1e-9:
            fail(f"node {e['src']} sent age {age} > lag {lag} (τ ≤ ℓ: docs/concepts/staleness.md#invariants)")
        if cnt < 1 or loc < 1:
            fail(f"node {e['src']} sent counts {cnt}, {loc} < 1")
        if h["sender"] != e["src"]:
            fail(f"node {e['src']} sent a header naming node {h['sender']}")
    return genuine


def _check_acceptance(case: Case, faults: Any, nodes: list, log: list[dict],
                      fail: Fail) -> None:
    """No corrupted or misrouted message accepted; rejections counted exactly, for no reason
    the faults cannot cause."""
    answered_stranger: dict[int, int] = {}
    for e in log:
        if e["kind"] == "stranger":
            if e["ok"]:
                fail(f"node {e['dst']} accepted a misrouted message of non-neighbour {e['src']}")
            elif e["reason"] not in ("non-neighbour", "UNAVAILABLE"):
                fail(f"node {e['dst']} answered a non-neighbour's message with {e['reason']!r}")
            if e["reason"] == "non-neighbour":
                answered_stranger[e["dst"]] = answered_stranger.get(e["dst"], 0) + 1
        elif e["changed"] and e["kind"] != "fetch" and e["ok"]:
            fail(f"node {e['dst']} accepted a corrupted message from {e['src']}")
    allowed = set()
    if faults.misroute > 0:
        allowed.add("non-neighbour")
    if faults.corrupt > 0:
        allowed.add("digest")
    rejected: dict[int, dict[str, int]] = {}
    for nd in nodes:
        r = rejected.setdefault(nd.i, {})
        for k, v in nd.rejections.counts.items():
            r[k] = r.get(k, 0) + int(v)
    for i, counts in rejected.items():
        extra = set(counts) - allowed
        if extra:
            fail(f"node {i} rejected messages for {sorted(extra)}, which no fault here causes "
                 f"({counts})")
        if counts.get("non-neighbour", 0) != answered_stranger.get(i, 0):
            fail(f"node {i} counted {counts.get('non-neighbour', 0)} non-neighbour rejections "
                 f"for {answered_stranger.get(i, 0)} misrouted copies it answered so")
    answered_digest: dict[int, int] = {}
    for e in log:
        if e["kind"] in ("push", "copy") and e["reason"] == "digest":
            answered_digest[e["dst"]] = answered_digest.get(e["dst"], 0) + 1
    for i in set(rejected) | set(answered_digest):
        got, want = rejected.get(i, {}).get("digest", 0), answered_digest.get(i, 0)
        # a lockstep node also rejects corrupted replies to its pulls (not answers: >=)
        if got != want and not (case.mode == "lockstep" and got > want):
            fail(f"node {i} counted {got} digest rejections for {want} corrupted messages it "
                 "answered so")


def _check_aggregated(case: Case, nodes: list, genuine: set[tuple[int, bytes]],
                      fail: Fail) -> None:
    """What was aggregated: neighbours' genuine models, weights a distribution, rounds in
    order."""
    for nd in nodes:
        allowed_from = {nd.i, *(int(j) for j in nd.nbrs)}
        last_round: dict[int, int] = {}
        for rec in nd.weights:
            cands = rec["candidates"]
            if not set(cands) <= allowed_from:
                fail(f"node {nd.i} aggregated models of non-neighbours "
                     f"{sorted(set(cands) - allowed_from)} in round {rec['round']}")
            w = np.asarray(rec["weights"])
            if (w < -1e-12).any() or abs(w.sum() - 1.0) > 1e-6:
                fail(f"node {nd.i} round {rec['round']}: weights {w.tolist()} not a distribution")
            for j, rd, claimed, content in zip(cands[1:], rec["rounds"], rec["claimed"],
                                               rec["content"], strict=True):
                if content != claimed:
                    fail(f"node {nd.i} aggregated a model from {j} whose content does not match "
                         f"its header's SHA-256 (round {rec['round']})")
                elif (j, content) not in genuine:
                    fail(f"node {nd.i} aggregated a model node {j} never sent")
                if case.mode == "lockstep" and rd != rec["round"]:
                    fail(f"node {nd.i} aggregated round {rd} of node {j} in round {rec['round']}")
                if case.mode == "async":
                    if rd < last_round.get(j, -1):
                        fail(f"node {nd.i} aggregated round {rd} of node {j} after round "
                             f"{last_round[j]}")
                    last_round[j] = max(last_round.get(j, -1), rd)


def _check_restarts(case: Case, world: Any, plan: Any, nodes: list,
                    fail: Fail) -> dict[int, Any]:
    """A restarted node resumes its predecessor's state and counts the wake-ups it missed;
    returns the latest incarnation of each node."""
    from sfg.round.staleness import wake_jitter

    N, T = world.n, world.rounds
    jit = case.jitter * case.period * wake_jitter(case.seed, T, N)
    restarts_of: dict[int, list[float]] = {i: [] for i in range(N)}
    for ev in plan.events:
        if ev.get("restarted") is not None:
            restarts_of[ev["node"]].append(float(ev["restarted"]))
    before: dict[int, Any] = {}
    for nd in nodes:
        prev = before.get(nd.i)
        before[nd.i] = nd
        if prev is None:
            continue
        if nd.loaded is None:  # crashed before its first checkpoint: starts afresh
            from sfg.net.checkpoints import NodeState

            x0, s0 = world.x0, NodeState(q_hat=[1.0] * len(world.neighbours(nd.i)))
        else:
            x0, s0 = nd.loaded
        if s0 != prev.state or not np.array_equal(x0, prev.x):
            fail(f"node {nd.i} resumed {s0} but had {prev.state} when it crashed")
        rest = nd.restored or {}
        if case.mode == "lockstep":
            if rest.get("missed", 0) != 0:
                fail(f"lockstep node {nd.i} counted {rest.get('missed')} missed rounds")
            continue
        back = restarts_of[nd.i].pop(0)  # the loop time it restarted at
        at = (1.0 + nd.clock.drift) * back  # on its own clock (t0 = 0)
        wakes = case.period * np.arange(T) + jit[:, nd.i]
        expect = int(np.sum(wakes[s0.t:] < at))
        if "at" not in rest:
            if expect:
                fail(f"node {nd.i} restarted after {expect} wake-ups passed and counted none")
            continue
        if rest["missed"] != expect:
            fail(f"node {nd.i} restarted at {at:.1f} s from round {s0.t} and counted "
                 f"{rest['missed']} missed rounds; {expect} wake-ups passed while it was down")
        if rest["age_after"] != s0.age + expect or abs(rest["lag_after"] - s0.lag - expect) > 1e-9:
            fail(f"node {nd.i} after its restart has age {rest['age_after']}, lag "
                 f"{rest['lag_after']}; its checkpoint's {s0.age}, {s0.lag} plus {expect} missed "
                 "rounds")
    return before


@dataclass
class SweepResult:
    outcomes: list[Outcome]
    wall: float

    @property
    def violations(self) -> list[str]:
        return [v for o in self.outcomes for v in o.violations]

    @property
    def node_rounds(self) -> int:
        return sum(o.node_rounds for o in self.outcomes)

    @property
    def throughput(self) -> float:
        """Simulated node-rounds per second of wall time."""
        return self.node_rounds / self.wall if self.wall > 0 else float("nan")


RULES = ("sfg-cut", "dfedavg", "sfg-l+guard")
ASYNC_FAULTS = (
    "faults:loss=0.2,delay=30,reorder=0.2,dup=0.1,drift=0.01",      # message faults
    "faults:corrupt=0.2,misroute=0.2,dup=0.2,copies=3",            # tampering in transit
    "faults:crashes=3,downtime=900,loss=0.05,drift=0.005",          # crashes and restarts
    "faults:partition=0-2|*@1200-3000,crashes=2,downtime=1300,corrupt=0.1",
    "faults:dup=1,copies=20,misroute=0.5",                          # a flood
)
LOCKSTEP_FAULTS = (
    "faults:loss=0.2,delay=2,reorder=0.2,dup=0.2,corrupt=0.1,misroute=0.1",
    "faults:crashes=2,span=3,downtime=20,loss=0.05",
    "faults:partition=0-2|*@1-30,dup=1,copies=5",
)


def standard_cases(seeds=(1, 2, 3), *, sizes=(6, 8, 10), rounds: int = 8) -> list[Case]:
    """The suite's sweep: ``seeds`` x (5 async + 3 lockstep fault settings), the rules of
    :data:`RULES` and the swarm sizes rotating over the runs, each run with a faults seed of
    its own. Lockstep's deadline (virtual seconds) outlasts the faults, so every lockstep run
    must end with the fault-free run's models."""
    cases, k = [], 0
    for seed in seeds:
        for f in ASYNC_FAULTS:
            cases.append(Case("async", RULES[k % 3], f, seed=seed, faults_seed=10 * seed + k,
                              n=sizes[k % len(sizes)], rounds=rounds))
            k += 1
        for f in LOCKSTEP_FAULTS:
            cases.append(Case("lockstep", RULES[k % 3], f, seed=seed, faults_seed=10 * seed + k,
                              n=sizes[k % len(sizes)], rounds=rounds, deadline=900.0))
            k += 1
    return cases


def reference_params(case: Case) -> np.ndarray:
    """The fault-free run of ``case``'s settings (for lockstep's equality check)."""
    from sfg.net.swarm import SwarmOptions
    from sfg.net.virtual import run_virtual_swarm
    from sfg.net.world import build_world

    world = build_world(case.world_cfg())
    opts = SwarmOptions(mode=case.mode, period=case.period, jitter=case.jitter,
                        deadline=case.deadline)
    return run_virtual_swarm(world, opts, clock_settings=case.clock_settings())["params"]


def sweep(cases: list[Case], *, max_cases: int | None = None,
          stop_at_first: bool = False) -> SweepResult:
    """Run ``cases`` in order (lockstep ones against their fault-free run), at most
    ``max_cases`` of them; with ``stop_at_first``, stop at the first violation. Bounded by a
    number of cases, never by seconds: a slow machine runs the same cases as a fast one."""
    refs: dict[tuple, np.ndarray] = {}
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    for c in cases[:max_cases]:
        ref = None
        if c.mode == "lockstep" and not c.may_time_out:
            key = (c.rule, c.seed, c.n, c.rounds, c.process, c.graph)
            if key not in refs:
                refs[key] = reference_params(c)
            ref = refs[key]
        o = check_case(c, reference=ref)
        outcomes.append(o)
        if stop_at_first and o.violations:
            break
    return SweepResult(outcomes, time.perf_counter() - t0)


def digest(summary: dict) -> str:
    """SHA-256 of a run's JSON without its wall-clock figures (for determinism checks)."""
    import json

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if "wall" not in k}
        if isinstance(v, list):
            return [strip(x) for x in v]
        if isinstance(v, np.ndarray):
            return v.tobytes().hex()
        return v
    if not isinstance(summary, dict):  # a RunResult: its JSON and its final models
        summary = {**summary.summary(), "params": summary.params}
    return hashlib.sha256(json.dumps(strip(summary), sort_keys=True).encode()).hexdigest()
