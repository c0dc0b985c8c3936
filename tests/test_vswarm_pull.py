"""Returns in time on the node under the virtual clock (docs/concepts/clock.md#returns-in-time,
docs/concepts/clock.md#the-node-on-the-clock): ``sfg swarm --clock virtual --protocol async`` with ``on_return:
pull:timeout=S`` runs the deployable node's pull (sfg.net.node) over the in-memory network
(sfg.net.memory: the requests and replies on the devices' uplinks, with the clock's engine's
latencies, losses and faults) and gives the same models, bit for bit, and the same pull counts
as ``sfg run --clock virtual --protocol async --on-return pull:timeout=S`` (sfg.clock.pull).
Everything runs in this process on virtual time; every run is bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest
from crosspath import assert_same_bits
from running import bounded

from sfg.clock.faults import Faults
from sfg.net.swarm import SwarmOptions
from sfg.net.virtual import run_virtual_swarm
from sfg.net.world import build_world

P = 600.0
S = 120.0  # the pull's longest wait (virtual seconds), below P
BASE = dict(rounds=30, local_steps=2, process="bursty:u=0.5", graph="knn:k=6", seed=1,
            eval_every=10, dataset="digits", model="mlp", backend="loop", rule="sfg-cut")
# a finite uplink (a 36 kB model: 90 s a message) and latency: the replies queue behind
# broadcasts and each other, the windows last long enough to move wakes, some time out, and
# some broadcasts outlast the next wake (skipped)
WORLD = {"compute": "lognormal:median=20,sigma=0.5", "latency": "const:value=3",
         "uplink": "const:value=400"}
FAULTS = ("faults:loss=0.1,delay=40,reorder=0.15,hold=700,dup=0.1,copies=2,corrupt=0.05,"
          "misroute=0.05,partition=0-2|3-5@3000-9000")

pytestmark = pytest.mark.crosspath

# the counts the node and the engine count alike, under the same names (sfg.metrics)
SAME_COUNTS = ("pull_requests", "pull_replies", "pull_empty", "pull_unreachable",
               "pull_replies_delivered", "pull_bytes", "returns", "returns_heard",
               "pull_wait_seconds", "skipped")


def _engine(n: int, world_set: dict, on_return: str | None, faults: str | None):
    from sfg.clock.train import simulate_events
    from sfg.sim.run import resolve_config

    return simulate_events(resolve_config({
        **BASE, "n_clients": n, **world_set, "clock": "virtual", "protocol": "async",
        "period": P, "jitter": 0.5, **({"on_return": on_return} if on_return else {}),
        **({"faults": faults, "faults_seed": 5} if faults else {})}))


def _nodes(n: int, world_set: dict, on_return: str, faults: str | None):
    world = build_world({**BASE, "n_clients": n, **world_set, "clock": "virtual",
                         "protocol": "async", "period": P, "round_seconds": P,
                         "on_return": on_return})
    opts = SwarmOptions(mode="async", period=P, jitter=0.5, window=1.0)
    return bounded(lambda: run_virtual_swarm(
        world, opts, clock_settings=world_set,
        faults=Faults.parse(faults, seed=5) if faults else None), 120.0, "the run hangs")


@pytest.mark.parametrize("n,faults", [(8, None), (8, "faults:loss=0.1,delay=2"), (16, FAULTS)],
                         ids=["no-faults", "loss-delay", "every-message-fault"])
def test_virtual_swarm_with_pull_equals_the_clocks_engine(n, faults):
    """Same seed, world (graph, trace, compute, uplink, latency; with faults also the world's
    per-link loss) and on_return: the nodes' pull on the virtual clock and the clock's engine
    give the same models bit for bit, and the same requests, replies, empty and unreachable
    answers, returns heard, waits and skipped wakes; and the pull changed the models."""
    world_set = {**WORLD, **({"loss": "const:value=0.05"} if faults else {})}
    on_return = f"pull:timeout={S:g}"
    res = _nodes(n, world_set, on_return, faults)
    eng = _engine(n, world_set, on_return, faults)
    assert_same_bits(res["params"], eng["params"].numpy())
    assert [nd["acc"] for nd in res["nodes"]] == eng["accuracy"].tolist()
    m, e = res["metrics"], eng["metrics"]
    assert m["messages"] == e["messages"] > 0
    for k in SAME_COUNTS:
        assert m.get(k, 0.0) == e[k], (k, m.get(k), e[k])
    # the pull happened and its waits were real: replies, unreachable neighbours, windows that
    # moved a wake, some timed out, replies not newer than what was held
    assert e["pull_replies_delivered"] > 0 and e["pull_unreachable"] > 0
    assert e["pull_wait_seconds"] > 0 and e["pull_timed_out"] > 0
    assert m["pull_replies_unused"] > 0 and e["skipped"] > 0
    if faults:  # some requests or replies were lost to the faults or the world's loss
        assert e["pull_replies"] + e["pull_empty"] + e["pull_unreachable"] \
            < e["pull_requests"] or m.get("net_pull_faults", 0) > 0
    # without pull: other models (the replies reached the models)
    none = _engine(n, world_set, None, faults)
    assert np.abs(none["params"].numpy() - eng["params"].numpy()).max() > 1e-4


def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


SWARM = ["swarm", "--clock", "virtual", "--protocol", "async", "-n", "8", "-T", "12",
         "--eval-every", "6", "-K", "2", "-p", "bursty:u=0.5", "--jitter", "0.5",
         "--compute", "const:value=30", "--latency", "const:value=20"]


def test_cli_virtual_swarm_passes_on_return_through(capsys):
    """``sfg swarm --clock virtual --protocol async --on-return pull:timeout=S``: the nodes
    pull (the swarm's metrics count requests and answers, the config names the setting);
    without it they do not."""
    code, out, err = bounded(lambda: _cli([*SWARM, "--on-return", "pull:timeout=100",
                                           "--json"], capsys), 120.0, "the run hangs")
    assert code == 0, err
    got = json.loads(out)
    m = got["metrics"]
    assert got["config"]["on_return"] == "pull:timeout=100"
    assert m["pull_requests"] > 0 and m["returns"] > 0
    assert m["pull_replies_delivered"] + m.get("pull_empty_received", 0) \
        + m.get("pull_unreachable_received", 0) > 0
    code, out, err = bounded(lambda: _cli([*SWARM, "--json"], capsys), 120.0, "the run hangs")
    assert code == 0, err
    assert "pull_requests" not in json.loads(out)["metrics"]


@pytest.mark.parametrize("args,needle", [
    (["--on-return", "pull:timeout=600", "--period", "600"], "period P"),
    (["--on-return", "pull:timeout=700", "--period", "600"], "period P"),
])
def test_cli_virtual_swarm_refuses_a_wait_not_below_the_period(args, needle, capsys):
    code, _, err = _cli([*SWARM, *args], capsys)
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in err, err
