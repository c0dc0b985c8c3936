"""Forged staleness: attack models on the freshness scalars, and their damage (issue: forged
staleness; defences in :mod:`sfg.round.defences`).

Every staleness-aware rule trusts what a sender claims about its own model (age τ, lag ℓ,
max-inherited count n; docs/concepts/staleness.md#the-staleness-state). An attack is a component string::

    forge:frac=0.1,claim=fresh,model=sign-flip,placement=degree,always_on=true

* ``frac`` — fraction of clients that attack (round(frac·N) of them); ``frac=0`` is exactly
  the no-attack run (bit for bit, tested).
* ``claim`` — what an attacker reports on every message:
  ``fresh``: age 0, lag 0, count = the largest count it knows of (its own and its
  neighbours', see ``knowledge``) + 1; ``stale-others`` (timestomping): fresh on send with the count inflated by t + 1 on top,
  which max-inherited counts then carry to clients that never hear the attacker; ``random``
  (honest-but-buggy clocks): age ~ U{0..t}, lag ~ U[0, t], count ~ U{1..t+1} each round;
  ``honest``: the true scalars (only the model is poisoned); ``undercut`` (knows the rule):
  per receiver, a lag just ``gap`` (default 1.01: beyond ``sfg-cut``'s default L = 1) below
  the freshest lag it expects among that receiver's candidates, so that a cut drops every
  other candidate, the receiver included, with an age (≤ the lag) and a count (1 + t − lag at
  least, at most t + 1) that ``+guard``'s bounds accept; ``certified`` (knows the certified
  protocol, :mod:`sfg.round.certified`): the most damaging claim it can back with signed
  provenance — trained, with its sources' smallest lag and largest count, or "trained
  alone" after sleeping, which only an absence witness refutes. The claims that do not
  depend on the receiver are one compiled definition, :func:`sfg.round.kernel.forged_claim`
  (codes :data:`sfg.round.kernel.CLAIM_CODE`), which the rounds (:func:`claims`) and the
  virtual clock's events share.
* ``knowledge`` — what an attacker knows when it forges. ``observed`` (default): only what
  it received — per neighbour, the claim of the last message it got in a round it aggregated
  (:class:`Heard`), so an attacker that slept knows nothing newer; its own state. ``rushing``:
  the omniscient variant, a stronger option — every neighbour's state of this very round,
  offline ones included (for ``undercut``: the receiver's and its honest neighbours' lags).
* ``model`` (training) — what an attacker's messages carry: ``none`` (its honest model),
  ``sign-flip`` (−x), ``noise`` (x + N(0, σ²), ``sigma`` default 1), ``constant`` (its
  initial model, never changing: the +guard evidence sees unchanged content); from its honest
  neighbours' models of the round (:mod:`sfg.sim.attack_train`): ``alie`` ("A little is
  enough", Baruch et al. 2019: μ − z·σ, coordinate-wise mean and standard deviation, ``z``
  default the paper's z_max of N and the number of attackers), ``ipm`` (inner-product
  manipulation, Xie et al. 2020: −ε·μ, ``epsilon`` default 0.1); ``dissensus`` (He et al.
  2022, per receiver i: x_i − ε·Σ_{k honest} w_ik (x_k − x_i) / (the attackers' weight at
  i), ``epsilon`` default 1.5, the authors' setting). These three run in ``sfg run``'s
  rounds only (:func:`check_rounds_only`).
* ``placement`` — ``random`` (drawn from the attack's own stream keyed by the seed) or
  ``degree`` (the highest-degree clients, ties by index).
* ``always_on`` — attackers never go offline (their availability row is set to 1).

Pairing (docs/concepts/training.md#pairing): graph, trace, data and minibatches are keyed by the seed alone; the attack
draws only from its own streams (``attack-placement``, ``attack-claims``, ``attack-noise``),
so honest clients see the same world with and without it. An attacker's own true state
evolves by the round as usual; only what it sends is forged. Honest receivers' bookkeeping
(lag = weighted mean of the lags they used, count = max of the counts they merged) takes the
claims at face value, which is how forged counts spread.

Damage (model-free, recorded by the round as facts and defined once in
:mod:`sfg.modelfree.metrics`): the weight honest receivers give attackers, the share of honest
aggregations whose own model is cut, and the reach: the share of honest clients whose model
carries ≥ 10 % attacker weight at the end of a window of ``h`` rounds (:func:`reach_rounds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sfg.errors import SfgError
from sfg.round.kernel import CLAIM_CODE, RANDOM, forge_slots
from sfg.util.components import did_you_mean, parse_component
from sfg.util.numba_start import njit
from sfg.util.rng import stream

CLAIMS = tuple(CLAIM_CODE)  # the claims' names (their codes: sfg.round.kernel.CLAIM_CODE)
MODELS = ("none", "sign-flip", "noise", "constant", "alie", "ipm", "dissensus")
# attack models read in the round from the honest neighbours' models (sfg.sim.attack_train)
ROUND_MODELS = ("alie", "ipm", "dissensus")
EPSILON = {"ipm": 0.1, "dissensus": 1.5}  # the default ε of the models that take one
PLACEMENTS = ("random", "degree")
KNOWLEDGE = ("observed", "rushing")
REACH_LEVEL = 0.1
_KEYS = {"frac", "claim", "model", "placement", "always_on", "sigma", "knowledge", "gap", "z",
         "epsilon"}


@dataclass(frozen=True)
class Attack:
    """A parsed attack (see the module docstring)."""

    frac: float = 0.0
    claim: str = "fresh"
    model: str = "none"
    placement: str = "random"
    always_on: bool = False
    sigma: float = 1.0
    knowledge: str = "observed"
    gap: float = 1.01
    z: float | None = None  # model=alie: None = the paper's z_max
    epsilon: float | None = None  # model=ipm / dissensus: None = EPSILON[model]
    text: str = ""

    def __str__(self) -> str:
        return self.text or "none"

    @property
    def forges(self) -> bool:
        return self.claim != "honest"

    @property
    def eps(self) -> float:
        """ε of ``model=ipm``/``dissensus`` (given, or :data:`EPSILON`)."""
        return float(self.epsilon) if self.epsilon is not None else EPSILON.get(self.model, 0.0)


def parse_attack(text: str | None) -> Attack | None:
    """``None``/``""``/``"none"`` → no attack; else ``forge:key=value,...``."""
    if text is None or not str(text).strip() or str(text).strip().lower() == "none":
        return None
    comp = parse_component(str(text), kind="attack")
    if comp.name != "forge":
        raise SfgError(f"unknown attack {comp.name!r}{did_you_mean(comp.name, ['forge', 'none'])}; "
                       "write e.g. 'forge:frac=0.1,claim=fresh'")
    if comp.modifiers:
        raise SfgError(f"attack {comp.text!r} takes no '+' modifiers")
    p = dict(comp.params)
    for key in p:
        if key not in _KEYS:
            raise SfgError(f"unknown attack parameter {key!r}{did_you_mean(key, _KEYS)}")
    frac = p.get("frac", 0.1)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
        raise SfgError(f"attack frac={frac!r} must be a number in [0, 1], e.g. frac=0.1")
    choices = {"claim": CLAIMS, "model": MODELS, "placement": PLACEMENTS,
               "knowledge": KNOWLEDGE}
    vals = {}
    for key, allowed in choices.items():
        v = str(p.get(key, Attack.__dataclass_fields__[key].default)).lower()
        if v not in allowed:
            raise SfgError(f"attack {key}={v!r} is not valid{did_you_mean(v, allowed)}")
        vals[key] = v
    always = p.get("always_on", False)
    if not isinstance(always, bool):
        raise SfgError(f"attack always_on={always!r} must be true or false")
    sigma = p.get("sigma", 1.0)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma >= 0:
        raise SfgError(f"attack sigma={sigma!r} must be a number >= 0")
    gap = p.get("gap", 1.01)
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap < 1e9:
        raise SfgError(f"attack gap={gap!r} must be a number >= 0 (the undercut below the "
                       "freshest lag), e.g. gap=1.01")
    z = p.get("z")
    if z is not None:
        if vals["model"] != "alie":
            raise SfgError(f"attack z={z!r} is a parameter of model=alie; add model=alie or "
                           "drop z")
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not 0 <= z < 1e9:
            raise SfgError(f"attack z={z!r} must be a number >= 0 (ALIE's deviation in "
                           "standard deviations), e.g. z=1")
    eps = p.get("epsilon")
    if eps is not None:
        if vals["model"] not in EPSILON:
            raise SfgError(f"attack epsilon={eps!r} is a parameter of model=ipm or "
                           "model=dissensus; add one or drop epsilon")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < 1e9:
            raise SfgError(f"attack epsilon={eps!r} must be a number >= 0, e.g. epsilon=0.1")
    return Attack(frac=float(frac), always_on=always, sigma=float(sigma), gap=float(gap),
                  z=None if z is None else float(z), epsilon=None if eps is None else float(eps),
                  text=comp.text, **vals)


def check_rounds_only(attack: Attack | None, where: str, *, certified_ok: bool = False) -> None:
    """The adversaries that run in rounds only (``sfg replay``, ``sfg run``): ``rushing``
    knowledge (this round's states of every neighbour: no message carries them in time),
    ``claim=undercut`` (a claim per receiver) and the round-computed models
    (:data:`ROUND_MODELS`) are refused in ``where`` with one line; ``claim=certified`` too
    unless ``certified_ok`` (the networked lockstep nodes play it, :mod:`sfg.net.certify`)."""
    if attack is None:
        return
    if attack.knowledge == "rushing":
        raise SfgError(f"attack knowledge=rushing (every neighbour's state of the same round) "
                       f"is an omniscient adversary of the round-based runs, not of {where}, "
                       "where a liar knows what it received (knowledge=observed): drop "
                       "knowledge=rushing there, or run in rounds (sfg replay, sfg run)")
    if attack.claim == "certified" and not certified_ok:
        raise SfgError(f"attack claim=certified answers the certified protocol, which is "
                       f"modelled in the round-based sfg replay and sfg run (+certified); not "
                       f"in {where}")
    if attack.claim == "undercut":
        raise SfgError(f"attack claim=undercut forges a claim per receiver; it runs in the "
                       f"round-based sfg replay and sfg run, not in {where}: use claim=fresh, "
                       "stale-others, random or honest there")
    if attack.model in ROUND_MODELS:
        raise SfgError(f"attack model={attack.model} is computed in the round from the honest "
                       f"neighbours' models (and, for dissensus, each receiver's weights); it "
                       f"runs in sfg run (rounds or the lockstep clock), not in {where}: use "
                       "model=none, sign-flip, noise or constant there")


def place(attack: Attack | None, n: int, degree: np.ndarray, *, seed: int) -> np.ndarray:
    """[n] bool: the attackers (round(frac·n) of them), by seed or by degree."""
    out = np.zeros(n, bool)
    if attack is None:
        return out
    m = int(round(attack.frac * n))
    if m == 0:
        return out
    if attack.placement == "degree":
        order = np.lexsort((np.arange(n), -np.asarray(degree)))
    else:
        order = stream(seed, "attack-placement").permutation(n)
    out[order[:m]] = True
    return out


def availability(available: np.ndarray, attack: Attack | None, attackers: np.ndarray) -> np.ndarray:
    """The trace with ``always_on`` attackers always available (a copy when it changes)."""
    if attack is None or not attack.always_on or not attackers.any():
        return available
    out = np.array(available, bool, copy=True)
    out[:, attackers] = True
    return out


class Heard:
    """What each client has observed (``knowledge=observed``): per slot, the claim (count,
    lag) its last message delivered in a round the receiver aggregated with it as a
    candidate — what the receiver got while online. Before any: count 1 and lag 0, the
    initial models' claims. :meth:`note` after every round."""

    def __init__(self, rg):
        self.count = np.ones(rg.n_slots, np.int64)
        self.lag = np.zeros(rg.n_slots)

    def note(self, rg, candidate: np.ndarray, delivered: tuple[np.ndarray, ...]) -> None:
        """Round done: ``candidate`` [E] its candidate slots, ``delivered`` the (ages, lags,
        counts) [E] its slots delivered (:func:`claims`)."""
        m = np.asarray(candidate, bool) & ~rg.is_self
        self.lag[m] = delivered[1][m]
        self.count[m] = delivered[2][m]


def true_claims(rg, state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ages, lags, counts) [E] that each slot delivers in an honest round: its sender's state."""
    return (state.ages[rg.send].astype(np.int64), state.lags[rg.send].astype(np.float64),
            state.counts[rg.send].astype(np.int64))


def random_claims(seed: int, t: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``claim=random``'s draws of round ``t`` in rounds, one per client [n] (stream
    ``attack-claims``): age ~ U{0..t}, lag ~ U[0, t], count ~ U{1..t+1}."""
    g = stream(seed, "attack-claims", t)
    return g.integers(0, t + 1, n), g.random(n) * t, g.integers(1, t + 2, n)


def random_claims_clock(seed: int, tt: np.ndarray) -> np.ndarray:
    """``claim=random``'s draws on the virtual clock, one per event [3, R] (age, lag, count as
    floats; stream ``attack-claims-clock``), the distributions of :func:`random_claims` at
    each event's round ``tt`` [R], from uniforms u: age ⌊u·(t+1)⌋, lag u·t, count
    1 + ⌊u·(t+1)⌋."""
    u = stream(seed, "attack-claims-clock").random((3, tt.shape[0]))
    t = np.asarray(tt, np.int64)
    return np.stack([np.floor(u[0] * (t + 1)), u[1] * t, 1 + np.floor(u[2] * (t + 1))])


def claims(attack: Attack, rg, state, attackers: np.ndarray, *, seed: int,
           ids: np.ndarray | None = None, n_all: int | None = None,
           heard: Heard | None = None, evidence=None, cand_now: np.ndarray | None = None):
    """(ages, lags, counts) [E] that each slot delivers in round ``state.t``: the sender's true
    state, except on slots from an attacker to someone else, which carry the forged claim.

    ``heard``: what the clients observed so far (``knowledge=observed``; None: nothing yet).
    ``evidence`` and ``cand_now``: the certified protocol's evidence and this round's
    candidate slots, for ``claim=certified`` (:func:`sfg.round.certified.best_claims`).
    ``ids`` [rg.n] and ``n_all``: when ``rg`` is part of a larger graph (a networked node's
    star, :mod:`sfg.net.node`), the clients' ids in it and its size, so that random claims are
    the draws of the same clients in the whole graph."""
    t = state.t
    age, lag, count = true_claims(rg, state)
    forged = attackers[rg.send] & ~rg.is_self
    if not forged.any() or not attack.forges:
        return age, lag, count
    if attack.claim == "undercut":
        return _undercut(attack, rg, state, attackers, forged, age, lag, count, heard)
    if attack.claim == "certified":
        from sfg.round.certified import best_claims

        return best_claims(attack, rg, state, attackers, evidence, cand_now, age, lag, count)
    rows = rg.indptr[:-1]
    if attack.knowledge == "rushing":  # own and every neighbour's count of this round [N]
        heard_count = np.maximum.reduceat(count, rows)
    else:  # own, and each neighbour's last count received
        h_count = np.ones(rg.n_slots, np.int64) if heard is None else heard.count
        heard_count = np.maximum.reduceat(np.where(rg.is_self, count, h_count), rows)
    src = rg.send[forged]
    code = CLAIM_CODE[attack.claim]
    if code == RANDOM:
        ra, rl, rc = random_claims(seed, t, rg.n if n_all is None else int(n_all))
        gsrc = src if ids is None else np.asarray(ids, np.int64)[src]
        ra, rl, rc = ra[gsrc], rl[gsrc], rc[gsrc]
    else:
        ra = rc = np.zeros(src.shape[0], np.int64)  # read by random only
        rl = np.zeros(src.shape[0])
    forge_slots(code, int(t), np.flatnonzero(forged), heard_count[src].astype(np.int64),
                 ra.astype(np.int64), rl.astype(np.float64), rc.astype(np.int64), age, lag,
                 count)
    return age, lag, count


def _undercut(attack: Attack, rg, state, attackers: np.ndarray, forged: np.ndarray,
              age: np.ndarray, lag: np.ndarray, count: np.ndarray, heard: Heard | None):
    """``claim=undercut`` on the slots ``forged`` (attacker j → receiver i): lag =
    max(0, ℓ̂_i − gap), ℓ̂_i the freshest lag j expects among i's candidates — ``rushing``:
    the smallest true lag of i and its honest neighbours this round; ``observed``: the
    smallest of the last lag i claimed to j and the lags j itself holds (its own and its
    neighbours' last claims), j's stand-in for i's other neighbours. Age min(τ_j, ⌊lag⌋),
    count clip(max(n_j, ⌈1 + t − lag⌉), 1, t + 1): what +guard's bounds accept."""
    t = state.t
    e = np.flatnonzero(forged)
    j, i = rg.send[e], rg.recv[e]
    rows = rg.indptr[:-1]
    if attack.knowledge == "rushing":
        honest_lag = np.where(attackers[rg.send], np.inf, lag)
        expect = np.minimum.reduceat(honest_lag, rows)[i]
    else:
        h_lag = np.zeros(rg.n_slots) if heard is None else heard.lag
        held = np.where(rg.is_self, lag, h_lag)  # per receiver row: own lag, last claims
        own_view = np.minimum.reduceat(held, rows)[j]
        # the slot i → j: the last lag i claimed to j
        expect = np.minimum(own_view, held[_slot(rg, j, i)])
    out_lag = np.maximum(expect - attack.gap, 0.0)
    true_age, true_count = state.ages[j].astype(np.int64), state.counts[j].astype(np.int64)
    lag[e] = out_lag
    age[e] = np.minimum(true_age, np.floor(out_lag).astype(np.int64))
    need = np.ceil(1.0 + t - out_lag - 1e-9).astype(np.int64)
    count[e] = np.clip(np.maximum(true_count, need), 1, t + 1)
    return age, lag, count


def _slot(rg, recv: np.ndarray, send: np.ndarray) -> np.ndarray:
    """The slot over which ``send`` delivers to ``recv`` (each pair must be an edge)."""
    key = rg.recv.astype(np.int64) * rg.n + rg.send
    order = np.argsort(key, kind="stable")
    pos = np.searchsorted(key[order], np.asarray(recv, np.int64) * rg.n + send)
    return order[pos]


@njit(cache=True, nogil=True)
def reach_rounds(t0, t1, indptr, send, w, adopt, attackers, honest_idx, M, h, level, out):
    """The attackers' reach over rounds [t0, t1) (weights ``w`` [R, E], adopters [R, N]).

    Window s (0 ≤ s ≤ T − h) follows, over rounds s .. s+h−1, the share m_i of each model that
    comes from attackers' messages: m = 0 at the start of round s; each round an adopter's
    m_i ← Σ_j w_ij m̂_j with m̂_j = 1 for an attacker (what it sends is its own) and m_j
    otherwise; others keep m_i (local training does not change the share). out[s] = the share
    of honest clients with m_i ≥ ``level`` after round s+h−1. ``M`` [N, h] holds the h live
    windows (column s mod h)."""
    n = indptr.shape[0] - 1
    T = out.shape[0] + h - 1
    new = np.empty(h)
    tmp = np.empty((n, h))
    for t in range(t0, t1):
        if t <= T - h:  # window t starts
            c = t % h
            for i in range(n):
                M[i, c] = 0.0
        wt = w[t - t0]
        for i in range(n):
            if not adopt[t - t0, i]:
                for c in range(h):
                    tmp[i, c] = M[i, c]
                continue
            for c in range(h):
                new[c] = 0.0
            for e in range(indptr[i], indptr[i + 1]):
                we = wt[e]
                if we == 0.0:
                    continue
                j = send[e]
                if attackers[j]:
                    for c in range(h):
                        new[c] += we
                else:
                    for c in range(h):
                        new[c] += we * M[j, c]
            for c in range(h):
                tmp[i, c] = new[c]
        for i in range(n):
            for c in range(h):
                M[i, c] = tmp[i, c]
        s = t - h + 1  # window s ends with round t
        if 0 <= s <= T - h:
            c = s % h
            hit = 0
            for i in honest_idx:
                if M[i, c] >= level:
                    hit += 1
            out[s] = hit / max(honest_idx.shape[0], 1)


class Reach:
    """The reach of one replay, fed block by block (:func:`reach_rounds`)."""

    def __init__(self, T: int, n: int, h: int, attackers: np.ndarray):
        self.h = max(1, min(h, T))
        self.attackers = np.ascontiguousarray(attackers, bool)
        self.honest = np.flatnonzero(~self.attackers).astype(np.int64)
        self.M = np.zeros((n, self.h))
        self.out = np.zeros(T - self.h + 1)

    def run(self, t0: int, t1: int, rg, w: np.ndarray, adopt: np.ndarray) -> None:
        if self.attackers.any():
            reach_rounds(t0, t1, rg.indptr, rg.send, w, np.ascontiguousarray(adopt),
                         self.attackers, self.honest, self.M, self.h, REACH_LEVEL, self.out)

    @property
    def value(self) -> float:
        return float(self.out.mean()) if self.out.size else 0.0
