"""Defaults that work together: ``sfg run``/``replay``/``swarm`` with only ``-T`` (>= 1), the
seed or ``-n`` changed run; a run shorter than the evaluation period evaluates at its end; a
replay shorter than the default horizon uses what fits and says so; below the smallest N the
default graph (knn:k=6) allows, the graph's k becomes N − 1 with one note, and an outage target
that N × T cannot resolve takes the nearest value a trace can have, with one note."""

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


def _notes(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("note: ")]


@pytest.mark.parametrize("command", ["run", "replay"])
def test_below_the_smallest_n_runs_on_k_n_minus_1_with_one_note(command, capsys):
    n = SMALLEST_N - 3
    args = [command, "-n", str(n), "-T", "4", "-p", "iid:u=0.5", "--json"]
    assert main([*args, *(["--seeds", "1"] if command == "replay" else [])]) == 0
    got = capsys.readouterr()
    notes = [ln for ln in _notes(got.err) if "graph" in ln]
    assert notes == [f"note: graph knn:k=6: k must be below the N={n} clients; using --graph "
                     f"knn:k={n - 1}"], got.err
    if command == "run":  # the value used is the stored one
        assert _json(got.out)["config"]["graph"] == f"knn:k={n - 1}"


def test_two_clients_one_round_run_and_say_what_they_used(capsys):
    """N = 2, T = 1 under the defaults: knn:k=1, and bursty u=0.8 at the nearest unavailability
    a 1 × 2 trace can have (1.0: 0.5 is further from 0.8)."""
    pytest.importorskip("torch")
    assert main(["run", "-n", "2", "-T", "1", "--json"]) == 0
    got = capsys.readouterr()
    out = _json(got.out)
    assert out["config"]["graph"] == "knn:k=1"
    assert out["metrics"]["unavailability"] == 1.0
    notes = _notes(got.err)
    assert len(notes) == 2 and "nearest achievable, 1.0000" in notes[1], got.err


def test_an_unresolvable_outage_target_takes_the_nearest_achievable_value():
    """u = 0.8 on T × N = 3 × 8 = 24 cells: no trace lies within ±0.005 (the nearest are 19/24
    and 20/24); the trace used has 19/24 = 0.7917 with one notice; where a trace within the
    tolerance exists none is given."""
    import warnings

    from sfg.errors import SfgNotice
    from sfg.world.outages import make_process

    with pytest.warns(SfgNotice, match=r"nearest achievable, 0\.7917"):
        A = make_process("bursty:u=0.8").sample(3, 8, seed=1)
    assert 1 - A.mean() == pytest.approx(19 / 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SfgNotice)
        A = make_process("bursty:u=0.8").sample(10, 20, seed=1)  # 200 cells: 160/200 exists
    assert abs(1 - A.mean() - 0.8) <= 0.005 + 1e-9


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


def test_swarm_below_the_smallest_n_runs_with_one_note():
    pytest.importorskip("torch")
    pytest.importorskip("grpc")
    res = _swarm("-n", "3", "-T", "2", "-p", "iid:u=0.5", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(_json(res.stdout)["nodes"]) == 3
    assert _notes(res.stderr) == ["note: graph knn:k=6: k must be below the N=3 clients; "
                                  "using --graph knn:k=2"], res.stderr


def test_a_short_replay_with_bad_input_is_only_the_error_line(capsys):
    """The horizon's note comes after the replay has run: bad input stays one line."""
    assert main(["replay", "-T", "5", "--seeds", "1", "-r", "sfg-cutt"]) == 2
    assert "did you mean 'sfg-cut'" in _error_line(capsys.readouterr().err)
