"""Peers chosen per exchange on the node on the virtual clock
(docs/concepts/peers.md#the-node-on-the-clock): ``sfg swarm --clock virtual`` runs the deployable node's membership (sfg.net.membership: the
keyed target draws, the table, the entries in the header) over the in-memory network, and
gives the same models bit for bit, and the same peer counts, as the clock's engine
(``sfg run --clock virtual``, whose schedule comes from sfg.clock.peersim) — async under
``epidemic`` and ``online``, lockstep under ``epidemic``. Everything runs in this process on
virtual time; every run is bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from crosspath import assert_same_bits
from running import bounded

from sfg.net.swarm import SwarmOptions
from sfg.net.virtual import run_virtual_swarm
from sfg.net.world import build_world

P = 600.0
BASE = dict(rounds=20, local_steps=2, process="bursty:u=0.5", graph="knn:k=4", seed=2,
            eval_every=10, dataset="digits", model="mlp", backend="loop", rule="sfg-l")
# the peers' counts the node and the engine report alike (sfg.metrics)
PEER_METRICS = ("peer_messages_per_device_hour", "messages_to_offline_per_device_hour",
                "membership_bytes_per_device_hour")
SAME = ("messages", "returns", "returns_heard", "skipped", "unavailability", *PEER_METRICS)
# worlds: latency, a lossy and finite network with jitter; and one full of ties (every device
# wakes, commits and is heard at the same instants: no latency, no jitter, an instant uplink)
LOSSY = ({"compute": "const:value=20", "latency": "const:value=5", "loss": "const:value=0.2",
          "uplink": "const:value=2000"}, 0.3)
TIES = ({"compute": "const:value=20", "latency": "const:value=0"}, 0.0)
# a slow uplink: broadcasts outlast their device's online time, so some messages are lost at
# their sender (neither they nor their entries count as sent)
SLOW = ({"compute": "const:value=20", "latency": "const:value=5", "uplink": "const:value=200"},
        0.5)

pytestmark = pytest.mark.crosspath


def _nodes(n: int, peers: str, world_set: dict, jitter: float, **over) -> dict:
    world = build_world({**BASE, "n_clients": n, "peers": peers, **world_set, **over,
                         "clock": "virtual", "protocol": "async", "period": P,
                         "round_seconds": P})
    opts = SwarmOptions(mode="async", period=P, jitter=jitter, window=1.0)
    return bounded(lambda: run_virtual_swarm(world, opts, clock_settings=world_set), 120.0,
                   "the run hangs")


def _engine(n: int, peers: str, world_set: dict, jitter: float, **over) -> dict:
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    return simulate_events(resolve_config({**BASE, "n_clients": n, "peers": peers,
                                           **world_set, **over, "clock": "virtual",
                                           "protocol": "async", "period": P,
                                           "jitter": jitter}))


@pytest.mark.parametrize("peers,world", [
    ("epidemic:s=3", LOSSY), ("online:s=3,view=6,gossip=2", LOSSY),
    ("online:s=3,view=6,gossip=2", TIES), ("epidemic:s=3", TIES),
    ("online:s=3,view=6,gossip=2", SLOW)],
    ids=["epidemic-lossy", "online-lossy", "online-ties", "epidemic-ties", "online-slow"])
def test_async_node_with_peers_equals_the_clocks_engine(peers, world):
    """Same seed, world and peers: the nodes draw their targets at each commit from the
    same keyed streams, keep the same tables (what each message's header carries, heard at
    its arrival) and give the engine's models bit for bit, its accuracies, and its counts
    of messages, returns heard, messages to drawn peers, to offline peers and membership
    bytes, per device-hour."""
    world_set, jitter = world
    res = _nodes(16, peers, world_set, jitter)
    eng = _engine(16, peers, world_set, jitter)
    _same(res, eng)
    e = eng["metrics"]
    assert e["peer_messages_per_device_hour"] > 0 and e["messages_to_offline_per_device_hour"] > 0
    assert (e["membership_bytes_per_device_hour"] > 0) == peers.startswith("online")
    if world is SLOW:  # messages lost at their sender, not counted as sent by either
        assert e["lost_sender"] > 0 and res["metrics"]["net_lost_sender"] == e["lost_sender"]
    # the peers drawn changed the run: the graph's neighbours give other models
    fixed = _engine(16, "fixed", world_set, jitter)
    assert np.abs(fixed["params"].numpy() - eng["params"].numpy()).max() > 1e-4


def _same(res: dict, eng: dict, also: tuple[str, ...] = ()) -> None:
    assert_same_bits(res["params"], eng["params"].numpy())
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    m, e = res["metrics"], eng["metrics"]
    for k in (*SAME, *also):
        # the waits are a float sum, taken node by node on the node, in time order on the
        # engine: the same terms, so equal up to the order of the sum
        want = pytest.approx(e[k], rel=1e-12) if k == "pull_wait_seconds" else e[k]
        assert m[k] == want, (k, m[k], e[k])


PULL_COUNTS = ("pull_requests", "pull_replies", "pull_empty", "pull_unreachable",
               "pull_replies_delivered", "pull_bytes", "pull_wait_seconds")


# long first local rounds: devices asked before they sent a model answer empty
LONG = ({"compute": "lognormal:median=100,sigma=1", "latency": "const:value=2"}, 0.5)


@pytest.mark.parametrize("peers,world", [
    ("epidemic:s=3", LOSSY), ("epidemic:s=3", TIES), ("online:s=3,view=6,gossip=2", LOSSY),
    ("online:s=3,view=6,gossip=2", TIES), ("online:s=3,view=6,gossip=2", LONG),
    ("online:s=3,view=6,gossip=2", SLOW)],
    ids=["epidemic-lossy", "epidemic-ties", "online-lossy", "online-ties", "online-long",
         "online-slow"])
def test_async_node_pulls_from_drawn_peers_as_the_engine_does(peers, world):
    """With ``on_return: pull`` a returning node asks the S devices the stream (seed,
    "peers", "pull") draws for its return (under ``online`` from its table as it stands),
    not its graph neighbours; under ``online`` a request makes its target hear of the
    asking node, a reply carries its sender's entries taken when it is made, an empty
    answer is heard as its sender alone, and "unreachable" removes the peer — at one
    instant in the engine's order. The engine's models bit for bit, its pull's requests,
    replies, unreachable answers and waits, and its peer counts."""
    world_set, jitter = world
    pull = {"on_return": "pull:timeout=120"}
    res = _nodes(16, peers, world_set, jitter, **pull)
    eng = _engine(16, peers, world_set, jitter, **pull)
    _same(res, eng, PULL_COUNTS)
    e = eng["metrics"]
    assert e["pull_replies_delivered"] > 0 and e["pull_unreachable"] > 0
    if world is LONG:
        assert e["pull_empty"] > 0
    # S requests a return: not the graph's degree (knn:k=4 gives each device 4 or more)
    assert e["pull_requests"] <= 3 * e["returns"]
    plain = _engine(16, peers, world_set, jitter)
    assert np.abs(plain["params"].numpy() - eng["params"].numpy()).max() > 1e-4


def test_lockstep_node_with_epidemic_equals_the_clocks_engine_and_the_rounds():
    """Lockstep under ``epidemic``: each node waits for the available devices whose keyed
    round-r draw names it; with no compute time the node on the virtual clock, sfg run on
    the lockstep clock and plain sfg run in rounds give the same models, and the nodes
    count the engine's messages to drawn peers and to offline ones per device-hour."""
    from sfg.sim.run import simulate

    cfg = {**BASE, "n_clients": 10, "peers": "epidemic:s=3", "rule": "sfg-cut"}
    world = build_world(cfg)
    res = bounded(lambda: run_virtual_swarm(
        world, SwarmOptions(mode="lockstep", period=P, deadline=BASE["rounds"] * P),
        clock_settings={"compute": "const:value=0"}), 120.0, "the run hangs")
    clock = simulate({**cfg, "clock": "virtual", "protocol": "lockstep",
                      "compute": "const:value=0"}, backend="loop")
    plain = simulate(cfg, backend="loop")
    for ref in (clock, plain):
        assert_same_bits(res["params"], ref.params.numpy())
        assert [nd["acc"] for nd in res["nodes"]] == ref.accuracy.tolist()
    for k in ("messages", "peer_messages_per_device_hour", "messages_to_offline_per_device_hour"):
        assert res["metrics"][k] == clock.metrics[k] > 0, k
    fixed = simulate({**cfg, "peers": "fixed"}, backend="loop")
    assert np.abs(fixed.params.numpy() - plain.params.numpy()).max() > 1e-4


def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


SWARM = ["swarm", "--clock", "virtual", "-n", "8", "-T", "6", "-K", "1", "--dataset", "digits",
         "-p", "iid:u=0.5",
         "--compute", "const:value=20"]


def test_cli_virtual_swarm_takes_peers_into_its_settings_and_store(tmp_path, capsys):
    """``sfg swarm --clock virtual --peers``: the setting is the run's (its JSON's config, the
    run id of the store), and the peer counts are in its metrics."""
    store = str(tmp_path / "runs.sqlite")
    code, out, err = _cli([*SWARM, "--protocol", "async", "--peers", "online:s=2", "--json",
                           "--store", store], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["config"]["peers"] == "online:s=2,view=8,gossip=2"
    assert got["metrics"]["peer_messages_per_device_hour"] > 0
    from sfg.experiments.store import records

    runs = records(store)
    assert len(runs) == 1 and runs[0]["config"]["peers"] == "online:s=2,view=8,gossip=2"
    assert runs[0]["run_id"] == got["run_id"]


@pytest.mark.parametrize("args,needle", [
    (["--protocol", "lockstep", "--peers", "online:s=2"], "cannot know whom to wait for"),
    (["--protocol", "async", "--peers", "online:s=2", "--faults", "faults:loss=0.1"],
     "does not run with faults"),
    (["--protocol", "async", "--peers", "epidemic:s=2", "--latency",
      "lognormal:median=2,sigma=0.5"], "latency drawn per link"),
    (["--protocol", "async", "--peers", "epidemic:s=9"], "s=9"),
])
def test_cli_virtual_swarm_refuses_what_it_does_not_run_with_peers(args, needle, capsys):
    code, out, err = _cli([*SWARM, *args], capsys)
    assert code == 2 and out == ""
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
