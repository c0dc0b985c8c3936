"""Forged staleness (sfg.round.attacks) and the defences (sfg.round.defences) in the shared round.

* an attacker claiming freshness under sfg-cut takes its honest neighbours' entire weight in a
  hand-built 4-client case; with +guard (and with +cap) it does not;
* frac=0 is the no-attack replay bit for bit; attackers are drawn from their own stream, the
  honest world (graph, trace) is the same with and without them;
* each defence changes nothing where claims are consistent (every model-free rule, honest
  replays, every anatomy mode) and keeps weights valid on arbitrary claims;
* the replay's damage measures equal a per-client loop over the recorded weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sfg.errors import SfgError
from sfg.modelfree import Lane, replay
from sfg.modelfree.driver import run_lane
from sfg.round.attacks import REACH_LEVEL, availability, claims, parse_attack, place
from sfg.round.kernel import play_round
from sfg.round.rules import parse_rule, rule_names
from sfg.round.slots import RoundGraph
from sfg.round.staleness import StalenessState
from sfg.world.graphs import Graph, make_graph
from sfg.world.outages import make_process
from sfg.world.outages.anatomy import ANATOMY_MODES, Capabilities, capabilities

N, T, H, SEED = 16, 40, 8, 2
DEFENDABLE = [r for r in rule_names() if parse_rule(r).compiled]


def _scenario(process: str = "bursty:u=0.7", n: int = N, rounds: int = T, seed: int = SEED):
    g = make_graph("knn:k=4", n, seed=seed)
    return g, make_process(process).sample(rounds, n, seed=seed, positions=g.positions)


def _lane(rule, attack=None, *, anatomy="full", n=N, rounds=T, seed=SEED, process="bursty:u=0.7"):
    g, avail = _scenario(process, n, rounds, seed)
    rg = RoundGraph.from_graph(g)
    w = np.zeros((rounds, rg.n_slots))
    res = run_lane(Lane(avail, g, parse_rule(rule), seed, parse_attack(attack)), anatomy=anatomy,
                   link_failure=0.0, horizon=H, exact_pairs=10**6, sample_pairs=1,
                   weights_out=w)
    return res, w, g, avail


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


# ----------------------------------------------------------------------------- parsing
def test_parse_attack_values_and_defaults():
    a = parse_attack("forge:frac=0.2,claim=stale-others,model=sign-flip,placement=degree,"
                     "always_on=true")
    assert (a.frac, a.claim, a.model, a.placement, a.always_on) == (0.2, "stale-others",
                                                                    "sign-flip", "degree", True)
    assert parse_attack("none") is None and parse_attack(None) is None and parse_attack("") is None
    b = parse_attack("forge")
    assert (b.frac, b.claim, b.model, b.placement, b.always_on) == (0.1, "fresh", "none",
                                                                    "random", False)
    assert (b.knowledge, b.gap) == ("observed", 1.01)


@pytest.mark.parametrize("text, fragment", [
    ("forje:frac=0.1", "did you mean 'forge'"), ("forge:frac=2", "must be a number in [0, 1]"),
    ("forge:claim=fresher", "claim='fresher' is not valid; did you mean 'fresh'"), ("forge:fraction=0.1", "unknown attack parameter"),
    ("forge:always_on=3", "always_on=3 must be true or false"), ("forge+x", "takes no '+' modifiers"),
    ("forge:model=flip", "did you mean 'sign-flip'"),
    ("forge:knowledge=omniscient", "knowledge='omniscient' is not valid"),
    ("forge:claim=undercut,gap=-1", "gap=-1 must be a number >= 0"),
])
def test_bad_attacks(text, fragment):
    with pytest.raises(SfgError) as e:
        parse_attack(text)
    assert fragment in str(e.value)


@pytest.mark.parametrize("text, fragment", [
    ("sfg:kappa=3", "kappa is a parameter of the +cap defence"),
    ("sfg:margin=-1+relative", "must be >= 0"), ("sfg:kappa=0.5+cap", "must be >= 1"),
    ("oracle-gls+guard", "do not apply"), ("pwg+guard", "only +catchup composes"),
])
def test_bad_defences(text, fragment):
    with pytest.raises(SfgError) as e:
        parse_rule(text)
    assert fragment in str(e.value)


def test_clip_is_training_only_in_replay():
    g, avail = _scenario()
    with pytest.raises(SfgError, match="training only"):
        replay(["bursty:u=0.7"], ["sfg+clip"], [1], n=8, T=5, graph="ring:k=1")
    assert parse_rule("sfg+clip").clip and not parse_rule("sfg").clip


# ----------------------------------------------------------------------------- placement
def test_placement_by_seed_and_by_degree():
    deg = np.array([1, 5, 2, 5, 0, 3, 1, 1, 2, 2])
    a = parse_attack("forge:frac=0.3")
    p1, p2 = place(a, 10, deg, seed=1), place(a, 10, deg, seed=1)
    assert p1.sum() == 3 and np.array_equal(p1, p2)
    assert any(not np.array_equal(p1, place(a, 10, deg, seed=s)) for s in range(2, 8))
    d = place(parse_attack("forge:frac=0.3,placement=degree"), 10, deg, seed=1)
    assert np.flatnonzero(d).tolist() == [1, 3, 5]  # the highest degrees, ties by index
    assert not place(parse_attack("forge:frac=0"), 10, deg, seed=1).any()
    assert not place(None, 10, deg, seed=1).any()


def test_always_on_changes_only_attackers_rows():
    avail = np.random.default_rng(0).random((20, 6)) < 0.5
    att = np.array([0, 1, 0, 0, 1, 0], bool)
    out = availability(avail, parse_attack("forge:frac=0.3,always_on=true"), att)
    assert out[:, att].all() and np.array_equal(out[:, ~att], avail[:, ~att])
    assert availability(avail, parse_attack("forge:frac=0.3"), att) is avail


# ----------------------------------------------------------------------------- the hand case
def _four_clients(t: int = 10):
    """Receiver 0 with neighbours 1, 2 (honest) and 3 (the attacker). Everyone has the same
    consistent state: lag 4, age 1, count 7 (lag ≥ 1 + t − count = 4)."""
    rg = RoundGraph.from_edges(4, np.array([[0, 1], [0, 2], [0, 3]]))
    n = 4
    state = StalenessState(t=t, ages=np.ones(n, np.int64), lags=np.full(n, 4.0),
                           counts=np.full(n, 7, np.int64), local_counts=np.full(n, 7, np.int64),
                           q_hat=np.ones(rg.n_slots))
    on = np.ones(n, bool)
    return rg, state, Capabilities(on, on, on, on)


def _row0(rule, attack="forge:frac=0.25,claim=fresh"):
    rg, state, caps = _four_clients()
    att = np.array([False, False, False, True])
    forged = claims(parse_attack(attack), rg, state, att, seed=0)
    rr = play_round(parse_rule(rule), rg, state, caps, seed=0, slot_staleness=forged,
                    attackers=att)
    sl = slice(rg.indptr[0], rg.indptr[1])
    return dict(zip(rg.send[sl].tolist(), rr.weights[sl].tolist(), strict=True)), rr


def test_fresh_claim_takes_all_weight_under_sfg_cut_and_guard_stops_it():
    # the forged claim: age 0, lag 0, count = the largest count heard + 1 = 8
    rg, state, _ = _four_clients()
    age, lag, count = claims(parse_attack("forge:claim=fresh"), rg, state,
                             np.array([0, 0, 0, 1], bool), seed=0)
    att_slots = (rg.send == 3) & ~rg.is_self
    assert age[att_slots].tolist() == [0] and lag[att_slots].tolist() == [0.0]
    assert count[att_slots].tolist() == [8]
    assert age[~att_slots].tolist() == [1] * int((~att_slots).sum())  # honest slots: the truth

    w, rr = _row0("sfg-cut")
    assert w == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0}  # lag 4 > 0 + L: all honest cut, receiver too
    assert rr.facts[0, -3] == 1.0  # attacker_weight fact
    # +guard: a count of 8 at t = 10 implies lag ≥ 1 + 10 − 8 = 3: everyone within L = 1
    # survives; h = 1 + t − ℓ: 7, 7, 7 for the honest lag 4 and 8 for the clamped lag 3
    w, rr = _row0("sfg-cut+guard")
    assert w[3] == pytest.approx(8 / 29) and w[0] == pytest.approx(7 / 29)
    assert rr.facts[0, -1] == 1.0  # one claim clamped
    # without an attack the guard changes nothing (claims are consistent)
    w_plain, _ = _row0("sfg-cut", "forge:frac=0.25,claim=honest")
    w_guard, _ = _row0("sfg-cut+guard", "forge:frac=0.25,claim=honest")
    assert w_plain == w_guard == {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
    # +cap (κ = 2): no neighbour above 2/4; the excess stays with the receiver
    w, _ = _row0("sfg-cut+cap")
    assert w == {0: 0.5, 1: 0.0, 2: 0.0, 3: 0.5}
    # +relative (margin 1): the forged lag 0 is raised to min(others) − 1 = 3, as the guard
    w, _ = _row0("sfg-cut+relative")
    assert w[3] == pytest.approx(8 / 29)


def test_observed_knowledge_is_what_the_liar_received_and_rushing_sees_this_round():
    """knowledge=observed: the liar's largest count is its own or the last one a neighbour
    claimed to it in a round it aggregated (Heard); knowledge=rushing: this round's counts."""
    from sfg.round.attacks import Heard

    rg, state, _ = _four_clients()
    att = np.array([0, 0, 0, 1], bool)
    s = (rg.send == 3) & ~rg.is_self  # the liar's slot to client 0
    into = (rg.recv == 3) & ~rg.is_self  # what client 0 sends the liar
    heard = Heard(rg)
    fresh = parse_attack("forge:claim=fresh")
    assert claims(fresh, rg, state, att, seed=0, heard=heard)[2][s].tolist() == [8]  # own 7 + 1
    delivered = (np.zeros(rg.n_slots, np.int64), np.full(rg.n_slots, 2.5),
                 np.where(into, 20, 7).astype(np.int64))
    heard.note(rg, ~into, delivered)  # a round the liar slept through: it heard nothing
    assert claims(fresh, rg, state, att, seed=0, heard=heard)[2][s].tolist() == [8]
    heard.note(rg, np.ones(rg.n_slots, bool), delivered)  # it heard client 0 claim 20
    assert heard.count[into].tolist() == [20] and heard.lag[into].tolist() == [2.5]
    assert claims(fresh, rg, state, att, seed=0, heard=heard)[2][s].tolist() == [21]
    rushing = parse_attack("forge:claim=fresh,knowledge=rushing")  # this round: all count 7
    assert claims(rushing, rg, state, att, seed=0, heard=heard)[2][s].tolist() == [8]


def test_undercut_claims_just_beyond_the_cut_and_takes_the_row_under_sfg_cut():
    """By hand (t = 10, everyone lag 4, age 1, count 7; liar 3 → receiver 0): rushing, the
    freshest lag among 0's honest candidates is 4, so the claim is lag 4 − 1.01 = 2.99, age
    min(1, ⌊2.99⌋) = 1, count max(7, ⌈1 + 10 − 2.99⌉) = 9 ≤ 11. Under sfg-cut (L = 1) every
    honest lag 4 is 1.01 beyond the liar's: all cut, the receiver too — the liar takes the
    whole row, and +guard's bounds accept the claim (lag ≥ age, ≥ 1 + t − count = 2). +relative
    (margin 1) raises it to 3: then the honest ones stay (h = 7, 7, 7 and 8)."""
    rg, state, caps = _four_clients()
    att = np.array([0, 0, 0, 1], bool)
    s = (rg.send == 3) & ~rg.is_self
    under = "forge:frac=0.25,claim=undercut,knowledge=rushing"
    age, lag, count = claims(parse_attack(under), rg, state, att, seed=0)
    assert (age[s].tolist(), count[s].tolist()) == ([1], [9])
    assert lag[s][0] == pytest.approx(2.99, abs=1e-12)
    assert _row0("sfg-cut", under)[0] == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0}
    w, rr = _row0("sfg-cut+guard", under)
    assert w[3] == 1.0 and rr.facts[0, -1] == 0.0  # nothing clamped
    assert _row0("sfg-cut+relative", under)[0][3] == pytest.approx(8 / 29)
    # observed, before hearing anything: the freshest it knows of is lag 0 (initial claims)
    age, lag, count = claims(parse_attack("forge:claim=undercut"), rg, state, att, seed=0)
    assert (lag[s].tolist(), age[s].tolist(), count[s].tolist()) == ([0.0], [0], [11])
    # gap: how far below; another gap, another claim
    lag2 = claims(parse_attack("forge:claim=undercut,knowledge=rushing,gap=0.5"), rg, state,
                  att, seed=0)[1]
    assert lag2[s][0] == pytest.approx(3.5, abs=1e-12)


def test_rounds_only_adversaries_are_refused_on_the_clock_and_in_nodes():
    from sfg.round.attacks import check_rounds_only

    for text, needle in (("forge:knowledge=rushing", "knowledge=rushing"),
                         ("forge:claim=undercut", "claim=undercut")):
        with pytest.raises(SfgError, match=needle):
            check_rounds_only(parse_attack(text), "the virtual clock")
    check_rounds_only(parse_attack("forge:claim=fresh"), "the virtual clock")  # fine


def test_stale_others_inflates_counts_that_spread():
    rg, state, caps = _four_clients()
    att = np.array([0, 0, 0, 1], bool)
    forged = claims(parse_attack("forge:claim=stale-others"), rg, state, att, seed=0)
    assert forged[2][(rg.send == 3) & ~rg.is_self].tolist() == [8 + 11]
    rr = play_round(parse_rule("gl-age"), rg, state, caps, seed=0, slot_staleness=forged,
                    attackers=att)
    assert rr.state.counts[0] == 8 + 11 + 1  # the receiver inherits the forged count
    rr = play_round(parse_rule("gl-age+guard"), rg, state, caps, seed=0, slot_staleness=forged,
                    attackers=att)
    assert rr.state.counts[0] == 11 + 1  # clamped to t + 1 = 11


def test_random_claims_are_keyed_by_seed_and_round():
    rg, state, _ = _four_clients()
    att = np.array([0, 0, 0, 1], bool)
    a = parse_attack("forge:claim=random")
    c1, c2 = claims(a, rg, state, att, seed=5), claims(a, rg, state, att, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(c1, c2, strict=True))
    s = (rg.send == 3) & ~rg.is_self
    assert 0 <= c1[0][s][0] <= 10 and 0 <= c1[1][s][0] <= 10 and 1 <= c1[2][s][0] <= 11
    others = [claims(a, rg, state, att, seed=k)[1][s][0] for k in range(6, 12)]
    assert any(o != c1[1][s][0] for o in others)


# ----------------------------------------------------------------------------- pairing
@pytest.mark.parametrize("rule", ["sfg-cut", "gl-age+guard", "sfg+relative+cap", "two-random"])
@pytest.mark.parametrize("attack", ["forge:frac=0,claim=fresh",
                                    "forge:frac=0,claim=random,always_on=true,placement=degree"])
def test_frac_zero_is_the_no_attack_replay_bit_for_bit(rule, attack):
    base, w0, _, _ = _lane(rule)
    got, w1, _, _ = _lane(rule, attack)
    # the no-attack replay reports no damage measures; under frac=0 they are all zero except
    # the own-model cuts the rule makes anyway
    assert _same(base.metrics, {k: got.metrics[k] for k in base.metrics})
    assert got.metrics["attack_weight"] == 0 and got.metrics["reach"] == 0
    assert "attack_weight" not in base.metrics
    assert np.array_equal(w0, w1)
    assert base.curves == got.curves


def test_attack_keeps_the_honest_world_and_changes_weights():
    base, w0, g, avail = _lane("sfg-cut")
    got, w1, _, _ = _lane("sfg-cut", "forge:frac=0.25,always_on=true")
    att = place(parse_attack("forge:frac=0.25"), N, np.zeros(N), seed=SEED)
    assert att.sum() == 4
    # the honest clients' availability is untouched; attackers are always on
    expect = 1 - availability(avail, parse_attack("forge:frac=0.25,always_on=true"), att).mean()
    assert got.metrics["unavailability"] == pytest.approx(expect)
    assert not np.array_equal(w0, w1)
    assert "attack_weight" not in base.metrics and "clamped" not in base.metrics
    assert got.metrics["attack_weight"] > 0.2 and got.metrics["reach"] > 0


# ----------------------------------------------------------------------------- no-op defences
@pytest.mark.parametrize("anatomy", ANATOMY_MODES)
def test_guard_changes_nothing_on_honest_replays(anatomy):
    """Honest claims are consistent: +guard and +refute give the same weights, bit for bit,
    for every model-free rule of the registry, in every anatomy mode (the evidence sees
    content that stays unchanged while a client cannot train)."""
    for rule in DEFENDABLE:
        a, w0, _, _ = _lane(rule, anatomy=anatomy, rounds=25)
        for defence in ("guard", "refute"):
            b, w1, _, _ = _lane(f"{rule}+{defence}", anatomy=anatomy, rounds=25)
            assert np.array_equal(w0, w1), (rule, defence)
            assert b.metrics["clamped"] == 0, (rule, defence)


def test_refute_excludes_what_the_guard_would_clamp_by_hand():
    """The hand case: the fresh claim (lag 0, count 8 at t = 10) is refuted by the bound
    lag ≥ 1 + t − count = 3; +guard keeps the liar with lag 3 (8/29), +refute drops it and
    the honest three share the row (lag 4 each: 1/3); the receiver inherits no forged count.
    With +cap (κ = 2: 1/2 each at most) nothing more changes; without a lie nothing changes."""
    w, rr = _row0("sfg-cut+refute")
    assert w[3] == 0.0 and [w[j] for j in range(3)] == pytest.approx([1 / 3] * 3, abs=1e-15)
    assert rr.facts[0, -1] == 1.0 and rr.state.counts[0] == 7 + 1
    w_guard, rg_guard = _row0("sfg-cut+guard")
    assert w_guard[3] == pytest.approx(8 / 29) and rg_guard.state.counts[0] == 8 + 1
    assert _row0("sfg-cut+refute+cap")[0] == w
    honest = "forge:frac=0.25,claim=honest"
    assert _row0("sfg-cut+refute", honest)[0] == _row0("sfg-cut", honest)[0]


def test_the_guards_ratchet_and_refute_without_it():
    """Replay, bursty u = 0.8, N = 100, 10 % sleeping liars claiming fresh with this round's
    counts (knowledge=rushing): +guard *raises* their share under sfg-cut (the clamped liar's
    count spreads and its admitted lag 1 + t − count keeps falling: sfg.round.defences),
    +refute lowers it below no defence; with observed knowledge the guard helps."""
    rows = replay(["bursty:u=0.8"], ["sfg-cut", "sfg-cut+guard", "sfg-cut+refute"], [1],
                  n=100, T=300, horizon=0,
                  attacks=["forge:frac=0.1,claim=fresh,knowledge=rushing",
                           "forge:frac=0.1,claim=fresh"])
    share = {(r["attack"], r["rule"]): r["attack_weight"] for r in rows}
    rushing, observed = ("forge:frac=0.1,claim=fresh,knowledge=rushing",
                         "forge:frac=0.1,claim=fresh")
    none = share[(rushing, "sfg-cut")]
    assert share[(rushing, "sfg-cut+guard")] > none + 0.005  # the ratchet
    assert share[(rushing, "sfg-cut+refute")] < 0.2 * none
    assert share[(observed, "sfg-cut+guard")] < share[(observed, "sfg-cut")]


def test_cap_and_relative_change_nothing_when_not_binding():
    # nothing stale: every rule gives DFedAvg-like rows; no neighbour above 2/|S_i| and no
    # claim more than 1 below the others
    for rule in ["sfg", "sfg-l", "sfg-cut", "gl-age", "limited-merging", "dfedavg"]:
        a, w0, _, _ = _lane(rule, process="none", rounds=12)
        b, w1, _, _ = _lane(f"{rule}+cap+relative", process="none", rounds=12)
        assert np.array_equal(w0, w1), rule
        assert b.metrics["clamped"] == 0


def test_guard_evidence_catches_unchanged_content():
    """An always-on attacker whose model never changes (model=constant) claims age 0: the
    evidence raises its age by the rounds since its content was first seen."""
    a, _, _, _ = _lane("sfg+guard", "forge:frac=0.25,claim=fresh,model=constant,always_on=true")
    b, _, _, _ = _lane("sfg+guard", "forge:frac=0.25,claim=fresh,always_on=true")
    c, _, _, _ = _lane("sfg", "forge:frac=0.25,claim=fresh,model=constant,always_on=true")
    assert a.metrics["attack_weight"] < b.metrics["attack_weight"]
    assert a.metrics["attack_weight"] < c.metrics["attack_weight"]


# ----------------------------------------------------------------------------- damage measures
def damage_reference(w: np.ndarray, g: Graph, avail: np.ndarray, attackers: np.ndarray,
                     anatomy: str, h: int) -> dict[str, float]:
    """The damage measures by a per-client loop over the recorded slot weights ``w`` [T, E]."""
    rg = RoundGraph.from_graph(g)
    caps = capabilities(avail, anatomy)
    Tn, n = avail.shape
    att_w, cut, count = 0.0, 0, 0
    for t in range(Tn):
        for i in range(n):
            if attackers[i] or not caps.adopt[t, i]:
                continue
            live_nb = [e for e in range(rg.indptr[i] + 1, rg.indptr[i + 1])
                       if caps.send[t, rg.send[e]]]
            if not live_nb:
                continue
            count += 1
            att_w += sum(w[t, e] for e in live_nb if attackers[rg.send[e]])
            cut += w[t, rg.indptr[i]] == 0.0
    hh = max(1, min(h, Tn))
    shares = []
    for s in range(Tn - hh + 1):
        m = [0.0] * n
        for t in range(s, s + hh):
            new = list(m)
            for i in range(n):
                if caps.adopt[t, i]:
                    new[i] = sum(w[t, e] * (1.0 if attackers[rg.send[e]] else m[rg.send[e]])
                                 for e in range(rg.indptr[i], rg.indptr[i + 1]))
            m = new
        honest = [i for i in range(n) if not attackers[i]]
        shares.append(sum(m[i] >= REACH_LEVEL for i in honest) / len(honest))
    return {"attack_weight": att_w / count if count else math.nan,
            "self_cut": cut / count if count else math.nan,
            "reach": sum(shares) / len(shares)}


@pytest.mark.parametrize("rule, attack, anatomy", [
    ("sfg-cut", "forge:frac=0.2,claim=fresh", "full"),
    ("limited-merging:L=2", "forge:frac=0.2,claim=stale-others,always_on=true", "full"),
    ("sfg+guard+cap", "forge:frac=0.3,claim=random,placement=degree", "cannot-train-shares"),
    ("dfedavg", "forge:frac=0.1", "cannot-communicate"),
])
def test_damage_measures_equal_a_per_client_loop(rule, attack, anatomy):
    res, w, g, avail = _lane(rule, attack, anatomy=anatomy)
    a = parse_attack(attack)
    att = place(a, N, np.diff(RoundGraph.from_graph(g).indptr) - 1, seed=SEED)
    ref = damage_reference(w, g, availability(avail, a, att), att, anatomy, H)
    for k, v in ref.items():
        assert res.metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    if rule != "dfedavg":
        assert res.metrics["attack_weight"] > 0 and res.metrics["reach"] > 0


def test_damage_reference_can_fail():
    res, w, g, avail = _lane("sfg-cut", "forge:frac=0.2")
    att = place(parse_attack("forge:frac=0.2"), N, np.zeros(N), seed=SEED)
    wrong = damage_reference(w, g, avail, np.roll(att, 1), "full", H)  # the wrong clients
    assert wrong["attack_weight"] != pytest.approx(res.metrics["attack_weight"])


# ----------------------------------------------------------------------------- training
TINY = dict(dataset="digits", model="mlp", n_clients=16, rounds=8, local_steps=2, batch_size=8,
            eval_every=4, process="bursty:u=0.6", graph="knn:k=4", seed=3, backend="loop")


def _train(**kw):
    from sfg.sim.run import simulate

    return simulate({**TINY, **kw})


@pytest.mark.crosspath
def test_training_frac_zero_is_the_no_attack_run_bit_for_bit():
    base = _train(rule="sfg-cut")
    for attack in ["forge:frac=0,model=sign-flip,always_on=true", "none"]:
        got = _train(rule="sfg-cut", attack=attack)
        assert {k: got.metrics[k] for k in base.metrics} == base.metrics
        assert got.meta["minibatch_digest"] == base.meta["minibatch_digest"]
        assert bool((got.params == base.params).all())
        if attack != "none":  # honest accuracy is reported under an attack: all clients here
            assert got.metrics["acc_honest_mean"] == base.metrics["acc_mean"]
    assert "acc_honest_mean" not in base.metrics


def test_training_attack_is_paired_and_poisons():
    base = _train(rule="dfedavg")
    flip = _train(rule="dfedavg", attack="forge:frac=0.25,claim=honest,model=sign-flip")
    # same minibatches (pairing), different models; honest accuracy over the 12 honest clients
    assert flip.meta["minibatch_digest"] == base.meta["minibatch_digest"]
    assert not bool((flip.params == base.params).all())
    att = place(parse_attack("forge:frac=0.25"), 16, np.zeros(16), seed=3)
    assert flip.metrics["acc_honest_mean"] == pytest.approx(float(flip.accuracy[~att].mean()))
    assert flip.metrics["acc_honest_mean"] < float(base.accuracy[~att].mean())


def test_clipped_gossip_hand_case():
    """+clip: neighbour differences clipped to the receiver's median neighbour distance; with
    one neighbour (its own median) nothing is clipped and it is plain gossip."""
    import torch

    from sfg.sim.attack_train import clipped_gossip

    rg = RoundGraph.from_edges(3, np.array([[0, 1], [1, 2], [0, 2]]))
    X = torch.tensor([[0.0, 0.0], [3.0, 4.0], [30.0, 40.0]], dtype=torch.float64)
    w = np.zeros(rg.n_slots)
    w[:] = 1.0 / 3
    cand = np.ones(rg.n_slots, bool)
    rows = np.ones(3, bool)
    out = clipped_gossip(X, X, rg, w, cand, rows)
    # receiver 0: distances 5 and 50, median (lower) 5: the far one is clipped to length 5
    np.testing.assert_allclose(out[0].numpy(), [(3 + 3) / 3, (4 + 4) / 3])
    # receiver 2: distances 45 (to 1) and 50 (to 0): clipped to 45
    far = np.array([-30.0, -40.0]) * 45 / 50
    np.testing.assert_allclose(out[2].numpy(), [30 + (-27 + far[0]) / 3, 40 + (-36 + far[1]) / 3])
    # with one neighbour per receiver nothing is clipped: plain gossip
    rg2 = RoundGraph.from_edges(2, np.array([[0, 1]]))
    w2 = np.full(rg2.n_slots, 0.5)
    out2 = clipped_gossip(X[:2], X[:2], rg2, w2, np.ones(rg2.n_slots, bool), np.ones(2, bool))
    np.testing.assert_allclose(out2.numpy(), [[1.5, 2.0], [1.5, 2.0]])


# ----------------------------------------------------------------------------- report
def _rec(rule, seed, value, attack=None, kind="train", metric="acc_honest_mean"):
    cfg = {"kind": kind, **({"attack": attack} if attack else {})}
    return {"run_id": f"{rule}-{seed}-{attack}", "dataset": "digits", "process": "bursty:u=0.8",
            "rule": rule, "seed": seed, "status": "done", "config": cfg,
            "metrics": {metric: value, "acc_honest_p10": value / 2}, "curves": {}}


def test_attack_report_pairs_against_the_no_attack_runs(tmp_path):
    from sfg.experiments.report.attacks import attack_rows, undefended, write_attack_report

    base = {1: 0.80, 2: 0.70, 3: 0.75}
    hit = {1: 0.60, 2: 0.55, 3: 0.45}
    guard = {1: 0.79, 2: 0.71, 3: 0.72}
    recs = ([_rec("sfg", s, v) for s, v in base.items()]
            + [_rec("sfg", s, v, "forge:claim=fresh,frac=0.1") for s, v in hit.items()]
            + [_rec("sfg+guard", s, v) for s, v in guard.items()])
    rows = {(r.rule, r.series, r.frac, r.metric): r for r in attack_rows(recs)}
    r = rows[("sfg", "forge:claim=fresh", 0.1, "acc_honest_mean")]
    diffs = np.array([hit[s] - base[s] for s in (1, 2, 3)])
    assert r.loss == pytest.approx(diffs.mean()) and r.units == 3 and r.runs == 3
    half = float(__import__("scipy").stats.t.ppf(0.975, 2)) * diffs.std(ddof=1) / np.sqrt(3)
    assert (r.low, r.high) == pytest.approx((diffs.mean() - half, diffs.mean() + half))
    # the defence's cost: its no-attack runs against the undefended rule's
    c = rows[("sfg+guard", "forge:claim=fresh", 0.0, "acc_honest_mean")]
    assert c.loss == pytest.approx(np.mean([guard[s] - base[s] for s in (1, 2, 3)]))
    assert undefended("sfg-cut:L=2,kappa=3+guard+cap") == "sfg-cut:L=2"
    assert undefended("sfg-l:gamma=0.3+ipw+relative") == "sfg-l:gamma=0.3+ipw"
    _, files = write_attack_report(recs, tmp_path)
    assert set(files) == {"attack.csv", "attack.md", "attack_damage.png"}
    assert "sfg+guard" in (tmp_path / "attack.md").read_text()


def test_sfg_report_on_a_real_attack_grid(tmp_path):
    """A replay grid with attacks through the real store and `sfg report`."""
    from typer.testing import CliRunner

    from sfg.cli.main import app

    grid = tmp_path / "g.yaml"
    grid.write_text("""\
name: tiny-attack
base: {kind: replay, n_clients: 12, rounds: 20, horizon: 5, graph: "knn:k=3"}
processes: ["bursty:u=0.7"]
rules: [sfg-cut, "sfg-cut+guard", dfedavg]
seeds: [1, 2, 3]
overrides: [{}, {attack: "forge:frac=0.25,always_on=true"}]
""")
    store = str(tmp_path / "s.sqlite")
    runner = CliRunner()
    res = runner.invoke(app, ["grid", "run", str(grid), "--store", store, "--workers", "1",
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", "--store", store, "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "rep" / "attack.csv").read_text()
    assert "sfg-cut+guard" in text and "attack_weight" in text
    assert (tmp_path / "rep" / "attack_damage.png").stat().st_size > 1000
