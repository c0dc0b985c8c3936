"""Defaults that work together: ``sfg run``/``replay``/``swarm`` with only ``-T`` (>= 1), the
seed or ``-n`` changed run; a run shorter than the evaluation period evaluates at its end; a
replay shorter than the default horizon uses what fits and says so; below the smallest N the
default graph (knn:k=6) allows, one error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sfg.cli.main import main

SMALLEST_N = 7  # knn:k=6 needs N > 6


def _json(out: str) -> dict:
    return json.loads(out)


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("T", [1, 2, 5])
def test_a_short_run_evaluates_at_its_end(T, capsys):
    pytest.importorskip("torch")
    assert main(["run", "-T", str(T), "--json"]) == 0
    got = capsys.readouterr()
    out = _json(got.out)
    assert out["config"]["eval_every"] == T
    assert out["curves"]["round"] == [float(T)]  # one evaluation, at the end
    assert 0.0 < out["metrics"]["acc_mean"] <= 1.0
    assert "Traceback" not in got.err


def test_run_with_another_seed_runs(capsys):
    pytest.importorskip("torch")
    assert main(["run", "-T", "2", "--seed", "7", "--json"]) == 0
    assert _json(capsys.readouterr().out)["config"]["seed"] == 7


@pytest.mark.parametrize("command", ["run", "replay"])
def test_below_the_smallest_n_is_one_error_line(command, capsys):
    assert main([command, "-n", str(SMALLEST_N - 1)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"N={SMALLEST_N - 1}" in line and "raise N" in line


def test_run_at_the_smallest_n(capsys):
    pytest.importorskip("torch")
    assert main(["run", "-n", str(SMALLEST_N), "--json"]) == 0
    out = _json(capsys.readouterr().out)
    assert out["config"]["n_clients"] == SMALLEST_N and out["config"]["rounds"] == 300


def test_run_on_a_thousand_clients(capsys):
    """1,000 clients on digits' 1,258 training examples: no Dirichlet draw gives every
    client one, so the best draw is repaired (it was an error)."""
    pytest.importorskip("torch")
    assert main(["run", "-n", "1000", "-T", "2", "--json"]) == 0
    out = _json(capsys.readouterr().out)
    assert out["config"]["n_clients"] == 1000 and out["curves"]["round"] == [2.0]


@pytest.mark.parametrize("T", [1, 2, 5])
def test_a_short_replay_uses_the_horizon_that_fits_and_says_so(T, capsys):
    assert main(["replay", "-T", str(T), "--seeds", "1", "-r", "sfg", "--json"]) == 0
    got = capsys.readouterr()
    assert got.err.splitlines() == [
        f"note: T={T} is shorter than the default horizon 50; the self-return H is over "
        f"h={T} rounds (set --horizon to choose, 0 to skip)"]
    rows = _json(got.out)["rows"]
    assert rows and all(r["H"] is not None and r["H"] == r["H"] for r in rows)  # measured


def test_a_replay_as_long_as_the_horizon_says_nothing(capsys):
    assert main(["replay", "-T", "50", "--seeds", "1", "-r", "sfg", "--json"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("n", [SMALLEST_N, 1000])
def test_replay_from_the_smallest_n_to_a_thousand(n, capsys):
    assert main(["replay", "-n", str(n), "--seeds", "1", "-r", "sfg", "--json"]) == 0
    rows = _json(capsys.readouterr().out)["rows"]
    assert len(rows) == 1 and rows[0]["H"] is not None


def _swarm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sfg", "swarm", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("args, nodes", [(["-T", "1"], 100), (["-n", "64", "-T", "1"], 64),
                                         (["-n", str(SMALLEST_N), "-T", "20"], SMALLEST_N)])
def test_swarm_short_and_from_the_smallest_n_to_64(args, nodes):
    pytest.importorskip("torch")
    pytest.importorskip("grpc")
    res = _swarm(*args, "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = _json(res.stdout)
    assert len(out["nodes"]) == nodes


def test_swarm_below_the_smallest_n_is_one_error_line():
    res = _swarm("-n", str(SMALLEST_N - 1))
    assert res.returncode == 2
    assert f"N={SMALLEST_N - 1}" in _error_line(res.stderr)


def test_a_short_replay_with_bad_input_is_only_the_error_line(capsys):
    """The horizon's note comes after the replay has run: bad input stays one line."""
    assert main(["replay", "-T", "5", "--seeds", "1", "-r", "sfg-cutt"]) == 2
    assert "did you mean 'sfg-cut'" in _error_line(capsys.readouterr().err)
