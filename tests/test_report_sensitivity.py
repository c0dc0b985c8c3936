"""Design sensitivity, share of the outage gap closed and quartile gains (docs/concepts/statistics.md#report-additions),
on a small synthetic record set whose figures are computed by hand below."""

from __future__ import annotations

import csv
import json

import pytest

from sfg.experiments.report.paired import SENSITIVITY_COLUMNS, build_report
from sfg.experiments.stats import compare

# DFedAvg accuracy per process and seed; the outage gap is none − process:
#   iid 0.10, bursty 0.30, heterogeneous 0.20 (both seeds)
BASE = {"none": (0.90, 0.80), "iid:u=0.5": (0.80, 0.70), "bursty:u=0.8": (0.60, 0.50),
        "heterogeneous:u=0.8": (0.70, 0.60)}
# sfg − dfedavg per process and seed
GAIN = {"none": (0.0, 0.0), "iid:u=0.5": (-0.02, -0.04), "bursty:u=0.8": (0.15, 0.09),
        "heterogeneous:u=0.8": (0.04, 0.02)}


def records(with_none: bool = True, quartiles: bool = True):
    out = []
    for process, accs in BASE.items():
        if process == "none" and not with_none:
            continue
        for k, seed in enumerate((1, 2)):
            for rule in ("dfedavg", "sfg"):
                acc = accs[k] + (GAIN[process][k] if rule == "sfg" else 0.0)
                m = {"acc_mean": acc, "acc_p10": acc - 0.1, "local_steps_rel": 1.0}
                if quartiles:  # sfg gains 0.03 + 0.01·q in quartile q
                    m |= {f"acc_q{q}": acc + (0.03 + 0.01 * q if rule == "sfg" else 0.0)
                          for q in range(1, 5)}
                out.append({"run_id": f"{process}{seed}{rule}", "dataset": "digits",
                            "process": process, "rule": rule, "seed": seed, "metrics": m})
    return out


def test_hand_computed_sensitivity_gap_and_quartiles():
    (c,) = compare(records(), rules=["sfg"])
    # unit means over 4 processes: seed 1 (0 − .02 + .15 + .04)/4, seed 2 (0 − .04 + .09 + .02)/4
    assert c.mean_gain == pytest.approx((0.17 / 4 + 0.07 / 4) / 2)
    # per-process means: none 0, iid −0.03, bursty +0.12, heterogeneous +0.03
    assert (c.positive_processes, c.processes) == (2, 4)
    # leave out none 0.04, iid 0.05, bursty 0.0, heterogeneous 0.03
    assert c.loo_min == pytest.approx(0.0, abs=1e-12) and c.loo_max == pytest.approx(0.05)
    # without iid: units 0.19/3 and 0.11/3 -> 0.05; exact sign flip over 2 units: p = 2/4
    assert c.mean_no_iid == pytest.approx(0.05) and c.p_no_iid == pytest.approx(0.5)
    # gap closed: pooled gain without none 0.04 over pooled gap 0.2
    assert c.gap_closed == pytest.approx(0.2)
    shares = json.loads(c.gap_closed_by_process)
    assert set(shares) == {"iid:u=0.5", "bursty:u=0.8", "heterogeneous:u=0.8"}
    assert shares["iid:u=0.5"] == pytest.approx(-0.3)
    assert shares["bursty:u=0.8"] == pytest.approx(0.4)
    assert shares["heterogeneous:u=0.8"] == pytest.approx(0.15)
    # quartile q: the overall gain of the run (mean 0.03) plus 0.03 + 0.01·q
    assert [c.gain_q1, c.gain_q2, c.gain_q3, c.gain_q4] == pytest.approx([.07, .08, .09, .10])


def test_without_a_none_process_or_quartiles_the_figures_are_undefined():
    (c,) = compare(records(with_none=False, quartiles=False), rules=["sfg"])
    assert c.gap_closed != c.gap_closed and json.loads(c.gap_closed_by_process) == {}
    assert c.gain_q1 != c.gain_q1
    assert (c.positive_processes, c.processes) == (2, 3)
    # leave out iid: (.095 + .055)/2 = .075; bursty: (.01 − .01)/2 = 0; heterogeneous .045
    assert c.loo_min == pytest.approx(0.0, abs=1e-12) and c.loo_max == pytest.approx(0.075)


def test_report_writes_the_columns_table_and_plot(tmp_path):
    rep = build_report(records(), out_dir=tmp_path)
    with (tmp_path / "comparisons.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["gap_closed"]) == pytest.approx(0.2)
    assert float(row["loo_max"]) == pytest.approx(0.05)
    assert json.loads(row["gap_closed_by_process"])["bursty:u=0.8"] == pytest.approx(0.4)
    md = rep.markdown
    assert "| " + " | ".join(SENSITIVITY_COLUMNS) + " |" in md
    line = next(x for x in md.splitlines() if x.startswith("| sfg | 2/4 |"))
    # gains in percentage points: 0.05 -> +5.00
    assert "[+0.00, +5.00]" in line and "+5.00 (0.5)" in line and "| 20 % |" in line
    assert "bursty:u=0.8: 40 %" in line and "iid:u=0.5: -30 %" in line
    assert "+7.00 | +8.00 | +9.00 | +10.00" in line
    png = (tmp_path / "sensitivity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
