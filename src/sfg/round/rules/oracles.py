"""Oracle rules (docs/concepts/rules.md#oracles) and the missed-fraction matrix A they read (docs/concepts/staleness.md#the-staleness-state).

They need global information (every candidate's row of A) and small linear algebra per
receiver, so they are analysis tools, not rules a real system could run: numpy, batched over
receivers. Their scores enter the shared round (:mod:`sfg.round.kernel`) as given scores, which
normalises them and updates the staleness state like any rule's.
"""

from __future__ import annotations

import numpy as np

from sfg.round.rules import Range, register_rule

# past ~1e6 the identity in I + kappa*G is lost to rounding and Σ' can be numerically singular
KAPPA = Range(0.0, 1e6, "larger values make I + kappa*G numerically singular")


def _padded(indptr: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slots padded per receiver: (index [R, kmax] int64, valid candidate [R, kmax] bool)."""
    lens = np.diff(indptr)
    k = np.arange(int(lens.max()) if lens.size else 0)
    valid = k[None, :] < lens[:, None]
    idx = np.minimum(indptr[:-1, None] + k[None, :], max(int(indptr[-1]) - 1, 0))
    return idx, valid & cand[idx]


def _system(indptr, send, cand, missed, kappa):
    """Per receiver: padded slots, valid candidates and Σ' = I + κ·G, G = A_S A_Sᵀ."""
    idx, valid = _padded(indptr, cand)
    rows = np.where(valid[..., None], missed[send[idx]], 0.0)  # [R, k, T]
    G = np.einsum("rkt,rlt->rkl", rows, rows)
    return idx, valid, np.eye(valid.shape[1])[None] + kappa * G


def _scatter(n_slots, idx, valid, values):
    h = np.zeros(n_slots)
    h[idx[valid]] = values[valid]
    return h


def oracle_gls(indptr, send, cand, missed, *, kappa: float) -> np.ndarray:
    """``oracle-gls``: w ∝ Σ'^{-1} 1 clipped at 0, Σ' = I + κ·G (G from A). Oracle: analysis only."""
    idx, valid, M = _system(indptr, send, cand, missed, kappa)
    x = np.linalg.solve(M, valid.astype(np.float64)[..., None])[..., 0]
    return _scatter(send.shape[0], idx, valid, np.maximum(x, 0.0))


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


def oracle_qp(indptr, send, cand, missed, *, kappa: float) -> np.ndarray:
    """``oracle-qp``: minimise Σ w² + κ·wᵀGw over the probability simplex. Oracle: analysis only."""
    idx, valid, M = _system(indptr, send, cand, missed, kappa)
    return _scatter(send.shape[0], idx, valid, _simplex_min(M, valid, iters=4 * valid.shape[1] + 4))


register_rule("oracle-gls", oracle_gls, params={"kappa": 1.0}, tags=("oracle",),
              ranges={"kappa": KAPPA}, doc=oracle_gls.__doc__.split("\n")[0])
register_rule("oracle-qp", oracle_qp, params={"kappa": 1.0}, tags=("oracle",),
              ranges={"kappa": KAPPA}, doc=oracle_qp.__doc__.split("\n")[0])


def advance_missed(missed: np.ndarray, t: int, indptr: np.ndarray, send: np.ndarray,
                   weights: np.ndarray, adopts: np.ndarray, trains: np.ndarray) -> np.ndarray:
    """A after round t (docs/concepts/staleness.md#the-staleness-state): adopters' rows become Σ_j w_ij A_j, column t = 1[not trained]."""
    import scipy.sparse as sp

    n = indptr.shape[0] - 1
    W = sp.csr_matrix((weights, send, indptr), shape=(n, n))
    out = np.where(adopts[:, None], W @ missed, missed)
    out[:, t] = ~trains
    return out
