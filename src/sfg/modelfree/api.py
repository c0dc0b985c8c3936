"""Model-free replay (docs/concepts/replay.md#model-free-analyses): ages, lags, counts and every model-free rule's weights on a trace.

No training, no models: given an availability trace, a graph and a rule, replay the staleness
state and the weights with the shared round (:mod:`sfg.round.kernel`), and measure the metrics of
:mod:`sfg.modelfree.metrics` (premise, spreads, kept candidates, self-weights on return, the
self-return H over a horizon, …). The per-client reference loop the tests and benchmarks
compare against lives in ``tests/reference.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from functools import partial
from typing import Any

import numpy as np

from sfg.errors import SfgError, check
from sfg.modelfree.driver import Lane, ReplayResult, run_lane
from sfg.modelfree.horizon import EXACT_PAIRS, default_threads
from sfg.modelfree.horizon import KERNEL as HORIZON_KERNEL
from sfg.round.attacks import Attack, parse_attack
from sfg.round.rules import Rule, check_model_defences, parse_rule
from sfg.world.graphs import Graph, make_graph
from sfg.world.outages import make_process

DEFAULT_N = 100
DEFAULT_T = 300
DEFAULT_GRAPH = "knn:k=6"

# One engine runs every rule: the compiled round. "numpy" (the former vectorised engine) and
# "compiled" are accepted so that existing scripts keep working; they run the same round.
ENGINES = ("auto", "compiled", "numpy")


def _check_engine(engine: str) -> None:
    check(engine in ENGINES, f"unknown replay engine {engine!r}; choose one of {', '.join(ENGINES)}")


def replay_batch(lanes: Sequence[Lane], *, anatomy: str = "full", link_failure: float = 0.0,
                 horizon: int = 50, exact_pairs: int = EXACT_PAIRS, sample_pairs: int = 1000,
                 progress: Callable[[int, int], None] | None = None,
                 engine: str = "auto", threads: int | None = None) -> list[ReplayResult]:
    """Replay several (trace, graph, rule, seed) lanes; every lane gives exactly what it would
    give alone (its random draws, link failures and horizon sample are keyed by its own seed).

    threads: threads (default: all usable cores, at most 8). Several lanes run on parallel
    threads, one each; a single lane splits its self-return H over them when that work is
    large. Results do not depend on it. ``engine``: see :data:`ENGINES`. Lanes share T.
    """
    check(len(lanes) > 0, "nothing to replay")
    T = lanes[0].available.shape[0]
    check(all(ln.available.shape[0] == T for ln in lanes), "lanes must have the same rounds")
    check(0.0 <= link_failure < 1.0, f"link failure probability {link_failure} must lie in [0, 1)")
    for ln in lanes:
        if ln.rule.reads_models:
            raise SfgError(f"rule {ln.rule.name!r} reads model parameters; replay covers "
                           "model-free rules only — run it with `sfg run`")
        if ln.rule.clip:
            raise SfgError(f"rule {str(ln.rule)!r}: +clip reads model parameters (training "
                           "only); drop it from the replay or run it with `sfg run`")
        check_model_defences(ln.rule, "the model-free replay")
        check(ln.available.shape[1] == ln.graph.n,
              f"trace has {ln.available.shape[1]} clients but the graph has {ln.graph.n}")
    _check_engine(engine)
    if 0 < horizon <= T:  # on a cold cache, H's kernel compiles in a helper process while
        HORIZON_KERNEL.ahead()  # this one compiles the round (sfg.round.compiled)
    results: list[ReplayResult | None] = [None] * len(lanes)
    total = len(lanes) * T  # progress counts lane-rounds
    run = partial(run_lane, anatomy=anatomy, link_failure=link_failure, horizon=horizon,
                  exact_pairs=exact_pairs, sample_pairs=sample_pairs)
    n_threads = default_threads() if threads is None else max(1, int(threads))
    if len(lanes) > 1 and n_threads > 1:
        # independent lanes on parallel threads (the round releases the GIL), one thread each
        with ThreadPoolExecutor(max_workers=min(n_threads, len(lanes))) as pool:
            futures = {pool.submit(run, ln, threads=1): k for k, ln in enumerate(lanes)}
            for done, fut in enumerate(as_completed(futures)):
                results[futures[fut]] = fut.result()
                if progress is not None:
                    progress((done + 1) * T, total)
    else:
        for k, ln in enumerate(lanes):
            at = None if progress is None else (lambda t, _T, o=k * T: progress(o + t, total))
            results[k] = run(ln, progress=at, threads=threads)
    return results  # type: ignore[return-value]


def warm_compiled(rules: Sequence[str | Rule] = ("dfedavg",)) -> None:
    """Load the compiled round and ``rules``' functions from numba's on-disk cache (or compile
    them: the round takes a few seconds on its first use on a machine, a rule a fraction of a
    second; later loads well under a second), by replaying a tiny trace."""
    g = Graph(n=3, edges=np.array([[0, 1], [1, 2]]), positions=None, name="path")
    avail = np.array([[1, 0, 1], [1, 1, 1], [0, 1, 1]], bool)
    for r in rules:
        rule = parse_rule(r) if isinstance(r, str) else r
        if not rule.reads_models:
            run_lane(Lane(avail, g, rule, 0), anatomy="full", link_failure=0.0, horizon=1,
                     exact_pairs=EXACT_PAIRS, sample_pairs=1, threads=1)


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
    attack: str | None = None,
) -> ReplayResult:
    """Replay ``rule`` on availability ``available`` (bool[T, N]) over ``graph``
    (``engine``: see :func:`replay_batch`; ``attack``: see :mod:`sfg.round.attacks`)."""
    rule = parse_rule(rule) if isinstance(rule, str) else rule
    return replay_batch([Lane(np.asarray(available, bool), graph, rule, seed,
                              parse_attack(attack))], anatomy=anatomy,
                        link_failure=link_failure, horizon=horizon, exact_pairs=exact_pairs,
                        sample_pairs=sample_pairs, progress=progress, engine=engine,
                        threads=threads)[0]


def build_scenario(process: str, *, n: int, T: int, graph: str, seed: int) -> tuple[Graph, np.ndarray]:
    """The graph and trace of a (process, seed) pair: shared by every rule (docs/concepts/training.md#pairing)."""
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
    attacks: Sequence[str | None] = (None,),
    peers: str | None = None,
    round_seconds: float = 600.0,
) -> list[dict[str, Any]]:
    """Replay processes × rules × seeds; one row per combination (rules share each trace).

    Replays go to :func:`replay_batch` (which describes ``engine`` and ``threads``) in
    batches of up to ``batch_clients`` clients; results do not depend on the batching.
    ``with_curves`` adds each replay's per-round mean age and lag under the key ``"curves"``.
    ``attacks``: attack strings (:mod:`sfg.round.attacks`; None = no attack), one more axis; rows
    carry ``"attack"`` when an attack is given. ``peers`` (docs/concepts/peers.md): whom
    each send goes to (``fixed``: the graph; ``epidemic:s=S``, ``online:s=S,…``: drawn per
    round, :mod:`sfg.modelfree.peers`; ``round_seconds`` Δ dates what the tables hear and
    gives the rows' per-device-hour counts)."""
    from sfg.modelfree.peers import check_rule, sampled_deliveries
    from sfg.world.peers import parse_peers

    check(len(processes) > 0, "give at least one --process, e.g. --process bursty:u=0.8")
    check(len(rules) > 0, "give at least one --rule, e.g. --rule sfg-cut")
    check(len(seeds) > 0, "give at least one seed, e.g. --seeds 1,2,3")
    parsed = [parse_rule(r) for r in rules]  # validate every name before any work
    sampler = parse_peers(peers).check(n)
    for r in parsed:
        check_rule(r, sampler)
    attacks = list(attacks) or [None]
    parsed_attacks = [parse_attack(a) for a in attacks]
    tag_attack = any(a is not None for a in parsed_attacks)
    if tag_attack:  # "none" next to attacks: frac=0 (the same replay, with the damage measures)
        parsed_attacks = [Attack(frac=0.0, text="none") if a is None else a
                          for a in parsed_attacks]
    _check_engine(engine)
    if 0 < horizon <= T:  # on a cold cache: H's kernel compiles in a helper (sfg.round.compiled)
        HORIZON_KERNEL.ahead()  # from now on, while the scenarios are built and the round compiles
    for p in processes:
        make_process(p)
    lanes: list[tuple[dict, Lane]] = []
    for p in processes:
        for seed in seeds:
            g, avail = build_scenario(p, n=n, T=T, graph=graph, seed=seed)
            live: np.ndarray | None = None
            counts: dict[str, float] = {}
            if not sampler.fixed:  # the seed's sends, the same for every rule
                g, live, counts = sampled_deliveries(sampler, seed, avail, g, round_seconds)
            for r in parsed:
                for a in parsed_attacks:
                    key = {"process": p, "rule": str(r), "seed": seed,
                           **({"attack": str(a) if a else "none"} if tag_attack else {})}
                    lanes.append(({**key, "_counts": counts}, Lane(avail, g, r, seed, a,
                                                                  live=live)))
    rows: list[dict[str, Any]] = []
    done = 0
    for batch in _batches([ln for _, ln in lanes], max_clients=batch_clients):
        results = replay_batch([lanes[k][1] for k in batch], anatomy=anatomy,
                               link_failure=link_failure, horizon=horizon, engine=engine,
                               threads=threads)
        for k, res in zip(batch, results, strict=True):
            key = {f: v for f, v in lanes[k][0].items() if f != "_counts"}
            rows.append({**key, **res.metrics, **lanes[k][0]["_counts"],
                         **({"curves": res.curves} if with_curves else {})})
        done += len(batch)
        if progress is not None:
            progress(done, len(lanes))
    return rows


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
    if cfg.get("peers", "fixed") != "fixed":  # peers chosen per exchange: the sampled sends
        rows = replay([cfg.get("process", "none")], [cfg.get("rule", "dfedavg")], [seed], n=n,
                      T=T, graph=cfg.get("graph", DEFAULT_GRAPH), anatomy=cfg.get("anatomy", "full"),
                      link_failure=float(cfg.get("link_failure", 0.0)),
                      horizon=int(cfg.get("horizon", 50)), with_curves=True, threads=1,
                      attacks=[cfg.get("attack")], peers=cfg["peers"],
                      round_seconds=float(cfg.get("round_seconds", 600.0)))
        curves = rows[0].pop("curves")
        if progress is not None:
            progress(1, 1)
        return {"metrics": {k: v for k, v in rows[0].items()
                            if k not in ("process", "rule", "seed", "attack")}, "curves": curves}
    g, avail = build_scenario(cfg.get("process", "none"), n=n, T=T,
                              graph=cfg.get("graph", DEFAULT_GRAPH), seed=seed)
    res = replay_trace(avail, g, cfg.get("rule", "dfedavg"), seed=seed,
                       anatomy=cfg.get("anatomy", "full"),
                       link_failure=float(cfg.get("link_failure", 0.0)),
                       horizon=int(cfg.get("horizon", 50)), progress=progress,
                       threads=1, attack=cfg.get("attack"))  # the grid already runs one replay per core
    return {"metrics": res.metrics, "curves": res.curves}
