"""Peers chosen per exchange (sfg.world.peers, docs/concepts/peers.md): the setting, the target
draws, the membership table by hand, the sends of a run in rounds, and the replay on them."""

from __future__ import annotations

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.modelfree.api import replay
from sfg.modelfree.peers import sampled_deliveries
from sfg.util.rng import counter_uniform
from sfg.world.graphs import Graph
from sfg.world.peers import (
    NEVER,
    Peers,
    draw_epidemic,
    draw_online,
    hear,
    new_tables,
    parse_peers,
    peers_key,
    round_sends,
    tie_key,
    uniform,
    uniform4,
)


@pytest.mark.parametrize("text,want", [
    (None, "fixed"), ("fixed", "fixed"), ("epidemic:s=6", "epidemic:s=6"),
    ("online:s=6", "online:s=6,view=24,gossip=6"),
    ("online:s=2,view=3", "online:s=2,view=3,gossip=2"),
    ("online:s=2,gossip=1", "online:s=2,view=8,gossip=1"),
])
def test_setting_and_its_defaults(text, want):
    assert str(parse_peers(text)) == want


@pytest.mark.parametrize("text,words", [
    ("gossip:s=2", "unknown peers"), ("epidemc:s=2", "did you mean 'epidemic'"),
    ("epidemic", "give s"), ("epidemic:s=0", "whole number ≥ 1"), ("epidemic:s=1.5", "whole"),
    ("epidemic:s=2,view=4", "unknown parameter 'view'"), ("online:s=4,view=3", "at least s"),
    ("online:s=2,gossip=9", "at most view"), ("fixed:s=2", "no parameters"),
    ("epidemic:s=5000", "over the limit of 1,000"), ("online:s=5,view=100000", "over the limit"),
])
def test_bad_settings_are_one_line(text, words):
    with pytest.raises(SfgError, match=words) as e:
        parse_peers(text)
    assert "\n" not in str(e.value)


def test_s_below_the_devices():
    with pytest.raises(SfgError, match="below the number of devices"):
        parse_peers("epidemic:s=5").check(5)
    assert parse_peers("epidemic:s=4").check(5).s == 4


def test_compiled_draw_is_the_counter_draw():
    key = peers_key(7)
    for ids in [(0, 0, 0), (5, 3, 2), (99, 1234, 17), (2**40, 7, 1)]:
        assert uniform(np.uint64(key), *ids) == counter_uniform(key, *ids)
        assert uniform4(np.uint64(key), *ids, 9) == counter_uniform(key, *ids, 9)


def test_epidemic_targets_distinct_others_uniform():
    key, n, s = np.uint64(peers_key(1)), 20, 5
    out = np.empty(s, np.int64)
    seen = np.zeros(n)
    for c in range(4000):
        draw_epidemic(key, 3, c, n, s, out)
        assert len(set(out.tolist())) == s and 3 not in out and out.min() >= 0 and out.max() < n
        seen[out] += 1
    share = seen[np.arange(n) != 3] / (4000 * s)
    assert seen[3] == 0 and np.allclose(share, 1 / 19, atol=0.006)
    again = np.empty(s, np.int64)
    draw_epidemic(key, 3, 17, n, s, out)
    draw_epidemic(key, 3, 17, n, s, again)
    assert np.array_equal(out, again)  # keyed: the same send draws the same


def test_online_targets_from_the_table_then_topped_up():
    key = np.uint64(peers_key(2))
    tab_id = np.array([[5, 9, 2, -1], [0, 0, 0, 0]], np.int64)
    tab_n = np.array([3, 0], np.int64)
    out, buf = np.empty(2, np.int64), np.empty(4, np.int64)
    for c in range(50):
        draw_online(key, 0, c, 10, 2, tab_id, tab_n, buf, out)
        assert set(out.tolist()) <= {5, 9, 2} and out[0] != out[1]
    out3 = np.empty(5, np.int64)
    draw_online(key, 0, 1, 10, 5, tab_id, tab_n, buf, out3)  # 3 entries, 2 topped up
    assert set(out3[:3].tolist()) == {5, 9, 2}
    assert len(set(out3.tolist())) == 5 and 0 not in out3



def test_online_draw_reads_the_row_in_place_and_draws_what_a_copy_draws():
    """draw_online's virtual shuffle (O(S) reads of the row, the moved positions in ``buf``)
    draws exactly what the first, copying draw (tests/reference_peers.py) draws: random rows
    of every fill, S below, at and above the entries held, and a ``buf`` of min(S, V)."""
    from reference_peers import draw_online_copying

    rng = np.random.default_rng(44)
    checked = 0
    for trial in range(600):
        V = int(rng.choice([1, 2, 3, 5, 8, 28, 200, 3000]))
        n = V + int(rng.integers(2, 60))
        s = int(rng.integers(1, min(n - 1, 2 * V + 3) + 1))
        tab_id = np.full((3, V), -1, np.int64)
        tab_n = np.zeros(3, np.int64)
        i = int(rng.integers(0, 3))
        m = int(rng.integers(0, V + 1))
        tab_n[i] = m
        tab_id[i, :m] = rng.choice(np.delete(np.arange(n), i), m, replace=False)
        key = np.uint64(rng.integers(0, 2**63))
        count = int(rng.integers(0, 10**6))
        got = np.full(s, -7, np.int64)
        draw_online(key, i, count, n, s, tab_id, tab_n,
                    np.full(min(s, V), -9, np.int64) if trial % 2 else np.empty(V, np.int64),
                    got)
        want = np.full(s, -7, np.int64)
        draw_online_copying(key, i, count, n, s, tab_id, tab_n, want)
        assert np.array_equal(got, want), (V, n, s, m)
        checked += min(s, m) > 1
    assert checked > 300

def _table(V=3):
    return (np.full((1, V), -1, np.int64), np.full((1, V), NEVER), np.zeros((1, V)),
            np.zeros(1, np.int64))


def test_hear_by_hand():
    tk = np.uint64(tie_key(4))
    tid, tt, th, tn = _table(3)
    assert not hear(tk, 0, 0, 5.0, tid, tt, th, tn)  # never itself
    assert hear(tk, 0, 7, 10.0, tid, tt, th, tn) and hear(tk, 0, 8, 30.0, tid, tt, th, tn)
    assert hear(tk, 0, 9, 20.0, tid, tt, th, tn)
    assert tid[0].tolist() == [8, 9, 7] and tt[0].tolist() == [30.0, 20.0, 10.0]
    assert not hear(tk, 0, 9, 20.0, tid, tt, th, tn)  # as fresh: unchanged
    assert not hear(tk, 0, 9, 15.0, tid, tt, th, tn)  # older: unchanged
    assert hear(tk, 0, 7, 40.0, tid, tt, th, tn)  # fresher: moves up
    assert tid[0].tolist() == [7, 8, 9]
    assert not hear(tk, 0, 4, 5.0, tid, tt, th, tn)  # full, older than the last: left out
    assert hear(tk, 0, 4, 25.0, tid, tt, th, tn)  # full, fresher than the last: it leaves
    assert tid[0].tolist() == [7, 8, 4] and tt[0].tolist() == [40.0, 30.0, 25.0]
    # a tie at the last place: the larger keyed hash of (seed, device, peer) stays
    h = {j: uniform(tk, 0, j, 0) for j in (4, 6)}
    hear(tk, 0, 6, 25.0, tid, tt, th, tn)
    assert tid[0, 2] == max(h, key=h.get)


def test_tables_start_with_the_neighbours_never_heard():
    g = Graph.from_edges(5, np.array([[0, 1], [0, 2], [0, 3], [0, 4], [1, 2]]))
    tid, tt, _, tn = new_tables(parse_peers("online:s=1,view=2"), 3, g)
    assert tn.tolist() == [2, 2, 2, 1, 1] and np.all(np.isneginf(tt[tn > 0][:, 0]))
    tk = np.uint64(tie_key(3))
    hashes = {j: uniform(tk, 0, j, 0) for j in (1, 2, 3, 4)}
    assert tid[0].tolist() == sorted(hashes, key=hashes.get, reverse=True)[:2]
    assert tid[3, 0] == 0 and tid[1].tolist() in ([0, 2], [2, 0])


def test_round_sends_by_hand():
    """3 devices on a path 0-1-2, online:s=1,view=2,gossip=1: round 0 only 0 and 1 are
    available, round 1 all. 0's table is {1} at the start, so 0 sends to 1 in round 0; 1 draws
    0 or 2 (2 is offline then: lost). In round 1, 1 has heard of 0 at 0 (first-hand)."""
    g = Graph.from_edges(3, np.array([[0, 1], [1, 2]]))
    avail = np.array([[1, 1, 0], [1, 1, 1]], bool)
    got = round_sends(parse_peers("online:s=1,view=2,gossip=1"), 5, avail, g, 600.0)
    r0 = got["round"] == 0
    assert got["send"][r0].tolist() == [0, 1] and got["recv"][r0][0] == 1
    assert got["reached"][r0].tolist() == [True, bool(got["recv"][r0][1] == 0)]
    assert got["messages"] == 5 and got["to_offline"] == int((~got["reached"]).sum())
    # only heard entries travel: none in round 0; in round 1 device 1 carries 0 (heard in
    # round 0), device 0 carries 1 if 1's message reached it, device 2 has heard of no one
    assert got["membership_bytes"] == 12 * (2 if got["recv"][r0][1] == 0 else 1)


def test_sampled_deliveries_are_the_reached_messages():
    rng = np.random.default_rng(0)
    avail = rng.random((40, 30)) < 0.4
    g = Graph.from_edges(30, np.array([[i, (i + 1) % 30] for i in range(30)]))
    p = parse_peers("epidemic:s=3")
    union, live, counts = sampled_deliveries(p, 9, avail, g, 600.0)
    got = round_sends(p, 9, avail, g, 600.0)
    from sfg.round.slots import RoundGraph

    rg = RoundGraph.from_graph(union)
    ok = got["reached"]
    t, s, r = np.nonzero(live)[0], rg.send[np.nonzero(live)[1]], rg.recv[np.nonzero(live)[1]]
    want = sorted(zip(got["round"][ok], got["send"][ok], got["recv"][ok], strict=True))
    assert sorted(zip(t, s, r, strict=True)) == want
    hours = 30 * 40 * 600 / 3600
    assert counts["peer_messages_per_device_hour"] == pytest.approx(int(avail.sum()) * 3 / hours)


def test_replay_rules_paired_on_the_same_sends():
    rows = replay(["bursty:u=0.8"], ["dfedavg", "sfg-cut"], [1, 2], n=40, T=60,
                  peers="online:s=4", horizon=0)
    by = {(r["rule"], r["seed"]): r for r in rows}
    for seed in (1, 2):
        a, b = by["dfedavg", seed], by["sfg-cut", seed]
        for k in ("returning_aggregations", "returning_aggregations_heard", "premise",
                  "peer_messages_per_device_hour", "membership_bytes_per_device_hour"):
            assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), k
    assert by["dfedavg", 1]["spread_lag"] != by["dfedavg", 2]["spread_lag"]


def test_fixed_is_the_replay_without_the_setting():
    base = replay(["bursty:u=0.8"], ["sfg-cut"], [3], n=30, T=40, horizon=10)
    same = replay(["bursty:u=0.8"], ["sfg-cut"], [3], n=30, T=40, horizon=10, peers="fixed")
    assert base == same and "peer_messages_per_device_hour" not in base[0]
    other = replay(["bursty:u=0.8"], ["sfg-cut"], [3], n=30, T=40, horizon=10,
                   peers="epidemic:s=6")
    assert other[0]["spread_lag"] != base[0]["spread_lag"]


@pytest.mark.parametrize("rule", ["dfl-aa", "metropolis-hastings", "sfg-l+ipw", "dfedavg+guard"])
def test_per_neighbour_rules_refused(rule):
    with pytest.raises(SfgError, match="cannot run with peers"):
        replay(["bursty:u=0.8"], [rule], [1], n=20, T=10, peers="epidemic:s=3")


def test_cli_one_line_errors(tmp_path):
    import subprocess
    import sys

    for args, words in [(["--peers", "online:s=0"], "whole number"),
                        (["--peers", "epidemic:s=3", "--clock", "virtual", "--protocol",
                          "async", "--on-return", "pull:timeout=60", "--latency", "lognormal:median=1,sigma=1"], "latency drawn per link")]:
        out = subprocess.run([sys.executable, "-m", "sfg", "replay", "-n", "20", "-T", "10",
                              *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and words in out.stderr
        assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert isinstance(parse_peers(Peers("epidemic", 3)), Peers)


def test_config_key_run_ids_and_refusals():
    from sfg.engines import refuse
    from sfg.experiments.config import RunConfig, run_id
    from sfg.modelfree.api import replay_config

    base = RunConfig(kind="replay", n_clients=30, rounds=20)
    same = RunConfig(kind="replay", n_clients=30, rounds=20, peers="fixed")
    assert run_id(base) == run_id(same) and "peers" not in base.model_dump()
    other = RunConfig(kind="replay", n_clients=30, rounds=20, peers="online:s=3")
    assert other.peers == "online:s=3,view=12,gossip=3" and run_id(other) != run_id(base)
    with pytest.raises(ValueError, match="whole number"):
        RunConfig(kind="replay", peers="epidemic:s=0")
    out = replay_config({**other.model_dump(), "horizon": 0})
    assert out["metrics"]["peer_messages_per_device_hour"] > 0 and out["curves"]["mean_lag"]
    # every engine runs peers now: the clock's and the node on the clock among them
    refuse("clock-async", {"clock": "virtual", "protocol": "async", "peers": "epidemic:s=2"})
    refuse("node-async", {"clock": "virtual", "protocol": "async", "nodes": "virtual",
                          "peers": "epidemic:s=2"})
    from sfg.net.node import Node, NodeConfig
    from sfg.net.world import build_world

    with pytest.raises(SfgError, match="cannot know whom to wait for"):  # but not everywhere
        Node(build_world({"n_clients": 6, "rounds": 2, "peers": "online:s=2"}), 0,
             NodeConfig(mode="lockstep"))


def test_node_peer_file_and_the_setting(tmp_path):
    """sfg node: the peer file is --peer-file (--peers FILE, the old spelling, still read with
    a notice); a peers setting is read beside it, an impossible one refused with one line."""
    import subprocess
    import sys

    f = tmp_path / "peers.yaml"
    f.write_text("nodes: {0: 127.0.0.1:7000, 1: 127.0.0.1:7001}\nedges: [[0, 1]]\n")

    def node(*args):
        return subprocess.run([sys.executable, "-m", "sfg", "node", "--id", "0", "--listen",
                               "127.0.0.1:7000", *args, "--protocol", "event"],
                              capture_output=True, text=True, timeout=120)

    old = node("--peers", str(f))
    assert old.returncode == 2 and "deprecated; use --peer-file" in old.stderr
    assert "virtual clock only" in old.stderr  # it read the file and went on to the check
    new = node("--peer-file", str(f))
    assert new.returncode == 2 and "deprecated" not in new.stderr
    # a peers setting is read beside the peer file (real nodes run it: tests/test_peers_nodes.py)
    sampled = node("--peer-file", str(f), "--peers", "epidemic:s=1")
    assert sampled.returncode == 2 and "virtual clock only" in sampled.stderr
    assert sampled.stderr.strip().count("\n") == 0
    bad = node("--peer-file", str(f), "--peers", "bogus")
    assert bad.returncode == 2 and "unknown peers 'bogus'" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0
    missing = node()
    assert missing.returncode == 2 and "give --peer-file" in missing.stderr


def test_sends_refused_over_the_memory_limit(monkeypatch):
    monkeypatch.setenv("SFG_MAX_MEMORY", "1M")
    avail = np.ones((300, 500), bool)
    g = Graph.from_edges(500, np.array([[i, (i + 1) % 500] for i in range(500)]))
    with pytest.raises(SfgError, match="over the limit"):
        round_sends(parse_peers("epidemic:s=50"), 1, avail, g, 600.0)


def test_replay_table_shows_the_peers_costs():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sfg", "replay", "-n", "30", "-T", "20",
                          "--seeds", "1,2", "-r", "sfg-cut", "--peers", "epidemic:s=3",
                          "--horizon", "0"], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "COLUMNS": "250"})
    assert out.returncode == 0 and "msgs/dh" in out.stdout and "member B/dh" in out.stdout
    from sfg.cli.replay import summarise_replay

    rows = replay(["bursty:u=0.8"], ["sfg-cut"], [1, 2], n=30, T=20, horizon=0,
                  peers="epidemic:s=3")
    s = summarise_replay(rows)[0]
    want = (rows[0]["peer_messages_per_device_hour"] + rows[1]["peer_messages_per_device_hour"]) / 2
    assert s["peer_messages_per_device_hour"] == pytest.approx(want)


@pytest.mark.parametrize("V,n", [(5, 12), (1, 6), (28, 40)])
def test_hearing_at_once_is_hearing_in_turn(V, n):
    """sfg.world.peers.hear_many (one merge) leaves the table that hear() of each peer in turn
    leaves, in any order: a table keeps the V freshest of what it heard."""
    from sfg.world.peers import NEVER, hear, hear_many, hear_scratch

    rng = np.random.default_rng(4 + V)
    key = np.uint64(99)
    changed = 0
    for _ in range(400):
        one = (np.full((1, V), -1, np.int64), np.full((1, V), NEVER), np.zeros((1, V)),
               np.zeros(1, np.int64))
        for j in rng.choice(n, rng.integers(0, V + 2), replace=False):  # a table to start from
            hear(key, 0, int(j), NEVER if rng.random() < 0.3 else float(rng.integers(0, 20)),
                 *one)
        other = tuple(a.copy() for a in one)
        before = tuple(a.copy() for a in one)
        cnt = int(rng.integers(1, 7))
        ids = rng.choice(n, cnt, replace=False).astype(np.int64)  # (0 itself may be among them)
        ts = rng.integers(0, 25, cnt).astype(float)
        for k in rng.permutation(cnt):
            hear(key, 0, int(ids[k]), float(ts[k]), *one)
        hear_many(key, 0, ids, ts, cnt, *other, hear_scratch(V, cnt))
        for a, b in zip(one, other, strict=True):
            assert np.array_equal(a[0, :one[3][0]] if a.ndim == 2 else a,
                                  b[0, :other[3][0]] if b.ndim == 2 else b)
        changed += not all(np.array_equal(a, b) for a, b in zip(one, before, strict=True))
    assert changed > 100
