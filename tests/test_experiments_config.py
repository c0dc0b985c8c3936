"""RunConfig: docs/concepts/training.md#the-training-protocol defaults, validation messages, canonical run ids, registry checks."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sfg.errors import SfgError
from sfg.experiments.config import (
    ConfigError,
    RunConfig,
    canonical_json,
    make_config,
    run_id,
    validate_names,
)


def test_defaults_are_the_reference_protocol():
    c = RunConfig()
    assert (c.n_clients, c.rounds, c.local_steps, c.batch_size) == (100, 300, 10, 32)
    assert (c.lr, c.weight_decay, c.alpha, c.ditto_lambda) == (0.05, 5e-4, 0.3, 0.2)
    assert (c.kind, c.rule, c.process, c.graph, c.backbone) == (
        "train", "dfedavg", "bursty:u=0.8", "knn:k=6", "full")
    assert (c.anatomy, c.link_failure, c.eval_every, c.horizon, c.device) == (
        "full", 0.0, 10, 50, "cpu")


def test_run_id_is_sha256_of_sorted_canonical_json():
    c = make_config(kind="selftest", seed=3)
    fields = c.model_dump(mode="json")
    expected_json = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert canonical_json(c) == expected_json
    assert '"seed":3' in expected_json and expected_json.index('"alpha"') < expected_json.index(
        '"weight_decay"')
    # settings added later are left out of the identity at their defaults, so that the run
    # ids of earlier stores stay valid
    assert (fields.pop("partition"), fields.pop("diagnostics"), fields.pop("backbone_from"),
            fields.pop("precision")) == ("dirichlet", "", None, "fp32")
    identity = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert run_id(c) == hashlib.sha256(identity.encode()).hexdigest()[:16]
    assert run_id(make_config(kind="selftest", seed=3, partition="classes:k=2")) != run_id(c)
    assert len(run_id(c)) == 16


def test_run_id_changes_with_every_field_and_ignores_spelling():
    base = make_config()
    changed = {"seed": 2, "rule": "sfg", "lr": 0.1, "rounds": 299, "device": "cuda",
               "data_root": "/data", "kind": "replay", "link_failure": 0.3}
    ids = {run_id(base)} | {run_id(make_config(**{k: v})) for k, v in changed.items()}
    assert len(ids) == len(changed) + 1
    # spelling variants of the same component share the id (canonical component strings)
    assert make_config(rule=" SFG-L:gamma=0.30+IPW ").rule == "sfg-l:gamma=0.3+ipw"
    assert run_id(make_config(rule="SFG")) == run_id(make_config(rule="sfg"))
    assert run_id(make_config(process="bursty:mean_off=10,u=0.8")) == run_id(
        make_config(process="bursty:u=0.8,mean_off=10"))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 500), lr=st.floats(1e-4, 1.0),
       u=st.sampled_from(["none", "iid:u=0.5", "bursty:u=0.8"]),
       rule=st.sampled_from(["dfedavg", "sfg", "aoi+ipw", "limited-merging:L=2"]))
def test_canonical_json_round_trips(seed, n, lr, u, rule):
    c = make_config(seed=seed, n_clients=n, lr=lr, process=u, rule=rule)
    again = RunConfig(**json.loads(canonical_json(c)))
    assert again == c and run_id(again) == run_id(c)
    fields = c.model_dump()
    reordered = make_config(dict(reversed(list(fields.items()))))
    assert run_id(reordered) == run_id(c)


@pytest.mark.parametrize("field, value, words", [
    ("seed", -1, "seed must be >= 0"),
    ("n_clients", 1, "n_clients must be >= 2"),
    ("rounds", 0, "rounds must be >= 1"),
    ("link_failure", 1.0, "link_failure must lie in [0, 1)"),
    ("lr", 0.0, "lr must be a finite number > 0"),
    ("momentum", 1.0, "momentum must lie in [0, 1)"),
    ("device", "gpu", "device 'gpu' is not one of"),
    ("backbone", "resnet", "backbone"),
    ("anatomy", "half", "anatomy"),
    ("seed", "1", "valid integer"),
    ("seed", True, "valid integer"),
    ("rounds", 10.5, "valid integer"),
    ("rule", "  ", "rule is empty"),
])
def test_bad_values_give_one_line_errors(field, value, words):
    with pytest.raises(SfgError) as info:
        make_config(**{field: value})
    msg = str(info.value)
    assert words in msg and field in msg and "\n" not in msg
    assert info.value.field == field


def test_extra_keys_and_mutation_are_rejected():
    with pytest.raises(SfgError, match="unknown run setting 'round'; did you mean 'rounds'"):
        make_config(round=3)
    c = make_config()
    with pytest.raises(ValidationError, match="Instance is frozen"):
        c.seed = 5  # type: ignore[misc]


def test_impossible_combinations():
    with pytest.raises(SfgError, match=r"eval_every \(10\) is larger than rounds \(5\)"):
        make_config(rounds=5, eval_every=10)
    assert make_config(rounds=5, eval_every=5).rounds == 5
    with pytest.raises(SfgError, match="horizon"):
        make_config(kind="replay", rounds=40, horizon=50)
    assert make_config(kind="replay", rounds=40, eval_every=10, horizon=40).horizon == 40


@pytest.mark.parametrize("rounds", [1, 2, 5, 9, 10, 11, 49, 50, 51, 300])
def test_defaults_fit_a_short_run(rounds):
    """Given neither, eval_every is min(10, T) (a short run evaluates at its end) and a
    replay's horizon min(50, T); given, they are kept (and checked)."""
    train, replay = make_config(rounds=rounds), make_config(kind="replay", rounds=rounds)
    assert (train.eval_every, train.horizon) == (min(10, rounds), 50)
    assert (replay.eval_every, replay.horizon) == (min(10, rounds), min(50, rounds))
    assert make_config(rounds=rounds, eval_every=1).eval_every == 1
    assert make_config({"rounds": rounds, "eval_every": None}).eval_every == min(10, rounds)


# run ids computed by 0.2's code (before the defaults adapted to short runs)
OLD_RUN_IDS = [
    ({}, "fedea88c70eef9bd"),
    ({"rounds": 10}, "5c5f614f6739506e"),
    ({"rounds": 60, "rule": "sfg-cut"}, "a99f9856ee28512e"),
    ({"kind": "replay", "rounds": 50}, "c7cf808cd23653d5"),
    ({"kind": "replay", "rounds": 300, "process": "iid:u=0.6"}, "b004a511934975f5"),
    ({"kind": "selftest", "rounds": 12}, "e0c0e6597a35ddec"),
]


@pytest.mark.parametrize("fields, rid", OLD_RUN_IDS)
def test_run_ids_of_runs_as_long_as_the_old_defaults_do_not_change(fields, rid):
    """The id hashes the resolved config; at T >= 10 (a replay: T >= 50) the adaptive
    defaults resolve to the old fixed ones, so stores written before keep their ids."""
    assert run_id(make_config(**fields)) == rid


def test_validate_names_uses_the_registries():
    validate_names(make_config(rule="aoi+ipw", process="regional:u=0.6"))
    with pytest.raises(ConfigError, match="did you mean 'sfg-cut'") as info:
        validate_names(make_config(rule="sfg-cutt"))
    assert info.value.field == "rule"
    with pytest.raises(ConfigError, match="outage process") as info:
        validate_names(make_config(process="burst:u=0.8"))
    assert info.value.field == "process"
    with pytest.raises(ConfigError, match="unknown parameter 'gama'"):
        validate_names(make_config(rule="sfg:gama=0.3"))


@pytest.fixture
def model_reading_rule():
    from sfg.round.rules import RULES, register_rule

    register_rule("test-reads-models", None, tags=("model",))
    yield "test-reads-models"
    RULES._entries.pop("test-reads-models")


def test_replay_rejects_model_reading_rules(model_reading_rule):
    train = make_config(kind="train", rule=model_reading_rule)
    validate_names(train)
    replay = make_config(kind="replay", rule=model_reading_rule, rounds=60)
    with pytest.raises(ConfigError, match="reads model parameters.*use kind: train"):
        validate_names(replay)


BROKEN_GRID = """\
name: broken
base: {kind: train, dataset: digits, model: mlp, n_clients: 8, graph: "ring:k=1", rounds: 2,
       local_steps: 1, eval_every: 1, device: cpu}
processes: [none]
rules: [dfedavg]
seeds: [1]
"""


@pytest.mark.parametrize("body, why", [
    ("raise ImportError('libtorch_cpu.so: cannot open shared object file')", "ImportError"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('CUDA driver initialisation failed')", "RuntimeError"),
])
def test_a_broken_model_module_is_one_error_line_naming_it(tmp_path, body, why):
    """A real broken module first on sys.path (a ``torch`` that fails to import) stops the
    grid before it runs, with one line naming the registry and the broken file: it used to
    turn the dataset and model checks off silently, and the grid failed mid-run."""
    import os
    import subprocess
    import sys

    (tmp_path / "torch").mkdir()
    broken = tmp_path / "torch" / "__init__.py"
    broken.write_text(body)
    grid = tmp_path / "g.yaml"
    grid.write_text(BROKEN_GRID)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "sfg", "grid", "run", str(grid), "--store",
                          str(tmp_path / "s.sqlite"), "--workers", "0"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    # the first registry of a train run that imports torch (data, then models) names it
    assert "error: sfg.world.data cannot be checked: importing it failed in " in lines[0]
    assert str(broken) in lines[0] and why in lines[0]


def test_a_missing_optional_dependency_skips_only_its_check(monkeypatch):
    """torch not installed at all (not broken): the model check is skipped, the run names the
    extra to install; the other checks still run."""
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a, **k)

    import sys

    monkeypatch.delitem(sys.modules, "sfg.world.models", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    validate_names(make_config(model="mlp-typo"))  # skipped: the run will say pip install
    with pytest.raises(ConfigError, match="did you mean 'sfg-cut'"):
        validate_names(make_config(rule="sfg-cutt", model="mlp-typo"))


def test_a_run_whose_engine_fails_to_import_names_the_broken_file(tmp_path):
    """The runner's own imports (a worker that skipped validation): the same one line."""
    import os
    import subprocess
    import sys

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cpu.so')")
    code = ("from sfg.errors import SfgError\n"
            "from sfg.experiments.config import make_config\n"
            "from sfg.experiments.runner import run_config\n"
            "try:\n"
            "    run_config(make_config(rounds=2, n_clients=8, eval_every=1, graph='ring:k=1'))\n"
            "except SfgError as e:\n"
            "    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert res.stdout.strip() == (f"kind 'train' needs sfg.sim.run: importing it failed in "
                                  f"{tmp_path / 'torch' / '__init__.py'}: ImportError: "
                                  "libtorch_cpu.so"), res.stderr
