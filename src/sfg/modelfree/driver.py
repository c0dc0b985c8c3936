"""One lane's replay: the shared round (:func:`sfg.round.kernel.play_round`) for every round, the
metrics' facts accumulated in blocks of rounds, and the self-return H followed through each
block's weights on parallel threads (:mod:`sfg.modelfree.horizon`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from sfg.modelfree.horizon import HorizonPart, default_threads, pair_list
from sfg.modelfree.metrics import Accumulator, RunEnd
from sfg.round.attacks import Attack, Heard, Reach, availability, claims, place, true_claims
from sfg.round.certified import evidence_for
from sfg.round.defences import GUARD
from sfg.round.kernel import FACTS, candidate_mask, caps_at, play_round, rule_draws, run_rounds
from sfg.round.rules import Rule
from sfg.round.slots import RoundGraph
from sfg.round.staleness import init_state
from sfg.util.alloc import tune_cpu_allocator
from sfg.world.graphs import Graph
from sfg.world.outages.anatomy import capabilities
from sfg.world.outages.links import link_failures


@dataclass(frozen=True)
class Lane:
    """One replay inside a batch: its trace (bool[T, n]), graph, rule and seed."""

    available: np.ndarray
    graph: Graph
    rule: Rule
    seed: int
    attack: Attack | None = None
    # per-slot deliveries bool[T, E] (the virtual clock's lockstep, sfg.clock.schedule), or None
    live: np.ndarray | None = None


@dataclass
class ReplayResult:
    """Metrics of one (process, rule, seed) replay; ``curves`` per round."""

    metrics: dict[str, float]
    curves: dict[str, list[float]] = field(default_factory=dict)


def run_lane(ln: Lane, *, anatomy: str, link_failure: float, horizon: int, exact_pairs: int,
             sample_pairs: int, progress: Callable[[int, int], None] | None = None,
             weights_out: np.ndarray | None = None, threads: int | None = None,
             chunk_elems: int = 2_000_000, tile: int = 4096) -> ReplayResult:
    """Replay one checked lane.

    Rounds run in blocks: the round records each round's weights and facts, then the metrics
    accumulate the block's facts and the self-return follows its pairs through the block's
    weights. With several ``threads`` (default: :func:`default_threads` when the H work is
    large) the pairs are split by start round over them and each part follows the round on
    its own thread, a stretch of rounds behind it (:class:`_Behind`), while the round plays
    on; each pair's arithmetic does not depend on the split, so results are bit-identical for
    any number of threads. ``weights_out`` [T, E] receives every round's
    slot weights (tests)."""
    tune_cpu_allocator()  # the per-round buffers below, reused instead of page-faulted
    T, n = ln.available.shape
    rg = RoundGraph.from_graph(ln.graph)
    E = rg.n_slots
    attackers = place(ln.attack, n, np.diff(rg.indptr) - 1, seed=ln.seed)
    attack = ln.attack if attackers.any() else None  # frac=0: exactly the no-attack replay
    available = availability(np.asarray(ln.available, bool), attack, attackers)
    frozen = attackers if (attack is not None and attack.model == "constant") else None
    reach = Reach(T, n, horizon, attackers)
    caps = capabilities(available, anatomy)
    live = link_failures(ln.graph.edges, T, p=link_failure, seed=ln.seed) if link_failure > 0 else None
    certified = ln.rule.certified  # the certified protocol (sfg.round.certified)
    evidence = evidence_for(ln.rule, attack, rg, anatomy=anatomy)
    if ln.live is not None or certified:  # deliveries per direction: one link id per slot
        from sfg.clock.schedule import directed, per_slot_live

        sent = ln.live if ln.live is not None else np.ones((T, E), bool)
        live = per_slot_live(rg, sent, live)
        rg = directed(rg)
    ts, flat, sampled = pair_list(caps.adopt, horizon, seed=ln.seed, exact_pairs=exact_pairs,
                                  sample=sample_pairs)
    h = horizon if flat.size else 0
    n_adopt = caps.adopt.sum(axis=1)
    max_adopt = int(n_adopt.max()) if (h and T) else 0
    if threads is None:
        # H costs about (pairs × h) columns × adopters row updates; below ~2·10^6 a second
        # thread costs more than it saves (measured: N = 100 with H over 50 rounds, bursty
        # u = 0.8 is 5·10^6, iid u = 0.6 2·10^7, both faster with H following on threads;
        # N = 20 is below)
        work = flat.size * h * (float(n_adopt.mean()) if T else 0.0)
        threads = default_threads() if work >= 2e6 else 1
    n_threads = max(1, int(threads))
    picks = [ts % n_threads == k for k in range(n_threads)] if h else []
    parts = [HorizonPart(T, n, h, ts[sel], flat[sel], max_adopt) for sel in picks]

    state = init_state(rg, rounds=T, track_missed=ln.rule.oracle)
    if ln.rule.defence_flags & GUARD:  # +guard's evidence, updated in place by the block path
        state = replace(state, versions=np.zeros(n, np.int64),
                        evidence=np.full((2, E), -1, np.int64))
    acc = Accumulator()
    R = max(1, min(T, chunk_elems // max(E, n * len(FACTS), 1)))
    wbuf = np.empty((R, E)) if weights_out is None else None
    fbuf = np.empty((R, n, len(FACTS)))
    # H in the background: with several threads, each part of the pairs follows the rounds
    # on its own thread, a stretch of rounds behind the round itself (sub-blocks of a block)
    behind = _Behind(parts, rg, caps.adopt, tile) if (h and n_threads > 1) else None
    # the round's rounds in compiled code (forged claims and certified evidence: round by round)
    block_loop = ln.rule.compiled and attack is None and evidence is None
    heard = Heard(rg) if attack is not None else None  # what attackers observed
    try:
        for t0 in range(0, T, R):
            t1 = min(T, t0 + R)
            w_blk = weights_out[t0:t1] if weights_out is not None else wbuf[: t1 - t0]
            if block_loop:  # one compiled call per stretch, H following each
                step = max(1, -(-(t1 - t0) // _STRETCHES)) if behind is not None else t1 - t0
                for s0 in range(t0, t1, step):
                    s1 = min(t1, s0 + step)
                    _rounds_block(ln.rule, rg, state, caps, live, ln.seed, s0, s1,
                                  w_blk[s0 - t0:], fbuf[s0 - t0:])
                    if behind is not None:
                        behind.follow(s0, s1, w_blk[s0 - t0: s1 - t0])
                state = replace(state, t=t1)
            else:
                for t in range(t0, t1):
                    cap_t = caps_at(caps, t)
                    live_t = None if live is None else live[t]
                    cand = None if evidence is None else candidate_mask(rg, cap_t, live_t)
                    forged = None if attack is None else claims(attack, rg, state, attackers,
                                                                seed=ln.seed, heard=heard,
                                                                evidence=evidence,
                                                                cand_now=cand)
                    if evidence is not None:
                        told = forged if forged is not None else true_claims(rg, state)
                        if certified:  # refused claims: excluded, as lost messages
                            live_t = evidence.screen(told, cand, live[t])
                    rr = play_round(ln.rule, rg, state, cap_t, seed=ln.seed, live=live_t,
                                    weights_out=w_blk[t - t0], facts_out=fbuf[t - t0],
                                    slot_staleness=forged,
                                    attackers=None if attack is None else attackers,
                                    frozen=frozen)
                    state = rr.state
                    if heard is not None and forged is not None:
                        heard.note(rg, rr.candidate, forged)
                    if evidence is not None:  # the heard-sets: what was received
                        evidence.note(cand, told)
            acc.add(fbuf[: t1 - t0])
            if attack is not None:
                reach.run(t0, t1, rg, w_blk, caps.adopt[t0:t1])
            if behind is None:
                if h:
                    parts[0].run(t0, t1, rg, w_blk, caps.adopt[t0:t1], tile)
            else:
                if not block_loop:  # the per-round path hands over its whole block
                    behind.follow(t0, t1, w_blk)
                behind.wait()  # the next block reuses the weight buffer
            if progress is not None:
                progress(t1, T)
    finally:
        if behind is not None:
            behind.close()
    hk = np.empty(flat.size)
    for sel, part in zip(picks, parts, strict=True):
        hk[sel] = part.out
    metrics, curves = acc.summary(RunEnd(available, hk, bool(sampled), state.lags,
                                         reach=reach.value), attack=ln.attack is not None,
                                  defence=bool(ln.rule.defence_flags))
    if certified and evidence is not None:
        metrics["claims_refused"] = evidence.refused_share
    return ReplayResult(metrics=metrics, curves=curves)


# Stretches of rounds per block when H follows on other threads: H of a stretch starts as
# soon as its weights exist, while the round plays the next one.
_STRETCHES = 16


class _Behind:
    """The self-return's parts (:class:`~sfg.modelfree.horizon.HorizonPart`), each on its own
    thread, following stretches of rounds in order as the round hands them over. Each pair's
    arithmetic is that of the one-thread replay (a part's rounds run in order, parts are
    disjoint), so results do not depend on threads or stretches."""

    def __init__(self, parts: list[HorizonPart], rg: RoundGraph, adopt: np.ndarray, tile: int):
        import queue
        import threading

        self.queues = [queue.Queue() for _ in parts]
        self.errors: list[BaseException] = []
        self.cancelled = False  # set by close(): stretches still queued are skipped

        def work(part: HorizonPart, q) -> None:
            while True:
                item = q.get()
                try:
                    if item is None:
                        return
                    if not (self.errors or self.cancelled):
                        t0, t1, w = item
                        part.run(t0, t1, rg, w, adopt[t0:t1], tile)
                except BaseException as e:  # noqa: BLE001 - re-raised by wait()
                    self.errors.append(e)
                finally:
                    q.task_done()

        self.threads = [threading.Thread(target=work, args=(p, q), daemon=True,
                                         name=f"sfg-horizon-{k}")
                        for k, (p, q) in enumerate(zip(parts, self.queues, strict=True))]
        for th in self.threads:
            th.start()

    def follow(self, t0: int, t1: int, w: np.ndarray) -> None:
        for q in self.queues:
            q.put((t0, t1, w))

    def wait(self) -> None:
        for q in self.queues:
            q.join()
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        """Stop the threads; after an error or an interrupt in the round, without following
        the stretches still queued."""
        self.cancelled = True
        for q in self.queues:
            q.put(None)
        for th in self.threads:
            th.join()


def _rounds_block(rule: Rule, rg: RoundGraph, state, caps, live, seed: int, t0: int, t1: int,
                  w: np.ndarray, facts: np.ndarray) -> None:
    """Rounds [t0, t1) of a compiled rule through :func:`sfg.round.kernel.run_rounds` (the round's
    integer state packed into one array for the call), updating the state's arrays in place
    (the driver owns them)."""
    n, E = rg.n, rg.n_slots
    u = key = np.zeros((0, 0))
    if rule.random:
        u, key = np.empty((t1 - t0, n)), np.empty((t1 - t0, E))
        for t in range(t0, t1):
            u[t - t0], key[t - t0] = rule_draws(seed, t, n, E)
    guard = state.versions is not None
    st = np.stack([state.ages, state.counts, state.local_counts,
                   state.versions if guard else np.zeros(n, np.int64)])
    run_rounds(rule.fn, np.array(rule.args, np.float64), t0, float(rule.self_weight),
               bool(rule.ipw), bool(rule.rounded), int(rule.defence_flags), float(rule.margin),
               float(rule.kappa), rg,
               np.stack([caps.train[t0:t1], caps.send[t0:t1], caps.aggregate[t0:t1],
                         caps.adopt[t0:t1]]),
               live[t0:t1] if live is not None else np.zeros((0, 0), bool), u, key, st,
               state.lags, state.q_hat, w[: t1 - t0], np.empty(E, bool), facts[: t1 - t0],
               ev=state.evidence if guard else None)
    state.ages[:], state.counts[:], state.local_counts[:] = st[0], st[1], st[2]
    if guard:
        state.versions[:] = st[3]
