"""run_config: the result contract and the built-in selftest workload."""

from __future__ import annotations

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.experiments.config import make_config
from sfg.experiments.runner import SELFTEST_DIM, normalise_result, run_config
from sfg.util.rng import stream


def _cfg(**kw):
    base = dict(kind="selftest", n_clients=12, rounds=20, eval_every=5, local_steps=2)
    return make_config(**{**base, **kw})


def test_selftest_is_deterministic_and_seeded():
    a, b = run_config(_cfg()), run_config(_cfg())
    assert a == b
    c = run_config(_cfg(seed=2))
    assert c["metrics"]["final_acc"] != a["metrics"]["final_acc"]
    assert set(a["metrics"]) >= {"final_acc", "p10_acc", "time_avg_acc", "final_loss",
                                 "messages", "unavailability"}
    assert all(isinstance(v, float) for v in a["metrics"].values())
    assert len(a["curves"]["acc"]) == 4 and a["curves"]["acc"][-1] == a["metrics"]["final_acc"]


def test_selftest_curve_length_and_progress():
    calls = []
    out = run_config(_cfg(rounds=12, eval_every=5), progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 12) for i in range(1, 13)]
    assert len(out["curves"]["loss"]) == 3  # rounds 5, 10 and the final round 12


def test_selftest_message_counts_by_hand():
    # no outages: every client hears all k neighbours every round; local rule sends nothing
    out = run_config(_cfg(process="none", graph="knn:k=3", rounds=7, eval_every=7))
    assert out["metrics"]["messages"] == 7 * 12 * 3
    assert out["metrics"]["unavailability"] == 0.0
    local = run_config(_cfg(process="none", rule="local", rounds=7, eval_every=7))
    assert local["metrics"]["messages"] == 0.0
    iid = run_config(_cfg(process="iid:u=0.5", rounds=20))
    assert 0.3 < iid["metrics"]["unavailability"] < 0.7


def test_selftest_pure_gossip_from_zero_stays_at_zero():
    # K = 0 and x0 = 0: averaging zeros keeps zeros, so the loss is mean((optimum)^2)
    out = run_config(_cfg(local_steps=0, process="none", rounds=5, eval_every=5))
    targets = stream(1, "selftest", "targets").normal(size=(12, SELFTEST_DIM))
    expected = float((targets.mean(axis=0) ** 2).mean())
    assert out["metrics"]["final_loss"] == pytest.approx(expected, rel=1e-12)


def test_selftest_bad_process_parameter():
    with pytest.raises(SfgError, match="u=1.5"):
        run_config(_cfg(process="iid:u=1.5"))


def test_normalise_result_checks_shape():
    out = normalise_result({"metrics": {"a": np.float32(0.5)}, "curves": {"c": np.arange(3)}})
    assert out == {"metrics": {"a": 0.5}, "curves": {"c": [0.0, 1.0, 2.0]}}
    assert type(out["metrics"]["a"]) is float
    with pytest.raises(SfgError, match="'metrics' and 'curves'"):
        normalise_result({"metrics": {}})
