"""The weight-rule library (SPEC §3.1–3.3): each rule is one small scoring function.

A rule maps a :class:`~sfg.rules.slots.Slots` view to non-negative scores h over the slots;
the shared kernel (:func:`sfg.rules.normalise`) masks non-candidates, normalises rows, gives
identity rows to clients that do not aggregate and falls back to w_ii = 1 on all-zero rows.
Modifiers (``+ipw``, base self-weight ``c``, ``+rounded``) wrap the scores; they do not fork
rules. ``0^0 = 1`` throughout (``np.power(0.0, 0.0) == 1``), which gives the ``gamma=0``
"freshest only" variants for free: on integer ages the candidates of minimal age are averaged,
on real lags the least-lagged is in effect copied.
"""

from __future__ import annotations

import numpy as np

from .slots import Slots


def _pow(gamma: float, exponent: np.ndarray) -> np.ndarray:
    return np.power(float(gamma), np.maximum(exponent, 0).astype(np.float64))


# Real-valued lags are sums of products; two lags that are equal (or exactly L apart) in exact
# arithmetic may differ in the last bits depending on summation order. Relative staleness below
# TIE_TOL counts as a tie, and the cut margin is compared with the same tolerance.
TIE_TOL = 1e-9


def _relative(s: Slots, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """x_j − min over the candidates (or over ``mask`` among them); 0 where undefined."""
    rel = x - s.min(x, mask)
    if rel.dtype.kind != "f":
        return rel
    return np.where(np.isfinite(rel) & (rel > TIE_TOL), rel, 0.0)


def _n_neighbours(s: Slots) -> np.ndarray:
    return s.sum(s.neighbours().astype(np.int64), s.cand)


# ----------------------------------------------------------------- SFG family (SPEC §3.1)
def sfg(s: Slots, *, gamma: float) -> np.ndarray:
    """``sfg``: h_j = γ^(τ_j − τ_min), ages relative to the freshest candidate (receiver included)."""
    return _pow(gamma, _relative(s, s.age))


def sfg_l(s: Slots, *, gamma: float) -> np.ndarray:
    """``sfg-l``: h_j = γ^(ℓ_j − ℓ_min) on effective lags."""
    return _pow(gamma, _relative(s, s.lag))


def sfg_cut(s: Slots, *, L: float) -> np.ndarray:
    """``sfg-cut``: h_j = (1 + t − ℓ_j)·1[ℓ_j − ℓ_min ≤ L] (mean-inherited count, cut at margin L)."""
    keep = _relative(s, s.lag) <= L + TIE_TOL
    return np.where(keep, np.maximum(1.0 + s.t - s.lag, 0.0), 0.0)


def sfg_counts(s: Slots, *, gamma: float) -> np.ndarray:
    """``sfg-counts``: h_j = γ^(n_max − n_j) on max-inherited counts."""
    return _pow(gamma, s.max(s.count) - s.count)


# ----------------------------------------------------------------- baselines (SPEC §3.2)
def dfedavg(s: Slots) -> np.ndarray:
    """``dfedavg``: uniform over the candidate set."""
    return np.ones(s.is_self.shape)


def local(s: Slots) -> np.ndarray:
    """``local``: only the receiver's own model (no communication)."""
    return s.is_self.astype(np.float64)


def aoi(s: Slots, *, gamma: float) -> np.ndarray:
    """``aoi`` (neighbour-only AoI): h_ii = 1, h_ij = γ^(τ_j) (absolute ages)."""
    return np.where(s.is_self, 1.0, _pow(gamma, s.age))


def dfl_aa(s: Slots, *, gamma: float) -> np.ndarray:
    """``dfl-aa``: h_ii = 1, h_ij = γ^(τ_j − min over live neighbours)/q̂_ij; the receiver is never discounted."""
    rel = _relative(s, s.age, s.neighbours())
    return np.where(s.is_self, 1.0, _pow(gamma, rel) / s.q)


def gl_age(s: Slots) -> np.ndarray:
    """``gl-age``: h_j = n_j, the max-inherited count (gossip-learning model age)."""
    return s.count.astype(np.float64)


def limited_merging(s: Slots, *, L: float) -> np.ndarray:
    """``limited-merging``: drop n_j < n_max − L (the receiver included), weight the rest by n_j."""
    keep = s.count >= s.max(s.count) - L
    return np.where(keep, s.count.astype(np.float64), 0.0)


def local_counts(s: Slots, *, L: float) -> np.ndarray:
    """``local-counts``: limited merging on per-client counters that are never inherited."""
    keep = s.local_count >= s.max(s.local_count) - L
    return np.where(keep, s.local_count.astype(np.float64), 0.0)


def update_amplification(s: Slots, *, c: float) -> np.ndarray:
    """``update-amplification`` (FedAWE-style): DFedAvg weights; a returning client scales its
    local update by 1 + min(τ_i, c) in training (SPEC §3.2)."""
    return np.ones(s.is_self.shape)


# ----------------------------------------------------------------- controls (SPEC §3.3)
def self_weight(s: Slots) -> np.ndarray:
    """``self-weight``: neighbours 1, receiver c (the base self-weight, default 0.5), regardless of age."""
    return np.ones(s.is_self.shape)


def _self_on_return(s: Slots, base: float) -> np.ndarray:
    tau_i = s.own(s.age)
    returning = (tau_i >= 1) & (_n_neighbours(s) >= 1)
    return np.where(s.is_self & returning, _pow(base, tau_i), 1.0)


def self_only(s: Slots, *, base: float) -> np.ndarray:
    """``self-only``: neighbours 1; a returning receiver with ≥ 1 live neighbour scores itself 0.5^τ_i."""
    return _self_on_return(s, base)


def reset_on_return(s: Slots) -> np.ndarray:
    """``reset-on-return``: as ``self-only`` with 0 (discard the own model, average live neighbours)."""
    return _self_on_return(s, 0.0)


def neighbour_only_lags(s: Slots, *, gamma: float) -> np.ndarray:
    """``neighbour-only-lags``: h_ii = 1, h_ij = γ^(ℓ_j − min over live neighbours ℓ)."""
    return np.where(s.is_self, 1.0, _pow(gamma, _relative(s, s.lag, s.neighbours())))


def neighbour_only_counts(s: Slots, *, gamma: float) -> np.ndarray:
    """``neighbour-only-counts``: h_ii = 1, h_ij = γ^(max over live neighbours n − n_j)."""
    deficit = s.max(s.count, s.neighbours()) - s.count
    return np.where(s.is_self, 1.0, _pow(gamma, deficit))


def pinned_receiver(s: Slots, *, gamma: float) -> np.ndarray:
    """``pinned-receiver``: ``sfg-l`` weights and reference (receiver included), but h_ii = 1."""
    return np.where(s.is_self, 1.0, sfg_l(s, gamma=gamma))


def copy_random(s: Slots) -> np.ndarray:
    """``copy-random``: replace the model by one candidate drawn uniformly (the rule's own stream)."""
    k = s.sum(s.cand.astype(np.int64))
    pick = np.minimum(np.floor(s.u * k).astype(np.int64), np.maximum(k - 1, 0))
    return (s.cumcount(s.cand) == pick).astype(np.float64)


def placebo_cut(s: Slots, *, L: float) -> np.ndarray:
    """``placebo-cut``: keep as many candidates as ``sfg-cut`` would, drawn at random; uniform weights."""
    kept = s.sum((sfg_cut(s, L=L) > 0).astype(np.int64))
    return (s.rank(s.key, s.cand) < kept).astype(np.float64)


def cut_ages(s: Slots) -> np.ndarray:
    """``cut-ages``: keep candidates within one round of the youngest age; uniform weights."""
    return (_relative(s, s.age) <= 1).astype(np.float64)


def receiver_kept(s: Slots, *, L: float) -> np.ndarray:
    """``receiver-kept``: ``sfg-cut`` that never drops the receiver."""
    return np.where(s.is_self, np.maximum(1.0 + s.t - s.lag, 0.0), sfg_cut(s, L=L))


# ----------------------------------------------------------------- oracles (SPEC §3.4)
# They read the missed-fraction matrix A (global information): analysis only, replay only.
def _oracle_system(s: Slots, kappa: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per receiver: padded slot index, valid candidates and Σ' = I + κ·G, G = A_S A_Sᵀ."""
    if s.missed is None:
        raise ValueError("oracle rules need the missed-fraction matrix A (track_missed)")
    idx, valid = s.segments()
    valid = valid & s.cand[idx]
    rows = np.where(valid[..., None], s.missed[idx], 0.0)  # [R, k, T]
    G = np.einsum("rkt,rlt->rkl", rows, rows)
    k = valid.shape[1]
    return idx, valid, np.eye(k)[None] + kappa * G


def _scatter(s: Slots, idx: np.ndarray, valid: np.ndarray, values: np.ndarray) -> np.ndarray:
    h = np.zeros(s.is_self.shape)
    h[idx[valid]] = values[valid]
    return h


def oracle_gls(s: Slots, *, kappa: float) -> np.ndarray:
    """``oracle-gls``: w ∝ Σ'^{-1} 1 clipped at 0, Σ' = I + κ·G (G from A). Oracle: analysis only."""
    idx, valid, M = _oracle_system(s, kappa)
    x = np.linalg.solve(M, valid.astype(np.float64)[..., None])[..., 0]
    return _scatter(s, idx, valid, np.maximum(x, 0.0))


def _simplex_min(M: np.ndarray, valid: np.ndarray, iters: int) -> np.ndarray:
    """argmin wᵀMw over the probability simplex on ``valid`` entries, batched (active set).

    Starts from all valid entries; solves the equality-constrained problem on the active set
    (w ∝ M_A^{-1} 1), drops the most negative entry while any is negative, and adds back the
    inactive entry with the most negative KKT multiplier (M w)_j − wᵀMw until none is.
    """
    R, k = valid.shape
    active = valid.copy()
    w = np.zeros((R, k))
    for _ in range(iters):
        Ma = np.where(active[:, :, None] & active[:, None, :], M, np.eye(k)[None])
        x = np.linalg.solve(Ma, active.astype(np.float64)[..., None])[..., 0]
        w_new = x / np.maximum(x.sum(axis=1, keepdims=True), 1e-300)
        neg = active & (w_new < -1e-12)
        drop = neg.any(axis=1)
        if drop.any():
            worst = np.argmin(np.where(neg, w_new, np.inf), axis=1)
            active[np.flatnonzero(drop), worst[drop]] = False
        keep = ~drop
        w[keep] = np.where(active[keep], w_new[keep], 0.0)
        grad = np.einsum("rkl,rl->rk", M, w)
        lam = np.einsum("rk,rk->r", w, grad)
        viol = valid & ~active & (grad < lam[:, None] - 1e-12) & keep[:, None]
        add = viol.any(axis=1)
        if add.any():
            best = np.argmin(np.where(viol, grad, np.inf), axis=1)
            active[np.flatnonzero(add), best[add]] = True
        if not drop.any() and not add.any():
            break
    return w


def oracle_qp(s: Slots, *, kappa: float) -> np.ndarray:
    """``oracle-qp``: minimise Σ w² + κ·wᵀGw over the probability simplex. Oracle: analysis only."""
    idx, valid, M = _oracle_system(s, kappa)
    return _scatter(s, idx, valid, _simplex_min(M, valid, iters=4 * valid.shape[1] + 4))
