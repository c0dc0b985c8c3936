"""The rule library (docs/concepts/rules.md#scores-and-weights): one compiled function per rule, registered where it is written.

Each rule sees ONE receiver's candidates ``x`` (:class:`sfg.round.kernel.Candidates`; index 0 is the
receiver, the others its live neighbours, in slot order) and returns non-negative scores
``[k] float64``. The shared round (:mod:`sfg.round.kernel`) applies the modifiers (``+ipw``,
``+rounded``, ``c``), normalises (docs/concepts/round.md#one-round) and updates the staleness state (docs/concepts/staleness.md#the-staleness-state), for the
replay, the training simulator and ``Rule.weights_one`` alike. A rule must not write to ``x``.

Fields of ``x``: ``t`` round; ``u`` the receiver's uniform draw; ``age`` [k] int64 τ;
``lag`` [k] float64 ℓ (rounded under ``+rounded``); ``count`` [k] int64 max-inherited counts;
``local_count`` [k] int64 never-inherited counters; ``q`` [k] float64 q̂_ij (q[0] = 1);
``degree`` [k] int64 live-neighbour counts; ``key`` [k] float64 uniform keys.

Parameters are the keyword defaults after ``x``; their annotation is the valid range
(``Annotated[float, R]``, ``R`` a :class:`sfg.round.rules.Range`). ``0^0 = 1`` throughout (``gamma ** 0.0 == 1``), which gives the
``gamma=0`` "freshest only" variants for free. Adding a rule: write a function here (or in any
module that is imported), decorate it with ``@rule(name)`` and ``@njit(cache=True)``.
"""

from typing import TYPE_CHECKING, Annotated

import numpy as np

from sfg.round.jit import (
    njit,  # numba.njit, imported on first use (listing the rules loads no numba)
)
from sfg.round.rules import Discount, NonNegative, Unit, register_rule, rule

if TYPE_CHECKING:  # the kernel loads numba; listing the rules must not
    from sfg.round.kernel import Candidates

# Real-valued lags are sums of products; two lags that are equal (or exactly L apart) in exact
# arithmetic may differ in the last bits depending on summation order. Relative staleness below
# TIE_TOL counts as a tie, and the cut margin is compared with the same tolerance.
TIE_TOL = 1e-9


# Helpers shared by several rules. They are written as loops with one output array and take
# arrays, not ``x``: a rule runs once per receiver and round, and each temporary array (and
# each call that passes ``x``, whose ten arrays are reference-counted) costs time. Loops also
# compile faster than numpy's generic reductions, array expressions and sorts (``s.min()``
# alone pulls in numba's n-dimensional iterator: about 0.5 s on a rule's first use). They are
# called from compiled rules only, so they get neither a Python nor a C wrapper (less to
# compile); the rules themselves are compiled inlined into the round's call (sfg.round.kernel.scorer).
HELPER = dict(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)


@njit(**HELPER)
def lowest(s):
    """``s.min()`` (the first NaN if there is one, as numpy's), as a loop."""
    lo = s[0]
    if lo != lo:
        return lo
    for j in range(1, s.shape[0]):
        v = s[j]
        if v != v:
            return v
        if v < lo:
            lo = v
    return lo


@njit(**HELPER)
def highest(s):
    """``s.max()`` of integers, as a loop."""
    hi = s[0]
    for j in range(1, s.shape[0]):
        if s[j] > hi:
            hi = s[j]
    return hi


@njit(**HELPER)
def smallest_keys(key, m):
    """1.0 on the ``m`` candidates with the smallest keys, ties to the earlier candidate (the
    order of a stable sort: ``np.argsort(key, kind="mergesort")[:m]``, NaN last), else 0."""
    k = key.shape[0]
    order = np.empty(k, np.int64)
    for j in range(k):  # insertion sort: stable, and k is a handful
        v = key[j]
        d = j
        while d > 0:
            u = key[order[d - 1]]
            if u > v or (u != u and v == v):
                order[d] = order[d - 1]
                d -= 1
            else:
                break
        order[d] = j
    h = np.empty(k, np.float64)
    for j in range(k):
        h[j] = 0.0
    for d in range(m if m < k else k):
        h[order[d]] = 1.0
    return h


@njit(**HELPER)
def relative(s):
    """s_j − min_k s_k over the given candidates, as float64; differences ≤ TIE_TOL count as 0."""
    lo = lowest(s)
    rel = np.empty(s.shape[0], np.float64)
    for j in range(s.shape[0]):
        r = s[j] - lo
        rel[j] = r if r > TIE_TOL else 0.0
    return rel


@njit(**HELPER)
def discount(gamma, s):
    """γ^(s_j − s_min) (0^0 = 1)."""
    h = relative(s)
    for j in range(h.shape[0]):
        h[j] = gamma ** h[j]
    return h


@njit(**HELPER)
def neighbours_discount(gamma, s):
    """h_ii = 1, h_ij = γ^(s_j − min over live neighbours) (receiver never discounted)."""
    h = np.empty(s.shape[0], np.float64)
    h[0] = 1.0
    if s.shape[0] > 1:
        rest = discount(gamma, s[1:])
        for j in range(rest.shape[0]):
            h[j + 1] = rest[j]
    return h


@njit(**HELPER)
def mean_inherited_cut(lag, t, L):
    """(1 + t − ℓ_j)·1[ℓ_j − ℓ_min ≤ L] (mean-inherited count, cut at margin L)."""
    lo = lowest(lag)
    h = np.empty(lag.shape[0], np.float64)
    for j in range(h.shape[0]):
        h[j] = 0.0
        if lag[j] - lo <= L + TIE_TOL:
            v = 1.0 + t - lag[j]
            h[j] = v if v > 0.0 else 0.0  # max(v, 0.0)
    return h


@njit(**HELPER)
def within(counts, L):
    """Counts within L of the largest, weighted by the count; the rest 0."""
    top = highest(counts)
    h = np.empty(counts.shape[0], np.float64)
    for j in range(h.shape[0]):
        h[j] = 0.0
        if counts[j] >= top - L:
            h[j] = counts[j]
    return h


@njit(**HELPER)
def negated(a):
    """−a of integers (a new array)."""
    out = np.empty(a.shape[0], np.int64)
    for j in range(a.shape[0]):
        out[j] = -a[j]
    return out


# ----------------------------------------------------------------- SFG family (docs/concepts/rules.md#the-sfg-family)
@rule("sfg", tags=("sfg",))
@njit(cache=True)
def sfg(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``sfg``: h_j = γ^(τ_j − τ_min), ages relative to the freshest candidate (receiver included)."""
    return discount(gamma, x.age)


@rule("sfg-l", tags=("sfg",))
@njit(cache=True)
def sfg_l(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``sfg-l``: h_j = γ^(ℓ_j − ℓ_min) on effective lags."""
    return discount(gamma, x.lag)


@rule("sfg-cut", tags=("sfg",))
@njit(cache=True)
def sfg_cut(x: "Candidates", L: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``sfg-cut``: h_j = (1 + t − ℓ_j)·1[ℓ_j − ℓ_min ≤ L] (mean-inherited count, cut at margin L)."""
    return mean_inherited_cut(x.lag, x.t, L)


@rule("sfg-counts", tags=("sfg",))
@njit(cache=True)
def sfg_counts(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``sfg-counts``: h_j = γ^(n_max − n_j) on max-inherited counts."""
    top = highest(x.count)
    h = np.empty(x.count.shape[0], np.float64)
    for j in range(h.shape[0]):
        h[j] = gamma ** float(top - x.count[j])
    return h


# ----------------------------------------------------------------- baselines (docs/concepts/rules.md#baselines)
@rule("dfedavg", tags=("baseline",), scalars=False)
@njit(cache=True)
def dfedavg(x: "Candidates") -> np.ndarray:
    """``dfedavg``: uniform over the candidate set."""
    return np.ones(x.age.shape[0])


@rule("local", tags=("baseline",), scalars=False)
@njit(cache=True)
def local(x: "Candidates") -> np.ndarray:
    """``local``: only the receiver's own model (no communication)."""
    h = np.zeros(x.age.shape[0])
    h[0] = 1.0
    return h


@rule("aoi", tags=("baseline",))
@njit(cache=True)
def aoi(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``aoi`` (neighbour-only AoI): h_ii = 1, h_ij = γ^(τ_j) (absolute ages)."""
    h = gamma ** x.age.astype(np.float64)
    h[0] = 1.0
    return h


@rule("dfl-aa", tags=("baseline",))
@njit(cache=True)
def dfl_aa(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``dfl-aa``: h_ii = 1, h_ij = γ^(τ_j − min over live neighbours)/q̂_ij; the receiver is never discounted."""
    h = neighbours_discount(gamma, x.age)
    for j in range(h.shape[0]):
        h[j] = h[j] / x.q[j]
    return h


@rule("gl-age", tags=("baseline",))
@njit(cache=True)
def gl_age(x: "Candidates") -> np.ndarray:
    """``gl-age``: h_j = n_j, the max-inherited count (gossip-learning model age)."""
    return x.count.astype(np.float64)


@rule("limited-merging", tags=("baseline",))
@njit(cache=True)
def limited_merging(x: "Candidates", L: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``limited-merging``: drop n_j < n_max − L (the receiver included), weight the rest by n_j."""
    return within(x.count, L)


@rule("local-counts", tags=("baseline",))
@njit(cache=True)
def local_counts(x: "Candidates", L: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``local-counts``: limited merging on per-client counters that are never inherited."""
    return within(x.local_count, L)


@rule("update-amplification", tags=("baseline",), amplify="c", scalars=False)
@njit(cache=True)
def update_amplification(x: "Candidates", c: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``update-amplification`` (FedAWE-style): DFedAvg weights, returning updates × (1 + min(τ_i, c)).

    A returning client scales its local update by 1 + min(τ_i, c) in training (docs/concepts/rules.md#baselines)."""
    return np.ones(x.age.shape[0])


# ----------------------------------------------------------------- controls (docs/concepts/rules.md#controls-and-ablations)
@rule("self-weight", tags=("control",), scalars=False)
@njit(cache=True)
def self_weight(x: "Candidates", c: Annotated[float, NonNegative] = 0.5) -> np.ndarray:
    """``self-weight``: neighbours 1, receiver c (default 0.5), regardless of age."""
    h = np.ones(x.age.shape[0])
    h[0] = c
    return h


@njit(**HELPER)
def discount_on_return(age, base):
    """Neighbours 1; a returning receiver (τ_i ≥ 1) with ≥ 1 live neighbour scores base^τ_i."""
    h = np.ones(age.shape[0])
    if age[0] >= 1 and age.shape[0] > 1:
        h[0] = base ** float(age[0])
    return h


@rule("self-only", tags=("control",))
@njit(cache=True)
def self_only(x: "Candidates", base: Annotated[float, Unit] = 0.5) -> np.ndarray:
    """``self-only``: neighbours 1; a returning receiver with ≥ 1 live neighbour scores itself base^τ_i."""
    return discount_on_return(x.age, base)


@rule("reset-on-return", tags=("control",))
@njit(cache=True)
def reset_on_return(x: "Candidates") -> np.ndarray:
    """``reset-on-return``: as ``self-only`` with 0 (discard the own model, average live neighbours)."""
    return discount_on_return(x.age, 0.0)


@rule("neighbour-only-lags", tags=("control",))
@njit(cache=True)
def neighbour_only_lags(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``neighbour-only-lags``: h_ii = 1, h_ij = γ^(ℓ_j − min over live neighbours ℓ)."""
    return neighbours_discount(gamma, x.lag)


@rule("neighbour-only-counts", tags=("control",))
@njit(cache=True)
def neighbour_only_counts(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``neighbour-only-counts``: h_ii = 1, h_ij = γ^(max over live neighbours n − n_j)."""
    return neighbours_discount(gamma, negated(x.count))


@rule("pinned-receiver", tags=("control",))
@njit(cache=True)
def pinned_receiver(x: "Candidates", gamma: Annotated[float, Discount] = 0.5) -> np.ndarray:
    """``pinned-receiver``: ``sfg-l`` weights and reference (receiver included), but h_ii = 1."""
    h = discount(gamma, x.lag)
    h[0] = 1.0
    return h


@rule("copy-random", tags=("control", "random"), scalars=False)
@njit(cache=True)
def copy_random(x: "Candidates") -> np.ndarray:
    """``copy-random``: replace the model by one candidate drawn uniformly (the rule's own stream)."""
    k = x.age.shape[0]
    h = np.zeros(k)
    h[min(int(np.floor(x.u * k)), k - 1)] = 1.0
    return h


@rule("placebo-cut", tags=("control", "random"))
@njit(cache=True)
def placebo_cut(x: "Candidates", L: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``placebo-cut``: keep as many candidates as ``sfg-cut`` would, drawn at random; uniform weights."""
    cut = mean_inherited_cut(x.lag, x.t, L)
    kept = np.int64(0)  # not a literal 0: smallest_keys is compiled for one type of m
    for j in range(cut.shape[0]):
        if cut[j] > 0:
            kept += 1
    return smallest_keys(x.key, kept)


@rule("cut-ages", tags=("control",))
@njit(cache=True)
def cut_ages(x: "Candidates") -> np.ndarray:
    """``cut-ages``: keep candidates within one round of the youngest age; uniform weights."""
    lo = lowest(x.age)
    h = np.empty(x.age.shape[0], np.float64)
    for j in range(h.shape[0]):
        h[j] = 1.0 if x.age[j] - lo <= 1 else 0.0
    return h


@rule("receiver-kept", tags=("control",))
@njit(cache=True)
def receiver_kept(x: "Candidates", L: Annotated[float, NonNegative] = 1.0) -> np.ndarray:
    """``receiver-kept``: ``sfg-cut`` that never drops the receiver."""
    h = mean_inherited_cut(x.lag, x.t, L)
    h[0] = max(1.0 + x.t - x.lag[0], 0.0)
    return h


@rule("two-random", tags=("control", "random"), scalars=False)
@njit(cache=True)
def two_random(x: "Candidates") -> np.ndarray:
    """``two-random``: two distinct candidates drawn uniformly (receiver included), equal weights.

    The own model alone when there is no live neighbour; the draws are the rule's own stream
    keyed by (seed, round) (docs/concepts/rules.md#controls-and-ablations)."""
    return smallest_keys(x.key, np.int64(2))


@rule("metropolis-hastings", tags=("control",), scalars=False)
@njit(cache=True)
def metropolis_hastings(x: "Candidates") -> np.ndarray:
    """``metropolis-hastings``: w_ij = 1/(1 + max(d_i, d_j)), d = live degree; w_ii = 1 − Σ_j w_ij.

    d is the current number of live neighbours (neighbours that send, over live links);
    symmetric and doubly stochastic without outages (docs/concepts/rules.md#controls-and-ablations)."""
    k = x.degree.shape[0]
    d0 = x.degree[0]
    h = np.empty(k, np.float64)
    rest = 0.0
    for j in range(k):
        dj = x.degree[j] if x.degree[j] > d0 else d0  # np.maximum
        h[j] = 1.0 / (1.0 + float(dj))
        if j > 0:
            rest += h[j]
    h[0] = 1.0 - rest
    return h


# ----------------------------------------------------------------- model-reading (docs/concepts/rules.md#baselines)
# Implemented in sfg.sim.model_rules (training only).
register_rule("model-memory", None, tags=("baseline", "model"),
              doc="MIFA analogue: remembered models of offline neighbours averaged in, undiscounted")
register_rule("model-memory+sfg", None, params={"gamma": 0.5}, tags=("baseline", "model"),
              ranges={"gamma": Discount},
              doc="model memory with SFG weights on ages (age at reception + rounds since)")
register_rule("model-memory+sfg-l", None, params={"gamma": 0.5}, tags=("baseline", "model"),
              ranges={"gamma": Discount},
              doc="model memory with SFG-L weights on lags (lag at reception + rounds since)")
register_rule("relative-variance", None, params={"nu": 0.2}, tags=("baseline", "model"),
              doc="diffusion-adaptation combiner: h_ij = 1/v_ij, EWMA of squared model distances")
register_rule("pwg", None, params={"H": 1.0, "rho": -1.0}, tags=("baseline", "model"),
              doc="precision-weighted gossip on ages: h = 1/(1 + rho*relative age); rho<0 = estimate online")
register_rule("pwg-l", None, params={"H": 1.0, "rho": -1.0}, tags=("baseline", "model"),
              doc="precision-weighted gossip on lags: h = 1/(1 + rho*relative lag); rho<0 = estimate online")
