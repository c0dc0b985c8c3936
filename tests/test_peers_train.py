"""Training with peers chosen per exchange (docs/concepts/peers.md#training-with-peers): the
rounds and the clock's lockstep train on the replay's sampled sends (sfg.modelfree.peers, one
definition), deterministic and paired across rules; rules that keep state per neighbour are
refused with one line, and the rules reference's column says which."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sfg.errors import SfgError
from sfg.sim.context import build_run
from sfg.sim.run import RoundLoop, resolve_config, simulate

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(dataset="digits", model="mlp", n_clients=12, rounds=6, local_steps=2, batch_size=8,
            eval_every=3, graph="knn:k=3", process="bursty:u=0.6", backend="batched")
PEERS = ("epidemic:s=2", "online:s=2")


def run(**kw):
    return simulate({**TINY, **kw})


def _deliveries(**kw):
    """The deliveries per slot and the union graph of a run, without training it."""
    loop = RoundLoop(build_run(resolve_config({**TINY, **kw}), engine="rounds"))
    return loop.clock_live, loop.graph.edges, loop.clock_meta["schedule_digest"]


@pytest.mark.parametrize("peers", PEERS)
def test_deterministic_and_paired_across_rules(peers):
    a, b = run(peers=peers, rule="dfedavg"), run(peers=peers, rule="dfedavg")
    assert torch.equal(a.params, b.params) and a.metrics == b.metrics
    assert a.meta["schedule_digest"] == b.meta["schedule_digest"]
    c = run(peers=peers, rule="sfg-cut")
    assert c.meta["schedule_digest"] == a.meta["schedule_digest"]
    assert c.meta["minibatch_digest"] == a.meta["minibatch_digest"]
    assert not torch.equal(c.params, a.params)  # another rule on the same exchanges
    for k in ("peer_messages_per_device_hour", "messages_to_offline_per_device_hour",
              "membership_bytes_per_device_hour"):
        assert c.metrics[k] == a.metrics[k]
    # the same deliveries, not only the same digest
    live_a, edges_a, dig_a = _deliveries(peers=peers, rule="dfedavg")
    live_c, edges_c, dig_c = _deliveries(peers=peers, rule="sfg-cut")
    assert np.array_equal(live_a, live_c) and np.array_equal(edges_a, edges_c)
    assert dig_a == dig_c == a.meta["schedule_digest"]
    # another seed, other exchanges
    assert run(peers=peers, seed=2).meta["schedule_digest"] != a.meta["schedule_digest"]


def test_candidates_are_the_senders_that_drew_the_receiver():
    """By hand: a receiver's candidates in round t (beside itself) are exactly the devices
    that drew it among their targets in round t (sfg.world.peers.round_sends) while it was
    available."""
    from sfg.world.graphs import make_graph
    from sfg.world.peers import parse_peers, round_sends

    seen: list[tuple[np.ndarray, object]] = []
    res = simulate({**TINY, "peers": "epidemic:s=2"},
                   observer=lambda s: seen.append((s["candidate"].copy(), s["rg"])))
    loop = RoundLoop(build_run(resolve_config({**TINY, "peers": "epidemic:s=2"}),
                               engine="rounds"))
    avail = loop.available
    got = round_sends(parse_peers("epidemic:s=2"), 1, avail,
                      make_graph(TINY["graph"], TINY["n_clients"], seed=1), 600.0)
    assert len(seen) == TINY["rounds"] and res.metrics["peer_messages_per_device_hour"] > 0
    for t, (cand, rg) in enumerate(seen):
        nb = cand & ~rg.is_self
        heard = {(int(j), int(i)) for j, i in zip(rg.send[nb], rg.recv[nb], strict=True)}
        drew = got["round"] == t
        want = {(int(j), int(i)) for j, i in zip(got["send"][drew], got["recv"][drew],
                                                 strict=True) if avail[t, i]}
        assert heard == want, t
        assert all(avail[t, j] for j, _ in want)  # only the available send
    assert any(seen[t][0][~seen[t][1].is_self].any() for t in range(len(seen)))


def test_counts_are_the_replays_and_registered():
    from sfg import metrics as reg
    from sfg.modelfree.api import replay

    for peers in PEERS:
        res = run(peers=peers)
        rows = replay([TINY["process"]], ["dfedavg"], [1], n=TINY["n_clients"],
                      T=TINY["rounds"], graph=TINY["graph"], horizon=0, peers=peers)
        for k in ("peer_messages_per_device_hour", "messages_to_offline_per_device_hour",
                  "membership_bytes_per_device_hour"):
            assert res.metrics[k] == rows[0][k], (peers, k)
        assert set(res.metrics) <= reg.reported_by("rounds")


@pytest.mark.parametrize("peers", PEERS)
def test_lockstep_with_instant_messages_is_the_rounds(peers):
    """The clock's lockstep with messages that take no time delivers every send to a target
    that takes part: the rounds' exchanges, the same models."""
    from sfg import metrics as reg

    a = run(peers=peers)
    b = run(peers=peers, clock="virtual")
    assert torch.equal(a.params, b.params)
    assert b.metrics["peer_messages_per_device_hour"] == a.metrics["peer_messages_per_device_hour"]
    assert set(b.metrics) <= reg.reported_by("clock-lockstep")
    late = run(peers=peers, clock="virtual", latency="const:value=700")  # none in time
    assert late.meta["schedule_digest"] != b.meta["schedule_digest"]
    assert late.metrics["late"] > 0 and not torch.equal(late.params, b.params)


def test_fixed_is_the_run_without_the_setting():
    a, b = run(), run(peers="fixed")
    assert torch.equal(a.params, b.params) and a.metrics == b.metrics
    assert "schedule_digest" not in a.meta and "peer_messages_per_device_hour" not in a.metrics


@pytest.mark.parametrize("rule", ["dfl-aa", "model-memory", "relative-variance", "sfg-l+ipw",
                                  "sfg-cut+certified", "metropolis-hastings"])
def test_per_neighbour_rules_refused(rule):
    with pytest.raises(SfgError, match="cannot run with peers"):
        run(rule=rule, peers="online:s=2", rounds=1, eval_every=1)
    with pytest.raises(SfgError, match="cannot run with peers"):
        run(rule=rule, peers="epidemic:s=2", rounds=1, eval_every=1, clock="virtual")


def test_cli_refuses_dfl_aa_with_one_line():
    out = subprocess.run([sys.executable, "-m", "sfg", "run", "-n", "8", "-T", "2", "--rule",
                          "dfl-aa", "--peers", "epidemic:s=2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and "dfl-aa" in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr


@pytest.mark.parametrize("protocol,peers,extra", [
    ("async", "online:s=2", {"jitter": 0.5, "on_return": "pull:timeout=60"}),
    ("event", "epidemic:s=2", {}),
    ("async", "epidemic:s=3", {"latency": "const:value=30"}),
])
def test_async_and_event_train_on_the_replays_schedule(protocol, peers, extra):
    """Under async and event a run trains on the schedule the model-free replay makes for the
    seed (the one time-ordered simulation, peers and pull inside it): the same digest as
    sfg replay's, paired across rules, bit-identical when run again, the peers' costs in the
    metrics as the replay reports them."""
    from sfg.clock.replay import replay_clock
    from sfg.clock.settings import make_settings
    from sfg.clock.train import simulate_events

    c = {**TINY, "clock": "virtual", "protocol": protocol, "compute": "const:value=30",
         "rounds": 8, "peers": peers, **extra}
    a = simulate_events(resolve_config({**c, "rule": "dfedavg"}))
    again = simulate_events(resolve_config({**c, "rule": "dfedavg"}))
    b = simulate_events(resolve_config({**c, "rule": "sfg-cut"}))
    assert torch.equal(a.params, again.params)
    assert json.dumps(a.metrics, sort_keys=True) == json.dumps(again.metrics, sort_keys=True)
    assert a.meta["schedule_digest"] == b.meta["schedule_digest"]
    assert not torch.equal(a.params, b.params)
    s = make_settings({"clock": "virtual", "protocol": protocol, "compute": "const:value=30",
                       **extra})
    free = replay_clock(TINY["process"], "dfedavg", seed=1, settings=s, n=TINY["n_clients"],
                        rounds=8, graph=TINY["graph"], local_steps=TINY["local_steps"],
                        peers=peers)
    assert free["meta"]["schedule_digest"] == a.meta["schedule_digest"]
    for k in ("peer_messages_per_device_hour", "messages_to_offline_per_device_hour",
              "membership_bytes_per_device_hour"):
        assert a.metrics[k] == pytest.approx(free["metrics"][k], rel=1e-12)
    fixed = simulate_events(resolve_config({**c, "rule": "dfedavg", "peers": "fixed"}))
    assert fixed.meta["schedule_digest"] != a.meta["schedule_digest"]
    assert "peer_messages_per_device_hour" not in fixed.metrics


def test_cli_event_run_shows_the_peers_costs():
    out = subprocess.run([sys.executable, "-m", "sfg", "run", "--clock", "virtual", "--protocol",
                          "event", "--compute", "const:value=30", "-n", "12", "-T", "4",
                          "--peers", "online:s=2", "--on-return", "pull:timeout=60",
                          "--rule", "sfg-l"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    for row in ("messages to drawn peers per device-hour", "membership bytes per device-hour"):
        assert row in out.stdout


def test_async_refuses_a_per_neighbour_rule_with_peers():
    from sfg.clock.train import simulate_events

    c = {**TINY, "clock": "virtual", "protocol": "async", "peers": "epidemic:s=2",
         "rule": "dfl-aa"}
    with pytest.raises(SfgError, match="cannot run with peers") as e:
        simulate_events(resolve_config(c))
    assert "\n" not in str(e.value)


def test_rules_reference_column_is_check_rules():
    """The generated column of docs/reference/rules.md says, per rule and modifier, what
    check_rule refuses under peers other than fixed (one source: PER_NEIGHBOUR_*)."""
    from sfg.modelfree.peers import check_rule, rules_markdown
    from sfg.round.rules import MODIFIERS, parse_rule, rule_names
    from sfg.world.peers import parse_peers

    page = (ROOT / "docs" / "reference" / "rules.md").read_text(encoding="utf-8")
    assert page == rules_markdown(), "run: python -m sfg.modelfree.peers docs/reference/rules.md"
    assert "reference/rules.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    peers = parse_peers("epidemic:s=2")
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[-2].strip()
            for line in page.splitlines() if line.startswith("| `")}
    for name in rule_names():
        try:
            check_rule(parse_rule(name), peers)
            refused = False
        except SfgError:
            refused = True
        assert rows[name].startswith("refused") == refused, name
    for m in MODIFIERS:  # on a rule that keeps nothing per neighbour
        try:
            check_rule(parse_rule(f"dfedavg+{m}"), peers)
            refused = False
        except SfgError:
            refused = True
        assert rows[f"+{m}"].startswith("refused") == refused, m
