"""The front door (sfg.api): ``import sfg`` gives every job as a function taking a RunConfig or
keywords with its names, returning one result type; ``import sfg`` itself loads nothing heavy;
the docstrings' examples run."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from running import bounded

import sfg
from sfg.errors import SfgError

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n_clients": 8, "rounds": 5}


def _python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------------------ import sfg
def test_import_sfg_loads_neither_torch_nor_numba():
    r = _python("""
        import sys
        import sfg
        heavy = [m for m in ("torch", "numba", "pydantic", "yaml", "scipy") if m in sys.modules]
        print(heavy)
        names = dir(sfg)
        for name in ("run", "replay", "swarm", "grid", "parse_rule", "rules", "config",
                     "RunConfig", "RunResult", "GridResult"):
            assert name in names, name
        print(callable(sfg.replay), callable(sfg.run))
        """)
    assert r.returncode == 0, r.stderr
    heavy, callables = r.stdout.splitlines()
    assert heavy == "[]", f"import sfg loaded {heavy}"
    assert callables == "True True"


def test_replay_is_a_plain_function_whatever_is_imported_first():
    """``sfg.replay`` is a function with a real signature (sfg.run's names), whether the
    model-free package or its old name was imported first; the old paths still import, with a
    DeprecationWarning naming the new home."""
    r = _python("""
        import inspect
        import warnings
        warnings.simplefilter("error")
        import sfg.modelfree.api             # the package first
        import sfg
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from sfg.replay import replay_trace
            from sfg.replay.metrics import columns
        assert replay_trace is sfg.modelfree.replay_trace and columns.__module__ == "sfg.modelfree.metrics"
        assert [w.category for w in caught] == [DeprecationWarning] * 2, caught
        assert all("sfg.modelfree" in str(w.message) for w in caught)
        params = inspect.signature(sfg.replay).parameters
        print(inspect.isfunction(sfg.replay), list(params)[1:6])
        res = sfg.replay(n_clients=8, rounds=5)
        print(type(res).__name__, inspect.isfunction(sfg.replay))
        """)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "True ['n_clients', 'rounds', 'rule', 'process', 'seed']"
    assert lines[1] == "RunResult True"


def test_replay_takes_one_value_or_a_list_and_gives_rows():
    """``rule``, ``process`` and ``seed`` each one value or a list: a list gives one run per
    combination, each the run its single values give; ``.rows()`` either way; the old
    ``sfg.replay.replay(processes, rules, seeds, n=, T=)`` gives the same numbers, with a
    DeprecationWarning."""
    base = dict(n_clients=12, rounds=8, graph="ring:k=1", horizon=4)
    many = sfg.replay(**base, rule=["dfedavg", "sfg-cut"], process="bursty:u=0.5", seed=[1, 2])
    rows = many.rows()
    assert [(r["rule"], r["seed"]) for r in rows] == [("dfedavg", 1), ("dfedavg", 2),
                                                     ("sfg-cut", 1), ("sfg-cut", 2)]
    one = sfg.replay(**base, rule="sfg-cut", process="bursty:u=0.5", seed=2)
    assert one.rows() == [one.row()] and rows[3] == one.row()
    assert len(many) == 4 and many[3].metrics == one.metrics
    with pytest.warns(DeprecationWarning, match=r"sfg.replay\(process=\[...\]"):
        old = sfg.replay.replay(["bursty:u=0.5"], ["sfg-cut"], [2], n=12, T=8,
                                graph="ring:k=1", horizon=4)
    assert old[0]["premise"] == one.metrics["premise"]
    with pytest.raises(sfg.SfgError, match="rule=\\[\\] names no rule"):
        sfg.replay(**base, rule=[])


def test_a_job_without_its_extra_is_one_line_naming_it():
    r = _python("""
        import sys
        sys.modules["torch"] = None      # as if the 'train' extra were not installed
        import sfg
        try:
            sfg.run(n_clients=8, rounds=5)
        except sfg.SfgError as e:
            print(e)
        """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "run needs the 'train' extra" in r.stdout and "sfg[train]" in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 1


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'simulate'"):
        sfg.simulate  # noqa: B018


# ------------------------------------------------------------------------ one run
def test_run_trains_on_the_rounds():
    res = sfg.run(**TINY, rule="sfg-cut")
    assert isinstance(res, sfg.RunResult)
    assert 0.0 <= res.metrics["acc_mean"] <= 1.0
    assert res.curves["round"] == [5.0]
    assert res.params.shape[0] == 8 and res.accuracy.shape == (8,)
    assert res.meta["config"]["rule"] == "sfg-cut" and res.meta["config"]["kind"] == "train"
    assert len(res.meta["run_id"]) == 16
    assert res["metrics"] is res.metrics and set(res.summary()) >= {"metrics", "curves"}


@pytest.mark.parametrize("protocol", ["lockstep", "event"])
def test_run_trains_on_the_clock_in_the_same_call(protocol):
    res = sfg.run(**TINY, clock="virtual", protocol=protocol, compute="const:value=30")
    assert res.meta["protocol"] == protocol and res.meta["clock"] == "virtual"
    assert "hours" in res.curves and 0.0 <= res.metrics["acc_mean"] <= 1.0


def test_keywords_a_mapping_and_a_run_config_give_the_same_run():
    kw = {**TINY, "seed": 3, "rule": "sfg-cut", "process": "bursty:u=0.5"}
    a = sfg.run(**kw)
    b = sfg.run(sfg.RunConfig(**kw))
    c = sfg.run(kw)
    d = sfg.run(sfg.config(seed=3), **{k: v for k, v in kw.items() if k != "seed"})
    for other in (b, c, d):
        assert other.metrics == a.metrics
        assert other.meta["run_id"] == a.meta["run_id"]
        assert np.array_equal(np.asarray(other.params), np.asarray(a.params))
    e = sfg.run(**{**kw, "seed": 4})  # and the comparison can fail
    assert e.meta["run_id"] != a.meta["run_id"]
    assert not np.array_equal(np.asarray(e.params), np.asarray(a.params))


def test_a_settings_file_is_a_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("kind: selftest\nn_clients: 8\nrounds: 5\nseed: 3\n")
    res = sfg.run(path, rounds=4)
    assert res.meta["config"]["seed"] == 3 and res.meta["config"]["rounds"] == 4
    assert res.metrics == sfg.run(kind="selftest", n_clients=8, rounds=4, seed=3).metrics
    path.write_text("n_clients: 8\nrondz: 5\n")
    with pytest.raises(SfgError, match=r"'rondz'; did you mean 'rounds'\? \(config file "):
        sfg.run(str(path))
    with pytest.raises(SfgError, match="does not exist|not found|no such"):
        sfg.run(tmp_path / "missing.yaml")


def test_automatic_eval_every_and_horizon_follow_a_new_rounds():
    cfg = sfg.config(n_clients=8, rounds=300)
    assert cfg.eval_every == 10
    res = sfg.run(cfg, rounds=5)
    assert res.meta["config"]["eval_every"] == 5
    rep = sfg.replay(sfg.config(kind="replay", n_clients=8, rounds=100), rounds=10)
    assert rep.meta["config"]["horizon"] == 10
    # given, they stay: a period longer than the run is refused
    with pytest.raises(SfgError, match="eval_every"):
        sfg.run(sfg.config(n_clients=8, rounds=300, eval_every=20), rounds=5)


def test_selftest_kind_runs_and_progress_is_reported():
    seen: list[tuple[int, int]] = []
    res = sfg.run(kind="selftest", n_clients=8, rounds=5, progress=lambda d, t: seen.append((d, t)))
    assert set(res.metrics) >= {"final_acc", "messages"} and res.accuracy is None
    assert seen == [(t, 5) for t in range(1, 6)]
    seen.clear()
    sfg.run(**TINY, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (5, 5)


# ------------------------------------------------------------------------ replay
def test_replay_on_the_rounds_and_on_the_clock():
    res = sfg.replay(n_clients=16, rounds=10, rule="sfg-cut", process="bursty:u=0.5")
    assert isinstance(res, sfg.RunResult)
    assert res.meta["config"]["kind"] == "replay" and res.meta["config"]["horizon"] == 10
    assert 0.0 <= res.metrics["premise"] <= 1.0 and len(res.curves["mean_age"]) == 10
    assert "accuracy" not in res
    on_clock = sfg.replay(n_clients=16, rounds=10, clock="virtual", protocol="event",
                          compute="const:value=30")
    assert on_clock.meta["protocol"] == "event" and "hours" in on_clock.curves
    assert sfg.run(kind="replay", n_clients=16, rounds=10, rule="sfg-cut",
                   process="bursty:u=0.5").metrics == res.metrics


def test_a_training_config_replays():
    train = sfg.config(n_clients=16, rounds=10, rule="sfg-cut")
    res = sfg.replay(train)
    assert res.meta["config"]["kind"] == "replay" and res.meta["config"]["rule"] == "sfg-cut"


def test_replay_refuses_a_model_reading_rule():
    with pytest.raises(SfgError, match="reads model parameters") as e:
        sfg.replay(n_clients=16, rounds=10, rule="sfg-cut+clip")
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------ swarm
def test_virtual_swarm_is_the_node_on_the_virtual_clock():
    kw = {**TINY, "protocol": "async", "period": 600.0, "compute": "const:value=30",
          "latency": "const:value=2"}
    res = bounded(lambda: sfg.swarm(**kw), 300)
    assert isinstance(res, sfg.RunResult) and res.meta["engine"] == "node-async"
    assert len(res["nodes"]) == 8 and res.params.shape[0] == 8
    assert res.metrics["virtual_seconds"] > 0
    again = bounded(lambda: sfg.swarm(sfg.config(**kw, clock="virtual")), 300)  # same bits
    assert np.array_equal(again.params, res.params)
    lock = bounded(lambda: sfg.swarm(**TINY), 300)
    assert lock.meta["engine"] == "node-lockstep" and len(lock["nodes"]) == 8


def test_real_swarm_on_loopback():
    pytest.importorskip("grpc")
    res = bounded(lambda: sfg.swarm(n_clients=4, rounds=5, graph="ring", nodes="real", procs=1,
                                    deadline=60.0), 300)
    assert res.meta["engine"] == "real-lockstep" and len(res["nodes"]) == 4
    assert res.meta["config"]["nodes"] == "real" and res.meta["config"]["backend"] == "loop"
    assert 0.0 <= res.metrics["acc_mean"] <= 1.0


@pytest.mark.parametrize("kw, match", [
    ({"protocol": "event"}, "lockstep or async"),
    ({"clock": "rounds"}, "nodes='real'"),
    ({"nodes": "cloud"}, "not one of virtual"),
])
def test_swarm_refusals_are_one_line(kw, match):
    with pytest.raises(SfgError, match=match) as e:
        sfg.swarm(**TINY, **kw)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------ bad settings
@pytest.mark.parametrize("job", ["run", "replay", "swarm", "config"])
@pytest.mark.parametrize("kw, message", [
    ({"n": 8}, "unknown run setting 'n'; did you mean 'n_clients'?"),
    ({"T": 5}, "unknown run setting 'T'; did you mean 'rounds'?"),
    ({"roundz": 5}, "unknown run setting 'roundz'; did you mean 'rounds'?"),
])
def test_an_unknown_keyword_is_one_line_naming_it(job, kw, message):
    with pytest.raises(SfgError) as e:
        getattr(sfg, job)(**kw)
    assert str(e.value) == f"sfg.{job}: {message}"


def test_bad_values_and_bad_configs_are_one_line():
    for call, match in [
        (lambda: sfg.run(n_clients=1), "n_clients must be >= 2"),
        (lambda: sfg.run(rule="no-such-rule", **TINY), "no-such-rule"),
        (lambda: sfg.run({"n_clients": 8, "rondz": 3}), "'rondz'; did you mean 'rounds'"),
        (lambda: sfg.run(42), "not a int"),
        (lambda: sfg.run(["n_clients"]), "not a list"),
    ]:
        with pytest.raises(SfgError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------------ grid
def test_grid_to_a_sqlite_store_returns_its_results(tmp_path):
    spec = {"name": "tiny", "base": {"kind": "replay", "n_clients": 16, "rounds": 10},
            "rules": ["dfedavg", "sfg-cut"], "seeds": [1, 2]}
    store = tmp_path / "results.sqlite"
    out = sfg.grid(spec, store=store)
    assert isinstance(out, sfg.GridResult) and out.ok and out.name == "tiny"
    assert out.store == store and store.is_file()
    assert len(out) == 4 and out.summary.done == 4 and not out.failures
    assert [(r["rule"], r["seed"]) for r in out.rows()] == [
        ("dfedavg", 1), ("dfedavg", 2), ("sfg-cut", 1), ("sfg-cut", 2)]
    # each run's result is the one sfg.run gives for its config, read back from the store
    for cfg, res in zip(out.configs, out, strict=True):
        alone = sfg.run(cfg)
        assert res.meta["run_id"] == alone.meta["run_id"]
        assert res.metrics == pytest.approx(alone.metrics, nan_ok=True)
        assert res.curves["mean_age"] == pytest.approx(alone.curves["mean_age"])
    with sfg.Store(store, create=False, readonly=True) as s:
        assert s.counts()["done"] == 4 and s.grids() == {r: ["tiny"] for r in out.run_ids}
    again = sfg.grid(spec, store=store)  # resumes: nothing left to run
    assert again.summary.already_done == 4 and again.summary.done == 4
    assert [r.metrics for r in again] == [r.metrics for r in out]


def test_a_training_grid_gives_what_sfg_run_gives(tmp_path):
    out = sfg.grid({"base": {**TINY, "process": "bursty:u=0.5"}, "rules": ["dfedavg", "sfg-cut"]},
                   store=tmp_path / "train.sqlite")
    assert out.ok and [r["rule"] for r in out.rows()] == ["dfedavg", "sfg-cut"]
    for cfg, res in zip(out.configs, out, strict=True):
        alone = sfg.run(cfg)
        assert res.metrics == pytest.approx(alone.metrics, nan_ok=True)
        assert res.curves["acc_mean"] == pytest.approx(alone.curves["acc_mean"])
    assert out.results[0].metrics["acc_mean"] != out.results[1].metrics["acc_mean"]


def test_grid_from_a_file_a_list_of_configs_and_a_default_store(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("base: {kind: selftest, n_clients: 8, rounds: 5}\nseeds: [1, 2]\n")
    out = sfg.grid(path, store=tmp_path / "a.sqlite")
    assert out.name == "g" and out.ok and len(out) == 2
    listed = sfg.grid([sfg.config(kind="selftest", n_clients=8, rounds=5, seed=s)
                       for s in (1, 2)])
    assert listed.store.is_file() and listed.run_ids == out.run_ids
    assert [r.metrics for r in listed] == [r.metrics for r in out]


def test_grid_bad_input_is_one_line(tmp_path):
    for spec, match in [(tmp_path / "missing.yaml", "does not exist"),
                        ({"base": {"kind": "replay"}, "rulez": ["sfg"]}, "unknown grid key"),
                        (None, "give a grid file's path")]:
        with pytest.raises(SfgError, match=match) as e:
            sfg.grid(spec, store=tmp_path / "x.sqlite")
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------------ rules
def test_parse_rule_and_rules():
    rule = sfg.parse_rule("sfg-cut:L=2")
    assert isinstance(rule, sfg.Rule) and rule.params["L"] == 2
    w = rule.weights_one(ages=[3, 0, 1], lags=[3.0, 0.5, 1.2], counts=[4, 9, 8], t=10)
    assert w.sum() == pytest.approx(1.0)
    listed = sfg.rules()
    assert {"dfedavg", "sfg-cut"} <= set(listed)
    assert listed["sfg-cut"]["params"]["L"] == 1.0 and listed["sfg-cut"]["doc"]
    assert set(sfg.rules("sfg")) < set(listed)
    with pytest.raises(SfgError, match="did you mean"):
        sfg.parse_rule("sfg-cutt")


# ------------------------------------------------------------------------ the docstrings
def _examples() -> list:
    from sfg import api

    out = []
    for name in ["module", *api.__all__]:
        doc = inspect.getdoc(api if name == "module" else getattr(api, name)) or ""
        for k, code in enumerate(re.findall(r"```python\n(.*?)```", doc, flags=re.S)):
            out.append(pytest.param(code, id=f"{name}-{k}"))
    return out


def test_every_job_has_an_example():
    from sfg import api

    documented = {p.id.split("-")[0] for p in _examples()}
    assert documented >= {"module", "run", "replay", "swarm", "grid", "parse_rule", "rules",
                          "config"}
    assert all(len(inspect.getdoc(getattr(api, n)) or "") > 200 for n in api.__all__)


@pytest.mark.parametrize("code", _examples())
def test_docstring_example_runs(code, tmp_path):
    r = _python(code, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.strip()


def test_results_go_into_a_table():
    """``RunResult.row()`` is one flat dict of plain values (settings, then metrics) from
    every engine; a list of them is a pandas table; the repr is one short line; ``params`` is
    a numpy float32 [N, D] array from ``sfg.run`` (rounds and clock) and ``sfg.swarm``."""
    pd = pytest.importorskip("pandas")
    tiny = dict(n_clients=6, rounds=2, local_steps=1, batch_size=8, graph="ring:k=1",
                process="iid:u=0.5")
    results = [sfg.run(**tiny), sfg.run(**tiny, clock="virtual", protocol="async"),
               sfg.swarm(**tiny, protocol="async")]
    rows = [r.row() for r in results]
    assert [r["engine"] for r in rows] == ["rounds", "clock-async", "node-async"]
    for res, row in zip(results, rows, strict=True):
        assert list(row)[:8] == ["run_id", "engine", "kind", "rule", "process", "seed",
                                 "n_clients", "rounds"]
        assert row["run_id"] == res.meta["run_id"] and row["n_clients"] == 6
        assert all(isinstance(v, (str, int, float)) for v in row.values()), row
        assert {k: row[k] for k in res.metrics} == res.metrics
        assert isinstance(res.params, np.ndarray) and res.params.dtype == np.float32
        assert res.params.shape[0] == 6
        text = repr(res)
        assert "\n" not in text and len(text) <= 160 and text.startswith("RunResult(engine=")
    table = pd.DataFrame(rows)
    assert table.shape[0] == 3 and table["acc_mean"].dtype == np.float64
