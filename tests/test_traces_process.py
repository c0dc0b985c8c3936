"""Real traces as outage processes (docs/concepts/outages.md#outage-processes "Real traces"): draws, determinism, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shared_data import FLASH, STUNNER_80, needs

import sfg.world.traces.process  # noqa: F401  (registers flash, stunner, trace)
from sfg.errors import SfgError
from sfg.world.outages.registry import PROCESSES, make_process
from sfg.world.traces import Trace, save_tabular


@pytest.fixture(autouse=True)
def repo_root(monkeypatch):
    # the component strings use paths relative to the repository root
    monkeypatch.chdir(Path(__file__).resolve().parents[1])


@needs(FLASH)
def test_example_from_the_brief():
    p = make_process(f"flash:rule=strict,path={FLASH}")
    a = p.sample(300, 20, seed=1)
    assert a.shape == (300, 20) and a.dtype == np.bool_
    assert 0.05 <= a.mean() <= 0.6
    assert "flash" in PROCESSES.names(tag="trace")


@needs(FLASH)
def test_columns_are_distinct_devices_and_match_the_trace():
    p = PROCESSES.make(f"flash:rule=relaxed,path={FLASH}")
    D = p.trace.n_devices
    ids = p.device_ids(D, seed=7)
    assert len(set(ids)) == D == len(ids)  # without replacement: every device exactly once
    a = p.sample(120, D, seed=7)
    cols = [p.trace.devices.index(i) for i in ids]
    np.testing.assert_array_equal(a, p.trace.available[:120, cols])
    assert sorted(ids) != ids or D < 3  # a random order (mapping onto nodes)


@needs(FLASH)
def test_per_seed_determinism():
    p = PROCESSES.make(f"flash:path={FLASH}")
    q = PROCESSES.make(f"flash:path={FLASH}")
    assert q.trace is p.trace  # parsed once per process
    np.testing.assert_array_equal(p.sample(300, 25, seed=3), q.sample(300, 25, seed=3))
    assert p.device_ids(25, seed=3) == q.device_ids(25, seed=3)
    assert p.device_ids(25, seed=3) != p.device_ids(25, seed=4)


@needs(FLASH)
def test_too_few_devices_and_replace():
    p = PROCESSES.make(f"flash:rule=strict,path={FLASH}")
    D = p.trace.n_devices
    with pytest.raises(SfgError) as e:
        p.sample(300, D + 1, seed=1)
    msg = str(e.value)
    assert f"only {D} eligible" in msg and "replace=true" in msg and f"--clients {D}" in msg
    r = PROCESSES.make(f"flash:rule=strict,replace=true,path={FLASH}")
    a = r.sample(50, 3 * D, seed=1)
    assert a.shape == (50, 3 * D)
    assert len(set(r.device_ids(3 * D, seed=1))) <= D


@needs(FLASH)
def test_too_many_rounds_and_bad_params():
    p = PROCESSES.make(f"flash:path={FLASH}")
    with pytest.raises(SfgError, match="300 rounds.*T=301"):
        p.sample(301, 5, seed=0)
    with pytest.raises(SfgError, match="needs a file"):
        PROCESSES.make("flash:rule=strict")
    with pytest.raises(SfgError, match="did you mean 'variant'"):
        PROCESSES.make("stunner:varaint=6day,path=x")
    with pytest.raises(SfgError, match="not found"):
        PROCESSES.make("stunner:path=../shared/data/stunner/nope.txt")
    with pytest.raises(SfgError, match="positive integer"):
        p.sample(300, 0, seed=0)


@needs(STUNNER_80)
def test_stunner_variants():
    p = PROCESSES.make(f"stunner:path={STUNNER_80},variant=6day")
    a = p.sample(300, 100, seed=2)
    assert a.shape == (300, 100) and p.trace.round_minutes == 30
    assert len(set(p.device_ids(100, seed=2))) == 100


def test_tabular_trace_process(tmp_path):
    a = np.zeros((12, 4), bool)
    a[::3, :] = True
    a[:, 3] = ~a[:, 3]
    tr = Trace(available=a, devices=["w", "x", "y", "z"], round_minutes=10,
               start=["minute 0"] * 4)
    path = save_tabular(tr, tmp_path / "fleet.csv")
    p = PROCESSES.make(f"trace:path={path}")
    s = p.sample(12, 4, seed=5)
    ids = p.device_ids(4, seed=5)
    assert sorted(ids) == ["w", "x", "y", "z"]
    for k, d in enumerate(ids):
        np.testing.assert_array_equal(s[:, k], a[:, tr.devices.index(d)])
    with pytest.raises(SfgError, match="only 4 eligible"):
        p.sample(12, 5, seed=5)
