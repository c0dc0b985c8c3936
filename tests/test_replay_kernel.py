"""The compiled replay engine (:mod:`sfg.replay_kernel`) against the numpy engine (SPEC §9).

The numpy engine runs the simulator's own round code (:mod:`sfg.engine`) with the rule library
(:mod:`sfg.rules.library`), which stays the definition of every rule. The kernel writes each
model-free rule a second time, so it is checked here

* weight by weight, round by round, against a plain numpy round loop written in this file,
  for every rule it implements, the modifiers, every anatomy mode and link failures;
* metric by metric (H and the per-round curves included) against ``engine="numpy"``, on the
  exact and the sampled self-return paths, at the horizon's edge cases and at large N;
* for coverage (``engine="auto"`` never leaves a model-free rule on the slow path), the engine
  errors, determinism and stacking invariance, and progress reporting.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sfg import replay_kernel
from sfg.engine import advance, caps_at, round_weights
from sfg.errors import SfgError
from sfg.graphs import make_graph
from sfg.outages import make_process
from sfg.outages.anatomy import ANATOMY_MODES, capabilities
from sfg.outages.links import link_failures
from sfg.replay import Lane, _replay_compiled, build_scenario, replay, replay_trace
from sfg.rounds import RoundGraph
from sfg.rules import RULES, parse_rule, rule_names
from sfg.staleness import init_state

N, T, SEED, HORIZON = 14, 60, 3, 10

# every rule the kernel implements, with its registry defaults
KERNEL_RULES = sorted(replay_kernel.RULE_IDS)
# parameters and modifiers that take other branches of the kernel
VARIANTS = ["sfg-l:gamma=0.3+ipw", "sfg-l:gamma=0+rounded", "sfg-cut:L=0+rounded", "aoi+ipw",
            "dfedavg:c=0.3", "self-weight", "sfg:gamma=0", "limited-merging:L=0",
            "placebo-cut:L=2", "copy-random", "update-amplification:c=2"]
# (process, link-failure probability): independent outages on reliable links, and long
# outages on lossy links (q̂ moves, so +ipw and dfl-aa matter)
SCENARIOS = [("iid:u=0.5", 0.0), ("bursty:u=0.6", 0.3)]
FEW_RULES = ["sfg", "sfg-cut", "limited-merging", "dfedavg"]
ALL_RULES = list(dict.fromkeys(KERNEL_RULES + VARIANTS))  # registry defaults, then variants


# ----------------------------------------------------------------------------- helpers
def _scenario(process: str, *, n: int = N, rounds: int = T, seed: int = SEED):
    g = make_graph("knn:k=3", n, seed=seed)
    avail = make_process(process).sample(rounds, n, seed=seed, positions=g.positions)
    return g, np.asarray(avail, bool)


def _numpy_weights(avail, g, rule, *, seed, anatomy, link_failure) -> np.ndarray:
    """[T, E] slot weights of a plain round loop over the simulator's round code."""
    rule = parse_rule(rule)
    rounds = avail.shape[0]
    rg = RoundGraph.from_graph(g)
    caps_all = capabilities(avail, anatomy)
    live_all = (link_failures(g.edges, rounds, p=link_failure, seed=seed) if link_failure > 0
                else None)
    state = init_state(rg)
    out = np.empty((rounds, rg.n_slots))
    for t in range(rounds):
        caps = caps_at(caps_all, t)
        rw = round_weights(rule, rg, state, caps, seed=seed,
                           live=None if live_all is None else live_all[t])
        out[t] = rw.weights
        state = advance(state, rg, rw, caps)
    return out


def _compiled_weights(avail, g, rule, *, seed, anatomy, link_failure) -> np.ndarray:
    """[T, E] slot weights of the compiled kernel (through ``weights_out``)."""
    w = np.full((avail.shape[0], RoundGraph.from_graph(g).n_slots), np.nan)
    _replay_compiled(Lane(avail, g, parse_rule(rule), seed), anatomy=anatomy,
                     link_failure=link_failure, horizon=HORIZON, exact_pairs=20_000,
                     sample_pairs=1000, progress=None, weights_out=w)
    return w


def _assert_weights_agree(avail, g, rule, *, anatomy="full", link_failure=0.0) -> None:
    ref = _numpy_weights(avail, g, rule, seed=SEED, anatomy=anatomy, link_failure=link_failure)
    got = _compiled_weights(avail, g, rule, seed=SEED, anatomy=anatomy,
                            link_failure=link_failure)
    assert np.isfinite(got).all(), "the kernel left rounds of weights_out unwritten"
    err = np.abs(got - ref)
    if err.max() > 1e-12:
        t, e = np.unravel_index(int(err.argmax()), err.shape)
        raise AssertionError(f"{rule} ({anatomy}, links {link_failure}): first mismatch in "
                             f"round {np.argmax(err.max(axis=1) > 1e-12)}; largest at round {t} "
                             f"slot {e}: compiled {got[t, e]!r} vs numpy {ref[t, e]!r}")
    # the weights are row-stochastic and non-trivial: the check has something to compare
    rg = RoundGraph.from_graph(g)
    assert np.allclose(np.add.reduceat(got, rg.indptr[:-1], axis=1), 1.0)
    assert (got[:, ~rg.is_self] > 0).any() or parse_rule(rule).name == "local"


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _assert_metrics_close(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for key, r in ref.items():
        if math.isnan(r):
            assert math.isnan(got[key]), f"{key}: compiled {got[key]} vs numpy nan"
        else:
            assert got[key] == pytest.approx(r, rel=1e-9, abs=1e-9), key


def _assert_results_close(got, ref) -> None:
    _assert_metrics_close(got.metrics, ref.metrics)
    assert got.curves["round"] == ref.curves["round"]
    for key in ("mean_age", "mean_lag"):
        assert got.curves[key] == pytest.approx(ref.curves[key], rel=1e-9, abs=1e-9), key


def _both(avail, g, rule, **kw):
    """(compiled, numpy) results of one replay."""
    return (replay_trace(avail, g, rule, seed=SEED, engine="compiled", **kw),
            replay_trace(avail, g, rule, seed=SEED, engine="numpy", **kw))


def _assert_identical(a, b) -> None:
    """Bit-identical metrics and curves (NaN equals NaN)."""
    assert set(a.metrics) == set(b.metrics)
    for key in a.metrics:
        assert _same(a.metrics[key], b.metrics[key]), (key, a.metrics[key], b.metrics[key])
    assert a.curves == b.curves


# ----------------------------------------------------------------------------- 1. weights
@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("process, link", SCENARIOS)
def test_kernel_weights_equal_numpy_round_loop(rule, process, link):
    g, avail = _scenario(process)
    _assert_weights_agree(avail, g, rule, link_failure=link)


@pytest.mark.parametrize("rule", FEW_RULES)
@pytest.mark.parametrize("anatomy", ANATOMY_MODES)
@pytest.mark.parametrize("link", [0.0, 0.3])
def test_kernel_weights_equal_numpy_in_every_anatomy_mode(rule, anatomy, link):
    g, avail = _scenario("bursty:u=0.6")
    _assert_weights_agree(avail, g, rule, anatomy=anatomy, link_failure=link)


def test_weight_check_can_fail():
    """The comparison is sharp: a different rule's weights on the same trace do not pass."""
    g, avail = _scenario("bursty:u=0.6")
    ref = _numpy_weights(avail, g, "sfg", seed=SEED, anatomy="full", link_failure=0.0)
    other = _compiled_weights(avail, g, "sfg-l", seed=SEED, anatomy="full", link_failure=0.0)
    assert np.abs(other - ref).max() > 1e-3


# ----------------------------------------------------------------------------- 2. metrics
@pytest.mark.parametrize("rule", ALL_RULES)
def test_kernel_metrics_equal_numpy_engine(rule):
    g, avail = _scenario("bursty:u=0.6")
    got, ref = _both(avail, g, rule, link_failure=0.3, horizon=HORIZON)
    assert ref.metrics["H_pairs"] > 0 and not math.isnan(ref.metrics["H"])
    _assert_results_close(got, ref)


@pytest.mark.parametrize("rule", FEW_RULES + ["placebo-cut", "aoi+ipw"])
@pytest.mark.parametrize("anatomy", ANATOMY_MODES)
def test_kernel_metrics_equal_numpy_in_every_anatomy_mode(rule, anatomy):
    g, avail = _scenario("iid:u=0.5")
    got, ref = _both(avail, g, rule, anatomy=anatomy, link_failure=0.4, horizon=HORIZON)
    _assert_results_close(got, ref)


# ----------------------------------------------------------------------------- 3. sampled H
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg", "copy-random"])
def test_sampled_horizon_equals_numpy_engine(rule):
    g, avail = _scenario("bursty:u=0.5", n=40, rounds=80)
    kw = dict(horizon=10, exact_pairs=50, sample_pairs=30)
    got, ref = _both(avail, g, rule, **kw)
    assert ref.metrics["H_pairs"] == 30 and ref.metrics["H_se"] > 0  # sampling did happen
    for key in ("H", "H_se", "H_pairs"):
        assert got.metrics[key] == pytest.approx(ref.metrics[key], rel=1e-9, abs=1e-12), key
    _assert_results_close(got, ref)


# ----------------------------------------------------------------------------- 4. coverage
def test_kernel_has_every_model_free_rule():
    assert replay_kernel.HAVE_NUMBA, "numba is a declared dependency: the compiled engine must run"
    model_free = set()
    for name in rule_names():
        rule = parse_rule(name)
        if rule.reads_models or rule.oracle:
            continue
        model_free.add(rule.name)
        assert replay_kernel.supports(rule), f"{name!r} would silently run on the numpy engine"
    assert model_free == set(replay_kernel.RULE_IDS)
    assert set(RULES.names()) >= set(replay_kernel.RULE_IDS)


def test_auto_engine_runs_supported_rules_compiled():
    g, avail = _scenario("bursty:u=0.6")
    for rule in ("sfg-cut", "placebo-cut", "aoi+ipw"):
        auto = replay_trace(avail, g, rule, seed=SEED, link_failure=0.3, horizon=HORIZON)
        comp = replay_trace(avail, g, rule, seed=SEED, link_failure=0.3, horizon=HORIZON,
                            engine="compiled")
        _assert_identical(auto, comp)


@pytest.mark.parametrize("rule", ["oracle-gls", "oracle-qp"])
def test_oracles_fall_back_to_numpy_but_refuse_compiled(rule):
    g, avail = _scenario("bursty:u=0.6", rounds=30)
    assert not replay_kernel.supports(parse_rule(rule))
    auto = replay_trace(avail, g, rule, seed=SEED, horizon=5)
    slow = replay_trace(avail, g, rule, seed=SEED, horizon=5, engine="numpy")
    _assert_identical(auto, slow)
    assert not math.isnan(auto.metrics["H"])
    with pytest.raises(SfgError) as e:
        replay_trace(avail, g, rule, seed=SEED, horizon=5, engine="compiled")
    msg = str(e.value)
    assert rule in msg and "numpy" in msg and "\n" not in msg


def test_unknown_engine_names_the_choices():
    g, avail = _scenario("iid:u=0.5", rounds=10)
    with pytest.raises(SfgError) as e:
        replay_trace(avail, g, "sfg", seed=SEED, engine="fast")
    msg = str(e.value)
    assert "'fast'" in msg and all(c in msg for c in ("auto", "compiled", "numpy"))
    with pytest.raises(SfgError, match=r"unknown replay engine 'numba'; choose one of auto, compiled"):
        replay(["iid:u=0.5"], ["sfg"], [1], n=14, T=10, engine="numba")


# ----------------------------------------------------------------------------- 5. determinism
@pytest.mark.parametrize("rule", ["sfg-cut", "placebo-cut", "copy-random"])
def test_compiled_runs_are_bit_identical(rule):
    g, avail = _scenario("bursty:u=0.6")
    kw = dict(seed=SEED, link_failure=0.3, horizon=HORIZON, engine="compiled")
    _assert_identical(replay_trace(avail, g, rule, **kw), replay_trace(avail, g, rule, **kw))


def test_compiled_lane_is_the_same_alone_and_in_a_grid():
    procs, rules, seeds = ["iid:u=0.5", "bursty:u=0.7"], ["sfg-cut", "placebo-cut", "dfedavg"], [1, 2]
    n, rounds, graph, h = 25, 50, "knn:k=4", 8
    rows = replay(procs, rules, seeds, n=n, T=rounds, graph=graph, horizon=h, link_failure=0.3,
                  with_curves=True, engine="compiled", batch_clients=60)
    assert len(rows) == len(procs) * len(rules) * len(seeds)
    for row in rows:
        g, avail = build_scenario(row["process"], n=n, T=rounds, graph=graph, seed=row["seed"])
        alone = replay_trace(avail, g, row["rule"], seed=row["seed"], horizon=h,
                             link_failure=0.3, engine="compiled")
        for key, value in alone.metrics.items():
            assert _same(row[key], value), (row["process"], row["rule"], row["seed"], key)
        assert row["curves"] == alone.curves
    # the placebo's own draws depend on the seed: the two seeds' lanes are not copies
    by = {(r["process"], r["rule"], r["seed"]): r for r in rows}
    assert by[("iid:u=0.5", "placebo-cut", 1)]["curves"] != by[("iid:u=0.5", "placebo-cut", 2)]["curves"]


# ----------------------------------------------------------------------------- 6. horizon edges
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg", "placebo-cut"])
def test_horizon_edge_cases_equal_numpy_engine(rule):
    g, avail = _scenario("bursty:u=0.6", rounds=30)
    for h in (1, 0, 30, 31, 100):
        got, ref = _both(avail, g, rule, horizon=h, link_failure=0.3)
        _assert_results_close(got, ref)
        if h == 1:
            assert got.metrics["H"] == 1.0  # the empty product only
            assert got.metrics["H_pairs"] == avail.sum()
        elif h == 30:  # one start round (t = 0)
            assert got.metrics["H_pairs"] == avail[0].sum() and got.metrics["H"] >= 1.0
        else:  # h = 0 or h > T: no pair has a full horizon
            assert math.isnan(got.metrics["H"]) and got.metrics["H_pairs"] == 0


# ----------------------------------------------------------------------------- 7. progress
def test_progress_reaches_total():
    g, avail = _scenario("iid:u=0.5")
    calls: list[tuple[int, int]] = []
    replay_trace(avail, g, "sfg-cut", seed=SEED, horizon=HORIZON, engine="compiled",
                 progress=lambda done, total: calls.append((done, total)))
    assert calls, "the progress callback was never called"
    assert calls[-1] == (T, T)
    done = [c[0] for c in calls]
    assert done == sorted(done) and all(c[1] == T for c in calls)


# ----------------------------------------------------------------------------- 8. large N
def test_large_n_compiled_equals_numpy_engine():
    g, avail = build_scenario("bursty:u=0.6", n=2000, T=40, graph="knn:k=6", seed=1)
    kw = dict(seed=1, horizon=10)
    got = replay_trace(avail, g, "sfg-cut", engine="compiled", **kw)
    ref = replay_trace(avail, g, "sfg-cut", engine="numpy", **kw)
    assert ref.metrics["H_pairs"] == 1000  # > EXACT_PAIRS candidates: the sampled path
    _assert_results_close(got, ref)


@pytest.mark.parametrize("rule", ["sfg-cut", "placebo-cut"])
def test_self_return_threads_do_not_change_results(rule):
    """The self-return's pairs are split by start round over threads; any split gives the
    same bits (each pair's arithmetic is independent of the others)."""
    g = make_graph("knn:k=4", 60, seed=5)
    avail = make_process("iid:u=0.5").sample(90, 60, seed=5, positions=g.positions)
    runs = [replay_trace(avail, g, rule, seed=5, horizon=20, engine="compiled", threads=k)
            for k in (1, 2, 3, 7)]
    assert runs[0].metrics["H_pairs"] > 1000
    for other in runs[1:]:
        assert other.metrics == runs[0].metrics
        assert other.curves == runs[0].curves


def test_warm_compiled_loads_the_kernels():
    from sfg.replay import warm_compiled

    warm_compiled()
    assert replay_kernel.run_rounds.signatures
    assert replay_kernel.horizon_rounds.signatures


def test_lanes_on_parallel_threads_give_the_same_rows():
    """replay() runs a batch's lanes on parallel threads; the rows, and their order, are
    those of a one-thread run."""
    kw = dict(n=30, T=60, horizon=10, with_curves=True)
    one = replay(["iid:u=0.5", "bursty:u=0.7"], ["sfg-cut", "placebo-cut", "dfedavg"], [1, 2],
                 threads=1, **kw)
    many = replay(["iid:u=0.5", "bursty:u=0.7"], ["sfg-cut", "placebo-cut", "dfedavg"], [1, 2],
                  threads=3, **kw)
    assert len(one) == 12
    assert many == one
