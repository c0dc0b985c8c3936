"""Deterministic faults (docs/concepts/clock.md#the-node-on-the-clock): the faults' component string and
streams, the protocol properties of the node under a seeded sweep of random faults, planted
protocol bugs that the sweep must catch, determinism, and bounded waits and memory.

Every run here is the deployable node (sfg.net.node.Node) on the virtual clock with the
in-memory network; nothing is mocked. A planted bug is a monkeypatched function of the node's
parts (sfg.net.inbox, sfg.net.lockstep, sfg.net.persist, sfg.net.claims) or sfg.net.wire, for
the duration of one test, that the sweep must detect."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest
from faultsweep import (
    ASYNC_FAULTS,
    LOCKSTEP_FAULTS,
    RULES,
    Case,
    check_case,
    digest,
    standard_cases,
    sweep,
)

from sfg.clock.faults import Faults
from sfg.errors import SfgError

SEEDS = (1, 2, 3, 4)


def sweep_cases() -> list[Case]:
    """SEEDS x 8 fault settings (5 async, 3 lockstep), rules and sizes 6/8/10 rotating."""
    return standard_cases(SEEDS)


SWEEP_CASES = 8 * len(SEEDS)  # the sweep's bound: a number of cases, not seconds


# ------------------------------------------------------------------ the component string
def test_faults_string_reads_every_key_and_none():
    f = Faults.parse("faults:loss=0.1,delay=2.0,reorder=0.1,hold=50,dup=0.05,copies=3,"
                     "corrupt=0.02,misroute=0.03,drift=0.001,crashes=2,downtime=900,span=4000,"
                     "crash=3@1500;5@20,partition=0-3|4-7@1200-3600;1.5|*@0-10", seed=7)
    assert (f.loss, f.delay, f.reorder, f.hold, f.dup, f.copies) == (0.1, 2.0, 0.1, 50.0, 0.05, 3)
    assert (f.corrupt, f.misroute, f.drift, f.crashes, f.downtime, f.span) == \
        (0.02, 0.03, 0.001, 2, 900.0, 4000.0)
    assert tuple(c.pair for c in f.crash_at) == ((3, 1500.0), (5, 20.0)) and f.seed == 7 and f.any
    p1, p2 = f.partitions
    assert p1.a == frozenset(range(4)) and p1.b == frozenset(range(4, 8))
    assert p1.blocks(0, 5, 1200.0) and p1.blocks(6, 2, 3599.0)
    assert not p1.blocks(0, 5, 3600.0) and not p1.blocks(0, 1, 2000.0)
    assert p2.blocks(1, 9, 5.0) and p2.blocks(0, 5, 5.0)
    assert not p2.blocks(1, 5, 5.0) and not p2.blocks(2, 3, 5.0) and not p2.blocks(0, 5, 10.0)
    for text in (None, "", "none", " None "):
        assert not Faults.parse(text).any
    plan = f.plan(8, period=600.0, rounds=10)
    assert plan.crashes()[0] == (5, 20.0) and len(plan.crashes()) == 4
    assert plan.hold == 50.0 and plan.downtime == 900.0
    assert Faults.parse("faults:reorder=0.5").plan(4, period=600.0, rounds=3).hold == 900.0


@pytest.mark.parametrize("text,needle", [
    ("faults:los=0.1", "did you mean 'loss'"),
    ("faults:loss=1.5", "probability"),
    ("faults:dup=-0.1", "probability"),
    ("faults:delay=-1", "seconds"),
    ("faults:drift=0.7", "rate"),
    ("faults:copies=0", "integer >= 1"),
    ("faults:crashes=1.5", "integer >= 0"),
    ("faults:loss=lots", "must be a number"),
    ("faults:partition=0-3@5-9", "A|B@T1-T2"),
    ("faults:partition=0-3|2-5@5-9", "disjoint"),
    ("faults:partition=0-3|4@9-5", "T1 < T2"),
    ("faults:partition=*|*@0-5", "at most one side"),
    ("faults:partition=a|4@0-5", "node set"),
    ("faults:crash=3", "NODE@SECONDS"),
    ("faults:crash=-1@5", "node id >= 0"),
    ("fault:loss=0.1", "write 'none' or faults:"),
    ("faults:loss=0.1+x", "write 'none' or faults:"),
])
def test_bad_faults_strings_are_one_line_errors(text, needle):
    with pytest.raises(SfgError) as e:
        Faults.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_faults_naming_missing_nodes_or_a_bad_seed_are_errors():
    with pytest.raises(SfgError, match="names node 9"):
        Faults.parse("faults:partition=0-9|*@0-5").plan(8, period=1.0, rounds=2)
    with pytest.raises(SfgError, match="names node 8"):
        Faults.parse("faults:crash=8@5").plan(8, period=1.0, rounds=2)
    with pytest.raises(SfgError, match="faults-seed"):
        Faults.parse("faults:loss=0.1", seed=-1)


def test_each_kind_draws_from_its_own_stream_of_the_faults_seed():
    """The same faults seed makes the same decisions; another seed others; switching one kind
    on leaves the decisions of the others where they were (their streams are their own)."""
    def decisions(text, seed):
        plan = Faults.parse(text, seed=seed).plan(4, period=600.0, rounds=5)
        return [plan.decide(s, d, float(t)) for t in range(200) for s, d in ((0, 1), (2, 3))]

    a = decisions("faults:loss=0.3,delay=5", 1)
    assert a == decisions("faults:loss=0.3,delay=5", 1)
    assert a != decisions("faults:loss=0.3,delay=5", 2)
    b = decisions("faults:loss=0.3,delay=5,dup=0.5", 1)
    assert [x[0] for x in a] == [x[0] for x in b]  # the same messages lost
    assert [x[1] for x in a] == [x[1] for x in b]  # the same delays
    assert any(x[2] > 1 for x in b) and all(x[2] == 1 for x in a)
    lost = sum(x[0] for x in a) / len(a)
    assert 0.2 < lost < 0.4
    drift = Faults.parse("faults:drift=0.01", seed=3).plan(50, period=1.0, rounds=1).drifts(50)
    assert np.abs(drift).max() <= 0.01 and drift.std() > 0.003
    assert np.array_equal(drift, Faults.parse("faults:drift=0.01", seed=3)
                          .plan(50, period=1.0, rounds=1).drifts(50))


def test_a_corrupted_payload_stays_finite_and_only_its_digest_gives_it_away():
    from sfg.net.wire import Layout, Rejected, check_message, encode

    layout = Layout(("w",), ((64,),))
    header, payload = encode(np.linspace(-1, 1, 64, dtype=np.float32), layout, sender=1,
                             round=0, age=0, lag=0.0, count=1, local_count=1)
    plan = Faults.parse("faults:corrupt=1", seed=0).plan(3, period=1.0, rounds=1)
    bad, _ = plan.tamper(1, 0, 0.0, payload)
    assert bad != payload and len(bad) == len(payload) and plan.stats["corrupted"] == 1
    assert sum(x != y for x, y in zip(bad, payload, strict=True)) == 1
    with pytest.raises(Rejected) as e:
        check_message(header, bad, layout, neighbours={1})
    assert e.value.reason == "digest"
    # with the digest made to match, every other check passes: only the digest catches it
    from sfg.net.wire import unpack_header

    h = unpack_header(header)
    forged = replace(h, sha256=hashlib.sha256(bad).digest()).pack()
    assert np.isfinite(check_message(forged, bad, layout, neighbours={1}).params).all()


# ------------------------------------------------------------------ the sweep
def test_protocol_properties_hold_under_a_seeded_sweep_of_random_faults(capsys):
    """No corrupted or non-neighbour message is accepted or aggregated, every header obeys
    docs/concepts/staleness.md#the-staleness-state, a restarted node resumes its checkpoint plus exactly the rounds it missed, async
    never blocks, lockstep ends with the fault-free models, memory stays bounded under a
    flood; and the sweep really exercised every kind of fault (see tests/faultsweep.py)."""
    cases = sweep_cases()
    res = sweep(cases)
    assert res.violations == [], "\n".join(res.violations)
    assert len(res.outcomes) == len(cases) == 8 * len(SEEDS)
    assert all(o.error is None for o in res.outcomes)
    # coverage: every fault kind happened, and was answered as it should be
    total: dict[str, int] = {}
    for o in res.outcomes:
        for k, v in o.summary["faults"].items():
            if isinstance(v, int):
                total[k] = total.get(k, 0) + v
    for kind in ("lost", "partitioned", "delayed", "reordered", "duplicated", "corrupted",
                 "misrouted", "crashes", "restarts"):
        assert total[kind] > 0, kind
    rejected = {}
    for o in res.outcomes:
        for n in o.summary["nodes"]:
            for k, v in n["rejected"].items():
                rejected[k] = rejected.get(k, 0) + v
    assert rejected.get("digest", 0) > 0 and rejected.get("non-neighbour", 0) > 0
    missed = [n["restored"]["missed"] for o in res.outcomes if o.case.mode == "async"
              for n in o.summary["nodes"] if n["restored"]]
    assert missed and max(missed) >= 1  # restarts that had rounds to catch up
    flood = [o for o in res.outcomes if "copies=20" in o.case.faults]
    assert flood and all(o.summary["faults"]["duplicated"] >= 1000 for o in flood)
    assert all(o.peaks["latest"] <= 6 for o in flood)
    with capsys.disabled():
        print(f"\nfault sweep: {len(res.outcomes)} runs ({len(SEEDS)} seeds x "
              f"{len(ASYNC_FAULTS) + len(LOCKSTEP_FAULTS)} fault settings, rules {RULES}), "
              f"{res.node_rounds} node-rounds in {res.wall:.1f} s = {res.throughput:.0f} "
              "simulated node-rounds/s")


# ------------------------------------------------------------------ planted bugs
def _lax_digest(monkeypatch):
    """check_message that skips the digest comparison (the announced header is kept)."""
    from sfg.net import inbox
    from sfg.net.wire import Message, check_message, unpack_header

    def lax(raw_header, payload, layout, **kw):
        kw.pop("parsed", None)  # the header re-parsed from the fixed bytes below
        h = unpack_header(raw_header)
        fixed = replace(h, sha256=hashlib.sha256(payload).digest()).pack()
        return Message(h, check_message(fixed, payload, layout, **kw).params)

    monkeypatch.setattr(inbox, "check_message", lax)


def _forget_missed_rounds(monkeypatch):
    """An async restart that forgets the rounds it missed while down."""
    from sfg.net import persist

    def forget(node):
        if node.restored is not None:
            node.restored.update(missed=0, age_after=node.state.age, lag_after=node.state.lag,
                                 at=node.clock.time())

    monkeypatch.setattr(persist, "catch_up_missed", forget)


def _missed_by_rows(monkeypatch):
    """The catch-up as it was before this sweep: rounds before the current trace row count as
    missed, the round of the row itself (its wake-up passed while the node was down) not."""
    import math

    from sfg.net import persist

    def by_rows(node):
        if node.restored is None or node.t0 is None:
            return
        due = int(math.floor((node.clock.time() - node.t0) / node.cfg.period))
        missed = max(0, min(due, node.world.rounds) - node.state.t)
        for _ in range(missed):
            node.offline_round()
        node.restored.update(missed=missed, age_after=node.state.age, lag_after=node.state.lag,
                             at=node.clock.time())

    monkeypatch.setattr(persist, "catch_up_missed", by_rows)


def _no_neighbour_check(monkeypatch):
    """check_header that lets any sender through."""
    import sfg.net.wire as wire
    from sfg.net import inbox

    real = wire.check_header

    def anyone(header, *, neighbours, **kw):
        return real(header, neighbours=set(neighbours) | {header.sender}, **kw)

    monkeypatch.setattr(inbox, "check_header", anyone)
    monkeypatch.setattr(wire, "check_header", anyone)


def _older_replaces_newer(monkeypatch):
    """Async: a late (reordered) older message replaces the newer one held."""
    from sfg.net import inbox

    real = inbox.accept

    def careless(node, msg, *args, **kw):
        if node.cfg.mode == "async":
            node.latest.pop(msg.header.sender, None)
        return real(node, msg, *args, **kw)

    monkeypatch.setattr(inbox, "accept", careless)


def _understated_age(monkeypatch):
    """A node that claims one round more of age than it has (τ > ℓ when fresh)."""
    from sfg.net.claims import HonestClaims

    real = HonestClaims.claim

    def older(self, node):
        age, lag, count = real(self, node)
        return age + 1, lag, count

    monkeypatch.setattr(HonestClaims, "claim", older)


def _served_means_received(monkeypatch):
    """Lockstep's end of run as it was before this sweep: a message handed out to a pull
    counts as received and is dropped from the outbox (the reply may be lost on the way)."""
    from sfg.net import lockstep

    def eager(node):
        for r in list(node.outbox):
            if all(node.heard.get(j, -1) > r or (j, r) in node.delivered
                   for j in node.expected.get(r, ())):
                del node.outbox[r]
                node.expected.pop(r, None)
        return not node.outbox

    monkeypatch.setattr(lockstep, "all_handed_out", eager)


PLANTED = {
    "digest not compared": (_lax_digest, "corrupted"),
    "missed rounds forgotten on restore": (_forget_missed_rounds, "missed rounds"),
    "missed rounds counted by trace row": (_missed_by_rows, "missed rounds"),
    "non-neighbours accepted": (_no_neighbour_check, "non-neighbour"),
    "older message replaces newer": (_older_replaces_newer, "after round"),
    "age claimed one too high": (_understated_age, "τ ≤ ℓ"),
    "a pulled message counts as received": (_served_means_received, "did not get the round"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_protocol_bug_is_caught_by_the_fault_sweep_within_its_cases(
        bug, monkeypatch, capsys):
    """The sweep has teeth: with the bug planted it reports a violation within its
    :data:`SWEEP_CASES` cases (it stops at the first violation) — the same cases on any
    machine, however loaded."""
    plant, needle = PLANTED[bug]
    plant(monkeypatch)
    res = sweep(sweep_cases(), max_cases=SWEEP_CASES, stop_at_first=True)
    assert res.violations, f"the sweep missed the planted bug {bug!r}"
    assert any(needle in v for v in res.violations), res.violations
    assert len(res.outcomes) <= SWEEP_CASES
    with capsys.disabled():
        print(f"\nplanted bug {bug!r}: caught in run {len(res.outcomes)} of "
              f"{SWEEP_CASES}: {res.violations[0][:160]}")


# ------------------------------------------------------------------ determinism
def test_same_run_and_faults_seeds_replay_byte_for_byte_and_another_faults_seed_differs():
    case = Case("async", "sfg-cut", "faults:loss=0.2,delay=30,reorder=0.2,dup=0.2,corrupt=0.1,"
                "misroute=0.1,crashes=2,downtime=700,drift=0.01", seed=4, faults_seed=5, n=8)
    a, b = check_case(case), check_case(case)
    assert a.violations == [] and b.violations == []
    assert digest(a.summary) == digest(b.summary)
    assert a.summary["params"].tobytes() == b.summary["params"].tobytes()
    assert a.summary["faults"]["crash_log"] == b.summary["faults"]["crash_log"]
    c = check_case(replace(case, faults_seed=6))
    assert digest(c.summary) != digest(a.summary)
    assert c.summary["faults"] != a.summary["faults"]
    # the faults seed is not the run seed: the fault-free parts of the world are unchanged
    assert c.summary["metrics"]["unavailability"] == a.summary["metrics"]["unavailability"]


# ------------------------------------------------------------------ no node waits forever
def test_lockstep_crash_longer_than_the_deadline_is_a_one_line_error_not_a_hang():
    """Neighbours of a crashed lockstep node hit their deadline (virtual seconds) and the run
    stops with the deadline's error; with a deadline longer than the downtime the restarted
    node catches up from its checkpoint and the run ends with the fault-free models."""
    from faultsweep import reference_params

    # (lockstep rounds follow the messages, not the clock: this run's rounds take hardly
    # any virtual time, so node 0 crashes at the start; which waiting node's deadline
    # reports first depends on how far the others got, so the error names no node)
    short = Case("lockstep", "sfg-cut", "faults:crash=0@0,downtime=120", seed=1, n=6,
                 deadline=60.0, may_time_out=True)
    out = check_case(short)
    assert out.violations == [] and out.error is not None
    assert "did not get the round" in out.error and "within 60 s" in out.error
    assert "\n" not in out.error and "wait forever" not in out.error  # not the loop's Deadlock
    long = replace(short, deadline=300.0, may_time_out=False)
    ok = check_case(long, reference=reference_params(long))
    assert ok.violations == [] and ok.error is None
    assert ok.summary["faults"]["restarts"] == 1 and ok.summary["metrics"]["restarts"] == 1


def test_async_never_waits_on_a_crashed_or_partitioned_neighbour():
    """Every node of an async run under crashes and a partition does all its rounds, and the
    virtual time stays within the schedule's span (no wait beyond a period)."""
    case = Case("async", "dfedavg", "faults:crashes=4,downtime=1500,partition=0-3|*@0-6000",
                seed=5, faults_seed=1, n=8)
    out = check_case(case)
    assert out.violations == [] and out.error is None
    m = out.summary["metrics"]
    assert m["virtual_seconds"] <= (case.rounds + 1) * case.period + 1500
    assert out.summary["faults"]["partitioned"] > 0 and out.summary["faults"]["crashes"] >= 1


# ------------------------------------------------------------------ bounded memory under a flood
def _node_on_memory_net(mode, i=0, n=6):
    from sfg.net.memory import MemoryNetwork
    from sfg.net.node import Node, NodeConfig
    from sfg.net.simclock import NodeClock
    from sfg.net.world import build_world

    world = build_world(dict(n_clients=n, rounds=5, process="none", graph="ring:k=1",
                             eval_every=5, backend="loop"))
    net = MemoryNetwork(n)
    node = Node(world, i, NodeConfig(mode=mode, t0=0.0), net=net,
                clock=NodeClock(virtual=True))
    return world, net, node


def _flood(mode, deliveries):
    from sfg.net.memory import MemoryPeer, address
    from sfg.net.simclock import VirtualLoop
    from sfg.net.wire import encode

    world, net, node = _node_on_memory_net(mode)

    async def main():
        await node.server.start("mem", 0)
        answers = []
        for src, r in deliveries:
            h, p = encode(world.x0, world.layout, sender=src, round=r, age=0, lag=0.0,
                          count=1, local_count=1)
            answers.append(await MemoryPeer(net, src, address(node.i)).deliver(h, p))
        return answers

    loop = VirtualLoop()
    try:
        answers = loop.run_until_complete(main())
    finally:
        loop.close()
    return node, answers


def test_lockstep_inbox_holds_at_most_two_rounds_of_a_flooding_neighbour():
    """A neighbour that floods future rounds gets two accepted (it can be at most one
    round-with-both-available ahead) and the rest rejected as "ahead", past the run too."""
    node, answers = _flood("lockstep", [(1, r) for r in range(40)] + [(1, 0)] * 10)
    assert [ok for ok, _ in answers[:2]] == [True, True]
    assert all(not ok and why == "ahead" for ok, why in answers[2:40])
    assert all(ok for ok, _ in answers[40:])  # copies of a held round replace it
    assert sorted(node.inbox) == [(1, 0), (1, 1)]
    assert node.rejections.counts["ahead"] == 38


def test_async_node_keeps_one_message_per_neighbour_whatever_the_flood():
    deliveries = [(1, r) for r in range(30)] + [(5, r) for r in range(30)] + \
        [(1, 3)] * 20 + [(3, r) for r in range(20)]  # 3 is no neighbour on the ring
    node, answers = _flood("async", deliveries)
    assert len(node.latest) == 2 and node.latest[1][0].header.round == 29
    assert node.latest[5][0].header.round == 29  # the late copies of round 3 changed nothing
    assert len(node.guard.seen) <= len(node.nbrs)
    assert node.rejections.counts["non-neighbour"] == 20
    assert all(not ok for ok, _ in answers[-20:])


# ------------------------------------------------------------------ the summary
def test_the_summary_reports_the_fault_counts():
    case = Case("async", "sfg-cut", "faults:loss=0.3,dup=0.3,crash=1@700,downtime=600",
                seed=2, faults_seed=3, n=6)
    out = check_case(case)
    f = out.summary["faults"]
    assert f["spec"] == case.faults and f["seed"] == 3
    assert f["lost"] > 0 and f["duplicated"] > 0 and f["crashes"] == 1 and f["restarts"] == 1
    (ev,) = f["crash_log"]
    assert ev["node"] == 1 and ev["crashed"] == pytest.approx(700.0)
    assert ev["restarted"] == pytest.approx(1300.0)
    m = out.summary["metrics"]
    assert m["net_dropped"] == f["lost"] + f["partitioned"]  # pushes and pulls' replies
    assert m["restarts"] == 1


def test_run_virtual_swarm_takes_the_faults_as_a_string():
    from sfg.net.swarm import SwarmOptions
    from sfg.net.virtual import run_virtual_swarm
    from sfg.net.world import build_world

    world = build_world(Case("async", "sfg-cut", "none", n=6).world_cfg())
    res = run_virtual_swarm(world, SwarmOptions(mode="async", period=600.0),
                            faults="faults:loss=0.5")
    assert res["faults"]["lost"] > 0 and res["faults"]["seed"] == 0
    with pytest.raises(SfgError, match="names node 7"):
        run_virtual_swarm(world, SwarmOptions(mode="async", period=600.0),
                          faults="faults:crash=7@10")


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("args,needle", [
    (["swarm", "--faults", "faults:los=0.1", "--clock", "virtual"], "did you mean 'loss'"),
    (["swarm", "--faults", "faults:partition=0-3@1-2", "--clock", "virtual"], "A|B@T1-T2"),
    (["swarm", "--faults", "faults:loss=0.1"], "add --clock virtual"),
    (["swarm", "--faults-seed", "-2", "--clock", "virtual"], "--faults-seed"),
])
def test_swarm_faults_flags_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    from sfg.cli.main import main

    code = main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert needle in err, err


# ------------------------------------------------------------------ faults as schedule events
def test_counter_draws_are_the_same_one_at_a_time_and_all_at_once():
    """The network decides one message at a time with Python ints, the clock's engine all
    at once with uint64 arrays: the same value for the same message, uniform, and
    independent across kinds, links and message indices."""
    from sfg.util.rng import counter_key, counter_uniform

    key = counter_key(7, "faults", "loss")
    g = np.random.default_rng(0)
    src, dst, k = g.integers(0, 10_000, 4000), g.integers(0, 10_000, 4000), g.integers(0, 10**9, 4000)
    many = counter_uniform(key, src, dst, 0, k)
    one = [counter_uniform(key, int(a), int(b), 0, int(c)) for a, b, c in zip(src, dst, k, strict=True)]
    assert many.tolist() == one
    assert 0.0 <= many.min() and many.max() < 1.0 and abs(many.mean() - 0.5) < 0.02
    assert counter_uniform(key, 1, 2, 0, 3) != counter_uniform(key, 2, 1, 0, 3)
    assert counter_uniform(key, 1, 2, 0, 3) != counter_uniform(key, 1, 2, 1, 3)
    assert counter_uniform(key, 1, 2, 0, 3) != counter_uniform(counter_key(7, "faults", "dup"),
                                                               1, 2, 0, 3)
    plan = Faults.parse("faults:loss=0.3,delay=5,corrupt=0.2", seed=7).plan(4, period=1.0, rounds=1)
    s, d, kk = np.array([0, 2, 0]), np.array([1, 3, 1]), np.array([0, 0, 1])
    cut, lost, extra, bad = plan.fates(s, d, kk, np.zeros(3))
    for m in range(3):
        drop, ex, _ = plan.decide(int(s[m]), int(d[m]), 0.0, int(kk[m]))
        assert drop == bool(lost[m]) and ex == extra[m]


@pytest.mark.parametrize("args,needle", [
    (["--protocol", "async", "--faults", "faults:crashes=2"], "node's own timeline"),
    (["--protocol", "async", "--faults", "faults:drift=0.01"], "node's own timeline"),
    (["--protocol", "lockstep", "--faults", "faults:loss=0.1"], "async and event"),
    (["--protocol", "event", "--faults", "faults:lose=0.1"], "did you mean 'loss'"),
    (["--protocol", "async", "--faults", "faults:loss=0.1", "--faults-seed", "-1"], "faults"),
])
def test_engine_faults_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    from sfg.cli.main import main

    code = main(["replay", "-p", "bursty:u=0.8", "-r", "sfg-cut", "--seeds", "1", "-n", "20",
                 "--clock", "virtual", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_engine_faults_change_the_replay_and_are_counted_and_paired_across_rules():
    """Model-free replay on the async clock: the faults drop and delay messages (counted),
    the same faults for every rule (one schedule digest), none without them."""
    from sfg.clock.replay import replay_clock
    from sfg.clock.settings import make_settings

    cs = make_settings({"clock": "virtual", "protocol": "async", "jitter": 0.5,
                        "faults": "faults:loss=0.3,delay=300,corrupt=0.1", "faults_seed": 4})
    a = replay_clock("bursty:u=0.8", "sfg-cut", n=40, rounds=60, seed=1, settings=cs)
    b = replay_clock("bursty:u=0.8", "dfedavg", n=40, rounds=60, seed=1, settings=cs)
    c = replay_clock("bursty:u=0.8", "sfg-cut", n=40, rounds=60, seed=1,
                     settings=make_settings({"clock": "virtual", "protocol": "async",
                                             "jitter": 0.5}))
    assert a["meta"]["schedule_digest"] == b["meta"]["schedule_digest"]
    assert a["meta"]["schedule_digest"] != c["meta"]["schedule_digest"]
    st = a["metrics"]
    assert st["fault_lost"] > 0 and st["fault_delayed"] > 0
    assert st["fault_corrupted"] > 0 and st["delivered"] < c["metrics"]["delivered"]
    assert "fault_lost" not in c["metrics"]
