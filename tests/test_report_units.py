"""Reports in the field's units: accuracies in %, gains in percentage points (tables and plots),
and every plot titled with what it shows and the dataset(s), process(es) and seeds it shows it
on (read back from the matplotlib figure as it is saved)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from rich.console import Console
from scipy import stats as sps

from sfg.experiments.report.paired import PLOT_FILES, build_report, print_report, table_columns
from sfg.util.units import context, percent, points, seeds_text

BASE = {1: 0.80, 2: 0.75, 3: 0.70}      # dfedavg's acc_mean per seed (both processes)
DIFF = {1: 0.02, 2: 0.03, 3: 0.04}      # sfg − dfedavg per seed: mean 0.03 = 3 points
PROCESSES = ("none", "bursty:u=0.8")


def records(*, metric_extra=None):
    out = []
    for process in PROCESSES:
        for rule in ("dfedavg", "sfg"):
            for seed, base in BASE.items():
                acc = base + (DIFF[seed] if rule == "sfg" else 0.0)
                m = {"acc_mean": acc, "acc_p10": acc - 0.1, "local_steps_rel": 1.0,
                     **{f"acc_q{q}": acc for q in range(1, 5)}, **(metric_extra or {})}
                out.append({"run_id": f"{process}-{rule}-{seed}", "dataset": "digits",
                            "process": process, "rule": rule, "seed": seed, "metrics": m,
                            "curves": {"round": [0, 10, 20], "acc_mean": [0.1, 0.5, acc]}})
    return out


@pytest.fixture
def titles(monkeypatch):
    """({file name: the figure's suptitle and axes titles}, {file name: its axis labels}) of
    each figure saved while the test runs, read from the figure itself as it is written."""
    seen: dict[str, str] = {}
    labels: dict[str, str] = {}
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):
        texts = [fig._suptitle.get_text()] if fig._suptitle is not None else []
        texts += [ax.get_title() for ax in fig.axes]
        seen[Path(fname).name] = "\n".join(t for t in texts if t)
        labels[Path(fname).name] = "\n".join(
            ax.get_xlabel() + "\n" + ax.get_ylabel() for ax in fig.axes)
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen, labels


def test_units_helpers():
    assert percent(0.86134) == "86.13" and percent(math.nan) == "—"
    assert points(0.0123) == "+1.23" and points(-0.2) == "-20.00"
    assert points(0.5, metric="messages") == "+0.5000"  # not an accuracy: its own unit
    assert seeds_text([3]) == "seed 3" and seeds_text(range(1, 6)) == "seeds 1–5"
    assert seeds_text([1, 2, 3, 7]) == "seeds 1–3, 7" and seeds_text([1, 2]) == "seeds 1, 2"
    assert (context(datasets=["digits"], processes=["none", "bursty:u=0.8", "none"],
                    seeds=[2, 1, 3]) == "dataset digits · processes none, bursty:u=0.8 · "
            "seeds 1–3")


def test_report_table_shows_a_known_gain_in_points(tmp_path):
    rep = build_report(records(), out_dir=tmp_path)
    (c,) = rep.comparisons
    diffs = np.array([DIFF[s] for s in (1, 2, 3)])
    half = float(sps.t.ppf(0.975, 2)) * diffs.std(ddof=1) / math.sqrt(3)
    # hand-computed: gain = 100 × 0.03 = 3.00 points, interval 100 × (0.03 ∓ half)
    text = f"+3.00 [{100 * (0.03 - half):+.2f}, {100 * (0.03 + half):+.2f}]"
    assert text == "+3.00 [+0.52, +5.48]"
    md = rep.markdown
    assert "| " + " | ".join(table_columns("acc_mean")) + " |" in md
    assert "gain (pp) [CI]" in md and "mean acc (%)" in md
    row = next(x for x in md.splitlines() if x.startswith("| sfg |"))
    # mean accuracy (0.75 + 0.03) in %, its p10, the gain and interval in points
    assert row.startswith(f"| sfg | 6 | 78.00 | 68.00 | {text} |")
    base = next(x for x in md.splitlines() if x.startswith("| dfedavg |"))
    assert base.startswith("| dfedavg | 6 | 75.00 | 65.00 | baseline |")
    # the quartile gains (sensitivity table) in points too
    sens = next(x for x in md.splitlines() if x.startswith("| sfg | 2/2 |"))
    assert sens.endswith("| +3.00 | +3.00 | +3.00 | +3.00 |")
    assert "dataset digits · processes none, bursty:u=0.8 · seeds 1–3" in md
    # terminal: same numbers
    console = Console(record=True, width=250)
    print_report(rep, console=console)
    out = console.export_text()
    assert "+3.00" in out and "[+0.52," in out and "78.00" in out and "gain (pp) [CI]" in out
    # the CSV keeps the raw fractions for scripts
    with (tmp_path / "comparisons.csv").open() as handle:
        (csv_row,) = list(csv.DictReader(handle))
    assert float(csv_row["mean_gain"]) == pytest.approx(0.03)
    assert float(csv_row["ci_low"]) == pytest.approx(0.03 - half)


def test_a_metric_that_is_not_an_accuracy_keeps_its_unit(tmp_path):
    recs = records()
    for r in recs:
        r["metrics"]["messages"] = 1000.0 + (5.0 if r["rule"] == "sfg" else 0.0)
    rep = build_report(recs, out_dir=tmp_path, metric="messages")
    md = rep.markdown
    assert "| gain [CI] |" in md and "gain (pp)" not in md
    row = next(x for x in md.splitlines() if x.startswith("| sfg |"))
    assert "+5.0000 [" in row and "| 78.00 |" in row  # accuracies stay in %


def _assert_names_the_data(text: str, *, dataset="digits", processes=PROCESSES,
                           seeds="seeds 1–3"):
    if dataset:
        assert dataset in text, text
    for p in processes:
        assert p in text, text
    assert seeds in text, text


def test_every_report_plot_is_titled_with_its_data_and_unit(tmp_path, titles):
    seen, labels = titles
    rep = build_report(records(), out_dir=tmp_path)
    assert set(PLOT_FILES) <= set(rep.files)
    for name in PLOT_FILES:
        _assert_names_the_data(seen[name])
    # the metric in every title; the unit on the gain axes
    for name in ("gains.png", "gains_by_process.png", "sensitivity.png"):
        assert "mean accuracy (acc_mean)" in seen[name] and "dfedavg" in seen[name]
    assert "acc_q1" in seen["gains_by_quartile.png"]
    assert "Mean accuracy (acc_mean) over rounds" in seen["accuracy_over_rounds.png"]
    for name in ("gains.png", "gains_by_process.png", "gains_by_quartile.png",
                 "sensitivity.png"):
        assert "(pp)" in labels[name], labels[name]
    assert "mean accuracy (%)" in labels["accuracy_over_rounds.png"]


def test_gain_plot_draws_points(tmp_path, monkeypatch):
    """The gains plot puts the known gain at 3.00 on its axis (points, not 0.03)."""
    drawn = {}
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):
        if Path(fname).name == "gains.png":
            (ax,) = fig.axes
            drawn["x"] = [line.get_xdata() for line in ax.get_lines() if len(line.get_xdata())]
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    build_report(records(), out_dir=tmp_path)
    assert any(np.allclose(x, [3.0]) for x in drawn["x"])


def test_attack_report_in_points_and_its_plot_titled(tmp_path, titles):
    from sfg.experiments.report.attacks import print_attack_rows, write_attack_report

    seen, labels = titles
    base = {1: 0.80, 2: 0.70, 3: 0.75}
    hit = {1: 0.60, 2: 0.55, 3: 0.45}

    def rec(seed, value, attack=None):
        cfg = {"kind": "train", **({"attack": attack} if attack else {})}
        return {"run_id": f"{seed}-{attack}", "dataset": "digits", "process": "bursty:u=0.8",
                "rule": "sfg", "seed": seed, "status": "done", "config": cfg,
                "metrics": {"acc_honest_mean": value, "acc_honest_p10": value / 2}}

    recs = ([rec(s, v) for s, v in base.items()]
            + [rec(s, v, "forge:claim=fresh,frac=0.1") for s, v in hit.items()])
    rows, files = write_attack_report(recs, tmp_path)
    md = (tmp_path / "attack.md").read_text()
    # hand-computed: Δ = mean(−0.20, −0.15, −0.30) = −0.21667 -> −21.67 points
    line = next(x for x in md.splitlines() if "| 0.1 | acc_honest_mean |" in x)
    assert "| 53.33 % | -21.67 [" in line
    assert "Δ vs no attack, pp [CI]" in md
    console = Console(record=True, width=200)
    print_attack_rows(rows, console=console)
    assert "-21.67 [" in console.export_text()
    # the CSV keeps fractions
    with (tmp_path / "attack.csv").open() as handle:
        r = next(x for x in csv.DictReader(handle)
                 if x["frac"] == "0.1" and x["metric"] == "acc_honest_mean")
    assert float(r["paired_diff"]) == pytest.approx(-0.65 / 3)
    _assert_names_the_data(seen["attack_damage.png"], processes=("bursty:u=0.8",))
    assert "acc_honest_mean" in seen["attack_damage.png"]
    assert "(pp)" in labels["attack_damage.png"]


def test_replay_plot_is_titled_with_processes_seeds_and_metrics(tmp_path, titles):
    from sfg.modelfree import plot_staleness, replay

    seen, _ = titles
    rows = replay(["bursty:u=0.8", "iid:u=0.5"], ["dfedavg", "sfg"], [1, 2, 3], n=12, T=15,
                  with_curves=True)
    plot_staleness(rows, tmp_path / "staleness.png")
    text = seen["staleness.png"]
    _assert_names_the_data(text, dataset=None, processes=("bursty:u=0.8", "iid:u=0.5"))
    assert "Model-free replay (no dataset)" in text and "mean age" in text
    assert "T = 15 rounds" in text


def test_trace_plots_are_titled_with_what_and_which_trace(tmp_path, titles):
    from sfg.world.traces.base import Trace
    from sfg.world.traces.plot import plot_trace

    seen, _ = titles
    rng = np.random.default_rng(0)
    avail = rng.random((48, 6)) < 0.5
    trace = Trace(available=avail, round_minutes=30.0, devices=[f"d{k}" for k in range(6)],
                  start=["2024-01-01T00:00"] * 6, day_offset_minutes=np.zeros(6),
                  meta={"source": "tabular", "path": "/data/fleet.csv"})
    paths = plot_trace(trace, tmp_path)
    what = {"availability_by_hour.png": "Mean availability by local hour",
            "outage_lengths.png": "Outage lengths",
            "device_availability.png": "Availability per device",
            "availability_raster.png": "Availability of each device by round"}
    assert sorted(p.name for p in paths) == sorted(what)
    for name, w in what.items():
        assert w in seen[name] and "tabular trace (fleet.csv)" in seen[name], seen[name]
        assert "6 devices, 48 rounds x 30 min" in seen[name]
