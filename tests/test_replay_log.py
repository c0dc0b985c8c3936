"""Real runs replayed (docs/concepts/clock.md#the-node-on-the-clock): a real async swarm over gRPC on 127.0.0.1
records its event log; ``sfg swarm --replay-log FILE --clock virtual`` re-executes it with the
same node code on the virtual clock and reproduces its final models. A tampered, truncated or
foreign log is one ``error:`` line (exit 2). Every real run is bounded in time."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from crosspath import assert_same_bits

from sfg.errors import SfgError
from sfg.net.checkpoints import load_checkpoint
from sfg.net.eventlog import models_path, read_logs
from sfg.net.replaylog import replay
from sfg.net.swarm import SwarmOptions, run_swarm
from sfg.net.world import build_world

# small and quick: digits MLP, 8 nodes, 12 rounds of 0.4 s (the machine keeps up with it;
# a late round is recorded as late and replayed as late anyway)
CFG = dict(n_clients=8, rounds=12, local_steps=5, process="bursty:u=0.5", rule="sfg-cut",
           model="mlp", dataset="digits", seed=3, eval_every=4)
PERIOD = 0.4


def _cli(args, capsys):
    from sfg.cli.main import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_error_line(code: int, err: str) -> str:
    # a note (a setting adjusted so a small run runs) is not an error line
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith("note:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def _lines(path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _write(path, objs: list[dict], *, models_from=None) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    if models_from is not None:
        models_path(path).write_bytes(models_path(models_from).read_bytes())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One real 8-node async swarm (2 worker processes, gRPC on 127.0.0.1), recorded."""
    work = tmp_path_factory.mktemp("swarm")
    # the run's settings as the swarm's assembly resolves them (real async nodes, their timer)
    world = build_world({**CFG, "nodes": "real", "protocol": "async", "period": PERIOD,
                         "jitter": 0.2, "window": 1.5})
    log = work / "run.events.jsonl"
    out = run_swarm(world, SwarmOptions(mode="async", procs=2, period=PERIOD, jitter=0.2,
                                        window=1.5, workdir=str(work / "w"),
                                        record_log=str(log)))
    return world, out, log, work / "w"


# ------------------------------------------------------------------ the replay
@pytest.mark.crosspath
def test_event_log_replay_of_a_real_8_node_async_swarm_reproduces_its_final_models(
        recorded, capsys):
    world, real, log, work = recorded
    N, T = world.n, world.rounds
    # the log: every node's wake-ups for every round (the wall clock skips none), arrivals
    # with digests from neighbours only, trainings in the available rounds
    events = _lines(log)
    assert events[0]["kind"] == "swarm" and events[0]["world"] == world.cfg
    assert events[-1] == {"end_of_log": True, "events": len(events) - 2}
    for i in range(N):
        mine = [e for e in events[1:-1] if e["node"] == i]
        assert [e["round"] for e in mine if e["ev"] == "wake"] == list(range(T))
        assert {e["sender"] for e in mine if e["ev"] == "arrival"} <= \
            set(world.neighbours(i).tolist())
        trained = [e["round"] for e in mine if e["ev"] == "trained"]
        assert trained == [r for r in range(T) if world.available[r, i]]
    n_arrivals = sum(e.get("ev") == "arrival" for e in events)
    assert n_arrivals > 50

    code, out, err = _cli(["swarm", "--replay-log", str(log), "--clock", "virtual", "--json"],
                          capsys)
    assert code == 0, err
    res = json.loads(out)
    rp = res["replay"]
    assert rp["arrivals"] == n_arrivals and rp["digests_matched"] == n_arrivals
    assert rp["delivered"] == n_arrivals and rp["final_models_compared"] == N
    # the replay runs the node's own code on the logged arrivals: the same operations in the
    # same order (one backend per client, one aggregation), so the same bits on any CPU
    assert res["max_param_diff"] == 0.0
    # the same JSON as the swarm: same models, so the same accuracies, messages and states
    for key in ("acc_mean", "acc_p10", "acc_time_avg", "messages", "bytes",
                "local_steps_rel", "unavailability"):
        assert res["metrics"][key] == pytest.approx(real["metrics"][key], abs=1e-9), key
    assert res["curves"] == real["curves"]
    for a, b in zip(res["nodes"], real["nodes"], strict=True):
        assert (a["age"], a["count"], a["local_count"]) == (b["age"], b["count"],
                                                              b["local_count"])
        assert a["lag"] == b["lag"]
    assert res["config"]["clock"] == "virtual" and res["config"]["period"] == PERIOD

    # against the real nodes' own last checkpoints (not the models written beside the log)
    X = replay(read_logs([log]))["params"]
    for i in range(N):
        x, state, _ = load_checkpoint(work / "checkpoints" / f"node-{i}.safetensors",
                                      world.layout)
        assert state.t == T
        assert_same_bits(X[i], x, f"node {i}")


def _first_arrival(events: list[dict], pick=lambda e: True) -> int:
    return next(k for k, e in enumerate(events) if e.get("ev") == "arrival" and pick(e))


def test_a_tampered_digest_stops_the_replay_naming_node_round_and_sender(recorded, tmp_path,
                                                                        capsys):
    world, _, log, _ = recorded
    events = _lines(log)
    k = _first_arrival(events)
    e = events[k]
    e["sha256"] = ("0" if e["sha256"][0] != "0" else "1") + e["sha256"][1:]
    bad = tmp_path / "tampered.jsonl"
    _write(bad, events, models_from=log)
    code, _, err = _cli(["swarm", "--replay-log", str(bad), "--clock", "virtual"], capsys)
    line = _one_error_line(code, err)
    assert "diverged" in line and "digest" in line
    assert f"at node {e['node']}, round {e['round']} of sender {e['sender']}" in line


def test_an_arrival_moved_to_another_sender_stops_the_replay(recorded, tmp_path, capsys):
    world, _, log, _ = recorded
    events = _lines(log)
    arrivals = {(e["node"], e["sender"], e["round"]) for e in events if e.get("ev") == "arrival"}
    # to another neighbour that also sent that round to that node: its model's digest differs
    k = _first_arrival(events, lambda e: any(
        (e["node"], j, e["round"]) in arrivals for j in world.neighbours(e["node"])
        if j != e["sender"]))
    e = events[k]
    other = next(int(j) for j in world.neighbours(e["node"])
                 if j != e["sender"] and (e["node"], j, e["round"]) in arrivals)
    e["sender"] = other
    moved = tmp_path / "moved.jsonl"
    _write(moved, events)
    with pytest.raises(SfgError, match=r"diverged.*at node \d+, round \d+ of sender \d+"):
        replay(read_logs([moved]))
    # to a node that is not a neighbour: the log cannot be of this run
    events = _lines(log)

    def strangers(i: int) -> list[int]:
        return [j for j in range(world.n) if j != i and j not in world.neighbours(i)]

    e = events[_first_arrival(events, lambda e: bool(strangers(e["node"])))]
    stranger = e["sender"] = strangers(e["node"])[0]
    _write(moved, events)
    code, _, err = _cli(["swarm", "--replay-log", str(moved), "--clock", "virtual"], capsys)
    line = _one_error_line(code, err)
    assert f"from node {stranger}, which is not a neighbour of node {e['node']}" in line


def test_a_log_of_another_runs_settings_is_one_error_line(recorded, tmp_path, capsys):
    _, _, log, _ = recorded
    for key, value, needle in (("seed", 4, "another run's settings"),
                               ("rule", "local", "diverged"),
                               ("rounds", 20, "another run's settings")):
        events = _lines(log)
        events[0]["world"][key] = value
        other = tmp_path / f"other-{key}.jsonl"
        _write(other, events)
        code, _, err = _cli(["swarm", "--replay-log", str(other), "--clock", "virtual"], capsys)
        assert needle in _one_error_line(code, err), (key, err)


@pytest.mark.parametrize("damage,needle", [
    (lambda b: b[: len(b) // 2], "cut short"),                            # mid-line
    (lambda b: b[: b.rindex(b"\n", 0, len(b) // 2) + 1], "end-of-log"),    # at a line end
    (lambda b: b.replace(b'"ev":"wake"', b'"ev":"wake', 1), "not a JSON line"),
    (lambda b: b.replace(b'"ev":"trained"', b'"ev":"napped"', 1), "unknown event"),
    (lambda b: b.replace(b'"round":3,', b'"round":"3",', 1), "'round'"),
    (lambda b: b.replace(b'"version":1', b'"version":7', 1), "version 7"),
    (lambda b: b'{"rounds": 12}\n', "no sfg-event-log header"),
    (lambda b: b"\x00\xff\x00garbage", "UTF-8"),
    (lambda b: b"", "empty"),
])
def test_a_truncated_or_malformed_log_is_error_exit_2(recorded, tmp_path, capsys, damage,
                                                      needle):
    _, _, log, _ = recorded
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(damage(log.read_bytes()))
    code, _, err = _cli(["swarm", "--replay-log", str(bad), "--clock", "virtual"], capsys)
    assert needle in _one_error_line(code, err), err


@pytest.mark.parametrize("args,needle", [
    (["--replay-log", "{log}"], "--clock virtual"),
    (["--replay-log", "{log}", "--clock", "virtual", "--rule", "local"], "drop --rule"),
    (["--replay-log", "/nonexistent.jsonl", "--clock", "virtual"], "not found"),
    (["--protocol", "lockstep", "--record-log", "x.jsonl", "-n", "4", "-T", "20"], "--protocol async"),
])
def test_replay_and_record_flags_are_checked(recorded, capsys, args, needle):
    _, _, log, _ = recorded
    code, _, err = _cli(["swarm", *[a.format(log=log) for a in args]], capsys)
    assert needle in _one_error_line(code, err), err


# ------------------------------------------------------------------ crashes, sfg node
def test_a_recorded_sigkill_and_restart_is_replayed(tmp_path, capsys):
    """`sfg swarm --mode async --kill 2@4 --record-log`: node 2's process dies and restarts
    from its checkpoint; the replay kills and restarts it at the logged instants, from the
    checkpoint its replayed incarnation wrote, and ends with the real run's models."""
    log = tmp_path / "kill.jsonl"
    code, out, err = _cli(["swarm", "--nodes", "4", "-T", "14", "-p", "iid:u=0.2", "-r",
                           "sfg-cut", "--graph", "ring:k=1", "--eval-every", "7", "--mode",
                           "async", "--period", "0.3", "--procs", "2", "--kill", "2@4",
                           "--workdir", str(tmp_path / "w"), "--record-log", str(log),
                           "--json"], capsys)
    assert code == 0, err
    real = json.loads(out)
    assert real["metrics"]["restarts"] == 1 and real["record_log"] == str(log)
    opens = [e for e in _lines(log)[1:-1] if e["node"] == 2 and e["ev"] == "open"]
    assert len(opens) == 2 and opens[1]["resume"] and opens[1]["restored"] >= 5
    code, out, err = _cli(["swarm", "--replay-log", str(log), "--clock", "virtual", "--json"],
                          capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["replay"]["restarts"] == 1 and res["metrics"]["restarts"] == 1
    assert res["max_param_diff"] == 0.0  # the same operations, see above
    got = next(n for n in res["nodes"] if n["node"] == 2)["restored"]
    want = next(n for n in real["nodes"] if n["node"] == 2)["restored"]
    assert (got["round"], got["missed"], got["age_after"]) == \
        (want["round"], want["missed"], want["age_after"])


def test_sfg_node_logs_of_two_machines_worth_of_nodes_replay_together(tmp_path, capsys):
    """Two `sfg node --mode async --record-log` processes (each its own start time t0, the
    graph from peers.yaml); their two logs replay together."""
    from sfg.net.swarm import free_ports

    p0, p1 = free_ports(2)
    peers = tmp_path / "peers.yaml"
    peers.write_text(f"nodes:\n  0: 127.0.0.1:{p0}\n  1: 127.0.0.1:{p1}\nedges: [[0, 1]]\n")
    logs = [tmp_path / f"node-{i}.jsonl" for i in range(2)]
    common = ["--peer-file", str(peers), "-T", "8", "-p", "iid:u=0.25", "--rule", "sfg-cut",
              "--eval-every", "4", "--json", "--mode", "async", "--period", "0.3"]
    procs = [subprocess.Popen([sys.executable, "-m", "sfg.cli.main", "node", "--id", str(i),
                               "--listen", f"127.0.0.1:{port}", "--record-log", str(logs[i]),
                               *common], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for i, port in ((0, p0), (1, p1))]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, e) in zip(procs, outs, strict=True):
        assert p.returncode == 0, e
    real = [json.loads(o) for o, _ in outs]
    assert sum(r["messages"] for r in real) > 0
    code, out, err = _cli(["swarm", "--replay-log", str(logs[0]), "--replay-log", str(logs[1]),
                           "--clock", "virtual", "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["max_param_diff"] == 0.0 and res["replay"]["final_models_compared"] == 2
    assert [n["acc"] for n in res["nodes"]] == [r["acc"] for r in real]
    # one node's log alone is not the run
    code, _, err = _cli(["swarm", "--replay-log", str(logs[0]), "--clock", "virtual"], capsys)
    assert "every node" in _one_error_line(code, err)


def test_the_log_format_names_its_version_and_the_world(recorded):
    _, _, log, _ = recorded
    head = _lines(log)[0]
    assert head["format"] == "sfg-event-log" and head["version"] == 1
    assert head["settings"] == {"mode": "async", "period": PERIOD, "jitter": 0.2,
                                "window": 1.5, "partitions": []}
    assert re.fullmatch(r"[0-9a-f]{64}", next(e["sha256"] for e in _lines(log)[1:-1]
                                              if e["ev"] == "arrival"))


@pytest.mark.crosspath
@pytest.mark.parametrize("peers", ["epidemic:s=3", "online:s=3,view=4,gossip=2"])
def test_a_real_swarm_with_peers_drawn_replays_to_the_same_models(peers, tmp_path):
    """Peers chosen per exchange (docs/concepts/peers.md#real-nodes): a real async swarm on a
    ring draws its targets and (``online``) keeps its tables on its monotonic clocks; the
    log holds arrivals from devices that are no graph neighbour, and the replay on the
    virtual clock, reading those clocks back, draws the same targets and gives the same
    models bit for bit."""
    world = build_world({**CFG, "graph": "ring:k=1", "nodes": "real", "protocol": "async",
                         "period": PERIOD, "jitter": 0.2, "window": 1.5})
    log = tmp_path / "run.events.jsonl"
    run_swarm(world, SwarmOptions(mode="async", procs=2, period=PERIOD, jitter=0.2, window=1.5,
                                  workdir=str(tmp_path / "w"), record_log=str(log),
                                  peers=peers))
    events = _lines(log)
    assert events[0]["world"]["peers"] == peers
    arrivals = [e for e in events[1:-1] if e.get("ev") == "arrival"]
    assert any(e["sender"] not in set(world.neighbours(e["node"]).tolist()) for e in arrivals)
    res = replay(read_logs([log]))
    rp = res["replay"]
    assert rp["digests_matched"] == rp["arrivals"] == len(arrivals) > 0
    assert rp["final_digests_equal"] == world.n and res["max_param_diff"] == 0.0
