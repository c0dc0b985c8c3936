"""Forged staleness claims, one definition (sfg.round.kernel.forged_claim) used by the rounds
(sfg.round.attacks.claims) and by the virtual clock's events (sfg.round.kernel, through
sfg.clock.replay): the definition against hand values, and the clock's headers of an attacker
on the hand-built async world of test_clock_hand worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_clock_hand import ASYNC, async_sched, world

from sfg.clock.replay import staleness_events
from sfg.round.attacks import CLAIMS, parse_attack, random_claims
from sfg.round.kernel import CLAIM_CODE, forged_claim
from sfg.round.rules import parse_rule
from sfg.util.rng import stream


def test_one_code_per_claim():
    assert sorted(CLAIM_CODE) == sorted(CLAIMS)
    assert len(set(CLAIM_CODE.values())) == len(CLAIMS)
    assert CLAIM_CODE["honest"] == 0  # the compiled events read 0 as "not forging"


@pytest.mark.parametrize("claim,want", [
    # t = 5, heard = 3, true (age 2, lag 2.5, count 4), draw (1, 0.75, 6)
    ("fresh", (0, 0.0, 4)),  # count heard + 1
    ("stale-others", (0, 0.0, 10)),  # heard + 1 + t + 1
    ("random", (1, 0.75, 6)),  # the draw
    ("honest", (2, 2.5, 4)),  # the true claim
    ("undercut", (2, 2.5, 4)),  # per receiver, in sfg.round.attacks.claims: not here
    ("certified", (2, 2.5, 4)),
])
def test_forged_claim_by_hand(claim, want):
    got = forged_claim(CLAIM_CODE[claim], 5, 3, 2, 2.5, 4, 1, 0.75, 6)
    assert tuple(got) == want
    assert [type(x) for x in got] == [int, float, int]


def test_random_claims_in_rounds_are_the_streams_draws():
    a, lag, c = random_claims(7, 5, 4)
    g = stream(7, "attack-claims", 5)
    assert a.tolist() == g.integers(0, 6, 4).tolist()
    assert lag.tolist() == (g.random(4) * 5).tolist()
    assert c.tolist() == g.integers(1, 7, 4).tolist()


# The async world of test_clock_hand (the path 0 – 1 – 2); placement=degree makes device 1 (the
# middle) the one attacker (round(0.34 · 3) = 1). Its local rounds: e1 (t 0, alone, count 1
# before), e8 (t 3, alone, count 2 before: e1 trained alone), e10 (t 4, own count 3 before,
# with 0's e7 and 2's e6).
ATTACKER_ROUNDS = (1, 8, 10)


def _clock(claim: str):
    att = parse_attack(f"forge:frac=0.34,claim={claim},placement=degree")
    return staleness_events(parse_rule("dfedavg"), world(**ASYNC), async_sched(), seed=1,
                            attack=att)


@pytest.mark.parametrize("claim,counts", [
    # fresh: e1 1 + 1 = 2; e8 2 + 1 = 3; e10: device 0's chain is as honest (e1's forged count
    # 2 is its true one): e0 2, e3 3, e4 4, e7 5 (alone); e6 max(2, 2) + 1 = 3; heard
    # max(3, 5, 3) = 5 -> 6
    ("fresh", [2, 3, 6]),
    # stale-others: e1 1 + 1 + (0 + 1) = 3; e8 2 + 1 + (3 + 1) = 7; device 0: e3 max(2, 3) + 1
    # = 4, e4 5, e7 6; e6 max(2, 3) + 1 = 4; e10 heard max(3, 6, 4) = 6 -> 6 + 1 + 5 = 12
    ("stale-others", [3, 7, 12]),
])
def test_the_clocks_forged_headers_by_hand(claim, counts):
    got = _clock(claim)
    hdr, lag = got["hdr"], got["hdr_lag"]
    r = list(ATTACKER_ROUNDS)
    assert got["attackers"].tolist() == [False, True, False]
    assert hdr[0, r].tolist() == [0, 0, 0] and lag[r].tolist() == [0.0, 0.0, 0.0]
    assert hdr[1, r].tolist() == counts
    # the honest senders' headers that the attacker heard at e10
    assert (hdr[1, 7], hdr[1, 6]) == ((5, 3) if claim == "fresh" else (6, 4))


def test_the_clocks_random_headers_are_the_events_draws():
    """Age ⌊u·(t+1)⌋, lag u·t, count 1 + ⌊u·(t+1)⌋ from the stream's uniforms [3, R]."""
    got = _clock("random")
    sched = async_sched()
    u = stream(1, "attack-claims-clock").random((3, sched.n_events))
    for r in ATTACKER_ROUNDS:
        t = int(sched.t[r])
        assert got["hdr"][0, r] == int(np.floor(u[0, r] * (t + 1)))
        assert got["hdr_lag"][r] == u[1, r] * t
        assert got["hdr"][1, r] == 1 + int(np.floor(u[2, r] * (t + 1)))
