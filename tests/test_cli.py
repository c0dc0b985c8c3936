"""The `sfg` command: JSON output, tables, one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sfg.cli.main import main
from sfg.cli.replay import parse_seeds
from sfg.errors import SfgError


def sfg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sfg.cli.main", *args], capture_output=True,
                          text=True, timeout=300)


def test_replay_json(capsys):
    rc = main(["replay", "--process", "iid:u=0.6", "--process", "bursty:u=0.8", "--rule",
               "dfedavg", "--rule", "sfg-cut", "--seeds", "1,2", "-n", "30", "-T", "40",
               "--horizon", "50", "--json"])  # h > T: H is undefined: null, not NaN
    assert rc == 0
    text = capsys.readouterr().out
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    assert len(data["rows"]) == 8 and len(data["summary"]) == 4
    row = data["summary"][0]
    for key in ("unavailability", "returning_aggregations", "premise", "spread_age",
                "spread_lag", "kept",
                "self_weight_return", "H"):
        assert key in row
    assert row["H"] is None


def test_replay_table_and_rules_listing():
    res = sfg("replay", "-p", "iid:u=0.5", "-r", "sfg", "--seeds", "1", "-n", "20", "-T", "30")
    assert res.returncode == 0 and "sfg" in res.stdout and "unavail" in res.stdout
    res = sfg("rules")
    assert res.returncode == 0 and "sfg-cut" in res.stdout and "model-memory" in res.stdout


@pytest.mark.parametrize("args, fragment", [
    (["replay", "--rule", "sfg-cutt"], "did you mean 'sfg-cut'"),
    (["replay", "--process", "bursty:u=1.5"], "target unavailability u=1.5 must lie in [0, 1)"),
    (["replay", "--seeds", "a,b"], "seeds"),
    (["replay", "--clients", "1"], "need at least 2 clients, got N=1"),
    (["replay", "--engine", "fast"], "choose one of auto, compiled, numpy"),
    (["replay", "--rule", "sfg:gamma=2"], "gamma=2 must lie in [0, 1]"),
    (["run", "--dataset", "digitz"], "did you mean 'digits'"),
    (["run", "--dataset", "cifar10", "--data-root", "/nonexistent/cifar"], "/nonexistent/cifar"),
    (["run", "--config", "/nonexistent.yaml"], "does not exist"),
    (["report", "--store", "/nonexistent.sqlite"], "does not exist"),
    (["traces", "stats", "--source", "flash", "--path", "/nonexistent.json"], "nonexistent"),
])
def test_bad_input_one_line_exit_2(args, fragment):
    res = sfg(*args)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert fragment in lines[0]


def test_unknown_command_is_a_usage_error_not_a_traceback():
    res = sfg("outages")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "No such command" in res.stderr


def test_run_json_and_config_file(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("dataset: digits\nmodel: mlp\nn_clients: 12\nrounds: 4\nlocal_steps: 2\n"
                   "batch_size: 8\neval_every: 2\ngraph: knn:k=3\nbackend: batched\n")
    res = sfg("run", "--config", str(cfg), "-p", "bursty:u=0.6", "-r", "sfg-cut", "--seed", "2",
              "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["config"]["rule"] == "sfg-cut" and data["config"]["n_clients"] == 12
    assert 0 <= data["metrics"]["acc_mean"] <= 1 and data["curves"]["round"] == [2.0, 4.0]


DIAG_RUN = ["run", "-n", "12", "-T", "10", "-K", "1", "-p", "iid:u=0.5", "--seed", "3",
            "--diagnostics", "raw,lag"]


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))


def test_run_json_and_table_carry_the_diagnostics_fitted_rates(capsys):
    """`sfg run --diagnostics raw,lag --json` carries the per-bin sums and the lag law's ρ;
    the report's fit (pooled over this one run) gives the same numbers; the table shows them."""
    from sfg.experiments.report.diagnostics import pooled

    assert main([*DIAG_RUN, "--json"]) == 0
    data = _strict(capsys.readouterr().out)
    diag = data["diagnostics"]
    assert diag["kinds"] == ["raw", "lag"] and "ratio" in diag["raw"]
    lag = diag["lag"]
    assert lag["snapshots"] >= 1 and all(isinstance(lag[k], float)
                                         for k in ("rho_age", "rho_lag", "rho_ratio"))
    assert lag["rho_ratio"] == lag["rho_lag"] / lag["rho_age"]
    record = {"dataset": "digits", "process": "iid:u=0.5", "rule": "dfedavg",
              "diagnostics": diag}
    report = pooled([record])[("digits", "iid:u=0.5", "dfedavg")]["lag"]
    for k in ("rho_age", "rho_lag", "rho_ratio"):
        assert report[k] == lag[k]
    assert main(DIAG_RUN) == 0
    table = capsys.readouterr().out
    for label, k in (("ρ against ages", "rho_age"), ("ρ against lags", "rho_lag"),
                     ("ρ lags ÷ ρ ages", "rho_ratio")):
        row = next(ln for ln in table.splitlines() if label in ln)
        assert f"{lag[k]:.4f}" in row


def test_run_json_rates_without_pairs_to_fit_are_null(capsys):
    # no outages: every age difference is 0, nothing to fit; strict JSON writes null
    args = ["run", "-n", "8", "-T", "5", "-K", "1", "-p", "none", "--eval-every", "5",
            "--diagnostics", "lag"]
    assert main([*args, "--json"]) == 0
    lag = _strict(capsys.readouterr().out)["diagnostics"]["lag"]
    assert lag["rho_age"] is None and lag["rho_ratio"] is None
    assert main(args) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "ρ against ages" in ln)
    assert "no live pairs" in row
    assert main(["run", "-n", "8", "-T", "5", "-K", "1", "--eval-every", "5", "--json"]) == 0
    assert "diagnostics" not in _strict(capsys.readouterr().out)


def test_parse_seeds():
    assert parse_seeds("1,2,3") == [1, 2, 3]
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5]
    with pytest.raises(SfgError, match=r"seeds '-1' must be non-negative integers"):
        parse_seeds("-1")


def test_replay_plot_writes_png(tmp_path, capsys):
    out = tmp_path / "plots" / "staleness.png"
    rc = main(["replay", "-p", "bursty:u=0.7", "-r", "dfedavg", "-r", "sfg-cut", "--seeds", "1,2",
               "-n", "20", "-T", "40", "--plot", str(out), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert "curves" not in data["rows"][0]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_replay_plot_into_a_folder_a_bare_name_or_a_bad_format(tmp_path, capsys):
    """--plot FOLDER writes FOLDER/staleness.png, a bare name gets .png, and the note names
    the file written; an unknown image format is one error line before any work (exit 2)."""
    base = ["replay", "-p", "bursty:u=0.7", "-r", "sfg", "--seeds", "1", "-n", "20", "-T", "30"]
    folder = tmp_path / "figs"
    folder.mkdir()
    assert main([*base, "--plot", str(folder)]) == 0
    assert f"wrote {folder / 'staleness.png'}" in capsys.readouterr().err
    assert (folder / "staleness.png").read_bytes()[:4] == b"\x89PNG"
    assert main([*base, "--plot", str(tmp_path / "bare")]) == 0
    assert (tmp_path / "bare.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main([*base, "--plot", str(tmp_path / "s.xyz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write plot") and "'.xyz'" in err
    assert not (tmp_path / "s.xyz").exists()


def test_replay_engine_is_deprecated_with_one_line_and_changes_nothing(capsys):
    """``--engine`` (deprecated in 0.3, gone in 0.4) still parses: one ``warning:`` line on
    stderr and the same rows as without it; ``auto`` runs an oracle next to compiled rules."""
    base = ["replay", "-p", "bursty:u=0.7", "-r", "sfg-cut", "-r", "aoi+ipw", "--seeds", "1,2",
            "-n", "30", "-T", "70", "--horizon", "10", "--json"]
    assert main(base) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    for engine in ("compiled", "numpy", "auto"):
        assert main([*base, "--engine", engine]) == 0
        got = capsys.readouterr()
        assert got.out == plain.out, engine
        assert got.err.splitlines() == ["warning: --engine is deprecated and does nothing (one "
                                        "compiled round runs every rule); drop it, it goes in "
                                        "0.4"], engine
    assert "--engine" not in subprocess.run(
        [sys.executable, "-m", "sfg", "replay", "--help"], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "200"}).stdout
    assert main([*base[:3], "-r", "oracle-gls", "-r", "sfg", *base[7:]]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["rule"] for r in rows} == {"oracle-gls", "sfg"}
    assert all(r["H"] is not None for r in rows)


def test_an_option_given_twice_is_refused_after_a_top_level_option(capsys):
    """``sfg --plugin MODULE replay ...``: the module is --plugin's value, not the command,
    so the replay's options are still checked for repeats."""
    from sfg.cli.main import main

    code = main(["--plugin", "sfg.round.rules", "replay", "-n", "20", "-T", "5",
                 "--seeds", "1", "--seeds", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--seeds is given twice" in err[0], err


def test_version_and_help_show_defaults_and_flags():
    """``sfg --version`` prints the version; ``sfg run --help`` shows every run setting's
    default (clients, rounds, local steps, rule, process) and on/off options as flags."""
    import re

    import sfg as package
    from sfg.engines import DEFAULTS

    res = sfg("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"sfg {package.__version__}"
    env = {**os.environ, "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "sfg.cli.main", "run", "--help"],
                         capture_output=True, text=True, env=env, timeout=120).stdout
    lines = {m.group(1): line for line in out.splitlines()
             if (m := re.search(r"(--[a-z-]+)\b", line))}
    for flag, key in [("--clients", "n_clients"), ("--rounds", "rounds"),
                      ("--local-steps", "local_steps"), ("--rule", "rule"),
                      ("--process", "process")]:
        assert f"(default {DEFAULTS[key]})" in lines[flag], (flag, lines[flag])
    assert "<bool>" not in out
    assert re.search(r"--json\s+Print JSON", lines["--json"])


def test_rules_read_as_plain_text_and_an_unknown_parameter_is_said_once():
    """``sfg rules`` / ``sfg.rules()`` show no reStructuredText marks; an unknown parameter
    lists the valid ones once (a did-you-mean adds them)."""
    import sfg as package
    from sfg.round.rules import parse_rule

    docs = [v["doc"] for v in package.rules().values()]
    assert docs and not any("``" in d or ":func:`" in d for d in docs)
    assert "dfedavg: uniform over the candidate set." in docs
    with pytest.raises(SfgError) as e:
        parse_rule("sfg-cut:x=1")
    assert str(e.value).endswith("choose one of: L, c") and str(e.value).count("L, c") == 1
    with pytest.raises(SfgError) as e:
        parse_rule("sfg-cut:LL=1")
    assert str(e.value).endswith("did you mean 'L'? (valid parameters: L, c)")


# flags of other programs that sfg's messages name (their own commands, not sfg's)
_OTHER_PROGRAMS = {"--experiment-id": "mlflow experiments restore"}


def _error_texts():
    """(where, text) of every string constant in an error or notice call in src/sfg: the
    messages that tell a user what to do."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "sfg"
    calls = ("refuse", "check", "notice", "WorkFailed", "Rejected")
    for f in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None) or ""
            if name.endswith("Error") or name in calls:
                for a in ast.walk(node):
                    if isinstance(a, ast.Constant) and isinstance(a.value, str):
                        yield f"{f.relative_to(src)}:{node.lineno}", a.value


def test_every_fix_an_error_names_is_an_option_that_exists():
    """A message that says what to do names options sfg has (and, where it spells out a
    component — ``--graph knn:k=2`` — one that parses)."""
    import re

    import typer

    from sfg.cli.main import app
    from sfg.round.rules import RULES, rule_names
    from sfg.util.components import parse_component
    from sfg.world.graphs import GRAPHS
    from sfg.world.outages import PROCESSES

    rule_names()  # the built-in rules registered
    registries = {"graph": GRAPHS, "rule": RULES, "process": PROCESSES}
    opts: set[str] = set()

    def walk(c):
        for p in getattr(c, "params", []):
            opts.update(getattr(p, "opts", []))
            opts.update(getattr(p, "secondary_opts", []))
        for sub in getattr(c, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    bad, seen = [], 0
    for where, text in _error_texts():
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
            seen += 1
            if flag not in opts and flag not in _OTHER_PROGRAMS:
                bad.append((where, flag))
        for flag, value in re.findall(r"(--(?:graph|process|rule|dataset|model)) "
                                      r"([a-z][\w:.,+-]*[\w)])(?=[\s;),]|$)", text):
            comp = parse_component(value, kind=flag[2:])
            registry = registries.get(flag[2:])
            if registry is not None:
                registry.check_params(comp.name, comp.params)  # a name and keys that exist
            seen += 1
    assert seen > 100
    assert not bad, bad


def test_help_and_errors_point_at_no_file_a_pip_user_lacks():
    """No ``--help`` text and no error message names a ``docs/...`` path (a pip install has
    no docs folder); they say what they mean instead."""
    import re

    import typer

    from sfg.cli.main import app

    found = [(w, t) for w, t in _error_texts() if re.search(r"docs/\w", t)]

    def walk(c, path):
        for t in [c.help or "", *(getattr(p, "help", "") or "" for p in c.params)]:
            if re.search(r"docs/\w", t):
                found.append((path, t))
        for name, sub in getattr(c, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "sfg")
    assert not found, found
