"""Gossip on the flat parameter store: the round's weights as one sparse row-stochastic product."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from sfg.round.slots import RoundGraph

# One sparse CSR product over the adopters' rows. Measured single-threaded (the round loop's
# setting) on the 2-core development CPU, kNN k = 6, ms per round, dense [rows, N] BLAS
# product / sparse: N=100, D=8970, 20 rows: 0.55 / 0.17, all rows: 2.4 / 0.9; N=32, D=8970:
# 0.10 / 0.08; N=100, D=102,078, 20 rows: 8.3 / 4.2, all rows: 45 / 51; paper CNN
# (D=878,538), 20 rows: 98 / 85; N=200, D=8970, 40 rows: 2.2 / 0.34. Time and memory grow
# with the edges, not N².


def slot_matmul(rg: RoundGraph, w: np.ndarray, rows: np.ndarray, M: torch.Tensor,
                cols: np.ndarray | None = None) -> torch.Tensor:
    """For the receivers ``rows`` (bool[N]): Σ_slots w_slot · M[col(slot)] -> [rows.sum(), D].

    ``col`` is the slot's sender (``M`` = the [N, D] models) unless ``cols`` maps slots to
    rows of ``M`` (e.g. a per-slot memory). One sparse CSR [rows, |M|] @ [|M|, D] product.
    """
    idx = np.flatnonzero(rows)
    starts, ends = rg.indptr[idx], rg.indptr[idx + 1]
    lens = ends - starts
    crow = np.concatenate([[0], np.cumsum(lens)])
    slot = np.repeat(starts - crow[:-1], lens) + np.arange(crow[-1])
    col = rg.send[slot] if cols is None else cols[slot]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        W = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(col),
                                    torch.from_numpy(w[slot]).to(M.dtype),
                                    size=(idx.size, M.shape[0])).to(M.device)
        return W @ M


def mix_rows(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray,
             memory: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The receivers ``rows`` (bool[N]) as a long index ``[n]`` and their mixed models
    ``[n, D]`` (x̃_i = Σ_j w_ij x_j), computed from ``X`` (or the per-slot ``memory``)."""
    idx = torch.from_numpy(np.flatnonzero(rows)).to(X.device)
    cols = None if memory is None else np.arange(rg.n_slots)
    M = X if memory is None else memory
    return idx, slot_matmul(rg, weights, rows, M, cols)


def gossip_(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray, *,
            keep: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gossip` in place: the rows of the receivers are overwritten with their mixes
    (all read from ``X`` as it was on entry); ``keep`` (bool[D]) coordinates keep their value.
    Same numbers as :func:`gossip`, without a copy of the whole store. Returns ``X``."""
    if rows.any():
        idx, Y = mix_rows(X, rg, weights, rows)
        if keep is not None:
            Y[:, keep] = X.index_select(0, idx)[:, keep]
        X.index_copy_(0, idx, Y)
    return X


def gossip(X: torch.Tensor, rg: RoundGraph, weights: np.ndarray, rows: np.ndarray,
           memory: torch.Tensor | None = None) -> torch.Tensor:
    """x̃_i = Σ_j w_ij x_j for the receivers ``rows``; every other row is returned untouched.

    With ``memory`` ([E, D], one model per slot) the slots' remembered models are mixed instead
    of the senders' current ones (model memory). Returns a new tensor; see :func:`gossip_`."""
    out = X.clone()
    if rows.any():
        idx, Y = mix_rows(X, rg, weights, rows, memory)
        out.index_copy_(0, idx, Y)
    return out
