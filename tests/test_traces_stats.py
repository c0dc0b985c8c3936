"""Trace statistics (outage runs) and PNG plots."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from shared_data import FLASH, needs

from sfg.errors import SfgError
from sfg.world.traces import Trace, load_trace, outage_runs, trace_stats
from sfg.world.traces.plot import availability_by_hour, plot_trace


def make(a, rm=10, offset=0.0):
    a = np.asarray(a, dtype=bool)
    D = a.shape[1]
    return Trace(available=a, devices=[str(i) for i in range(D)], round_minutes=rm,
                 start=["minute 0"] * D, day_offset_minutes=np.full(D, offset),
                 meta={"source": "test"})


def test_outage_runs_hand_computed():
    a = np.array([[1, 0, 0],
                  [0, 0, 1],
                  [0, 0, 0],
                  [1, 0, 1],
                  [0, 0, 1]], bool)
    lengths, dev = outage_runs(a)
    assert lengths.tolist() == [2, 1, 5, 1, 1] and dev.tolist() == [0, 0, 1, 2, 2]
    lengths, dev = outage_runs(a, include_edges=False)
    assert lengths.tolist() == [2, 1] and dev.tolist() == [0, 2]


def test_trace_stats_hand_computed():
    a = np.array([[1, 0], [0, 0], [0, 0], [1, 0], [1, 1], [0, 1]], bool)
    s = trace_stats(make(a, rm=30))
    assert s["devices"] == 2 and s["rounds"] == 6
    assert s["mean_availability"] == pytest.approx(5 / 12)
    assert s["outages"] == 3  # device 0: 2 + 1 (edge); device 1: 4 (edge)
    assert s["outage_mean_rounds"] == pytest.approx(7 / 3)
    assert s["outage_median_rounds"] == 2 and s["outage_longest_rounds"] == 4
    assert s["outage_longest_hours"] == pytest.approx(2.0)
    assert s["share_never_available"] == 0.0
    s = trace_stats(make(a, rm=30), include_edges=False)
    assert s["outages"] == 1 and s["outage_mean_rounds"] == 2
    assert trace_stats(make(np.zeros((4, 2), bool)))["share_never_available"] == 1.0


@settings(max_examples=50, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 40), st.integers(1, 6))))
def test_outage_runs_match_groupby(a):
    lengths, dev = outage_runs(a)
    assert lengths.sum() == (~a).sum()
    ref = [(d, len(list(g))) for d in range(a.shape[1])
           for k, g in itertools.groupby(a[:, d].tolist()) if not k]
    assert list(zip(dev.tolist(), lengths.tolist(), strict=True)) == ref
    inner, _ = outage_runs(a, include_edges=False)
    assert inner.size <= lengths.size and inner.sum() <= lengths.sum()


def test_availability_by_hour():
    a = np.zeros((48, 2), bool)
    a[0:6, 0] = True  # hours 0..5 of day 1
    a[24:30, 0] = True  # and of day 2
    a[:, 1] = True
    by = availability_by_hour(make(a, rm=60))
    assert by[:6].tolist() == [1.0] * 6 and by[6:].tolist() == [0.5] * 18
    # a trace whose round 0 starts at 22:00
    shifted = availability_by_hour(make(a[:, :1], rm=60, offset=22 * 60))
    assert shifted[22] == 1.0 and shifted[4] == 0.0 and shifted[3] == 1.0


@needs(FLASH)
def test_plots_written_and_non_empty(tmp_path):
    tr = load_trace("flash", FLASH, rule="strict")
    paths = plot_trace(tr, tmp_path / "plots")
    assert [p.name for p in paths] == ["availability_by_hour.png", "outage_lengths.png",
                                       "device_availability.png", "availability_raster.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_of_empty_trace_is_an_error(tmp_path):
    with pytest.raises(SfgError, match="nothing to plot"):
        plot_trace(make(np.zeros((5, 0), bool)), tmp_path)
