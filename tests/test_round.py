"""The compiled round (:mod:`sfg.round.kernel`) against the per-client reference loop (tests/reference.py).

* weight by weight, round by round, and metric by metric: every model-free rule of the registry
  (picked up automatically), the modifiers, every anatomy mode and link failures;
* the reference can fail: a misread rule is caught;
* determinism, lanes alone or in a grid, threads, the self-return's edge cases and sampled form,
  progress, and the per-rule kernel cache.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from reference import SCORES, replay_reference

from sfg.errors import SfgError
from sfg.modelfree import Lane, build_scenario, replay, replay_trace
from sfg.modelfree.driver import run_lane
from sfg.round.rules import parse_rule, rule_names
from sfg.round.slots import RoundGraph
from sfg.world.graphs import make_graph
from sfg.world.outages import make_process
from sfg.world.outages.anatomy import ANATOMY_MODES

COMPILED = [r for r in rule_names() if parse_rule(r).compiled]
VARIANTS = COMPILED + ["sfg-l:gamma=0.3+ipw", "aoi+ipw", "sfg:gamma=0", "sfg-l:gamma=0+rounded",
                       "sfg-cut:L=2+rounded", "sfg:c=0.5", "limited-merging:L=0", "dfedavg:c=0.2",
                       "self-weight:c=0.2", "self-only:base=0.25", "two-random+ipw",
                       "metropolis-hastings:c=0.5", "placebo-cut:L=0", "receiver-kept:L=0+ipw"]
SCENARIOS = [(a, 0.0) for a in ANATOMY_MODES] + [("full", 0.3), ("cannot-train-adopts", 0.3)]
N, T, HORIZON, SEED = 12, 30, 6, 3


def _scenario(process: str = "bursty:u=0.6", n: int = N, rounds: int = T):
    g = make_graph("knn:k=3", n, seed=SEED)
    return g, make_process(process).sample(rounds, n, seed=SEED, positions=g.positions)


def _close(a: float, b: float) -> bool:
    if math.isnan(b):
        return math.isnan(a)
    return a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_reference_has_every_compiled_rule():
    assert set(COMPILED) <= set(SCORES), set(COMPILED) - set(SCORES)


@pytest.mark.parametrize("anatomy, link", SCENARIOS)
@pytest.mark.parametrize("rule", VARIANTS)
def test_round_equals_reference_weight_by_weight(rule, anatomy, link):
    g, avail = _scenario("iid:u=0.5" if link else "bursty:u=0.6")
    r = parse_rule(rule)
    rg = RoundGraph.from_graph(g)
    w = np.zeros((T, rg.n_slots))
    got = run_lane(Lane(avail, g, r, SEED), anatomy=anatomy, link_failure=link, horizon=HORIZON,
                   exact_pairs=10**6, sample_pairs=1, weights_out=w)
    dense: list[np.ndarray] = []
    ref = replay_reference(avail, g, r, seed=SEED, anatomy=anatomy, link_failure=link,
                           horizon=HORIZON, weights_out=dense)
    for t in range(T):
        np.testing.assert_allclose(rg.to_dense(w[t]), dense[t], rtol=1e-12, atol=1e-12,
                                   err_msg=f"{rule} {anatomy} link={link} round {t}")
    for key, value in ref.items():
        assert _close(got.metrics[key], value), (key, got.metrics[key], value)


def _with(rule: str, modifier: str) -> str:
    if modifier == "c":
        return f"{rule}:c=0.5"
    return f"{rule}+{modifier}"


@pytest.mark.parametrize("modifier", ["ipw", "rounded", "c"])
@pytest.mark.parametrize("rule", COMPILED)
def test_every_rule_with_every_modifier_equals_reference(rule, modifier):
    """Each modifier composes with each rule (the round applies it, the reference separately)."""
    if modifier == "c" and parse_rule(rule).entry.own_c:
        rule, modifier = f"{rule}:c=0.3", "ipw"  # its own c, with +ipw on top
    test_round_equals_reference_weight_by_weight(_with(rule, modifier), "full", 0.3)


def test_reference_comparison_can_fail(monkeypatch):
    """A misread rule (dfl-aa's minimum over all candidates instead of live neighbours) is
    caught by the weight-by-weight comparison."""
    import reference

    def misread(C, t, u, p):
        lo = min(c["age"] for c in C)
        return [1.0] + [p["gamma"] ** (c["age"] - lo) / c["q"] for c in C[1:]]

    monkeypatch.setitem(reference.SCORES, "dfl-aa", misread)
    with pytest.raises(AssertionError):
        test_round_equals_reference_weight_by_weight("dfl-aa", "full", 0.0)


# ----------------------------------------------------------------------------- determinism
def _same(a, b) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("rule", ["sfg-cut", "placebo-cut", "copy-random", "two-random"])
def test_runs_are_bit_identical(rule):
    g, avail = _scenario()
    kw = dict(seed=SEED, link_failure=0.3, horizon=HORIZON)
    a, b = replay_trace(avail, g, rule, **kw), replay_trace(avail, g, rule, **kw)
    assert all(_same(a.metrics[k], b.metrics[k]) for k in a.metrics) and a.curves == b.curves


def test_lane_is_the_same_alone_and_in_a_grid():
    procs, rules, seeds = ["iid:u=0.5", "bursty:u=0.7"], ["sfg-cut", "placebo-cut", "dfedavg"], [1, 2]
    n, rounds, graph, h = 25, 50, "knn:k=4", 8
    rows = replay(procs, rules, seeds, n=n, T=rounds, graph=graph, horizon=h, link_failure=0.3,
                  with_curves=True, batch_clients=60)
    assert len(rows) == len(procs) * len(rules) * len(seeds)
    for row in rows:
        g, avail = build_scenario(row["process"], n=n, T=rounds, graph=graph, seed=row["seed"])
        alone = replay_trace(avail, g, row["rule"], seed=row["seed"], horizon=h, link_failure=0.3)
        for key, value in alone.metrics.items():
            assert _same(row[key], value), (row["process"], row["rule"], row["seed"], key)
        assert row["curves"] == alone.curves
    by = {(r["process"], r["rule"], r["seed"]): r for r in rows}
    assert by[("iid:u=0.5", "placebo-cut", 1)]["curves"] != by[("iid:u=0.5", "placebo-cut", 2)]["curves"]


def test_lanes_on_parallel_threads_give_the_same_rows():
    kw = dict(n=30, T=60, horizon=10, with_curves=True)
    args = (["iid:u=0.5", "bursty:u=0.7"], ["sfg-cut", "placebo-cut", "dfedavg"], [1, 2])
    one = replay(*args, threads=1, **kw)
    assert len(one) == 12
    assert replay(*args, threads=3, **kw) == one


@pytest.mark.parametrize("rule", ["sfg-cut", "placebo-cut"])
def test_self_return_threads_do_not_change_results(rule):
    g = make_graph("knn:k=4", 60, seed=5)
    avail = make_process("iid:u=0.5").sample(90, 60, seed=5, positions=g.positions)
    runs = [replay_trace(avail, g, rule, seed=5, horizon=20, threads=k) for k in (1, 2, 3, 7)]
    assert runs[0].metrics["H_pairs"] > 1000
    for other in runs[1:]:
        assert other.metrics == runs[0].metrics and other.curves == runs[0].curves


@pytest.mark.parametrize("attack", [None, "forge:frac=0.1,claim=fresh,always_on=true"])
def test_self_return_following_on_threads_across_blocks(attack):
    """H following the round on threads, in stretches of small blocks (the weight buffer is
    reused from block to block), with the compiled block path and the per-round path of an
    attack: the same rows as one thread, and H equal to the per-client loop without attack."""
    from sfg.modelfree.horizon import EXACT_PAIRS
    from sfg.round.attacks import parse_attack

    g = make_graph("knn:k=4", 40, seed=3)
    avail = make_process("iid:u=0.5").sample(80, 40, seed=3, positions=g.positions)
    lane = Lane(avail, g, parse_rule("sfg-cut"), 3, parse_attack(attack))
    kw = dict(anatomy="full", link_failure=0.0, horizon=10, exact_pairs=EXACT_PAIRS,
              sample_pairs=1000, chunk_elems=40 * 12 * 7)  # blocks of 7 rounds
    one = run_lane(lane, threads=1, **kw)
    for k in (2, 3):
        other = run_lane(lane, threads=k, **kw)
        assert other.metrics == one.metrics and other.curves == one.curves
    if attack is None:
        ref = replay_reference(avail, g, "sfg-cut", seed=3, horizon=10)
        assert _close(one.metrics["H"], ref["H"]) and one.metrics["H_pairs"] > 1000


@pytest.mark.parametrize("where", ["round", "horizon"])
def test_a_failure_while_H_follows_on_threads_propagates_and_stops_the_threads(where,
                                                                               monkeypatch):
    """An error in the round (the main thread) or in a part of H on its thread reaches the
    caller, and no H thread is left running."""
    import threading

    from sfg.modelfree import driver
    from sfg.modelfree.horizon import EXACT_PAIRS

    calls = {"n": 0}
    target = (driver, "_rounds_block") if where == "round" else (driver.HorizonPart, "run")
    real = getattr(*target)

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError(f"injected failure in the {where}")
        return real(*a, **k)

    monkeypatch.setattr(*target, failing)
    g = make_graph("knn:k=4", 40, seed=3)
    avail = make_process("iid:u=0.5").sample(80, 40, seed=3, positions=g.positions)
    lane = Lane(avail, g, parse_rule("sfg"), 3)
    with pytest.raises(RuntimeError, match=f"injected failure in the {where}"):
        run_lane(lane, anatomy="full", link_failure=0.0, horizon=10, exact_pairs=EXACT_PAIRS,
                 sample_pairs=1000, threads=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("sfg-horizon")]


# ----------------------------------------------------------------------------- horizon
@pytest.mark.parametrize("rule", ["sfg-cut", "dfedavg", "placebo-cut"])
def test_horizon_edge_cases_equal_reference(rule):
    g, avail = _scenario(rounds=20)
    for h in (1, 0, 20, 21, 100):
        got = replay_trace(avail, g, rule, seed=SEED, horizon=h, link_failure=0.3)
        ref = replay_reference(avail, g, rule, seed=SEED, horizon=h, link_failure=0.3)
        assert _close(got.metrics["H"], ref["H"])
        if h == 1:
            assert got.metrics["H"] == 1.0 and got.metrics["H_pairs"] == avail.sum()
        elif h == 20:  # one start round (t = 0)
            assert got.metrics["H_pairs"] == avail[0].sum() and got.metrics["H"] >= 1.0
        else:  # h = 0 or h > T: no pair has a full horizon
            assert math.isnan(got.metrics["H"]) and got.metrics["H_pairs"] == 0


def test_sampled_horizon_is_the_mean_over_its_pairs():
    """Above exact_pairs, H is the mean over a seeded sample of pairs with its standard error;
    with a sample of every pair it equals the exact H."""
    g, avail = _scenario("iid:u=0.5", n=20, rounds=40)
    exact = replay_trace(avail, g, "sfg-cut", seed=SEED, horizon=5)
    n_pairs = int(exact.metrics["H_pairs"])
    full = replay_trace(avail, g, "sfg-cut", seed=SEED, horizon=5, exact_pairs=1,
                        sample_pairs=n_pairs)
    assert full.metrics["H"] == pytest.approx(exact.metrics["H"], rel=1e-12)
    assert exact.metrics["H_se"] == 0.0 and full.metrics["H_se"] > 0
    some = replay_trace(avail, g, "sfg-cut", seed=SEED, horizon=5, exact_pairs=1, sample_pairs=50)
    assert some.metrics["H_pairs"] == 50
    assert abs(some.metrics["H"] - exact.metrics["H"]) < 5 * some.metrics["H_se"]


def test_progress_reaches_total():
    g, avail = _scenario("iid:u=0.5")
    calls: list[tuple[int, int]] = []
    replay_trace(avail, g, "sfg-cut", seed=SEED, horizon=HORIZON,
                 progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (T, T)
    done = [c[0] for c in calls]
    assert done == sorted(done) and all(c[1] == T for c in calls)


# ----------------------------------------------------------------------------- engine, cache
def test_engine_names():
    g, avail = _scenario()
    a = replay_trace(avail, g, "oracle-gls", seed=SEED, horizon=HORIZON, engine="compiled")
    b = replay_trace(avail, g, "oracle-gls", seed=SEED, horizon=HORIZON, engine="numpy")
    assert a.curves == b.curves  # one round runs every rule; the names are aliases
    with pytest.raises(SfgError, match="choose one of auto, compiled, numpy"):
        replay(["iid:u=0.5"], ["sfg"], [1], n=14, T=10, engine="numba")


def test_only_the_rule_is_compiled_per_rule():
    """The round is compiled once for every rule (one signature: the rule is an argument);
    per rule only its score function is made, once per process, named after the rule."""
    from sfg.round.kernel import _generic, scorer

    fn = parse_rule("sfg-cut").fn
    sc = scorer(fn)
    assert scorer(fn) is sc and "sfg_cut" in sc.dispatcher.py_func.__name__
    assert scorer(parse_rule("sfg").fn) is not sc
    g, avail = _scenario()
    for rule in ("sfg-cut", "sfg", "dfedavg+ipw"):
        replay_trace(avail, g, rule, seed=SEED, horizon=HORIZON)
    assert len(_generic(("round", False, False)).signatures) == 1


def test_warm_compiled_loads_the_rules_given():
    from sfg.modelfree import warm_compiled
    from sfg.round.kernel import _KERNELS

    warm_compiled(["sfg-l", "dfedavg"])
    assert parse_rule("sfg-l").fn in _KERNELS


def test_a_rule_that_raises_is_an_error_not_a_crash(tmp_path, monkeypatch):
    """A rule's exception cannot cross the C wrapper the round calls it through; numba reports
    it (as an unraisable exception) and the round stops with an error that names the rule,
    the receiver and the round, in the replay and in weights_one alike."""
    import importlib
    import textwrap

    from sfg.round.kernel import RuleError
    from sfg.round.rules import RULES

    (tmp_path / "raising_rule.py").write_text(textwrap.dedent('''
        import numpy as np
        from numba import njit

        from sfg.round.rules import rule


        @rule("test-raises", tags=("control",))
        @njit(cache=True)
        def raises(x):
            """``test-raises``: divides by zero once a receiver has been offline."""
            h = np.ones(x.age.shape[0])
            h[0] = 1.0 / (x.age[0] - x.age[0]) if x.age[0] > 2 else 1.0
            return h
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    try:
        importlib.import_module("raising_rule")
        g, avail = _scenario()
        with pytest.raises(RuleError, match=r"raises raised while scoring receiver \d+ in round"):
            replay_trace(avail, g, "test-raises", seed=SEED, horizon=HORIZON)
        assert seen == [ZeroDivisionError]
        with pytest.raises(RuleError, match="receiver 0 in round 3"):
            parse_rule("test-raises").weights_one(ages=[3, 0, 1])
        assert parse_rule("test-raises").weights_one(ages=[1, 0, 1]).sum() == 1.0
    finally:
        RULES._entries.pop("test-raises", None)
        sys.modules.pop("raising_rule", None)
