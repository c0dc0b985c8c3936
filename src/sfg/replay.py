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

from .engine import advance, caps_at, round_weights
from .errors import SfgError, check
from .graphs import Graph, make_graph
from .outages import make_process
from .outages.anatomy import capabilities
from .outages.links import live_links_round
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
    """Online computation of the self-return H over a fixed horizon (SPEC §9)."""

    def __init__(self, rg: RoundGraph, T: int, h: int, pairs: dict[int, np.ndarray]):
        self.rg, self.T, self.h, self.pairs = rg, T, h, pairs
        self.C = np.zeros((rg.n, 0))
        self.recv = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.acc = np.zeros(0)
        self.done: list[np.ndarray] = []
        self.dense = rg.n <= 400

    def step(self, s: int, w: np.ndarray) -> None:
        if self.C.shape[1]:
            W = self.rg.to_dense(w) if self.dense else self.rg.to_sparse(w)
            self.C = np.asarray(W @ self.C)
            self.acc += self.C[self.recv, np.arange(self.C.shape[1])]
            fin = self.end == s
            if fin.any():
                self.done.append(self.acc[fin])
                keep = ~fin
                self.C, self.recv = self.C[:, keep], self.recv[keep]
                self.end, self.acc = self.end[keep], self.acc[keep]
        new = self.pairs.get(s)
        if new is not None and new.size:
            if self.h == 1:
                self.done.append(np.ones(new.size))
                return
            block = np.zeros((self.rg.n, new.size))
            block[new, np.arange(new.size)] = 1.0
            self.C = np.concatenate([self.C, block], axis=1)
            self.recv = np.concatenate([self.recv, new])
            self.end = np.concatenate([self.end, np.full(new.size, s + self.h - 1)])
            self.acc = np.concatenate([self.acc, np.ones(new.size)])

    def values(self) -> np.ndarray:
        return np.concatenate(self.done) if self.done else np.zeros(0)


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

    n_agg = n_returns = n_ret_nb = n_stalest = 0
    spread_age = spread_lag = kept = self_w = 0.0
    messages = 0
    mean_age: list[float] = []
    mean_lag: list[float] = []
    self_slot = rg.indptr[:-1]
    for t in range(T):
        caps = caps_at(caps_all, t)
        live = live_links_round(graph.edges.shape[0], t, p=link_failure, seed=seed) \
            if link_failure > 0 else None
        rw = round_weights(rule, rg, state, caps, seed=seed, live=live)
        s, w = rw.slots, rw.weights
        nb = rw.candidate & ~rg.is_self
        n_nb = np.bincount(rg.recv, weights=nb, minlength=N)
        agg = caps.adopt & (n_nb >= 1)
        returning = caps.adopt & (state.ages >= 1)
        ret_nb = returning & agg
        max_nb_age = s.max(s.age, nb)[self_slot]
        rel_age = (s.max(s.age) - s.min(s.age))[self_slot]
        rel_lag = (s.max(s.lag) - s.min(s.lag))[self_slot]
        n_kept = np.bincount(rg.recv, weights=(w > 0) & rw.candidate, minlength=N)

        n_agg += int(agg.sum())
        n_returns += int(returning.sum())
        n_ret_nb += int(ret_nb.sum())
        n_stalest += int((ret_nb & (state.ages > max_nb_age)).sum())
        spread_age += float(rel_age[agg].sum())
        spread_lag += float(rel_lag[agg].sum())
        kept += float(n_kept[agg].sum())
        self_w += float(w[self_slot][ret_nb].sum())
        messages += int(nb.sum())
        mean_age.append(float(state.ages.mean()))
        mean_lag.append(float(state.lags.mean()))

        if hz is not None:
            hz.step(t, w)
        state = advance(state, rg, rw, caps)
        if progress is not None:
            progress(t + 1, T)

    H = hz.values() if hz is not None else np.zeros(0)

    def ratio(a: float, b: float) -> float:
        return float(a / b) if b else float("nan")

    metrics = {
        "unavailability": float(1.0 - available.mean()),
        "returns": float(n_returns),
        "premise": ratio(n_stalest, n_ret_nb),
        "spread_age": ratio(spread_age, n_agg),
        "spread_lag": ratio(spread_lag, n_agg),
        "kept": ratio(kept, n_agg),
        "self_weight_return": ratio(self_w, n_ret_nb),
        "H": float(H.mean()) if H.size else float("nan"),
        "H_se": float(H.std(ddof=1) / np.sqrt(H.size)) if (sampled and H.size > 1) else 0.0,
        "H_pairs": float(H.size),
        "messages": float(messages),
        "final_mean_lag": float(state.lags.mean()),
    }
    curves = {"round": list(range(T)), "mean_age": mean_age, "mean_lag": mean_lag}
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
