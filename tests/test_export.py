"""`sfg report --tensorboard DIR / --mlflow URI` (sfg.experiments.report.export): a real store from tiny grids,
exported, read back with TensorBoard's and MLflow's own readers and compared with the store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    SCALARS,
    TENSORS,
    EventAccumulator,
)
from tensorboard.plugins.hparams import metadata as hparams_metadata  # noqa: E402

from sfg.cli.main import main  # noqa: E402
from sfg.experiments.store import Store  # noqa: E402

REPLAY = "base: {kind: replay, n_clients: 12, rounds: 20, horizon: 5}\n"
GRIDS = {
    # 2 processes x 2 rules x 2 seeds of model-free replay: curves carry a `round` curve
    "tiny-replay": REPLAY + 'processes: ["none", "bursty:u=0.8"]\nrules: [dfedavg, sfg-cut]\n'
                            "seeds: [1, 2]\n",
    # one run of tiny-replay again: a run that two grids share is filed under both
    "subset": REPLAY + 'processes: ["none"]\nrules: [dfedavg]\nseeds: [1]\n',
    # selftest curves have no `round` curve: steps are positions
    "tiny-self": "base: {kind: selftest, n_clients: 10, rounds: 10, eval_every: 5}\n"
                 'processes: ["none"]\nrules: [sfg]\nseeds: [3]\n',
}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("export")
    path = tmp / "results.sqlite"
    for name, text in GRIDS.items():
        grid = tmp / f"{name}.yaml"
        grid.write_text(f"name: {name}\n{text}")
        assert main(["grid", "run", str(grid), "--store", str(path), "--no-progress"]) == 0
    return path


def expected(path: Path) -> dict[tuple[str, str], dict]:
    """``{(grid, run id): store record}`` read straight from the store."""
    with Store(path, create=False) as s:
        grids, recs = s.grids(), s.records()
    return {(g, r["run_id"]): r for r in recs for g in grids[r["run_id"]]}


def same(a, b) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def f32(v: float) -> float:
    return float(np.float32(v))


def param(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def read_tensorboard(root: Path) -> dict[tuple[str, str], tuple[Path, EventAccumulator, dict]]:
    """Every run folder under ``root``, keyed by the (grid, sfg run id) its HParams name."""
    out = {}
    for events in root.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent), size_guidance={SCALARS: 0, TENSORS: 0})
        acc.Reload()
        content = acc.PluginTagToContent("hparams")[hparams_metadata.SESSION_START_INFO_TAG]
        info = hparams_metadata.parse_session_start_info_plugin_data(content)
        hp = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
              for k, v in info.hparams.items()}
        key = (hp["grid"], hp["sfg_run_id"])
        assert key not in out
        out[key] = (events.parent.relative_to(root), acc, hp)
    return out


def test_tensorboard_events_hold_the_store(store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--store", str(store), "--tensorboard", "tb"]) == 0
    assert "tensorboard: 10 runs written" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()  # exporting alone writes no report
    want = expected(store)
    got = read_tensorboard(tmp_path / "tb")
    assert set(got) == set(want) and len(want) == 10
    assert {g for g, _ in want} == set(GRIDS)
    for (grid, rid), rec in want.items():
        folder, acc, hp = got[(grid, rid)]
        cfg = rec["config"]
        assert folder == Path(grid, rec["dataset"], rec["process"], rec["rule"],
                              f"seed={rec['seed']}-{rid[:8]}")
        for k, v in cfg.items():  # every resolved setting is an hparam
            assert hp[k] == (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                             else v if isinstance(v, (str, bool)) else json.dumps(v)), k
        curves = {n: c for n, c in rec["curves"].items() if n != "round"}
        assert set(acc.Tags()["scalars"]) == ({f"curve/{n}" for n in curves}
                                              | {f"final/{m}" for m in rec["metrics"]})
        rounds = rec["curves"].get("round")
        for name, values in curves.items():
            events = acc.Scalars(f"curve/{name}")
            steps = [int(r) for r in rounds] if rounds else list(range(len(values)))
            assert [e.step for e in events] == steps
            assert all(same(e.value, f32(v)) for e, v in zip(events, values, strict=True))
        for name, value in rec["metrics"].items():
            (event,) = acc.Scalars(f"final/{name}")
            assert event.step == cfg["rounds"] and same(event.value, f32(value))
    # a curve that has a round curve is stepped by it; selftest's by position
    replay = next(r for (g, _), r in want.items() if g == "tiny-replay")
    assert replay["curves"]["round"][:3] == [0.0, 1.0, 2.0]


def test_mlflow_runs_hold_the_store(store, tmp_path, monkeypatch, capsys):
    uri = (tmp_path / "mlruns").as_uri()
    assert main(["report", "--store", str(store), "--mlflow", uri]) == 0
    assert "mlflow: 10 runs written" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    want = expected(store)
    seen = set()
    for grid in GRIDS:
        exp = client.get_experiment_by_name(grid)
        assert exp is not None
        for run in client.search_runs([exp.experiment_id]):
            tags = run.data.tags
            key = (grid, tags["sfg_run_id"])
            assert key in want and key not in seen
            seen.add(key)
            rec = want[key]
            assert run.info.status == "FINISHED"
            assert run.info.run_name == f"{rec['dataset']}/{rec['process']}/{rec['rule']}/" \
                                        f"seed={rec['seed']}"
            assert {k: tags[k] for k in ("grid", "dataset", "process", "rule", "seed", "kind")} \
                == {"grid": grid, "dataset": rec["dataset"], "process": rec["process"],
                    "rule": rec["rule"], "seed": str(rec["seed"]), "kind": rec["config"]["kind"]}
            assert run.data.params == {k: param(v) for k, v in rec["config"].items()}
            finals = {k: v for k, v in run.data.metrics.items() if not k.startswith("curve/")}
            assert finals.keys() == rec["metrics"].keys()
            assert all(same(finals[k], v) for k, v in rec["metrics"].items())
            rounds = rec["curves"].get("round")
            curves = {n: c for n, c in rec["curves"].items() if n != "round"}
            assert {k for k in run.data.metrics if k.startswith("curve/")} == \
                {f"curve/{n}" for n in curves}
            for name, values in curves.items():
                hist = sorted(client.get_metric_history(run.info.run_id, f"curve/{name}"),
                              key=lambda m: m.step)
                steps = [int(r) for r in rounds] if rounds else list(range(len(values)))
                assert [m.step for m in hist] == steps
                assert all(same(m.value, v) for m, v in zip(hist, values, strict=True))
    assert seen == set(want)


def test_exporting_again_adds_nothing(store, tmp_path, monkeypatch, capsys):
    tb, uri = tmp_path / "tb", f"file:{tmp_path / 'ml'}"
    args = ["report", "--store", str(store), "--tensorboard", str(tb), "--mlflow", uri]
    assert main(args) == 0
    files = {p: p.read_bytes() for p in tb.rglob("*") if p.is_file()}
    assert len(files) == 10
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "tensorboard: 0 runs written" in err and "mlflow: 0 runs written" in err
    assert err.count("10 already there") == 2
    assert {p: p.read_bytes() for p in tb.rglob("*") if p.is_file()} == files

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tiny-replay")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 8 and len({r.data.tags["sfg_run_id"] for r in runs}) == 8
    # an export interrupted after creating a run: the unfinished run is replaced
    victim = runs[0]
    client.delete_run(victim.info.run_id)
    client.create_run(exp.experiment_id, tags={"sfg_run_id": victim.data.tags["sfg_run_id"]})
    next(tb.rglob("events.out.tfevents.*")).unlink()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "tensorboard: 1 runs written" in err and "9 already there" in err
    assert "mlflow: 1 runs written" in err
    again = client.search_runs([exp.experiment_id])
    assert len(again) == 8 and all(r.info.status == "FINISHED" for r in again)
    assert len({r.data.tags["sfg_run_id"] for r in again}) == 8
    assert len(list(tb.rglob("events.out.tfevents.*"))) == 10


def test_report_and_export_together_runs_without_grid_name(tmp_path, capsys):
    """Runs queued without a grid name are filed under the store's name."""
    from sfg.experiments.config import make_config

    path = tmp_path / "older.sqlite"
    configs = [make_config(rule=rule, seed=seed) for rule in ("dfedavg", "sfg")
               for seed in (1, 2, 3)]
    with Store(path) as s:
        ids = s.add_runs(configs)
        for cfg in configs:
            rid, _ = s.claim(ids, "host:1:w")
            acc = 0.5 + 0.01 * cfg.seed + (0.03 if cfg.rule == "sfg" else 0.0)
            metrics = {"acc_mean": acc, "acc_p10": acc - 0.2, "acc_time_avg": acc - 0.1,
                       **{f"acc_q{q}": acc for q in range(1, 5)}, "messages": 100.0,
                       "scalars": 0.0, "local_steps_rel": 1.0}
            assert s.finish(rid, "host:1:w", {"metrics": metrics, "curves": {
                "round": [5.0, 10.0], "acc_mean": [acc / 2, acc]}}, seconds=0.1)
    rc = main(["report", "--store", str(path), "--out", str(tmp_path / "rep"),
               "--tensorboard", str(tmp_path / "tb")])
    assert rc == 0 and (tmp_path / "rep" / "report.md").exists()
    got = read_tensorboard(tmp_path / "tb")
    assert {g for g, _ in got} == {"older"} and len(got) == 6
    _, acc, _ = next(iter(got.values()))
    assert [e.step for e in acc.Scalars("curve/acc_mean")] == [5, 10]


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("flag, missing", [("--tensorboard", "tensorboard"),
                                           ("--mlflow", "mlflow")])
def test_missing_package_is_one_error_line(store, tmp_path, flag, missing):
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            "from sfg.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", code, "report", "--store", str(store),
                          "--tensorboard", str(out / "tb"), "--mlflow", f"file:{out / 'ml'}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    line = one_error(res.stderr)
    assert flag in line and "pip install 'sfg[export]'" in line
    assert not out.exists()  # checked before anything is written


def test_bad_folders_and_uris_are_one_error_line(store, tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (["--tensorboard", str(a_file)], "is a file"),
        (["--tensorboard", str(a_file / "tb")], "cannot write TensorBoard events"),
        (["--mlflow", f"file:{a_file / 'ml'}"], "cannot create"),
        (["--mlflow", a_file.as_uri()], "is a file"),
        (["--mlflow", "file://elsewhere/ml"], "not a host"),
        (["--mlflow", "bogus://x"], "cannot open bogus: stores"),
        (["--mlflow", ""], "needs a tracking URI"),
    ]
    for extra, why in cases:
        assert main(["report", "--store", str(store), *extra]) == 2, extra
        assert why in one_error(capsys.readouterr().err), extra
    assert main(["report", "--store", str(tmp_path / "none.sqlite"), "--tensorboard",
                 str(tmp_path / "tb")]) == 2
    assert "does not exist" in one_error(capsys.readouterr().err)
