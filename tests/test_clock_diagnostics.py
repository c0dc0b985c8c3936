"""The training diagnostics (docs/concepts/diagnostics.md#training-diagnostics) on the virtual clock's async and event protocols
(sfg.clock.diagnostics): every kind runs and carries the rounds' JSON shape; training is bit
for bit the same with and without them; the raw law, the lag law and the returning clients
equal slow oracles written here from the schedule, the staleness run and the models the run
made (captured as the training's pool receives them); the command line prints the fitted
rates."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import sfg.clock.train as clock_train
from sfg.cli.main import main
from sfg.clock.replay import staleness_events
from sfg.clock.schedule import LOCAL, OFFLINE, make_schedule, make_world
from sfg.clock.settings import HEADER_BYTES, make_settings
from sfg.clock.train import simulate_events
from sfg.round.kernel import FACTS
from sfg.round.rules import parse_rule
from sfg.sim.diagnostics import LATER, LAW_EVERY, RETURN_COLUMNS, binned_means
from sfg.sim.params import ParamSpec, load_flat
from sfg.sim.run import resolve_config
from sfg.world.data import load_federated
from sfg.world.models import make_model

F_AGE, F_LAG = FACTS.index("age"), FACTS.index("lag")
# a window of 4 units: messages wait whole units, so candidates have waited ages ≥ 1
BASE = dict(dataset="digits", model="mlp", n_clients=12, rounds=24, local_steps=2,
            process="bursty:u=0.6", graph="knn:k=4", seed=2, eval_every=8, clock="virtual",
            compute="const:value=30", latency="const:value=5", jitter=0.5, window=4,
            rule="sfg-l")
ALL = "raw,lag,finetune,returning"


def _settings(**over) -> dict:
    """BASE with ``over``; the event protocol has no timer, so no jitter (it refuses one)."""
    cfg = {**BASE, **over}
    if cfg.get("protocol") == "event":
        cfg.pop("jitter")
    return cfg


def _run(**over):
    return simulate_events(resolve_config(_settings(**over)))


def _finite_block(block: dict) -> None:
    for col, v in block.items():
        if isinstance(v, dict) and "sum" in v:
            assert all(math.isfinite(x) for x in v["sum"]), col
            assert all(c >= 0 for c in v["count"]), col


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_every_kind_runs_with_the_rounds_json_shape(protocol):
    d = _run(protocol=protocol, diagnostics=ALL)["diagnostics"]
    assert d["kinds"] == ["raw", "lag", "finetune", "returning"]
    bins, means, counts = binned_means(d["raw"], "ratio")
    assert counts.sum() > 0 and bins.max() >= 1 and np.isfinite(means).all()
    lag = d["lag"]
    assert lag["snapshots"] > 0
    for by in ("age", "lag"):
        assert sum(lag[by]["ratio"]["count"]) > 0
        _finite_block(lag[by])
    assert all(math.isfinite(lag[k]) for k in ("rho_age", "rho_lag", "rho_ratio"))
    ft = d["finetune"]
    assert ft["receivers"] > 0 and ft["own_loss"][1] > 0 and math.isfinite(ft["own_loss"][0])
    for col in ("before", "after", "loss", "acc"):
        assert sum(ft[col]["count"]) > 0, col
    _finite_block(ft)
    ret = d["returning"]
    assert ret["returns"] > 0
    assert set(RETURN_COLUMNS) <= set(ret)
    for col in ("loss_stale", "loss_agg", "loss_trained", "loss_later", "self_weight"):
        assert sum(ret[col]["count"]) > 0, col
    assert sum(ret["loss_later"]["count"]) <= ret["returns"]
    _finite_block(ret)
    json.dumps(d, allow_nan=False)  # strict JSON: every stored number is finite


def _same(a, b) -> bool:
    return (a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


@pytest.mark.parametrize("protocol", ["async", "event"])
@pytest.mark.parametrize("over", [{}, {"rule": "pwg"}, {"momentum": 0.5},
                                  {"rule": "sfg-cut",
                                   "attack": "forge:frac=0.25,claim=fresh,model=sign-flip"}])
@pytest.mark.crosspath
def test_diagnostics_never_change_training(protocol, over):
    """The same models, accuracies, curves, schedule and peak of models held, with every
    diagnostic and without (a rule reading models, whose staleness runs level by level, and
    an attack whose sent models differ from those trained, included)."""
    plain = _run(protocol=protocol, **over)
    diag = _run(protocol=protocol, diagnostics=ALL, **over)
    assert plain["diagnostics"] is None and diag["diagnostics"]["returning"]["returns"] > 0
    assert torch.equal(plain["params"], diag["params"])
    assert plain["accuracy"].tolist() == diag["accuracy"].tolist()
    assert plain["curves"] == diag["curves"]
    assert plain["metrics"].keys() == diag["metrics"].keys()
    assert all(_same(plain["metrics"][k], diag["metrics"][k]) for k in plain["metrics"])
    for k in ("schedule_digest", "client_steps", "levels", "peak_models"):
        assert plain["meta"][k] == diag["meta"][k], k


# ----------------------------------------------------------------------------- slow oracles
def _captured(monkeypatch, **over):
    """Run with diagnostics, keeping a copy of every model the training's pool receives
    (initial models: ids 0..N−1; local round r's output: id N + r)."""
    models: dict[int, torch.Tensor] = {}

    class Pool(clock_train._Pool):
        def __init__(self, X0, n_ids):
            super().__init__(X0, n_ids)
            for i in range(X0.shape[0]):
                models[i] = X0[i].clone()

        def put(self, ids, X):
            super().put(ids, X)
            for k, i in enumerate(ids.tolist()):
                models[i] = X[k].clone()

    monkeypatch.setattr(clock_train, "_Pool", Pool)
    cfg = resolve_config(_settings(**over))
    got = simulate_events(cfg)
    settings = make_settings(cfg)
    spec = ParamSpec.from_module(make_model("mlp", input_shape=(1, 8, 8), num_classes=10))
    settings = settings.with_bytes(4.0 * spec.D + HEADER_BYTES)
    world = make_world(settings, process=cfg["process"], graph=cfg["graph"],
                       n=cfg["n_clients"], rounds=cfg["rounds"], seed=cfg["seed"])
    sched = make_schedule(world, settings, local_steps=cfg["local_steps"], seed=cfg["seed"])
    assert sched.digest() == got["meta"]["schedule_digest"]
    st = staleness_events(parse_rule(cfg["rule"]), world, sched, seed=cfg["seed"])
    return got, models, sched, st, cfg


def _inputs(sched, N):
    """Per event: the model id its device reads before it (a plain loop over the events)."""
    own = np.full(sched.n_events, -1)
    last = list(range(N))
    for r in range(sched.n_events):
        if sched.kind[r] == LOCAL:
            own[r] = last[sched.dev[r]]
            last[sched.dev[r]] = N + r
    return own


def _d2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()) ** 2).sum())


def _means(pairs: list[tuple[int, float]]) -> dict[int, tuple[float, int]]:
    out: dict[int, list[float]] = {}
    for b, v in pairs:
        out.setdefault(b, []).append(v)
    return {b: (float(np.mean(v)), len(v)) for b, v in out.items()}


def _check(got: tuple[np.ndarray, np.ndarray, np.ndarray],
           want: dict[int, tuple[float, int]]) -> None:
    bins, means, counts = got
    assert bins.tolist() == sorted(want)
    for b, m, c in zip(bins, means, counts, strict=True):
        assert c == want[b][1] and m == pytest.approx(want[b][0], rel=1e-5), b


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_raw_and_lag_laws_equal_a_slow_oracle(protocol, monkeypatch):
    got, models, s, st, cfg = _captured(monkeypatch, protocol=protocol, diagnostics="raw,lag")
    N = cfg["n_clients"]
    own = _inputs(s, N)
    raw: list[tuple[int, float]] = []
    by_unit: dict[int, list[tuple[float, int, int]]] = {}
    for r in range(s.n_events):
        if s.kind[r] != LOCAL or s.t[r] % LAW_EVERY != 0:
            continue
        cands = []
        for c in range(s.cptr[r] + 1, s.cptr[r + 1]):
            m = s.cmsg[c]
            age = int(st["hdr"][0, m]) + math.floor(s.cwait[c])  # waited: τ + ⌊d⌋
            lag = float(st["hdr_lag"][m]) + float(s.cwait[c])  # ℓ + d
            cands.append((_d2(models[own[r]], models[N + m]), age, lag))
        ai, li = int(st["facts"][r, F_AGE]), float(st["facts"][r, F_LAG])
        for d, a, lg in cands:
            by_unit.setdefault(int(s.t[r]), []).append((d, abs(ai - a), round(abs(li - lg))))
        fresh = [d for d, a, _ in cands if a == 0]
        if ai == 0 and fresh and np.mean(fresh) > 0:
            raw += [(a, d / np.mean(fresh)) for d, a, _ in cands]
    assert any(b >= 1 for b, _ in raw)
    _check(binned_means(got["diagnostics"]["raw"], "ratio"), _means(raw))
    used: set[int] = set()
    for k, by in ((1, "age"), (2, "lag")):
        pairs = []
        for u, rows in by_unit.items():  # normalised per unit (the clock's snapshot)
            zero = [row[0] for row in rows if row[k] == 0]
            if zero and np.mean(zero) > 0:
                pairs += [(row[k], row[0] / np.mean(zero)) for row in rows]
                used.add(u)
        _check(binned_means(got["diagnostics"]["lag"][by], "ratio"), _means(pairs))
    assert got["diagnostics"]["lag"]["snapshots"] == len(used) > 1


def test_the_lag_law_normalises_each_snapshot_by_its_own_zero_difference_pairs():
    """Two snapshots (units) recorded together: each pair is divided by the mean over its
    own snapshot's pairs with no difference (by hand), not the pooled one."""
    from sfg.sim.diagnostics import Recorder

    rec = Recorder(["lag"], seed=1)
    # snapshot 0: zero-difference pair d = 2, a pair of age difference 1 with d = 6;
    # snapshot 5: zero-difference pairs d = 1 and 3 (mean 2), one of difference 1 with d = 10
    d = np.array([2.0, 6.0, 1.0, 3.0, 10.0])
    ages = (np.array([0, 0, 0, 0, 0]), np.array([0, 1, 0, 0, 1]))
    lags = (np.zeros(5), np.array([0.2, 1.4, 0.0, 2.6, 0.9]))  # rounded: 0, 1, 0, 3, 1
    rec.record_lag(d, ages, lags, np.array([0, 0, 5, 5, 5]))
    res = rec.result()["lag"]
    assert binned_means(res["age"], "ratio")[1].tolist() == [pytest.approx((1 + 0.5 + 1.5) / 3),
                                                             pytest.approx((3 + 5) / 2)]
    # lags: snapshot 0's zero pair d = 2 (ratio 1, then 6/2 = 3); snapshot 5's only zero
    # pair d = 1: 1, then 3/1 at difference 3, 10/1 at 1
    bins, means, _ = binned_means(res["lag"], "ratio")
    assert bins.tolist() == [0, 1, 3] and means.tolist() == [1.0, 6.5, 3.0]
    assert res["snapshots"] == 2


@pytest.mark.parametrize("protocol", ["async", "event"])
def test_returning_clients_equal_a_slow_oracle(protocol, monkeypatch):
    """A device's first local round after an offline span, D its age then: the loss of its
    stale model, of its output, of its model LATER units on (its last local round finished by
    then), and its rule's own weight — from the captured models, evaluated by a plain loop."""
    got, models, s, st, cfg = _captured(monkeypatch, protocol=protocol, diagnostics="returning")
    N = cfg["n_clients"]
    own = _inputs(s, N)
    data = load_federated("digits", n_clients=N, seed=cfg["seed"], data_root=None,
                          alpha=cfg["alpha"], partition=cfg["partition"])
    net = make_model("mlp", input_shape=tuple(data.input_shape), num_classes=data.num_classes)

    def loss(i: int, flat: torch.Tensor) -> float:
        with torch.no_grad():
            out = load_flat(net, flat)(data.val_x[i].float())
            return float(torch.nn.functional.cross_entropy(out, data.val_y[i]))

    stale, trained, later, weight = [], [], [], []
    prev_kind = [None] * N
    for r in range(s.n_events):
        i = int(s.dev[r])
        back = s.kind[r] == LOCAL and prev_kind[i] == OFFLINE
        prev_kind[i] = int(s.kind[r])
        if not back:
            continue
        D = int(st["facts"][r, F_AGE])
        stale.append((D, loss(i, models[own[r]])))
        trained.append((D, loss(i, models[N + r])))
        weight.append((D, float(st["weights"][s.cptr[r]])))
        q = s.time[r] + LATER * s.unit
        mine = [e for e in range(r, s.n_events)
                if s.kind[e] == LOCAL and s.dev[e] == i and s.end[e] <= q]
        if q <= s.horizon and mine:
            later.append((D, loss(i, models[N + mine[-1]])))
    ret = got["diagnostics"]["returning"]
    assert ret["returns"] == len(stale) > 0 and later
    for col, pairs in (("loss_stale", stale), ("loss_trained", trained), ("loss_later", later),
                       ("self_weight", weight)):
        _check(binned_means(ret, col), _means(pairs))


# ----------------------------------------------------------------------------- the command line
def test_the_command_line_prints_the_clock_s_fitted_rates(capsys):
    args = ["run", "--clock", "virtual", "--protocol", "async", "--diagnostics", "raw,lag",
            "-n", "12", "-T", "20", "-K", "2", "-p", "bursty:u=0.6", "--window", "4",
            "--compute", "const:value=30", "--jitter", "0.5", "--seed", "2"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lag = data["diagnostics"]["lag"]
    assert data["diagnostics"]["kinds"] == ["raw", "lag"] and lag["snapshots"] > 0
    assert isinstance(lag["rho_age"], float) and isinstance(lag["rho_lag"], float)
    assert main(args) == 0
    table = capsys.readouterr().out
    for label, k in (("ρ against ages", "rho_age"), ("ρ against lags", "rho_lag")):
        row = next(ln for ln in table.splitlines() if label in ln)
        assert f"{lag[k]:.4f}" in row


def test_a_grid_run_on_the_clock_keeps_its_diagnostics():
    """The grid runner's result carries them (the store and `sfg report` read that)."""
    from sfg.experiments.config import make_config
    from sfg.experiments.runner import run_config

    cfg = make_config(_settings(rounds=12, protocol="event", diagnostics="lag"), kind="train")
    out = run_config(cfg)
    assert out["diagnostics"]["kinds"] == ["lag"] and out["diagnostics"]["lag"]["snapshots"] > 0
