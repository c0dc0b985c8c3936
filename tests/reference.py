"""A straightforward per-client Python loop of the replay: the reference for :mod:`sfg.replay`.

Deliberately simple (dicts and lists, one receiver at a time, the rules' one-receiver form,
dense products for the self-return H), so that it is easy to check by reading. The vectorised
replay must agree with it; ``benchmarks/bench_replay.py`` measures both side by side.
Anatomy mode ``full`` only; H always exact.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from .graphs import Graph
from .outages.links import live_links_round
from .rng import stream
from .rounds import RoundGraph
from .rules import Rule, parse_rule
from .staleness import Q_HAT_BETA, Q_HAT_FLOOR


def replay_reference(available: np.ndarray, graph: Graph, rule: Rule | str, *, seed: int,
                     link_failure: float = 0.0, horizon: int = 50) -> dict[str, float]:
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    available = np.asarray(available, bool)
    T, N = available.shape
    nbrs: list[list[int]] = [[] for _ in range(N)]
    edge_index: dict[tuple[int, int], int] = {}
    for e, (a, b) in enumerate(graph.edges.tolist()):
        nbrs[a].append(b)
        nbrs[b].append(a)
        edge_index[(a, b)] = edge_index[(b, a)] = e
    for lst in nbrs:
        lst.sort()
    rg = RoundGraph.from_graph(graph)  # only to look up where the rule's random keys live
    slot_of = {(int(r), int(s)): k for k, (r, s) in enumerate(zip(rg.recv, rg.send, strict=True))}

    age = [0] * N
    lag = [0.0] * N
    count = [1] * N
    local = [1] * N
    q = {(i, j): 1.0 for i in range(N) for j in nbrs[i]}

    n_agg = n_returns = n_ret_nb = n_stalest = 0
    spread_age = spread_lag = kept = self_w = 0.0
    messages = 0
    mixing: list[np.ndarray] = []
    for t in range(T):
        avail = available[t]
        live = live_links_round(graph.edges.shape[0], t, p=link_failure, seed=seed) \
            if link_failure > 0 else None
        if rule.random:
            g = stream(seed, "rule-draws", t)
            u = g.random(N)
            keys = g.random(rg.n_slots)
        W = np.zeros((N, N))
        new_age, new_lag, new_count, new_local = list(age), list(lag), list(count), list(local)
        for i in range(N):
            if not avail[i]:
                W[i, i] = 1.0
                new_age[i] = age[i] + 1
                new_lag[i] = lag[i] + 1
                continue
            cands = [i] + [j for j in nbrs[i]
                           if avail[j] and (live is None or live[edge_index[(i, j)]])]
            w = rule.weights_one(
                ages=[age[c] for c in cands], lags=[lag[c] for c in cands],
                counts=[count[c] for c in cands], local_counts=[local[c] for c in cands],
                q_hat=[1.0] + [q[(i, j)] for j in cands[1:]], t=t,
                u=float(u[i]) if rule.random else 0.5,
                keys=[keys[slot_of[(i, c)]] for c in cands] if rule.random else None)
            for c, wc in zip(cands, w, strict=True):
                W[i, c] = wc
            has_nb = len(cands) > 1
            if age[i] >= 1:
                n_returns += 1
            if has_nb:
                n_agg += 1
                messages += len(cands) - 1
                spread_age += max(age[c] for c in cands) - min(age[c] for c in cands)
                spread_lag += max(lag[c] for c in cands) - min(lag[c] for c in cands)
                kept += sum(1 for wc in w if wc > 0)
                if age[i] >= 1:
                    n_ret_nb += 1
                    self_w += w[0]
                    if age[i] > max(age[c] for c in cands[1:]):
                        n_stalest += 1
            new_age[i] = 0
            new_lag[i] = float(sum(wc * lag[c] for c, wc in zip(cands, w, strict=True)))
            new_count[i] = max(count[c] for c, wc in zip(cands, w, strict=True) if wc > 0) + 1
            new_local[i] = local[i] + 1
            for j in nbrs[i]:
                q[(i, j)] = max((1 - Q_HAT_BETA) * q[(i, j)] + Q_HAT_BETA * (j in cands), Q_HAT_FLOOR)
        age, lag, count, local = new_age, new_lag, new_count, new_local
        mixing.append(W)

    H = []
    with threadpool_limits(limits=1, user_api="blas"):  # as fast as BLAS gets here (see replay)
        for t in range(0, T - horizon + 1 if horizon > 0 else 0):
            P = np.eye(N)
            acc = np.ones(N)
            for s in range(t + 1, t + horizon):
                P = mixing[s] @ P
                acc += np.diag(P)
            H.extend(acc[available[t]].tolist())

    def ratio(a, b):
        return float(a / b) if b else float("nan")

    return {
        "unavailability": float(1.0 - available.mean()),
        "returns": float(n_returns),
        "premise": ratio(n_stalest, n_ret_nb),
        "spread_age": ratio(spread_age, n_agg),
        "spread_lag": ratio(spread_lag, n_agg),
        "kept": ratio(kept, n_agg),
        "self_weight_return": ratio(self_w, n_ret_nb),
        "H": float(np.mean(H)) if H else float("nan"),
        "messages": float(messages),
        "final_mean_lag": float(np.mean(lag)),
    }
