"""Model-free replay (SPEC §9): ages, lags, counts and every model-free rule's weights on a trace.

No training, no models: given an availability trace, a graph and a rule, replay the staleness
state and the weights, and measure

* ``unavailability`` — realised fraction of offline client-rounds;
* ``returns`` — aggregations by a returning client (τ_i ≥ 1);
* ``premise`` — among returns with ≥ 1 live neighbour, the fraction where the receiver's age is
  strictly larger than every live neighbour's (the receiver is strictly the stalest candidate);
* ``spread_age`` / ``spread_lag`` — mean over aggregations with ≥ 1 live neighbour of the
  largest relative age / lag among the candidates;
* ``kept`` — mean number of candidates kept (positive weight) per such aggregation;
* ``self_weight_return`` — mean receiver self-weight on return (with ≥ 1 live neighbour);
* ``H`` — the receiver's self-return H_i^t = Σ_{s=t+1}^{t+h} [W^{s−1}⋯W^{t+1}]_ii over
  horizon h (default 50), averaged over the available receivers of every round t ≤ T − h.
  When there are more than ``exact_pairs`` (round, receiver) pairs (large N), H is estimated on
  a seeded uniform sample of ``horizon_pairs`` pairs and ``H_se`` gives its standard error.

Two engines run it (see :func:`replay_batch`): a compiled numba kernel per replay
(:mod:`sfg.replay_kernel`, the default for every model-free rule but the oracles) and the
simulator's own round code, vectorised over clients and edges with several replays stacked
(one numpy pass per round). They are tested against each other weight by weight, and both
against the per-client Python loop in :mod:`sfg.replay_reference`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from .engine import RoundWeights, advance, caps_at, rule_draws
from .errors import SfgError, check
from .graphs import Graph, make_graph
from .outages import make_process
from .outages.anatomy import capabilities
from .outages.links import link_failures
from .rng import stream
from .rounds import RoundGraph
from .rules import Rule, parse_rule
from .staleness import init_state

DEFAULT_N = 100
DEFAULT_T = 300
DEFAULT_GRAPH = "knn:k=6"
EXACT_PAIRS = 20_000


@dataclass
class ReplayResult:
    """Metrics of one (process, rule, seed) replay; ``curves`` per round."""

    metrics: dict[str, float]
    curves: dict[str, list[float]] = field(default_factory=dict)


class _Horizon:
    """Online computation of the self-return H over a fixed horizon (SPEC §9).

    Every tracked (start t, receiver i) pair is a column of ``C``, started at e_i and multiplied
    by each later round's W; [W^{s−1}⋯W^{t+1}]_ii is then that column's entry i. The columns
    of start t live in block t mod h of a ring buffer (h blocks of ``cap`` columns, cap = the
    most pairs of any start). Only the rows of clients that adopted an aggregate change in a
    round (the others have identity rows), so a round costs (adopters' slots) × columns.
    """

    def __init__(self, rg: RoundGraph, h: int, pairs: dict[int, np.ndarray]):
        self.rg, self.h, self.pairs = rg, h, pairs
        self.cap = max((v.size for v in pairs.values()), default=0)
        width = h * self.cap
        self.C = np.zeros((rg.n, width))
        self.recv = np.zeros(width, np.int64)  # receiver of each column
        self.live = np.zeros(width, bool)      # column in use
        self.acc = np.zeros(width)
        self.done: list[np.ndarray] = []

    def step(self, s: int, w: np.ndarray, adopt: np.ndarray) -> None:
        rg, cap = self.rg, self.cap
        live = np.flatnonzero(self.live)
        if live.size:
            if adopt.any():
                rows = np.flatnonzero(adopt)
                sl = np.flatnonzero(adopt[rg.recv])  # slots of adopting receivers, by receiver
                lens = rg.indptr[rows + 1] - rg.indptr[rows]
                indptr = np.concatenate([[0], np.cumsum(lens)])
                import scipy.sparse as sp  # numpy engine only: not on the compiled path

                W_rows = sp.csr_matrix((w[sl], rg.send[sl], indptr), shape=(rows.size, rg.n))
                # a sparse product over all columns (dead ones are overwritten when their block
                # is reused): cost ∝ adopters' slots × columns, no gathers
                self.C[rows] = W_rows @ self.C
            self.acc[live] += self.C[self.recv[live], live]
        # start s − h + 1 (block (s + 1) mod h) has its h terms now
        b = (s + 1) % self.h
        ending = slice(b * cap, (b + 1) * cap)
        if self.live[ending].any():
            self._finish(np.flatnonzero(self.live[ending]) + ending.start)
        # start s takes block s mod h (freed at round s − 1)
        block = slice((s % self.h) * cap, (s % self.h + 1) * cap)
        new = self.pairs.get(s)
        if new is not None and new.size:
            cols = np.arange(block.start, block.start + new.size)
            self.C[:, block] = 0.0
            self.C[new, cols] = 1.0
            self.recv[cols], self.live[cols], self.acc[cols] = new, True, 1.0
            if self.h == 1:
                self._finish(cols)

    def _finish(self, cols: np.ndarray) -> None:
        self.done.append(self.acc[cols].copy())
        self.live[cols] = False

    def values(self) -> np.ndarray:
        """H of every finished (start, receiver) pair."""
        return np.concatenate(self.done) if self.done else np.zeros(0)


_TOTALS = ("agg", "returns", "ret_nb", "stalest", "spread_age", "spread_lag", "kept", "self_w",
           "messages")


class _Analyses:
    """Premise, spreads, kept candidates and self-weights (SPEC §9), per lane, computed in
    blocks of rounds: each round only stores its ages, lags, weights and candidates; the
    analyses run vectorised over [rounds, slots] arrays once a block is full."""

    def __init__(self, rg: RoundGraph, T: int, lane_starts: np.ndarray,
                 block_elems: int = 2_000_000):
        self.rg = rg
        self.lane_starts = lane_starts  # first node of each lane
        self.lane_sizes = np.diff(np.append(lane_starts, rg.n))
        self.B = max(1, min(T, block_elems // max(rg.n_slots, 1)))
        E, N = rg.n_slots, rg.n
        self.ages = np.zeros((self.B, N), np.int64)
        self.lags = np.zeros((self.B, N))
        self.w = np.zeros((self.B, E))
        self.cand = np.zeros((self.B, E), bool)
        self.adopt = np.zeros((self.B, N), bool)
        self.k = 0
        self.totals = {key: np.zeros(lane_starts.size) for key in _TOTALS}
        self.mean_age: list[np.ndarray] = []
        self.mean_lag: list[np.ndarray] = []

    def record(self, state, w, cand, adopt) -> None:
        k = self.k
        self.ages[k], self.lags[k], self.w[k], self.cand[k], self.adopt[k] = (
            state.ages, state.lags, w, cand, adopt)
        self.k += 1
        if self.k == self.B:
            self._flush()

    def _per_lane(self, per_node: np.ndarray) -> np.ndarray:
        """[rounds, N] -> [lanes] sums."""
        return np.add.reduceat(per_node.sum(axis=0), self.lane_starts)

    def _flush(self) -> None:
        k, rg = self.k, self.rg
        if k == 0:
            return
        ages, lags, w, cand, adopt = (self.ages[:k], self.lags[:k], self.w[:k], self.cand[:k],
                                      self.adopt[:k])
        starts = rg.indptr[:-1]
        nb = cand & ~rg.is_self
        n_nb = np.add.reduceat(nb.astype(np.int64), starts, axis=1)
        agg = adopt & (n_nb >= 1)
        returning = adopt & (ages >= 1)
        ret_nb = returning & agg
        a_s = ages[:, rg.send]
        l_s = lags[:, rg.send]
        big = np.iinfo(np.int64).max
        max_nb_age = np.maximum.reduceat(np.where(nb, a_s, -1), starts, axis=1)
        rel_age = (np.maximum.reduceat(np.where(cand, a_s, -1), starts, axis=1)
                   - np.minimum.reduceat(np.where(cand, a_s, big), starts, axis=1))
        rel_lag = (np.maximum.reduceat(np.where(cand, l_s, -np.inf), starts, axis=1)
                   - np.minimum.reduceat(np.where(cand, l_s, np.inf), starts, axis=1))
        n_kept = np.add.reduceat(((w > 0) & cand).astype(np.int64), starts, axis=1)
        t, lane = self.totals, self._per_lane
        t["agg"] += lane(agg)
        t["returns"] += lane(returning)
        t["ret_nb"] += lane(ret_nb)
        t["stalest"] += lane(ret_nb & (ages > max_nb_age))
        t["spread_age"] += lane(np.where(agg, rel_age, 0))
        t["spread_lag"] += lane(np.where(agg, rel_lag, 0.0))
        t["kept"] += lane(np.where(agg, n_kept, 0))
        t["self_w"] += lane(np.where(ret_nb, w[:, starts], 0.0))
        t["messages"] += lane(n_nb)
        self.mean_age.append(np.add.reduceat(ages, self.lane_starts, axis=1) / self.lane_sizes)
        self.mean_lag.append(np.add.reduceat(lags, self.lane_starts, axis=1) / self.lane_sizes)
        self.k = 0

    def finish(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Totals per lane, and mean age / lag per round and lane ([T, lanes])."""
        self._flush()
        return self.totals, np.concatenate(self.mean_age), np.concatenate(self.mean_lag)


def _pair_list(adopt: np.ndarray, h: int, *, seed: int, exact_pairs: int,
               sample: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """(start rounds, receivers, sampled?) of the H pairs, sorted by start (see horizon_pairs)."""
    T = adopt.shape[0]
    if h <= 0 or T - h < 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), False
    ts, ii = np.nonzero(adopt[: T - h + 1])
    sampled = ts.size > exact_pairs
    if sampled:
        pick = np.sort(stream(seed, "horizon").choice(ts.size, size=sample, replace=False))
        ts, ii = ts[pick], ii[pick]
    return ts.astype(np.int64), ii.astype(np.int64), bool(sampled)


def horizon_pairs(adopt: np.ndarray, h: int, *, seed: int, exact_pairs: int = EXACT_PAIRS,
                  sample: int = 1000) -> tuple[dict[int, np.ndarray], bool]:
    """The (start round, receiver) pairs over which H is averaged: all available receivers of
    every round t ≤ T − h, or a seeded uniform sample of ``sample`` of them when there are more
    than ``exact_pairs``. Returns ({t: receivers}, sampled?)."""
    ts, ii, sampled = _pair_list(adopt, h, seed=seed, exact_pairs=exact_pairs, sample=sample)
    out: dict[int, np.ndarray] = {}
    if ts.size:
        bounds = np.flatnonzero(np.diff(ts)) + 1
        for group_t, group_i in zip(np.split(ts, bounds), np.split(ii, bounds), strict=True):
            out[int(group_t[0])] = group_i
    return out, sampled


@dataclass(frozen=True)
class Lane:
    """One replay inside a batch: its trace (bool[T, n]), graph, rule and seed."""

    available: np.ndarray
    graph: Graph
    rule: Rule
    seed: int


class _RuleGroup:
    """Consecutive lanes with the same rule: their slots form one contiguous range."""

    def __init__(self, rule: Rule, lanes: list[Lane], node0: int, slot0: int):
        self.rule = rule
        self.lanes = lanes
        n = sum(ln.graph.n for ln in lanes)
        offs = np.cumsum([0] + [ln.graph.n for ln in lanes])
        edges = np.concatenate([ln.graph.edges + o for ln, o in zip(lanes, offs[:-1], strict=True)])
        self.rg = RoundGraph.from_edges(n, edges)
        self.nodes = slice(node0, node0 + n)
        self.slots = slice(slot0, slot0 + self.rg.n_slots)
        self.lane_nodes = offs
        self.lane_slots = np.concatenate([[0], np.cumsum([2 * ln.graph.edges.shape[0] + ln.graph.n
                                                          for ln in lanes])])

    def draws(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The rule's own random draws of round t, per lane (keyed by the lane's seed)."""
        u = np.empty(self.rg.n_slots)
        key = np.empty(self.rg.n_slots)
        for k, ln in enumerate(self.lanes):
            lo, hi = self.lane_slots[k], self.lane_slots[k + 1]
            u_client, key[lo:hi] = rule_draws(ln.seed, t, ln.graph.n, hi - lo)
            u[lo:hi] = u_client[self.rg.recv[lo:hi] - self.lane_nodes[k]]
        return u, key


ENGINES = ("auto", "compiled", "numpy")


def replay_batch(lanes: Sequence[Lane], *, anatomy: str = "full", link_failure: float = 0.0,
                 horizon: int = 50, exact_pairs: int = EXACT_PAIRS, sample_pairs: int = 1000,
                 progress: Callable[[int, int], None] | None = None,
                 engine: str = "auto", threads: int | None = None) -> list[ReplayResult]:
    """Replay several (trace, graph, rule, seed) lanes; every lane gives exactly what it would
    give alone (its random draws, link failures and horizon sample are keyed by its own seed).

    engine:
      * ``"compiled"`` — each lane in one numba kernel (:mod:`sfg.replay_kernel`); every
        model-free rule but the oracles;
      * ``"numpy"`` — the lanes stacked as one disjoint graph and run through the simulator's
        own round code (:mod:`sfg.engine`), one vectorised numpy pass per round; stacking
        amortises numpy's per-call cost over all lanes' clients. Runs every rule;
      * ``"auto"`` (default) — compiled where the kernel has the rule, numpy for the rest.

    threads: threads for the compiled engine (default: all usable cores). Several lanes run
    on parallel threads, one each; a single lane splits its self-return H over them when
    that work is large. Results do not depend on it.

    The two engines agree to rounding (tested weight by weight); lanes must share T.

    BLAS runs single-threaded in the numpy engine: the products are small, and a
    multi-threaded OpenBLAS spends far longer synchronising its threads than computing them
    (measured: 16 ms instead of 0.13 ms for a 20×60 by 60×1750 product on the 2-core
    development machine).
    """
    from . import replay_kernel

    check(len(lanes) > 0, "nothing to replay")
    T = lanes[0].available.shape[0]
    check(all(ln.available.shape[0] == T for ln in lanes), "lanes must have the same rounds")
    check(0.0 <= link_failure < 1.0, f"link failure probability {link_failure} must lie in [0, 1)")
    for ln in lanes:
        if ln.rule.reads_models:
            raise SfgError(f"rule {ln.rule.name!r} reads model parameters; replay covers "
                           "model-free rules only — run it with `sfg run`")
        check(ln.available.shape[1] == ln.graph.n,
              f"trace has {ln.available.shape[1]} clients but the graph has {ln.graph.n}")
    _check_engine(engine, [ln.rule for ln in lanes])
    fast = [k for k, ln in enumerate(lanes)
            if engine != "numpy" and replay_kernel.supports(ln.rule)]
    slow = [k for k in range(len(lanes)) if k not in set(fast)]
    results: list[ReplayResult | None] = [None] * len(lanes)
    total = len(lanes) * T  # progress counts lane-rounds

    def at(offset: int, scale: int = 1) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        return lambda t, _T: progress(offset + scale * t, total)

    run = partial(_replay_compiled, anatomy=anatomy, link_failure=link_failure,
                  horizon=horizon, exact_pairs=exact_pairs, sample_pairs=sample_pairs)
    n_threads = default_threads() if threads is None else max(1, int(threads))
    if len(fast) > 1 and n_threads > 1:
        # independent lanes on parallel threads (the kernels release the GIL), one thread each
        with ThreadPoolExecutor(max_workers=min(n_threads, len(fast))) as pool:
            futures = {pool.submit(run, lanes[k], threads=1): k for k in fast}
            for done, fut in enumerate(as_completed(futures)):
                results[futures[fut]] = fut.result()
                if progress is not None:
                    progress((done + 1) * T, total)
    else:
        for done, k in enumerate(fast):
            results[k] = run(lanes[k], progress=at(done * T), threads=threads)
    if slow:
        with threadpool_limits(limits=1, user_api="blas"):
            out = _replay_batch([lanes[k] for k in slow], anatomy=anatomy,
                                link_failure=link_failure, horizon=horizon,
                                exact_pairs=exact_pairs, sample_pairs=sample_pairs,
                                progress=at(len(fast) * T, len(slow)))
        for k, res in zip(slow, out, strict=True):
            results[k] = res
    return results  # type: ignore[return-value]


def warm_compiled() -> None:
    """Compile the compiled engine's kernels, or load them from numba's on-disk cache, by
    replaying a tiny trace (the first use on a machine compiles: about 15 s; later ones load
    in under a second). The command line calls this under a spinner."""
    from . import replay_kernel

    if not replay_kernel.HAVE_NUMBA:  # pragma: no cover
        return
    g = Graph(n=3, edges=np.array([[0, 1], [1, 2]]), positions=None, name="path")
    avail = np.array([[1, 0, 1], [1, 1, 1], [0, 1, 1]], bool)
    _replay_compiled(Lane(avail, g, parse_rule("dfedavg"), 0), anatomy="full", link_failure=0.0,
                     horizon=1, exact_pairs=EXACT_PAIRS, sample_pairs=1, threads=1)


def _check_engine(engine: str, rules: Sequence[Rule]) -> None:
    from . import replay_kernel

    check(engine in ENGINES, f"unknown replay engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "compiled":
        bad = [str(r) for r in rules if not replay_kernel.supports(r) and not r.reads_models]
        if bad:
            why = ("numba is not installed" if not replay_kernel.HAVE_NUMBA else
                   "the compiled engine has every model-free rule but the oracles")
            raise SfgError(f"rule {bad[0]!r} cannot run on the compiled engine ({why}); "
                           "use engine 'numpy' or 'auto'")


def default_threads() -> int:
    """Threads for the compiled engine's self-return: the cores this process may use (≤ 8)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class _HorizonPart:
    """One thread's share of the self-return pairs (see replay_kernel.horizon_rounds): its own
    pair list, ring of columns and pool of rows."""

    def __init__(self, T: int, n: int, h: int, ts: np.ndarray, ii: np.ndarray, max_adopt: int):
        self.ptr = np.zeros(T + 1, np.int64)
        np.cumsum(np.bincount(ts, minlength=T), out=self.ptr[1:])
        self.pairs, self.h = ii, h
        # ring of columns: wide enough for the pairs of any h consecutive starts
        width = (int((self.ptr[np.minimum(np.arange(T + 1) + h, T)] - self.ptr).max())
                 if ii.size else 0)
        self.C = np.zeros((n + max_adopt if width else 0, width))
        self.rowbuf = np.arange(n, dtype=np.int64)
        self.spare = np.arange(n, n + max_adopt, dtype=np.int64)
        self.recv = np.zeros(width, np.int64)
        self.acc = np.zeros(width)
        self.out = np.full(ii.size, np.nan)

    def run(self, t0: int, t1: int, rg: RoundGraph, w: np.ndarray, adopt: np.ndarray,
            tile: int) -> None:
        from . import replay_kernel as K

        K.horizon_rounds(t0, t1, rg.indptr, rg.send, w, adopt, self.C, self.rowbuf, self.spare,
                         self.recv, self.acc, self.ptr, self.pairs, self.out, self.h, tile)


def _replay_compiled(ln: Lane, *, anatomy: str, link_failure: float, horizon: int,
                     exact_pairs: int, sample_pairs: int,
                     progress: Callable[[int, int], None] | None = None,
                     weights_out: np.ndarray | None = None, threads: int | None = None,
                     chunk_elems: int = 2_000_000, tile: int = 4096) -> ReplayResult:
    """One lane on the compiled kernel (:mod:`sfg.replay_kernel`).

    The rounds run in chunks: the kernel replays a chunk's rounds and keeps their weights,
    then the self-return H follows its pairs through those rounds. The pairs are split by
    start round over ``threads`` threads (default: :func:`default_threads`; the kernels
    release the GIL); each pair's arithmetic does not depend on the split, so results are
    bit-identical for any number of threads. ``weights_out`` [T, E] receives every round's
    slot weights (tests compare them with the numpy engine). The lane is one that
    :func:`replay_batch` has checked."""
    from . import replay_kernel as K

    T, n = ln.available.shape
    rg = RoundGraph.from_graph(ln.graph)
    E = rg.n_slots
    caps = capabilities(np.asarray(ln.available, bool), anatomy)
    live = (link_failures(ln.graph.edges, T, p=link_failure, seed=ln.seed) if link_failure > 0
            else np.zeros((0, 0), bool))
    rid, prm = K.rule_params(ln.rule)
    ts, flat, sampled = _pair_list(caps.adopt, horizon, seed=ln.seed, exact_pairs=exact_pairs,
                                   sample=sample_pairs)
    h = horizon if flat.size else 0
    n_adopt = caps.adopt.sum(axis=1)
    max_adopt = int(n_adopt.max()) if (h and T) else 0
    if threads is None:
        # H costs about (pairs × h) columns × adopters row updates; below ~10^7 a second
        # thread costs more than it saves (measured at N = 100: bursty u = 0.8 is below)
        work = flat.size * h * (float(n_adopt.mean()) if T else 0.0)
        threads = default_threads() if work >= 1e7 else 1
    n_threads = max(1, int(threads))
    picks = [ts % n_threads == k for k in range(n_threads)] if h else []
    parts = [_HorizonPart(T, n, h, ts[sel], flat[sel], max_adopt) for sel in picks]

    ages = np.zeros(n, np.int64)
    lags = np.zeros(n)
    counts = np.ones(n, np.int64)
    lcounts = np.ones(n, np.int64)
    q = np.ones(E)
    new_ages, new_lags, new_counts = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64)
    hbuf, w, cand = np.empty(E), np.empty(E), np.empty(E, bool)
    totals = np.zeros(len(_TOTALS))  # the kernel adds into them in this order
    mean_age, mean_lag = np.zeros(T), np.zeros(T)
    no_draws = np.zeros((0, 0))
    R = max(1, min(T, chunk_elems // max(E, 1)))
    wbuf = np.empty((R, E)) if (h and weights_out is None) else np.zeros((0, 0))
    pool = ThreadPoolExecutor(max_workers=n_threads) if n_threads > 1 else None
    try:
        for t0 in range(0, T, R):
            t1 = min(T, t0 + R)
            u = key = no_draws
            if ln.rule.random:
                u, key = np.empty((t1 - t0, n)), np.empty((t1 - t0, E))
                for t in range(t0, t1):
                    u[t - t0], key[t - t0] = rule_draws(ln.seed, t, n, E)
            w_out = weights_out[t0:t1] if weights_out is not None else wbuf[: t1 - t0]
            K.run_rounds(t0, t1, rid, prm, rg.indptr, rg.send, rg.edge_id,
                         caps.train[t0:t1], caps.send[t0:t1], caps.aggregate[t0:t1],
                         caps.adopt[t0:t1], live[t0:t1] if live.size else live, u, key,
                         ages, lags, counts, lcounts, q, new_ages, new_lags, new_counts,
                         hbuf, w, cand, totals, mean_age, mean_lag, w_out)
            if h:
                run = partial(_HorizonPart.run, t0=t0, t1=t1, rg=rg, w=w_out,
                              adopt=caps.adopt[t0:t1], tile=tile)
                if pool is None:
                    run(parts[0])
                else:
                    list(pool.map(run, parts))
            if progress is not None:
                progress(t1, T)
    finally:
        if pool is not None:
            pool.shutdown()
    hk = np.empty(flat.size)
    for sel, part in zip(picks, parts, strict=True):
        hk[sel] = part.out
    tot = dict(zip(_TOTALS, totals.tolist(), strict=True))
    return ReplayResult(metrics=_metrics(ln, tot, hk, bool(sampled), lags),
                        curves={"round": list(range(T)), "mean_age": mean_age.tolist(),
                                "mean_lag": mean_lag.tolist()})


def _metrics(ln: Lane, tot: dict[str, float], hk: np.ndarray, sampled: bool,
             final_lags: np.ndarray) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return float(a / b) if b else float("nan")

    return {
        "unavailability": float(1.0 - ln.available.mean()),
        "returns": tot["returns"],
        "premise": ratio(tot["stalest"], tot["ret_nb"]),
        "spread_age": ratio(tot["spread_age"], tot["agg"]),
        "spread_lag": ratio(tot["spread_lag"], tot["agg"]),
        "kept": ratio(tot["kept"], tot["agg"]),
        "self_weight_return": ratio(tot["self_w"], tot["ret_nb"]),
        "H": float(hk.mean()) if hk.size else float("nan"),
        "H_se": float(hk.std(ddof=1) / np.sqrt(hk.size)) if (sampled and hk.size > 1) else 0.0,
        "H_pairs": float(hk.size),
        "messages": tot["messages"],
        "final_mean_lag": float(final_lags.mean()),
    }


def _replay_batch(lanes, *, anatomy, link_failure, horizon, exact_pairs, sample_pairs,
                  progress) -> list[ReplayResult]:
    """The numpy engine on lanes that :func:`replay_batch` has checked."""
    T = lanes[0].available.shape[0]
    # rule-major order: lanes of one rule are contiguous (original order kept for the results)
    order = sorted(range(len(lanes)), key=lambda k: str(lanes[k].rule))
    ordered = [lanes[k] for k in order]
    groups: list[_RuleGroup] = []
    node0 = slot0 = 0
    k = 0
    while k < len(ordered):
        j = k
        while j < len(ordered) and str(ordered[j].rule) == str(ordered[k].rule):
            j += 1
        grp = _RuleGroup(ordered[k].rule, ordered[k:j], node0, slot0)
        groups.append(grp)
        node0, slot0, k = grp.nodes.stop, grp.slots.stop, j
    sizes = np.array([ln.graph.n for ln in ordered])
    lane_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    offs = np.concatenate([[0], np.cumsum(sizes)])
    edges = np.concatenate([ln.graph.edges + o for ln, o in zip(ordered, offs[:-1], strict=True)])
    rg = RoundGraph.from_edges(int(offs[-1]), edges)
    available = np.concatenate([ln.available for ln in ordered], axis=1).astype(bool)
    caps_all = capabilities(available, anatomy)
    live_all = None
    if link_failure > 0:
        live_all = np.concatenate([link_failures(ln.graph.edges, T, p=link_failure, seed=ln.seed)
                                   for ln in ordered], axis=1)
    # the self-return is tracked per lane: a lane's columns never leave its own clients
    sampled = np.zeros(len(ordered), bool)
    horizons: list[tuple[_Horizon, slice, slice]] = []
    for k, ln in enumerate(ordered):
        p_k, sampled[k] = horizon_pairs(caps_all.adopt[:, offs[k]:offs[k + 1]], horizon,
                                        seed=ln.seed, exact_pairs=exact_pairs, sample=sample_pairs)
        if p_k:
            horizons.append((_Horizon(RoundGraph.from_graph(ln.graph), horizon, p_k),
                             slice(offs[k], offs[k + 1]),
                             slice(rg.indptr[offs[k]], rg.indptr[offs[k + 1]])))

    from .engine import batch_slots, candidate_mask
    from .rules import normalise

    state = init_state(rg, rounds=T, track_missed=any(g.rule.oracle for g in groups))
    acc = _Analyses(rg, T, lane_starts)
    any_random = any(g.rule.random for g in groups)
    for t in range(T):
        caps = caps_at(caps_all, t)
        cand = candidate_mask(rg, caps, None if live_all is None else live_all[t])
        slots = batch_slots(rg, state, cand, rule=None, seed=0)
        if any_random:
            slots.u = np.zeros(rg.n_slots)
            slots.key = np.zeros(rg.n_slots)
        h = np.empty(rg.n_slots)
        for grp in groups:
            sl = grp.slots
            if grp.rule.random:
                slots.u[sl], slots.key[sl] = grp.draws(t)
            sub = type(slots)(rg=grp.rg, t=t, is_self=grp.rg.is_self, cand=cand[sl],
                              age=slots.age[sl], lag=slots.lag[sl], count=slots.count[sl],
                              local_count=slots.local_count[sl], q=slots.q[sl], u=slots.u[sl],
                              key=slots.key[sl],
                              missed=None if slots.missed is None else slots.missed[sl])
            h[sl] = grp.rule.scores(sub)
        w = normalise(h, slots, caps.adopt)
        rw = RoundWeights(weights=w, candidate=cand, slots=slots)
        acc.record(state, w, cand, caps.adopt)
        for hz, nodes, lane_slots in horizons:
            hz.step(t, w[lane_slots], caps.adopt[nodes])
        state = advance(state, rg, rw, caps)
        if progress is not None:
            progress(t + 1, T)

    totals, mean_age, mean_lag = acc.finish()
    H_of = {nodes.start: hz.values() for hz, nodes, _ in horizons}

    results: list[ReplayResult | None] = [None] * len(lanes)
    for k, ln in enumerate(ordered):
        hk = H_of.get(int(offs[k]), np.zeros(0))
        tot = {key: float(v[k]) for key, v in totals.items()}
        metrics = _metrics(ln, tot, hk, bool(sampled[k]), state.lags[offs[k]:offs[k + 1]])
        curves = {"round": list(range(T)), "mean_age": mean_age[:, k].tolist(),
                  "mean_lag": mean_lag[:, k].tolist()}
        results[order[k]] = ReplayResult(metrics=metrics, curves=curves)
    return results  # type: ignore[return-value]


def replay_trace(
    available: np.ndarray,
    graph: Graph,
    rule: Rule | str,
    *,
    seed: int,
    anatomy: str = "full",
    link_failure: float = 0.0,
    horizon: int = 50,
    exact_pairs: int = EXACT_PAIRS,
    sample_pairs: int = 1000,
    progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
    threads: int | None = None,
) -> ReplayResult:
    """Replay ``rule`` on availability ``available`` (bool[T, N]) over ``graph``
    (``engine``: see :func:`replay_batch`)."""
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    return replay_batch([Lane(np.asarray(available, bool), graph, rule, seed)], anatomy=anatomy,
                        link_failure=link_failure, horizon=horizon, exact_pairs=exact_pairs,
                        sample_pairs=sample_pairs, progress=progress, engine=engine,
                        threads=threads)[0]


def build_scenario(process: str, *, n: int, T: int, graph: str, seed: int) -> tuple[Graph, np.ndarray]:
    """The graph and trace of a (process, seed) pair: shared by every rule (SPEC §7)."""
    check(n >= 2, f"need at least 2 clients, got N={n}")
    check(T >= 1, f"need at least 1 round, got T={T}")
    g = make_graph(graph, n, seed=seed)
    proc = make_process(process)
    avail = proc.sample(T, n, seed=seed, positions=g.positions)
    return g, avail


def replay(
    processes: Sequence[str],
    rules: Sequence[str],
    seeds: Sequence[int],
    *,
    n: int = DEFAULT_N,
    T: int = DEFAULT_T,
    graph: str = DEFAULT_GRAPH,
    anatomy: str = "full",
    link_failure: float = 0.0,
    horizon: int = 50,
    batch_clients: int = 400,
    with_curves: bool = False,
    progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """Replay processes × rules × seeds; one row per combination (rules share each trace).

    Replays go to :func:`replay_batch` (which describes ``engine`` and ``threads``) in
    batches of up to ``batch_clients`` clients; results do not depend on the batching.
    ``with_curves`` adds each replay's per-round mean age and lag under the key ``"curves"``."""
    check(len(processes) > 0, "give at least one --process, e.g. --process bursty:u=0.8")
    check(len(rules) > 0, "give at least one --rule, e.g. --rule sfg-cut")
    check(len(seeds) > 0, "give at least one seed, e.g. --seeds 1,2,3")
    parsed = [parse_rule(r) for r in rules]  # validate every name before any work
    _check_engine(engine, parsed)
    for p in processes:
        make_process(p)
    lanes: list[tuple[dict, Lane]] = []
    for p in processes:
        for seed in seeds:
            g, avail = build_scenario(p, n=n, T=T, graph=graph, seed=seed)
            for r in parsed:
                lanes.append(({"process": p, "rule": str(r), "seed": seed}, Lane(avail, g, r, seed)))
    rows: list[dict[str, Any]] = []
    done = 0
    for batch in _batches([ln for _, ln in lanes], max_clients=batch_clients):
        results = replay_batch([lanes[k][1] for k in batch], anatomy=anatomy,
                               link_failure=link_failure, horizon=horizon, engine=engine,
                               threads=threads)
        for k, res in zip(batch, results, strict=True):
            rows.append({**lanes[k][0], **res.metrics,
                         **({"curves": res.curves} if with_curves else {})})
        done += len(batch)
        if progress is not None:
            progress(done, len(lanes))
    return rows


def plot_staleness(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """PNG of the mean age and mean effective lag over rounds, one line per rule (mean over
    seeds), one column per process. ``rows`` from :func:`replay` with ``with_curves=True``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    processes = list(dict.fromkeys(r["process"] for r in rows))
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    fig, axes = plt.subplots(2, len(processes), figsize=(5 * len(processes), 6.5), squeeze=False,
                             sharex=True)
    for j, proc in enumerate(processes):
        for rule in rules:
            sel = [r["curves"] for r in rows if r["process"] == proc and r["rule"] == rule]
            if not sel:
                continue
            for i, key in enumerate(("mean_age", "mean_lag")):
                y = np.mean([c[key] for c in sel], axis=0)
                axes[i, j].plot(sel[0]["round"], y, label=rule, lw=1.2)
        axes[0, j].set_title(proc)
        axes[0, j].set_ylabel("mean age τ")
        axes[1, j].set_ylabel("mean effective lag ℓ")
        axes[1, j].set_xlabel("round")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise SfgError(f"cannot write plot {path}: {e.strerror}; choose a writable path") from None
    finally:
        plt.close(fig)
    return path


def _batches(lanes: Sequence[Lane], *, max_clients: int) -> list[list[int]]:
    """Consecutive groups of lane indices with at most ``max_clients`` clients (≥ 1 lane)."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for k, ln in enumerate(lanes):
        if cur and size + ln.graph.n > max_clients:
            out.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += ln.graph.n
    if cur:
        out.append(cur)
    return out


def replay_config(cfg: dict[str, Any], *, progress: Callable[[int, int], None] | None = None) -> dict:
    """Run one replay from a run-config dict (the grid runner's ``kind: replay``)."""
    seed = int(cfg.get("seed", 1))
    n = int(cfg.get("n_clients", DEFAULT_N))
    T = int(cfg.get("rounds", DEFAULT_T))
    g, avail = build_scenario(cfg.get("process", "none"), n=n, T=T,
                              graph=cfg.get("graph", DEFAULT_GRAPH), seed=seed)
    res = replay_trace(avail, g, cfg.get("rule", "dfedavg"), seed=seed,
                       anatomy=cfg.get("anatomy", "full"),
                       link_failure=float(cfg.get("link_failure", 0.0)),
                       horizon=int(cfg.get("horizon", 50)), progress=progress,
                       threads=1)  # the grid already runs one replay per core
    return {"metrics": res.metrics, "curves": res.curves}
