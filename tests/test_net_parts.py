"""The node's parts, each written once: network cuts and crashes (one parsed type for both
syntaxes), claim policies (the attacker is an object the node is given), async candidate
selection (the node's and the clock's engine's), and the modules' boundaries."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import numpy as np
import pytest

from sfg.clock.faults import Faults
from sfg.errors import SfgError
from sfg.net import asyncmode, outgoing
from sfg.net.claims import CertifiedLiar, ForgedClaims, HonestClaims, claim_policy
from sfg.net.cuts import Crash, Cut
from sfg.net.node import Node, NodeConfig
from sfg.net.wire import Header, Message, unpack_header
from sfg.net.world import build_world

SRC = Path(__file__).resolve().parents[1] / "src" / "sfg"
WORLD = dict(n_clients=4, rounds=6, process="none", eval_every=6, model="mlp", graph="ring:k=1",
             dataset="digits")


# ------------------------------------------------------------------ cuts and crashes
def test_both_cut_syntaxes_give_one_type_with_one_meaning():
    rounds = Cut.parse_rounds("0,1|2,3@5-9")
    seconds = Faults.parse("faults:partition=0-1|2-3@5-10").partitions[0]
    assert type(rounds) is type(seconds) is Cut
    assert (rounds.a, rounds.b, rounds.start, rounds.end, rounds.unit) == \
        (frozenset({0, 1}), frozenset({2, 3}), 5, 10, "rounds")
    assert (seconds.a, seconds.b, seconds.start, seconds.end, seconds.unit) == \
        (frozenset({0, 1}), frozenset({2, 3}), 5.0, 10.0, "seconds")
    # rounds R1..R2 both included; seconds [T1, T2): the same half-open span here
    for at in range(12):
        assert rounds.blocks(0, 3, at) == seconds.blocks(3, 0, float(at)) == (5 <= at <= 9)
    assert not rounds.blocks(0, 1, 6) and not rounds.blocks(2, 3, 6)
    i, j = np.array([0, 0, 1, 2, 3]), np.array([2, 1, 3, 3, 0])
    for at in (4, 5, 9, 10):
        t = np.full(5, float(at))
        assert rounds.blocks_many(i, j, t).tolist() == \
            [rounds.blocks(int(a), int(b), at) for a, b in zip(i, j, strict=True)]
    for text in ("0,1|2,3@5-9", "7|0,2@0-0"):
        assert Cut.parse_rounds(text).text() == text
    star = Cut.parse_seconds("0.2-3|*@0.5-7.25")
    assert Cut.parse_seconds(star.text()) == star and star.blocks(2, 9, 0.5)


def test_both_crash_syntaxes_give_one_type():
    kill, crash = Crash.parse_round("3@10"), Crash.parse_seconds("3@1500")
    assert (kill.node, kill.at, kill.unit, kill.pair) == (3, 10, "rounds", (3, 10))
    assert (crash.node, crash.at, crash.unit, crash.pair) == (3, 1500.0, "seconds", (3, 1500.0))
    f = Faults.parse("faults:crash=3@1500;5@20")
    assert f.crash_at == (crash, Crash(5, 20.0)) and all(type(c) is Crash for c in f.crash_at)


def test_a_node_takes_cuts_in_rounds_only():
    NodeConfig(partitions=(Cut.parse_rounds("0|1@2-3"),))
    with pytest.raises(SfgError, match="in rounds, not seconds"):
        NodeConfig(partitions=(Cut.parse_seconds("0|1@2-3"),))


@pytest.mark.parametrize("parse,text,needle", [
    (Cut.parse_rounds, "0,1|1,2@5-9", "disjoint"),
    (Cut.parse_rounds, "0,1|2@9-5", "R1 <= R2"),
    (Cut.parse_rounds, "0,1@5-9", "A|B@R1-R2"),
    (Cut.parse_seconds, "0-3|4@9-5", "T1 < T2"),
    (Cut.parse_seconds, "*|*@0-5", "at most one side"),
    (Crash.parse_round, "3@x", "NODE@ROUND"),
    (Crash.parse_round, "-1@3", ">= 0"),
    (Crash.parse_seconds, "3@-5", ">= 0 seconds"),
])
def test_bad_cuts_and_crashes_are_one_error_line(parse, text, needle):
    with pytest.raises(SfgError) as e:
        parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ claim policies
def test_the_claim_policy_comes_from_the_runs_attack():
    honest = build_world(WORLD)
    assert all(type(claim_policy(honest, i)) is HonestClaims for i in range(4))
    for attack, kind in (("forge:frac=0.5,claim=fresh", ForgedClaims),
                         ("forge:frac=0.5,claim=certified", CertifiedLiar)):
        world = build_world({**WORLD, "attack": attack,
                             "rule": "sfg-cut+certified" if "certified" in attack else "sfg-cut"})
        kinds = [type(claim_policy(world, i)) for i in range(4)]
        assert kinds == [kind if a else HonestClaims for a in world.attackers], attack


def test_a_node_sends_what_the_policy_it_is_given_claims():
    class Boast(HonestClaims):
        def claim(self, node):
            return 0, 0.0, 99

    world = build_world(WORLD)
    node = Node(world, 0, NodeConfig(mode="lockstep"), claims=Boast())
    head = unpack_header(outgoing.message(node)[0])
    assert (head.age, head.lag, head.count) == (0, 0.0, 99)
    plain = unpack_header(outgoing.message(Node(world, 0, NodeConfig(mode="lockstep")))[0])
    assert (plain.age, plain.lag, plain.count) == (0, 0.0, 1)


# ------------------------------------------------------------------ async candidates
# Each case: the period P, the window W, the node's clock at its wake, and per neighbour the
# arrival of its latest message, worked out by hand: waited d = (now − arrival)/P periods.
EDGE_CASES = {
    # P = 0.125 s: every d below is exact. Neighbour 2's message waited d = W exactly (a
    # candidate: "within the last W periods" includes W); 1's waited 2⁻³⁷ periods more (out),
    # 3's 2⁻³⁷ less (in).
    "exactly W": (0.125, 1.5, 1.0, {1: 0.8125 - 2 ** -40, 2: 0.8125, 3: 0.8125 + 2 ** -40},
                  [2, 3]),
    # P = 0.1 s: 1's message waited 0.15 s, ≤ W·P = 0.15 as seconds, but d = 1.5 + 2⁻⁵¹ periods
    # in units (the definition): out; 3's waited 0.15 · (1 − 2⁻⁴⁰) s: in.
    "W in decimal": (0.1, 1.5, 0.45, {1: 0.3, 2: 0.35, 3: 0.45 - 0.15 * (1 - 2 ** -40)},
                     [2, 3]),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_the_node_and_the_clocks_engine_select_the_same_async_candidates(case):
    """docs/concepts/nodes.md#asynchronous-mode: an available node "takes as candidates itself
    and every neighbour whose latest message arrived within the last W periods, W included" and
    "counts a message that waited d = (now − arrival)/P periods as older: age τ_j + ⌊d⌋ and
    lag ℓ_j + d".
    The node's candidates and the clock's engine's (sfg.clock.schedule.held_latest) are both
    the ones worked out by hand at the window's edge — a message that waited exactly d = W is
    in, one just beyond is out — and the node's waited ages and lags are the hand's."""
    from sfg.clock.schedule import held_latest

    P, W, now, arrivals, want = EDGE_CASES[case]
    if case == "exactly W":
        assert (now - arrivals[2]) / P == W  # the edge case is real
    else:
        assert now - arrivals[1] <= W * P and (now - arrivals[1]) / P > W
    world = build_world(WORLD, edges=np.array([[0, 1], [0, 2], [0, 3]]))
    node = Node(world, 0, NodeConfig(mode="async", period=P, window=W))
    for j, a in arrivals.items():
        head = Header(sender=j, round=0, age=1, lag=2.0, count=3, local_count=3, length=0,
                      sha256=hashlib.sha256(b"%d" % j).digest())
        node.latest[j] = (Message(head, world.x0), a)
    senders, _, ages, lags = asyncmode.candidates(node, 0, now)
    ptr = np.arange(4, dtype=np.int64)  # one message per slot (slots 0..2: neighbours 1..3)
    arrival = np.array([arrivals[j] for j in (1, 2, 3)])
    idx, wait = np.empty(3, np.int64), np.empty(3)
    held_latest(ptr, arrival, np.full(3, -np.inf), np.arange(3, dtype=np.int64), np.zeros(3),
                np.arange(3, dtype=np.int64), np.full(3, now), W, P, idx, wait)
    engine = [j for j, k in zip((1, 2, 3), idx, strict=True) if k >= 0]
    assert senders == engine == want
    d = [(now - arrivals[j]) / P for j in want]
    assert lags == [2.0 + x for x in d] and ages == [1 + int(x) for x in d]
    assert [float(wait[j - 1]) for j in want] == d


# ------------------------------------------------------------------ the modules' boundaries
MINE = ["net/node.py", "net/nodeconfig.py", "net/lockstep.py", "net/asyncmode.py",
        "net/returns.py", "net/inbox.py", "net/outgoing.py", "net/localround.py",
        "net/claims.py", "net/evidence.py", "net/persist.py", "net/cuts.py",
        "net/certify.py", "net/eventlog.py", "net/replaylog.py",
        "clock/faults.py", "modelfree/horizon.py"]


@pytest.mark.parametrize("rel", MINE)
def test_no_private_imports_and_no_function_over_150_lines(rel):
    tree = ast.parse((SRC / rel).read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("sfg"):
            private = [a.name for a in n.names if a.name.startswith("_")]
            assert not private, f"{rel} imports private {private} from {n.module}"
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert n.end_lineno - n.lineno + 1 <= 150, f"{rel}: {n.name} is over 150 lines"


NODE_PARTS = ["net/lockstep.py", "net/asyncmode.py", "net/returns.py", "net/inbox.py",
              "net/outgoing.py", "net/localround.py"]


def test_the_node_is_short_and_its_parts_use_only_its_public_attributes():
    """Node holds what the protocols share (about 300 lines); its parts are functions of the
    node that read and change it through public attributes only."""
    assert len((SRC / "net/node.py").read_text().splitlines()) <= 320
    for rel in NODE_PARTS:
        for n in ast.walk(ast.parse((SRC / rel).read_text())):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                    and n.value.id == "node":
                assert not n.attr.startswith("_"), f"{rel}:{n.lineno} node.{n.attr}"
