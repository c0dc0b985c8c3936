"""`sfg traces stats|plot` (the Typer app the top-level CLI mounts as `sfg traces`)."""

from __future__ import annotations

import json

import pytest
import shared_data
from test_traces_flash import small_flash
from typer.testing import CliRunner

from sfg.cli.traces import app
from sfg.errors import SfgError

FLASH = str(shared_data.FLASH)
runner = CliRunner()


@shared_data.needs(shared_data.FLASH)
def test_stats_json():
    r = runner.invoke(app, ["stats", "--source", "flash", "--path", FLASH, "--availability", "relaxed",
                            "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["devices"] == 47 and s["rule"] == "relaxed" and s["devices_total"] == 100
    assert 0 < s["mean_availability"] < 1


@shared_data.needs(shared_data.STUNNER_100)
def test_stats_table_stunner():
    path = str(shared_data.STUNNER_100)
    r = runner.invoke(app, ["stats", "--source", "stunner", "--path", path, "--variant", "10min"])
    assert r.exit_code == 0, r.output
    assert "mean_availability" in r.output and "outage_longest_rounds" in r.output


@shared_data.needs(shared_data.FLASH)
def test_plot(tmp_path):
    r = runner.invoke(app, ["plot", "--source", "flash", "--path", FLASH, "--out",
                            str(tmp_path)])
    assert r.exit_code == 0, r.output
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 4 and all(p.stat().st_size > 0 for p in pngs)
    assert str(pngs[0]) in r.output


def test_tabular_source(tmp_path):
    p = tmp_path / "f.csv"
    p.write_text("device,round,available\na,0,1\na,1,0\nb,1,1\n")
    r = runner.invoke(app, ["stats", "--source", "tabular", "--path", str(p), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["devices"] == 2 and s["mean_availability"] == 0.5


@pytest.mark.parametrize("args,match", [
    (["stats", "--source", "flsh", "--path", "<flash>"], "did you mean 'flash'"),
    (["stats", "--source", "flash", "--path", "nope.json"], "not found"),
    (["stats", "--source", "flash", "--path", "<flash>", "--rule", "loose"], "unknown FLASH rule"),
])
def test_bad_input_raises_sfgerror(args, match, tmp_path):
    flash = str(small_flash(tmp_path))  # a FLASH file of the test's own
    r = runner.invoke(app, [flash if a == "<flash>" else a for a in args])
    assert r.exit_code != 0
    assert isinstance(r.exception, SfgError)
    assert match in str(r.exception)
