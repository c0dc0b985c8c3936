"""THE round (docs/concepts/round.md#one-round, docs/concepts/staleness.md#the-staleness-state, docs/concepts/replay.md#model-free-analyses): candidates → weights → staleness update → per-receiver facts.

One compiled function, :func:`_rounds`, plays rounds for every receiver: it forms the
candidate set S_i^t (anatomy modes through the round's capabilities, link failures), gathers
the candidates' staleness into short arrays (index 0 = the receiver), calls the rule's compiled
one-receiver function, applies the modifiers and the shared normalisation (:func:`_weights`:
``c``, ``+ipw``, non-finite or negative scores → 0, all-zero rows and non-adopters keep their
own model), updates the staleness state (ages, lags, counts, local counts, q̂) and records
the facts that the replay analyses (docs/concepts/replay.md#model-free-analyses) are computed from (:data:`FACTS`).

:func:`play_round` runs it for one round and :func:`run_rounds` for a stretch of rounds; the
replay (:mod:`sfg.modelfree`), the training simulator (:mod:`sfg.sim`) and
:meth:`sfg.round.rules.Rule.weights_one` (through :func:`one_receiver`, which runs the same
:func:`_weights`) all call it.

Compiled once, for every rule: the round takes the rule as an argument, a first-class
function of one signature (:func:`scorer`: the rule's function inlined into :func:`_score`,
cached on disk under a name that includes the rule's name and a hash of its source: the rule,
every helper it calls and their source files, :func:`sfg.round.jit.source_digest`). A new
rule therefore compiles only its own few lines, not the round, and an edited rule or helper is
compiled afresh on the next run. The round itself has up to four
signatures, compiled on first use: with or without inputs from outside the round (scores
computed outside, forged claims, remembered models, attackers) and with or without defences;
the branches of what is absent are not compiled.
"""

from __future__ import annotations

import re
import threading
import types
from collections import namedtuple
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from sfg.errors import SfgError
from sfg.round.compiled import first_class
from sfg.round.defences import CAP, GUARD, REFUTE, RELATIVE, cap_weights, clamp_claims
from sfg.round.slots import RoundGraph
from sfg.round.staleness import Q_HAT_BETA, Q_HAT_FLOOR, StalenessState, waited
from sfg.util.numba_start import njit
from sfg.util.rng import stream
from sfg.world.outages.anatomy import Capabilities

if TYPE_CHECKING:
    from sfg.round.rules import Rule

Candidates = namedtuple("Candidates", ["t", "u", "age", "lag", "count", "local_count", "q",
                                       "degree", "key", "given"])
Candidates.__doc__ = """One receiver's candidates as a rule sees them (index 0 = the receiver).

t: round index; u: the receiver's uniform draw (random rules); age [k] int64; lag [k] float64
(rounded under +rounded); count [k] int64 max-inherited; local_count [k] int64; q [k] float64
q̂_ij (q[0] = 1); degree [k] int64 live-neighbour counts; key [k] float64 uniform keys (random
rules); given [k] float64 scores computed outside (model-reading rules, oracles)."""

# Per-receiver facts of a round, on the state before it (docs/concepts/replay.md#model-free-analyses); metrics are defined on them
# in sfg.modelfree.metrics.
FACTS = ("adopt", "age", "lag", "neighbours", "max_neighbour_age", "spread_age", "spread_lag",
         "kept", "self_weight", "attacker_weight", "honest", "clamped")
(F_ADOPT, F_AGE, F_LAG, F_NB, F_MAX_NB_AGE, F_SPREAD_AGE, F_SPREAD_LAG, F_KEPT,
 F_SELF_W, F_ATT_W, F_HONEST, F_CLAMPED) = range(len(FACTS))

# a local round's capabilities on the clock (anatomy modes, docs/concepts/outages.md#anatomy-modes; sfg.clock.schedule)
EV_TRAIN, EV_SEND, EV_AGGREGATE = 1, 2, 4
EV_ALL = EV_TRAIN | EV_SEND | EV_AGGREGATE
# The compiled parts' placeholders for an absent input (one signature takes arrays, never
# None): EMPTY_* a [0] array, NONE_* a [0, 0] one, of floats (F), int64 (I) or bools (B).
# Shared by every call (the compiled parts take them writeable but never write them).
EMPTY_F = np.zeros(0)
EMPTY_I = np.zeros(0, np.int64)
EMPTY_B = np.zeros(0, bool)
NONE_F = np.zeros((0, 0))
NONE_I = np.zeros((0, 0), np.int64)
NONE_B = np.zeros((0, 0), bool)
_I64_MAX = np.iinfo(np.int64).max


# ----------------------------------------------------------------------------- forged claims
# The claims an attacker can forge (sfg.round.attacks, which parses them) and their codes, as
# the compiled parts take them: one table, in the order attacks lists them; 0 = honest (the
# true claim: nothing forged).
CLAIM_CODE = {"fresh": 1, "stale-others": 2, "random": 3, "honest": 0, "undercut": 4,
              "certified": 5}
HONEST, FRESH, STALE_OTHERS, RANDOM = (CLAIM_CODE[c] for c in
                                       ("honest", "fresh", "stale-others", "random"))


@njit(cache=True, nogil=True)
def forged_claim(code, t, heard, age, lag, count, r_age, r_lag, r_count):
    """THE forged claim (age, lag, count) that an attacker sends in round ``t`` (its own
    clock's round on the virtual clock) under claim ``code`` (:data:`CLAIM_CODE`), from its
    true (``age``, ``lag``, ``count``), ``heard`` the largest count it knows of (its own and
    what it received) and its random draw (``r_age``, ``r_lag``, ``r_count``) of the round
    (:func:`sfg.round.attacks.random_claims`; read for ``random`` only):

    * ``fresh``: age 0, lag 0, count heard + 1; ``stale-others``: that count + t + 1;
    * ``random``: the draw (age in 0..t, lag in [0, t], count in 1..t+1);
    * ``honest`` — and ``undercut``/``certified``, which forge per receiver
      (:func:`sfg.round.attacks.claims`) and run in rounds only — the true claim.

    The rounds (:func:`sfg.round.attacks.claims`, through :func:`forge_slots`), the virtual
    clock's events (:func:`_events`) and so the model-free replay on the clock
    (:mod:`sfg.clock.replay`) all send this claim."""
    if code == FRESH or code == STALE_OTHERS:
        extra = t + 1 if code == STALE_OTHERS else 0
        return np.int64(0), 0.0, np.int64(heard + 1 + extra)
    if code == RANDOM:
        return np.int64(r_age), np.float64(r_lag), np.int64(r_count)
    return np.int64(age), np.float64(lag), np.int64(count)


@njit(cache=True, nogil=True)
def forge_slots(code, t, slots, heard, r_age, r_lag, r_count, age, lag, count):
    """:func:`forged_claim` on the ``slots`` (their senders' heard counts and draws given per
    slot), in place on the slots' claims ``age``, ``lag``, ``count`` [E]."""
    for k in range(slots.shape[0]):
        e = slots[k]
        age[e], lag[e], count[e] = forged_claim(code, t, heard[k], age[e], lag[e], count[e],
                                                r_age[k], r_lag[k], r_count[k])


def _c(a: Any, dtype: Any) -> np.ndarray:
    """``a`` as a C-contiguous, writeable array of ``dtype`` (what the compiled parts' one
    signature takes); no copy when it already is one."""
    a = np.ascontiguousarray(a, dtype)
    return a if a.flags.writeable else a.copy()


# ----------------------------------------------------------------------------- compiled parts
# A rule's compiled form, as the round calls it: score(x, params, out) writes the rule's
# scores of one receiver's candidates x into out [k] (params: the rule's parameters in
# signature order) and returns 1, or 0 if the rule raised (numba's C wrapper, through which
# the round calls it, reports the exception). One signature for every rule, so that the round
# takes the rule as an argument (a first-class function) and is compiled once.
_TYPES: dict[object, object] = {}


def _types() -> dict[object, object]:
    """The numba types of the compiled parts (made on first use: importing this module
    compiles nothing). ``("round", outside, defended)``: the signature of :func:`_rounds`
    with or without the inputs from outside the round and the defences."""
    if not _TYPES:
        from numba import types as nt

        from sfg.round.defences import defend_signature

        i1, f1, b1 = (nt.Array(d, 1, "C") for d in (nt.int64, nt.float64, nt.boolean))
        i2, f2, b2 = (nt.Array(d, 2, "C") for d in (nt.int64, nt.float64, nt.boolean))
        cand = nt.NamedTuple((nt.int64, nt.float64, i1, f1, i1, i1, f1, i1, f1, f1), Candidates)
        score = nt.FunctionType(nt.int64(cand, f1, f1))
        head = (score, f1, nt.int64, nt.float64, nt.boolean, nt.boolean, nt.int64, nt.float64,
                nt.float64, i1, i1, i1, nt.Array(nt.boolean, 3, "C"), b2, f2, f2, i2, f1, f1, f2,
                b1, nt.Array(nt.float64, 3, "C"))
        _TYPES.update(cand=cand, score=score, one=nt.int64(
            score, f1, nt.int64, nt.float64, i1, f1, i1, i1, f1, i1, f1, f1, nt.float64,
            nt.boolean, nt.boolean, f1))
        for outside in (False, True):
            for defended in (False, True):
                tail = ((f2, i2, f1, b1, b2) if outside else (nt.none,) * 5) + (
                    (nt.FunctionType(defend_signature()), i2) if defended else (nt.none,) * 2)
                _TYPES["round", outside, defended] = nt.int64(*head, *tail)
        for defended in (False, True):
            # _events: score, params, c_self, ipw, rounded, defence, margin, kappa, indptr,
            # send, times, kind, dev, tt, amount, cptr, cslot, cmsg, cwait, u, key, st, lags,
            # q, hdr, hdr_lag, w, facts, marks, forge, rnd, samples, curve, order, given,
            # caps, track_q, defend, ev
            _TYPES["events", defended] = nt.int64(
                score, f1, nt.float64, nt.boolean, nt.boolean, nt.int64, nt.float64,
                nt.float64, i1, i1, f1, i1, i1, i1, f1, i1, i1, i1, f1, f1, f1, i2, f1, f1,
                i2, f1, f1, f2, b2, nt.int64, f2, f1, f2, i1, f1, i1, nt.boolean,
                *((nt.FunctionType(defend_signature()), i2) if defended else (nt.none,) * 2))
    return _TYPES


#: ``c_self`` meaning "the given scores are the candidates' weights exactly as used": a node's
#: own staleness update (:class:`sfg.net.checkpoints.Star`) replays the weights its rule gave,
#: which normalising (or modifying) again would round differently from the round's own.
WEIGHTS_GIVEN = -1.0


@njit(inline="always")
def _weights(score, x, params, c_self, ipw, adopt, w):  # pragma: no cover - compiled
    """One receiver's weights, written to ``w`` [k]: the rule's scores (``score``, see
    :func:`scorer`), the modifiers (base self-weight c on the receiver, +ipw on neighbours),
    non-finite or negative scores → 0, then the shared normalisation (docs/concepts/round.md#one-round); an all-zero
    row, or a receiver that does not adopt, keeps its own model (w_ii = 1); with ``c_self`` =
    :data:`WEIGHTS_GIVEN` an adopting receiver's scores are its weights, as given. Returns 0,
    or 1 if the rule raised (``w`` is then undefined)."""
    if score(x, params, w) != 1:
        return 1
    k = w.shape[0]
    if c_self == WEIGHTS_GIVEN and adopt:  # the scores are the weights as used: kept as given
        return 0
    row = 0.0
    for d in range(k):
        v = w[d]
        if d == 0:
            if c_self != 1.0:
                v = v * c_self
        elif ipw:
            v = v / x.q[d]
        if not (v > 0.0 and v < np.inf):  # non-finite or not positive
            v = 0.0
        w[d] = v
        row += v
    if row > 0.0 and adopt:
        for d in range(k):
            w[d] = w[d] / row
    else:
        for d in range(k):
            w[d] = 0.0
        w[0] = 1.0
    return 0


@njit(cache=True, nogil=True)
def _settle(trained, k, b_age, b_raw, b_count, wk, b_cand, b_att, fr):  # pragma: no cover
    """The staleness update of one receiver that adopts its aggregate (docs/concepts/staleness.md#the-staleness-state), from its
    candidates' claims as used (``b_age``, ``b_raw`` lags, ``b_count`` [k], index 0 = the
    receiver) and its weights ``wk`` [k]: returns (age, lag, count) after the round — lag the
    weighted mean of the candidates' lags (+1 if it did not train), age 0 after training (else
    the youngest merged + 1), count the largest merged (+1 for training). Writes the facts of
    the candidates into ``fr`` (:data:`FACTS`; ``b_cand``: candidates proper, not remembered
    models; ``b_att``: sent by an attacker). Written once for the round (:func:`_rounds`) and
    the virtual clock's events (:func:`_events`)."""
    mix = 0.0
    youngest = _I64_MAX
    inherited = 0
    kept = 0
    amin = _I64_MAX
    amax = -1
    lmin = np.inf
    lmax = -np.inf
    max_nb_age = -1
    att_w = 0.0
    for d in range(k):
        if b_att[d]:
            att_w += wk[d]
        mix += wk[d] * b_raw[d]
        if wk[d] > 0.0:
            if b_age[d] < youngest:
                youngest = b_age[d]
            if b_count[d] > inherited:
                inherited = b_count[d]
            if b_cand[d]:
                kept += 1
        if b_cand[d]:
            if b_age[d] < amin:
                amin = b_age[d]
            if b_age[d] > amax:
                amax = b_age[d]
            if b_raw[d] < lmin:
                lmin = b_raw[d]
            if b_raw[d] > lmax:
                lmax = b_raw[d]
            if d > 0 and b_age[d] > max_nb_age:
                max_nb_age = b_age[d]
    fr[F_MAX_NB_AGE] = max_nb_age
    fr[F_SPREAD_AGE] = amax - amin
    fr[F_SPREAD_LAG] = lmax - lmin
    fr[F_KEPT] = kept
    fr[F_ATT_W] = att_w
    not_trained = 0.0 if trained else 1.0
    return (0 if trained else youngest + 1), mix + not_trained, inherited + (1 if trained else 0)


@njit(inline="always")
def _update_q(q, a, b, cand):  # pragma: no cover - compiled
    """q̂ of receiver slots a+1..b−1 after an aggregation (docs/concepts/staleness.md#the-staleness-state): EWMA of "is a candidate",
    floored."""
    for e in range(a + 1, b):
        qe = (1.0 - Q_HAT_BETA) * q[e] + Q_HAT_BETA * (1.0 if cand[e] else 0.0)
        q[e] = Q_HAT_FLOOR if Q_HAT_FLOOR > qe else qe  # max(qe, floor)


# Stages of _rounds and _events, inlined into them (numba IR, before typing, so that a None
# argument still removes its branches). An inlined stage binds each array it takes to a new
# reference (counted up and down by each call): a stage called per receiver or per event
# would cost the events ~4 % (callgrind), so the stages below run once per call or per round,
# or only with defences; the per-receiver and per-event code that writes arrays is written out.
@njit(inline="always")
def _kmax(indptr):  # pragma: no cover - compiled
    """The most slots any receiver has (its candidates' buffers' length), at least 1."""
    kmax = 1
    for i in range(indptr.shape[0] - 1):
        ki = indptr[i + 1] - indptr[i]
        if ki > kmax:
            kmax = ki
    return kmax


@njit(inline="always")
def _buffers(kmax):  # pragma: no cover - compiled
    """One receiver's candidates, gathered into [kmax] buffers (index 0 = the receiver): slot,
    age, lag as the rule sees it, raw lag, count, local count, q̂, live-neighbour count, key
    (0), score given (1), weight, +guard's least age (0), candidate proper (True), sent by an
    attacker (False)."""
    return (np.empty(kmax, np.int64), np.empty(kmax, np.int64), np.empty(kmax, np.float64),
            np.empty(kmax, np.float64), np.empty(kmax, np.int64), np.empty(kmax, np.int64),
            np.empty(kmax, np.float64), np.empty(kmax, np.int64), np.zeros(kmax, np.float64),
            np.ones(kmax, np.float64), np.empty(kmax, np.float64), np.zeros(kmax, np.int64),
            np.ones(kmax, np.bool_), np.zeros(kmax, np.bool_))


@njit(inline="always")
def _defend_claims(defend, defence, margin, kappa, t, k, b_age, b_raw, b_count, b_min_age,
                   b_w, b_lag, rounded):  # pragma: no cover - compiled
    """The defences' clamp of the candidates' claims (``defend``: not None), the lags as the
    rule sees them made again from the clamped ones; returns the claims clamped. Called only
    where there are defences, so that a round without them binds none of these arrays."""
    n_clamped = 0
    if defence != 0:
        n_clamped = defend(0, t, defence, margin, kappa, k, b_age, b_raw, b_count, b_min_age,
                           b_w)
        for d in range(k):
            b_lag[d] = np.rint(b_raw[d]) if rounded else b_raw[d]
    return n_clamped


@njit(inline="always")
def _defend_weights(defend, defence, margin, kappa, t, k, b_age, b_raw, b_count, b_min_age,
                    wk, adopts):  # pragma: no cover - compiled
    """The defences' cap or refutation of an adopting receiver's weights ``wk`` (``defend``:
    not None, as :func:`_defend_claims`)."""
    if (defence & (CAP | REFUTE)) != 0 and adopts:
        defend(1, t, defence, margin, kappa, k, b_age, b_raw, b_count, b_min_age, wk)


@njit(inline="always")
def _degrees(indptr, send, edge_id, sends, live, r, degree):  # pragma: no cover - compiled
    """Round ``r``'s live-neighbour counts d_j (whether or not j aggregates) into degree [N]."""
    use_live = live.shape[0] > 0
    for i in range(indptr.shape[0] - 1):
        dg = 0
        for e in range(indptr[i] + 1, indptr[i + 1]):
            if sends[send[e]] and (not use_live or live[r, edge_id[e]]):
                dg += 1
        degree[i] = dg


@njit(inline="always")
def _next_round(indptr, train, adopts, wr, marks, ev, st, lags, new_age, new_lag,
                new_count):  # pragma: no cover - compiled
    """The state after a round: content versions (+guard's evidence: a model changes when
    trained or mixed, unless its content never changes), then ages, lags, counts and local
    counts."""
    if ev is not None:
        if ev.shape[0] > 0:
            for i in range(indptr.shape[0] - 1):
                if train[i] or (adopts[i] and wr[indptr[i]] < 1.0):
                    frozen = False
                    if marks is not None:
                        frozen = marks.shape[0] > 0 and marks[1, i]
                    if not frozen:
                        st[3, i] += 1
    for i in range(indptr.shape[0] - 1):
        st[0, i] = new_age[i]
        lags[i] = new_lag[i]
        st[1, i] = new_count[i]
        if train[i]:
            st[2, i] += 1


def _rounds(score, params, t0, c_self, ipw, rounded, defence, margin, kappa, indptr, send,
            edge_id, caps, live, u, key, st, lags, q, w, cand, facts, given, claim_ic,
            claim_lag, extra, marks, defend, ev):  # pragma: no cover - compiled once
    """Rounds t0, t0 + 1, … of every receiver (docs/concepts/round.md#one-round, docs/concepts/staleness.md#the-staleness-state), updating the state in place; the
    rule is ``score`` (see :func:`scorer`) with its ``params``. Returns 0, or 1 + r·N + i for
    the first receiver i (of row r) whose rule raised (the results are then undefined).

    Per round (rows r = t − t0): caps [4, R, N] bool (train, send, aggregate, adopt); live
    [R, M] bool per undirected edge, or [0, 0] (all live); u [R, N], key [R, E] the rule's
    draws, or [0, 0]. State: st [4, N] int64 (ages, counts, local counts, content versions),
    lags [N], q [E] (q̂). Out: w [R, E] weights, cand [E] the last round's candidate slots,
    facts [R, N, F] (:data:`FACTS`).

    Inputs from outside the round, all None (the usual case: those branches are not even
    compiled) or all arrays: given [R, E] scores computed outside, or [0, 0]; forged claims
    (:mod:`sfg.round.attacks`: slots deliver claim_ic [2, E] ages and counts and claim_lag [E] lags,
    in every round), or [0, 0] and [0] (the senders' own state); extra [E] bool slots that
    are candidates besides the live ones (remembered models), or [0]; marks [2, N] bool:
    attackers (for the damage facts) and senders whose content never changes (evidence of
    ``+guard``), or [0, 0].

    Defences (:mod:`sfg.round.defences`), None without them: ``defend`` (:func:`sfg.round.defences.defend`,
    with the ``defence`` flags, ``margin``, ``kappa``) and ev [2, E] int64, ``+guard``'s
    evidence per slot (the version last seen, the round first seen), or [0, 0]."""
    n = indptr.shape[0] - 1
    use_live = live.shape[0] > 0
    use_u = u.shape[0] > 0
    (b_slot, b_age, b_lag, b_raw, b_count, b_local, b_q, b_deg, b_key, b_given, b_w,
     b_min_age, b_cand, b_att) = _buffers(_kmax(indptr))
    degree = np.empty(n, np.int64)
    new_age = np.empty(n, np.int64)
    new_lag = np.empty(n, np.float64)
    new_count = np.empty(n, np.int64)
    ages = st[0]
    counts = st[1]
    local_counts = st[2]
    versions = st[3]
    failed = 0
    for r in range(caps.shape[1]):
        t = t0 + r
        train = caps[0, r]
        sends = caps[1, r]
        aggregates = caps[2, r]
        adopts = caps[3, r]
        wr = w[r]
        fr = facts[r]
        _degrees(indptr, send, edge_id, sends, live, r, degree)
        for i in range(n):
            a = indptr[i]
            b = indptr[i + 1]
            trained = train[i]
            # a client that keeps its model (overwritten below for adopters)
            new_lag[i] = lags[i] + (0.0 if trained else 1.0)
            new_age[i] = 0 if trained else ages[i] + 1
            new_count[i] = counts[i] + (1 if trained else 0)
            for f in range(fr.shape[1]):
                fr[i, f] = 0.0
            fr[i, F_AGE] = ages[i]
            fr[i, F_LAG] = lags[i]
            fr[i, F_MAX_NB_AGE] = -1.0
            fr[i, F_SELF_W] = 1.0
            fr[i, F_HONEST] = 1.0
            if marks is not None:
                if marks.shape[0] > 0 and marks[0, i]:
                    fr[i, F_HONEST] = 0.0
            for e in range(a, b):
                wr[e] = 0.0
                cand[e] = False
            wr[a] = 1.0
            if not aggregates[i]:
                continue  # no candidate set: identity row (adopting implies aggregating)
            # candidates S_i^t (the receiver first), their staleness gathered
            k = np.int64(0)
            n_nb = 0
            for e in range(a, b):
                j = send[e]
                c = e == a or (sends[j] and (not use_live or live[r, edge_id[e]]))
                cand[e] = c
                if not c:
                    if extra is None:
                        continue
                    if not (extra.shape[0] > 0 and extra[e]):
                        continue
                b_slot[k] = e
                b_age[k] = ages[j]
                b_raw[k] = lags[j]
                b_count[k] = counts[j]
                if claim_ic is not None:
                    if claim_ic.shape[0] > 0:
                        b_age[k] = claim_ic[0, e]
                        b_raw[k] = claim_lag[e]
                        b_count[k] = claim_ic[1, e]
                b_lag[k] = np.rint(b_raw[k]) if rounded else b_raw[k]
                b_local[k] = local_counts[j]
                b_q[k] = 1.0 if e == a else q[e]
                b_deg[k] = degree[j]
                if key.shape[0] > 0:
                    b_key[k] = key[r, e]
                if given is not None:
                    if given.shape[0] > 0:
                        b_given[k] = given[r, e]
                if ev is not None:
                    b_min_age[k] = 0
                    # +guard's evidence: the content last seen over this slot
                    if ev.shape[0] > 0 and c and e != a:
                        if ev[0, e] == versions[j]:
                            b_min_age[k] = t - ev[1, e]
                        else:
                            ev[0, e] = versions[j]
                            ev[1, e] = t
                if c and e != a:
                    n_nb += 1
                k += 1
            n_clamped = 0
            if defend is not None:
                n_clamped = _defend_claims(defend, defence, margin, kappa, t, k, b_age, b_raw,
                                           b_count, b_min_age, b_w, b_lag, rounded)
            x = Candidates(t, u[r, i] if use_u else 0.5, b_age[:k], b_lag[:k], b_count[:k],
                           b_local[:k], b_q[:k], b_deg[:k], b_key[:k], b_given[:k])
            wk = b_w[:k]
            # after a failure, no more scoring (and no early return: its clean-up code
            # would compile slower)
            if failed == 0 and _weights(score, x, params, c_self, ipw, adopts[i], wk) != 0:
                failed = 1 + r * n + i
            if defend is not None:
                _defend_weights(defend, defence, margin, kappa, t, k, b_age, b_raw, b_count,
                                b_min_age, wk, adopts[i])
            for d in range(k):
                e = b_slot[d]
                wr[e] = wk[d]
                b_cand[d] = cand[e]
                b_att[d] = False
                if marks is not None:
                    if marks.shape[0] > 0 and d > 0 and marks[0, send[e]]:
                        b_att[d] = True
            # the staleness update of an adopter (docs/concepts/staleness.md#the-staleness-state), facts (docs/concepts/replay.md#model-free-analyses)
            if adopts[i]:
                new_age[i], new_lag[i], new_count[i] = _settle(
                    trained, k, b_age, b_raw, b_count, wk, b_cand, b_att, fr[i])
            else:
                _settle(trained, k, b_age, b_raw, b_count, wk, b_cand, b_att, fr[i])
            _update_q(q, a, b, cand)
            fr[i, F_ADOPT] = 1.0 if adopts[i] else 0.0
            fr[i, F_NB] = n_nb
            fr[i, F_SELF_W] = wr[a]
            fr[i, F_CLAMPED] = n_clamped
        _next_round(indptr, train, adopts, wr, marks, ev, st, lags, new_age, new_lag,
                    new_count)
    return failed


@njit(inline="always")
def _sample(curve, s, samples, until, ages, lags):  # pragma: no cover - compiled
    """The mean age and lag into curve [2, S] at the samples from ``s`` up to time ``until``
    (every one left if ``until`` is None); returns the next sample's index."""
    while s < samples.shape[0] and (until is None or samples[s] <= until):
        curve[0, s] = np.mean(ages)
        curve[1, s] = np.mean(lags)
        s += 1
    return s


def _events(score, params, c_self, ipw, rounded, defence, margin, kappa, indptr, send, times,
            kind, dev, tt, amount, cptr, cslot, cmsg, cwait, u, key, st, lags, q, hdr, hdr_lag,
            w, facts, marks, forge, rnd, samples, curve, order, given, caps, track_q, defend,
            ev):  # pragma: no cover
    """The virtual clock's events in order (docs/concepts/clock.md#the-virtual-clock), one receiver each, through the round's
    own parts: the rule (``score``), :func:`_weights`, the defences, :func:`_settle` (the
    staleness update) and :func:`_update_q`. Returns 0, or 1 + r for the first event r whose
    rule raised.

    kind [R]: 0 a local round of dev[r] at times[r] (aggregate, train K steps, send; the
    schedule holds only rounds that completed), 1 an offline span of amount[r] staleness
    units (lag + amount, age + ⌊amount⌋). tt [R]: the receiver's round index t as the rule
    sees it (its own clock). cptr [R+1], cslot / cmsg / cwait [C]: a local round's
    candidates, the receiver first (its own slot; cmsg −1), then one message per neighbour:
    the slot it arrives over, the local round that sent it (an earlier event) and the units
    it waited (counted as older: age + ⌊d⌋, lag + d, counts unchanged). u [R], key [C]: a
    random rule's draws, or [0].

    State, in place: st [4, N] int64 (ages, counts, local counts, content versions), lags
    [N], q [E] (q̂ per slot). hdr [5, R] int64 (age, count, local count, candidates heard,
    version) and hdr_lag [R]: the header each local round sends (written here; read by the
    candidates of later rounds). Out: w [C] weights, facts [R, F] (:data:`FACTS`, on the
    state before the event), curve [2, S] the mean age and lag at the times samples [S].

    order [R'] (the events to run, in this order), given [C] or [0], caps [R] or [0] and
    ``track_q``: as :func:`run_events` says.

    Attacks: marks [2, N] attackers and senders whose content never changes; ``forge`` the
    code of the attackers' claim on what they send (:data:`CLAIM_CODE`;
    :func:`forged_claim`, with the largest count among its candidates as
    what it heard and, for ``random``, the event's draws rnd [3, R]
    (:func:`sfg.round.attacks.random_claims_clock`), else [0, 0]). An attacker knows only
    what it received (its candidates), not its neighbours' state.
    Defences: ``defend`` and ev [2, E] as in :func:`_rounds` (None without them)."""
    (b_slot, b_age, b_lag, b_raw, b_count, b_local, b_q, b_deg, b_key, b_given, b_w,
     b_min_age, b_cand, b_att) = _buffers(_kmax(indptr))
    cand = np.zeros(send.shape[0], np.bool_)
    ages = st[0]
    s = 0
    failed = 0
    for o in range(order.shape[0]):
        r = order[o]
        if s < samples.shape[0] and samples[s] <= times[r]:
            s = _sample(curve, s, samples, times[r], ages, lags)
        i = dev[r]
        t = tt[r]
        fr = facts[r]
        for f in range(fr.shape[0]):
            fr[f] = 0.0
        fr[F_AGE] = ages[i]
        fr[F_LAG] = lags[i]
        fr[F_MAX_NB_AGE] = -1.0
        fr[F_SELF_W] = 1.0
        fr[F_HONEST] = 0.0 if marks[0, i] else 1.0
        if kind[r] == 1:
            lags[i] += amount[r]
            ages[i] += np.int64(np.floor(amount[r]))
            continue
        a = indptr[i]
        b = indptr[i + 1]
        if track_q:
            for e in range(a, b):
                cand[e] = False
        p0 = cptr[r]
        k = cptr[r + 1] - p0
        for d in range(k):
            c = p0 + d
            e = cslot[c]
            cand[e] = True
            b_slot[d] = e
            if d == 0:
                b_age[d] = ages[i]
                b_raw[d] = lags[i]
                b_count[d] = st[1, i]
                b_local[d] = st[2, i]
                b_deg[d] = k - 1
                b_q[d] = 1.0
                b_att[d] = False
            else:
                m = cmsg[c]
                dd = cwait[c]
                b_age[d], b_raw[d] = waited(hdr[0, m], hdr_lag[m], dd)
                b_count[d] = hdr[1, m]
                b_local[d] = hdr[2, m]
                b_deg[d] = hdr[3, m]
                b_q[d] = q[e]
                b_att[d] = marks[0, send[e]]
                if ev is not None:
                    b_min_age[d] = 0
                    # +guard's evidence: the content last seen over this slot
                    if ev.shape[0] > 0:
                        if ev[0, e] == hdr[4, m]:
                            b_min_age[d] = t - ev[1, e]
                        else:
                            ev[0, e] = hdr[4, m]
                            ev[1, e] = t
            b_lag[d] = np.rint(b_raw[d]) if rounded else b_raw[d]
            if key.shape[0] > 0:
                b_key[d] = key[c]
            if given.shape[0] > 0:
                b_given[d] = given[c]
        n_clamped = 0
        if defend is not None:
            n_clamped = _defend_claims(defend, defence, margin, kappa, t, k, b_age, b_raw,
                                       b_count, b_min_age, b_w, b_lag, rounded)
        x = Candidates(t, u[r] if u.shape[0] > 0 else 0.5, b_age[:k], b_lag[:k], b_count[:k],
                       b_local[:k], b_q[:k], b_deg[:k], b_key[:k], b_given[:k])
        wk = b_w[:k]
        mk = caps[r] if caps.shape[0] > 0 else EV_ALL
        trains = (mk & EV_TRAIN) != 0
        adopts = (mk & EV_AGGREGATE) != 0
        if failed == 0 and _weights(score, x, params, c_self, ipw, adopts, wk) != 0:
            failed = 1 + r
        if defend is not None:
            _defend_weights(defend, defence, margin, kappa, t, k, b_age, b_raw, b_count,
                            b_min_age, wk, True)
        heard = 0
        for d in range(k):
            w[p0 + d] = wk[d]
            if b_count[d] > heard:
                heard = b_count[d]
        na, nl, nc = _settle(trains, k, b_age, b_raw, b_count, wk, b_cand, b_att, fr)
        if adopts:
            if track_q:
                _update_q(q, a, b, cand)
            fr[F_ADOPT] = 1.0
            fr[F_NB] = k - 1
            fr[F_SELF_W] = wk[0]
        fr[F_CLAMPED] = n_clamped
        ages[i] = na
        lags[i] = nl
        st[1, i] = nc
        if trains:
            st[2, i] += 1
        if not marks[1, i] and (trains or wk[0] < 1.0):
            st[3, i] += 1
        hdr[0, r] = na
        hdr[1, r] = nc
        hdr[2, r] = st[2, i]
        hdr[3, r] = k - 1
        hdr[4, r] = st[3, i]
        hdr_lag[r] = nl
        if forge != HONEST and marks[0, i]:
            ra, rl, rc = 0.0, 0.0, 0.0
            if forge == RANDOM:
                ra, rl, rc = rnd[0, r], rnd[1, r], rnd[2, r]
            hdr[0, r], hdr_lag[r], hdr[1, r] = forged_claim(forge, t, heard, na, nl, nc, ra,
                                                            rl, rc)
    _sample(curve, s, samples, None, ages, lags)
    return failed


def _one(score, params, t, u, age, lag, count, local, q, deg, key, given, c_self, ipw, adopt,
         w):  # pragma: no cover - compiled once, for every rule
    """One receiver's weights (:func:`_weights`) on the given candidates (index 0 = the
    receiver), written to ``w`` [k]; returns 0, or 1 if the rule raised."""
    x = Candidates(t, u, age, lag, count, local, q, deg, key, given)
    return _weights(score, x, params, c_self, ipw, adopt, w)


def _score(x, params, out):  # pragma: no cover - compiled per rule
    """The rule's scores of one receiver, written to ``out`` [k]; returns 1 (the round calls
    this through numba's C wrapper, which returns 0 instead if the rule raises).
    ``call_rule`` is bound per rule by :func:`scorer`."""
    h = call_rule(x, params)  # type: ignore[name-defined]  # noqa: F821 - bound per rule by scorer()
    for d in range(out.shape[0]):
        out[d] = h[d]
    return 1


def _given(x):  # pragma: no cover - compiled
    """Scores computed outside the round (model-reading rules, oracles)."""
    return x.given


given_scores = njit(cache=True)(_given)
_KERNELS: dict[object, object] = {}
_GENERIC: dict[object, object] = {}
_LOCK = threading.Lock()


def _generic(name):
    """The round's rule-independent compiled parts, one signature each (see :func:`_types`),
    compiled (or loaded from numba's cache) on first use: ``("round", outside, defended)``
    is :func:`_rounds` for that signature, ``"one"`` is :func:`_one`."""
    got = _GENERIC.get(name)
    if got is None:
        with _LOCK:
            got = _GENERIC.get(name)
            if got is None:
                fn = {"one": _one, "round": _rounds, "events": _events}[
                    name if isinstance(name, str) else name[0]]
                sig: Any = _types()[name]  # a numba signature
                got = njit(sig, cache=True, nogil=True)(fn)
                _GENERIC[name] = got
    return got


def _specialise(fn: Any, tag: str, **bind: Any) -> Any:
    """A copy of ``fn`` named ``fn__tag`` with ``bind`` as its globals, compiled for the score
    signature: called from compiled code only, so without a Python wrapper (which would
    unbox the candidates' ten arrays: about a third of a rule's compile time)."""
    g = dict(fn.__globals__)
    g.update(bind)
    f = types.FunctionType(fn.__code__, g, f"{fn.__name__}__{tag}")
    f.__qualname__ = f.__name__
    f.__doc__ = fn.__doc__
    sig = _types()["score"].signature  # type: ignore[attr-defined]  # a numba FunctionType
    # numba's stubs do not list no_cpython_wrapper, which njit accepts
    return njit(sig, cache=True, nogil=True, no_cpython_wrapper=True)(f)  # type: ignore[call-overload]


def _rule_call(fn):
    """``call_rule(x, params)`` = ``fn(x, params[0], …)`` with the parameters spelled out, the
    rule inlined into it (numba inlines no call with ``*args``); ``fn``: a rule's dispatcher."""
    import inspect

    py = getattr(fn, "py_func", None)
    if py is None:
        return fn
    arity = len(inspect.signature(py).parameters) - 1
    args = "".join(f", params[{k}]" for k in range(arity))
    ns = {"rule": njit(inline="always")(py)}
    exec(f"def call_rule(x, params):\n    return rule(x{args})\n", ns)  # noqa: S102
    return njit(inline="always")(ns["call_rule"])


def scorer(fn):
    """The rule function ``fn`` compiled as the round calls it (:func:`_score`, the rule
    inlined; as a first-class function, :func:`sfg.round.compiled.first_class`), cached on disk
    under a name that includes the rule's name and a hash of its source
    (:func:`sfg.round.jit.source_digest`: the rule, every helper it calls, the constants they
    read and their source files), so an edit to any of them compiles afresh on the next run;
    loaded from there when present, made once per process. The only compiled code made per
    rule."""
    got = _KERNELS.get(fn)
    if got is None:
        with _LOCK:
            got = _KERNELS.get(fn)
            if got is None:
                from sfg.round.jit import materialise, source_digest

                py = getattr(fn, "py_func", fn)
                disp = materialise(fn)
                digest = source_digest(fn)
                name = re.sub(r"\W", "_", f"{py.__module__}_{py.__qualname__}")
                try:
                    got = first_class(_specialise(_score, f"{name}_{digest}",
                                                  call_rule=_rule_call(disp)),
                                      _types()["score"].signature)  # type: ignore[attr-defined]
                except Exception as e:
                    from numba.core.errors import NumbaError

                    if isinstance(e, NumbaError):
                        raise compile_error(fn, e) from None
                    raise
                _KERNELS[fn] = got
    return got


def compile_error(fn: Any, e: BaseException) -> SfgError:
    """A rule function that numba cannot compile, as one line: the rule's name, its file and
    line, what numba found wrong and the fields a candidate has (docs/howto/add-rule.md)."""
    from sfg.round.rules import RULES

    py = getattr(fn, "py_func", fn)
    names = [n for n in RULES.names() if RULES.entry(n).factory is fn]
    who = repr(names[0]) if names else py.__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    where = re.findall(r" at (\S+) \((\d+)\)", text)
    path, line = where[-1] if where else (py.__code__.co_filename, py.__code__.co_firstlineno)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    what = next((ln for ln in lines if not ln.startswith(("Failed in", "File ", "During:"))),
                lines[0] if lines else type(e).__name__)
    what = re.sub(r" of type Candidates\(.*\)$", " of the candidates x", what)
    return SfgError(f"rule {who} ({path}:{line}) does not compile: {what}; a rule reads the "
                    f"candidates' fields {', '.join(f'x.{f}' for f in Candidates._fields[:-1])} "
                    "and returns a score per candidate")


class RuleError(SfgError):
    """A rule's compiled function raised while the round scored a receiver."""


def _raise_rule_error(fn: Any, status: int, t0: int, n: int) -> None:
    r, i = divmod(int(status) - 1, max(n, 1))
    name = getattr(getattr(fn, "py_func", fn), "__qualname__", str(fn))
    raise RuleError(f"the rule function {name} raised while scoring receiver {i} in round "
                    f"{t0 + r} (the exception is printed above; to see where, call the "
                    "function in Python, e.g. through Rule.weights_one, on those candidates)")


def run_rounds(fn: Any, params: Any, t0: int, c_self: float, ipw: bool, rounded: bool,
               defence: int, margin: float, kappa: float, rg: RoundGraph, caps: np.ndarray,
               live: np.ndarray, u: np.ndarray, key: np.ndarray, st: np.ndarray,
               lags: np.ndarray, q: np.ndarray, w: np.ndarray, cand: np.ndarray,
               facts: np.ndarray, outside: tuple | None = None,
               ev: np.ndarray | None = None) -> None:
    """:func:`_rounds` (the compiled round, once for every rule) with the rule function ``fn``
    (:func:`scorer`); arguments as there, the graph as ``rg``. ``outside``: None or
    (given, claim_ic, claim_lag, extra, marks); ``ev``: the ``+guard`` evidence (None without
    ``+guard``). The state (st, lags, q, ev) and outputs (w, cand, facts) are updated in
    place: C-contiguous arrays of the signature's types. Raises :class:`RuleError` if the
    rule raised."""
    bound_rounds(fn, params, c_self, ipw, rounded, defence, margin, kappa, rg, caps, live, u,
                 key, st, lags, q, w, cand, facts, outside=outside, ev=ev, copy_ok=True)(t0)


def bound_rounds(fn: Any, params: Any, c_self: float, ipw: bool, rounded: bool, defence: int,
                 margin: float, kappa: float, rg: RoundGraph, caps: np.ndarray,
                 live: np.ndarray, u: np.ndarray, key: np.ndarray, st: np.ndarray,
                 lags: np.ndarray, q: np.ndarray, w: np.ndarray, cand: np.ndarray,
                 facts: np.ndarray, outside: tuple | None = None,
                 ev: np.ndarray | None = None, copy_ok: bool = False) -> Any:
    """:func:`run_rounds`' arguments less ``t0``, prepared once: returns ``step(t0)``, which
    runs the compiled round on these very arrays. For a caller that plays many rounds on the
    same buffers, rewriting them in place between steps (a node's star,
    :class:`sfg.net.checkpoints.Star`): the per-call set-up is paid once. The input arrays
    must already be C-contiguous of the signature's types (``copy_ok`` False: a ValueError
    otherwise, since a converted copy would not see the caller's later writes)."""
    defended = bool(defence & (GUARD | RELATIVE | CAP))
    rest = (None,) * 5 if outside is None else outside
    if defended:
        from sfg.round.defences import defend

        rest = (*rest, defend(), NONE_I if ev is None else ev)
    else:
        rest = (*rest, None, None)
    kern = _generic(("round", outside is not None, defended))
    ins = []
    for a, dt in ((params, np.float64), (rg.indptr, np.int64), (rg.send, np.int64),
                  (rg.edge_id, np.int64), (caps, np.bool_), (live, np.bool_), (u, np.float64),
                  (key, np.float64)):
        got = _c(a, dt)
        if got is not a and not copy_ok and isinstance(a, np.ndarray) and a is not params:
            raise ValueError("bound_rounds needs C-contiguous, writeable inputs of the "
                             "signature's types (a converted copy would not see later writes)")
        ins.append(got)
    p, indptr, send, edge_id, caps_c, live_c, u_c, key_c = ins
    head = (scorer(fn), p)
    mid = (float(c_self), bool(ipw), bool(rounded), int(defence), float(margin), float(kappa),
           indptr, send, edge_id, caps_c, live_c, u_c, key_c, st, lags, q, w, cand, facts,
           *rest)
    n = rg.n

    def step(t0: int) -> None:
        status = kern(*head, int(t0), *mid)
        if status:
            _raise_rule_error(fn, status, t0, n)

    return step


def run_events(rule: Rule, rg: RoundGraph, *, times: np.ndarray, kind: np.ndarray,
               dev: np.ndarray, tt: np.ndarray, amount: np.ndarray, cptr: np.ndarray,
               cslot: np.ndarray, cmsg: np.ndarray, cwait: np.ndarray, u: np.ndarray,
               key: np.ndarray, st: np.ndarray, lags: np.ndarray, q: np.ndarray,
               hdr: np.ndarray, hdr_lag: np.ndarray, w: np.ndarray, facts: np.ndarray,
               marks: np.ndarray, forge: int, rnd: np.ndarray, samples: np.ndarray,
               curve: np.ndarray, ev: np.ndarray | None = None,
               order: np.ndarray | None = None, given: np.ndarray | None = None,
               caps: np.ndarray | None = None, track_q: bool = True) -> None:
    """:func:`_events` (the virtual clock's events, compiled once for every rule) with
    ``rule``'s compiled function, modifiers and defences; arguments as there, and:

    order [R']: the events to run, in this order (None: all of them in time order; or — for
    rules whose scores are computed from models between the calls — one batch of a
    dependency level: every event only reads state that earlier events of its device and
    its messages' sending events wrote, so any order that keeps those before it gives the
    same results; the sampled curves need time order and all events). given [C]: the
    candidates' scores computed outside, for rules that read models or global information
    (the rule's modifiers and defences still apply). caps [R] (None: all capabilities): a
    local round's capabilities under an anatomy mode (docs/concepts/outages.md#anatomy-modes;
    bits :data:`EV_TRAIN`, :data:`EV_SEND`, :data:`EV_AGGREGATE`): one that does not
    aggregate has only itself as candidate and keeps its model (weight 1, q̂ unchanged), one
    that does not train settles as untrained (age + 1, lag + 1 when alone). ``track_q``
    False: q̂ is not updated (it stays as given; for rules that do not read it, when every
    update would cost a pass over the receiver's slots: the union graph of peers chosen per
    exchange, where the rules that read it are refused).

    The state (st, lags, q, hdr, hdr_lag, ev) and outputs (w, facts, curve) are updated in
    place. Raises :class:`RuleError` if the rule raised."""
    if given is None and (not rule.compiled or rule.oracle or rule.reads_models):
        raise SfgError(f"rule {rule.name!r} reads models or global information: its scores "
                       "are computed outside the events (give them as given=)")
    defence = int(rule.defence_flags)
    defended = bool(defence & (GUARD | RELATIVE | CAP))
    if defended:
        from sfg.round.defences import TIMED, defend

        defence |= TIMED  # on the clock, counts grow by local rounds, not by rounds
        rest: tuple = (defend(), NONE_I if ev is None else ev)
    else:
        rest = (None, None)
    kern = _generic(("events", defended))
    fn, params = (rule.fn, rule.args) if given is None else (given_scores, ())
    order = np.arange(kind.shape[0], dtype=np.int64) if order is None else order
    status = kern(scorer(fn), _c(params, np.float64), float(rule.self_weight),
                  bool(rule.ipw), bool(rule.rounded), defence, float(rule.margin),
                  float(rule.kappa), _c(rg.indptr, np.int64), _c(rg.send, np.int64),
                  _c(times, np.float64), _c(kind, np.int64), _c(dev, np.int64),
                  _c(tt, np.int64), _c(amount, np.float64), _c(cptr, np.int64),
                  _c(cslot, np.int64), _c(cmsg, np.int64), _c(cwait, np.float64),
                  _c(u, np.float64), _c(key, np.float64), st, lags, q, hdr, hdr_lag, w, facts,
                  _c(marks, np.bool_), int(forge), _c(rnd, np.float64), _c(samples, np.float64),
                  curve, _c(order, np.int64), EMPTY_F if given is None else _c(given, np.float64),
                  EMPTY_I if caps is None else _c(caps, np.int64), bool(track_q), *rest)
    if status:
        r = int(status) - 1
        name = getattr(getattr(fn, "py_func", fn), "__qualname__", str(fn))
        raise RuleError(f"the rule function {name} raised while scoring the local round "
                        f"{r} of the virtual clock (device {int(dev[r])}, round {int(tt[r])})")


# ----------------------------------------------------------------------------- Python side
def caps_at(caps: Capabilities, t: int) -> Capabilities:
    """Round ``t``'s capabilities ([N] each) out of whole-trace capabilities ([T, N] each)."""
    return Capabilities(caps.train[t], caps.send[t], caps.aggregate[t], caps.adopt[t])


def candidate_mask(rg: RoundGraph, caps: Capabilities, live: np.ndarray | None = None) -> np.ndarray:
    """S_i^t as a slot mask, for callers that score before the round (model-reading rules,
    oracles): {i} ∪ {j ∈ N(i): j sends and link (i, j) is live}, for receivers that aggregate.
    The same set as the round's own (tested)."""
    nb = caps.send[rg.send]
    if live is not None and live.size:
        nb = nb & live[np.maximum(rg.edge_id, 0)]
    return caps.aggregate[rg.recv] & (rg.is_self | nb)


def rule_draws(seed: int, t: int, n: int, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A random rule's own draws of round ``t``: one uniform per client ([n]) and one key
    per slot ([n_slots]), from the stream keyed by the seed and the round."""
    g = stream(seed, "rule-draws", t)
    return g.random(n), g.random(n_slots)


@dataclass(frozen=True)
class RoundResult:
    """What one round did.

    weights:   [E] float64 slot weights (rows sum to 1; identity rows for non-adopters)
    candidate: [E] bool    slots in S_i^t (empty rows for clients that do not aggregate)
    state:     the staleness state after the round (docs/concepts/staleness.md#the-staleness-state)
    facts:     [N, len(FACTS)] float64 per-receiver facts on the state before the round
    """

    weights: np.ndarray
    candidate: np.ndarray
    state: StalenessState
    facts: np.ndarray


def play_round(rule: Rule, rg: RoundGraph, state: StalenessState, caps: Capabilities, *, seed: int,
               live: np.ndarray | None = None, scores: np.ndarray | None = None,
               slot_staleness: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               extra: np.ndarray | None = None, weights_out: np.ndarray | None = None,
               facts_out: np.ndarray | None = None, attackers: np.ndarray | None = None,
               frozen: np.ndarray | None = None, weights_given: bool = False) -> RoundResult:
    """Round ``state.t`` of ``rule`` (a :class:`~sfg.round.rules.Rule`): weights and the next state.

    caps: this round's capabilities ([N] each); live: [M] bool link states or None.
    scores: [E] scores computed outside the round (model-reading rules); oracle rules get
    theirs from A here. slot_staleness: (ages, lags, counts) [E] delivered per slot and
    extra [E] bool additional candidate slots (remembered models). weights_out [E] and
    facts_out [N, F] receive the results in place when given.

    Attacks (:mod:`sfg.round.attacks`): forged claims come in as ``slot_staleness`` (what each slot
    delivers; the senders' true state stays in ``state``); ``attackers`` [N] bool marks them for
    the damage facts; ``frozen`` [N] bool marks senders whose model content never changes
    (evidence of ``+guard``). The rule's defences (:mod:`sfg.round.defences`) run inside the round.
    ``weights_given``: ``scores`` are the weights as used (:data:`WEIGHTS_GIVEN`), not scores."""
    fn: Any
    if rule.oracle:
        assert rule.fn is not None  # an oracle's numpy function
        cand = candidate_mask(rg, caps, live)
        scores = rule.fn(rg.indptr, rg.send, cand, state.missed, **{
            k: v for k, v in rule.params.items() if k != "c"})
    if scores is not None:
        fn, params = given_scores, EMPTY_F
    else:
        fn, params = rule.fn, np.array(rule.args, np.float64)
    n, E = rg.n, rg.n_slots
    u = key = NONE_F
    if rule.random:
        u, key = (a.reshape(1, -1) for a in rule_draws(seed, state.t, n, E))
    st = np.stack([state.ages, state.counts, state.local_counts,
                   state.versions if state.versions is not None else np.zeros(n, np.int64)]
                  ).astype(np.int64, copy=False)
    lags, q = _c(state.lags, np.float64).copy(), _c(state.q_hat, np.float64).copy()
    w = np.empty(E) if weights_out is None else weights_out
    cand = np.empty(E, bool)
    facts = np.empty((n, len(FACTS))) if facts_out is None else facts_out
    w_run, f_run = (a if (a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable)
                    else np.empty(a.shape) for a in (w, facts))
    outside = None  # the inputs from outside the round, when there are any
    if (scores is not None or slot_staleness is not None or extra is not None
            or attackers is not None or frozen is not None):
        marks = NONE_B
        if attackers is not None or frozen is not None:
            marks = np.zeros((2, n), bool)
            for row, a in enumerate((attackers, frozen)):
                if a is not None:
                    marks[row] = a
        outside = (NONE_F if scores is None else _c(scores, np.float64).reshape(1, -1),
                   *((NONE_I, EMPTY_F) if slot_staleness is None else (
                       _c(np.stack([slot_staleness[0], slot_staleness[2]]), np.int64),
                       _c(slot_staleness[1], np.float64))),
                   EMPTY_B if extra is None else _c(extra, bool), marks)
    defence = rule.defence_flags
    versions = evidence = None
    if defence & GUARD:
        evidence = (np.full((2, E), -1, np.int64) if state.evidence is None
                    else _c(state.evidence, np.int64).copy())
    caps_r = np.stack([caps.train, caps.send, caps.aggregate, caps.adopt]).astype(
        bool, copy=False).reshape(4, 1, n)
    run_rounds(fn, params, state.t,
               WEIGHTS_GIVEN if weights_given else float(rule.self_weight),
               bool(rule.ipw) and not weights_given,
               bool(rule.rounded), int(defence), float(rule.margin), float(rule.kappa), rg,
               caps_r, NONE_B if live is None else _c(live, bool).reshape(1, -1), u, key, st,
               lags, q, w_run.reshape(1, E), cand, f_run.reshape(1, n, len(FACTS)),
               outside=outside, ev=evidence)
    for out, got in ((w, w_run), (facts, f_run)):
        if got is not out:
            out[...] = got
    if defence & GUARD:
        versions = st[3]
    ages, counts, local_counts = st[0], st[1], st[2]
    missed = state.missed
    if missed is not None:
        from sfg.round.rules.oracles import advance_missed

        missed = advance_missed(missed, state.t, rg.indptr, rg.send, w, caps.adopt, caps.train)
    nxt = replace(state, t=state.t + 1, ages=ages, lags=lags, counts=counts,
                  local_counts=local_counts, q_hat=q, missed=missed,
                  versions=versions if versions is not None else state.versions,
                  evidence=evidence if evidence is not None else state.evidence)
    return RoundResult(weights=w, candidate=cand, state=nxt, facts=facts)


_KEYS: dict[int, np.ndarray] = {}


def _default_keys(k: int) -> np.ndarray:
    """linspace(0, 1, k), a fresh copy of one made once per k (linspace's own set-up costs
    more than the rest of a small receiver's weights)."""
    got = _KEYS.get(k)
    if got is None:
        got = _KEYS[k] = np.linspace(0, 1, k)
    return got.copy()


def one_receiver(rule: Rule, *, ages: ArrayLike, lags: ArrayLike | None = None,
                 counts: ArrayLike | None = None, local_counts: ArrayLike | None = None,
                 q_hat: ArrayLike | None = None, t: int | None = None, u: float = 0.5,
                 keys: ArrayLike | None = None, degrees: ArrayLike | None = None,
                 missed: ArrayLike | None = None) -> np.ndarray:
    """One receiver's weights over its candidates (index 0 = the receiver): the round's own
    compiled weights (:func:`_weights`) on the given candidates. See ``Rule.weights_one``."""
    from sfg.errors import SfgError

    age = np.ascontiguousarray(np.asarray(ages, dtype=np.int64).reshape(-1))
    k = age.shape[0]
    if k < 1:
        raise SfgError("a receiver needs at least itself as a candidate (index 0)")

    def arr(v, dtype):  # a fresh, C-contiguous copy (np.array copies lists and arrays)
        return np.array(v, dtype).reshape(-1)

    raw = age.astype(np.float64) if lags is None else arr(lags, np.float64)
    count = np.ones(k, np.int64) if counts is None else arr(counts, np.int64)
    local = count if local_counts is None else arr(local_counts, np.int64)
    q = np.ones(k) if q_hat is None else arr(q_hat, np.float64)
    key = _default_keys(k) if keys is None else arr(keys, np.float64)
    if degrees is None:
        deg = np.ones(k, np.int64)
        deg[0] = k - 1
    else:
        deg = arr(degrees, np.int64)
    for name, a in (("lags", raw), ("counts", count), ("local_counts", local), ("q_hat", q),
                    ("keys", key), ("degrees", deg)):
        if a.shape[0] != k:
            raise SfgError(f"{name} has {a.shape[0]} entries but ages has {k}; give one per candidate")
    q[0] = 1.0
    if t is None:
        t = int(np.ceil(raw.max())) if k else 0
    lag = np.rint(raw) if rule.rounded else raw
    given = np.ones(k)
    fn: Any = rule.fn
    params = rule.args if rule.compiled else ()
    if rule.oracle:
        assert fn is not None  # an oracle's numpy function
        if missed is None:
            raise SfgError(f"rule {rule.name!r} is an oracle: give missed=[k, T] rows of A")
        given = fn(np.array([0, k]), np.arange(k), np.ones(k, bool),
                        np.asarray(missed, np.float64),
                        **{kk: v for kk, v in rule.params.items() if kk != "c"})
        fn = given_scores
    defence = rule.defence_flags
    if defence:  # claims clamped as in the round (no evidence history here)
        age, raw, count = age.copy(), raw.copy(), count.copy()
        clamp_claims(int(t), defence, rule.margin, k, age, raw, count, np.zeros(k, np.int64))
        lag = np.rint(raw) if rule.rounded else raw
    w = np.empty(k)
    status = _generic("one")(scorer(fn), np.array(params, np.float64), int(t), float(u), age,
                             _c(lag, np.float64), count, local, q, deg, key,
                             _c(given, np.float64), float(rule.self_weight), bool(rule.ipw),
                             True, w)
    if status:
        _raise_rule_error(fn, status, int(t), 1)
    if defence & CAP:
        cap_weights(w, rule.kappa)
    return w
