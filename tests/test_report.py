"""Tests for sfg.experiments.report.paired: tables, comparisons CSV and PNG plots on tiny record sets."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from rich.console import Console

from sfg.errors import SfgError
from sfg.experiments.report.paired import PLOT_FILES, TABLE_COLUMNS, build_report, print_report
from sfg.experiments.stats import CSV_COLUMNS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROCESSES = ("iid:u=0.5", "bursty:u=0.8")


def tiny_records(*, rules=("dfedavg", "sfg-cut"), seeds=(1, 2, 3), processes=PROCESSES,
                 datasets=("digits",), curves=True, quartiles=True):
    """1 dataset × 2 processes × 2 rules × 3 seeds; sfg-cut is 0.02 + 0.01·seed better."""
    out = []
    for dataset in datasets:
        for process in processes:
            for rule in rules:
                for seed in seeds:
                    gain = 0.0 if rule == "dfedavg" else 0.02 + 0.01 * seed
                    acc = 0.70 + gain
                    metrics = {"acc_mean": acc, "acc_p10": acc - 0.2, "acc_time_avg": acc - 0.1,
                               "local_steps_rel": 1.0 if rule == "dfedavg" else 1.2,
                               "messages": 1000, "scalars": 50}
                    if quartiles:
                        metrics |= {f"acc_q{q}": acc - 0.05 * (4 - q) + gain * (4 - q)
                                    for q in range(1, 5)}
                    r = {"run_id": f"{dataset}{process}{rule}{seed}", "dataset": dataset,
                         "process": process, "rule": rule, "seed": seed, "metrics": metrics}
                    if curves:
                        rounds = list(range(0, 50, 10))
                        r["curves"] = {"round": rounds,
                                       "acc_mean": [acc * (k + 1) / 5 for k in range(5)]}
                    out.append(r)
    return out


def assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_SIGNATURE
    with Image.open(io.BytesIO(data)) as img:
        img.verify()
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100


@pytest.fixture
def figures(monkeypatch):
    """What each figure shows, read from the figure itself as it is written (the real
    ``savefig`` still writes the file): {file name: {"title": suptitle, "axes": [{"title",
    "xlabel", "ylabel", "xticks", "yticks", "series": {label: (x, y)}}]}}."""
    seen: dict[str, dict] = {}
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):
        axes = []
        for ax in fig.axes:
            axes.append({
                "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                "xticks": [t.get_text() for t in ax.get_xticklabels()],
                "yticks": [t.get_text() for t in ax.get_yticklabels()],
                "lines": [(ln.get_label(), np.asarray(ln.get_xdata(), float),
                           np.asarray(ln.get_ydata(), float)) for ln in ax.get_lines()]})
        seen[Path(fname).name] = {
            "title": fig._suptitle.get_text() if fig._suptitle is not None else "",
            "axes": axes}
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def test_report_on_tiny_record_set_writes_every_file(tmp_path, figures):
    rep = build_report(tiny_records(), out_dir=tmp_path / "rep")
    for name in PLOT_FILES:
        assert name in rep.files
        assert_png(tmp_path / "rep" / name)
    # what the figures show: sfg-cut's known gain of 4 pp (0.02 + 0.01·seed, mean over seeds
    # 1-3) and its interval; per process; per quartile; the curves of both rules
    c = rep.rows[1].comparison
    (gains,) = figures["gains.png"]["axes"]
    assert gains["yticks"] == ["sfg-cut (unresolved)"] and "(pp)" in gains["xlabel"]
    pts = [ln[1][0] for ln in gains["lines"] if len(ln[1]) == 1]
    assert pts == pytest.approx([4.0, 100 * c.ci_low, 100 * c.ci_high])
    (proc,) = figures["gains_by_process.png"]["axes"]
    assert proc["xticks"] == ["bursty:u=0.8", "iid:u=0.5"]
    assert proc["lines"][0][2] == pytest.approx([4.0, 4.0])  # the gain in each process
    (quart,) = figures["gains_by_quartile.png"]["axes"]
    assert quart["lines"][0][2] == pytest.approx([16.0, 12.0, 8.0, 4.0])  # gain·(4 − q) + gain
    sens = figures["sensitivity.png"]["axes"][0]
    assert dict((ln[0], ln[1][0]) for ln in sens["lines"][:3])["all processes"] == \
        pytest.approx(4.0)
    curves = figures["accuracy_over_rounds.png"]
    assert "Mean accuracy (acc_mean) over rounds" in curves["title"]
    assert [ax["title"] for ax in curves["axes"]] == ["digits · bursty:u=0.8",
                                                       "digits · iid:u=0.5"]
    for ax in curves["axes"]:
        assert ax["ylabel"] == "mean accuracy (%)" and ax["xlabel"] == "round"
        series = {label: (x, y) for label, x, y in ax["lines"]}
        assert set(series) == {"dfedavg (n=3)", "sfg-cut (n=3)"}
        for label, final in (("dfedavg (n=3)", 70.0), ("sfg-cut (n=3)", 74.0)):
            x, y = series[label]
            assert x.tolist() == [0, 10, 20, 30, 40]
            assert y == pytest.approx([final * (k + 1) / 5 for k in range(5)])
    assert rep.notes == []
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md == rep.markdown
    assert "| " + " | ".join(TABLE_COLUMNS) + " |" in md
    for name in PLOT_FILES:
        assert f"![{name}]({name})" in md
    # table rows: baseline first, then the rule with its comparison
    assert [r.rule for r in rep.rows] == ["dfedavg", "sfg-cut"]
    base, rule = rep.rows
    assert base.comparison is None and base.runs == 6
    assert base.acc_mean == pytest.approx(0.70) and base.acc_p10 == pytest.approx(0.50)
    assert rule.acc_mean == pytest.approx(0.74) and rule.local_steps_rel == pytest.approx(1.2)
    c = rule.comparison
    # units = seeds; unit gains 0.03, 0.04, 0.05 -> mean 0.04; 3 exact patterns... 2^3 = 8
    assert c.mean_gain == pytest.approx(0.04) and c.units == 3 and c.df == 2
    assert (c.wins, c.runs, c.positive_cells, c.cells) == (6, 6, 2, 2)
    assert c.p_perm == pytest.approx(2 / 8)
    assert c.verdict == "unresolved"  # interval excludes 0, 3 units cannot reach p < 0.05
    row_line = next(line for line in md.splitlines() if line.startswith("| sfg-cut |"))
    assert "6/6" in row_line and "2/2" in row_line and "unresolved" in row_line
    assert "+4.00 [" in row_line and "1.200" in row_line  # gain in percentage points


def test_comparisons_csv_from_report(tmp_path):
    recs = tiny_records(rules=("dfedavg", "sfg-cut", "aoi"))
    rep = build_report(recs, out_dir=tmp_path)
    with (tmp_path / "comparisons.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(rep.comparisons) == 2
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert {r["rule"] for r in rows} == {"sfg-cut", "aoi"}
    assert all(r["baseline"] == "dfedavg" and r["metric"] == "acc_mean" for r in rows)


def test_report_with_only_the_baseline(tmp_path, figures):
    recs = tiny_records(rules=("dfedavg",))
    rep = build_report(recs, out_dir=tmp_path)
    assert rep.comparisons == [] and [r.rule for r in rep.rows] == ["dfedavg"]
    md = (tmp_path / "report.md").read_text()
    assert "| dfedavg | 6 | 70.00 | 50.00 | baseline |" in md  # accuracies in %
    assert "only the baseline" in md
    with (tmp_path / "comparisons.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows == [list(CSV_COLUMNS)]
    assert not (tmp_path / "gains.png").exists()
    assert_png(tmp_path / "accuracy_over_rounds.png")
    assert set(figures) == {"accuracy_over_rounds.png"}
    for ax in figures["accuracy_over_rounds.png"]["axes"]:
        assert [ln[0] for ln in ax["lines"]] == ["dfedavg (n=3)"]
        assert ax["lines"][0][2][-1] == pytest.approx(70.0)


def test_report_without_curves_or_quartiles_skips_those_plots_with_notes(tmp_path):
    recs = tiny_records(curves=False, quartiles=False, processes=("none",), seeds=(1, 2))
    rep = build_report(recs, out_dir=tmp_path)
    assert_png(tmp_path / "gains.png")
    assert_png(tmp_path / "gains_by_process.png")
    assert not (tmp_path / "accuracy_over_rounds.png").exists()
    assert not (tmp_path / "gains_by_quartile.png").exists()
    assert any("no run has curves" in n for n in rep.notes)
    assert any("acc_q1" in n for n in rep.notes)
    assert all(n in rep.markdown for n in rep.notes)


def test_report_two_datasets_and_undefined_interval(tmp_path):
    recs = tiny_records(datasets=("digits", "cifar10"), seeds=(1,))
    rep = build_report(recs, out_dir=tmp_path)
    (c,) = rep.comparisons
    assert c.units == 2 and c.df == 0 and c.verdict == "unresolved"
    assert "[undefined, df=0]" in rep.markdown
    for name in PLOT_FILES:
        assert_png(tmp_path / name)


def test_print_report_renders_table():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rep = build_report(tiny_records(), out_dir=tmp)
    console = Console(record=True, width=250)
    print_report(rep, console=console)
    text = console.export_text()
    assert "sfg-cut" in text and "dfedavg" in text and "unresolved" in text
    assert "6/6" in text and "74.00" in text and "+4.00" in text and "gain (pp)" in text


def test_report_bad_input(tmp_path):
    recs = tiny_records()
    with pytest.raises(SfgError, match="no run records"):
        build_report([], out_dir=tmp_path)
    bad = [dict(r) for r in recs]
    bad[0]["curves"] = {"round": [0, 10], "acc_mean": [0.1]}
    with pytest.raises(SfgError, match="2 rounds but 1 acc_mean"):
        build_report(bad, out_dir=tmp_path)
    with pytest.raises(SfgError, match="baseline 'fedavg' has no runs"):
        build_report(recs, baseline="fedavg", out_dir=tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SfgError, match="cannot create report folder"):
        build_report(recs, out_dir=blocker / "sub")


def test_report_with_an_unpaired_rule_renders(tmp_path):
    recs = tiny_records()
    recs += [{**r, "rule": "lonely", "dataset": "other", "run_id": r["run_id"] + "x"}
             for r in tiny_records(rules=("sfg",))]
    rep = build_report(recs, out_dir=tmp_path)
    lonely = next(c for c in rep.comparisons if c.rule == "lonely")
    assert lonely.dropped == 12 and lonely.verdict == "unresolved"  # its 6 + 6 baseline
    assert "— (no paired runs)" in rep.markdown
    for name in PLOT_FILES:
        assert_png(tmp_path / name)


def test_report_selects_a_grid_and_names_what_a_mixed_store_holds(tmp_path):
    """Two grids in one store — training and replay — cannot be compared: without --grid one
    error line names both with their kinds and sizes; --grid picks one; an unknown grid is
    one line naming what the store holds."""
    import sfg
    from sfg.cli.main import main

    store = tmp_path / "mixed.sqlite"
    base = {"n_clients": 8, "rounds": 3, "graph": "ring:k=1", "process": "iid:u=0.5"}
    sfg.grid({"name": "train-demo", "base": {**base, "local_steps": 1, "batch_size": 8},
              "rules": ["dfedavg", "sfg-cut"], "seeds": [1, 2]}, store=store)
    sfg.grid({"name": "replay-demo", "base": {"kind": "replay", **base, "horizon": 2},
              "rules": ["dfedavg", "sfg-cut"], "seeds": [1, 2, 3]}, store=store)
    err = _report_error(main, ["report", "--store", str(store), "--out", str(tmp_path / "r")])
    assert "several kinds (replay, train)" in err and "--grid NAME" in err
    assert "replay-demo (replay, 6 runs)" in err and "train-demo (train, 4 runs)" in err
    err = _report_error(main, ["report", "--store", str(store), "--grid", "nope"])
    assert err.startswith("error: no finished run of grid 'nope'") and "train-demo" in err
    out = tmp_path / "train"
    assert main(["report", "--store", str(store), "--grid", "train-demo", "--out", str(out)]) == 0
    assert (out / "report.md").exists()


def _report_error(main, argv):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        assert main(argv) == 2
    lines = buf.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
