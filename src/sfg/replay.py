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

The replay is vectorised over clients and edges (one numpy pass per round); the per-client
Python loop in :mod:`sfg.replay_reference` is the reference it is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from .engine import advance, caps_at, round_weights
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
    round (the others have identity rows), and only columns in use are touched, so a round
    costs (adopters' slots) × (live columns).
    """

    def __init__(self, rg: RoundGraph, T: int, h: int, pairs: dict[int, np.ndarray]):
        self.rg, self.h, self.pairs = rg, h, pairs
        self.cap = max((v.size for v in pairs.values()), default=0)
        width = h * self.cap
        self.C = np.zeros((rg.n, width))
        self.recv = np.zeros(width, np.int64)  # receiver of each column
        self.live = np.zeros(width, bool)      # column in use
        self.acc = np.zeros(width)
        self.cols = np.arange(width)
        self.done: list[np.ndarray] = []

    def step(self, s: int, w: np.ndarray, adopt: np.ndarray) -> None:
        rg, cap = self.rg, self.cap
        live = np.flatnonzero(self.live)
        if live.size:
            if adopt.any():
                rows = np.flatnonzero(adopt)
                sl = np.flatnonzero(adopt[rg.recv])  # slots of adopting receivers, by receiver
                lens = rg.indptr[rows + 1] - rg.indptr[rows]
                senders, col = np.unique(rg.send[sl], return_inverse=True)
                indptr = np.concatenate([[0], np.cumsum(lens)])
                W_rows = sp.csr_matrix((w[sl], col, indptr), shape=(rows.size, senders.size))
                self.C[np.ix_(rows, live)] = W_rows @ self.C[np.ix_(senders, live)]
            self.acc[live] += self.C[self.recv[live], live]
        # start s − h + 1 (block (s + 1) mod h) has its h terms now
        b = (s + 1) % self.h
        ending = slice(b * cap, (b + 1) * cap)
        if self.live[ending].any():
            self.done.append(self.acc[ending][self.live[ending]])
            self.live[ending] = False
        # start s takes block s mod h (freed at round s − 1)
        block = slice((s % self.h) * cap, (s % self.h + 1) * cap)
        new = self.pairs.get(s)
        if new is not None and new.size:
            cols = np.arange(block.start, block.start + new.size)
            self.C[:, block] = 0.0
            self.C[new, cols] = 1.0
            self.recv[cols], self.live[cols], self.acc[cols] = new, True, 1.0
            if self.h == 1:
                self.done.append(self.acc[cols].copy())
                self.live[cols] = False

    def values(self) -> np.ndarray:
        return np.concatenate(self.done) if self.done else np.zeros(0)


class _Analyses:
    """Premise, spreads, kept candidates and self-weights (SPEC §9), computed in blocks of
    rounds: each round only stores its ages, lags, weights and candidates; the analyses run
    vectorised over [rounds, slots] arrays once a block is full."""

    def __init__(self, rg: RoundGraph, T: int, block_elems: int = 2_000_000):
        self.rg = rg
        self.B = max(1, min(T, block_elems // max(rg.n_slots, 1)))
        E, N = rg.n_slots, rg.n
        self.ages = np.zeros((self.B, N), np.int64)
        self.lags = np.zeros((self.B, N))
        self.w = np.zeros((self.B, E))
        self.cand = np.zeros((self.B, E), bool)
        self.adopt = np.zeros((self.B, N), bool)
        self.k = 0
        self.totals = dict.fromkeys(("agg", "returns", "ret_nb", "stalest", "spread_age",
                                     "spread_lag", "kept", "self_w", "messages"), 0.0)
        self.mean_age: list[float] = []
        self.mean_lag: list[float] = []

    def record(self, state, w, cand, adopt) -> None:
        k = self.k
        self.ages[k], self.lags[k], self.w[k], self.cand[k], self.adopt[k] = (
            state.ages, state.lags, w, cand, adopt)
        self.k += 1
        if self.k == self.B:
            self._flush()

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
        t = self.totals
        t["agg"] += int(agg.sum())
        t["returns"] += int(returning.sum())
        t["ret_nb"] += int(ret_nb.sum())
        t["stalest"] += int((ret_nb & (ages > max_nb_age)).sum())
        t["spread_age"] += float(rel_age[agg].sum())
        t["spread_lag"] += float(rel_lag[agg].sum())
        t["kept"] += float(n_kept[agg].sum())
        t["self_w"] += float(w[:, starts][ret_nb].sum())
        t["messages"] += int(nb.sum())
        self.mean_age.extend(ages.mean(axis=1).tolist())
        self.mean_lag.extend(lags.mean(axis=1).tolist())
        self.k = 0

    def finish(self) -> dict[str, float]:
        self._flush()
        return self.totals


def link_failures_or_none(graph: Graph, T: int, p: float, seed: int) -> np.ndarray | None:
    """bool[T, M] live links for the whole replay, or None without link failures."""
    if p <= 0:
        return None
    return link_failures(graph.edges, T, p=p, seed=seed)


def horizon_pairs(adopt: np.ndarray, h: int, *, seed: int, exact_pairs: int = EXACT_PAIRS,
                  sample: int = 1000) -> tuple[dict[int, np.ndarray], bool]:
    """The (start round, receiver) pairs over which H is averaged: all available receivers of
    every round t ≤ T − h, or a seeded uniform sample of ``sample`` of them when there are more
    than ``exact_pairs``. Returns ({t: receivers}, sampled?)."""
    T = adopt.shape[0]
    if h <= 0 or T - h < 0:
        return {}, False
    ts, ii = np.nonzero(adopt[: T - h + 1])
    sampled = ts.size > exact_pairs
    if sampled:
        pick = np.sort(stream(seed, "horizon").choice(ts.size, size=sample, replace=False))
        ts, ii = ts[pick], ii[pick]
    out: dict[int, np.ndarray] = {}
    if ts.size:
        bounds = np.flatnonzero(np.diff(ts)) + 1
        for group_t, group_i in zip(np.split(ts, bounds), np.split(ii, bounds), strict=True):
            out[int(group_t[0])] = group_i
    return out, sampled


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
) -> ReplayResult:
    """Replay ``rule`` on availability ``available`` (bool[T, N]) over ``graph``."""
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    if rule.reads_models:
        raise SfgError(f"rule {rule.name!r} reads model parameters; replay covers model-free "
                       "rules only — run it with `sfg run`")
    available = np.asarray(available, dtype=bool)
    T, N = available.shape
    check(N == graph.n, f"trace has {N} clients but the graph has {graph.n}")
    check(0.0 <= link_failure < 1.0, f"link failure probability {link_failure} must lie in [0, 1)")
    rg = RoundGraph.from_graph(graph)
    state = init_state(rg)
    caps_all = capabilities(available, anatomy)
    pairs, sampled = horizon_pairs(caps_all.adopt, horizon, seed=seed, exact_pairs=exact_pairs,
                                   sample=sample_pairs)
    hz = _Horizon(rg, T, horizon, pairs) if pairs else None

    acc = _Analyses(rg, T)
    live_all = link_failures_or_none(graph, T, link_failure, seed)
    for t in range(T):
        caps = caps_at(caps_all, t)
        rw = round_weights(rule, rg, state, caps, seed=seed,
                           live=None if live_all is None else live_all[t])
        acc.record(state, rw.weights, rw.candidate, caps.adopt)
        if hz is not None:
            hz.step(t, rw.weights, caps.adopt)
        state = advance(state, rg, rw, caps)
        if progress is not None:
            progress(t + 1, T)
    m = acc.finish()
    H = hz.values() if hz is not None else np.zeros(0)

    def ratio(a: float, b: float) -> float:
        return float(a / b) if b else float("nan")

    metrics = {
        "unavailability": float(1.0 - available.mean()),
        "returns": float(m["returns"]),
        "premise": ratio(m["stalest"], m["ret_nb"]),
        "spread_age": ratio(m["spread_age"], m["agg"]),
        "spread_lag": ratio(m["spread_lag"], m["agg"]),
        "kept": ratio(m["kept"], m["agg"]),
        "self_weight_return": ratio(m["self_w"], m["ret_nb"]),
        "H": float(H.mean()) if H.size else float("nan"),
        "H_se": float(H.std(ddof=1) / np.sqrt(H.size)) if (sampled and H.size > 1) else 0.0,
        "H_pairs": float(H.size),
        "messages": float(m["messages"]),
        "final_mean_lag": float(state.lags.mean()),
    }
    curves = {"round": list(range(T)), "mean_age": acc.mean_age, "mean_lag": acc.mean_lag}
    return ReplayResult(metrics=metrics, curves=curves)


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
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Replay processes × rules × seeds; one row per combination (rules share each trace)."""
    check(len(processes) > 0, "give at least one --process, e.g. --process bursty:u=0.8")
    check(len(rules) > 0, "give at least one --rule, e.g. --rule sfg-cut")
    check(len(seeds) > 0, "give at least one seed, e.g. --seeds 1,2,3")
    parsed = [parse_rule(r) for r in rules]  # validate every name before any work
    for p in processes:
        make_process(p)
    rows = []
    total = len(processes) * len(seeds) * len(parsed)
    done = 0
    for p in processes:
        for seed in seeds:
            g, avail = build_scenario(p, n=n, T=T, graph=graph, seed=seed)
            for r in parsed:
                res = replay_trace(avail, g, r, seed=seed, anatomy=anatomy,
                                   link_failure=link_failure, horizon=horizon)
                rows.append({"process": p, "rule": str(r), "seed": seed, **res.metrics})
                done += 1
                if progress is not None:
                    progress(done, total)
    return rows


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
                       horizon=int(cfg.get("horizon", 50)), progress=progress)
    return {"metrics": res.metrics, "curves": res.curves}
