"""A straightforward per-client Python loop of the replay: the test oracle for :mod:`sfg.round.kernel`.

Deliberately simple and independent of the library's round: dicts and lists, one receiver at
a time, every rule's score written again from docs/concepts/rules.md#scores-and-weights in plain Python (:data:`SCORES`), the
modifiers, the normalisation (docs/concepts/round.md#one-round) and the staleness update (docs/concepts/staleness.md#the-staleness-state) spelled out, dense
products for the self-return H. It shares only the inputs with the library: the anatomy
mode's capabilities, link failures and the rules' random draws (same streams). The tests
compare it with the compiled round weight by weight; ``benchmarks/bench_replay.py`` times both.
Oracles (docs/concepts/rules.md#oracles) are not here (they are checked against hand cases and a QP solver).
"""

from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from sfg.round.rules import Rule, parse_rule
from sfg.round.slots import RoundGraph
from sfg.util.rng import stream
from sfg.world.graphs import Graph
from sfg.world.outages.anatomy import capabilities
from sfg.world.outages.links import link_failures

TOL = 1e-9  # relative staleness within TOL counts as a tie (real lags are sums of products)
BETA, FLOOR = 0.1, 0.05


def _rel(values: list[float], lo: float) -> list[float]:
    out = []
    for v in values:
        r = v - lo
        out.append(r if r > TOL else 0.0)
    return out


def _cut(C, t, L):
    lmin = min(c["lag"] for c in C)
    return [max(1.0 + t - c["lag"], 0.0) if c["lag"] - lmin <= L + TOL else 0.0 for c in C]


def _by_key(C, m):
    """1 on the m candidates with the smallest keys (ties: the earlier candidate)."""
    order = sorted(range(len(C)), key=lambda d: (C[d]["key"], d))
    return [1.0 if d in order[:m] else 0.0 for d in range(len(C))]


def _nb_discount(g, values):
    if len(values) == 1:
        return [1.0]
    lo = min(values[1:])
    return [1.0] + [g ** r for r in _rel(values[1:], lo)]


# name -> scores(C, t, u, p) over the candidates C (index 0 = the receiver)
SCORES = {
    "sfg": lambda C, t, u, p: [p["gamma"] ** (c["age"] - min(x["age"] for x in C)) for c in C],
    "sfg-l": lambda C, t, u, p: [p["gamma"] ** r for r in
                                 _rel([c["lag"] for c in C], min(c["lag"] for c in C))],
    "sfg-cut": lambda C, t, u, p: _cut(C, t, p["L"]),
    "sfg-counts": lambda C, t, u, p: [p["gamma"] ** (max(x["count"] for x in C) - c["count"])
                                      for c in C],
    "dfedavg": lambda C, t, u, p: [1.0] * len(C),
    "local": lambda C, t, u, p: [1.0] + [0.0] * (len(C) - 1),
    "aoi": lambda C, t, u, p: [1.0] + [p["gamma"] ** c["age"] for c in C[1:]],
    "dfl-aa": lambda C, t, u, p: [h / c["q"] for h, c in
                                  zip(_nb_discount(p["gamma"], [c["age"] for c in C]), C, strict=True)],
    "gl-age": lambda C, t, u, p: [float(c["count"]) for c in C],
    "limited-merging": lambda C, t, u, p: [
        float(c["count"]) if c["count"] >= max(x["count"] for x in C) - p["L"] else 0.0 for c in C],
    "local-counts": lambda C, t, u, p: [
        float(c["local"]) if c["local"] >= max(x["local"] for x in C) - p["L"] else 0.0 for c in C],
    "update-amplification": lambda C, t, u, p: [1.0] * len(C),
    "self-weight": lambda C, t, u, p: [p["c"]] + [1.0] * (len(C) - 1),
    "self-only": lambda C, t, u, p: [
        p["base"] ** C[0]["age"] if (C[0]["age"] >= 1 and len(C) > 1) else 1.0] + [1.0] * (len(C) - 1),
    "reset-on-return": lambda C, t, u, p: [
        0.0 if (C[0]["age"] >= 1 and len(C) > 1) else 1.0] + [1.0] * (len(C) - 1),
    "neighbour-only-lags": lambda C, t, u, p: _nb_discount(p["gamma"], [c["lag"] for c in C]),
    "neighbour-only-counts": lambda C, t, u, p: [1.0] + [
        p["gamma"] ** (max(x["count"] for x in C[1:]) - c["count"]) for c in C[1:]],
    "pinned-receiver": lambda C, t, u, p: [1.0] + [p["gamma"] ** r for r in _rel(
        [c["lag"] for c in C], min(c["lag"] for c in C))][1:],
    "copy-random": lambda C, t, u, p: [1.0 if d == min(math.floor(u * len(C)), len(C) - 1) else 0.0
                                       for d in range(len(C))],
    "placebo-cut": lambda C, t, u, p: _by_key(C, sum(1 for h in _cut(C, t, p["L"]) if h > 0)),
    "cut-ages": lambda C, t, u, p: [1.0 if c["age"] - min(x["age"] for x in C) <= 1 else 0.0
                                    for c in C],
    "receiver-kept": lambda C, t, u, p: [max(1.0 + t - C[0]["lag"], 0.0)] + _cut(C, t, p["L"])[1:],
    "two-random": lambda C, t, u, p: _by_key(C, 2),
    "metropolis-hastings": lambda C, t, u, p: (lambda nb: [1.0 - sum(nb)] + nb)(
        [1.0 / (1.0 + max(C[0]["deg"], c["deg"])) for c in C[1:]]),
}
OWN_C = {"self-weight", "update-amplification"}  # rules whose parameter c is not the self-weight


def reference_weights(rule: Rule, C: list[dict], t: int, u: float) -> list[float]:
    """One receiver's weights: scores, modifiers, normalisation (docs/concepts/round.md#one-round, docs/concepts/rules.md#scores-and-weights)."""
    if "rounded" in rule.modifiers:
        C = [{**c, "lag": float(round(c["lag"]))} for c in C]
    h = list(SCORES[rule.name](C, t, u, rule.params))
    if "ipw" in rule.modifiers:
        h = [h[0]] + [v / c["q"] for v, c in zip(h[1:], C[1:], strict=True)]
    if rule.name not in OWN_C:
        h[0] = h[0] * rule.params.get("c", 1.0)
    h = [v if (math.isfinite(v) and v > 0) else 0.0 for v in h]
    total = sum(h)
    if total > 0:
        return [v / total for v in h]
    return [1.0] + [0.0] * (len(C) - 1)


def replay_reference(available: np.ndarray, graph: Graph, rule: Rule | str, *, seed: int,
                     anatomy: str = "full", link_failure: float = 0.0, horizon: int = 50,
                     weights_out: list | None = None) -> dict[str, float]:
    """Metrics of docs/concepts/replay.md#model-free-analyses by a per-client loop; ``weights_out`` gets each round's dense W."""
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    available = np.asarray(available, bool)
    T, N = available.shape
    caps = capabilities(available, anatomy)
    nbrs: list[list[int]] = [[] for _ in range(N)]
    edge_index: dict[tuple[int, int], int] = {}
    for e, (a, b) in enumerate(graph.edges.tolist()):
        nbrs[a].append(b)
        nbrs[b].append(a)
        edge_index[(a, b)] = edge_index[(b, a)] = e
    for lst in nbrs:
        lst.sort()
    live_all = link_failures(graph.edges, T, p=link_failure, seed=seed) if link_failure > 0 else None
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
        train, send, aggregate, adopt = (caps.train[t], caps.send[t], caps.aggregate[t],
                                         caps.adopt[t])

        def link(i, j, t=t):
            return live_all is None or bool(live_all[t, edge_index[(i, j)]])

        u = keys = None
        if rule.random:
            g = stream(seed, "rule-draws", t)
            u = g.random(N)
            keys = g.random(rg.n_slots)
        deg = [sum(1 for m in nbrs[j] if send[m] and link(j, m)) for j in range(N)]
        W = np.eye(N)
        new_age, new_lag, new_count = list(age), list(lag), list(count)
        for i in range(N):
            tr = bool(train[i])
            new_age[i] = 0 if tr else age[i] + 1
            new_lag[i] = lag[i] + (0.0 if tr else 1.0)
            new_count[i] = count[i] + (1 if tr else 0)
            if not aggregate[i]:
                continue
            cands = [i] + [j for j in nbrs[i] if send[j] and link(i, j)]
            C = [{"age": age[j], "lag": lag[j], "count": count[j], "local": local[j],
                  "q": 1.0 if j == i else q[(i, j)], "deg": deg[j],
                  "key": keys[slot_of[(i, j)]] if keys is not None else 0.0} for j in cands]
            w = reference_weights(rule, C, t, float(u[i]) if u is not None else 0.5)
            if not adopt[i]:
                w = [1.0] + [0.0] * (len(cands) - 1)
            W[i, i] = 0.0
            for j, wj in zip(cands, w, strict=True):
                W[i, j] = wj
            has_nb = len(cands) > 1
            messages += len(cands) - 1
            if adopt[i]:
                if age[i] >= 1:
                    n_returns += 1
                if has_nb:
                    n_agg += 1
                    spread_age += max(age[j] for j in cands) - min(age[j] for j in cands)
                    spread_lag += max(lag[j] for j in cands) - min(lag[j] for j in cands)
                    kept += sum(1 for wj in w if wj > 0)
                    if age[i] >= 1:
                        n_ret_nb += 1
                        self_w += w[0]
                        if age[i] > max(age[j] for j in cands[1:]):
                            n_stalest += 1
                merged = [j for j, wj in zip(cands, w, strict=True) if wj > 0]
                new_lag[i] = sum(wj * lag[j] for j, wj in zip(cands, w, strict=True)) \
                    + (0.0 if tr else 1.0)
                new_age[i] = 0 if tr else min(age[j] for j in merged) + 1
                new_count[i] = max(count[j] for j in merged) + (1 if tr else 0)
            for j in nbrs[i]:
                q[(i, j)] = max((1 - BETA) * q[(i, j)] + BETA * (j in cands), FLOOR)
        local = [local[i] + (1 if train[i] else 0) for i in range(N)]
        age, lag, count = new_age, new_lag, new_count
        mixing.append(W)
        if weights_out is not None:
            weights_out.append(W)

    H = []
    starts = range(0, T - horizon + 1) if horizon > 0 else range(0)
    with threadpool_limits(limits=1, user_api="blas"):  # small products: one BLAS thread is fastest
        for t in starts:
            P = np.eye(N)
            acc = np.ones(N)
            for s in range(t + 1, t + horizon):
                P = mixing[s] @ P
                acc += np.diag(P)
            H.extend(acc[caps.adopt[t]].tolist())

    def ratio(a, b):
        return float(a / b) if b else float("nan")

    return {
        "unavailability": float(1.0 - available.mean()),
        "returning_aggregations": float(n_returns),
        "premise": ratio(n_stalest, n_ret_nb),
        "spread_age": ratio(spread_age, n_agg),
        "spread_lag": ratio(spread_lag, n_agg),
        "kept": ratio(kept, n_agg),
        "self_weight_return": ratio(self_w, n_ret_nb),
        "H": float(np.mean(H)) if H else float("nan"),
        "messages": float(messages),
        "final_mean_lag": float(np.mean(lag)),
    }
