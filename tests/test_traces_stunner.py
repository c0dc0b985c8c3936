"""STUNner session pipeline (docs/concepts/traces.md#real-availability-traces): hand-computed lines, the real files, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shared_data import STUNNER, STUNNER_80, STUNNER_100, needs

from sfg.errors import SfgError
from sfg.world.traces import load_stunner, load_trace, parse_sessions, trace_stats

S0 = 1402358400000  # 2014-06-10 00:00 UTC
H, M, S = 3_600_000, 60_000, 1000


def write(tmp_path: Path, lines: list[str], name: str = "s.txt") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def line(user: str, first: int, start: int, tz: float, durations: list[int]) -> str:
    return " ".join([user, str(first), str(start), f"{tz:g}", *map(str, durations)])


def test_handcrafted_line_local_midnight_and_half_rule(tmp_path):
    # tz +2: the window starts at 02:00 local, so the first local midnight is 22 h later.
    # Local times after that midnight: online to 00:05, offline to 00:15, online to 00:19:29,
    # offline to 00:40, online to 02:00 (end of the 24 h window).
    d = [22 * H + 5 * M, 10 * M, 4 * M + 29 * S, 20 * M + 31 * S, 80 * M]
    assert sum(d) == 24 * H
    p = write(tmp_path, [line("u1", 1, S0, 2, d)])
    tr = load_stunner(p, rounds=6, round_minutes=10)
    # r0: 5 of 10 minutes online -> yes; r1: minutes 15..18 + 29 s of minute 19 -> 4 -> no
    assert tr.available[:, 0].astype(int).tolist() == [1, 0, 0, 0, 1, 1]
    assert tr.devices == ["u1"]
    assert tr.start == ["2014-06-11T00:00"]
    assert tr.meta["online_fraction"] == pytest.approx((d[0] + d[2] + d[4]) / sum(d))


def test_negative_offset_and_first_offline(tmp_path):
    # tz -4: local start is 20:00 the day before -> first local midnight 4 h after the start.
    # firstOnline = 0: offline 4 h 10 min, then online for the rest.
    p = write(tmp_path, [line("u2", 0, S0, -4, [4 * H + 10 * M, 20 * H - 10 * M])])
    tr = load_stunner(p, rounds=3, round_minutes=10)
    assert tr.available[:, 0].astype(int).tolist() == [0, 1, 1]
    assert tr.start == ["2014-06-10T00:00"]


def test_contiguous_lines_are_joined(tmp_path):
    # three contiguous one-day lines (tz 0): online day, offline day, online day;
    # a 50-hour window starting at the first midnight spans all three.
    day = 24 * H
    p = write(tmp_path, [
        line("u", 1, S0, 0, [day]),
        line("u", 0, S0 + day, 0, [day]),
        line("u", 1, S0 + 2 * day, 0, [day]),
    ])
    tr = load_stunner(p)  # 300 x 10 min
    a = tr.available[:, 0]
    assert a.shape == (300,)
    assert a[:144].all() and not a[144:288].any() and a[288:].all()
    assert tr.meta["lines"] == 3 and tr.meta["devices_eligible"] == 1


def test_first_qualifying_window(tmp_path):
    # offline for 60 h, then online for 60 h: the window at day 0 has 0 % availability, the
    # one at day 1 (24..74 h) has 14 h online = 84 rounds.
    p = write(tmp_path, [line("u", 0, S0, 0, [60 * H, 60 * H])])
    tr = load_stunner(p)
    assert tr.start == ["2014-06-11T00:00"]
    assert int(tr.available.sum()) == 84
    # a user whose lines are too short for any window and one never online
    p = write(tmp_path, [line("short", 1, S0, 0, [24 * H]), line("off", 0, S0, 0, [72 * H])],
              "b.txt")
    tr = load_stunner(p)
    assert tr.devices == []
    assert tr.meta["devices_no_window"] == 1 and tr.meta["devices_low_availability"] == 1
    assert tr.meta["devices_never"] == 1


def test_six_day_variant_rounds(tmp_path):
    p = write(tmp_path, [line("u", 1, S0, 0, [7 * 24 * H])])
    tr = load_stunner(p, variant="6day")
    assert tr.available.shape == (300, 1) and tr.round_minutes == 30
    assert tr.available.all()
    with pytest.raises(SfgError, match="did you mean '6day'"):
        load_stunner(p, variant="6days")


@needs(STUNNER_100, STUNNER_80)
@pytest.mark.parametrize("suffix,fraction", [("100", 0.233), ("80", 0.353)])
def test_real_files(suffix, fraction):
    path = STUNNER / f"peersim_session_{suffix}.txt"
    tr = load_trace("stunner", path)
    m = tr.meta
    assert m["lines"] == 4334 and m["devices_total"] == 776
    assert tr.available.shape == (300, m["devices_eligible"])
    assert 500 < m["devices_eligible"] <= 776
    av = tr.device_availability()
    assert ((av >= 0.05) & (av <= 1.0)).all()
    assert m["online_fraction"] == pytest.approx(fraction, abs=0.002)  # README's figure
    # the eligible windows (>= 5 % available, half-the-minutes rule) stay close to it
    assert abs(tr.available.mean() - fraction) < 0.06
    assert len(set(tr.devices)) == len(tr.devices)  # one window per user
    assert all(s.endswith("T00:00") for s in tr.start)
    assert trace_stats(tr)["outage_longest_rounds"] <= 300


@needs(STUNNER_80)
def test_real_six_day_variant():
    tr = load_trace("stunner", STUNNER / "peersim_session_80.txt", variant="6day")
    assert tr.available.shape[0] == 300 and tr.round_minutes == 30
    ten = load_trace("stunner", STUNNER / "peersim_session_80.txt")
    # a 150-hour window fits fewer users than a 50-hour one
    assert 0 < tr.n_devices < ten.n_devices
    assert load_trace("stunner", STUNNER / "peersim_session_80.txt") is ten  # cached


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad,where,what", [
    ("u 1 1402358400000 2 1000 x 2000", "line 2", "duration 2 is not an integer"),
    ("u 1 1402358400000 2 1000 -5", "line 2", "negative"),
    ("u 2 1402358400000 2 1000", "line 2", "firstOnline"),
    ("u 1 notanumber 2 1000", "line 2", "window start"),
    ("u 1 1402358400000 two 1000", "line 2", "timezone"),
    ("u 1 1402358400000 2", "line 2", "at least one duration"),
    ("u 1 1402358400000 2 0 0", "line 2", "sum to 0"),
])
def test_malformed_lines(tmp_path, bad, where, what):
    p = write(tmp_path, [line("ok", 1, S0, 0, [1000]), bad])
    with pytest.raises(SfgError) as e:
        parse_sessions(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and where in msg and what in msg


def test_durations_that_do_not_sum_to_the_window(tmp_path):
    day = 24 * H
    # line 1 claims 1 day + 1 s but the user's next window starts after exactly one day
    p = write(tmp_path, [line("u", 1, S0, 0, [day // 2, day // 2 + 1000]),
                         line("u", 1, S0 + day, 0, [day])])
    with pytest.raises(SfgError) as e:
        parse_sessions(p)
    msg = str(e.value)
    assert str(p) in msg and "line 1" in msg and "line 2" in msg and "sum" in msg


def test_empty_and_missing(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_text("")
    with pytest.raises(SfgError, match="empty"):
        parse_sessions(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    with pytest.raises(SfgError, match="no session lines"):
        parse_sessions(blank)
    with pytest.raises(SfgError, match="not found"):
        parse_sessions(tmp_path / "missing.txt")


@needs(STUNNER_100)
def test_deterministic(tmp_path):
    p = STUNNER_100
    a = load_stunner(p)
    b = load_stunner(p)
    assert a.devices == b.devices
    np.testing.assert_array_equal(a.available, b.available)
