"""Defences against forged staleness claims; they compose with every model-free rule like a
modifier (``sfg-cut:L=2+guard``, ``sfg+relative+cap``; see :mod:`sfg.round.attacks` for the attacks).

A rule trusts the scalars each sender claims about its own model (age τ, effective lag ℓ,
max-inherited count n; docs/concepts/staleness.md#the-staleness-state). The defences below run inside the shared round
(:mod:`sfg.round.kernel`) on one receiver's candidates (index 0 = the receiver, whose own state is
never touched), before the rule scores them (claims) or after the shared normalisation
(weights). Clamped claims are what the receiver then also uses for its own bookkeeping (its
lag is the weighted mean of the clamped lags, its count the max of the clamped counts).

* ``+guard`` — receiver-side evidence. The receiver keeps, per neighbour (per slot), the
  version of the model it last received and the round it first saw that version (a content
  hash in a deployment). Only bounds that every honest history satisfies are enforced, so
  consistent claims are never changed:

  - age ≥ rounds since the content last changed as the receiver observed it
    (an unchanged model was not trained since the receiver first saw it);
  - count ≤ t + 1 (counts start at 1 and grow by at most one per round; inheriting takes a
    max, which cannot exceed that bound either), count ≥ 1;
  - lag ≥ age (τ ≤ ℓ: docs/concepts/staleness.md#invariants), lag ≥ 1 + t − count (the max-inherited count is at least the
    mean-inherited count n̄ = 1 + t − ℓ, by induction over the rounds), lag ≥ 0.

  A tighter count bound from the sender's last claim ("rounds elapsed plus what the receiver
  could have passed on") is *not* sound: an honest neighbour can inherit a larger count from
  a third client the receiver never hears from; it would clamp honest claims.
* ``+relative`` — robust relative claims: a neighbour's claimed age and lag may not lie more
  than ``margin`` (default 1) below the smallest claim of the *other* candidates (the
  receiver included), nor its count more than ``margin`` above their largest.
* ``+refute`` — ``+guard``'s bounds, and a claim they refute (one the guard would clamp)
  excludes its candidate from the aggregation (weight 0, the rest renormalised) instead of
  entering it with the clamped claim. Sound as the guard: an honest claim is never refuted,
  so honest rows are unchanged bit for bit. Why: a clamped liar still feeds the receiver's
  bookkeeping — its count is inherited — and a liar that sees this round's counts
  (``knowledge=rushing``) claims the largest + 1, so the bound lag ≥ 1 + t − count falls as
  fast as the counts it spread grow: the *ratchet*, under which ``+guard`` raised the liars'
  share above no defence (``sfg-cut`` 0.104 → 0.114, bursty u = 0.8, N = 100, 10 % liars,
  seeds 1–5). Excluded, the liar passes on no count, and nothing ratchets
  (``docs/findings/attacks.md`` has the figures).
* ``+cap`` — per-neighbour weight cap: no neighbour gets more than κ/|S_i| (``kappa``,
  default 2); the excess stays with the receiver's own model.
* ``+clip`` (training only, reads models; :mod:`sfg.sim.run`) — ClippedGossip-style
  screening: x̃_i = x_i + Σ_j w_ij clip(x_j − x_i, r_i) with r_i the median distance to the
  receiver's neighbour candidates.
"""

from __future__ import annotations

import numpy as np

from sfg.util.numba_start import njit

GUARD = 1
RELATIVE = 2
CAP = 4
CLIP = 8
REFUTE = 16  # with GUARD: a claim the guard's bounds refute excludes its candidate
# the virtual clock's events: only the bounds that hold in time — τ ≤ ℓ, ℓ ≥ 0, τ ≥ 0,
# counts ≥ 1. Counts grow by local rounds, several per unit under the event protocol, and a
# held message is aggregated again at later units with its waited age rounded down, so the
# count bound (≤ t + 1), the lag bound (≥ 1 + t − count) and the evidence bound (rounds since
# the content changed) clamp honest claims there; they are left out (tested)
TIMED = 32
CERTIFIED = 64  # the certified protocol's evidence, checked outside the round (sfg.round.certified)
DEFENCES = {"guard": GUARD, "relative": RELATIVE, "cap": CAP, "clip": CLIP,
            "refute": GUARD | REFUTE, "certified": CERTIFIED}
# parameters a defence brings, with defaults and the defence that owns them
DEFENCE_PARAMS = {"margin": (1.0, "relative"), "kappa": (2.0, "cap"), "beta": (0.2, "trim"),
                  "delta": (0.1, "scclip"), "scclip_tau": (0.0, "scclip"),
                  "scclip_rank": (0.0, "scclip"), "balance_gamma": (0.5, "balance"),
                  "balance_kappa": (1.0, "balance"), "balance_alpha": (0.5, "balance")}
TOL = 1e-9  # slack for real-valued lags (sums of products; see sfg.round.rules.library.TIE_TOL)


@njit(cache=True, nogil=True)
def clamp_claims(t, flags, margin, k, age, raw, count, min_age):  # pragma: no cover - compiled
    """Clamp neighbours' claims (entries 1..k−1) in place: ``age`` [k] int64, ``raw`` [k]
    lags, ``count`` [k] int64; ``min_age`` [k] the evidence bound of ``+guard``. Returns the
    number of claims changed."""
    changed = 0
    if flags & GUARD:
        for d in range(1, k):
            a, lg, c = age[d], raw[d], count[d]
            if a < min_age[d] and not flags & TIMED:  # evidence counted in rounds
                a = min_age[d]
            if a < 0:
                a = 0
            if c > t + 1 and not flags & TIMED:
                c = t + 1
            if c < 1:
                c = 1
            lo = max(float(a), 0.0)
            if not flags & TIMED:  # rounds: at most one count per round (docs/concepts/staleness.md#the-staleness-state)
                lo = max(lo, 1.0 + t - c)
            if lg < lo - TOL:
                lg = lo
            if a != age[d] or c != count[d] or lg != raw[d]:
                changed += 1
                if flags & REFUTE:
                    min_age[d] = -1  # refuted: marked for exclusion (drop_refuted)
            age[d], raw[d], count[d] = a, lg, c
    if (flags & RELATIVE) and k > 2:
        # bounds from the claims as they stand before this step, for every neighbour alike
        a1 = a2 = np.iinfo(np.int64).max  # smallest two ages, lags; largest two counts
        l1 = l2 = np.inf
        c1 = c2 = np.iinfo(np.int64).min
        for d in range(k):
            if age[d] < a1:
                a1, a2 = age[d], a1
            elif age[d] < a2:
                a2 = age[d]
            if raw[d] < l1:
                l1, l2 = raw[d], l1
            elif raw[d] < l2:
                l2 = raw[d]
            if count[d] > c1:
                c1, c2 = count[d], c1
            elif count[d] > c2:
                c2 = count[d]
        lo_a = np.empty(k)
        lo_l = np.empty(k)
        hi_c = np.empty(k)
        for d in range(k):  # extremes over the other candidates
            lo_a[d] = a2 if age[d] == a1 else a1
            lo_l[d] = l2 if raw[d] == l1 else l1
            hi_c[d] = c2 if count[d] == c1 else c1
        for d in range(1, k):
            hit = False
            if age[d] < lo_a[d] - margin:
                age[d] = int(np.ceil(lo_a[d] - margin))
                hit = True
            if raw[d] < lo_l[d] - margin - TOL:
                raw[d] = lo_l[d] - margin
                hit = True
            if count[d] > hi_c[d] + margin:
                count[d] = int(np.floor(hi_c[d] + margin))
                hit = True
            if hit:
                changed += 1
    return changed


@njit(cache=True, nogil=True)
def cap_weights(w, kappa):  # pragma: no cover - compiled
    """``+cap``: each neighbour's weight at most κ/k (k candidates); the excess goes to the
    receiver (entry 0). In place; a row that already satisfies the cap is unchanged."""
    k = w.shape[0]
    if k < 2:
        return
    cap = kappa / k
    excess = 0.0
    for d in range(1, k):
        if w[d] > cap:
            excess += w[d] - cap
            w[d] = cap
    if excess > 0.0:
        w[0] += excess


@njit(cache=True, nogil=True)
def drop_refuted(w, min_age):  # pragma: no cover - compiled
    """``+refute``: the weights ``w`` [k] without the candidates whose claims the guard's
    bounds refuted (``min_age`` −1, marked by :func:`clamp_claims`), renormalised over the
    rest; the receiver keeps its own model when nothing else is left. In place; a row with
    nothing refuted is unchanged, bit for bit."""
    k = w.shape[0]
    hit = False
    for d in range(1, k):
        if min_age[d] == -1:
            hit = True
            w[d] = 0.0
    if not hit:
        return
    total = 0.0
    for d in range(k):
        total += w[d]
    if total > 0.0:
        for d in range(k):
            w[d] = w[d] / total
    else:
        w[0] = 1.0


def _defend(stage, t, flags, margin, kappa, k, age, raw, count, min_age, w):  # pragma: no cover
    """The round's defences of one receiver (compiled, passed to the round as a function, so
    that a round without defences compiles none of them): ``stage`` 0 clamps the claims
    (:func:`clamp_claims`, returns the number changed), 1 the weights ``w``: drops the refuted
    (:func:`drop_refuted`, ``+refute``), then caps (:func:`cap_weights`, ``+cap``); returns 0."""
    if stage == 0:
        return clamp_claims(t, flags, margin, k, age, raw, count, min_age)
    if flags & REFUTE:
        drop_refuted(w, min_age)
    if flags & CAP:
        cap_weights(w, kappa)
    return 0


_DEFEND: list = []


def defend_signature():
    """The numba signature of :func:`defend`."""
    from numba import types as nt

    i1, f1 = nt.Array(nt.int64, 1, "C"), nt.Array(nt.float64, 1, "C")
    return nt.int64(nt.int64, nt.int64, nt.int64, nt.float64, nt.float64, nt.int64, i1, f1, i1,
                    i1, f1)


def defend():
    """:func:`_defend` compiled (or loaded from numba's cache) on first use, as the round's
    first-class function argument (:func:`sfg.round.compiled.first_class`)."""
    if not _DEFEND:
        from sfg.round.compiled import first_class

        sig = defend_signature()
        _DEFEND.append(first_class(njit(sig, cache=True, nogil=True)(_defend), sig))
    return _DEFEND[0]


def clamp_one(rule, t: int, ages, lags, counts, min_ages=None, *, timed: bool = False):
    """One receiver's claims as the round's defences leave them (index 0 = the receiver):
    ``(ages [k] int64, lags [k] float64, counts [k] int64, changed, marks)`` —
    :func:`clamp_claims`, the round's own compiled clamp, on copies; ``marks`` [k] −1 where
    ``+refute`` refuted a claim (for :func:`weights_after`). ``timed``: the receiver runs on
    its own timer (an async node), not in rounds: the bounds of :data:`TIMED` only. ``min_ages`` [k] is the ``+guard`` evidence
    bound (rounds since each candidate's content last changed as the receiver observed it;
    default 0: no evidence). For receivers outside the round, e.g. a networked node
    (:mod:`sfg.net.node`), which then scores the clamped claims with :func:`claims_as_given`'s
    rule and keeps them for its own bookkeeping, as the round does."""
    age = np.array(ages, dtype=np.int64).reshape(-1)
    raw = np.array(lags, dtype=np.float64).reshape(-1)
    count = np.array(counts, dtype=np.int64).reshape(-1)
    k = age.shape[0]
    lo = np.zeros(k, np.int64) if min_ages is None else np.array(min_ages, np.int64).reshape(-1)
    changed = 0
    flags = rule.defence_flags & (GUARD | RELATIVE | REFUTE)
    if flags and timed:  # an async node: only the bounds that hold in time (TIMED)
        flags |= TIMED
    if flags:
        changed = int(clamp_claims(int(t), flags, float(rule.margin), k, age, raw, count, lo))
    return age, raw, count, changed, lo


def claims_as_given(rule):
    """``rule`` without its claim defences (``+guard``, ``+refute``, ``+relative``; ``+cap``
    stays, except beside ``+refute``, which must drop before the cap: :func:`weights_after`):
    for scoring claims that :func:`clamp_one` already clamped (clamping once, as the round
    does)."""
    from dataclasses import replace

    drop = ("guard", "refute", "relative") + (("cap",) if "refute" in rule.modifiers else ())
    keep = tuple(m for m in rule.modifiers if m not in drop)
    return rule if keep == rule.modifiers else replace(rule, modifiers=keep)


def weights_after(rule, w: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """One receiver's weights ``w`` [k] (of :func:`claims_as_given`'s rule) after the
    weight defences as the round applies them under ``+refute``: the refuted dropped
    (``marks``: :func:`clamp_one`'s fifth result), then ``+cap``. Unchanged without
    ``+refute`` (``+cap`` was already in the scoring rule)."""
    flags = rule.defence_flags
    if not flags & REFUTE:
        return w
    out = np.array(w, np.float64).reshape(-1)
    drop_refuted(out, np.asarray(marks, np.int64))
    if flags & CAP:
        cap_weights(out, float(rule.kappa))
    return out
