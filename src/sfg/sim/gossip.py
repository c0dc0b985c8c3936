"""Gossip on the flat parameter store: the round's weights as one sparse row-stochastic product."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..rounds import RoundGraph

# Dense below this many rows of M, sparse CSR above. Measured on the 2-core development CPU
# (kNN k = 6, all rows aggregating, ms per round, dense / sparse): N=32, D=1e5: 6.7 / 10.2;
# N=100, D=1e5: 40 / 73; N=100, D=8970: 2.7 / 2.1; N=200, D=8970: 8.7 / 4.5.
DENSE_MAX_ROWS = 128


def slot_matmul(rg: RoundGraph, w: np.ndarray, rows: np.ndarray, M: torch.Tensor,
                cols: np.ndarray | None = None) -> torch.Tensor:
    """For the receivers ``rows`` (bool[N]): Σ_slots w_slot · M[col(slot)] -> [rows.sum(), D].

    ``col`` is the slot's sender (``M`` = the [N, D] models) unless ``cols`` maps slots to
    rows of ``M`` (e.g. a per-slot memory). Dense [rows, |M|] weights and one BLAS product
    while ``M`` has at most ``DENSE_MAX_ROWS`` rows; a sparse CSR product beyond, so that time
    and memory grow with edges, not N².
    """
    idx = np.flatnonzero(rows)
    starts, ends = rg.indptr[idx], rg.indptr[idx + 1]
    lens = ends - starts
    crow = np.concatenate([[0], np.cumsum(lens)])
    slot = np.repeat(starts - crow[:-1], lens) + np.arange(crow[-1])
    col = rg.send[slot] if cols is None else cols[slot]
    if M.shape[0] <= DENSE_MAX_ROWS:
        # small N: a dense [rows, N] matrix and one BLAS product beat torch's sparse kernels
        W = torch.zeros(idx.size, M.shape[0], dtype=M.dtype)
        row_of = np.repeat(np.arange(idx.size), lens)
        W.index_put_((torch.from_numpy(row_of), torch.from_numpy(col)),
                     torch.from_numpy(w[slot]).to(M.dtype), accumulate=True)
        return W.to(M.device) @ M
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
