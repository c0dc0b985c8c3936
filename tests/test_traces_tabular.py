"""Tabular user traces (docs/concepts/traces.md#real-availability-traces "Any user trace"): both forms, round trips, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from shared_data import FLASH, needs

from sfg.errors import SfgError
from sfg.world.traces import Trace, load_tabular, load_trace, save_tabular


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_intervals_iso_hand_computed(tmp_path):
    p = write(tmp_path, "\n".join([
        "Device,Start,End",
        "p1,2024-03-01T00:00,2024-03-01T00:25",   # rounds 0,1 full; round 2 5 of 10 min
        "p2,2024-03-01 00:04:00,2024-03-01 00:16:00",  # 6 min of round 0, 6 of round 1
        "p1,2024-03-01T00:40,2024-03-01T00:44",   # 4 min of round 4 -> no
    ]) + "\n")
    tr = load_tabular(p, round_minutes=10)
    assert tr.devices == ["p1", "p2"]
    assert tr.available.astype(int).T.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    assert tr.start == ["2024-03-01T00:00", "2024-03-01T00:00"]
    assert tr.meta["form"] == "intervals"


def test_iso_origin_is_midnight_and_hours(tmp_path):
    p = write(tmp_path, "device,start,end\nx,2024-03-01T08:00,2024-03-01T09:00\n")
    tr = load_tabular(p, round_minutes=60)
    assert tr.rounds == 9 and tr.available[:, 0].astype(int).tolist() == [0] * 8 + [1]
    assert tr.hour_of_day()[8, 0] == 8
    tr = load_tabular(p, round_minutes=30, origin="2024-03-01T07:00")
    assert tr.available[:, 0].astype(int).tolist() == [0, 0, 1, 1]
    assert tr.hour_of_day()[:, 0].tolist() == [7, 7, 8, 8]


def test_timezone_aware_timestamps(tmp_path):
    p = write(tmp_path, "device,start,end\nx,2024-03-01T02:00+02:00,2024-03-01T02:20+02:00\n")
    tr = load_tabular(p, round_minutes=10, origin="2024-03-01T00:00+00:00")
    assert tr.available[:, 0].astype(int).tolist() == [1, 1]
    p = write(tmp_path, "device,start,end\nx,2024-03-01T02:00+02:00,2024-03-01T02:20\n", "m.csv")
    with pytest.raises(SfgError, match="start is ISO timestamps with a time-zone offset"):
        load_tabular(p)
    p = write(tmp_path, "device,start,end\nx,2024-03-01T02:00,2024-03-01T02:20\n"
                        "y,2024-03-01T02:00+01:00,2024-03-01T02:20+01:00\n", "n.csv")
    with pytest.raises(SfgError, match="line 3.*time-zone"):
        load_tabular(p)
    with pytest.raises(SfgError, match="origin"):
        load_tabular(tmp_path / "t.csv", origin="2024-03-01T00:00")  # naive vs aware


def test_intervals_numeric_with_available_column(tmp_path):
    p = write(tmp_path, "device,start,end,available\n"
                        "a,0,15,1\n"
                        "a,15,30,0\n"
                        "b,0,30,false\n"
                        "c,20,25,yes\n")
    tr = load_tabular(p, round_minutes=10)
    assert tr.devices == ["a", "b", "c"]
    assert tr.available.astype(int).T.tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 1]]
    assert tr.start == ["minute 0"] * 3
    assert tr.meta["devices_never"] == 1
    # min_availability drops the never-available device
    assert load_tabular(p, round_minutes=10, min_availability=0.2).devices == ["a", "c"]


def test_long_form_matrix(tmp_path):
    p = write(tmp_path, "device,round,available\n"
                        "d1,0,1\nd1,2,true\nd2,1,0\nd2,3,1\n")
    tr = load_tabular(p, round_minutes=30)
    # missing rounds are offline; 4 rounds = max round + 1
    assert tr.available.astype(int).T.tolist() == [[1, 0, 1, 0], [0, 0, 0, 1]]
    assert tr.round_minutes == 30 and tr.meta["form"] == "rounds"
    assert load_tabular(p, rounds=2).available.shape == (2, 2)
    assert load_tabular(p, rounds=6).available.shape == (6, 2)


@settings(max_examples=20, deadline=None)
@given(arrays(bool, st.tuples(st.integers(1, 30), st.integers(1, 6))),
       st.sampled_from([1, 10, 30]))
def test_round_trip(tmp_path_factory, a, rm):
    tmp = tmp_path_factory.mktemp("rt")
    tr = Trace(available=a, devices=[f"dev {i}" for i in range(a.shape[1])], round_minutes=rm,
               start=["minute 0"] * a.shape[1])
    for form in ("rounds", "intervals"):
        p = save_tabular(tr, tmp / f"{form}.csv", form=form)
        back = load_tabular(p, round_minutes=rm, rounds=a.shape[0])
        assert back.devices == tr.devices
        np.testing.assert_array_equal(back.available, a)


@needs(FLASH)
def test_round_trip_real_flash_window(tmp_path):
    tr = load_trace("flash", FLASH, rule="relaxed")
    p = save_tabular(tr, tmp_path / "flash.csv", form="intervals")
    back = load_tabular(p, round_minutes=10, rounds=300)
    assert back.devices == tr.devices
    np.testing.assert_array_equal(back.available, tr.available)


def test_parquet_round_trip_and_user_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tr = Trace(available=np.eye(3, dtype=bool), devices=["a", "b", "c"], round_minutes=10,
               start=["minute 0"] * 3)
    for form in ("rounds", "intervals"):
        p = save_tabular(tr, tmp_path / f"t-{form}.parquet", form=form)
        back = load_tabular(p, rounds=3)
        np.testing.assert_array_equal(back.available, tr.available)
    # a file a user's own pipeline wrote, in the documented long form
    table = pa.table({"device": ["x", "x", "y"], "round": [0, 2, 1], "available": [1, 1, 1]})
    pq.write_table(table, tmp_path / "fleet.parquet")
    fleet = load_tabular(tmp_path / "fleet.parquet", rounds=3)
    assert fleet.devices == ["x", "y"]
    np.testing.assert_array_equal(fleet.available, [[1, 0], [0, 1], [1, 0]])


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    tr = Trace(available=np.eye(3, dtype=bool), devices=["a", "b", "c"], round_minutes=10,
               start=["minute 0"] * 3)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(SfgError, match=r"'parquet' extra \(pyarrow is not installed\)"):
        save_tabular(tr, tmp_path / "t.parquet")
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(SfgError, match=r"pip install 'sfg\[parquet\]'"):
        load_tabular(tmp_path / "x.parquet")


@pytest.mark.parametrize("text,match", [
    ("device,begin,end\na,0,1\n", "no 'start' column"),
    ("device,start,end\na,0,x\n", "line 2.*end must be a number"),
    ("device,start,end\na,0,10\na,5,5\n", "line 3.*must be after"),
    ("device,start,end\na,0,10\nb,0,10\na,5,20\n", "line 4.*overlaps.*line 2"),
    ("device,start,end,available\na,0,10,maybe\n", "line 2.*'available'"),
    ("device,round,available\na,0,1\na,0,0\n", "line 3.*appears twice.*line 2"),
    ("device,round,available\na,-1,1\n", "line 2.*non-negative integer"),
    ("device,round,available\na,1.5,1\n", "line 2.*non-negative integer"),
    ("device,round\na,1\n", "no 'available' column"),
    ("device,start,end\na,0\n", "line 2.*2 field"),
    ("device,start,end\n", "no data rows"),
])
def test_malformed(tmp_path, text, match):
    p = write(tmp_path, text)
    with pytest.raises(SfgError, match=match) as e:
        load_tabular(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_empty_and_missing(tmp_path):
    p = write(tmp_path, "")
    with pytest.raises(SfgError, match="empty"):
        load_tabular(p)
    with pytest.raises(SfgError, match="not found"):
        load_tabular(tmp_path / "none.csv")
    with pytest.raises(SfgError, match="round_minutes"):
        load_tabular(write(tmp_path, "device,round,available\na,0,1\n", "ok.csv"),
                     round_minutes=0)


# ------------------------------------------------ fleet-sized files: the plain reader, the cut
def _dense_cut(D, dev, s, e, T, L):
    """The rounds as the loader cut them before it was sparse: a dense device x round matrix
    of coverage, one entry per covered device-round, summed in the periods' order."""
    cover = np.zeros((D, T + 1))
    r0 = np.floor(s / L).astype(np.int64)
    n = np.ceil(e / L).astype(np.int64) - r0
    rep = np.repeat(np.arange(len(n)), n)
    rr = r0[rep] + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    overlap = np.minimum(e[rep], (rr + 1) * L) - np.maximum(s[rep], rr * L)
    np.add.at(cover, (dev[rep], rr), overlap)
    return (2 * cover[:, :T] >= L - 1e-9).T


@pytest.mark.parametrize("L,block", [(10.0, 1 << 24), (7.3, 40), (0.7, 7), (1e-10, 3)])
def test_sparse_cut_equals_the_dense_matrix(monkeypatch, L, block):
    """Each round decided from the periods' first and last rounds (exact overlaps, in order)
    and the rounds they cover whole, by blocks of devices: the dense matrix's answer."""
    from sfg.world.traces import tabular

    monkeypatch.setattr(tabular, "_BLOCK_CELLS", block)
    rng = np.random.default_rng(7)
    D, T = 23, 40
    rows = []
    for d in range(D):
        t = float(rng.uniform(0, 30) * L)
        for _ in range(int(rng.integers(0, 9))):
            t += float(rng.choice([0.0, rng.uniform(0, 3 * L), L * rng.integers(0, 4)]))
            dur = float(rng.choice([rng.uniform(0.01, 4) * L, L * rng.integers(1, 5), L / 2]))
            rows.append((d, t, t + dur))
            t += dur
    dev = np.array([r[0] for r in rows])
    s = np.clip([r[1] for r in rows], 0, T * L)
    e = np.clip([r[2] for r in rows], 0, T * L)
    keep = e > s
    dev, s, e = dev[keep], s[keep], e[keep]
    got = tabular._cut_rounds(D, dev, s, e, T, L)
    assert got.shape == (T, D) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, _dense_cut(D, dev, s, e, T, L))


PLAIN = [
    "device,start,end\nb,0,25\na,5,12.5\n\n b ,30,31\n,,\n  \nc,1e1,1_1\n",
    "Device , Start,END,available,note\r\na,0,10,1,x\r\nb,0,10, No ,y\r\na,10,20,TRUE,\r\n",
    "device,start,end\na,2024-03-01T00:00,2024-03-01 07:30:05\nb,2024-02-29,2024-03-01T01:00\n",
    "device,start,end\nx,2024-03-01T00:00,2024-03-01T01:00+02:00\n",
    "device,start,end\nx,2024-02-30T00:00,2024-03-01T00:00\n",
    "device,start,end\nx,2024-03-01T24:00,2024-03-02T00:00\n",
    "device,start,end\nx,20240301T0000,20240301T0100\n",
    "device,start,end\nx,2024/03/01T00:00,2024/03/01T01:00\n",
    "device,start,end\nx,2024-03-01X00:00,2024-03-01T01:00\n",
    "device,start,end\nx,0,10\ny,5\n",
    "device,start,end\nx,0,10\ny,5,6,7\n ,, \n",
    "device,start,end\nx,10,5\n",
    "device,start,end\nx,0,10\nx,5,20\n",
    "device,start,end,available\nx,0,10,maybe\n",
    "device,round,available\nx,0,1\ny,3,0\nx,2,yes\n",
    "device,round,available\nx,0,1\nx,0,0\n",
    "device,round,available\nx,1.5,1\n",
    "device,start,end\n",
]


@pytest.mark.parametrize("text", PLAIN)
def test_plain_reader_equals_the_csv_module(tmp_path, monkeypatch, text):
    """A plain file (ASCII, unquoted) is split with numpy; the trace, or the one-line error,
    is the csv module's on the same file."""
    from sfg.world.traces import tabular

    p = tmp_path / "t.csv"
    p.write_bytes(text.encode())

    def load():
        try:
            tr = load_tabular(p, round_minutes=5)
        except SfgError as e:
            return str(e)
        got = tabular.tabular_intervals(p, round_minutes=5)
        return (tr.available.tolist(), tr.devices, tr.start, tr.meta,
                None if got is None else (got[0], got[1].tolist(), got[2].tolist(),
                                          got[3].tolist(), got[4]))

    plain = load()
    try:
        assert tabular._plain_columns(p, text.encode()) is not None  # it takes the plain path
    except SfgError:
        pass
    monkeypatch.setattr(tabular, "_plain_columns", lambda path, data: None)
    assert plain == load()
