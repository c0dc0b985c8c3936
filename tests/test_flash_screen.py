"""FLASH screen readings: what "idle" means, on a hand-computed event log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sfg.errors import SfgError
from sfg.world.outages import make_process
from sfg.world.traces import load_flash

# WiFi and charging throughout; 5 rounds of 10 min from 2020-01-02 00:00. States per round:
#   r0 display off (22:00), lock unknown                 either 1  last 1  display 1  lock 0
#   r1 locked at 00:10                                   either 1  last 1  display 1  lock 1
#   r2 screen_on at 00:20, still locked                  either 1  last 0  display 0  lock 1
#   r3 unlock 00:30:00 then screen_off 00:30:30          either 1  last 1  display 1  lock 0
#   r4 screen_on 00:40:00 then screen_lock 00:40:30      either 1  last 1  display 0  lock 1
LINES = [
    "2020-01-01 22:00:00 \twifi",
    "2020-01-01 22:00:00 \tbattery_charged_on",
    "2020-01-01 23:00:00 \tscreen_off",
    "2020-01-02 00:10:00 \tscreen_lock",
    "2020-01-02 00:20:00 \tscreen_on",
    "2020-01-02 00:30:00 \tscreen_unlock",
    "2020-01-02 00:30:30 \tscreen_off",
    "2020-01-02 00:40:00 \tscreen_on",
    "2020-01-02 00:40:30 \tscreen_lock",
    "2020-01-02 01:00:00 \t80.0%",
]
EXPECTED = {"either": [1, 1, 1, 1, 1], "last-event": [1, 1, 0, 1, 1],
            "display": [1, 1, 0, 1, 0], "lock": [0, 1, 1, 0, 1]}


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "flash.json"
    path.write_text(json.dumps({"a": {"guid": "a", "model": "t", "messages": "\n".join(LINES)}}))
    return path


@pytest.mark.parametrize("screen", list(EXPECTED))
@pytest.mark.parametrize("rule", ["strict", "relaxed"])
def test_each_screen_reading_matches_the_hand_computed_rounds(log, screen, rule):
    tr = load_flash(log, rule=rule, rounds=5, round_minutes=10, screen=screen)
    assert tr.available[:, 0].astype(int).tolist() == EXPECTED[screen]
    assert tr.meta["screen"] == screen


def test_default_is_either_and_the_process_takes_the_option(log):
    assert load_flash(log, rounds=5).meta["screen"] == "either"
    base = f"flash:path={log},rounds=5,min_availability=0"
    for screen, want in EXPECTED.items():
        a = make_process(f"{base},screen={screen}").sample(5, 1, seed=1)
        assert a[:, 0].astype(int).tolist() == want
    with pytest.raises(SfgError, match="did you mean 'display'"):
        make_process(f"{base},screen=displya")
