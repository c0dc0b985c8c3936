"""`sfg report --across FIELD=A,B`: paired comparisons across one setting (docs/concepts/statistics.md#across-one-setting).

A tiny real grid on the virtual clock (digits, N = 10, 4 rounds, K = 1, two rules, three
seeds) runs with compute = const:value=30 and const:value=60 under two protocols (async with
jitter, event), plus one setting that has only the B value (unmatched on purpose). Checked
against the stored metrics by hand: B − A per (rule, protocol) is the mean over seeds of
acc(B) − acc(A) of the runs that differ only in compute (never across protocols), the time to
target over the pairs where both reached it; the unmatched setting is left out with a note; the
exact sign-flip p on a hand-made case; the note when 2^(1−U)·m ≥ 0.05; the error lines.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy import stats as sps

from sfg.errors import SfgError
from sfg.experiments.report.across import across_report, parse_across
from sfg.experiments.store import records as store_records

GRID = """\
name: tiny-across
base: {kind: train, dataset: digits, n_clients: 10, rounds: 4, local_steps: 1, eval_every: 2,
       clock: virtual, target_accuracy: 0.137}
rules: [dfedavg, sfg-cut]
seeds: [1, 2, 3]
overrides:
  - {protocol: async, jitter: 0.5, compute: "const:value=30"}
  - {protocol: async, jitter: 0.5, compute: "const:value=60"}
  - {protocol: event, compute: "const:value=30"}
  - {protocol: event, compute: "const:value=60"}
  - {protocol: async, jitter: 0.25, compute: "const:value=60"}
"""
A, B = "const:value=30", "const:value=60"
ACROSS = f"compute={A},{B}"
# (protocol, jitter) of each remaining setting with both values, and its label
SETTINGS = {("async", 0.5): "async, jitter 0.5, target_accuracy 0.137",
            ("event", 0.0): "event, target_accuracy 0.137"}
RULES = ("dfedavg", "sfg-cut")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    from sfg.cli.main import main

    tmp = tmp_path_factory.mktemp("across-report")
    (tmp / "g.yaml").write_text(GRID)
    store = tmp / "s.sqlite"
    assert main(["grid", "run", str(tmp / "g.yaml"), "--store", str(store), "--workers", "1",
                 "--no-progress"]) == 0
    return {"store": store, "records": store_records(store), "tmp": tmp}


def _run(grid, protocol: str, jitter: float, compute: str, rule: str, seed: int) -> dict:
    (r,) = [r for r in grid["records"] if r["config"]["protocol"] == protocol
            and r["config"]["jitter"] == jitter and r["config"]["compute"] == compute
            and r["rule"] == rule and r["seed"] == seed]
    return r


def _csv(path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_cli_writes_across_tables_matching_a_hand_computation(grid, capsys):
    from sfg.cli.main import main

    out = grid["tmp"] / "rep"
    assert main(["report", "--store", str(grid["store"]), "--out", str(out),
                 "--across", ACROSS]) == 0
    got = capsys.readouterr()
    printed = got.out
    assert "Across compute" in printed
    rows = _csv(out / "across.csv")
    acc = {(r["rule"], r["setting"]): r for r in rows if r["metric"] == "acc_mean"}
    # one comparison per rule and remaining setting with both values; the jitter-0.25
    # setting has only B runs and is not compared
    assert set(acc) == {(rule, s) for rule in RULES for s in SETTINGS.values()}
    for (protocol, jitter), setting in SETTINGS.items():
        for rule in RULES:
            diffs = [_run(grid, protocol, jitter, B, rule, s)["metrics"]["acc_mean"]
                     - _run(grid, protocol, jitter, A, rule, s)["metrics"]["acc_mean"]
                     for s in (1, 2, 3)]
            row = acc[(rule, setting)]
            assert row["baseline"] == f"compute={A}"
            assert int(row["runs"]) == 3 and int(row["units"]) == 3
            assert float(row["mean_gain"]) == pytest.approx(np.mean(diffs), abs=1e-12)
            half = sps.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / math.sqrt(3)
            assert float(row["ci_low"]) == pytest.approx(np.mean(diffs) - half, abs=1e-9)
            assert float(row["ci_high"]) == pytest.approx(np.mean(diffs) + half, abs=1e-9)
            # 3 seeds: the exact sign-flip p is a multiple of 1/8, 1/4 at the smallest
            same_sign = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
            if same_sign:
                assert float(row["p_perm"]) == pytest.approx(0.25)
            assert float(row["p_perm_holm"]) >= float(row["p_perm"])
    # time to target: over the pairs where both runs reached it
    tta = {(r["rule"], r["setting"]): r for r in rows if r["metric"] == "time_to_accuracy_h"}
    assert set(tta) == set(acc)
    for (protocol, jitter), setting in SETTINGS.items():
        for rule in RULES:
            pairs = [(_run(grid, protocol, jitter, B, rule, s)["metrics"]["time_to_accuracy_h"],
                      _run(grid, protocol, jitter, A, rule, s)["metrics"]["time_to_accuracy_h"])
                     for s in (1, 2, 3)]
            both = [b - a for b, a in pairs
                    if b is not None and a is not None and math.isfinite(b) and math.isfinite(a)
                    and b == b and a == a]
            row = tta[(rule, setting)]
            assert int(row["runs"]) == len(both)
            if both:
                assert float(row["mean_gain"]) == pytest.approx(np.mean(both), abs=1e-12)
    md = (out / "across.md").read_text()
    assert md.count("| dfedavg |") == 4 and md.count("| sfg-cut |") == 4
    assert "jitter 0.25" in md and "no partner" in md  # the unmatched setting, noted
    # 3 seeds, 4 comparisons per table: 2^(1−3)·4 = 1 ≥ 0.05, so a note says so
    assert "no comparison can be resolved" in printed
    # the ordinary report is written too, and the files are named once (one "wrote" line)
    wrote = [ln for ln in (got.out + got.err).splitlines() if "report.md" in ln]
    assert len(wrote) == 1 and wrote[0].startswith("wrote ") and "across.md" in wrote[0]


def test_pairs_differ_only_in_the_field(grid, tmp_path):
    rep = across_report(grid["records"], across=ACROSS, out_dir=tmp_path)
    for row in rep.rows:
        c = row.comparison
        protocol = "async" if c.setting.startswith("async") else "event"
        # an async difference computed by hand differs from the event one: mixing protocols
        # (or pairing across the unmatched jitter 0.25) would change it
        if c.metric == "acc_mean":
            jitter = 0.5 if protocol == "async" else 0.0
            by_hand = np.mean([_run(grid, protocol, jitter, B, c.rule, s)["metrics"]["acc_mean"]
                               - _run(grid, protocol, jitter, A, c.rule, s)["metrics"]["acc_mean"]
                               for s in (1, 2, 3)])
            assert c.mean_gain == pytest.approx(by_hand, abs=1e-12)
            assert c.dropped == 0
    # the other order gives the opposite differences
    rev = across_report(grid["records"], across=f"compute={B},{A}", out_dir=tmp_path)
    for x, y in zip(rep.rows, rev.rows, strict=True):
        assert x.comparison.mean_gain == pytest.approx(-y.comparison.mean_gain, abs=1e-12)


def _hand(diffs, field="local_steps"):
    """Round-based records: one dataset and process, seeds 1..U, rule dfedavg, A = 1, B = 3."""
    recs = []
    for seed, d in enumerate(diffs, start=1):
        for k, acc in ((1, 0.5), (3, 0.5 + d)):
            recs.append({"run_id": f"{seed}-{k}", "dataset": "d", "process": "none",
                         "rule": "dfedavg", "seed": seed, "config": {field: k, "rounds": 5},
                         "metrics": {"acc_mean": acc}})
    return recs


def test_exact_sign_flip_p_on_a_hand_made_case(tmp_path):
    # B − A = 0.1, 0.2, 0.3, −0.05: |Σ ±d| ≥ 0.55 only for (+,+,+,±) and (−,−,−,±): p = 4/16
    rep = across_report(_hand([0.1, 0.2, 0.3, -0.05]), across="local_steps=1,3",
                        out_dir=tmp_path)
    (row,) = rep.rows
    c = row.comparison
    assert (c.rule, c.units, c.runs) == ("dfedavg", 4, 4)
    assert c.mean_gain == pytest.approx(0.1375)
    assert c.p_perm == pytest.approx(0.25) and c.p_perm_holm == pytest.approx(0.25)
    assert c.permutation == "exact(16)"
    # U = 4: 2^(1−4) · 1 = 0.125 ≥ 0.05
    assert any("no comparison can be resolved" in n and "U = 4" in n for n in rep.notes)
    # U = 6, all positive: p = 2/64, resolvable with m = 1: no note
    rep = across_report(_hand([0.1, 0.2, 0.3, 0.05, 0.1, 0.2]), across="local_steps=1,3.0",
                        out_dir=tmp_path)
    assert rep.rows[0].comparison.p_perm == pytest.approx(2 / 64)
    assert not any("resolved" in n for n in rep.notes)


def test_bad_input_raises_one_line(tmp_path):
    recs = _hand([0.1, 0.2])
    for spec, match in (("local_steps", "not FIELD=A,B"),
                        ("nosuchfield=1,3", "unknown config field 'nosuchfield'"),
                        ("local_steps=1,7", "value '7' is not in the store"),
                        ("local_steps=1", "fewer than 2 values"),
                        ("local_steps=1,1", "both '1'"),
                        ("seed=1,2", "axis of the grid")):
        with pytest.raises(SfgError, match=match):
            across_report(recs, across=spec, out_dir=tmp_path)
    assert parse_across("on_return=none,pull:timeout=60") == ("on_return",
                                                             ["none", "pull:timeout=60"])


@pytest.mark.parametrize("spec, match", [
    ("compute", "not FIELD=A,B"),
    ("nosuchfield=a,b", "unknown config field"),
    (f"compute={A},const:value=45", "'const:value=45' is not in the store"),
    (f"compute={A}", "fewer than 2 values"),
])
def test_cli_bad_across_is_one_error_line(grid, tmp_path, capsys, spec, match):
    from sfg.cli.main import main

    code = main(["report", "--store", str(grid["store"]), "--out", str(tmp_path / "r"),
                 "--across", spec])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and match in err[0]
    assert "Traceback" not in err[0]
    assert not (tmp_path / "r" / "report.md").exists()
