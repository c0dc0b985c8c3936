"""Tests for sfg.experiments.stats: paired comparisons (docs/concepts/statistics.md#paired-statistics), with hand-computed cases."""

from __future__ import annotations

import csv
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from sfg.errors import SfgError
from sfg.experiments.stats import (
    CSV_COLUMNS,
    compare,
    comparisons_to_csv,
    holm,
    paired_differences,
    sign_flip_pvalue,
    stratified_interval,
    verdict,
    wilcoxon_pvalue,
)

T975 = {3: 3.182446305284263, 4: 2.7764451051977987, 5: 2.5705818366147395}  # t tables


def rec(dataset, process, rule, seed, value, **metrics):
    return {"run_id": f"{dataset}-{process}-{rule}-{seed}", "dataset": dataset,
            "process": process, "rule": rule, "seed": seed,
            "metrics": {"acc_mean": value, **metrics}}


def paired_records(diffs, *, rule="sfg", base=0.5, process="iid:u=0.5"):
    """Records where ``rule`` − dfedavg = diffs[dataset][seed_index] (seeds 1..)."""
    out = []
    for dataset, ds in diffs.items():
        for k, d in enumerate(ds, start=1):
            out.append(rec(dataset, process, "dfedavg", k, base))
            out.append(rec(dataset, process, rule, k, base + d))
    return out


# ----------------------------------------------------------------- stratified interval


def test_stratified_interval_two_datasets_three_seeds_by_hand():
    # A: d = 1, 2, 3 (mean 2, SS 2); B: d = 2, 4, 6 (mean 4, SS 8).
    # units 6, datasets 2 -> df 4; s² = (2 + 8) / 4 = 2.5; mean = 18 / 6 = 3;
    # SE = sqrt(2.5 / 6); half-width = t_{.975,4} · SE = 2.7764451 · 0.6454972 = 1.7921876.
    recs = paired_records({"A": [0.01, 0.02, 0.03], "B": [0.02, 0.04, 0.06]})
    (c,) = compare(recs, rules=["sfg"])
    se = math.sqrt(2.5e-4 / 6)
    assert c.df == 4 and c.units == 6 and c.datasets == 2
    assert c.mean_gain == pytest.approx(0.03, abs=1e-12)
    assert c.ci_low == pytest.approx(0.03 - T975[4] * se, abs=1e-10)
    assert c.ci_high == pytest.approx(0.03 + T975[4] * se, abs=1e-10)
    assert T975[4] * math.sqrt(2.5 / 6) == pytest.approx(1.7921876, abs=1e-6)


def test_stratified_interval_weightings_unbalanced_by_hand():
    # A: 1, 2, 3 (mean 2, SS 2); B: 10, 14 (mean 12, SS 8); df = 5 − 2 = 3, s² = 10/3.
    d = np.array([1.0, 2.0, 3.0, 10.0, 14.0])
    h = np.array([0, 0, 0, 1, 1])
    unit = stratified_interval(d, h, weighting="unit")
    # unit weights 1/5: mean 30/5 = 6, SE² = s²/5 = 2/3
    assert unit.mean == pytest.approx(6.0) and unit.df == 3
    assert unit.se == pytest.approx(math.sqrt(2 / 3))
    assert unit.high - unit.mean == pytest.approx(T975[3] * math.sqrt(2 / 3))
    ds = stratified_interval(d, h, weighting="dataset")
    # dataset weights: mean (2 + 12)/2 = 7, Σw² = (1/4)(1/3 + 1/2) = 5/24, SE² = 10/3·5/24
    assert ds.mean == pytest.approx(7.0)
    assert ds.se == pytest.approx(5 / 6)
    assert ds.low == pytest.approx(7.0 - T975[3] * 5 / 6)


def test_interval_undefined_when_df_not_positive():
    # one seed per dataset: units = datasets -> df = 0; NaN interval, verdict unresolved
    recs = paired_records({"A": [0.1], "B": [0.2]})
    (c,) = compare(recs)
    assert c.df == 0 and c.units == 2
    assert c.mean_gain == pytest.approx(0.15)
    assert math.isnan(c.ci_low) and math.isnan(c.ci_high)
    assert c.verdict == "unresolved"
    assert stratified_interval(np.zeros(0), np.zeros(0, int)).units == 0


# ----------------------------------------------------------------- permutation test


def test_exact_permutation_four_units_by_hand():
    # d = 3, 1, 1, −1: observed sum 4. Signed sums = ±3 + (±1 ±1 ±1):
    #   +3 + {3, 1, −1, −3} (counts 1, 3, 3, 1) -> 6, 4, 2, 0
    #   −3 + {3, 1, −1, −3} (counts 1, 3, 3, 1) -> 0, −2, −4, −6
    # |sum| ≥ 4: 6 (1) + 4 (3) + −4 (3) + −6 (1) = 8 of 16 patterns -> p = 0.5
    p, method = sign_flip_pvalue(np.array([3.0, 1.0, 1.0, -1.0]))
    assert p == 0.5 and method == "exact(16)"
    # d = 1, 2, 3, 4: only the identity and the all-flipped pattern reach |sum| = 10
    assert sign_flip_pvalue(np.array([1.0, 2.0, 3.0, 4.0]))[0] == 2 / 16
    # through compare: one dataset, four seeds
    (c,) = compare(paired_records({"A": [0.03, 0.01, 0.01, -0.01]}))
    assert c.p_perm == 0.5 and c.permutation == "exact(16)"


def test_exact_permutation_matches_brute_force_enumeration():
    d = np.array([0.3, -0.1, 0.25, 0.05, -0.2, 0.4, 0.1])
    obs = abs(d.mean())
    pats = np.array(list(itertools.product([1, -1], repeat=d.size)))
    brute = np.mean(np.abs(pats @ d / d.size) >= obs - 1e-12)
    assert sign_flip_pvalue(d)[0] == pytest.approx(brute, abs=1e-15)


def test_all_zero_differences_give_p_one():
    assert sign_flip_pvalue(np.zeros(5))[0] == 1.0
    assert wilcoxon_pvalue(np.zeros(4)) == 1.0
    (c,) = compare(paired_records({"A": [0.0, 0.0, 0.0]}))
    assert c.p_perm == 1.0 and c.p_wilcoxon == 1.0 and c.wins == 0
    assert c.verdict == "no difference"


def test_monte_carlo_path_is_seeded_and_close_to_exact():
    d = np.random.default_rng(3).normal(0.3, 1.0, size=12)
    exact, m_exact = sign_flip_pvalue(d)
    mc1, m_mc = sign_flip_pvalue(d, exact_max_units=10, draws=40_000, seed=7)
    mc2, _ = sign_flip_pvalue(d, exact_max_units=10, draws=40_000, seed=7)
    mc3, _ = sign_flip_pvalue(d, exact_max_units=10, draws=40_000, seed=8)
    assert m_exact == "exact(4096)" and m_mc == "monte-carlo(40000, seed=7)"
    assert mc1 == mc2  # same seed -> bit-identical
    assert mc1 != mc3
    assert abs(mc1 - exact) < 0.01 and abs(mc3 - exact) < 0.01


def test_monte_carlo_default_threshold_above_twenty_units():
    d = np.random.default_rng(0).normal(0.0, 1.0, size=21)
    p1, method = sign_flip_pvalue(d)
    p2, _ = sign_flip_pvalue(d)
    assert method == "monte-carlo(100000, seed=0)" and p1 == p2
    assert 1 / 100_001 <= p1 <= 1.0
    assert sign_flip_pvalue(d[:20])[1] == f"exact({2**20})"


# ----------------------------------------------------------------- Holm and Wilcoxon


def test_holm_hand_example_and_statsmodels():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> max(0.06) = 0.06
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])
    np.testing.assert_allclose(holm([0.5, 0.6]), [1.0, 1.0])  # capped at 1
    out = holm([0.02, math.nan, 0.01])  # NaN stays NaN and is not counted: m = 2
    assert math.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.02, 0.02])
    assert holm([]).size == 0


def test_holm_applied_over_declared_family():
    # two rules; the permutation p of each is Holm-adjusted within the pair
    recs = paired_records({"A": [0.01, 0.02, 0.03, 0.04]}, rule="r1")
    recs += [r for r in paired_records({"A": [0.03, 0.01, 0.01, -0.01]}, rule="r2")
             if r["rule"] == "r2"]
    c1, c2 = compare(recs, rules=["r1", "r2"])
    assert (c1.p_perm, c2.p_perm) == (0.125, 0.5)
    assert c1.p_perm_holm == pytest.approx(0.25) and c2.p_perm_holm == pytest.approx(0.5)
    (solo,) = compare(recs, rules=["r1"])  # a family of one is not adjusted
    assert solo.p_perm_holm == 0.125


def test_wilcoxon_on_cell_means_matches_scipy():
    # 1 dataset, 5 processes, 2 seeds; cell mean = mean over seeds of d
    d = {"p1": (0.02, 0.04), "p2": (-0.01, 0.03), "p3": (0.05, 0.05),
         "p4": (0.0, -0.06), "p5": (0.07, 0.01)}
    recs = []
    for proc, ds in d.items():
        for seed, x in enumerate(ds, start=1):
            recs += [rec("A", proc, "dfedavg", seed, 0.5), rec("A", proc, "sfg", seed, 0.5 + x)]
    (c,) = compare(recs)
    hand = [0.03, 0.01, 0.05, -0.03, 0.04]  # |0.03| tie: must stay a tie despite rounding noise
    assert c.p_wilcoxon == pytest.approx(sps.wilcoxon(hand).pvalue, rel=1e-9)
    assert c.cells == 5 and c.positive_cells == 4
    assert math.isnan(wilcoxon_pvalue(np.zeros(0)))


# ----------------------------------------------------------------- pairing and counts


def test_unit_difference_averages_over_processes_present_for_both():
    recs = []
    # seed 1: processes p1 (d=0.02) and p2 (d=0.06) -> unit mean 0.04
    # seed 2: p1 (d=−0.01); p2 only has the baseline -> unit mean −0.01, one run dropped
    for proc, seed, d in [("p1", 1, 0.02), ("p2", 1, 0.06), ("p1", 2, -0.01)]:
        recs += [rec("A", proc, "dfedavg", seed, 0.6), rec("A", proc, "sfg", seed, 0.6 + d)]
    recs.append(rec("A", "p2", "dfedavg", 2, 0.6))
    pd = paired_differences(recs, rule="sfg")
    assert pd.unit_keys == (("A", 1), ("A", 2))
    np.testing.assert_allclose(pd.unit_diffs, [0.04, -0.01], atol=1e-12)
    assert pd.dropped == 1
    (c,) = compare(recs)
    assert c.mean_gain == pytest.approx(0.015, abs=1e-12)
    assert (c.units, c.runs, c.dropped) == (2, 3, 1)


def test_dropped_unpaired_and_non_finite_runs():
    recs = paired_records({"A": [0.01, 0.02, 0.03]})
    recs.append(rec("A", "iid:u=0.5", "sfg", 9, 0.7))  # no baseline partner
    recs.append(rec("A", "bursty:u=0.8", "dfedavg", 1, 0.7))  # no rule partner
    recs.append(rec("B", "iid:u=0.5", "sfg", 1, float("nan")))  # non-finite
    recs.append(rec("B", "iid:u=0.5", "dfedavg", 1, 0.4))
    (c,) = compare(recs)
    assert c.dropped == 4 and c.runs == 3 and c.units == 3 and c.datasets == 1


def test_wins_and_positive_cells():
    # 1 dataset × 2 processes × 3 seeds
    d = {"p1": [0.02, -0.01, 0.03], "p2": [-0.05, 0.01, 0.0]}
    recs = []
    for proc, ds in d.items():
        for seed, x in enumerate(ds, start=1):
            recs += [rec("A", proc, "dfedavg", seed, 0.5), rec("A", proc, "sfg", seed, 0.5 + x)]
    (c,) = compare(recs)
    assert (c.wins, c.runs) == (3, 6)  # 0.02, 0.03, 0.01
    assert (c.positive_cells, c.cells) == (1, 2)  # p1 mean > 0, p2 mean < 0


def test_lower_is_better_metric_orients_wins_and_verdict():
    recs = []
    for seed, saved in enumerate([100, 120, 90, 110, 105, 95], start=1):
        recs.append(rec("A", "p", "dfedavg", seed, 0.5, messages=1000))
        recs.append(rec("A", "p", "sfg", seed, 0.5, messages=1000 - saved))
    (c,) = compare(recs, metric="messages")
    assert c.mean_gain == pytest.approx(-620 / 6) and not c.higher_is_better
    assert c.wins == 6 and c.verdict == "better"
    assert compare(recs, metric="messages", higher_is_better=True)[0].verdict == "worse"


# ----------------------------------------------------------------- verdicts


def test_verdicts_better_worse_no_difference():
    good = [0.02, 0.03, 0.025, 0.02, 0.03, 0.028]  # 6 units, all positive: p = 2/64
    (c,) = compare(paired_records({"A": good}))
    assert c.p_perm == pytest.approx(2 / 64) and c.ci_low > 0 and c.verdict == "better"
    (c,) = compare(paired_records({"A": [-x for x in good]}))
    assert c.verdict == "worse"
    (c,) = compare(paired_records({"A": [0.02, -0.03, 0.01, -0.01, 0.02, -0.02]}))
    assert c.verdict == "no difference" and c.ci_low < 0 < c.ci_high


def test_unresolved_when_interval_excludes_zero_but_test_does_not_reject():
    # four tight positive units: the interval excludes 0, but the smallest exact
    # permutation p with 4 units is 2/16 = 0.125 > 0.05
    (c,) = compare(paired_records({"A": [0.020, 0.021, 0.019, 0.020]}))
    assert c.ci_low > 0 and c.p_perm_holm == 0.125
    assert c.verdict == "unresolved"


def test_unresolved_when_test_rejects_but_interval_covers_zero():
    # six positive units, one huge: p = 2/64 < 0.05, but the spread puts 0 in the interval
    (c,) = compare(paired_records({"A": [0.001] * 5 + [0.1]}))
    assert c.p_perm_holm == pytest.approx(2 / 64)
    assert c.ci_low < 0 < c.ci_high
    assert c.verdict == "unresolved"


def test_verdict_function_table():
    kw = dict(alpha=0.05)
    assert verdict(mean=1, low=0.5, high=1.5, p_adjusted=0.01, **kw) == "better"
    assert verdict(mean=-1, low=-1.5, high=-0.5, p_adjusted=0.01, **kw) == "worse"
    assert verdict(mean=1, low=-0.5, high=1.5, p_adjusted=0.2, **kw) == "no difference"
    assert verdict(mean=1, low=0.5, high=1.5, p_adjusted=0.2, **kw) == "unresolved"
    assert verdict(mean=1, low=math.nan, high=math.nan, p_adjusted=0.01, **kw) == "unresolved"


# ----------------------------------------------------------------- errors and CSV


def test_bad_input_raises_sfg_error():
    recs = paired_records({"A": [0.01, 0.02]})
    with pytest.raises(SfgError, match="did you mean 'acc_mean'"):
        compare(recs, metric="acc_maen")
    with pytest.raises(SfgError, match="baseline 'dfedvg' has no runs; did you mean"):
        compare(recs, baseline="dfedvg")
    with pytest.raises(SfgError, match="rule 'sgf' has no runs"):
        compare(recs, rules=["sgf"])
    with pytest.raises(SfgError, match="duplicates record 0"):
        compare(recs + [recs[0]])
    with pytest.raises(SfgError, match="seed"):
        compare([{**recs[0], "seed": "one"}] + recs[1:])
    with pytest.raises(SfgError, match="alpha"):
        compare(recs, alpha=1.5)
    with pytest.raises(SfgError, match="weighting"):
        compare(recs, weighting="units")
    with pytest.raises(SfgError, match="non-numeric"):
        compare([{**recs[0], "metrics": {"acc_mean": "high"}}] + recs[1:])


def test_only_baseline_gives_no_comparisons():
    recs = [r for r in paired_records({"A": [0.01, 0.02]}) if r["rule"] == "dfedavg"]
    assert compare(recs) == []


def test_comparisons_csv_one_row_per_comparison(tmp_path):
    recs = paired_records({"A": [0.01, 0.02, 0.03]}, rule="r1")
    recs += [r for r in paired_records({"A": [0.0, -0.01, 0.01]}, rule="r2")
             if r["rule"] == "r2"]
    comps = compare(recs)
    path = comparisons_to_csv(comps, tmp_path / "sub" / "comparisons.csv")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert [r["rule"] for r in rows] == ["r1", "r2"]
    assert float(rows[0]["mean_gain"]) == comps[0].mean_gain
    assert float(rows[1]["p_perm_holm"]) == comps[1].p_perm_holm
    for col in ("ci_low", "ci_high", "wins", "p_wilcoxon", "verdict", "dropped"):
        assert col in CSV_COLUMNS


# ----------------------------------------------------------------- invariants


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=10), st.randoms())
def test_sign_flip_invariants(d, rnd):
    d = np.array(d)
    p, _ = sign_flip_pvalue(d)
    assert 0 < p <= 1
    assert sign_flip_pvalue(-d)[0] == pytest.approx(p)
    perm = list(range(d.size))
    rnd.shuffle(perm)
    assert sign_flip_pvalue(d[perm])[0] == pytest.approx(p)
    assert p >= min(1.0, 2.0 / 2**d.size) - 1e-15


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12))
def test_holm_invariants(p):
    p = np.array(p)
    adj = holm(p)
    assert np.all(adj >= p - 1e-15) and np.all(adj <= 1)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adj[order]) >= -1e-15)
    m = p.size  # the smallest p is multiplied by m; the largest adjusted is max over the rest
    assert adj[order[0]] == pytest.approx(min(1.0, m * p[order[0]]))


def test_rule_without_any_pair_is_unresolved_not_a_crash():
    recs = paired_records({"A": [0.01, 0.02, 0.03]}, rule="r1")
    recs += [rec("B", "iid:u=0.5", "r2", s, 0.5) for s in (1, 2)]  # no baseline on B
    c1, c2 = compare(recs)
    assert (c2.units, c2.runs, c2.dropped) == (0, 0, 5)  # 2 of r2 + 3 unmatched dfedavg
    assert math.isnan(c2.mean_gain) and math.isnan(c2.p_perm) and c2.verdict == "unresolved"
    assert c1.p_perm_holm == c1.p_perm  # the NaN p-value does not enlarge the Holm family
