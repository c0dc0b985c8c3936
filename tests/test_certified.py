"""The certified protocol modelled in rounds (``+certified``, sfg.round.certified): hand-built
witnesses and provenance, honest claims never refused (bit for bit, every model-free rule),
the best-response liar, and what a failed link costs honest clients."""

from __future__ import annotations

import numpy as np
import pytest
from test_attacks import DEFENDABLE, _lane

from sfg.errors import SfgError
from sfg.round.certified import Evidence
from sfg.round.rules import parse_rule
from sfg.round.slots import RoundGraph

# the triangle 0 – 1 – 2 plus 3 hanging off 1: receiver 0, sender 1, witness 2
EDGES = np.array([[0, 1], [0, 2], [1, 2], [1, 3]])


def _slot(rg, j, i):
    return int(np.flatnonzero((rg.send == j) & (rg.recv == i))[0])


def _evidence(*, asleep_1: bool, witness_online: bool):
    """The previous round: every client at age 1, lag 2, count 5 (its self slot), neighbours
    delivering the same; client 1 asleep (aggregated nothing) or awake; client 2 (the
    witness) aggregated then — hearing 1 only if 1 was awake — or was offline too."""
    rg = RoundGraph.from_edges(4, EDGES)
    ev = Evidence(rg)
    E = rg.n_slots
    cand = np.zeros(E, bool)
    for i in range(4):
        on = not (i == 1 and asleep_1) and not (i == 2 and not witness_online)
        if not on:
            continue
        for s in range(rg.indptr[i], rg.indptr[i + 1]):
            j = rg.send[s]
            j_on = not (j == 1 and asleep_1) and not (j == 2 and not witness_online)
            cand[s] = rg.is_self[s] or j_on
    ev.note(cand, (np.ones(E, np.int64), np.full(E, 2.0), np.full(E, 5, np.int64)))
    return rg, ev


def _told(rg, claim_of_1, *, asleep_2: bool = False):
    """This round's delivered claims: the honest clients' true ones — trained after
    aggregating last round (age 0, lag 2, count 6), or one round older after sleeping
    (age 2, lag 3, count 5) — and client 1's ``claim_of_1`` (age, lag, count)."""
    E = rg.n_slots
    age, lag, count = np.zeros(E, np.int64), np.full(E, 2.0), np.full(E, 6, np.int64)
    if asleep_2:
        from2 = rg.send == 2
        age[from2], lag[from2], count[from2] = 2, 3.0, 5
    from1 = rg.send == 1
    age[from1], lag[from1], count[from1] = claim_of_1
    return age, lag, count


ALONE = (0, 2.0, 6)  # "I trained alone": age 0, my own lag, my count + 1


def test_a_witness_refutes_the_sleeping_liars_trained_alone_claim():
    """Client 1 slept; it claims to have trained alone. Client 2, a neighbour of both, is a
    candidate of 0 this round and aggregated last round without hearing 1: refuted."""
    rg, ev = _evidence(asleep_1=True, witness_online=True)
    cand = np.ones(rg.n_slots, bool)
    got = ev.refuted(_told(rg, ALONE), cand)
    assert got[_slot(rg, 1, 0)] and not got[_slot(rg, 2, 0)]
    assert got[_slot(rg, 1, 2)]  # 2 is its own witness: it heard nothing from 1
    assert got[_slot(rg, 1, 3)]  # and so is 3, awake last round
    # without the witness among 0's candidates this round, nothing refutes it — unless 0
    # itself aggregated last round without hearing 1 (it did): its own heard-set
    no_2 = cand.copy()
    no_2[_slot(rg, 2, 0)] = False
    assert ev.refuted(_told(rg, ALONE), no_2)[_slot(rg, 1, 0)]


def test_an_honest_client_that_trained_alone_is_not_refuted():
    """The same claim from a client that was awake while its neighbours slept (it trained
    alone for real): no neighbour aggregated, so no witness — not refuted; and an awake
    client heard by the witness is not refuted either."""
    rg, ev = _evidence(asleep_1=False, witness_online=False)
    assert not ev.refuted(_told(rg, ALONE, asleep_2=True), np.ones(rg.n_slots, bool)).any()
    rg, ev = _evidence(asleep_1=False, witness_online=True)
    assert not ev.refuted(_told(rg, ALONE), np.ones(rg.n_slots, bool)).any()


def test_provenance_refuses_a_claim_no_source_gives():
    """Every source of client 1 says lag 2 and count 5: a trained claim must have lag 2 and
    count 6, an untrained one lag 3, count 5, age 2. "Fresh" (lag 0) and an inflated count
    are refused with or without a witness; the untrained truth after sleeping is not."""
    rg, ev = _evidence(asleep_1=True, witness_online=False)
    cand = np.ones(rg.n_slots, bool)
    s = _slot(rg, 1, 0)

    def told(claim):
        return _told(rg, claim, asleep_2=True)

    assert ev.refuted(told((0, 0.0, 6)), cand)[s]      # lag below every source
    assert ev.refuted(told((0, 2.0, 9)), cand)[s]      # count no source gives
    assert ev.refuted(told((1, 3.0, 5)), cand)[s]      # untrained: age must be 2
    assert not ev.refuted(told((2, 3.0, 5)), cand)[s]  # the truth after sleeping
    # "trained alone" has provenance; only witnesses refute it: receiver 0 is its own (it
    # heard nothing from 1 last round); receiver 2 slept, and without 0 among its
    # candidates this round nobody refutes it there
    assert ev.refuted(told(ALONE), cand)[s]
    no_0 = cand.copy()
    no_0[_slot(rg, 0, 2)] = False
    got = ev.refuted(told(ALONE), no_0)
    assert not got[_slot(rg, 1, 2)] and got[s]
    # the honest others are never refused: 3 + 3 + 3 + 0 + 3 + 2 of 1's slots, nothing else
    assert ev.refused == 14


@pytest.mark.parametrize("anatomy", ["full", "cannot-train-shares", "cannot-train-adopts",
                                     "cannot-communicate"])
def test_certified_never_refuses_an_honest_claim(anatomy):
    """Honest claims are their sources' docs/concepts/staleness.md#the-staleness-state update and an awake client is heard by
    every online neighbour: +certified gives the rule's weights bit for bit, every
    model-free rule, refusing nothing (the witness is off under cannot-communicate)."""
    for rule in DEFENDABLE:
        a, w0, _, _ = _lane(rule, anatomy=anatomy, rounds=25)
        b, w1, _, _ = _lane(f"{rule}+certified", anatomy=anatomy, rounds=25)
        assert np.array_equal(w0, w1), rule
        assert b.metrics["claims_refused"] == 0.0, rule


def test_failed_links_make_honest_senders_look_absent():
    """The limit, measured: with link failures an online neighbour may not hear an honest
    sender, which then looks asleep to the witness — honest claims get refused."""
    from test_attacks import _scenario

    from sfg.modelfree.driver import Lane, run_lane

    g, avail = _scenario(n=30, rounds=40)
    res = run_lane(Lane(avail, g, parse_rule("sfg+certified"), 1, None), anatomy="full",
                   link_failure=0.4, horizon=0, exact_pairs=0, sample_pairs=1)
    assert res.metrics["claims_refused"] > 0


def test_the_best_response_liar_and_what_certification_refutes():
    """claim=certified (the best claim it can back) with the round's knowledge avoids every
    witness and is never refused; with what it observed it lies after sleeping and the
    witnesses catch some of it. A fresh liar (no provenance) is refused and loses its share."""
    got = {}
    for attack in ("forge:frac=0.2,claim=certified,knowledge=rushing",
                   "forge:frac=0.2,claim=certified", "forge:frac=0.2,claim=fresh"):
        for rule in ("sfg", "sfg+certified"):
            res, *_ = _lane(rule, attack, rounds=40)
            got[(attack, rule)] = res.metrics
    rushing, observed, fresh = ("forge:frac=0.2,claim=certified,knowledge=rushing",
                                "forge:frac=0.2,claim=certified", "forge:frac=0.2,claim=fresh")
    assert got[(rushing, "sfg+certified")]["claims_refused"] == 0.0
    assert got[(rushing, "sfg+certified")]["attack_weight"] == got[(rushing, "sfg")]["attack_weight"]
    assert got[(observed, "sfg+certified")]["claims_refused"] > 0
    assert got[(observed, "sfg+certified")]["attack_weight"] < got[(observed, "sfg")]["attack_weight"]
    assert got[(fresh, "sfg+certified")]["attack_weight"] < 0.2 * got[(fresh, "sfg")]["attack_weight"]


def test_certified_is_refused_where_it_is_not_modelled():
    from sfg.round.certified import check_rounds_only

    with pytest.raises(SfgError, match=r"\+certified models the certified protocol"):
        check_rounds_only(parse_rule("sfg-cut+certified"), "the virtual clock")
    with pytest.raises(SfgError, match="give \\+certified alone"):
        parse_rule("sfg-cut+certified+guard")
    from sfg.round.attacks import check_rounds_only as attack_rounds_only
    from sfg.round.attacks import parse_attack

    with pytest.raises(SfgError, match="claim=certified"):
        attack_rounds_only(parse_attack("forge:claim=certified"), "the networked nodes")


def test_certified_in_training_changes_nothing_honest_and_refuses_fresh_liars():
    """sfg run: +certified without an attack trains the rule's models bit for bit (nothing
    refused); under fresh liars it refuses their claims (the honest accuracy is measured)."""
    import torch
    from test_attacks import _train

    plain = _train(rule="sfg-cut")
    cert = _train(rule="sfg-cut+certified")
    assert torch.equal(plain.params, cert.params) and cert.metrics["claims_refused"] == 0.0
    lied = _train(rule="sfg-cut+certified", attack="forge:frac=0.25,claim=fresh")
    assert lied.metrics["claims_refused"] > 0 and np.isfinite(lied.metrics["acc_honest_mean"])


def test_a_senders_prior_is_what_the_receiver_heard_from_it_not_its_true_state():
    """Receiver 0 accepted client 1's claim of the previous round (lag 0.5, count 9, a lie:
    its self slot says lag 2, count 5); receiver 2 got the truth. Client 1 now claims to have
    trained from that lie (age 0, lag 0.5, count 10): 0 knows no better — the claim follows
    from what 1 told it — while 2, whose prior of 1 is the truth, refuses it. Had 0 refused
    the lie, its prior of 1 would be the prior 1 cites (its true state), and 0 refuses too."""
    rg, ev = _evidence(asleep_1=False, witness_online=True)
    s10, s12 = _slot(rg, 1, 0), _slot(rg, 1, 2)
    ev.lag[s10], ev.count[s10] = 0.5, 9
    p_age, p_lag, p_count = ev.prior()
    assert (p_lag[s10], p_count[s10]) == (0.5, 9) and (p_lag[s12], p_count[s12]) == (2.0, 5)
    cand = np.ones(rg.n_slots, bool)
    got = ev.refuted(_told(rg, (0, 0.5, 10)), cand)
    assert not got[s10] and got[s12]
    ev._refused_last[:] = False
    ev._refused_last[s10] = True  # 0 refused the lie in the previous round
    assert ev.refuted(_told(rg, (0, 0.5, 10)), cand)[s10]
    # the sender's own view (knows_refusals=False) still builds on what it delivered
    assert ev.prior(knows_refusals=False)[1][s10] == 0.5
