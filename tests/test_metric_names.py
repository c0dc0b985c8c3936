"""One vocabulary of results (sfg.metrics): every metric an engine reports is registered for
that engine; on the same run the node and the clock's engine report the same value under every
name both report; a store written by 0.2.0 reads with today's names and reports the same
numbers.

Every engine runs a tiny run (8 clients, 3 rounds, digits, mlp), with the settings under which
its conditional metrics appear (a pull on return, faults, a certified rule); real nodes once,
over gRPC on loopback.
"""

from __future__ import annotations

import math
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sfg
from sfg import metrics as reg
from sfg.engines import ENGINES

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "metrics.md"
FIXTURES = Path(__file__).parent / "fixtures" / "metric_names"

BASE: dict[str, Any] = dict(dataset="digits", model="mlp", n_clients=8, rounds=3,
                            local_steps=2, batch_size=8, graph="knn:k=3",
                            process="bursty:u=0.5", seed=1)
# the settings under which each engine's conditional metrics appear
PULL = dict(on_return="pull:timeout=60", latency="const:value=20")
ENGINE_RUNS: dict[str, list[dict[str, Any]]] = {
    "rounds": [dict(rule="sfg-cut+certified"),
               dict(rule="sfg-cut", attack="forge:frac=0.3,claim=fresh,model=constant")],
    "clock-lockstep": [dict(rule="sfg-cut+certified", compute="const:value=10")],
    "clock-async": [dict(rule="sfg-cut", loss="const:value=0.2", faults="faults:loss=0.2",
                         rounds=6, **PULL)],
    "clock-event": [dict(rule="sfg-cut", compute="const:value=100", faults="faults:loss=0.2",
                         rounds=6, **PULL)],
    "node-lockstep": [dict(rule="sfg-cut", compute="const:value=10")],
    "node-async": [dict(rule="sfg-cut", faults="faults:loss=0.2", rounds=6, **PULL)],
}
# real nodes: one small run (wall time), lockstep; async with a pull where it is an engine
REAL_RUNS: dict[str, dict[str, Any]] = {"lockstep": dict(rule="sfg-cut"),
                                        "async": dict(rule="sfg-cut", period=0.2,
                                                      on_return="pull:timeout=0.05")}


def _runs(engine: str) -> list[dict[str, Any]]:
    if engine.startswith("real-"):
        proto = "async" if engine.endswith("-async") else "lockstep"
        return [dict(REAL_RUNS[proto], protocol=proto)]
    return ENGINE_RUNS[engine]


_RUNS: dict[str, Any] = {}


def _engine_run(engine: str, over: dict[str, Any]):
    """``engine``'s run of BASE with ``over`` (each run once per session)."""
    key = repr((engine, sorted(over.items())))
    if key not in _RUNS:
        _RUNS[key] = _run_engine(engine, over)
    return _RUNS[key]


def _run_engine(engine: str, over: dict[str, Any]):
    cfg = {**BASE, **over}
    if engine.startswith("real-"):
        return sfg.swarm(nodes="real", procs=0, deadline=60, **cfg)
    kind, _, proto = engine.partition("-")
    if kind == "node":
        return sfg.swarm(nodes="virtual", **{**cfg, "protocol": proto})
    if kind == "clock":
        return sfg.run(clock="virtual", **{**cfg, "protocol": proto})
    return sfg.run(**cfg)


# ----------------------------------------------------------------------------- the registry
def test_registry_names_engines_that_exist_and_each_name_once():
    assert len({m.name for m in reg.METRICS}) == len(reg.METRICS)
    for m in reg.METRICS:
        assert m.engines and set(m.engines) <= set(reg.REPORTERS), m.name
        assert m.unit and m.definition and "\n" not in m.definition, m.name
    assert set(ENGINES) < set(reg.REPORTERS)
    # the mapping of old names leads to registered names only
    for kind, table in reg.RENAMED.items():
        for old, new in table.items():
            assert new is None or new in reg.BY_NAME, (kind, old, new)


def test_metrics_module_imports_nothing_heavy():
    code = ("import sys, sfg.metrics; bad = [m for m in ('torch', 'numba', 'pydantic', "
            "'numpy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_reference_page_is_the_generated_table():
    assert PAGE.read_text(encoding="utf-8") == reg.markdown(), \
        "run: python -m sfg.metrics docs/reference/metrics.md"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "reference/metrics.md" in nav


# ----------------------------------------------------------------------------- every engine
@pytest.mark.parametrize("engine", ENGINES)
def test_every_metric_an_engine_reports_is_registered_for_it(engine):
    allowed = reg.reported_by(engine)
    for over in _runs(engine):
        got = set(_engine_run(engine, over).metrics)
        unknown = sorted(got - set(reg.BY_NAME))
        assert not unknown, f"engine {engine} reports metrics not in sfg.metrics: {unknown}"
        other = sorted(got - allowed)
        assert not other, f"engine {engine} reports metrics registered for other engines " \
                          f"only: {other}"


@pytest.mark.parametrize("clock", [None, "virtual"])
def test_every_metric_the_replay_reports_is_registered_for_it(clock):
    over = dict(rule="sfg-cut+certified") if clock is None else \
        dict(clock="virtual", protocol="async", rule="sfg-cut", **PULL)
    res = sfg.replay(**{**BASE, "rounds": 12, "horizon": 4, **over})
    got = set(res.metrics)
    assert not sorted(got - reg.reported_by(reg.REPLAY)), sorted(got - reg.reported_by("replay"))
    assert "returning_aggregations" in got
    if clock:
        assert {"returns", "returns_heard", "bytes", "messages_sent"} <= got


# ----------------------------------------------------------------------------- the same run
# counts that do not read the models: equal exactly; the accuracy figures: equal where the two
# engines train the same models at the same instants
COUNTS_OF_TIME = {"time_to_accuracy_h", "reached_target"}
SAME_RUNS = {
    "lockstep": dict(protocol="lockstep", compute="const:value=10"),
    "async": dict(protocol="async", loss="const:value=0.2", compute="const:value=10",
                  jitter=0.3),
    "async-pull": dict(protocol="async", compute="const:value=10", jitter=0.3,
                       uplink="const:value=1e5", loss="const:value=0.2", **PULL),
    "async-pull-faults": dict(protocol="async", faults="faults:loss=0.2,dup=0.2", **PULL),
    # transfers a device's outage cuts short: sent only when they end with the sender online
    "async-slow-uplink": dict(protocol="async", uplink="const:value=300", compute="const:value=10",
                              jitter=0.5),
}
# the names the node and the clock's engine both report on the runs above (the test fails when
# one of them stops reporting one)
SHARED = {
    "lockstep": {"messages", "scalars", "messages_sent", "bytes", "local_rounds",
                 "unavailability", "local_steps_rel"},
    "async": {"messages", "scalars", "messages_sent", "bytes", "local_rounds", "interrupted",
              "skipped",
              "unfinished", "returns", "returns_heard", "unavailability", "local_steps_rel"},
}
SHARED["async-pull"] = SHARED["async"] | {
    "pull_requests", "pull_replies", "pull_empty", "pull_unreachable", "pull_replies_delivered",
    "pull_bytes", "pull_wait_seconds", "pull_abandoned"}
ACCURACY = {"acc_mean", "acc_p10", "acc_q1", "acc_q2", "acc_q3", "acc_q4", "acc_time_avg",
            *COUNTS_OF_TIME}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_every_lockstep_engine_reports_the_same_value_under_every_shared_name():
    """Under the defaults of time (no compute time, no latency) every lockstep engine runs
    sfg run's rounds: the rounds, the clock's lockstep, the node on the virtual clock and real
    nodes report the same value under every name two of them share (wall time aside)."""
    over = dict(REAL_RUNS["lockstep"], protocol="lockstep")
    runs = {e: _engine_run(e, over).metrics for e in ENGINES if e.endswith("lockstep")}
    runs["rounds"] = _engine_run("rounds", dict(REAL_RUNS["lockstep"])).metrics
    assert len(runs) == 4
    for a in runs:
        for b in runs:
            shared = (set(runs[a]) & set(runs[b])) - {"wall_seconds"}
            assert {"acc_mean", "acc_time_avg", "messages", "scalars"} <= shared
            diff = sorted(k for k in shared if not _same(runs[a][k], runs[b][k]))
            assert not diff, f"{a} != {b}: " + ", ".join(
                f"{k} {runs[a][k]} != {runs[b][k]}" for k in diff)


@pytest.mark.parametrize("case", list(SAME_RUNS))
def test_node_and_engine_report_the_same_value_under_every_shared_name(case):
    cfg = {**BASE, "rule": "sfg-cut", "rounds": 8, **SAME_RUNS[case]}
    node = sfg.swarm(nodes="virtual", **cfg).metrics
    engine = sfg.run(clock="virtual", **cfg).metrics
    shared = set(node) & set(engine)
    want = SHARED["lockstep" if case == "lockstep" else "async-pull" if "pull" in case
                  else "async"]
    assert want <= shared, sorted(want - shared)
    counts = sorted(k for k in shared - ACCURACY if not _same(node[k], engine[k]))
    assert not counts, "node != engine: " + ", ".join(
        f"{k} {node[k]} != {engine[k]}" for k in counts)
    if case == "async-pull":  # the runs exercise what they compare
        assert node["returns"] > 0 and node["pull_requests"] > 0 and node["bytes"] > 0
    if case == "async-slow-uplink":
        assert node["net_lost_sender"] > 0 and node["skipped"] > 0
    acc = sorted(k for k in shared & ACCURACY if not _same(node[k], engine[k]))
    assert not acc, "node != engine: " + ", ".join(f"{k} {node[k]} != {engine[k]}" for k in acc)


# ----------------------------------------------------------------------------- stored results
STORES = ("grid", "replay", "swarm")  # written by sfg 0.2.0 (tests/fixtures/metric_names)


def _raw_rows(path: Path) -> list[tuple[dict, dict]]:
    import json

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [(json.loads(c), json.loads(m)) for c, m in
                db.execute("SELECT config, metrics FROM runs ORDER BY rowid")]


@pytest.mark.parametrize("name", STORES)
def test_a_store_of_0_2_0_reads_with_todays_names_and_the_same_values(name, tmp_path):
    from sfg.experiments import records

    path = tmp_path / f"{name}.sqlite"
    shutil.copy(FIXTURES / f"{name}.sqlite", path)
    raw = _raw_rows(path)
    recs = records(path)
    assert len(recs) == len(raw) > 0
    for (cfg, old), rec in zip(raw, recs, strict=True):
        got = rec["metrics"]
        kind = "replay" if cfg.get("kind") == "replay" else "train"
        unknown = sorted(set(got) - set(reg.BY_NAME))
        assert not unknown, f"{name}: names not in sfg.metrics after reading: {unknown}"
        assert not any(k.startswith("clock_") for k in got), sorted(got)
        # every old value is there under its new name, unchanged
        table = {**reg.RENAMED["clock"], **reg.RENAMED.get(reg.old_kind(old, kind) or "", {})}
        for k, v in old.items():
            new = table.get(k, k)
            if new is not None:
                assert _same(got[new], v), (name, k, new)
        assert len(got) == len([k for k in old if table.get(k, k) is not None])
        # and today's names read as they are
        assert reg.upgrade(got, kind) == got
    if name == "swarm":  # the node's encoded bytes are not the nominal bytes
        assert all("wire_bytes_received" in r["metrics"] and "bytes" not in r["metrics"]
                   for r in recs)
        # re-keyed by sfg grid upgrade, the rows read the same
        from sfg.experiments.upgrade import upgrade_store

        assert upgrade_store(path)
        assert [r["metrics"] for r in records(path)] == [r["metrics"] for r in recs]
    if name == "replay":
        assert all("returning_aggregations" in r["metrics"] for r in recs)


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)", re.IGNORECASE)


def test_the_report_of_a_store_of_0_2_0_prints_the_same_numbers(tmp_path):
    """``sfg report`` on the grid store written by 0.2.0 prints the numbers it printed then
    (the report and every table; a renamed metric's column carries its new name)."""
    from sfg.cli.main import main

    path = tmp_path / "grid.sqlite"
    shutil.copy(FIXTURES / "grid.sqlite", path)
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    want = FIXTURES / "report-0.2.0"
    files = sorted(p.name for p in want.iterdir())
    assert "clock_rates.csv" in files and "report.md" in files
    for f in files:
        old = (want / f).read_text(encoding="utf-8").splitlines()
        new = (out / f).read_text(encoding="utf-8").splitlines()
        assert len(old) == len(new), f
        for a, b in zip(old, new, strict=True):
            assert _NUMBER.findall(a) == _NUMBER.findall(b), (f, a, b)


def test_the_engines_metric_only_effects_name_registered_metrics():
    from sfg.engines import METRIC_ONLY

    for (engine, field), shows in METRIC_ONLY.items():
        for what in shows:
            kind, _, name = what.partition(" ")
            if kind == "metric":
                assert name in reg.reported_by(engine), (engine, field, name)


def test_unavailability_is_one_formula_in_rounds_or_seconds():
    """sfg.metrics.unavailability, by hand, and the same bits whether the clients' online
    time is counted in rounds or in seconds of whole rounds (the rounds engine and the nodes
    count rows, the clock counts seconds); the mean of per-client fractions, which the
    clock's training took before, can differ in the last bit."""
    import numpy as np

    from sfg.metrics import unavailability

    assert unavailability([3, 1], 4) == 0.5  # 1 - (3 + 1) / (2 · 4)
    assert unavailability([], 4) != unavailability([], 4)  # NaN: no client
    rng = np.random.default_rng(5)
    differs = 0
    for _ in range(300):
        n, T = int(rng.integers(1, 60)), int(rng.integers(1, 400))
        rows = rng.integers(0, T + 1, n)
        got = unavailability(rows, T)
        assert got == unavailability(rows * 600.0, T * 600.0)
        assert got == 1.0 - rows.sum() / (n * T)
        differs += got != float(1.0 - (rows * 600.0 / (T * 600.0)).mean())
    assert differs > 0  # (why it is one formula)
