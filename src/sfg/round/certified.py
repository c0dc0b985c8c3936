"""Certified claims, modelled in rounds (``+certified``).

The certified protocol this models: every header is signed by its sender and stamped with
its round; a claim carries its *provenance* — the signed headers of the previous round it
merged (by digest), with its weights and whether it trained — so a receiver can recompute it;
and every message carries the sender's signed *heard-set* of the previous round (the
neighbours whose messages it aggregated), an absence witness. A receiver refuses (excludes
from its aggregation, as a lost message) a claim that its evidence refutes:

* **provenance**: the claim must be the staleness update (docs/concepts/staleness.md#the-staleness-state) of the sender's sources — its *prior*
  (its state at the start of the previous round: the claim it delivered to this receiver
  then, if the receiver got it and did not refuse it; else the prior it cites, which only
  it signs) and, if it aggregated then, the claims its candidates delivered —
  trained (age 0, lag within the sources' lags, count one more than a source's count) or
  not (age one more than a source's, lag one more than within their lags, count a source's).
  The model checks the hull (lags between the sources' smallest and largest, counts between
  theirs), which every honest claim satisfies; a lie inside the hull passes, so the measured
  refutations are a lower bound of what the exact recomputation gives.
* **absence witness**: a claim that can only be a trained one ("I trained in the previous
  round") is refuted when the receiver itself, or one of its candidates of this round that
  is a neighbour of the sender, aggregated in the previous round and did not hear the
  sender: an online client sends to every neighbour, so it was offline and could not train.

What is certified and what is not: honest claims are never refused when links do not fail
(the conformance tests, bit for bit, every model-free rule, anatomy modes full and
cannot-train-*); a failed link makes an honest sender look absent, so with
``link_failure`` > 0 honest claims can be refused (measured, not hidden); under
``cannot-communicate`` a client trains while offline without sending, so the witness is off
there. Witnesses report what they heard: colluding liars that lie about their heard-sets
are not modelled. A liar that stays inside its sources' hull (``claim=certified``, the best
response below) is not refuted by provenance, only by witnesses when it slept.

The adversary ``claim=certified`` (:func:`best_claims`) makes the most damaging claim it can
back: awake in the previous round, a trained claim with the smallest lag and the largest
count of its sources (+1); asleep, "trained alone" from its prior — which only a witness
refutes. Its prior per receiver is what it told that receiver (so accepted lies compound
inside the hull's slack); it cannot tell which of its claims were refused, so a refused lie
can get its next claim refused too. With ``knowledge=rushing`` it knows the refusals and
each receiver's witnesses, and claims the truth where it would be refuted.

A sender asleep in the previous round delivered nothing then, so its cited prior is
self-signed: it is refuted only through the chain of claims (a receiver that heard it before
knows what it said). Sfg's liars cite their true prior; one that cites an invented prior
after sleeping is not modelled.
"""

from __future__ import annotations

import numpy as np

from sfg.errors import SfgError

_TOL = 1e-9


class Evidence:
    """What the certified protocol lets receivers check, kept round by round: the previous
    round's candidate slots (the signed heard-sets), the claims each slot delivered then,
    and who aggregated. ``witness``: the absence witness is on (off under
    ``cannot-communicate``, where a client trains offline without sending)."""

    def __init__(self, rg, *, anatomy: str = "full"):
        self.rg = rg
        self.witness = anatomy != "cannot-communicate"
        E, n = rg.n_slots, rg.n
        self.cand = np.zeros(E, bool)
        self.aggregated = np.zeros(n, bool)
        self.age = np.zeros(E, np.int64)
        self.lag = np.zeros(E)
        self.count = np.ones(E, np.int64)
        self.first = True  # before round 0: the initial models (age 0, lag 0, count 1)
        # the slots refused in the latest checked round (set by refuted, read by the next
        # round's priors: a refused claim is not what its receiver knows of the sender)
        self._refused_last = np.zeros(E, bool)
        self.refused = 0
        self.candidates = 0
        # pairs (slot e = j → i, slot f = k → i, slot g = j → k) over triangles i, j, k: k is a
        # candidate of i that could witness j's absence (the graph is fixed: built once)
        self._pairs = _witness_pairs(rg)

    # ---------------------------------------------------------------- sources
    def own(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each client's (age, lag, count) [N] at the start of the previous round (what its
        self slot delivered then): the prior a sender cites, signed by itself alone."""
        s = self.rg.indptr[:-1]
        return self.age[s], self.lag[s], self.count[s]

    def prior(self, *, knows_refusals: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per slot e = j → i [E]: the sender's state at the start of the previous round as
        receiver i knows it — the claim j delivered to i then, if i received it and did not
        refuse it; otherwise the prior j cites (:meth:`own`). ``knows_refusals=False``: what
        the sender itself can tell (the claims it delivered, refused or not)."""
        rg = self.rg
        heard = self.cand & ~rg.is_self
        if knows_refusals:
            heard &= ~self._refused_last
        o_age, o_lag, o_count = (x[rg.send] for x in self.own())
        return (np.where(heard, self.age, o_age), np.where(heard, self.lag, o_lag),
                np.where(heard, self.count, o_count))

    def _hull(self, *, knows_refusals: bool = True):
        """Per slot e = j → i [E]: (min age, max age, min lag, max lag, min count, max count)
        over the sources of j's claim — its prior as i knows it (:meth:`prior`) and, if j
        aggregated in the previous round, the claims its candidates delivered to it then."""
        rg = self.rg
        take = self.cand & self.aggregated[rg.recv] & ~rg.is_self
        rows = rg.indptr[:-1]
        big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        p_age, p_lag, p_count = self.prior(knows_refusals=knows_refusals)

        def red(op, vals, fill, prior):
            v = np.where(take, vals, fill)
            return op(op.reduceat(v, rows)[rg.send], prior)

        return (red(np.minimum, self.age, big, p_age), red(np.maximum, self.age, small, p_age),
                red(np.minimum, self.lag, np.inf, p_lag),
                red(np.maximum, self.lag, -np.inf, p_lag),
                red(np.minimum, self.count, big, p_count),
                red(np.maximum, self.count, small, p_count))

    # ---------------------------------------------------------------- checks
    def refuted(self, delivered: tuple[np.ndarray, np.ndarray, np.ndarray],
                cand_now: np.ndarray) -> np.ndarray:
        """bool [E]: the neighbour slots whose delivered claim (``delivered``: ages, lags,
        counts [E]) the evidence refutes, for the receivers' candidates ``cand_now`` [E] of
        this round (in the first round: any claim but the initial model's age 0, lag 0,
        count 1)."""
        rg = self.rg
        a, lg, c = delivered
        nb = ~rg.is_self & cand_now
        if self.first:
            out = nb & ~((a == 0) & (lg == 0.0) & (c == 1))
            self._refused_last = out
            self.refused += int(np.count_nonzero(out))
            self.candidates += int(np.count_nonzero(nb))
            return out
        out = nb & verdict(a, lg, c, *self._hull(),
                           absent=self.absent(cand_now) if self.witness else None,
                           witness=self.witness)
        self._refused_last = out
        self.refused += int(np.count_nonzero(out))
        self.candidates += int(np.count_nonzero(nb))
        return out

    def screen(self, delivered: tuple[np.ndarray, np.ndarray, np.ndarray],
               cand_now: np.ndarray, live: np.ndarray) -> np.ndarray:
        """The per-slot deliveries ``live`` [E] of this round without the refused claims
        (:meth:`refuted`): a refused message counts as lost."""
        return live & ~self.refuted(delivered, cand_now)

    def absent(self, cand_now: np.ndarray) -> np.ndarray:
        """bool [E]: slots j → i for which i itself, or a candidate k of i this round that
        is a neighbour of j, aggregated in the previous round without hearing j."""
        rg = self.rg
        e, f, g = self._pairs
        k = rg.send[f]
        hit = cand_now[f] & self.aggregated[k] & ~self.cand[g]
        out = ~rg.is_self & self.aggregated[rg.recv] & ~self.cand  # the receiver's own
        out[e[hit]] = True
        return out

    def note(self, candidate: np.ndarray, delivered: tuple[np.ndarray, ...]) -> None:
        """Round done: its candidate slots (the heard-sets) and delivered claims."""
        rg = self.rg
        self.cand = np.asarray(candidate, bool).copy()
        self.aggregated = self.cand[rg.indptr[:-1]] & rg.is_self[rg.indptr[:-1]]
        self.age, self.lag, self.count = (np.asarray(x).copy() for x in delivered)
        self.first = False

    @property
    def refused_share(self) -> float:
        """The share of neighbour candidates refused so far."""
        return self.refused / self.candidates if self.candidates else 0.0


def verdict(a, lg, c, amin, amax, lmin, lmax, cmin, cmax, *, absent, witness: bool):
    """Whether claims (ages ``a``, lags ``lg``, counts ``c``, arrays) are refuted by their
    sources' hull (min/max of the sources' ages, lags and counts, per claim) and, with
    ``witness``, the absence witnesses ``absent`` (bool per claim): a claim must be the staleness
    update (docs/concepts/staleness.md#the-staleness-state) of a source — trained (age 0, lag within the sources' lags, count one more than a
    source's) or not (age one more than a source's, lag one more than within their lags, count
    a source's) — and a claim that can only be a trained one is refuted where the sender was
    absent. The one definition, for the rounds model and the networked nodes
    (:mod:`sfg.net.certify`)."""
    trained = ((a == 0) & (c - 1 >= cmin) & (c - 1 <= cmax)
               & (lg >= lmin - _TOL) & (lg <= lmax + _TOL))
    untrained = ((a - 1 >= amin) & (a - 1 <= amax) & (c >= cmin) & (c <= cmax)
                 & (lg - 1 >= lmin - _TOL) & (lg - 1 <= lmax + _TOL))
    out = ~trained & ~untrained
    if witness:
        out |= trained & ~untrained & absent
    return out


def evidence_for(rule, attack, rg, *, anatomy: str) -> Evidence | None:
    """The certified evidence a round-based run keeps (the replay's and ``sfg run``'s one
    definition): when the rule is ``+certified`` or the attack answers it
    (``claim=certified``); else None."""
    if rule.certified or (attack is not None and attack.claim == "certified"):
        return Evidence(rg, anatomy=anatomy)
    return None


def check_rounds_only(rule, where: str) -> None:
    """``+certified`` is modelled in rounds (the replay, ``sfg run``); refused in ``where``
    with one line."""
    if rule.certified:
        raise SfgError(f"+certified models the certified protocol in rounds (sfg replay and sfg "
                       f"run, the clock's lockstep included) and runs it in the networked "
                       f"lockstep nodes (sfg swarm/node --tls-dir); not yet in {where}: drop "
                       "+certified there (+refute keeps the guard's sound bounds)")


def _witness_pairs(rg) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e, f, g): for every receiver i and two distinct neighbours j, k of i that are
    neighbours of each other, e = slot j → i, f = slot k → i, g = slot j → k."""
    key = rg.recv.astype(np.int64) * rg.n + rg.send
    order = np.argsort(key, kind="stable")
    sk = key[order]
    nb = np.flatnonzero(~rg.is_self)
    recv = rg.recv[nb]
    # all ordered pairs of neighbour slots within a receiver's row
    by = np.argsort(recv, kind="stable")
    nb, recv = nb[by], recv[by]
    starts = np.searchsorted(recv, recv, side="left")
    ends = np.searchsorted(recv, recv, side="right")
    lens = ends - starts
    e = np.repeat(nb, lens)
    pos = np.arange(e.size) - np.repeat(np.cumsum(lens) - lens, lens)
    f = nb[np.repeat(starts, lens) + pos]
    j, k = rg.send[e], rg.send[f]
    want = k.astype(np.int64) * rg.n + j  # slot j → k: receiver k, sender j
    at = np.minimum(np.searchsorted(sk, want), sk.size - 1)
    ok = (j != k) & (sk[at] == want)
    return e[ok], f[ok], order[at[ok]]


def best_claims(attack, rg, state, attackers: np.ndarray, evidence: Evidence | None,
                cand_now: np.ndarray | None, age: np.ndarray, lag: np.ndarray,
                count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``claim=certified``: the best response against ``+certified`` on the attackers'
    slots (see the module docstring), written into ``age``, ``lag``, ``count`` [E]."""
    if evidence is None:
        raise SfgError("attack claim=certified needs the certified evidence of the run "
                       "(it runs in sfg replay and sfg run)")
    forged = attackers[rg.send] & ~rg.is_self
    e = np.flatnonzero(forged)
    j = rg.send[e]
    if evidence.first:  # round 0: nothing to cite but the initial model
        age[e], lag[e], count[e] = 0, 0.0, 1
        return age, lag, count
    # the liar knows the claims it delivered; with the round's knowledge also what was refused
    rushing = attack.knowledge == "rushing"
    amin, amax, lmin, lmax, cmin, cmax = (x[e] for x in evidence._hull(knows_refusals=rushing))
    p_age, p_lag, p_count = (x[e] for x in evidence.prior(knows_refusals=rushing))
    awake = evidence.aggregated[j]
    lag[e] = np.where(awake, lmin, p_lag)
    count[e] = np.where(awake, cmax, p_count) + 1
    age[e] = 0
    if attack.knowledge == "rushing" and cand_now is not None and evidence.witness:
        caught = evidence.absent(cand_now)[e] & ~awake
        t_age, t_lag, t_count = (state.ages[j], state.lags[j], state.counts[j])
        age[e] = np.where(caught, t_age, age[e])
        lag[e] = np.where(caught, t_lag, lag[e])
        count[e] = np.where(caught, t_count, count[e])
    return age, lag, count
