"""Figures recorded before the round's redesign (tests/make_baseline.py) are reproduced.

Replay rows and ``weights_one`` outputs agree to 1e-9 (relative; summation order may differ
from the recording code), training runs give the same accuracies, metrics and final staleness.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import make_baseline as mb
import numpy as np
import pytest

from sfg.metrics import upgrade

BASE = json.loads((Path(__file__).parent / "fixtures" / "baseline.json").read_text())
# replay metrics added after the recording (sfg.modelfree.metrics): not in it, checked elsewhere
ADDED = {"returning_aggregations_heard"}


def _close(a, b, tol=1e-9) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return math.isclose(a, b, rel_tol=tol, abs_tol=1e-12)


def test_replay_rows_match_the_recording():
    rows = mb.replay_rows()
    want = BASE["replay"]["rows"]
    assert len(rows) == len(want)
    for got, exp in zip(rows, want, strict=True):
        exp = upgrade(exp, "replay")  # recorded under the names of the time (sfg.metrics)
        key = (exp["process"], exp["rule"], exp["anatomy"], exp["link_failure"])
        assert (got["process"], got["rule"], got["anatomy"], got["link_failure"]) == key
        assert set(got) - ADDED == set(exp), key
        for m, v in exp.items():
            if isinstance(v, float):
                assert _close(got[m], v), (key, m, got[m], v)


def test_weights_one_matches_the_recording():
    got = mb.weights_one()
    for g, exp in zip(got, BASE["weights_one"], strict=True):
        assert g["rule"] == exp["rule"]
        np.testing.assert_allclose(g["weights"], exp["weights"], rtol=1e-12, atol=1e-15,
                                   err_msg=exp["rule"])


@pytest.mark.parametrize("k", range(len(mb.TRAIN_RUNS)))
def test_training_matches_the_recording(k):
    from sfg.sim.run import simulate

    exp = BASE["training"][k]
    res = simulate(exp["config"])
    np.testing.assert_array_equal(res.accuracy, exp["accuracy"])
    assert res.meta["minibatch_digest"] == exp["minibatch_digest"]
    for m, v in exp["metrics"].items():
        assert _close(res.metrics[m], v), (m, res.metrics[m], v)
    # parameters are float32: the batched MLP backward (class-major, one bmm) reorders float32
    # sums, so they agree to float32 rounding, not to 1e-9; accuracies above stay exact
    assert _close(float(res.params.double().sum()), exp["params_sum"], tol=1e-6)
    np.testing.assert_array_equal(res.state.ages, exp["ages"])
    # a model-reading rule's weights (hence lags) are functions of those float32 parameters
    from sfg.round.rules import parse_rule

    rtol = 1e-6 if parse_rule(exp["config"]["rule"]).reads_models else 1e-9
    np.testing.assert_allclose(res.state.lags, exp["lags"], rtol=rtol, atol=1e-12)
