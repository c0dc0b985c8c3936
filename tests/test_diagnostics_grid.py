"""Diagnostics through a grid: the real SQLite store keeps them per run, `sfg report` exports
pooled CSV tables and PNG plots (docs/concepts/diagnostics.md#training-diagnostics)."""

from __future__ import annotations

import csv
import sqlite3

import numpy as np
import pytest
from typer.testing import CliRunner

from sfg.cli.main import app
from sfg.experiments.executors import run_grid
from sfg.experiments.grid import load_grid
from sfg.experiments.report.diagnostics import FILES
from sfg.experiments.store import Store
from sfg.sim.diagnostics import binned_means

GRID = """\
name: diag
base: {kind: train, dataset: digits, model: mlp, n_clients: 12, rounds: 12, local_steps: 2,
       batch_size: 8, eval_every: 6, graph: "knn:k=4", backend: batched,
       diagnostics: "raw,lag,finetune,returning"}
processes: ["bursty:u=0.8"]
rules: [dfedavg, sfg]
seeds: [1, 2]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("diag")
    (tmp / "g.yaml").write_text(GRID)
    grid = load_grid(tmp / "g.yaml")
    summary = run_grid(list(grid), tmp / "s.sqlite", workers=1)
    assert summary.failed == 0
    return tmp / "s.sqlite"


def test_store_keeps_diagnostics_per_run(store):
    with Store(store, create=False) as s:
        recs = s.records()
    assert len(recs) == 4 and all("diagnostics" in r for r in recs)
    assert all(r["diagnostics"]["returning"]["returns"] > 0 for r in recs)
    con = sqlite3.connect(store)
    assert con.execute("SELECT COUNT(*) FROM diagnostics").fetchone() == (4,)
    con.close()


def test_report_exports_pooled_tables_and_plots(store, tmp_path):
    res = CliRunner().invoke(app, ["report", "--store", str(store), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for name in FILES:
        data = (tmp_path / "diagnostics" / name).read_bytes()
        assert len(data) > 50, name
        if name.endswith(".png"):
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "## Training diagnostics" in md and "![diagnostics/lag_law.png]" in md
    # the table pools the two seeds: counts add up and the mean is sum / count
    with Store(store, create=False) as s:
        recs = [r for r in s.records() if r["rule"] == "sfg"]
    sums = np.zeros(64)
    counts = np.zeros(64)
    for r in recs:
        blk = r["diagnostics"]["returning"]["loss_agg"]
        sums[:len(blk["sum"])] += blk["sum"]
        counts[:len(blk["count"])] += blk["count"]
    with (tmp_path / "diagnostics" / "returning.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["rule"] == "sfg"]
    assert rows and all(row["runs"] == "2" for row in rows)
    for row in rows:
        d = int(row["outage_length"])
        if counts[d]:
            assert float(row["loss_agg"]) == pytest.approx(sums[d] / counts[d])
    with (tmp_path / "diagnostics" / "lag_rates.csv").open() as handle:
        rates = list(csv.DictReader(handle))
    assert {r["rule"] for r in rates} == {"dfedavg", "sfg"}
    # binned_means on the pooled block is what the CSV holds
    assert binned_means({"x": {"sum": [0, 2.0], "count": [0, 2]}}, "x")[1].tolist() == [1.0]


def test_diagnostics_plots_are_titled_with_what_and_the_data(store, tmp_path, monkeypatch):
    """Each diagnostics figure names what it shows and the dataset, process and seeds it pools
    (read from the figure as it is saved)."""
    from pathlib import Path

    from matplotlib.figure import Figure

    from sfg.experiments.report.diagnostics import write_diagnostics

    seen = {}
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):
        seen[Path(fname).name] = (fig._suptitle.get_text() if fig._suptitle else "") + "\n" \
            + "\n".join(ax.get_title() for ax in fig.axes)
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    with Store(store, create=False) as s:
        recs = s.records()
    files = write_diagnostics(recs, tmp_path)
    what = {"raw_law.png": "Raw staleness law", "lag_law.png": "Lag law",
            "finetune.png": "Fine-tuned geometry", "returning.png": "Returning clients"}
    assert set(what) <= set(files)
    for name, w in what.items():
        text = seen[name]
        assert w in text and "pooled over seeds" in text, text
        assert "dataset digits · process bursty:u=0.8 · seeds 1, 2" in text, text
