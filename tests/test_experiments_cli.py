"""`sfg grid run/status` (the experiments CLI): dry runs, runs, resume, status, errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sfg.cli.grid import app, main

GRID = """\
name: tiny
base: {kind: selftest, n_clients: 10, rounds: 10, eval_every: 5}
processes: ["none", "bursty:u=0.8"]
rules: [dfedavg, sfg]
seeds: [1, 2]
"""

runner = CliRunner()


def _grid(tmp_path, text=GRID, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_dry_run_then_run_then_resume(tmp_path):
    grid, store = _grid(tmp_path), str(tmp_path / "r.sqlite")
    res = runner.invoke(app, ["run", grid, "--store", store, "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"grid": "tiny", "runs": 8, "already_done": 0, "to_run": 8,
                                      "axes": {"processes": 2, "rules": 2, "seeds": 2},
                                      "kinds": ["selftest"]}
    assert not (tmp_path / "r.sqlite").exists()  # a dry run writes nothing

    res = runner.invoke(app, ["run", grid, "--store", store])  # with the progress bar
    assert res.exit_code == 0, res.output
    assert "8/8 done (0 were already done), 0 failed" in " ".join(res.output.split())

    res = runner.invoke(app, ["run", grid, "--store", store, "--json"])
    out = json.loads(res.output)
    assert res.exit_code == 0 and (out["already_done"], out["done"], out["total"]) == (8, 8, 8)

    res = runner.invoke(app, ["status", "--store", store, "--json"])
    status = json.loads(res.output)
    assert status["counts"] == {"queued": 0, "running": 0, "done": 8, "failed": 0}
    assert status["schema_version"] == 1 and status["failed"] == []
    res = runner.invoke(app, ["status", "--store", store])
    assert res.exit_code == 0
    assert "8 runs - 0 queued, 0 running, 8 done, 0 failed" in " ".join(res.output.split())


def test_failed_runs_exit_nonzero_and_show_in_status(tmp_path):
    # half the runs are real training runs whose data is missing on this "worker"
    missing = str(tmp_path / "no-cifar")
    grid = _grid(tmp_path, GRID + "overrides:\n  - {}\n  - {kind: train, dataset: cifar10, "
                                  f"model: cnn, data_root: {missing}}}\n")
    store = str(tmp_path / "f.sqlite")
    res = runner.invoke(app, ["run", grid, "--store", store, "--no-progress"])
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "8/16 done" in out and "8 failed" in out and "does not exist" in out
    status = json.loads(runner.invoke(app, ["status", "--store", store, "--json"]).output)
    assert status["counts"] == {"queued": 0, "running": 0, "done": 8, "failed": 8}
    assert all(f["error"].startswith("SfgError: CIFAR-10 data") for f in status["failed"])


def test_main_prints_one_line_errors(tmp_path, capsys):
    grid = _grid(tmp_path)
    cases = [
        (["run", str(tmp_path / "nope.yaml"), "--store", "x.sqlite"], "does not exist"),
        (["run", grid, "--store", str(tmp_path / "s.sqlite"), "--executor", "slurm"],
         "unknown executor 'slurm'"),
        (["status", "--store", str(tmp_path / "missing.sqlite")], "no results store at"),
        (["run", _grid(tmp_path, "base: {kind: selftest}\nrulez: [sfg]\n", "bad.yaml"), "--store",
          "x"], "bad.yaml:2: unknown grid key 'rulez'; did you mean 'rules'?"),
    ]
    for argv, words in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and err.count("\n") == 1
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    assert main(["status", "--store", str(text)]) == 2
    assert "not an SQLite database" in capsys.readouterr().err
    assert main(["run", "--help"]) == 0
