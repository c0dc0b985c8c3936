"""The common Trace type and the half-the-minutes round rule (docs/concepts/traces.md#real-availability-traces)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sfg.errors import SfgError
from sfg.world.traces import Trace, minutes_to_rounds
from sfg.world.traces.base import eligible_mask


def test_trace_validates_and_freezes():
    t = Trace(available=np.array([[1, 0], [1, 1]]), devices=[1, 2], round_minutes=10,
              start=["minute 0", "minute 0"])
    assert t.available.dtype == np.bool_ and t.devices == ["1", "2"]
    assert (t.rounds, t.n_devices) == (2, 2)
    assert t.device_availability().tolist() == [1.0, 0.5]
    with pytest.raises(ValueError):
        t.available[0, 0] = False  # read-only
    with pytest.raises(SfgError, match="device ids"):
        Trace(available=np.zeros((3, 2), bool), devices=["a"], round_minutes=10,
              start=["", ""])
    with pytest.raises(SfgError, match="rounds, devices"):
        Trace(available=np.zeros(3, bool), devices=[], round_minutes=10, start=[])
    with pytest.raises(SfgError, match="round_minutes"):
        Trace(available=np.zeros((3, 1), bool), devices=["a"], round_minutes=0, start=[""])


def test_hour_of_day():
    t = Trace(available=np.zeros((7, 1), bool), devices=["a"], round_minutes=30,
              start=["x"], day_offset_minutes=np.array([23 * 60.0]))
    assert t.hour_of_day()[:, 0].tolist() == [23, 23, 0, 0, 1, 1, 2]


def test_minutes_to_rounds_half_rule():
    m = np.zeros((1, 30), bool)
    m[0, :5] = True  # 5 of 10 -> available
    m[0, 10:14] = True  # 4 of 10 -> not
    m[0, 20:30] = True
    assert minutes_to_rounds(m, 10)[0].tolist() == [True, False, True]
    odd = np.array([[1, 1, 0, 1, 0, 0]], bool)  # 2 of 3 -> yes; 1 of 3 -> no
    assert minutes_to_rounds(odd, 3)[0].tolist() == [True, False]
    with pytest.raises(SfgError, match="whole number"):
        minutes_to_rounds(np.zeros((1, 7), bool), 10)


@settings(max_examples=40, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 4), st.integers(1, 8).map(lambda k: 6 * k))))
def test_minutes_to_rounds_matches_loop(m):
    got = minutes_to_rounds(m, 6)
    ref = [[2 * int(m[d, r * 6:(r + 1) * 6].sum()) >= 6 for r in range(m.shape[1] // 6)]
           for d in range(m.shape[0])]
    assert got.tolist() == ref


def test_eligibility_threshold_is_exact():
    a = np.zeros((2, 300), bool)
    a[0, :15] = True  # exactly 5 %
    a[1, :14] = True
    assert eligible_mask(a, 0.05).tolist() == [True, False]
