"""Grid files: expansion, validation errors with line numbers, the shipped example grids."""

from __future__ import annotations

from pathlib import Path

import pytest

from sfg.errors import SfgError
from sfg.experiments.config import run_id
from sfg.experiments.grid import load_grid, parse_grid

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SMALL = """\
name: small
base: {kind: selftest, n_clients: 10, rounds: 20, eval_every: 5}
processes: ["none", "iid:u=0.5"]
rules: [dfedavg, sfg]
seeds: [1, 2]
overrides: [{}, {local_steps: 3}]
"""


def test_expansion_order_and_values():
    g = parse_grid(SMALL, source="small.yaml")
    assert g.name == "small" and len(g) == 2 * 2 * 2 * 2
    key = [(c.process, c.rule, c.seed, c.local_steps) for c in g]
    assert key[:5] == [("none", "dfedavg", 1, 10), ("none", "dfedavg", 1, 3),
                       ("none", "dfedavg", 2, 10), ("none", "dfedavg", 2, 3),
                       ("none", "sfg", 1, 10)]
    assert key[-1] == ("iid:u=0.5", "sfg", 2, 3)
    assert all(c.kind == "selftest" and c.n_clients == 10 and c.dataset == "digits" for c in g)
    assert len(set(g.run_ids())) == 16 and g.run_ids()[0] == run_id(g.configs[0])
    assert g.axes == {"processes": ["none", "iid:u=0.5"], "rules": ["dfedavg", "sfg"],
                      "seeds": [1, 2]}


def test_absent_axes_take_base_or_defaults():
    g = parse_grid("base: {kind: selftest, rule: sfg, rounds: 10}\nseeds: [3]\n")
    assert len(g) == 1 and g.configs[0].rule == "sfg" and g.configs[0].process == "bursty:u=0.8"
    assert g.name == "grid"


def _error(text: str) -> str:
    with pytest.raises(SfgError) as info:
        parse_grid(text, source="g.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("g.yaml:")
    return msg


@pytest.mark.parametrize("text, expected", [
    ("name: x\nrule: [sfg]\n", "g.yaml:2: unknown grid key 'rule'; did you mean the axis "
                              "'rules' (a list), or put 'rule' under base:?"),
    ("name: x\nseed: [1]\nprocess: [none]\n", "g.yaml:2: unknown grid key 'seed'; did you mean "
                                              "the axis 'seeds'"),
    ("name: x\noverride: []\n", "g.yaml:2: unknown grid key 'override'; did you mean "
                                "'overrides'?"),
    ("name: x\nrounds: 10\n", "g.yaml:2: unknown grid key 'rounds'; 'rounds' is a run setting, "
                              "put it under base:"),
    ("base:\n  kind: selftest\n  round: 10\n",
     "g.yaml:3: unknown run setting 'round' in base; did you mean 'rounds'?"),
    ("base: {kind: selftest}\nseeds: [1]\noverrides:\n  - {}\n  - {lcoal_steps: 2}\n",
     "g.yaml:5: unknown run setting 'lcoal_steps' in overrides[1]; did you mean 'local_steps'?"),
    ("base:\n  rules: [sfg]\n", "g.yaml:2: unknown run setting 'rules' in base; 'rules' is a "
                               "grid axis, write it at the top level"),
    ("seeds: [1, '2']\n", "g.yaml:1: seeds must be integers, got '2' (str)"),
    ("seeds:\n  - 1\n  - 2.5\n", "g.yaml:3: seeds must be integers, got 2.5 (float)"),
    ("seeds: [true]\n", "seeds must be integers, got True (bool)"),
    ("seeds: 3\n", "g.yaml:1: seeds must be a non-empty list"),
    ("rules: [sfg, 3]\n", "g.yaml:1: rules entries must be non-empty strings, got 3"),
    ("rules:\n  - sfg\n  - dfedavg\n  - SFG\n", "g.yaml:4: rules lists 'SFG' twice"),
    ("base:\n  kind: selftest\n  rounds: '100'\n",
     "g.yaml:3: rounds: Input should be a valid integer (got '100' of type str)"),
    ("base:\n  kind: selftest\n  link_failure: 1.5\n", "g.yaml:3: link_failure must lie in [0, 1) (got 1.5)"),
    ("base:\n  kind: selftest\n  rounds: 5\n  eval_every: 10\n",
     "eval_every (10) is larger than rounds (5)"),
    ("base: {kind: selftest, rule: sfg}\nrules: [dfedavg]\n",
     "g.yaml:1: base sets 'rule' but the grid also has the axis 'rules'"),
    ("rules: [sfg]\noverrides:\n  - {rule: dfedavg}\n",
     "g.yaml:3: overrides[0] sets 'rule', which the axis 'rules' already varies"),
    ("base: {kind: selftest}\nrules:\n  - dfedavg\n  - sfg-cutt\n",
     "g.yaml:4: unknown rule 'sfg-cutt'; did you mean 'sfg-cut'?"),
    ("base: {kind: selftest}\nprocesses:\n  - none\n  - 'burst:u=0.8'\n",
     "g.yaml:4: unknown outage process 'burst'"),
    ("base: {kind: selftest, local_steps: 10}\noverrides: [{}, {local_steps: 10}]\n",
     "same run twice"),
    ("base:\n  kind: selftest\n  kind: train\n", "g.yaml:3: key 'kind' appears twice"),
    ("base: {kind: selftest\nrules: [sfg]\n", "invalid YAML"),
    ("- a\n- b\n", "a grid file must be a mapping"),
    ("base: [1, 2]\n", "g.yaml:1: base must be a mapping"),
])
def test_validation_errors_name_the_line_and_the_fix(text, expected):
    assert expected in _error(text)


def test_replay_grid_rejects_model_reading_rules():
    from sfg.round.rules import RULES, register_rule

    register_rule("grid-test-reads-models", None, tags=("model",))
    try:
        msg = _error("base: {kind: replay, rounds: 60}\nrules:\n  - sfg\n"
                     "  - grid-test-reads-models\n")
    finally:
        RULES._entries.pop("grid-test-reads-models")
    assert msg.startswith("g.yaml:4:") and "reads model parameters" in msg


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(SfgError, match="empty.yaml: the grid file is empty"):
        load_grid(empty)
    with pytest.raises(SfgError, match="does not exist"):
        load_grid(tmp_path / "nope.yaml")
    ok = tmp_path / "mine.yaml"
    ok.write_text("base: {kind: selftest, rounds: 10}\n")
    assert load_grid(ok).name == "mine"  # the file stem names an unnamed grid


def test_demo_grid():
    g = load_grid(EXAMPLES / "demo.yaml")
    assert g.name == "demo" and len(g) == 2 * 7 * 8
    assert {c.process for c in g} == {"none", "bursty:u=0.8"}
    assert {c.rule for c in g} == {"dfedavg", "aoi+ipw", "dfl-aa", "limited-merging:L=2", "sfg",
                                   "sfg-l", "sfg-cut"}
    assert {c.seed for c in g} == set(range(1, 9))
    assert all((c.dataset, c.n_clients, c.model, c.kind) == ("digits", 100, "mlp", "train")
               for c in g)
    # the copy that `make demo` runs (shipped inside the package) is the same grid
    from sfg.cli.demo import demo_grid_text

    assert demo_grid_text() == (EXAMPLES / "demo.yaml").read_text()


@pytest.mark.parametrize("name, dataset", [("paper-cifar10", "cifar10"),
                                           ("paper-femnist", "femnist"),
                                           ("paper-cifar100", "cifar100")])
def test_paper_grids(name, dataset):
    g = load_grid(EXAMPLES / f"{name}.yaml")
    processes = {"none"} | {f"{p}:u={u}" for p in ("iid", "bursty", "heterogeneous", "regional")
                            for u in (0.6, 0.8)}
    assert {c.process for c in g} == processes
    rules = {c.rule for c in g}
    assert {"dfedavg", "aoi+ipw", "dfl-aa", "sfg", "sfg-l", "sfg-cut"} <= rules
    assert len(g) == 9 * len(rules) * 5
    assert {c.seed for c in g} == {1, 2, 3, 4, 5}
    assert all((c.dataset, c.model, c.rounds, c.local_steps, c.device, c.kind) ==
               (dataset, "cnn", 300, 10, "cuda", "train") for c in g)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_grid_validates(path):
    """Every shipped grid expands and validates (what `sfg grid run --dry-run` checks)."""
    g = load_grid(path)
    assert len(g) > 0 and g.name == path.stem
    assert len({run_id(c) for c in g}) == len(g)  # no two entries are the same run


def test_attack_digits_grid():
    """The forged-staleness training grid: 7 rules x 5 defence settings x 5 seeds x
    (no attack; 5, 10, 20 % fresh always-on liars; 3 controls at 10 %)."""
    g = load_grid(EXAMPLES / "attack-digits.yaml")
    assert len(g) == 7 * 5 * 5 * 7
    attacks = {c.attack for c in g}
    assert len(attacks) == 7 and any(a in (None, "none", "") for a in attacks)
    assert {c.seed for c in g} == {1, 2, 3, 4, 5}
    defences = {c.rule.rsplit("+", 1)[1] if "+" in c.rule else "none" for c in g}
    assert defences == {"none", "guard", "relative", "cap", "clip"}


def _family_grid(seeds: int, m: int, alpha: str = "") -> str:
    return (f"base: {{kind: selftest, n_clients: 10, rounds: 5}}\nrules: [dfedavg, sfg]\n"
            f"seeds: {list(range(1, seeds + 1))}\nfamily: {{comparisons: {m}{alpha}}}\n")


@pytest.mark.parametrize("m,alpha", [(1, 0.05), (24, 0.05), (128, 0.05), (6, 0.01), (1000, 0.1)])
def test_family_check_is_the_smallest_exact_p_against_holm(m, alpha):
    """A grid's declared family (m comparisons at alpha) can be resolved after Holm exactly
    when its U seeds give the exact sign-flip test a smallest p 2^(1-U) below alpha/m; the
    check names the least U, by hand: the first U with 2^(1-U) < alpha/m."""
    from sfg.experiments.grid import check_family

    least = next(u for u in range(1, 200) if 2.0 ** (1 - u) < alpha / m)
    ok = parse_grid(_family_grid(least, m, f", alpha: {alpha}"), source="f.yaml")
    assert ok.family == {"comparisons": m, "alpha": alpha}
    assert f"({least} seeds are the least)" in check_family(ok)
    if least > 1:
        short = parse_grid(_family_grid(least - 1, m, f", alpha: {alpha}"), source="f.yaml")
        with pytest.raises(SfgError, match=f"use at least {least} seeds") as e:
            check_family(short)
        assert "\n" not in str(e.value)


def test_family_check_by_the_cli(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "g.yaml"
    f.write_text(_family_grid(9, 24))
    bad = subprocess.run([sys.executable, "-m", "sfg", "grid", "check", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
    assert "use at least 10 seeds" in bad.stderr and bad.stderr.strip().count("\n") == 0
    run = subprocess.run([sys.executable, "-m", "sfg", "grid", "run", str(f), "--store",
                          str(tmp_path / "s.sqlite")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "use at least 10 seeds" in run.stderr  # nothing ran
    assert not (tmp_path / "s.sqlite").exists()
    f.write_text(_family_grid(10, 24))
    good = subprocess.run([sys.executable, "-m", "sfg", "grid", "check", str(f)],
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "can be resolved after Holm" in good.stdout
    for text, words in (("family: 24", "must be a mapping"),
                        ("family: {comparisons: 0}", "whole number from 1"),
                        ("family: {comparisons: 4, alpha: 2}", "alpha must lie in (0, 1)"),
                        ("family: {comparison: 4}", "unknown family key")):
        with pytest.raises(SfgError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_grid("base: {kind: selftest}\nseeds: [1]\n" + text + "\n")
    no_family = parse_grid("base: {kind: selftest}\nseeds: [1]\n")
    from sfg.experiments.grid import check_family

    with pytest.raises(SfgError, match="declares no family"):
        check_family(no_family)
