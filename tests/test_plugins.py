"""Plugins end to end: a real package (a wheel with an ``sfg.rules`` entry point, installed
with ``pip install --no-deps --target``) is found by the real command line in fresh processes
— ``sfg replay``, ``sfg run`` and ``sfg grid run --workers 2`` (spawned workers) use its rule
— and an edit to the helper its rule calls changes the numbers on the next run (the compiled
rule is cached under a hash of its source, :func:`sfg.round.jit.source_digest`). A plain
module works through ``--plugin`` and ``SFG_PLUGINS``; a broken plugin is one error line
naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from sfg.round.jit import source_digest

RULES = '''
import numpy as np
from numba import njit

from sfg.round.rules import rule


@njit(cache=True)
def boost(age):
    """The helper the rule calls."""
    return 1.0 / (1.0 + age)


@rule("plugin-fresh", tags=("control",))
@njit(cache=True)
def plugin_fresh(x):
    """``plugin-fresh``: a candidate's score falls with its age (through a helper)."""
    return boost(x.age.astype(np.float64))
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "sfg-plugin-example"
version = "0.1"

[project.entry-points."sfg.rules"]
fresh = "sfg_plugin_example.rules"

[tool.setuptools]
packages = ["sfg_plugin_example"]
'''

GRID = '''
name: plugin
base: {kind: replay, n_clients: 12, rounds: 10, horizon: 5, graph: "ring:k=1"}
processes: ["bursty:u=0.8"]
rules: [plugin-fresh]
seeds: [1, 2]
'''

REPLAY = ["replay", "-p", "bursty:u=0.8", "-r", "plugin-fresh", "--seeds", "1", "-n", "16",
          "-T", "10", "--horizon", "5", "--graph", "ring:k=1", "--json"]
RUN = ["run", "--rule", "plugin-fresh", "-p", "bursty:u=0.5", "-n", "8", "-T", "5",
       "--eval-every", "5", "--local-steps", "1", "--batch-size", "8", "--graph", "ring:k=1",
       "--json"]


def sfg(args, env, timeout=240):
    return subprocess.run([sys.executable, "-m", "sfg", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def env_with(path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("SFG_PLUGINS", "PYTHONPATH")}
    return {**env, "PYTHONPATH": str(path), **extra}


def ok(res):
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def replay_rows(out):
    return json.loads(out)["rows"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example plugin built as a wheel and installed into a folder of its own."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    (src / "sfg_plugin_example").mkdir(parents=True)
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (src / "sfg_plugin_example" / "__init__.py").write_text("")
    (src / "sfg_plugin_example" / "rules.py").write_text(textwrap.dedent(RULES))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(root / "dist"), str(src)],
                           capture_output=True, text=True, timeout=180)
    assert built.returncode == 0, built.stderr[-2000:]
    wheels = list((root / "dist").glob("sfg_plugin_example-0.1-*.whl"))
    assert len(wheels) == 1
    site = root / "site"
    got = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site),
                          str(wheels[0])], capture_output=True, text=True, timeout=180)
    assert got.returncode == 0, got.stderr[-2000:]
    assert (site / "sfg_plugin_example-0.1.dist-info" / "entry_points.txt").exists()
    return site


def test_an_installed_plugin_runs_everywhere_and_an_edited_helper_is_picked_up(installed,
                                                                                tmp_path):
    env = env_with(installed)
    # the replay finds the rule through its entry point (no --plugin, no SFG_PLUGINS)
    before = replay_rows(ok(sfg(REPLAY, env)))
    assert before[0]["rule"] == "plugin-fresh"
    # its numbers are the rule's: the same replay under a built-in rule differs
    dfedavg = replay_rows(ok(sfg([*REPLAY[:4], "dfedavg", *REPLAY[5:]], env)))
    assert dfedavg[0]["self_weight_return"] != before[0]["self_weight_return"]
    # sfg rules lists it
    assert "plugin-fresh" in ok(sfg(["rules"], env))

    # training
    trained = json.loads(ok(sfg(RUN, env)))
    assert "plugin-fresh" in json.dumps(trained)

    # a grid with two spawned worker processes: each loads the entry point itself
    grid = tmp_path / "grid.yaml"
    grid.write_text(textwrap.dedent(GRID))
    store = tmp_path / "grid.sqlite"
    ok(sfg(["grid", "run", str(grid), "--store", str(store), "--workers", "2",
            "--no-progress"], env))
    from sfg.experiments.store import records

    done = records(store)
    assert len(done) == 2 and {r["config"]["rule"] for r in done} == {"plugin-fresh"}

    # edit the helper in the installed module: the next run compiles it afresh
    path = installed / "sfg_plugin_example" / "rules.py"
    text = path.read_text()
    assert "return 1.0 / (1.0 + age)" in text
    path.write_text(text.replace("return 1.0 / (1.0 + age)", "return 1.0 / (1.0 + age) ** 3"))
    after = replay_rows(ok(sfg(REPLAY, env)))
    assert after[0]["self_weight_return"] != before[0]["self_weight_return"]
    retrained = json.loads(ok(sfg(RUN, env)))
    assert retrained != trained
    # and the edit undone gives the first numbers again
    path.write_text(text + "\n")
    assert replay_rows(ok(sfg(REPLAY, env))) == before

    # a broken entry point: other commands keep working; one that needs its rule is one
    # error line naming it and its package
    path.write_text("raise ImportError('a missing piece')\n")
    try:
        assert sfg(["processes"], env).returncode == 0
        res = sfg(REPLAY, env)
    finally:
        path.write_text(text + "\n")  # the installed plugin as it was, for the other tests
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    for w in ("error: unknown rule 'plugin-fresh'", "plugin 'sfg_plugin_example.rules'",
              "entry point 'fresh'", "'sfg.rules'", "sfg-plugin-example",
              "ImportError: a missing piece"):
        assert w in lines[0]


def test_a_plain_module_through_plugin_and_the_environment(tmp_path):
    (tmp_path / "plain_rules.py").write_text(textwrap.dedent(RULES).replace(
        "plugin-fresh", "plain-fresh"))
    args = [*REPLAY[:4], "plain-fresh", *REPLAY[5:]]
    env = env_with(tmp_path)
    missing = sfg(args, env)  # not imported: an unknown rule
    assert missing.returncode == 2 and "plain-fresh" in missing.stderr
    by_option = replay_rows(ok(sfg(["--plugin", "plain_rules", *args], env)))
    by_env = replay_rows(ok(sfg(args, env_with(tmp_path, SFG_PLUGINS="plain_rules"))))
    assert by_option == by_env and by_option[0]["rule"] == "plain-fresh"


@pytest.mark.parametrize("how", ["option", "env", "missing"])
def test_a_broken_plugin_is_reported_by_what_needs_it(tmp_path, how):
    """--help, the built-in names and ``sfg rules`` keep working (the broken plugin listed as
    broken); an unknown name is one error line that names the broken plugin."""
    (tmp_path / "broken_rules.py").write_text("import numpy\nraise RuntimeError('no luck')\n")
    if how == "option":
        env, pre = env_with(tmp_path), ["--plugin", "broken_rules"]
        want = ["'broken_rules'", "--plugin", "RuntimeError: no luck"]
    elif how == "env":
        env, pre = env_with(tmp_path, SFG_PLUGINS="numpy, broken_rules"), []
        want = ["'broken_rules'", "SFG_PLUGINS", "RuntimeError: no luck"]
    else:
        env, pre = env_with(tmp_path), ["--plugin", "no_such_plugin"]
        want = ["'no_such_plugin'", "no module named"]
    listed = sfg([*pre, "rules", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert any(r["rule"] == "dfedavg" for r in rows)
    gone = [r for r in rows if "broken" in r["tags"]]
    assert len(gone) == 1 and all(w in gone[0]["doc"] for w in want), gone
    assert sfg([*pre, "run", "--help"], env).returncode == 0
    built_in = sfg([*pre, *REPLAY[:4], "dfedavg", *REPLAY[5:]], env)
    assert built_in.returncode == 0, built_in.stderr
    res = sfg([*pre, *REPLAY], env)  # plugin-fresh: a name the broken plugin may define
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: unknown rule 'plugin-fresh'"), res.stderr
    assert "a plugin that may define it is broken" in lines[0] and "--no-plugins" in lines[0]
    for w in want:
        assert w in lines[0]


def test_no_plugins_turns_the_installed_ones_off_here_and_in_grid_workers(installed, tmp_path):
    """``--no-plugins`` / ``SFG_NO_PLUGINS=1``: the installed plugin's rule is unknown, in the
    command and in the grid's spawned workers; without it the rule runs."""
    env = env_with(installed)
    assert replay_rows(ok(sfg(REPLAY, env)))[0]["rule"] == "plugin-fresh"
    for pre, extra in ((["--no-plugins"], {}), ([], {"SFG_NO_PLUGINS": "1"})):
        res = sfg([*pre, *REPLAY], {**env, **extra})
        assert res.returncode == 2 and "unknown rule 'plugin-fresh'" in res.stderr, res.stderr
    (tmp_path / "grid.yaml").write_text(textwrap.dedent(GRID))
    store = tmp_path / "off.sqlite"
    res = sfg(["--no-plugins", "grid", "run", str(tmp_path / "grid.yaml"), "--store", str(store),
               "--workers", "2"], env)
    assert res.returncode != 0 and "plugin-fresh" in res.stderr, res.stderr[-2000:]


def test_a_rule_that_does_not_compile_is_one_line_naming_its_file_and_line(tmp_path):
    (tmp_path / "typo_rules.py").write_text(textwrap.dedent(RULES).replace(
        "plugin-fresh", "typo-fresh").replace("boost(x.age", "boost(x.agee"))
    res = sfg(["--plugin", "typo_rules", *REPLAY[:4], "typo-fresh", *REPLAY[5:]],
              env_with(tmp_path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    where = f"{tmp_path / 'typo_rules.py'}:"
    assert line.startswith("error: rule 'typo-fresh' (" + where), line
    lineno = 1 + textwrap.dedent(RULES).splitlines().index(
        "    return boost(x.age.astype(np.float64))")
    assert f"{where}{lineno})" in line and "Unknown attribute 'agee'" in line
    assert "x.age, x.lag" in line and "Traceback" not in res.stderr


# ------------------------------------------------------------------ the compiled cache's key
def _module(name, source):
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    exec(compile(textwrap.dedent(source), mod.__file__, "exec"), mod.__dict__)  # noqa: S102
    return mod


RULE = '''
import helpers

LIMIT = 2.0

def rule(x):
    return helpers.boost(x) + LIMIT
'''


@pytest.mark.parametrize("edit", ["helper", "constant", "helper_constant", "nothing"])
def test_the_cache_key_follows_the_rule_and_its_helpers(edit, monkeypatch):
    """The key changes with the rule's helper in another module, a constant it reads (numba
    freezes globals) and a constant its helper reads; it does not change for nothing."""
    helpers = _module("helpers", "SCALE = 3.0\ndef boost(x):\n    return x * SCALE\n")
    monkeypatch.setitem(sys.modules, "helpers", helpers)
    fn = _module("user_rule", RULE).rule
    key = source_digest(fn)
    assert source_digest(fn) == key
    if edit == "helper":
        helpers.boost = _module("helpers", "def boost(x):\n    return x * 4.0\n").boost
    elif edit == "constant":
        fn.__globals__["LIMIT"] = 2.5
    elif edit == "helper_constant":
        helpers.SCALE = 3.5
    changed = source_digest(fn) != key
    assert changed == (edit != "nothing")


RULE_FILE = '''
def _scale(x):
    return x * {factor}


HELPERS = {{"scale": _scale}}


class Helpers:
    scale = staticmethod(_scale)


def rule(x):
    return {call}(x)
'''


@pytest.mark.parametrize("call", ['HELPERS["scale"]', "Helpers.scale"])
def test_the_cache_key_covers_the_text_of_the_rules_source_file(call, tmp_path):
    """docs/howto/add-rule.md: "The compiled rule is cached on disk under a hash of its source:
    the rule's code, the code of every helper it calls [...] and the text of their source
    files. Change the rule, a helper or such a constant and the next run compiles it afresh".
    The rule's file is edited only in a helper that the rule reaches through a dict or a class
    attribute (not called directly): the rule's own code is the same, the file's text is not,
    and the module loaded again from the edited file has another key."""
    import importlib.util

    path = tmp_path / "my_rules.py"

    def key(factor: str) -> str:
        path.write_text(RULE_FILE.format(factor=factor, call=call))
        spec = importlib.util.spec_from_file_location("my_rules", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return source_digest(mod.rule)

    before = key("2.0")
    assert key("2.0") == before   # the same text: the same key
    assert key("3.25") != before  # the helper edited (another length: a new read of the file)


def test_the_built_in_rules_keys_are_stable_across_processes():
    code = ("from sfg.round.rules import parse_rule; from sfg.round.jit import source_digest; "
            "print(source_digest(parse_rule('sfg-cut').fn))")
    # fresh processes (this one's modules may have been changed by other tests: its own key
    # is not the point; the on-disk cache is shared by fresh processes)
    keys = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=120).stdout.strip() for _ in range(2)]
    assert keys[0] == keys[1] and len(keys[0]) >= 12, keys


DATASET = '''
from sfg.world.data import DATASETS
from sfg.world.data.digits import load_digits_federated


def tiny_digits(**kw):
    """The digits, as a dataset of one's own."""
    return load_digits_federated(**kw)


DATASETS.register("plugin-digits", tiny_digits, params={"test_fraction": 0.3, "balance": True},
                  doc="the digits again, from a plugin", tags=("image",))


from sfg.world.models import MODELS, mlp


def plugin_mlp(**kw):
    return mlp(**kw)


MODELS.register("plugin-mlp", plugin_mlp, params={"hidden": "16", "backbone": ""},
                doc="a small MLP, from a plugin")


from sfg.world.outages.registry import PROCESSES
from sfg.world.outages.synthetic import Iid

PROCESSES.register("plugin-iid", Iid, params={"u": None}, doc="iid, from a plugin")
'''


def test_a_dataset_model_and_outage_process_from_a_plugin_module(tmp_path):
    (tmp_path / "plugin_data.py").write_text(textwrap.dedent(DATASET))
    args = ["run", "--dataset", "plugin-digits", "--model", "plugin-mlp", "--rule", "sfg-cut",
            "-p", "plugin-iid:u=0.5", *RUN[5:]]
    unknown = sfg(args, env_with(tmp_path))
    assert unknown.returncode == 2 and "plugin-digits" in unknown.stderr
    out = json.dumps(json.loads(ok(sfg(args, env_with(tmp_path, SFG_PLUGINS="plugin_data")))))
    for name in ("plugin-digits", "plugin-mlp", "plugin-iid:u=0.5"):
        assert name in out


def test_a_ray_task_loads_the_drivers_plugins_and_reports_a_broken_one(tmp_path, monkeypatch):
    """The Ray executor's task (called here without Ray): the driver's plugin modules are
    loaded before the run; one that fails is the one-line error of a run that needs it."""
    from sfg.experiments.config import make_config
    from sfg.experiments.executors import _ray_task

    (tmp_path / "ray_rules.py").write_text(textwrap.dedent(RULES).replace(
        "plugin-fresh", "ray-fresh"))
    (tmp_path / "ray_broken.py").write_text("raise RuntimeError('no luck')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SFG_PLUGINS", raising=False)
    from sfg.round.rules import RULES as registry

    try:
        config = make_config(kind="replay", n_clients=8, rounds=10, horizon=5,
                             graph="ring:k=1", process="bursty:u=0.5",
                             rule="dfedavg", seed=1).model_dump(mode="json")
        # a broken plugin fails only the run that needs it, naming the plugin
        assert _ray_task(config, ["ray_broken"])["ok"]
        broken = _ray_task({**config, "rule": "ray-fresh"}, ["ray_broken"])
        assert not broken["ok"] and "plugin 'ray_broken'" in broken["error"]
        assert "RuntimeError: no luck" in broken["error"]
        assert "ray-fresh" not in registry
        done = _ray_task({**config, "rule": "ray-fresh"}, ["ray_rules"])
        assert done["ok"], done.get("error")
        assert "ray-fresh" in registry
    finally:
        registry._entries.pop("ray-fresh", None)
        sys.modules.pop("ray_rules", None)


def test_a_node_worker_loads_the_plugins_first(tmp_path, monkeypatch, capsys):
    """A swarm's node worker process (``python -m sfg.net.worker``) loads ``SFG_PLUGINS``
    (inherited from the command) before it builds its nodes; a broken one is named by the
    one error line of a world that needs it."""
    from sfg.net import worker

    (tmp_path / "node_broken.py").write_text("raise RuntimeError('no luck')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SFG_PLUGINS", "node_broken")
    spec = tmp_path / "swarm.json"
    cfg = {"n_clients": 8, "rounds": 2, "graph": "ring:k=1", "rule": "node-fresh", "nodes": "real"}
    spec.write_text(json.dumps({"cfg": cfg}))
    assert worker.main([str(spec), "--nodes", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown rule 'node-fresh'"), err
    assert "plugin 'node_broken' (SFG_PLUGINS) failed to import" in err[0]
