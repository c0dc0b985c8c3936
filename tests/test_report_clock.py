"""`sfg report` on runs of the virtual clock (docs/concepts/clock.md#metrics with the statistics of docs/concepts/statistics.md#paired-statistics).

A tiny real grid (digits, N = 10, 4 rounds, K = 1, two rules, two seeds) runs on three
protocols into a real SQLite store, then `sfg report` reads it back. Checked against the stored
metrics and curves by hand: the cells are separated by protocol (an async run is never paired
with a lockstep one), the time-to-accuracy differences over the pairs where both runs reached
the target (and the pairs dropped because one or both never did), a target no run can reach
(0.99) reported as never reached, not as a number, the clock's counts per device-hour, and
accuracy drawn over virtual hours. The base target 0.137 lies between the two rules' first
event-protocol accuracies of seed 2 on this data, so one paired difference is not zero.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from sfg.errors import SfgError
from sfg.experiments.report.clock import figure_over_time, hours_curve
from sfg.experiments.stats import (
    pair_values,
    run_values,
    setting_labels,
    sign_flip_pvalue,
    with_settings,
)
from sfg.experiments.store import records as store_records

GRID = """\
name: tiny-clock
base: {kind: train, dataset: digits, n_clients: 10, rounds: 4, local_steps: 1, eval_every: 2,
       clock: virtual, target_accuracy: 0.137}
rules: [dfedavg, sfg-cut]
seeds: [1, 2]
overrides:
  - {protocol: lockstep}
  - {protocol: async, jitter: 0.5, target_accuracy: 0.99}
  - {protocol: event, compute: "const:value=60"}
"""
LOCKSTEP = "lockstep, target_accuracy 0.137"
ASYNC = "async, jitter 0.5, target_accuracy 0.99"
EVENT = "event, compute const:value=60, target_accuracy 0.137"
SETTINGS = (LOCKSTEP, ASYNC, EVENT)
PROTOCOL = {LOCKSTEP: "lockstep", ASYNC: "async", EVENT: "event"}
RULES = ("dfedavg", "sfg-cut")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    from sfg.cli.main import app

    tmp = tmp_path_factory.mktemp("clock-report")
    (tmp / "g.yaml").write_text(GRID)
    store = tmp / "s.sqlite"
    runner = CliRunner()
    res = runner.invoke(app, ["grid", "run", str(tmp / "g.yaml"), "--store", str(store),
                              "--workers", "1", "--no-progress"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", "--store", str(store), "--out", str(tmp / "rep")])
    assert res.exit_code == 0, res.output
    return {"records": store_records(store), "out": tmp / "rep", "output": res.output}


def _csv(path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def _run(grid, protocol: str, rule: str, seed: int) -> dict:
    (r,) = [r for r in grid["records"] if r["config"]["protocol"] == protocol
            and r["rule"] == rule and r["seed"] == seed]
    return r


def _tta_by_hand(r: dict) -> float:
    """The first evaluation time (h) whose mean accuracy reaches the run's target; lockstep's
    round r ends at r · 600 s."""
    cfg, curves = r["config"], r["curves"]
    hours = (curves["hours"] if "hours" in curves
             else [x * cfg["round_seconds"] / 3600.0 for x in curves["round"]])
    for h, acc in zip(hours, curves["acc_mean"], strict=True):
        if acc >= cfg["target_accuracy"]:
            return h
    return math.nan


def test_cells_are_separated_by_protocol(grid):
    assert len(grid["records"]) == 12
    comps = _csv(grid["out"] / "comparisons.csv")
    assert [c["setting"] for c in comps] == list(SETTINGS)
    for c in comps:
        proto = PROTOCOL[c["setting"]]
        # each comparison pairs the two seeds of its own protocol, nothing else
        assert (c["rule"], int(c["runs"]), int(c["units"]), int(c["dropped"])) == \
            ("sfg-cut", 2, 2, 0)
        diffs = [_run(grid, proto, "sfg-cut", s)["metrics"]["acc_mean"]
                 - _run(grid, proto, "dfedavg", s)["metrics"]["acc_mean"] for s in (1, 2)]
        assert float(c["mean_gain"]) == pytest.approx(np.mean(diffs), abs=1e-12)
    md = (grid["out"] / "report.md").read_text()
    assert "| rule | setting | runs | mean acc (%) |" in md
    for setting in SETTINGS:
        assert f"| dfedavg | {setting} | 2 |" in md and f"| sfg-cut | {setting} | 2 |" in md
    assert "Time to accuracy on the virtual clock" in grid["output"]


def test_time_to_accuracy_by_hand(grid):
    rows = {(r["setting"], r["rule"]): r for r in _csv(grid["out"] / "time_to_accuracy.csv")}
    assert set(rows) == {(s, rule) for s in SETTINGS for rule in RULES}
    md = (grid["out"] / "report.md").read_text()
    for setting in (LOCKSTEP, EVENT):
        proto = PROTOCOL[setting]
        t = {(rule, s): _tta_by_hand(_run(grid, proto, rule, s)) for rule in RULES
             for s in (1, 2)}
        if proto == "event":  # the stored metric is the same first time
            for (rule, s), h in t.items():
                stored = _run(grid, proto, rule, s)["metrics"]["time_to_accuracy_h"]
                assert (math.isnan(h) and math.isnan(stored)) or stored == pytest.approx(h)
        both = [s for s in (1, 2) if math.isfinite(t["sfg-cut", s])
                and math.isfinite(t["dfedavg", s])]
        d = np.array([t["sfg-cut", s] - t["dfedavg", s] for s in both])
        row = rows[(setting, "sfg-cut")]
        base = rows[(setting, "dfedavg")]
        reached = [h for (rule, _), h in t.items() if rule == "dfedavg" and math.isfinite(h)]
        assert int(base["reached"]) == len(reached) and base["verdict"] == "baseline"
        assert int(row["both_reached"]) == len(both) and int(row["pairs"]) == 2
        never = {"rule_never": 0, "baseline_never": 0, "neither": 0}
        for s in (1, 2):
            a, b = math.isfinite(t["sfg-cut", s]), math.isfinite(t["dfedavg", s])
            if (a, b) == (False, True):
                never["rule_never"] += 1
            elif (a, b) == (True, False):
                never["baseline_never"] += 1
            elif (a, b) == (False, False):
                never["neither"] += 1
        assert {k: int(row[k]) for k in never} == never
        assert float(row["mean_diff_h"]) == pytest.approx(d.mean())
        if d.size == 2:  # df = 2 units − 1 dataset; weights 1/2 each
            half = float(sps.t.ppf(0.975, 1)) * d.std(ddof=1) / math.sqrt(2)
            assert float(row["ci_low_h"]) == pytest.approx(d.mean() - half)
            assert float(row["ci_high_h"]) == pytest.approx(d.mean() + half)
            flips = [abs(a * d[0] + b * d[1]) >= abs(d.sum()) - 1e-12
                     for a in (1, -1) for b in (1, -1)]
            assert float(row["p_perm"]) == pytest.approx(sum(flips) / 4)
            assert float(row["p_perm"]) == pytest.approx(sign_flip_pvalue(d)[0])
            line = next(x for x in md.splitlines()
                        if x.startswith(f"| {setting} | sfg-cut |"))
            assert f"| {d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] |" in line
        assert int(row["wins"]) == int(np.sum(d < 0))  # wins: the rule reached it sooner
    # this data: in the event world seed 2's sfg-cut reaches 13.7 % at the first evaluation
    # (1/3 h), dfedavg only at the second; lockstep's seed 2 never does
    assert float(rows[(EVENT, "sfg-cut")]["mean_diff_h"]) < 0
    assert int(rows[(LOCKSTEP, "sfg-cut")]["neither"]) >= 1
    # lockstep runs store their time to accuracy (round r ends at r·Δ) like async and event,
    # so the report reads it rather than working it out from their round curves
    assert "Lockstep times come from the runs' round curves" not in md
    for s_ in (1, 2):
        m = _run(grid, "lockstep", "sfg-cut", s_)
        hit = [r * 600 / 3600 for r, a in zip(m["curves"]["round"], m["curves"]["acc_mean"],
                                               strict=True) if a >= m["config"]["target_accuracy"]]
        want = hit[0] if hit else float("nan")
        got = m["metrics"]["time_to_accuracy_h"]
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_a_target_never_reached_is_reported_as_such(grid):
    rows = {(r["setting"], r["rule"]): r for r in _csv(grid["out"] / "time_to_accuracy.csv")}
    for rule in RULES:
        for s in (1, 2):
            m = _run(grid, "async", rule, s)["metrics"]
            assert math.isnan(m["time_to_accuracy_h"]) and m["reached_target"] == 0
        assert int(rows[(ASYNC, rule)]["reached"]) == 0
        assert math.isnan(float(rows[(ASYNC, rule)]["mean_h"]))
    row = rows[(ASYNC, "sfg-cut")]
    assert (int(row["both_reached"]), int(row["neither"])) == (0, 2)
    assert math.isnan(float(row["mean_diff_h"]))
    md = (grid["out"] / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith(f"| {ASYNC} | sfg-cut |"))
    assert "| 99 | 2 | 0/2 | never reached (0/2 runs) |" in line
    assert "— (no pair where both reached the target)" in line
    assert "2 (rule only 0, baseline only 0, both 2)" in line


def test_clock_counts_per_device_hour(grid):
    rows = {r["setting"]: r for r in _csv(grid["out"] / "clock_rates.csv")}
    assert set(rows) == set(SETTINGS)
    device_hours = 10 * 4 * 600 / 3600  # N · T · Δ
    for setting, row in rows.items():
        proto = PROTOCOL[setting]
        runs = [_run(grid, proto, rule, s)["metrics"] for rule in RULES for s in (1, 2)]
        # the schedule does not depend on the rule: both rules share one row
        assert row["rules"] == "dfedavg;sfg-cut" and int(row["runs"]) == 4
        assert float(row["messages_sent_per_device_hour"]) == pytest.approx(
            np.mean([m["messages_sent_per_device_hour"] for m in runs]))
        # the run's delivered rate; lockstep (no such rate): its aggregated messages
        assert float(row["delivered_per_device_hour"]) == pytest.approx(np.mean([
            m.get("delivered_per_device_hour", m["messages"] / device_hours)
            for m in runs]))
        lost = np.mean([sum(v for k, v in m.items() if k.startswith("lost")
                            and not k.endswith("_hour")) for m in runs])
        assert float(row["lost"]) == pytest.approx(lost)
    # lockstep: local rounds are participations; no compute time was set
    lock = rows[LOCKSTEP]
    part = np.mean([_run(grid, "lockstep", r, s)["metrics"]["local_rounds"]
                    for r in RULES for s in (1, 2)])
    assert float(lock["local_rounds_per_device_hour"]) == pytest.approx(part / device_hours)
    assert float(lock["compute_seconds_per_device_hour"]) == 0.0
    assert math.isnan(float(lock["skipped"])) and math.isfinite(float(lock["late"]))
    # event, 60 s per step and K = 1: 60 compute-seconds per local round
    ev = rows[EVENT]
    assert float(ev["compute_seconds_per_device_hour"]) == pytest.approx(
        60 * float(ev["local_rounds_per_device_hour"]))
    assert math.isnan(float(ev["late"])) and math.isnan(float(ev["skipped"]))
    md = (grid["out"] / "report.md").read_text()
    assert "## The clock's counts (docs/concepts/clock.md#metrics)" in md
    assert f"| digits | bursty:u=0.8 | {EVENT} | all 2: dfedavg, sfg-cut | 4 |" in md


def test_accuracy_over_virtual_hours(grid):
    out = grid["out"]
    assert (out / "accuracy_over_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "accuracy_over_rounds.png").exists()  # every run is on the clock
    assert "![accuracy_over_time.png](accuracy_over_time.png)" in (out / "report.md").read_text()
    fig = figure_over_time(with_settings(grid["records"]), list(RULES))
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 3  # one per clock setting, in the grid's order
    assert "over virtual time" in fig._suptitle.get_text()
    for ax, setting in zip(panels, SETTINGS, strict=True):
        assert ax.get_xlabel() == "virtual time (h)" and ax.get_ylabel() == "mean accuracy (%)"
        assert PROTOCOL[setting] in ax.get_title()
        line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("dfedavg"))
        runs = [_run(grid, PROTOCOL[setting], "dfedavg", s) for s in (1, 2)]
        hours = hours_curve(runs[0])[0]
        assert np.allclose(line.get_xdata(), hours) and np.allclose(hours, [1 / 3, 2 / 3])
        assert np.allclose(line.get_ydata(), 100 * np.mean(
            [r["curves"]["acc_mean"] for r in runs], axis=0))


def test_settings_other_than_the_clock():
    """An override that tells the runs of one cell apart is part of the setting; a setting that
    only follows the dataset (a model per dataset) is not, so datasets still pool."""
    def rec(dataset, rule, seed, acc, **cfg):
        return {"dataset": dataset, "process": "none", "rule": rule, "seed": seed,
                "metrics": {"acc_mean": acc}, "config": {"local_steps": 1, "model": "mlp",
                                                          **cfg}}

    recs = [rec("digits", rule, s, 0.5 + 0.1 * (rule == "sfg") + 0.01 * k, local_steps=k)
            for rule in ("dfedavg", "sfg") for s in (1, 2) for k in (1, 3)]
    assert sorted(set(setting_labels(recs))) == ["local_steps 1", "local_steps 3"]
    values = run_values(recs, "acc_mean")  # no duplicates: the setting tells them apart
    assert len(values) == 8
    with pytest.raises(SfgError, match="2 settings .*'local_steps 1'; 'local_steps 3'"):
        pair_values(values, rule="sfg", baseline="dfedavg")
    pd = pair_values(values, rule="sfg", baseline="dfedavg", setting="local_steps 3")
    assert pd.run_diffs == pytest.approx([0.1, 0.1]) and pd.setting == "local_steps 3"
    mixed = [rec(d, rule, 1, 0.5, model=m) for d, m in (("digits", "mlp"), ("cifar10", "cnn"))
             for rule in ("dfedavg", "sfg")]
    assert setting_labels(mixed) == [""] * 4
    clock = rec("digits", "sfg", 1, 0.5, clock="virtual", protocol="event",
                compute="lognormal:median=30,sigma=1")
    assert setting_labels([clock]) == ["event, compute lognormal:median=30,sigma=1"]
    # a setting a stored config leaves out at its default is labelled with the default
    peers = [rec("digits", "sfg", 1, 0.5), rec("digits", "sfg", 1, 0.6, peers="epidemic:s=7")]
    assert setting_labels(peers) == ["peers fixed", "peers epidemic:s=7"]


def test_malformed_clock_curves_are_one_line_errors():
    r = {"rule": "sfg", "seed": 1, "config": {"clock": "virtual"},
         "curves": {"hours": [0.5, 0.25], "acc_mean": [0.1, 0.2]}}
    with pytest.raises(SfgError, match="not strictly increasing"):
        hours_curve(r)
    with pytest.raises(SfgError, match="2 hours values but 1 acc_mean"):
        hours_curve({**r, "curves": {"hours": [0.5, 1.0], "acc_mean": [0.1]}})
    with pytest.raises(SfgError, match="without 'hours'"):
        hours_curve({**r, "curves": {"acc_mean": [0.1]}})
