"""Adding a rule touches one place: a function and its registration in one module (the how-to
docs/howto/add-rule.md; how sfg loads such a module, and how an edit is picked up:
tests/test_plugins.py). This test writes exactly that into a temporary module, imports it, and
checks the rule runs in the replay, in training, in ``weights_one``, and in the conformance
suite — with no other file changed."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
from hypothesis import given, settings
from test_rules import candidates, check_conformance

from sfg.round.rules import RULES, parse_rule, rule_names

MODULE = '''
import numpy as np
from numba import njit

from sfg.round.rules import Unit, rule


@rule("test-median-age", tags=("control",))
@njit(cache=True)
def median_age(x, share: Unit = 0.25):
    """``test-median-age``: candidates no older than the median age score 1, the rest ``share``."""
    return np.where(x.age <= np.median(x.age), 1.0, share)
'''


def test_a_rule_in_one_module_runs_everywhere(tmp_path, monkeypatch):
    (tmp_path / "my_rules.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("my_rules")
        assert "test-median-age" in rule_names()
        rule = parse_rule("test-median-age:share=0.5+ipw")

        # weights_one: ages [4, 0, 1, 9] -> median 2.5 -> scores [0.5, 1, 1, 0.5], then +ipw
        w = rule.weights_one(ages=[4, 0, 1, 9], q_hat=[1, 0.5, 1, 1])
        h = np.array([0.5, 1 / 0.5, 1.0, 0.5])
        np.testing.assert_allclose(w, h / h.sum())
        # its parameter's range is read from the annotation
        import pytest

        from sfg.errors import SfgError

        with pytest.raises(SfgError, match="share=2 must lie in"):
            parse_rule("test-median-age:share=2")

        # the replay
        from sfg.modelfree import replay

        rows = replay(["bursty:u=0.7"], ["test-median-age", "dfedavg"], [1], n=20, T=30,
                      graph="knn:k=4", horizon=5)
        assert rows[0]["rule"] == "test-median-age" and 1.0 <= rows[0]["H"]
        assert rows[0]["self_weight_return"] != rows[1]["self_weight_return"]

        # training
        from sfg.sim.run import simulate

        res = simulate(dict(dataset="digits", model="mlp", n_clients=10, rounds=3, local_steps=1,
                            batch_size=8, eval_every=3, graph="knn:k=3",
                            process="bursty:u=0.6", rule="test-median-age", backend="batched"))
        assert 0.0 <= res.metrics["acc_mean"] <= 1.0

        # the registry-wide conformance property, on the new rule
        @settings(max_examples=50, deadline=None)
        @given(x=candidates())
        def conformance(x):
            check_conformance("test-median-age", x)

        conformance()
        # and the suite's list is the registry's: a new rule is in it automatically
        from test_rules import model_free_rules

        assert "test-median-age" in model_free_rules()
    finally:
        RULES._entries.pop("test-median-age", None)
        sys.modules.pop("my_rules", None)
